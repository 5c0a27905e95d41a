#!/usr/bin/env python3
"""When each drive's files finish during one deepio.dcp load spread over several folders.

One process, no process group: saves a state dict with ``deepio.dcp.FileSystemWriter(main,
extra_paths=[...])``, empties the page cache (``drop_caches``: root), loads it with
``deepio.dcp.FileSystemReader(main)`` and prints the load's GiB/s and, per data file, its
folder and when its reading started and ended (seconds from the load's start) and on which
thread. Drives served at once end together; drives served one after another end in steps.
A diagnostic for the several-drives rows of docs/benchmarks.md, not a comparison.

    python3 bench/dcp_drive_timeline.py /mnt/drive0/tl /mnt/drive1/tl /mnt/drive2/tl [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

import deepio.dcp
from deepio.dcp import _reader


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="the main folder, then one folder per further drive")
    ap.add_argument("--mib", type=int, default=256, help="state dict size in MiB (default 256)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    main_dir, extra = args.folders[0], args.folders[1:]
    for d in args.folders:
        shutil.rmtree(d, ignore_errors=True)
    rows = max(1, args.mib // 32)
    sd = {f"w{i}": torch.randn(2048, 4096) for i in range(rows)}  # 32 MiB each
    sd.update({f"v{i}": torch.randn(4096) for i in range(50)})
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(main_dir, extra_paths=extra))
    real = _reader.FileSystemReader._read_file
    log: list[tuple[str, float, float, str]] = []
    t0 = 0.0

    def timed(self: Any, path: str, reqs: list[Any], planner: Any, *rest: Any) -> None:
        start = time.perf_counter() - t0
        real(self, path, reqs, planner, *rest)
        log.append((path, start, time.perf_counter() - t0, threading.current_thread().name))

    _reader.FileSystemReader._read_file = timed  # type: ignore[method-assign]
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    t0 = time.perf_counter()
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main_dir))
    took = time.perf_counter() - t0
    nbytes = sum(v.nbytes for v in sd.values())
    assert all(torch.equal(out[k], v) for k, v in sd.items())
    print(f"load {nbytes / 2**20:.0f} MiB in {took:.2f} s: {nbytes / took / 2**30:.3f} GiB/s")
    for path, start, end, thread in sorted(log, key=lambda r: r[2]):
        size = os.path.getsize(path) >> 20
        print(f"  {path} ({size} MiB): {start:.2f} -> {end:.2f} s on {thread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
