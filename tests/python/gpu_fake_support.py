"""What the GPU cases run by test_gpu_fake.py (test_gpu_fake_cases*.py) share: DLPack by hand,
the fake CUDA driver loaded with ctypes (FakeCuda), device buffers of it (FakeCudaTensor), the
marks that pick the runs a case belongs to, and the fixtures (cuda, dev, tmp), which a case
file takes as a plugin (``pytest_plugins``): registered once, `cuda` is one FakeCuda a process.

The cases run in subprocesses of test_gpu_fake.py whose DEEPIO_CUDA_LIBRARY /
DEEPIO_CUFILE_LIBRARY point at the fake drivers (or "none"); DEEPIO_GPU_TEST_MODE says which
("fake", "nocufile", "absent").

A "CUDA tensor" here is FakeCudaTensor: memory from the fake driver's cuMemAlloc_v2 (host
memory the fake records as device memory), exported through DLPack as kDLCUDA, exactly as
torch or CuPy export device memory. Importing this module needs neither driver: FakeCuda
opens $DEEPIO_CUDA_LIBRARY when made.
"""

from __future__ import annotations

import ctypes
import os

import pytest

# "fake", "nocufile" or "absent" in the runs of test_gpu_fake.py; a case file skips otherwise.
MODE = os.environ.get("DEEPIO_GPU_TEST_MODE")
MODES = ("fake", "nocufile", "absent")
NOT_A_FAKE_RUN = "run by test_gpu_fake.py in a subprocess with the fake drivers"

# ------------------------------------------------------------------------------ DLPack by hand


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

_NOOP_DELETER = DELETER(lambda p: None)  # the memory belongs to the FakeCudaTensor
_CAPSULE_NAME = b"dltensor"
_keep = []  # every exported struct lives until the process ends: consumers may hold them long
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

KDLCUDA = 2


class FakeCuda:
    """The fake driver loaded with ctypes (the same object deepio dlopens)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(os.environ["DEEPIO_CUDA_LIBRARY"])
        self.lib.deepio_fake_cuda_set_result.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        for name in ("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"):
            getattr(self.lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        assert self.lib.cuInit(0) == 0
        # Memory calls need a current context, per thread, as with the real driver (which
        # refuses them with CUDA_ERROR_INVALID_CONTEXT otherwise); torch keeps one current.
        self.ctx = ctypes.c_void_p()
        assert self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0) == 0

    def _current(self) -> None:
        assert self.lib.cuCtxSetCurrent(self.ctx) == 0

    def alloc(self, n: int) -> int:
        self._current()
        p = ctypes.c_uint64()
        assert self.lib.cuMemAlloc_v2(ctypes.byref(p), max(n, 1)) == 0
        return p.value

    def free(self, p: int) -> None:
        self._current()
        assert self.lib.cuMemFree_v2(p) == 0

    def put(self, p: int, data: bytes) -> None:
        self._current()
        assert self.lib.cuMemcpyHtoD_v2(p, data, len(data)) == 0

    def get(self, p: int, n: int) -> bytes:
        self._current()
        out = ctypes.create_string_buffer(n)
        assert self.lib.cuMemcpyDtoH_v2(out, p, n) == 0
        return out.raw

    def fail(self, name, result: int = 0, after: int = 0) -> None:
        self.lib.deepio_fake_cuda_set_result(name.encode() if name else None, result, after)


class FakeCudaTensor:
    """A 1-D uint8 CUDA buffer exported through DLPack (kDLCUDA, device 0)."""

    def __init__(self, cuda: FakeCuda, nbytes: int, ptr: int = 0, owner=None) -> None:
        self.cuda = cuda
        self.nbytes = nbytes
        self.owner = owner
        self.ptr = ptr or cuda.alloc(nbytes)

    def view(self, offset: int, n: int) -> FakeCudaTensor:
        assert 0 <= offset and offset + n <= self.nbytes
        return FakeCudaTensor(self.cuda, n, self.ptr + offset, owner=self)

    def __dlpack_device__(self):
        return (KDLCUDA, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        shape = (ctypes.c_int64 * 1)(self.nbytes)
        mt = DLManagedTensor()
        mt.dl_tensor.data = self.ptr
        mt.dl_tensor.device = DLDevice(KDLCUDA, 0)
        mt.dl_tensor.ndim = 1
        mt.dl_tensor.dtype = DLDataType(1, 8, 1)  # uint8
        mt.dl_tensor.shape = shape
        mt.dl_tensor.strides = None
        mt.dl_tensor.byte_offset = 0
        mt.deleter = _NOOP_DELETER
        _keep.append((mt, shape))
        return _PyCapsule_New(ctypes.addressof(mt), _CAPSULE_NAME, None)

    def write(self, data: bytes) -> None:
        assert len(data) == self.nbytes
        self.cuda.put(self.ptr, data)

    def read(self) -> bytes:
        return self.cuda.get(self.ptr, self.nbytes)

    def free(self) -> None:
        assert self.owner is None
        self.cuda.free(self.ptr)


needs_fake = pytest.mark.skipif(MODE == "absent", reason="needs the fake CUDA driver")
needs_absent = pytest.mark.skipif(MODE != "absent", reason="CUDA disabled only in the 'absent' run")
needs_cufile = pytest.mark.skipif(MODE != "fake", reason="needs the fake libcufile")


@pytest.fixture(scope="session")
def cuda():
    return FakeCuda()


@pytest.fixture
def dev(cuda):
    made = []

    def make(nbytes: int, data: bytes | None = None) -> FakeCudaTensor:
        t = FakeCudaTensor(cuda, nbytes)
        if data is not None:
            t.write(data)
        made.append(t)
        return t

    yield make
    cuda.fail(None)
    for t in made:
        t.free()


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


def rand(n: int) -> bytes:
    return os.urandom(n)
