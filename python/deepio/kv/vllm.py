"""deepio.kv.Store as a secondary tier of vLLM's KV offloading (``TieringOffloadingSpec``).

vLLM loads an out-of-tree tier by class name and module path from the offloading
connector's config (docs/kv-backends.md has the whole command line)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "DeepioTier", "module_path": "deepio.kv.vllm",
                             "folders": ["/mnt/nvme0/kv", "/mnt/nvme1/kv"],
                             "capacity_bytes": 68719476736}]}}'

vLLM's ``SecondaryTierFactory.create_secondary_tier`` constructs
``DeepioTier(offloading_spec=, primary_kv_view=, tier_type=, backpressure_detector=, **rest)``
where ``rest`` is the tier's dict less ``type``, ``module_path`` and ``backpressure``.

Memory: ``primary_kv_view`` is vLLM's CPU tier, a (chunks, chunk_bytes) uint8 memoryview over
its shared mmap; it is registered with the store once, as the pool, and a job's
``chunk_ids`` are the pool's rows: a store is ``Store.put(keys, chunk_ids)``, a load
``Store.get(keys, chunk_ids)``, straight between the drive and vLLM's CPU tier. vLLM keeps the
rows of a job pinned until the job is reported finished.

Calls (vLLM makes them under its tiering manager's lock; they never block on I/O):
- ``lookup(key)``: HIT if the store holds the key, RETRY while a store of that key is still in
  flight here, else MISS (``Store.contains``, an in-memory lookup in the store's owner; a round
  trip to the owner in the other processes).
- ``submit_store(job)`` / ``submit_load(job)``: start the batch and return; the store future's
  ``add_done_callback`` queues a ``JobResult`` (success: every key stored durably / found whole
  with a matching CRC-32C; a partly failed load names the keys that did arrive).
- ``get_finished_jobs()``: the results queued since the last call.
- ``drain_jobs()``: waits for every job in flight; ``shutdown()`` drains, then closes the store.

Keys are vLLM's ``OffloadKey`` bytes (block hash + group index). Sharing (docs/kv-backends.md, "vLLM"):
the tier lives in vLLM's scheduler process, one per instance (one per data-parallel replica);
its store is opened with ``shared=True`` (the tier's ``"shared": false`` opts out), so every
instance and replica on the node that opens the same folders with the same configuration uses
one store and hits the others' chunks. The first to open it owns it (pages move straight
between the drives and its CPU tier); the others' go through their staging region (one copy).
An MLA model under vLLM's replicated layout (``replicated_layout``: pure MLA, single-node TP)
has one copy of a chunk in the CPU tier for every TP worker: the tier loads it once.

What the bytes mean (the model and its dtype, the parallel ranks and sizes, the KV groups'
tokens per block and layers, the cache's tokens per hash and blocks per chunk, the worker's
bytes per block and KV layout, from ``offloading_spec.config``; the chunk's bytes; and the
tier's ``fingerprint`` string) is the store's fingerprint: a store written under another
raises at construction, or, with ``"clear_on_mismatch": true``, starts empty with a warning.
A fresh folder needs ``capacity_bytes`` (the construction raises, naming the folder).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from deepio.kv._backend import clear_setting, digest, fingerprint, open_store

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector


class DeepioTier(SecondaryTierManager):
    """A vLLM secondary tier on local drives: ``folders`` (one per drive), ``capacity_bytes``
    (required to create a store, not to reopen one), ``clear_on_mismatch`` (default false: a
    store written under another configuration raises; true: it starts empty, with a warning),
    ``fingerprint`` (a string added to the fingerprint, for what vLLM's config does not say),
    ``locality`` ("LOCAL", the default, or "REMOTE": the events' and vLLM's backpressure
    defaults'), ``shared`` (default true: one store per node for every instance that opens
    these folders; see the module comment), ``enable_kv_events`` (default false: emit a "stored" ``OffloadingEvent`` per
    successful store job, as vLLM's fs tier does, when vLLM's KV cache events are enabled),
    and any further ``deepio.kv.Store`` keyword."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        folders: Sequence[str] | str = (),
        capacity_bytes: int = 0,
        locality: str | None = "LOCAL",
        clear_on_mismatch: bool = False,
        fingerprint: str = "",
        enable_kv_events: bool = False,
        **store_options: Any,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        # vLLM's factory passes "locality" on (it also reads it for backpressure defaults);
        # local drives by default, as its fs tier takes it.
        self.locality = Locality(locality) if locality is not None else None
        if isinstance(folders, str):
            folders = [folders]
        if not folders:
            raise ValueError('DeepioTier: give the store\'s folders as "folders": [...] in the tier config')
        # A view, no copy: the store moves pages in place. vLLM's view has format "b" (int8).
        pool = np.asarray(primary_kv_view)
        if pool.ndim != 2 or pool.itemsize != 1 or not pool.flags.c_contiguous:
            raise ValueError(
                f"DeepioTier: the CPU tier should be (chunks, bytes) of bytes, got {pool.shape} {pool.dtype}"
            )
        pool = pool.view(np.uint8)
        self._pool = pool
        store_options.setdefault("shared", True)
        self._store = open_store(
            "DeepioTier",
            _WHERE,
            list(folders),
            capacity_bytes=int(capacity_bytes),
            page_bytes=int(pool.shape[1]),
            fingerprint=_fingerprint(offloading_spec, int(pool.shape[1]), str(fingerprint)),
            clear_on_mismatch=clear_setting(clear_on_mismatch, _WHERE),
            **store_options,
        )
        self._store.register(pool)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a job leaves _in_flight
        self._finished: collections.deque[JobResult] = collections.deque()
        self._in_flight: dict[int, Any] = {}  # job id -> store future
        self._storing: collections.Counter[bytes] = collections.Counter()
        # KV events, as vLLM's fs and obj tiers emit them: one "stored" OffloadingEvent per
        # successful store job (all its keys, those present already included), with this
        # tier's locality; only when the tier asks for them and vLLM's KV cache events are on.
        self._events: list[OffloadingEvent] | None = None
        if enable_kv_events:
            events_config = getattr(offloading_spec, "kv_events_config", None)
            if getattr(events_config, "enable_kv_cache_events", False):
                self._events = []
            else:
                logger.warning(
                    "enable_kv_events is set on secondary tier '%s' but KV cache events are "
                    "disabled globally; the tier will not emit events.",
                    tier_type,
                )

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        with self._lock:
            if self._storing[key]:
                return LookupResult.RETRY
        return LookupResult.HIT if self._store.contains([bytes(key)])[0] else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        # Chunks this tier already holds are not written again (the tier's duty, says
        # SecondaryTierManager.submit_store): keys are content hashes.
        keys = [bytes(k) for k in job_metadata.keys]
        slots = _slots(job_metadata)
        try:
            todo = [i for i, present in enumerate(self._store.contains(keys)) if not present]
        except Exception:
            todo = list(range(len(keys)))  # let the put report the failure
        if len(slots) == len(keys):  # else _submit reports the mismatch
            keys, slots = [keys[i] for i in todo], [slots[i] for i in todo]
        with self._lock:
            self._storing.update(keys)
        self._submit(job_metadata, keys, slots, self._store.put, store=True)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        self._submit(job_metadata, keys, _slots(job_metadata), self._store.get, store=False)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done = list(self._finished)
            self._finished.clear()
        return done

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The events of the store jobs finished since the last call (none unless enabled)."""
        if self._events is None:
            return []
        with self._lock:
            events, self._events = self._events, []
        return events

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._in_flight)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        # Waits for the callbacks, not only the futures: a future's waiters wake before its
        # callbacks run, and vLLM needs every result queued when this returns.
        with self._idle:
            self._idle.wait_for(lambda: not self._in_flight)

    def shutdown(self) -> None:
        self.drain_jobs()
        self._store.close()

    def stats(self) -> dict[str, Any]:
        return dict(self._store.stats())

    # ---- internals -----------------------------------------------------------------------

    def _submit(self, job: TransferJob, keys: list[bytes], slots: list[int], call: Any, store: bool) -> None:
        job_id = job.job_id
        original = list(job.keys)
        start = time.monotonic()
        nbytes = len(keys) * int(self._pool.shape[1])

        def finished(results: list[bool] | None, error: BaseException | None) -> None:
            ok = results is not None and len(results) == len(keys) and all(results)
            successful = None
            if not store and results is not None and not ok:
                successful = [k for k, r in zip(original, results, strict=False) if r]
            result = JobResult(
                job_id=job_id,
                success=ok,
                successful_keys=successful,
                transfer_time=time.monotonic() - start,
                transfer_bytes=nbytes if ok else None,
            )
            with self._lock:
                self._in_flight.pop(job_id, None)
                if store:
                    self._storing.subtract(keys)
                    for k in keys:
                        if self._storing[k] <= 0:
                            del self._storing[k]
                if store and ok and self._events is not None and original:
                    self._events.append(
                        OffloadingEvent(keys=original, medium=self.medium, removed=False, locality=self.locality)
                    )
                self._finished.append(result)
                self._idle.notify_all()

        try:
            if len(keys) != len(slots):
                raise ValueError(f"{len(keys)} keys but {len(slots)} chunk ids")
            if not keys:  # a store of chunks all present already
                finished([], None)
                return
            future = call(keys, slots)
        except Exception as e:
            finished(None, e)
            return
        with self._lock:
            self._in_flight[job_id] = future

        def on_done(f: Any) -> None:
            try:
                finished([bool(r) for r in f.result()], None)
            except Exception as e:
                finished(None, e)

        future.add_done_callback(on_done)


def _slots(job: TransferJob) -> list[int]:
    return [int(c) for c in np.asarray(job.chunk_ids).reshape(-1)]


_WHERE = 'its entry of "secondary_tiers" in --kv-transfer-config'


# OffloadingParallelConfig's fields that name the process, not the bytes: rank (0 on the
# scheduler side, where the tier lives) and the data-parallel replica's index and sizes.
_INSTANCE_FIELDS = ("rank", "data_parallel_index", "data_parallel_size", "data_parallel_rank_local")


def _as_dict(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def _fingerprint(spec: Any, chunk_bytes: int, user: str) -> str:
    """What a chunk's bytes mean, from the offloading spec's normalized config (vLLM's
    ``OffloadingConfig``; absent fields are left out) and the chunk's size: the same in every
    instance and data-parallel replica of one configuration, which share the store."""
    fields: dict[str, Any] = {"chunk_bytes": chunk_bytes}
    config = getattr(spec, "config", None)
    if config is not None:
        model = getattr(config, "model", None)
        if model is not None:
            fields["model"] = getattr(model, "name", None)
            fields["dtype"] = getattr(model, "dtype", None)
        if getattr(config, "cache", None) is not None:
            fields["cache"] = _as_dict(config.cache)
        parallel = _as_dict(getattr(config, "parallel", None))
        if isinstance(parallel, dict):
            # What a chunk's bytes depend on; not which instance or data-parallel replica
            # wrote it (they share the store: vLLM's fs tier keys its folders so too).
            fields["parallel"] = {k: v for k, v in parallel.items() if k not in _INSTANCE_FIELDS}
        elif parallel is not None:
            fields["parallel"] = parallel
        groups = getattr(config, "groups", None)
        if groups is not None:
            fields["groups"] = [
                [
                    getattr(g, "group_id", None),
                    getattr(g, "tokens_per_block", None),
                    getattr(g, "sliding_window_size_in_chunks", None),
                    len(getattr(g, "layer_names", ())),
                    digest(list(getattr(g, "layer_names", ()))),
                ]
                for g in groups
            ]
        for name in ("worker_kv_bytes_per_block", "kv_cache_layout", "replicated_layout", "canonical_layout"):
            if getattr(config, name, None) is not None:
                fields[name] = getattr(config, name)
    if user:
        fields["user"] = user
    return fingerprint("vllm", fields)
