#!/usr/bin/env python3
"""One engine, several drives at once (issue 38): each drive alone, then all of them together,
through one ``deepio.aio_handle()`` with its default settings, interleaved round by round.

Rows, per round (medians over the rounds are printed, with the range):
  read  whole files: one file of --mib MiB per folder, one async_pread each, one wait()
  write whole files: the same with async_pwrite
  pages: --pages random --page-kib KiB pages of each file through ``deepio.File.pread_ranges``
         (one call per file, then every future waited)
For each row: the drives alone (one after another, each timed) give the sum of their rates;
together gives the rate of all at once; the ratio together / sum is what the scheduler is
judged by (1.0: every drive at its own speed at once). CPU seconds per GiB of the process,
every thread, for the together runs.

Meant for separate devices of known speed: ``bench/throttled_drives.sh up 3 100`` makes three
loop devices throttled to 100 MiB/s each, mounted at /mnt/drive0..2:

    python3 bench/many_drives.py --dirs /mnt/drive0,/mnt/drive1,/mnt/drive2 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepio  # noqa: E402
from benchutil import cpu_seconds  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


def aligned(nbytes: int) -> np.ndarray:
    """A zeroed byte array whose data starts on a 4 KiB boundary (O_DIRECT takes it as it is)."""
    raw = np.zeros(nbytes + 4096, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 4096
    return raw[skip : skip + nbytes]


REST = 0.5


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of fn(), after REST seconds of idle devices: the
    block layer's throttle (cgroup v1 blkio) lets a device that was idle start with a burst,
    which every timed run then gets alike."""
    time.sleep(REST)
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dirs", required=True, help="comma-separated folders, one per drive")
    ap.add_argument("--mib", type=int, default=96, help="size of each drive's file (MiB)")
    ap.add_argument("--pages", type=int, default=256, help="random pages read per file and round")
    ap.add_argument("--page-kib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rest", type=float, default=REST, help="idle seconds before each timed run")
    args = ap.parse_args()
    globals()["REST"] = args.rest
    dirs = [d for d in args.dirs.split(",") if d]
    nbytes = args.mib * MIB
    page = args.page_kib << 10
    if nbytes < page:
        ap.error("--mib must hold at least one page")
    rng = random.Random(args.seed)
    h = deepio.aio_handle()
    paths = [os.path.join(d, "deepio-many-drives.bin") for d in dirs]
    bufs = [aligned(nbytes) for _ in dirs]
    for b in bufs:
        b[:] = np.frombuffer(rng.randbytes(nbytes), dtype=np.uint8)
    for b, p in zip(bufs, paths):
        h.sync_pwrite(b, p)
    pagebufs = [aligned(args.pages * page) for _ in dirs]
    files = [deepio.File(p, "r+") for p in paths]

    def read(idx):
        for i in idx:
            h.async_pread(bufs[i], paths[i])
        h.wait()

    def write(idx):
        for i in idx:
            h.async_pwrite(bufs[i], paths[i])
        h.wait()

    def pages(idx):
        futs = []
        for i in idx:
            offs = [rng.randrange(nbytes // page) * page for _ in range(args.pages)]
            futs.append(files[i].pread_ranges(pagebufs[i], offs, [page] * args.pages))
        for f in futs:
            f.result()

    rows = {"read": (read, nbytes), "write": (write, nbytes), "pages": (pages, args.pages * page)}
    results: dict[str, dict[str, list[float]]] = {k: {"sum": [], "together": [], "cpu": []} for k in rows}
    everyone = list(range(len(dirs)))
    for _ in range(args.rounds):
        for name, (fn, per_drive) in rows.items():
            alone = [per_drive / timed(lambda i=i, fn=fn: fn([i]))[0] for i in everyone]
            wall, cpu = timed(lambda fn=fn: fn(everyone))
            total = per_drive * len(dirs)
            results[name]["sum"].append(sum(alone) / MIB)
            results[name]["together"].append(total / wall / MIB)
            results[name]["cpu"].append(cpu / (total / GIB))
    for f in files:
        f.close()
    for p in paths:
        os.unlink(p)

    print(f"{len(dirs)} folders: {', '.join(dirs)}; {args.rounds} rounds, medians (range)")
    print("| row | drives alone, sum (MiB/s) | together (MiB/s) | together / sum | CPU s/GiB together |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        ratios = [t / s for t, s in zip(r["together"], r["sum"])]
        print(
            f"| {name} | {statistics.median(r['sum']):.0f} | {statistics.median(r['together']):.0f} "
            f"| **{statistics.median(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f}) "
            f"| {statistics.median(r['cpu']):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
