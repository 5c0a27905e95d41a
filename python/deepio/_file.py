"""The modern API: ``deepio.File`` is the engine's file object (opened once; ``_deepio.File``);
``pread``/``pwrite`` return futures."""

from __future__ import annotations

import os
import warnings
from typing import Any, Union

from . import _deepio, _engine
from ._aio import _direct_io_arg, _range_args
from ._errors import describe, with_name
from ._futures import NativeFuture

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


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


class Future(NativeFuture[int]):
    """The outcome of one ``File.pread``/``File.pwrite``, a ``concurrent.futures.Future``.

    ``done()`` never blocks; ``wait(timeout)`` blocks (GIL released) and returns done();
    ``result(timeout)`` returns the number of bytes transferred or raises the operation's
    OSError (TimeoutError if the timeout passes first); ``exception(timeout)`` returns it;
    ``cancel()`` returns False. ``await future`` in asyncio, ``asyncio.wrap_future`` and
    ``concurrent.futures.wait``/``as_completed`` work, with no thread per wait: the engine
    thread that finishes the operation settles them (deepio/_futures.py); a failure is then
    retrieved (not warned about as unobserved). Done callbacks run on that thread (GIL held),
    or at once if done.
    The buffer stays referenced until the operation is done, even if the Future is dropped.
    """

    def __init__(self, op: Any, name: str | bytes | None = None) -> None:
        super().__init__(op)
        self._name = name  # the File's path: errors on its descriptor name it

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self._native.wait(timeout))

    def _native_result(self, timeout: float | None) -> int:
        try:
            return self._native.result(timeout)
        except OSError as e:
            raise with_name(e, self._name) from None

    def _native_exception(self, timeout: float | None) -> BaseException | None:
        e = self._native.exception(timeout)
        return with_name(e, self._name) if isinstance(e, OSError) else e

    @property
    def nbytes(self) -> int:
        """Size of the request in bytes."""
        return self._native.nbytes

    @property
    def offset(self) -> int:
        return self._native.offset

    def __repr__(self) -> str:
        kind = "write" if self._native.write else "read"
        state = "done" if self._native.done() else "pending"
        return f"<deepio.Future {kind} offset={self._native.offset} nbytes={self._native.nbytes} {state}>"


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

    # Per-operation path: pread/pwrite are one call into the binding (_deepio.File.submit),
    # which submits, tracks the operation for close()/fsync() and enforces the close protocol
    # (python/src/file.hpp); here only the handle is resolved and the Future made.
    def __init__(
        self, path: PathArg, mode: str = "r", *, handle: Any = None, direct_io: str | bool | None = "auto"
    ) -> None:
        self._file: Any = None
        key = mode.replace("b", "")
        if key not in _MODES or mode.count("b") > 1:
            raise ValueError(f"invalid mode {mode!r} (expected r, r+, w, w+, x, x+, a or a+)")
        direct = _direct_io_arg(direct_io)  # the names themselves are checked by the engine
        self._h = _engine_handle(handle)
        self.name = os.fspath(path)
        self.mode = mode
        # The engine's file object (_deepio.File): opened once as the engine opens its own files
        # (O_DIRECT where the file system takes it, statx's answer checked, refusals counted in
        # stats()["direct_refused"]; its twin without O_DIRECT reopened from the descriptor), its
        # facts read once. Every pread/pwrite goes to the engine with it: no open, stat or close
        # per operation, and always the file opened here, whatever happens to the path since.
        # It also keeps the File's operations until done (close() waits for them) and those
        # holding a failure nobody retrieved (close()/fsync() raise those), and counts the
        # calls using the descriptor: close() marks the File closing (new calls are refused),
        # waits until none is left, and only then waits for the operations and closes it.
        self._file = self._engine().open_file(path, _MODES[key], direct)
        self.direct = self._file.direct

    def _engine(self) -> Any:
        return self._h if self._h is not None else _engine.default()

    def pread(self, buffer: Any, offset: int = 0) -> Future:
        """Starts reading ``buffer.nbytes`` bytes at ``offset`` into ``buffer``."""
        h = self._h
        try:
            op = self._file.submit(h if h is not None else _engine.default(), False, buffer, offset)
        except OSError as e:  # refused at submission (a read past the end, ...): named as later ones
            raise with_name(e, self.name) from None
        return Future(op, self.name)

    def pwrite(self, buffer: Any, offset: int = 0) -> Future:
        """Starts writing ``buffer`` at ``offset`` (extends the file as needed)."""
        h = self._h
        try:
            op = self._file.submit(h if h is not None else _engine.default(), True, buffer, offset)
        except OSError as e:
            raise with_name(e, self.name) from None
        return Future(op, self.name)

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
        try:
            op = self._file.submit_ranges(self._engine(), write, buffer, *args)
        except OSError as e:
            raise with_name(e, self.name) from None
        return Future(op, self.name)

    def read_into(self, buffer: Any, offset: int = 0) -> int:
        """Reads synchronously; returns the number of bytes read."""
        return self.pread(buffer, offset).result()

    def write_from(self, buffer: Any, offset: int = 0) -> int:
        """Writes synchronously; returns the number of bytes written."""
        return self.pwrite(buffer, offset).result()

    def size(self) -> int:
        fd = self._file.enter()
        try:
            return os.fstat(fd).st_size
        finally:
            self._file.leave()

    def truncate(self, length: int) -> None:
        fd = self._file.enter()
        try:
            os.ftruncate(fd, length)
        finally:
            self._file.leave()

    def fsync(self) -> None:
        """Waits for the file's running operations, raises the first failure nobody
        retrieved (see the class), then flushes the file to storage."""
        self._check()
        self._drain()
        fd = self._file.enter()
        try:
            os.fsync(fd)
        finally:
            self._file.leave()

    def fileno(self) -> int:
        return self._check()

    @property
    def closed(self) -> bool:
        return self._file is None or self._file.closed

    def close(self) -> None:
        """Waits for the file's operations, closes the descriptor, then raises the first
        failure nobody retrieved (see the class). Thread-safe: from the moment it starts, new
        calls on the File raise ValueError; a submission already under way on another thread
        finishes first and its operation is waited for like the others; the descriptor is
        closed only then. A second close() waits for the first."""
        if self._file is None or not self._file.begin_close():
            return
        try:
            self._drain()
        finally:
            # Every operation on it is done (waited for above): its descriptors close now. In
            # a forked child, a parent's operation still running there keeps them until exit.
            self._file.close()

    def _drain(self) -> None:
        """Waits for every operation of the file; raises the first failure nobody retrieved
        (marking them all retrieved: each is raised once)."""
        errors: list[BaseException] = [with_name(e, self.name) for e in self._file.drain()]
        _deepio.flush_unobserved()
        _raise_first(errors, f"of operations on {self.name!r} nobody retrieved")

    def _check(self) -> int:
        fd = -1 if self._file is None else self._file.fd
        if fd < 0:
            raise ValueError("I/O operation on a closed file")
        return int(fd)

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_file", None) is None or self._file.closed:
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
        state = "closed" if self.closed else f"fd={self._file.fd}"
        return f"<deepio.File {self.name!r} mode={self.mode!r} {state} direct={self.direct}>"
