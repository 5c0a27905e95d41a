"""Sharded training that checkpoints through deepio: torch.distributed.checkpoint (DCP) with
deepio.dcp's FileSystemWriter/FileSystemReader as its storage.

Two ranks on the host (gloo over loopback, ``torch.multiprocessing.spawn``; no GPU needed)
train a small MLP sharded with FSDP2 (``fully_shard``: every parameter and every AdamW state
tensor is a DTensor split over the ranks), save model and optimizer with ``dcp.save`` through
``deepio.dcp.FileSystemWriter``, and resume in a fresh model and optimizer with ``dcp.load``
through ``deepio.dcp.FileSystemReader``. Each rank then checks that what it resumed is what
it saved (every local shard, bit for bit, and the step count) and that the original and the
resumed run go on to the same losses.

    python3 examples/dcp_train.py --dir /tmp/dcp-example

leaves the checkpoint in ``DIR/checkpoint`` (DCP's format: ``__0_0.distcp``,
``__1_0.distcp``, ``.metadata``; torch's own FileSystemReader loads it as well) and prints
``dcp_train: OK`` when every rank passed; the exit status is non-zero otherwise.
See docs/checkpoints.md, "Distributed checkpoint (DCP)".
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import deepio.dcp


def make_model(seed: int, mesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small MLP sharded with FSDP2 over `mesh` (each linear layer its own unit), and AdamW."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, optim: torch.optim.Optimizer, steps: int, seed: int) -> list[float]:
    """`steps` steps on data drawn from `seed` (the same on every rank: data parallel over
    the same batch keeps the example short); returns the losses."""
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        loss = (model(x) - x[:, :8]).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


def local(value):
    """What a rank holds of a state dict value: a DTensor's local shard, cloned (the live
    parameters go on changing); other values as they are."""
    if isinstance(value, DTensor):
        return value.to_local().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: local(v) for k, v in value.items()}
    if isinstance(value, list):
        return [local(v) for v in value]
    return value


def assert_equal(got, want, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)), f"{where} differs"
    elif isinstance(want, dict):
        assert set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_equal(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_equal(a, b, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def run(rank: int, world: int, folder: str, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        checkpoint = os.path.join(folder, "checkpoint")

        # Train, then save model and optimizer: DCP plans which rank writes what, deepio writes.
        model, optim = make_model(seed=0, mesh=mesh)
        train(model, optim, steps, seed=1)
        model_sd, optim_sd = get_state_dict(model, optim)
        saved = local({"model": model_sd, "optim": optim_sd, "step": steps})
        dcp.save(
            {"model": model_sd, "optim": optim_sd, "step": steps},
            storage_writer=deepio.dcp.FileSystemWriter(checkpoint),  # sync_files=True: durable
        )

        # Resume: a fresh model (other initial weights) and optimizer (no state yet: get_state_dict
        # makes its state tensors so that DCP has somewhere to load them), loaded in place.
        model2, optim2 = make_model(seed=123, mesh=mesh)
        model2_sd, optim2_sd = get_state_dict(model2, optim2)
        state: dict[str, Any] = {"model": model2_sd, "optim": optim2_sd, "step": 0}
        dcp.load(state, storage_reader=deepio.dcp.FileSystemReader(checkpoint))
        set_state_dict(model2, optim2, model_state_dict=state["model"], optim_state_dict=state["optim"])

        resumed = local({"model": state["model"], "optim": state["optim"], "step": state["step"]})
        assert_equal(resumed, saved, f"rank {rank}: resumed state")
        again_sd, again_optim_sd = get_state_dict(model2, optim2)  # what the live model holds now
        live = local({"model": again_sd, "optim": again_optim_sd})
        assert_equal(live, {"model": saved["model"], "optim": saved["optim"]}, f"rank {rank}: live state")

        # Both runs go on alike: the resumed one is the saved one.
        cont, cont2 = train(model, optim, 2, seed=2), train(model2, optim2, 2, seed=2)
        assert cont == cont2, f"rank {rank}: losses after resuming {cont2} != {cont}"
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, folder: str, steps: int) -> None:
    try:
        run(rank, world, folder, steps)
    except BaseException:
        traceback.print_exc()
        raise
    sys.stdout.write(f"dcp_train: rank {rank} resumed {steps} steps\n")  # one write: ranks share stdout
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="folder for the checkpoint (made if missing)")
    parser.add_argument("--steps", type=int, default=3, help="training steps before the checkpoint")
    parser.add_argument("--ranks", type=int, default=2, help="processes (gloo on this host)")
    args = parser.parse_args(argv)
    folder = os.path.abspath(args.dir)
    os.makedirs(folder, exist_ok=True)
    store = os.path.join(folder, "store")  # gloo's rendezvous file: must not be left from a run before
    if os.path.exists(store):
        os.unlink(store)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both ranks on this host
    mp.spawn(_spawned, args=(args.ranks, folder, args.steps), nprocs=args.ranks, join=True)
    print("dcp_train: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
