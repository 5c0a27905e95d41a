"""CRC-32s of the bytes a DCP load reads, computed on a pool of threads as the reads complete
(``_reader``'s check of each record against the CRC-32 its zip records).

``crc32(data, value=0)`` is zlib's (zlib-ng's where installed: deepio.save's, 12 GiB/s a core
on the development VM against the standard library's 3.5; both release the GIL for large
buffers). ``crc32_combine(crc1, crc2, len2)`` is the CRC-32 of two byte strings one after the
other from theirs: zlib-ng's where installed, else ``_combine`` below (the standard library's
zlib module has no binding for zlib's ``crc32_combine``): zlib 1.2.12's method, multiplication
of polynomials over GF(2) modulo the CRC's, ``x^(8 * len2)`` from a table of ``x^(2^k)``; a
few hundred Python operations, cached per length (a load's pieces share few lengths).

``Sums`` (one per load, its pool shared by every folder's reading thread) hands out one
``Record`` per stored record checked: the record's bytes arrive as pieces, in several buffers
(the destination, scratch for the bytes of a record a partial load does not want), each
piece's CRC-32 is started on the pool once its read completed (``Record.landed``), and
``Record.crc()`` combines them in the record's order. ``Sums.run(fn, nbytes)`` runs any other
check (a whole item's ``_record.bad_layout``) on the pool; checks of at most ``INLINE_BYTES``
run at once on the calling thread instead. Thread-safe: ``landed`` and ``submit`` may
be called from any thread; one ``Record`` is filled and read by one thread.
"""

from __future__ import annotations

import functools
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import torch

crc32: Callable[..., int]
crc32_combine: Callable[[int, int, int], int]

_POLY = 0xEDB88320  # the CRC-32 polynomial, bit-reflected (x^0 is bit 31)


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial, both reflected (zlib's multmodp)."""
    if a == 0 or b == 0:
        return 0
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    """x^(2^k) modulo the polynomial, k = 0..31 (zlib's x2n_table)."""
    out, p = [], 1 << 30  # x^1
    for _ in range(32):
        out.append(p)
        p = _multmodp(p, p)
    return out


_X2N = _x2n_table()


@functools.lru_cache(maxsize=256)
def _shift(len2: int) -> int:
    """x^(8 * len2) modulo the polynomial: appending len2 bytes multiplies a CRC by it."""
    p, k, n = 1 << 31, 3, len2  # x^0; 2^3 bits a byte
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def _combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's crc32_combine in Python: the CRC-32 of A + B from crc32(A), crc32(B) and len(B)."""
    if len2 < 0:
        raise ValueError("crc32_combine: negative length")
    return _multmodp(_shift(len2), crc1 & 0xFFFFFFFF) ^ (crc2 & 0xFFFFFFFF)


try:
    from zlib_ng import zlib_ng as _zlib_ng

    crc32 = _zlib_ng.crc32
    crc32_combine = _zlib_ng.crc32_combine
except ImportError:  # depends on what is installed (the "checkpoint" extra)
    crc32 = zlib.crc32
    crc32_combine = _combine

#: Bytes of a destination read as one request, its CRC-32 started as soon as it landed: the
#: check then runs beside the later reads, and only the last piece's is left at the end.
#: Read at each use (tests set it small).
PIECE_BYTES = 16 << 20
#: Bytes of CUDA memory copied back to the host at a time for its CRC-32.
CUDA_PIECE_BYTES = 64 << 20
#: Host bytes checked at once on the calling thread rather than on the pool: handing a job
#: over costs about what the CRC-32 of this many bytes does (and the GIL, twice). Read at
#: each use.
INLINE_BYTES = 256 << 10


def threads() -> int:
    """Threads of a load's pool: one on two cores (the loading thread and the engine's workers
    need the other), up to four where there are cores to spare (deepio.save's count)."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _host_crc(t: torch.Tensor) -> int:
    return crc32(memoryview(cast(Any, t.numpy()))) & 0xFFFFFFFF if t.numel() else 0


def _cuda_crc(t: torch.Tensor) -> int:
    """CRC-32 of CUDA bytes (a flat uint8 tensor whose read is complete for every stream:
    docs/gpu.md), copied back ``CUDA_PIECE_BYTES`` at a time."""
    crc = 0
    for at in range(0, t.numel(), CUDA_PIECE_BYTES):
        crc = crc32(memoryview(cast(Any, t[at : at + CUDA_PIECE_BYTES].cpu().numpy())), crc)
    return crc & 0xFFFFFFFF


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 tensor (the same memory)."""
    return t.detach().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class _Done:
    """A check run at once: ``result()`` as a done Future's (a Future's set_result takes its
    condition's lock and wakes waiters: 0.15 ms each under load, per small item)."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self._value, self._error = value, error

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class Record:
    """The CRC-32 of one stored record whose bytes arrive in ``parts`` pieces (numbered in the
    record's order, each given once to ``landed``)."""

    def __init__(self, sums: Sums, parts: int, expected: int) -> None:
        self._sums = sums
        self.expected = expected
        self._parts: list[tuple[int, Future[int]] | None] = [None] * parts

    def landed(self, n: int, piece: torch.Tensor) -> None:
        """Piece ``n`` (a flat uint8 tensor, host or CUDA memory) is read: its CRC-32 starts."""
        fn = _cuda_crc if piece.is_cuda else _host_crc
        nbytes = piece.numel() if not piece.is_cuda else INLINE_BYTES + 1
        self._parts[n] = (piece.numel(), self._sums.run(functools.partial(fn, piece), nbytes))

    def crc(self) -> int:
        """The record's CRC-32, once every piece landed (waits for the pool)."""
        out = 0
        for k, part in enumerate(self._parts):
            if part is None:
                raise RuntimeError("deepio.dcp: a piece of a record was never read")
            n, fut = part
            out = fut.result() if k == 0 else crc32_combine(out, fut.result(), n)
        return out & 0xFFFFFFFF


class Sums:
    """A load's pool of CRC threads (started with the first job, ``threads()`` of them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def record(self, parts: int, expected: int) -> Record:
        return Record(self, parts, expected)

    def run(self, fn: Callable[[], Any], nbytes: int) -> Future[Any]:
        """``fn()`` (a check of ``nbytes`` bytes): at once on this thread where they are at
        most ``INLINE_BYTES``, else on the pool; its future either way."""
        if nbytes > INLINE_BYTES:
            return self.submit(fn)
        try:
            return cast(Future, _Done(fn(), None))
        except BaseException as e:  # raised by result(), as a pool job's would be
            return cast(Future, _Done(None, e))

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(threads(), thread_name_prefix="deepio-dcp-crc")
            return self._pool.submit(fn)

    def close(self) -> None:
        """Waits for every job (none may outlive the buffers it reads) and stops the pool."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
