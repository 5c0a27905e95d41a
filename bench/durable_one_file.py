#!/usr/bin/env python3
"""Durable writes of many pieces of ONE file: what fsync=True costs against one fdatasync.

Three ways to write --count pieces of --size bytes to a fresh file (a new name every sample)
and have them on stable storage when the call returns, same handle and locked buffer:
  batch+fsync    async_pwrite_batch(..., fsync=True): every write durable on its own (the
                 engine groups the syncs of one file: writes that finish while a sync of the
                 file runs share the next one)
  ranges+fsync   async_pwrite_ranges(..., fsync=True): one operation, one sync
  batch+1 sync   async_pwrite_batch(...), then one os.fdatasync of the file (the baseline:
                 what the data costs with a single sync, no per-write durability)
Modes rotated per pair; medians of --pairs; ms, GiB/s, CPU s/GiB (process, all threads),
and the disk's flush count over the sample (/sys/block/<dev>/stat, where readable).

Usage: python3 bench/durable_one_file.py [--dir /var/tmp] [--count 1024] [--size 65536] [--pairs 5]
                                         [--modes "batch+fsync,ranges+fsync,batch+1 sync"]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import deepio
from benchutil import block_device, cpu_seconds, disk_stat, fsync_path, stat_delta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--count", type=int, default=1024)
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--modes", default="batch+fsync,ranges+fsync,batch+1 sync", help="comma-separated subset")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="deepio-durable-", dir=a.dir)
    dev = block_device(root)
    h = deepio.aio_handle(block_size=1 << 20, queue_depth=128, intra_op_parallelism=2)
    total = a.count * a.size
    buf = h.new_cpu_locked_tensor(total, np.empty(0, np.uint8))
    buf[:] = np.random.default_rng(1).integers(0, 256, total, dtype=np.uint8)
    views = [buf[i * a.size : (i + 1) * a.size] for i in range(a.count)]
    offsets = [i * a.size for i in range(a.count)]
    modes = a.modes.split(",")
    if "batch+1 sync" not in modes:
        modes.append("batch+1 sync")  # the baseline of every ratio
    rows: dict[str, list[tuple[float, float, int | None]]] = {m: [] for m in modes}
    print(f"deepio {deepio.__version__}; {a.count} x {a.size} B to one fresh file in {root} (device {dev})")
    try:
        n = 0
        for pair in range(a.pairs):
            for mode in modes[pair % len(modes) :] + modes[: pair % len(modes)]:
                n += 1
                path = os.path.join(root, f"f{n}")
                s0, c0, t0 = disk_stat(dev), cpu_seconds(), time.perf_counter()
                if mode == "batch+fsync":
                    h.async_pwrite_batch(views, path, offsets, fsync=True)
                    h.wait()
                elif mode == "ranges+fsync":
                    h.async_pwrite_ranges(buf, path, offsets, a.size, fsync=True)
                    h.wait()
                else:
                    h.async_pwrite_batch(views, path, offsets)
                    h.wait()
                    fsync_path(path, data_only=True)
                s, c = time.perf_counter() - t0, cpu_seconds() - c0
                rows[mode].append((s, c, stat_delta(s0, disk_stat(dev), "flushes")))
        gib = total / (1 << 30)
        base = rows["batch+1 sync"]
        print(f"{'mode':14} {'ms':>8} {'GiB/s':>7} {'CPU s/GiB':>10} {'flushes':>8}   time / baseline (pairs)")
        for mode in modes:
            s = statistics.median(x[0] for x in rows[mode])
            c = statistics.median(x[1] for x in rows[mode])
            fl = [x[2] for x in rows[mode] if x[2] is not None]
            ratios = [x[0] / b[0] for x, b in zip(rows[mode], base)]
            flushes = f"{statistics.median(fl):8.0f}" if fl else f"{'-':>8}"
            print(
                f"{mode:14} {s * 1e3:8.1f} {gib / s:7.3f} {c / gib:10.3f} {flushes}   "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )
    finally:
        h.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
