"""deepio.dcp over several drives (extra_paths): data files spread over the folders and loaded
from the main path, folders moved (folder_map), a missing or corrupt file on one drive named,
the folders read at once and flushed before the metadata, bad arguments, async saves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import deepio  # noqa: E402
import deepio.dcp  # noqa: E402
from dcp_support import _assert_same, _cause, _data_files, _state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


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
