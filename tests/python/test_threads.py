"""GIL release and concurrency (DeepNVMe's test_aio_gil.py, reference §5.3, CPU parts; and
more threads than DeepNVMe ever tested)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

import deepio
from conftest import FRAMEWORKS, as_bytes, fill, make_buffer, needs_numpy, needs_torch

SIZE = 4096


def _peer_runs_during(call, attempts=32) -> bool:
    """DeepNVMe's protocol: a peer thread waits on a lock; with a 60 s switch interval the
    interpreter never preempts the caller, so the peer can only run if `call` releases the
    GIL while it blocks."""
    lock = threading.Lock()
    lock.acquire()
    progressed = threading.Event()

    def peer():
        with lock:
            progressed.set()

    t = threading.Thread(target=peer, daemon=True)
    t.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(60)
    try:
        lock.release()
        for _ in range(attempts):
            call()
            if progressed.is_set():
                break
    finally:
        sys.setswitchinterval(old)
    t.join(30)
    return progressed.is_set()


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "method", ["pread", "pwrite", "sync_pread", "sync_pwrite", "wait", "read", "write", "new_cpu_locked_tensor"]
)
def test_blocking_call_releases_gil(framework, method, random_file):
    h = deepio.aio_handle(4096, 2, True, True, 2)
    path, data = random_file(SIZE)
    buf = make_buffer(framework, SIZE)
    fill(buf, data)
    path = str(path)
    calls = {
        "pread": lambda: h.pread(buf, path, False, False) == 1,
        "pwrite": lambda: h.pwrite(buf, path, False, False) == 1,
        "sync_pread": lambda: h.sync_pread(buf, path) == 1,
        "sync_pwrite": lambda: h.sync_pwrite(buf, path) == 1,
        "wait": lambda: h.async_pread(buf, path) == 0 and h.wait() == 1,
        "read": lambda: h.read(buf, path, False) == 0,
        "write": lambda: h.write(buf, path, False) == 0,
        "new_cpu_locked_tensor": lambda: h.free_cpu_locked_tensor(h.new_cpu_locked_tensor(1 << 16, buf)),
    }
    results = []
    assert _peer_runs_during(lambda: results.append(calls[method]()))
    assert all(results)
    assert as_bytes(buf) == data


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_concurrent_blocking_reads_on_shared_handle(framework, random_file):
    h = deepio.aio_handle(4096, 2, True, True, 2)
    files = [random_file(1 << 16) for _ in range(2)]
    bufs = [make_buffer(framework, 1 << 16) for _ in range(2)]
    statuses = [None, None]
    errors = []
    barrier = threading.Barrier(2)

    def reader(i):
        try:
            barrier.wait()
            statuses[i] = h.sync_pread(bufs[i], str(files[i][0]))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert statuses == [1, 1]
    for buf, (_, data) in zip(bufs, files):
        assert as_bytes(buf) == data


@needs_torch
def test_concurrent_read_and_locked_tensor_management(random_file):
    import torch

    h = deepio.aio_handle(4096, 2, True, True, 2)
    path, data = random_file(SIZE)
    buf = torch.empty(SIZE, dtype=torch.uint8)
    errors = []

    def reads():
        try:
            for _ in range(32):
                assert h.sync_pread(buf, str(path)) == 1
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    def locked():
        try:
            for _ in range(32):
                t = h.new_cpu_locked_tensor(SIZE, buf)
                assert h.free_cpu_locked_tensor(t) is True
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=reads), threading.Thread(target=locked)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert as_bytes(buf) == data


@needs_numpy
@pytest.mark.parametrize("shared_handle", [True, False])
def test_many_threads(shared_handle, tmp_dir):
    """16 threads, each writing then reading back its own region of one file, through one
    shared handle or one handle each, mixing async ops, sync ops and wait()."""
    import numpy as np

    nthreads, per = 16, 3 * 4096 + 123
    path = str(tmp_dir / "shared.bin")
    shared = deepio.aio_handle(8192, 4, False, True, 3)
    errors = []
    barrier = threading.Barrier(nthreads)

    def work(i):
        try:
            h = shared if shared_handle else deepio.aio_handle(8192, 4, False, True, 2)
            rng = np.random.default_rng(i)
            data = rng.integers(0, 256, per, dtype=np.uint8)
            barrier.wait()
            for round_ in range(5):
                off = i * per
                if round_ % 2:
                    assert h.sync_pwrite(data, path, off) >= 1
                else:
                    h.async_pwrite(data, path, off)
                    h.wait()  # may collect other threads' ops too; ours is done after it
                out = np.empty_like(data)
                h.read(out, path, False, off)
                assert (out == data).all()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert shared.wait() == 0
    assert os.path.getsize(path) == nthreads * per


@needs_numpy
def test_each_op_counted_by_exactly_one_waiter(random_file):
    """Several threads wait() on one handle while ops are queued: the counts add up."""
    import numpy as np

    h = deepio.aio_handle(4096, 4, False, False, 2)
    path, data = random_file(1 << 16)
    bufs = [np.empty(1 << 16, dtype=np.uint8) for _ in range(64)]
    for b in bufs:
        h.async_pread(b, str(path))
    counts = []
    lock = threading.Lock()

    def waiter():
        n = h.wait()
        with lock:
            counts.append(n)

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(counts) == 64
    assert all(b.tobytes() == data for b in bufs)


@needs_numpy
def test_sync_call_counts_its_own_op_while_another_thread_waits(random_file):
    """A sync call collects its own operation even when wait() runs in another thread at the
    same time: the count is never 0 and its failure is never raised elsewhere."""
    import numpy as np

    h = deepio.aio_handle(4096, 4, False, False, 2)
    path, data = random_file(1 << 14)
    stop = threading.Event()
    errors = []

    def waiter():
        try:
            while not stop.is_set():
                h.wait()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    try:
        buf = np.empty(1 << 14, np.uint8)
        counts = [h.sync_pread(buf, str(path)) for _ in range(200)]
    finally:
        stop.set()
        t.join(30)
    assert not errors
    assert min(counts) >= 1
    assert buf.tobytes() == data
