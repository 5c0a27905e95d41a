"""Is the MPI library that mpi4py loaded CUDA-aware? Asked at run time, of the library itself.

Open MPI (2.0 and later) answers ``MPIX_Query_cuda_support()`` (its mpi-ext.h): 1 when this
process's library can take CUDA device pointers, 0 when it was built without CUDA support (or
the support is switched off at run time). MPICH 4 answers ``MPIX_GPU_query_support(
MPIX_GPU_SUPPORT_CUDA, &flag)``. Both are looked up in the already loaded MPI library through
ctypes (in the process's global symbols, where mpi4py puts them, else in the libmpi* mapped into
the process); deepio links neither. A library with neither symbol is
reported as not CUDA-aware, with that reason: device buffers are then never handed to MPI.
``ompi_info --parsable --all | grep mpi_built_with_cuda_support`` reports the build-time flag of
an Open MPI installation; the run-time query is what this process will actually get.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from typing import Any

_MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's enum value for CUDA
_warned: set[str] = set()


def _loaded_mpi_libraries() -> list[ctypes.CDLL]:
    """The process's global symbols, then each libmpi* already mapped into this process (in case
    mpi4py loaded it without RTLD_GLOBAL): dlopen of a loaded library returns its handle."""
    libs = [ctypes.CDLL(None)]
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "/libmpi" in ln and ".so" in ln}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libs


def _symbol(libs: list[ctypes.CDLL], name: str) -> Any:
    for lib in libs:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def query() -> tuple[bool, str]:
    """(CUDA-aware, reason) for the MPI library in this process; the reason names the evidence."""
    from mpi4py import MPI

    if not MPI.Is_initialized():
        return False, "MPI is not initialised"  # not cached: MPI may be initialised later
    return _query_initialized()


@functools.lru_cache(maxsize=1)
def _query_initialized() -> tuple[bool, str]:
    from mpi4py import MPI

    version = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0].strip()
    libs = _loaded_mpi_libraries()
    fn = _symbol(libs, "MPIX_Query_cuda_support")
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = []
        if fn() == 1:
            return True, f"MPIX_Query_cuda_support() = 1 ({version})"
        return False, f"MPIX_Query_cuda_support() = 0: the MPI library is not CUDA-aware ({version})"
    fn = _symbol(libs, "MPIX_GPU_query_support")
    if fn is not None:
        flag = ctypes.c_int(0)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        if fn(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == 0 and flag.value == 1:
            return True, f"MPIX_GPU_query_support(CUDA) = 1 ({version})"
        return False, f"MPIX_GPU_query_support(CUDA) = 0: the MPI library is not CUDA-aware ({version})"
    return False, f"the MPI library offers no CUDA-support query (MPIX_Query_cuda_support) ({version})"


class CudaAwareWarning(RuntimeWarning):
    """``cuda_aware=True`` was asked for, but the MPI library cannot take device buffers."""


def warn_once(reason: str) -> None:
    """Warns once per process and reason that device buffers will be staged."""
    if reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(
        "deepio.comm: cuda_aware=True, but " + reason + "; only the packed signs and scales "
        "(about 1/32 of the buffer) are staged through page-locked host memory",
        CudaAwareWarning,
        stacklevel=3,
    )
