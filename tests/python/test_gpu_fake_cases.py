"""GPU cases with the fake drivers: aio_handle reading and writing device buffers (one handle type
for host and device memory, the device route, offsets, views, copy errors), what is refused
where CPU memory is needed, the machine without CUDA, and deepio.kv over a CUDA pool.

Run by test_gpu_fake.py with the fake drivers (gpu_fake_support.py says how); collected on
their own, they skip as one module.
"""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from gpu_fake_support import MODE, MODES, NOT_A_FAKE_RUN

if MODE not in MODES:
    pytest.skip(NOT_A_FAKE_RUN, allow_module_level=True)

import deepio  # noqa: E402
from deepio import compat  # noqa: E402
from gpu_fake_support import (  # noqa: E402
    _CAPSULE_NAME,
    _NOOP_DELETER,
    KDLCUDA,
    DLDataType,
    DLDevice,
    DLManagedTensor,
    FakeCuda,
    FakeCudaTensor,
    _keep,
    _PyCapsule_New,
    needs_absent,
    needs_cufile,
    needs_fake,
    rand,
)

pytest_plugins = ["gpu_fake_support"]  # the fixtures: cuda, dev, tmp


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
