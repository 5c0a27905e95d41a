"""``deepio.dcp.HuggingFaceStorageWriter`` and ``HuggingFaceStorageReader``:
torch.distributed.checkpoint's storage of a folder of ``.safetensors`` files (torch's classes of
the same names), with the tensor bytes written and read through deepio's engine.

The writer. Constructor, planning (``fqn_to_index_mapping``, ``save_distributed``), file names,
``model.safetensors.index.json`` and consolidation (``enable_consolidation``) are torch's.
deepio's is ``write_data``: each data file is written by ``deepio.safetensors.save_file`` (the
tensors from their own memory, CPU or CUDA, by direct I/O where the file system takes it; a
temporary name, fsync, rename and folder fsync) when ``sync_files`` (the default, as torch's),
else in place without a flush. The files are byte-identical to torch's writer's: the same
tensors in the same order (torch's loader order: as planned, or by size where torch would use
its CUDA-overlapping loader), the same ``__metadata__``. What torch would write wrongly is
refused before any file is written: a non-tensor value (torch writes its pickled bytes in front
of the safetensors data, a file nothing can read) raises ``ValueError`` naming it. I/O errors
raise the engine's ``OSError`` naming the file; a file being replaced is then untouched.

The reader. The constructor, the planning and the metadata (built by torch from each file's
header with ``safetensors.safe_open``) are torch's. deepio's:

- ``read_metadata`` first checks every ``.safetensors`` file of the folder with deepio's
  safetensors parser (``deepio.safetensors.read_header``), so that a truncated or corrupt file
  is refused with ``deepio.CorruptFileError`` naming the file (torch's message names none);
- ``read_data``, per data file: the header parsed once (the same parser: the file is checked
  again, it may have changed since the metadata was read); each item whose requested piece is
  one run of the stored tensor's bytes (``_record.piece``: the whole tensor, or whole
  leading-dimension rows) and whose destination (``planner.resolve_tensor``) is a contiguous
  host or CUDA tensor of the stored dtype and the piece's shape (CUDA where the engine found
  the driver, through its GPU path) is read straight into the destination
  through the process's default engine (one ``deepio.File``, direct I/O where the file system
  takes it, all of the file's reads in flight at once), then committed;
- a read error raises the engine's ``OSError`` naming the file, a short read
  ``deepio.CorruptFileError`` naming the file, the item and the byte range (as
  ``deepio.dcp.FileSystemReader``); every read is waited for before anything is raised;
- every other item (column pieces, other-dtype or non-contiguous or other-device destinations, F4
  and other dtypes torch cannot view directly) goes to torch's own ``_process_read_request``
  over ``safe_open`` (``get_slice`` and ``copy_``), after the direct reads of its file.

``thread_count`` is accepted and ignored by both: the engine's workers write and read in
parallel already. Thread-safety: one writer per save and one reader per load, as torch's.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .._file import File, Future
from ..safetensors._format import Header, TensorInfo
from ..safetensors._load import read_header
from ..safetensors._save import save_file, write_in_place
from ..safetensors._tensors import torch_dtype
from . import _record, _savelock
from ._common import item_nbytes, overlapping_order
from ._reader import FileSystemReader

try:
    from torch.distributed.checkpoint import _hf_utils
    from torch.distributed.checkpoint import hf_storage as _hf_storage
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    _SUFFIX = _hf_utils.SUFFIX
    _TorchHFReader: Any = _hf_storage.HuggingFaceStorageReader
    _TorchHFWriter: Any = _hf_storage.HuggingFaceStorageWriter
    _FILE_METADATA = {  # what torch's writer puts in every file's __metadata__, less the items
        _hf_utils.DCP_VERSION_KEY: str(_hf_utils.HF_DCP_VERSION),
        _hf_utils.FORMAT_KEY: _hf_utils.FORMAT_VALUE,
    }
    _gen_file_name = _hf_utils._gen_file_name
    _CUSTOM_METADATA_KEY = _hf_utils.CUSTOM_METADATA_KEY
except (ImportError, AttributeError) as e:  # pragma: no cover - depends on the torch installed
    raise ImportError(
        f"deepio.dcp needs torch.distributed.checkpoint's HuggingFace storage as torch 2.13 has it; "
        f"torch {torch.__version__} lacks {e}"
    ) from e


def _read_into(f: File, buf: torch.Tensor, at: int) -> Future:
    """Starts the engine read of ``buf.nbytes`` bytes at ``at`` into ``buf`` (one place, so
    that tests can count what went straight into destinations)."""
    return f.pread(buf, at)


def _place(header: Header, t: TensorInfo | None, req: Any, planner: Any) -> tuple[torch.Tensor, int] | None:
    """The destination of ``req`` as bytes and where its piece starts in the file, where the
    piece of stored tensor ``t`` is one run of bytes and the destination a contiguous host (or
    CUDA) tensor of the stored dtype and the piece's shape (``FileSystemReader._destination``);
    None otherwise (torch then reads it)."""
    if t is None or t.dtype == "F4":  # F4: the file counts values, torch packs two a byte
        return None
    try:
        dtype = torch_dtype(header, t)
    except ValueError:
        return None
    lay = _record.Layout(
        dtype, t.shape, _record._contiguous_strides(t.shape), 0, header.data_offset + t.begin, t.nbytes
    )
    return FileSystemReader._destination(req, lay, planner)  # the same test as DCP's own format's


class HuggingFaceStorageReader(_TorchHFReader):
    """``torch.distributed.checkpoint.HuggingFaceStorageReader`` through deepio's engine (see
    the module). Same arguments as torch's (``path``, ``thread_count``). Use it as torch's:
    ``dcp.load(state_dict, storage_reader=deepio.dcp.HuggingFaceStorageReader(path))``.

    Raises, besides torch's errors: ``deepio.CorruptFileError`` (a ValueError) naming the file
    for a truncated or corrupt ``.safetensors`` file, the engine's ``OSError`` naming the file
    for a read error."""

    def read_metadata(self) -> Any:
        for name in sorted(self.fs.ls(self.path)):
            if os.fspath(name).endswith(_SUFFIX):
                read_header(name)
        return super().read_metadata()

    def read_data(self, plan: Any, planner: Any) -> Any:
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(os.fspath(self.storage_data[req.storage_index].relative_path), []).append(req)
        for path, reqs in per_file.items():
            self._read_file(path, reqs, planner)
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_file(self, path: str, reqs: list[Any], planner: Any) -> None:
        header = read_header(path)
        tensors = {t.name: t for t in header.tensors}
        direct: list[tuple[Any, torch.Tensor, int]] = []
        rest: list[Any] = []
        for req in reqs:
            place = _place(header, tensors.get(req.storage_index.fqn), req, planner)
            if place is None:
                rest.append(req)
            else:
                direct.append((req, place[0], place[1]))
        if direct:
            direct.sort(key=lambda d: d[2])
            with File(path, "r") as f:
                reads: list[tuple[Future, Any, int]] = []
                first = FileSystemReader._submitting(reads, lambda: self._start(f, direct, reads))
                FileSystemReader._collect(path, reads, first)
            for req, target, _ in direct:
                planner.commit_tensor(req, target)
        if rest:
            from safetensors import safe_open

            with safe_open(filename=path, framework="pt") as sf:
                for req in rest:
                    self._process_read_request(sf, req, planner)

    @staticmethod
    def _start(f: File, direct: list[tuple[Any, torch.Tensor, int]], reads: list[tuple[Future, Any, int]]) -> None:
        for req, target, at in direct:
            buf = target.reshape(-1).view(torch.uint8)
            if buf.nbytes:
                reads.append((_read_into(f, buf, at), req, at))


class HuggingFaceStorageWriter(_TorchHFWriter):
    """``torch.distributed.checkpoint.HuggingFaceStorageWriter`` through deepio's engine (see
    the module). Same arguments as torch's (``path``, ``fqn_to_index_mapping``,
    ``thread_count``, ``save_distributed``, ``enable_consolidation``,
    ``thread_count_consolidation``); ``sync_files`` (an attribute, True as torch's) chooses the
    durable write. Use it as torch's:
    ``dcp.save(state_dict, storage_writer=deepio.dcp.HuggingFaceStorageWriter(path))``.

    Raises, besides torch's errors (``dcp.save`` wraps each in its ``CheckpointException``):
    ``ValueError`` naming a non-tensor value, before any file is written; the engine's
    ``OSError`` naming the file for I/O.

    Two saves of one folder run one after the other: the coordinator holds the folder's save
    lock (``_savelock``, as ``deepio.dcp.FileSystemWriter``) from ``prepare_global_plan`` to
    the end of ``finish``, so the files of two saves never mix (torch's writer replaces the
    files one by one: the folder holds no whole checkpoint while a save runs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._save_lock: _savelock.SaveLock | None = None
        self._ranks = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_save_lock"] = None  # a lock this process holds stays here
        return state

    def _give_back(self) -> None:
        held, self._save_lock = self._save_lock, None
        if held is not None:
            held.release()

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        folder = os.path.abspath(os.fspath(self.consolidated_output_path or self.path))
        alone = not self.use_collectives and self.rank is not None
        name = f".deepio-save-{self.rank}.lock" if alone else ".deepio-save.lock"
        self._save_lock = _savelock.lock(os.path.join(folder, name))
        try:
            plans = super().prepare_global_plan(plans)
        except BaseException:
            self._give_back()
            raise
        self._ranks = len(plans)
        return plans

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        try:
            super().finish(metadata, results)
        finally:
            self._give_back()

    def write_data(self, plan: Any, planner: Any) -> Any:
        try:
            return self._write_data(plan, planner)
        except BaseException:
            if not self.use_collectives or self._ranks == 1:  # no other rank writes for this save
                self._give_back()
            raise

    def _write_data(self, plan: Any, planner: Any) -> Any:
        odd = [i.index.fqn for i in plan.items if i.type == WriteItemType.BYTE_IO]
        if odd:
            raise ValueError(
                f"deepio.dcp.HuggingFaceStorageWriter: {odd[0]!r} is not a tensor, and a .safetensors file holds "
                f"tensors only (torch's writer would put its pickled bytes in front of the file's header)"
            )
        storage = plan.storage_data or {}
        mapping = storage.get("fqn_to_index_mapping")
        highest = max(mapping.values()) if mapping else 1
        results: list[Any] = []
        if plan.items:
            for index, items in self._split_by_storage_plan(mapping, plan.items).items():
                name = _gen_file_name(index, highest, storage.get("shard_index"))
                results += self._write_file(os.fspath(self.fs.concat_path(self.path, name)), name, items, planner)
        fut: torch.futures.Future[list[Any]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def _write_file(self, path: str, name: str, items: list[Any], planner: Any) -> list[Any]:
        """Writes one data file of ``items`` as torch's writer would, through the engine."""
        if overlapping_order(self):
            items = sorted(items, key=item_nbytes)  # stable, as torch's loader's sort
        tensors: dict[str, torch.Tensor] = {}
        offsets: dict[str, Any] = {}
        results = []
        for item in items:
            t = planner.resolve_data(item).detach()
            if t.untyped_storage().nbytes() != t.nbytes:  # a view: its own minimal storage, as torch
                t = t.clone()
            tensors[item.index.fqn] = t
            offsets[item.index.fqn] = {"saved_offsets": item.tensor_data.chunk.offsets}
            results.append(
                WriteResult(index=item.index, size_in_bytes=t.nbytes, storage_data=_StorageInfo(name, 0, t.nbytes))
            )
        metadata = {_CUSTOM_METADATA_KEY: json.dumps(offsets), **_FILE_METADATA}
        if self.sync_files:
            save_file(tensors, path, metadata)
        else:
            write_in_place(tensors, path, metadata)
        return results
