"""`deepio info --kv`: a read-only look at a deepio.kv store's folders while another process
holds the store open (issue 49 item 4): layout, capacity, pages (as of the last checkpoint, or
every header with --scan), free slots, the last checkpoint and the process holding the lock;
the holder is never disturbed (it keeps its lock and its pages)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli_support import CLI, run

pytestmark = pytest.mark.skipif(CLI is None, reason="the deepio command is not built (set DEEPIO_CLI)")

PAGE = 64 * 1024

HOLDER = textwrap.dedent(
    """
    import sys, torch, deepio.kv
    folder, n, checkpoint, page = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
    s = deepio.kv.Store([folder], page_bytes=page, capacity_bytes=32 << 20)
    pool = torch.arange(n * page, dtype=torch.int64).to(torch.uint8).reshape(n, page)
    s.register(pool)
    assert all(s.put([f"k{i}" for i in range(n)], list(range(n))).result())
    if checkpoint:
        s.checkpoint()
    print("ready", flush=True)
    sys.stdin.readline()  # held open until the test is done
    out = torch.zeros_like(pool)
    s.register(out)
    assert all(s.get([f"k{i}" for i in range(n)], list(range(n))).result()), "the holder lost pages"
    assert torch.equal(out, pool)
    s.close()
    print("ok", flush=True)
    """
)


class Holder:
    """A process holding a store over `folder` with n pages put (and checkpointed, or not)."""

    def __init__(self, folder: Path, n: int, checkpoint: bool) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), str(n), "1" if checkpoint else "0", str(PAGE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.p.stdout is not None and self.p.stdout.readline().strip() == "ready"

    def finish(self) -> None:
        out, _ = self.p.communicate("\n", timeout=60)
        assert self.p.returncode == 0 and out.strip() == "ok", out


def kv_json(*args: str) -> dict:
    r = run("info", "--json", "--kv", *args)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_a_store_held_by_another_process_is_described_without_disturbing_it(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    holder = Holder(folder, 12, checkpoint=True)
    try:
        (f,) = kv_json(str(folder))["folders"]
        assert f["problem"] is None
        assert f["held_by_pid"] == holder.p.pid
        assert f["page_bytes"] == PAGE and f["slots"] > 12 and f["capacity_bytes"] == f["slots"] * PAGE
        assert f["checkpoint"] and f["checkpoint_pages"] == 12 and f["pages"] == 12
        assert f["free_slots"] == f["slots"] - 12
        assert 0 <= f["checkpoint_age_seconds"] < 600
        text = run("info", "--kv", str(folder)).stdout
        assert f"open in process {holder.p.pid}" in text and "12 live" in text
    finally:
        holder.finish()  # its lock and its pages were never touched
    (f,) = kv_json(str(folder))["folders"]
    assert f["held_by_pid"] is None


def test_scan_counts_the_pages_put_since_the_last_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    holder = Holder(folder, 7, checkpoint=False)
    try:
        (f,) = kv_json(str(folder))["folders"]
        # Nothing checkpointed yet: the store's first checkpoint (made with it) lists no page.
        assert f["checkpoint_pages"] == 0 and f["pages"] == 0
        (f,) = kv_json(str(folder), "--scan")["folders"]
        assert f["scanned"] and f["pages"] == 7 and f["free_slots"] == f["slots"] - 7
    finally:
        holder.finish()


def test_folders_that_hold_no_store_are_named_and_fail_the_command(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "kv.meta").write_bytes(b"DKVM\x02\x00")
    r = run("info", "--kv", str(empty), str(torn), str(tmp_path / "absent"))
    assert r.returncode == 1
    assert "not a deepio.kv folder" in r.stdout and "kv.meta is not whole" in r.stdout
    bad = run("info", "--scan")
    assert bad.returncode != 0 and "--scan goes with --kv" in bad.stderr
