"""deepio.kv: a KV-cache page store on local NVMe drives (docs/kv.md, "The store").

A thin face over the C++ store (``deepio::kv::Store``, include/deepio/kv.hpp)::

    store = deepio.kv.Store(["/mnt/nvme0/kv", "/mnt/nvme1/kv"], capacity_bytes=64 << 30, page_bytes=2 << 20)
    store.register(pool)                  # 2-D [slots, page_bytes], C-contiguous, CPU
    ok = store.put(keys, slots).result()  # list[bool]: stored durably
    ok = store.get(keys, slots).result()  # list[bool]: found whole, checksum matched
    n = store.exists(keys)                # leading run of keys present
    store.contains(keys)                  # list[bool]

The engine's guarantees (durability, atomic replace, crash recovery, eviction, failed
folders and their recovery) are the C++ store's; this module adds argument handling, warnings and the context
manager.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Union

from deepio import _deepio
from deepio._futures import NativeFuture

__all__ = [
    "Store",
    "Future",
    "FolderFailedWarning",
    "FolderRecoveredWarning",
    "StoreClearedWarning",
    "MAX_KEY_BYTES",
    "MAX_FINGERPRINT_BYTES",
    "crc32c",
]

#: The longest key, in bytes (utf-8 for str).
MAX_KEY_BYTES: int = _deepio.KV_MAX_KEY_BYTES

#: The longest fingerprint, in bytes (utf-8).
MAX_FINGERPRINT_BYTES: int = 4096


class Future(NativeFuture[list[bool]]):
    """The completion of a put or get batch, a ``concurrent.futures.Future``:
    ``result(timeout=None) -> list[bool]`` (one bool per key), ``done()``,
    ``add_done_callback(fn)``, ``exception()`` (always None once done: a page that failed
    is a False), ``cancel()`` (always False); ``await future`` in asyncio,
    ``asyncio.wrap_future`` and ``concurrent.futures.wait``/``as_completed`` work, with no
    thread per wait (deepio/_futures.py). Done callbacks run on the store's batch thread
    that completed the batch (GIL held), or at once if done; one may drop the last
    reference to the store (its close is then deferred, see ``Store.close``)."""

    def _native_result(self, timeout: float | None) -> list[bool]:
        return self._native.result(timeout)

    def _native_exception(self, timeout: float | None) -> BaseException | None:
        self._native.result(timeout)
        return None

    def __repr__(self) -> str:
        return f"<deepio.kv.Future {'done' if self._native.done() else 'running'}>"


Key = Union[str, bytes]


def crc32c(buffer: Any, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of a host buffer's bytes, continuing from ``crc``: the checksum the
    store keeps for each page (AVX-512 VPCLMULQDQ and SSE4.2 where the CPU has them).
    ``crc32c(b"123456789") == 0xE3069283``."""
    return _deepio.kv_crc32c(buffer, crc)


class FolderFailedWarning(RuntimeWarning):
    """A store folder's I/O failed: its pages are dropped (misses from then on) and new pages
    go to the other folders until a probe finds it working again (``retry_failed_after``,
    ``Store.retry_failed()``)."""


class FolderRecoveredWarning(RuntimeWarning):
    """A failed store folder passed a probe and takes new pages again (its dropped pages stay
    dropped). Not a FolderFailedWarning: a filter that turns failures into errors leaves it be."""


class StoreClearedWarning(RuntimeWarning):
    """An existing store was opened with another fingerprint and ``clear_on_mismatch=True``:
    every page it held was dropped (durably) and it starts empty."""


# The C++ store's recovery message is "deepio.kv: folder PATH recovered"; the one of a store
# cleared at open names the fingerprint; a failure's ends otherwise ("... until a probe finds
# it working again").
_RECOVERED_SUFFIX = " recovered"


def _warning_category(message: str) -> type[RuntimeWarning]:
    if message.endswith(_RECOVERED_SUFFIX):
        return FolderRecoveredWarning
    if "fingerprint" in message:
        return StoreClearedWarning
    return FolderFailedWarning


class Store:
    """A page store over one folder per drive (see the module docstring and docs/kv.md).

    ``capacity_bytes`` is the total over all folders, required (> 0) for a fresh folder (one
    without ``kv.meta``): deepio.InvalidArgumentError naming the folder otherwise; the layout
    is fixed at first open (0, or any value, keeps an existing one). ``page_bytes`` is the
    largest page. ``fingerprint``: what the pages mean to the caller (model, layout, dtype,
    page shape, ranks; opaque, at most MAX_FINGERPRINT_BYTES), kept in the store's ``kv.meta``:
    an existing store opened with another one raises deepio.InvalidArgumentError naming the
    folder and both, or, with ``clear_on_mismatch=True``, drops every page durably, keeps the
    new fingerprint and warns (StoreClearedWarning).
    ``shared=True``: one store per node, for every process that opens these folders so: the
    first owns and serves it, the others are its clients with the same calls (docs/kv-sharing.md,
    "Sharing a store between processes"); False (default): a second open raises EBUSY.
    ``group=(name, rank, size)`` (with ``shared=True`` only; ValueError otherwise): this
    process is member ``rank`` of ``size`` that get the same keys: each page is read from the
    drives about once for the group and copied to every member, and a member's put of a key
    another member put within the group's window is not written again (docs/kv-sharing.md, "Groups").
    Keyword options: watermarks of the LRU eviction, slab file size (0: one file per folder;
    else files of that size, at most 4 per folder; kept by later opens), checkpoint interval in
    seconds (0: only at close), batch threads, the engine's queue depth and workers,
    ``device_pages_in_flight``: the page-locked host buffers each batch thread moves CUDA pages
    through (made on its first CUDA page; host memory never uses them), and
    ``retry_failed_after``: seconds after its last error before a batch probes a failed folder
    again (0: only ``retry_failed()``; see ``retry_failed``).
    Thread-safe, close() included (it waits for the calls under way). In a forked child
    every call raises deepio.ForkedHandleError at once, and dropping the Store there leaves
    the parent's store alone. The last reference may go anywhere, a done callback included.
    """

    def __new__(cls, *args: Any, shared: bool = False, **kwargs: Any) -> Store:
        # shared=True: this process owns the store and serves it, or is a client of the process
        # that does (deepio/kv/_shared.py; docs/kv-sharing.md, "Sharing a store between processes").
        if shared and cls is Store:
            from ._shared import SharedStore

            return object.__new__(SharedStore)
        return object.__new__(cls)

    def __init__(
        self,
        folders: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        capacity_bytes: int = 0,
        page_bytes: int = 2 << 20,
        *,
        high_watermark: float = 0.95,
        low_watermark: float = 0.85,
        slab_bytes: int = 0,
        checkpoint_interval: float = 60.0,
        batch_threads: int = 4,
        queue_depth: int = 128,
        workers: int = 2,
        device_pages_in_flight: int = 4,
        retry_failed_after: float = 30.0,
        fingerprint: str = "",
        clear_on_mismatch: bool = False,
        shared: bool = False,
        group: tuple[str, int, int] | None = None,
    ) -> None:
        if group is not None:
            raise ValueError("deepio.kv: group=(name, rank, size) needs shared=True")
        if isinstance(folders, (str, bytes, os.PathLike)):
            folders = [folders]
        paths = [os.fsdecode(os.fspath(f)) for f in folders]
        for name, value in (("capacity_bytes", capacity_bytes), ("page_bytes", page_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"{name} must be a non-negative int, not {value!r}")
        if not isinstance(fingerprint, str):
            raise TypeError(f"fingerprint must be a str, not {type(fingerprint).__name__}")
        if len(fingerprint.encode()) > MAX_FINGERPRINT_BYTES:
            raise ValueError(
                f"fingerprint is {len(fingerprint.encode())} bytes (utf-8); at most {MAX_FINGERPRINT_BYTES}"
            )
        if not isinstance(clear_on_mismatch, bool):
            raise TypeError(f"clear_on_mismatch must be a bool, not {clear_on_mismatch!r}")
        self._s = _deepio.KvStore(
            paths,
            capacity_bytes,
            page_bytes,
            high_watermark,
            low_watermark,
            slab_bytes,
            checkpoint_interval,
            batch_threads,
            queue_depth,
            workers,
            device_pages_in_flight,
            retry_failed_after,
            fingerprint,
            clear_on_mismatch,
        )
        self.folders = paths
        #: What the pages mean to the caller, as given (see the class docstring).
        self.fingerprint = fingerprint
        self._warn()  # a store cleared for another fingerprint says so at once

    # -- pages -------------------------------------------------------------------------------
    def register(self, pool: Any) -> None:
        """Registers the memory pages move to and from: 2-D [slots, page_bytes] (uint8, or any
        dtype whose row is page_bytes bytes), C-contiguous, writable, CPU (torch, NumPy,
        DLPack, buffer protocol) or CUDA (torch ``is_cuda``, DLPack ``kDLCUDA``). A CUDA pool's
        pages are copied through the store's page-locked host buffers (the checksum needs host
        bytes). put/get order their copies after the work queued on the pool's producer stream
        before the call (torch's current stream; other DLPack producers by the stream
        exchange), without waiting on the calling thread; a get copies to the device only pages
        whose checksum matched, and its future is done once they are in device memory. The
        store keeps the pool alive until closed. A host pool of up to 8 GiB moves through
        io_uring registered buffers (its pages pinned once, not at every request; see
        ``stats()["bytes_fixed"]``) until the store closes."""
        self._s.register(pool)

    def put(self, keys: Sequence[Key], slots: Iterable[int]) -> Future:
        """Stores pool row slots[i] under keys[i]; the future's result is one bool per key
        (True once durable). Keep the rows unchanged until the future is done."""
        try:
            return Future(self._s.put(keys, slots))
        finally:
            self._warn()

    def get(self, keys: Sequence[Key], slots: Iterable[int]) -> Future:
        """Reads keys[i] into pool row slots[i]; True where the page was found whole, its
        length is page_bytes and its checksum matched (a False row's contents are
        unspecified)."""
        try:
            return Future(self._s.get(keys, slots))
        finally:
            self._warn()

    def put_segments(self, keys: Sequence[Key], segments: Sequence[Sequence[tuple[int, int]]]) -> Future:
        """Zero-copy scatter/gather put: page i is the concatenation of segments[i], a list of
        (address, nbytes) summing to at most page_bytes. The caller keeps that memory alive
        and unchanged until the future is done. Addresses may be CUDA device memory (copied
        through host buffers, as for a CUDA pool; not ordered after any stream: finish the work
        that writes them first)."""
        try:
            return Future(self._s.put_segments(keys, segments))
        finally:
            self._warn()

    def get_segments(self, keys: Sequence[Key], segments: Sequence[Sequence[tuple[int, int]]]) -> Future:
        """Zero-copy scatter/gather get: True only where the stored length equals the sum of
        segments[i] and the checksum matched. Memory kept alive until the future is done."""
        try:
            return Future(self._s.get_segments(keys, segments))
        finally:
            self._warn()

    def exists(self, keys: Sequence[Key]) -> int:
        """Length of the leading run of keys present."""
        try:
            return self._s.exists(keys)
        finally:
            self._warn()

    def contains(self, keys: Sequence[Key]) -> list[bool]:
        """Per key: present."""
        try:
            return self._s.contains(keys)
        finally:
            self._warn()

    def remove(self, keys: Sequence[Key]) -> int:
        """Removes keys (absent ones are ignored); returns how many were present. Durable at
        the next checkpoint (after a crash before it a removed page may come back, whole)."""
        return self._s.remove(keys)

    def clear(self) -> int:
        """Removes every page; returns how many there were. Durable when it returns (it ends
        with a checkpoint): after a crash none of them comes back. For pages that must not be
        served again, e.g. after the model's weights changed. A put in flight at the call may
        commit after it and stay. A folder failed at the time keeps its pages on its drive;
        they come back only if a later open finds that folder readable again."""
        return self._s.clear()

    def checkpoint(self) -> None:
        """Writes the index checkpoint now, after waiting for the puts in flight that began
        before the call: every page put and every removal made before it is then durable."""
        self._s.checkpoint()

    def retry_failed(self) -> int:
        """Probes every failed folder now, however recently it failed, and returns how many
        came back. A probe writes a zeroed 4 KiB block with fsync over a free slot's header in
        each slab file and reads it back, then rewrites the folder's checkpoint (listing none
        of the pages its failure dropped, so that a crash cannot bring them back). A folder that
        passes takes new pages again (a FolderRecoveredWarning; ``stats()`` counts it in
        ``recoveries``); one that fails stays failed, its error counted. A folder that could not
        be opened at all is not probed (reopen the store). The same probe runs by itself after
        a batch once a folder's last error is ``retry_failed_after`` seconds old."""
        try:
            return self._s.retry_failed()
        finally:
            self._warn()

    def stats(self) -> dict[str, Any]:
        """Counters and per-folder state (path, state "ok"/"failed", slots, used, errors,
        recoveries, last_errno, last_error; errors and the last error are kept after a
        recovery)."""
        try:
            return self._s.stats()
        finally:
            self._warn()

    @property
    def page_bytes(self) -> int:
        return self._s.page_bytes

    @property
    def closed(self) -> bool:
        return self._s.closed

    def close(self) -> None:
        """Finishes every batch in flight, writes the checkpoint, closes the slab files.
        Calls under way in other threads finish first (close waits for them); later calls
        raise ValueError. Idempotent; raises OSError if the checkpoint could not be written.
        From a done callback (the store's own batch thread) the close runs on a thread of its
        own and this returns at once; a failure of its checkpoint is then reported as a
        deepio.UnobservedFailureWarning."""
        try:
            self._s.close()
        finally:
            for w in self._s.take_warnings():
                warnings.warn(w, _warning_category(w), stacklevel=2)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _warn(self) -> None:
        for w in self._s.take_warnings():
            warnings.warn(w, _warning_category(w), stacklevel=3)

    def __repr__(self) -> str:
        try:
            state = "closed" if self.closed else f"page_bytes={self.page_bytes}"
        except _deepio.ForkedHandleError:  # a forked child's copy: every call refuses
            state = "of another process"
        except ValueError:  # closed by another thread meanwhile
            state = "closed"
        return f"deepio.kv.Store({self.folders!r}, {state})"
