"""What the smoke tests of the `deepio` command (test_cli*.py) share: which binary they run,
the marks every one of them carries, a fresh folder a test, and the checks of ds_io output
and of refused input.

Which binary: $DEEPIO_CLI (CTest sets it to the one it built), else `deepio` on PATH (what
`pip install .` installs), else the newest build/*/tools/deepio of this checkout.
Self-contained (CTest runs the files with --noconftest, without the Python package): files go
to a fresh folder under $DEEPIO_TEST_DIR, else /var/tmp (a disk, not tmpfs).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _find_cli() -> str | None:
    env = os.environ.get("DEEPIO_CLI")
    if env:
        return env
    on_path = shutil.which("deepio")
    if on_path:
        return on_path
    built = sorted(REPO.glob("build/*/tools/deepio"), key=lambda p: p.stat().st_mtime, reverse=True)
    return str(built[0]) if built else None


CLI = _find_cli()
# Every test file's pytestmark.
MARKS = [
    pytest.mark.skipif(CLI is None, reason="the deepio command is not built (set DEEPIO_CLI)"),
    # fio ceilings and vm.nr_hugepages are the machine's: no other test runs meanwhile (scripts/test.sh).
    pytest.mark.machine,
]


def fresh_folder() -> Iterator[Path]:
    """The body of every file's `tmp_dir` fixture (``yield from fresh_folder()``): this
    folder, not conftest.py's, which CTest's --noconftest run lacks."""
    base = Path(os.environ.get("DEEPIO_TEST_DIR") or "/var/tmp")
    if not base.is_dir():
        base = Path(tempfile.gettempdir())
    d = Path(tempfile.mkdtemp(prefix="deepio-cli-test-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


DS_IO_LINE = re.compile(r"^(Task|E2E) (Read|Write) (Latency|Speed) = (\S+) (sec|GB/sec)$")


def run(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


def ds_io_lines(stdout: str) -> dict:
    """{('E2E', 'Read', 'Speed'): float, ...} from ds_io's four result lines."""
    out = {}
    for line in stdout.splitlines():
        m = DS_IO_LINE.match(line)
        if m:
            kind, op, what, value, unit = m.groups()
            assert unit == ("sec" if what == "Latency" else "GB/sec"), line
            out[(kind, op, what)] = float(value)  # Python's float repr parses back
    return out


def some_folders(tmp_dir: Path, n: int) -> list[Path]:
    folders = [tmp_dir / f"drive{i}" for i in range(n)]
    for f in folders:
        f.mkdir()
    return folders


def bad(*args: str, expect: list[str]) -> None:
    r = run(*args)
    assert r.returncode not in (0,) and r.returncode > 0, (args, r.returncode, r.stderr)  # no signal, no core
    assert "Traceback" not in r.stderr and "core dumped" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln]
    for needle in expect:
        assert any(needle in ln for ln in lines), (needle, r.stderr)
    for ln in lines:
        assert ln.startswith("deepio"), ln  # one line per problem, each naming the command
