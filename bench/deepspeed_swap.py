#!/usr/bin/env python3
"""DeepSpeed's tensor swapping on deepio against DeepSpeed's own async_io op, interleaved.

Drives DeepSpeed's swap functions (`deepspeed.runtime.swap_tensor.utils.swap_out_tensors` /
`swap_in_tensors`, what its parameter and optimizer swappers call) with the aio_handle of
each library, in one process: N tensors, one file each, buffers page-locked by the same
handle's `new_cpu_locked_tensor` (as DeepSpeed's SwapBufferManager makes them), the handle
parameters of DeepSpeed's default "aio" config. Each sample: swap-out of every tensor then
wait(); page cache dropped; swap-in of every tensor then wait(); data checked outside the
timed region. Swap-out runs to fresh files (first step of a run: the files do not exist) and
as an overwrite (every later step). Order alternates per pair; medians, GiB/s and CPU seconds
per GiB (the process's user+system time: both libraries' worker threads count).

DeepSpeed's op is JIT-built on first use (ninja, a C++ compiler, libaio-dev): a minute or two.

    python3 bench/deepspeed_swap.py --folder /var/tmp/swap --tensors 82 --total-mib 515 --pairs 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

from benchutil import cpu_seconds, drop_file_cache

GIB = 1 << 30


def drop_cache(paths):
    for p in paths:
        drop_file_cache(p)


def timed(fn):
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


class Case:
    """One library: its handle, its locked buffers, its files."""

    def __init__(self, name, op, folder, sizes, aio, torch):
        self.name = name
        self.handle = op.aio_handle(
            aio["block_size"],
            aio["queue_depth"],
            aio["single_submit"],
            aio["overlap_events"],
            aio["intra_op_parallelism"],
        )
        example = torch.zeros(1, dtype=torch.float32)
        self.buffers = [self.handle.new_cpu_locked_tensor(n, example) for n in sizes]
        g = torch.Generator().manual_seed(len(name))
        self.data = [torch.randn(n, generator=g) for n in sizes]
        self.folder = os.path.join(folder, name)
        self.paths = [os.path.join(self.folder, f"tensor{i}.swp") for i in range(len(sizes))]
        self.nbytes = sum(b.nbytes for b in self.buffers)

    def fresh(self):
        shutil.rmtree(self.folder, ignore_errors=True)
        os.makedirs(self.folder)

    def swap_out(self, swap_out_tensors):
        for b, d in zip(self.buffers, self.data):
            b.copy_(d)
        os.sync()

        def run():
            swap_out_tensors(self.handle, self.buffers, self.paths)
            assert self.handle.wait() == len(self.paths)

        return timed(run)

    def swap_in(self, swap_in_tensors):
        for b in self.buffers:
            b.zero_()
        drop_cache(self.paths)

        def run():
            swap_in_tensors(self.handle, self.buffers, self.paths)
            assert self.handle.wait() == len(self.paths)

        t = timed(run)
        for b, d in zip(self.buffers, self.data):
            assert b.equal(d), f"{self.name}: swapped-in data differs"
        return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/var/tmp/deepio-swap-bench")
    ap.add_argument("--tensors", type=int, default=82)
    ap.add_argument("--total-mib", type=int, default=515)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=1 << 20)
    ap.add_argument("--queue-depth", type=int, default=8)
    ap.add_argument("--intra-op-parallelism", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder
    from deepspeed.runtime.swap_tensor.utils import swap_in_tensors, swap_out_tensors

    import deepio
    from deepio import compat

    assert AsyncIOBuilder.__module__.startswith("deepspeed."), "run without DEEPIO_DEEPSPEED"
    aio = {
        "block_size": args.block_size,
        "queue_depth": args.queue_depth,
        "single_submit": False,
        "overlap_events": True,
        "intra_op_parallelism": args.intra_op_parallelism,
    }
    # Tensor sizes: like a model's, uneven, 1 KiB-aligned element counts (DeepSpeed aligns them).
    total = args.total_mib << 20
    weights = [1 + (i * 7919) % 13 for i in range(args.tensors)]
    sizes = [max(256, total * w // sum(weights) // 4 // 256 * 256) for w in weights]
    os.makedirs(args.folder, exist_ok=True)
    cases = [
        Case("deepspeed", AsyncIOBuilder().load(), args.folder, sizes, aio, torch),
        Case("deepio", compat.AsyncIOBuilder().load(), args.folder, sizes, aio, torch),
    ]
    print(
        f"deepio {deepio.__version__} ({cases[1].handle.backend}), {args.tensors} tensors, "
        f"{cases[0].nbytes / 2**20:.0f} MiB, aio {aio}, pairs {args.pairs}"
    )
    results = {(c.name, k): [] for c in cases for k in ("out fresh", "out overwrite", "in")}
    for i in range(args.pairs):
        for c in cases if i % 2 == 0 else cases[::-1]:
            c.fresh()
            results[(c.name, "out fresh")].append(c.swap_out(swap_out_tensors))
            results[(c.name, "out overwrite")].append(c.swap_out(swap_out_tensors))
            results[(c.name, "in")].append(c.swap_in(swap_in_tensors))
    print(
        f"{'case':16} {'DeepSpeed GiB/s':>16} {'deepio GiB/s':>13} {'ratio':>6} "
        f"{'DS CPU s/GiB':>13} {'deepio CPU s/GiB':>17}   ranges (GiB/s)"
    )
    for k in ("out fresh", "out overwrite", "in"):
        row = []
        for c in cases:
            gibs = [c.nbytes / GIB / t for t, _ in results[(c.name, k)]]
            cpu = [u / (c.nbytes / GIB) for _, u in results[(c.name, k)]]
            row.append((statistics.median(gibs), statistics.median(cpu), min(gibs), max(gibs)))
        (dg, dc, dlo, dhi), (ng, nc, nlo, nhi) = row
        print(
            f"swap-{k:11} {dg:16.3f} {ng:13.3f} {ng / dg:6.2f} {dc:13.3f} {nc:17.3f}   "
            f"DS {dlo:.2f}-{dhi:.2f}, deepio {nlo:.2f}-{nhi:.2f}"
        )
    for c in cases:
        shutil.rmtree(c.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
