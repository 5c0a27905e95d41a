#!/usr/bin/env python3
"""How long `import deepio` takes from two installs: the binary wheel (an environment made by
scripts/test-wheel.sh) against the source build (`pip install .`), interleaved, medians.

    python3 bench/import_time.py --wheel build/wheel/test-venv/bin/python --source python3

Each round starts one fresh interpreter per install, in alternating order, that imports deepio
and reports the import's wall time (time.perf_counter around the import) and the process's
CPU seconds; the interpreter's own start-up is not counted. Before timing, each install is
asked where deepio comes from, so that the two rows are really two different builds. Prints a
table and, with --json, one JSON object. The issue's target: the wheel within 1.2x of the
source build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess

CHILD = r"""
import json, os, resource, time
t0 = time.perf_counter(); c0 = resource.getrusage(resource.RUSAGE_SELF)
import deepio
t1 = time.perf_counter(); c1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
print(json.dumps({"wall": t1 - t0, "cpu": cpu, "where": os.path.dirname(deepio.__file__)}))
"""


def _once(python: str) -> dict:
    out = subprocess.run([python, "-c", CHILD], capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", required=True, help="python of the environment holding the wheel")
    ap.add_argument("--source", default="python3", help="python whose deepio is the source build")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    # Resolved here: the children run from / (so that no source folder is on their sys.path).
    installs = {
        k: os.path.abspath(p) if os.sep in p else (shutil.which(p) or p)
        for k, p in (("wheel", a.wheel), ("source", a.source))
    }
    where = {k: _once(p)["where"] for k, p in installs.items()}
    if where["wheel"] == where["source"]:
        raise SystemExit(f"both interpreters import the same deepio ({where['wheel']})")
    samples: dict[str, list[dict]] = {k: [] for k in installs}
    for r in range(a.rounds):
        order = list(installs) if r % 2 == 0 else list(reversed(installs))
        for k in order:
            samples[k].append(_once(installs[k]))
    med = {
        k: {m: statistics.median(s[m] for s in v) for m in ("wall", "cpu")} | {"where": where[k]}
        for k, v in samples.items()
    }
    ratio = med["wheel"]["wall"] / med["source"]["wall"]
    if a.json:
        print(json.dumps({"rounds": a.rounds, "median": med, "wheel_over_source": ratio}))
    else:
        for k, m in med.items():
            print(f"{k:7s} import deepio: {1e3 * m['wall']:7.1f} ms wall, {1e3 * m['cpu']:7.1f} ms CPU  ({m['where']})")
        print(f"wheel / source (wall, median of {a.rounds}): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
