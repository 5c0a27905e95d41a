"""deepio.dcp: torch.distributed.checkpoint's FileSystemWriter/Reader through the engine.

Real saves and loads with dcp.save/dcp.load (no process group: one process; and two ranks
over gloo in dcp_program.py), checked value by value and against torch's own storage classes
byte for byte, plus the crash-safety promises: metadata last, overwrite=False, a folder without
metadata (a save killed with SIGKILL) and a truncated data file refused with clear errors.
Several drives (extra_paths): test_dcp_extra_paths.py; the filling route:
test_dcp_filling.py; shared helpers: dcp_support.py.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import deepio  # noqa: E402
import deepio.dcp  # noqa: E402
from dcp_support import _assert_same, _cause, _data_files, _state  # noqa: E402
from deepio.dcp import _record  # noqa: E402

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.mark.wheel
@pytest.mark.parametrize("single_file_per_rank", [True, False])
@pytest.mark.parametrize("sync_files", [True, False])
def test_round_trip(tmp_dir, single_file_per_rank, sync_files):
    want = _state()
    writer = deepio.dcp.FileSystemWriter(
        tmp_dir / "ck", single_file_per_rank=single_file_per_rank, sync_files=sync_files
    )
    dcp.save(_state(), storage_writer=writer)
    names = sorted(os.listdir(tmp_dir / "ck"))
    assert ".metadata" in names and not [n for n in names if "tmp" in n], names
    assert (len(names) == 2) == single_file_per_rank, names
    out = _state(fill=False)
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    _assert_same(out, want)


@pytest.mark.parametrize("thread_count", [1, 3])
def test_files_are_torchs(tmp_dir, thread_count):
    """deepio's writer writes the data files torch's writes, byte for byte (and so the same
    items); each reader loads the other's checkpoint."""
    dcp.save(_state(), storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d", thread_count=thread_count))
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(tmp_dir / "t", thread_count=thread_count))
    ours, theirs = _data_files(tmp_dir / "d"), _data_files(tmp_dir / "t")
    assert len(ours) == thread_count and ours == theirs
    for reader in (dcp.FileSystemReader(tmp_dir / "d"), deepio.dcp.FileSystemReader(tmp_dir / "t")):
        out = _state(fill=False)
        dcp.load(out, storage_reader=reader)
        _assert_same(out, _state())


def test_partial_load_and_bigger_tensors(tmp_dir, monkeypatch):
    """Tensors across the engine's request size (1 MiB) and the reader's batches; a load of
    a subset of the keys reads only those."""
    sd = {f"t{i}": torch.randn((1 << 18) + 3 * i) for i in range(6)}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    monkeypatch.setattr(deepio.dcp._reader, "READ_BATCH_BYTES", 1 << 20)  # several batches
    out = {k: torch.empty_like(v) for k, v in sd.items() if k in ("t1", "t4", "t5")}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    for k, v in out.items():
        assert torch.equal(v, sd[k]), k


def test_async_save(tmp_dir):
    """torch's async_save (staging on a thread) with deepio's writer."""
    fut = dcp.async_save(_state(), storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    fut.result()
    out = _state(fill=False)
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    _assert_same(out, _state())


def test_overwrite_false_refuses_existing(tmp_dir):
    dcp.save({"a": torch.ones(3)}, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    before = _data_files(tmp_dir / "ck")
    with pytest.raises(CheckpointException) as info:
        dcp.save({"a": torch.zeros(3)}, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck", overwrite=False))
    e = _cause(info)
    assert isinstance(e, FileExistsError) and "overwrite=False" in str(e) and e.filename == str(tmp_dir / "ck")
    assert _data_files(tmp_dir / "ck") == before  # nothing written


def test_overwrite_true_replaces(tmp_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in (1.0, 2.0):
            dcp.save({"a": torch.full((3,), value)}, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    out = {"a": torch.zeros(3)}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    assert torch.equal(out["a"], torch.full((3,), 2.0))


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_failed_overwrite_leaves_the_old_checkpoint(tmp_dir):
    """A save over an old checkpoint that fails once data files are being written leaves the
    old checkpoint whole (new data goes under new names, .metadata is switched last): load
    gives the old values, not a mix (what torch's writer leaves) and not nothing."""
    dcp.save({"a": torch.ones(4), "b": torch.ones(4)}, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    bad = {"a": torch.zeros(4), "b": torch.zeros(4), "z": _Unpicklable()}
    with pytest.raises(CheckpointException, match="cannot pickle this"):
        dcp.save(bad, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck", single_file_per_rank=False))
    out = {"a": torch.empty(4), "b": torch.empty(4)}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    assert torch.equal(out["a"], torch.ones(4)) and torch.equal(out["b"], torch.ones(4))


def test_write_error_mid_save_leaves_the_old_checkpoint(tmp_dir, fault):
    """An EIO from the engine on a data file's write (test hooks) fails dcp.save with that
    OSError naming the data file (the save's own, in a folder of its own next to the old
    checkpoint's files); the old checkpoint still loads."""
    dcp.save({"t0": torch.ones(4)}, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    fault("write", errno=errno.EIO, after=2, path_contains=".distcp")
    with pytest.raises(CheckpointException) as info:
        sd = {f"t{i}": torch.randn(1 << 20) for i in range(4)}
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    e = _cause(info)
    assert isinstance(e, OSError) and e.errno == errno.EIO
    name = Path(e.filename)
    assert name.name == "__0_0.distcp" and name.parent.parent == tmp_dir / "ck" and name.parent.name.startswith("save.")
    out = {"t0": torch.empty(4)}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    assert torch.equal(out["t0"], torch.ones(4))


def test_read_errors_at_load(tmp_dir, fault):
    """An EIO on a read of a data file is the OSError naming it (every read waited for first);
    a short transfer is read on by the engine, not an error."""
    sd = {f"t{i}": torch.randn(1 << 18) for i in range(4)}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    data = str(tmp_dir / "ck" / "__0_0.distcp")
    fault("read", errno=errno.EIO, after=3)
    with pytest.raises(CheckpointException) as info:
        dcp.load(
            {k: torch.empty_like(v) for k, v in sd.items()}, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck")
        )
    e = _cause(info)
    assert isinstance(e, OSError) and e.errno == errno.EIO and e.filename == data
    fault("read", short=100, after=3)  # the engine reads the rest again: no error
    out = {k: torch.empty_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck"))
    for k, v in sd.items():
        assert torch.equal(out[k], v), k


def test_killed_first_save_is_refused(tmp_dir):
    """A first save killed with SIGKILL mid-way leaves data files and no metadata; dcp.load
    refuses the folder, saying why. (Killed over an older checkpoint, the old one stays:
    test_dcp_ownership.py.)"""
    folder = tmp_dir / "ck"
    r = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / "dcp_program.py"), "killed-first", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    assert list(folder.glob("*.distcp")) and not (folder / ".metadata").exists()
    with pytest.raises(CheckpointException) as info:
        dcp.load({"a": torch.empty(1 << 20)}, storage_reader=dcp.FileSystemReader(folder))  # torch's too
    # dcp.load tries the global .metadata, then the rank's own, and reports both failures
    with pytest.raises(CheckpointException) as info:
        dcp.load({"a": torch.empty(1 << 20)}, storage_reader=deepio.dcp.FileSystemReader(folder))
    message = str(_cause(info))
    assert f"no checkpoint at {str(folder)!r}: the folder has no metadata file (.metadata)" in message
    assert "a save killed before it finished" in message


def test_missing_folder_is_refused(tmp_dir):
    with pytest.raises(CheckpointException) as info:
        dcp.load({"a": torch.empty(1)}, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "nothing"))
    assert f"no checkpoint at {str(tmp_dir / 'nothing')!r}: the folder does not exist" in str(_cause(info))


@pytest.mark.parametrize("keep", [0, 100, -1])
def test_truncated_data_file_is_refused(tmp_dir, keep):
    sd = {"a": torch.arange(1000.0), "b": torch.arange(10)}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "ck"))
    data = tmp_dir / "ck" / "__0_0.distcp"
    size = data.stat().st_size
    os.truncate(data, size + keep if keep < 0 else keep)
    with pytest.raises(CheckpointException) as info:
        dcp.load(
            {k: torch.empty_like(v) for k, v in sd.items()}, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "ck")
        )
    e = _cause(info)
    assert isinstance(e, deepio.CorruptFileError) and e.filename == str(data)
    assert "truncated: item '" in str(e) and f"has {os.path.getsize(data)} bytes" in str(e)


# Two gloo ranks over one folder: slow (the default run has test_dcp_ranks.py's two ranks over three folders).
@pytest.mark.slow
def test_two_ranks_gloo(tmp_dir):
    """Two processes over gloo: DTensors sharded over both ranks, tensors of each rank's own,
    shared values; loaded back in the same layout, resharded, and crosswise with torch's
    classes (dcp_program.py checks every value). The data files equal torch's, and one process
    without a process group loads the sharded tensor whole."""
    r = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / "dcp_program.py"), "ranks", str(tmp_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and "ranks OK" in r.stdout, r.stdout + r.stderr
    ours, theirs = _data_files(tmp_dir / "deepio"), _data_files(tmp_dir / "torch")
    assert sorted(ours) == ["__0_0.distcp", "__1_0.distcp"] and ours == theirs
    out = {
        "model": {"w": torch.zeros(256, 48), "b": torch.zeros(256, 48, dtype=torch.bfloat16)},
        "own1": torch.zeros(5, dtype=torch.int64),
    }
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(tmp_dir / "deepio"))
    full = torch.arange(256 * 48, dtype=torch.float32).reshape(256, 48)
    assert torch.equal(out["model"]["w"], full - 5)
    assert torch.equal(out["model"]["b"], full.bfloat16() - 5)
    assert torch.equal(out["own1"], torch.ones(5, dtype=torch.int64))


def test_import_deepio_leaves_dcp_alone():
    code = (
        "import sys, deepio\n"
        "assert 'torch.distributed.checkpoint' not in sys.modules\n"
        "print(deepio.dcp.FileSystemWriter.__module__)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "deepio.dcp._writer", r.stderr


def _saved(obj) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool, torch.complex64]
)
def test_record_layout_finds_the_storage(dtype):
    """_record.layout, from a DCP tensor item's first and last 4 KiB (torch.save of the
    tensor), finds the storage's bytes; piece() finds each narrowing that is one run of them
    and refuses the others."""
    t = (torch.arange(64 * 40) % 2 == 0) if dtype == torch.bool else (torch.arange(64 * 40) % 120).to(dtype)
    t = t.reshape(64, 40)
    blob = _saved(t)
    lay = _record.layout(blob[:4096], blob[-4096:], len(blob))
    assert lay is not None and lay.dtype == dtype and lay.size == (64, 40) and lay.storage_offset == 0
    assert blob[lay.data_start : lay.data_start + lay.data_nbytes] == _raw(t)
    runs = [((0, 0), (64, 40)), ((5, 0), (7, 40)), ((9, 3), (1, 30)), ((63, 39), (1, 1)), ((3, 0), (0, 40))]
    for (o0, o1), (n0, n1) in runs:
        where = _record.piece(lay, (o0, o1), (n0, n1))
        assert where is not None, (o0, o1, n0, n1)
        assert blob[where[0] : where[0] + where[1]] == _raw(t[o0 : o0 + n0, o1 : o1 + n1])
    for offsets, lengths in [((5, 3), (2, 30)), ((0, 0), (64, 39)), ((60, 0), (5, 40)), ((0,), (64,))]:
        assert _record.piece(lay, offsets, lengths) is None, (offsets, lengths)


def test_record_layout_refuses_what_it_does_not_know():
    big = torch.arange(4096.0)
    transposed = _record.layout(*(lambda b: (b[:4096], b[-4096:], len(b)))(_saved(big.reshape(64, 64).t())))
    assert transposed is not None and _record.piece(transposed, (0, 0), (64, 64)) is None  # strides say no
    for blob in (_saved({"a": big}), _saved([big, big]), os.urandom(20000), b"PK" * 10000):
        assert _record.layout(blob[:4096], blob[-4096:], len(blob)) is None
    shifted = _saved(big[100:])  # a view past its storage's start (DCP clones such views first)
    lay = _record.layout(shifted[:4096], shifted[-4096:], len(shifted))
    assert lay is not None and lay.storage_offset == 100
    where = _record.piece(lay, (0,), (3996,))
    assert where is not None and shifted[where[0] : where[0] + where[1]] == _raw(big[100:])
