"""Lifetimes: buffers stay alive until their operation is collected, handles finish their
work before going away, and Ctrl-C during a wait never leaves I/O running into freed memory.
Slow operations are made deterministic with the fault hook's delay."""

from __future__ import annotations

import _thread
import errno
import gc
import signal
import threading
import weakref

import pytest

import deepio
from conftest import FRAMEWORKS, fill, make_buffer, needs_numpy, threads_in_fault_delay, wait_until
from deepio import _deepio

try:
    import numpy as np
except ImportError:
    np = None

pytestmark = needs_numpy


class _InterruptOnceHeld:
    """Ctrl-C for the main thread once it is about to block (go()) and an engine worker sits in
    the fault's delay: the operation is certainly still running when the interrupt arrives.
    go() is the last thing before the blocking call, which then is where the interrupt lands.
    Python's own SIGINT handler is put in place until join(): a process started with SIGINT
    ignored (a background job of a non-interactive shell, as CI may run the suite) inherits
    SIG_IGN, and interrupt_main() then does nothing."""

    def __init__(self) -> None:
        self._previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if not self._go.wait(60):
            return
        wait_until(lambda: threads_in_fault_delay() >= 1, "a worker held by the fault")
        _thread.interrupt_main()

    def go(self) -> None:
        self._go.set()

    def join(self) -> None:
        self._thread.join(60)
        signal.signal(signal.SIGINT, self._previous)
        assert not self._thread.is_alive()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_read_buffer_dropped_before_wait(framework, random_file):
    path, data = random_file(1 << 16)
    h = deepio.aio_handle(4096, 2, False, False, 2)
    buf = make_buffer(framework, 1 << 16)
    ref = weakref.ref(buf)
    assert h.async_pread(buf, str(path)) == 0
    del buf
    gc.collect()
    assert ref() is not None  # the handle holds it until wait() collects the read
    assert h.wait() == 1
    assert ref() is None  # ... and releases it afterwards


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_write_buffer_dropped_before_wait(framework, tmp_dir, fault):
    data = bytes(range(256)) * 256
    h = deepio.aio_handle(4096, 2, False, False, 2)
    fault("write", delay=0.05, count=4)
    buf = make_buffer(framework, len(data))
    fill(buf, data)
    ref = weakref.ref(buf)
    out = tmp_dir / "w.bin"
    h.async_pwrite(buf, str(out))
    del buf
    junk = [np.full(len(data), 0xAA, np.uint8) for _ in range(8)]  # reuse freed memory, if any
    assert ref() is not None
    assert h.wait() == 1
    assert ref() is None
    assert out.read_bytes() == data
    del junk


def test_handle_dropped_with_pending_ops_finishes_them(tmp_dir, fault):
    fault("write", delay=0.05, count=8)
    h = deepio.aio_handle(4096, 2, False, False, 2)
    datas = [np.random.default_rng(i).integers(0, 256, 20000, dtype=np.uint8) for i in range(4)]
    for i, d in enumerate(datas):
        h.async_pwrite(d, str(tmp_dir / f"f{i}.bin"))
    refs = [weakref.ref(x) for x in datas]
    del datas, d
    del h  # blocks until the writes finished, then releases the buffers
    # The rule counts a hit only after its delay: all 8 delayed writes were over when del returned.
    assert _deepio._fault_hits() == 8
    assert all(r() is None for r in refs)
    for i in range(4):
        assert (tmp_dir / f"f{i}.bin").read_bytes() == np.random.default_rng(i).integers(
            0, 256, 20000, dtype=np.uint8
        ).tobytes()


def test_handle_dropped_with_failed_ops_warns(random_file, fault):
    path, _ = random_file(4096)
    h = deepio.aio_handle(backend="threads")
    fault("read", errno=errno.EIO, count=1)
    h.async_pread(np.empty(4096, np.uint8), str(path))
    with pytest.warns(RuntimeWarning, match="never collected by wait"):
        del h
        gc.collect()


def test_context_manager_waits_and_raises(random_file, fault):
    path, data = random_file(4096)
    buf = np.empty(4096, np.uint8)
    with deepio.aio_handle() as h:
        h.async_pread(buf, str(path))
    assert buf.tobytes() == data
    assert h.closed
    fault("read", errno=errno.EIO, count=1)
    with pytest.raises(OSError):
        with deepio.aio_handle(backend="threads") as h2:
            h2.async_pread(buf, str(path))


def test_ctrl_c_during_wait_keeps_buffers_alive(random_file, fault):
    path, data = random_file(4 * 4096)
    h = deepio.aio_handle(4096, 4, False, False, 1, backend="threads")
    fault("read", delay=2.0, count=1, path_contains=str(path.resolve()))
    buf = np.empty(4 * 4096, np.uint8)
    ref = weakref.ref(buf)
    h.async_pread(buf, str(path))
    del buf
    timer = _InterruptOnceHeld()
    with pytest.raises(KeyboardInterrupt):
        timer.go()
        h.wait()
    timer.join()
    # Honoured promptly, not after the I/O: the held read's delay (counted when over) is not.
    assert _deepio._fault_hits() == 0
    assert h.pending() == 1  # still running, still referenced
    assert ref() is not None
    assert h.wait() == 1  # the next wait collects it
    assert ref() is None


def test_ctrl_c_during_sync_call_hands_op_to_wait(random_file, fault):
    path, data = random_file(4096)
    h = deepio.aio_handle(4096, 4, False, False, 1, backend="threads")
    fault("read", delay=2.0, count=1, path_contains=str(path.resolve()))
    buf = np.empty(4096, np.uint8)
    timer = _InterruptOnceHeld()
    with pytest.raises(KeyboardInterrupt):
        timer.go()
        h.sync_pread(buf, str(path))
    timer.join()
    assert _deepio._fault_hits() == 0  # interrupted while the read was still held
    assert h.pending() == 1
    assert h.wait() == 1
    assert buf.tobytes() == data


def test_locked_tensor_freed_while_in_flight(random_file, fault):
    """free_cpu_locked_tensor + del while a read targets it: the free unlocks and uncounts the
    allocation at once, the operation keeps its memory mapped, and it goes after wait()."""
    path, data = random_file(1 << 16)
    h = deepio.aio_handle(4096, 2, False, False, 1, backend="threads")
    before = deepio.locked_memory_stats()
    fault("read", delay=0.05, count=2)
    t = h.new_cpu_locked_tensor(1 << 16, np.empty(1, np.uint8))
    h.async_pread(t, str(path))
    assert h.free_cpu_locked_tensor(t)
    del t
    during = deepio.locked_memory_stats()
    assert during["allocations"] == before["allocations"]  # freed: no longer counted or locked
    assert during["released_but_referenced"] == before["released_but_referenced"] + 1  # the op holds it
    assert h.wait() == 1
    assert deepio.locked_memory_stats() == before


def test_many_handles_created_and_dropped(random_file):
    path, data = random_file(10000)
    for i in range(50):
        h = deepio.aio_handle(4096, 4, i % 2 == 0, i % 3 == 0, 1 + i % 3)
        b = bytearray(10000)
        h.async_pread(b, str(path))
        if i % 2:
            assert h.wait() == 1
            assert bytes(b) == data
        del h


def test_no_descriptor_leak_over_many_ops(random_file, tmp_dir):
    """Every file deepio opens by name is closed by the time the op is collected."""
    import os

    path, data = random_file(8192)
    h = deepio.aio_handle(4096, 4, False, True, 2)
    before = len(os.listdir("/proc/self/fd"))
    b = np.empty(8192, np.uint8)
    for i in range(200):
        h.async_pread(b, str(path))
        h.async_pwrite(b, str(tmp_dir / f"x{i % 5}.bin"))
        if i % 10 == 9:
            h.wait()
    h.wait()
    with pytest.raises(FileNotFoundError):
        h.sync_pread(b, str(tmp_dir / "missing"))
    assert len(os.listdir("/proc/self/fd")) == before


def test_future_dropped_while_running_keeps_buffer_until_done(random_file, fault):
    """An Op (deepio.File's future) dropped before its read finished: the engine keeps the
    buffer until the read is done, and the next collection on the handle releases it."""
    path, data = random_file(8192)
    h = _deepio.Handle(4096, 2, False, False, 1, "threads", "auto")
    fault("read", delay=0.2, count=2)
    buf = np.empty(8192, np.uint8)
    ref = weakref.ref(buf)
    with open(path, "rb") as f:
        h.submit_future(False, buf, f.fileno(), 0)  # the Op is dropped at once
        del buf
        gc.collect()
        assert ref() is not None  # still being read into
        # Both reads are past their delays (a hit counts when its delay is over): the operation
        # is done, or finishing, and nothing collected it yet.
        wait_until(lambda: _deepio._fault_hits() == 2, "both reads past their delays")
        assert ref() is not None
        assert h.submit_future(False, bytearray(1), f.fileno(), 0).result() == 1
        assert h.wait() == 0  # File-style operations are never counted by wait() ...
    assert ref() is None  # ... but it collected the abandoned one


def test_ctrl_c_during_drain_free_read_hands_op_to_wait(random_file, fault):
    """read() (a synchronous call that does not drain the handle) interrupted: its operation
    keeps running with its buffer referenced and the next wait() collects it."""
    path, data = random_file(4096)
    h = deepio.aio_handle(4096, 4, False, False, 1, backend="threads")
    fault("read", delay=2.0, count=1, path_contains=str(path.resolve()))
    buf = np.empty(4096, np.uint8)
    ref = weakref.ref(buf)
    timer = _InterruptOnceHeld()
    with pytest.raises(KeyboardInterrupt):
        timer.go()
        h.read(buf, str(path))
    timer.join()
    assert _deepio._fault_hits() == 0  # interrupted while the read was still held
    del buf
    gc.collect()
    assert ref() is not None
    assert h.pending() == 1
    assert h.wait() == 1
    assert ref() is None
