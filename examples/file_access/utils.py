"""Shared helpers of the file-access examples: DeepNVMe's command lines, timing, page cache,
and clean skips when a GPU or GPUDirect Storage is not there."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

GIGA_UNIT = 1024**3
MEGA_UNIT = 1024**2

# DeepNVMe's hard-coded configuration in these examples (block 1 MiB, queue depth 128,
# single_submit, overlap_events, one thread): aio_handle(1024**2, 128, True, True, 1).
AIO_CONFIG = dict(block_size=1024**2, queue_depth=128, single_submit=True, overlap_events=True, intra_op_parallelism=1)


def parse_read_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--input_file", default=None, type=str, required=True, help="File on NVMe device that will read as input."
    )
    parser.add_argument("--loop", type=int, default=3, help="The number of times to repeat the operation (default 3).")
    parser.add_argument(
        "--validate",
        action="store_true",
        help="Run validation step that compares tensor value against Python file read",
    )
    args = parser.parse_args()
    if not os.path.isfile(args.input_file):
        parser.error(f"--input_file {args.input_file}: no such file")
    if args.loop < 1:
        parser.error("--loop must be at least 1")
    return args


def parse_write_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvme_folder", default=None, type=str, required=True, help="NVMe folder for file write.")
    parser.add_argument("--mb_size", type=int, default=1024, help="Size of tensor to save in MB (default 1024).")
    parser.add_argument("--loop", type=int, default=3, help="The number of times to repeat the operation (default 3).")
    parser.add_argument(
        "--validate",
        action="store_true",
        help="Run validation step that compares tensor value against Python file read",
    )
    args = parser.parse_args()
    if not os.path.isdir(args.nvme_folder):
        parser.error(f"--nvme_folder {args.nvme_folder}: no such folder")
    if not os.access(args.nvme_folder, os.W_OK):
        parser.error(f"--nvme_folder {args.nvme_folder}: not writable")
    if args.mb_size < 1:
        parser.error("--mb_size must be at least 1")
    if args.loop < 1:
        parser.error("--loop must be at least 1")
    return args


def drop_page_cache(path: str) -> None:
    """fsync + posix_fadvise(DONTNEED): the next read of `path` comes from the device, so a
    buffered Python read is not timed against the page cache (DeepNVMe's examples do not do
    this, which flatters plain Python on repeated loops)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed_loop(op: Callable[[], object], loop: int, before: Callable[[], None] | None = None) -> float:
    """Runs op `loop` times; `before` (not timed) runs ahead of each. Returns total seconds."""
    total = 0.0
    for _ in range(loop):
        if before is not None:
            before()
        t0 = time.perf_counter()
        op()
        total += time.perf_counter() - t0
    return total


def report(name: str, nbytes: int, loop: int, seconds: float) -> None:
    gbs = (loop * nbytes) / GIGA_UNIT / seconds if seconds > 0 else 0.0
    print(f"{name}: {nbytes / GIGA_UNIT} GB, {seconds / loop} secs, {gbs:5.2f} GB/sec")


def validation_result(ok: bool) -> None:
    print(f"Validation success = {ok}")
    if not ok:
        sys.exit(1)


def skip(script: str, reason: str) -> None:
    """Ends the script cleanly (exit status 0) with a one-line reason."""
    print(f"{os.path.basename(script)}: skipped: {reason}")
    sys.exit(0)


def quick_gpu_check(script: str) -> None:
    """Skips at once, before PyTorch is imported (seconds), where no CUDA driver is loadable."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        skip(script, f"no CUDA GPU available ({e})")


def require_gpu(script: str):
    """Returns torch once a CUDA GPU is usable; otherwise skips the script."""
    try:
        import torch
    except ImportError:
        skip(script, "PyTorch is not installed")
    if not torch.cuda.is_available():
        skip(script, "no CUDA GPU available (torch.cuda.is_available() is False)")
    return torch


def require_gds(script: str):
    """Returns deepio's gds_handle class once GPUDirect Storage can work here; otherwise skips."""
    torch = require_gpu(script)
    import deepio
    import deepio.compat

    gds = getattr(deepio, "gds_handle", None)
    if gds is None:
        skip(script, "this deepio build has no gds_handle (GPUDirect Storage support not built)")
    builder = deepio.compat.GDSBuilder()
    if not builder.is_compatible():
        skip(script, builder.reason)
    return torch, gds
