"""deepio.dcp.HuggingFaceStorageWriter: dcp.save of state dicts into folders of .safetensors
files through deepio's engine, against torch's own HuggingFaceStorageWriter in the same test:
the same files (tensors, header, index), loadable by torch's reader, deepio's reader and
safetensors; durable and in-place writes; what torch would write wrongly refused; I/O errors
naming the file with the old file kept.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
require_module("safetensors")
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import deepio  # noqa: E402
import deepio.dcp  # noqa: E402
from deepio import _engine  # noqa: E402
from deepio.dcp import _common  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(64, 48, generator=g)
    return {
        "big": torch.randn(512, 1024, generator=g),  # 2 MiB: written from its own memory
        "bf16": torch.randn(8, 16, generator=g).bfloat16(),
        "cols": wide[:, 5:17],  # a view: torch clones it to its own storage first
        "i64": torch.arange(-500, 500, dtype=torch.int64),
        "odd_u8": torch.arange(0, 251, dtype=torch.uint8),
        "bool": torch.arange(13) % 3 == 0,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
    }


def _layout(path: Path) -> tuple[int, dict, list, bytes]:
    """A .safetensors file as (header length, __metadata__, tensor entries in file order, data).
    safetensors writes __metadata__'s keys in an order it draws at random in each process (a
    hash map), so the metadata is compared as a dict; everything else byte for byte."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    doc = json.loads(raw[8 : 8 + n], object_pairs_hook=list)
    meta = dict(dict(doc).pop("__metadata__", []))
    entries = [(k, v) for k, v in doc if k != "__metadata__"]
    return n, meta, entries, raw[8 + n :]


def _same_folders(ours: Path, theirs: Path) -> None:
    names = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        if (ours / name).is_dir():
            _same_folders(ours / name, theirs / name)
        elif name.endswith(".safetensors"):
            assert _layout(ours / name) == _layout(theirs / name), name
        else:
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def _both(tmp: Path, sd: dict[str, torch.Tensor], **kw) -> tuple[Path, Path]:
    ours, theirs = tmp / "deepio", tmp / "torch"
    dcp.save(sd, storage_writer=deepio.dcp.HuggingFaceStorageWriter(str(ours), **kw))
    dcp.save(sd, storage_writer=dcp.HuggingFaceStorageWriter(str(theirs), **kw))
    return ours, theirs


def _loads_back(folder: Path, sd: dict[str, torch.Tensor]) -> None:
    for reader in (dcp.HuggingFaceStorageReader, deepio.dcp.HuggingFaceStorageReader):
        out = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(out, storage_reader=reader(str(folder)))
        for k, v in sd.items():
            assert out[k].dtype == v.dtype and torch.equal(out[k], v), (reader, k)


def _written_bytes() -> int:
    s = _engine.default().stats()
    return s["bytes_direct"] + s["bytes_bounced"] + s["bytes_buffered"]


@pytest.mark.parametrize("mapping", [None, {"big": 1, "bf16": 2, "cols": 2, "i64": 1}], ids=["one-file", "two-files"])
def test_files_are_torchs_and_load_with_every_reader(tmp_dir, mapping):
    sd = _state()
    if mapping is not None:
        mapping = {k: mapping.get(k, 3) for k in sd}
    before = _written_bytes()
    ours, theirs = _both(tmp_dir, sd, fqn_to_index_mapping=mapping)
    data = sum(v.nbytes for v in sd.values())
    assert _written_bytes() - before >= data  # the tensors went through the engine
    _same_folders(ours, theirs)
    assert len(list(ours.glob("*.safetensors"))) == (1 if mapping is None else 3)
    _loads_back(ours, sd)
    merged: dict[str, torch.Tensor] = {}
    for f in ours.glob("*.safetensors"):
        merged.update(load_file(f))
    assert merged.keys() == sd.keys() and all(torch.equal(merged[k], sd[k]) for k in sd)


def test_distributed_shards_and_consolidation_are_torchs(tmp_dir):
    # Floating-point tensors of one dimension or more: torch 2.13's consolidation asks
    # torch.finfo of every dtype (raising for integers and bool) and loses a 0-d tensor's value,
    # with torch's own writer too.
    sd = {k: v for k, v in _state().items() if v.is_floating_point() and v.dim()}
    ours, theirs = _both(tmp_dir, sd, save_distributed=True, enable_consolidation=True)
    assert list((ours / "sharded").glob("*.safetensors"))
    _same_folders(ours, theirs)  # the shards, and torch's consolidation of deepio's
    _loads_back(ours, sd)


def test_in_place_writes_truncate_an_older_longer_file(tmp_dir):
    sd = _state()
    ours = tmp_dir / "deepio"
    ours.mkdir()
    stale = ours / "model-00001-of-00001.safetensors"
    stale.write_bytes(b"\xab" * (8 << 20))  # longer than what is saved over it
    w = deepio.dcp.HuggingFaceStorageWriter(str(ours))
    w.sync_files = False
    dcp.save(sd, storage_writer=w)
    dcp.save(sd, storage_writer=dcp.HuggingFaceStorageWriter(str(tmp_dir / "torch")))
    _same_folders(ours, tmp_dir / "torch")
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in (tmp_dir / "torch").iterdir())


def test_a_non_tensor_is_refused_before_any_file_is_written(tmp_dir):
    sd = {"w": torch.arange(4.0), "step": 7}
    with pytest.raises(CheckpointException) as info:
        dcp.save(sd, storage_writer=deepio.dcp.HuggingFaceStorageWriter(str(tmp_dir / "hf")))
    e = next(iter(info.value.failures.values()))
    e = e[0] if isinstance(e, tuple) else e
    assert isinstance(e, ValueError) and "'step'" in str(e) and "tensors only" in str(e)
    assert not list((tmp_dir / "hf").glob("*.safetensors"))


def test_write_error_names_the_file_and_keeps_the_old_one(tmp_dir, fault):
    folder = tmp_dir / "hf"
    old = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    dcp.save(old, storage_writer=deepio.dcp.HuggingFaceStorageWriter(str(folder)))
    data = folder / "model-00001-of-00001.safetensors"
    kept = data.read_bytes()
    fault("write", errno=errno.EIO, after=1)
    with pytest.raises(CheckpointException) as info:
        dcp.save({"w": old["w"] + 1}, storage_writer=deepio.dcp.HuggingFaceStorageWriter(str(folder)))
    e = next(iter(info.value.failures.values()))
    e = e[0] if isinstance(e, tuple) else e
    assert isinstance(e, OSError) and e.errno == errno.EIO
    assert os.path.dirname(e.filename) == str(folder)  # the temporary file beside it, named
    assert data.read_bytes() == kept
    assert sorted(p.name for p in folder.iterdir()) == [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]


def test_items_go_in_torchs_loader_order(tmp_dir, monkeypatch):
    # torch's writer hands items over smallest first where it would overlap copies to the host
    # (one thread, an accelerator, copy-ahead on): the order of the sharding JSON follows.
    sd = {"b_mid": torch.zeros(300), "a_big": torch.zeros(1000), "c_small": torch.zeros(10)}
    dcp.save(sd, storage_writer=deepio.dcp.HuggingFaceStorageWriter(str(tmp_dir / "cpu")))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    dcp.save(sd, storage_writer=deepio.dcp.HuggingFaceStorageWriter(str(tmp_dir / "accel")))

    def order(folder: Path) -> list[str]:
        (f,) = folder.glob("*.safetensors")
        return list(json.loads(_layout(f)[1]["DCP_SHARDING_INFO"]))

    assert order(tmp_dir / "cpu") == list(sd)
    assert order(tmp_dir / "accel") == ["c_small", "b_mid", "a_big"]
    w = deepio.dcp.HuggingFaceStorageWriter(str(tmp_dir / "x"))
    assert _common.overlapping_order(w)
    w.thread_count = 2
    assert not _common.overlapping_order(w)
    w.thread_count, w.per_thread_copy_ahead = 1, 0
    assert not _common.overlapping_order(w)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    w.per_thread_copy_ahead = 10_000_000
    assert not _common.overlapping_order(w)
