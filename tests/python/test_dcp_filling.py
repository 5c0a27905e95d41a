"""deepio.dcp's filling route (issue 27): large tensor items written as deepio.save writes large
storages, byte for byte torch's files with every CRC-32 right, torch's CRC-32 option
followed, a restarted item written as before, and a write error naming the file."""

from __future__ import annotations

import errno

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import deepio  # noqa: E402
import deepio.dcp  # noqa: E402
from dcp_support import (  # noqa: E402
    _assert_same,
    _cause,
    _data_files,
    _items_are_zips_with_their_crcs,
    _save_both_with_crc32,
    _state,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


# ------------------------------------------------------------------ the filling route (issue 27)


def _mixed(single: bool = False) -> dict:
    """Large tensors (an odd length: 1 MiB + 3 bytes; a transposed view; a slice of a larger
    storage, which DCP clones; a non-float dtype) among small ones and objects."""
    g = torch.Generator().manual_seed(27)
    big = torch.randn(700, 600, generator=g)
    return {
        "odd": torch.randint(0, 255, ((1 << 20) + 3,), dtype=torch.uint8, generator=g),
        "transposed": torch.randn(600, 500, generator=g).t(),
        "slice": big[100:600, 7:],
        "i64": torch.arange((1 << 17) + 1, dtype=torch.int64),
        "small": torch.randn(17, 5, generator=g),
        "step": torch.tensor(3.0),
        "name": "run-27",
    }


def _filled_items(monkeypatch) -> list[int]:
    """Each tensor item the filling route wrote, by its bytes (a spy on _write_filled)."""
    filled: list[int] = []
    real = deepio.dcp._datafile._write_filled

    def spy(t, w, crc, pool=None):
        got = real(t, w, crc, pool)
        if got[0] is not None:
            filled.append(t.untyped_storage().nbytes())
        return got

    monkeypatch.setattr(deepio.dcp._datafile, "_write_filled", spy)
    return filled


@pytest.mark.parametrize("single_file_per_rank", [True, False])
def test_large_tensors_take_the_filling_route_and_write_torchs_bytes(tmp_dir, monkeypatch, single_file_per_rank):
    """Tensor items from _FILL_MIN bytes on are written by deepio.save's filling route (torch's
    zip without the storage bytes, each storage placed from its own memory, CRC-32s computed
    beside the writes and patched in, the serialization id with them): the data files are
    still byte for byte torch's, with small items, objects, odd lengths and views in the same
    file; every item's CRC-32s hold, and both readers load the checkpoint."""
    from deepio.checkpoint import _filling

    monkeypatch.setattr(deepio.dcp._datafile, "_FILL_MIN", 1 << 20)
    filled = _filled_items(monkeypatch)
    pools: list[str] = []  # the CRC thread pools made, by module: one per data file, by _datafile

    def counting(module):
        class Pool(module.ThreadPoolExecutor):
            def __init__(self, *a, **kw):
                pools.append(module.__name__)
                super().__init__(*a, **kw)

        monkeypatch.setattr(module, "ThreadPoolExecutor", Pool)

    counting(deepio.dcp._datafile)
    counting(_filling)
    sd = _mixed()
    kw = {"single_file_per_rank": single_file_per_rank}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d", **kw))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_dir / "t", **kw))
    large = [sd[k].untyped_storage().nbytes() for k in ("odd", "transposed", "i64")] + [sd["slice"].nbytes]
    assert sorted(filled) == sorted(large)
    ours, theirs = _data_files(tmp_dir / "d"), _data_files(tmp_dir / "t")
    assert pools == ["deepio.dcp._datafile"] * len(ours)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name] == theirs[name], name
    _items_are_zips_with_their_crcs(tmp_dir / "d")
    for reader in (dcp.FileSystemReader(tmp_dir / "d"), deepio.dcp.FileSystemReader(tmp_dir / "d")):
        out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else "" for k, v in sd.items()}
        dcp.load(out, storage_reader=reader)
        _assert_same(out, sd)


def test_small_tensors_stay_on_torch_save(tmp_dir, monkeypatch):
    """Below _FILL_MIN no item takes the filling route (torch.save into the staging buffers
    costs less there)."""
    filled = _filled_items(monkeypatch)
    dcp.save(_state(), storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d"))
    assert filled == []


@pytest.mark.parametrize("crc32", [True, False])
def test_filling_route_follows_torchs_crc32_option(tmp_dir, monkeypatch, crc32):
    """torch's writer calls torch.save, whose records carry CRC-32s as
    torch.serialization.set_crc32_options says: the filling route follows it, byte for byte."""
    monkeypatch.setattr(deepio.dcp._datafile, "_FILL_MIN", 1 << 20)
    filled = _filled_items(monkeypatch)
    _save_both_with_crc32(_mixed(), tmp_dir, crc32)
    assert len(filled) == 4 and _data_files(tmp_dir / "d") == _data_files(tmp_dir / "t")


@pytest.mark.parametrize("where", ["first", "last"])
def test_filling_route_that_starts_again_writes_the_item_as_before(tmp_dir, monkeypatch, where):
    """A filling attempt that meets a mismatch (_FillMismatch: torch's records and the queued
    storages disagree) after writing more than the item's bytes: the item is written again
    from its start by torch.save, and what the attempt left past the file's end is cut off;
    the file is torch's."""
    from deepio.checkpoint import _filling

    monkeypatch.setattr(deepio.dcp._datafile, "_FILL_MIN", 1 << 20)
    sd = {"a": torch.randn((1 << 18) + 1), "b": torch.randn(1 << 19), "s": torch.arange(5)}
    victim = sd["a"] if where == "first" else sd["b"]
    real = _filling._save_filling
    attempts = []

    def mismatching(obj, w, *args, **kwargs):
        if obj.untyped_storage().nbytes() != victim.nbytes:
            return real(obj, w, *args, **kwargs)
        attempts.append(w.tell())
        w.write(b"\xee" * (victim.nbytes + 10_000))
        w._error = _filling._FillMismatch("test: a mismatch")
        raise w._error

    monkeypatch.setattr(_filling, "_save_filling", mismatching)
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d"))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_dir / "t"))
    assert len(attempts) == 1
    assert _data_files(tmp_dir / "d") == _data_files(tmp_dir / "t")


def test_write_error_on_the_filling_route_names_the_file(tmp_dir, fault):
    """An EIO from the engine while the filling route writes a storage (from its own memory
    where the folder takes direct I/O) fails dcp.save with that OSError naming the data file."""
    fault("write", errno=errno.EIO, after=1, path_contains=".distcp")
    with pytest.raises(CheckpointException) as info:
        sd = {f"t{i}": torch.randn(3 << 20) for i in range(3)}  # 12 MiB each
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    e = _cause(info)
    assert isinstance(e, OSError) and e.errno == errno.EIO and e.filename == str(tmp_dir / "ck" / "__0_0.distcp")
    assert not (tmp_dir / "ck" / ".metadata").exists()
