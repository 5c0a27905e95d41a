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
    _sglang_config,
    engines,  # noqa: F401 (the fixture that puts the engines on sys.path)
)

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
    """SGLang's MHA host pool on the CPU (as test_kv_backends._host_pool), of any dtype and
    head shape, filled with a fixed pattern."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    layers = 4
    device = MHATokenToKVPool(
        256, PAGE_TOKENS, dtype, heads, head_dim, layers, "cpu", False, start_layer=0, end_layer=layers
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
    gen = torch.Generator().manual_seed(11)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=gen, dtype=torch.float32).to(dtype))
    return pool


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
