"""DeepNVMe's own conformance checklist (tests/unit/v1/nvme/test_aio.py, reference §5.1),
run with torch CPU tensors and NumPy arrays, plain and locked buffers (torch-pinned where a
runtime can pin)."""

from __future__ import annotations

import errno
import os
import time

import pytest

import deepio
from conftest import FRAMEWORKS, TORCH_PINNED, as_bytes, fill, make_buffer, needs_numpy, needs_torch
from deepio import _deepio

BLOCK_SIZE = 1024
QUEUE_DEPTH = 2
IO_SIZE = 4096
PARALLELISM = 2

# (framework, buffer kind): plain memory, new_cpu_locked_tensor, torch pin_memory().
BUFFERS = [
    pytest.param("torch", "plain", marks=needs_torch, id="torch-plain"),
    pytest.param("torch", "locked", marks=needs_torch, id="torch-locked"),
    pytest.param(
        "torch",
        "pinned",
        id="torch-pinned",
        marks=[
            needs_torch,
            pytest.mark.skipif(not TORCH_PINNED, reason="torch cannot pin host memory here (no CUDA runtime)"),
        ],
    ),
    pytest.param("numpy", "plain", marks=needs_numpy, id="numpy-plain"),
    pytest.param("numpy", "locked", marks=needs_numpy, id="numpy-locked"),
]


def _handle(single_submit=False, overlap_events=False):
    h = deepio.aio_handle(BLOCK_SIZE, QUEUE_DEPTH, single_submit, overlap_events, PARALLELISM)
    assert h.get_block_size() == BLOCK_SIZE
    assert h.get_queue_depth() == QUEUE_DEPTH
    assert h.get_single_submit() == single_submit
    assert h.get_overlap_events() == overlap_events
    assert h.get_intra_op_parallelism() == PARALLELISM
    return h


def _buffer(framework, kind, h, nbytes=IO_SIZE):
    return make_buffer(framework, nbytes, kind, h)


def _free(h, buf, kind):
    if kind == "locked":
        assert h.free_cpu_locked_tensor(buf)


def test_getters_and_defaults():
    h = deepio.aio_handle()
    assert (
        h.get_block_size(),
        h.get_queue_depth(),
        h.get_single_submit(),
        h.get_overlap_events(),
        h.get_intra_op_parallelism(),
    ) == (1048576, 128, False, False, 1)
    assert h.get_alignment() == 512
    assert h.get_thread_count() == 1
    h2 = deepio.aio_handle(4096, 8, True, True, 3)
    assert (
        h2.get_block_size(),
        h2.get_queue_depth(),
        h2.get_single_submit(),
        h2.get_overlap_events(),
        h2.get_intra_op_parallelism(),
        h2.get_alignment(),
    ) == (4096, 8, True, True, 3, 1536)
    # the tutorial's spelling
    assert deepio.aio_handle(num_threads=4).get_intra_op_parallelism() == 4
    assert deepio.aio_handle(thread_count=2).get_thread_count() == 2


@pytest.mark.parametrize("framework,kind", BUFFERS)
@pytest.mark.parametrize("single_submit", [True, False])
@pytest.mark.parametrize("overlap_events", [True, False])
class TestReadWrite:
    def test_parallel_read(self, framework, kind, single_submit, overlap_events, random_file):
        path, data = random_file(IO_SIZE)
        h = _handle(single_submit, overlap_events)
        buf = _buffer(framework, kind, h)
        assert h.sync_pread(buf, str(path)) == 1
        assert as_bytes(buf) == data
        _free(h, buf, kind)

    def test_async_read(self, framework, kind, single_submit, overlap_events, random_file):
        path, data = random_file(IO_SIZE)
        h = _handle(single_submit, overlap_events)
        buf = _buffer(framework, kind, h)
        assert h.async_pread(buf, str(path)) == 0
        assert h.wait() == 1
        assert as_bytes(buf) == data
        _free(h, buf, kind)

    def test_parallel_write(self, framework, kind, single_submit, overlap_events, tmp_dir):
        data = os.urandom(IO_SIZE)
        h = _handle(single_submit, overlap_events)
        buf = _buffer(framework, kind, h)
        fill(buf, data)
        path = tmp_dir / "out.bin"
        assert h.sync_pwrite(buf, str(path)) == 1
        assert path.is_file()
        assert path.read_bytes() == data
        _free(h, buf, kind)

    def test_async_write(self, framework, kind, single_submit, overlap_events, tmp_dir):
        data = os.urandom(IO_SIZE)
        h = _handle(single_submit, overlap_events)
        buf = _buffer(framework, kind, h)
        fill(buf, data)
        path = tmp_dir / "out.bin"
        assert h.async_pwrite(buf, str(path)) == 0
        assert h.wait() == 1
        assert path.read_bytes() == data
        _free(h, buf, kind)


@pytest.mark.parametrize("framework,kind", BUFFERS)
@pytest.mark.parametrize("async_queue", [2, 3])
class TestAsyncQueue:
    def test_read(self, framework, kind, async_queue, random_file):
        h = _handle(True, True)
        refs = [random_file(IO_SIZE) for _ in range(async_queue)]
        bufs = [_buffer(framework, kind, h) for _ in range(async_queue)]
        for buf, (path, _) in zip(bufs, refs):
            assert h.async_pread(buf, str(path)) == 0
        assert h.wait() == async_queue
        for buf, (_, data) in zip(bufs, refs):
            assert as_bytes(buf) == data
        for buf in bufs:
            _free(h, buf, kind)

    def test_write(self, framework, kind, async_queue, tmp_dir):
        h = _handle(True, True)
        datas = [os.urandom(IO_SIZE) for _ in range(async_queue)]
        bufs = [_buffer(framework, kind, h) for _ in range(async_queue)]
        paths = [tmp_dir / f"w{i}.bin" for i in range(async_queue)]
        for buf, data, path in zip(bufs, datas, paths):
            fill(buf, data)
            assert h.async_pwrite(buf, str(path)) == 0
        assert h.wait() == async_queue
        for data, path in zip(datas, paths):
            assert path.read_bytes() == data
        for buf in bufs:
            _free(h, buf, kind)


PARTITIONS = [[1, 1, 1], [1, 1, 2], [1, 2, 1], [2, 1, 1]]


@pytest.mark.parametrize("framework,kind", BUFFERS)
@pytest.mark.parametrize("partitions", PARTITIONS)
class TestAsyncFileOffset:
    @pytest.mark.parametrize("use_fd", [False, True])
    def test_offset_write(self, framework, kind, partitions, use_fd, tmp_dir):
        h = _handle()
        sizes = [p * 1024 for p in partitions]
        data = os.urandom(sum(sizes))
        buf = _buffer(framework, kind, h, len(data))
        fill(buf, data)
        path = tmp_dir / "offset.bin"
        expected = b""
        offset = 0
        for size in sizes:
            part = buf[offset : offset + size]
            if use_fd:
                fd = os.open(path, os.O_DIRECT | os.O_CREAT | os.O_WRONLY, 0o600)
                try:
                    assert h.async_pwrite(buffer=part, fd=fd, file_offset=offset) == 0
                    assert h.wait() == 1
                finally:
                    os.close(fd)
            else:
                assert h.async_pwrite(buffer=part, filename=str(path), file_offset=offset) == 0
                assert h.wait() == 1
            expected += data[offset : offset + size]
            offset += size
            assert path.read_bytes() == expected  # no truncation, earlier data kept
        del part
        _free(h, buf, kind)

    def test_offset_read(self, framework, kind, partitions, random_file):
        h = _handle()
        sizes = [p * 1024 for p in partitions]
        path, data = random_file(sum(sizes))
        buf = _buffer(framework, kind, h, len(data))
        offset = 0
        for size in sizes:
            view = buf[0:size]  # narrow(buf, 0, size)
            assert h.sync_pread(view, str(path), offset) == 1
            assert as_bytes(view) == data[offset : offset + size]
            offset += size
        del view
        _free(h, buf, kind)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_pread_pwrite_validate_and_async_flags(framework, tmp_dir):
    """pread/pwrite keep DeepNVMe's positional (buffer, filename, validate, async, offset)."""
    h = _handle()
    data = os.urandom(IO_SIZE)
    buf = make_buffer(framework, IO_SIZE)
    fill(buf, data)
    path = str(tmp_dir / "p.bin")
    assert h.pwrite(buf, path, True, False) == 1  # sync, validated
    assert h.pwrite(buf, path, False, True, IO_SIZE) == 0  # async at an offset
    assert h.wait() == 1
    assert h.pwrite(buf, path, True, True, 0) == 0  # async, validated at wait()
    assert h.wait() == 1
    assert os.path.getsize(path) == 2 * IO_SIZE
    out = make_buffer(framework, IO_SIZE)
    assert h.pread(out, path, True, False, IO_SIZE) == 1
    assert as_bytes(out) == data
    out2 = make_buffer(framework, IO_SIZE)
    assert h.pread(out2, path, False, **{"async": True}) == 0  # DeepNVMe's keyword name
    assert h.wait() == 1
    assert as_bytes(out2) == data
    assert h.read(out2, path, True) == 0
    assert h.write(buf, path, False, 4) == 0
    with pytest.raises(TypeError):
        h.pread(out, path, False)  # async is required, as in DeepNVMe


def test_sync_call_waits_for_its_own_op_only(random_file):
    """A synchronous call waits for, and counts, its own operation alone (issue 38; DeepNVMe's
    drained the handle, §1.4): what was queued before stays for wait(), which counts it."""
    h = _handle()
    (p1, d1), (p2, d2), (p3, d3) = (random_file(IO_SIZE) for _ in range(3))
    b1, b2, b3 = bytearray(IO_SIZE), bytearray(IO_SIZE), bytearray(IO_SIZE)
    assert h.async_pread(b1, str(p1)) == 0
    assert h.async_pread(b2, str(p2)) == 0
    assert h.sync_pread(b3, str(p3)) == 1
    assert bytes(b3) == d3
    assert h.pread(b3, str(p3), False, False) == 1  # DeepNVMe's sync form, likewise
    assert h.wait() == 2
    assert (bytes(b1), bytes(b2)) == (d1, d2)
    assert h.wait() == 0


def test_sync_read_returns_its_bytes_while_an_earlier_async_op_failed(random_file, fault):
    """The earlier operation's failure is not the synchronous call's: the sync read returns its
    bytes, and the failure comes from the next wait(), counted there."""
    h = _handle()
    (p1, _), (p2, d2) = random_file(IO_SIZE), random_file(IO_SIZE)
    fault("read", errno=errno.EIO, count=1 << 30)
    assert h.async_pread(bytearray(IO_SIZE), str(p1)) == 0
    deadline = time.monotonic() + 30  # only a broken engine takes this long
    while h.stats()["ops_failed"] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert h.stats()["ops_failed"] == 1
    _deepio._clear_fault()
    out = bytearray(IO_SIZE)
    assert h.sync_pread(out, str(p2)) == 1
    assert bytes(out) == d2
    assert h.pending() == 1
    with pytest.raises(OSError) as e:
        h.wait()
    assert e.value.errno == errno.EIO and e.value.filename == str(p1)
    assert h.wait() == 0


def test_wait_with_nothing_pending_returns_zero():
    h = deepio.aio_handle()
    assert h.wait() == 0
    assert h.wait() == 0
