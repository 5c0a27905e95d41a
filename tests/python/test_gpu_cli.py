"""`deepio bench --gpu/--use_gds` and `deepio tune --gpu/--gds` where they cannot run: one
error line naming the cause, exit status 2. CUDA and cuFile are switched off with
DEEPIO_CUDA_LIBRARY / DEEPIO_CUFILE_LIBRARY=none, so this holds on a GPU machine too; the
fake driver of tests/gpu stands in for "CUDA present, cuFile absent"."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_cli import CLI  # the binary test_cli.py found ($DEEPIO_CLI, PATH, build/*/tools)
from test_gpu_fake import build_fakes

pytestmark = pytest.mark.skipif(CLI is None, reason="the deepio command is not built (set DEEPIO_CLI)")


def run(args, **env_over):
    env = dict(os.environ)
    env.update(env_over)
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def one_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--io_size", "1M", "--gpu"],
        ["bench", "--io_size", "1M", "--gpu", "--use_gds"],
        ["bench", "--size", "1M", "--gpu"],
        ["tune", "--gpu"],
        ["tune", "--gpu", "--gds"],
    ],
)
def test_gpu_flags_without_cuda(args):
    folder = tempfile.mkdtemp()
    args = [args[0], "--nvme_dir" if args[0] == "tune" else "--folder", folder, *args[1:]]
    try:
        one_error(run(args, DEEPIO_CUDA_LIBRARY="none", DEEPIO_CUFILE_LIBRARY="none"),
                  "--gpu: no usable CUDA driver", "DEEPIO_CUDA_LIBRARY=none")
    finally:
        os.rmdir(folder)


def test_use_gds_without_cufile(tmp_path):
    cuda, _ = build_fakes(tmp_path)
    one_error(run(["bench", "--folder", str(tmp_path), "--io_size", "1M", "--gpu", "--use_gds"],
                  DEEPIO_CUDA_LIBRARY=str(cuda), DEEPIO_CUFILE_LIBRARY="none"),
              "--use_gds: no cuFile", "DEEPIO_CUFILE_LIBRARY=none")
