"""deepio.dcp: torch.distributed.checkpoint's FileSystemWriter/Reader through the engine.

Real saves and loads with dcp.save/dcp.load (no process group: one process; and two ranks
over gloo in dcp_program.py), checked value by value and against torch's own storage classes
byte for byte, plus the crash-safety promises: metadata last, overwrite=False, a folder without
metadata (a save killed with SIGKILL) and a truncated data file refused with clear errors.
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
from deepio.dcp import _record  # noqa: E402

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _state(fill: bool = True) -> dict:
    """A nested state dict: tensors of several dtypes, views DCP must make contiguous (a
    transposed one; a slice of a larger storage), an empty tensor, objects, and an
    optimizer-like part."""
    g = torch.Generator().manual_seed(1)

    def t(x: torch.Tensor) -> torch.Tensor:
        return x if fill else torch.zeros_like(x)

    big = torch.randn(64, 32, generator=g)
    return {
        "model": {
            "f32": t(torch.randn(17, 5, generator=g)),
            "f16": t(torch.randn(33, generator=g).half()),
            "bf16": t(torch.randn(4, 4, generator=g).bfloat16()),
            "i64": t(torch.arange(-50, 50, dtype=torch.int64)),
            "i8": t(torch.arange(-100, 100, 3, dtype=torch.int8)),
            "u8": t(torch.arange(0, 250, 7, dtype=torch.uint8)),
            "bool": t(torch.arange(10) % 3 == 0),
            "c64": t(torch.randn(6, dtype=torch.complex64, generator=g)),
            "f64": t(torch.randn(3, 3, 3, dtype=torch.float64, generator=g)),
            "transposed": t(torch.randn(7, 9, generator=g).t()),
            "slice": t(big[10:20, 3:8]),  # a view of part of a larger storage
            "empty": t(torch.empty(0, 4)),
        },
        "optim": {
            "state": {
                "0": {"step": t(torch.tensor(12.0)), "exp_avg": t(torch.randn(17, 5, generator=g))},
                "1": {"step": t(torch.tensor(12.0)), "exp_avg_sq": t(torch.rand(33, generator=g))},
            },
            "param_groups": [{"lr": 0.01 if fill else 0.0, "betas": (0.9, 0.999), "params": ["0", "1"]}],
        },
        "epoch": 3 if fill else 0,
        "name": "run-7" if fill else "",
        "blob": {"bytes": b"\x00\x01deepio" if fill else b"", "list": [1, 2.5, "x"] if fill else []},
    }


def _assert_same(got, want, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{got.shape}"
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), where
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)) and any(isinstance(x, (dict, torch.Tensor)) for x in want):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _cause(excinfo: pytest.ExceptionInfo) -> BaseException:
    """The exception a rank raised, from dcp's CheckpointException (or the exception itself)."""
    e = excinfo.value
    if isinstance(e, CheckpointException):
        return next(iter(e.failures.values()))[0]
    return e


def _data_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.distcp"))}


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


# ---------------------------------------------------------- several drives: extra_paths


def _drives(tmp_dir: Path) -> tuple[Path, list[Path]]:
    """The main path and two extra folders, standing in for three drives (plain folders on
    the test disk: the spreading and the bookkeeping are the point, not the devices)."""
    return tmp_dir / "nvme0" / "ck", [tmp_dir / "nvme1" / "ck", tmp_dir / "nvme2" / "ck"]


def _with_big(sd: dict) -> dict:
    g = torch.Generator().manual_seed(2)
    sd["big"] = {f"b{i}": torch.randn(20000 + 1000 * i, generator=g) for i in range(5)}
    return sd


def _relative_paths(main: Path) -> set[str]:
    meta = deepio.dcp.FileSystemReader(main).read_metadata()
    return {info.relative_path for info in meta.storage_data.values()}


@pytest.mark.parametrize("single_file_per_rank", [True, False])
def test_extra_paths_spread_files_and_load_from_the_main_path(tmp_dir, single_file_per_rank):
    """Data files spread over the main path and two extra folders (each gets data, none gets
    metadata); the metadata records each file (relative in the main path, by its absolute
    path elsewhere); deepio's reader, given only the main path, loads every value, and so
    does torch's while the folders stay where they were written."""
    main, extra = _drives(tmp_dir)
    writer = deepio.dcp.FileSystemWriter(main, extra_paths=extra, single_file_per_rank=single_file_per_rank)
    dcp.save(_with_big(_state()), storage_writer=writer)
    assert sorted(n for n in os.listdir(main) if not n.endswith(".distcp")) == [".metadata"]
    sizes = []
    for folder in (main, *extra):
        files = list(folder.glob("*.distcp")) + list(folder.glob("*/*.distcp"))
        assert files, f"{folder} got no data file"
        sizes.append(sum(f.stat().st_size for f in files))
    # each extra folder holds one folder of this save's own (issue 36): data files and its owner
    assert all(len(os.listdir(folder)) == 1 for folder in extra)
    for d in (d for f in extra for d in f.iterdir()):
        assert sorted(os.listdir(d)) == sorted([*(f.name for f in d.glob("*.distcp")), "owner"])
    assert max(sizes) - min(sizes) <= 4 * 25000 + 8192, sizes  # round robin by size: within one file
    recorded = _relative_paths(main)
    assert {os.path.dirname(os.path.dirname(p)) for p in recorded} == {"", str(extra[0]), str(extra[1])}, recorded
    for reader in (deepio.dcp.FileSystemReader(main), dcp.FileSystemReader(main)):
        out = _with_big(_state(fill=False))
        dcp.load(out, storage_reader=reader)
        _assert_same(out, _with_big(_state()))


def test_extra_paths_empty_is_todays_checkpoint(tmp_dir):
    """extra_paths=[] (or None) writes what it wrote before: torch's data files byte for
    byte, every file recorded relative to the main path."""
    dcp.save(_state(), storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d", extra_paths=[], thread_count=2))
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(tmp_dir / "t", thread_count=2))
    assert _data_files(tmp_dir / "d") == _data_files(tmp_dir / "t")
    assert _relative_paths(tmp_dir / "d") == _relative_paths(tmp_dir / "t") == {"__0_0.distcp", "__0_1.distcp"}


def test_moved_extra_folders_load_with_folder_map(tmp_dir):
    """After the extra folders moved: deepio's reader refuses, naming the missing file, its
    folder and folder_map (before reading anything); torch's reader fails to open the file
    where it was; deepio's reader with folder_map={old: new} loads every value (relative
    paths in the map taken from the current folder)."""
    main, extra = _drives(tmp_dir)
    dcp.save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    moved = [tmp_dir / "new1", tmp_dir / "new2"]
    for old, new in zip(extra, moved):
        os.rename(old, new)

    def extra_of(p: str) -> str:
        return os.path.dirname(os.path.dirname(p))

    missing = {str(p) for p in _relative_paths(main) if extra_of(p) == str(extra[0])}
    with pytest.raises(CheckpointException) as info:
        dcp.load(_with_big(_state(fill=False)), storage_reader=deepio.dcp.FileSystemReader(main))
    e = _cause(info)
    assert isinstance(e, FileNotFoundError) and e.filename in missing | {
        str(p) for p in _relative_paths(main) if extra_of(p) == str(extra[1])
    }
    folder = extra_of(e.filename)
    assert f"its folder {folder!r} does not exist" in str(e) and f"folder_map={{{folder!r}: NEW_FOLDER}}" in str(e)
    with pytest.raises(CheckpointException) as info:
        dcp.load(_with_big(_state(fill=False)), storage_reader=dcp.FileSystemReader(main))
    assert isinstance(_cause(info), FileNotFoundError)
    # One folder mapped, the other not: the error names the one still missing.
    with pytest.raises(CheckpointException) as info:
        reader = deepio.dcp.FileSystemReader(main, folder_map={extra[0]: moved[0]})
        dcp.load(_with_big(_state(fill=False)), storage_reader=reader)
    assert extra_of(_cause(info).filename) == str(extra[1])
    cwd = os.getcwd()
    os.chdir(tmp_dir)
    try:
        reader = deepio.dcp.FileSystemReader(main, folder_map={str(extra[0]): "new1", extra[1]: Path("new2")})
    finally:
        os.chdir(cwd)
    out = _with_big(_state(fill=False))
    dcp.load(out, storage_reader=reader)
    _assert_same(out, _with_big(_state()))


def test_missing_file_in_an_extra_folder_is_named(tmp_dir):
    main, extra = _drives(tmp_dir)
    dcp.save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    gone = next(extra[1].glob("*/*.distcp"))
    gone.unlink()
    with pytest.raises(CheckpointException) as info:
        dcp.load(_with_big(_state(fill=False)), storage_reader=deepio.dcp.FileSystemReader(main))
    e = _cause(info)
    assert isinstance(e, FileNotFoundError) and e.filename == str(gone)
    assert f"its folder {str(extra[1])!r} has no {gone.parent.name}/{gone.name}" in str(e)


def test_extra_folders_are_read_at_once_with_one_planner_call_at_a_time(tmp_dir, monkeypatch):
    """deepio's reader reads the files of each folder (drive) on a thread of its own, all
    folders at once, through the one default engine (its scheduler serves every device at
    once): each folder's first file waits at a barrier for the other two (which sequential
    reading would never reach: BrokenBarrierError). The planner still sees one call at a time."""
    import threading
    import time

    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    main, extra = _drives(tmp_dir)
    dcp.save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    barrier = threading.Barrier(3, timeout=20)
    first: set[str] = set()
    engines = set()  # the engine each folder's files went through
    real = deepio.dcp.FileSystemReader._read_file

    def meeting(self, path, reqs, planner, handle=None):
        folder = os.path.dirname(path)
        folder = folder if folder == str(main) else os.path.dirname(folder)
        if folder not in first:
            first.add(folder)
            engines.add(id(handle) if handle is not None else None)
            barrier.wait()
        return real(self, path, reqs, planner, handle)

    monkeypatch.setattr(deepio.dcp.FileSystemReader, "_read_file", meeting)
    inside = []  # planner calls running now: never more than one

    class Watching(DefaultLoadPlanner):
        def _watch(self, call, *args):
            inside.append(1)
            try:
                assert len(inside) == 1, "two planner calls at once"
                time.sleep(0.001)
                return call(*args)
            finally:
                inside.pop()

        def resolve_tensor(self, req):
            return self._watch(super().resolve_tensor, req)

        def commit_tensor(self, req, tensor):
            return self._watch(super().commit_tensor, req, tensor)

        def load_bytes(self, req, value):
            return self._watch(super().load_bytes, req, value)

    out = _with_big(_state(fill=False))
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main), planner=Watching())
    assert first == {str(main), str(extra[0]), str(extra[1])}
    assert engines == {None}  # the default engine for every folder
    _assert_same(out, _with_big(_state()))


def test_every_folder_is_written_through_the_one_default_engine(tmp_dir, monkeypatch):
    """The writer's files, in the main path and in each extra folder, all go through the
    process's default engine: no engine per drive (the engine's scheduler keeps every drive
    busy at once, tests/cpp/test_scheduler.cpp)."""
    main, extra = _drives(tmp_dir)
    used: dict[str, set] = {}
    real = deepio.dcp._datafile.write_file

    def spy(path, key, items, planner, durable, by_size=False, handle=None, **kw):
        folder = os.path.dirname(path)
        used.setdefault(folder if folder == str(main) else os.path.dirname(folder), set()).add(handle)
        return real(path, key, items, planner, durable, by_size, handle, **kw)

    monkeypatch.setattr(deepio.dcp._datafile, "write_file", spy)
    writer = deepio.dcp.FileSystemWriter(main, extra_paths=extra, thread_count=4)
    dcp.save(_with_big(_state()), storage_writer=writer)
    assert used == {str(main): {None}, str(extra[0]): {None}, str(extra[1]): {None}}, used
    out = _with_big(_state(fill=False))
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    _assert_same(out, _with_big(_state()))


def test_a_corrupt_file_on_one_drive_fails_the_load_naming_it(tmp_dir):
    """A data file cut short in one extra folder while the other folders read: the load
    raises CorruptFileError naming that file, once every folder's thread stopped."""
    main, extra = _drives(tmp_dir)
    dcp.save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    victim = max(extra[1].glob("*/*.distcp"), key=lambda p: p.stat().st_size)
    os.truncate(victim, victim.stat().st_size // 2)
    with pytest.raises(CheckpointException) as info:
        dcp.load(_with_big(_state(fill=False)), storage_reader=deepio.dcp.FileSystemReader(main))
    e = _cause(info)
    assert isinstance(e, deepio.CorruptFileError) and str(victim) in str(e)


def test_overwrite_false_and_shared_extra_folders(tmp_dir):
    """overwrite=False refuses a main path that holds a checkpoint, before writing anything;
    another checkpoint's files in an extra folder are no reason to refuse (each save's files
    are in a folder of its own there: issue 36), and both checkpoints load; missing extra
    folders are made."""
    main, extra = _drives(tmp_dir)
    dcp.save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    before = {f: sorted(f.rglob("*")) for f in (main, *extra)}
    with pytest.raises(CheckpointException) as info:
        dcp.save(_state(), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra, overwrite=False))
    e = _cause(info)
    assert isinstance(e, FileExistsError) and e.filename == str(main) and "overwrite=False" in str(e)
    assert {f: sorted(f.rglob("*")) for f in (main, *extra)} == before
    other = tmp_dir / "other"
    new = [tmp_dir / "a" / "b", extra[1]]
    dcp.save(_state(), storage_writer=deepio.dcp.FileSystemWriter(other, extra_paths=new, overwrite=False))
    assert list(new[0].glob("*/*.distcp"))
    for folder, want in ((main, _with_big(_state())), (other, _state())):
        out = _with_big(_state(fill=False)) if folder == main else _state(fill=False)
        dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(folder))
        _assert_same(out, want)


def test_extra_folders_are_flushed_before_the_metadata(tmp_dir, monkeypatch):
    """With sync_files, each extra folder that got a file is flushed (the files' names on that
    drive) before .metadata is put in place, and a folder the writer made has its parent
    flushed; without sync_files nothing is."""
    main, extra = _drives(tmp_dir)
    flushed: list[tuple[str, bool]] = []
    real = deepio.dcp._writer.fsync_path

    def spy(path):
        flushed.append((os.fspath(path), (main / ".metadata").exists()))
        real(path)

    monkeypatch.setattr(deepio.dcp._writer, "fsync_path", spy)
    monkeypatch.setattr(deepio.dcp._cleanup, "fsync_path", spy)  # where the writer makes folders
    dcp.save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    for folder in extra:
        assert (str(folder), False) in flushed and (str(folder.parent), False) in flushed, flushed
    flushed.clear()
    dcp.save(_state(), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra, sync_files=False))
    assert flushed == []


def test_extra_paths_bad_arguments(tmp_dir):
    main = tmp_dir / "ck"
    with pytest.raises(ValueError, match="main path"):
        deepio.dcp.FileSystemWriter(main, extra_paths=[tmp_dir / "ck"])
    with pytest.raises(ValueError, match="given twice"):
        deepio.dcp.FileSystemWriter(main, extra_paths=[tmp_dir / "a", str(tmp_dir / "a") + "/"])
    with pytest.raises(TypeError, match="list of folders"):
        deepio.dcp.FileSystemWriter(main, extra_paths=str(tmp_dir / "a"))
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    with pytest.raises(ValueError, match="serialization_format TORCH_SAVE"):
        deepio.dcp.FileSystemWriter(
            main, extra_paths=[tmp_dir / "a"], serialization_format=SerializationFormat.SAFETENSORS
        )
    writer = deepio.dcp.FileSystemWriter(main, extra_paths=[tmp_dir / "a"])
    writer.reset(main)  # the same checkpoint: fine
    with pytest.raises(ValueError, match="its own extra folders"):
        writer.reset(tmp_dir / "ck2")  # what dcp.save(checkpoint_id=...) does first


def test_assign_folders_round_robin_by_size():
    """Largest first, each file to the folder with the fewest bytes so far: every folder
    within the largest file of every other; ties start at `first` (a rank's own folder)."""
    import random

    assign = deepio.dcp._writer.assign_folders
    assert assign([], 3) == []
    assert assign([5, 5, 5], 1) == [0, 0, 0]
    assert assign([10], 3, first=2) == [2] and assign([10, 10], 3, first=1) == [1, 2]
    assert assign([1, 100, 10, 10], 3) == [1, 0, 1, 2]
    rng = random.Random(3)
    for _ in range(300):
        folders = rng.randint(1, 5)
        sizes = [rng.choice([0, rng.randint(1, 100), rng.randint(1, 10**6)]) for _ in range(rng.randint(0, 20))]
        where = assign(sizes, folders, rng.randrange(folders))
        assert len(where) == len(sizes) and all(0 <= k < folders for k in where)
        load = [sum(s for s, k in zip(sizes, where) if k == f) for f in range(folders)]
        assert max(load) - min(load) <= max(sizes, default=0), (sizes, where)
        if len(sizes) >= folders:
            assert len(set(where)) == folders or sum(1 for s in sizes if s) < folders


def test_extra_paths_with_async_save(tmp_dir):
    """torch's async_save (staging, then the writes on a thread) with extra folders."""
    main, extra = _drives(tmp_dir)
    fut = dcp.async_save(_with_big(_state()), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    fut.result()
    assert list(main.glob("*.distcp")) and all(list(f.glob("*/*.distcp")) for f in extra)
    out = _with_big(_state(fill=False))
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    _assert_same(out, _with_big(_state()))


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


def _items_are_zips_with_their_crcs(folder: Path) -> None:
    """Every tensor item of the checkpoint, read alone, is a zip whose CRC-32s all hold."""
    import zipfile

    md = dcp.FileSystemReader(folder).read_metadata()
    for index, place in md.storage_data.items():
        with open(folder / place.relative_path, "rb") as f:
            f.seek(place.offset)
            raw = f.read(place.length)
        if raw[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                assert z.testzip() is None, index.fqn


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


def _save_both_with_crc32(sd: dict, folder: Path, crc32: bool) -> None:
    """Saves ``sd`` with deepio's writer into ``folder/d`` and torch's into ``folder/t``, with
    torch.serialization's CRC-32 option set to ``crc32`` (restored after)."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc32)
    try:
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(folder / "d"))
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(folder / "t"))
    finally:
        torch.serialization.set_crc32_options(before)


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
