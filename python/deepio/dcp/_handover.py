"""Threads of a ``deepio.dcp.FileSystemReader`` load reading several folders at once
(``_reader._read_folders``): ``_OnCaller`` runs the submissions of reads into CUDA memory on the
thread that called ``read_data``; ``_OneAtATime`` hands the planner one call at a time.
Thread-safe (that is their purpose)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class _OnCaller:
    """Runs the submissions of reads into CUDA memory on the thread that called ``read_data``,
    so that the event each one records (on ``torch.cuda.current_stream()``, the binding's
    ordering after the destination's producer: docs/gpu.md) is recorded on the caller's current
    stream, from the caller's thread; torch's current stream is per thread. On that thread
    ``run(fn)`` calls ``fn`` at once; on another (a folder's reading thread) it hands ``fn`` to
    ``serve``, which the calling thread runs while the others read, and waits for its result.
    Once ``serve`` stopped (Ctrl-C), ``run`` raises instead of waiting."""

    def __init__(self) -> None:
        self._caller = threading.get_ident()
        self._jobs: queue.Queue[tuple[Callable[[], Any], list[Any], threading.Event] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[[], Any]) -> Any:
        if threading.get_ident() == self._caller:
            return fn()
        slot: list[Any] = [None, None]  # (result, exception)
        done = threading.Event()
        with self._lock:
            if self._closed:
                raise RuntimeError("deepio.dcp: the load stopped before this read could be submitted")
            self._jobs.put((fn, slot, done))
        done.wait()
        if slot[1] is not None:
            raise slot[1]
        return slot[0]

    def ended(self) -> None:
        """A reading thread is done (called once by each, however it ended)."""
        self._jobs.put(None)

    def serve(self, threads: int) -> None:
        """On the calling thread: runs what ``run`` hands over until ``threads`` threads ended."""
        try:
            while threads:
                job = self._jobs.get()
                if job is None:
                    threads -= 1
                    continue
                fn, slot, done = job
                try:
                    slot[0] = fn()
                except BaseException as e:  # the reading thread raises it
                    slot[1] = e
                done.set()
        finally:
            self.close()

    def close(self) -> None:
        """Stops taking hand-overs: what is queued, and any later ``run`` from another
        thread, raises RuntimeError (also where ``serve`` never ran: a reading thread that
        started while a later one failed to)."""
        with self._lock:
            self._closed = True
        while True:  # refuse what is still queued: nobody will run it
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[1][1] = RuntimeError("deepio.dcp: the load stopped before this read could be submitted")
                job[2].set()


class _OneAtATime:
    """A load planner as the folders' reading threads share it: each call it gets
    (``resolve_tensor``, ``commit_tensor``, ``load_bytes``) runs under one lock, so a planner
    sees one call at a time, as under torch's own reader."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner
        self._lock = threading.Lock()

    def resolve_tensor(self, req: Any) -> Any:
        with self._lock:
            return self._planner.resolve_tensor(req)

    def commit_tensor(self, req: Any, tensor: Any) -> None:
        with self._lock:
            self._planner.commit_tensor(req, tensor)

    def load_bytes(self, req: Any, value: Any) -> None:
        with self._lock:
            self._planner.load_bytes(req, value)
