"""Cases run by test_gpu_fake.py in a subprocess whose DEEPIO_CUDA_LIBRARY /
DEEPIO_CUFILE_LIBRARY point at the fake drivers (or "none"); DEEPIO_GPU_TEST_MODE says which
("fake", "nocufile", "absent"). Collected on their own, they skip as one module.

A "CUDA tensor" here is FakeCudaTensor: memory from the fake driver's cuMemAlloc_v2 (host
memory the fake records as device memory), exported through DLPack as kDLCUDA, exactly as
torch or CuPy export device memory.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import threading

import pytest

MODE = os.environ.get("DEEPIO_GPU_TEST_MODE")
if MODE not in ("fake", "nocufile", "absent"):
    pytest.skip("run by test_gpu_fake.py in a subprocess with the fake drivers", allow_module_level=True)

import deepio  # noqa: E402
from deepio import compat  # noqa: E402

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


# ------------------------------------------------------------------------ aio_handle, device


@needs_fake
@pytest.mark.parametrize("nbytes", [1, 4095, 65536, 65536 * 3 + 777, (1 << 20) + 4097])
def test_aio_handle_reads_and_writes_device_buffers(dev, tmp, nbytes):
    data = rand(nbytes)
    src = dev(nbytes, data)
    f = tmp / "w.bin"
    # Staging slots of 64 KiB (block_size): sizes that are not multiples of a chunk.
    h = deepio.aio_handle(block_size=65536, queue_depth=4, intra_op_parallelism=2)
    assert h.sync_pwrite(src, str(f)) == 1
    assert f.read_bytes() == data
    dst = dev(nbytes)
    assert h.async_pread(dst, str(f)) == 0
    assert h.wait() == 1
    assert dst.read() == data
    assert h.stats()["ops_failed"] == 0


def _cufile_opens() -> int:
    """How many times the fake cuFile's driver was opened (cuFileDriverOpen) in this process."""
    lib = ctypes.CDLL(os.environ["DEEPIO_CUFILE_LIBRARY"])
    out = (ctypes.c_long * 8)()
    lib.deepio_fake_cufile_stats(out)
    return int(out[0])


@needs_fake
@pytest.mark.parametrize("route", ["auto", "staged", "gds"])
def test_one_handle_type_device_route(dev, tmp, route):
    # Every aio_handle has a device route. auto: cuFile where usable (the fake libcufile),
    # staged without it; staged: never cuFile; gds: cuFile required (ENOTSUP without it).
    # stats() says which route each operation on device memory took.
    n = 3 * 65536 + 11
    data = rand(n)
    if route == "gds" and MODE != "fake":
        with pytest.raises(OSError) as ei:
            deepio.aio_handle(device_route="gds")
        assert ei.value.errno == errno.ENOTSUP
        assert "cuFile" in str(ei.value) or "cufile" in str(ei.value), str(ei.value)
        return
    h = deepio.aio_handle(block_size=65536, device_route=route)
    assert h._h.device_route == route
    src, dst = dev(n, data), dev(n)
    assert h.sync_pwrite(src, str(tmp / "r")) == 1
    assert h.sync_pread(dst, str(tmp / "r")) == 1
    assert dst.read() == data
    s = h.stats()
    via_cufile = MODE == "fake" and route != "staged"
    assert s["device_ops_completed"] == 2 and s["device_ops_failed"] == 0
    assert s["device_ops_cufile"] == (2 if via_cufile else 0), s
    assert s["device_ops_staged"] == (0 if via_cufile else 2), s
    assert s["device_bytes_cufile"] == (2 * n if via_cufile else 0), s
    assert s["device_bytes_staged"] == (0 if via_cufile else 2 * n), s


@needs_cufile
def test_auto_opens_cufile_only_for_device_memory(dev, tmp):
    # A handle that only sees host memory never opens cuFile's driver; the first operation
    # on device memory does (once).
    opened = _cufile_opens()
    h = deepio.aio_handle(block_size=65536)
    data = rand(100_000)
    assert h.sync_pwrite(bytearray(data), str(tmp / "host")) == 1
    assert _cufile_opens() == opened, "cuFile opened for host memory"
    assert h.sync_pread(dev(len(data)), str(tmp / "host")) == 1
    assert _cufile_opens() == opened + 1
    assert h.stats()["device_ops_cufile"] == 1
    h.close()


@needs_fake
def test_default_engine_is_one_handle_for_host_and_device_memory(dev, tmp):
    from deepio import _deepio, _engine

    e = _engine.default()
    assert e.device_route == "auto"
    before = _deepio.live_handles()
    data = rand(70_000)
    (tmp / "d").write_bytes(data)
    with deepio.File(str(tmp / "d"), "r") as f:
        host = bytearray(len(data))
        f.pread(host, 0).result()
        buf = dev(len(data))
        f.pread(buf, 0).result()
    assert bytes(host) == data and buf.read() == data
    assert _engine.default() is e
    assert _deepio.live_handles() == before, "a second engine was made"
    s = e.stats()
    assert s["device_ops_completed"] >= 1
    assert s["device_ops_cufile" if MODE == "fake" else "device_ops_staged"] >= 1, s


@needs_fake
def test_aio_handle_device_offsets_and_views(dev, tmp):
    n = 300_000
    data = rand(n)
    f = tmp / "o.bin"
    f.write_bytes(data)
    buf = dev(n)
    h = deepio.aio_handle(block_size=32768, queue_depth=2, intra_op_parallelism=3)
    # Three unaligned pieces read into views at unaligned device offsets.
    cuts = [0, 1, 100_003, n]
    for a, b in zip(cuts, cuts[1:]):
        h.async_pread(buf.view(a, b - a), str(f), a)
    assert h.wait() == 3
    assert buf.read() == data
    # Written back at an offset of a new file: no truncation, earlier bytes kept.
    g = tmp / "g.bin"
    g.write_bytes(b"x" * 10)
    assert h.sync_pwrite(buf.view(5, 1000), str(g), 10) == 1
    assert g.read_bytes() == b"x" * 10 + data[5:1005]


@needs_fake
def test_aio_handle_device_buffer_with_descriptor(dev, tmp):
    data = rand(10_000)
    f = tmp / "fd.bin"
    f.write_bytes(data)
    buf = dev(10_000)
    fd = os.open(f, os.O_RDONLY)
    try:
        assert deepio.aio_handle().sync_pread(buf, fd=fd) == 1
    finally:
        os.close(fd)
    assert buf.read() == data


@needs_fake
def test_aio_handle_device_copy_error_raises(cuda, dev, tmp):
    n = 1 << 20
    data = rand(n)
    f = tmp / "e.bin"
    f.write_bytes(data)
    buf = dev(n)
    h = deepio.aio_handle(block_size=65536, queue_depth=4, device_route="staged")
    cuda.fail("cuMemcpyHtoD", 700, 3)  # CUDA_ERROR_ILLEGAL_ADDRESS on the 4th copy
    with pytest.raises(OSError) as ei:
        h.sync_pread(buf, str(f))
    assert ei.value.errno == errno.EIO
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(ei.value)
    assert ei.value.filename == str(f)
    cuda.fail(None)
    assert h.sync_pread(buf, str(f)) == 1, "the handle stays usable"
    assert buf.read() == data


@needs_fake
def test_aio_handle_rejects_unknown_device_address(cuda, tmp):
    # DLPack says CUDA, but the driver does not know the address: TypeError, never a crash.
    bogus = FakeCudaTensor(cuda, 4096, ptr=0x10)
    with pytest.raises(TypeError, match="does not know address"):
        deepio.aio_handle().sync_pwrite(bogus, str(tmp / "x"))


@needs_fake
def test_device_buffers_still_refused_where_cpu_memory_is_needed(dev, tmp):
    buf = dev(16, b"a" * 16)
    with pytest.raises(TypeError, match="CPU memory only"):
        deepio.compat.deepspeed_memcpy(bytearray(16), buf)
    h = deepio.aio_handle()
    (tmp / "v").write_bytes(b"a" * 16)
    with pytest.raises(TypeError, match="validate=True needs a torch tensor"):
        h.sync_pread(buf, str(tmp / "v")) and h.read(buf, str(tmp / "v"), True)


# --------------------------------------------------------- stream order by handshake (issue 26)

LATE_US = 300_000  # how late a producer's fill runs on the fake's streams


class StreamProducer(FakeCudaTensor):
    """A producer with work queued on its own stream, speaking DLPack's stream exchange as
    CuPy does: ``__dlpack__(stream=S)`` records an event on its stream and makes S wait for
    it. ``streams`` records what it was asked."""

    def __init__(self, cuda: FakeCuda, nbytes: int) -> None:
        super().__init__(cuda, nbytes)
        lib = cuda.lib
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
        lib.cuEventDestroy_v2.argtypes = [ctypes.c_void_p]
        lib.deepio_fake_cuda_enqueue_fill.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_size_t,
            ctypes.c_long,
        ]
        cuda._current()
        self.stream = ctypes.c_void_p()
        assert lib.cuStreamCreate(ctypes.byref(self.stream), 1) == 0  # CU_STREAM_NON_BLOCKING
        self.streams: list = []

    def fill_late(self, byte: int) -> None:
        """A "kernel" on the producer's stream that writes every byte, LATE_US from now."""
        assert self.cuda.lib.deepio_fake_cuda_enqueue_fill(self.stream, self.ptr, byte, self.nbytes, LATE_US) == 0

    def fill_held(self, byte: int) -> None:
        """A "kernel" on the producer's stream that writes every byte once release() is called
        (the fake holds fills until then)."""
        self.cuda.lib.deepio_fake_cuda_hold_fills.argtypes = [ctypes.c_int]
        self.cuda.lib.deepio_fake_cuda_hold_fills(1)
        assert self.cuda.lib.deepio_fake_cuda_enqueue_fill(self.stream, self.ptr, byte, self.nbytes, -1) == 0

    def release(self) -> None:
        self.cuda.lib.deepio_fake_cuda_hold_fills(0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        if stream is not None and stream != -1:
            lib = self.cuda.lib
            self.cuda._current()
            e = ctypes.c_void_p()
            assert lib.cuEventCreate(ctypes.byref(e), 2) == 0
            assert lib.cuEventRecord(e, self.stream) == 0
            assert lib.cuStreamWaitEvent(stream, e, 0) == 0
            assert lib.cuEventDestroy_v2(e) == 0
        return super().__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)

    def settle(self) -> bytes:
        """The bytes once the producer's stream is idle."""
        self.cuda._current()
        assert self.cuda.lib.cuStreamSynchronize(self.stream) == 0
        return self.read()

    def free(self) -> None:
        self.settle()
        assert self.cuda.lib.cuStreamDestroy_v2(self.stream) == 0
        super().free()


class PlainProducer(FakeCudaTensor):
    """A producer whose ``__dlpack__`` takes no ``stream``: its work is on the legacy default
    stream, which is what DLPack's plain export promises to order before."""

    def __dlpack__(self, *, max_version=None, dl_device=None, copy=None):
        return super().__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)


@pytest.fixture
def producer(cuda):
    made = []

    def make(nbytes: int) -> StreamProducer:
        t = StreamProducer(cuda, nbytes)
        made.append(t)
        return t

    yield make
    for t in made:
        t.free()


@needs_fake
def test_device_write_is_ordered_after_the_producer_without_a_stall(producer, tmp):
    n = (1 << 20) + 4097
    src = producer(n)
    src.fill_held(0x5C)
    f = tmp / "w.bin"
    h = deepio.aio_handle(block_size=65536, queue_depth=4, intra_op_parallelism=2)
    # The submission returns while the producer's fill is held: it did not wait for the
    # producer (no clock decides; the 60 s only bounds a broken engine).
    submitted = threading.Thread(target=lambda: h.async_pwrite(src, str(f)), daemon=True)
    submitted.start()
    submitted.join(60)
    returned = not submitted.is_alive()
    src.release()
    submitted.join()
    assert returned, "the submission waited for the producer"
    assert h.wait() == 1
    assert f.read_bytes() == b"\x5c" * n, "the staged copy saw the memory before the producer's fill"
    asked = [s for s in src.streams if s is not None]
    assert len(asked) == 1 and asked[0] > 2, f"one stream exchange with deepio's own stream: {src.streams}"


@needs_fake
def test_device_read_lands_after_the_producer(producer, tmp):
    n = (1 << 20) + 4097
    data = rand(n)
    f = tmp / "r.bin"
    f.write_bytes(data)
    dst = producer(n)
    dst.fill_late(0x77)
    h = deepio.aio_handle(block_size=65536, queue_depth=4, intra_op_parallelism=2)
    assert h.sync_pread(dst, str(f)) == 1
    assert dst.settle() == data, "the producer's late fill overwrote the read"
    # The same through a batch and a ranged read.
    dst.fill_late(0x78)
    assert h.async_pread_batch([dst], str(f)) == 1
    assert h.wait() == 1
    assert dst.settle() == data
    dst.fill_late(0x79)
    h.async_pread_ranges(dst, str(f), [0, n // 2], [n // 2, n - n // 2], [0, n // 2])
    assert h.wait() == 1
    assert dst.settle() == data


@needs_fake
def test_producer_without_stream_keyword_is_ordered_on_the_legacy_stream(cuda, tmp):
    n = 300_000
    src = PlainProducer(cuda, n)
    cuda.lib.deepio_fake_cuda_enqueue_fill.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_size_t,
        ctypes.c_long,
    ]
    try:
        assert cuda.lib.deepio_fake_cuda_enqueue_fill(None, src.ptr, 0x21, n, LATE_US) == 0
        f = tmp / "p.bin"
        assert deepio.aio_handle().sync_pwrite(src, str(f)) == 1
        assert f.read_bytes() == b"\x21" * n
    finally:
        src.free()


# ------------------------------------------------------------------------------ gds_handle


@needs_fake
def test_gds_handle_getters_mode_and_builder():
    h = deepio.gds_handle(262144, 2, True, True, 2)
    assert h.get_block_size() == 262144
    assert h.get_queue_depth() == 2
    assert h.get_single_submit() is True
    assert h.get_overlap_events() is True
    assert h.get_intra_op_parallelism() == 2
    assert h.get_alignment() == 512
    assert h.mode in ("gds", "compat")
    if MODE == "nocufile":
        assert h.mode == "compat"
        assert "cuFile" in h.mode_reason
    b = compat.GDSBuilder()
    assert b.is_compatible()
    mod = b.load()
    assert mod.gds_handle is deepio.gds_handle
    assert deepio.info()["gpu"]["cuda_found"] is True
    h.close()
    assert h.closed


@needs_fake
@pytest.mark.parametrize("nbytes", [777, 1 << 20, (1 << 20) + 4097])
@pytest.mark.parametrize("pinned", [True, False])
def test_gds_sync_and_async(dev, tmp, nbytes, pinned):
    data = rand(nbytes)
    h = deepio.gds_handle(block_size=262144, queue_depth=2, intra_op_parallelism=2)
    src = dev(nbytes, data)
    dst = dev(nbytes)
    if pinned:
        assert h.pin_device_tensor(src) is True
        assert h.pin_device_tensor(dst) is True
    f = tmp / "g.bin"
    assert h.sync_pwrite(src, str(f)) == 1
    assert f.read_bytes() == data
    assert h.sync_pread(dst, str(f)) == 1
    assert dst.read() == data
    dst.write(b"\0" * nbytes)
    assert h.async_pread(dst, str(f)) == 0
    assert h.wait() == 1
    assert dst.read() == data
    assert h.async_pwrite(src, str(tmp / "h.bin")) == 0
    assert h.wait() == 1
    assert (tmp / "h.bin").read_bytes() == data
    assert h.wait() == 0
    st = h.stats()["gds"]
    assert st["ops_completed"] == 4 and st["ops_failed"] == 0
    if MODE == "fake" and h.mode == "gds":
        assert st["bytes_cufile"] == 4 * nbytes
    if pinned:
        assert h.unpin_device_tensor(src) is True
        assert h.free_pinned_device_tensor(dst) is True
        assert h.unpin_device_tensor(src) is False


@needs_fake
def test_a_pinned_tensor_stays_pinned_after_every_handle_closed(dev, tmp):
    # Pins are process-wide and end at unpin: the last handle's close ends cuFile's
    # registration (its driver closes), not deepio's pin, so the tensor deepio keeps alive and
    # the registry agree; a later handle unpins it, and re-pinning registers it with cuFile again.
    data = rand(3 * 4096 + 5)
    src = dev(len(data), data)
    h = deepio.gds_handle(block_size=65536)
    assert h.pin_device_tensor(src) is True
    h.close()
    h2 = deepio.gds_handle(block_size=65536)
    assert h2.pin_device_tensor(src) is True  # the same pin: registered again, not an overlap
    f = tmp / "p.bin"
    assert h2.sync_pwrite(src, str(f)) == 1
    assert f.read_bytes() == data
    if MODE == "fake" and h2.mode == "gds":
        assert h2.stats()["gds"]["bytes_cufile"] == len(data)
    assert h2.unpin_device_tensor(src) is True, "the pin did not survive the first handle"
    assert h2.unpin_device_tensor(src) is False
    h2.close()


@needs_fake
@pytest.mark.parametrize("queue", [2, 3])
def test_gds_async_queue(dev, tmp, queue):
    h = deepio.gds_handle(block_size=65536, intra_op_parallelism=2)
    datas = [rand(100_000 + i) for i in range(queue)]
    srcs = [dev(len(d), d) for d in datas]
    for i, s in enumerate(srcs):
        assert h.async_pwrite(s, str(tmp / f"q{i}")) == 0
    assert h.wait() == queue
    dsts = [dev(len(d)) for d in datas]
    for i, d in enumerate(dsts):
        assert h.async_pread(d, str(tmp / f"q{i}")) == 0
    assert h.wait() == queue
    assert [d.read() for d in dsts] == datas


@needs_fake
@pytest.mark.parametrize("parts", [[1, 1, 1], [1, 1, 2], [1, 2, 1], [2, 1, 1]])
def test_gds_offset_reads_into_views_of_a_pinned_buffer(dev, tmp, parts):
    unit = 65536 + 3
    total = sum(parts) * unit
    data = rand(total)
    f = tmp / "r.bin"
    f.write_bytes(data)
    h = deepio.gds_handle(block_size=65536, queue_depth=2, intra_op_parallelism=2)
    buf = dev(total)
    h.pin_device_tensor(buf)
    off = 0
    for p in parts:
        n = p * unit
        assert h.async_pread(buf.view(off, n), str(f), off) == 0
        assert h.wait() == 1
        off += n
    assert buf.read() == data
    # A view running past the end of the pinned buffer it starts in: EINVAL, not a crash.
    longer = FakeCudaTensor(buf.cuda, total, buf.ptr + 10, owner=buf)
    with pytest.raises(OSError) as ei:
        h.sync_pread(longer, str(f))
    assert ei.value.errno == errno.EINVAL
    assert h.unpin_device_tensor(buf)


@needs_fake
@pytest.mark.parametrize("use_fd", [False, True])
def test_gds_cpu_buffers_take_the_cpu_path(tmp, use_fd):
    # DeepNVMe's TestAsyncFileOffset.test_offset_write: CPU slices, by name or by descriptor.
    data = rand(3 * 4096 + 5)
    h = deepio.gds_handle(intra_op_parallelism=2)
    f = tmp / "c.bin"
    mv = memoryview(bytearray(data))
    cuts = [0, 4096, 8192 + 3, len(data)]
    for a, b in zip(cuts, cuts[1:]):
        if use_fd:
            fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o600)
            assert h.async_pwrite(mv[a:b], fd=fd, file_offset=a) == 0
            assert h.wait() == 1
            os.close(fd)
        else:
            assert h.async_pwrite(mv[a:b], str(f), a) == 0
            assert h.wait() == 1
        assert f.read_bytes() == data[:b]
    assert h.stats()["gds"]["ops_completed"] == 0
    out = bytearray(len(data))
    assert h.sync_pread(out, str(f)) == 1
    assert bytes(out) == data


@needs_fake
def test_gds_mixed_device_and_cpu_ops_in_one_wait(dev, tmp):
    data = rand(50_000)
    (tmp / "m").write_bytes(data)
    h = deepio.gds_handle()
    d = dev(50_000)
    c = bytearray(50_000)
    h.async_pread(d, str(tmp / "m"))
    h.async_pread(c, str(tmp / "m"))
    assert h.pending() == 2
    assert h.wait() == 2
    assert d.read() == data and bytes(c) == data


@needs_fake
@pytest.mark.parametrize("kind", ["aio", "gds"])
def test_durable_writes_of_device_buffers_sync_once_each(dev, tmp, kind):
    # fsync=True on the staged path (aio_handle) and on the cuFile route (gds_handle): the
    # write completes after its fdatasync, counted in stats()["synced"].
    data = rand((1 << 20) + 333)
    src = dev(len(data), data)
    h = deepio.aio_handle(block_size=65536) if kind == "aio" else deepio.gds_handle(block_size=65536)
    assert h.sync_pwrite(src, str(tmp / "a"), fsync=True) == 1
    h.async_pwrite(src, str(tmp / "b"), fsync=True)
    h.async_pwrite_batch([src.view(0, 1000), src.view(1000, 5000)], [str(tmp / "c"), str(tmp / "d")], fsync=True)
    assert h.wait() == 3
    assert h.stats()["synced"] == 4
    assert (tmp / "a").read_bytes() == data and (tmp / "b").read_bytes() == data
    assert (tmp / "c").read_bytes() == data[:1000] and (tmp / "d").read_bytes() == data[1000:6000]


@needs_fake
@pytest.mark.parametrize("kind", ["aio", "gds"])
def test_ranges_into_and_from_device_buffers_are_staged(dev, tmp, kind):
    page = 4096
    n = 300
    data = rand(n * page + 5)
    (tmp / "f").write_bytes(data)
    order = list(range(n))
    random.Random(1).shuffle(order)
    h = deepio.aio_handle(block_size=65536, intra_op_parallelism=2) if kind == "aio" else deepio.gds_handle()
    dst = dev(n * page)
    assert h.async_pread_ranges(dst, str(tmp / "f"), [i * page + 5 for i in order], page) == n * page
    assert h.wait() == 1
    got = dst.read()
    assert all(got[k * page : (k + 1) * page] == data[i * page + 5 : (i + 1) * page + 5] for k, i in enumerate(order))
    # Scattered back to a new file from device memory, in the file's original order.
    h.async_pwrite_ranges(dst, str(tmp / "g"), [i * page for i in order], page, fsync=True)
    assert h.wait() == 1
    assert (tmp / "g").read_bytes() == data[5 : n * page + 5]
    if kind == "gds":
        assert h.stats()["gds"]["bytes_cufile"] == 0, "ranges are staged, never cuFile"


@needs_cufile
def test_gds_cufile_read_error_raises(dev, tmp):
    lib = ctypes.CDLL(os.environ["DEEPIO_CUFILE_LIBRARY"])
    lib.deepio_fake_cufile_fail_io.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int]
    data = rand(200_000)
    (tmp / "e").write_bytes(data)
    h = deepio.gds_handle(block_size=65536)
    buf = dev(200_000)
    lib.deepio_fake_cufile_fail_io(0, -1, errno.EIO, 1)  # the second read fails with EIO
    try:
        with pytest.raises(OSError) as ei:
            h.sync_pread(buf, str(tmp / "e"))
    finally:
        lib.deepio_fake_cufile_fail_io(-1, 0, 0, 0)  # (reset() would also forget the open driver)
    assert ei.value.errno == errno.EIO
    assert ei.value.filename == str(tmp / "e")
    # cuFile's own error code on a write: an error in mode "cufile" ...
    strict = deepio.gds_handle(block_size=65536, mode="cufile")
    lib.deepio_fake_cufile_fail_io(1, -5011, 0, 0)  # CU_FILE_CUDA_DRIVER_ERROR
    try:
        with pytest.raises(OSError, match="CU_FILE_CUDA_DRIVER_ERROR"):
            strict.sync_pwrite(buf, str(tmp / "f"))
    finally:
        lib.deepio_fake_cufile_fail_io(-1, 0, 0, 0)
    assert h.sync_pread(buf, str(tmp / "e")) == 1
    assert buf.read() == data
    # ... and in "auto" the request is staged instead, counted and explained.
    lib.deepio_fake_cufile_fail_io(1, -5011, 0, 0)
    try:
        assert h.sync_pwrite(buf, str(tmp / "f")) == 1
    finally:
        lib.deepio_fake_cufile_fail_io(-1, 0, 0, 0)
    assert (tmp / "f").read_bytes() == data
    assert h.stats()["gds"]["io_fallbacks"] >= 1
    assert "CU_FILE_CUDA_DRIVER_ERROR" in h.mode_reason


@needs_cufile
def test_gds_unsupported_file_falls_back_and_says_so(dev, tmp):
    lib = ctypes.CDLL(os.environ["DEEPIO_CUFILE_LIBRARY"])
    lib.deepio_fake_cufile_fail_register(5008)  # CU_FILE_IO_NOT_SUPPORTED
    try:
        h = deepio.gds_handle()
        data = rand(10_000)
        assert h.sync_pwrite(dev(10_000, data), str(tmp / "u")) == 1
    finally:
        lib.deepio_fake_cufile_fail_register(0)
    assert (tmp / "u").read_bytes() == data
    assert h.mode == "compat"
    assert "CU_FILE_IO_NOT_SUPPORTED" in h.mode_reason
    assert h.stats()["gds"]["files_fallback"] == 1


@needs_fake
def test_gds_errors_are_exceptions(dev, tmp):
    h = deepio.gds_handle()
    buf = dev(100)
    with pytest.raises(FileNotFoundError):
        h.sync_pread(buf, str(tmp / "missing"))
    (tmp / "short").write_bytes(b"x" * 50)
    with pytest.raises(deepio.EndOfFileError):
        h.sync_pread(buf, str(tmp / "short"))
    h.pin_device_tensor(buf)
    with pytest.raises(OSError) as ei:
        h.pin_device_tensor(buf.view(10, 20))  # overlaps a pinned buffer
    assert ei.value.errno == errno.EEXIST
    assert h.unpin_device_tensor(buf)
    with pytest.raises(TypeError, match="CUDA"):
        h.pin_device_tensor(bytearray(10))
    with pytest.raises(ValueError):
        deepio.gds_handle(block_size=0)
    with pytest.raises(ValueError):
        deepio.gds_handle(mode="fast")


@needs_fake
def test_new_pinned_device_tensor_needs_torch_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch has CUDA here: covered by test_gpu_real.py")
    h = deepio.gds_handle()
    with pytest.raises(RuntimeError, match="torch has no usable CUDA"):
        h.new_pinned_device_tensor(10, torch.empty(0, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="torch has no usable CUDA"):
        h.new_pinned_device_tensor(10, example_tenosr=torch.empty(0))


@needs_fake
def test_gds_handle_destroyed_with_writes_in_flight_finishes_them(dev, tmp):
    data = rand(1 << 20)
    h = deepio.gds_handle(block_size=65536)
    h.async_pwrite(dev(len(data), data), str(tmp / "d"))
    del h
    assert (tmp / "d").read_bytes() == data


# ----------------------------------------------------------------------------- no CUDA


@needs_absent
def test_no_cuda_clean_errors(tmp):
    info = deepio.gpu_info()
    assert info["cuda_found"] is False and info["gds_mode"] == "unavailable"
    assert "disabled" in info["cuda_reason"] or "none" in info["cuda_reason"], info["cuda_reason"]
    assert deepio.info()["gpu"]["cuda_found"] is False
    with pytest.raises(OSError) as ei:
        deepio.gds_handle()
    assert ei.value.errno in (errno.ENOTSUP, errno.ENODEV)
    with pytest.raises(OSError) as ei:
        deepio.aio_handle(device_route="gds")
    assert ei.value.errno in (errno.ENOTSUP, errno.ENODEV)
    # auto (the default) and staged work for host memory without CUDA.
    for route in ("auto", "staged"):
        h = deepio.aio_handle(device_route=route)
        assert h.sync_pwrite(bytearray(b"abc"), str(tmp / route)) == 1
        assert h.stats()["device_ops_completed"] == 0
    b = compat.GDSBuilder()
    assert b.is_compatible() is False
    assert "CUDA" in b.reason
    with pytest.raises(RuntimeError, match="gds"):
        b.load()


@needs_absent
def test_no_cuda_device_buffers_are_refused_with_the_reason(tmp):
    class Pretend:  # any kDLCUDA producer; nothing is dereferenced
        def __dlpack_device__(self):
            return (KDLCUDA, 0)

        def __dlpack__(self, **kw):
            return FakeCudaTensor.__dlpack__(self, **kw)

    p = Pretend()
    p.ptr, p.nbytes = 0x1000, 64
    with pytest.raises(TypeError, match="cannot use the CUDA driver"):
        deepio.aio_handle().sync_pwrite(p, str(tmp / "n"))
    assert not (tmp / "n").exists()


@needs_fake
def test_managed_memory_labelled_cuda_is_read_in_place(cuda, tmp):
    # CUDA managed memory is host-addressable: deepio reads and writes it as host memory, even
    # when a framework (torch with a managed allocator) labels it kDLCUDA rather than
    # kDLCUDAManaged; nothing is staged and cuFile is never asked.
    n = 100_000
    cuda.lib.cuMemAllocManaged.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_uint]
    cuda._current()
    p = ctypes.c_uint64()
    assert cuda.lib.cuMemAllocManaged(ctypes.byref(p), n, 1) == 0  # CU_MEM_ATTACH_GLOBAL
    try:
        t = FakeCudaTensor(cuda, n, p.value)
        data = rand(n)
        (tmp / "m").write_bytes(data)
        for h in (deepio.aio_handle(), deepio.gds_handle()):
            ctypes.memset(p.value, 0, n)
            assert h.sync_pread(t, str(tmp / "m")) == 1
            assert ctypes.string_at(p.value, n) == data
            assert h.sync_pwrite(t, str(tmp / "m2")) == 1
            assert (tmp / "m2").read_bytes() == data
        assert h.stats()["gds"]["ops_completed"] == 0, "not device memory"
        assert h.stats()["gds"]["bytes_staged"] == 0
    finally:
        cuda.free(p.value)


# ------------------------------------------------------------------- deepio.kv, a CUDA pool


class FakeCudaPool(FakeCudaTensor):
    """A 2-D [rows, page] uint8 CUDA pool exported through DLPack, as torch.empty((rows,
    page), dtype=torch.uint8, device="cuda") would be."""

    def __init__(self, cuda: FakeCuda, rows: int, page: int) -> None:
        super().__init__(cuda, rows * page)
        self.shape = (rows, page)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        shape = (ctypes.c_int64 * 2)(*self.shape)
        mt = DLManagedTensor()
        mt.dl_tensor.data = self.ptr
        mt.dl_tensor.device = DLDevice(KDLCUDA, 0)
        mt.dl_tensor.ndim = 2
        mt.dl_tensor.dtype = DLDataType(1, 8, 1)
        mt.dl_tensor.shape = shape
        mt.dl_tensor.strides = None
        mt.dl_tensor.byte_offset = 0
        mt.deleter = _NOOP_DELETER
        _keep.append((mt, shape))
        return _PyCapsule_New(ctypes.addressof(mt), _CAPSULE_NAME, None)


@needs_fake
def test_kv_store_cuda_pool_round_trip_flipped_byte_and_copy_error(cuda, tmp):
    import deepio.kv

    page, rows = 16384, 6
    pool = FakeCudaPool(cuda, rows, page)
    try:
        pages = [rand(page) for _ in range(3)]
        for r, p in enumerate(pages):
            cuda.put(pool.ptr + r * page, p)
        with deepio.kv.Store(
            [str(tmp / "kv")], capacity_bytes=16 * (4096 + page), page_bytes=page, device_pages_in_flight=2
        ) as store:
            store.register(pool)
            assert store.put(["a", "b", "c"], [0, 1, 2]).result(timeout=30) == [True] * 3
            assert store.get(["a", "b", "c", "zz"], [3, 4, 5, 0]).result(timeout=30) == [True, True, True, False]
            for r, p in enumerate(pages):
                assert cuda.get(pool.ptr + (3 + r) * page, page) == p
            assert store.stats()["device_pages"] == 6
            # segments with device addresses: the K and V halves of a page
            half = page // 2
            segs = [[(pool.ptr + half, half), (pool.ptr, half)]]
            assert store.put_segments(["swapped"], segs).result(timeout=30) == [True]
            back = [[(pool.ptr + 3 * page, half), (pool.ptr + 3 * page + half, half)]]
            assert store.get_segments(["swapped"], back).result(timeout=30) == [True]
            assert cuda.get(pool.ptr + 3 * page, page) == pages[0][half:] + pages[0][:half]

            # A flipped byte on disk: a miss; the device row keeps what it held.
            slab = tmp / "kv" / "slab-0000.bin"
            raw = bytearray(slab.read_bytes())
            at = raw.find(pages[1][:256])
            assert at >= 0
            raw[at + 10] ^= 0xFF
            with open(slab, "r+b") as f:
                f.seek(at + 10)
                f.write(bytes([raw[at + 10]]))
            cuda.put(pool.ptr + 4 * page, b"\xee" * page)
            assert store.get(["b"], [4]).result(timeout=30) == [False]
            assert cuda.get(pool.ptr + 4 * page, page) == b"\xee" * page
            assert store.stats()["corrupt"] == 1

            # A driver copy error: that page is False, the folder stays ok, the page stays.
            cuda.fail("cuMemcpyHtoD", 700)
            assert store.get(["c"], [5]).result(timeout=30) == [False]
            cuda.fail(None)
            st = store.stats()
            assert st["device_copy_errors"] == 1 and st["folders"][0]["state"] == "ok"
            assert store.get(["c"], [5]).result(timeout=30) == [True]
            assert cuda.get(pool.ptr + 5 * page, page) == pages[2]

            # A CPU pool on the same store: the host path, unchanged.
            host = bytearray(rand(page)) + bytearray(page)
            import numpy as np

            cpu = np.frombuffer(host, dtype=np.uint8).reshape(2, page)
            store.register(cpu)
            n = store.stats()["device_pages"]
            assert store.put(["h"], [0]).result(timeout=30) == [True]
            assert store.get(["h"], [1]).result(timeout=30) == [True]
            assert cpu[1].tobytes() == cpu[0].tobytes()
            assert store.stats()["device_pages"] == n
    finally:
        cuda.fail(None)
        pool.free()
