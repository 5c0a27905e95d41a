#!/usr/bin/env python3
"""deepio's engine against fio, interleaved in one run (issue: engine performance).

Sequential: one 1 GiB file read and written from one locked buffer, direct I/O, same engine,
block size and queue depth for both tools. Small files: 8192 separate 64 KiB files read with
one async call each and a single wait(), against fio's 64 KiB reads at queue depth 64.
Pairs alternate their order (fio first, then deepio first, ...). Prints medians of GiB/s and
CPU seconds per GiB, and the ratio deepio/fio; --json writes all samples.

Each deepio sample is a process that allocates its locked buffer and then moves the data
--passes times (default 2) with the same handle and buffer. The main rows use the last pass;
rows marked "(first pass)" use the first. On this virtual machine the first DMA into freshly
allocated memory is slow for any program (docs/benchmarks.md shows it with a plain liburing
loop), while fio reuses a buffer of iodepth x bs, so the last pass is the like-for-like one;
a long-running user (DeepSpeed's swap buffers) reuses its locked buffers the same way.

    python3 bench/engine_vs_fio.py --bench build/default/bench/engine_bench --dir /var/tmp/x
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

GIB = 1 << 30


def fio(args, name, rw, path, size, bs, qd, engine, nrfiles=0):
    if nrfiles:  # the same separate files deepio reads: f0 .. f{n-1} in the folder `path`
        target = [
            f"--directory={path}",
            "--filename_format=f$filenum",
            f"--nrfiles={nrfiles}",
            f"--filesize={size // nrfiles}",
            "--file_service_type=sequential",
            f"--openfiles={qd}",
        ]
    else:
        target = [f"--filename={path}"]
    cmd = [
        "fio",
        f"--name={name}",
        *target,
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={qd}",
        f"--ioengine={engine}",
        "--direct=1",
        f"--size={size}",
        "--numjobs=1",
        "--group_reporting",
        "--output-format=json",
    ]
    if rw == "write":
        cmd.append("--fallocate=none")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    part = job["read" if rw == "read" else "write"]
    secs = part["runtime"] / 1000.0
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * secs
    return {"tool": "fio", "bytes": part["io_bytes"], "seconds": secs, "cpu_seconds": cpu}


def deepio(args, *extra):
    """One engine_bench process; returns its passes (one dict each), or [] for --prepare."""
    passes = [] if "--prepare" in extra else ["--repeat", str(args.passes)]
    out = subprocess.run([args.bench, *extra, *passes], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.strip().splitlines()]


def summarize(samples):
    gibs = [s["bytes"] / GIB / s["seconds"] for s in samples]
    cpu = [s["cpu_seconds"] / (s["bytes"] / GIB) for s in samples]
    return statistics.median(gibs), statistics.median(cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="path to the engine_bench program")
    ap.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temp dir in /var/tmp)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of each tool before each case (the virtual disk is faster on data it served recently)",
    )
    ap.add_argument("--size", type=int, default=GIB)
    ap.add_argument("--engine", default="io_uring", choices=["io_uring", "libaio"])
    ap.add_argument("--qd", type=int, default=128)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--small-files", type=int, default=8192)
    ap.add_argument(
        "--passes", type=int, default=2, help="transfers per deepio process (same buffer); the last is reported"
    )
    ap.add_argument("--json", default=None, help="write every sample here")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("engine_vs_fio: fio is not installed (apt-get install fio)")
    root = args.dir or tempfile.mkdtemp(prefix="deepio-bench-", dir="/var/tmp")
    os.makedirs(root, exist_ok=True)
    big = os.path.join(root, "seq.bin")
    small = os.path.join(root, "small")
    os.makedirs(small, exist_ok=True)
    backend = "io_uring" if args.engine == "io_uring" else "libaio"
    common = ["--backend", backend, "--block", str(args.block), "--qd", str(args.qd)]
    results = {}
    try:
        deepio(args, "--mode", "seq", "--op", "write", "--path", big, "--size", str(args.size), "--prepare", *common)
        for op in ("write", "read"):
            f_s, d_s = [], []
            for _ in range(args.warmup):
                fio(args, "seq", op, big, args.size, args.block, args.qd, args.engine)
                deepio(args, "--mode", "seq", "--op", op, "--path", big, "--size", str(args.size), *common)
            for i in range(args.pairs):
                order = ("fio", "deepio") if i % 2 == 0 else ("deepio", "fio")
                for who in order:
                    if who == "fio":
                        f_s.append(fio(args, "seq", op, big, args.size, args.block, args.qd, args.engine))
                    else:
                        d_s.append(
                            deepio(args, "--mode", "seq", "--op", op, "--path", big, "--size", str(args.size), *common)
                        )
            results[f"seq_{op}"] = {"fio": f_s, "deepio": [d[-1] for d in d_s]}
            results[f"seq_{op} (first pass)"] = {"fio": f_s, "deepio": [d[0] for d in d_s]}
        # Many small tensors: separate files for deepio, one file of the same total for fio.
        total = args.small_files * 65536
        deepio(
            args,
            "--mode",
            "files",
            "--op",
            "write",
            "--path",
            small,
            "--size",
            "65536",
            "--files",
            str(args.small_files),
            "--prepare",
            "--backend",
            backend,
            "--qd",
            "64",
        )
        flat = os.path.join(root, "flat.bin")
        deepio(args, "--mode", "seq", "--op", "write", "--path", flat, "--size", str(total), "--prepare", *common)
        f_s, g_s, d_s = [], [], []
        for _ in range(args.warmup):
            fio(args, "small", "read", flat, total, 65536, 64, args.engine)
            fio(args, "files", "read", small, total, 65536, 64, args.engine, nrfiles=args.small_files)
            deepio(
                args,
                "--mode",
                "files",
                "--op",
                "read",
                "--path",
                small,
                "--size",
                "65536",
                "--files",
                str(args.small_files),
                "--backend",
                backend,
                "--qd",
                "64",
                "--block",
                str(1 << 20),
            )
        for i in range(args.pairs):
            order = ("fio", "fio_files", "deepio") if i % 2 == 0 else ("deepio", "fio_files", "fio")
            for who in order:
                if who == "fio":
                    f_s.append(fio(args, "small", "read", flat, total, 65536, 64, args.engine))
                elif who == "fio_files":
                    g_s.append(
                        fio(args, "files", "read", small, total, 65536, 64, args.engine, nrfiles=args.small_files)
                    )
                else:
                    d_s.append(
                        deepio(
                            args,
                            "--mode",
                            "files",
                            "--op",
                            "read",
                            "--path",
                            small,
                            "--size",
                            "65536",
                            "--files",
                            str(args.small_files),
                            "--backend",
                            backend,
                            "--qd",
                            "64",
                            "--block",
                            str(1 << 20),
                        )
                    )
        results["small_read"] = {"fio": f_s, "deepio": [d[-1] for d in d_s]}
        results["small_read_same_files"] = {"fio": g_s, "deepio": [d[-1] for d in d_s]}
        results["small_read (first pass)"] = {"fio": f_s, "deepio": [d[0] for d in d_s]}
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"engine={args.engine} block={args.block} qd={args.qd} pairs={args.pairs} warmup={args.warmup} "
        f"size={args.size} "
        f"direct=1 (deepio backend {backend}, overlap_events=True, intra_op_parallelism=1)"
    )
    print(
        "small_read: fio reads one file of the same total size; small_read_same_files: fio reads "
        "the same separate files (nrfiles, openfiles=64)"
    )
    print(
        f"{'case':<31} {'fio GiB/s':>10} {'deepio GiB/s':>13} {'ratio':>7} "
        f"{'fio CPU s/GiB':>14} {'deepio CPU s/GiB':>17}"
    )
    for case, r in results.items():
        fg, fc = summarize(r["fio"])
        dg, dc = summarize(r["deepio"])
        print(f"{case:<31} {fg:>10.3f} {dg:>13.3f} {dg / fg:>7.3f} {fc:>14.3f} {dc:>17.3f}")
    bad = [s for r in results.values() for s in r["deepio"] if s.get("bytes_direct", 0) == 0]
    if bad:
        print("warning: some deepio runs moved no bytes with direct I/O", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
