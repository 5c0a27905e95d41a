"""Fork is a normal event (issue 24): a real torch DataLoader with two workers, forked and
spawned, reads through deepio.File, deepio.load, deepio.safetensors and a handle of its own
after the parent used each of them; a parent's handle used in a forked child refuses at once.
A parent's Future waited in a forked child raises at once, and a fork while another thread
holds a module lock leaves a child that works (real forks of this process, under a timeout).

Each case runs fork_program.py in a fresh interpreter under a timeout, so a hang fails the
test instead of stalling the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

import deepio
from conftest import needs_numpy, needs_torch, threads_in_fault_delay, wait_until

PROGRAM = Path(__file__).with_name("fork_program.py")


def _run(*args: str, timeout: float = 240) -> str:
    r = subprocess.run(
        [sys.executable, str(PROGRAM), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert "FAIL" not in r.stdout, r.stdout
    return r.stdout


# fork in the default run and the wheel's set; spawn (a fresh interpreter per worker) is slow.
@needs_torch
@pytest.mark.parametrize(
    "method", [pytest.param("fork", marks=pytest.mark.wheel), pytest.param("spawn", marks=pytest.mark.slow)]
)
def test_dataloader_workers_read_through_deepio(tmp_dir, method):
    out = _run("dataloader", method, str(tmp_dir))
    assert out.count("ok ") == 8 * 4 + 2, out  # every item four ways, workers, parent after


@needs_numpy
@pytest.mark.wheel
def test_parent_handle_in_forked_child_refuses_at_once(tmp_dir):
    out = _run("parent-handle", str(tmp_dir), timeout=60)
    for name in ("aio_handle.sync_pread", "aio_handle.async_pread", "aio_handle.wait", "File on the parent's handle"):
        assert f"ok {name}" in out, out
    assert "ok File on the default engine" in out and "ok child's own handle" in out, out
    assert "ok inherited locked memory" in out, out


# ---- in-process forks (issue 36): a real os.fork() of this process, the child bounded by a timeout


def _in_child(fn, timeout: float = 10.0) -> int:
    """Runs ``fn()`` in a real forked child of this process; returns its exit code (fn's
    return value; 101 when it raised), or -1 when it was still running after ``timeout``
    seconds (a hang: the child is killed)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 101
        try:
            code = fn()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.005)


def test_parents_future_waited_in_a_forked_child_raises_at_once(tmp_dir, fault):
    f = deepio.File(tmp_dir / "held.bin", "w")
    fault("write", delay=1.5)  # the parent's write stays in flight while the child runs
    running = f.pwrite(b"\x07" * 4096)
    wait_until(lambda: threads_in_fault_delay() >= 1, "the write to be held on its worker")
    finished = deepio.File(tmp_dir / "done.bin", "w")
    finished_future = finished.pwrite(b"\x08" * 100)

    # "At once" needs no clock: the parent's operations never finish in the child (their
    # workers are in the parent), so a call that waited for one at all would wait for ever or
    # its 30 s, past the child's 10 s bound (-1).
    def child() -> int:
        calls = [
            lambda: running.result(),
            lambda: running.result(timeout=30),
            lambda: running.exception(),
            lambda: running.wait(),
            lambda: running.done(),
            lambda: finished_future.result(),  # finished or not: the parent's
        ]
        for n, call in enumerate(calls):
            try:
                call()
                return 10 + n
            except deepio.ForkedHandleError:
                pass
        return 0

    assert _in_child(child) == 0, "-1: the child hung on the parent's Future"
    assert running.result() == 4096  # the parent's operation is untouched
    assert finished_future.result() == 100
    f.close()
    finished.close()


def test_fork_while_a_thread_holds_a_module_lock_leaves_a_working_child(tmp_dir):
    from deepio import _populate

    data = os.urandom(1 << 16)
    path = tmp_dir / "r.bin"
    path.write_bytes(data)
    holding = threading.Event()

    def hold() -> None:
        with _populate._lock:
            holding.set()
            time.sleep(0.2)  # the fork comes meanwhile

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()

    def child() -> int:
        if not _populate._lock.acquire(timeout=5):
            return 10
        _populate._lock.release()
        buf = bytearray(len(data))
        with deepio.File(path) as f:  # the child's own default engine
            if f.read_into(buf) != len(data) or bytes(buf) != data:
                return 20
        return 0

    try:
        assert _in_child(child) == 0
    finally:
        holder.join()
