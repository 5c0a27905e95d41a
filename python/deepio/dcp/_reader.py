"""``deepio.dcp.FileSystemReader``: torch.distributed.checkpoint's FileSystemReader whose data
files are read through deepio's engine.

What is torch's and what is deepio's. Planning, ``set_up_storage_reader`` and the metadata's
unpickling are torch's. ``read_metadata`` first makes sure there is a ``.metadata`` at all: a
folder without one (a save killed before it finished: deepio's writer puts the metadata in
place last) is refused with ``FileNotFoundError`` saying so. ``read_data`` is deepio's:

- per data file, one ``deepio.File`` (direct I/O where the file system takes it), read with
  positional reads through the process's default engine, all of a batch in flight at once
  (up to ``READ_BATCH_BYTES`` of items, in file order);
- a file shorter than an item's range is refused before anything is read, and a read that
  comes back short after that, with ``deepio.CorruptFileError`` naming the file, the item's
  fully qualified name and the byte range;
- a tensor item of more than ``HEAD_BYTES + TAIL_BYTES`` has those first and last bytes read
  (torch.save's local headers, data.pkl and zip directory: ``_record.layout``); where the
  requested piece is one run of the stored bytes (``_record.piece``: the whole tensor, whole
  rows) and the destination a contiguous tensor of the stored dtype and the piece's shape, in
  host memory or in CUDA memory (where the engine found the CUDA driver: its GPU path,
  GPUDirect Storage or pinned staging), the piece is read straight into the destination: no
  copy, no torch.load;
- every other item (small ones, bytes items, column pieces, transposed tensors, other device
  or other-dtype destinations, stream extensions) is read whole into fresh host memory; there,
  a tensor record is rebuilt by ``torch.load`` (``weights_only=True``,
  ``map_location="cpu"``: torch's zip reader over the bytes read; no file I/O), narrowed to
  the requested piece and copied into the destination as torch does; a bytes item goes to
  ``planner.load_bytes`` as an ``io.BytesIO``; stream extensions are undone by torch's
  transforms over the bytes read.

A data file the metadata records by an absolute path (deepio's writer with ``extra_paths``) is
read from there, or from where ``folder_map`` says its folder moved; one that is missing is
refused with ``FileNotFoundError`` naming the file, its folder and ``folder_map``, before
anything is read. A rank's files in several folders (drives) are read one thread and one
engine per folder (``_DriveEngines``), all folders at once (``_read_folders``); the planner is
called by one of them at a time.

Thread-safety: one reader per load, as torch's.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import threading
from collections.abc import Mapping
from typing import Any, cast

import torch

from .. import _deepio
from .._errors import CorruptFileError
from .._file import File, Future
from ..checkpoint._zip import _MemoryFile
from . import _record
from . import _torchapi as T
from ._writer import _DriveEngines, _side_by_side

#: Bytes of items read ahead of being loaded (one item larger than this is read alone).
READ_BATCH_BYTES = 256 << 20
#: A tensor item's first and last bytes read to find its layout (_record.layout); an item of
#: at most both is read whole.
HEAD_BYTES = 4096
TAIL_BYTES = 4096


@functools.cache
def _engine_reads_cuda() -> bool:
    """Whether deepio's engine loaded the CUDA driver, so reads may go into CUDA tensors."""
    return bool(_deepio.gpu_info().get("cuda_found"))


class _OneAtATime:
    """A load planner as the folders' reading threads share it: each call it gets
    (``resolve_tensor``, ``commit_tensor``, ``load_bytes``) runs under one lock, so a planner
    sees one call at a time, as under torch's own reader."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner
        self._lock = threading.Lock()

    def resolve_tensor(self, req: Any) -> Any:
        with self._lock:
            return self._planner.resolve_tensor(req)

    def commit_tensor(self, req: Any, tensor: Any) -> None:
        with self._lock:
            self._planner.commit_tensor(req, tensor)

    def load_bytes(self, req: Any, value: Any) -> None:
        with self._lock:
            self._planner.load_bytes(req, value)


def _item_name(req: Any) -> str:
    idx = req.storage_index
    return f"{idx.fqn!r}" + (f" (chunk at {list(idx.offset)})" if idx.offset is not None else "")


class FileSystemReader(T.FileSystemReader):
    """``torch.distributed.checkpoint.FileSystemReader`` through deepio's engine (see the
    module). Same arguments as torch's: ``path`` and the experimental ``_extension_registry``.
    Reads checkpoints written by torch's FileSystemWriter and by deepio.dcp's alike. Use it as
    torch's: ``dcp.load(state_dict, storage_reader=deepio.dcp.FileSystemReader(path))``.

    deepio's own argument, keyword only: ``folder_map``, ``{old: new}`` for a checkpoint
    written with ``extra_paths`` whose extra folders moved: a data file the metadata records
    in folder ``old`` (the absolute path the writer was given) is read from ``new``. Relative
    paths are taken from the current folder. A data file whose folder is gone raises
    ``FileNotFoundError`` naming the file, its folder and ``folder_map``."""

    def __init__(self, path: Any, *args: Any, folder_map: Mapping[Any, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.folder_map: dict[str, str] = {
            os.path.abspath(os.fsdecode(old)): os.path.abspath(os.fsdecode(new))
            for old, new in (folder_map or {}).items()
        }

    def _data_path(self, relative_path: str) -> str:
        """Where a data file the metadata records as ``relative_path`` is: in the main path,
        or (an absolute path: deepio's writer with ``extra_paths``) in its folder, moved as
        ``folder_map`` says. A file in an extra folder that is not there is refused here,
        naming it, before any read."""
        if not os.path.isabs(relative_path):
            return os.fspath(self.fs.concat_path(self.path, relative_path))
        recorded, name = os.path.split(relative_path)
        folder = self.folder_map.get(recorded, recorded)
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            moved = f" (folder_map moved it from {recorded!r})" if folder != recorded else ""
            what = "does not exist" if not os.path.isdir(folder) else f"has no {name}"
            raise FileNotFoundError(
                errno.ENOENT,
                f"deepio.dcp: data file {path!r} of the checkpoint at {os.fspath(self.path)!r} is missing: "
                f"its folder {folder!r}{moved} {what}. The checkpoint was saved with extra_paths; if that "
                f"folder moved, pass folder_map={{{recorded!r}: NEW_FOLDER}} to deepio.dcp.FileSystemReader",
                path,
            )
        return path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = os.fspath(self._get_metadata_path(kwargs.get("rank")))
        if not os.path.exists(path):
            folder = os.fspath(self.path)
            what = "does not exist" if not os.path.isdir(folder) else "has no metadata file"
            raise FileNotFoundError(
                errno.ENOENT,
                f"deepio.dcp: no checkpoint at {folder!r}: the folder {what} ({os.path.basename(path)}); "
                "a save killed before it finished leaves its data files without one, and such a "
                "checkpoint is incomplete",
                path,
            )
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan: Any, planner: Any) -> Any:
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        paths = {relative_path: self._data_path(relative_path) for relative_path in per_file}
        per_folder: dict[str, list[tuple[str, list[Any]]]] = {}
        for relative_path, reqs in per_file.items():
            path = paths[relative_path]
            per_folder.setdefault(os.path.dirname(path), []).append((path, reqs))
        if len(per_folder) > 1:  # several drives (extra_paths): all at once
            self._read_folders(list(per_folder.values()), planner)
        else:
            for path, reqs in next(iter(per_folder.values()), []):
                self._read_file(path, reqs, planner)
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_folders(self, folders: list[list[tuple[str, list[Any]]]], planner: Any) -> None:
        """Reads the files of each folder (a drive, for a checkpoint saved with
        ``extra_paths``) on a thread of its own, every folder at once; the planner is called
        by one thread at a time (``_OneAtATime``). The first failure is raised once every
        thread has stopped; the others stop at their next file."""
        errors: list[BaseException] = []
        one = _OneAtATime(planner)
        engines = _DriveEngines(len(folders))

        def work(n: int) -> None:
            for path, reqs in folders[n]:
                if errors:
                    return
                try:
                    self._read_file(path, reqs, one, engines.handle(n))
                except BaseException as e:
                    errors.append(e)
                    return

        try:
            _side_by_side([functools.partial(work, n) for n in range(len(folders))], "deepio.dcp-read")
        finally:
            engines.close()
        if errors:
            raise errors[0]

    def _read_file(self, path: str, reqs: list[Any], planner: Any, handle: Any = None) -> None:
        with File(path, "r", handle=handle) as f:
            size = f.size()
            reqs = sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset)
            past = [r for r in reqs if self._end(r) > size]
            if past:
                info = self.storage_data[past[0].storage_index]
                more = f" ({len(past) - 1} more items past its end)" if len(past) > 1 else ""
                raise CorruptFileError(
                    path,
                    f"truncated: item {_item_name(past[0])} is stored at bytes [{info.offset}, "
                    f"{info.offset + info.length}) but the file has {size} bytes{more}",
                )
            start = 0
            while start < len(reqs):
                end, nbytes = start, 0
                while end < len(reqs) and (end == start or nbytes < READ_BATCH_BYTES):
                    nbytes += self.storage_data[reqs[end].storage_index].length
                    end += 1
                self._read_batch(f, path, reqs[start:end], planner)
                start = end

    def _end(self, req: Any) -> int:
        info = self.storage_data[req.storage_index]
        return int(info.offset + info.length)

    def _read_batch(self, f: File, path: str, reqs: list[Any], planner: Any) -> None:
        """Loads the items of ``reqs``: the first and last bytes of each large tensor item
        (its zip's local headers, data.pkl and directory), then each piece a request wants
        straight into its destination where ``_record`` says it is one run of bytes; every
        other item whole into host memory. Every read is waited for before anything is
        raised."""
        whole: dict[Any, torch.Tensor] = {}  # storage_index -> the item's bytes
        ends: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}  # storage_index -> (head, tail)
        reads: list[tuple[Future, Any, int]] = []
        first = self._submitting(reads, lambda: self._start_ends(f, reqs, whole, ends, reads))
        self._collect(path, reads, first)
        direct: list[tuple[Any, torch.Tensor]] = []
        first = self._submitting(reads, lambda: self._start_pieces(f, reqs, ends, whole, direct, planner, reads))
        self._collect(path, reads, first)
        for req, target in direct:
            planner.commit_tensor(req, target)
        done = {id(req) for req, _ in direct}
        for req in reqs:
            if id(req) not in done:
                self._load_item(req, whole[req.storage_index], planner)

    @staticmethod
    def _submitting(reads: list[Any], submit: Any) -> BaseException | None:
        try:
            submit()
        except BaseException as e:  # Ctrl-C: no read may outlive its buffer
            return e
        return None

    def _read(self, f: File, reads: list[Any], buf: torch.Tensor, at: int, req: Any) -> None:
        if buf.nbytes:
            reads.append((f.pread(buf, at), req, at))

    def _start_ends(self, f: File, reqs: list[Any], whole: dict, ends: dict, reads: list[Any]) -> None:
        for req in reqs:
            idx = req.storage_index
            if idx in whole or idx in ends:
                continue
            info = self.storage_data[idx]
            large = info.length > HEAD_BYTES + TAIL_BYTES
            if req.type == T.LoadItemType.BYTE_IO or info.transform_descriptors or not large:
                whole[idx] = torch.empty(info.length, dtype=torch.uint8)
                self._read(f, reads, whole[idx], info.offset, req)
                continue
            head, tail = torch.empty(HEAD_BYTES, dtype=torch.uint8), torch.empty(TAIL_BYTES, dtype=torch.uint8)
            ends[idx] = (head, tail)
            self._read(f, reads, head, info.offset, req)
            self._read(f, reads, tail, info.offset + info.length - TAIL_BYTES, req)

    def _start_pieces(
        self, f: File, reqs: list[Any], ends: dict, whole: dict, direct: list[Any], planner: Any, reads: list[Any]
    ) -> None:
        layouts = {
            idx: _record.layout(h.numpy().tobytes(), t.numpy().tobytes(), self.storage_data[idx].length)
            for idx, (h, t) in ends.items()
        }
        for req in reqs:
            idx = req.storage_index
            lay = layouts.get(idx)
            if idx in whole or idx not in layouts:
                continue
            info = self.storage_data[idx]
            target = self._destination(req, lay, planner)
            if target is not None:
                direct.append((req, target[0]))
                self._read(f, reads, target[0], info.offset + target[1], req)
            else:
                whole[idx] = torch.empty(info.length, dtype=torch.uint8)
                self._read(f, reads, whole[idx], info.offset, req)

    @staticmethod
    def _destination(req: Any, lay: _record.Layout | None, planner: Any) -> tuple[torch.Tensor, int] | None:
        """The destination tensor of ``req`` and where its bytes start in the item, where the
        piece is one run of the stored bytes and the destination a contiguous tensor of the
        stored dtype and the piece's shape, in host memory or (where deepio's engine found the
        CUDA driver) CUDA memory: the bytes then go straight into it (CUDA memory through the
        engine's GPU path: GPUDirect Storage, or pinned staging)."""
        if lay is None:
            return None
        where = _record.piece(lay, req.storage_offsets, req.lengths)
        if where is None:
            return None
        target = planner.resolve_tensor(req).detach()
        fits = (
            (target.device.type == "cpu" or (target.is_cuda and _engine_reads_cuda()))
            and target.dtype == lay.dtype
            and tuple(target.shape) == tuple(int(n) for n in req.lengths)
            and target.is_contiguous()
            and target.nbytes == where[1]
        )
        return (target, where[0]) if fits else None

    @staticmethod
    def _collect(path: str, reads: list[tuple[Future, Any, int]], first: BaseException | None) -> None:
        """Waits for every read of ``reads`` (emptied) and raises ``first``, a read's error or
        ``CorruptFileError`` for a short read."""
        for fut, req, at in reads:
            try:
                got = fut.result()
            except BaseException as e:
                first = first or e
                continue
            if got != fut.nbytes and first is None:
                first = CorruptFileError(
                    path,
                    f"truncated: item {_item_name(req)}: only {got} of the {fut.nbytes} bytes at {at} could be read",
                )
        reads.clear()
        if first is not None:
            raise first

    def _load_item(self, req: Any, buf: torch.Tensor, planner: Any) -> None:
        info = self.storage_data[req.storage_index]
        raw = memoryview(cast(Any, buf.numpy())) if buf.numel() else memoryview(b"")
        stream: Any = _MemoryFile(raw)
        if info.transform_descriptors:
            stream = self.transforms.transform_load_stream(req, info.transform_descriptors, io.BytesIO(raw))
            if req.type != T.LoadItemType.BYTE_IO and not stream.seekable():
                stream = io.BytesIO(stream.read(-1))
        if req.type == T.LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(stream.read(-1)))
            return
        tensor = cast(torch.Tensor, torch.load(stream, map_location="cpu", weights_only=True))
        tensor = T.narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"deepio.dcp: item {_item_name(req)}: the checkpoint holds a piece of size "
                f"{tuple(tensor.size())}, the destination is {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)
