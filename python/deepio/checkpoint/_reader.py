"""``deepio.Reader``: a binary file opened for reading through the engine, with read-ahead.

Protocol. The file is read in aligned chunks of ``buffer_size`` into a ring of ``buffers``
buffers lent by the engine from its staging pool (page-locked where RLIMIT_MEMLOCK allows;
direct I/O into aligned memory; given back for the next file when the Reader closes), and
copied from there into the caller's memory. A large read starts every chunk it covers, up to the ring's size ahead,
plus the chunk after it; a small read that continues the previous one starts the next chunk.
Reading straight into the caller's memory would be slower: a tensor's memory is rarely
page-aligned, and the engine then bounces every block (measured in docs/checkpoints.md).
A destination of ``_PREFAULT_MIN`` bytes or more is faulted in on a helper thread ahead of
the copies into it (``_prefault``).

Errors: a failed chunk read is raised by the ``readinto()`` that needs it (the chunk is then
read again by the next call that needs it); a read-ahead nobody used is waited for, its
outcome ignored, before its buffer is reused or freed. Not thread-safe: use a Reader from one
thread at a time, as with ``open()``.
"""

from __future__ import annotations

import os
from typing import Any

from .. import _populate
from .._file import File, Future
from . import _staging
from ._staging import PathArg, _check_sizes, _EngineFile, _Staging

#: Read-ahead chunks of a Reader: size and count.
DEFAULT_READ_BUFFER = 8 << 20
DEFAULT_READ_BUFFERS = 4

_PREFAULT_MIN = 8 << 20  # readinto() destinations from this size get _prefault()

_HUGEPAGE_HINT = False  # MADV_HUGEPAGE on large destinations (where THP is in madvise mode)
_POPULATE_PIECE = 8 << 20  # destinations are faulted in ahead of the copies in pieces of this
_POPULATE_AHEAD = True  # False: one MADV_POPULATE_WRITE of the whole destination before copying


def _prefault(dest: memoryview) -> _populate.Ahead | None:
    """Starts faulting in a large destination on a helper thread (``_populate.Ahead``:
    MADV_POPULATE_WRITE piece by piece, ahead of the copies into it), after asking for huge
    pages. torch.load reads every storage into freshly allocated memory, and faulting that in
    a 4 KiB page at a time inside the copies cost more than the disk on this VM
    (docs/checkpoints.md); on the helper the faults run beside the copies and the disk. Hints
    only: None (nothing to wait for) where the kernel has no MADV_POPULATE_WRITE."""
    if not _populate.available():
        return None
    addr, n = _populate.address(dest), len(dest)
    if _HUGEPAGE_HINT:
        lo, hi = _populate.whole_pages(addr, n, _populate.HUGE)
        if hi > lo:
            _populate.advise(lo, hi - lo, _populate.MADV_HUGEPAGE)
    if not _POPULATE_AHEAD:
        _populate.populate(addr, n)
        return None
    return _populate.Ahead([(addr, n)], _POPULATE_PIECE, 1)


class Reader(_EngineFile):
    """A binary file opened for reading through deepio's engine, with read-ahead.

    ``Reader(path, *, buffer_size=8 MiB, buffers=4, handle=None, direct_io="auto")``:
    ``read(n=-1)``, ``readinto(b)`` (fills ``b`` unless the end of the file comes first),
    ``readall()``, ``seek()``, ``tell()``, ``readable()``/``seekable()``, context manager.
    Missing files, permissions and folders raise at construction, as ``open()`` does.
    """

    def __init__(
        self,
        path: PathArg,
        *,
        buffer_size: int = DEFAULT_READ_BUFFER,
        buffers: int = DEFAULT_READ_BUFFERS,
        handle: Any = None,
        direct_io: str | bool | None = "auto",
    ) -> None:
        super().__init__()
        self._file: File | None = None
        self._bufs: list[_Staging] = []
        buffer_size = _check_sizes(buffer_size, buffers)
        self.name = os.fspath(path)
        if os.path.isdir(self.name):  # O_RDONLY opens a folder; reading it would say EISDIR late
            raise IsADirectoryError(21, "Is a directory", self.name)
        self._file = File(path, "r", handle=handle, direct_io=direct_io)
        try:
            self._end = self._file.size()
            self._bufs = [_Staging(buffer_size, self._file._engine()) for _ in range(buffers)]
        except BaseException:
            self._close_all()
            raise
        self._size = buffer_size
        self._chunk: list[int] = [-1] * buffers  # chunk index each buffer holds (or is reading)
        self._fut: list[Future | None] = [None] * buffers
        self._pos = 0
        self._last_chunk = -2  # chunk the previous read ended in

    def tell(self) -> int:
        self._check()
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        target = self._seek_target(offset, whence, self._pos, lambda: self._end)
        self._pos = target
        return target

    def readinto(self, b: Any) -> int:
        self._check()
        dest = b if isinstance(b, memoryview) else memoryview(b)
        if dest.readonly or not dest.c_contiguous:
            raise ValueError("readinto() needs a writable C-contiguous buffer")
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        n = max(0, min(len(dest), self._end - self._pos))
        if n == 0:
            return 0
        first, last = self._pos // self._size, (self._pos + n - 1) // self._size
        # Read ahead: through the end of a large read (and the chunk after it, where the next
        # record's header usually is), or one chunk after a small read that continues the last.
        sequential = first in (self._last_chunk, self._last_chunk + 1)
        ahead = last + 1 if (last > first or sequential) else last
        pop: _populate.Ahead | None = None
        if n >= _PREFAULT_MIN:
            self._start_range(first, min(ahead, first + len(self._bufs) - 1))  # disk first
            pop = _prefault(dest[:n])
        try:
            done = 0
            while done < n:
                pos = self._pos + done
                k = pos // self._size
                self._start_range(k, min(ahead, k + len(self._bufs) - 1))
                i = self._chunk.index(k)
                view = self._ready(i)
                start = pos - k * self._size
                m = min(n - done, len(view) - start)
                if pop is not None:  # the pages copied into next are populated first
                    pop.wait_through(done + m)
                _staging._copy(dest[done : done + m], view[start : start + m])
                done += m
        finally:
            if pop is not None:
                pop.close()
        self._last_chunk = last
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._check()
        if size is None or size < 0:
            return self.readall()
        out = bytearray(max(0, min(size, self._end - self._pos)))
        n = self.readinto(out)
        del out[n:]
        return bytes(out)

    def readall(self) -> bytes:
        self._check()
        return self.read(max(0, self._end - self._pos))

    def close(self) -> None:
        if self._file is not None:
            self._close_all()
        super().close()

    def _close_all(self) -> None:
        for i, f in enumerate(self._fut):
            if f is not None:
                f.wait()  # a read-ahead nobody asked for: its outcome does not matter
                self._fut[i] = None
        f_, self._file = self._file, None
        self._bufs = []  # back to the engine's pool once no view of them is left
        if f_ is not None:
            f_.close()

    def _check(self) -> None:
        if self._file is None:
            raise ValueError("I/O operation on a closed deepio.Reader")

    def _ready(self, i: int) -> memoryview:
        fut, self._fut[i] = self._fut[i], None
        if fut is not None:
            try:
                fut.result()
            except BaseException:
                self._chunk[i] = -1
                raise
        k = self._chunk[i]
        return self._bufs[i].view[: min(self._size, self._end - k * self._size)]

    def _start_range(self, k: int, upto: int) -> None:
        """Starts reading every chunk of [k, upto] (within the file) not already held, into
        buffers holding chunks outside that range."""
        upto = min(upto, (self._end - 1) // self._size)
        for j in range(k, upto + 1):
            if j in self._chunk:
                continue
            free = [i for i, c in enumerate(self._chunk) if not k <= c <= upto]
            # Prefer empty buffers, then the chunk furthest behind.
            i = min(free, key=lambda i: (self._chunk[i] >= 0, self._chunk[i] if self._chunk[i] < k else -1))
            self._start(i, j)

    def _start(self, i: int, k: int) -> None:
        fut, self._fut[i] = self._fut[i], None
        if fut is not None:
            fut.wait()  # a read-ahead never used: the buffer must be free before reuse
        self._chunk[i] = -1
        off = k * self._size
        length = min(self._size, self._end - off)
        assert self._file is not None
        self._fut[i] = self._file.pread(self._bufs[i].view[:length], off)
        self._chunk[i] = k

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"pos={self._pos}"
        return f"<deepio.Reader {self.name!r} {state}>"
