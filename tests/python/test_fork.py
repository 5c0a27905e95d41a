"""Fork is a normal event (issue 24): a real torch DataLoader with two workers, forked and
spawned, reads through deepio.File, deepio.load, deepio.safetensors and a handle of its own
after the parent used each of them; a parent's handle used in a forked child refuses at once.

Each case runs fork_program.py in a fresh interpreter under a timeout, so a hang fails the
test instead of stalling the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import needs_numpy, needs_torch

PROGRAM = Path(__file__).with_name("fork_program.py")


def _run(*args: str, timeout: float = 240) -> str:
    r = subprocess.run(
        [sys.executable, str(PROGRAM), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert "FAIL" not in r.stdout, r.stdout
    return r.stdout


@needs_torch
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_read_through_deepio(tmp_dir, method):
    out = _run("dataloader", method, str(tmp_dir))
    assert out.count("ok ") == 8 * 4 + 2, out  # every item four ways, workers, parent after


@needs_numpy
def test_parent_handle_in_forked_child_refuses_at_once(tmp_dir):
    out = _run("parent-handle", str(tmp_dir), timeout=60)
    for name in ("aio_handle.sync_pread", "aio_handle.async_pread", "aio_handle.wait", "File on the parent's handle"):
        assert f"ok {name}" in out, out
    assert "ok File on the default engine" in out and "ok child's own handle" in out, out
    assert "ok inherited locked memory" in out, out
