#!/usr/bin/env python3
"""DeepSpeed's swapping over N folders (DEEPIO_NVME_PATHS) against one folder, interleaved.

With the switch on (deepio.deepspeed.install()), one process makes DeepSpeed's optimizer
swapper (`OptimizerSwapper`: the folder `<nvme_path>/zero_stage_3/optimizer/rank0`, made and,
over N folders, spread by the switch) twice: once over its nvme_path alone (the variable
unset: DeepSpeed's behaviour) and once with DEEPIO_NVME_PATHS naming every folder (nvme_path:
the first). Each case names its files with DeepSpeed's own code (`SwapTensorContext`, one file
per tensor, as its swappers do) and moves them with DeepSpeed's swap functions
(`swap_out_tensors` / `swap_in_tensors`, what the parameter and optimizer swappers call), all
tensors of a sample in one call, on one deepio aio_handle with DeepSpeed's default aio
parameters and buffers locked by it. A sample: swap-out to fresh files then wait(); swap-out
over them (every later step of a run) then wait(); page cache dropped; swap-in then wait();
data checked outside the timed region. The case order alternates per pair; medians, GiB/s,
CPU seconds per GiB (the process's user+system time: the engine's threads count), and the
ratio of N folders to one.

Separate drives on one machine: bench/throttled_drives.sh (root, loop devices):

    bench/throttled_drives.sh up 3 100 4
    python3 bench/deepspeed_swap_folders.py --folders /mnt/drive0,/mnt/drive1,/mnt/drive2 --pairs 5
    bench/throttled_drives.sh down
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

from benchutil import cpu_seconds, drop_file_cache

GIB = 1 << 30


def timed(fn):
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def device_of(path: str) -> str:
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


class Case:
    """One layout: DeepSpeed's optimizer swapper over ``folders`` (one: the variable unset)."""

    def __init__(self, name, folders, handle, buffers, data, deps):
        torch, OptimizerSwapper, SwapTensorContext, offload_config, aio_config = deps
        self.name, self.handle, self.buffers, self.data = name, handle, buffers, data
        # Each case in a folder of its own under every drive; nvme_path: the first drive's.
        self.twins = [os.path.join(f, f"swap-{name}") for f in folders]
        for f in self.twins:
            os.makedirs(f, exist_ok=True)
        nvme_path = self.twins[0]
        if len(folders) > 1:
            os.environ["DEEPIO_NVME_PATHS"] = ",".join(self.twins)
        else:
            os.environ.pop("DEEPIO_NVME_PATHS", None)
        config = offload_config(device="nvme", nvme_path=nvme_path, buffer_count=1)
        swapper = OptimizerSwapper(
            swap_config=config,
            aio_config=aio_config,
            base_folder=os.path.join(nvme_path, "zero_stage_3"),  # as ZeRO-3 makes it
            optimizer=None,
            largest_numel=1024,
            device="cpu",
            dtype=torch.float32,
            timers=None,
            aio_handle=handle,
        )
        os.environ.pop("DEEPIO_NVME_PATHS", None)
        self.folder = swapper.swap_folder
        tensors = []
        for i in range(len(buffers)):
            t = torch.empty(0)
            t.ds_id = f"{name}{i}"  # DeepSpeed's tensor id, which names the swap file
            tensors.append(t)
        self.paths = [SwapTensorContext(t, self.folder).swap_path for t in tensors]
        self.nbytes = sum(b.nbytes for b in buffers)

    def real_paths(self):
        """Where the files are (the switch's placement), found on disk."""
        out = []
        for twin in self.twins:
            for root, _, names in os.walk(twin):
                out += [os.path.join(root, n) for n in names if n.endswith(".swp")]
        return out

    def delete_files(self):
        for p in self.real_paths():
            os.unlink(p)

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
        for p in self.real_paths():
            drop_file_cache(p)

        def run():
            swap_in_tensors(self.handle, self.buffers, self.paths)
            assert self.handle.wait() == len(self.paths)

        t = timed(run)
        for b, d in zip(self.buffers, self.data):
            assert b.equal(d), f"{self.name}: swapped-in data differs"
        return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folders", required=True, help="comma-separated folders, one per drive (at least two)")
    ap.add_argument("--tensors", type=int, default=48)
    ap.add_argument("--total-mib", type=int, default=384)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=1 << 20)
    ap.add_argument("--queue-depth", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="also print the medians as one JSON line")
    args = ap.parse_args()
    folders = args.folders.split(",")
    if len(folders) < 2 or any(not f for f in folders):
        ap.error("--folders: at least two folders, none empty")

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # One rank on this machine, as DeepSpeed's launcher would set it (the swapper asks the rank).
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1")
    os.environ.setdefault("MASTER_PORT", "29655")
    os.environ.pop("DEEPIO_NVME_PATHS", None)

    import deepspeed
    import torch

    import deepio
    import deepio.deepspeed

    deepio.deepspeed.install()
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # one rank: no shm allreduce to build
    deepspeed.init_distributed(dist_backend="gloo")
    from deepspeed.ops.op_builder import AsyncIOBuilder
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper, SwapTensorContext
    from deepspeed.runtime.swap_tensor.utils import swap_in_tensors, swap_out_tensors
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    assert AsyncIOBuilder.__module__ == "deepio.compat", "the switch is not on"
    aio = get_aio_config({"aio": {"block_size": args.block_size, "queue_depth": args.queue_depth}})
    handle = (
        AsyncIOBuilder()
        .load()
        .aio_handle(
            aio["block_size"],
            aio["queue_depth"],
            aio["single_submit"],
            aio["overlap_events"],
            aio["intra_op_parallelism"],
        )
    )
    # Tensor sizes: like a model's, uneven, 1 KiB-aligned element counts (DeepSpeed aligns them).
    total = args.total_mib << 20
    weights = [1 + (i * 7919) % 13 for i in range(args.tensors)]
    sizes = [max(256, total * w // sum(weights) // 4 // 256 * 256) for w in weights]
    example = torch.zeros(1, dtype=torch.float32)
    buffers = [handle.new_cpu_locked_tensor(n, example) for n in sizes]
    g = torch.Generator().manual_seed(7)
    data = [torch.randn(n, generator=g) for n in sizes]
    deps = (torch, OptimizerSwapper, SwapTensorContext, DeepSpeedZeroOffloadOptimizerConfig, aio)
    cases = [
        Case("one", folders[:1], handle, buffers, data, deps),
        Case(f"n{len(folders)}", folders, handle, buffers, data, deps),
    ]
    nbytes = cases[0].nbytes
    print(
        f"deepio {deepio.__version__} ({handle.backend}), DeepSpeed {deepspeed.__version__}, "
        f"{args.tensors} tensors, {nbytes / 2**20:.0f} MiB, one swap call per sample, aio {aio}, "
        f"pairs {args.pairs}"
    )
    for f in folders:
        print(f"  folder {f} on device {device_of(f)}")

    rows = ("out fresh", "out overwrite", "in")
    results = {(c.name, k): [] for c in cases for k in rows}
    for i in range(args.pairs):
        for c in cases if i % 2 == 0 else cases[::-1]:
            c.delete_files()
            results[(c.name, "out fresh")].append(c.swap_out(swap_out_tensors))
            results[(c.name, "out overwrite")].append(c.swap_out(swap_out_tensors))
            results[(c.name, "in")].append(c.swap_in(swap_in_tensors))
    spread = cases[1].real_paths()
    used = {f for f in folders if any(p.startswith(os.path.join(f, "")) for p in spread)}
    print(f"  {len(folders)} folders: {len(spread)} files over {len(used)} folders")
    assert len(spread) == args.tensors and len(used) == min(len(folders), args.tensors), "files not spread"

    n = len(folders)
    print(
        f"{'case':18} {'1 folder GiB/s':>15} {f'{n} folders GiB/s':>16} {'ratio':>6} "
        f"{'1: CPU s/GiB':>13} {f'{n}: CPU s/GiB':>13}   ranges (GiB/s)"
    )
    summary = {}
    for k in rows:
        row = []
        for c in cases:
            gibs = [nbytes / GIB / t for t, _ in results[(c.name, k)]]
            cpu = [u / (nbytes / GIB) for _, u in results[(c.name, k)]]
            row.append((statistics.median(gibs), statistics.median(cpu), min(gibs), max(gibs)))
        (og, oc, olo, ohi), (ng, nc, nlo, nhi) = row
        summary[k] = {"one_gib_s": og, "n_gib_s": ng, "ratio": ng / og, "one_cpu_s_per_gib": oc, "n_cpu_s_per_gib": nc}
        print(
            f"swap-{k:13} {og:15.3f} {ng:16.3f} {ng / og:6.2f} {oc:13.3f} {nc:13.3f}   "
            f"1: {olo:.3f}-{ohi:.3f}, {n}: {nlo:.3f}-{nhi:.3f}"
        )
    if args.json:
        print(json.dumps({"folders": n, "tensors": args.tensors, "mib": nbytes >> 20, "rows": summary}))
    for c in cases:
        c.delete_files()
        for twin in c.twins:
            shutil.rmtree(twin, ignore_errors=True)
    sys.stdout.flush()
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
