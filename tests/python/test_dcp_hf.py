"""deepio.dcp.HuggingFaceStorageReader: folders of .safetensors files saved by torch's
HuggingFaceStorageWriter (dcp.save, one process, no process group), loaded with dcp.load
through deepio's reader: values, partial loads, which items go through the engine and which
through torch's fallback, and truncated files refused naming the file.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
require_module("safetensors")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402

import deepio  # noqa: E402
import deepio.dcp  # noqa: E402
import deepio.safetensors  # noqa: E402
from deepio.dcp import _hf  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "f32_2d": torch.randn(37, 19, generator=g),
        "bf16": torch.randn(8, 16, generator=g).bfloat16(),
        "f16_1d": torch.randn(101, generator=g).half(),
        "i64": torch.arange(-500, 500, dtype=torch.int64),
        "odd_u8": torch.arange(0, 251, dtype=torch.uint8),  # an odd number of bytes
        "i8": torch.arange(-7, 6, dtype=torch.int8),
        "f64_3d": torch.randn(3, 5, 7, dtype=torch.float64, generator=g),
        "bool": torch.arange(13) % 3 == 0,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
    }


def _zeros(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _save(folder: Path, sd: dict[str, torch.Tensor]) -> Path:
    dcp.save(sd, storage_writer=dcp.HuggingFaceStorageWriter(str(folder)))
    (data,) = folder.glob("*.safetensors")
    return data


@pytest.fixture
def engine_bytes(monkeypatch) -> list[int]:
    """Bytes of each read that went straight into a destination (a spy on _hf._read_into)."""
    got: list[int] = []
    real = _hf._read_into

    def spy(f, buf, at):
        got.append(buf.nbytes)
        return real(f, buf, at)

    monkeypatch.setattr(_hf, "_read_into", spy)
    return got


@pytest.fixture
def fallback_items(monkeypatch) -> list[str]:
    """The items torch's _process_read_request read (the fallback), by name."""
    got: list[str] = []
    real = deepio.dcp.HuggingFaceStorageReader._process_read_request

    def spy(self, f, req, planner):
        got.append(req.storage_index.fqn)
        return real(self, f, req, planner)

    monkeypatch.setattr(deepio.dcp.HuggingFaceStorageReader, "_process_read_request", spy)
    return got


def test_round_trip_through_the_engine(tmp_dir, engine_bytes, fallback_items):
    sd = _state()
    data = _save(tmp_dir / "hf", sd)
    out = _zeros(sd)
    dcp.load(out, storage_reader=deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf")))
    for k, v in sd.items():
        assert _same(out[k], v), k
    assert fallback_items == []
    assert sorted(engine_bytes) == sorted(v.nbytes for v in sd.values() if v.nbytes)
    # the files are ordinary safetensors files
    from safetensors.torch import load_file

    loaded = load_file(str(data))
    assert set(loaded) == set(sd) and all(_same(loaded[k], v) for k, v in sd.items())


def test_partial_load(tmp_dir, engine_bytes):
    sd = _state()
    _save(tmp_dir / "hf", sd)
    keys = ["bf16", "odd_u8", "scalar"]
    out = {k: torch.zeros_like(sd[k]) for k in keys}
    dcp.load(out, storage_reader=deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf"), thread_count=2))
    for k in keys:
        assert _same(out[k], sd[k]), k
    assert sorted(engine_bytes) == sorted(sd[k].nbytes for k in keys)


def test_several_files(tmp_dir, engine_bytes):
    """fqn_to_index_mapping spreads the items over three files; each is read by its header."""
    sd = _state()
    mapping = {k: 1 + i % 3 for i, k in enumerate(sd)}
    dcp.save(sd, storage_writer=dcp.HuggingFaceStorageWriter(str(tmp_dir / "hf"), fqn_to_index_mapping=mapping))
    assert len(list((tmp_dir / "hf").glob("*.safetensors"))) == 3
    out = _zeros(sd)
    dcp.load(out, storage_reader=deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf"), thread_count=3))
    for k, v in sd.items():
        assert _same(out[k], v), k
    assert sorted(engine_bytes) == sorted(v.nbytes for v in sd.values() if v.nbytes)


def test_fallback_items_are_torchs_and_correct(tmp_dir, engine_bytes, fallback_items):
    """A destination of another dtype and a non-contiguous destination go to torch's
    _process_read_request; the other items still through the engine."""
    sd = _state()
    _save(tmp_dir / "hf", sd)
    out = _zeros(sd)
    out["f32_2d"] = torch.zeros(37, 19, dtype=torch.float64)  # DCP converts on copy_
    out["f64_3d"] = torch.zeros(7, 5, 3, dtype=torch.float64).permute(2, 1, 0)  # non-contiguous
    dcp.load(out, storage_reader=deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf")))
    assert torch.equal(out["f32_2d"], sd["f32_2d"].double())
    assert torch.equal(out["f64_3d"], sd["f64_3d"])
    for k in set(sd) - {"f32_2d", "f64_3d"}:
        assert _same(out[k], sd[k]), k
    assert sorted(fallback_items) == ["f32_2d", "f64_3d"]
    assert sorted(engine_bytes) == sorted(v.nbytes for k, v in sd.items() if v.nbytes and k not in ("f32_2d", "f64_3d"))


def _load_plan(folder: Path, out: dict[str, torch.Tensor]):
    """Torch's steps of dcp.load up to read_data, one process: (reader, plan, planner)."""
    reader = deepio.dcp.HuggingFaceStorageReader(str(folder))
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)
    planner = DefaultLoadPlanner()
    planner.set_up_planner(out, md, True)
    plan = reader.prepare_local_plan(planner.create_local_plan())
    plan = reader.prepare_global_plan(planner.create_global_plan([plan]))[0]
    return reader, planner.finish_plan(plan), planner


def _only(plan, fqn: str, offsets: list[int], lengths: list[int]):
    """``plan`` reduced to one piece of ``fqn``: rows or columns of the stored tensor, into
    the same place of the destination (what a resharded load asks for)."""
    (item,) = [i for i in plan.items if i.storage_index.fqn == fqn]
    piece = dataclasses.replace(
        item, storage_offsets=torch.Size(offsets), dest_offsets=torch.Size(offsets), lengths=torch.Size(lengths)
    )
    return dataclasses.replace(plan, items=[piece])


@pytest.mark.parametrize("rows", [(0, 37), (4, 3), (36, 1)])
def test_rows_are_read_through_the_engine(tmp_dir, engine_bytes, fallback_items, rows):
    sd = _state()
    _save(tmp_dir / "hf", sd)
    out = _zeros(sd)
    reader, plan, planner = _load_plan(tmp_dir / "hf", out)
    start, n = rows
    reader.read_data(_only(plan, "f32_2d", [start, 0], [n, 19]), planner).wait()
    want = torch.zeros_like(sd["f32_2d"])
    want[start : start + n] = sd["f32_2d"][start : start + n]
    assert torch.equal(out["f32_2d"], want)
    assert engine_bytes == [n * 19 * 4] and fallback_items == []


def test_columns_fall_back_to_torch(tmp_dir, engine_bytes, fallback_items):
    sd = _state()
    _save(tmp_dir / "hf", sd)
    out = _zeros(sd)
    reader, plan, planner = _load_plan(tmp_dir / "hf", out)
    reader.read_data(_only(plan, "f32_2d", [0, 2], [37, 5]), planner).wait()
    want = torch.zeros_like(sd["f32_2d"])
    want[:, 2:7] = sd["f32_2d"][:, 2:7]
    assert torch.equal(out["f32_2d"], want)
    assert engine_bytes == [] and fallback_items == ["f32_2d"]


def test_truncated_file_is_refused_naming_it(tmp_dir):
    sd = _state()
    data = _save(tmp_dir / "hf", sd)
    os.truncate(data, data.stat().st_size - 3)
    with pytest.raises(CheckpointException) as info:
        dcp.load(_zeros(sd), storage_reader=deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf")))
    message = str(next(iter(info.value.failures.values()))[0])  # dcp folds it into its message
    assert str(data) in message and "truncated" in message, message
    with pytest.raises(deepio.CorruptFileError) as e:
        deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf")).read_metadata()
    assert e.value.filename == str(data)


def test_file_that_shrinks_after_the_metadata_is_refused(tmp_dir):
    sd = _state()
    data = _save(tmp_dir / "hf", sd)
    out = _zeros(sd)
    reader, plan, planner = _load_plan(tmp_dir / "hf", out)
    os.truncate(data, data.stat().st_size - 100)
    with pytest.raises(deepio.CorruptFileError) as e:
        reader.read_data(plan, planner)
    assert e.value.filename == str(data) and "truncated" in str(e.value)


def test_read_error_names_the_file(tmp_dir, fault):
    sd = {f"t{i}": torch.randn(1 << 16) for i in range(4)}
    data = _save(tmp_dir / "hf", sd)
    fault("read", errno=errno.EIO, after=1)
    with pytest.raises(CheckpointException) as info:
        dcp.load(_zeros(sd), storage_reader=deepio.dcp.HuggingFaceStorageReader(str(tmp_dir / "hf")))
    e = next(iter(info.value.failures.values()))[0]
    assert isinstance(e, OSError) and e.errno == errno.EIO and e.filename == str(data)
