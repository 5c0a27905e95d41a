#!/usr/bin/env python3
"""Two builds of deepio's engine against each other, interleaved in one run.

Runs the same engine_bench cases with an old and a new engine_bench binary, alternating which
goes first (A B, B A, ...), and prints per case the medians of GiB/s and CPU seconds per GiB
and the ratio new/old. Cases: one 1 GiB file written and read sequentially (1 MiB blocks,
QD 128), 8192 separate 64 KiB files read with one async call each and one wait(), and 65536
reads of 4 KiB on one file (the per-operation cost). Each sample is a process that moves the
data --passes times with the same handle and buffer; the last pass is reported (the first DMA
into fresh memory is slow on these VMs, see docs/benchmarks.md). Use it to show that a change
did not make the engine slower: build the old commit in a worktree, then

    python3 bench/before_after.py --old /work/before/build/b/bench/engine_bench \\
        --new build/default/bench/engine_bench --pairs 7
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

GIB = 1 << 30


def run(binary, passes, *extra):
    """One engine_bench process: its passes (one dict each), or [] for --prepare."""
    rep = [] if "--prepare" in extra else ["--repeat", str(passes)]
    out = subprocess.run([binary, *extra, *rep], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.strip().splitlines()]


def medians(samples):
    gibs = [s["bytes"] / GIB / s["seconds"] for s in samples]
    cpu = [s["cpu_seconds"] / (s["bytes"] / GIB) for s in samples]
    return statistics.median(gibs), statistics.median(cpu), min(gibs), max(gibs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="engine_bench of the build before the change")
    ap.add_argument("--new", required=True, help="engine_bench of the build after the change")
    ap.add_argument("--dir", default=None, help="folder on the disk (default: a temp dir in /var/tmp)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--size", type=int, default=GIB)
    ap.add_argument("--backend", default="io_uring")
    ap.add_argument("--json", default=None, help="write every sample here")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="deepio-ab-", dir="/var/tmp")
    os.makedirs(root, exist_ok=True)
    big, small, ops = os.path.join(root, "seq.bin"), os.path.join(root, "small"), os.path.join(root, "ops.bin")
    os.makedirs(small, exist_ok=True)
    seq = ["--mode", "seq", "--path", big, "--size", str(args.size), "--block", str(1 << 20), "--qd", "128"]
    files = ["--mode", "files", "--path", small, "--size", "65536", "--files", "8192", "--qd", "64"]
    many = ["--mode", "ops", "--path", ops, "--size", "4096", "--files", "65536", "--qd", "64"]
    cases = {
        f"seq write {args.size >> 20} MiB": [*seq, "--op", "write"],
        f"seq read {args.size >> 20} MiB": [*seq, "--op", "read"],
        "8192 x 64 KiB files read": [*files, "--op", "read"],
        "65536 x 4 KiB ops read": [*many, "--op", "read"],
    }
    common = ["--backend", args.backend]
    results = {}
    try:
        for prep in (seq, files, many):
            run(args.new, 1, *prep, "--op", "write", "--prepare", *common)
        for name, argv in cases.items():
            got = {"old": [], "new": []}
            run(args.old, 1, *argv, *common)  # warm-up: the virtual disk favours recent data
            run(args.new, 1, *argv, *common)
            for i in range(args.pairs):
                for who in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    got[who].append(run(getattr(args, who), args.passes, *argv, *common)[-1])
            results[name] = got
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"backend={args.backend} pairs={args.pairs} passes={args.passes} (last pass reported) dir={root}")
    print(
        f"{'case':<27} {'old GiB/s':>10} {'new GiB/s':>10} {'new/old':>8} {'old range':>13} {'new range':>13} "
        f"{'old CPU s/GiB':>14} {'new CPU s/GiB':>14}"
    )
    for name, got in results.items():
        og, oc, olo, ohi = medians(got["old"])
        ng, nc, nlo, nhi = medians(got["new"])
        print(
            f"{name:<27} {og:>10.3f} {ng:>10.3f} {ng / og:>8.3f} {f'{olo:.2f}-{ohi:.2f}':>13} "
            f"{f'{nlo:.2f}-{nhi:.2f}':>13} {oc:>14.3f} {nc:>14.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
