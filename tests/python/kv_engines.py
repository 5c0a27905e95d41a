"""Makes the inference engines of scripts/setup-kv-engines.sh importable, for the files that
drive them (tests/python/test_kv_backends.py, bench/kv_bench.py) and for nothing else.

setup-kv-engines.sh installs SGLang, LMCache and vLLM without their CUDA dependencies into a
folder of their own ($DEEPIO_KV_ENGINES, default ~/.cache/deepio/kv-engines-<python version>);
``activate()`` puts that folder at the front of sys.path. Where the engines are installed in
the interpreter itself (a user's GPU machine), the folder is absent and nothing changes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

_ops_library = None  # the torchvision op schemas defined below; kept alive for the process


def folder() -> Path:
    default = Path.home() / ".cache" / "deepio" / f"kv-engines-{sys.version_info[0]}.{sys.version_info[1]}"
    return Path(os.environ.get("DEEPIO_KV_ENGINES", default))


def activate() -> None:
    path = folder()
    if path.is_dir() and str(path) not in sys.path:
        sys.path.insert(0, str(path))
    _torchvision_without_its_ops()


def _torchvision_without_its_ops() -> None:
    """PyPI's torchvision is a CUDA build: with CPU torch its compiled ops (``_C``) cannot load,
    and then its ``_meta_registrations`` raises at import for the two ops it registers without
    checking for them (``nms``, ``qnms``); the first import fails so, and the second, after this,
    succeeds. SGLang's host-pool modules import torchvision through its multimodal model configs
    and never call those ops. Declaring the two schemas, with no kernel, lets ``import
    torchvision`` finish; calling them would raise. Nothing is done where torchvision imports as
    it is, or where torch or torchvision is absent."""
    global _ops_library
    if _ops_library is not None:
        return
    try:
        import torch
    except ImportError:
        return
    try:
        import torchvision  # noqa: F401 (a torchvision whose ops load needs nothing)

        return
    except ImportError:
        return
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    _ops_library = torch.library.Library("torchvision", "DEF")
    _ops_library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _ops_library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


@contextlib.contextmanager
def vllm_cpu_tier(chunks: int, chunk_bytes: int, name: str) -> Iterator[memoryview]:
    """vLLM's CPU (primary) tier memory: its SharedOffloadRegion (a /dev/shm mmap) of `chunks`
    chunks of `chunk_bytes`, viewed as TieringOffloadingSpec hands it to secondary tiers."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    region = SharedOffloadRegion(
        engine_id=f"{name}-{uuid.uuid4().hex[:8]}",
        num_chunks=chunks,
        rank=None,
        kv_bytes_per_chunk=chunk_bytes,
        cpu_page_size=mmap.PAGESIZE,
    )
    view = region.create_kv_memoryview()
    try:
        yield view
    finally:
        view.release()
        region.cleanup()
