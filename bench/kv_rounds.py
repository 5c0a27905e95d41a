#!/usr/bin/env python3
"""deepio.kv puts or gets of the same keys, round after round, in one store: a small program
to profile (perf record -g) or to compare two builds of deepio (run it with each build's
Python, alternating). Unlike bench/kv_bench.py, the keys are the same every round, so that
from the second round on every put replaces a page (the index's deletion and the slot's
release are in the cost) and gets read pages that were put rounds before.

1 GiB of pages of --page-bytes over the --folder(s) (one per drive; default the RAM-backed
drives of bench/ram_drives.sh), in batches of --batch pages from a registered pool; a first
untimed round puts them all; then --rounds timed rounds of --phase (a get round drops the
page cache first: root). Prints per round GiB/s and the process's CPU seconds per GiB, then
the store's stats().

Usage: python3 bench/kv_rounds.py [--phase put|get] [--page-bytes 65536] [--rounds 5]
                                  [--batch 256] [--folder DIR ...]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import time

import numpy as np

import deepio.kv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_seconds, drive_folders, drop_caches  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=("put", "get"), default="put")
    ap.add_argument("--page-bytes", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--total", type=int, default=1 << 30, help="bytes of pages (default 1 GiB)")
    ap.add_argument("--folder", action="append", default=[], help="a folder per drive (repeat)")
    a = ap.parse_args()
    bases = drive_folders(a.folder)
    dirs = [os.path.join(f, "kv-rounds") for f in bases]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    pages = max(a.total // a.page_bytes, a.batch)
    st = deepio.kv.Store(dirs, capacity_bytes=int(pages * (a.page_bytes + 4096) * 1.25), page_bytes=a.page_bytes)
    buf = mmap.mmap(-1, a.batch * a.page_bytes)
    pool = np.frombuffer(buf, np.uint8).reshape(a.batch, a.page_bytes)
    pool[:] = 7
    st.register(pool)
    keys = [f"k{i}" for i in range(pages)]
    slots = list(range(a.batch))

    def one_round(call) -> tuple[float, float]:
        t, c = time.perf_counter(), cpu_seconds()
        for b in range(0, pages, a.batch):
            ks = keys[b : b + a.batch]
            if not all(call(ks, slots[: len(ks)]).result()):
                raise SystemExit(f"{a.phase}: a page failed")
        return time.perf_counter() - t, cpu_seconds() - c

    try:
        one_round(st.put)
        gib = pages * a.page_bytes / 2**30
        for _ in range(a.rounds):
            if a.phase == "get":
                drop_caches()
            wall, cpu = one_round(st.get if a.phase == "get" else st.put)
            print(f"{a.phase} {a.page_bytes}: {gib / wall:.2f} GiB/s cpu {cpu / gib:.3f} s/GiB", flush=True)
        print(st.stats())
    finally:
        st.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
