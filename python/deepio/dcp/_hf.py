"""``deepio.dcp.HuggingFaceStorageReader``: torch.distributed.checkpoint's
HuggingFaceStorageReader (a folder of ``.safetensors`` files) whose tensor bytes are read
through deepio's engine.

What is torch's and what is deepio's. The constructor, the planning and the metadata (built by
torch from each file's header with ``safetensors.safe_open``) are torch's. deepio's:

- ``read_metadata`` first checks every ``.safetensors`` file of the folder with deepio's
  safetensors parser (``deepio.safetensors.read_header``), so that a truncated or corrupt file
  is refused with ``deepio.CorruptFileError`` naming the file (torch's message names none);
- ``read_data``, per data file: the header parsed once (the same parser: the file is checked
  again, it may have changed since the metadata was read); each item whose requested piece is
  one run of the stored tensor's bytes (``_record.piece``: the whole tensor, or whole
  leading-dimension rows) and whose destination (``planner.resolve_tensor``) is a contiguous
  host tensor of the stored dtype and the piece's shape is read straight into the destination
  through the process's default engine (one ``deepio.File``, direct I/O where the file system
  takes it, all of the file's reads in flight at once), then committed;
- a read error raises the engine's ``OSError`` naming the file, a short read
  ``deepio.CorruptFileError`` naming the file, the item and the byte range (as
  ``deepio.dcp.FileSystemReader``); every read is waited for before anything is raised;
- every other item (column pieces, other-dtype or non-contiguous or device destinations, F4
  and other dtypes torch cannot view directly) goes to torch's own ``_process_read_request``
  over ``safe_open`` (``get_slice`` and ``copy_``), after the direct reads of its file.

``thread_count`` is accepted and ignored: the engine's workers read in parallel already.
Thread-safety: one reader per load, as torch's.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .._file import File, Future
from ..safetensors._format import Header, TensorInfo
from ..safetensors._load import read_header
from ..safetensors._tensors import torch_dtype
from . import _record
from ._reader import FileSystemReader

try:
    from torch.distributed.checkpoint import hf_storage as _hf_storage
    from torch.distributed.checkpoint._hf_utils import SUFFIX as _SUFFIX

    _TorchHFReader: Any = _hf_storage.HuggingFaceStorageReader
except (ImportError, AttributeError) as e:  # pragma: no cover - depends on the torch installed
    raise ImportError(
        f"deepio.dcp needs torch.distributed.checkpoint's HuggingFaceStorageReader as torch 2.13 has it; "
        f"torch {torch.__version__} lacks {e}"
    ) from e


def _read_into(f: File, buf: torch.Tensor, at: int) -> Future:
    """Starts the engine read of ``buf.nbytes`` bytes at ``at`` into ``buf`` (one place, so
    that tests can count what went straight into destinations)."""
    return f.pread(buf, at)


def _place(header: Header, t: TensorInfo | None, req: Any, planner: Any) -> tuple[torch.Tensor, int] | None:
    """The destination of ``req`` as bytes and where its piece starts in the file, where the
    piece of stored tensor ``t`` is one run of bytes and the destination a contiguous host
    tensor of the stored dtype and the piece's shape; None otherwise (torch then reads it)."""
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
