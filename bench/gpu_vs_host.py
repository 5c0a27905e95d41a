#!/usr/bin/env python3
"""Issue 5's GPU benchmark: a 1 GiB GPU tensor loaded and stored through deepio's staging
pipeline, against deepio's own host-memory read/write on the same disk (the 0.9x target), the
unpipelined whole-tensor bounce DeepNVMe uses, GdsHandle (GDS or its staged fallback), the
host-to-device copy ceiling and the disk ceiling — interleaved in one run (the order rotates
every round), medians.

    python3 bench/gpu_vs_host.py --bench build/default/bench/gpu_bench --dir /local/nvme/folder

Honest figures (issue 11):
  * every row that touches the file starts from a cold page cache: gpu_bench drops it before
    the clock starts (--cold auto: sync + /proc/sys/vm/drop_caches as root, else fdatasync +
    POSIX_FADV_DONTNEED on the file) and reports, from mincore(), how much of the file was still
    cached; write rows end with fsync() inside the clock;
  * the disk ceiling is measured in the same run, interleaved with the rest: gpu_bench
    --memory disk (--qd threads of O_DIRECT pread/pwrite, no deepio, one sample per round), and
    fio (io_uring, direct, one sample) when installed; the ceiling's samples are those of the
    higher of the two (by median);
  * a file row is judged by the one ceiling rule of `deepio bench` (benchutil.judge_against_ceiling,
    which mirrors tools/lib/ceiling.cpp): within the ceiling samples' own spread it reads "at
    ceiling"; one beyond every ceiling sample by more than max(their spread, 10%), or one that
    started with the file cached, is FLAGGED: its figure appears only in the flag note, never as
    a result;
  * host buffers (the h2d ceiling's source, the bounce buffer) are page-locked and registered
    with CUDA (cuMemHostRegister), so those copies are DMA, not pageable copies.

--staging 32M,64M adds a `device@32M` (and `device@64M`) row: the staged device row run with
DEEPIO_STAGING_BYTES set to that size (docs/settings.md), interleaved with the rest, so staging
sizes are compared in one run. --ops read limits the run to reads (or writes).

Needs a CUDA driver (DEEPIO_CUDA_LIBRARY may name the fake one from tests/gpu to check the
script itself; its figures mean nothing). Exits 1 when a row returned wrong bytes or a run
failed, 3 when some row was flagged (--allow-flagged: 0).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchutil import judge_against_ceiling

GIB = 1 << 30
MEMORIES = ["disk", "host", "device", "bounce", "gds", "h2d"]
FILE_ROWS = {"host", "device", "bounce", "gds"}  # deepio rows checked against the disk ceiling
COLD_WORDS = {
    "drop_caches": "sync + echo 3 > /proc/sys/vm/drop_caches before every file row (root)",
    "fadvise": "fdatasync + posix_fadvise(DONTNEED) on the file before every file row (not root)",
    "none": "NOT dropped (--cold none): read rows may come from the page cache",
}


def one(bench, *args, env=None):
    out = subprocess.run([bench, *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"gpu_vs_host: {bench} {' '.join(args)} failed (status {out.returncode}): {out.stderr.strip()}")
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def fio_ceiling(path, size, rw):
    if shutil.which("fio") is None:
        return None
    out = subprocess.run(
        [
            "fio",
            "--name=ceil",
            f"--filename={path}",
            f"--rw={rw}",
            "--bs=1M",
            "--iodepth=32",
            "--ioengine=io_uring",
            "--direct=1",
            f"--size={size}",
            "--end_fsync=1",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        print(f"gpu_vs_host: fio {rw} failed, ceiling from gpu_bench --memory disk only: {out.stderr.strip()[:200]}")
        return None
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    part = job["read" if rw == "read" else "write"]
    return part["io_bytes"] / GIB / (part["runtime"] / 1000.0) if part["runtime"] else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="path to the gpu_bench program")
    ap.add_argument("--dir", default=None, help="folder on the disk to use (default: a temp dir in /var/tmp)")
    ap.add_argument("--size", type=int, default=GIB)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--par", type=int, default=2)
    ap.add_argument(
        "--cold",
        default="auto",
        choices=["auto", "drop", "fadvise", "none"],
        help="how gpu_bench empties the page cache before each file row (default auto)",
    )
    ap.add_argument("--allow-flagged", action="store_true", help="exit 0 even when rows were flagged")
    ap.add_argument(
        "--staging", default="", help="comma-separated DEEPIO_STAGING_BYTES values, each an extra device@SIZE row"
    )
    ap.add_argument("--ops", default="read,write", help="read, write or read,write (default)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    ops = [o for o in args.ops.split(",") if o]
    if not ops or any(o not in ("read", "write") for o in ops):
        ap.error("--ops takes read, write or read,write")
    rows = MEMORIES + [f"device@{v}" for v in args.staging.split(",") if v]
    root = args.dir or tempfile.mkdtemp(prefix="deepio-gpu-bench-", dir="/var/tmp")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "tensor.bin")
    common = [
        "--path",
        path,
        "--size",
        str(args.size),
        "--block",
        str(args.block),
        "--qd",
        str(args.qd),
        "--par",
        str(args.par),
        "--cold",
        args.cold,
    ]
    samples = {}
    try:
        one(args.bench, "--prepare", *common)
        for op in ops:
            for r in range(args.rounds):
                k = r % len(rows)
                for mem in rows[k:] + rows[:k]:
                    memory, _, staging = mem.partition("@")
                    env = dict(os.environ, DEEPIO_STAGING_BYTES=staging) if staging else None
                    s = one(
                        args.bench, "--memory", memory, "--op", op, *common, *(["--verify"] if r == 0 else []), env=env
                    )
                    if s.get("verified") is False:
                        sys.exit(f"gpu_vs_host: {mem} {op} returned wrong bytes")
                    samples.setdefault((op, mem), []).append(s)
        fio = {op: fio_ceiling(path, args.size, op) for op in ops}
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    table = {}
    for (op, mem), ss in samples.items():
        gibs = statistics.median(s["bytes"] / GIB / s["seconds"] for s in ss)
        cpu = statistics.median(s["cpu_seconds"] / (s["bytes"] / GIB) for s in ss)
        table[(op, mem)] = (gibs, cpu, ss)
    # The ceiling's samples: the disk row's (one per round) or fio's one, whichever measured more.
    ceiling_samples = {}
    for op in ops:
        own = [s["bytes"] / GIB / s["seconds"] for s in table[(op, "disk")][2]]
        ceiling_samples[op] = [fio[op]] if fio[op] and fio[op] > table[(op, "disk")][0] else own
    ceiling = {op: statistics.median(v) for op, v in ceiling_samples.items()}

    colds = sorted({s["cold"] for ss in samples.values() for s in ss if s["cold"] != "n/a"})
    registered = all(s.get("host_registered") for ss in samples.values() for s in ss)
    print(
        f"size={args.size} block={args.block} qd={args.qd} intra_op_parallelism={args.par} rounds={args.rounds} "
        f"(interleaved, order rotating; medians)"
    )
    print(
        "page cache: "
        + "; ".join(COLD_WORDS.get(c, c) for c in colds)
        + "; residency checked with mincore() before each clock; writes end with fsync inside the clock"
    )
    print(
        "host buffers: page-locked and "
        + ("CUDA-registered (cuMemHostRegister)" if registered else "NOT CUDA-registered (pageable copies)")
    )
    for op in ops:
        ss = table[(op, "disk")][2]
        how = "O_DIRECT" if all(s.get("direct") for s in ss) else "buffered (O_DIRECT refused)"
        f = f"{fio[op]:.3f} GiB/s" if fio[op] else "not run (fio not installed)"
        print(
            f"disk ceiling ({op}): gpu_bench --memory disk {args.qd} threads x {args.block} B {how}: "
            f"{table[(op, 'disk')][0]:.3f} GiB/s; fio io_uring 1M x QD32 direct: {f}; "
            f"ceiling {ceiling[op]:.3f} GiB/s (median of " + ", ".join(f"{v:.3f}" for v in ceiling_samples[op]) + ")"
        )
    print(f"{'op':<6} {'memory':<20} {'GiB/s':>8} {'CPU s/GiB':>10} {'vs host':>8} {'vs bounce':>10} {'vs disk':>10}")
    flagged = []
    standings = {}
    for (op, mem), (gibs, cpu, ss) in table.items():
        mode = ss[0].get("gds_mode", "")
        if mem == "gds":
            staged = sum(s.get("bytes_staged", 0) for s in ss)
            mode = f"{mode}, {'staged' if staged else 'cuFile'}" if mode else mode
        label = mem + (f" ({mode})" if mode else "")
        why = []
        verdict = judge_against_ceiling(gibs, ceiling_samples[op]) if mem.partition("@")[0] in FILE_ROWS else None
        if verdict:
            standings[f"{op}/{mem}"] = verdict.standing
            if verdict.flagged:
                why.append(f"{gibs:.2f} GiB/s, {verdict.reason}")
        warm = max(s.get("resident", -1) for s in ss)
        if mem != "h2d" and warm > 0.01:
            why.append(f"{warm:.0%} of the file was in the page cache when the clock started")
        if why:
            flagged.append(f"{op} {label}: " + "; ".join(why) + " -- not a result")
            print(f"{op:<6} {label:<20} {'FLAGGED':>8} {cpu:>10.3f} {'-':>8} {'-':>10} {'-':>10}")
            continue
        host = table[(op, "host")][0]
        bounce = table[(op, "bounce")][0]
        if verdict and verdict.standing == "at_ceiling":
            vs_disk = f"{'at ceiling':>10}"
        elif mem != "h2d" and ceiling[op] > 0:
            vs_disk = f"{gibs / ceiling[op]:>10.3f}"
        else:
            vs_disk = f"{'-':>10}"
        print(f"{op:<6} {label:<20} {gibs:>8.3f} {cpu:>10.3f} {gibs / host:>8.3f} {gibs / bounce:>10.3f} {vs_disk}")
    for f in flagged:
        print("FLAGGED " + f)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "samples": {f"{op}/{mem}": ss for (op, mem), ss in samples.items()},
                    "ceiling": ceiling,
                    "ceiling_samples": ceiling_samples,
                    "vs_ceiling": standings,
                    "fio": fio,
                    "flagged": flagged,
                },
                fh,
                indent=1,
            )
    if flagged and not args.allow_flagged:
        sys.exit(3)


if __name__ == "__main__":
    main()
