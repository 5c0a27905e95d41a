"""deepio.kv.Store as an LMCache L2 tier, through LMCache's ``native_plugin`` L2 adapter.

LMCache (multiprocess mode) loads it from its L2 adapter config (docs/kv-backends.md has the whole
command line)::

    --l2-adapter '{"type": "native_plugin", "module_path": "deepio.kv.lmcache",
                   "class_name": "DeepioL2Connector",
                   "adapter_params": {"folders": ["/mnt/nvme0/kv", "/mnt/nvme1/kv"],
                                      "capacity_bytes": 68719476736, "page_bytes": 6291456,
                                      "fingerprint": "llama-3.1-8b bf16 chunk256"}}'

What the bytes mean: LMCache passes a native plug-in nothing but ``adapter_params``, and its
keys name the model and the KV rank (``<model>@<kv_rank>@<group>@<chunk hash>``) but not the
dtype, chunk size or layout of an object. The store's fingerprint is ``page_bytes`` and the
``fingerprint`` parameter, a string the operator sets to name the rest (e.g. the KV dtype,
chunk size and format); a store written under another one raises at construction, or, with
``"clear_on_mismatch": true``, starts empty with a warning: its objects are never served.
A fresh folder needs ``capacity_bytes`` (the construction raises, naming the folder).

Sharing (docs/kv-backends.md, "LMCache"): the store is opened with ``shared=True`` (``"shared": false``
in ``adapter_params`` opts out): every LMCache server on the node (its multiprocess mode runs
one per node, or one per vLLM instance) that names the same folders, ``page_bytes`` and
``fingerprint`` uses one store and hits the others' objects. LMCache's keys name the model and
the KV rank, so whatever LMCache shares between ranks (or keeps per rank) it shares here too.
The first to open the store owns it (objects move straight between the drives and its L1
memory); the others' go through their staging region (one memory copy).

LMCache constructs ``DeepioL2Connector(**adapter_params)`` and wraps it in its
``NativeConnectorL2Adapter``, which calls exactly the six methods below (its
``native_connector_l2_adapter.py`` names the protocol):

- ``event_fd() -> int``: one eventfd; it becomes readable when completions are waiting.
- ``submit_batch_set(keys, memoryviews) -> id`` / ``submit_batch_get(keys, memoryviews) -> id``:
  start a batch and return at once. Each memoryview is one whole object in LMCache's L1 memory;
  the store reads from it (set) or writes into it (get) in place, as the one segment of its
  page (``Store.put_segments`` / ``Store.get_segments``). The memoryviews are held here until
  the batch completes.
- ``submit_batch_exists(keys) -> id``: answered from the store's in-memory index at once
  (``Store.contains``); ``submit_batch_delete(keys) -> id`` likewise (``Store.remove``).
- ``drain_completions() -> [(id, ok, error, per_key_bools)]``: every completion since the last
  call, oldest first; reading resets the eventfd.
- ``close()``: finishes the batches in flight (the store's close drains them), then closes the
  store and the eventfd.

Completions are queued by the store futures' ``add_done_callback`` (run on the store's
completion thread, or at once when the batch is already done) and the eventfd is written
then. For a set or get, ``ok`` is True when every key succeeded and ``per_key_bools`` says which
did (a get: found whole with a matching CRC-32C; a set: stored durably), ``error`` why not;
for exists and delete, ``ok`` says the call worked and the bools which keys were present.
An exception from the store at submit time (a key too long, a closed store) becomes a failed
completion, never an exception into LMCache's submit path.

Thread safety: LMCache submits from its own threads and drains from its demux thread; the
queue and the id counter are guarded by one lock, held only for O(1) work.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from deepio.kv._backend import clear_setting, fingerprint, open_store

# (future id, ok, error message, per-key results)
Completion = tuple[int, bool, str, list[bool]]


def _address(view: Any) -> tuple[int, int]:
    """(address, nbytes) of a byte buffer, read-only ones included, without a copy."""
    array = np.frombuffer(view, dtype=np.uint8)
    return int(array.ctypes.data), int(array.nbytes)


class DeepioL2Connector:
    """The native-plugin client: ``folders`` (one per drive), ``capacity_bytes`` (required to
    create a store, not to reopen one), ``page_bytes`` (the largest object LMCache stores: its
    chunk size in bytes; default 2 MiB), ``fingerprint`` (what the objects' bytes are, beyond
    what the keys say: see the module comment), ``clear_on_mismatch`` (default false: a store
    written under another fingerprint raises; true: it starts empty, with a warning), ``shared``
    (default true: one store per node for every process that opens these folders), and any
    further ``deepio.kv.Store`` keyword argument."""

    def __init__(
        self,
        folders: Sequence[str] | str,
        capacity_bytes: int = 0,
        page_bytes: int = 2 << 20,
        fingerprint: str = "",
        clear_on_mismatch: bool = False,
        **store_options: Any,
    ) -> None:
        if isinstance(folders, str):
            folders = [folders]
        store_options.setdefault("shared", True)
        self._store = open_store(
            "deepio LMCache L2 connector",
            _WHERE,
            list(folders),
            capacity_bytes=int(capacity_bytes),
            page_bytes=int(page_bytes),
            fingerprint=_fingerprint(int(page_bytes), str(fingerprint)),
            clear_on_mismatch=clear_setting(clear_on_mismatch, _WHERE),
            **store_options,
        )
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._next_id = 1
        self._done: collections.deque[Completion] = collections.deque()
        # id -> the memoryviews of a batch in flight (the store reads or writes them until done)
        self._in_flight: dict[int, Any] = {}
        self._closed = False
        self._fd_closed = False

    def event_fd(self) -> int:
        return self._efd

    def submit_batch_set(self, keys: list[str], memoryviews: list[Any]) -> int:
        return self._submit(self._store.put_segments, keys, memoryviews)

    def submit_batch_get(self, keys: list[str], memoryviews: list[Any]) -> int:
        return self._submit(self._store.get_segments, keys, memoryviews)

    def submit_batch_exists(self, keys: list[str]) -> int:
        fid = self._new_id()
        try:
            self._complete(fid, True, [bool(p) for p in self._store.contains(list(keys))], "")
        except Exception as e:
            self._complete(fid, False, [False] * len(keys), f"{type(e).__name__}: {e}")
        return fid

    def submit_batch_delete(self, keys: list[str]) -> int:
        fid = self._new_id()
        try:
            present = [bool(p) for p in self._store.contains(list(keys))]
            self._store.remove(list(keys))
            self._complete(fid, True, present, "")
        except Exception as e:
            self._complete(fid, False, [False] * len(keys), f"{type(e).__name__}: {e}")
        return fid

    def drain_completions(self) -> list[Completion]:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done = list(self._done)
            self._done.clear()
        return done

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Finishes the batches in flight: their callbacks run (and write the eventfd) before
        # the store's close returns, so the fd is closed after the last write.
        self._store.close()
        with self._lock:
            self._fd_closed = True
            os.close(self._efd)

    def stats(self) -> dict[str, Any]:
        return dict(self._store.stats())

    # ---- internals -----------------------------------------------------------------------

    def _new_id(self) -> int:
        with self._lock:
            fid = self._next_id
            self._next_id += 1
        return fid

    def _submit(self, call: Any, keys: list[str], memoryviews: list[Any]) -> int:
        fid = self._new_id()
        n = len(keys)
        try:
            if len(memoryviews) != n:
                raise ValueError(f"{n} keys but {len(memoryviews)} buffers")
            segments = [[_address(v)] for v in memoryviews]
            with self._lock:
                self._in_flight[fid] = memoryviews
            future = call(list(keys), segments)
        except Exception as e:
            with self._lock:
                self._in_flight.pop(fid, None)
            self._complete(fid, False, [False] * n, f"{type(e).__name__}: {e}")
            return fid

        def finished(f: Any) -> None:
            try:
                results = [bool(r) for r in f.result()]
                missed = results.count(False)
                error = f"{missed} of {n} pages failed" if missed else ""
            except Exception as e:
                results, error = [False] * n, f"{type(e).__name__}: {e}"
            with self._lock:
                self._in_flight.pop(fid, None)
            self._complete(fid, not error, results, error)

        future.add_done_callback(finished)
        return fid

    def __del__(self) -> None:
        # Dropped without close() (an adapter dropped mid-job: the last reference may go in a
        # store callback): the eventfd is closed here; the store closes itself when dropped.
        lock = getattr(self, "_lock", None)
        if lock is None:  # the construction failed before the eventfd was made
            return
        with lock:
            if self._fd_closed:
                return
            self._fd_closed = True
        os.close(self._efd)

    def _complete(self, fid: int, ok: bool, results: list[bool], error: str) -> None:
        with self._lock:
            self._done.append((fid, ok, error, results))
            if self._fd_closed:  # a submit after close(): its failure is queued, nobody waits
                return
            os.eventfd_write(self._efd, 1)


_WHERE = 'the --l2-adapter "adapter_params"'


def _fingerprint(page_bytes: int, user: str) -> str:
    fields: dict[str, Any] = {"page_bytes": page_bytes}
    if user:
        fields["user"] = user
    return fingerprint("lmcache", fields)
