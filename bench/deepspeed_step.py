#!/usr/bin/env python3
"""A ZeRO-3 training step with parameters and optimizer state on NVMe: deepio against
DeepSpeed's own async_io op, interleaved.

Each sample is a fresh process (DeepSpeed initializes once per process) on DeepSpeed's CPU
accelerator, one rank: an MLP of --layers square Linear layers of --width, bf16, torch's
Adam, ZeRO-3 with offload_param and offload_optimizer on NVMe (plain or --pipelined
optimizer swapper). The same program runs with DEEPIO_DEEPSPEED=1 (deepio) and without it
(DeepSpeed's op, JIT-built on first use); the order alternates per pair. Reported: the
median of the steps after the first (the first allocates and swaps out for the first time),
per library, medians over samples, and the process's CPU seconds per step.

    python3 bench/deepspeed_step.py --folder /var/tmp/ds-step --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def child(args) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(args.port),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_SIZE="1",
        CROSS_RANK="0",
        CROSS_SIZE="1",
    )
    import deepspeed
    import torch

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # one rank: no shm allreduce to build
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers)
    numel = args.width * args.width
    config = {
        "train_batch_size": 4,
        "bf16": {"enabled": True},
        "zero_force_ds_cpu_optimizer": False,
        "aio": {"block_size": 1 << 20, "queue_depth": 8, "single_submit": False, "overlap_events": True},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "offload_param": {"device": "nvme", "nvme_path": args.folder, "buffer_count": 5, "buffer_size": numel},
            "offload_optimizer": {
                "device": "nvme",
                "nvme_path": args.folder,
                "pipeline_read": args.pipelined,
                "pipeline_write": args.pipelined,
                "buffer_count": 4,
            },
        },
    }
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-4), config=config)
    from deepspeed.ops.op_builder import AsyncIOBuilder

    g = torch.Generator().manual_seed(1)
    times, cpus = [], []
    for _ in range(args.steps):
        x = torch.randn(4, args.width, generator=g).bfloat16()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    print(json.dumps({"op": AsyncIOBuilder.__module__, "times": times, "cpus": cpus}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/var/tmp/deepio-ds-step")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--pipelined", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29700, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results: dict[str, list[tuple[float, float]]] = {"deepspeed": [], "deepio": []}
    order = ["deepspeed", "deepio"]
    for i in range(args.pairs):
        for name in order if i % 2 == 0 else order[::-1]:
            shutil.rmtree(args.folder, ignore_errors=True)
            os.makedirs(args.folder)
            env = dict(os.environ, DEEPIO_DEEPSPEED="1" if name == "deepio" else "0")
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--folder",
                args.folder,
                "--steps",
                str(args.steps),
                "--layers",
                str(args.layers),
                "--width",
                str(args.width),
                "--port",
                str(29700 + i),
            ]
            if args.pipelined:
                cmd.append("--pipelined")
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
            if p.returncode != 0:
                sys.exit(f"{name} sample failed:\n{p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            assert r["op"].startswith("deepio" if name == "deepio" else "deepspeed"), r["op"]
            results[name].append((statistics.median(r["times"][1:]), statistics.median(r["cpus"][1:])))
    shutil.rmtree(args.folder, ignore_errors=True)
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"ZeRO-3, params + optimizer on NVMe ({'pipelined' if args.pipelined else 'plain'} swapper), "
        f"{params / 1e6:.1f}M bf16 params, {args.pairs} pairs, median of steps 2..{args.steps}"
    )
    print(f"{'library':10} {'step s (median)':>16} {'range':>14} {'CPU s/step':>11}")
    med = {}
    for name, rows in results.items():
        t = [a for a, _ in rows]
        med[name] = statistics.median(t)
        print(f"{name:10} {med[name]:16.3f} {min(t):6.3f}-{max(t):6.3f} {statistics.median(c for _, c in rows):11.3f}")
    print(f"deepio step time / DeepSpeed's: {med['deepio'] / med['deepspeed']:.2f}")


if __name__ == "__main__":
    main()
