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
- a tensor item of at most ``WHOLE_BYTES`` is read whole in one request and its layout read
  from its first and last bytes as it lands; a larger one has its first ``HEAD_BYTES`` and
  last ``TAIL_BYTES`` read (torch.save's local headers, data.pkl and zip directory:
  ``_record.layout``); where the requested piece is one run of the stored bytes
  (``_record.piece``: the whole tensor, whole rows) and the destination a contiguous tensor
  of the stored dtype and the piece's shape, in host memory or in CUDA memory (where the
  engine found the CUDA driver), the piece is copied from the item read whole, or read
  straight into the destination: no torch.load. CUDA memory is read through
  the same engine as host memory (the given handle or the default engine; GPUDirect Storage
  where the engine's device route finds it usable, else its staging pipeline), the read submitted
  on the thread that called ``read_data`` (``_OnCaller``), so that its ordering event is
  recorded on that thread's current stream;
- with ``verify_crc`` (the default) each stored record read is checked against the CRC-32 its
  zip records, before the batch's items reach the planner, on the load's pool of threads
  (``_crc.Sums``) as the reads land: an item read whole, its data.pkl and storage records
  (``_record.bad_layout``; every record, ``_record.bad_record``, where it has no layout); a
  piece read straight into its destination, its data.pkl (from the first bytes read) and its
  storage's record, read in ``_crc.PIECE_BYTES`` requests whose CRC-32s are combined
  (``_read_checked``; CUDA memory in one request, copied back for its CRC-32); a piece that
  is part of its record (a resharded load's rows) goes into its destination and the rest of
  the record into scratch host memory, all of it checked (the format has one CRC-32 per
  record: docs/checkpoints.md). A mismatch is ``deepio.CorruptFileError`` naming the file
  and the item. Records without a CRC-32 (0), bytes items and stream extensions are not
  checked;
- every other item (bytes items, column pieces, transposed tensors, other device or
  other-dtype destinations, stream extensions) is read whole into fresh host memory; there,
  a tensor record is rebuilt by ``torch.load`` (``weights_only=True``,
  ``map_location="cpu"``: torch's zip reader over the bytes read; no file I/O), narrowed to
  the requested piece and copied into the destination as torch does; a bytes item goes to
  ``planner.load_bytes`` as an ``io.BytesIO``; stream extensions are undone by torch's
  transforms over the bytes read.

Ownership (``_owner``): a data file not at torch's names at the top of the main path must end
with the owner mark of the save ``.metadata`` records (``StorageMeta.save_id``); one that
names another save, or has none, is refused with ``deepio.CorruptFileError`` naming both
checkpoints, before its items are read.

A data file the metadata records by an absolute path (deepio's writer with ``extra_paths``) is
read from there, or from where ``folder_map`` says its folder moved; one that is missing is
refused with ``FileNotFoundError`` naming the file, its folder and ``folder_map``, before
anything is read. A rank's files in several folders (drives) are read one thread per folder,
all folders at once through the one default engine (``_read_folders``); the planner is called
by one of them at a time.

Thread-safety: one reader per load, as torch's.
"""

from __future__ import annotations

import errno
import functools
import io
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from .. import _deepio
from .._errors import CorruptFileError
from .._file import File, Future
from ..checkpoint._zip import _MemoryFile
from . import _crc, _owner, _record
from . import _torchapi as T
from ._common import side_by_side
from ._handover import _OnCaller, _OneAtATime

#: Bytes of items read ahead of being loaded (one item larger than this is read alone).
READ_BATCH_BYTES = 256 << 20
#: A tensor item's first and last bytes read to find its layout (_record.layout); an item of
#: at most both is read whole.
HEAD_BYTES = 4096
TAIL_BYTES = 4096
#: Tensor items of at most this many bytes are read whole at once (one request, no second
#: round trip for their layout), their piece copied into the destination from there.
WHOLE_BYTES = 1 << 20


@functools.cache
def _engine_reads_cuda() -> bool:
    """Whether deepio's engine loaded the CUDA driver, so reads may go into CUDA tensors."""
    return bool(_deepio.gpu_info().get("cuda_found"))


def _crc_message(req: Any, what: str, stored: int, got: int) -> str:
    return (
        f"item {_item_name(req)}: {what} does not match its CRC-32 (recorded {stored:08x}, read {got:08x}): "
        "the file changed after it was written (load with verify_crc=False to skip this check)"
    )


def _item_name(req: Any) -> str:
    idx = req.storage_index
    return f"{idx.fqn!r}" + (f" (chunk at {list(idx.offset)})" if idx.offset is not None else "")


class FileSystemReader(T.FileSystemReader):
    """``torch.distributed.checkpoint.FileSystemReader`` through deepio's engine (see the
    module). Same arguments as torch's: ``path`` and the experimental ``_extension_registry``.
    Reads checkpoints written by torch's FileSystemWriter and by deepio.dcp's alike. Use it as
    torch's: ``dcp.load(state_dict, storage_reader=deepio.dcp.FileSystemReader(path))``.

    deepio's own arguments, keyword only: ``verify_crc=True`` (False: no CRC-32 check of
    the records read; see the module) and ``folder_map``, ``{old: new}`` for a checkpoint
    written with ``extra_paths`` whose extra folders moved: a data file the metadata records
    in folder ``old`` (the absolute path the writer was given) is read from ``new``. Relative
    paths are taken from the current folder. A data file whose folder is gone raises
    ``FileNotFoundError`` naming the file, its folder and ``folder_map``."""

    def __init__(
        self,
        path: Any,
        *args: Any,
        folder_map: Mapping[Any, Any] | None = None,
        verify_crc: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, *args, **kwargs)
        self.folder_map: dict[str, str] = {
            os.path.abspath(os.fsdecode(old)): os.path.abspath(os.fsdecode(new))
            for old, new in (folder_map or {}).items()
        }
        self.verify_crc = bool(verify_crc)
        self._owner: _owner.Owner | None = None
        self._on_caller = _OnCaller()
        self._sums = _crc.Sums()

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        meta = getattr(metadata, "storage_meta", None)
        save_id = getattr(meta, "save_id", None)
        self._owner = _owner.Owner(os.path.abspath(os.fspath(self.path)), save_id) if save_id else None

    def _data_path(self, relative_path: str) -> str:
        """Where a data file the metadata records as ``relative_path`` is: in the main path,
        or (an absolute path: deepio's writer with ``extra_paths``) in its folder, moved as
        ``folder_map`` says. A file in an extra folder that is not there is refused here,
        naming it, before any read."""
        if not os.path.isabs(relative_path):
            return os.fspath(self.fs.concat_path(self.path, relative_path))
        # The extra folder the writer was given: the file's folder, or (deepio's naming since
        # issue 36: _owner.extra_dir) that folder's parent.
        recorded, name = os.path.split(relative_path)
        if _owner.is_extra_dir(os.path.basename(recorded)):
            recorded, name = os.path.dirname(recorded), os.path.join(os.path.basename(recorded), name)
        folder = self.folder_map.get(recorded, recorded)
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            moved = f" (folder_map moved it from {recorded!r})" if folder != recorded else ""
            what = "does not exist" if not os.path.isdir(folder) else f"has no {name}"
            if os.path.isdir(folder) and not os.path.isdir(os.path.dirname(path)):
                what = f"has no {os.path.dirname(name)} (the folder of this save's files)"
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
        self._on_caller = _OnCaller()  # this thread's: reads into CUDA memory are submitted on it
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        paths = {relative_path: self._data_path(relative_path) for relative_path in per_file}
        per_folder: dict[str, list[tuple[str, list[Any]]]] = {}
        for relative_path, reqs in per_file.items():
            path = paths[relative_path]
            per_folder.setdefault(os.path.dirname(path), []).append((path, reqs))
        self._sums = _crc.Sums()  # this load's CRC threads
        try:
            if len(per_folder) > 1:  # several drives (extra_paths): all at once
                self._read_folders(list(per_folder.values()), planner)
            else:
                for path, reqs in next(iter(per_folder.values()), []):
                    self._read_file(path, reqs, planner)
        finally:
            self._sums.close()
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_folders(self, folders: list[list[tuple[str, list[Any]]]], planner: Any) -> None:
        """Reads the files of each folder (a drive, for a checkpoint saved with
        ``extra_paths``) on a thread of its own, every folder at once, while the calling
        thread submits their reads into CUDA memory (``_OnCaller``); the planner is called
        by one thread at a time (``_OneAtATime``). The first failure is raised once every
        thread has stopped; the others stop at their next file."""
        errors: list[BaseException] = []
        one = _OneAtATime(planner)
        caller = self._on_caller

        def work(n: int) -> None:
            try:
                for path, reqs in folders[n]:
                    if errors:
                        return
                    try:
                        self._read_file(path, reqs, one)
                    except BaseException as e:
                        errors.append(e)
                        return
            finally:
                caller.ended()

        tasks: list[Callable[[], None]] = [functools.partial(caller.serve, len(folders))]
        tasks += [functools.partial(work, n) for n in range(len(folders))]
        try:
            side_by_side(tasks, "deepio.dcp-read")
        finally:
            caller.close()
        if errors:
            raise errors[0]

    def _expects_mark(self, reqs: list[Any]) -> bool:
        """Whether the file of ``reqs`` must carry this checkpoint's owner mark: every file in
        a save's folder (``_owner``: in an extra folder, or ``save.*`` in the main path), where
        the metadata records a save id. Files at torch's names at the top of the main path
        carry none, nor do those of checkpoints saved before issue 36 with ``extra_paths``
        (at the top of the extra folders): those still load, unchecked."""
        rel = self.storage_data[reqs[0].storage_index].relative_path if reqs else ""
        parent = os.path.basename(os.path.dirname(rel))
        if os.path.isabs(rel):
            return self._owner is not None and _owner.is_extra_dir(parent)
        return self._owner is not None and _owner.is_save_dir(parent)

    def _check_owner(self, f: File, path: str, size: int) -> None:
        """Refuses a file whose owner mark names another checkpoint (or that has none) with
        CorruptFileError naming both."""
        assert self._owner is not None
        n = min(size, _owner.MAX_MARK)
        tail = torch.empty(n, dtype=torch.uint8)
        if n:
            got = f.read_into(tail, size - n)
            if got != n:
                raise CorruptFileError(path, f"truncated: only {got} of its last {n} bytes could be read")
        found = _owner.owner(tail.numpy().tobytes())
        if found is None:
            raise CorruptFileError(
                path,
                f"not a data file of {self._owner}: it carries no owner mark (deepio.dcp marks every data file "
                "outside the main path's top with the checkpoint that wrote it)",
            )
        if found.save_id != self._owner.save_id:
            raise CorruptFileError(
                path,
                f"a data file of {found}, not of {self._owner}, whose metadata points here: "
                "the file was replaced after this checkpoint was saved",
            )

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
            if self._expects_mark(reqs):
                self._check_owner(f, path, size)
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
        straight into its destination where ``_record`` says it is one run of bytes (into
        CUDA memory too, through the same file and engine, submitted on the caller's thread); every
        other item whole into host memory. Every read is waited for before anything is
        raised; with ``verify_crc`` each stored record read is checked against its CRC-32
        before any of the batch's items is committed, the CRC-32s computed on the load's
        threads (``_crc.Sums``) as the reads land, beside the later reads."""
        whole: dict[Any, torch.Tensor] = {}  # storage_index -> the item's bytes
        ends: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}  # storage_index -> (head, tail)
        # storage_index -> an item read whole: its layout (None: torch.load rebuilds it), and the
        # future result of its check (_record.bad_layout, or bad_record where no layout)
        laid: dict[Any, _record.Layout | None] = {}
        checks: dict[Any, Any] = {}
        reads: list[tuple[Future, Any, int, Callable[[], None] | None]] = []
        first = self._submitting(reads, lambda: self._start_ends(f, reqs, whole, ends, laid, checks, reads))
        self._collect(path, reads, first)
        direct: list[tuple[Any, torch.Tensor, _crc.Record | None]] = []  # (request, destination, its check)
        device = lambda: f  # noqa: E731 - _start_pieces takes the file for CUDA reads lazily
        first = self._submitting(
            reads, lambda: self._start_pieces(f, path, reqs, ends, whole, laid, checks, direct, planner, reads, device)
        )
        self._collect(path, reads, first)
        for req, _, rec in direct:
            got = rec.crc() if rec is not None else 0
            if rec is not None and got != rec.expected:
                raise CorruptFileError(path, _crc_message(req, "the tensor's data", rec.expected, got))
        for req in reqs:
            check = checks.pop(req.storage_index, None)
            bad = check.result() if check is not None else None
            if bad is not None:
                raise CorruptFileError(path, _crc_message(req, f"its record {bad[0]!r}", bad[1], bad[2]))
        for req, target, _ in direct:
            planner.commit_tensor(req, target)
        done = {id(req) for req, _, _ in direct}
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

    def _read(
        self, f: File, reads: list[Any], buf: torch.Tensor, at: int, req: Any, landed: Callable[[], None] | None = None
    ) -> None:
        if buf.nbytes:
            reads.append((f.pread(buf, at), req, at, landed))

    def _read_whole(self, f: File, reads: list[Any], req: Any, whole: dict, laid: dict, checks: dict) -> None:
        """Reads ``req``'s item whole into host memory. Once a tensor item (without stream
        extensions) landed, its layout is read (``_record.layout``: ``laid``) and, with
        ``verify_crc``, its records' CRC-32s start on the load's threads (``checks``):
        data.pkl's and the storage's, or every record's where it has no layout."""
        info = self.storage_data[req.storage_index]
        buf = whole[req.storage_index] = torch.empty(info.length, dtype=torch.uint8)
        landed = None
        if req.type != T.LoadItemType.BYTE_IO and not info.transform_descriptors:

            def landed() -> None:
                raw = buf.numpy()
                lay = laid[req.storage_index] = _record.layout(
                    raw[:HEAD_BYTES].tobytes(), raw[-TAIL_BYTES:].tobytes(), info.length
                )
                if self.verify_crc:
                    check = (
                        functools.partial(_record.bad_layout, lay, raw, _crc.crc32)
                        if lay is not None
                        else functools.partial(_record.bad_record, raw, _crc.crc32)
                    )
                    checks[req.storage_index] = self._sums.run(check, info.length)

        self._read(f, reads, buf, info.offset, req, landed)

    def _read_checked(
        self, f: File, reads: list[Any], req: Any, segments: list[tuple[torch.Tensor, int]], expected: int
    ) -> _crc.Record:
        """Reads ``segments`` ([(flat uint8 tensor, file offset)]: one stored record's bytes
        in its order) in ``_crc.PIECE_BYTES`` requests (a CUDA tensor in one, submitted on the
        caller's thread), each piece's CRC-32 started as soon as it landed; returns the
        record's check."""
        step = max(1, _crc.PIECE_BYTES)
        pieces = [
            (buf[lo : lo + (max(1, buf.numel()) if buf.is_cuda else step)], at + lo)
            for buf, at in segments
            for lo in range(0, buf.numel(), max(1, buf.numel()) if buf.is_cuda else step)
        ]
        rec = self._sums.record(len(pieces), expected)
        for k, (piece, at) in enumerate(pieces):
            landed = functools.partial(rec.landed, k, piece)
            if piece.is_cuda:
                self._on_caller.run(functools.partial(self._read, f, reads, piece, at, req, landed))
            else:
                self._read(f, reads, piece, at, req, landed)
        return rec

    def _start_ends(
        self, f: File, reqs: list[Any], whole: dict, ends: dict, laid: dict, checks: dict, reads: list[Any]
    ) -> None:
        for req in reqs:
            idx = req.storage_index
            if idx in whole or idx in ends:
                continue
            info = self.storage_data[idx]
            large = info.length > max(WHOLE_BYTES, HEAD_BYTES + TAIL_BYTES)
            if req.type == T.LoadItemType.BYTE_IO or info.transform_descriptors or not large:
                self._read_whole(f, reads, req, whole, laid, checks)
                continue
            head, tail = torch.empty(HEAD_BYTES, dtype=torch.uint8), torch.empty(TAIL_BYTES, dtype=torch.uint8)
            ends[idx] = (head, tail)
            self._read(f, reads, head, info.offset, req)
            self._read(f, reads, tail, info.offset + info.length - TAIL_BYTES, req)

    def _start_pieces(
        self,
        f: File,
        path: str,
        reqs: list[Any],
        ends: dict,
        whole: dict,
        laid: dict,
        checks: dict,
        direct: list[Any],
        planner: Any,
        reads: list[Any],
        on_device: Callable[[], File],
    ) -> None:
        layouts = {
            idx: _record.layout(h.numpy().tobytes(), t.numpy().tobytes(), self.storage_data[idx].length)
            for idx, (h, t) in ends.items()
        }
        for idx, lay in layouts.items() if self.verify_crc else ():
            bad = _record.bad_pkl(lay, ends[idx][0].numpy(), _crc.crc32) if lay is not None else None
            if bad is not None:
                req = next(r for r in reqs if r.storage_index == idx)
                raise CorruptFileError(path, _crc_message(req, f"its record {bad[0]!r}", bad[1], bad[2]))
        for req in reqs:
            idx = req.storage_index
            if idx in whole:
                self._copy_piece(req, whole[idx], laid.get(idx), direct, planner)
                continue
            lay = layouts.get(idx)
            if idx not in layouts:
                continue
            info = self.storage_data[idx]
            target = self._destination(req, lay, planner)
            if target is None:
                self._read_whole(f, reads, req, whole, laid, checks)
                continue
            assert lay is not None
            dest, at = target
            g = on_device() if dest.is_cuda else f
            if not (self.verify_crc and lay.crc):
                direct.append((req, dest, None))
                if dest.is_cuda:
                    self._on_caller.run(functools.partial(self._read, g, reads, dest, info.offset + at, req))
                else:
                    self._read(f, reads, dest, info.offset + at, req)
                continue
            # The record's CRC-32 covers all its bytes: those of the piece land in the
            # destination, the others (a resharded load's part of a stored tensor) in scratch
            # memory; the pieces' CRC-32s are combined (_crc.Record).
            flat = _crc.flat_bytes(dest)
            start, end = lay.data_start, lay.data_start + lay.data_nbytes
            before = torch.empty(at - start, dtype=torch.uint8)
            after = torch.empty(end - at - flat.numel(), dtype=torch.uint8)
            o = info.offset
            segments = [(before, o + start), (flat, o + at), (after, o + at + flat.numel())]
            rec = self._read_checked(g, reads, req, segments, lay.crc)
            direct.append((req, dest, rec))

    def _copy_piece(
        self, req: Any, buf: torch.Tensor, lay: _record.Layout | None, direct: list[Any], planner: Any
    ) -> None:
        """Where the piece ``req`` wants of an item read whole (``buf``) is one run of bytes
        and its destination fits (``_destination``), copies it there (into CUDA memory on the
        caller's thread) and lists it in ``direct``; else leaves it to torch.load
        (``_load_item``). The item's check is its own (``_read_whole``)."""
        target = self._destination(req, lay, planner) if lay is not None else None
        if target is None:
            return
        dest, at = target
        flat = _crc.flat_bytes(dest)
        src = buf[at : at + flat.numel()]
        if dest.is_cuda:
            self._on_caller.run(functools.partial(flat.copy_, src))
        elif flat.numel():  # a memcpy: torch's copy_ of as many uint8 elements would start its threads
            flat.numpy()[:] = src.numpy()
        direct.append((req, dest, None))

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
    def _collect(path: str, reads: list[Any], first: BaseException | None) -> None:
        """Waits for every read of ``reads`` ((future, request, offset[, landed]), emptied, in
        order) and raises ``first``, a read's error or ``CorruptFileError`` for a short read;
        ``landed()`` is called once its read is complete while nothing failed yet."""
        for fut, req, at, *rest in reads:
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
            elif rest and rest[0] is not None and first is None:
                try:
                    rest[0]()
                except BaseException as e:
                    first = e
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
        if target.is_cuda:  # on the caller's current stream, from its thread (_OnCaller)
            self._on_caller.run(functools.partial(target.copy_, tensor))
        else:
            target.copy_(tensor)
        planner.commit_tensor(req, target)
