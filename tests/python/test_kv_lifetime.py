"""deepio.kv cannot take the host process down (issue 45 item 3), on real stores in temporary
folders with real threads and real forks:

- close() while other threads are in calls waits for them; later calls raise ValueError;
- in a forked child every call (stats() and close() included) raises ForkedHandleError at
  once, with the parent idle or busy at the fork, and dropping the store there does not hang;
- a done callback that drops the last reference to the store (or closes it), or to an
  LMCache / vLLM adapter whose callbacks capture it, does not abort the process, and the
  store still closes (its folder lock is released, its pages durable).

The cases that abort or hang on a broken build run in a child process under a timeout, so that
such a build fails the test instead of killing pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import deepio
import deepio.kv
from conftest import HAS_TEST_HOOKS, NO_TEST_HOOKS, needs, needs_numpy

np = pytest.importorskip("numpy")

PAGE = 8192
SLOT = 4096 + PAGE
HERE = os.path.dirname(os.path.abspath(__file__))


def make_store(tmp_dir, pages=64, folders=("a", "b"), **kw):
    return deepio.kv.Store(
        [str(tmp_dir / f) for f in folders],
        capacity_bytes=pages * SLOT,
        page_bytes=PAGE,
        checkpoint_interval=0,
        batch_threads=2,
        workers=1,
        queue_depth=32,
        **kw,
    )


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (tests/python on its path); a hang is a failure."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child process hung ({timeout} s): {e.stderr}")


def check_child(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, f"child exited with {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"


# ------------------------------------------------------------------------ close under calls


_CLOSE_UNDER_CALLS = """
    import sys, threading, time, numpy as np, deepio, deepio.kv
    from deepio import _deepio
    folder = sys.argv[1]
    PAGE = 8192
    store = deepio.kv.Store([folder + "/a", folder + "/b"], capacity_bytes=256 * (4096 + PAGE),
                            page_bytes=PAGE, checkpoint_interval=0, batch_threads=2, workers=1)
    pool = np.zeros((64, PAGE), np.uint8)
    store.register(pool)
    # Slow writes: puts stay in flight, so checkpoint() (which waits for them and writes its
    # file) keeps threads inside the store when close() comes.
    _deepio._set_fault("write", delay=0.01, count=1 << 30)
    threads = 8
    calls = [0] * threads  # store calls returned (a future's result() is not one)
    outcome = [None] * threads
    start = threading.Barrier(threads + 1)

    def worker(t):
        start.wait()
        keys = [f"t{t}-{i}" for i in range(4)]
        slots = [t * 8 + i for i in range(4)]
        ops = [
            lambda: store.put(keys, slots),
            lambda: store.checkpoint(),
            lambda: store.get(keys, slots),
            lambda: store.stats(),
            lambda: store.contains(keys),
            lambda: store.checkpoint(),
            lambda: store.exists(keys),
        ]
        try:
            while True:
                ops[calls[t] % len(ops)]()
                calls[t] += 1
        except ValueError as e:
            outcome[t] = "closed" if "closed store" in str(e) else repr(e)
        except BaseException as e:
            outcome[t] = repr(e)

    pool_threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool_threads:
        th.start()
    start.wait()
    while min(calls) < 8:  # every thread well into its loop of calls
        time.sleep(0.001)
    store.close()
    at_close = list(calls)
    for th in pool_threads:
        th.join(60)
    _deepio._clear_fault()
    assert not any(th.is_alive() for th in pool_threads), "a caller never returned"
    # close() waited for every call under way: none returned after it.
    assert calls == at_close, (at_close, calls)
    assert outcome == ["closed"] * threads, outcome
    try:
        store.stats()
        sys.exit("stats() after close() did not raise")
    except ValueError as e:
        assert "closed store" in str(e), e
    # The store closed whole: it reopens.
    again = deepio.kv.Store([folder + "/a", folder + "/b"], capacity_bytes=0, page_bytes=PAGE)
    assert again.stats()["recovered_pages"] > 0
    again.close()
    print("ok", sum(calls))
"""


@needs_numpy
def test_close_while_threads_call_waits_for_them(tmp_dir):
    """Eight threads in a loop of put/get/stats/contains/exists/checkpoint (writes slowed by
    the fault hook) while the main thread closes: close() waits for the calls under way (none
    returns after it), later ones raise ValueError "closed store", nothing crashes or hangs,
    and the store closed cleanly (it reopens)."""
    if not HAS_TEST_HOOKS:
        pytest.skip(NO_TEST_HOOKS)
    out = run_child(_CLOSE_UNDER_CALLS, str(tmp_dir))
    check_child(out)
    assert out.stdout.startswith("ok")


@needs_numpy
def test_close_waits_for_a_call_in_the_store(tmp_dir, fault):
    """A checkpoint() held inside the store (it waits for a put whose write the fault hook
    holds) is counted as a user: close() from another thread waits until it returns, then
    closes; the checkpoint completes normally and later calls raise ValueError."""
    store = make_store(tmp_dir)
    pool = np.zeros((4, PAGE), np.uint8)
    store.register(pool)
    fault("write", delay=0.5, count=1)
    fut = store.put(["held"], [0])
    in_call = threading.Event()
    result: list = []

    def checkpointer():
        in_call.set()
        try:
            store.checkpoint()
            result.append("done")
        except BaseException as e:  # noqa: BLE001 (reported through the assertion below)
            result.append(repr(e))

    t = threading.Thread(target=checkpointer)
    t.start()
    in_call.wait(10)
    deadline = time.monotonic() + 10
    while store._s._users == 0 and not result:  # until the checkpoint is inside the store
        assert time.monotonic() < deadline
        time.sleep(0.001)
    store.close()
    t.join(30)
    assert result in (["done"], [repr(ValueError("deepio.kv: operation on a closed store"))])
    assert fut.result(timeout=10) == [True]
    with pytest.raises(ValueError, match="closed store"):
        store.contains(["held"])
    store.close()  # idempotent


# ------------------------------------------------------------------------------------ fork


def _in_child(box: list) -> int:
    """What a forked child does with box = [store, future]: every call raises
    ForkedHandleError at once; dropping the last reference to the store (box holds it) does
    not hang. Returns the exit code (0: as expected)."""
    signal.alarm(20)  # a hang is killed (SIGALRM) and the parent sees it
    store, fut = box
    assert "of another process" in repr(store)  # repr never raises
    calls = [
        store.stats,
        lambda: store.put(["c"], [0]),
        lambda: store.get(["c"], [0]),
        lambda: store.contains(["c"]),
        lambda: store.exists(["c"]),
        lambda: store.remove(["c"]),
        store.checkpoint,
        store.clear,
        store.retry_failed,
        lambda: store.page_bytes,
        fut.done,
        fut.result,
        lambda: fut.add_done_callback(lambda f: None),
        store.close,  # last: close() too raises, and leaves nothing to wait for
    ]
    for i, call in enumerate(calls):
        try:
            call()
            return 10 + i
        except deepio.ForkedHandleError:
            pass
        except BaseException:  # noqa: BLE001 (any other outcome is a failure code)
            return 40 + i
    calls.clear()
    box.clear()
    store = fut = None
    import gc

    gc.collect()  # the store's last reference went: leaked here, the parent's untouched
    return 0


def _fork_and_check(box: list) -> None:
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = _in_child(box)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.005)
    assert os.waitstatus_to_exitcode(status) == 0, "child: " + str(os.waitstatus_to_exitcode(status))


@needs_numpy
def test_fork_child_raises_with_the_parent_idle(tmp_dir):
    box = [make_store(tmp_dir)]
    pool = np.zeros((2, PAGE), np.uint8)
    box[0].register(pool)
    fut = box[0].put(["a"], [0])
    assert fut.result() == [True]
    box.append(fut)
    del fut
    _fork_and_check(box)
    store = box[0]
    with store:
        assert store.put(["a"], [1]).result() == [True]
        assert store.stats()["puts"] == 2


@needs_numpy
def test_fork_child_raises_with_the_parent_busy(tmp_dir, fault):
    """Forks while another thread is in a stream of puts (their writes held by the fault hook,
    so batches are in flight and the store's locks in use at the fork) and of stats()."""
    box = [make_store(tmp_dir)]
    pool = np.zeros((8, PAGE), np.uint8)
    box[0].register(pool)
    fault("write", delay=0.02, count=1 << 30)
    stop = threading.Event()
    busy = [0]

    def hammer(store):
        while not stop.is_set():
            f = store.put([f"h{busy[0] % 8}"], [busy[0] % 8])
            store.stats()
            f.result()
            busy[0] += 1

    t = threading.Thread(target=hammer, args=(box[0],))
    t.start()
    try:
        box.append(box[0].put(["pending"], [0]))  # in flight (its write held) at the first fork
        for _ in range(6):
            _fork_and_check(box)
    finally:
        stop.set()
        t.join(30)
    store = box[0]
    with store:
        assert busy[0] > 0 and store.stats()["puts_failed"] == 0


# ---------------------------------------------------------------------- done callbacks


_DROP_IN_CALLBACK = """
    import errno, gc, sys, threading, time, numpy as np, deepio, deepio.kv
    from deepio import _deepio
    folder, how = sys.argv[1], sys.argv[2]
    PAGE = 8192
    folders = [folder + "/a", folder + "/b"]

    def open_store():
        return deepio.kv.Store(folders, capacity_bytes=64 * (4096 + PAGE), page_bytes=PAGE, batch_threads=2)

    store = open_store()
    pool = np.zeros((2, PAGE), np.uint8)
    pool[0] = 7
    store.register(pool)
    # The put is still in flight below ("busy": every write is slow, so that a checkpoint()
    # that the callback starts in another thread is still writing when the callback closes).
    _deepio._set_fault("write", delay=0.5, count=1 if how != "busy" else 1 << 30)
    fut = store.put(["k"], [0])
    holder = [store]
    ran = []
    done = threading.Event()
    checkpointed = []

    def checkpointer(s):
        try:
            s.checkpoint()
            checkpointed.append("done")
        except BaseException as e:
            checkpointed.append(repr(e))

    def cb(f):
        ran.append((threading.get_ident(), f.result()))
        s = holder[0]
        if how == "busy":  # until the checkpoint is inside the store, a call under way
            threads.append(threading.Thread(target=checkpointer, args=(s,)))
            threads[0].start()
            deadline = time.monotonic() + 20
            while s._s._users == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            ran.append(("users at close", s._s._users))
        if how in ("close", "busy"):
            s.close()  # returns at once: the close runs on a thread of its own
            ran.append(("users after close", s._s._users))
            try:
                s.stats()
                ran.append("stats after close did not raise")
            except ValueError:
                pass
        holder.clear()  # the last reference to the store
        done.set()

    threads = []
    del store, pool
    fut.add_done_callback(cb)
    assert done.wait(30), "the callback never ran"
    assert ran[0][0] != threading.get_ident(), "the callback ran at once: nothing was tested"
    assert ran[0][1] == [True], ran
    if how == "busy":
        assert ran[1] == ("users at close", 1) and ran[2] == ("users after close", 1), ran
        threads[0].join(30)
        assert checkpointed == ["done"], checkpointed
    elif how == "close":
        assert ran[1] == ("users after close", 0), ran
    _deepio._clear_fault()
    gc.collect()
    # The store closes after its callback returned (and, "busy", after the checkpoint): its
    # folders' locks are released then, and its pages are durable.
    deadline = time.monotonic() + 30
    while True:
        try:
            again = open_store()
            break
        except OSError as e:  # EBUSY until the close is done
            if e.errno != errno.EBUSY:
                raise
            assert time.monotonic() < deadline, "the dropped store never closed"
            time.sleep(0.01)
    assert again.contains(["k"]) == [True]
    again.close()
    print("ok")
"""


@pytest.mark.parametrize("how", ["drop", "close", "busy"])
@needs_numpy
def test_done_callback_drops_or_closes_the_store(tmp_dir, how):
    """The callback of a put drops the last reference to the Store ("drop"), or closes it first
    ("close"; "busy": while another thread's checkpoint() is under way), on the store's own
    batch thread: no abort (a self-join), no wait in the callback, and the store closes once
    the calls under way are done."""
    if not HAS_TEST_HOOKS:
        pytest.skip(NO_TEST_HOOKS)
    out = run_child(_DROP_IN_CALLBACK, str(tmp_dir), how)
    check_child(out)
    assert out.stdout.strip() == "ok"


_DROP_ADAPTER = """
    import gc, sys, threading, time, numpy as np, deepio, deepio.kv
    from deepio import _deepio
    folder, which = sys.argv[1], sys.argv[2]
    PAGE = 64 << 10
    _deepio._set_fault("write", delay=0.5, count=1)  # the job is still in flight below
    watch = {}
    if which == "lmcache":
        from deepio.kv.lmcache import DeepioL2Connector

        adapter = DeepioL2Connector(folders=[folder], capacity_bytes=8 << 20, page_bytes=PAGE)
        data = bytearray(PAGE)
        data[:4] = b"abcd"
        adapter.submit_batch_set(["k"], [memoryview(data)])
        key = "k"
    else:
        import kv_engines

        kv_engines.activate()
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.tiering.base import TransferJob
        from deepio.kv.vllm import DeepioTier

        rows = np.zeros((4, PAGE), np.uint8)
        rows[0] = 5
        adapter = DeepioTier(None, memoryview(rows), "DeepioTier", folders=[folder], capacity_bytes=8 << 20)
        offload_key = make_offload_key(b"\\x01" * 16, 0)
        adapter.submit_store(TransferJob(job_id=1, keys=[offload_key], chunk_ids=np.arange(1),
                                         is_promotion=False, req_context=ReqContext(req_id="r")))
        key = bytes(offload_key)
    gone = threading.Event()
    import errno, weakref

    fingerprint = adapter._store.fingerprint  # to reopen its store
    weakref.finalize(adapter, gone.set)
    del adapter  # mid-job: the store's callback holds the last reference
    assert gone.wait(30), "the adapter was never dropped"
    _deepio._clear_fault()
    gc.collect()
    deadline = time.monotonic() + 30
    while True:
        try:
            again = deepio.kv.Store([folder], page_bytes=PAGE, fingerprint=fingerprint)
            break
        except OSError as e:  # EBUSY until the dropped store's close is done
            if e.errno != errno.EBUSY:
                raise
            assert time.monotonic() < deadline, "the dropped store never closed"
            time.sleep(0.01)
    assert again.contains([key]) == [True]
    again.close()
    print("ok")
"""


@needs_numpy
def test_lmcache_adapter_dropped_mid_job(tmp_dir):
    if not HAS_TEST_HOOKS:
        pytest.skip(NO_TEST_HOOKS)
    check_child(run_child(_DROP_ADAPTER, str(tmp_dir / "s"), "lmcache"))


@needs("vllm")
@needs_numpy
def test_vllm_tier_dropped_mid_job(tmp_dir):
    if not HAS_TEST_HOOKS:
        pytest.skip(NO_TEST_HOOKS)
    check_child(run_child(_DROP_ADAPTER, str(tmp_dir / "s"), "vllm", timeout=300))
