#!/usr/bin/env python3
"""Batched submission against a Python loop of single submissions, same handle and buffers.

Cases (each: loop = one aio_handle.async_pread/async_pwrite per request then wait();
batch = one async_pread_batch/async_pwrite_batch then wait(); ranges = one
async_pread_ranges over all the requests, small reads only):
  small-reads   N reads of --small bytes at offsets of one file (page cache dropped first)
  many-files    --files files of --file-size bytes: write them, then read them back
                (page cache and dentries dropped before the reads: cold opens)

Pairs are interleaved (loop, batch, ranges, then the order rotated), medians of --pairs; every row prints
ops/s, GiB/s and CPU seconds per GiB of the process (user + system, all threads); for the
small reads, also the time spent in the submitting call(s) per request, before wait().

Usage: python3 bench/batch_submit.py [--dir DIR] [--pairs 5] [--small 4096] [--count 65536]
                                     [--files 4096] [--file-size 65536] [--threads 1] [--small-only]
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
from benchutil import cpu_seconds, drop_caches


def timed(fn, *args):
    c0, t0 = cpu_seconds(), time.perf_counter()
    call = fn(*args)
    return time.perf_counter() - t0, cpu_seconds() - c0, call


def small_reads(h, path, bufs, offsets, mode: str, pool, offset_array, size: int) -> float:
    # Returns the seconds spent in the submitting call(s), before wait().
    t0 = time.perf_counter()
    if mode == "batch":
        h.async_pread_batch(bufs, path, offsets)
    elif mode == "ranges":
        h.async_pread_ranges(pool, path, offset_array, size)
    else:
        for b, o in zip(bufs, offsets):
            h.async_pread(b, path, o)
    call = time.perf_counter() - t0
    h.wait()
    return call


def many(h, write: bool, bufs, paths, batch: bool) -> None:
    if batch:
        (h.async_pwrite_batch if write else h.async_pread_batch)(bufs, paths)
    else:
        call = h.async_pwrite if write else h.async_pread
        for b, p in zip(bufs, paths):
            call(b, p)
    h.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="folder for the test files (default: a temporary one)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--small", type=int, default=4096)
    ap.add_argument("--count", type=int, default=65536)
    ap.add_argument("--files", type=int, default=4096)
    ap.add_argument("--file-size", type=int, default=65536)
    ap.add_argument("--queue-depth", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="intra_op_parallelism")
    ap.add_argument("--small-only", action="store_true", help="only the small-reads case")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="deepio-batch-", dir=a.dir)
    cold = drop_caches()
    print(f"deepio {deepio.__version__}; folder {root}; page cache dropped: {cold}; pairs {a.pairs}")
    h = deepio.aio_handle(block_size=1 << 20, queue_depth=a.queue_depth, intra_op_parallelism=a.threads)
    try:
        # small-reads: one file, N aligned offsets in random order.
        path = os.path.join(root, "small")
        total = a.small * a.count
        with open(path, "wb") as f:
            f.write(np.random.default_rng(1).integers(0, 256, total, dtype=np.uint8).tobytes())
        pool = h.new_cpu_locked_tensor(total, np.empty(0, np.uint8))
        bufs = [pool[i * a.small : (i + 1) * a.small] for i in range(a.count)]
        offsets = [int(i) * a.small for i in np.random.default_rng(2).permutation(a.count)]
        offset_array = np.array(offsets, dtype=np.int64)
        # many-files
        fbufs = [np.random.default_rng(10 + i).integers(0, 256, a.file_size, dtype=np.uint8) for i in range(a.files)]
        paths = [os.path.join(root, f"f{i:06d}") for i in range(a.files)]
        rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
        calls: dict[str, list[float]] = {}

        def record(case: str, mode: str, s: float, c: float, call: float | None = None) -> None:
            rows.setdefault(case, {}).setdefault(mode, []).append((s, c))
            if call is not None:
                calls.setdefault(mode, []).append(call)

        all_modes = ["loop", "batch", "ranges"]
        for pair in range(a.pairs):
            order = all_modes[pair % 3 :] + all_modes[: pair % 3]
            for mode in order:
                drop_caches()
                s, c, call = timed(small_reads, h, path, bufs, offsets, mode, pool, offset_array, a.small)
                record(f"{a.count} reads of {a.small} B, one file", mode, s, c, call)
            for mode in [m for m in order if m != "ranges" and not a.small_only]:
                batch = mode == "batch"
                for p in paths:
                    if os.path.exists(p):
                        os.unlink(p)
                s, c, _ = timed(many, h, True, fbufs, paths, batch)
                record(f"{a.files} new files of {a.file_size} B: write", mode, s, c)
                drop_caches()
                s, c, _ = timed(many, h, False, fbufs, paths, batch)
                record(f"{a.files} files of {a.file_size} B: read (cold)", mode, s, c)
        sizes = {  # (operations, bytes) per case
            f"{a.count} reads of {a.small} B, one file": (a.count, total),
            f"{a.files} new files of {a.file_size} B: write": (a.files, a.files * a.file_size),
            f"{a.files} files of {a.file_size} B: read (cold)": (a.files, a.files * a.file_size),
        }
        print(f"{'case':44} {'mode':6} {'kops/s':>8} {'GiB/s':>7} {'CPU s/GiB':>10}   speed-up over loop (pairs)")
        for case, modes in rows.items():
            ops, nbytes = sizes[case]
            gib = nbytes / (1 << 30)
            for mode in [m for m in all_modes if m in modes]:
                s = statistics.median(x[0] for x in modes[mode])
                c = statistics.median(x[1] for x in modes[mode])
                extra = ""
                if mode != "loop":
                    ratios = [lp[0] / bt[0] for lp, bt in zip(modes["loop"], modes[mode])]
                    extra = f"   {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                print(f"{case:44} {mode:6} {ops / s / 1e3:8.1f} {gib / s:7.3f} {c / gib:10.3f}{extra}")
        for mode in all_modes:
            per = statistics.median(calls[mode]) / a.count * 1e6
            print(f"{a.count} reads of {a.small} B: {mode} submitting call(s) {per:.2f} us per request (median)")
    finally:
        h.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
