"""deepio.dcp across several real processes (gloo on the host, no mocks): the example
examples/dcp_train.py, run as a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _run(*args: object, timeout: float = 180) -> subprocess.CompletedProcess:
    """A Python program of the tests (or the example), its output captured."""
    return subprocess.run(
        [sys.executable, "-W", "ignore", *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------------------- the example


def test_example_trains_saves_and_resumes(tmp_dir):
    """examples/dcp_train.py: 2 ranks, FSDP2, save and resume through deepio.dcp (the
    program checks the resumed state and the losses after it); its checkpoint loads whole in
    one process with torch's own reader."""
    r = _run(REPO / "examples" / "dcp_train.py", "--dir", tmp_dir)
    assert r.returncode == 0 and "dcp_train: OK" in r.stdout, r.stdout + r.stderr
    checkpoint = tmp_dir / "checkpoint"
    assert sorted(os.listdir(checkpoint)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    reader = dcp.FileSystemReader(checkpoint)
    meta = reader.read_metadata().state_dict_metadata
    model = {
        fqn.removeprefix("model."): torch.full(tuple(md.size), float("nan"), dtype=md.properties.dtype)
        for fqn, md in meta.items()
        if fqn.startswith("model.")
    }
    assert sorted(model) == [f"{n}.{p}" for n in (0, 2, 4) for p in ("bias", "weight")]
    out = {"model": model, "step": 0}
    dcp.load(out, storage_reader=dcp.FileSystemReader(checkpoint))
    assert out["step"] == 3
    assert model["0.weight"].shape == (64, 32) and model["4.weight"].shape == (8, 64)
    assert all(bool(t.isfinite().all()) for t in model.values())
