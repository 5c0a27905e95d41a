"""A load of your own safetensors files against the disk: deepio.safetensors.load_files beside
the disk ceiling measured in the same run (the same bytes read whole and sequentially by the
same engine into one buffer faulted in before the clock), interleaved, with the page cache
dropped before each run when run as root.

    python3 bench/load_safetensors.py PATH [--device D] [--repeat N] [--no-drop-caches]

PATH: a .safetensors file or a folder of shards. Prints the configuration first (engine,
direct I/O, block size, queue depth, request size, cache state), then each run and the medians.
bench/load_weights.py compares deepio with safetensors itself on a generated model, and also
uses ``ceiling`` and ``ceiling_memory`` from here.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from typing import Any

from benchutil import cpu_seconds, drop_caches

PAGE = 4096


def ceiling_memory(paths: list[str], populated: bool = True) -> Any:
    """The destination of ``ceiling``: one page-aligned buffer for all ``paths`` (each file
    at a page boundary), by default already faulted in (populated before any clock starts), so
    that the ceiling is the disk's and not the cost of fresh memory. None when the files are
    empty."""
    from deepio import _populate

    nbytes = sum(-(-os.path.getsize(p) // PAGE) * PAGE for p in paths)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if nbytes else None
    if not populated:
        return buf
    if buf is not None and _populate.populate(_populate.address(buf), len(buf)) != 0:
        view = memoryview(buf)  # no MADV_POPULATE_WRITE: touch every page instead
        view[::PAGE] = bytes(len(range(0, len(view), PAGE)))
        view.release()
    return buf


def ceiling(paths: list[str], buf: Any = None) -> None:
    """The disk ceiling: every file read whole, sequentially, by the same engine into one big
    page-aligned buffer (no parsing, no tensors). ``buf``: from ``ceiling_memory`` (the disk
    alone); None reads into fresh memory that the reads fault in (the disk and the memory)."""
    from deepio.safetensors import _io

    sizes = [os.path.getsize(p) for p in paths]
    if buf is None:
        buf = ceiling_memory(paths, populated=False)
    if buf is None:
        return
    view = memoryview(buf)
    ops: list[Any] = []
    at = 0
    for p, n in zip(paths, sizes):
        _io.submit_read(_io.engine(), lambda a, k, at=at: view[at + a : at + a + k], p, 0, n, ops)
        at += -(-n // PAGE) * PAGE  # each file page-aligned in the buffer, as a load places it
    try:
        _io.run(ops)
    finally:
        view.release()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a .safetensors file or a folder of them")
    ap.add_argument("--device", default="cpu", help='"cpu" (default), "cuda", "cuda:N"')
    ap.add_argument("--repeat", type=int, default=3, help="interleaved load/ceiling pairs (default 3)")
    ap.add_argument("--no-drop-caches", action="store_true", help="keep the page cache between runs")
    args = ap.parse_args(argv)
    try:
        import torch  # imported before any clock starts

        import deepio.safetensors as ds
        from deepio.safetensors import _io, _load

        paths = _load.shard_paths(args.path)
        total = sum(os.path.getsize(p) for p in paths)
        h = _io.engine()
        drop = not args.no_drop_caches and drop_caches()
        cache = "cold (dropped before each run)" if drop else "warm (page cache not dropped: not root, or asked)"
        print(
            f"load_safetensors: {len(paths)} file(s), {total / 1e9:.3f} GB; device {args.device}; "
            f"engine {h.backend}, direct_io {h.direct_io}, block {h.block_size >> 10} KiB, queue depth "
            f"{h.queue_depth}, {h.intra_op_parallelism} workers, requests of {_io._CHUNK_BYTES >> 20} MiB; "
            f"cache {cache}"
        )
        loads: list[float] = []
        ceils: list[float] = []
        cpus: list[float] = []
        count = 0
        for i in range(max(args.repeat, 1)):
            for what in ("load", "ceiling") if i % 2 == 0 else ("ceiling", "load"):
                if drop:
                    drop_caches()
                mem = ceiling_memory(paths) if what == "ceiling" else None
                c0, t0 = cpu_seconds(), time.perf_counter()
                if what == "load":
                    sd = ds.load_files(paths, device=args.device)
                    count = len(sd)
                    if args.device != "cpu":
                        torch.cuda.synchronize()
                    del sd
                else:
                    ceiling(paths, mem)
                    del mem
                dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
                (loads if what == "load" else ceils).append(dt)
                if what == "load":
                    cpus.append(dc)
                rate, per = total / dt / 1e9, dc / (total / 2**30)
                print(f"  run {i + 1} {what:8s} {rate:7.2f} GB/s  {dt:7.3f} s  CPU {per:.3f} s/GiB")
        lo, ce = statistics.median(loads), statistics.median(ceils)
        print(
            f"load {count} tensors: {total / lo / 1e9:.2f} GB/s (median of {len(loads)}), "
            f"CPU {statistics.median(cpus) / (total / 2**30):.3f} s/GiB; disk ceiling (engine, sequential, "
            f"same run): {total / ce / 1e9:.2f} GB/s; load/ceiling {ce / lo:.2f}"
        )
        return 0
    except (OSError, ValueError, RuntimeError) as e:
        print(f"load_safetensors: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
