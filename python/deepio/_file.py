"""The modern API: ``deepio.File`` keeps a file open; ``pread``/``pwrite`` return futures."""

from __future__ import annotations

import errno as _errno
import os
import threading
from collections.abc import Generator
from typing import Any, Union

from . import _deepio
from ._aio import _range_args

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_default_handle: Any | None = None
_default_lock = threading.Lock()


def _engine_handle(handle: Any) -> Any:
    global _default_handle
    if handle is None:
        with _default_lock:
            if _default_handle is None:
                _default_handle = _deepio.Handle()
            return _default_handle
    inner = getattr(handle, "_h", handle)  # an aio_handle, or a raw _deepio.Handle
    if not isinstance(inner, _deepio.Handle):
        raise TypeError(f"handle must be a deepio.aio_handle, not {type(handle).__qualname__}")
    return inner


class Future:
    """The outcome of one ``File.pread``/``File.pwrite``.

    ``done()`` never blocks; ``wait(timeout)`` blocks (GIL released) and returns done();
    ``result(timeout)`` returns the number of bytes transferred or raises the operation's
    OSError (TimeoutError if the timeout passes first); ``exception(timeout)`` returns it.
    ``await future`` works inside asyncio (the wait runs in the loop's default executor).
    The buffer stays referenced until the operation is done, even if the Future is dropped.
    """

    __slots__ = ("_op", "__weakref__")

    def __init__(self, op: Any) -> None:
        self._op = op

    def done(self) -> bool:
        return self._op.done()

    def wait(self, timeout: float | None = None) -> bool:
        return self._op.wait(timeout)

    def result(self, timeout: float | None = None) -> int:
        return self._op.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._op.exception(timeout)

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
        return self._op.result(None)

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
    """An open file for positional asynchronous I/O.

    ``File(path, mode="r", *, handle=None, direct_io="auto")``. ``mode`` as for ``open()``
    ("r", "r+", "w", "w+", "x", "x+", "a", "a+"; a "b" is ignored; "a" creates without
    truncating, it does not force appends). ``handle``: the deepio.aio_handle whose workers
    run the I/O (default: a shared process-wide handle). ``direct_io``: "auto" opens with
    O_DIRECT where the file system accepts it, "off" never, "on" requires it.

    ``pread(buffer, offset=0)`` / ``pwrite(buffer, offset=0)`` return a Future;
    ``pread_ranges``/``pwrite_ranges`` one Future for many ranges of the file.
    ``close()`` waits for the file's operations still running (their outcomes stay in their
    futures), then closes the descriptor. Usable as a context manager.
    """

    def __init__(
        self, path: PathArg, mode: str = "r", *, handle: Any = None, direct_io: str | bool | None = "auto"
    ) -> None:
        self._fd = -1
        key = mode.replace("b", "")
        if key not in _MODES or mode.count("b") > 1:
            raise ValueError(f"invalid mode {mode!r} (expected r, r+, w, w+, x, x+, a or a+)")
        direct = {True: "on", False: "off", None: "auto"}.get(direct_io, direct_io)  # type: ignore[arg-type]
        if direct not in ("auto", "on", "off"):
            raise ValueError(f"direct_io must be 'auto', 'on' or 'off', not {direct_io!r}")
        self._h = _engine_handle(handle)
        self._ops: list[Any] = []
        self._lock = threading.Lock()
        self.name = os.fspath(path)
        self.mode = mode
        flags = _MODES[key] | os.O_CLOEXEC
        self.direct = False
        if direct != "off" and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(path, flags | os.O_DIRECT, 0o666)
                self.direct = True
            except OSError as e:
                if e.errno != _errno.EINVAL or direct == "on":
                    raise
        if self._fd < 0:
            self._fd = os.open(path, flags, 0o666)

    def _submit(self, write: bool, buffer: Any, offset: int) -> Future:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed file")
        return self._track(self._h.submit_future(write, buffer, self._fd, offset))

    def _track(self, op: Any) -> Future:
        # Kept until done, so close() can wait for it; finished ones are dropped on the way.
        with self._lock:
            self._ops = [o for o in self._ops if not o.done()]
            self._ops.append(op)
        return Future(op)

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
        if self._fd < 0:
            raise ValueError("I/O operation on a closed file")
        args = _range_args(file_offsets, sizes, buffer_offsets)
        return self._track(self._h.submit_ranges(write, buffer, self._fd, *args, False, True))

    def read_into(self, buffer: Any, offset: int = 0) -> int:
        """Reads synchronously; returns the number of bytes read."""
        return self.pread(buffer, offset).result()

    def write_from(self, buffer: Any, offset: int = 0) -> int:
        """Writes synchronously; returns the number of bytes written."""
        return self.pwrite(buffer, offset).result()

    def size(self) -> int:
        return os.fstat(self._check()).st_size

    def truncate(self, length: int) -> None:
        os.ftruncate(self._check(), length)

    def fsync(self) -> None:
        """Waits for the file's running operations, then flushes it to storage."""
        self._drain()
        os.fsync(self._check())

    def fileno(self) -> int:
        return self._check()

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd < 0:
            return
        self._drain()
        fd, self._fd = self._fd, -1
        os.close(fd)

    def _drain(self) -> None:
        with self._lock:
            ops = list(self._ops)
        for op in ops:
            op.wait(None)  # outcomes stay with their futures
        with self._lock:
            self._ops = [o for o in self._ops if not o.done()]

    def _check(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed file")
        return self._fd

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"fd={self._fd}"
        return f"<deepio.File {self.name!r} mode={self.mode!r} {state} direct={self.direct}>"
