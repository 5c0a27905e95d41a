"""``import deepio.comm`` in a deepio without deepio._comm (the binary wheel, a build that found
no MPI) raises the message that says how to get it; a deepio._comm that is there but does not
load raises its own error. Both against a real copy of the installed package (symbolic links to
its files) with _comm left out or replaced, imported in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import deepio

FRIENDLY = "deepio.comm needs deepio built with MPI"
PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import deepio
assert deepio.__file__.startswith(sys.argv[1]), deepio.__file__
try:
    import deepio.comm
except ImportError as e:
    print("ImportError", e.name, "|", e)
else:
    print("imported")
"""


def _package_copy(dest: Path, comm_so: bytes | None) -> Path:
    """deepio's installed files linked into dest/deepio, without its _comm extension; with
    comm_so, a file of those bytes in its place."""
    src = Path(deepio.__file__).parent
    pkg = dest / "deepio"
    pkg.mkdir()
    for entry in src.iterdir():
        if entry.name == "__pycache__":
            continue
        if entry.name.startswith("_comm.") and entry.name.endswith(".so"):
            if comm_so is not None:
                (pkg / entry.name).write_bytes(comm_so)
            continue
        (pkg / entry.name).symlink_to(entry)
    if comm_so is not None and not any(p.name.startswith("_comm.") and p.name.endswith(".so") for p in pkg.iterdir()):
        (pkg / f"_comm{_ext_suffix()}").write_bytes(comm_so)
    return dest


def _ext_suffix() -> str:
    import sysconfig

    return sysconfig.get_config_var("EXT_SUFFIX")


def _probe(root: Path) -> str:
    r = subprocess.run([sys.executable, "-c", PROBE, str(root)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.wheel
def test_import_without_comm_module_says_how_to_get_it(tmp_path):
    out = _probe(_package_copy(tmp_path, None))
    assert out.startswith("ImportError deepio._comm |"), out
    assert FRIENDLY in out and "libopenmpi-dev" in out, out


def test_a_comm_module_that_does_not_load_raises_its_own_error(tmp_path):
    out = _probe(_package_copy(tmp_path, b"not an ELF file"))
    assert out.startswith("ImportError"), out
    assert FRIENDLY not in out, out


@pytest.mark.wheel
def test_this_deepio_without_its_comm_module_says_so():
    """The installed deepio itself (the binary wheel has no deepio._comm): where it lacks the
    module, the message; where it has it (a source build with MPI), deepio.comm imports."""
    import importlib.util

    out = _probe(Path(deepio.__file__).parent.parent)
    if importlib.util.find_spec("deepio._comm") is None:
        assert out.startswith("ImportError deepio._comm |") and FRIENDLY in out, out
    else:
        assert out.strip() == "imported", out


def test_importing_comm_keeps_the_io_calls_own_exceptions(tmp_path):
    """deepio._comm registers an exception translator, and nanobind asks the last registered
    first: it must leave the I/O calls' errors to deepio's own. It once caught every deepio
    error, so that after ``import deepio.comm`` a parent's Future waited in a forked child
    raised a plain OSError instead of deepio.ForkedHandleError."""
    import importlib.util

    if importlib.util.find_spec("deepio._comm") is None:
        pytest.skip("this deepio has no deepio._comm (built without MPI)")
    code = f"""
import os, deepio, deepio.comm
with deepio.File({str(tmp_path / "f.bin")!r}, "w") as f:
    fut = f.pwrite(b"x" * 4096)
    fut.result()
    pid = os.fork()
    if pid == 0:
        try:
            fut.result()
        except deepio.ForkedHandleError:
            os._exit(0)
        except OSError as e:
            print("child:", type(e).__module__, type(e).__name__, flush=True)
            os._exit(1)
        os._exit(2)
    print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("child exit 0"), r.stdout
