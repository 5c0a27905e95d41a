"""deepio.dcp.FileSystemWriter's route for device tensors, run on the host.

A CUDA tensor item of _FILL_MIN bytes or more is written as its host copy's record (pickled
from an unfilled host stand-in, _device_twin) with the bytes staged from the tensor's memory
through a small ring of host buffers and their CRC-32 computed from the same host bytes
(FillingWriter._write_staged). The route is device-agnostic except for the CUDA stream, events
and pinned allocation; these tests run it on CPU tensors (``_STAGED_DEVICES`` with "cpu")
against torch's own writer, byte for byte. tests/python/test_gpu_real.py runs it on CUDA.

Also here: the order of a data file's tensors where torch's writer would take them through its
overlapping loader (one thread and an accelerator: smallest first).
"""

from __future__ import annotations

import errno
import time
import zlib
from pathlib import Path

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import deepio.dcp  # noqa: E402
from deepio.checkpoint import _filling  # noqa: E402
from deepio.dcp import _datafile, _writer  # noqa: E402
from test_dcp import _data_files, _items_are_zips_with_their_crcs, _save_both_with_crc32  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture
def staged(monkeypatch) -> list[int]:
    """CPU tensors take the device route, from 1 MiB, in unaligned pieces of 300,000 bytes
    through the ring: returns the bytes of each storage _write_staged wrote."""
    monkeypatch.setattr(_datafile, "_STAGED_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(_datafile, "_FILL_MIN", 1 << 20)
    monkeypatch.setattr(_filling, "_STAGE_CHUNK", 300_000)
    wrote: list[int] = []
    real = _filling.FillingWriter._write_staged

    def spy(self, src):
        wrote.append(int(src.numel()))
        return real(self, src)

    monkeypatch.setattr(_filling.FillingWriter, "_write_staged", spy)
    return wrote


def _state() -> dict:
    """Large tensors of every kind of layout (dense, a dense view at an offset of a larger
    storage, transposed, not dense, an unaligned length) among small ones and objects."""
    g = torch.Generator().manual_seed(31)
    big = torch.randn(700, 600, generator=g)
    return {
        "odd": torch.randint(0, 255, ((1 << 20) + 3,), dtype=torch.uint8, generator=g),
        "rows": big[100:600],  # dense, at an offset: its span of the storage is written
        "transposed": torch.randn(600, 500, generator=g).t(),  # dense: its strides kept
        "cols": big[:, 7:],  # not dense: cloned, contiguous (as .cpu() of it would be)
        "bf16": torch.randn(1 << 20, generator=g).bfloat16(),
        "small": torch.randn(17, 5, generator=g),
        "step": torch.tensor(3.0),
        "name": "run-27",
    }


def _loads(folder: Path, want: dict) -> None:
    for reader in (dcp.FileSystemReader(folder), deepio.dcp.FileSystemReader(folder)):
        out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else "" for k, v in want.items()}
        dcp.load(out, storage_reader=reader)
        for k, v in want.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(out[k], v), k
            else:
                assert out[k] == v, k


def test_device_twin_keeps_a_dense_tensors_memory_and_clones_only_what_is_not_dense(monkeypatch):
    monkeypatch.setattr(_datafile, "_STAGED_DEVICES", frozenset({"cpu"}))
    sd = _state()
    for key in ("rows", "transposed", "odd"):
        t = sd[key]
        stand, src = _datafile._device_twin(t)
        assert stand.shape == t.shape and stand.stride() == t.stride() and stand.dtype == t.dtype, key
        assert stand.untyped_storage().nbytes() == t.nbytes == src.numel(), key
        assert src.data_ptr() == t.data_ptr(), key  # the tensor's own bytes, no copy
    stand, src = _datafile._device_twin(sd["cols"])
    assert stand.is_contiguous() and src.data_ptr() != sd["cols"].data_ptr()
    assert torch.equal(src, sd["cols"].contiguous().reshape(-1).view(torch.uint8))
    monkeypatch.setattr(_datafile, "_STAGED_DEVICES", frozenset({"cuda"}))
    assert _datafile._device_twin(sd["rows"]) is None


@pytest.mark.parametrize("combine", [True, False], ids=["pieces-combined", "one-running-crc"])
@pytest.mark.parametrize("single_file_per_rank", [True, False])
def test_staged_route_writes_torchs_bytes(tmp_dir, staged, monkeypatch, combine, single_file_per_rank):
    """Every large item goes through the ring (a slow CRC-32 on the helper threads, so that a
    buffer taken again before its CRC is done would give wrong CRCs), and the data files are
    torch's writer's byte for byte, every record's CRC-32 holds, and both readers load it."""

    def slow_crc(data, value=0):
        time.sleep(0.002)
        return zlib.crc32(data, value)

    monkeypatch.setattr(_filling, "_crc32", slow_crc)
    if not combine:
        monkeypatch.setattr(_filling, "_crc32_combine", None)
    elif _filling._crc32_combine is None:
        pytest.skip("zlib-ng (the checkpoint extra) is not installed: no crc32_combine")
    sd = _state()
    kw = {"single_file_per_rank": single_file_per_rank}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d", **kw))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_dir / "t", **kw))
    assert sorted(staged) == sorted(sd[k].nbytes for k in ("odd", "rows", "transposed", "cols", "bf16"))
    ours, theirs = _data_files(tmp_dir / "d"), _data_files(tmp_dir / "t")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name] == theirs[name], name
    _items_are_zips_with_their_crcs(tmp_dir / "d")
    _loads(tmp_dir / "d", sd)


@pytest.mark.parametrize("crc32", [True, False])
def test_staged_route_follows_torchs_crc32_option(tmp_dir, staged, crc32):
    _save_both_with_crc32(_state(), tmp_dir, crc32)
    assert len(staged) == 5 and _data_files(tmp_dir / "d") == _data_files(tmp_dir / "t")


def test_staged_item_that_starts_again_is_written_from_a_host_copy(tmp_dir, staged, monkeypatch):
    """A mismatch on the device route after writing past the item: the item is written again
    by torch.save from the tensor's host copy (not from the unfilled stand-in), the rest cut
    off: the file is torch's."""
    sd = {"a": torch.randn((1 << 18) + 1), "b": torch.randn(1 << 19), "s": torch.arange(5)}
    real = _filling._save_filling
    attempts = []

    def mismatching(obj, w, *args, **kwargs):
        if obj.untyped_storage().nbytes() != sd["a"].nbytes:
            return real(obj, w, *args, **kwargs)
        attempts.append(w.tell())
        assert w._twins  # the stand-in is twinned with the tensor's bytes
        w.write(b"\xee" * (sd["a"].nbytes + 10_000))
        w._error = _filling._FillMismatch("test: a mismatch")
        raise w._error

    monkeypatch.setattr(_filling, "_save_filling", mismatching)
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d"))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_dir / "t"))
    assert len(attempts) == 1 and staged == [sd["b"].nbytes]
    assert _data_files(tmp_dir / "d") == _data_files(tmp_dir / "t")
    _loads(tmp_dir / "d", sd)


def test_staged_write_error_names_the_file_and_leaves_no_metadata(tmp_dir, staged, fault):
    fault("write", errno=errno.EIO, after=2, path_contains=".distcp")
    with pytest.raises(CheckpointException) as info:
        dcp.save({f"t{i}": torch.randn(1 << 20) for i in range(3)}, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir))
    e = next(iter(info.value.failures.values()))[0]
    assert isinstance(e, OSError) and e.errno == errno.EIO and e.filename == str(tmp_dir / "__0_0.distcp")
    assert staged and not (tmp_dir / ".metadata").exists()


def test_tensors_go_smallest_first_where_torch_would_overlap_its_copies(tmp_dir, monkeypatch):
    """Where torch's writer takes tensors through _OverlappingCpuLoader (one thread, an
    accelerator), its files hold them smallest first (a stable sort); deepio's writer writes
    them in that order then, bytes items first as always; and in the planned order otherwise."""
    g = torch.Generator().manual_seed(3)
    sd = {
        "a": torch.randn(300, generator=g),
        "b": torch.randn(100, generator=g),
        "c": torch.randn(200, generator=g),
        "d": torch.randn(100, generator=g),
        "name": "run-27",
    }

    def order(folder: Path) -> list[str]:
        md = dcp.FileSystemReader(folder).read_metadata()
        return [i.fqn for i, _ in sorted(md.storage_data.items(), key=lambda kv: kv[1].offset)]

    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "plain"))
    monkeypatch.setattr(_writer, "overlapping_order", lambda w: True)
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "sorted"))
    assert order(tmp_dir / "sorted") == ["name", "b", "d", "c", "a"]
    assert order(tmp_dir / "plain") != order(tmp_dir / "sorted")
    _loads(tmp_dir / "sorted", sd)
