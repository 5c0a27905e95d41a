"""deepio: asynchronous tensor I/O between files and memory at the speed of the storage.

DeepNVMe-compatible::

    import deepio
    h = deepio.aio_handle()            # or: deepio.compat.AsyncIOBuilder().load().aio_handle()
    h.async_pwrite(tensor, "/local_nvme/t.pt")
    h.wait()                           # -> 1

Modern::

    with deepio.File("/local_nvme/t.pt", "r") as f:
        n = f.pread(array, offset=0).result()

Any CPU tensor or array works (torch, NumPy, anything with ``__dlpack__`` or the buffer
protocol), and CUDA tensors where a CUDA driver is usable (``deepio.gpu_info()``);
``deepio.gds_handle`` is DeepNVMe's gds_handle.

Checkpoints (torch's format, durable, through the engine)::

    deepio.save(state_dict, "/local_nvme/ckpt.pt")     # plain torch.load reads it
    sd = deepio.load("/local_nvme/ckpt.pt", map_location="cpu")
    with deepio.Writer(path) as f: numpy.save(f, array)   # file-like objects for any serializer

Failures raise ``OSError`` subclasses
(arguments deepio refuses: ``InvalidArgumentError``, also a ``ValueError``; a handle made
before a fork used in the child: ``ForkedHandleError``). A failure nobody can collect any
more (a dropped Future, a finalizer) emits ``UnobservedFailureWarning``: never silently.
See docs/python.md and docs/checkpoints.md.

``deepio.dcp`` (torch.distributed.checkpoint storage through the engine) is imported on first
use: ``import deepio`` never imports torch.distributed.
"""

from __future__ import annotations

import os
from typing import Any

from . import _deepio
from ._aio import ValidationError, aio_handle
from ._buffers import LockedMemoryWarning
from ._errors import CorruptFileError
from ._file import File, Future
from ._gds import gds_handle, gpu_info
from .checkpoint import Reader, Writer, load, save

EndOfFileError = _deepio.EndOfFileError
InvalidArgumentError = _deepio.InvalidArgumentError
ForkedHandleError = _deepio.ForkedHandleError
UnobservedFailureWarning = _deepio.UnobservedFailureWarning
__version__: str = _deepio.__version__

__all__ = [
    "aio_handle",
    "gds_handle",
    "gpu_info",
    "File",
    "Future",
    "EndOfFileError",
    "InvalidArgumentError",
    "ForkedHandleError",
    "CorruptFileError",
    "UnobservedFailureWarning",
    "ValidationError",
    "LockedMemoryWarning",
    "save",
    "load",
    "Writer",
    "Reader",
    "info",
    "locked_memory_stats",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Subpackages that import heavy optional modules load on first use (deepio.dcp imports
    # torch.distributed.checkpoint).
    if name == "dcp":
        import importlib

        return importlib.import_module(".dcp", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def info(path: str | bytes | os.PathLike[str] | os.PathLike[bytes] | None = None) -> dict[str, Any]:
    """The engine's capabilities: version, each backend (compiled, available, why not),
    the backend "auto" picks, RLIMIT_MEMLOCK, and ``gpu`` (``gpu_info()``: CUDA, cuFile, GDS
    mode and why not). With ``path`` (a folder or file), also what direct I/O deepio will
    use there (``direct_io``: supported, alignments, file system)."""
    d = _deepio.capabilities()
    d["gpu"] = _deepio.gpu_info()
    if path is not None:
        d["direct_io"] = _deepio.probe_direct_io(path)
    return d


def locked_memory_stats() -> dict[str, Any]:
    """Live locked allocations of the process: count, bytes, bytes actually locked, and how
    many were freed with free_cpu_locked_tensor() but are still referenced by an array."""
    return _deepio.locked_memory_stats()
