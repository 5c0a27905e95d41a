"""deepio.dcp's FileSystemWriter/FileSystemReader against torch.distributed.checkpoint's own.

    python3 bench/dcp_bench.py [--gib 1] [--ranks 2] [--rounds 5] [--threads 1,2,4,8]
                               [--dir /var/tmp/deepio-dcp-bench] [--cache auto|drop_caches|fadvise]
                               [--no-async] [--baseline-dcp DIR] [--unchecked] [--json]

--ranks processes (gloo, torch.multiprocessing.spawn) share a state dict of --gib GiB shaped like
a model with Adam's state: a handful of large matrices and many small vectors per section
("model", "optim.exp_avg", "optim.exp_avg_sq"), every tensor a DTensor sharded by rows
(Shard(0), as FSDP2 holds them), a 0-dim "step" tensor per parameter (replicated: the
coordinator writes it) and a plain integer. Each round (--rounds of them; the order of the
methods rotated by one every round) runs, with dcp.save / dcp.load:

  save (sync_files=True, durable; each into a folder emptied and synced before the clock):
    engine write   the ceiling: each rank writes its bytes to one file through deepio's engine
                   (64 MiB page-locked buffer, all requests in flight) and fsyncs it
    deepio         deepio.dcp.FileSystemWriter, default arguments (thread_count=1)
    torch t=N      torch's FileSystemWriter with thread_count=N for N in --threads (1 is its
                   default); "torch best" is the row with the highest median
  load (each after the page cache was dropped: as root `sync; echo 3 > drop_caches`, else
        sync and posix_fadvise(DONTNEED) of every file read; --cache picks; the header says
        which. The "maj.faults" column counts the ranks' major page faults during the call: 0
        on the development VM, drop_caches leaves mapped pages such as torch's code alone):
    engine read    the ceiling: each rank reads its engine file back into the 64 MiB buffer
    engine read->dest  the same file read into the destination tensors' own memory (their
                   shards of 1 MiB or more, one request each, all in flight): the ceiling for
                   what the readers do
    deepio         deepio.dcp.FileSystemReader
    deepio baseline  (with --baseline-dcp DIR: the deepio/dcp folder of another deepio, e.g.
                   main's installed in another venv) that folder's FileSystemReader, imported
                   beside this one as deepio._dcp_baseline (its modules over this deepio's
                   engine and checkpoint code): before/after of a reader change in one run
    deepio unchecked  (with --unchecked) deepio.dcp.FileSystemReader(verify_crc=False): what
                   the CRC-32 check costs
    torch          torch's FileSystemReader
    Both readers read the checkpoint the first "torch t=N" (t=1 by default) wrote this round into the same destination
    state dict (zeroed before the clock); after each load every rank compares its shards with
    the saved tensors byte for byte, outside the clock, and the run fails on a difference.
  async_save (unless --no-async): dcp.async_save with each writer; timed: the call until it
    returns its future (the blocking part: torch's staging copy of the state dict), and until
    the future is done.

Wall time is the slowest rank's, from a barrier to the call's return; CPU time is user +
system of every rank process (all its threads; getrusage in each rank) summed. Not counted:
the kernel's write-back threads (page cache to disk for torch's buffered writes). At the end,
torch's reader loads deepio's last checkpoint and deepio's reader loads torch's last
thread_count=8 (or largest) one, both checked byte for byte.

Printed: medians of GiB/s (with the range over rounds), CPU s/GiB and major page faults (all
ranks) per method, ratios within rounds (median and range), and with --json a line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

from benchutil import cpu_seconds, drop_caches, drop_file_cache

ENGINE_CHUNK = 64 << 20  # the engine ceiling's page-locked buffer, one request
SMALL_SIZES = (2048, 8192, 512, 16384)  # float32 elements of the small vectors (8/32/2/64 KiB)
SMALL_PER_SECTION = 64
LARGE_PER_SECTION = 4
COLS = 2048


def _majflt() -> int:
    """Major page faults of this process so far (pages that had to come from the disk: were a
    cache drop to evict torch's own code, the loads would pay for it here)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _shapes(gib: float, world: int) -> list[tuple[str, tuple[int, ...]]]:
    """The global shapes of one section's tensors: SMALL_PER_SECTION vectors and
    LARGE_PER_SECTION matrices of COLS columns whose rows (multiples of ``world``) fill a third
    of --gib (the other two thirds: the optimizer's two states of the same shapes)."""
    budget = gib * (1 << 30) / 3
    small = [(f"norm{i}", (SMALL_SIZES[i % len(SMALL_SIZES)] * world,)) for i in range(SMALL_PER_SECTION)]
    small_bytes = sum(4 * s[0] for _, s in small)
    rows_total = max(world * LARGE_PER_SECTION, int((budget - small_bytes) / (4 * COLS)))
    # uneven large matrices: one 40 %, the rest sharing the other 60 %, like an embedding
    weights = [0.4] + [0.6 / (LARGE_PER_SECTION - 1)] * (LARGE_PER_SECTION - 1)
    large = [(f"w{i}", (max(world, int(rows_total * f) // world * world), COLS)) for i, f in enumerate(weights)]
    return large + small


def _state(rank: int, world: int, gib: float, mesh: Any, fill: bool) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor, Shard

    sd: dict[str, Any] = {}
    seed = 0
    for section in ("model", "optim.exp_avg", "optim.exp_avg_sq"):
        for name, shape in _shapes(gib, world):
            seed += 1
            local_shape = (shape[0] // world, *shape[1:])
            if fill:
                g = torch.Generator().manual_seed(seed * 1000 + rank)
                local = torch.randn(local_shape, generator=g)
            else:
                local = torch.zeros(local_shape)
            sd[f"{section}.{name}"] = DTensor.from_local(
                local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=local.stride()
            )
            if section == "optim.exp_avg":
                sd[f"optim.step.{name}"] = torch.tensor(float(seed) if fill else 0.0)
    sd["iteration"] = 100 if fill else 0
    return sd


def _local_bytes(sd: dict[str, Any], rank: int) -> int:
    """Bytes this rank writes: its shards, and (coordinator) the replicated tensors."""
    n = 0
    for v in sd.values():
        if hasattr(v, "to_local"):
            n += v.to_local().nbytes
        elif hasattr(v, "nbytes") and rank == 0:
            n += v.nbytes
    return n


def _equal(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    import torch

    bad = []
    for k, v in a.items():
        w = b[k]
        if hasattr(v, "to_local"):
            if not torch.equal(v.to_local(), w.to_local()):
                bad.append(k)
        elif hasattr(v, "nbytes"):
            if not torch.equal(v, w):
                bad.append(k)
        elif v != w:
            bad.append(k)
    return bad


def _zero(sd: dict[str, Any]) -> None:
    for k, v in sd.items():
        if hasattr(v, "to_local"):
            v.to_local().zero_()
        elif hasattr(v, "nbytes"):
            v.zero_()
        else:
            sd[k] = 0


def _baseline_reader(folder: str) -> Any:
    """FileSystemReader of the deepio.dcp package in ``folder`` (--baseline-dcp), imported as
    deepio._dcp_baseline: its relative imports of deepio's other modules get this deepio's."""
    import importlib.util

    import deepio

    name = f"{deepio.__name__}._dcp_baseline"
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod.FileSystemReader


def _rank(rank: int, args: argparse.Namespace, store: str, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    import deepio
    import deepio.dcp

    world = args.ranks
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(minutes=30)
    )
    mesh = init_device_mesh("cpu", (world,))
    sd = _state(rank, world, args.gib, mesh, fill=True)
    dest = _state(rank, world, args.gib, mesh, fill=False)
    mine = _local_bytes(sd, rank)
    threads = [int(t) for t in args.threads.split(",")]
    root = args.dir

    def folder(key: str) -> str:
        return os.path.join(root, key)

    # --extra-dirs: one more folder per drive for the "deepio, N folders" rows (extra_paths)
    extra = [os.path.join(d, "spread") for d in args.extra_work]

    locked = deepio.aio_handle().new_cpu_locked_tensor(ENGINE_CHUNK, torch.empty(0, dtype=torch.uint8))
    locked.fill_(7)
    engine_file = os.path.join(folder("engine"), f"rank{rank}.bin")

    def engine_write() -> None:
        with deepio.File(engine_file, "w") as f:
            futs = [f.pwrite(locked[: min(ENGINE_CHUNK, mine - off)], off) for off in range(0, mine, ENGINE_CHUNK)]
            for fut in futs:
                fut.result()
            f.fsync()

    def engine_read() -> None:
        with deepio.File(engine_file, "r") as f:
            futs = [f.pread(locked[: min(ENGINE_CHUNK, mine - off)], off) for off in range(0, mine, ENGINE_CHUNK)]
            for fut in futs:
                fut.result()

    # The destination's own memory: its local shards of 1 MiB or more, as bytes, in order
    big = [v.to_local().view(-1).view(torch.uint8) for v in dest.values() if hasattr(v, "to_local")]
    big = [b for b in big if b.nbytes >= 1 << 20]

    def engine_read_dest() -> None:
        """The engine reading the rank's engine file into the destination tensors' memory (what
        the readers fill), one request per tensor, all in flight."""
        with deepio.File(engine_file, "r") as f:
            futs, off = [], 0
            for b in big:
                n = min(b.nbytes, mine - off)
                if n <= 0:
                    break
                futs.append(f.pread(b[:n], off))
                off += n
            for fut in futs:
                fut.result()

    def dcp_save(key: str, writer: Any) -> Any:
        return lambda: dcp.save(sd, storage_writer=writer(folder(key)))

    saves: dict[str, Any] = {
        "engine write": engine_write,
        "deepio": dcp_save("deepio", lambda p: deepio.dcp.FileSystemWriter(p, sync_files=True)),
    }
    if extra:
        saves[f"deepio {1 + len(extra)} folders"] = dcp_save(
            "spread", lambda p: deepio.dcp.FileSystemWriter(p, sync_files=True, extra_paths=extra)
        )
    for t in threads:
        saves[f"torch t={t}"] = dcp_save(
            f"torch-t{t}", lambda p, t=t: dcp.FileSystemWriter(p, sync_files=True, thread_count=t)
        )
    base = folder(f"torch-t{threads[0]}")  # both readers read this one
    loads: dict[str, Any] = {
        "engine read": engine_read,
        "engine read->dest": engine_read_dest,
        "deepio load": lambda: dcp.load(dest, storage_reader=deepio.dcp.FileSystemReader(base)),
        "torch load": lambda: dcp.load(dest, storage_reader=dcp.FileSystemReader(base)),
    }
    if args.unchecked:
        loads["deepio unchecked load"] = lambda: dcp.load(
            dest, storage_reader=deepio.dcp.FileSystemReader(base, verify_crc=False)
        )
    if args.baseline_dcp:
        baseline = _baseline_reader(args.baseline_dcp)
        loads["deepio baseline load"] = lambda: dcp.load(dest, storage_reader=baseline(base))
    if extra:  # deepio's own checkpoint, spread over the folders (the single-folder row reads torch's)
        loads[f"deepio load {1 + len(extra)} folders"] = lambda: dcp.load(
            dest, storage_reader=deepio.dcp.FileSystemReader(folder("spread"))
        )
    asyncs: dict[str, Any] = {}
    if not args.no_async:
        asyncs = {
            "deepio async_save": lambda p: deepio.dcp.FileSystemWriter(p, sync_files=True),
            "torch async_save": lambda p: dcp.FileSystemWriter(p, sync_files=True),
        }

    def cold() -> None:
        """Every rank's files out of the page cache (rank 0 does it, between barriers)."""
        dist.barrier()
        if rank == 0:
            if args.cache == "drop_caches":
                drop_caches()
            else:
                os.sync()
                for top in [root, *args.extra_work]:
                    for dirpath, _, files in os.walk(top):
                        for name in files:
                            drop_file_cache(os.path.join(dirpath, name))
        dist.barrier()

    def fresh(path: str) -> None:
        """An empty folder, its removal synced, before a save's clock."""
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            if path == folder("spread"):
                for d in extra:
                    shutil.rmtree(d, ignore_errors=True)
            os.sync()
        dist.barrier()

    def timed(fn: Any) -> tuple[float, float, int]:
        dist.barrier()
        f0, c0, t0 = _majflt(), cpu_seconds(), time.perf_counter()
        fn()
        return time.perf_counter() - t0, cpu_seconds() - c0, _majflt() - f0

    runs: list[dict[str, Any]] = []

    def verify(what: str) -> None:
        bad = _equal(sd, dest)
        if bad:
            raise AssertionError(f"rank {rank}: {what}: loaded values differ from the saved ones: {bad[:5]}")

    def rotate(names: list[str], i: int) -> list[str]:
        k = i % len(names) if names else 0  # none: --no-async's asyncs
        return names[k:] + names[:k]

    for rnd in range(args.rounds):
        for name in rotate(list(saves), rnd):
            key = "engine" if name == "engine write" else name.replace("torch t=", "torch-t")
            key = "spread" if name.endswith(" folders") else key
            fresh(folder(key))
            wall, cpu, flt = timed(saves[name])
            runs.append({"round": rnd, "method": name, "kind": "save", "wall": wall, "cpu": cpu, "majflt": flt})
        # the loads' clock starts with the data on the disk (saves' checkpoints are fsync'ed;
        # the engine file too)
        for name in rotate(list(loads), rnd):
            _zero(dest)
            cold()
            wall, cpu, flt = timed(loads[name])
            runs.append({"round": rnd, "method": name, "kind": "load", "wall": wall, "cpu": cpu, "majflt": flt})
            if not name.startswith("engine"):
                verify(f"round {rnd + 1}, {name}")
        for name in rotate(list(asyncs), rnd):
            path = folder(name.replace(" ", "-"))
            fresh(path)
            dist.barrier()
            f0, c0, t0 = _majflt(), cpu_seconds(), time.perf_counter()
            fut = dcp.async_save(sd, storage_writer=asyncs[name](path))
            blocking = time.perf_counter() - t0
            fut.result()
            wall, cpu, flt = time.perf_counter() - t0, cpu_seconds() - c0, _majflt() - f0
            runs.append(
                {
                    "round": rnd,
                    "method": name,
                    "kind": "async",
                    "wall": wall,
                    "cpu": cpu,
                    "blocking": blocking,
                    "majflt": flt,
                }
            )
        if rank == 0:
            print(f"round {rnd + 1} done, load average {os.getloadavg()[0]:.1f}", flush=True)

    # Each writer's checkpoint through the other's reader (outside the clock).
    checks = [("deepio's checkpoint, torch's reader", folder("deepio"), dcp.FileSystemReader)]
    last = folder(f"torch-t{threads[-1]}")
    checks.append(("torch's checkpoint, deepio's reader", last, deepio.dcp.FileSystemReader))
    if asyncs:
        checks.append(
            ("deepio async_save's checkpoint, torch's reader", folder("deepio-async_save"), dcp.FileSystemReader)
        )
    for what, path, reader in checks:
        _zero(dest)
        dcp.load(dest, storage_reader=reader(path))
        verify(what)

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "bytes": mine, "runs": runs})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def _summary(gathered: list[dict[str, Any]], gib: float) -> dict[str, Any]:
    """Per method: per round the slowest rank's wall time and all ranks' CPU summed."""
    per: dict[str, dict[int, dict[str, Any]]] = {}
    for g in gathered:
        for r in g["runs"]:
            e = per.setdefault(r["method"], {}).setdefault(
                r["round"], {"kind": r["kind"], "wall": 0.0, "cpu": 0.0, "blocking": 0.0, "majflt": 0}
            )
            e["majflt"] += r["majflt"]
            e["wall"] = max(e["wall"], r["wall"])
            e["cpu"] += r["cpu"]
            e["blocking"] = max(e["blocking"], r.get("blocking", 0.0))
    out: dict[str, Any] = {}
    for name, rounds in per.items():
        rs = [rounds[i] for i in sorted(rounds)]
        rates = [gib / e["wall"] for e in rs]
        m: dict[str, Any] = {
            "kind": rs[0]["kind"],
            "gib_per_s": statistics.median(rates),
            "gib_per_s_range": [min(rates), max(rates)],
            "cpu_s_per_gib": statistics.median(e["cpu"] / gib for e in rs),
            "wall_s": [e["wall"] for e in rs],
            "cpu_s": [e["cpu"] for e in rs],
            "major_faults": statistics.median(e["majflt"] for e in rs),
        }
        if rs[0]["kind"] == "async":
            m["blocking_s"] = statistics.median(e["blocking"] for e in rs)
            m["blocking_s_range"] = [min(e["blocking"] for e in rs), max(e["blocking"] for e in rs)]
            m["blocking_s_runs"] = [e["blocking"] for e in rs]
        out[name] = m
    return out


def _ratio(results: dict[str, Any], a: str, b: str, key: str = "wall_s") -> dict[str, Any] | None:
    """a's speed over b's within each round (b's time / a's time): median and range."""
    if a not in results or b not in results:
        return None
    q = sorted(tb / ta for ta, tb in zip(results[a][key], results[b][key]))
    return {"median": statistics.median(q), "range": [q[0], q[-1]], "of_medians": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="state dict size in GiB, all ranks together (default 1)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2,4,8", help="torch FileSystemWriter thread_counts, first is the baseline")
    ap.add_argument("--dir", default="/var/tmp/deepio-dcp-bench")
    ap.add_argument(
        "--cache",
        choices=["auto", "drop_caches", "fadvise"],
        default="auto",
        help="how the page cache is emptied before each load: auto (drop_caches where allowed, else fadvise), "
        "drop_caches (the whole page cache; needs root), fadvise (the checkpoint files only)",
    )
    ap.add_argument("--no-async", action="store_true", help="skip the async_save rows")
    ap.add_argument(
        "--extra-dirs",
        default="",
        help="comma-separated folders, one per further drive: adds 'deepio N folders' save and load rows "
        "(deepio.dcp's extra_paths; the main --dir is the first folder)",
    )
    ap.add_argument(
        "--baseline-dcp",
        default="",
        help="a deepio/dcp package folder of another deepio (e.g. main's, in another venv): adds a "
        "'deepio baseline load' row with its FileSystemReader, interleaved with the others",
    )
    ap.add_argument("--unchecked", action="store_true", help="adds a 'deepio unchecked load' row (verify_crc=False)")
    ap.add_argument("--json", action="store_true", help="print the results as one line of JSON at the end")
    args = ap.parse_args()

    import torch
    import torch.multiprocessing as mp

    import deepio
    from deepio import _engine

    need = int(args.gib * (1 << 30))
    os.makedirs(args.dir, exist_ok=True)
    n_folders = 3 + len(args.threads.split(",")) + (0 if args.no_async else 2)
    if shutil.disk_usage(args.dir).free < (n_folders + 1) * need:
        sys.exit(f"need {(n_folders + 1) * need >> 20} MiB free in {args.dir}")
    avail = int(open("/proc/meminfo").read().split("MemAvailable:")[1].split()[0]) * 1024
    if avail < 3 * need + (1 << 30):  # the state dict, the destination, async_save's staged copy
        sys.exit(f"need {(3 * need + (1 << 30)) >> 20} MiB of available memory, have {avail >> 20}")
    if args.cache != "fadvise":
        can_drop = drop_caches()
        if args.cache == "drop_caches" and not can_drop:
            sys.exit("--cache drop_caches: not allowed here (needs root)")
        args.cache = "drop_caches" if can_drop else "fadvise"

    how = (
        "sync; echo 3 > /proc/sys/vm/drop_caches"
        if args.cache == "drop_caches"
        else "posix_fadvise DONTNEED on every checkpoint file after a sync"
    )
    h = _engine.default()
    probe = deepio.info(args.dir)["direct_io"]
    shapes = _shapes(args.gib, args.ranks)
    n_tensors = 3 * len(shapes) + len(shapes)  # three sections, and a step per parameter
    total = 3 * sum(4 * (s[0] * (s[1] if len(s) > 1 else 1)) for _, s in shapes) + 4 * len(shapes)
    gib = total / (1 << 30)
    print(
        f"# state dict: {n_tensors} tensors + 1 int, {gib:.3f} GiB fp32 ({3 * LARGE_PER_SECTION} matrices of "
        f"{COLS} columns, {3 * SMALL_PER_SECTION} vectors of 2-64 KiB, DTensors Shard(0) over {args.ranks} ranks; "
        f"{len(shapes)} 0-dim step tensors); dir {args.dir} ({probe.get('filesystem')}, direct I/O "
        f"{probe.get('supported', probe)}); engine {h.backend}, block {h.block_size >> 10} KiB, queue depth "
        f"{h.queue_depth}, {h.intra_op_parallelism} workers per rank; torch {torch.__version__}, deepio "
        f"{deepio.__version__}; {os.cpu_count()} CPUs; {args.rounds} rounds, order rotated every round; "
        f"page cache before each load: {args.cache}"
        f" ({how}); "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    work = tempfile.mkdtemp(prefix="dcp-bench-", dir=args.dir)
    args.dir = work
    args.extra_work = [tempfile.mkdtemp(prefix="dcp-bench-", dir=d) for d in args.extra_dirs.split(",") if d]
    try:
        out_path = os.path.join(work, "results.json")
        store = os.path.join(work, "store")
        mp.spawn(_rank, args=(args, store, out_path), nprocs=args.ranks, join=True)
        with open(out_path) as f:
            gathered = json.load(f)
    finally:
        for d in [work, *args.extra_work]:
            shutil.rmtree(d, ignore_errors=True)

    results = _summary(gathered, gib)
    threads = [f"torch t={t}" for t in args.threads.split(",")]
    best = max(threads, key=lambda k: results[k]["gib_per_s"])
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    print(
        "# verified: every load's shards equal the saved tensors; deepio's and torch's checkpoints "
        "loaded by the other's reader"
    )
    print(
        f"{'method':20s} {'GiB/s':>7s} {'(range)':>13s} {'CPU s/GiB':>10s} {'maj.faults':>10s}"
        f"   medians of {args.rounds} rounds"
    )
    for name, m in results.items():
        lo, hi = m["gib_per_s_range"]
        extra = ""
        if m["kind"] == "async":
            b0, b1 = m["blocking_s_range"]
            extra = f"   blocking part {m['blocking_s']:.3f} s ({b0:.3f}-{b1:.3f}); GiB/s to the future's end"
        print(
            f"{name:20s} {m['gib_per_s']:7.3f} ({lo:5.3f}-{hi:5.3f}) {m['cpu_s_per_gib']:10.2f} "
            f"{m['major_faults']:10.0f}{extra}"
        )
    pairs = {
        "save deepio / torch default": ("deepio", threads[0]),
        "save deepio / torch best": ("deepio", best),
        "save deepio / engine write": ("deepio", "engine write"),
        f"save {best} / engine write": (best, "engine write"),
        "load deepio / torch": ("deepio load", "torch load"),
        "load deepio baseline / torch": ("deepio baseline load", "torch load"),
        "load deepio / deepio baseline": ("deepio load", "deepio baseline load"),
        "load deepio / deepio unchecked": ("deepio load", "deepio unchecked load"),
        "load deepio / engine read": ("deepio load", "engine read"),
        "load deepio / engine read->dest": ("deepio load", "engine read->dest"),
        "load torch / engine read": ("torch load", "engine read"),
    }
    ratios: dict[str, Any] = {}
    for label, (a, b) in pairs.items():
        r = _ratio(results, a, b)
        if r is None:
            continue
        r["of_medians"] = results[a]["gib_per_s"] / results[b]["gib_per_s"]
        r["cpu"] = results[a]["cpu_s_per_gib"] / results[b]["cpu_s_per_gib"]
        ratios[label] = r
    # stricter than "torch best" (one thread_count for all rounds, picked by its median): the
    # fastest of torch's thread_counts in each round
    fastest = [min(ts) for ts in zip(*(results[k]["wall_s"] for k in threads))]
    q = sorted(tb / ta for ta, tb in zip(results["deepio"]["wall_s"], fastest))
    ratios["save deepio / torch fastest in each round"] = {
        "median": statistics.median(q),
        "range": [q[0], q[-1]],
        "of_medians": results["deepio"]["gib_per_s"] / statistics.median(gib / t for t in fastest),
    }
    # deepio's blocking time over torch's, per round (< 1: deepio blocks for less time)
    r = _ratio(results, "torch async_save", "deepio async_save", key="blocking_s_runs")
    if r is not None:
        r["of_medians"] = results["deepio async_save"]["blocking_s"] / results["torch async_save"]["blocking_s"]
        ratios["async_save blocking time deepio / torch"] = r
    print(f"# torch best thread_count here: {best}")
    for label, r in ratios.items():
        lo, hi = r["range"]
        cpu = f"; CPU/GiB {r['cpu']:.2f}x" if "cpu" in r else ""
        print(
            f"# {label}: {r['median']:.2f}x within rounds ({lo:.2f}-{hi:.2f}), {r['of_medians']:.2f}x of medians{cpu}"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "gib": gib,
                    "ranks": args.ranks,
                    "rounds": args.rounds,
                    "cache": args.cache,
                    "torch_best": best,
                    "results": results,
                    "ratios": ratios,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
