"""deepio's futures as Python's (issue 49 item 3): ``deepio.kv.Future`` (Store.put/get) and
``deepio.Future`` (File.pread/pwrite) are ``concurrent.futures.Future`` instances that asyncio
awaits with no thread per wait (python/deepio/_futures.py).

A thousand gets from one event loop, every byte checked, the process's thread count sampled
while they are in flight; concurrent.futures.wait/as_completed and asyncio.wrap_future on both
kinds; cancel() refused; failures through exception(), await and FIRST_EXCEPTION; a done
callback that drops the last reference to its aio_handle on the handle's own worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import errno
import gc
import os
import threading
import time

import pytest

import deepio
import deepio.kv
from conftest import needs_numpy

np = pytest.importorskip("numpy")

PAGE = 4096
SLOT = 4096 + PAGE
N = 1000


def make_store(tmp_dir, pages):
    return deepio.kv.Store(
        [str(tmp_dir / "a"), str(tmp_dir / "b")],
        capacity_bytes=pages * SLOT,
        page_bytes=PAGE,
        checkpoint_interval=0,
        batch_threads=2,
        workers=1,
        queue_depth=32,
    )


def pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, PAGE), dtype=np.uint8)


@needs_numpy
def test_a_thousand_gets_from_one_event_loop(tmp_dir):
    with make_store(tmp_dir, 2 * N) as store:
        pool = np.zeros((2 * N, PAGE), np.uint8)
        pool[:N] = pages(N, 1)
        store.register(pool)
        keys = [f"k{i}" for i in range(N)]
        assert store.put(keys, range(N)).result(60) == [True] * N
        base = threading.active_count()  # the store's threads are running by now
        counts = []

        async def main():
            loop = asyncio.get_running_loop()
            busy = True

            async def sample():
                while busy:
                    counts.append(threading.active_count())
                    await asyncio.sleep(0)

            sampler = asyncio.ensure_future(sample())
            futs = [store.get([k], [N + i]) for i, k in enumerate(keys)]
            pending_at_start = sum(not f.done() for f in futs)
            # Half awaited directly (__await__), half through asyncio.wrap_future.
            waits = [f if i % 2 else asyncio.wrap_future(f) for i, f in enumerate(futs)]
            results = await asyncio.gather(*waits)
            busy = False
            await sampler
            # Nothing went through the loop's default executor (a thread per wait).
            assert getattr(loop, "_default_executor", None) is None
            return results, pending_at_start

        results, pending_at_start = asyncio.run(main())
        assert results == [[True]] * N
        assert np.array_equal(pool[N:], pool[:N]), "a page came back with other bytes"
        assert counts and max(counts) <= base + 1, (base, max(counts))
        assert pending_at_start > 0, "every get was done at once: nothing was awaited"


@needs_numpy
def test_kv_future_is_a_concurrent_future(tmp_dir):
    with make_store(tmp_dir, 64) as store:
        pool = np.zeros((16, PAGE), np.uint8)
        pool[:8] = pages(8, 2)
        store.register(pool)
        fut = store.put([f"p{i}" for i in range(8)], range(8))
        assert isinstance(fut, cf.Future) and isinstance(fut, deepio.kv.Future)
        assert fut.cancel() is False and fut.cancelled() is False
        done, not_done = cf.wait([fut], timeout=30)
        assert done == {fut} and not not_done
        assert fut.done() and not fut.running() and fut.exception() is None
        assert fut.result(timeout=0) == [True] * 8
        gets = [store.get([f"p{i}"], [8 + i]) for i in range(8)]
        assert sorted(f.result() == [True] for f in cf.as_completed(gets, timeout=30)) == [True] * 8
        assert np.array_equal(pool[8:], pool[:8])
        # A missing key is a False, not an exception.
        miss = store.get(["absent"], [0])
        assert cf.wait([miss], timeout=30, return_when=cf.FIRST_EXCEPTION).done == {miss}
        assert miss.exception() is None and miss.result() == [False]
        seen = []
        miss.add_done_callback(seen.append)  # done: called at once, with the future
        assert seen == [miss]
        with pytest.raises(RuntimeError):
            miss.set_result([True])


@needs_numpy
def test_kv_future_timeout_and_callbacks_from_the_batch_thread(tmp_dir, fault):
    with make_store(tmp_dir, 64) as store:
        pool = np.zeros((4, PAGE), np.uint8)
        store.register(pool)
        fault("write", delay=0.5, count=1)
        fut = store.put(["slow"], [0])
        with pytest.raises(cf.TimeoutError):
            fut.result(timeout=0.01)
        with pytest.raises(TimeoutError):
            fut.exception(timeout=0.01)
        assert fut.running() and not fut.done() and fut.cancel() is False
        where = []
        ev = threading.Event()
        fut.add_done_callback(lambda f: (where.append((threading.get_ident(), f.result())), ev.set()))
        assert ev.wait(30)
        assert where[0][0] != threading.get_ident() and where[0][1] == [True]

        async def cancelled_await():
            fault("write", delay=0.3, count=1)
            f = store.put(["slow2"], [1])
            task = asyncio.ensure_future(asyncio.wrap_future(f))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return f

        f = asyncio.run(cancelled_await())
        assert f.result(30) == [True]  # the put went on: I/O in flight is never cancelled


def test_file_futures_in_asyncio_and_concurrent_futures(tmp_dir):
    data = np.random.default_rng(3).integers(0, 256, 64 * 4096, dtype=np.uint8)
    path = tmp_dir / "f"
    with deepio.File(path, "w+") as f:
        assert f.pwrite(data).result() == data.nbytes
        w = f.pwrite(data[:4096], offset=data.nbytes)
        assert isinstance(w, cf.Future) and w.cancel() is False
        assert cf.wait([w], timeout=30).done == {w} and w.exception() is None

        async def reads():
            out = np.zeros((200, 4096), np.uint8)
            futs = [f.pread(out[i], offset=(i % 64) * 4096) for i in range(200)]
            n = await asyncio.gather(*(x if i % 2 else asyncio.wrap_future(x) for i, x in enumerate(futs)))
            assert getattr(asyncio.get_running_loop(), "_default_executor", None) is None
            return out, n

        base = threading.active_count()
        out, n = asyncio.run(reads())
        assert threading.active_count() <= base + 1
        assert n == [4096] * 200
        for i in range(200):
            assert np.array_equal(out[i], data[(i % 64) * 4096 : (i % 64 + 1) * 4096]), i


def test_file_future_failures(tmp_dir, fault):
    """A failure: exception(), await and FIRST_EXCEPTION all see it, named for the file."""
    path = tmp_dir / "e"
    path.write_bytes(b"z" * 8192)
    with deepio.File(path, "r") as f:
        fault("read", errno=errno.EIO, count=1)
        bad = f.pread(np.zeros(8192, np.uint8))
        done = cf.wait([bad], timeout=30, return_when=cf.FIRST_EXCEPTION).done
        assert done == {bad}
        exc = bad.exception()
        assert isinstance(exc, OSError) and exc.errno == errno.EIO and exc.filename == str(path)
        with pytest.raises(OSError):
            bad.result()

        async def await_bad():
            fault("read", errno=errno.EIO, count=1)
            with pytest.raises(OSError) as info:
                await f.pread(np.zeros(8192, np.uint8))
            return info.value

        e = asyncio.run(await_bad())
        assert e.errno == errno.EIO and e.filename == str(path)


def test_callback_dropping_the_last_reference_to_its_handle(tmp_dir, fault):
    """The callback runs on the handle's worker; dropping the handle (and the File on it) there
    must not make that worker join itself: the handle's shutdown runs on a thread of its own."""
    path = tmp_dir / "g"
    path.write_bytes(b"x" * 8192)
    tasks = len(os.listdir("/proc/self/task"))
    h = deepio.aio_handle()
    f = deepio.File(path, "r", handle=h)
    box = [h, f]
    assert len(os.listdir("/proc/self/task")) > tasks  # the handle's workers
    del h, f
    buf = np.zeros(8192, np.uint8)
    fault("read", delay=0.3, count=1)
    fut = box[1].pread(buf)
    ran = []
    ev = threading.Event()

    def cb(done):
        ran.append(threading.get_ident())
        box.clear()  # the last references to the File and to the handle
        ev.set()

    fut.add_done_callback(cb)
    assert ev.wait(30)
    assert ran[0] != threading.get_ident(), "the callback ran at once: nothing was tested"
    assert fut.result() == 8192 and bytes(buf) == b"x" * 8192
    gc.collect()
    # The handle was shut down: its workers, and the thread that shut it down, are gone.
    deadline = time.monotonic() + 10
    while len(os.listdir("/proc/self/task")) > tasks:
        assert time.monotonic() < deadline, "the dropped handle was never shut down"
        time.sleep(0.01)
