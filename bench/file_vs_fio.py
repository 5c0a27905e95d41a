#!/usr/bin/env python3
"""Random reads from one preallocated file through a deepio.File against fio --rw=randread,
interleaved in one run (issue 38: "one drive, random reads of 4 KiB / 64 KiB / 256 KiB /
1 MiB from preallocated files through file objects, batched: >= 0.9 x fio --rw=randread at the
same block size and total queue depth, same run").

For each block size, --rounds pairs, the order alternating (fio first, then deepio first, ...):
  fio     fio --rw=randread --ioengine=io_uring --direct=1 --bs=BS --iodepth=QD on the file,
          --io_size=--bytes (random offsets over the whole file, no random map), plus
          --fio-opts (default --fixedbufs --registerfiles: registered buffers and file, as
          deepio's io_uring backend uses them; on this VM fio's unregistered 1 MiB reads spend
          ~0.5 ms each pinning pages at submission)
  deepio  one deepio.File(path, "r", direct_io="on") through one aio_handle(queue_depth=QD,
          intra_op_parallelism=1, block_size >= BS, direct_io="on", overlap_events=True: the
          queue refilled as completions come, as fio does); the same number of reads
          of BS at random BS-aligned offsets over the whole file, submitted as
          File.pread_ranges batches of --batch ranges (default: all in one), --inflight
          batches kept running, each into its own part of one locked buffer (batch x BS per
          batch in flight), touched by an untimed first pass (fio, too, runs once untimed).
Both read with O_DIRECT from the disk, and the page cache is dropped before every run where
allowed (root). Reported per block size: medians of GiB/s, IOPS and CPU seconds per GiB (fio:
its usr+sys; deepio: the process's, every thread), the median of the per-pair ratios
deepio/fio with their range, and the disk's average queue depth during each tool's runs (from
/sys/block/DEV/stat's time-in-queue: whether the queue depth asked for was reached). The
configuration is printed first; deepio's bytes are verified after the timed runs. --json
prints every sample too.

Usage: python3 bench/file_vs_fio.py [--dir DIR] [--file-size 4G] [--sizes 4K,64K,256K,1M]
                                    [--bytes 256M] [--bytes-4k 64M] [--queue-depth 32]
                                    [--rounds 3] [--batch 0] [--inflight 2]
                                    [--overlap-events 1] [--fio-opts ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np

import deepio
from benchutil import block_device, cpu_seconds, drop_caches

GIB = 1 << 30


def size_arg(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def queue_ticks(dev: str | None) -> int | None:
    """/sys/block/DEV/stat field 11: milliseconds spent by all requests in the queue (the
    integral of the queue depth over time); None where unreadable."""
    if dev is None:
        return None
    try:
        with open(f"/sys/block/{dev}/stat") as f:
            return int(f.read().split()[10])
    except (OSError, ValueError, IndexError):
        return None


def run_fio(path: str, file_size: int, bs: int, qd: int, total: int, extra: list[str]) -> dict:
    cmd = [
        "fio",
        "--name=randread",
        f"--filename={path}",
        "--rw=randread",
        f"--bs={bs}",
        f"--iodepth={qd}",
        "--ioengine=io_uring",
        "--direct=1",
        f"--size={file_size}",
        f"--io_size={total}",
        "--norandommap",
        "--randrepeat=0",
        "--numjobs=1",
        "--output-format=json",
        *extra,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    part = job["read"]
    secs = part["runtime"] / 1000.0
    return {
        "bytes": part["io_bytes"],
        "seconds": secs,
        "cpu_seconds": (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * secs,
    }


def run_deepio(f, buf, offsets: np.ndarray, bs: int, batch: int, inflight: int) -> dict:
    n = len(offsets)
    # Batch k reads into slot k % inflight of the buffer (batch x BS each): a batch's ranges
    # never overlap in the buffer (the engine refuses that for reads), batches in flight
    # never share a slot. Sliced before the clock starts.
    chunks = [offsets[i : i + batch] for i in range(0, n, batch)]
    slots = [buf[k * batch * bs : (k + 1) * batch * bs] for k in range(inflight)]
    c0, t0 = cpu_seconds(), time.perf_counter()
    running: list = []
    for k, offs in enumerate(chunks):
        if len(running) >= inflight:
            running.pop(0).result()
        running.append(f.pread_ranges(slots[k % inflight], offs, bs))
    for fut in running:
        fut.result()
    secs = time.perf_counter() - t0
    return {"bytes": n * bs, "seconds": secs, "cpu_seconds": cpu_seconds() - c0}


def verify(f, path: str, offsets: np.ndarray, bs: int) -> None:
    """A few of the random ranges read through the File again, compared with a plain read."""
    pick = offsets[: min(64, len(offsets))]
    out = np.empty(len(pick) * bs, np.uint8)
    f.pread_ranges(out, pick, bs).result()
    with open(path, "rb") as plain:
        for i, o in enumerate(pick):
            plain.seek(int(o))
            if plain.read(bs) != out[i * bs : (i + 1) * bs].tobytes():
                raise SystemExit(f"verification failed: {bs} B at offset {o}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temporary one)")
    ap.add_argument("--file-size", type=size_arg, default=4 << 30)
    ap.add_argument("--sizes", default="4K,64K,256K,1M")
    ap.add_argument("--bytes", type=size_arg, default=256 << 20, help="bytes read per run (64 KiB and up)")
    ap.add_argument("--bytes-4k", type=size_arg, default=64 << 20, help="bytes read per run of 4 KiB reads")
    ap.add_argument("--queue-depth", type=int, default=32, help="deepio's queue depth = fio's iodepth")
    ap.add_argument("--rounds", type=int, default=3, help="pairs per block size (medians of these)")
    ap.add_argument("--batch", type=int, default=0, help="ranges per pread_ranges (0: all in one)")
    ap.add_argument("--inflight", type=int, default=2, help="pread_ranges batches kept running")
    ap.add_argument(
        "--fio-opts",
        default="--fixedbufs --registerfiles",
        help="more fio options (default: registered buffers and files, as deepio's io_uring backend "
        "uses; '' for plain fio)",
    )
    ap.add_argument(
        "--overlap-events",
        type=int,
        default=1,
        choices=(0, 1),
        help="the handle's overlap_events (1, default: completions reaped as they come, the queue "
        "kept full as fio keeps it; 0: DeepNVMe's default, each batch reaped whole before the next)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the test file (reused by a later run with --dir)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (apt-get install -y fio)")
    sizes = [size_arg(s) for s in a.sizes.split(",") if s]
    fio_extra = a.fio_opts.split()

    folder = a.dir or tempfile.mkdtemp(prefix="deepio-file-fio-", dir="/var/tmp")
    path = os.path.join(folder, "file_vs_fio.bin")
    if not os.path.exists(path) or os.path.getsize(path) != a.file_size:
        chunk = np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
        with open(path, "wb") as out:  # preallocated: every block written
            for at in range(0, a.file_size, len(chunk)):
                out.write(chunk[: min(len(chunk), a.file_size - at)])
            os.fsync(out.fileno())
    dev = block_device(path)
    cold = drop_caches()
    h = deepio.aio_handle(
        block_size=max(1 << 20, max(sizes)),
        queue_depth=a.queue_depth,
        overlap_events=bool(a.overlap_events),
        intra_op_parallelism=1,
        direct_io="on",
    )
    f = deepio.File(path, "r", handle=h, direct_io="on")
    print(
        f"deepio {deepio.__version__}; backend {h.backend}; O_DIRECT {f.direct} (fio --direct=1); "
        f"fio {subprocess.run(['fio', '--version'], capture_output=True, text=True).stdout.strip()} "
        f"ioengine io_uring {a.fio_opts or '(no more options)'}; "
        f"queue depth {a.queue_depth} (deepio: one worker, overlap_events {bool(a.overlap_events)}; fio: iodepth); "
        f"device {dev}; "
        f"file {a.file_size >> 20} MiB; block sizes {a.sizes}; {a.bytes >> 20} MiB per run "
        f"({a.bytes_4k >> 20} MiB for 4 KiB); pread_ranges batch {a.batch or 'all'}, {a.inflight} in flight; "
        f"rounds {a.rounds}; page cache {'dropped before every run' if cold else 'NOT dropped (not root)'}"
    )
    rng = random.Random(2)
    samples: list[dict] = []
    rows = []
    for bs in sizes:
        total = a.bytes_4k if bs == 4096 else a.bytes
        n = total // bs
        batch = min(n, a.batch or n)
        inflight = 1 if batch == n else a.inflight
        buf = h.new_cpu_locked_tensor(inflight * batch * bs, np.empty(0, np.uint8))
        # Untimed: the buffer's pages touched by a first transfer (this VM's first DMA into new
        # memory is slow for any program), fio's file and start-up warmed the same way.
        warm = np.array([rng.randrange(a.file_size // bs) * bs for _ in range(n)], dtype=np.int64)
        run_deepio(f, buf, warm, bs, batch, inflight)
        run_fio(path, a.file_size, bs, a.queue_depth, min(total, 16 << 20), fio_extra)
        per = {"fio": [], "deepio": []}
        ratios = []
        for r in range(a.rounds):
            offsets = np.array([rng.randrange(a.file_size // bs) * bs for _ in range(n)], dtype=np.int64)
            order = ("fio", "deepio") if r % 2 == 0 else ("deepio", "fio")
            got = {}
            for tool in order:
                drop_caches()
                q0, w0 = queue_ticks(dev), time.perf_counter()
                if tool == "fio":
                    s = run_fio(path, a.file_size, bs, a.queue_depth, total, fio_extra)
                else:
                    s = run_deepio(f, buf, offsets, bs, batch, inflight)
                q1, w1 = queue_ticks(dev), time.perf_counter()
                s["avg_queue_depth"] = (q1 - q0) / ((w1 - w0) * 1000) if q0 is not None and q1 is not None else None
                s.update(tool=tool, bs=bs, round=r)
                samples.append(s)
                per[tool].append(s)
                got[tool] = s
            de, fi = got["deepio"], got["fio"]
            ratios.append((de["bytes"] / de["seconds"]) / (fi["bytes"] / fi["seconds"]))
        verify(f, path, offsets, bs)
        row = {"bs": bs, "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
        for tool, ss in per.items():
            row[tool] = {
                "gib_s": statistics.median(s["bytes"] / GIB / s["seconds"] for s in ss),
                "iops": statistics.median(s["bytes"] / bs / s["seconds"] for s in ss),
                "cpu_s_per_gib": statistics.median(s["cpu_seconds"] / (s["bytes"] / GIB) for s in ss),
                "avg_queue_depth": statistics.median(
                    s["avg_queue_depth"] for s in ss if s["avg_queue_depth"] is not None
                )
                if any(s["avg_queue_depth"] is not None for s in ss)
                else None,
            }
        rows.append(row)
        del buf
    f.close()
    print(
        f"{'bs':>6} | {'fio GiB/s':>9} {'IOPS':>8} {'CPU s/GiB':>9} {'disk QD':>7} | "
        f"{'deepio GiB/s':>12} {'IOPS':>8} {'CPU s/GiB':>9} {'disk QD':>7} | deepio/fio (range)"
    )
    for row in rows:
        fi, de = row["fio"], row["deepio"]

        def qd(x):
            return f"{x:7.1f}" if x is not None else f"{'-':>7}"

        print(
            f"{row['bs'] >> 10:>5}K | {fi['gib_s']:>9.3f} {fi['iops']:>8.0f} {fi['cpu_s_per_gib']:>9.3f} "
            f"{qd(fi['avg_queue_depth'])} | {de['gib_s']:>12.3f} {de['iops']:>8.0f} {de['cpu_s_per_gib']:>9.3f} "
            f"{qd(de['avg_queue_depth'])} | {row['ratio']:.2f}x ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
        )
    if a.json:
        print(json.dumps({"rows": rows, "samples": samples}))
    if not a.keep:
        os.unlink(path)
        if a.dir is None:
            os.rmdir(folder)


if __name__ == "__main__":
    main()
