"""deepio's one whole-file reader: a file read whole into fresh page-aligned anonymous memory
through the engine, the memory faulted in on a helper thread ahead of the reads.

``deepio.load`` reads a zip checkpoint this way and makes every storage a view of the buffer;
a reader of another format that wants the whole file in memory (safetensors) should call
``read()`` here rather than grow a second one.

Protocol. ``read(path)`` opens the file through the engine (``deepio.File``, direct I/O where
the file system takes it), maps ``size`` bytes of anonymous memory (2 MiB more, asked for
transparent huge pages, with ``HUGEPAGES``: the file then starts on a 2 MiB boundary) and
submits one ``CHUNK``-byte positional read per piece, all in flight at once; file offsets and
addresses share their alignment, so every aligned piece goes by direct I/O. With
``POPULATE_THREADS`` helper threads (``_populate.Ahead``: ``MADV_POPULATE_WRITE``), each piece
is submitted once its memory is faulted in: on the development VM faulting fresh memory in cost
more than the disk (docs/benchmarks.md), and on the helper it runs beside the reads.

Errors. Every read is waited for before anything is raised (no read may outlive the buffer,
Ctrl-C included); the first failure is raised as the engine's ``OSError`` subclass with the
file's name. A file shorter than ``at_least`` bytes, or one that shrank while it was read
(fewer bytes came back than its size said), gives None and frees the buffer: the caller decides
what such a file is. Thread-safe: nothing is shared between calls.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import NamedTuple

from . import _populate
from ._errors import with_name
from ._file import File, Future

#: Engine request size of a whole-file read.
CHUNK = 16 << 20
#: Helper threads faulting the buffer in ahead of the reads (0: the reads fault it themselves).
POPULATE_THREADS = 1
#: Transparent huge pages for the buffer: on the development VM a load on them cost 0.16-0.20
#: CPU s/GiB against 0.50-0.57 on 4 KiB pages (faulting fresh memory in is paid per page) and
#: ran about 2x as fast (docs/benchmarks.md, "deepio.load reads the whole file into huge pages").
HUGEPAGES = True


class WholeFile(NamedTuple):
    """A file's bytes in memory: ``buffer[offset : offset + size]``. The buffer is the
    caller's; it stays mapped while any view of it (or ctypes array over it) lives."""

    buffer: mmap.mmap
    offset: int
    size: int

    def view(self) -> memoryview:
        """The file's bytes (a view that keeps the buffer mapped while it lives)."""
        return memoryview(self.buffer)[self.offset : self.offset + self.size]


def read(path: str, *, at_least: int = 0) -> WholeFile | None:
    """The whole file at ``path`` in fresh page-aligned memory, read through the process's
    default engine as the module's docstring says; None for a file shorter than ``at_least``
    bytes or one that shrank while it was read. Raises ``IsADirectoryError`` for a folder and
    the engine's ``OSError`` subclasses (the file named) for everything else."""
    if os.path.isdir(path):  # O_RDONLY opens a folder; reading it would say EISDIR late
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    with File(path, "r", handle=None) as f:
        size = int(f.size())
        if size < max(at_least, 1):
            return None
        buf, off = _populate.anonymous(size, HUGEPAGES)
        addr = _populate.address(buf)
        view = memoryview(buf)[off : off + size]
        futs: list[tuple[Future, int]] = []
        ahead = None
        if POPULATE_THREADS > 0 and _populate.available():
            ahead = _populate.Ahead([(addr + off, size)], CHUNK, POPULATE_THREADS)
        first: BaseException | None = None
        try:
            for at in range(0, size, CHUNK):
                n = min(CHUNK, size - at)
                if ahead is not None:
                    ahead.wait_through(at + n)
                futs.append((f.pread(view[at : at + n], at), n))
        except BaseException as e:  # Ctrl-C: no read may outlive the buffer
            first = e
        finally:
            if ahead is not None:
                ahead.close()
        short = False
        for fut, n in futs:
            try:
                short = short or fut.result() != n
            except BaseException as e:
                first = first or (with_name(e, path) if isinstance(e, OSError) else e)
        del view, futs
        if first is not None or short:
            try:
                buf.close()
            except BufferError:  # a view still exported: freed with its last reference
                pass
        if first is not None:
            raise first
        return None if short else WholeFile(buf, off, size)
