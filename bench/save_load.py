"""deepio.save / deepio.load against torch.save / torch.load on a checkpoint-sized state dict.

    python3 bench/save_load.py [--gib 1.5] [--pairs 5] [--dir /var/tmp/deepio-bench] [--json]
                               [--saves-only | --loads-only] [--method NAME ...] [--variants]

A transformer-shaped state dict (embedding, per layer qkv/out/mlp weights and biases, norms;
tensors from KiB to hundreds of MiB) of about --gib GiB is saved and loaded, interleaved
(deepio, torch, deepio, torch, ... with the order swapped every pair), --pairs times:

  save:  deepio.save (temp name, fsync, rename, fsync folder), also with crc32=False and, where zlib-ng is
         installed, with the standard library's zlib CRC-32 instead | torch.save + fsync of the file and folder
         (the same durability) | torch.save without fsync (what most code does)
  ceiling: the engine writing (fsync'ed) and reading one page-locked buffer of the same size
  load:  deepio.load | torch.load of the same torch.save file, page cache dropped before each
         (echo 3 > /proc/sys/vm/drop_caches; needs root, else the loads are marked warm);
         --variants adds deepio.save's and deepio.load's other routes (see --help)

--method NAME (repeated) runs only the methods named: with fewer in a pair, less of what one leaves behind
(dirty pages, the disk's write-back cache) falls on the next. The tensors' alignment matters
to deepio.save (docs/checkpoints.md): THP_MEM_ALLOC_ENABLE=1 makes torch's allocator give
page-aligned tensors, and the first line printed says how much of the state dict is.

Printed: medians of GiB/s, CPU s/GiB (user + system of the whole process, engine threads
included, from getrusage) and the peak resident memory each call added (VmHWM after a reset,
minus VmRSS before: a load's result itself counts, so the checkpoint's size is the floor).
Results are checked outside the timed region (one load of each kind compared with the
original tensors).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import time
import zlib

from benchutil import cpu_seconds, drop_caches, fsync_path


def state_dict(gib: float, dtype):  # type: ignore[no-untyped-def]
    import torch

    h, vocab = 2048, 32000
    esize = torch.empty(0, dtype=dtype).element_size()
    per_layer = (3 * h * h + h * h + 4 * h * h * 2) * esize
    layers = max(1, int((gib * (1 << 30) - vocab * h * esize) // per_layer))
    g = torch.Generator().manual_seed(0)
    sd = {"embed.weight": torch.randn(vocab, h, generator=g).to(dtype)}
    for i in range(layers):
        p = f"layers.{i}."
        sd[p + "attn.qkv.weight"] = torch.randn(3 * h, h, generator=g).to(dtype)
        sd[p + "attn.qkv.bias"] = torch.randn(3 * h, generator=g).to(dtype)
        sd[p + "attn.out.weight"] = torch.randn(h, h, generator=g).to(dtype)
        sd[p + "mlp.up.weight"] = torch.randn(4 * h, h, generator=g).to(dtype)
        sd[p + "mlp.down.weight"] = torch.randn(h, 4 * h, generator=g).to(dtype)
        sd[p + "norm1.weight"] = torch.ones(h, dtype=dtype)
        sd[p + "norm2.weight"] = torch.ones(h, dtype=dtype)
    sd["step"] = 1234
    return sd


def nbytes_of(sd) -> int:  # type: ignore[no-untyped-def]
    return sum(v.nbytes for v in sd.values() if hasattr(v, "nbytes"))


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def timed(fn):  # type: ignore[no-untyped-def]
    """(wall s, CPU s, peak resident memory added while fn ran in MiB, fn's result). The peak
    is VmHWM after resetting it (echo 5 > /proc/self/clear_refs) minus VmRSS before."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5\n")
    except OSError:
        pass
    rss0 = rss_kib("VmRSS")
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = fn()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return wall, cpu, (rss_kib("VmHWM") - rss0) / 1024, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.5, help="state dict size in GiB (default 1.5)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--dir", default="/var/tmp/deepio-bench")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    ap.add_argument("--loads-only", action="store_true", help="measure the loads only (the file saved once)")
    ap.add_argument("--saves-only", action="store_true", help="measure the saves only")
    ap.add_argument(
        "--method",
        action="append",
        help="run this method (its name as printed, e.g. 'engine write (ceiling)'; repeat for more) and no other: "
        "fewer methods in a pair, less of what one leaves behind (dirty pages, the disk's cache) for the next",
    )
    ap.add_argument(
        "--variants",
        action="store_true",
        help="add deepio.save with every storage copied into the staging buffers (before 2026-11-25), "
        "deepio.load through the Reader (each storage read into memory torch allocates: deepio.load "
        "before 2026-11-23 19:45), the whole-file read without its populating helper thread and on huge "
        "pages, the Reader with each destination populated in one call before the copies instead of ahead "
        "of them on a helper thread, and the engine reading the file into pre-faulted 4 KiB or huge pages",
    )
    args = ap.parse_args()

    import torch

    import deepio
    from deepio import _engine, checkpoint

    os.makedirs(args.dir, exist_ok=True)
    need = int(args.gib * (1 << 30))
    free_disk = shutil.disk_usage(args.dir).free
    avail = int(open("/proc/meminfo").read().split("MemAvailable:")[1].split()[0]) * 1024
    if free_disk < 4 * need:
        sys.exit(f"need {4 * need >> 20} MiB free in {args.dir}, have {free_disk >> 20}")
    mem = (6 if args.variants else 4) * need  # the state dict, a loaded copy, the ceiling's locked
    if avail < mem:  # buffer (--variants: two more destinations), slack
        sys.exit(f"need {mem >> 20} MiB of available memory, have {avail >> 20}")

    dtype = getattr(torch, args.dtype)
    sd = state_dict(args.gib, dtype)
    total = nbytes_of(sd)
    gib = total / (1 << 30)
    h = _engine.default()  # the engine deepio.save/load use
    probe = deepio.info(args.dir)["direct_io"]
    print(
        f"# state dict: {len(sd)} entries, {gib:.2f} GiB {args.dtype}; dir {args.dir} ({probe.get('filesystem')}); "
        f"engine {h.backend}, direct_io {h.direct_io}, block {h.block_size >> 10} KiB, queue depth "
        f"{h.queue_depth}, {h.intra_op_parallelism} workers; Writer buffers {checkpoint.DEFAULT_WRITE_BUFFERS} x "
        f"{checkpoint.DEFAULT_WRITE_BUFFER >> 20} MiB, Reader chunks {checkpoint.DEFAULT_READ_BUFFERS} x "
        f"{checkpoint.DEFAULT_READ_BUFFER >> 20} MiB; deepio.load whole-file route {checkpoint._WHOLE_FILE} "
        f"({checkpoint._WHOLE_CHUNK >> 20} MiB requests, {checkpoint._WHOLE_POPULATE_THREADS} populating thread, "
        f"huge pages {checkpoint._WHOLE_HUGEPAGES}); "
        f"CRC-32 from {checkpoint._crc32.__module__}; torch {torch.__version__}, {os.cpu_count()} CPUs; "
        f"{args.pairs} interleaved pairs; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    # deepio.save writes large storages by direct I/O straight from their memory only where
    # the address suits the device (512 bytes on this VM's disks, 4 on NVMe); torch's allocator
    # gives 64-byte alignment, page alignment under THP_MEM_ALLOC_ENABLE=1.
    aligned = sum(v.nbytes for v in sd.values() if hasattr(v, "data_ptr") and v.data_ptr() % 4096 == 0)
    mem_align = deepio.info(args.dir)["direct_io"].get("mem_align")
    print(
        f"# tensor memory: {aligned / total:.0%} of the bytes page-aligned "
        f"(THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}); "
        f"direct I/O memory alignment here {mem_align}"
    )
    p_dio = os.path.join(args.dir, "deepio.pt")
    p_tor = os.path.join(args.dir, "torch.pt")
    p_raw = os.path.join(args.dir, "torch-nosync.pt")

    def save_deepio() -> None:
        deepio.save(sd, p_dio)

    def save_deepio_nocrc() -> None:
        deepio.save(sd, p_dio, crc32=False)

    def save_deepio_zlib() -> None:
        fast, checkpoint._crc32 = checkpoint._crc32, zlib.crc32
        try:
            deepio.save(sd, p_dio)
        finally:
            checkpoint._crc32 = fast

    def save_torch_fsync() -> None:
        torch.save(sd, p_tor)
        fsync_path(p_tor)
        fsync_path(args.dir)

    def save_torch() -> None:
        torch.save(sd, p_raw)

    # The disk's ceiling in the same run: the engine writing / reading one page-locked buffer
    # of the checkpoint's size in one request (what `deepio bench` measures), fsync'ed.
    ceiling_buf = deepio.aio_handle().new_cpu_locked_tensor(total, torch.empty(0, dtype=torch.uint8))
    ceiling_buf.fill_(7)
    p_eng = os.path.join(args.dir, "engine.bin")

    def write_engine() -> None:
        with deepio.File(p_eng, "w", handle=h) as f:
            f.write_from(ceiling_buf, 0)
            f.fsync()

    def read_engine() -> None:
        with deepio.File(p_eng, "r", handle=h) as f:
            f.read_into(ceiling_buf, 0)

    saves = {
        "engine write (ceiling)": write_engine,
        "deepio.save": save_deepio,
        "deepio.save crc32=False": save_deepio_nocrc,
        "torch.save+fsync": save_torch_fsync,
        "torch.save (no fsync)": save_torch,
    }
    if checkpoint._crc32 is not zlib.crc32:
        saves["deepio.save, zlib's CRC"] = save_deepio_zlib
    loads = {
        "engine read (ceiling)": read_engine,
        "deepio.load": lambda: deepio.load(p_tor, weights_only=True),
        "torch.load": lambda: torch.load(p_tor, weights_only=True),
    }

    def variant(**settings):  # type: ignore[no-untyped-def]
        """deepio.load with checkpoint's module settings changed for the call."""

        def run():  # type: ignore[no-untyped-def]
            old = {k: getattr(checkpoint, k) for k in settings}
            for k, v in settings.items():
                setattr(checkpoint, k, v)
            try:
                return deepio.load(p_tor, weights_only=True)
            finally:
                for k, v in old.items():
                    setattr(checkpoint, k, v)

        return run

    def save_variant(**settings):  # type: ignore[no-untyped-def]
        """deepio.save with checkpoint's module settings changed for the call."""

        def run() -> None:
            old = {k: getattr(checkpoint, k) for k in settings}
            for k, v in settings.items():
                setattr(checkpoint, k, v)
            try:
                deepio.save(sd, p_dio)
            finally:
                for k, v in old.items():
                    setattr(checkpoint, k, v)

        return run

    if args.variants:
        # deepio.save before 2026-11-25: every storage copied into the staging buffers
        saves["deepio.save, all staged"] = save_variant(_IN_PLACE_MIN=1 << 62)
        saves["deepio.save, 2 CRC threads"] = save_variant(_crc_threads=lambda: 2)
        saves["deepio.save, CRC whole"] = save_variant(_CRC_PIECE=1 << 62)
        loads["deepio.load Reader"] = variant(_WHOLE_FILE=False)
        loads["deepio.load whole, no helper"] = variant(_WHOLE_POPULATE_THREADS=0)
        loads["deepio.load whole, huge pages"] = variant(_WHOLE_HUGEPAGES=True)
        loads["deepio.load Reader pop. first"] = variant(_WHOLE_FILE=False, _POPULATE_AHEAD=False)
    if args.variants:
        # What the whole-file route's destination costs the disk: the engine reading the
        # torch.save file (16 MiB requests, all in flight, as deepio.load does) into plain
        # anonymous memory faulted in before the clock, on 4 KiB pages and on huge pages.
        from deepio import _populate
        from deepio._file import File

        def anonymous(huge: bool):  # type: ignore[no-untyped-def]
            n = total + (64 << 20)  # the file is a little larger than its tensors
            buf = mmap.mmap(-1, n + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            addr = _populate.address(buf)
            off = -addr % (2 << 20)
            if huge:
                _populate.advise(addr + off, n // (2 << 20) * (2 << 20), 14)  # MADV_HUGEPAGE
            _populate.populate(addr + off, n)
            view = memoryview(buf)[off : off + n]

            def run() -> None:
                with File(p_tor, "r", handle=h) as f:
                    size, chunk = f.size(), 16 << 20
                    futs = [f.pread(view[a : min(a + chunk, size)], a) for a in range(0, size, chunk)]
                    for fut in futs:
                        fut.result()

            return run

        loads["engine read, 4 KiB pages"] = anonymous(False)
        loads["engine read, huge pages"] = anonymous(True)
    if args.method:
        keep = set(args.method)
        unknown = keep - set(saves) - set(loads)
        if unknown:
            sys.exit(f"unknown methods {sorted(unknown)}; known: {sorted([*saves, *loads])}")
        saves = {k: v for k, v in saves.items() if k in keep}
        loads = {k: v for k, v in loads.items() if k in keep}
    if args.saves_only:
        loads = {}
    if args.loads_only:
        saves = {}
    if loads and not {"torch.save+fsync", "engine write (ceiling)"} <= set(saves):
        # the loads read the files these two saves write: written once, before the clock
        torch.save(sd, p_tor)
        fsync_path(p_tor)
        write_engine()
    res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in [*saves, *loads]}
    cold = True
    for i in range(args.pairs):
        order = list(saves) if i % 2 == 0 else list(reversed(saves))
        for name in order:
            os.sync()
            wall, cpu, peak, _ = timed(saves[name])
            res[name].append((wall, cpu, peak))
        os.sync()
        order = list(loads) if i % 2 == 0 else list(reversed(loads))
        for name in order:
            cold = drop_caches() and cold
            wall, cpu, peak, out = timed(loads[name])
            res[name].append((wall, cpu, peak))
            del out
        print(
            f"pair {i + 1}: " + ", ".join(f"{k} {gib / v[-1][0]:.2f} GiB/s" for k, v in res.items()),
            flush=True,
        )

    # Verify outside the timed region.
    saved = any(k.startswith("deepio.save") for k in saves)  # p_dio is this run's
    checks = [("deepio.save -> torch.load", lambda: torch.load(p_dio))] if saved else []
    checks += [(k, f) for k, f in loads.items() if not k.startswith("engine")]
    for name, fn in checks:
        got = fn()
        bad = [k for k, v in sd.items() if hasattr(v, "nbytes") and not torch.equal(got[k], v)]
        if bad or got["step"] != sd["step"]:
            sys.exit(f"{name}: results differ ({bad[:3]})")
        del got
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    print(f"# verified; page cache {'dropped before each load' if cold else 'NOT dropped (not root): warm loads'}")

    summary = {}
    print(f"{'method':30s} {'GiB/s':>7s} {'CPU s/GiB':>10s} {'peak +RSS MiB':>14s}   (medians of {args.pairs})")
    for name, v in res.items():
        rate = statistics.median(gib / w for w, _, _ in v)
        cpu = statistics.median(c / gib for _, c, _ in v)
        peak = statistics.median(p for _, _, p in v)
        summary[name] = {"gib_per_s": rate, "cpu_s_per_gib": cpu, "peak_rss_added_mib": peak, "runs": v}
        print(f"{name:30s} {rate:7.2f} {cpu:10.2f} {peak:14.0f}")
    r = {k: v["gib_per_s"] for k, v in summary.items()}
    medians = [
        f"{a} / {b} = {r[a] / r[b]:.2f}x"
        for a, b in (
            ("deepio.save", "torch.save+fsync"),
            ("deepio.save", "torch.save (no fsync)"),
            ("deepio.save", "engine write (ceiling)"),
            ("deepio.load", "torch.load"),
            ("deepio.load", "engine read (ceiling)"),
        )
        if a in r and b in r
    ]
    if medians:
        print("# of the medians: " + "; ".join(medians))
    for a, b in (
        ("deepio.save", "torch.save+fsync"),
        ("deepio.save", "torch.save (no fsync)"),
        ("deepio.save", "deepio.save, zlib's CRC"),
        ("deepio.save", "deepio.save, all staged"),
        ("deepio.save", "engine write (ceiling)"),
        ("deepio.load", "torch.load"),
        ("deepio.load", "engine read (ceiling)"),
        ("deepio.load", "deepio.load Reader"),
        ("deepio.load", "deepio.load whole, no helper"),
        ("deepio.load", "deepio.load whole, huge pages"),
        ("deepio.load Reader", "deepio.load Reader pop. first"),
        ("deepio.load Reader", "torch.load"),
        ("engine read, huge pages", "engine read, 4 KiB pages"),
    ):
        if not res.get(a) or not res.get(b):
            continue
        q = sorted(tb / ta for (ta, _, _), (tb, _, _) in zip(res[a], res[b]))
        print(f"# {a} / {b} within pairs (time ratios): median {statistics.median(q):.2f}x, {q[0]:.2f}-{q[-1]:.2f}")
    if args.json:
        print(json.dumps({"gib": gib, "cold": cold, "results": summary}))
    for p in (p_dio, p_tor, p_raw, p_eng):
        if os.path.exists(p):
            os.unlink(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
