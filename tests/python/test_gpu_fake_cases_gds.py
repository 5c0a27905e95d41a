"""GPU cases with the fake drivers: gds_handle (getters, mode, builder, sync and async I/O,
pinned device buffers, CPU buffers, durable writes, ranges, cuFile errors and fallbacks).

Run by test_gpu_fake.py with the fake drivers (gpu_fake_support.py says how); collected on
their own, they skip as one module.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random

import pytest

from gpu_fake_support import MODE, MODES, NOT_A_FAKE_RUN

if MODE not in MODES:
    pytest.skip(NOT_A_FAKE_RUN, allow_module_level=True)

import deepio  # noqa: E402
from deepio import compat  # noqa: E402
from gpu_fake_support import FakeCudaTensor, needs_cufile, needs_fake, rand  # noqa: E402

pytest_plugins = ["gpu_fake_support"]  # the fixtures: cuda, dev, tmp


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
