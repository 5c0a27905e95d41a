"""The file-access examples (examples/file_access) pass --validate at small sizes; the GPU and
GPUDirect Storage scripts end cleanly with a "skipped" line where there is no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import needs_torch

try:
    import torch
except ImportError:
    torch = None

pytestmark = needs_torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "file_access"
HAS_GPU = torch is not None and torch.cuda.is_available()


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=240, env=env)


def test_load_examples_validate(tmp_dir):
    data = tmp_dir / "input.bin"
    data.write_bytes(os.urandom(3 * 2**20 + 4097))  # not a multiple of the block size nor of 4 KiB
    r = run_script("run_load_tensor.sh", str(data), "--loop", "1", "--validate")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "py load_cpu: " in r.stdout and "GB/sec" in r.stdout
    assert "aio load_cpu (" in r.stdout
    assert r.stdout.count("Validation success = True") == (3 if HAS_GPU else 1)
    if not HAS_GPU:
        for s in ("py_load_gpu_tensor.py", "aio_load_gpu_tensor.py", "gds_load_gpu_tensor.py"):
            assert f"{s}: skipped: no CUDA GPU" in r.stdout


def test_store_examples_validate(tmp_dir):
    r = run_script("run_store_tensor.sh", str(tmp_dir), "--mb_size", "3", "--loop", "2", "--validate")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "py store_cpu: " in r.stdout and "aio store_cpu (" in r.stdout
    assert r.stdout.count("Validation success = True") == (3 if HAS_GPU else 1)
    if not HAS_GPU:
        assert "gds_store_gpu_tensor.py: skipped" in r.stdout
    assert list(tmp_dir.iterdir()) == []  # outputs removed


def test_bad_arguments(tmp_dir):
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "py_load_cpu_tensor.py"), "--input_file", str(tmp_dir / "missing.bin")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_script("run_store_tensor.sh", str(tmp_dir / "missing"))
    assert r.returncode == 2 and "folder not found" in r.stderr
