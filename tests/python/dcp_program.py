"""deepio.dcp across real processes, run by tests/python/test_dcp.py and test_dcp_ranks.py.

``dcp_program.py ranks FOLDER``: two ranks (``torch.multiprocessing.spawn``, gloo on the host)
save a state dict of DTensors sharded over both ranks, a tensor of each rank's own, a tensor
and an object every rank holds, with deepio.dcp's writer to FOLDER/deepio and with torch's to
FOLDER/torch; then each rank loads it back in the same layout, resharded (Shard(1), Replicate),
and crosswise (torch's reader over deepio's files, deepio's over torch's), and checks every
value. Exit status 0 when all ranks passed.

``dcp_program.py killed FOLDER [EXTRA...]``: one process saves a complete checkpoint to
FOLDER (with the extra folders EXTRA, if any), then saves over it (overwrite=True, one file per
item) a state dict whose last item kills the process with SIGKILL while it is pickled, after
the tensors before it were written. ``killed-first FOLDER``: the second save alone, into a
folder with no checkpoint.

``dcp_program.py save4 FOLDER``: four ranks save ``resharded_state`` (DTensors sharded
unevenly by rows and by columns, a ShardedTensor, an optimizer-like nested part, each rank's
own tensor) with deepio.dcp's writer to FOLDER/ck4.
``dcp_program.py load2 FOLDER``: two ranks load FOLDER/ck4 resharded (other placements, a
ShardedTensor of two shards, DTensors where a ShardedTensor was saved) with deepio.dcp's
reader and with torch's, and check every local piece byte for byte against the full tensors.

``dcp_program.py async FOLDER``: two ranks ``dcp.async_save`` through deepio.dcp's writer
with each of torch's checkpointer types (THREAD: on a thread of the rank; PROCESS: in a
background process of each rank, the writer pickled to it), load each back and check it;
then an ``overwrite=False`` save over the PROCESS one must fail with deepio's
FileExistsError, carried back from the background process.

``dcp_program.py enospc FOLDER CHECKPOINT``: two ranks save a small checkpoint to CHECKPOINT,
then over it one bigger than CHECKPOINT's file system (a small tmpfs the test mounted): every
rank must see ``dcp.save`` raise, naming ENOSPC. Each rank prints ``rank R raised: ...``.

``dcp_program.py drives FOLDER``: two ranks save a state dict of DTensors and each rank's own
tensors with deepio.dcp's writer to FOLDER/nvme0/ck with ``extra_paths`` FOLDER/nvme1/ck and
FOLDER/nvme2/ck (three folders standing in for three drives), load it back resharded with
deepio.dcp's reader given the main path alone, then (rank 0) move the extra folders to
FOLDER/moved1 and FOLDER/moved2 and load again with ``folder_map``.

``dcp_program.py one-save MAIN [EXTRA...]``: one process saves ``concurrent_state(2.0)`` to
MAIN with the extra folders EXTRA (test_dcp_concurrent.py runs it beside a save of its own).

``dcp_program.py clean-collectives FOLDER`` and ``clean-alone FOLDER`` (``use_collectives=False``):
two ranks save to FOLDER/ck three times, each rank with an extra folder of its own
(FOLDER/node{rank}, standing in for a node-local drive); the second save fails midway
(collectives: rank 1's last item refuses to be pickled; alone: every rank's), leaving files
behind; each rank then loads the third save back and checks it.

The multi-rank modes print ``ranks OK`` when every rank passed.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import Future
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


def _killed(folder: str, extra: list[str], first: bool = True) -> None:
    sd: dict[str, Any] = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(1000)}
    if first:
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(folder, extra_paths=extra))
    sd = {"a": torch.zeros(1 << 20), "b": torch.zeros(1000), "z": _Killer()}
    writer = deepio.dcp.FileSystemWriter(folder, single_file_per_rank=False, extra_paths=extra)
    dcp.save(sd, storage_writer=writer)
    raise SystemExit("not killed")


def _spawned(rank: int, folder: str) -> None:
    try:
        _rank(rank, folder)
    except BaseException:
        traceback.print_exc()
        raise
    print(f"rank {rank} OK", flush=True)


# ---------------------------------------------------------------- resharding: 4 ranks -> 2 -> 1

FULL_SHAPES = {"rows": (250, 48), "cols": (48, 250), "st": (250, 40), "exp_avg": (1001,)}


def full_tensor(name: str) -> torch.Tensor:
    """The full value of each resharded tensor (test_dcp_ranks.py loads them whole in one process)."""
    shape = FULL_SHAPES[name]
    n = 1
    for d in shape:
        n *= d
    t = torch.arange(n, dtype=torch.float64).reshape(shape) * 0.5 - 7
    return t.to(torch.bfloat16) if name == "cols" else t.float()


def _init(rank: int, world: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)


def _sharded_tensor(full: torch.Tensor, world: int, fill: bool):
    """A ShardedTensor of `full` split by rows over `world` ranks (torch's older sharded type,
    still what some DCP users hold); zeros when not `fill`."""
    import torch.distributed._shard.sharded_tensor as st
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    t = st.empty(spec, *full.shape, dtype=full.dtype)
    for shard in t.local_shards():
        rows = shard.metadata.shard_offsets[0]
        shard.tensor.copy_(full[rows : rows + shard.tensor.shape[0]] if fill else torch.zeros_like(shard.tensor))
    return t


def resharded_state(rank: int, world: int, fill: bool, saved_layout: bool, st_dtensor: bool = False) -> dict:
    """The state dict of the resharding test as `world` ranks hold it: saved by 4 ranks in one
    layout, loaded by 2 in another (`saved_layout` False; with `st_dtensor` the saved
    ShardedTensor is loaded as a DTensor), zeros when not `fill`. Making it is collective
    (distribute_tensor, ShardedTensor): every rank asks for the same layout."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))

    def dt(name: str, placement) -> torch.Tensor:
        full = full_tensor(name)
        return distribute_tensor(full if fill else torch.zeros_like(full), mesh, [placement])

    if saved_layout:  # 250 rows over 4 ranks: 63, 63, 63, 61
        model = {"rows": dt("rows", Shard(0)), "cols": dt("cols", Shard(1))}
        st = _sharded_tensor(full_tensor("st"), world, fill)
        exp_avg = dt("exp_avg", Shard(0))
    else:  # every piece crosses the saved chunks' boundaries
        model = {"rows": dt("rows", Shard(1)), "cols": dt("cols", Shard(0))}
        st = dt("st", Shard(1)) if st_dtensor else _sharded_tensor(full_tensor("st"), world, fill)
        exp_avg = dt("exp_avg", Replicate())
    return {
        "model": model,
        "st": st,
        "optim": {"state": {"rows": {"exp_avg": exp_avg, "step": torch.tensor(9.0 if fill else 0.0)}}},
        "epoch": 4 if fill else 0,
    }


def _local(value) -> list[torch.Tensor]:
    """The pieces a rank holds of a DTensor, a ShardedTensor or a tensor."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return [value.to_local()]
    if isinstance(value, ShardedTensor):
        return [s.tensor for s in value.local_shards()]
    return [value]


def _same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (
        got.dtype == want.dtype
        and got.shape == want.shape
        and torch.equal(got.contiguous().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))
    )


def check_resharded(got: dict, want: dict, what: str) -> None:
    pairs = [
        ("model.rows", got["model"]["rows"], want["model"]["rows"]),
        ("model.cols", got["model"]["cols"], want["model"]["cols"]),
        ("st", got["st"], want["st"]),
        ("exp_avg", got["optim"]["state"]["rows"]["exp_avg"], want["optim"]["state"]["rows"]["exp_avg"]),
        ("step", got["optim"]["state"]["rows"]["step"], want["optim"]["state"]["rows"]["step"]),
    ]
    for name, g, w in pairs:
        gl, wl = _local(g), _local(w)
        assert len(gl) == len(wl) and all(_same_bytes(a, b) for a, b in zip(gl, wl)), f"{what}: {name} differs"
    assert got["epoch"] == want["epoch"], f"{what}: epoch {got['epoch']}"


def _save4(rank: int, world: int, folder: str) -> None:
    sd = resharded_state(rank, world, fill=True, saved_layout=True)
    sd[f"own{rank}"] = torch.full((7,), rank, dtype=torch.int32)
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(f"{folder}/ck4"))


def _load2(rank: int, world: int, folder: str) -> None:
    cases = [
        (deepio.dcp.FileSystemReader(f"{folder}/ck4"), False),
        (deepio.dcp.FileSystemReader(f"{folder}/ck4"), True),
        (dcp.FileSystemReader(f"{folder}/ck4"), False),  # torch's reader over deepio's files
    ]
    for reader, st_dtensor in cases:
        out = resharded_state(rank, world, fill=False, saved_layout=False, st_dtensor=st_dtensor)
        out[f"own{rank + 2}"] = torch.zeros(7, dtype=torch.int32)  # a tensor of a rank that is gone
        dcp.load(out, storage_reader=reader)
        what = f"rank {rank} of {world}, {type(reader).__module__}, st as DTensor: {st_dtensor}"
        want = resharded_state(rank, world, fill=True, saved_layout=False, st_dtensor=st_dtensor)
        check_resharded(out, want, what)
        assert torch.equal(out[f"own{rank + 2}"], torch.full((7,), rank + 2, dtype=torch.int32)), what


# ------------------------------------------------------------- async_save, thread and process


def _async(rank: int, world: int, folder: str) -> None:
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(300 * 20, dtype=torch.float32).reshape(300, 20)

    def state(fill: bool) -> dict:
        return {
            "w": distribute_tensor(full if fill else torch.zeros_like(full), mesh, [Shard(0)]),
            f"own{rank}": torch.full((3,), rank if fill else -1),
            "step": 5 if fill else 0,
        }

    sd = state(True)
    for kind in (AsyncCheckpointerType.THREAD, AsyncCheckpointerType.PROCESS):
        checkpoint = f"{folder}/ck-{kind.value}"
        fut = dcp.async_save(sd, storage_writer=deepio.dcp.FileSystemWriter(checkpoint), async_checkpointer_type=kind)
        assert isinstance(fut, Future), type(fut)  # not an AsyncSaveResponse: no async_stager given
        fut.result(timeout=300)
        out = state(False)
        dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(checkpoint))
        assert torch.equal(out["w"].to_local(), sd["w"].to_local()), f"rank {rank}, {kind}: w"
        assert torch.equal(out[f"own{rank}"], sd[f"own{rank}"]) and out["step"] == 5, f"rank {rank}, {kind}"

    # The same background process serves the next save: deepio's writer refuses the checkpoint
    # there, and the error comes back through the future.
    fut = dcp.async_save(
        state(True),
        storage_writer=deepio.dcp.FileSystemWriter(checkpoint, overwrite=False),
        async_checkpointer_type=AsyncCheckpointerType.PROCESS,
    )
    assert isinstance(fut, Future), type(fut)
    try:
        fut.result(timeout=300)
    except CheckpointException as e:
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values()]
        assert any(isinstance(c, FileExistsError) and "overwrite=False" in str(c) for c in causes), repr(e)
    else:
        raise AssertionError(f"rank {rank}: async_save with overwrite=False over a checkpoint succeeded")
    assert sorted(os.listdir(checkpoint)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


# ------------------------------------------------------------------------ ENOSPC on a tmpfs


def _enospc(rank: int, world: int, folder: str, checkpoint: str) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    # A checkpoint that fits, then 3 MiB of tensors on each rank over it: more than the 2 MiB
    # file system, whichever rank writes first.
    dcp.save({f"small{rank}": torch.ones(1000)}, storage_writer=deepio.dcp.FileSystemWriter(checkpoint))
    sd = {f"r{rank}_{i}": torch.full((1 << 18,), float(i)) for i in range(3)}
    try:
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(checkpoint))
    except CheckpointException as e:
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values()]
        full = [c for c in causes if isinstance(c, OSError) and c.errno == errno.ENOSPC]
        assert full, f"rank {rank}: no ENOSPC among {causes!r}"
        print(f"rank {rank} raised: {type(e).__name__}: {len(full)} rank(s) ENOSPC: {full[0]}", flush=True)
    else:
        raise AssertionError(f"rank {rank}: dcp.save of 6 MiB on a 2 MiB file system succeeded")


# --------------------------------------------------------------- several drives: extra_paths


def drives_state(rank: int, world: int, fill: bool, placement: Any) -> dict:
    """The state dict of the drives test as `world` ranks hold it (collective: DTensors)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    sd: dict[str, Any] = {}
    for i in range(4):
        full = full_tensor("rows") + i
        sd[f"w{i}"] = distribute_tensor(full if fill else torch.zeros_like(full), mesh, [placement])
    sd[f"own{rank}"] = torch.full((3000,), rank if fill else -1, dtype=torch.int64)
    sd["step"] = 11 if fill else 0
    return sd


def _drives(rank: int, world: int, folder: str) -> None:
    from torch.distributed.tensor import Shard

    main, extra = f"{folder}/nvme0/ck", [f"{folder}/nvme1/ck", f"{folder}/nvme2/ck"]
    dcp.save(
        drives_state(rank, world, True, Shard(0)), storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra)
    )
    moved = [f"{folder}/moved1", f"{folder}/moved2"]
    for step, reader in (
        ("in place", lambda: deepio.dcp.FileSystemReader(main)),
        ("moved", lambda: deepio.dcp.FileSystemReader(main, folder_map=dict(zip(extra, moved)))),
    ):
        if step == "moved":
            dist.barrier()
            if rank == 0:
                for old, new in zip(extra, moved):
                    os.rename(old, new)
            dist.barrier()
        out = drives_state(rank, world, False, Shard(1))
        dcp.load(out, storage_reader=reader())
        want = drives_state(rank, world, True, Shard(1))
        for i in range(4):
            assert _same_bytes(out[f"w{i}"].to_local(), want[f"w{i}"].to_local()), f"rank {rank}, {step}: w{i}"
        assert torch.equal(out[f"own{rank}"], want[f"own{rank}"]) and out["step"] == 11, f"rank {rank}, {step}"


# ------------------------------------------------ concurrent saves, clean-up on each rank's host


def concurrent_state(value: float) -> dict[str, Any]:
    """Tensors over several files (one per item), a 1 MiB one among them, and an object."""
    return {
        "big": torch.full((1 << 18,), value),
        "w": {f"w{i}": torch.full((3000 + 100 * i,), value + i) for i in range(4)},
        "step": int(value),
    }


def _one_save(main: str, extra: list[str]) -> None:
    writer = deepio.dcp.FileSystemWriter(main, extra_paths=extra, single_file_per_rank=False)
    dcp.save(concurrent_state(2.0), storage_writer=writer)
    print("saved", flush=True)


class _Refused:
    def __reduce__(self):  # runs while DCP pickles the item, after the larger items' files
        raise RuntimeError("dcp_program: this item refuses to be saved")


def _cleaned(rank: int, world: int, folder: str, collectives: bool) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    main, extra = f"{folder}/ck", [f"{folder}/node{rank}"]

    def state(value: float) -> dict[str, Any]:
        return {f"r{rank}_{i}": torch.full((20000 + i,), value + rank) for i in range(3)}

    def save(sd: dict[str, Any]) -> None:
        writer = deepio.dcp.FileSystemWriter(main, extra_paths=extra, single_file_per_rank=False)
        dcp.save(sd, storage_writer=writer, use_collectives=collectives)

    save(state(1.0))
    bad = state(2.0)
    if rank == 1 or not collectives:  # without collectives a rank failing alone would hang the others' barrier
        bad["zz"] = _Refused()
    try:
        save(bad)
    except (Exception, CheckpointException):
        pass
    else:
        raise AssertionError(f"rank {rank}: the save that refuses an item succeeded")
    save(state(3.0))
    out = state(0.0)
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    for k, v in out.items():
        assert torch.equal(v, state(3.0)[k]), f"rank {rank}: {k}"


# ------------------------------------------------------------------------------------- driver


def _ranked(rank: int, world: int, folder: str, fn: Callable[..., None], args: tuple) -> None:
    try:
        _init(rank, world, folder)
        try:
            fn(rank, world, folder, *args)
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        raise
    sys.stdout.write(f"rank {rank} OK\n")  # one write: the ranks share the pipe
    sys.stdout.flush()


def _run_ranks(world: int, folder: str, fn: Callable[..., None], *args: Any) -> None:
    """`fn(rank, world, folder, *args)` in `world` processes over gloo. Forked, not spawned:
    the ranks inherit the imported torch (spawn re-imports it in each, about 4 s of CPU a
    rank on a 2-core VM). The parent has done nothing but import: no deepio engine, process
    group or work in flight is forked (importing torch starts one thread, idle, as when
    DataLoader forks its workers)."""
    store = os.path.join(folder, "store")
    if os.path.exists(store):
        os.unlink(store)
    mp.start_processes(_ranked, args=(world, folder, fn, args), nprocs=world, join=True, start_method="fork")
    print("ranks OK")


if __name__ == "__main__":
    mode, folder = sys.argv[1], sys.argv[2]
    # Every rank on this host: gloo over loopback, whatever the host name resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if mode == "ranks":
        mp.spawn(_spawned, args=(folder,), nprocs=WORLD, join=True)
        print("ranks OK")
    elif mode == "killed":
        _killed(folder, sys.argv[3:])
    elif mode == "killed-first":
        _killed(folder, [], first=False)
    elif mode == "save4":
        _run_ranks(4, folder, _save4)
    elif mode == "load2":
        _run_ranks(2, folder, _load2)
    elif mode == "async":
        _run_ranks(2, folder, _async)
    elif mode == "drives":
        _run_ranks(2, folder, _drives)
    elif mode == "one-save":
        _one_save(folder, sys.argv[3:])
    elif mode == "clean-collectives":
        _run_ranks(2, folder, _cleaned, True)
    elif mode == "clean-alone":
        _run_ranks(2, folder, _cleaned, False)
    elif mode == "enospc":
        _run_ranks(2, folder, _enospc, sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
