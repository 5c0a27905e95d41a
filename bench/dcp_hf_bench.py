#!/usr/bin/env python3
"""DCP's HuggingFace safetensors storage: deepio's writer and reader against torch's.

    python3 bench/dcp_hf_bench.py [--gib 1] [--rounds 3] [--files 1] [--dir /var/tmp] [--json]

One process, no process group (what ``dcp.save`` does for a rank-0 HuggingFace export). A
state dict of about --gib GiB (float32 tensors of 4 to 64 MiB, split over --files files by
``fqn_to_index_mapping``) is saved with ``torch.distributed.checkpoint.HuggingFaceStorageWriter``
and ``deepio.dcp.HuggingFaceStorageWriter`` (both durable: torch fsyncs each file, deepio
writes a temporary name, fsyncs and renames), then loaded into zeroed tensors with torch's
``HuggingFaceStorageReader`` and deepio's from a dropped page cache (root; else marked warm).
Rounds alternate the order (torch first, then deepio first). Printed: medians of GiB/s and
CPU s/GiB (user + system of the process) per method, and deepio/torch; every load is checked
against the saved values.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--files", type=int, default=1)
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed.checkpoint as dcp

    import deepio.dcp

    g = torch.Generator().manual_seed(0)
    sizes = [4, 64, 16, 32, 8]  # MiB, cycled
    sd: dict[str, torch.Tensor] = {}
    total = 0
    while total < args.gib * (1 << 30):
        mib = sizes[len(sd) % len(sizes)]
        sd[f"layer{len(sd)}.weight"] = torch.randn(mib << 18, generator=g)
        total += mib << 20
    mapping = {k: 1 + i % args.files for i, k in enumerate(sd)} if args.files > 1 else None
    gib = total / (1 << 30)
    writers = {"torch": dcp.HuggingFaceStorageWriter, "deepio": deepio.dcp.HuggingFaceStorageWriter}
    readers = {"torch": dcp.HuggingFaceStorageReader, "deepio": deepio.dcp.HuggingFaceStorageReader}
    got: dict[str, list[tuple[float, float]]] = {f"{w} {k}": [] for w in ("save", "load") for k in writers}
    cold = True
    root = tempfile.mkdtemp(prefix="dcp-hf-", dir=args.dir)
    try:
        for r in range(args.rounds):
            order = ["torch", "deepio"] if r % 2 == 0 else ["deepio", "torch"]
            for who in order:
                folder = os.path.join(root, f"{who}-{r}")
                t0, c0 = time.perf_counter(), benchutil.cpu_seconds()
                dcp.save(sd, storage_writer=writers[who](folder, fqn_to_index_mapping=mapping))
                got[f"save {who}"].append((gib / (time.perf_counter() - t0), (benchutil.cpu_seconds() - c0) / gib))
            for who in order:
                folder = os.path.join(root, f"{who}-{r}")
                out = {k: torch.zeros_like(v) for k, v in sd.items()}
                cold = benchutil.drop_caches() and cold
                t0, c0 = time.perf_counter(), benchutil.cpu_seconds()
                dcp.load(out, storage_reader=readers[who](folder))
                got[f"load {who}"].append((gib / (time.perf_counter() - t0), (benchutil.cpu_seconds() - c0) / gib))
                assert all(torch.equal(out[k], sd[k]) for k in sd), f"{who} loaded other values"
            for who in order:
                shutil.rmtree(os.path.join(root, f"{who}-{r}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in got.items()}
    if args.json:
        print(json.dumps({"gib": gib, "cold": cold, "samples": got, "medians": med}))
        return
    print(
        f"# {gib:.2f} GiB, {len(sd)} tensors, {args.files} file(s), {args.rounds} rounds, dir {args.dir}; "
        f"loads {'cold (page cache dropped)' if cold else 'WARM (not root)'}; load average {os.getloadavg()[0]:.1f}"
    )
    for k, (bw, cpu) in med.items():
        spread = ", ".join(f"{x[0]:.2f}" for x in got[k])
        print(f"{k:14s} {bw:6.2f} GiB/s  {cpu:5.2f} CPU s/GiB   (GiB/s per round: {spread})")
    for what in ("save", "load"):
        print(
            f"{what}: deepio/torch {med[f'{what} deepio'][0] / med[f'{what} torch'][0]:.2f}x, "
            f"CPU {med[f'{what} deepio'][1] / med[f'{what} torch'][1]:.2f}x"
        )


if __name__ == "__main__":
    main()
