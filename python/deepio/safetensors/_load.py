"""Loading: ``read_header``, ``load_file``, ``load_files``, ``load``.

Every header is read and checked completely (``_format.parse``) before any data is read, so a
corrupt or truncated file raises ``deepio.CorruptFileError`` naming the file and the tensor,
and no dict is ever returned half filled. To the CPU (``backend="direct"``) the data sections
of all the files are read by deepio's one whole-file reader (``_cpu.read_files``, over
``deepio._wholefile.read_many``: large engine requests, direct I/O, every file in flight at
once) into ONE page-aligned buffer per file; each CPU tensor is a ``torch.frombuffer`` view of
its range with a storage of its own (as safetensors gives), and all of them keep the buffer
alive: the memory returns to the system when the last tensor of the file is dropped. A tensor
whose range is not aligned to its element size (possible only in files written by other tools)
is copied. To a CUDA device the data section goes into one device allocation through the
engine's GPU path (GPUDirect Storage where usable, else the staging pipeline: bounded pinned
slots, no full-size host copy) and tensors are views of that allocation (they share its
storage).

Errors: when a load raises, every request it queued has finished (``_io.run``, and
``_wholefile.read_many`` for CPU loads). Thread-safe: loads in several threads at once share
the default engine; the knobs of ``_io``, ``_cpu`` and ``deepio._wholefile`` must not change
during a load."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Union

from .. import _deepio
from . import _cpu
from ._format import MAX_HEADER_BYTES, Header, header_end, parse
from ._io import engine, run, submit_read
from ._tensors import as_bytes, torch_dtype, torch_module, torch_shape

if TYPE_CHECKING:  # pragma: no cover
    import torch

PathArg = Union[str, "os.PathLike[str]"]

# CPU loads (docs/models.md, "Reading"): "direct" reads with the engine into fresh anonymous
# memory (deepio._wholefile, the reader deepio.load uses too); "mmap" maps each file
# copy-on-write and faults the mapping in from the page cache on helper threads (tensors tied
# to the file, as safetensors' own).
_BACKENDS = ("direct", "mmap")
DEFAULT_BACKEND = "direct"


def _pread_exact(fd: int, nbytes: int, offset: int) -> bytes:
    """Up to ``nbytes`` from ``offset``: fewer only at the end of the file."""
    parts, got = [], 0
    while got < nbytes:
        b = os.pread(fd, nbytes - got, offset + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_header(path: PathArg) -> Header:
    """Reads and checks a file's header (no tensor data): one read of the first 64 KiB, a
    second where the header is longer. CorruptFileError (a ValueError) for a corrupt file,
    FileNotFoundError/OSError for I/O, OSError (EIO) where the file shrank while read."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        head = _pread_exact(fd, min(size, 1 << 16), 0)  # most headers fit: one read
        end = header_end(head)
        need = end if end <= size else min(size, 8)  # past the end: parse refuses it from 8 bytes
        if len(head) < need:
            head += _pread_exact(fd, need - len(head), len(head))
        if len(head) < need:
            raise OSError(errno.EIO, "the file shrank while its header was read", name)
        return parse(name, head, size)
    finally:
        os.close(fd)


class _Pending:
    """One file whose data reads are in flight: the header, the destination and the layout
    (``base``: where the data section starts in ``buffer``)."""

    __slots__ = ("header", "buffer", "base", "device")

    def __init__(self, header: Header, buffer: Any, base: int, device: Any) -> None:
        self.header, self.buffer, self.base, self.device = header, buffer, base, device


def _device(device: Any) -> Any:
    torch = torch_module()
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)


def _start(header: Header, dev: Any, ops: list[Any]) -> _Pending:
    """Allocates the device memory of one file's data section and queues its reads."""
    torch = torch_module()
    path = header.path
    nbytes = header.data_bytes
    if dev.type != "cuda":
        raise ValueError(f"device must be 'cpu' or a CUDA device, not {str(dev)!r}")
    # Checked before allocating: a clear reason where torch has no CUDA.
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {str(dev)!r} requested but torch has no usable CUDA device")
    gpu = _deepio.gpu_info()
    if not gpu.get("cuda_found"):
        raise RuntimeError(f"device {str(dev)!r}: deepio cannot use the CUDA driver: {gpu.get('cuda_reason')}")
    buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    if nbytes:
        submit_read(engine(), lambda a, n: buf[a : a + n], path, header.data_offset, nbytes, ops)
    return _Pending(header, buf, 0, dev)


def _finish(p: _Pending, out: dict[str, Any]) -> None:
    """Makes the tensors of one file whose reads completed."""
    torch = torch_module()
    h = p.header
    for t in h.tensors:
        dtype = torch_dtype(h, t)
        shape = torch_shape(h, t)
        if t.nbytes == 0:
            out[t.name] = torch.empty(shape, dtype=dtype, device=p.device)
            continue
        start = p.base + t.begin
        item = torch.empty((), dtype=dtype).element_size()
        if p.device.type == "cpu":
            if start % item == 0:
                out[t.name] = torch.frombuffer(p.buffer, dtype=dtype, count=t.nbytes // item, offset=start).view(shape)
            else:  # only in files from writers that do not align: copy
                src = torch.frombuffer(p.buffer, dtype=torch.uint8, count=t.nbytes, offset=start)
                dst = torch.empty(shape, dtype=dtype)
                as_bytes(dst).copy_(src)
                out[t.name] = dst
        else:
            raw = p.buffer[start : start + t.nbytes]
            if start % item == 0:
                out[t.name] = raw.view(dtype).view(shape)
            else:
                dst = torch.empty(shape, dtype=dtype, device=p.device)
                as_bytes(dst).copy_(raw)
                out[t.name] = dst


def _check_names(headers: Iterable[Header]) -> None:
    seen: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            other = seen.setdefault(t.name, h.path)
            if other != h.path:
                raise ValueError(f"tensor {t.name!r} is in both {other} and {h.path}")


def _backend(backend: str | None) -> str:
    if backend is None:
        return DEFAULT_BACKEND
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, _BACKENDS))}, not {backend!r}")
    return backend


def _load_headers(headers: list[Header], device: Any, backend: str = "direct") -> dict[str, Any]:
    """``backend`` as checked by ``_backend`` (load_file/load_files check it before any file is
    opened)."""
    dev = _device(device)
    for h in headers:  # every dtype must exist in this torch before anything is read
        for t in h.tensors:
            torch_dtype(h, t)
            torch_shape(h, t)
    if dev.type == "cpu":
        if backend == "mmap":
            places = [(m, h.data_offset) for h, m in zip(headers, _cpu.map_files(headers))]
        else:
            places = _cpu.read_files(headers)
        out_h: dict[str, Any] = {}
        for h, (buf, base) in zip(headers, places):
            _finish(_Pending(h, buf, base, dev), out_h)
        return out_h
    ops: list[Any] = []
    pending: list[_Pending] = []
    try:
        for h in headers:
            pending.append(_start(h, dev, ops))
    finally:
        run(ops)  # also when a later file failed to start: nothing is left in flight
    out: dict[str, Any] = {}
    for p in pending:
        _finish(p, out)
    return out


def load_file(
    filename: PathArg, device: str | int | Any = "cpu", *, backend: str | None = None
) -> dict[str, torch.Tensor]:
    """Loads a safetensors file: ``{name: tensor}`` on ``device`` ("cpu", "cuda", "cuda:N", an
    int or a torch.device), equal to ``safetensors.torch.load_file(filename, device)``.

    ``backend`` (CPU loads): "direct" reads with the engine into ordinary memory; "mmap" maps
    the file copy-on-write and reads it into the page cache on helper threads before returning
    (tensors backed by the file, as safetensors' are: truncating the file under them is a
    SIGBUS). None: ``DEFAULT_BACKEND``. See docs/models.md for which is faster where.

    Raises FileNotFoundError/PermissionError/OSError for I/O, ``deepio.CorruptFileError`` (a
    ValueError naming the file and the tensor) for a corrupt or truncated file, ValueError for
    a dtype or F4 shape this torch cannot hold, RuntimeError for a CUDA device where torch has
    none. CPU tensors have storages of their own over one shared buffer per file (freed when
    the last of them goes); CUDA tensors share one storage."""
    backend = _backend(backend)
    return _load_headers([read_header(filename)], device, backend)


def shard_paths(paths: PathArg | Iterable[PathArg]) -> list[str]:
    """The files ``load_files`` reads: a folder's ``*.safetensors`` sorted by name
    (FileNotFoundError where it has none), a single path, or each path of an iterable."""
    if isinstance(paths, (str, os.PathLike)):
        p = os.fspath(paths)
        if os.path.isdir(p):
            found = sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".safetensors"))
            if not found:
                raise FileNotFoundError(2, "no *.safetensors file in the folder", p)
            return found
        return [p]
    return [os.fspath(p) for p in paths]


def load_files(
    paths: PathArg | Iterable[PathArg], device: str | int | Any = "cpu", *, backend: str | None = None
) -> dict[str, torch.Tensor]:
    """Loads several files (a list of paths, or a folder: every ``*.safetensors`` in it) into
    one dict. All headers are read and checked first (a tensor name in two files is a
    ValueError naming both), then every file's reads are in flight at once on the engine.
    Errors as for ``load_file``."""
    backend = _backend(backend)
    headers = [read_header(p) for p in shard_paths(paths)]
    _check_names(headers)
    return _load_headers(headers, device, backend)


def load(data: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """Loads from the bytes of a whole file (``safetensors.torch.load``); CPU tensors sharing
    one private copy of ``data``. Errors as for ``load_file`` (the file named ``<bytes>``)."""
    torch = torch_module()
    view = memoryview(data).cast("B")
    h = parse("<bytes>", view[: min(len(view), 8 + MAX_HEADER_BYTES)], len(view))
    out: dict[str, Any] = {}
    buf = bytearray(view[h.data_offset :]) if h.data_bytes else None
    for t in h.tensors:
        dtype, shape = torch_dtype(h, t), torch_shape(h, t)
        if t.nbytes == 0:
            out[t.name] = torch.empty(shape, dtype=dtype)
            continue
        src = torch.frombuffer(buf, dtype=torch.uint8, count=t.nbytes, offset=t.begin)
        dst = torch.empty(shape, dtype=dtype)
        as_bytes(dst).copy_(src)
        out[t.name] = dst
    return out
