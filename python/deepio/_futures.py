"""``concurrent.futures.Future`` over a native completion: the base of ``deepio.Future``
(``File.pread``/``pwrite``) and ``deepio.kv.Future`` (``Store.put``/``get``).

The futures ARE ``concurrent.futures.Future`` instances, so ``concurrent.futures.wait`` /
``as_completed``, ``asyncio.wrap_future`` and ``await future`` work on them, with no thread
per wait: completion comes from the native future's done callback, which runs on the
engine's (or the store's) own thread that finished the work.

Protocol. The operation is in flight from the start (state RUNNING): ``cancel()`` returns
False (I/O under way is never cancelled: the buffers stay referenced until it is done),
``running()`` is ``not done()``. ``done()``, ``result()`` and ``exception()`` ask the native
future directly (``result`` waits with the GIL released, Ctrl-C honoured). The
``concurrent.futures`` state (its condition, waiters and callbacks) is made on first use
(``add_done_callback``, ``asyncio.wrap_future``, ``await``, ``concurrent.futures.wait``):
only then is a native done callback registered, which settles that state from the
completing thread (taking the GIL there). A future only ever waited on by ``result()``
costs its completing thread nothing. Done callbacks run on that thread (or at once, on the
caller's, when already done); keep them short, as asyncio's ``call_soon_threadsafe`` is.

Thread-safe: any method from any thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Generator
from concurrent.futures._base import RUNNING
from typing import Any, Callable, NoReturn, TypeVar

T = TypeVar("T")


class NativeFuture(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` settled by a native future (see the module docstring).
    Subclasses define ``_native_result(timeout)`` and ``_native_exception(timeout)``."""

    # The base class keeps its state in the instance __dict__; these are set lazily (in
    # _condition) except the class-level defaults below, which hold until then.
    _state = RUNNING
    _result = None
    _exception = None

    def __init__(self, native: Any) -> None:  # the base __init__ is not called: see _condition
        self._native = native

    # -- subclass hooks ------------------------------------------------------------------------
    def _native_result(self, timeout: float | None) -> T:
        raise NotImplementedError

    def _native_exception(self, timeout: float | None) -> BaseException | None:
        raise NotImplementedError

    # -- the concurrent.futures state, made on first use -----------------------------------------
    @property
    def _condition(self) -> threading.Condition:
        d = self.__dict__
        cond: threading.Condition | None = d.get("_cond")
        if cond is not None:
            return cond
        # Made by whichever thread gets here first (dict.setdefault is atomic under the GIL,
        # and takes no lock a fork could leave held); the lists exist before the condition.
        d.setdefault("_waiters", [])
        d.setdefault("_done_callbacks", [])
        mine = threading.Condition()
        cond = d.setdefault("_cond", mine)
        if cond is mine:
            # Every use of the state goes through this condition first, so a waiter or
            # callback added after this registration is either there when _settle runs
            # (notified, called) or finds the state finished.
            self._native.add_done_callback(self._settle)
        return cond

    @_condition.setter
    def _condition(self, cond: threading.Condition) -> None:
        self.__dict__["_cond"] = cond

    def _settle(self, _native: Any) -> None:
        """The native done callback: finishes the concurrent.futures state (notifying
        concurrent.futures.wait, running done callbacks such as asyncio's)."""
        exc = self._native_exception(0)
        if exc is not None:
            concurrent.futures.Future.set_exception(self, exc)
        else:
            concurrent.futures.Future.set_result(self, self._native_result(0))

    # -- the Future interface ------------------------------------------------------------------
    def done(self) -> bool:
        """True once the work finished (successfully or not). Never blocks."""
        return bool(self._native.done())

    def running(self) -> bool:
        """True while the work is in flight (it starts at once): ``not done()``."""
        return not self.done()

    def cancel(self) -> bool:
        """Always False: I/O in flight is not cancelled (the buffers stay referenced until it
        is done)."""
        return False

    def cancelled(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> T:
        """Waits (GIL released, Ctrl-C honoured) and returns the result or raises the failure;
        TimeoutError (``concurrent.futures.TimeoutError``) when ``timeout`` passes first."""
        try:
            return self._native_result(timeout)
        except TimeoutError as e:
            if concurrent.futures.TimeoutError is TimeoutError:
                raise
            raise concurrent.futures.TimeoutError(str(e)) from None  # Python < 3.11

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Waits like result() and returns the failure, or None."""
        try:
            return self._native_exception(timeout)
        except TimeoutError as e:
            if concurrent.futures.TimeoutError is TimeoutError:
                raise
            raise concurrent.futures.TimeoutError(str(e)) from None

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Calls fn(future) once done: at once on this thread if done, else on the thread that
        completes the work (an engine worker or a store batch thread, GIL held). Exceptions
        from fn are logged (the concurrent.futures logger), not raised."""
        super().add_done_callback(fn)

    def set_result(self, result: object) -> NoReturn:
        raise RuntimeError("a deepio future is settled by the engine, not by its user")

    def set_exception(self, exception: BaseException | None) -> NoReturn:
        raise RuntimeError("a deepio future is settled by the engine, not by its user")

    def set_running_or_notify_cancel(self) -> NoReturn:
        raise RuntimeError("a deepio future is settled by the engine, not by its user")

    def __await__(self) -> Generator[Any, None, T]:
        """``await future`` in asyncio: no thread waits; the loop is woken by the completing
        thread (``asyncio.wrap_future``). A cancelled await leaves the work running."""
        if not self._native.done():
            import asyncio

            yield from asyncio.wrap_future(self).__await__()
        return self.result()
