"""deepio.dcp across real processes, run by tests/python/test_dcp.py.

``dcp_program.py ranks FOLDER``: two ranks (``torch.multiprocessing.spawn``, gloo on the host)
save a state dict of DTensors sharded over both ranks, a tensor of each rank's own, a tensor
and an object every rank holds, with deepio.dcp's writer to FOLDER/deepio and with torch's to
FOLDER/torch; then each rank loads it back in the same layout, resharded (Shard(1), Replicate),
and crosswise (torch's reader over deepio's files, deepio's over torch's), and checks every
value. Exit status 0 when all ranks passed.

``dcp_program.py killed FOLDER``: one process saves a complete checkpoint to FOLDER, then
saves over it (overwrite=True, one file per item) a state dict whose last item kills the
process with SIGKILL while it is pickled, after the tensors before it were written.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import deepio.dcp

WORLD = 2


def _full(dtype: torch.dtype) -> torch.Tensor:
    # Shards above deepio.dcp's 8 KiB: their bytes go straight into the destinations where a
    # piece is one run of bytes (Shard(0), Replicate), through a whole-item read elsewhere.
    return torch.arange(256 * 48, dtype=torch.float32).reshape(256, 48).to(dtype) - 5


def _rank(rank: int, folder: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))

        def state(fill: bool, placement: list) -> dict:
            def dt(dtype: torch.dtype) -> torch.Tensor:
                src = _full(dtype) if fill else torch.zeros(256, 48, dtype=dtype)
                return distribute_tensor(src, mesh, placement)

            return {
                "model": {"w": dt(torch.float32), "b": dt(torch.bfloat16)},
                f"own{rank}": torch.full((5,), rank if fill else -1, dtype=torch.int64),
                "shared": torch.arange(4.0) if fill else torch.zeros(4),
                "step": 7 if fill else 0,
            }

        sd = state(True, [Shard(0)])
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(f"{folder}/deepio"))
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{folder}/torch"))

        cases: list[tuple[list[Any], Any]] = [
            ([Shard(0)], deepio.dcp.FileSystemReader(f"{folder}/deepio")),
            ([Shard(1)], deepio.dcp.FileSystemReader(f"{folder}/deepio")),
            ([Replicate()], deepio.dcp.FileSystemReader(f"{folder}/deepio")),
            ([Shard(1)], dcp.FileSystemReader(f"{folder}/deepio")),
            ([Shard(1)], deepio.dcp.FileSystemReader(f"{folder}/torch")),
        ]
        for placement, reader in cases:
            out = state(False, placement)
            dcp.load(out, storage_reader=reader)
            want = state(True, placement)
            what = f"rank {rank}, {placement}, {type(reader).__module__}"
            for key in ("w", "b"):
                got, exp = out["model"][key].to_local(), want["model"][key].to_local()
                assert got.dtype == exp.dtype and torch.equal(got, exp), f"{what}: model.{key} {got} != {exp}"
            assert torch.equal(out[f"own{rank}"], want[f"own{rank}"]), what
            assert torch.equal(out["shared"], want["shared"]), what
            assert out["step"] == 7, what
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _Killer:
    def __reduce__(self):  # runs while DCP pickles the item: the save dies mid-way
        os.kill(os.getpid(), signal.SIGKILL)


def _killed(folder: str) -> None:
    sd: dict[str, Any] = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(1000)}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(folder))
    sd = {"a": torch.zeros(1 << 20), "b": torch.zeros(1000), "z": _Killer()}
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(folder, single_file_per_rank=False))
    raise SystemExit("not killed")


def _spawned(rank: int, folder: str) -> None:
    try:
        _rank(rank, folder)
    except BaseException:
        traceback.print_exc()
        raise
    print(f"rank {rank} OK", flush=True)


if __name__ == "__main__":
    mode, folder = sys.argv[1], sys.argv[2]
    if mode == "ranks":
        # Both ranks on this host: gloo over loopback, whatever the host name resolves to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mp.spawn(_spawned, args=(folder,), nprocs=WORLD, join=True)
        print("ranks OK")
    elif mode == "killed":
        _killed(folder)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
