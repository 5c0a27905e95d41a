"""The type stubs shipped with the package describe the compiled modules it ships.

nanobind's stub generator runs against the *installed* extension modules (the ones these tests
import) with the patterns of python/stubgen-patterns.txt, and its output must equal the .pyi
files installed beside them. A binding changed without `scripts/gen-stubs.sh` fails here with
the difference."""

from __future__ import annotations

import difflib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import deepio
from conftest import REPO

PATTERNS = REPO / "python" / "stubgen-patterns.txt"
REGENERATE = "scripts/gen-stubs.sh (then reinstall the package)"


def _nanobind_version() -> str | None:
    try:
        import nanobind
    except ImportError:
        return None
    return str(nanobind.__version__)


def test_package_is_marked_typed():
    # PEP 561: without py.typed, type checkers ignore the package's annotations and stubs.
    assert (Path(deepio.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("name", ["_deepio", "_comm"])
def test_shipped_stub_matches_the_extension(name, tmp_path):
    try:
        module = importlib.import_module(f"deepio.{name}")
    except ModuleNotFoundError as e:
        if name == "_comm" and e.name == "deepio._comm":
            pytest.skip("deepio._comm is not built here (MPI was not found)")
        raise
    version = _nanobind_version()
    if version is None:
        pytest.skip("nanobind is not installed (pip install nanobind): no stub generator")
    shipped = Path(module.__file__).with_name(f"{name}.pyi")
    assert shipped.is_file(), f"{shipped} is missing: the package must ship the stubs of deepio.{name}"

    out = tmp_path / f"{name}.pyi"
    # A fresh interpreter, importing the package these tests use (not the source tree).
    path = [str(Path(deepio.__file__).parents[1])] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    cmd = [sys.executable, "-m", "nanobind.stubgen", "-q", "-p", str(PATTERNS), "-m", f"deepio.{name}", "-o", str(out)]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}"

    want = out.read_text()
    have = shipped.read_text()
    if want != have:
        diff = "".join(
            difflib.unified_diff(
                have.splitlines(keepends=True),
                want.splitlines(keepends=True),
                f"shipped {shipped}",
                f"generated from {module.__file__} (nanobind {version})",
            )
        )
        pytest.fail(f"python/deepio/{name}.pyi is out of date; regenerate it with {REGENERATE}.\n{diff}")
