"""The modern API: ``deepio.File`` is the engine's file object (opened once; ``_deepio.File``);
``pread``/``pwrite`` return futures."""

from __future__ import annotations

import os
import threading
import warnings
from collections import deque
from collections.abc import Generator
from typing import Any, Union

from . import _deepio, _engine
from ._aio import _direct_io_arg, _range_args
from ._errors import describe, with_name

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
_PRUNE_MIN = 64  # a File's tracked operations below this never get a full pass
_pid = os.getpid()  # this process; kept by a fork hook so that a call costs no getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _engine_handle(handle: Any) -> Any:
    """The engine handle under ``handle`` (an aio_handle, or a raw _deepio.Handle); None for
    the process's default engine (deepio._engine), looked up at each use so that a File opened
    before a fork works in the child on the child's own engine."""
    if handle is None:
        return None
    inner = getattr(handle, "_h", handle)
    if not isinstance(inner, _deepio.Handle):
        raise TypeError(f"handle must be a deepio.aio_handle, not {type(handle).__qualname__}")
    return inner


def _raise_first(errors: list[BaseException], what: str) -> None:
    """Raises errors[0] with the others attached as ``other_errors`` (as wait() does).

    Empties ``errors`` and keeps no local reference to the exception: the traceback refers to
    the caller's frames, and a frame referring back to the exception would be a cycle that
    keeps the File (``self`` in those frames), and so its descriptor, until the garbage
    collector runs."""
    if not errors:
        return
    first = errors[0]
    first.other_errors = errors[1:]  # type: ignore[attr-defined]
    if len(errors) > 1:
        first.add_note(f"{len(errors) - 1} more of the failures {what} (see .other_errors)")
    errors.clear()
    try:
        raise first
    finally:
        del first


class Future:
    """The outcome of one ``File.pread``/``File.pwrite``.

    ``done()`` never blocks; ``wait(timeout)`` blocks (GIL released) and returns done();
    ``result(timeout)`` returns the number of bytes transferred or raises the operation's
    OSError (TimeoutError if the timeout passes first); ``exception(timeout)`` returns it.
    ``await future`` works inside asyncio (the wait runs in the loop's default executor).
    The buffer stays referenced until the operation is done, even if the Future is dropped.
    """

    __slots__ = ("_op", "_name", "__weakref__")

    def __init__(self, op: Any, name: str | bytes | None = None) -> None:
        self._op = op
        self._name = name  # the File's path: errors on its descriptor name it

    def done(self) -> bool:
        return self._op.done()

    def wait(self, timeout: float | None = None) -> bool:
        return self._op.wait(timeout)

    def result(self, timeout: float | None = None) -> int:
        try:
            return self._op.result(timeout)
        except OSError as e:
            raise with_name(e, self._name) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        e = self._op.exception(timeout)
        return with_name(e, self._name) if isinstance(e, OSError) else e

    @property
    def nbytes(self) -> int:
        """Size of the request in bytes."""
        return self._op.nbytes

    @property
    def offset(self) -> int:
        return self._op.offset

    def __await__(self) -> Generator[Any, None, int]:
        return self._await().__await__()

    async def _await(self) -> int:
        if not self._op.done():
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, self._op.wait, None)
        return self.result(None)

    def __repr__(self) -> str:
        kind = "write" if self._op.write else "read"
        state = "done" if self._op.done() else "pending"
        return f"<deepio.Future {kind} offset={self._op.offset} nbytes={self._op.nbytes} {state}>"


_MODES = {
    "r": os.O_RDONLY,
    "r+": os.O_RDWR,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "x+": os.O_RDWR | os.O_CREAT | os.O_EXCL,
    "a": os.O_WRONLY | os.O_CREAT,  # positional writes: "a" only means create, never truncate
    "a+": os.O_RDWR | os.O_CREAT,
}


class File:
    """An open file for positional asynchronous I/O: opened once, its operations with no open,
    stat or close of their own, always on the file opened (even if the path is renamed over or
    unlinked after).

    ``File(path, mode="r", *, handle=None, direct_io="auto")``. ``mode`` as for ``open()``
    ("r", "r+", "w", "w+", "x", "x+", "a", "a+"; a "b" is ignored; "a" creates without
    truncating, it does not force appends). ``handle``: the deepio.aio_handle whose workers
    run the I/O (default: a shared process-wide handle). ``direct_io``: "auto" opens with
    O_DIRECT where the file system accepts it, "off" never, "on" requires it.

    ``pread(buffer, offset=0)`` / ``pwrite(buffer, offset=0)`` return a Future;
    ``pread_ranges``/``pwrite_ranges`` one Future for many ranges of the file.
    ``close()``, ``fsync()`` and leaving a ``with`` block wait for the file's operations
    still running, then raise the first failure that nobody retrieved through its Future
    (``result()``/``exception()``), the others attached as ``other_errors``; ``close()``
    closes the descriptor either way. A File garbage-collected unclosed whose close() fails
    emits ``deepio.UnobservedFailureWarning``. Usable as a context manager.
    """

    def __init__(
        self, path: PathArg, mode: str = "r", *, handle: Any = None, direct_io: str | bool | None = "auto"
    ) -> None:
        self._fd = -1
        self._file: Any = None
        key = mode.replace("b", "")
        if key not in _MODES or mode.count("b") > 1:
            raise ValueError(f"invalid mode {mode!r} (expected r, r+, w, w+, x, x+, a or a+)")
        direct = _direct_io_arg(direct_io)  # the names themselves are checked by the engine
        self._h = _engine_handle(handle)
        # Under self._lock: the operations not yet seen done, in submission order, and the done
        # ones holding a failure nobody retrieved (close()/fsync() raise those).
        self._ops: deque[Any] = deque()
        self._failed: list[Any] = []
        self._prune_at = _PRUNE_MIN  # len(_ops) that triggers a full pass (amortised O(1))
        self._ops_pid = _pid  # the process whose engine runs the operations in _ops
        self._lock = threading.Lock()
        # Calls using self._fd right now (a submission, fsync, size, truncate): close() marks
        # the File closing (new calls are refused), waits until none is left, and only then
        # waits for the operations and closes the descriptor.
        self._users = 0
        self._closing = False
        self._idle = threading.Condition(self._lock)  # notified when _users drops to 0 or _fd closes
        self.name = os.fspath(path)
        self.mode = mode
        # The engine's file object (_deepio.File): opened once as the engine opens its own files
        # (O_DIRECT where the file system takes it, statx's answer checked, refusals counted in
        # stats()["direct_refused"]; its twin without O_DIRECT reopened from the descriptor), its
        # facts read once. Every pread/pwrite goes to the engine with it: no open, stat or close
        # per operation, and always the file opened here, whatever happens to the path since.
        self._file = self._engine().open_file(path, _MODES[key], direct)
        self._fd, self.direct = self._file.fd, self._file.direct

    def _engine(self) -> Any:
        return self._h if self._h is not None else _engine.default()

    def _use_fd(self) -> int:
        """The descriptor, counted as in use until _end_use(): close() never closes it under a
        call. ValueError once the File is closed or closing."""
        with self._lock:
            self._adopt()
            if self._fd < 0 or self._closing:
                raise ValueError("I/O operation on a closed file")
            self._users += 1
            return self._fd

    def _use_file(self) -> Any:
        """_use_fd() for a submission: the engine's file object, in use until _end_use()."""
        self._use_fd()
        return self._file

    def _end_use(self, op: Any = None) -> None:
        """Ends a _use_fd(); records `op`, the operation it submitted, first (so a close() that
        waited for this call then waits for the operation)."""
        with self._lock:
            try:
                if op is not None:
                    self._track(op)
            finally:  # whatever happens, a close() waiting for this call is not left waiting
                self._users -= 1
                if self._users == 0 and self._closing:  # (it set _closing, under the lock, first)
                    self._idle.notify_all()

    def _submit(self, write: bool, buffer: Any, offset: int) -> Future:
        # _use_file(), the submission and _end_use(op) written out: this is the per-read path,
        # and each Python call in it costs as much as the engine's own work for a page-cache read.
        with self._lock:
            if self._ops_pid != _pid:
                self._adopt()
            if self._fd < 0 or self._closing:
                raise ValueError("I/O operation on a closed file")
            self._users += 1
            file = self._file
        op = None
        try:
            op = (self._h if self._h is not None else _engine.default()).submit_future(write, buffer, file, offset)
        except OSError as e:  # refused at submission (a read past the end, ...): named as later ones
            raise with_name(e, self.name) from None
        finally:
            with self._lock:
                try:
                    if op is not None:
                        self._track(op)
                finally:  # whatever happens, a close() waiting for this call is not left waiting
                    self._users -= 1
                    if self._users == 0 and self._closing:
                        self._idle.notify_all()
        return Future(op, self.name)

    def _track(self, op: Any) -> None:
        """Under self._lock. Kept until done, so close() can wait for it, and after that while
        it holds a failure nobody retrieved, so close()/fsync() can raise it. Operations finish
        about in submission order: the done ones at the front go at each call, and a full pass
        runs only when the deque doubled since the last one, so each operation costs O(1)."""
        ops = self._ops
        while ops and ops[0].done():
            self._settle(ops.popleft())
        ops.append(op)
        if len(ops) > self._prune_at or len(self._failed) > self._prune_at:
            self._prune()

    def _settle(self, op: Any) -> None:
        """Under self._lock: a done operation leaves _ops; kept in _failed if its failure is unretrieved."""
        if op.unobserved_failure():
            self._failed.append(op)

    def _prune(self) -> None:
        """Under self._lock: drops every done operation nobody needs any more."""
        kept: deque[Any] = deque()
        for o in self._ops:
            if o.done():
                self._settle(o)
            else:
                kept.append(o)
        self._ops = kept
        self._failed = [o for o in self._failed if o.unobserved_failure()]
        self._prune_at = max(_PRUNE_MIN, 2 * max(len(kept), len(self._failed)))

    def pread(self, buffer: Any, offset: int = 0) -> Future:
        """Starts reading ``buffer.nbytes`` bytes at ``offset`` into ``buffer``."""
        return self._submit(False, buffer, offset)

    def pwrite(self, buffer: Any, offset: int = 0) -> Future:
        """Starts writing ``buffer`` at ``offset`` (extends the file as needed)."""
        return self._submit(True, buffer, offset)

    def pread_ranges(self, buffer: Any, file_offsets: Any, sizes: Any, buffer_offsets: Any = None) -> Future:
        """Starts ONE read of many ranges of the file into ``buffer``: ``sizes[i]`` bytes at
        ``file_offsets[i]`` into ``buffer_offsets[i]`` (default: packed one after another).
        Arguments, checks and failures as for ``aio_handle.async_pread_ranges``; the Future's
        result is the sum of the sizes."""
        return self._submit_ranges(False, buffer, file_offsets, sizes, buffer_offsets)

    def pwrite_ranges(self, buffer: Any, file_offsets: Any, sizes: Any, buffer_offsets: Any = None) -> Future:
        """Starts ONE write of many ranges of ``buffer`` to the file (``aio_handle.async_pwrite_ranges``)."""
        return self._submit_ranges(True, buffer, file_offsets, sizes, buffer_offsets)

    def _submit_ranges(self, write: bool, buffer: Any, file_offsets: Any, sizes: Any, buffer_offsets: Any) -> Future:
        args = _range_args(file_offsets, sizes, buffer_offsets)
        file = self._use_file()
        op = None
        try:
            op = self._engine().submit_ranges(write, buffer, file, *args, False, True)
        except OSError as e:
            raise with_name(e, self.name) from None
        finally:
            self._end_use(op)
        return Future(op, self.name)

    def read_into(self, buffer: Any, offset: int = 0) -> int:
        """Reads synchronously; returns the number of bytes read."""
        return self.pread(buffer, offset).result()

    def write_from(self, buffer: Any, offset: int = 0) -> int:
        """Writes synchronously; returns the number of bytes written."""
        return self.pwrite(buffer, offset).result()

    def size(self) -> int:
        fd = self._use_fd()
        try:
            return os.fstat(fd).st_size
        finally:
            self._end_use()

    def truncate(self, length: int) -> None:
        fd = self._use_fd()
        try:
            os.ftruncate(fd, length)
        finally:
            self._end_use()

    def fsync(self) -> None:
        """Waits for the file's running operations, raises the first failure nobody
        retrieved (see the class), then flushes the file to storage."""
        self._check()
        self._drain()
        fd = self._use_fd()
        try:
            os.fsync(fd)
        finally:
            self._end_use()

    def fileno(self) -> int:
        return self._check()

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Waits for the file's operations, closes the descriptor, then raises the first
        failure nobody retrieved (see the class). Thread-safe: from the moment it starts, new
        calls on the File raise ValueError; a submission already under way on another thread
        finishes first and its operation is waited for like the others; the descriptor is
        closed only then. A second close() waits for the first."""
        with self._lock:
            self._adopt()
            if self._closing:
                while self._fd >= 0:
                    self._idle.wait()
                return
            if self._fd < 0:
                return
            self._closing = True
            while self._users:
                self._idle.wait()
        try:
            self._drain()
        finally:
            with self._lock:
                self._fd = -1
                self._idle.notify_all()
            # Every operation on it is done (waited for above): its descriptors close now. In
            # a forked child, a parent's operation still running there keeps them until exit.
            self._file.close()

    def _drain(self) -> None:
        """Waits for every operation of the file; raises the first failure nobody retrieved
        (marking them all retrieved: each is raised once)."""
        with self._lock:
            self._adopt()
            ops = [*self._ops, *self._failed]
        for op in ops:
            op.wait(None)
        errors: list[BaseException] = [
            with_name(e, self.name) for e in (op.take_unobserved() for op in ops) if e is not None
        ]
        del ops
        with self._lock:
            self._prune()
        _deepio.flush_unobserved()
        _raise_first(errors, f"of operations on {self.name!r} nobody retrieved")

    def _adopt(self) -> None:
        """In a child forked from the process that ran this File's operations: forget them
        and the parent's calls under way (under self._lock). They belong to the parent, whose
        workers finish and report them; here they would never finish, and waiting for them
        would hang."""
        if self._ops_pid != _pid:
            self._ops, self._failed, self._ops_pid = deque(), [], _pid
            self._users, self._closing, self._prune_at = 0, False, _PRUNE_MIN

    def _check(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed file")
        return self._fd

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) < 0:
            return
        try:
            self.close()
        except Exception as e:  # nobody can catch it here: never silently
            warnings.warn(
                f"deepio.File {self.name!r} was garbage-collected unclosed and closing it failed: {describe(e)}",
                _deepio.UnobservedFailureWarning,
                stacklevel=2,
            )

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"fd={self._fd}"
        return f"<deepio.File {self.name!r} mode={self.mode!r} {state} direct={self.direct}>"
