"""deepio.kv's three backends, each driven end to end through its engine's own interface code
at the pinned versions of scripts/setup-kv-engines.sh (docs/kv-backends.md, "Tested versions"):

- SGLang 0.5.23: the backend is built by SGLang's ``StorageBackendFactory`` from the
  ``dynamic`` config (as ``--hicache-storage-backend dynamic`` does), over a real CPU
  ``MHATokenToKVPoolHost`` (built from a real CPU ``MHATokenToKVPool``), and driven through the
  cache controller's own page functions (``HiCacheController._page_set_zero_copy`` and friends,
  called with the few attributes they read), beside SGLang's shipped ``HiCacheFile``.
- LMCache 0.5.6: the ``--l2-adapter`` JSON is parsed by LMCache's argument parser and the
  adapter built by its registry (``native_plugin`` -> its ``NativeConnectorL2Adapter`` around
  ``DeepioL2Connector``); stores, lookups and loads of real ``TensorMemoryObj`` through its
  ``L2AdapterInterface``, waiting on its eventfds, bitmaps checked; and the native-plugin
  protocol itself (eventfd, drain_completions).
- vLLM 0.33.0: the tier is built by vLLM's ``SecondaryTierFactory`` from an out-of-tree tier
  config over the memoryview of a real ``SharedOffloadRegion`` (vLLM's CPU tier memory), and
  driven through ``submit_store``/``submit_load``/``lookup``/``get_finished_jobs``.

Each engine is skipped, with the reason, where it is not installed; DEEPIO_REQUIRE naming it
(scripts/test.sh does) turns that into a failure.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import select
import sys
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import kv_engines
from conftest import needs

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

PAGE_TOKENS = 16  # SGLang pages of 16 tokens: 2 x 4 layers x 16 x 2 heads x 64 x fp16 = 32 KiB


@pytest.fixture(scope="module")
def engines() -> Iterator[None]:
    """The engines' folder on sys.path for this file's tests only (kv_engines.py).

    The engines' imports (SGLang's host pool pulls in transformers, torch._inductor and vLLM)
    leave about 5,500 modules and millions of long-lived objects. Automatic collection is off
    while this file runs: each full collection during those imports walks them all (2 s of
    the file's 10 here). They stay loaded in this pytest worker after the file (modules do not
    unload), so at the end they are collected once and frozen (gc.freeze): the later files of
    the worker then collect, gc.collect() included, over their own objects, not the engines'
    (test_nothing_lost.py's three gc.collect() calls took 2.1 s after this file unfrozen, 0.4
    s alone). They are unfrozen at exit, for the interpreter's last collection (which also
    lets the extension modules' leak checks, triton's nanobind one, see them freed)."""
    added = str(kv_engines.folder()) not in sys.path
    kv_engines.activate()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        if added and str(kv_engines.folder()) in sys.path:
            sys.path.remove(str(kv_engines.folder()))
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)


def _wait_readable(fd: int, timeout: float = 10.0) -> None:
    r, _, _ = select.select([fd], [], [], timeout)
    assert r, f"fd {fd} not readable within {timeout}s"


# ---------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------


def _sglang_config(folders: list[Path] | None, *, v1: bool = True, file_path: Path | None = None, **extra):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    extra_config: dict = dict(extra)
    if folders is not None:
        extra_config.update(
            backend_name="deepio",
            module_path="deepio.kv.sglang",
            class_name="DeepioHiCacheStorage",
            folders=[str(f) for f in folders],
            capacity_bytes=16 << 20,
        )
        if v1:
            extra_config["interface_v1"] = 1
    if file_path is not None:
        extra_config["file_storage_path"] = str(file_path)
    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="test/model",
        extra_config=extra_config,
    )


def _host_pool(layout: str = "page_first", dtype=None, heads: int = 2, head_dim: int = 64, tokens: int = 512, seed=7):
    """SGLang's MHA host pool on the CPU, made the way its scheduler makes it: from the buffer
    info of a device pool (here a CPU MHATokenToKVPool), 4 layers, `heads` heads of `head_dim`
    (2 of 64), `dtype` (fp16), filled with a pattern drawn from `seed`."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dtype = torch.float16 if dtype is None else dtype
    layers = 4
    device = MHATokenToKVPool(
        tokens, PAGE_TOKENS, dtype, heads, head_dim, layers, "cpu", False, start_layer=0, end_layer=layers
    )
    info = device.get_device_pool_infos()[0].buffer_info
    pool = MHATokenToKVPoolHost(
        info,
        2.0,
        0,
        PAGE_TOKENS,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=layers,
    )
    gen = torch.Generator().manual_seed(seed)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=gen, dtype=torch.float32).to(dtype))
    return pool


def _controller(backend, pool):
    """The attributes of SGLang's HiCacheController that its page functions read."""
    return types.SimpleNamespace(
        storage_backend=backend, storage_host_pool=pool, mem_pool_host=pool, page_size=pool.page_size
    )


def _pages(pool, indices) -> list:
    return [
        pool.get_data_page(int(indices[i * pool.page_size]), flat=True).clone()
        for i in range(len(indices) // pool.page_size)
    ]


def _store_pages(backend, pool, n: int):
    """n new pages of the host pool stored through SGLang's zero-copy page function (its
    success asserted): their host indices, keys and bytes, and the controller."""
    from sglang.srt.managers.cache_controller import HiCacheController

    src = pool.alloc(n * PAGE_TOKENS)
    keys = [uuid.uuid4().hex for _ in range(n)]
    expected = _pages(pool, src)
    ctl = _controller(backend, pool)
    assert HiCacheController._page_set_zero_copy(ctl, keys, src) is True
    return src, keys, expected, ctl


def _deepio_backend(folders: list[Path], pool, **kw):
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    backend = StorageBackendFactory.create_backend("dynamic", _sglang_config(folders, **kw), pool)
    backend.register_mem_pool_host(pool)  # what HiCacheController.attach_storage_backend does next
    return backend


@needs("sglang")
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_sglang_zero_copy_round_trip(engines, tmp_dir, layout):
    from sglang.srt.managers.cache_controller import HiCacheController

    pool = _host_pool(layout)
    backend = _deepio_backend([tmp_dir / "a", tmp_dir / "b"], pool)
    try:
        assert type(backend).__name__ == "DeepioHiCacheStorage"
        n = 12
        src, keys, expected, ctl = _store_pages(backend, pool, n)
        assert backend.batch_exists(keys) == n
        assert backend.batch_exists(keys[:5] + ["absent"] + keys[5:]) == 5
        assert backend.batch_exists(["absent", *keys]) == 0
        stats = backend.get_stats()  # SGLang's StorageMetrics, per call since the last one
        assert stats.backup_pgs == [n] and stats.backup_bandwidth[0] > 0 and stats.prefetch_pgs == []
        assert backend.get_stats().backup_pgs == []
        assert backend.store_stats()["kv"]["pages"] == n

        dst = pool.alloc(n * PAGE_TOKENS)
        op = types.SimpleNamespace(request_id="r1")
        assert HiCacheController._page_get_zero_copy(ctl, op, keys, dst) == n
        assert backend.get_stats().prefetch_pgs == [n]
        for want, got in zip(expected, _pages(pool, dst), strict=True):
            assert torch.equal(want, got)

        # A miss in the middle: the controller counts the leading hits; the page after the
        # miss is still read (True), the missing one is not.
        mixed = keys[:3] + ["absent"] + keys[3:5]
        dst2 = pool.alloc(len(mixed) * PAGE_TOKENS)
        assert backend.batch_get_v1(mixed, dst2) == [True, True, True, False, True, True]
        assert HiCacheController._page_get_zero_copy(ctl, op, mixed, dst2) == 3

        # Host indices that are not whole pages: per-key False (logged), no exception into
        # the controller, and nothing stored.
        short = ["short-0", "short-1"]
        assert backend.batch_set_v1(short, src[: 2 * PAGE_TOKENS - 1]) == [False, False]
        assert backend.batch_get_v1(keys[:2], dst[: 2 * PAGE_TOKENS - 1]) == [False, False]
        assert backend.batch_exists(short) == 0

        # SGLang's /clear_hicache_storage_backend: every page gone, and still gone after a
        # reopen (Store.clear is durable when it returns).
        assert backend.clear() is True
        assert backend.batch_exists(keys) == 0
        backend.close()
        backend = _deepio_backend([tmp_dir / "a", tmp_dir / "b"], pool)
        assert backend.batch_exists(keys) == 0
        assert backend.store_stats()["kv"]["recovered_pages"] == 0
    finally:
        backend.close()


@needs("sglang")
def test_sglang_same_bytes_as_hicache_file(engines, tmp_dir):
    """The same pages through SGLang's shipped file backend (the controller's generic path)
    and through deepio (zero-copy and generic paths) come back identical."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    pool = _host_pool()
    file_backend = StorageBackendFactory.create_backend("file", _sglang_config(None, file_path=tmp_dir / "file"), pool)
    file_backend.register_mem_pool_host(pool)
    deepio_generic = _deepio_backend([tmp_dir / "g"], pool, v1=False)
    deepio_v1 = _deepio_backend([tmp_dir / "z"], pool)
    try:
        n = 6
        src = pool.alloc(n * PAGE_TOKENS)
        keys = [f"page-{i}" for i in range(n)]
        expected = _pages(pool, src)
        op = types.SimpleNamespace(request_id="r2", is_terminated=lambda: False)
        for backend in (file_backend, deepio_generic):
            ctl = _controller(backend, pool)
            assert HiCacheController._generic_page_set(ctl, keys, src) is True
            dst = pool.alloc(n * PAGE_TOKENS)
            assert HiCacheController._generic_page_get(ctl, op, keys, dst) == n
            assert all(torch.equal(a, b) for a, b in zip(expected, _pages(pool, dst), strict=True))
            assert backend.batch_exists(keys + ["absent"]) == n
            assert backend.exists(keys[0]) and not backend.exists("absent")
        ctl = _controller(deepio_v1, pool)
        assert HiCacheController._page_set_zero_copy(ctl, keys, src) is True
        dst = pool.alloc(n * PAGE_TOKENS)
        assert HiCacheController._page_get_zero_copy(ctl, op, keys, dst) == n
        assert all(torch.equal(a, b) for a, b in zip(expected, _pages(pool, dst), strict=True))
    finally:
        deepio_generic.close()
        deepio_v1.close()


@needs("sglang")
def test_sglang_v2_pools_hit_policies_like_hicache_file(engines, tmp_dir):
    """The v2 calls with a second pool (an SWA-like pool, registered with
    register_mem_host_pool_v2): deepio answers batch_exists_v2 as SGLang's HiCacheFile does,
    for both hit policies, and moves the second pool's pages."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    kv, side = _host_pool(), _host_pool()
    file_backend = StorageBackendFactory.create_backend("file", _sglang_config(None, file_path=tmp_dir / "f"), kv)
    deepio_backend = _deepio_backend([tmp_dir / "d"], kv)
    fresh = _deepio_backend([tmp_dir / "fresh"], kv)
    try:
        # Before any pool is registered: nothing stored, no error (HiCacheFile answers 0 too).
        assert fresh.batch_exists(["a", "b"]) == 0
        assert fresh.batch_exists_v2(["a", "b"]).kv_hit_pages == 0
        n = 5
        keys = [f"v2-{i}" for i in range(n)]
        kv_idx, side_idx = kv.alloc(n * PAGE_TOKENS), side.alloc(2 * PAGE_TOKENS)
        expected_side = _pages(side, side_idx)
        answers = []
        for backend in (file_backend, deepio_backend):
            # As SGLang's hybrid controller does: the anchor pool, then every pool through v2.
            backend.register_mem_pool_host(kv)
            backend.register_mem_host_pool_v2(kv, PoolName.KV)
            backend.register_mem_host_pool_v2(side, PoolName.SWA)
            put = backend.batch_set_v2(
                [
                    PoolTransfer(name=PoolName.KV, host_indices=kv_idx, keys=keys),
                    PoolTransfer(name=PoolName.SWA, host_indices=side_idx, keys=keys[-2:]),
                ]
            )
            assert put == {PoolName.KV: [True] * n, PoolName.SWA: [True, True]}
            trailing = backend.batch_exists_v2(
                keys, [PoolTransfer(name=PoolName.SWA, keys=keys[-2:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
            )
            every = backend.batch_exists_v2(
                keys, [PoolTransfer(name=PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)]
            )
            answers.append((trailing, every))
            dst = side.alloc(2 * PAGE_TOKENS)
            got = backend.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=dst, keys=keys[-2:])])
            assert got == {PoolName.SWA: [True, True]}
            assert all(torch.equal(a, b) for a, b in zip(expected_side, _pages(side, dst), strict=True))
        # A pool never registered: per-key False for it, the other pools' transfers unharmed.
        got = deepio_backend.batch_get_v2(
            [
                PoolTransfer(name=PoolName.MAMBA, host_indices=dst, keys=keys[-2:]),
                PoolTransfer(name=PoolName.SWA, host_indices=dst, keys=keys[-2:]),
            ]
        )
        assert got == {PoolName.MAMBA: [False, False], PoolName.SWA: [True, True]}
        # batch_exists_v2 over a pool never registered: 0 pages of it, as HiCacheFile answers.
        never = [PoolTransfer(name=PoolName.MAMBA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)]
        f_never, d_never = (b.batch_exists_v2(keys, never) for b in (file_backend, deepio_backend))
        assert d_never.kv_hit_pages == f_never.kv_hit_pages == 0
        assert d_never.extra_pool_hit_pages == f_never.extra_pool_hit_pages
        assert d_never.restorable_prefix_pages == f_never.restorable_prefix_pages == []
        (f_trailing, f_every), (d_trailing, d_every) = answers
        assert f_trailing.kv_hit_pages == d_trailing.kv_hit_pages == n
        assert f_trailing.restorable_prefix_pages == d_trailing.restorable_prefix_pages
        assert f_every.kv_hit_pages == d_every.kv_hit_pages == 0
    finally:
        deepio_backend.close()
        fresh.close()


@needs("sglang")
def test_sglang_shared_false_opens_the_processs_own_store(engines, tmp_dir):
    """ "shared": false in the extra config: a plain Store of this process (no node-shared
    server or client), whose folders a second backend cannot open meanwhile (the folder lock);
    pages round-trip as with the shared store. A setting that is not true/false raises."""
    from sglang.srt.managers.cache_controller import HiCacheController

    import deepio.kv
    from deepio.kv._shared import SharedStore

    pool = _host_pool("page_first")
    folders = [tmp_dir / "own-a", tmp_dir / "own-b"]
    backend = _deepio_backend(folders, pool, shared=False)
    try:
        store = backend._store("kv")
        assert type(store) is deepio.kv.Store and not isinstance(store, SharedStore)
        n = 4
        _, keys, expected, ctl = _store_pages(backend, pool, n)
        dst = pool.alloc(n * PAGE_TOKENS)
        assert HiCacheController._page_get_zero_copy(ctl, types.SimpleNamespace(request_id="r"), keys, dst) == n
        for want, got in zip(expected, _pages(pool, dst), strict=True):
            assert torch.equal(want, got)
        with pytest.raises(Exception, match="EBUSY|busy|lock|in use"):
            _deepio_backend(folders, pool, shared=False)
    finally:
        backend.close()
    with pytest.raises(ValueError, match='"shared" in --hicache-storage-backend-extra-config'):
        _deepio_backend([tmp_dir / "own-c"], pool, shared="maybe")


@needs("sglang")
def test_sglang_refuses_what_it_cannot_serve(engines, tmp_dir):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    with pytest.raises(ValueError, match="folders"):
        StorageBackendFactory.create_backend("dynamic", _sglang_config([]), None)
    mla = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=2,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=True,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="m",
        extra_config=_sglang_config([tmp_dir]).extra_config,
    )
    # MLA with tensor parallelism is served (one store shared by the ranks:
    # test_kv_backends_shared.py), no longer refused at construction.
    StorageBackendFactory.create_backend("dynamic", mla, None).close()


# ---------------------------------------------------------------------------------------------
# LMCache
# ---------------------------------------------------------------------------------------------

LM_PAGE = 64 << 10


def _lmcache_adapter(folders: list[Path]):
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry

    spec = {
        "type": "native_plugin",
        "module_path": "deepio.kv.lmcache",
        "class_name": "DeepioL2Connector",
        "adapter_params": {"folders": [str(f) for f in folders], "capacity_bytes": 16 << 20, "page_bytes": LM_PAGE},
    }
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    config = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", json.dumps(spec)]))
    return create_l2_adapter_from_registry(config.adapters[0])


def _memory_obj(data: torch.Tensor):
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    meta = MemoryObjMetadata(shape=data.shape, dtype=data.dtype, address=0, phy_size=data.numel(), ref_count=1)
    return TensorMemoryObj(data, meta, None)


def _object_key(i: int):
    from lmcache.v1.distributed.api import ObjectKey

    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="test-model", kv_rank=0)


def _until(fd: int, poll):
    deadline = time.monotonic() + 10
    while True:
        result = poll()
        if result is not None and result != {}:
            return result
        assert time.monotonic() < deadline, "no completion within 10 s"
        select.select([fd], [], [], 0.5)


@needs("lmcache")
def test_lmcache_l2_adapter_round_trip(engines, tmp_dir):
    adapter = _lmcache_adapter([tmp_dir / "a", tmp_dir / "b"])
    try:
        assert type(adapter).__name__ == "NativeConnectorL2Adapter"
        n = 6
        gen = torch.Generator().manual_seed(3)
        src = [torch.randint(0, 256, (LM_PAGE,), generator=gen, dtype=torch.uint8) for _ in range(n)]
        keys = [_object_key(i) for i in range(n)]
        task = adapter.submit_store_task(keys, [_memory_obj(t) for t in src])
        stored = _until(adapter.get_store_event_fd(), adapter.pop_completed_store_tasks)
        assert stored[task] == 6 * LM_PAGE  # an L2StoreResult: bytes stored, -1 on failure

        probe = keys[:3] + [_object_key(99)] + keys[3:]
        task = adapter.submit_lookup_and_lock_task(probe, {})
        bitmap = _until(adapter.get_lookup_and_lock_event_fd(), lambda: adapter.query_lookup_and_lock_result(task))
        assert [bitmap.test(i) for i in range(len(probe))] == [True, True, True, False, True, True, True]
        adapter.submit_unlock([k for k in probe if k != _object_key(99)])

        dst = [torch.zeros(LM_PAGE, dtype=torch.uint8) for _ in probe]
        task = adapter.submit_load_task(probe, [_memory_obj(t) for t in dst])
        bitmap = _until(adapter.get_load_event_fd(), lambda: adapter.query_load_result(task))
        assert [bitmap.test(i) for i in range(len(probe))] == [True, True, True, False, True, True, True]
        for want, got in zip(src, dst[:3] + dst[4:], strict=True):
            assert torch.equal(want, got)

        adapter.delete(keys[:2])
        task = adapter.submit_lookup_and_lock_task(keys, {})
        bitmap = _until(adapter.get_lookup_and_lock_event_fd(), lambda: adapter.query_lookup_and_lock_result(task))
        assert [bitmap.test(i) for i in range(n)] == [False, False] + [True] * (n - 2)
    finally:
        adapter.close()


@needs("lmcache")
def test_lmcache_native_plugin_protocol(engines, tmp_dir):
    """The six calls of the native-plugin protocol as LMCache's adapter makes them: the eventfd
    becomes readable, drain_completions returns (id, ok, error, per-key bools) once each."""
    from deepio.kv.lmcache import DeepioL2Connector

    conn = DeepioL2Connector(folders=[str(tmp_dir)], capacity_bytes=8 << 20, page_bytes=LM_PAGE)
    try:
        fd = conn.event_fd()
        pages = [
            bytearray(np.random.default_rng(i).integers(0, 256, LM_PAGE, dtype=np.uint8).tobytes()) for i in range(3)
        ]
        set_id = conn.submit_batch_set(["a", "b", "c"], [memoryview(p) for p in pages])
        done = _drain_until(conn, fd, {set_id})
        assert done[set_id] == (set_id, True, "", [True, True, True])

        out = [bytearray(LM_PAGE) for _ in range(2)]
        get_id = conn.submit_batch_get(["b", "zzz"], [memoryview(o) for o in out])
        exists_id = conn.submit_batch_exists(["a", "zzz", "c"])
        done = _drain_until(conn, fd, {get_id, exists_id})
        fid, ok, error, bools = done[get_id]
        assert (ok, bools) == (False, [True, False]) and "1 of 2" in error
        assert out[0] == pages[1]
        assert done[exists_id] == (exists_id, True, "", [True, False, True])

        delete_id = conn.submit_batch_delete(["a", "zzz"])
        assert _drain_until(conn, fd, {delete_id})[delete_id][3] == [True, False]
        # A page larger than page_bytes: a failed completion, not an exception into LMCache.
        big_id = conn.submit_batch_set(["big"], [memoryview(bytearray(LM_PAGE + 4096))])
        assert _drain_until(conn, fd, {big_id})[big_id][1] is False
        assert conn.drain_completions() == []
    finally:
        conn.close()


def _drain_until(conn, fd: int, ids: set[int]) -> dict:
    got: dict = {}
    deadline = time.monotonic() + 10
    while not ids <= got.keys():
        assert time.monotonic() < deadline, f"completions {ids - got.keys()} missing after 10 s"
        select.select([fd], [], [], 0.5)
        for c in conn.drain_completions():
            assert c[0] not in got, "a completion was delivered twice"
            got[c[0]] = c
    return got


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------

VLLM_CHUNK = 64 << 10


def _vllm_cpu_tier(chunks: int) -> contextlib.AbstractContextManager[memoryview]:
    return kv_engines.vllm_cpu_tier(chunks, VLLM_CHUNK, "deepio-test")


def _finished(tier, job_ids: set[int]) -> dict:
    got: dict = {}
    deadline = time.monotonic() + 10
    while not job_ids <= got.keys():
        assert time.monotonic() < deadline, f"jobs {job_ids - got.keys()} not finished after 10 s"
        for r in tier.get_finished_jobs():
            got[r.job_id] = r
        time.sleep(0.001)
    return got


@needs("vllm")
def test_vllm_secondary_tier_round_trip(engines, tmp_dir):
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    with _vllm_cpu_tier(12) as view:
        rows = np.asarray(view).view(np.uint8)
        rows[:] = np.random.default_rng(5).integers(0, 256, rows.shape, dtype=np.uint8)
        config = {
            "type": "DeepioTier",
            "module_path": "deepio.kv.vllm",
            "folders": [str(tmp_dir / "a"), str(tmp_dir / "b")],
            "capacity_bytes": 16 << 20,
            "locality": "LOCAL",
        }
        # The offloading spec is only kept by SecondaryTierManager, not read by this tier.
        tier = SecondaryTierFactory.create_secondary_tier(config, view, None)
        try:
            assert type(tier).__name__ == "DeepioTier" and tier.block_size_bytes == VLLM_CHUNK
            assert tier.locality.value == "LOCAL" and tier.medium.value == "STORAGE"
            ctx = ReqContext(req_id="r1")
            tier.on_new_request(ctx)
            keys = [make_offload_key(bytes([i]) * 16, 0) for i in range(4)]
            absent = make_offload_key(b"\xff" * 16, 0)
            expected = rows[:4].copy()
            tier.submit_store(
                TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(4), is_promotion=False, req_context=ctx)
            )
            assert _finished(tier, {1})[1].success is True
            assert [tier.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 4
            assert tier.lookup(absent, ctx) == LookupResult.MISS

            tier.submit_load(
                TransferJob(job_id=2, keys=keys, chunk_ids=np.arange(4, 8), is_promotion=True, req_context=ctx)
            )
            assert _finished(tier, {2})[2].success is True
            assert np.array_equal(rows[4:8], expected)

            # One key missing: the job fails and names the keys that did arrive.
            tier.submit_load(
                TransferJob(
                    job_id=3,
                    keys=[keys[0], absent, keys[2]],
                    chunk_ids=np.arange(8, 11),
                    is_promotion=True,
                    req_context=ctx,
                )
            )
            result = _finished(tier, {3})[3]
            assert result.success is False and list(result.successful_keys) == [keys[0], keys[2]]
            assert np.array_equal(rows[8], expected[0]) and np.array_equal(rows[10], expected[2])
            # Chunks already held are not written again.
            written = tier.stats()["bytes_written"]
            tier.submit_store(
                TransferJob(job_id=4, keys=keys[:2], chunk_ids=np.arange(2), is_promotion=False, req_context=ctx)
            )
            assert _finished(tier, {4})[4].success is True
            assert tier.stats()["bytes_written"] == written
            tier.drain_jobs()
            assert not tier.has_pending_work()
            tier.on_request_finished(ctx)
        finally:
            tier.shutdown()
