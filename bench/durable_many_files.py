#!/usr/bin/env python3
"""Durable writes of many fresh files: where the time goes, and what one flush costs.

Issue 15's many-tensor write bar (2048 x 256 KiB, one fresh file each, >= 1.7x DeepNVMe with
the writes made durable) depends on what the device does when asked to make data durable.
This program splits that time, same handle and page-locked buffers, every sample in a new
folder (nothing is deleted until the end, so ext4's recently-deleted inode scan stays out):

  no sync       async_pwrite_batch(...), no sync (what reaches the device's cache)
  fsync=True    async_pwrite_batch(..., fsync=True): every file durable on its own (deepio)
  fsync loop    the batch, then an os.fdatasync of every file in creation order (what
                DeepNVMe's users write)
  one syncfs    the batch, then one syncfs(2) of the file system: every file's metadata
                and ONE device flush, the least any per-file durability can cost here

Modes rotated per pair; medians of --pairs; per sample the disk's write requests, MiB
written and flush requests (/sys/block/<dev>/stat). Then the flush probe: --probe-mib MiB
overwritten in place with O_DIRECT (no metadata changes), then one fdatasync (one flush of
that much cached data), and a second fdatasync with nothing left to flush.

Usage: python3 bench/durable_many_files.py [--dir /var/tmp] [--count 2048] [--size 262144]
                                           [--pairs 5] [--probe-mib 512]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import deepio
from benchutil import block_device, cpu_seconds, disk_stat, fsync_path, stat_delta, write_cache

_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), folder)
    finally:
        os.close(fd)


def flush_probe(folder: str, mib: int, dev: str | None) -> None:
    """One fdatasync after ``mib`` MiB of in-place direct writes, and one with nothing to flush."""
    path = os.path.join(folder, "flush-probe")
    buf = mmap.mmap(-1, 1 << 20)
    buf.write(b"\x5a" * (1 << 20))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        for off in range(0, mib << 20, 1 << 20):  # allocate the blocks once: later rounds overwrite
            os.pwritev(fd, [buf], off)
        os.fsync(fd)
        for rnd in range(3):
            t0 = time.perf_counter()
            for off in range(0, mib << 20, 1 << 20):
                os.pwritev(fd, [buf], off)
            s1, t1 = disk_stat(dev), time.perf_counter()
            os.fdatasync(fd)
            s2, t2 = disk_stat(dev), time.perf_counter()
            os.fdatasync(fd)
            t3 = time.perf_counter()
            print(
                f"flush probe {rnd + 1}: {mib} MiB written in {(t1 - t0) * 1e3:.0f} ms "
                f"({mib / 1024 / (t1 - t0):.2f} GiB/s); fdatasync {(t2 - t1) * 1e3:.0f} ms "
                f"({stat_delta(s1, s2, 'flushes')} flush, {stat_delta(s1, s2, 'write_ios')} write requests); "
                f"again with nothing written {(t3 - t2) * 1e3:.2f} ms"
            )
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--count", type=int, default=2048)
    ap.add_argument("--size", type=int, default=256 << 10)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--probe-mib", type=int, default=512, help="MiB written before the flush probe (0: no probe)")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="deepio-durable-many-", dir=a.dir)
    dev = block_device(root)
    h = deepio.aio_handle(block_size=1 << 20, queue_depth=32, intra_op_parallelism=2)
    bufs = [h.new_cpu_locked_tensor(a.size, np.empty(0, np.uint8)) for _ in range(a.count)]
    for i, b in enumerate(bufs):
        b[:] = i & 0xFF
    modes = ["no sync", "fsync=True", "fsync loop", "one syncfs"]
    rows: dict[str, list[tuple[float, float, int | None, float | None, int | None]]] = {m: [] for m in modes}
    print(
        f"deepio {deepio.__version__}; {a.count} fresh files x {a.size >> 10} KiB in {root} (device {dev}, "
        f"write cache: {write_cache(dev)}); {a.pairs} pairs; load average {os.getloadavg()[0]:.1f}"
    )
    try:
        n = 0
        for pair in range(a.pairs):
            for mode in modes[pair % len(modes) :] + modes[: pair % len(modes)]:
                n += 1
                folder = os.path.join(root, f"s{n}")
                os.mkdir(folder)
                _syncfs(folder)  # nothing of earlier samples left for this one to flush
                paths = [os.path.join(folder, str(i)) for i in range(a.count)]
                s0, c0, t0 = disk_stat(dev), cpu_seconds(), time.perf_counter()
                h.async_pwrite_batch(bufs, paths, fsync=mode == "fsync=True")
                h.wait()
                if mode == "fsync loop":
                    for p in paths:
                        fsync_path(p, data_only=True)
                elif mode == "one syncfs":
                    _syncfs(folder)
                t, c, s1 = time.perf_counter() - t0, cpu_seconds() - c0, disk_stat(dev)
                sect = stat_delta(s0, s1, "write_sectors")
                rows[mode].append(
                    (
                        t,
                        c,
                        stat_delta(s0, s1, "write_ios"),
                        None if sect is None else sect * 512 / (1 << 20),
                        stat_delta(s0, s1, "flushes"),
                    )
                )
        gib = a.count * a.size / (1 << 30)
        print(
            f"{'mode':11} {'ms':>7} {'us/file':>8} {'files/s':>8} {'CPU s/GiB':>9} {'writes':>7} {'MiB':>6} "
            f"{'flushes':>7}   time / fsync loop (pairs)"
        )
        base = rows["fsync loop"]
        for mode in modes:
            v = rows[mode]
            t = statistics.median(x[0] for x in v)
            c = statistics.median(x[1] for x in v)
            ratios = [b[0] / x[0] for x, b in zip(v, base)]

            def med(i: int, v: list = v) -> str:  # type: ignore[type-arg]
                xs = [x[i] for x in v if x[i] is not None]
                return f"{statistics.median(xs):.0f}" if xs else "-"

            print(
                f"{mode:11} {t * 1e3:7.0f} {t / a.count * 1e6:8.1f} {a.count / t:8.0f} {c / gib:9.2f} "
                f"{med(2):>7} {med(3):>6} {med(4):>7}   {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )
        if a.probe_mib:
            flush_probe(root, a.probe_mib, dev)
        print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        h.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
