"""The three backends on the node-shared store (docs/kv-sharing.md, "Sharing a store between
processes", and docs/kv-backends.md, "The engines' backends"), with N = 2 and 4 real processes,
each driven through its engine's own classes at the pinned versions (as test_kv_backends.py
drives one process):

- SGLang 0.5.23: the TP ranks of an MLA model (SGLang's ``MLATokenToKVPoolHost`` on the CPU,
  built from a CPU ``MLATokenToKVPool``) open one store; the rank SGLang's controller lets
  write (``HiCacheController.backup_skip``, i.e. ``is_storage_writer``) puts the pages through
  ``_page_set_zero_copy``, every rank gets them through ``_page_get_zero_copy``, bytes checked;
  the ranks' gets go through their read group (``group=``): each page read from the drives
  once, against once per rank with ``"read_group": false``; two servers share each other's
  prefixes; a non-MLA model's TP ranks keep their own pages
  (rank r of a second data-parallel group gets rank r's bytes, never another rank's).
- vLLM 0.33.0: N instances (each a scheduler with its own ``SharedOffloadRegion``, vLLM's CPU
  tier, and a ``DeepioTier`` built by ``SecondaryTierFactory``), as N data-parallel replicas of
  an MLA model under vLLM's replicated layout: one stores, every other looks up (HIT) and
  loads, bytes checked.
- LMCache 0.5.6: N LMCache servers, each with the adapter built by LMCache's registry from the
  ``--l2-adapter`` JSON: one stores, every other looks up and loads, bytes checked.

The processes are forked from this one once the engines are imported (an import is 8 s per
process here); each opens its own backend after the fork.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import traceback
import types
import uuid
from pathlib import Path

import pytest

import kv_engines
from conftest import needs
from deepio.kv._backend import group_supported
from test_kv_backends import (  # noqa: F401 (engines is a fixture)
    LM_PAGE,
    PAGE_TOKENS,
    _controller,
    _finished,
    _lmcache_adapter,
    _memory_obj,
    _object_key,
    _pages,
    _sglang_config,
    _until,
    engines,
)

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("engines")

TIMEOUT = 120.0


# ------------------------------------------------------------------------------ the processes


def _child(fn, rank: int, n: int, barrier, queue, args, kwargs) -> None:
    try:
        torch.set_num_threads(1)
        queue.put((rank, True, fn(rank, n, barrier, *args, **kwargs)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        queue.close()
        queue.join_thread()
        os._exit(0)


# What the processes import, imported here first (forked children then share it).
_MODULES = {
    "sglang": (
        "sglang.srt.managers.cache_controller",
        "sglang.srt.mem_cache.memory_pool",
        "sglang.srt.mem_cache.pool_host.mla",
        "sglang.srt.mem_cache.pool_host.mha",
        "sglang.srt.mem_cache.storage.backend_factory",
        "deepio.kv.sglang",
    ),
    "vllm": (
        "vllm.v1.kv_offload.base",
        "vllm.v1.kv_offload.config",
        "vllm.v1.kv_offload.cpu.shared_offload_region",
        "vllm.v1.kv_offload.tiering.base",
        "vllm.v1.kv_offload.tiering.factory",
        "deepio.kv.vllm",
    ),
    "lmcache": (
        "lmcache.v1.distributed.api",
        "lmcache.v1.distributed.l2_adapters.config",
        "lmcache.v1.distributed.l2_adapters.factory",
        "lmcache.v1.memory_management",
        "deepio.kv.lmcache",
    ),
}


def _run(fn, n: int, *args, **kwargs) -> list:
    """fn(rank, n, barrier, *args, **kwargs) in n forked processes at once; their results by rank. A
    process that raises fails the test with its traceback."""
    engine = fn.__name__.split("_")[1]
    for module in _MODULES[engine]:
        importlib.import_module(module)
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(n, timeout=TIMEOUT), ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, n, barrier, queue, args, kwargs)) for r in range(n)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in range(n):
            rank, ok, value = queue.get(timeout=TIMEOUT)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                barrier.abort()  # the others stop waiting for it
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    assert not errors, "\n".join(errors)
    return [results[r] for r in range(n)]


# ------------------------------------------------------------------------------------ SGLang

LAYERS = 4


def _mla_host_pool(seed: int):
    """SGLang's MLA host pool on the CPU, as its scheduler makes it (from a CPU
    MLATokenToKVPool's buffer info): 4 layers of kv_lora_rank 128 + rope 64, bf16, 16-token
    pages (24 KiB per page and layer piece in page_first), filled from `seed`."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    device = MLATokenToKVPool(
        512, PAGE_TOKENS, torch.bfloat16, 128, 64, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS
    )
    pool = MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        PAGE_TOKENS,
        "page_first",
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=LAYERS,
        target_layer_num=LAYERS,
    )
    gen = torch.Generator().manual_seed(seed)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=gen, dtype=torch.float32).to(pool.dtype))
    return pool


def _sglang_rank(
    rank: int, n: int, barrier, folders: list[Path], servers: int, mla: bool, keys: list[list[str]], **extra
):
    """One scheduler process: server `rank // tp` (a data-parallel group when not `mla`), TP rank
    `rank % tp`. The writers of server s put the pages of keys[s]; then every rank gets every
    server's pages. Returns what the test checks."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from test_kv_backends import _host_pool

    tp = n // servers
    server, tp_rank = divmod(rank, tp)
    # One server: its read group named by default (the schedulers' parent, here this test's
    # process); two: each named by "read_group" (as two servers' schedulers may share a parent).
    config = _sglang_config(folders, **({"read_group": f"server{server}"} if servers > 1 else {}), **extra)
    config.is_mla_model, config.tp_rank, config.tp_size = mla, tp_rank, tp
    if not mla:
        config.dp_rank = server  # DP-attention groups: TP rank r of each holds the same heads
    # MLA: the latent KV is the same bytes on every rank; otherwise each TP rank's differ.
    pool = _mla_host_pool(seed=1) if mla else _host_pool(seed=100 + tp_rank)
    per = len(keys[0])
    src = pool.alloc(servers * per * PAGE_TOKENS)  # the same rows in every process
    expected = _pages(pool, src)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    ctl = _controller(backend, pool)
    ctl.storage_config = config
    try:
        barrier.wait()
        writer = not HiCacheController.backup_skip.fget(ctl)  # SGLang's own rule (is_storage_writer)
        if writer:
            mine = src[server * per * PAGE_TOKENS : (server + 1) * per * PAGE_TOKENS]
            assert HiCacheController._page_set_zero_copy(ctl, keys[server], mine) is True
        barrier.wait()
        got = []
        for s in range(servers):
            assert backend.batch_exists(keys[s]) == per, (s, backend.batch_exists(keys[s]))
            dst = pool.alloc(per * PAGE_TOKENS)
            op = types.SimpleNamespace(request_id=f"r{rank}-{s}")
            assert HiCacheController._page_get_zero_copy(ctl, op, keys[s], dst) == per
            got.append(
                all(
                    torch.equal(w, g) for w, g in zip(expected[s * per : (s + 1) * per], _pages(pool, dst), strict=True)
                )
            )
            pool.free(dst)
        barrier.wait()  # every rank's gets are done: the group's counters are final
        stats = backend.store_stats()["kv"]
        result = {
            "group_reads": (stats.get("group_pages_read"), stats.get("group_pages_shared")),
            "bytes_read": stats["bytes_read"],
            "page_bytes": backend._kv_page_bytes,
            "writer": writer,
            "bytes_right": got,
            "role": stats["shared_role"],
            "pages": stats["pages"],
            "folder": backend._folders[0],
            "fingerprint": backend._stores["kv"].fingerprint,
            "group": backend._group,
        }
        barrier.wait()  # nobody closes while another still moves pages
        return result
    finally:
        backend.close()


def _keys(servers: int, per: int) -> list[list[str]]:
    return [[uuid.uuid4().hex for _ in range(per)] for _ in range(servers)]


@needs("sglang")
@pytest.mark.parametrize("n", [2, 4])
def test_sglang_mla_tp_ranks_share_one_store_rank0_writes_every_rank_reads(tmp_dir, n):
    folders = [tmp_dir / "a", tmp_dir / "b"]
    results = _run(_sglang_rank, n, folders, 1, True, _keys(1, 8))
    assert [r["writer"] for r in results] == [True] + [False] * (n - 1)  # as SGLang writes MLA
    assert all(r["bytes_right"] == [True] for r in results)
    assert sorted(r["role"] for r in results) == ["client"] * (n - 1) + ["owner"]
    assert {r["pages"] for r in results} == {8}  # written once, for every rank
    assert {r["folder"] for r in results} == {str(tmp_dir / "a" / "test-model_mla")}
    assert len({r["fingerprint"] for r in results}) == 1
    name = f"sglang:test/model:ppid{os.getpid()}:dp0:pp0:cp0:dcp0"
    assert [r["group"] for r in results] == [(name, i, n) for i in range(n)]
    if group_supported():  # the ranks' gets went through their group: each page read about once
        read, shared = results[0]["group_reads"]
        assert read + shared == n * 8 and read < n * 8, (read, shared)


@needs("sglang")
def test_sglang_mla_read_group_reads_each_page_once_without_it_each_rank_reads_all(tmp_dir):
    """The bytes the store read from the drives for 2 MLA TP ranks getting 8 pages: with the
    read group (the default) each page once (where the store takes groups), with
    "read_group": false every rank its own (2x)."""
    on = _run(_sglang_rank, 2, [tmp_dir / "on"], 1, True, _keys(1, 8))
    off = _run(_sglang_rank, 2, [tmp_dir / "off"], 1, True, _keys(1, 8), read_group=False)
    page = on[0]["page_bytes"]
    assert all(r["bytes_right"] == [True] for r in on + off)
    assert all(r["group"] is None for r in off) and off[0]["bytes_read"] == 2 * 8 * page
    if group_supported():
        assert on[0]["bytes_read"] < 2 * 8 * page, on[0]["bytes_read"] // page  # 8 when both came in time


@needs("sglang")
def test_sglang_two_mla_servers_share_each_others_prefixes(tmp_dir):
    """Two SGLang servers of one MLA model at TP 2 (4 processes): each server's rank 0 writes
    its prefix; every rank of both servers gets both."""
    results = _run(_sglang_rank, 4, [tmp_dir], 2, True, _keys(2, 6))
    assert [r["writer"] for r in results] == [True, False, True, False]
    assert all(r["bytes_right"] == [True, True] for r in results)
    assert {r["pages"] for r in results} == {12} and len({r["folder"] for r in results}) == 1
    assert [r["group"][0].split(":")[2] for r in results] == ["server0", "server0", "server1", "server1"]
    if group_supported():  # each server's group reads both prefixes for its two ranks
        read, shared = results[0]["group_reads"]
        assert read + shared == 2 * 2 * 12 and read < 2 * 2 * 12, (read, shared)


@needs("sglang")
def test_sglang_non_mla_tp_ranks_keep_their_own_pages_shared_across_dp_groups(tmp_dir):
    """A non-MLA model at TP 2 in two DP-attention groups (4 processes): each TP rank's pages
    are its own bytes under the same keys; TP rank r of the second group gets rank r's pages
    (written by the first group's rank r), never rank 1-r's."""
    results = _run(_sglang_rank, 4, [tmp_dir], 2, False, _keys(2, 4))
    assert all(r["writer"] for r in results)  # SGLang writes non-MLA pages from every rank
    assert all(r["bytes_right"] == [True, True] for r in results)
    folders = [Path(r["folder"]).name for r in results]
    assert folders == ["test-model_tp0of2", "test-model_tp1of2"] * 2
    assert [r["pages"] for r in results] == [8] * 4 and all(r["group"] is None for r in results)


# -------------------------------------------------------------------------------------- vLLM

VLLM_CHUNK = 16 << 10


def _vllm_spec(dp_index: int, tp: int):
    """An offloading spec as the tier reads it: an MLA model under vLLM's replicated layout
    (one copy of a chunk for every TP worker), data-parallel replica `dp_index`."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    return types.SimpleNamespace(
        config=OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
            worker_kv_bytes_per_block=VLLM_CHUNK,
            enable_kv_cache_events=False,
            extra_config={},
            engine_id=f"e_dp{dp_index}",
            model=OffloadingModelConfig(name="deepseek", dtype="bfloat16"),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=0,
                world_size=tp,
                tp_size=tp,
                pp_size=1,
                pcp_size=1,
                dcp_size=1,
                data_parallel_index=dp_index,
                data_parallel_size=4,
                data_parallel_rank_local=None,
                is_parallelism_agnostic=False,
            ),
            replicated_layout=True,
        )
    )


def _vllm_rank(rank: int, n: int, barrier, folders: list[Path], keys: list[bytes]):
    """One vLLM instance (data-parallel replica `rank`): its own CPU tier and DeepioTier. Rank 0
    stores the chunks of `keys`; every rank looks them up and loads them into other rows."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    config = {"type": "DeepioTier", "module_path": "deepio.kv.vllm", "folders": [str(f) for f in folders]}
    config["capacity_bytes"] = 16 << 20
    offload_keys = [make_offload_key(k, 0) for k in keys]
    k = len(keys)
    with kv_engines.vllm_cpu_tier(2 * k, VLLM_CHUNK, f"deepio-shared-{rank}") as view:
        rows = np.asarray(view).view(np.uint8)
        pattern = np.random.default_rng(5).integers(0, 256, (k, VLLM_CHUNK), dtype=np.uint8)
        tier = SecondaryTierFactory.create_secondary_tier(config, view, _vllm_spec(rank, 2))
        try:
            ctx = ReqContext(req_id=f"r{rank}")
            barrier.wait()
            if rank == 0:
                rows[:k] = pattern
                job = TransferJob(
                    job_id=1, keys=offload_keys, chunk_ids=np.arange(k), is_promotion=False, req_context=ctx
                )
                tier.submit_store(job)
                assert _finished(tier, {1})[1].success is True
            barrier.wait()
            hits = [tier.lookup(key, ctx) == LookupResult.HIT for key in offload_keys]
            job = TransferJob(
                job_id=2, keys=offload_keys, chunk_ids=np.arange(k, 2 * k), is_promotion=True, req_context=ctx
            )
            tier.submit_load(job)
            loaded = _finished(tier, {2})[2].success
            result = {
                "hits": hits,
                "loaded": loaded,
                "bytes_right": bool(np.array_equal(rows[k:], pattern)),
                "role": tier.stats()["shared_role"],
                "pages": tier.stats()["pages"],
                "fingerprint": tier._store.fingerprint,
            }
            barrier.wait()
            return result
        finally:
            tier.shutdown()


@needs("vllm")
@pytest.mark.parametrize("n", [2, 4])
def test_vllm_instances_share_one_store(tmp_dir, n):
    keys = [bytes([i]) * 16 for i in range(6)]
    results = _run(_vllm_rank, n, [tmp_dir / "a", tmp_dir / "b"], keys)
    assert all(r["hits"] == [True] * 6 and r["loaded"] and r["bytes_right"] for r in results), results
    assert sorted(r["role"] for r in results) == ["client"] * (n - 1) + ["owner"]
    assert {r["pages"] for r in results} == {6}
    assert len({r["fingerprint"] for r in results}) == 1  # not the replica's index


# ------------------------------------------------------------------------------------ LMCache


def _lmcache_rank(rank: int, n: int, barrier, folders: list[Path], count: int):
    """One LMCache server with the deepio adapter: rank 0 stores `count` objects; every rank
    looks them up and loads them."""
    adapter = _lmcache_adapter(folders)
    try:
        gen = torch.Generator().manual_seed(3)
        src = [torch.randint(0, 256, (LM_PAGE,), generator=gen, dtype=torch.uint8) for _ in range(count)]
        keys = [_object_key(i) for i in range(count)]
        barrier.wait()
        if rank == 0:
            task = adapter.submit_store_task(keys, [_memory_obj(t) for t in src])
            assert _until(adapter.get_store_event_fd(), adapter.pop_completed_store_tasks)[task] == count * LM_PAGE
        barrier.wait()
        task = adapter.submit_lookup_and_lock_task(keys, {})
        bitmap = _until(adapter.get_lookup_and_lock_event_fd(), lambda: adapter.query_lookup_and_lock_result(task))
        found = [bitmap.test(i) for i in range(count)]
        adapter.submit_unlock(keys)
        dst = [torch.zeros(LM_PAGE, dtype=torch.uint8) for _ in keys]
        task = adapter.submit_load_task(keys, [_memory_obj(t) for t in dst])
        bitmap = _until(adapter.get_load_event_fd(), lambda: adapter.query_load_result(task))
        result = {
            "found": found,
            "loaded": [bitmap.test(i) for i in range(count)],
            "bytes_right": all(torch.equal(a, b) for a, b in zip(src, dst, strict=True)),
        }
        barrier.wait()
        return result
    finally:
        adapter.close()


@needs("lmcache")
@pytest.mark.parametrize("n", [2, 4])
def test_lmcache_servers_share_one_store(tmp_dir, n):
    results = _run(_lmcache_rank, n, [tmp_dir / "a", tmp_dir / "b"], 5)
    assert all(r["found"] == [True] * 5 and r["loaded"] == [True] * 5 and r["bytes_right"] for r in results), results


@needs("sglang")
def test_sglang_read_group_names_the_server_replica_and_dcp_shard(tmp_dir, monkeypatch):
    """Who loads the same pages at once: an MLA model's TP ranks of one server, replica, DP
    group and DCP shard; nobody else (a non-MLA model, TP 1, "read_group": false)."""
    import sglang.srt.runtime_context as runtime

    from deepio.kv.sglang import _read_group

    config = _sglang_config([tmp_dir])
    config.is_mla_model, config.tp_rank, config.tp_size = True, 3, 4
    base = f"sglang:test/model:ppid{os.getppid()}:dp0:pp0:cp0:dcp0"
    assert _read_group(config, None) == (base, 3, 4)
    assert _read_group(config, "s1") == ("sglang:test/model:s1:dp0:pp0:cp0:dcp0", 3, 4)
    assert _read_group(config, False) is None and _read_group(config, "false") is None
    monkeypatch.setattr(runtime, "get_parallel", lambda: types.SimpleNamespace(dp_rank=1))
    assert _read_group(config, None) == (base.replace(":dp0", ":replica1:dp0"), 3, 4)
    config.dcp_size, config.dcp_rank = 2, 1  # TP 4 in DCP shards of 2: ranks 1 and 3 share shard 1
    assert _read_group(config, "s")[1:] == (1, 2) and _read_group(config, "s")[0].endswith(":dcp1")
    config.dcp_size, config.dcp_rank = 1, 0
    config.tp_size, config.tp_rank = 1, 0
    assert _read_group(config, None) is None
    config.tp_size, config.is_mla_model = 4, False
    assert _read_group(config, None) is None
