#!/usr/bin/env python3
"""Issue 5's GPU benchmark: a 1 GiB GPU tensor loaded and stored through deepio's staging
pipeline, against deepio's own host-memory read/write on the same disk (the 0.9x target), the
unpipelined whole-tensor bounce DeepNVMe uses, GdsHandle (GDS or its staged fallback), and the
host-to-device copy ceiling — interleaved in one run (the order rotates every round), medians.

    python3 bench/gpu_vs_host.py --bench build/default/bench/gpu_bench --dir /local/nvme/folder

Needs a CUDA driver (DEEPIO_CUDA_LIBRARY may name the fake one from tests/gpu to check the
script itself; its figures mean nothing). Also measures the disk ceiling with fio when present.
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
MEMORIES = ["host", "device", "bounce", "gds", "h2d"]


def one(bench, *args):
    out = subprocess.run([bench, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"gpu_vs_host: {bench} {' '.join(args)} failed: {out.stderr.strip()}")
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def fio_ceiling(path, size, rw):
    if shutil.which("fio") is None:
        return None
    out = subprocess.run(["fio", "--name=ceil", f"--filename={path}", f"--rw={rw}", "--bs=1M", "--iodepth=32",
                          "--ioengine=io_uring", "--direct=1", f"--size={size}", "--output-format=json"],
                         capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    part = job["read" if rw == "read" else "write"]
    return part["io_bytes"] / GIB / (part["runtime"] / 1000.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="path to the gpu_bench program")
    ap.add_argument("--dir", default=None, help="folder on the disk to use (default: a temp dir in /var/tmp)")
    ap.add_argument("--size", type=int, default=GIB)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--par", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="deepio-gpu-bench-", dir="/var/tmp")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "tensor.bin")
    common = ["--path", path, "--size", str(args.size), "--block", str(args.block), "--qd", str(args.qd),
              "--par", str(args.par)]
    samples = {}
    try:
        one(args.bench, "--prepare", *common)
        for op in ("read", "write"):
            for r in range(args.rounds):
                k = r % len(MEMORIES)
                for mem in MEMORIES[k:] + MEMORIES[:k]:
                    s = one(args.bench, "--memory", mem, "--op", op, *common, *(["--verify"] if r == 0 else []))
                    if s.get("verified") is False:
                        sys.exit(f"gpu_vs_host: {mem} {op} returned wrong bytes")
                    samples.setdefault((op, mem), []).append(s)
        ceilings = {op: fio_ceiling(path, args.size, op) for op in ("read", "write")}
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"size={args.size} block={args.block} qd={args.qd} intra_op_parallelism={args.par} rounds={args.rounds}")
    print(f"{'op':<6} {'memory':<8} {'GiB/s':>8} {'CPU s/GiB':>10} {'vs host':>8} {'vs bounce':>10}")
    table = {}
    for (op, mem), ss in samples.items():
        gibs = statistics.median(s["bytes"] / GIB / s["seconds"] for s in ss)
        cpu = statistics.median(s["cpu_seconds"] / (s["bytes"] / GIB) for s in ss)
        table[(op, mem)] = (gibs, cpu, ss[0].get("gds_mode", ""))
    for (op, mem), (gibs, cpu, mode) in table.items():
        host = table[(op, "host")][0]
        bounce = table[(op, "bounce")][0]
        note = f" ({mode})" if mode else ""
        print(f"{op:<6} {mem + note:<8} {gibs:>8.3f} {cpu:>10.3f} {gibs / host:>8.3f} {gibs / bounce:>10.3f}")
    for op, c in ceilings.items():
        print(f"disk ceiling ({op}, fio io_uring 1M x QD32 direct): " + (f"{c:.3f} GiB/s" if c else "fio not installed"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{op}/{mem}": ss for (op, mem), ss in samples.items()}, f, indent=1)


if __name__ == "__main__":
    main()
