"""GPU tensors and gds_handle without a GPU: test_gpu_fake_cases*.py run in subprocesses.

The CUDA and cuFile libraries are chosen once per process (DEEPIO_CUDA_LIBRARY /
DEEPIO_CUFILE_LIBRARY), so each configuration is a separate pytest invocation:
  * "fake":   the fake driver and libcufile of tests/gpu (host memory posing as device memory),
  * "nocufile": the fake driver, cuFile disabled (gds_handle's staged path),
  * "absent": CUDA and cuFile disabled ("none"), as on a machine without a GPU.
The fakes are compiled here from tests/gpu/fake_*.c (so they always match the sources), or
taken from a CMake build tree when no C compiler is present.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASES = [
    Path(__file__).with_name(name)
    for name in ("test_gpu_fake_cases.py", "test_gpu_fake_cases_gds.py", "test_gpu_fake_cases_stream_order.py")
]


def build_fakes(out: Path) -> tuple[Path, Path]:
    """(libdeepio_fake_cuda.so, libdeepio_fake_cufile.so); pytest.skip with the reason if
    they can neither be compiled nor found."""
    src = REPO / "tests" / "gpu"
    cuda, cufile = out / "libdeepio_fake_cuda.so", out / "libdeepio_fake_cufile.so"
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    why = "no C compiler (cc/gcc) on PATH"
    if cc is not None:
        flags = ["-shared", "-fPIC", "-O1", "-fvisibility=hidden"]
        r1 = subprocess.run(
            [cc, *flags, "-Wl,-soname,libdeepio_fake_cuda.so", "-o", str(cuda), str(src / "fake_cuda.c"), "-lpthread"],
            capture_output=True,
            text=True,
        )
        r2 = r1
        if r1.returncode == 0:
            r2 = subprocess.run(
                [
                    cc,
                    *flags,
                    "-o",
                    str(cufile),
                    str(src / "fake_cufile.c"),
                    f"-L{out}",
                    "-ldeepio_fake_cuda",
                    f"-Wl,-rpath,{out}",
                    "-lpthread",
                ],
                capture_output=True,
                text=True,
            )
        if r1.returncode == 0 and r2.returncode == 0:
            return cuda, cufile
        why = f"compiling the fakes failed: {(r1.stderr or r2.stderr).strip()[:400]}"
    for d in sorted((REPO / "build").glob("*/tests*/gpu")) + sorted((REPO / "build").glob("*/tests-gpu")):
        c, f = d / "libdeepio_fake_cuda.so", d / "libdeepio_fake_cufile.so"
        if c.exists() and f.exists():
            return c, f
    pytest.skip(f"fake CUDA/cuFile libraries unavailable: {why}, and none under build/*/tests/gpu")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    return build_fakes(tmp_path_factory.mktemp("fakes"))


def run_cases(mode: str, cuda: str, cufile: str) -> None:
    env = dict(os.environ)
    env.update(DEEPIO_GPU_TEST_MODE=mode, DEEPIO_CUDA_LIBRARY=cuda, DEEPIO_CUFILE_LIBRARY=cufile)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, CASES)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = "\n".join((r.stdout + r.stderr).splitlines()[-60:])
    assert r.returncode == 0, f"GPU cases ({mode}) failed:\n{tail}"
    assert " passed" in r.stdout, tail


def test_gpu_cases_with_fake_drivers(fakes):
    run_cases("fake", str(fakes[0]), str(fakes[1]))


@pytest.mark.slow
def test_gpu_cases_with_fake_cuda_without_cufile(fakes):
    run_cases("nocufile", str(fakes[0]), "none")


@pytest.mark.slow
def test_gpu_cases_without_cuda():
    run_cases("absent", "none", "none")
