"""deepio.save over one path from two processes at once (issue 45): each save writes a
temporary file of its own (named by host, process and thread) and renames it over the path
last, so two saves end as if run one after the other (the one that renames last is in place),
every file whole; the file before stays loadable until a whole new one replaces it. One save
is held mid-write with a real mechanism (an object whose pickling waits on an event) while
the other process saves; nothing is timed. test_checkpoint_large_saves.py's
test_saves_from_many_threads_at_once covers threads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import deepio
from conftest import InThread, require_module

torch = require_module("torch")


def _state(value: float) -> dict:
    return {"w": torch.full((1 << 20,), value), "b": torch.full((100,), value + 1), "step": int(value)}


class _Held:
    """Pickled inside deepio.save (torch's data.pkl) after the tensors it follows: waits there
    until ``go`` is set, with the save's temporary file open and partly written."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def __reduce__(self) -> tuple:
        self.reached.set()
        assert self.go.wait(120), "never let go"
        return (int, (7,))


OTHER_SAVE = r"""
import sys, torch, deepio
deepio.save({"w": torch.full((1 << 20,), 2.0), "b": torch.full((100,), 3.0), "step": 2}, sys.argv[1])
print("saved", flush=True)
"""


def _is(got: dict, value: float) -> bool:
    want = _state(value)
    return torch.equal(got["w"], want["w"]) and torch.equal(got["b"], want["b"]) and got["step"] == want["step"]


def test_two_processes_save_one_path(tmp_dir):
    """This process's save is held mid-write while another process saves the same path and
    exits: the path then holds that process's save, whole; released, this save replaces it
    whole; no temporary file is left."""
    path = tmp_dir / "latest.pt"
    deepio.save(_state(0.0), path)
    held = _Held()
    t = InThread(lambda: deepio.save({**_state(1.0), "held": held}, path))
    try:
        assert held.reached.wait(120)
        assert _is(deepio.load(path), 0.0)  # the file in place, while this save writes
        other = subprocess.run(
            [sys.executable, "-c", OTHER_SAVE, str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert other.returncode == 0 and "saved" in other.stdout, other.stderr
        assert _is(deepio.load(path), 2.0)
    finally:
        held.go.set()
        t.join()
    assert not t.errors, t.errors
    got = deepio.load(path, weights_only=False)  # the held object pickles as int(7)
    assert got.pop("held") == 7 and _is(got, 1.0)
    assert sorted(os.listdir(tmp_dir)) == ["latest.pt"]
