"""One version everywhere: CMakeLists.txt's ``project(deepio VERSION ...)`` is the only place it
is written. The wheel's metadata (pyproject.toml reads it from there), ``deepio.__version__``
(the C++ ``deepio::version()``) and the ``deepio`` command must all say the same;
scripts/check-install.sh checks the installed CMake package's version against it too."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import pytest

import deepio
from cli_support import CLI

REPO = Path(__file__).resolve().parents[2]


def _project_version() -> str:
    m = re.search(r"project\(deepio VERSION ([0-9]+\.[0-9]+\.[0-9]+)", (REPO / "CMakeLists.txt").read_text())
    assert m, "CMakeLists.txt has no project(deepio VERSION x.y.z)"
    return m.group(1)


@pytest.mark.wheel
def test_the_package_the_metadata_and_cmake_agree():
    assert deepio.__version__ == _project_version()
    assert importlib.metadata.version("deepio") == deepio.__version__


@pytest.mark.wheel
def test_the_command_reports_the_same_version():
    if CLI is None:
        pytest.skip("the deepio command is not built (set DEEPIO_CLI)")
    out = subprocess.run([CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["deepio", deepio.__version__], out.stdout
