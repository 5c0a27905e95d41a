"""``deepio.Writer``: a binary file opened for writing whose bytes go through the engine.

Protocol. Bytes handed to ``write()`` are copied into a ring of ``buffers``
staging buffers (``buffer_size`` each) lent by the engine from the pool its bounce slots come
from (page-locked where RLIMIT_MEMLOCK allows; given back when the Writer is done with them,
so the next file's Writer reuses the memory instead of mapping and locking its own). A full
buffer is submitted to the engine
as one positional write and filling continues in the next buffer while the earlier ones are on
their way to the disk; before a buffer is filled again its write is waited for (and its error
raised). Buffers cover file ranges that end at multiples of ``buffer_size``, so every full
buffer is an aligned request from aligned memory, written with direct I/O; a partial buffer
(``flush()``, ``seek()`` elsewhere, ``close()``) is written as it is and the engine puts its
unaligned edges through the page cache. ``write()`` never keeps the caller's memory: when it
returns, the bytes are copied (torch hands ``write()`` views of tensor storages that are only
valid during the call). ``flush()`` writes everything staged and waits for it; ``close()``
also flushes the file to stable storage (``fsync``) unless ``durable=False``. A failed write
is raised by the call that waits for it and again by every later call; ``close()`` releases
everything anyway. CUDA memory (and, for deepio.save's filling route, large host storages:
``_filling.FillingWriter``) is written from its own memory between the staged windows.

Not thread-safe: use a Writer from one thread at a time, as with ``open()``.
"""

from __future__ import annotations

import os
from typing import Any

from .._errors import with_name
from .._file import File, Future
from . import _staging
from ._staging import PathArg, _byte_view, _check_sizes, _EngineFile, _is_device, _Staging

#: Staging buffers of a Writer: size and count.
DEFAULT_WRITE_BUFFER = 16 << 20
DEFAULT_WRITE_BUFFERS = 4

#: A Writer window's first byte sits at its file offset modulo this in the staging buffer
#: (Writer._shift()); staging buffer sizes are multiples of it (_check_sizes).
_WINDOW_ALIGN = 4096


class Writer(_EngineFile):
    """A binary file opened for writing whose bytes go through deepio's engine.

    ``Writer(path, *, buffer_size=16 MiB, buffers=4, handle=None, direct_io="auto",
    durable=True)``
    creates or truncates ``path``. ``write(b)`` accepts anything with the buffer protocol
    (and CUDA memory: torch CUDA tensors or kDLCUDA DLPack producers, written through the
    engine's GPU staging pipeline) and always consumes all of it. ``tell()``, ``seek()``
    (within what is staged: free; elsewhere: staged bytes are written first), ``flush()``,
    ``close()`` (``fsync`` when ``durable``), context manager. Errors are ``OSError``
    subclasses with errno and file name; ``ValueError`` after close.
    """

    def __init__(
        self,
        path: PathArg,
        *,
        buffer_size: int = DEFAULT_WRITE_BUFFER,
        buffers: int = DEFAULT_WRITE_BUFFERS,
        handle: Any = None,
        direct_io: str | bool | None = "auto",
        durable: bool = True,
    ) -> None:
        super().__init__()
        self._file: File | None = None
        self._bufs: list[_Staging] = []
        buffer_size = _check_sizes(buffer_size, buffers)
        self.name = os.fspath(path)
        self._file = File(path, "w", handle=handle, direct_io=direct_io)
        try:
            self._bufs = [_Staging(buffer_size, self._file._engine()) for _ in range(buffers)]
        except BaseException:
            self._release()
            raise
        self._size = buffer_size
        self._pending: list[Future | None] = [None] * buffers  # the write of each buffer
        self._other: list[Future] = []  # writes from the caller's device memory
        self._cur = 0  # buffer being filled
        self._base = 0  # file offset of its first byte
        self._pos = 0  # write position inside it
        self._fill = 0  # bytes of it holding data
        self._limit = buffer_size  # its capacity: ends at a multiple of buffer_size
        self._error: BaseException | None = None
        self._durable = durable

    _writes = True

    # --------------------------------------------------------------------- io.RawIOBase
    def tell(self) -> int:
        self._check()
        return self._base + self._pos

    def write(self, b: Any) -> int:
        self._check()
        if _is_device(b):
            return self._write_device(b)
        src = _byte_view(b)
        n = len(src)
        done = 0
        while done < n:
            room = self._limit - self._pos
            k = min(room, n - done)
            at = self._shift() + self._pos
            _staging._copy(self._bufs[self._cur].view[at : at + k], src[done : done + k])
            self._pos += k
            done += k
            if self._pos > self._fill:
                self._fill = self._pos
            if self._pos == self._limit:
                self._submit()
        return n

    def _shift(self) -> int:
        """Where in its staging buffer the window's first byte sits: its file offset's place in
        a page (at most ``_base % _size``: the window fits the buffer), so that the buffer's
        bytes at every block boundary of the file are aligned and the engine writes them by
        direct I/O. A window starting mid-block (after a seek, or a write from device memory)
        would otherwise be bounced through the engine's slots."""
        return self._base % _WINDOW_ALIGN

    def _write_device(self, b: Any) -> int:
        # Ordered after the producer's stream by the engine's handshake (no stall here).
        return self._write_in_place(b, int(getattr(b, "nbytes", 0)))

    def _write_in_place(self, b: Any, nbytes: int) -> int:
        """Writes ``b`` from its own memory through the engine, with no copy into the staging
        buffers (CUDA memory through the GPU path; large host storages from
        FillingWriter._write_host_in_place).
        What was staged before it is written first; staging goes on after it. ``b`` must not
        change until the Writer is flushed."""
        assert self._file is not None
        at = self._flush_to_position()
        self._reap()
        self._other.append(self._file.pwrite(b, at))
        self._restart(at + nbytes)
        return nbytes

    def _reap(self) -> None:
        """Drops the in-place writes that finished, raising the first one's error: a full disk
        stops a save at the next storage, not at close()."""
        running = []
        for f in self._other:
            if f.done():
                self._wait(f)
            else:
                running.append(f)
        self._other = running

    def _flush_to_position(self) -> int:
        """Submits what is staged; returns the write position, from which a new window starts
        (after waiting for every write, when the position lies inside what was staged)."""
        at = self._base + self._pos
        self._submit_partial()
        if at != self._base:
            self._drain()
            self._restart(at)
        return at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        target = self._seek_target(offset, whence, self._base + self._pos, self._end_after_flush)
        if self._base <= target <= self._base + self._fill:
            self._pos = target - self._base  # inside what is staged: nothing to write yet
        else:
            self._flush_to_position()
            self._drain()
            self._restart(target)
        return target

    def flush(self) -> None:
        """Writes everything staged through the engine and waits for it (no fsync)."""
        if self._file is None:
            return
        self._check()
        self._flush_to_position()
        self._drain()

    def truncate(self, size: int | None = None) -> int:
        self.flush()
        assert self._file is not None
        size = self.tell() if size is None else size
        self._file.truncate(size)
        return size

    def close(self) -> None:
        """Flushes, fsyncs (``durable``), closes and frees the staging buffers. Raises the
        first write error (again, if an earlier call raised it already)."""
        if self._file is None:
            super().close()
            return
        err: BaseException | None = None
        try:
            if self._error is None:
                self._submit_partial()
            self._drain()
            if self._durable:
                self._file.fsync()
        except BaseException as e:
            err = e
        finally:
            self._release()
            super().close()
        if err is not None:
            raise err
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        """Closes without writing what is still staged (the file keeps what reached it)."""
        if self._file is not None:
            self._error = self._error or OSError("deepio.Writer discarded")
            try:
                self.close()
            except BaseException:
                pass

    # ------------------------------------------------------------------------ internals
    def _end_after_flush(self) -> int:
        self.flush()
        assert self._file is not None
        return int(self._file.size())

    def _check(self) -> None:
        if self._file is None:
            raise ValueError("I/O operation on a closed deepio.Writer")
        if self._error is not None:
            raise self._error

    def _wait(self, fut: Future | None) -> None:
        if fut is None:
            return
        try:
            fut.result()
        except OSError as e:
            if self._error is None:
                self._error = with_name(e, self.name)
            raise self._error from None
        except BaseException as e:
            if self._error is None:
                self._error = e
            raise

    def _submit(self) -> None:
        """Writes the current buffer's data and moves to the other buffer (waiting for the
        write it was holding)."""
        assert self._file is not None
        if self._fill:
            shift = self._shift()
            buf = self._bufs[self._cur].view[shift : shift + self._fill]
            self._pending[self._cur] = self._file.pwrite(buf, self._base)
        self._restart(self._base + self._fill, switch=True)

    def _submit_partial(self) -> None:
        if self._fill:
            self._submit()

    def _restart(self, offset: int, switch: bool = False) -> None:
        if switch:
            self._cur = (self._cur + 1) % len(self._bufs)
            fut, self._pending[self._cur] = self._pending[self._cur], None
            self._wait(fut)
        self._base = offset
        self._pos = self._fill = 0
        self._limit = self._size - offset % self._size

    def _drain(self) -> None:
        futs = [f for f in self._pending if f is not None] + self._other
        self._pending = [None] * len(self._pending)
        self._other = []
        first: BaseException | None = None
        for f in futs:  # wait for all before raising: no write may outlive its buffer
            try:
                self._wait(f)
            except BaseException as e:
                first = first or e
        if first is not None:
            raise first

    def _release(self) -> None:
        try:
            self._drain()
        except BaseException:
            pass
        f, self._file = self._file, None
        self._bufs = []  # back to the engine's pool once no view of them is left
        if f is not None:
            f.close()

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"pos={self.tell()}"
        return f"<deepio.Writer {self.name!r} {state}>"
