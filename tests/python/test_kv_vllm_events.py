"""deepio.kv.vllm's tier and vLLM's KV events (issue 49 item 5), through vLLM's own classes
at the pinned version (scripts/setup-kv-engines.sh): the tier built by its
``SecondaryTierFactory`` from a tier config with ``"enable_kv_events": true``, driven by
``TransferJob``s, its ``take_events()`` compared with vLLM's ``OffloadingEvent`` (which the
OffloadingConnector turns into ``BlockStored``; that module needs ``cbor2``, which the
engines' folder lacks). As vLLM's fs and obj
tiers: one stored event per successful store job, with the tier's medium and locality;
nothing from loads or failed stores; nothing unless vLLM's KV cache events are on.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import types
from collections.abc import Iterator

import pytest

import kv_engines
from conftest import needs

np = pytest.importorskip("numpy")
pytest.importorskip("torch")

CHUNK = 64 << 10


@pytest.fixture(scope="module")
def engines() -> Iterator[None]:
    added = str(kv_engines.folder()) not in sys.path
    kv_engines.activate()
    try:
        yield
    finally:
        if added and str(kv_engines.folder()) in sys.path:
            sys.path.remove(str(kv_engines.folder()))


def cpu_tier(chunks: int) -> contextlib.AbstractContextManager[memoryview]:
    return kv_engines.vllm_cpu_tier(chunks, CHUNK, "deepio-events")


def spec(events_on: bool):
    """The part of vLLM's OffloadingSpec a tier reads for events (kv_events_config)."""
    from vllm.v1.kv_offload.base import OffloadingKVEventsConfig

    return types.SimpleNamespace(
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=events_on, self_describing_kv_events=False)
    )


def finished(tier, job_ids: set[int]) -> dict:
    got: dict = {}
    deadline = time.monotonic() + 10
    while not job_ids <= got.keys():
        assert time.monotonic() < deadline, f"jobs {job_ids - got.keys()} not finished after 10 s"
        for r in tier.get_finished_jobs():
            got[r.job_id] = r
        time.sleep(0.001)
    return got


def make_tier(tmp_dir, view, events_on: bool, **extra):
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    config = {
        "type": "DeepioTier",
        "module_path": "deepio.kv.vllm",
        "folders": [str(tmp_dir / "a")],
        "capacity_bytes": 16 << 20,
        **extra,
    }
    return SecondaryTierFactory.create_secondary_tier(config, view, spec(events_on))


@needs("vllm")
@pytest.mark.parametrize("locality", ["LOCAL", "REMOTE"])
def test_stored_events_as_vllm_tiers_emit_them(engines, tmp_dir, locality):
    from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    with cpu_tier(12) as view:
        tier = make_tier(tmp_dir, view, True, enable_kv_events=True, locality=locality)
        try:
            ctx = ReqContext(req_id="r1")
            keys = [make_offload_key(bytes([i]) * 16, 0) for i in range(4)]
            assert list(tier.take_events()) == []
            tier.submit_store(
                TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(4), is_promotion=False, req_context=ctx)
            )
            assert finished(tier, {1})[1].success
            events = list(tier.take_events())
            assert events == [
                OffloadingEvent(keys=keys, medium=Medium.STORAGE, removed=False, locality=Locality(locality))
            ]
            assert list(tier.take_events()) == []  # taken once

            # A load and a failed load emit nothing; a store of chunks held already names them all.
            absent = make_offload_key(b"\xff" * 16, 0)
            tier.submit_load(
                TransferJob(
                    job_id=2, keys=[keys[0], absent], chunk_ids=np.arange(4, 6), is_promotion=True, req_context=ctx
                )
            )
            tier.submit_store(
                TransferJob(job_id=3, keys=keys[:2], chunk_ids=np.arange(2), is_promotion=False, req_context=ctx)
            )
            got = finished(tier, {2, 3})
            assert not got[2].success and got[3].success
            again = list(tier.take_events())
            assert [(e.keys, e.removed) for e in again] == [(keys[:2], False)]
        finally:
            tier.shutdown()


@needs("vllm")
def test_no_events_unless_asked_and_enabled(engines, tmp_dir, caplog):
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    with cpu_tier(4) as view:
        for i, (events_on, asked) in enumerate([(True, False), (False, True)]):
            with caplog.at_level(logging.WARNING, logger="deepio.kv.vllm"):
                tier = make_tier(tmp_dir / str(i), view, events_on, enable_kv_events=asked)
            try:
                if asked and not events_on:  # as vLLM's fs tier: says why nothing will come
                    assert "disabled globally" in caplog.text
                ctx = ReqContext(req_id="r")
                job = TransferJob(
                    job_id=1,
                    keys=[make_offload_key(b"\x01" * 16, 0)],
                    chunk_ids=np.arange(1),
                    is_promotion=False,
                    req_context=ctx,
                )
                tier.submit_store(job)
                assert finished(tier, {1})[1].success
                assert list(tier.take_events()) == []
            finally:
                tier.shutdown()
