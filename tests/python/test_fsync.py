"""Durable writes: fsync=True on aio_handle's writes (async_pwrite, sync_pwrite, pwrite, write,
async_pwrite_batch). The engine fdatasyncs each written file after its blocks and before the
write counts as complete; that the sync really runs is seen through stats()["synced"] and the
"sync" fault point (an injected EIO, a delayed sync); durability itself cannot be proven
without a crash."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

import deepio
from conftest import threads_in_fault_delay, wait_until
from deepio import _deepio


def _data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _pread(path, nbytes: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_batch_with_fsync_writes_and_syncs_every_file(tmp_dir):
    h = deepio.aio_handle(block_size=1 << 16, queue_depth=32, intra_op_parallelism=2)
    bufs = [_data(4096 * (1 + i % 7) + i, i) for i in range(200)]
    paths = [tmp_dir / f"t{i:03d}" for i in range(200)]
    assert h.async_pwrite_batch(bufs, paths, fsync=True) == 200
    assert h.wait() == 200
    assert h.stats()["synced"] == 200
    for b, p in zip(bufs, paths):
        assert _read(p) == b.tobytes()
    # Read back through the engine too.
    out = [np.empty_like(b) for b in bufs]
    h.async_pread_batch(out, paths)
    assert h.wait() == 200
    assert all(np.array_equal(a, b) for a, b in zip(out, bufs))
    h.close()


def test_fsync_off_is_unchanged(tmp_dir, fault):
    fault("sync", errno=errno.EIO, count=1 << 30)  # any sync would fail
    h = deepio.aio_handle()
    b = _data(300_000, 1)
    h.async_pwrite(b, tmp_dir / "a")
    h.async_pwrite_batch([b, b], [tmp_dir / "b", tmp_dir / "c"])
    assert h.sync_pwrite(b, tmp_dir / "d") == 1  # its own write only
    assert h.pwrite(b, tmp_dir / "e", False, False) == 1
    assert h.write(b, tmp_dir / "f") == 0
    assert h.wait() == 3
    assert h.stats()["synced"] == 0
    assert _deepio._fault_hits() == 0
    for name in "abcdef":
        assert _read(tmp_dir / name) == b.tobytes()


def test_every_write_method_takes_fsync(tmp_dir):
    h = deepio.aio_handle()
    b = _data(123_457, 2)
    assert h.async_pwrite(b, tmp_dir / "a", fsync=True) == 0
    assert h.wait() == 1
    assert h.sync_pwrite(b, tmp_dir / "b", fsync=True) == 1
    assert h.pwrite(b, tmp_dir / "c", False, True, fsync=True) == 0
    assert h.wait() == 1
    assert h.pwrite(b, tmp_dir / "d", False, False, 4096, fsync=True) == 1
    assert h.write(b, tmp_dir / "e", fsync=True) == 0
    fd = os.open(tmp_dir / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert h.sync_pwrite(b, fd=fd, fsync=True) == 1
    finally:
        os.close(fd)
    assert h.stats()["synced"] == 6
    for name in "abcef":
        assert _read(tmp_dir / name) == b.tobytes()
    assert _read(tmp_dir / "d")[4096:] == b.tobytes()
    with pytest.raises(TypeError, match="fsync must be a bool"):
        h.async_pwrite(b, tmp_dir / "g", fsync="yes")
    with pytest.raises(TypeError, match="fsync"):
        h.async_pwrite_batch([b], [tmp_dir / "g"], fsync=None)


def test_injected_sync_eio_fails_only_that_write_naming_the_file(tmp_dir, fault):
    fault("sync", errno=errno.EIO, path_contains="t07")
    h = deepio.aio_handle(block_size=1 << 16, queue_depth=16)
    bufs = [_data(200_000 + i, i) for i in range(16)]
    paths = [tmp_dir / f"t{i:02d}" for i in range(16)]
    h.async_pwrite_batch(bufs, paths, fsync=True)
    with pytest.raises(OSError) as info:
        h.wait()
    e = info.value
    assert e.errno == errno.EIO
    assert e.filename == str(paths[7])
    assert "fdatasync" in str(e)
    assert e.nbytes == bufs[7].nbytes
    assert e.other_errors == []
    assert _deepio._fault_hits() == 1
    assert h.stats()["synced"] == 15
    assert h.pending() == 0
    for b, p in zip(bufs, paths):  # nothing else lost; the failed one's bytes went out too
        assert _read(p) == b.tobytes()
    # The synchronous call raises it itself; the handle stays usable.
    fault("sync", errno=errno.EIO)
    with pytest.raises(OSError) as info:
        h.sync_pwrite(bufs[0], paths[0], fsync=True)
    assert info.value.errno == errno.EIO and info.value.filename == str(paths[0])
    _deepio._clear_fault()
    assert h.sync_pwrite(bufs[0], paths[0], fsync=True) == 1
    h.close()


def test_write_completes_only_after_its_sync(tmp_dir, fault):
    fault("sync", delay=0.4)
    h = deepio.aio_handle()
    b = _data(1 << 20, 3)
    h.async_pwrite(b, tmp_dir / "slow", fsync=True)
    assert h.pending() == 1
    assert h.wait() == 1
    # The rule counts its hit only once its delay is over, right before the sync runs: a
    # wait() that returned before the sync would find it still 0 (no clock involved).
    assert _deepio._fault_hits() == 1, "wait() returned before the sync did"
    assert h.stats()["synced"] == 1


def test_close_finishes_durable_writes_in_flight(tmp_dir, fault):
    fault("sync", delay=0.2, count=8)
    h = deepio.aio_handle()
    bufs = [_data(70_000, i) for i in range(8)]
    paths = [tmp_dir / f"c{i}" for i in range(8)]
    h.async_pwrite_batch(bufs, paths, fsync=True)
    h.close()
    assert _deepio._fault_hits() == 8, "every sync ran before close() returned"
    for b, p in zip(bufs, paths):
        assert _read(p) == b.tobytes()


def test_reads_refuse_fsync(tmp_dir, random_file):
    h = deepio.aio_handle()
    out = np.empty(4096, np.uint8)
    with pytest.raises(deepio.InvalidArgumentError, match="fsync applies to writes only"):
        h._h.submit(False, out, str(random_file), 0, True)
    with pytest.raises(deepio.InvalidArgumentError, match="request 0 of the batch"):
        h._h.submit_batch(False, [out], str(random_file), None, False, True)
    assert h.pending() == 0


def test_many_threads_durable_writes(tmp_dir):
    h = deepio.aio_handle(block_size=1 << 16, queue_depth=32, intra_op_parallelism=2)
    per, threads = 30, 6
    bufs = {(t, k): _data(50_000 + 97 * k + t, 100 * t + k) for t in range(threads) for k in range(per)}
    counts = [0] * threads
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            batch = []
            for k in range(per):
                p = tmp_dir / f"m{t}-{k}"
                if k % 3 == 0:
                    counts[t] += h.sync_pwrite(bufs[t, k], p, fsync=True)
                elif k % 3 == 1:
                    h.async_pwrite(bufs[t, k], p, fsync=True)
                else:
                    batch.append(k)
            h.async_pwrite_batch([bufs[t, k] for k in batch], [tmp_dir / f"m{t}-{k}" for k in batch], fsync=True)
            counts[t] += h.wait()
        except BaseException as e:  # reported below, in the main thread
            errors.append(e)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert sum(counts) + h.wait() == per * threads
    assert h.stats()["synced"] == per * threads
    for (t, k), b in bufs.items():
        assert _read(tmp_dir / f"m{t}-{k}") == b.tobytes()


# ------------------------------------------------- a real writeback error, seen by one descriptor


def _run(*cmd: str) -> None:
    import subprocess

    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def full_backed_ext4():
    """ext4 without a journal on a loop device whose image lives on a 48 MiB tmpfs: once that
    tmpfs is full, writing back any block the image has not stored yet fails (ENOSPC), a real
    writeback error. Root, losetup and mkfs.ext4 only; yields (the mount point, the tmpfs)."""
    import shutil
    import tempfile

    if os.geteuid() != 0 or not shutil.which("losetup") or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root, losetup and mkfs.ext4")
    top = tempfile.mkdtemp(prefix="deepio-errseq-")
    back, ext = os.path.join(top, "back"), os.path.join(top, "ext")
    os.mkdir(back)
    os.mkdir(ext)
    loop = None
    mounted: list[str] = []
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", back)
        mounted.append(back)
        image = os.path.join(back, "disk.img")
        with open(image, "wb") as f:
            f.truncate(256 << 20)  # sparse: its blocks take tmpfs pages only once written
        import subprocess

        loop = subprocess.run(["losetup", "-f", "--show", image], check=True, capture_output=True, text=True).stdout
        loop = loop.strip()
        _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "lazy_itable_init=0,nodiscard", loop)
        _run("mount", "-o", "errors=continue", loop, ext)
        mounted.append(ext)
    except Exception as e:  # no loop devices in this container, no tmpfs mounts, ...
        for m in reversed(mounted):
            _run("umount", m)
        if loop:
            _run("losetup", "-d", loop)
        shutil.rmtree(top, ignore_errors=True)
        pytest.skip(f"cannot set up the loop device: {e}")
    try:
        yield ext, back
    finally:
        _run("umount", ext)
        _run("losetup", "-d", loop)
        _run("umount", back)
        shutil.rmtree(top, ignore_errors=True)


def test_a_writeback_error_reaches_a_grouped_write_whose_round_synced_another_descriptor(full_backed_ext4, fault):
    """Linux reports a writeback error once to each open descriptor, and only to those opened
    before it. Durable writes of one file are synced in rounds through ONE descriptor: when
    that descriptor was opened after an error someone already saw, its fdatasync succeeds,
    and a write of the same round whose pages were lost must still fail (its own descriptor
    is asked for the errors it has not seen), never complete as durable.

    C: a buffered ranged write whose second block is held 2 s; meanwhile the image's tmpfs is
    filled and a plain fdatasync sees C's first page fail to write back (ENOSPC). G: a durable
    write whose sync is held 3 s, so that F (opened after the error) and C fall into the next
    round of this file, F first. Each step waits for the state the next one needs (a worker
    held in the fault, bytes in the page cache) and checks that the holds have not run out
    yet, so the scenario either happens as described or the test says it did not.

    F's page overwrites a block the image already stores, so its writeback cannot fail: F
    must complete, and its bytes be there. C's error belongs to C alone."""
    ext, back = full_backed_ext4
    x = os.path.join(ext, "x.bin")
    with open(x, "wb") as f:
        f.write(b"\1" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
    h = deepio.aio_handle(block_size=4096, intra_op_parallelism=4, direct_io="off")
    c_data = b"C" * 8192
    fault("write", delay=2.0, after=1, count=1)
    c = h._h.submit_ranges(True, c_data, x, [8 << 20, (8 << 20) + 4096], 4096, None, True, True)
    # Both of C's blocks are in the page cache (the hook runs after the write) and one is held.
    wait_until(lambda: threads_in_fault_delay() == 1 and _pread(x, 8192, 8 << 20) == c_data, "C's held block")
    with open(os.path.join(back, "filler"), "wb", buffering=0) as filler:
        with pytest.raises(OSError) as full:
            while True:
                filler.write(b"\0" * (1 << 20))
        assert full.value.errno == errno.ENOSPC
    seen = os.open(x, os.O_WRONLY)
    try:
        with pytest.raises(OSError) as lost:
            os.fdatasync(seen)  # C's first page cannot be written back: the error is now seen
        assert lost.value.errno in (errno.ENOSPC, errno.EIO)
    finally:
        os.close(seen)
    assert not c.done(), "C's 2 s hold ran out before its page's error was seen: machine too slow"
    fault("sync", delay=3.0, count=1)
    g = h._h.submit_batch(True, [b"G" * 4096], x, [0], True, True)[0]
    wait_until(lambda: threads_in_fault_delay() == 2 or c.done(), "G's sync held")
    assert not c.done(), "C's 2 s hold ran out before G's sync was held: machine too slow"
    f_op = h._h.submit_batch(True, [b"F" * 4096], x, [4096], True, True)[0]
    wait_until(lambda: _pread(x, 4096, 4096) == b"F" * 4096, "F's write")
    # F is written while C and G are still held: F and C fall into the round after G's.
    assert not c.done() and not g.done(), "a hold ran out before F was written: machine too slow"
    assert g.result(None) == 4096
    with pytest.raises(OSError) as failed:
        c.result(None)
    assert failed.value.errno in (errno.ENOSPC, errno.EIO)
    assert "may not be on stable storage" in str(failed.value)
    assert f_op.result(None) == 4096, "F's page was written back: C's error must not fail F"
    assert _pread(x, 4096, 4096) == b"F" * 4096
    os.unlink(os.path.join(back, "filler"))
