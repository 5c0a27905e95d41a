"""DeepSpeed driven through its public API on its CPU accelerator, one rank: run by
test_deepspeed.py in a fresh interpreter per case, with DEEPIO_DEEPSPEED=1 (the switch under
test) in the environment. Not a test module itself.

    python deepspeed_program.py train OFFLOAD DTYPE FOLDER OUT   # ZeRO-3, a few steps
    python deepspeed_program.py checkpoint FOLDER OUT           # FastPersist save, torch.load

OFFLOAD: cpu | nvme | nvme-pipelined. DTYPE: bf16 (parameters and optimizer state on NVMe) or
fp32 (optimizer state on NVMe, parameters on CPU: DeepSpeed swaps NVMe parameters as 16-bit
on an accelerator without fp16, so an fp32 model's NVMe parameters are rounded; that is
DeepSpeed's rule, the same with its own op). OUT gets a torch.save'd dict: losses, full fp32
parameters, which module served AsyncIOBuilder, and the stats of the aio handles DeepSpeed
made (they prove the bytes went through deepio).
"""

from __future__ import annotations

import glob
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# What DeepSpeed's launcher sets for one rank on one machine.
os.environ.update(
    MASTER_ADDR="127.0.0.1",
    RANK="0",
    WORLD_SIZE="1",
    LOCAL_RANK="0",
    LOCAL_SIZE="1",
    CROSS_RANK="0",
    CROSS_SIZE="1",
)
os.environ.setdefault("MASTER_PORT", "29517")

import deepspeed  # noqa: E402
import torch  # noqa: E402

# One rank needs no shared-memory allreduce; without this the CPU accelerator compiles one.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

AIO = {"block_size": 131072, "queue_depth": 8, "single_submit": False, "overlap_events": True}


def model() -> torch.nn.Module:
    # Every weight is at least 1 MiB: DeepSpeed swaps nothing smaller.
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(96, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 8),
    )


def steps(engine, dtype: str, n: int = 4) -> list[float]:
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(n):
        x, y = torch.randn(4, 96, generator=g), torch.randn(4, 8, generator=g)
        if dtype == "bf16":
            x, y = x.bfloat16(), y.bfloat16()
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def handle_stats(*handles) -> list[dict]:
    return [h.stats() if hasattr(h, "stats") else {"type": type(h).__module__} for h in handles if h is not None]


def train(offload: str, dtype: str, folder: str, out: str) -> None:
    zero: dict = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_live_parameters": 1,
        "stage3_max_reuse_distance": 0,
    }
    if offload == "cpu":
        zero["offload_param"] = {"device": "cpu"}
        zero["offload_optimizer"] = {"device": "cpu"}
    else:
        pipelined = offload == "nvme-pipelined"
        if dtype == "bf16":
            zero["offload_param"] = {"device": "nvme", "nvme_path": folder, "buffer_count": 4, "buffer_size": 1 << 20}
        else:
            zero["offload_param"] = {"device": "cpu"}
        zero["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": folder,
            "pipeline_read": pipelined,
            "pipeline_write": pipelined,
            "buffer_count": 4,
        }
    config = {
        "train_batch_size": 4,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,  # torch's Adam: nothing to compile
        "bf16": {"enabled": dtype == "bf16"},
        "aio": AIO,
    }
    net = model()
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-3), config=config)
    losses = steps(engine, dtype)
    from deepspeed.utils import safe_get_full_fp32_param

    params = {name: safe_get_full_fp32_param(p).clone() for name, p in engine.module.named_parameters()}
    swapper = getattr(engine.optimizer, "optimizer_swapper", None)
    param_swapper = getattr(next(engine.module.parameters()), "nvme_swapper", None)
    handles = [getattr(swapper, "aio_handle", None)]
    if param_swapper is not None:
        handles += [param_swapper.aio_read_handle, param_swapper.aio_write_handle]
    result = {"losses": losses, "params": params, "builder": builder_module(), "handles": handle_stats(*handles)}
    torch.save(result, out)


def checkpoint(folder: str, out: str) -> None:
    """DeepSpeed's FastPersist writer ("checkpoint": {"writer": {"type": "fast"}}) saves a
    ZeRO-1 checkpoint; torch.load reads the model states back."""
    config = {
        "train_batch_size": 4,
        "zero_optimization": {"stage": 1},
        "zero_force_ds_cpu_optimizer": False,
        "aio": AIO,
        "checkpoint": {
            "writer": {"type": "fast", "io_buffer_size": 1 << 20, "io_buffer_double": True, "data_parallel": "replica"}
        },
    }
    net = model()
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-3), config=config)
    steps(engine, "fp32", n=2)
    engine.save_checkpoint(folder, tag="step2")
    writer = engine.checkpoint_engine._writer
    # The data-parallel writer names its part "<file>-<rank>.<writers>": one writer, one part.
    (states,) = glob.glob(os.path.join(folder, "step2", "mp_rank_00_model_states.pt*"))
    saved = torch.load(states, map_location="cpu", weights_only=False)
    import deepio

    torch.save(
        {
            "saved": saved["module"],
            "live": {k: v.detach().clone() for k, v in engine.module.state_dict().items()},
            "builder": builder_module(),
            "handles": handle_stats(writer._dnvme_handle),
            "buffer_pinned_for_deepio": deepio.aio_handle().is_pinned(writer._io_buffer),
        },
        out,
    )


def builder_module() -> str:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return AsyncIOBuilder.__module__


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(*sys.argv[2:6])
    elif sys.argv[1] == "checkpoint":
        checkpoint(*sys.argv[2:4])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
