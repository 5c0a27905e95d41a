"""Where a CPU load's data lands, and how it gets there (docs/models.md, "Reading").

``read_files``: the ``backend="direct"`` load. Each file's data section is read by deepio's one
whole-file reader (``deepio._wholefile.read_many``: fresh page-aligned anonymous memory, one
buffer per file, every file's reads in flight together through the engine, huge pages and
populating ahead as its knobs ``HUGEPAGES``, ``POPULATE_THREADS`` and ``CHUNK`` say).

``map_files``: the ``backend="mmap"`` load, each file mapped copy-on-write and read into the
page cache on helper threads before returning (tensors tied to the file, as safetensors' own).

Errors: ``OSError`` for I/O (from the engine, or errno from MADV_POPULATE_READ, naming the
file); ``OSError`` (EIO) naming the file where it shrank after its header was read. When
either raises, no read is left in flight. The module-level knobs (``_MMAP_THREADS``,
``_MMAP_PIECE``, and ``_wholefile``'s) are read at each call; set them before a load, not
during one. Thread-safe: nothing is shared between calls."""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any

from .. import _populate, _wholefile
from ._format import Header

PAGE = 4096

# The "mmap" backend: helper threads faulting the mappings in, and the size of their pieces.
_MMAP_THREADS = 2
_MMAP_PIECE = 64 << 20


def _shrank(h: Header) -> OSError:
    return OSError(errno.EIO, f"the file shrank to under {h.file_size} bytes while it was loaded", h.path)


def read_files(headers: list[Header]) -> list[tuple[Any, int]]:
    """The "direct" backend: for each header, (buffer, where its data section starts in the
    buffer): the data section read whole by ``_wholefile.read_many``, all files at once;
    (None, 0) for a file without data. OSError (EIO) naming the file where it shrank."""
    with_data = [h for h in headers if h.data_bytes]
    wholes = iter(_wholefile.read_many([_wholefile.Part(h.path, h.data_offset, h.file_size) for h in with_data]))
    out: list[tuple[Any, int]] = []
    for h in headers:
        whole = next(wholes) if h.data_bytes else None
        if h.data_bytes and whole is None:
            raise _shrank(h)
        out.append((None, 0) if whole is None else (whole.buffer, whole.offset))
    return out


def map_files(headers: list[Header]) -> list[Any]:
    """The "mmap" backend: for each header, its file mapped whole, copy-on-write (MAP_PRIVATE,
    writable: a tensor written to gets private pages, the file never changes), or None for a
    file without data; every page of the data sections read and mapped before returning, by
    MADV_POPULATE_READ on _MMAP_THREADS helper threads in _MMAP_PIECE pieces, so the page
    cache's readahead streams run in parallel. OSError (EIO) where a file shrank under it."""
    maps: list[Any] = []
    ranges: list[tuple[int, int]] = []
    for h in headers:
        m = None
        if h.data_bytes:
            with open(h.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < h.file_size:
                    raise _shrank(h)
                m = mmap.mmap(f.fileno(), h.file_size, access=mmap.ACCESS_COPY)
            lo = h.data_offset // PAGE * PAGE
            ranges.append((_populate.address(m) + lo, h.file_size - lo))
        maps.append(m)
    ahead = _populate.Ahead(ranges, _MMAP_PIECE, _MMAP_THREADS, _populate.MADV_POPULATE_READ)
    try:
        for i in range(len(ahead.pieces)):
            ahead.wait(i)
    finally:
        ahead.close()
    failed: dict[int, int] = {}
    for r, err in ahead.errors:
        failed.setdefault(r, err)
    with_data = [(h, m) for h, m in zip(headers, maps) if m is not None]
    for r, (h, m) in enumerate(with_data):
        err = failed.get(r, 0) if _populate.available() else errno.EINVAL
        if err == errno.EINVAL:  # no MADV_POPULATE_READ here: touch every page instead
            try:
                view = memoryview(m)
                bytes(view[h.data_offset // PAGE * PAGE :: PAGE])
                view.release()
            except ValueError:
                pass
        elif err:
            raise OSError(
                err,
                f"cannot read the data section ({os.strerror(err)}: an I/O error, or the file shrank)",
                h.path,
            )
    return maps
