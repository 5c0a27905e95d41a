"""bench/gets_under_puts.py (issue 46 item 3) in a tiny configuration: it runs, its gets
return the pages that were put (the program checks each get's index stamps and one batch per
round byte for byte, and exits non-zero otherwise), and its JSON line holds the figures the
table is made from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_gets_under_puts_runs_and_reads_back_what_was_put(tmp_dir):
    folders = [tmp_dir / "a", tmp_dir / "b"]
    for f in folders:
        f.mkdir()
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gets_under_puts.py"),
            "--folders",
            *map(str, folders),
            "--page-bytes",
            "64K",
            "--get-pages",
            "32",
            "--put-keys",
            "16",
            "--put-batch",
            "4",
            "--seconds",
            "0.5",
            "--rounds",
            "2",
            "--queue-depth",
            "16",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["rounds"]) == 2
    for rnd in out["rounds"]:
        for phase in ("alone", "under"):
            assert rnd[phase]["n"] > 0
            assert 0 < rnd[phase]["p50"] <= rnd[phase]["p95"] <= rnd[phase]["p99"]
        assert rnd["under"]["put_gibs"] >= 0 and rnd["puts_alone_gibs"] >= 0
    # The puts progressed, under gets too (a round's window is short: counted over both).
    assert sum(r["under"]["put_gibs"] for r in out["rounds"]) > 0
    assert sum(r["puts_alone_gibs"] for r in out["rounds"]) > 0
    assert out["summary"]["ratio_p95"] > 0
    assert "p95 under puts / p95 alone" in r.stdout
    # The store's folders are removed afterwards; the caller's stay.
    assert all(f.is_dir() and not any(f.iterdir()) for f in folders)
