"""Loading and saving safetensors files through deepio's engine (``import deepio.safetensors``).

The functions have the signatures and results of ``safetensors.torch``::

    from deepio.safetensors import load_file, save_file, load_files
    sd = load_file("model.safetensors")                 # dict[str, torch.Tensor] on the CPU
    sd = load_file("model.safetensors", device="cuda:0")
    sd = load_files("llama-70b/")                       # every *.safetensors in the folder
    save_file(sd, "copy.safetensors", metadata={"format": "pt"})   # byte-identical to safetensors'

The format (public, https://github.com/huggingface/safetensors): 8 bytes little-endian
header length N, N bytes of UTF-8 JSON ``{"name": {"dtype", "shape", "data_offsets":
[begin, end]}, ..., "__metadata__": {str: str}}`` padded with spaces to a multiple of 8, then
the data section; offsets are relative to it and the tensors tile it exactly.

Reading: the header is parsed and checked completely (dtype known, shape * dtype size equal
to the byte range, ranges inside the data section, neither overlapping nor leaving gaps, file
exactly as long as declared) before any data is read, so a corrupt or truncated file raises
``ValueError`` naming the file and the tensor, and no dict is ever returned half filled. The
data section is then read with a few large engine requests (direct I/O, many blocks in flight)
into ONE page-aligned buffer per file; each CPU tensor is a ``torch.frombuffer`` view of its
range with a storage of its own (as safetensors gives), and all of them keep the buffer alive:
the memory returns to the system when the last tensor of the file is dropped. A tensor whose
range is not aligned to its element size (possible only in files written by other tools) is
copied. To a CUDA device the data section goes into one device allocation through the engine's
GPU path (GPUDirect Storage where usable, else the staging pipeline: bounded pinned slots, no
full-size host copy) and tensors are views of that allocation (they share its storage).

Writing: the header and tensors are written through the engine to a temporary name in the same
folder, flushed (fsync) and renamed over the destination, then the folder is flushed
(``deepio._durable.replacing``): after ``save_file`` returns the file is on stable storage, and
a save that fails or is killed leaves the old file untouched.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Union

from . import _deepio, _populate
from ._durable import replacing
from ._engine import default as _default_engine

if TYPE_CHECKING:  # pragma: no cover
    import torch

PathArg = Union[str, "os.PathLike[str]"]

__all__ = ["load_file", "load_files", "save_file", "load", "save", "read_header"]

# safetensors' dtype names, in the order of its Dtype enum (the writer sorts tensors by this
# rank, highest first, then by name), with their width in bits and torch's name.
_DTYPES: list[tuple[str, int, str]] = [
    ("BOOL", 8, "bool"),
    ("F4", 4, "float4_e2m1fn_x2"),  # two values per byte; the file's shape counts values
    ("F6_E2M3", 6, ""),  # no torch dtype
    ("F6_E3M2", 6, ""),
    ("U8", 8, "uint8"),
    ("I8", 8, "int8"),
    ("F8_E5M2", 8, "float8_e5m2"),
    ("F8_E4M3", 8, "float8_e4m3fn"),
    ("F8_E8M0", 8, "float8_e8m0fnu"),
    ("F8_E4M3FNUZ", 8, "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", 8, "float8_e5m2fnuz"),
    ("I16", 16, "int16"),
    ("U16", 16, "uint16"),
    ("F16", 16, "float16"),
    ("BF16", 16, "bfloat16"),
    ("I32", 32, "int32"),
    ("U32", 32, "uint32"),
    ("F32", 32, "float32"),
    ("C64", 64, "complex64"),
    ("F64", 64, "float64"),
    ("I64", 64, "int64"),
    ("U64", 64, "uint64"),
]
_RANK = {name: i for i, (name, _, _) in enumerate(_DTYPES)}
_BITS = {name: bits for name, bits, _ in _DTYPES}
_TORCH_NAME = {name: tname for name, _, tname in _DTYPES}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
_PAGE = 4096
_CHUNK_BYTES = 64 << 20  # engine requests per file: large, several in flight (docs/models.md)


# ------------------------------------------------------------------------------- the header


class TensorInfo:
    """One tensor of a file's header: ``name``, ``dtype`` (safetensors' name, e.g. "BF16"),
    ``shape`` (as in the file), ``begin``/``end`` (byte range within the data section)."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def __repr__(self) -> str:
        return f"TensorInfo({self.name!r}, {self.dtype}, {list(self.shape)}, [{self.begin}, {self.end}])"


class Header:
    """A parsed, checked header: ``tensors`` (in file order of their data), ``metadata``
    (dict or None), ``data_offset`` (where the data section starts: 8 + header length) and
    ``file_size``."""

    __slots__ = ("path", "tensors", "metadata", "data_offset", "file_size")

    def __init__(
        self, path: str, tensors: list[TensorInfo], metadata: dict[str, str] | None, data_offset: int, file_size: int
    ) -> None:
        self.path, self.tensors, self.metadata = path, tensors, metadata
        self.data_offset, self.file_size = data_offset, file_size

    @property
    def data_bytes(self) -> int:
        return self.file_size - self.data_offset


def _bad(path: str, what: str) -> ValueError:
    return ValueError(f"{path}: not a valid safetensors file: {what}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the header names {k!r} twice")
        out[k] = v
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse(path: str, head: bytes, file_size: int) -> Header:
    """Parses and checks a header. ``head`` holds at least the first 8 + N bytes of the file
    (N from its first 8 bytes) when the file has them; ``file_size`` is the whole file's size."""
    if file_size < 8:
        raise _bad(path, f"{file_size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", head, 0)
    if n > MAX_HEADER_BYTES:
        raise _bad(path, f"header length {n} is over the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        raise _bad(path, f"header length {n} runs past the end of the {file_size}-byte file (truncated?)")
    raw = head[8 : 8 + n]
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as e:
        raise _bad(path, f"the header is not UTF-8 ({e})") from None
    except ValueError as e:  # json.JSONDecodeError and duplicates
        raise _bad(path, f"the header is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise _bad(path, f"the header is a JSON {type(doc).__name__}, not an object")
    metadata = doc.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _bad(path, "__metadata__ must map strings to strings")
    data_bytes = file_size - 8 - n
    tensors: list[TensorInfo] = []
    for name, entry in doc.items():
        where = f"tensor {name!r}"
        if not isinstance(entry, dict):
            raise _bad(path, f"{where}: the entry is a {type(entry).__name__}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise _bad(path, f"{where}: missing or non-string dtype")
        if dtype not in _BITS:
            raise _bad(path, f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _bad(path, f"{where}: shape must be a list of non-negative integers, got {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(path, f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
        bits = math.prod(shape) * _BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            raise _bad(
                path,
                f"{where}: shape {shape} of {dtype} needs {bits / 8:g} bytes but data_offsets "
                f"{offsets} hold {offsets[1] - offsets[0]}",
            )
        if offsets[1] > data_bytes:
            raise _bad(
                path,
                f"{where}: data_offsets {offsets} run past the end of the {data_bytes}-byte data section (truncated?)",
            )
        tensors.append(TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1]))
    tensors.sort(key=lambda t: (t.begin, t.end))
    at, prev = 0, None
    for t in tensors:
        if t.begin < at:
            raise _bad(path, f"tensor {t.name!r} [{t.begin}, {t.end}] overlaps tensor {prev!r} (ends at {at})")
        if t.begin > at:
            after = f"tensor {prev!r} ends" if prev is not None else "the data section starts"
            raise _bad(path, f"tensor {t.name!r} starts at {t.begin} but {after} at {at}: a gap")
        at, prev = t.end, t.name
    if at != data_bytes:
        raise _bad(path, f"the tensors cover {at} bytes but the data section holds {data_bytes}")
    return Header(path, tensors, metadata, 8 + n, file_size)


def _pread_exact(fd: int, nbytes: int, offset: int) -> bytes:
    parts, got = [], 0
    while got < nbytes:
        b = os.pread(fd, nbytes - got, offset + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_header(path: PathArg) -> Header:
    """Reads and checks a file's header (no tensor data). ValueError for a corrupt file,
    FileNotFoundError/OSError for I/O."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        head = _pread_exact(fd, min(size, 1 << 16), 0)  # most headers fit: one read
        if len(head) >= 8:
            (n,) = struct.unpack_from("<Q", head, 0)
            if len(head) < 8 + n <= min(size, 8 + MAX_HEADER_BYTES):
                head += _pread_exact(fd, 8 + n - len(head), len(head))
        if len(head) < min(size, 8):
            raise OSError(f"{name}: the file shrank while its header was read")
        return _parse(name, head, size)
    finally:
        os.close(fd)


# -------------------------------------------------------------------------------- torch glue


def _torch() -> Any:
    import torch

    return torch


def _torch_dtype(h: Header, t: TensorInfo) -> Any:
    dt = getattr(_torch(), _TORCH_NAME[t.dtype] or "-", None)
    if dt is None:
        raise _bad(h.path, f"tensor {t.name!r}: dtype {t.dtype} has no equivalent in this torch")
    return dt


def _torch_shape(h: Header, t: TensorInfo) -> tuple[int, ...]:
    if t.dtype != "F4":
        return t.shape
    if not t.shape or t.shape[-1] % 2:  # torch packs two values per element along the last axis
        raise _bad(h.path, f"tensor {t.name!r}: F4 needs an even last dimension, got shape {list(t.shape)}")
    return (*t.shape[:-1], t.shape[-1] // 2)


def _as_bytes(t: Any) -> Any:
    """A contiguous tensor's memory as a 1-D uint8 view (no copy)."""
    return t.reshape(-1).view(_torch().uint8)


# ------------------------------------------------------------------------------- the engine

def _engine(kind: str = "cpu") -> Any:
    """The process's default engine (deepio._engine): "gds" for CUDA memory where GPUDirect
    Storage is usable."""
    return _default_engine(kind)


def _run(ops: list[Any]) -> None:
    """Waits for every operation, then raises the first failure (none is left running)."""
    first: BaseException | None = None
    for op in ops:
        try:
            op.result(None)
        except BaseException as e:  # KeyboardInterrupt too: the others must finish first
            if first is None:
                first = e
    if first is not None:
        raise first


def _submit_read(h: Any, cut: Any, path: str, offset: int, nbytes: int, ops: list[Any]) -> None:
    """Queues reads of [offset, offset + nbytes) of ``path`` into the destination in requests
    of up to _CHUNK_BYTES, as one batch (one call, the file opened once off this thread);
    ``cut(at, n)`` returns the destination's bytes [at, at + n) (a memoryview slice, a CUDA
    tensor slice, any buffer the engine takes)."""
    starts = range(0, nbytes, _CHUNK_BYTES)
    if starts:
        views = [cut(at, min(_CHUNK_BYTES, nbytes - at)) for at in starts]
        ops.extend(h.submit_batch(False, views, path, [offset + at for at in starts], True))


# ---------------------------------------------------------------------------------- loading


class _Pending:
    """One file whose data reads are in flight: the header, the destination and the layout."""

    __slots__ = ("header", "buffer", "base", "device")

    def __init__(self, header: Header, buffer: Any, base: int, device: Any) -> None:
        self.header, self.buffer, self.base, self.device = header, buffer, base, device


def _device(device: Any) -> Any:
    torch = _torch()
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)


# Where a CPU load's data lands (docs/models.md, "Layout"): "mmap" is plain anonymous memory
# (page-aligned, faulted in by the reads themselves); "locked" deepio's page-locked allocator
# (mlock, huge pages from 2 MiB, io_uring registered buffers), which cost more CPU per GiB in a
# fresh process on the development VM. bench/load_weights.py compares them.
_HOST_MEMORY = "mmap"


def _host_buffer(nbytes: int) -> Any:
    """Page-aligned memory for ``nbytes`` (None for 0) that supports the buffer protocol."""
    if nbytes == 0:
        return None
    if _HOST_MEMORY == "locked":
        try:
            import numpy  # noqa: F401 - the allocator hands its memory out as a NumPy array
        except ImportError:
            pass
        else:
            array, _owner = _deepio.alloc_locked(nbytes, "numpy")  # the array keeps it alive
            return array
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


# With _POPULATE_THREADS > 0, fresh anonymous memory is populated ahead of the reads on that
# many helper threads, in pieces of _PIECE_BYTES, each piece read once populated. Off (0) by
# default: on the development VM the engine's two workers, faulting the pages in as they submit
# the reads, were faster (docs/benchmarks.md, "Loads to CPU: what bounds them").
_POPULATE_THREADS = 0
_PIECE_BYTES = 16 << 20


def _read_host(reads: list[tuple[Any, str, int, int]], ops: list[Any]) -> None:
    """Queues the CPU reads: (destination memoryview, path, file offset, nbytes) each. With
    _POPULATE_THREADS, plain anonymous memory is faulted in by ``_populate.Ahead`` on helper
    threads, piece by piece, and each piece's read is submitted once its memory is populated;
    otherwise every read is submitted at once and the engine faults the pages in."""
    if not reads:
        return
    h = _engine("cpu")
    if _HOST_MEMORY != "mmap" or _POPULATE_THREADS <= 0 or not _populate.available():
        for view, path, offset, n in reads:
            _submit_read(h, lambda a, k, view=view: view[a : a + k], path, offset, n, ops)
        return
    ahead = _populate.Ahead([(_populate.address(v), n) for v, _, _, n in reads], _PIECE_BYTES, _POPULATE_THREADS)
    try:
        for i, (r, at, n) in enumerate(ahead.pieces):
            ahead.wait(i)
            view, path, offset, _ = reads[r]
            _submit_read(h, lambda a, k, view=view, at=at: view[at + a : at + a + k], path, offset + at, n, ops)
    finally:
        ahead.close()


def _start(header: Header, dev: Any, ops: list[Any], host_reads: list[tuple[Any, str, int, int]]) -> _Pending:
    """Allocates the destination of one file's data section and queues its reads (CUDA) or
    adds them to ``host_reads`` as (memoryview, path, file offset, nbytes) (CPU: submitted by
    _read_host as its memory is populated)."""
    torch = _torch()
    path = header.path
    nbytes = header.data_bytes
    if dev.type == "cpu":
        # Read from the page boundary below the data section so that file offsets and buffer
        # addresses share their alignment: the whole body then goes direct, unbounced.
        lo = header.data_offset // _PAGE * _PAGE
        buf = _host_buffer(header.file_size - lo)
        base = header.data_offset - lo
        if buf is not None and nbytes:
            host_reads.append((memoryview(buf), path, lo, header.file_size - lo))
        return _Pending(header, buf, base, dev)
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
        torch.cuda.current_stream(dev).synchronize()  # the allocation is usable by deepio's stream
        kind = "gds" if gpu.get("gds_mode") == "gds" else "cpu"
        _submit_read(_engine(kind), lambda a, n: buf[a : a + n], path, header.data_offset, nbytes, ops)
    return _Pending(header, buf, 0, dev)


def _finish(p: _Pending, out: dict[str, Any]) -> None:
    """Makes the tensors of one file whose reads completed."""
    torch = _torch()
    h = p.header
    for t in h.tensors:
        dtype = _torch_dtype(h, t)
        shape = _torch_shape(h, t)
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
                _as_bytes(dst).copy_(src)
                out[t.name] = dst
        else:
            raw = p.buffer[start : start + t.nbytes]
            if start % item == 0:
                out[t.name] = raw.view(dtype).view(shape)
            else:
                dst = torch.empty(shape, dtype=dtype, device=p.device)
                _as_bytes(dst).copy_(raw)
                out[t.name] = dst


def _check_names(headers: Iterable[Header]) -> None:
    seen: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            other = seen.setdefault(t.name, h.path)
            if other != h.path:
                raise ValueError(f"tensor {t.name!r} is in both {other} and {h.path}")


# CPU loads (docs/models.md, "Reading"): "direct" reads with the engine into ordinary
# anonymous memory; "mmap" maps each file copy-on-write and faults the mapping in from the page
# cache on helper threads (tensors tied to the file, as safetensors' own).
_BACKENDS = ("direct", "mmap")
DEFAULT_BACKEND = "direct"
_MMAP_THREADS = 2
_MMAP_PIECE = 64 << 20


def _map_files(headers: list[Header]) -> list[_Pending]:
    """The "mmap" backend: each file mapped whole, copy-on-write (MAP_PRIVATE, writable: a
    tensor written to gets private pages, the file never changes), and every page of the data
    sections read and mapped before returning, by MADV_POPULATE_READ on _MMAP_THREADS helper
    threads in _MMAP_PIECE pieces, so the page cache's readahead streams run in parallel."""
    pending: list[_Pending] = []
    ranges: list[tuple[int, int]] = []
    for h in headers:
        m = None
        if h.data_bytes:
            with open(h.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < h.file_size:
                    raise OSError(
                        errno.EIO, f"the file shrank to under {h.file_size} bytes while it was loaded", h.path
                    )
                m = mmap.mmap(f.fileno(), h.file_size, access=mmap.ACCESS_COPY)
            lo = h.data_offset // _PAGE * _PAGE
            ranges.append((_populate.address(m) + lo, h.file_size - lo))
        pending.append(_Pending(h, m, h.data_offset, _torch().device("cpu")))
    with_data = [p for p in pending if p.buffer is not None]
    ahead = _populate.Ahead(ranges, _MMAP_PIECE, _MMAP_THREADS, _populate.MADV_POPULATE_READ)
    try:
        for i in range(len(ahead.pieces)):
            ahead.wait(i)
    finally:
        ahead.close()
    failed: dict[int, int] = {}
    for r, err in ahead.errors:
        failed.setdefault(r, err)
    for r, p in enumerate(with_data):
        err = failed.get(r, 0) if _populate.available() else errno.EINVAL
        if err == errno.EINVAL:  # no MADV_POPULATE_READ here: touch every page instead
            try:
                view = memoryview(p.buffer)
                bytes(view[p.base // _PAGE * _PAGE :: _PAGE])
                view.release()
            except ValueError:
                pass
        elif err:
            raise OSError(
                err,
                f"cannot read the data section ({os.strerror(err)}: an I/O error, or the file shrank)",
                p.header.path,
            )
    return pending


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
            _torch_dtype(h, t)
            _torch_shape(h, t)
    if dev.type == "cpu" and backend == "mmap":
        out_m: dict[str, Any] = {}
        for p in _map_files(headers):
            _finish(p, out_m)
        return out_m
    ops: list[Any] = []
    pending: list[_Pending] = []
    host_reads: list[tuple[Any, str, int, int]] = []
    try:
        for h in headers:
            pending.append(_start(h, dev, ops, host_reads))
        _read_host(host_reads, ops)
    finally:
        _run(ops)  # also when a later file failed to start: nothing is left in flight
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

    Raises FileNotFoundError/PermissionError/OSError for I/O, ValueError (naming the file and
    the tensor) for a corrupt or truncated file or a dtype this torch lacks, RuntimeError for
    a CUDA device where torch has none. CPU tensors have storages of their own over one shared
    buffer per file (freed when the last of them goes); CUDA tensors share one storage."""
    backend = _backend(backend)
    return _load_headers([read_header(filename)], device, backend)


def _shard_paths(paths: PathArg | Iterable[PathArg]) -> list[str]:
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
    headers = [read_header(p) for p in _shard_paths(paths)]
    _check_names(headers)
    return _load_headers(headers, device, backend)


def load(data: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """Loads from the bytes of a whole file (``safetensors.torch.load``); CPU tensors sharing
    one private copy of ``data``."""
    torch = _torch()
    view = memoryview(data).cast("B")
    h = _parse("<bytes>", bytes(view[: min(len(view), 8 + MAX_HEADER_BYTES)]), len(view))
    out: dict[str, Any] = {}
    buf = bytearray(view[h.data_offset :]) if h.data_bytes else None
    for t in h.tensors:
        dtype, shape = _torch_dtype(h, t), _torch_shape(h, t)
        if t.nbytes == 0:
            out[t.name] = torch.empty(shape, dtype=dtype)
            continue
        src = torch.frombuffer(buf, dtype=torch.uint8, count=t.nbytes, offset=t.begin)
        dst = torch.empty(shape, dtype=dtype)
        _as_bytes(dst).copy_(src)
        out[t.name] = dst
    return out


# ----------------------------------------------------------------------------------- saving

_SMALL_BYTES = 1 << 20  # tensors below this are packed into one host buffer with the header


def _plan(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None) -> tuple[bytes, list[tuple[Any, int]]]:
    """(header bytes padded to 8, [(contiguous CPU-or-CUDA tensor, offset in the data section)])
    in safetensors' order; raises as safetensors.torch.save_file does for what it refuses."""
    torch = _torch()
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    names = {v: k for k, v in _TORCH_NAME.items() if v}
    entries = []
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensor names must be str, not {type(k).__name__} ({k!r})")
        if k == "__metadata__":
            raise ValueError("'__metadata__' is reserved for the metadata: it cannot name a tensor")
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            raise ValueError(f"tensor {k!r} is sparse ({v.layout}): make it dense with .to_dense() first")
        if not v.is_contiguous():
            raise ValueError(f"tensor {k!r} is not contiguous: call .contiguous() before saving")
        dname = names.get(str(v.dtype).split(".")[-1])
        if dname is None:
            raise ValueError(f"tensor {k!r}: dtype {v.dtype} has no safetensors equivalent")
        shape = list(v.shape)
        if dname == "F4":
            if not shape:
                raise ValueError(f"tensor {k!r}: a 0-d float4_e2m1fn_x2 tensor cannot be saved (no last axis)")
            shape[-1] *= 2
        entries.append((k, dname, shape, v))
    _check_not_shared(entries)
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
            isinstance(a, str) and isinstance(b, str) for a, b in metadata.items()
        ):
            raise TypeError("metadata must be a dict of str to str")
    entries.sort(key=lambda e: (-_RANK[e[1]], e[0]))
    doc: dict[str, Any] = {}
    if metadata is not None:
        # Sorted: safetensors orders these keys at random (a Rust HashMap), so equal inputs
        # give equal files here only; with at most one key the files are byte-identical.
        doc["__metadata__"] = dict(sorted(metadata.items()))
    at = 0
    plan = []
    for k, dname, shape, v in entries:
        n = v.numel() * v.element_size()
        doc[k] = {"dtype": dname, "shape": shape, "data_offsets": [at, at + n]}
        plan.append((v, at))
        at += n
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, plan


def _check_not_shared(entries: list[tuple[str, str, list[int], Any]]) -> None:
    """safetensors refuses tensors whose memory overlaps (RuntimeError); so do we."""
    spans = []
    for k, _, _, v in entries:
        n = v.numel() * v.element_size()
        if n:
            spans.append((str(v.device), v.data_ptr(), v.data_ptr() + n, k))
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if a[0] == b[0] and b[1] < a[2]:
            raise RuntimeError(
                f"Some tensors share memory, this will lead to duplicate memory on disk: {a[3]!r} and {b[3]!r}"
            )


def _runs(head: bytes, plan: list[tuple[Any, int]]) -> list[tuple[int, Any]]:
    """[(file offset, source)]: the header and each run of small tensors packed into one
    bytearray; each large tensor as its own 1-D uint8 view (CPU or CUDA memory, no copy)."""
    torch = _torch()
    base = len(head)
    out: list[tuple[int, Any]] = []
    run: list[tuple[Any, int, int]] = []  # (uint8 view, offset, nbytes) of the open run
    run_at, run_end = 0, base  # the first run holds the header

    def close_run() -> None:
        if run_end <= run_at:
            return
        buf = bytearray(run_end - run_at)
        if run_at == 0:
            buf[:base] = head
        for src, off, n in run:
            torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=base + off - run_at).copy_(src)
        out.append((run_at, buf))

    for v, off in plan:
        n = v.numel() * v.element_size()
        if n == 0:
            continue
        src = _as_bytes(v.detach())
        if n < _SMALL_BYTES:
            if not run and run_end != base + off:  # a new run after a large tensor
                run_at = base + off
            run.append((src, off, n))
            run_end = base + off + n
            continue
        close_run()
        run, run_at, run_end = [], base + off + n, base + off + n
        if src.is_cuda:
            torch.cuda.current_stream(src.device).synchronize()
        out.append((base + off, src))
    close_run()
    return out


def _write(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None, path: str) -> None:
    head, plan = _plan(tensors, metadata)
    runs = _runs(head, plan)
    # One batch: one call, the file opened once off this thread; _run waits for every write
    # and raises the first failure (an open failure included).
    if runs:
        _run(_engine("cpu").submit_batch(True, [src for _, src in runs], path, [offset for offset, _ in runs], True))


def save_file(
    tensors: Mapping[str, torch.Tensor], filename: PathArg, metadata: Mapping[str, str] | None = None
) -> None:
    """Writes ``tensors`` to ``filename`` in the safetensors format, byte-identical to
    ``safetensors.torch.save_file``, durably (temporary name, fsync, rename, fsync of the
    folder). Tensors may be on the CPU or a CUDA device. Raises ValueError/TypeError/
    RuntimeError for what safetensors refuses (non-contiguous, sparse or overlapping
    tensors, non-string metadata), OSError for I/O (the old file is then untouched)."""
    name = os.fspath(filename)
    with replacing(name) as tmp:
        _write(tensors, metadata, tmp)
        try:  # the permission bits of the file replaced stay (safetensors writes in place)
            os.chmod(tmp, os.stat(name).st_mode & 0o7777)
        except FileNotFoundError:
            pass


def save(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes ``save_file`` would write (``safetensors.torch.save``)."""
    torch = _torch()
    head, plan = _plan(tensors, metadata)
    out = bytearray(len(head) + sum(v.numel() * v.element_size() for v, _ in plan))
    out[: len(head)] = head
    for v, off in plan:
        n = v.numel() * v.element_size()
        if n:
            torch.frombuffer(out, dtype=torch.uint8, count=n, offset=len(head) + off).copy_(_as_bytes(v.detach()))
    return bytes(out)


# ----------------------------------------------------------------------------- command line


def _drop_caches() -> bool:
    """Empties the page cache (root only); False where not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _ceiling_memory(paths: list[str], populated: bool = True) -> Any:
    """The destination of ``_ceiling``: one page-aligned buffer for all ``paths`` (each file
    at a page boundary), by default already faulted in (populated before any clock starts), so
    that the ceiling is the disk's and not the cost of fresh memory. None when the files are
    empty."""
    buf = _host_buffer(sum(-(-os.path.getsize(p) // _PAGE) * _PAGE for p in paths))
    if not populated:
        return buf
    if buf is not None and _populate.populate(_populate.address(buf), len(buf)) != 0:
        view = memoryview(buf)  # no MADV_POPULATE_WRITE: touch every page instead
        view[::_PAGE] = bytes(len(range(0, len(view), _PAGE)))
        view.release()
    return buf


def _ceiling(paths: list[str], buf: Any = None) -> None:
    """The disk ceiling: every file read whole, sequentially, by the same engine into one big
    page-aligned buffer (no parsing, no tensors). ``buf``: from ``_ceiling_memory`` (the disk
    alone); None reads into fresh memory that the reads fault in (the disk and the memory)."""
    sizes = [os.path.getsize(p) for p in paths]
    if buf is None:
        buf = _ceiling_memory(paths, populated=False)
    if buf is None:
        return
    view = memoryview(buf)
    ops: list[Any] = []
    at = 0
    for p, n in zip(paths, sizes):
        _submit_read(_engine("cpu"), lambda a, k, at=at: view[at + a : at + a + k], p, 0, n, ops)
        at += -(-n // _PAGE) * _PAGE  # each file page-aligned in the buffer, as a load places it
    try:
        _run(ops)
    finally:
        view.release()


def main(argv: list[str] | None = None) -> int:
    """``python -m deepio.safetensors PATH [--device D] [--repeat N]``: loads a file or a folder
    of shards and prints GB/s next to the disk ceiling measured in the same run (a plain
    sequential read of the same bytes by the same engine), cold page cache when run as root."""
    import argparse
    import statistics
    import sys
    import time

    ap = argparse.ArgumentParser(prog="python -m deepio.safetensors", description=main.__doc__)
    ap.add_argument("path", help="a .safetensors file or a folder of them")
    ap.add_argument("--device", default="cpu", help='"cpu" (default), "cuda", "cuda:N"')
    ap.add_argument("--repeat", type=int, default=3, help="interleaved load/ceiling pairs (default 3)")
    ap.add_argument("--no-drop-caches", action="store_true", help="keep the page cache between runs")
    args = ap.parse_args(argv)
    try:
        _torch()  # imported before any clock starts
        paths = _shard_paths(args.path)
        total = sum(os.path.getsize(p) for p in paths)
        h = _engine("cpu")
        drop = not args.no_drop_caches and _drop_caches()
        cache = "cold (dropped before each run)" if drop else "warm (page cache not dropped: not root, or asked)"
        print(
            f"deepio.safetensors: {len(paths)} file(s), {total / 1e9:.3f} GB; device {args.device}; "
            f"engine {h.backend}, direct_io {h.direct_io}, block {h.block_size >> 10} KiB, queue depth "
            f"{h.queue_depth}, {h.intra_op_parallelism} workers, requests of {_CHUNK_BYTES >> 20} MiB; cache {cache}"
        )
        loads: list[float] = []
        ceils: list[float] = []
        cpus: list[float] = []
        count = 0
        for i in range(max(args.repeat, 1)):
            for what in ("load", "ceiling") if i % 2 == 0 else ("ceiling", "load"):
                if drop:
                    _drop_caches()
                mem = _ceiling_memory(paths) if what == "ceiling" else None
                c0, t0 = _cpu_seconds(), time.perf_counter()
                if what == "load":
                    sd = load_files(paths, device=args.device)
                    count = len(sd)
                    if args.device != "cpu":
                        _torch().cuda.synchronize()
                    del sd
                else:
                    _ceiling(paths, mem)
                    del mem
                dt, dc = time.perf_counter() - t0, _cpu_seconds() - c0
                (loads if what == "load" else ceils).append(dt)
                if what == "load":
                    cpus.append(dc)
                rate, per = total / dt / 1e9, dc / (total / 2**30)
                print(f"  run {i + 1} {what:8s} {rate:7.2f} GB/s  {dt:7.3f} s  CPU {per:.3f} s/GiB")
        lo, ce = statistics.median(loads), statistics.median(ceils)
        print(
            f"load {count} tensors: {total / lo / 1e9:.2f} GB/s (median of {len(loads)}), "
            f"CPU {statistics.median(cpus) / (total / 2**30):.3f} s/GiB; disk ceiling (engine, sequential, "
            f"same run): {total / ce / 1e9:.2f} GB/s; load/ceiling {ce / lo:.2f}"
        )
        return 0
    except (OSError, ValueError, RuntimeError) as e:
        print(f"python -m deepio.safetensors: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
