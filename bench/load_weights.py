"""Loading model weights from safetensors shards: deepio.safetensors against safetensors.torch.

Makes a model-like state dict (a Llama-style transformer in bf16: embeddings and lm_head of
vocab x hidden, per layer four hidden x hidden attention matrices, three hidden x inter MLP
matrices and two norms; tensors from 8 KiB to 250 MiB) split into shards, then measures, with
the page cache dropped before every run (root), interleaved, one fresh process per run:

  ceiling      the disk's ceiling: the same bytes read whole and sequentially by deepio's engine
               into one big buffer that was faulted in before the clock started
  ceiling.fresh the same into fresh anonymous memory that the reads fault in (disk + memory)
  populate     no I/O: faulting in fresh anonymous memory of the same size (MADV_POPULATE_WRITE,
               one thread) on 4 KiB pages: what provisioning the destination costs on this machine
  populate.huge the same on transparent huge pages (deepio._populate.anonymous)
  deepio       deepio.safetensors.load_files(shards, device)
  deepio.mmap  load_files(..., backend="mmap"): the files mapped copy-on-write and read into the
               page cache by helper threads (MADV_POPULATE_READ) before returning
  deepio.popN  the same with N helper threads populating the memory ahead of the reads
               (deepio._wholefile.POPULATE_THREADS; 0: the reads fault the memory in), on the
               reader's default pages; deepio.popN.4k on 4 KiB pages, deepio.popN.huge on
               transparent huge pages (deepio._wholefile.HUGEPAGES False / True)
  per_tensor   one engine request per tensor into its own torch.empty (the layout not taken)
  st.load_file safetensors.torch.load_file(shard, device) for each shard, merged
  st.safe_open safe_open(shard).get_tensor(name) for each tensor

safetensors maps the file and returns before reading it (pages arrive on first touch), so every
method ends by touching each 4 KiB page of every tensor (for deepio a no-op pass over resident
memory): the time is until the weights are in memory, and each run prints how much of it
that touch took (where safetensors' deferred reads land). Each run reports wall time, CPU seconds
(user + system, all threads) per GiB and peak resident memory during the load (VmHWM reset
before it), and what the disk was asked for (/sys/block: MiB read, read requests, their mean
size). Medians over --pairs runs of each method.

    python3 bench/load_weights.py                      # 2 GiB in 2 shards under /var/tmp
    python3 bench/load_weights.py --gib 4 --shards 4 --pairs 7 --json out.json
    python3 bench/load_weights.py --device cuda:0      # adds loads to the GPU
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time

from benchutil import drop_caches
from load_safetensors import ceiling, ceiling_memory

HIDDEN, INTER, VOCAB = 4096, 11008, 32000


def model_shapes(target_bytes: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a bf16 transformer with as many layers as fit in target_bytes."""
    head = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    tail = [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    per_layer = 2 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN)
    layers = max(1, (target_bytes - 2 * 2 * VOCAB * HIDDEN) // per_layer)
    body = []
    for i in range(layers):
        p = f"model.layers.{i}."
        body += [(p + f"self_attn.{n}.weight", (HIDDEN, HIDDEN)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        body += [(p + "mlp.gate_proj.weight", (INTER, HIDDEN)), (p + "mlp.up_proj.weight", (INTER, HIDDEN))]
        body += [(p + "mlp.down_proj.weight", (HIDDEN, INTER))]
        body += [(p + "input_layernorm.weight", (HIDDEN,)), (p + "post_attention_layernorm.weight", (HIDDEN,))]
    return head + body + tail


def make_files(folder: str, gib: float, shards: int) -> list[str]:
    """Writes (or reuses, when the recorded configuration matches) the shards."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    stamp = os.path.join(folder, "config.json")
    config = {"gib": gib, "shards": shards, "hidden": HIDDEN, "inter": INTER, "vocab": VOCAB}
    paths = [os.path.join(folder, f"model-{i + 1:05d}-of-{shards:05d}.safetensors") for i in range(shards)]
    try:
        with open(stamp) as f:
            if json.load(f) == config and all(os.path.exists(p) for p in paths):
                return paths
    except (OSError, ValueError):
        pass
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            os.unlink(os.path.join(folder, name))
    shapes = model_shapes(int(gib * 2**30))
    total = sum(2 * _numel(s) for _, s in shapes)
    per_shard, at, shard, g = total / shards, 0, 0, torch.Generator().manual_seed(0)
    current: dict = {}
    for name, shape in shapes:
        current[name] = torch.empty(shape, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
        at += 2 * _numel(shape)
        if at >= per_shard * (shard + 1) and shard < shards - 1:
            save_file(current, paths[shard], metadata={"format": "pt"})
            current, shard = {}, shard + 1
    save_file(current, paths[shard], metadata={"format": "pt"})
    with open(stamp, "w") as f:
        json.dump(config, f)
    os.sync()
    return paths


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ------------------------------------------------------------------------- one measured run


def _touch(sd: dict) -> int:
    """Reads one byte of every 4 KiB page of every tensor (on its device); returns a checksum."""
    import torch

    s = 0
    for t in sd.values():
        if t.numel():
            b = t.reshape(-1).view(torch.uint8)
            s += int(b[::4096].sum())
    return s


def _per_tensor(paths: list[str]) -> dict:
    """Each tensor read by its own engine request into its own torch.empty (64-byte aligned
    memory, so the direct body goes through the engine's bounce slots)."""
    import torch

    from deepio.safetensors import _format, _io, read_header

    sd, ops = {}, []
    h = _io.engine()
    for p in paths:
        head = read_header(p)
        for t in head.tensors:
            dst = torch.empty(t.shape, dtype=getattr(torch, _format.TORCH_NAME[t.dtype]))
            sd[t.name] = dst
            if t.nbytes:
                ops.append(h.submit_future(False, dst.reshape(-1).view(torch.uint8), p, head.data_offset + t.begin))
    _io.run(ops)
    return sd


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _disk_stat(path: str) -> tuple[int, int]:
    """(read requests completed, sectors read) of the block device holding path."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as f:
            v = f.read().split()
        return int(v[0]), int(v[2])
    except (OSError, IndexError, ValueError):
        return 0, 0


def run_one(method: str, paths: list[str], device: str) -> dict:
    import torch  # noqa: F401 - imported before the clock starts, by every method

    import deepio._populate as populate
    import deepio.safetensors as ds
    from deepio import _wholefile

    if method.startswith("st"):
        from safetensors import safe_open
        from safetensors.torch import load_file
    mem = ceiling_memory(paths) if method == "ceiling" else None  # faulted in before the clock
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5\n")  # resets VmHWM: the peak below is the load's
    rss0 = _status("VmRSS")
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    d0 = _disk_stat(paths[0])
    t0 = time.perf_counter()
    sd: dict = {}
    if method == "ceiling":
        ceiling(paths, mem)
    elif method == "ceiling.fresh":
        ceiling(paths)
    elif method == "populate":
        n = sum(os.path.getsize(p) for p in paths)
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        populate.populate(populate.address(buf), n)
    elif method == "populate.huge":
        n = sum(os.path.getsize(p) for p in paths)
        buf, off = populate.anonymous(n, True)
        populate.populate(populate.address(buf) + off, n)
    elif method == "deepio":
        sd = ds.load_files(paths, device=device)
    elif method == "deepio.mmap":  # the page-cache backend
        sd = ds.load_files(paths, device=device, backend="mmap")
    elif method.startswith("deepio.pop"):  # deepio.popN[.4k|.huge]: N helper threads populate (0: none)
        threads, _, pages = method[len("deepio.pop") :].partition(".")
        _wholefile.POPULATE_THREADS = int(threads)
        if pages:
            if pages not in ("4k", "huge"):
                raise SystemExit(f"unknown method {method}")
            _wholefile.HUGEPAGES = pages == "huge"
        sd = ds.load_files(paths, device=device)
    elif method == "per_tensor":  # the layout not taken: one engine request per tensor
        sd = _per_tensor(paths)
    elif method == "st.load_file":
        sd = {}
        for p in paths:
            sd.update(load_file(p, device=device))
    elif method == "st.safe_open":
        sd = {}
        for p in paths:
            with safe_open(p, framework="pt", device=device) as f:
                for k in f.keys():
                    sd[k] = f.get_tensor(k)
    else:
        raise SystemExit(f"unknown method {method}")
    loaded = time.perf_counter() - t0
    check = _touch(sd)
    if device != "cpu":
        import torch

        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    d1 = _disk_stat(paths[0])
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "method": method,
        "wall_s": wall,
        "load_s": loaded,
        "cpu_s": cpu,
        "peak_rss": _status("VmHWM"),
        "rss_before": rss0,
        "tensors": len(sd),
        "disk_reads": d1[0] - d0[0],
        "disk_mib": (d1[1] - d0[1]) * 512 / 2**20,
        "check": check,
    }


# --------------------------------------------------------------------------------- driver


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/deepio-load-weights", help="where the shards live (a real disk)")
    ap.add_argument("--gib", type=float, default=2.0, help="model size in GiB (default 2)")
    ap.add_argument("--shards", type=int, default=2, help="number of shards (default 2)")
    ap.add_argument("--pairs", type=int, default=5, help="runs of each method, interleaved (default 5)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    ap.add_argument("--methods", default="ceiling,populate,deepio,st.load_file,st.safe_open")
    ap.add_argument("--json", help="write every run and the medians here")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:
        paths = json.loads(os.environ["LOAD_WEIGHTS_PATHS"])
        print(json.dumps(run_one(args.one, paths, args.device)))
        return 0

    paths = make_files(args.dir, args.gib, args.shards)
    total = sum(os.path.getsize(p) for p in paths)
    gib = total / 2**30
    methods = args.methods.split(",")
    import deepio
    import deepio.safetensors as ds
    from deepio import _wholefile
    from deepio.safetensors import _io

    h = _io.engine()
    dropped = drop_caches()
    print(
        f"load_weights: {len(paths)} shards, {gib:.3f} GiB, {sum(len(ds.read_header(p).tensors) for p in paths)} "
        f"tensors in {args.dir} ({deepio.info(args.dir)['direct_io'].get('filesystem', '?')}); device {args.device}; "
        f"deepio engine {h.backend}, direct_io {h.direct_io}, block {h.block_size >> 10} KiB, queue depth "
        f"{h.queue_depth}, {h.intra_op_parallelism} workers; CPU loads: {_wholefile.CHUNK >> 20} MiB requests, "
        f"{_wholefile.POPULATE_THREADS} populating thread(s), huge pages {_wholefile.HUGEPAGES} by default; "
        f"page cache {'dropped before every run' if dropped else 'NOT dropped (not root): warm figures'}; "
        f"{os.cpu_count()} CPUs; {args.pairs} interleaved runs of each"
    )
    env = dict(os.environ, LOAD_WEIGHTS_PATHS=json.dumps(paths))
    runs: list[dict] = []
    for i in range(args.pairs):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for m in order:
            if dropped:
                drop_caches()
            out = subprocess.run(
                [sys.executable, __file__, "--one", m, "--device", args.device],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["pair"] = i
            runs.append(r)
            print(
                f"  run {i + 1} {m:13s} {gib / r['wall_s']:6.2f} GiB/s (touch {r['wall_s'] - r['load_s']:5.2f} s)  "
                f"CPU {r['cpu_s'] / gib:5.2f} s/GiB  "
                f"peak RSS {r['peak_rss'] / 2**30:5.2f} GiB (before {r['rss_before'] / 2**30:4.2f})  "
                f"disk {r['disk_mib']:6.0f} MiB in {r['disk_reads']:6d} reads "
                f"({r['disk_mib'] * 1024 / max(r['disk_reads'], 1):5.0f} KiB each)",
                flush=True,
            )
    checks = {r["check"] for r in runs if r["tensors"]}
    if len(checks) != 1:
        print(f"methods disagree on the data: checksums {checks}", file=sys.stderr)
        return 1
    medians = {}
    ceiling = None
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        wall = statistics.median(r["wall_s"] for r in rs)
        medians[m] = {
            "gib_s": gib / wall,
            "cpu_s_per_gib": statistics.median(r["cpu_s"] for r in rs) / gib,
            "peak_rss_gib": statistics.median(r["peak_rss"] for r in rs) / 2**30,
            "extra_rss_gib": statistics.median(r["peak_rss"] - r["rss_before"] for r in rs) / 2**30,
            "disk_request_kib": statistics.median(r["disk_mib"] * 1024 / max(r["disk_reads"], 1) for r in rs),
        }
        if m == "ceiling":
            ceiling = gib / wall
    print(f"medians of {args.pairs} ({gib:.2f} GiB, device {args.device}):")
    print(
        f"  {'method':13s} {'GiB/s':>7s} {'x ceiling':>9s} {'CPU s/GiB':>9s} {'peak RSS GiB':>12s} {'(+load)':>8s} "
        f"{'KiB/request':>11s}"
    )
    for m, v in medians.items():
        rel = f"{v['gib_s'] / ceiling:9.2f}" if ceiling else f"{'-':>9s}"
        print(
            f"  {m:13s} {v['gib_s']:7.2f} {rel} {v['cpu_s_per_gib']:9.2f} {v['peak_rss_gib']:12.2f} "
            f"{v['extra_rss_gib']:8.2f} {v['disk_request_kib']:11.0f}"
        )
    # Within each round (the same minute of the shared machine): time ratios, median and range.
    pairs = [("deepio", "st.load_file"), ("deepio", "ceiling"), ("deepio", "deepio.pop0")]
    pairs += [("deepio.pop1.huge", "deepio.pop0.4k"), ("deepio.pop0.huge", "deepio.pop0.4k")]
    pairs += [("deepio.pop1.huge", "deepio.pop0.huge"), ("deepio.pop1.4k", "deepio.pop0.4k")]
    for a, b in pairs:
        if a in medians and b in medians:
            ratios = sorted(
                rb["wall_s"] / ra["wall_s"]
                for i in range(args.pairs)
                for ra in runs
                if ra["pair"] == i and ra["method"] == a
                for rb in runs
                if rb["pair"] == i and rb["method"] == b
            )
            print(
                f"  {a} / {b}: {medians[a]['gib_s'] / medians[b]['gib_s']:.2f}x by the medians; within rounds "
                f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gib": gib, "device": args.device, "runs": runs, "medians": medians}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
