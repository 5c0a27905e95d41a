"""deepio.dcp: a checkpoint owns its files, and what is read back is checked (issue 36).

Two checkpoints that share extra folders (what a training loop saving step after step does)
never share a data file; a data file of one put in the place of the other's is refused naming
both; a flipped byte is refused naming the file and the item (the CRC-32 torch's zip records
carry, checked for bytes read straight into destinations too); a save killed over an existing
checkpoint leaves that checkpoint whole. Real saves and loads on the test disk.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
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


def _cause(excinfo: pytest.ExceptionInfo) -> BaseException:
    e = excinfo.value
    if isinstance(e, CheckpointException):
        return next(iter(e.failures.values()))[0]
    return e


def _step(value: float) -> dict:
    """Tensors large enough to be read straight into their destinations (one of 1 MiB: the
    filling route), small ones read whole, and an object."""
    return {
        "big": torch.full((1 << 18,), value),
        "w": {f"w{i}": torch.full((5000 + 100 * i,), value + i) for i in range(4)},
        "small": torch.full((7,), value),
        "step": int(value),
    }


def _empty() -> dict:
    out = _step(0.0)
    for k, v in list(out.items()):
        if isinstance(v, torch.Tensor):
            out[k] = torch.empty_like(v)
    out["w"] = {k: torch.empty_like(v) for k, v in out["w"].items()}
    return out


def _same(got: dict, want: dict) -> None:
    assert torch.equal(got["big"], want["big"]) and torch.equal(got["small"], want["small"])
    assert all(torch.equal(got["w"][k], want["w"][k]) for k in want["w"]) and got["step"] == want["step"]


def _places(main: Path) -> dict[str, tuple[str, int, int]]:
    """{fqn: (data file, offset, length)} as the checkpoint's metadata records them."""
    md = deepio.dcp.FileSystemReader(main).read_metadata()
    return {i.fqn: (str(main / s.relative_path), s.offset, s.length) for i, s in md.storage_data.items()}


def _two_steps(tmp_dir: Path) -> tuple[Path, Path, list[Path]]:
    extra = [tmp_dir / "nvme1" / "ck", tmp_dir / "nvme2" / "ck"]
    a, b = tmp_dir / "nvme0" / "step100", tmp_dir / "nvme0" / "step200"
    for main, value in ((a, 100.0), (b, 200.0)):
        dcp.save(_step(value), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra, thread_count=2))
    return a, b, extra


def test_two_checkpoints_sharing_extra_folders_each_load_their_own(tmp_dir):
    a, b, extra = _two_steps(tmp_dir)
    files_a = {p for p, _, _ in _places(a).values()}
    files_b = {p for p, _, _ in _places(b).values()}
    assert not files_a & files_b
    assert any(not p.startswith(str(a)) for p in files_a) and any(not p.startswith(str(b)) for p in files_b)
    for main, value in ((a, 100.0), (b, 200.0)):
        for reader in (deepio.dcp.FileSystemReader(main), dcp.FileSystemReader(main)):  # torch's too
            out = _empty()
            dcp.load(out, storage_reader=reader)
            _same(out, _step(value))


def test_a_data_file_of_another_checkpoint_is_refused_naming_both(tmp_dir):
    a, b, extra = _two_steps(tmp_dir)
    theirs = sorted(p for p, _, _ in _places(a).values() if p.startswith(str(extra[0])))
    ours = sorted(p for p, _, _ in _places(b).values() if p.startswith(str(extra[0])))
    assert theirs and ours
    shutil.copyfile(theirs[0], ours[0])  # step100's file where step200's metadata points
    with pytest.raises(CheckpointException) as info:
        dcp.load(_empty(), storage_reader=deepio.dcp.FileSystemReader(b))
    e = _cause(info)
    assert isinstance(e, deepio.CorruptFileError) and e.filename == ours[0]
    assert f"the checkpoint at {str(a)!r}" in str(e) and f"the checkpoint at {str(b)!r}" in str(e)


def test_a_multi_folder_checkpoint_from_before_still_loads(tmp_dir, monkeypatch):
    """A checkpoint saved with extra_paths before issue 36 (files at the top of the extra
    folders, no owner mark: the writer's naming and mark turned off here) still loads."""
    from deepio.dcp import _owner

    main, extra = tmp_dir / "ck", [tmp_dir / "nvme1", tmp_dir / "nvme2"]
    with monkeypatch.context() as m:
        m.setattr(_owner, "extra_dir", lambda main, save_id: "")
        m.setattr(_owner, "mark", lambda main, save_id: b"")
        dcp.save(_step(5.0), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    assert all(list(f.glob("*.distcp")) for f in extra)
    out = _empty()
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    _same(out, _step(5.0))


@pytest.mark.parametrize("fqn", ["big", "w.w1", "small"])
def test_a_flipped_byte_is_refused_naming_the_file_and_the_item(tmp_dir, fqn):
    """A byte of a tensor's stored data flipped: read straight into the destination ("big",
    "w.w1") or whole and rebuilt by torch.load ("small"), the load refuses it naming the file
    and the item; verify_crc=False skips the check (and loads the flipped value)."""
    main = tmp_dir / "ck"
    dcp.save(_step(3.0), storage_writer=deepio.dcp.FileSystemWriter(main))
    path, offset, length = _places(main)[fqn]
    with open(path, "rb") as f:
        f.seek(offset)
        item = f.read(length)
    lay = _record.layout(item[:4096], item[-4096:], length)
    assert lay is not None
    at = offset + lay.data_start + lay.data_nbytes // 2
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointException) as info:
        dcp.load(_empty(), storage_reader=deepio.dcp.FileSystemReader(main))
    e = _cause(info)
    assert isinstance(e, deepio.CorruptFileError) and e.filename == path
    assert f"item {fqn!r}" in str(e) and "CRC-32" in str(e)
    out = _empty()
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main, verify_crc=False))
    assert out["step"] == 3


def test_a_part_of_a_tensor_is_checked_too(tmp_dir):
    """A load of part of a stored tensor (a resharded load's rows) checks the whole record's
    CRC-32: a flipped byte outside the part read is still refused."""
    main = tmp_dir / "ck"
    full = torch.arange(4096 * 64, dtype=torch.float32).reshape(4096, 64)
    dcp.save({"t": full}, storage_writer=deepio.dcp.FileSystemWriter(main))
    path, offset, length = _places(main)["t"]
    with open(path, "r+b") as f:
        f.seek(offset + length - 8192)  # in the last rows' bytes
        byte = f.read(1)
        f.seek(offset + length - 8192)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CheckpointException) as info:
        dcp.load({"t": torch.empty(4096, 64)}, storage_reader=deepio.dcp.FileSystemReader(main))
    assert "CRC-32" in str(_cause(info))


def test_a_save_killed_over_a_checkpoint_leaves_it_loadable(tmp_dir):
    """SIGKILL mid-way through a save over an existing checkpoint (overwrite=True, extra
    folders): the old checkpoint loads whole, with deepio's reader and torch's; the next save
    replaces it and removes the old files and the killed save's leftovers in the main path, and
    the lock file the killed save left behind."""
    main, extra = tmp_dir / "ck", [tmp_dir / "nvme1"]
    r = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / "dcp_program.py"), "killed", str(main), *map(str, extra)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    want = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(1000)}
    for reader in (deepio.dcp.FileSystemReader(main), dcp.FileSystemReader(main)):
        out = {"a": torch.empty(1 << 20), "b": torch.empty(1000)}
        dcp.load(out, storage_reader=reader)
        assert torch.equal(out["a"], want["a"]) and torch.equal(out["b"], want["b"])
    old = {p for p, _, _ in _places(main).values()}
    left = sorted(p.name for p in main.iterdir() if p.is_dir())
    assert left and all(n.startswith("save.") for n in left)  # the killed save's own folder
    assert (main / ".deepio-save.lock").exists()  # left unlocked by the killed save (_savelock)
    dcp.save({"a": torch.ones(8)}, storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra))
    out = {"a": torch.empty(8)}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    assert torch.equal(out["a"], torch.ones(8))
    now = {p for p, _, _ in _places(main).values()}
    assert not any(os.path.exists(p) for p in old - now)
    on_disk = {str(p) for p in main.rglob("*.distcp")} | {str(p) for p in extra[0].rglob("*.distcp")}
    assert on_disk == now
    assert not (main / ".deepio-save.lock").exists()  # the next save took it and removed it


def test_device_submissions_run_on_the_callers_thread():
    """What a multi-folder load does with a read into CUDA memory (no GPU here: the mechanism
    alone): each folder's thread hands the submission to the thread that called read_data,
    which runs it there (so its ordering event is recorded on that thread's current stream)
    and hands back its result or its exception; once that thread stops serving, a hand-over
    is refused instead of waiting forever."""
    from deepio.dcp._common import side_by_side
    from deepio.dcp._reader import _OnCaller

    caller = _OnCaller()
    seen: list[int] = []
    raised: list[BaseException] = []

    def boom() -> None:
        raise OSError(5, "refused at submission")

    def work() -> None:
        try:
            for _ in range(3):
                seen.append(caller.run(threading.get_ident))
            try:
                caller.run(boom)
            except OSError as e:
                raised.append(e)
        finally:
            caller.ended()

    side_by_side([functools.partial(caller.serve, 2), work, work], "test-dcp")
    assert seen == [threading.get_ident()] * 6 and len(raised) == 2
    assert caller.run(threading.get_ident) == threading.get_ident()  # on the caller: at once
    late: list[BaseException] = []

    def after() -> None:
        try:
            caller.run(threading.get_ident)
        except RuntimeError as e:
            late.append(e)

    t = threading.Thread(target=after)
    t.start()
    t.join(10)
    assert not t.is_alive() and late and "stopped" in str(late[0])
