"""The modern API: deepio.File, deepio.Future (sync, threads, asyncio), deepio.info()."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import subprocess
import threading
import weakref

import pytest

import deepio
from conftest import (
    FRAMEWORKS,
    as_bytes,
    fill,
    make_buffer,
    mounted,
    needs_numpy,
    small_tmpfs,
    threads_in_fault_delay,
    wait_until,
)

try:
    import numpy as np
except ImportError:
    np = None

pytestmark = needs_numpy


@pytest.mark.wheel
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("direct_io", ["auto", "off"])
def test_file_roundtrip(framework, direct_io, tmp_dir):
    data = os.urandom(3 * 4096 + 5)
    path = tmp_dir / "f.bin"
    src = make_buffer(framework, len(data))
    fill(src, data)
    with deepio.File(path, "w", direct_io=direct_io) as f:
        assert f.direct == (direct_io == "auto")  # ext4 accepts O_DIRECT
        fut = f.pwrite(src, 0)
        assert isinstance(fut, deepio.Future)
        assert fut.result() == len(data)
        assert fut.done() and fut.wait(0) and fut.exception() is None
        assert f.pwrite(src[:10], len(data)).result(timeout=10) == 10
        assert f.size() == len(data) + 10
    assert f.closed
    with deepio.File(str(path), "rb") as f:
        dst = make_buffer(framework, len(data))
        futs = [f.pread(dst[i : i + 4096], i) for i in range(0, len(data), 4096)]
        assert sum(x.result() for x in futs) == len(data)
        assert as_bytes(dst) == data
        assert f.read_into(dst[:7], 3) == 7
        assert as_bytes(dst[:7]) == data[3:10]


def test_file_modes(tmp_dir):
    p = tmp_dir / "m.bin"
    with pytest.raises(FileNotFoundError) as e:
        deepio.File(p, "r")
    assert e.value.filename == str(p)  # as open() names it
    with deepio.File(p, "x") as f:
        f.write_from(b"abcdef")
    with pytest.raises(FileExistsError):
        deepio.File(p, "x")
    with deepio.File(p, "a") as f:  # creates, never truncates
        f.write_from(b"XY", 2)
    assert p.read_bytes() == b"abXYef"
    with deepio.File(p, "r+") as f:
        f.write_from(b"Z", 0)
        b = bytearray(6)
        f.read_into(b)
        assert bytes(b) == b"ZbXYef"
    with deepio.File(p, "w"):  # truncates, like open()
        pass
    assert p.read_bytes() == b""
    with pytest.raises(ValueError):
        deepio.File(p, "rw")
    with pytest.raises(ValueError, match="direct_io"):  # the engine's check, as for aio_handle
        deepio.File(p, "r", direct_io="sometimes")
    with pytest.raises(ValueError, match="direct_io"):
        deepio.File(p, "r", direct_io=2)
    f = deepio.File(p, "r")
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.pread(bytearray(1), 0)


def test_file_opens_as_the_engine_does(tmp_dir, fault):
    """File opens through its handle's engine: a file system refusing O_DIRECT at open
    (EINVAL, injected once) means the page cache, counted in the handle's direct_refused like
    the engine's own opens; with direct_io="on" it is an error naming the file."""
    h = deepio.aio_handle()
    fault("open", errno=errno.EINVAL, count=1)
    with deepio.File(tmp_dir / "a.bin", "w", handle=h) as f:
        assert not f.direct
        assert f.write_from(b"abc") == 3
    assert (tmp_dir / "a.bin").read_bytes() == b"abc"
    assert h.stats()["direct_refused"] == 1
    with deepio.File(tmp_dir / "a.bin", "r+", handle=h) as f:  # nothing injected: O_DIRECT
        assert f.direct
    fault("open", errno=errno.EINVAL, count=1)
    with pytest.raises(OSError) as e:
        deepio.File(tmp_dir / "b.bin", "w", handle=h, direct_io="on")
    assert e.value.errno == errno.EINVAL and e.value.filename == str(tmp_dir / "b.bin")
    assert h.stats()["direct_refused"] == 1
    fault("open", errno=errno.EMFILE, count=1)  # out of descriptors, no operation to wait for
    with pytest.raises(OSError) as e:
        deepio.File(tmp_dir / "c.bin", "w", handle=h)
    assert e.value.errno == errno.EMFILE and e.value.filename == str(tmp_dir / "c.bin")


def test_file_on_a_file_system_without_o_direct(tmp_dir):
    """ramfs refuses O_DIRECT only after open() created the file: "x" must not then find its
    own file existing (it did, before File opened through the engine), and "on" must not leave
    it behind."""
    with mounted(tmp_dir, "ramfs") as mnt:
        h = deepio.aio_handle()
        p = mnt / "x.bin"
        with deepio.File(p, "x", handle=h) as f:
            assert not f.direct
            assert f.write_from(b"hello") == 5
        assert p.read_bytes() == b"hello"
        assert h.stats()["direct_refused"] == 1
        with pytest.raises(FileExistsError):
            deepio.File(p, "x", handle=h)
        with deepio.File(p, "w", handle=h) as f:  # truncates, as without O_DIRECT
            assert not f.direct
        assert p.read_bytes() == b""
        with pytest.raises(OSError) as e:
            deepio.File(mnt / "on.bin", "x", handle=h, direct_io="on")
        assert e.value.errno == errno.EINVAL and e.value.filename == str(mnt / "on.bin")
        assert not (mnt / "on.bin").exists()
        with deepio.File(mnt / "off.bin", "x", handle=h, direct_io="off") as f:
            assert not f.direct
        assert h.stats()["direct_refused"] == 2  # "x" and "w"; the refused "on" is an error, not counted


def test_an_error_at_submission_names_the_file(tmp_dir):
    """A request refused when it is submitted (a read past the end) names the File's path, as
    an error the Future returns later does, and keeps it through pickle."""
    import pickle

    p = tmp_dir / "short.bin"
    p.write_bytes(b"\0" * 4096)
    with deepio.File(p, "r") as f:
        for submit in (lambda: f.pread(bytearray(5000), 0), lambda: f.pread_ranges(bytearray(8), [4093], [8])):
            with pytest.raises(deepio.EndOfFileError) as info:
                submit()
            assert info.value.filename == str(p), info.value
            assert str(p) in str(info.value)
            copy = pickle.loads(pickle.dumps(info.value))
            assert type(copy) is type(info.value) and copy.filename == str(p)


def test_future_errors_and_timeouts(tmp_dir, fault):
    p = tmp_dir / "e.bin"
    p.write_bytes(b"\0" * 4096)
    with deepio.File(p, "r") as f:
        with pytest.raises(deepio.EndOfFileError):
            f.pread(bytearray(5000), 0)  # past the end: raised at submission
        fault("read", delay=0.3, count=1)
        fut = f.pread(bytearray(4096), 0)
        assert not fut.done()
        assert fut.wait(0.01) is False
        with pytest.raises(TimeoutError):
            fut.result(timeout=0.01)
        assert fut.result() == 4096
    h = deepio.aio_handle(backend="threads")
    fault("read", errno=errno.EIO, count=1)
    with deepio.File(p, "r", handle=h) as f:
        fut = f.pread(bytearray(4096), 0)
        exc = fut.exception()
        assert isinstance(exc, OSError) and exc.errno == errno.EIO
        with pytest.raises(OSError):
            fut.result()
        with pytest.raises(OSError):  # every call re-raises, like concurrent.futures
            fut.result()
    assert h.wait() == 0  # File operations are collected by their futures, not wait()


def test_dropped_future_keeps_buffer_until_done(tmp_dir, fault):
    p = tmp_dir / "d.bin"
    data = os.urandom(8192)
    p.write_bytes(data)
    fault("read", delay=0.1, count=2)
    with deepio.File(p, "r") as f:
        buf = np.empty(8192, np.uint8)
        ref = weakref.ref(buf)
        f.pread(buf, 0)  # future dropped at once
        del buf
        assert ref() is not None
    # close() waited for the operation; the buffer is released once the next submission
    # (or handle teardown) prunes finished records
    with deepio.File(p, "r") as f:
        f.read_into(bytearray(1))
    assert ref() is None


def test_asyncio_await(tmp_dir):
    p = tmp_dir / "a.bin"
    data = os.urandom(1 << 16)
    p.write_bytes(data)

    async def main():
        with deepio.File(p, "r") as f:
            bufs = [np.empty(1 << 14, np.uint8) for _ in range(4)]
            futs = [f.pread(b, i << 14) for i, b in enumerate(bufs)]
            counts = await asyncio.gather(*futs)
            assert counts == [1 << 14] * 4
            assert b"".join(b.tobytes() for b in bufs) == data
            assert await f.pread(np.empty(10, np.uint8), 0) == 10

    asyncio.run(main())


def test_file_closes_its_descriptor(tmp_dir):
    p = tmp_dir / "c.bin"
    f = deepio.File(p, "w")
    fd = f.fileno()
    f.write_from(b"x" * 100)
    f.fsync()
    del f
    with pytest.raises(OSError):
        os.fstat(fd)


def test_info():
    d = deepio.info()
    assert d["version"] == deepio.__version__
    names = [b["name"] for b in d["backends"]]
    assert names == ["io_uring", "libaio", "threads"]
    assert d["auto_backend"] in names
    threads = d["backends"][2]
    assert threads["compiled"] and threads["available"]
    for b in d["backends"]:
        assert b["available"] or b["reason"]
    h = deepio.aio_handle()
    assert h.backend == d["auto_backend"]
    assert deepio.aio_handle(backend="threads").backend == "threads"


def test_info_with_path(tmp_dir):
    d = deepio.info(tmp_dir)
    assert set(d["direct_io"]) >= {"supported", "mem_align", "offset_align", "filesystem", "reason"}
    if os.path.exists("/dev/shm"):
        shm = deepio.info("/dev/shm")["direct_io"]
        assert shm["filesystem"] == "tmpfs"


def test_stats_show_direct_and_buffered_bytes(tmp_dir):
    """Aligned requests go direct; unaligned heads and tails through the page cache; tmpfs
    (if present) refuses O_DIRECT visibly."""
    h = deepio.aio_handle(4096, 4, False, False, 1)
    big = np.zeros(1 << 20, np.uint8)
    h.sync_pwrite(big, str(tmp_dir / "s.bin"))
    h.sync_pwrite(np.zeros(100, np.uint8), str(tmp_dir / "s.bin"), 7)
    s = h.stats()
    assert s["ops_completed"] == 2
    assert s["bytes_direct"] + s["bytes_bounced"] + s["bytes_buffered"] == (1 << 20) + 100
    assert s["bytes_buffered"] >= 100


def test_close_from_another_thread_while_a_loop_submits(tmp_dir, fault):
    """close() on one thread while another submits writes in a loop: every write submitted
    completes (close() waits for it, the descriptor stays open until then), later ones raise
    ValueError, and a file opened right after close() gets no byte of them."""
    fault("write", delay=0.002, count=1 << 30)  # a slow device: writes queue up behind each other
    block = b"\x5a" * 4096
    for rnd in range(3):
        a = deepio.File(tmp_dir / f"a{rnd}.bin", "w")
        futures: list = []
        refused: list = []

        def loop(a=a, futures=futures, refused=refused) -> None:
            offset = 0
            while True:
                try:
                    futures.append(a.pwrite(block, offset))
                except ValueError as e:
                    refused.append(e)
                    return
                offset += len(block)

        t = threading.Thread(target=loop)
        t.start()
        wait_until(lambda futures=futures: len(futures) >= 8, "writes to be queued")
        a.close()
        b = deepio.File(tmp_dir / f"b{rnd}.bin", "w")  # most likely a's descriptor number
        t.join()
        assert refused, "the loop ended without a refusal"
        assert all(fut.done() for fut in futures), "close() returned before a write it took finished"
        assert all(fut.result() == len(block) for fut in futures)
        b.close()
        assert os.path.getsize(tmp_dir / f"b{rnd}.bin") == 0, "a write of the closed file reached another"
        assert (tmp_dir / f"a{rnd}.bin").read_bytes() == block * len(futures)


def test_concurrent_closes_both_return_once_closed(tmp_dir, fault):
    f = deepio.File(tmp_dir / "c.bin", "w")
    fault("write", delay=0.3)
    fut = f.pwrite(b"\x01" * 4096)
    closers = [threading.Thread(target=f.close) for _ in range(2)]
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    assert fut.done() and f.closed


def test_file_tracks_each_operation_in_constant_time(tmp_dir, fault):
    """With the operations still running (the one worker held), 3000 submissions through one
    File look at a bounded number of tracked operations per submission (_deepio.File._visits,
    a count kept by test builds, no clock): no rescan of the tracked operations at each
    submission, which made it quadratic (about 4.5 million looks for these 3000; done() is
    asked of at most about 3 per submission: the front one, and full passes only when the
    tracked set doubled)."""
    h = deepio.aio_handle(intra_op_parallelism=1)
    fault("write", delay=2.0)
    with deepio.File(tmp_dir / "many.bin", "w", handle=h) as f:
        first = f.pwrite(b"\x02" * 16, 0)
        wait_until(lambda: threads_in_fault_delay() >= 1, "the worker to be held")
        n = 3000
        offset = 16
        futures = [first]
        visits = f._file._visits
        for _ in range(n):
            futures.append(f.pwrite(b"\x02" * 16, offset))
            offset += 16
        visits = f._file._visits - visits
        still_running = sum(not x.done() for x in futures)
    assert still_running > n // 2, "the worker was not held: no operations accumulated to rescan"
    assert visits <= 4 * n, f"{visits} tracked operations looked at for {n} submissions: rescans as they accumulate"
    assert all(x.result() == 16 for x in futures)


def test_file_keeps_only_running_operations_and_unretrieved_failures(tmp_dir, fault):
    """The binding's bookkeeping for close() (_deepio.File.tracked, counts, no clocks): done
    operations leave as later ones are submitted, so many reads whose results were taken leave
    few records; a failure nobody retrieved stays recorded (dropped Future and all) until
    close() raises it, once."""
    p = tmp_dir / "t.bin"
    p.write_bytes(os.urandom(1 << 16))
    h = deepio.aio_handle(backend="threads")
    f = deepio.File(p, "r", handle=h)
    buf = np.empty(4096, np.uint8)
    for i in range(1000):
        assert f.pread(buf, 4096 * (i % 16)).result() == 4096
    running, failed = f._file.tracked
    assert running <= 1 and failed == 0
    fault("read", errno=errno.EIO, count=1)
    fut = f.pread(buf, 0)
    assert fut.wait(10)
    del fut  # dropped unretrieved: the File still holds the failure for close()
    for i in range(200):  # pruning passes run; the failure survives them
        f.pread(buf, 4096 * (i % 16)).result()
    assert f._file.tracked[1] == 1
    with pytest.raises(OSError) as info:
        f.close()
    assert info.value.errno == errno.EIO and info.value.filename == str(p)
    assert f.closed and f._file.tracked == (0, 0)
    f.close()  # raised once: a second close() is quiet
    with pytest.raises(ValueError):
        f.pread(buf, 0)


def test_a_file_whose_fsync_raised_holds_no_descriptor_once_dropped(tmp_dir):
    """A write that hit ENOSPC on a tiny tmpfs, its Future dropped: fsync() raises it; once the
    caller drops the File (no gc.collect(), the collector off), its descriptor is closed and
    the file system unmounts."""
    gc.disable()
    try:
        with small_tmpfs(tmp_dir, "64k") as mnt:
            f = deepio.File(mnt / "full.bin", "w")
            f.pwrite(b"\x03" * (1 << 20))  # more than the file system holds
            err = 0
            try:
                f.fsync()
            except OSError as e:
                err = e.errno
            assert err == errno.ENOSPC
            del f
            held = [t for t in _fd_targets() if t.startswith(str(mnt))]
            assert not held, f"descriptors still open on the tmpfs: {held}"
            r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            mnt.rmdir()
            mnt.mkdir()  # small_tmpfs's own unmount then finds nothing to do
    finally:
        gc.enable()


def _fd_targets() -> list[str]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            pass
    return out


def test_file_reads_and_writes_the_opened_file_after_its_name_is_replaced_or_removed(tmp_dir):
    """deepio.File holds the file opened once, not the path: renamed over or unlinked after
    the open, every pread/pwrite (and ranged ones) still goes to the opened inode."""
    p, other = tmp_dir / "kept.bin", tmp_dir / "other.bin"
    data, impostor = os.urandom(64 << 10), os.urandom(64 << 10)
    p.write_bytes(data)
    other.write_bytes(impostor)
    with deepio.File(p, "r+") as f:
        ino = os.fstat(f.fileno()).st_ino
        os.replace(other, p)  # a new file under the name
        back = bytearray(len(data))
        assert f.pread(back, 0).result() == len(data) and bytes(back) == data
        assert f.pwrite(b"\x01" * 5000, 4093).result() == 5000
        assert p.read_bytes() == impostor, "the file now at the path is untouched"
        p.unlink()  # no name at all
        part = bytearray(5006)
        assert f.pread_ranges(part, [4090], [5006]).result() == 5006
        assert bytes(part) == data[4090:4093] + b"\x01" * 5000 + data[9093:9096]
        assert f.pwrite(b"\x02" * 100, len(data)).result() == 100  # grows the opened file
        tail = bytearray(100)
        assert f.read_into(tail, len(data)) == 100 and bytes(tail) == b"\x02" * 100
        assert f.size() == len(data) + 100
        assert os.fstat(f.fileno()).st_ino == ino and os.fstat(f.fileno()).st_nlink == 0


def test_many_operations_on_a_file_open_it_once(tmp_dir, fault):
    """Every open the engine makes (and every reopen through /proc/self/fd) passes the Open
    fault point: counted there, a File's reads and writes open nothing after the File's own
    open (its descriptor, and with O_DIRECT its twin without it)."""
    from deepio import _deepio

    p = tmp_dir / "once.bin"
    p.write_bytes(os.urandom(1 << 20))
    fault("open", delay=1e-6, count=1 << 40, path_contains="once.bin")  # counts, changes nothing
    with deepio.File(p, "r+") as f:
        at_open = _deepio._fault_hits()
        assert at_open == (2 if f.direct else 1)
        buf = np.empty(3 * 4096 + 7, np.uint8)
        futs = [f.pread(buf[:4096], 4096 * i) for i in range(100)]
        futs += [f.pread(buf[1 : 4096 + 6], 4096 * i + 3) for i in range(100)]  # unaligned: the twin
        futs.append(f.pread_ranges(buf, [8192, 100], [4096, 300]))
        futs.append(f.pwrite(buf, 5))
        futs.append(f.pwrite_ranges(buf, [0, 1 << 20], [4096, 300]))
        assert all(x.result() > 0 for x in futs)
        assert _deepio._fault_hits() == at_open
    # The path calls, for contrast: one open per operation.
    h = deepio.aio_handle()
    before = _deepio._fault_hits()
    for i in range(10):
        h.async_pread(buf[:4096], str(p), 4096 * i)
    assert h.wait() == 10
    assert _deepio._fault_hits() >= before + 10


def test_file_refuses_the_direction_it_was_not_opened_for(tmp_dir):
    p = tmp_dir / "dir.bin"
    p.write_bytes(b"\0" * 4096)
    with deepio.File(p, "r") as f:
        with pytest.raises(OSError) as e:
            f.pwrite(b"x", 0)
        assert e.value.errno == errno.EBADF and e.value.filename == str(p)
    with deepio.File(p, "a") as f:
        with pytest.raises(OSError) as e:
            f.pread(bytearray(1), 0)
        assert e.value.errno == errno.EBADF


def test_file_reads_go_through_io_urings_registered_files(tmp_dir):
    """On io_uring a File's requests use its slot in each worker's registered-file table
    (stats()["fixed_file_requests"]); path calls never do; the bytes are the file's."""
    if "io_uring" not in [b["name"] for b in deepio.info()["backends"] if b["available"]]:
        pytest.skip("io_uring is not available here")
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    p = tmp_dir / "fixed.bin"
    data = os.urandom(1 << 20)
    p.write_bytes(data)
    h = deepio.aio_handle(block_size=65536, backend="io_uring")
    buf = np.empty(1 << 20, np.uint8)
    with deepio.File(p, "r", handle=h) as f:
        futs = [f.pread(buf[i * 4096 : (i + 1) * 4096], i * 4096) for i in range(64)]
        assert all(x.result() == 4096 for x in futs)
    assert as_bytes(buf[: 64 * 4096]) == data[: 64 * 4096]
    s = h.stats()
    assert s["fixed_file_fallbacks"] == 0
    if release >= (5, 19):
        assert s["fixed_file_requests"] == 64
    else:
        assert s["fixed_file_requests"] == 0, "no sparse file tables before Linux 5.19"
    h.sync_pread(buf[:4096], str(p), 0)
    assert h.stats()["fixed_file_requests"] == s["fixed_file_requests"], "path calls are not registered"
