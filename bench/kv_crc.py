#!/usr/bin/env python3
"""CRC-32C speed: deepio.kv.crc32c (the checksum of every page a deepio.kv.Store puts or gets)
against Google's crc32c (the `google-crc32c` package, its C library with SSE4.2) and, for
scale, zlib's CRC-32 (another polynomial), interleaved in one process.

Per round (--rounds), each implementation checksums each buffer size (--sizes) over --bytes in
total, the implementations' order rotating per round; reported per implementation and size: the
median over rounds of GB/s (10^9 bytes per second) and of CPU seconds per GiB. The values are
checked against google-crc32c where it is installed (CRC-32C of random bytes).

A before/after comparison of two deepio builds runs this twice, one with the other build on
PYTHONPATH (a copy of its installed `deepio` package), alternating; google-crc32c is the common
baseline of both runs.

Usage: python3 bench/kv_crc.py [--sizes 4K,2M,64M] [--bytes 2G] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import zlib

import deepio.kv


def size_arg(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def implementations() -> dict:
    impls = {"deepio.kv.crc32c": lambda b: deepio.kv.crc32c(b)}
    try:
        import google_crc32c

        impls["google-crc32c (" + google_crc32c.implementation + ")"] = lambda b: google_crc32c.value(b)
    except ImportError:
        print("google-crc32c not installed (pip install google-crc32c): compared with zlib only", file=sys.stderr)
    impls["zlib.crc32 (CRC-32)"] = lambda b: zlib.crc32(b)
    return impls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4K,2M,64M", help="buffer sizes, comma-separated (default 4K,2M,64M)")
    ap.add_argument("--bytes", default="2G", help="bytes checksummed per implementation, size and round (default 2G)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print every sample as JSON too")
    args = ap.parse_args()
    sizes = [size_arg(s) for s in args.sizes.split(",")]
    total = size_arg(args.bytes)
    impls = implementations()
    names = list(impls)
    where = os.path.dirname(deepio.__file__)
    print(f"deepio from {where}; sizes {args.sizes}; {args.bytes} per sample; {args.rounds} rounds")
    bufs = {n: memoryview(os.urandom(n)) for n in sizes}
    if len(names) > 2:
        ref = impls[names[1]]
        for n, b in bufs.items():
            got, want = impls[names[0]](b), ref(bytes(b))
            if got != want:
                print(f"MISMATCH at {n} bytes: deepio {got:#010x}, google-crc32c {want:#010x}", file=sys.stderr)
                return 1
    samples = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = impls[name]
            for n in sizes:
                b = bufs[n] if not name.startswith("google") else bytes(bufs[n])
                reps = max(1, total // n)
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(reps):
                    fn(b)
                secs, cpu = time.perf_counter() - t0, time.process_time() - c0
                samples.append({"impl": name, "size": n, "bytes": reps * n, "seconds": secs, "cpu_seconds": cpu})
    print(f"{'implementation':<34} {'size':>8} {'GB/s':>8} {'CPU s/GiB':>10}")
    for name in names:
        for n in sizes:
            ss = [s for s in samples if s["impl"] == name and s["size"] == n]
            gbs = statistics.median(s["bytes"] / s["seconds"] / 1e9 for s in ss)
            cpg = statistics.median(s["cpu_seconds"] / (s["bytes"] / (1 << 30)) for s in ss)
            print(f"{name:<34} {n:>8} {gbs:>8.2f} {cpg:>10.3f}")
    if args.json:
        print(json.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
