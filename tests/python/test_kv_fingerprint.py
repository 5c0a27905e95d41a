"""A store never fills the wrong disk or serves pages of another configuration (issue 45 item 5),
through deepio.kv.Store and each engine backend:

- each backend's fingerprint says what its bytes mean: it changes with the model, the dtype,
  the page shape (same bytes, other heads), the layout and the ranks, and only with them;
- a backend without a capacity for a fresh folder raises, naming the folder and the setting;
- a store written under one configuration and reopened under another raises (naming the
  setting that would clear it), or, with clear_on_mismatch, starts empty with a warning:
  never a hit on bytes of another layout.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import deepio
import deepio.kv
from conftest import needs, needs_numpy

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from test_kv_backends import (  # noqa: E402 (after the skips: it imports numpy and torch too)
    LM_PAGE,
    PAGE_TOKENS,
    _drain_until,
    _pages,
    _sglang_config,
    engines,  # noqa: F401 (the fixture that puts the engines on sys.path)
)
from test_kv_backends import _host_pool as _backends_host_pool  # noqa: E402 (as above)

PAGE = 8192
SLOT = 4096 + PAGE


# ------------------------------------------------------------------------------ the store


@needs_numpy
def test_fingerprint_arguments_are_checked(tmp_dir):
    with pytest.raises(TypeError, match="fingerprint"):
        deepio.kv.Store([str(tmp_dir / "a")], capacity_bytes=8 * SLOT, page_bytes=PAGE, fingerprint=b"x")
    with pytest.raises(ValueError, match="4096"):
        deepio.kv.Store(
            [str(tmp_dir / "a")],
            capacity_bytes=8 * SLOT,
            page_bytes=PAGE,
            fingerprint="x" * (deepio.kv.MAX_FINGERPRINT_BYTES + 1),
        )
    with pytest.raises(TypeError, match="clear_on_mismatch"):
        deepio.kv.Store([str(tmp_dir / "a")], capacity_bytes=8 * SLOT, page_bytes=PAGE, clear_on_mismatch=1)


def test_store_warning_categories():
    from deepio.kv import _warning_category

    assert _warning_category("deepio.kv: folder /x recovered") is deepio.kv.FolderRecoveredWarning
    assert _warning_category("deepio.kv: folder /x failed (EIO) ...") is deepio.kv.FolderFailedWarning
    assert _warning_category("deepio.kv: folder /x had fingerprint a, not b: cleared") is deepio.kv.StoreClearedWarning
    assert not issubclass(deepio.kv.StoreClearedWarning, deepio.kv.FolderFailedWarning)


# ------------------------------------------------------------------------- the backends


def _host_pool(dtype=torch.float16, heads: int = 2, head_dim: int = 64, layout: str = "page_first"):
    """test_kv_backends' SGLang host pool, of any dtype and head shape (256 tokens)."""
    return _backends_host_pool(layout, dtype, heads, head_dim, tokens=256, seed=11)


def _sglang(folders: list[Path], pool, model: str = "test/model", tp: tuple[int, int] = (0, 1), **extra):
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    config = _sglang_config(folders, **extra)
    config.model_name = model
    config.tp_rank, config.tp_size = tp
    if extra.get("capacity_bytes", 1) is None:
        del config.extra_config["capacity_bytes"]
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def _fingerprint_of(backend) -> dict:
    return json.loads(backend._stores["kv"].fingerprint)


@needs("sglang")
def test_sglang_fingerprint_names_what_the_bytes_mean(engines, tmp_dir):  # noqa: F811
    fp16 = _host_pool(torch.float16)
    seen = {}
    cases = {
        "base": (fp16, {}),
        "bf16": (_host_pool(torch.bfloat16), {}),  # same page bytes, other dtype
        "heads": (_host_pool(heads=4, head_dim=32), {}),  # same page bytes, other shape
        "layer_first": (_host_pool(layout="layer_first"), {}),
        "model": (fp16, {"model": "other/model"}),
        "tp": (fp16, {"tp": (1, 2)}),
        "user": (fp16, {"fingerprint": "weights-v2"}),
    }
    for name, (pool, kw) in cases.items():
        backend = _sglang([tmp_dir / name], pool, **kw)
        try:
            seen[name] = _fingerprint_of(backend)
        finally:
            backend.close()
    base = seen["base"]
    assert base["backend"] == "sglang" and base["model"] == "test/model" and base["tp"] == [0, 1]
    assert base["dtype"] == "torch.float16" and base["layout"] == "page_first" and base["head_num"] == 2
    assert len({json.dumps(v, sort_keys=True) for v in seen.values()}) == len(seen), seen
    again = _sglang([tmp_dir / "again"], fp16)
    try:
        assert _fingerprint_of(again) == base  # a function of the configuration alone
    finally:
        again.close()


@needs("sglang")
def test_sglang_fresh_folder_needs_a_capacity(engines, tmp_dir):  # noqa: F811
    pool = _host_pool()
    with pytest.raises(ValueError, match=r'kv holds no store yet.*"capacity_bytes".*--hicache-storage-backend'):
        _sglang([tmp_dir / "a"], pool, capacity_bytes=None)
    assert not any((tmp_dir / "a").rglob("slab-*"))  # nothing was allocated
    # An existing store reopens without one (its layout is kept).
    _sglang([tmp_dir / "a"], pool).close()
    backend = _sglang([tmp_dir / "a"], pool, capacity_bytes=None)
    try:
        assert backend.store_stats()["kv"]["capacity_bytes"] > 0
    finally:
        backend.close()


@needs("lmcache")
def test_lmcache_fingerprint_and_capacity(engines, tmp_dir):  # noqa: F811
    from deepio.kv.lmcache import DeepioL2Connector

    with pytest.raises(ValueError, match=r'holds no store yet.*"capacity_bytes".*adapter_params'):
        DeepioL2Connector(folders=[str(tmp_dir / "a")], page_bytes=LM_PAGE)
    conn = DeepioL2Connector(
        folders=[str(tmp_dir / "a")], capacity_bytes=4 << 20, page_bytes=LM_PAGE, fingerprint="bf16 chunk256"
    )
    try:
        fp = json.loads(conn._store.fingerprint)
        assert fp == {"backend": "lmcache", "page_bytes": LM_PAGE, "user": "bf16 chunk256"}
    finally:
        conn.close()


class _Spec:
    """The part of vLLM's OffloadingSpec the tier reads: its normalized config."""

    def __init__(self, model: str = "m", dtype: str = "bfloat16", rank: int = 0, world: int = 1) -> None:
        from vllm.v1.kv_offload.config import (
            OffloadingCacheConfig,
            OffloadingConfig,
            OffloadingGroupConfig,
            OffloadingModelConfig,
            OffloadingParallelConfig,
        )

        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
            worker_kv_bytes_per_block=4096,
            enable_kv_cache_events=False,
            extra_config={},
            engine_id="e",
            model=OffloadingModelConfig(name=model, dtype=dtype),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=rank,
                world_size=world,
                tp_size=world,
                pp_size=1,
                pcp_size=1,
                dcp_size=1,
                data_parallel_index=0,
                data_parallel_size=1,
                data_parallel_rank_local=None,
                is_parallelism_agnostic=False,
            ),
        )


def _tier(folder: Path, spec, rows, **kw):
    from deepio.kv.vllm import DeepioTier

    return DeepioTier(spec, memoryview(rows), "DeepioTier", folders=[str(folder)], **kw)


@needs("vllm")
def test_vllm_fingerprint_and_capacity(engines, tmp_dir):  # noqa: F811
    rows = np.zeros((4, 16 << 10), np.uint8)
    with pytest.raises(ValueError, match=r'holds no store yet.*"capacity_bytes".*secondary_tiers'):
        _tier(tmp_dir / "a", _Spec(), rows)
    seen = []
    for i, spec in enumerate([_Spec(), _Spec(dtype="float16"), _Spec(model="n"), _Spec(rank=1, world=2), None]):
        tier = _tier(tmp_dir / str(i), spec, rows, capacity_bytes=1 << 20)
        try:
            seen.append(tier._store.fingerprint)
        finally:
            tier.shutdown()
    assert len(set(seen)) == len(seen)
    base = json.loads(seen[0])
    assert base["model"] == "m" and base["dtype"] == "bfloat16" and base["chunk_bytes"] == 16 << 10
    assert base["parallel"]["world_size"] == 1 and base["groups"][0][:2] == [0, 16]


# ------------------------------------------- reopened under another configuration (C++ store)


def _store(folder: Path, capacity: int = 16 * SLOT, **kw):
    return deepio.kv.Store([str(folder)], capacity_bytes=capacity, page_bytes=PAGE, checkpoint_interval=0, **kw)


@needs_numpy
def test_a_fresh_folder_needs_a_capacity(tmp_dir):
    """No capacity for a fresh folder: InvalidArgumentError naming it, nothing allocated (a
    drive that failed to mount must not fill the file system below it). A store that exists
    reopens without one."""
    fresh = tmp_dir / "nvme1" / "kv"
    with pytest.raises(deepio.InvalidArgumentError, match=str(fresh)):
        deepio.kv.Store([str(fresh)], page_bytes=PAGE)
    assert not fresh.exists() or not list(fresh.glob("slab-*"))
    _store(fresh).close()
    with deepio.kv.Store([str(fresh)], page_bytes=PAGE) as store:
        assert store.stats()["capacity_bytes"] > 0


@needs_numpy
def test_another_fingerprint_raises_or_starts_empty(tmp_dir):
    pool = np.zeros((2, PAGE), np.uint8)
    pool[0] = 3
    with _store(tmp_dir / "s", fingerprint="model-a fp16") as store:
        store.register(pool)
        assert store.put(["k"], [0]).result() == [True]
    with pytest.raises(deepio.InvalidArgumentError) as info:
        _store(tmp_dir / "s", fingerprint="model-a bf16")
    for part in (str(tmp_dir / "s"), "model-a fp16", "model-a bf16"):
        assert part in str(info.value)
    with _store(tmp_dir / "s", fingerprint="model-a fp16") as store:  # the same one: a hit
        store.register(pool)
        assert store.get(["k"], [1]).result() == [True] and (pool[1] == 3).all()
    with pytest.warns(deepio.kv.StoreClearedWarning, match="fingerprint"):
        store = _store(tmp_dir / "s", fingerprint="model-a bf16", clear_on_mismatch=True)
    with store:
        store.register(pool)
        assert store.contains(["k"]) == [False] and store.get(["k"], [1]).result() == [False]
        assert store.stats()["pages"] == 0
    with pytest.raises(deepio.InvalidArgumentError):  # the store is now bf16's, durably
        _store(tmp_dir / "s", fingerprint="model-a fp16")
    with _store(tmp_dir / "s", fingerprint="model-a bf16") as store:
        assert store.contains(["k"]) == [False]


def _sglang_written(tmp_dir: Path, pool, n: int = 4):
    """Pages put by the SGLang backend over `pool` into tmp_dir/"s"; returns their keys."""
    from sglang.srt.managers.cache_controller import HiCacheController

    backend = _sglang([tmp_dir / "s"], pool)
    try:
        keys = [f"page-{i}" for i in range(n)]
        ctl = types.SimpleNamespace(
            storage_backend=backend, storage_host_pool=pool, mem_pool_host=pool, page_size=pool.page_size
        )
        assert HiCacheController._page_set_zero_copy(ctl, keys, pool.alloc(n * PAGE_TOKENS)) is True
    finally:
        backend.close()
    return keys


@needs("sglang")
@pytest.mark.parametrize("change", ["dtype", "heads"])
def test_sglang_reopened_under_another_layout_never_hits(engines, tmp_dir, change):  # noqa: F811
    """Pages written by an fp16 pool of 2 heads of 64, reopened with a bf16 pool or one of 4
    heads of 32 (the same page bytes): the backend raises, naming the setting; with
    clear_on_mismatch it starts empty with a warning and every get misses."""
    keys = _sglang_written(tmp_dir, _host_pool(torch.float16))
    other = _host_pool(torch.bfloat16) if change == "dtype" else _host_pool(heads=4, head_dim=32)
    with pytest.raises(deepio.InvalidArgumentError) as info:
        _sglang([tmp_dir / "s"], other)
    assert "clear_on_mismatch" in " ".join(getattr(info.value, "__notes__", []))
    with pytest.warns(deepio.kv.StoreClearedWarning):
        backend = _sglang([tmp_dir / "s"], other, clear_on_mismatch=True)
    try:
        assert backend.batch_exists(keys) == 0
        dst = other.alloc(len(keys) * PAGE_TOKENS)
        assert backend.batch_get_v1(keys, dst) == [False] * len(keys)
    finally:
        backend.close()


@needs("sglang")
def test_sglang_same_layout_still_hits(engines, tmp_dir):  # noqa: F811
    pool = _host_pool(torch.float16)
    keys = _sglang_written(tmp_dir, pool)
    backend = _sglang([tmp_dir / "s"], pool)
    try:
        dst = pool.alloc(len(keys) * PAGE_TOKENS)
        assert backend.batch_get_v1(keys, dst) == [True] * len(keys)
        assert len(_pages(pool, dst)) == len(keys)
    finally:
        backend.close()


@needs("lmcache")
def test_lmcache_reopened_under_another_fingerprint_never_hits(engines, tmp_dir):  # noqa: F811
    from deepio.kv.lmcache import DeepioL2Connector

    def conn(fp: str, **kw):
        return DeepioL2Connector(
            folders=[str(tmp_dir)], capacity_bytes=4 << 20, page_bytes=LM_PAGE, fingerprint=fp, **kw
        )

    first = conn("fp16 chunk256")
    try:
        fid = first.submit_batch_set(["k"], [memoryview(bytearray(LM_PAGE))])
        assert _drain_until(first, first.event_fd(), {fid})[fid][1] is True
    finally:
        first.close()
    with pytest.raises(deepio.InvalidArgumentError):
        conn("bf16 chunk256")
    with pytest.warns(deepio.kv.StoreClearedWarning):
        second = conn("bf16 chunk256", clear_on_mismatch=True)
    try:
        assert second._store.contains(["k"]) == [False]
    finally:
        second.close()


@needs("vllm")
def test_vllm_reopened_under_another_config_never_hits(engines, tmp_dir):  # noqa: F811
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    rows = np.ones((4, 16 << 10), np.uint8)
    key = make_offload_key(b"\x07" * 16, 0)
    tier = _tier(tmp_dir, _Spec(dtype="bfloat16"), rows, capacity_bytes=1 << 20)
    try:
        ctx = ReqContext(req_id="r")
        tier.submit_store(
            TransferJob(job_id=1, keys=[key], chunk_ids=np.arange(1), is_promotion=False, req_context=ctx)
        )
        tier.drain_jobs()
        assert [r.success for r in tier.get_finished_jobs()] == [True]
    finally:
        tier.shutdown()
    with pytest.raises(deepio.InvalidArgumentError):
        _tier(tmp_dir, _Spec(dtype="float16"), rows)
    with pytest.warns(deepio.kv.StoreClearedWarning):
        tier = _tier(tmp_dir, _Spec(dtype="float16"), rows, clear_on_mismatch=True)
    try:
        assert tier.lookup(key, ReqContext(req_id="r")) == LookupResult.MISS
    finally:
        tier.shutdown()
