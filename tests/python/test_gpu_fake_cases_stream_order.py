"""GPU cases with the fake drivers: device reads and writes ordered after the producer's stream
by the DLPack stream handshake (issue 26), without a stall.

Run by test_gpu_fake.py with the fake drivers (gpu_fake_support.py says how); collected on
their own, they skip as one module.
"""

from __future__ import annotations

import ctypes
import threading

import pytest

from gpu_fake_support import MODE, MODES, NOT_A_FAKE_RUN

if MODE not in MODES:
    pytest.skip(NOT_A_FAKE_RUN, allow_module_level=True)

import deepio  # noqa: E402
from gpu_fake_support import FakeCuda, FakeCudaTensor, needs_fake, rand  # noqa: E402

pytest_plugins = ["gpu_fake_support"]  # the fixtures: cuda, dev, tmp


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
