"""deepio.kv.Store as SGLang's HiCache storage backend (the L3 tier below host memory).

Load it with SGLang's dynamic backend (docs/kv-backends.md has the whole command line)::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name": "deepio", "module_path": "deepio.kv.sglang",
        "class_name": "DeepioHiCacheStorage", "interface_v1": 1,
        "folders": ["/mnt/nvme0/kv", "/mnt/nvme1/kv"], "capacity_bytes": 68719476736}'

``interface_v1: 1`` makes SGLang's cache controller call the zero-copy ``batch_get_v1`` /
``batch_set_v1``; without it the controller takes its generic path (``batch_get`` into a
staging page, then a copy into the host pool), which this class also serves.

Lifecycle: SGLang's ``StorageBackendFactory`` constructs ``cls(storage_config, kwargs)``, then
calls ``register_mem_pool_host(host_pool)``; only then is a page's size known, so the store
of the KV pool opens there, in ``<folder>/<store>/kv`` for each folder. Each further pool of
the v2 interface (``register_mem_host_pool_v2``: Mamba state, SWA, indexer, ...) gets its own
store in ``<folder>/<store>/<pool name>``.

Sharing (docs/kv-backends.md, "SGLang"): every store is opened with ``shared=True``
(``"shared": false`` in the extra config opts out), one per node for the processes whose pages
are the same bytes. ``<store>`` names the model and the ranks a page's bytes depend on: an MLA
model's (``<model>_mla``, per pipeline stage, context rank and DCP shard) are the same on every
TP rank and every data-parallel (DP-attention) rank, so all of them, and every other SGLang
server of that model on the node, open one store: SGLang's cache controller writes from one
rank (``is_storage_writer``: TP rank 0, or one per DCP shard) and every rank reads. Another
model's pages differ by TP rank (``<model>_tp<rank>of<size>``): TP rank r of every DP group and
every server shares the store of rank r. The TP ranks of an MLA model load the same pages at
once; they are given to the store as one read group (``_read_group``) so that, where the store
splits reads, each page is read from the drives once per node.

Memory: in the process that owns the shared store (the first to open it) a page moves
straight between the drive and the host pool, no staging copy; in the others it goes through
their staging region (one memory copy; docs/kv-sharing.md, "Sharing a store between processes"). The
host pool's ``get_page_buffer_meta(indices)`` gives, per page, the addresses and sizes of its
pieces (page_first: the K part and the V part; layer_first: one K and one V piece per layer),
which become that key's segments of ``Store.put_segments`` / ``Store.get_segments``. The
calls block until the batch is done, as SGLang's storage threads expect (they run off the
scheduler thread); the host pool's pages stay alive and pinned by SGLang meanwhile.

Results: one bool per key, True where the page was stored durably (a put) or found whole
with a matching CRC-32C (a get). A put skips keys already present (HiCache keys are hashes
of the page's tokens and its prefix: the same key is the same content), as SGLang's own file
and Mooncake backends do. Errors from the store (a folder that failed, a bad argument) are
per-key False for the batch calls, logged once per call with the reason; construction errors
(no folder) raise.

Thread safety: SGLang calls a backend from its prefetch and backup threads at once; the Store
is thread-safe, and the only mutable state here (the stores of v2 pools, the per-call metrics
of ``get_stats``) is guarded by a lock.

Metrics: ``get_stats()`` is SGLang's storage-backend hook (``--enable-storage-metrics``): the
pages and GB/s of each zero-copy call since the last one, as SGLang's ``StorageMetrics``;
``store_stats()`` gives each pool's ``Store.stats()``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Literal

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from deepio.kv import Store
from deepio.kv._backend import bool_setting, clear_setting, digest, fingerprint, open_store

logger = logging.getLogger(__name__)

Segments = list[tuple[int, int]]
Op = Literal["put", "get"]


def _store_folder(config: HiCacheStorageConfig) -> str:
    """The subfolder of the store this process shares with every process whose pages are the
    same bytes (see the module comment): an MLA model's pages are the same on every TP rank
    and every data-parallel rank (one store per DCP shard), another model's differ by TP rank."""
    model = (config.model_name or "model").replace("/", "-")
    if config.is_mla_model:
        name = f"{model}_mla"
        if config.dcp_size > 1:
            name += f"_dcp{config.dcp_rank}of{config.dcp_size}_tp{config.tp_size}"
    else:
        name = f"{model}_tp{config.tp_rank}of{config.tp_size}"
    if config.pp_size > 1:
        name += f"_pp{config.pp_rank}of{config.pp_size}"
    if config.attn_cp_size > 1:
        name += f"_cp{config.attn_cp_rank}of{config.attn_cp_size}"
    return name


def _read_group(config: HiCacheStorageConfig, setting: Any) -> tuple[str, int, int] | None:
    """The ranks that load the same pages at once, as ``(name, rank, size)`` for the shared
    store's split reads: an MLA model's TP ranks of one DCP shard in one data-parallel group of
    one SGLang server. The server is named by ``"read_group"`` of the extra config, else by the
    parent process of the scheduler processes (the server's launcher spawns every TP rank on
    the node) and the data-parallel replica; ``"read_group": false`` turns split reads off.
    None where there is no group."""
    if not config.is_mla_model or setting is False or str(setting).lower() in ("false", "0"):
        return None
    size = config.tp_size // max(config.dcp_size, 1)
    if size <= 1:
        return None
    server = str(setting) if setting not in (None, True) else f"ppid{os.getppid()}"
    replica = _replica()  # data-parallel replicas (no DP attention) share their launcher
    if replica is not None:
        server += f":replica{replica}"
    name = f"sglang:{config.model_name}:{server}:dp{config.dp_rank}:pp{config.pp_rank}:cp{config.attn_cp_rank}"
    return f"{name}:dcp{config.dcp_rank}", config.tp_rank // max(config.dcp_size, 1), size


def _replica() -> int | None:
    """This process's data-parallel replica (SGLang's ``get_parallel().dp_rank``, set by its
    data-parallel controller), or None (no controller, or no SGLang runtime context)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        replica = get_parallel().dp_rank
    except Exception:
        return None
    return replica if isinstance(replica, int) and not isinstance(replica, bool) else None


class DeepioHiCacheStorage(HiCacheStorage):
    """A ``HiCacheStorage`` whose pages live in a ``deepio.kv.Store`` on local drives.

    ``storage_config.extra_config`` (the JSON of ``--hicache-storage-backend-extra-config``):
    ``folders`` (list of paths, one per drive; or the environment variable
    ``DEEPIO_KV_FOLDERS``, colon-separated), ``capacity_bytes`` (over all folders, for the KV
    pool; required to create a store, not to reopen one), ``pool_capacity_bytes`` (a dict
    pool name -> bytes for v2 pools; default: room for as many pages as the KV pool),
    ``clear_on_mismatch`` (default false: a store written under another configuration raises;
    true: its pages are dropped and it starts empty, with a warning) and ``fingerprint`` (a
    string added to the store's fingerprint, for what SGLang's config does not say, e.g. the
    weights' revision), ``read_group`` (an MLA model's TP ranks read each page once per node
    together: the name of this server, default the scheduler processes' parent; false: off),
    ``shared`` (default true: one store per node for the processes whose pages are the same
    bytes; false: this process's own store, whose folders no other process may open
    meanwhile, and no read group).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        extra = dict(storage_config.extra_config or {})
        folders = extra.get("folders")
        if folders is None and os.environ.get("DEEPIO_KV_FOLDERS"):
            folders = os.environ["DEEPIO_KV_FOLDERS"].split(":")
        if isinstance(folders, str):
            folders = [folders]
        if not folders:
            raise ValueError(
                "deepio HiCache backend: give the store's folders as "
                '"folders": [...] in --hicache-storage-backend-extra-config '
                "or as DEEPIO_KV_FOLDERS"
            )
        self.storage_config = storage_config
        self._folders = [os.path.join(str(f), _store_folder(storage_config)) for f in folders]
        self._shared = bool_setting(extra.get("shared", True), "shared", _WHERE)
        self._group = _read_group(storage_config, extra.get("read_group")) if self._shared else None
        self._capacity_bytes = int(extra.get("capacity_bytes", 0))
        self._pool_capacity = {str(k): int(v) for k, v in dict(extra.get("pool_capacity_bytes", {})).items()}
        self._clear_on_mismatch = clear_setting(extra.get("clear_on_mismatch", False), _WHERE)
        self._user_fingerprint = str(extra.get("fingerprint", ""))
        self._lock = threading.Lock()
        self._stores: dict[str, Store] = {}
        self._pools: dict[str, Any] = {}
        self._kv_page_bytes = 0
        # Per zero-copy call since the last get_stats(): (pages moved, GB/s) by op; under _lock.
        self._metrics: dict[str, tuple[list[int], list[float]]] = {"get": ([], []), "put": ([], [])}

    # ---- registration -------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._open(str(PoolName.KV), mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._open(str(host_pool_name), host_pool)

    def _open(self, name: str, pool: Any) -> Store:
        one_page = torch.arange(_page_size(pool), dtype=torch.int64)
        pieces = [nbytes for _, nbytes in _page_segments(pool, one_page, 1)[0]]
        page_bytes = sum(pieces)
        with self._lock:
            store = self._stores.get(name)
            if store is not None and self._pools.get(name) is pool:
                return store
            folders = [os.path.join(f, name) for f in self._folders]
            setting = '"capacity_bytes"'
            if name == str(PoolName.KV):
                self._kv_page_bytes = page_bytes
                capacity = self._capacity_bytes
            else:
                setting = f'"pool_capacity_bytes": {{"{name}": ...}} (or "capacity_bytes")'
                capacity = self._pool_capacity.get(name, 0)
                if not capacity and self._capacity_bytes and self._kv_page_bytes:
                    capacity = max(self._capacity_bytes * page_bytes // self._kv_page_bytes, page_bytes)
            if store is None:
                store = open_store(
                    "deepio HiCache backend",
                    _WHERE,
                    folders,
                    capacity_bytes=capacity,
                    page_bytes=page_bytes,
                    fingerprint=_fingerprint(self.storage_config, name, pool, pieces, self._user_fingerprint),
                    clear_on_mismatch=self._clear_on_mismatch,
                    capacity_setting=setting,
                    shared=self._shared,
                    group=None if self._group is None else (f"{self._group[0]}:{name}", *self._group[1:]),
                )
                self._stores[name] = store
            self._pools[name] = pool
            return store

    def _store_if_any(self, name: str) -> Store | None:
        with self._lock:
            return self._stores.get(name)

    def _store(self, name: str) -> Store:
        store = self._store_if_any(name)
        if store is None:
            raise RuntimeError(f"deepio HiCache backend: no host pool registered for pool {name!r}")
        return store

    # ---- zero-copy batch interface (v1) ---------------------------------------------------

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._move("put", str(PoolName.KV), self.mem_pool_host, keys, host_indices)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._move("get", str(PoolName.KV), self.mem_pool_host, keys, host_indices)

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        if not keys:
            return 0
        store = self._store_if_any(str(PoolName.KV))  # none registered yet: nothing stored (as HiCacheFile)
        return int(store.exists(list(keys))) if store is not None else 0

    def _move(self, op: Op, name: str, pool: Any, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        """The one body of the zero-copy calls, v1 and v2: ``op`` ("put" or "get") of the pages
        at ``host_indices`` of ``pool`` under ``keys``, in the store of pool ``name``."""
        if not keys:
            return []
        try:
            store = self._store(name)
            segments = _page_segments(pool, host_indices, len(keys))
            start = time.monotonic()
            if op == "put":
                done = _put_absent(store, keys, segments)
            else:
                done = [bool(r) for r in store.get_segments(list(keys), segments).result()]
            self._record(op, done, segments, time.monotonic() - start)
            return done
        except Exception as e:  # the controller expects per-key results, not exceptions
            logger.error("deepio HiCache backend: %s of %d pages of pool %s failed: %s", op, len(keys), name, e)
            return [False] * len(keys)

    # ---- multi-pool interface (v2) -------------------------------------------------------

    def _transfer_pool(self, transfer: PoolTransfer) -> Any:
        registered = getattr(self, "registered_pools", {})
        pool = registered.get(transfer.name)
        if pool is None and str(transfer.name) == str(PoolName.KV):
            pool = self.mem_pool_host
        return pool

    def batch_set_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        return self._move_v2("put", transfers)

    def batch_get_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        return self._move_v2("get", transfers)

    def _move_v2(self, op: Op, transfers: list[PoolTransfer]) -> dict[str, list[bool]]:
        return {
            t.name: self._move(op, str(t.name), self._transfer_pool(t), list(t.keys or []), t.host_indices)
            for t in transfers
        }

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """SGLang's own semantics (those of its HiCacheFile): the usable prefix is the longest
        run of KV pages that every extra pool also covers under its hit policy (ALL_PAGES:
        each page of the prefix; TRAILING_PAGES: the last len(transfer.keys) pages)."""
        kv_pages = self.batch_exists(keys)
        hits: dict[str, int] = {str(PoolName.KV): kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            name = str(transfer.name)
            store = self._store_if_any(name)  # a pool never registered holds no page (as HiCacheFile)
            present = store.contains(list(keys[:kv_pages])) if kv_pages and store is not None else [False] * kv_pages
            if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = present.index(False) if False in present else kv_pages
                pool_restorable = set(range(1, boundary + 1))
            elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                pool_restorable = {n for n in range(1, kv_pages + 1) if all(present[max(0, n - trailing) : n])}
                boundary = max(pool_restorable, default=0)
            else:
                raise ValueError(f"deepio HiCache backend: unsupported pool hit policy {transfer.hit_policy}")
            if boundary:
                hits[name] = boundary
            restorable &= pool_restorable
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)

    # ---- generic (copying) interface: the controller's path without "interface_v1" -------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        if not keys:
            return []
        targets = list(target_locations)
        results = (
            self._store(str(PoolName.KV)).get_segments(list(keys), [_tensor_segments(t) for t in targets]).result()
        )
        return [t if ok else None for t, ok in zip(targets, results, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        if not keys:
            return True
        pages = [v.contiguous() for v in values]  # kept alive until the put is done
        return all(_put_absent(self._store(str(PoolName.KV)), keys, [_tensor_segments(p) for p in pages]))

    def exists(self, key: str) -> bool:
        return bool(self._store(str(PoolName.KV)).contains([key])[0])

    # ---- the rest ------------------------------------------------------------------------

    def clear(self) -> bool:
        """Removes every page of this process's stores (``Store.clear``, durable when it
        returns), for every process that shares them. SGLang calls it for its
        ``/clear_hicache_storage_backend`` endpoint, e.g. after new weights, when the stored
        pages must not be served again."""
        with self._lock:
            stores = list(self._stores.values())
        removed = sum(store.clear() for store in stores)
        logger.info("deepio HiCache backend: cleared %d pages", removed)
        return True

    def _record(self, op: Op, done: list[bool], segments: list[Segments], seconds: float) -> None:
        """One zero-copy call's pages and GB/s (bytes of the pages moved over the call's wall
        time), for get_stats(), as SGLang's HF3FS backend keeps them."""
        pages = sum(done)
        if not pages:
            return
        nbytes = sum(n for ok, seg in zip(done, segments, strict=True) if ok for _, n in seg)
        gbps = nbytes / (1 << 30) / seconds if seconds > 0 else 0.0
        with self._lock:
            counts, rates = self._metrics[op]
            counts.append(pages)
            rates.append(gbps)

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` (its ``--enable-storage-metrics`` histograms): per call
        since the last get_stats(), the pages loaded (prefetch) and stored (backup) and the
        GB/s of each, then reset. The store's own counters are in store_stats()."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._lock:
            (get_pages, get_rates), (put_pages, put_rates) = self._metrics["get"], self._metrics["put"]
            self._metrics = {"get": ([], []), "put": ([], [])}
        return StorageMetrics(
            prefetch_pgs=get_pages, backup_pgs=put_pages, prefetch_bandwidth=get_rates, backup_bandwidth=put_rates
        )

    def store_stats(self) -> dict[str, Any]:
        """Each pool's ``Store.stats()``, by pool name."""
        with self._lock:
            stores = dict(self._stores)
        return {name: store.stats() for name, store in stores.items()}

    def close(self) -> None:
        with self._lock:
            stores, self._stores = self._stores, {}
        for store in stores.values():
            store.close()


_WHERE = "--hicache-storage-backend-extra-config"

# The host pool's attributes that say what its pages' bytes are (those a pool class has).
_POOL_FIELDS = (
    "layout",
    "dtype",
    "page_size",
    "head_num",
    "head_dim",
    "layer_num",
    "start_layer",
    "end_layer",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "size_per_token",
    "dcp_size",
    "dcp_rank",
    "storage_format_tag",
    "stores_page_envelope",
)


def _fingerprint(config: HiCacheStorageConfig, name: str, pool: Any, pieces: list[int], user: str) -> str:
    """What the pages of pool ``name`` mean: the model and the ranks its pages' bytes depend on
    (SGLang's storage config: an MLA page is the same on every TP and data-parallel rank, a
    page of another model differs by TP rank; none of them by data-parallel rank), the host
    pool's class and geometry, and the sizes of a page's pieces in the order they are stored
    (the byte layout on the drive). Every process that shares the store has the same one."""
    fields: dict[str, Any] = {
        "pool": name,
        "model": config.model_name,
        "pp": [config.pp_rank, config.pp_size],
        "cp": [config.attn_cp_rank, config.attn_cp_size],
        "mla": config.is_mla_model,
        "page_first": config.is_page_first_layout,
        "host_pool": type(pool).__name__,
        "pieces": pieces if len(pieces) <= 64 else [len(pieces), digest(pieces)],
    }
    if not config.is_mla_model:
        fields["tp"] = [config.tp_rank, config.tp_size]
    elif config.dcp_size > 1:  # a DCP shard's bytes depend on the TP size (as HiCacheFile keys them)
        fields["tp_size"] = config.tp_size
    for attr in _POOL_FIELDS:
        value = getattr(pool, attr, None)
        if value is not None:
            fields[attr] = value
    if user:
        fields["user"] = user
    return fingerprint("sglang", fields)


def _page_size(pool: Any) -> int:
    return int(getattr(pool, "page_size", 1) or 1)


def _page_segments(pool: Any, host_indices: torch.Tensor, pages: int) -> list[Segments]:
    """Per page, the (address, nbytes) pieces of the host pool that hold it, in the order of
    ``get_page_buffer_meta`` (which defines the page's byte layout on the drive). Raises
    ValueError where the indices or the pool's pieces do not make ``pages`` whole pages."""
    want = pages * _page_size(pool)
    if host_indices is None or host_indices.numel() != want:
        got = None if host_indices is None else host_indices.numel()
        raise ValueError(f"{pages} pages need {want} host indices, got {got}")
    ptrs, sizes = pool.get_page_buffer_meta(host_indices.cpu())
    if pages == 0 or len(ptrs) % pages or len(ptrs) != len(sizes):
        raise ValueError(f"host pool gave {len(ptrs)} pieces for {pages} pages")
    per = len(ptrs) // pages
    return [[(int(ptrs[j]), int(sizes[j])) for j in range(i * per, (i + 1) * per)] for i in range(pages)]


def _put_absent(store: Store, keys: list[str], segments: list[Segments]) -> list[bool]:
    """Puts the pages whose keys the store lacks (a HiCache key names the page's content: a key
    present is that page already). Per key: True where the page is in the store now."""
    results = [True] * len(keys)
    todo = [i for i, present in enumerate(store.contains(list(keys))) if not present]
    if todo:
        done = store.put_segments([keys[i] for i in todo], [segments[i] for i in todo]).result()
        for i, r in zip(todo, done, strict=True):
            results[i] = bool(r)
    return results


def _tensor_segments(tensor: torch.Tensor) -> Segments:
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError("deepio HiCache backend: pages must be contiguous CPU tensors")
    return [(int(tensor.data_ptr()), int(tensor.numel() * tensor.element_size()))]
