"""Where the kernel refuses io_uring or libaio, deepio falls back and says so.

Containers' default seccomp profile refuses io_uring; ``kernel.io_uring_disabled=2`` does the
same for the whole machine, and ``fs.aio-max-nr=0`` makes every ``io_setup`` fail. With each set,
a fresh process (the check of an installed wheel runs this file too) must pick the next backend
(io_uring, then libaio, then threads), move the bytes, and give the reason in ``deepio.info()``
and ``deepio info``. Root only, where the sysctls exist: the test sets them for the seconds a
child process runs and restores them in ``finally``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import CLI

IO_URING = Path("/proc/sys/kernel/io_uring_disabled")
AIO_MAX = Path("/proc/sys/fs/aio-max-nr")

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not IO_URING.exists() or not AIO_MAX.exists(),
        reason="needs root and the sysctls kernel.io_uring_disabled (Linux 6.6+) and fs.aio-max-nr",
    ),
    # The sysctls are the machine's: no other test may run meanwhile (scripts/test.sh).
    pytest.mark.machine,
]

CHILD = r"""
import json, sys
import deepio

path = sys.argv[1]
data = bytes(range(256)) * 4099  # not a multiple of any alignment
h = deepio.aio_handle(block_size=64 << 10, queue_depth=8, intra_op_parallelism=2)
src = bytearray(data)
assert h.sync_pwrite(src, path) == 1
dst = bytearray(len(data))
assert h.sync_pread(dst, path) == 1
info = deepio.info()
print(json.dumps({
    "backend": h.backend,
    "same": bytes(dst) == data,
    "auto": info["auto_backend"],
    "reasons": {b["name"]: b["reason"] for b in info["backends"] if not b["available"]},
}))
"""


def _set(knob: Path, value: str) -> str:
    old = knob.read_text().strip()
    knob.write_text(value)
    return old


@pytest.fixture
def refuse():
    """refuse(io_uring=..., aio=...): sets the sysctls; every one is restored afterwards."""
    restore: list[tuple[Path, str]] = []

    def apply(io_uring: bool = False, aio: bool = False) -> None:
        if io_uring:
            restore.append((IO_URING, _set(IO_URING, "2")))
        if aio:
            restore.append((AIO_MAX, _set(AIO_MAX, "0")))

    try:
        yield apply
    finally:
        for knob, old in reversed(restore):
            knob.write_text(old)


def _child(tmp_path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "f.bin")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli_backends() -> str:
    assert CLI is not None
    out = subprocess.run([CLI, "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize(
    "refused, expected",
    [((True, False), "libaio"), ((True, True), "threads")],
    ids=["io_uring-refused", "io_uring-and-libaio-refused"],
)
@pytest.mark.wheel
def test_a_refused_backend_falls_back_and_says_why(tmp_path, refuse, refused, expected):
    io_uring, aio = refused
    refuse(io_uring=io_uring, aio=aio)
    got = _child(tmp_path)
    assert got["same"], got
    assert got["backend"] == expected and got["auto"] == expected, got
    assert "io_uring_disabled" in got["reasons"]["io_uring"], got
    if aio:
        assert "libaio" in got["reasons"], got
    if CLI is not None:
        text = _cli_backends()
        assert f"backends (auto picks {expected})" in text, text
        assert "io_uring  unavailable" in text, text


@pytest.mark.wheel
def test_nothing_refused_picks_io_uring(tmp_path):
    """The control: the same child, sysctls untouched, gets io_uring (so the cases above test
    the refusal, not this machine)."""
    if IO_URING.read_text().strip() != "0":
        pytest.skip("io_uring is already restricted on this machine")
    got = _child(tmp_path)
    assert got["same"] and got["backend"] == "io_uring" and got["auto"] == "io_uring", got
