"""deepio's one whole-file reader: files (or their tails) read whole into fresh page-aligned
anonymous memory through the engine, every file's reads in flight together, the memory faulted
in on a helper thread ahead of the reads.

``deepio.load`` reads a zip checkpoint with ``read()``; ``deepio.safetensors`` reads the data
sections of all the files of a load with one ``read_many()``. A reader of another format that
wants whole files in memory should call these rather than grow a second reader.

Protocol. ``read_many(parts)`` takes ``Part(path, start, size)`` each: bytes [start, size) of
the file (``size`` None: to its end as it is when opened). Every file is opened first through
the engine (``deepio.File``: direct I/O where the file system takes it) and given one mapping
of fresh anonymous memory, from the page boundary below ``start`` to the end, so that file
offsets and buffer addresses share their alignment and every aligned piece goes by direct I/O,
unbounced (with ``HUGEPAGES``, off by default, the mapping is 2 MiB larger and asked for
transparent huge pages: the read then starts on a 2 MiB boundary). Then the files are cut into
``CHUNK``-byte positional reads, all of them in flight at once, file after file. With
``POPULATE_THREADS`` helper threads (one by default; one ``_populate.Ahead`` over every buffer:
``MADV_POPULATE_WRITE``, in the same pieces), each piece is submitted once its memory is
faulted in: faulting fresh memory in costs as much as the disk on the development VM, and on
the helper it runs beside the reads. The defaults are the one tuning both loads measured best
(docs/benchmarks.md, "One whole-file reader (issue 25)").
``read(path)`` is ``read_many`` of one whole file.

Errors. Every read is waited for before anything is raised (no read may outlive its buffer, a
Ctrl-C during the wait included: the wait goes on, then ``KeyboardInterrupt`` is raised). A
folder raises ``IsADirectoryError`` and a file that cannot be opened the ``OSError`` subclass,
before any read starts; a failed read raises the engine's ``OSError`` subclass naming its file
(the first in the order of ``parts``), every buffer freed. A file shorter than its ``size`` or
``start``, or one that shrank while it was read (a read came back short or past its end), is not
an error here: its result is None (its buffer freed) and the caller decides what such a file is.
Thread-safe: nothing is shared between calls; the knobs are read once at the start of a call.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Sequence
from typing import NamedTuple, cast

from . import _populate
from ._errors import with_name
from ._file import File, Future

#: Engine request size of a whole-file read, and the piece populated ahead of each request.
CHUNK = 16 << 20
#: Helper threads faulting the buffers in ahead of the reads (0: the reads fault them themselves).
#: On 4 KiB pages one costs no CPU and was 1.05x (safetensors) to 1.3x (deepio.load) as fast on
#: the development VM (docs/benchmarks.md, "One whole-file reader (issue 25)").
POPULATE_THREADS = 1
#: Transparent huge pages for the buffers (2 MiB-aligned, MADV_HUGEPAGE). Off: on the
#: development VM they were cheaper only where huge pages just freed (by an earlier load in the
#: process, or a process before) were reused; in a fresh process after ordinary ones they cost
#: 1.4-2.8x the CPU of 4 KiB pages and were no faster (docs/benchmarks.md, "One whole-file
#: reader (issue 25)").
HUGEPAGES = False

_PAGE = mmap.PAGESIZE


class Part(NamedTuple):
    """What ``read_many`` reads of one file: bytes [start, size) (``size`` None: to the end)."""

    path: str
    start: int = 0
    size: int | None = None


class WholeFile(NamedTuple):
    """A file's bytes in memory: ``buffer[offset : offset + size]``. The buffer is the
    caller's; it stays mapped while any view of it (or ctypes array, or ``torch.frombuffer``
    tensor over it) lives."""

    buffer: mmap.mmap
    offset: int
    size: int

    def view(self) -> memoryview:
        """The file's bytes (a view that keeps the buffer mapped while it lives)."""
        return memoryview(self.buffer)[self.offset : self.offset + self.size]


class _Open(NamedTuple):
    """One part being read: its file, where the read starts in the file (``lo``, a page
    boundary), the buffer and where the read lands in it (``off``), and the bytes read."""

    file: File
    lo: int
    buffer: mmap.mmap
    off: int
    nbytes: int
    whole: WholeFile


def _free(buf: mmap.mmap) -> None:
    try:
        buf.close()
    except BufferError:  # a view still exported: freed with its last reference
        pass


def _settle(fut: Future) -> tuple[int, OSError | None, BaseException | None]:
    """Waits until ``fut`` is done, Ctrl-C or not: (bytes read, its failure, an interruption
    of the wait)."""
    stop: BaseException | None = None
    while True:
        try:
            return fut.result(), None, stop
        except OSError as e:
            return 0, e, stop
        except BaseException as e:  # KeyboardInterrupt: the read still runs into the buffer
            stop = stop or e
            if fut.done():  # its outcome retrieved, so that closing its File raises nothing
                err = fut.exception(0)
                return 0, err if isinstance(err, OSError) else None, stop


def read_many(parts: Sequence[Part]) -> list[WholeFile | None]:
    """Each part read into fresh page-aligned memory as the module's docstring says, every
    file's reads in flight together through the process's default engine: a ``WholeFile``
    (bytes [start, end) of the file at ``offset``) per part, or None for a file shorter than
    the part or one that shrank while it was read. Raises ``IsADirectoryError`` for a folder and
    the engine's ``OSError`` subclasses (the file named) for everything else, after every read
    finished."""
    chunk, huge, threads = CHUNK, HUGEPAGES, POPULATE_THREADS
    for p in parts:
        if os.path.isdir(p.path):  # O_RDONLY opens a folder; reading it would say EISDIR late
            raise IsADirectoryError(errno.EISDIR, "Is a directory", p.path)
    with contextlib.ExitStack() as files:  # closed after every read finished
        opened: list[_Open | None] = []
        for p in parts:
            f = files.enter_context(File(p.path, "r", handle=None))
            have = int(f.size())
            end = have if p.size is None else p.size
            if have < end or p.start > end or p.start < 0:
                opened.append(None)
                continue
            lo = p.start // _PAGE * _PAGE
            buf, off = _populate.anonymous(end - lo, huge)
            opened.append(_Open(f, lo, buf, off, end - lo, WholeFile(buf, off + p.start - lo, end - p.start)))
        reading = [i for i, o in enumerate(opened) if o is not None and o.nbytes > 0]
        into = [cast(_Open, opened[i]) for i in reading]
        views = [memoryview(o.buffer)[o.off : o.off + o.nbytes] for o in into]
        ranges = [(_populate.address(v), len(v)) for v in views]
        futs: list[tuple[int, Future, int]] = []  # (index in reading, the read, its size)
        first: BaseException | None = None
        ahead = None
        if threads > 0 and _populate.available():
            ahead = _populate.Ahead(ranges, chunk, threads)
        shrank: set[int] = set()  # indices in reading
        try:
            pieces = ahead.pieces if ahead is not None else _pieces(ranges, chunk)
            for i, (r, at, n) in enumerate(pieces):
                if ahead is not None:
                    ahead.wait(i)
                if r in shrank:
                    continue
                try:
                    futs.append((r, into[r].file.pread(views[r][at : at + n], into[r].lo + at), n))
                except OSError as e:
                    if e.errno != errno.ENODATA:
                        raise
                    shrank.add(r)  # refused as a read past the end: the file shrank
        except BaseException as e:  # Ctrl-C, or a read refused: no read may outlive the buffers
            first = e
        finally:
            if ahead is not None:
                ahead.close()
        for r, fut, n in futs:
            got, err, stop = _settle(fut)
            first = first or stop
            if err is not None and err.errno != errno.ENODATA:
                first = first or with_name(err, into[r].file.name)
            elif err is not None or got != n:  # short, or past the end (ENODATA): it shrank
                shrank.add(r)
        del views, futs
        for r in shrank:
            opened[reading[r]] = None
            _free(into[r].buffer)
        del into
    if first is not None:
        for o in opened:
            if o is not None:
                _free(o.buffer)
        raise first
    return [None if o is None else o.whole for o in opened]


def _pieces(ranges: list[tuple[int, int]], chunk: int) -> list[tuple[int, int, int]]:
    """(range index, offset in the range, bytes) of each ``chunk``-byte piece, in order (as
    ``_populate.Ahead.pieces``)."""
    return [(r, at, min(chunk, n - at)) for r, (_, n) in enumerate(ranges) for at in range(0, n, chunk)]


def read(path: str, *, at_least: int = 0) -> WholeFile | None:
    """The whole file at ``path`` in fresh page-aligned memory (``read_many`` of one file);
    None for a file shorter than ``at_least`` bytes (or empty) or one that shrank while it was
    read. Errors as for ``read_many``."""
    whole = read_many([Part(path)])[0]
    if whole is not None and whole.size < max(at_least, 1):
        _free(whole.buffer)
        return None
    return whole
