#!/usr/bin/env python3
"""The engine's cost per request, old package against new, interleaved in one run (issue 46
item 6).

Each sample is a process of one Python (a venv with one build of deepio) that reads N random
pages of BS from one file with O_DIRECT through aio_handle: one async_pread per page on an
O_DIRECT descriptor (no open per op), one wait(), queue depth 64, overlap_events on; the
process makes the reads once untimed, then times a second pass (GiB/s, requests/s and the
process's CPU seconds per GiB, every thread). The old and new Pythons alternate which goes
first (old new, new old, ...); medians of --rounds pairs per page size.

    python3 bench/per_request_ab.py --old /work/venv-old/bin/python \\
        --new /work/venv-new/bin/python --file /mnt/ram0/file.bin --par 2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GIB = 1 << 30
CASES = {"4K": (4096, 32768), "64K": (65536, 8192), "256K": (262144, 2048)}


def one(path: str, bs: int, n: int, par: int) -> None:
    import numpy as np

    import deepio

    h = deepio.aio_handle(
        block_size=1 << 20, queue_depth=64, overlap_events=True, intra_op_parallelism=par, direct_io="on"
    )
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    size = os.path.getsize(path)
    offs = (np.random.default_rng(3).integers(0, size // bs, n) * bs).tolist()
    buf = h.new_cpu_locked_tensor(n * bs, np.empty(0, np.uint8))
    views = [buf[i * bs : (i + 1) * bs] for i in range(n)]
    for _rep in range(2):  # the first pass untimed: fresh memory, registrations
        c0, t0 = time.process_time(), time.perf_counter()
        for v, o in zip(views, offs):
            h.async_pread(v, fd, o)
        h.wait()
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"bytes": n * bs, "requests": n, "seconds": secs, "cpu_seconds": cpu}))
    os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", help="python of the venv with the old build")
    ap.add_argument("--new", help="python of the venv with the new build")
    ap.add_argument("--file", required=True, help="a file of at least 64 MiB on the drive to measure")
    ap.add_argument("--par", type=int, default=2, help="intra_op_parallelism")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: "BS,N"
    a = ap.parse_args()
    if a.one:
        bs, n = (int(x) for x in a.one.split(","))
        one(a.file, bs, n, a.par)
        return
    py = {"old": a.old, "new": a.new}
    res: dict = {}
    for r in range(a.rounds):
        for name, (bs, n) in CASES.items():
            for tag in ("old", "new") if r % 2 == 0 else ("new", "old"):
                cmd = [py[tag], os.path.abspath(__file__), "--file", a.file, "--par", str(a.par), "--one", f"{bs},{n}"]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd="/tmp").stdout
                s = json.loads(out.strip().splitlines()[-1])
                gib = s["bytes"] / GIB
                res.setdefault((name, tag), []).append((gib / s["seconds"], n / s["seconds"], s["cpu_seconds"] / gib))
    print(
        f"aio_handle.async_pread, one op per page on an O_DIRECT fd, one wait(); intra_op_parallelism={a.par}, "
        f"QD 64; {a.rounds} interleaved rounds, medians (GiB/s min-max)"
    )
    print(f"{'page':5} {'build':5} {'GiB/s':>6} {'pages/s':>8} {'CPU s/GiB':>9}")
    for name in CASES:
        for tag in ("old", "new"):
            v = res[(name, tag)]
            g = [x[0] for x in v]
            print(
                f"{name:5} {tag:5} {statistics.median(g):6.2f} {statistics.median(x[1] for x in v):8.0f} "
                f"{statistics.median(x[2] for x in v):9.3f}   ({min(g):.2f}-{max(g):.2f})"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
