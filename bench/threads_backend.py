#!/usr/bin/env python3
"""The threads backend on one file: random 4 KiB reads and 1 MiB reads through one
``deepio.File.pread_ranges`` each (one worker, queue depth 32, overlap_events on), medians of
--runs. Prints the configuration first, then per block size reads/s, GiB/s and the process's
CPU seconds per GiB; the bytes read are checked against the file after the timed runs. Makes a
64 MiB file at PATH if there is none.

  python3 bench/threads_backend.py PATH [--direct-io on|off|auto] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import deepio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--direct-io", default="auto")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    n = 64 << 20
    if not os.path.exists(args.path):
        with open(args.path, "wb") as f:
            f.write(os.urandom(n))
    n = os.path.getsize(args.path)
    h = deepio.aio_handle(
        block_size=1 << 20, queue_depth=32, overlap_events=True, intra_op_parallelism=1, backend="threads"
    )
    print(
        f"# deepio {deepio.__file__}; backend threads, one worker, queue depth 32; {args.path} ({n} bytes), "
        f"direct_io={args.direct_io}; runs {args.runs}"
    )
    rng = np.random.default_rng(1)
    with deepio.File(args.path, handle=h, direct_io=args.direct_io) as f:
        for bs, count in ((4096, 32768), (1 << 20, 256)):
            buf = np.empty(bs * count, dtype=np.uint8)
            offsets = (rng.integers(0, n // bs, count) * bs).astype(np.int64)
            sizes = np.full(count, bs, dtype=np.int64)
            samples = []
            for _ in range(args.runs):
                t0, c0 = time.perf_counter(), time.process_time()
                f.pread_ranges(buf, offsets, sizes).result()
                samples.append((time.perf_counter() - t0, time.process_time() - c0))
            want = np.fromfile(args.path, dtype=np.uint8)[: n // bs * bs].reshape(-1, bs)[offsets // bs]
            if not np.array_equal(buf.reshape(count, bs), want):
                raise SystemExit(f"threads_backend: the {bs}-byte reads differ from the file")
            t = statistics.median(s[0] for s in samples)
            c = statistics.median(s[1] for s in samples)
            gib = bs * count / 2**30
            print(
                f"{bs:8} B x {count:5}: {count / t / 1e3:6.0f}k reads/s, {gib / t:5.2f} GiB/s, CPU {c / gib:.2f} s/GiB"
            )


if __name__ == "__main__":
    main()
