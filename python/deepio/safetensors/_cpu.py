"""Where a CPU load's data lands, and how it gets there (docs/models.md, "Reading").

``host_buffer``: one page-aligned buffer per file, filled by the engine (``read_host``);
``_HOST_MEMORY`` picks plain anonymous memory ("mmap", the default: page-aligned, faulted in by
the reads themselves) or deepio's page-locked allocator ("locked": mlock, huge pages from 2 MiB,
io_uring registered buffers), which cost more CPU per GiB in a fresh process on the development
VM. bench/load_weights.py compares them.

``map_files``: the ``backend="mmap"`` load, each file mapped copy-on-write and read into the
page cache on helper threads before returning (tensors tied to the file, as safetensors' own).

Errors: ``OSError`` for I/O (from the engine, or errno from MADV_POPULATE_READ, naming the
file). The module-level knobs (``_HOST_MEMORY``, ``_POPULATE_THREADS``, ``_PIECE_BYTES``,
``_MMAP_THREADS``, ``_MMAP_PIECE``) are read at each call; set them before a load, not during
one."""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any, Callable

from .. import _deepio, _populate
from ._format import Header
from ._io import engine, submit_read

PAGE = 4096

_HOST_MEMORY = "mmap"

# With _POPULATE_THREADS > 0, fresh anonymous memory is populated ahead of the reads on that
# many helper threads, in pieces of _PIECE_BYTES, each piece read once populated. Off (0) by
# default: on the development VM the engine's two workers, faulting the pages in as they submit
# the reads, were faster (docs/benchmarks.md, "Loads to CPU: what bounds them").
_POPULATE_THREADS = 0
_PIECE_BYTES = 16 << 20

# The "mmap" backend: helper threads faulting the mappings in, and the size of their pieces.
_MMAP_THREADS = 2
_MMAP_PIECE = 64 << 20


def host_buffer(nbytes: int) -> Any:
    """Page-aligned memory for ``nbytes`` (None for 0) that supports the buffer protocol."""
    if nbytes == 0:
        return None
    if _HOST_MEMORY == "locked":
        try:
            import numpy  # noqa: F401 - the allocator hands its memory out as a NumPy array
        except ImportError:
            pass
        else:
            array, _owner = _deepio.alloc_locked(nbytes, "numpy")  # the array keeps it alive
            return array
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _cut(view: memoryview, at: int) -> Callable[[int, int], memoryview]:
    """``submit_read``'s ``cut`` for the destination ``view[at:]``."""
    return lambda a, n: view[at + a : at + a + n]


def read_host(reads: list[tuple[Any, str, int, int]], ops: list[Any]) -> None:
    """Queues the CPU reads: (destination memoryview, path, file offset, nbytes) each. With
    _POPULATE_THREADS, plain anonymous memory is faulted in by ``_populate.Ahead`` on helper
    threads, piece by piece, and each piece's read is submitted once its memory is populated;
    otherwise every read is submitted at once and the engine faults the pages in."""
    if not reads:
        return
    h = engine("cpu")
    if _HOST_MEMORY != "mmap" or _POPULATE_THREADS <= 0 or not _populate.available():
        for view, path, offset, n in reads:
            submit_read(h, _cut(view, 0), path, offset, n, ops)
        return
    ahead = _populate.Ahead([(_populate.address(v), n) for v, _, _, n in reads], _PIECE_BYTES, _POPULATE_THREADS)
    try:
        for i, (r, at, n) in enumerate(ahead.pieces):
            ahead.wait(i)
            view, path, offset, _ = reads[r]
            submit_read(h, _cut(view, at), path, offset + at, n, ops)
    finally:
        ahead.close()


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
                    raise OSError(
                        errno.EIO, f"the file shrank to under {h.file_size} bytes while it was loaded", h.path
                    )
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
