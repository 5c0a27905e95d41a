#!/usr/bin/env python3
"""Small random reads through a file object (deepio.File, opened once) against the path calls
(aio_handle.async_pread(buffer, path, offset): open, statx and close per read), same handle,
same buffers, same offsets (issue 38, item 2: 4 KiB reads per second through Python >= 1.5x
the path calls).

Modes, each reading --count blocks of --size bytes at random aligned offsets of one
preallocated file into slices of one buffer:
  path       one aio_handle.async_pread(buf, path, off) per read, then one wait()
  fd         one aio_handle.async_pread(buf, fd=fd, off) per read (a descriptor the caller
             opened with O_DIRECT; the engine inspects it per read), then one wait()
  file       one deepio.File.pread(buf, off) per read (a Future each), then every result()
  path-sync  one aio_handle.sync_pread(buf, path, off) per read (one at a time)
  file-sync  one deepio.File.read_into(buf, off) per read (one at a time)
  file-ranges  one deepio.File.pread_ranges(buf, offsets, sizes) for all the reads, then its
             result() (the engine's and the kernel's cost per read, little of Python's)
Rounds are interleaved (the order rotated each round); medians of --rounds, with the range of
the per-round ratios against `path` (and `path-sync` for the sync rows). With the default
--direct-io off the reads come from the page cache (the file is written just before), so the
figures are the calls' own cost; --direct-io auto reads with O_DIRECT from the disk, --cold
drops the page cache before every round (root only). The
configuration (backend, O_DIRECT, block size, queue depth, device) is printed first, and the
bytes are verified after the timed rounds. --json prints the rows as JSON too.

Usage: python3 bench/file_object.py [--dir DIR] [--file-size 256M] [--size 4096]
                                    [--count 20000] [--rounds 7] [--modes path,fd,file,...]
                                    [--direct-io off|auto|on] [--cold] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

import numpy as np

import deepio
from benchutil import block_device, cpu_seconds, drop_caches

MODES = ("path", "fd", "file", "path-sync", "file-sync", "file-ranges")


def size_arg(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def run(mode: str, h, f, fd: int, path: str, pool, views, offsets) -> None:
    if mode == "path":
        for b, o in zip(views, offsets):
            h.async_pread(b, path, o)
        h.wait()
    elif mode == "fd":
        for b, o in zip(views, offsets):
            h.async_pread(b, file_offset=o, fd=fd)
        h.wait()
    elif mode == "file":
        futs = [f.pread(b, o) for b, o in zip(views, offsets)]
        for x in futs:
            x.result()
    elif mode == "path-sync":
        for b, o in zip(views, offsets):
            h.sync_pread(b, path, o)
    elif mode == "file-sync":
        for b, o in zip(views, offsets):
            f.read_into(b, o)
    elif mode == "file-ranges":
        f.pread_ranges(pool, offsets, [len(views[0])] * len(offsets)).result()
    else:
        raise ValueError(mode)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="folder for the test file (default: a temporary one)")
    ap.add_argument("--file-size", type=size_arg, default=256 << 20)
    ap.add_argument("--size", type=size_arg, default=4096, help="bytes per read")
    ap.add_argument("--count", type=int, default=20000, help="reads per round and mode")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--queue-depth", type=int, default=128)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--direct-io",
        default="off",
        choices=("auto", "on", "off"),
        help="the handle's and File's direct_io; off (default): reads from the page cache, "
        "so the figures are the per-read cost of the calls, not the disk's",
    )
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every round (root)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r} (expected {', '.join(MODES)})")

    folder = tempfile.mkdtemp(prefix="deepio-fileobj-", dir=a.dir)
    path = os.path.join(folder, "data.bin")
    data = np.random.default_rng(1).integers(0, 256, a.file_size, dtype=np.uint8)
    with open(path, "wb") as out:  # preallocated: every block written
        out.write(data.tobytes())
    h = deepio.aio_handle(block_size=1 << 20, queue_depth=a.queue_depth, direct_io=a.direct_io)
    pool = h.new_cpu_locked_tensor(a.count * a.size, np.empty(0, np.uint8))
    views = [pool[i * a.size : (i + 1) * a.size] for i in range(a.count)]
    rng = random.Random(2)
    offsets = [rng.randrange(a.file_size // a.size) * a.size for _ in range(a.count)]
    f = deepio.File(path, "r", handle=h, direct_io=a.direct_io)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if f.direct else 0))
    print(
        f"deepio {deepio.__version__}; backend {h.backend}; direct_io {a.direct_io}: O_DIRECT {f.direct}; "
        f"block_size 1 MiB; "
        f"queue_depth {a.queue_depth}; intra_op_parallelism 1; device {block_device(path)}; "
        f"file {a.file_size >> 20} MiB; {a.count} reads of {a.size} B per round; rounds {a.rounds}; "
        f"page cache {'dropped before each round' if a.cold else 'warm (reads may come from it)'}"
    )
    run("path", h, f, fd, path, pool, views, offsets)  # warm-up: the file into the cache, pools made
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(a.rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for m in order:
            if a.cold and not drop_caches():
                raise SystemExit("--cold needs root (drop_caches)")
            c0, t0 = cpu_seconds(), time.perf_counter()
            run(m, h, f, fd, path, pool, views, offsets)
            times[m].append(time.perf_counter() - t0)
            cpus[m].append(cpu_seconds() - c0)
    # Verified outside the timed rounds: the last round's bytes of every read.
    pool[:] = 0
    run(modes[0], h, f, fd, path, pool, views, offsets)
    for v, o in zip(views, offsets):
        if not np.array_equal(v, data[o : o + a.size]):
            raise SystemExit(f"verification failed at offset {o}")
    f.close()
    os.close(fd)

    st = h.stats()
    # Older packages have no such counters: "n/a".
    print(
        f"io_uring registered files: {st.get('fixed_file_requests', 'n/a')} requests through a File's slot, "
        f"{st.get('fixed_file_fallbacks', 'n/a')} on the plain descriptor (table full)"
    )
    rows = []
    print(f"{'mode':<11} {'reads/s':>10} {'us/read':>8} {'CPU us/read':>12}  ratio (range)")
    for m in modes:
        med = statistics.median(times[m])
        base = "path-sync" if m.endswith("-sync") and "path-sync" in times else "path"
        ratios = [b / t for b, t in zip(times.get(base, times[m]), times[m])]
        row = {
            "mode": m,
            "reads_per_s": a.count / med,
            "us_per_read": med / a.count * 1e6,
            "cpu_us_per_read": statistics.median(cpus[m]) / a.count * 1e6,
            "vs": base,
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        rows.append(row)
        print(
            f"{m:<11} {row['reads_per_s']:>10.0f} {row['us_per_read']:>8.2f} {row['cpu_us_per_read']:>12.2f}  "
            f"{row['ratio']:.2f}x vs {base} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
        )
    if a.json:
        print(json.dumps(rows))
    os.unlink(path)
    os.rmdir(folder)


if __name__ == "__main__":
    main()
