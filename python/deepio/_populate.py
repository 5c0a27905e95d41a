"""Faulting in fresh destination memory on helper threads, ahead of the reads that fill it.

A load reads into memory that was just allocated (``mmap`` for deepio.safetensors, torch's
allocator for deepio.load). The first touch of each 4 KiB page of such memory costs a page
fault and the zeroing of the page, and on a virtual machine also the host's fault that backs
the guest page: measured on the development VM (docs/benchmarks.md, "Loads to CPU: what
bounds them"), 0.4-0.7 CPU s/GiB, more than the disk's 0.27 s/GiB. When the reads fault the
pages themselves, that cost runs inside the I/O path, one page at a time, and the disk waits.

``Ahead`` faults a list of ranges in with ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14; one
system call per piece, GIL released by ctypes), in order, on its own threads, and lets the
reader wait until the memory it is about to read into is populated: the faults run on another
core while the disk fills the pieces already populated. Hints only: where the kernel refuses
(older kernels, EINVAL; a range no longer mapped) the pieces count as done and the reads fault
the pages as before, so nothing but speed changes.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from typing import Any

MADV_POPULATE_READ = 22  # Linux 5.14
MADV_POPULATE_WRITE = 23
_PAGE = mmap.PAGESIZE

_madvise: Any = None  # ctypes function, or False where there is none
_supported = True  # False once the kernel said EINVAL (no MADV_POPULATE_WRITE)
_lock = threading.Lock()
# Held across os.fork(): a child never inherits it locked by a parent thread half way
# through setting _madvise.
os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release, after_in_child=_lock.release)


def _fn() -> Any:
    global _madvise
    if _madvise is None:
        with _lock:
            if _madvise is None:
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    fn = libc.madvise
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                    fn.restype = ctypes.c_int
                    _madvise = fn
                except (OSError, AttributeError):
                    _madvise = False
    return _madvise


def address(buf: Any) -> int:
    """The address of a writable buffer's first byte (a memoryview, an mmap, a bytearray)."""
    anchor = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def whole_pages(addr: int, nbytes: int, page: int = _PAGE) -> tuple[int, int]:
    """[lo, hi): the whole pages of ``page`` bytes (the base page; HUGE for huge pages) inside
    [addr, addr + nbytes) (hi <= lo: none)."""
    return -(-addr // page) * page, (addr + nbytes) // page * page


def populate(addr: int, nbytes: int, advice: int = MADV_POPULATE_WRITE) -> int:
    """Faults in the whole pages of [addr, addr + nbytes): for writing (MADV_POPULATE_WRITE,
    anonymous memory) or reading (MADV_POPULATE_READ, a file mapping: the file's pages are
    read into the page cache and mapped). 0 when done; else the errno: EINVAL where the kernel
    has no such advice (the memory is then faulted in by whoever touches it first), EFAULT
    where a file's page could not be read (an I/O error, or the file shrank)."""
    global _supported
    fn = _fn()
    lo, hi = whole_pages(addr, nbytes)
    if hi <= lo:
        return 0
    if not fn or not _supported:
        return errno.EINVAL
    if fn(lo, hi - lo, advice) == 0:
        return 0
    err = ctypes.get_errno()
    if err == errno.EINVAL:
        _supported = False
    return err


def advise(addr: int, nbytes: int, advice: int) -> bool:
    """madvise(addr, nbytes, advice) as a hint: True when the kernel took it."""
    fn = _fn()
    return bool(fn) and fn(addr, nbytes, advice) == 0


HUGE = 2 << 20  # a transparent huge page on x86-64 and most arm64 kernels
MADV_HUGEPAGE = 14


def anonymous(nbytes: int, huge: bool = True) -> tuple[mmap.mmap, int]:
    """Fresh private anonymous memory for ``nbytes``: (the mapping, the offset of the usable
    bytes in it; page-aligned). With ``huge`` and ``nbytes`` of at least 2 MiB the usable bytes
    start on a 2 MiB boundary of a mapping 2 MiB larger, advised MADV_HUGEPAGE, so that where
    transparent huge pages are in "madvise" (or "always") mode the memory is faulted in per
    2 MiB page instead of per 4 KiB page (on the development VM 0.16-0.20 instead of 0.50-0.57
    CPU s/GiB, docs/benchmarks.md). Where the kernel refuses the advice it is ordinary memory."""
    huge = huge and nbytes >= HUGE
    buf = mmap.mmap(-1, max(1, nbytes + (HUGE if huge else 0)), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if not huge:
        return buf, 0
    addr = address(buf)
    off = -addr % HUGE
    advise(addr + off, nbytes // HUGE * HUGE, MADV_HUGEPAGE)
    return buf, off


def available() -> bool:
    """Whether populating can work here (a libc madvise, and the kernel has not refused)."""
    return bool(_fn()) and _supported


class Ahead:
    """Populates ``ranges`` ([(address, nbytes)], each cut into ``piece``-byte pieces) on
    ``threads`` helper threads, in order. ``wait(i)`` blocks until piece ``i`` (of
    ``pieces``, a list of (range index, offset in the range, nbytes)) is done; ``close()``
    stops the helpers after the piece each one is on and joins them (always call it, e.g. in a
    ``finally``: the memory must outlive the helpers). ``errors`` lists the pieces the kernel
    refused, as (range index, errno). Where populating cannot work at all (``available()`` is
    False) no thread starts and every piece counts as done."""

    def __init__(
        self, ranges: list[tuple[int, int]], piece: int, threads: int = 1, advice: int = MADV_POPULATE_WRITE
    ) -> None:
        self.pieces: list[tuple[int, int, int]] = []
        for r, (_, n) in enumerate(ranges):
            at = 0
            while at < n:
                k = min(piece, n - at)
                self.pieces.append((r, at, k))
                at += k
        self._ranges = ranges
        self._advice = advice
        self.errors: list[tuple[int, int]] = []  # (range index, errno) of pieces that failed
        self._done = [threading.Event() for _ in self.pieces]
        self._stop = False
        self._waited = 0  # pieces wait_through has seen done
        self._threads: list[threading.Thread] = []
        if not available():
            for e in self._done:
                e.set()
            return
        threads = max(1, min(threads, len(self.pieces)))
        for k in range(threads):
            t = threading.Thread(target=self._work, args=(k, threads), name=f"deepio-populate-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def _work(self, first: int, step: int) -> None:
        for i in range(first, len(self.pieces), step):
            if self._stop:
                break
            r, at, n = self.pieces[i]
            try:
                err = populate(self._ranges[r][0] + at, n, self._advice)
                if err:
                    self.errors.append((r, err))  # list.append is atomic
            finally:
                self._done[i].set()
        for i in range(first, len(self.pieces), step):  # stopped early: nobody waits forever
            self._done[i].set()

    def wait(self, i: int) -> None:
        """Blocks until piece ``i`` is populated (or given up)."""
        self._done[i].wait()

    def wait_through(self, end: int) -> None:
        """Blocks until bytes [0, end) of a single range are populated (pieces in order)."""
        while self._waited < len(self.pieces) and self.pieces[self._waited][1] < end:
            self._done[self._waited].wait()
            self._waited += 1

    def close(self) -> None:
        self._stop = True
        for t in self._threads:
            t.join()
        self._threads = []
