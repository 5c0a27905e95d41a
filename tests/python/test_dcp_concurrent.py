"""deepio.dcp: one save of a checkpoint at a time, and every rank cleans its own files (issue 45).

Two saves of one checkpoint path at once (two threads, two processes, an ``async_save`` not
awaited, with a new writer or the same one) each finish, one after the other: the checkpoint
then loads whole and equals one of the two states, and the one before it stays loadable until
a complete new one replaces it. Each holds a save mid-write with a real mechanism (an object
whose pickling waits on an event) until the other save has finished or waits for the first;
nothing is timed. The multi-rank clean-up (with and without collectives, each rank with a
folder of its own standing in for a node-local drive) runs in dcp_program.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import InThread, require_module, wait_until

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import dcp_program  # noqa: E402
import deepio.dcp  # noqa: E402

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


_state = dcp_program.concurrent_state  # tensors over several files, a 1 MiB one, an object


def _loads_as(main: Path, *values: float) -> float:
    """Loads the checkpoint at ``main`` (deepio's reader) and returns which of ``values`` it
    holds, whole; fails where it does not load or holds none of them."""
    out = _state(-1.0)
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    for v in values:
        want = _state(v)
        if (
            torch.equal(out["big"], want["big"])
            and all(torch.equal(out["w"][k], want["w"][k]) for k in want["w"])
            and out["step"] == want["step"]
        ):
            return v
    raise AssertionError(f"the checkpoint holds none of {values}: big[0]={out['big'][0]}, step={out['step']}")


def _data_files(*folders: Path) -> set[str]:
    return {str(p) for f in folders for p in f.rglob("*.distcp")}


def _named(main: Path) -> set[str]:
    md = deepio.dcp.FileSystemReader(main).read_metadata()
    return {os.path.join(main, s.relative_path) for s in md.storage_data.values()}


def _writer(main: Path, extra: list[Path], **kw: Any) -> Any:
    return deepio.dcp.FileSystemWriter(main, extra_paths=extra, single_file_per_rank=False, **kw)


class _Held:
    """A state dict item whose pickling (in its save's write_data, after the larger items'
    files were written: the writer takes the largest first) waits until ``go`` is set;
    ``reached`` is set when it starts waiting. Staging (async_save's copy) leaves it as it is."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def __deepcopy__(self, memo: dict) -> _Held:
        return self

    def __reduce__(self) -> tuple:
        self.reached.set()
        assert self.go.wait(120), "never let go"
        return (int, (7,))


def _held_state(value: float, held: _Held) -> dict[str, Any]:
    sd = _state(value)
    sd["zz_held"] = held
    return sd


def _waits_in_save_lock(thread_id: int | None) -> bool:
    """Whether the thread is waiting for deepio.dcp's save lock or writer turn (its stack)."""
    f = sys._current_frames().get(thread_id) if thread_id is not None else None
    while f is not None:
        if f.f_globals.get("__name__") == "deepio.dcp._savelock":
            return True
        f = f.f_back
    return False


def _waits_on_flock(pid: int) -> bool:
    """Whether the process ``pid`` is blocked waiting for a flock (/proc/locks lists a
    blocked request as ``-> FLOCK ... PID``)."""
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields and "FLOCK" in fields and str(pid) in fields:
                return True
    return False


def test_two_threads_save_one_path_with_extra_folders(tmp_dir):
    """Two threads save two states to one checkpoint with extra folders at once (a barrier
    starts them together), six times: both saves succeed each time, the checkpoint loads whole
    as one of the two, and on disk only the files its .metadata names are left."""
    main, extra = tmp_dir / "ck", [tmp_dir / "x1", tmp_dir / "x2"]
    dcp.save(_state(0.0), storage_writer=_writer(main, extra))
    for run in range(6):
        start = threading.Barrier(2)

        def save(value: float, start: threading.Barrier = start) -> None:
            start.wait()
            dcp.save(_state(value), storage_writer=_writer(main, extra, thread_count=2))

        threads = [InThread(save, v) for v in (1.0 + 2 * run, 2.0 + 2 * run)]
        for t in threads:
            t.join()
        assert not threads[0].errors + threads[1].errors, threads[0].errors + threads[1].errors
        _loads_as(main, 1.0 + 2 * run, 2.0 + 2 * run)
        assert _data_files(main, *extra) == _named(main), run
    assert not (main / ".deepio-save.lock").exists()


@pytest.mark.parametrize("same_writer", [False, True], ids=["new-writer", "same-writer"])
def test_async_save_not_awaited_then_another(tmp_dir, same_writer):
    """dcp.async_save to a "latest" checkpoint, held mid-write, then a second async_save to it
    before the first was awaited (with a new writer, and with the same writer object): the
    checkpoint before stays loadable meanwhile; the second waits for the first; both futures
    succeed and the checkpoint is the second's, whole."""
    main, extra = tmp_dir / "latest", [tmp_dir / "x1"]
    dcp.save(_state(0.0), storage_writer=_writer(main, extra))
    held = _Held()
    first = _writer(main, extra)
    f1 = dcp.async_save(_held_state(1.0, held), storage_writer=first)
    assert held.reached.wait(120)
    assert _loads_as(main, 0.0) == 0.0  # the checkpoint in place, while the first writes
    f2 = dcp.async_save(_state(2.0), storage_writer=first if same_writer else _writer(main, extra))
    wait_until(
        lambda: f2.done() or any(_waits_in_save_lock(t.ident) for t in threading.enumerate()),
        "the second save to finish or to wait for the first",
    )
    held.go.set()
    f1.result(timeout=120)
    f2.result(timeout=120)
    assert _loads_as(main, 1.0, 2.0) == 2.0
    assert _data_files(main, *extra) == _named(main)


def test_two_processes_save_one_path(tmp_dir):
    """A save held mid-write in this process, and a second process saving the same checkpoint
    meanwhile: the second waits (flock) until the first is done, then replaces it; both succeed
    and the checkpoint loads as the second's, whole, with only its files left on disk."""
    main, extra = tmp_dir / "ck", [tmp_dir / "x1", tmp_dir / "x2"]
    dcp.save(_state(0.0), storage_writer=_writer(main, extra))
    held = _Held()
    t = InThread(lambda: dcp.save(_held_state(1.0, held), storage_writer=_writer(main, extra)))
    try:
        assert held.reached.wait(120)
        other = subprocess.Popen(
            [sys.executable, "-W", "ignore", str(HERE / "dcp_program.py"), "one-save", str(main), *map(str, extra)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(
            lambda: other.poll() is not None or _waits_on_flock(other.pid),
            "the other process to finish its save or to wait for the lock",
            timeout=180,
        )
        assert _loads_as(main, 0.0, 2.0) in (0.0, 2.0)  # whole, whichever is in place
    finally:
        held.go.set()
        t.join()
    out, err = other.communicate(timeout=180)
    assert other.returncode == 0 and "saved" in out, err
    assert not t.errors, t.errors
    assert _loads_as(main, 1.0, 2.0) == 2.0
    assert _data_files(main, *extra) == _named(main)


def test_a_writer_saving_again_never_writes_over_the_checkpoint_in_place(tmp_dir):
    """One writer object saves three times without reset (torch's save() resets only when
    given a checkpoint_id): the third save, failing midway, leaves the second's checkpoint
    whole (each save writes files of its own: a fresh save id per save)."""
    main = tmp_dir / "ck"
    w = deepio.dcp.FileSystemWriter(main, single_file_per_rank=False)
    dcp.save(_state(1.0), storage_writer=w)
    dcp.save(_state(2.0), storage_writer=w)

    class Refused:
        def __reduce__(self) -> tuple:
            raise RuntimeError("refused to pickle")

    bad = _state(3.0)
    bad["zz"] = Refused()
    with pytest.raises(CheckpointException):
        dcp.save(bad, storage_writer=w)
    assert _loads_as(main, 2.0) == 2.0
    dcp.save(_state(4.0), storage_writer=w)
    assert _loads_as(main, 4.0) == 4.0
    assert _data_files(main) == _named(main)


def _program(mode: str, folder: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / "dcp_program.py"), mode, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "ranks OK" in r.stdout, f"{mode}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.mark.parametrize("mode", ["clean-collectives", "clean-alone"])
def test_each_rank_removes_its_own_files(tmp_dir, mode):
    """Two ranks save three times to one checkpoint, each with an extra folder of its own (a
    node-local drive: the coordinator's host cannot see another host's), with collectives and
    without (use_collectives=False: each rank its own __{rank}.metadata); the second save fails
    midway (rank 1's item refuses to be pickled: its files and rank 0's are left over). After
    the third save, every folder holds exactly the files the checkpoint's metadata names:
    rank 1 removed what was left in its own folder (dcp_program.py checks each rank's load)."""
    _program(mode, tmp_dir)
    main = tmp_dir / "ck"
    metas = [main / ".metadata"] if mode == "clean-collectives" else [main / f"__{r}.metadata" for r in (0, 1)]
    named: set[str] = set()
    for meta in metas:
        md = deepio.dcp.FileSystemReader(main).read_metadata(
            **({} if meta.name == ".metadata" else {"rank": int(meta.name[2])})
        )
        named |= {os.path.join(main, s.relative_path) for s in md.storage_data.values()}
    folders = [main, tmp_dir / "node0", tmp_dir / "node1"]
    assert _data_files(*folders) == named
    assert all(_data_files(f) for f in folders[1:])  # each rank's folder holds its files
    assert not [n for n in os.listdir(main) if n.endswith(".lock")], os.listdir(main)


@pytest.mark.parametrize("where", ["same-thread", "other-thread"])
def test_a_save_that_failed_before_finish_does_not_hold_the_path(tmp_dir, where):
    """A save that fails between the coordinator's prepare_global_plan and its write_data
    (here the planner's finish_plan: the writer is never told) leaves no lock behind once
    torch's save has returned, though its writer is still referenced: the next save of the
    path, on the same thread or another, goes through and the checkpoint is the new one."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    class Failing(DefaultSavePlanner):
        def finish_plan(self, central_plan: Any) -> Any:
            raise RuntimeError("the planner fails after the global plan")

    main, extra = tmp_dir / "ck", [tmp_dir / "x1"]
    dcp.save(_state(0.0), storage_writer=_writer(main, extra))
    kept = _writer(main, extra)
    with pytest.raises(CheckpointException):
        dcp.save(_state(1.0), storage_writer=kept, planner=Failing())
    assert kept._save_lock is not None  # never given back by the writer: its save is just over
    if where == "same-thread":
        dcp.save(_state(2.0), storage_writer=_writer(main, extra))
    else:
        t = InThread(lambda: dcp.save(_state(2.0), storage_writer=_writer(main, extra)))
        t.join(120)
        assert not t.thread.is_alive() and not t.errors, t.errors
    assert _loads_as(main, 0.0, 2.0) == 2.0
    assert not (main / ".deepio-save.lock").exists()
    del kept


def test_a_file_system_without_flock_saves_with_a_warning(tmp_dir, monkeypatch):
    """Where flock fails with ENOLCK (NFS mounted with nolock), the save goes on, with a
    RuntimeWarning naming the lock file; the checkpoint loads and no lock file is left."""
    import errno
    import fcntl

    from deepio.dcp import _savelock

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(_savelock.fcntl, "flock", no_flock)
    main = tmp_dir / "ck"
    with pytest.warns(RuntimeWarning, match=r"cannot lock .*\.deepio-save\.lock"):
        dcp.save(_state(1.0), storage_writer=_writer(main, []))
    monkeypatch.setattr(_savelock.fcntl, "flock", fcntl.flock)
    assert _loads_as(main, 1.0) == 1.0
    assert not (main / ".deepio-save.lock").exists()


def test_two_huggingface_saves_of_one_folder_never_mix_their_files(tmp_dir):
    """deepio.dcp.HuggingFaceStorageWriter, two files a save: a save held between its two
    files (its planner waits before handing over the second file's tensor) and a second save
    of the folder meanwhile: the second waits for the first, so the folder ends with the
    second's two files, never one file of each."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    held = _Held()

    class Holding(DefaultSavePlanner):
        def resolve_data(self, write_item: Any) -> Any:
            if write_item.index.fqn == "b":
                held.__reduce__()  # waits for held.go
            return super().resolve_data(write_item)

    folder = str(tmp_dir / "hf")
    mapping = {"a": 1, "b": 2}

    def state(v: float) -> dict[str, torch.Tensor]:
        return {"a": torch.full((1000,), v), "b": torch.full((1000,), v + 0.5)}

    def first() -> None:
        w = deepio.dcp.HuggingFaceStorageWriter(folder, fqn_to_index_mapping=mapping)
        dcp.save(state(1.0), storage_writer=w, planner=Holding())

    t = InThread(first)
    try:
        assert held.reached.wait(120)
        second = threading.Thread(
            target=lambda: dcp.save(
                state(2.0), storage_writer=deepio.dcp.HuggingFaceStorageWriter(folder, fqn_to_index_mapping=mapping)
            )
        )
        second.start()
        wait_until(lambda: not second.is_alive() or _waits_in_save_lock(second.ident), "the second HF save")
    finally:
        held.go.set()
        t.join()
    second.join()
    assert not t.errors, t.errors
    out = {k: torch.zeros(1000) for k in ("a", "b")}
    dcp.load(out, storage_reader=deepio.dcp.HuggingFaceStorageReader(folder))
    assert torch.equal(out["a"], state(2.0)["a"]) and torch.equal(out["b"], state(2.0)["b"])
    assert not [n for n in os.listdir(folder) if n.endswith(".lock")]
