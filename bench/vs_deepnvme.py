#!/usr/bin/env python3
"""Big sequential transfers: deepio's aio_handle against DeepNVMe (DeepSpeed's async_io op),
one process holding both, same handle parameters, same file, interleaved.

For each (queue_depth, intra_op_parallelism) and each buffer kind, a sample is one 1 GiB
(--mib) read or write of one file by one library: reads after the file's page cache is
dropped, writes timed through fsync (overwrite of an existing file). Each library uses its
own new_cpu_locked_tensor, as its users do (deepio: page-locked and, at >= 2 MiB, advised onto
transparent huge pages; DeepNVMe: page-locked 4 KiB pages). One buffer for both is not a fair
engine-only comparison: DeepNVMe copies any tensor torch does not report as pinned through a
bounce buffer of its own, and deepio's locked memory is not torch-pinned.
Order alternates per pair; medians of the paired ratios (deepio time / DeepNVMe time
inverted: > 1 means deepio is faster), GiB/s and CPU seconds per GiB of the process.

With --many COUNTxKiB[,...] (e.g. 2048x256,8192x64) it also runs many-tensor cases: COUNT
tensors of KiB each, one file each, every tensor submitted with async_pwrite/async_pread and
one wait() (as DeepSpeed's swappers do), reads after dropping their page cache; for deepio
also through one async_pwrite_batch / async_pread_batch call ("batch" column). Writes go to
fresh files and are measured three ways, all interleaved in the same rounds: "write" (until
wait() returns, nothing synced: the engines alone), "write+fsync loop" (then os.fsync of each
file from a Python loop, one after another, for every library) and "write durable" (DeepNVMe,
which has no such option, with that loop; deepio with fsync=True, its engine syncing the files
itself, many at once). Figures are tensors/s and CPU seconds per GiB of the process.

What a "fresh file" is (--fresh): "new" (default) gives every write sample names never used
before in the run and frees the previous sample's blocks by truncating its files to 0 bytes
(outside the timing); no file is deleted until the end of the run. "recreate" (the earlier
behaviour) deletes the same names before every write sample. On ext4 without a journal (this
development VM's root file system) the inode allocator skips every inode freed in the last
60 s (360 s while its inode-table block is dirty), one by one, on every create: after a
mass delete each new file costs up to ~1 ms of kernel CPU, whatever library writes it, so
"recreate" measures that more than the engines. The run prints the cost of creating empty
files in the folder before and after the writes ("inode probe"): 15-35 us on this VM when
clean, more when recently deleted inodes are in the way (a hint only: the scan costs a write
sample far more). Start a "new" run at least 2 minutes after the last mass delete on the file
system (e.g. a previous "recreate" run).

DeepSpeed's op is JIT-built on first use (ninja, a C++ compiler, libaio-dev): a minute or two.

    python3 bench/vs_deepnvme.py --folder /var/tmp/deepio-vs --mib 1024 --pairs 5
    python3 bench/vs_deepnvme.py --folder /var/tmp/deepio-vs --many 2048x256 --skip-sequential --pairs 5
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import time

from benchutil import cpu_seconds, drop_file_cache

GIB = 1 << 30


def sample(handle, buf, path: str, write: bool) -> tuple[float, float]:
    if not write:
        drop_file_cache(path)
    c0, t0 = cpu_seconds(), time.perf_counter()
    if write:
        handle.async_pwrite(buf, path)
    else:
        handle.async_pread(buf, path)
    handle.wait()
    if write:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0, cpu_seconds() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/var/tmp/deepio-vs-deepnvme")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=1 << 20)
    ap.add_argument("--queue-depths", default="32,128")
    ap.add_argument("--parallelism", default="1,2")
    ap.add_argument("--many", default="", help="many-tensor cases, e.g. 2048x256,8192x64 (COUNTxKiB)")
    ap.add_argument("--skip-sequential", action="store_true")
    ap.add_argument(
        "--fresh",
        choices=("new", "recreate"),
        default="new",
        help="many-tensor writes: new names every sample, nothing deleted until the end (new), "
        "or the same names deleted before every sample (recreate: measures ext4's recently-deleted scan)",
    )
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    import deepio
    from deepio import compat

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # its NVMe-endurance warning per call

    assert AsyncIOBuilder.__module__.startswith("deepspeed."), "run without DEEPIO_DEEPSPEED"
    ds_op = AsyncIOBuilder().load()
    dio_op = compat.AsyncIOBuilder().load()
    os.makedirs(args.folder, exist_ok=True)
    n = (args.mib << 20) // 4
    path = os.path.join(args.folder, "seq")
    example = torch.zeros(1, dtype=torch.float32)
    print(f"deepio {deepio.__version__}, {args.mib} MiB, block {args.block_size}, pairs {args.pairs}")
    print(
        f"{'case':30} {'DeepNVMe GiB/s':>15} {'deepio GiB/s':>13} {'deepio/DS':>10} "
        f"{'DS CPU s/GiB':>13} {'deepio CPU s/GiB':>17}   ratio range"
    )
    if args.many:
        # A kill (or Ctrl-C of a background run, where SIGINT is ignored) still removes the files.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        leftovers: list[str] = []
        try:
            many_cases(args, ds_op, dio_op, torch, leftovers)
        finally:
            remove_all(leftovers)
    if args.skip_sequential:
        return
    for qd in [int(x) for x in args.queue_depths.split(",")]:
        for par in [int(x) for x in args.parallelism.split(",")]:
            hs = {
                "DeepNVMe": ds_op.aio_handle(args.block_size, qd, False, True, par),
                "deepio": dio_op.aio_handle(args.block_size, qd, False, True, par),
            }
            own = {k: h.new_cpu_locked_tensor(n, example) for k, h in hs.items()}
            own["deepio"].copy_(torch.randn(n, generator=torch.Generator().manual_seed(qd + par)))
            own["DeepNVMe"].copy_(own["deepio"])
            hs["deepio"].async_pwrite(own["deepio"], path)
            hs["deepio"].wait()
            for write in (False, True):
                res: dict[str, list[tuple[float, float]]] = {"DeepNVMe": [], "deepio": []}
                for i in range(args.pairs):
                    for name in ("DeepNVMe", "deepio") if i % 2 == 0 else ("deepio", "DeepNVMe"):
                        res[name].append(sample(hs[name], own[name], path, write))
                if not write:
                    assert torch.equal(own["deepio"], own["DeepNVMe"]), "both read the same bytes"
                ratios = [d[0] / o[0] for d, o in zip(res["DeepNVMe"], res["deepio"])]
                gib = n * 4 / GIB
                row = {
                    k: (gib / statistics.median(t for t, _ in v), statistics.median(c for _, c in v) / gib)
                    for k, v in res.items()
                }
                case = f"{'write' if write else 'read'} qd{qd} x{par}"
                print(
                    f"{case:30} {row['DeepNVMe'][0]:15.3f} {row['deepio'][0]:13.3f} "
                    f"{statistics.median(ratios):10.2f} {row['DeepNVMe'][1]:13.3f} {row['deepio'][1]:17.3f}"
                    f"   {min(ratios):.2f}-{max(ratios):.2f}",
                    flush=True,
                )
            for k, h in hs.items():
                h.free_cpu_locked_tensor(own[k])
    os.unlink(path)


def inode_probe(folder: str, tag: str, leftovers: list[str], count: int = 64) -> float:
    """Microseconds per create of `count` empty files in `folder` (kept until the end of the
    run, so the probe frees no inode): what the file system charges for a new inode there."""
    paths = [os.path.join(folder, f"probe-{tag}-{i:03d}") for i in range(count)]
    t0 = time.perf_counter()
    for p in paths:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    t = time.perf_counter() - t0
    leftovers.extend(paths)
    return t / count * 1e6


def remove_all(paths: list[str]) -> None:
    folders = {os.path.dirname(p) for p in paths}
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)
    for f in folders:
        if os.path.isdir(f) and not os.listdir(f):
            os.rmdir(f)


def many_cases(args, ds_op, dio_op, torch, leftovers: list[str]) -> None:
    qd = int(args.queue_depths.split(",")[0])
    par = int(args.parallelism.split(",")[0])
    print(f"many tensors, one file each: block {args.block_size}, queue depth {qd}, parallelism {par}")
    if args.fresh == "new":
        print(
            "fresh files (--fresh new): new names every write sample, the previous sample's files "
            "truncated to 0 bytes before it (untimed), nothing deleted until the end of the run"
        )
    else:
        print(
            "fresh files (--fresh recreate): the same names deleted before every write sample "
            "(on ext4 without a journal each create then scans past the recently deleted inodes)"
        )
    print(
        f"{'case':36} {'DeepNVMe t/s':>13} {'deepio t/s':>11} {'batch t/s':>10} {'deepio/DS':>10} "
        f"{'batch/DS':>9} {'CPU s/GiB DS':>13} {'deepio':>7} {'batch':>7}   ratio ranges"
    )
    for spec in args.many.split(","):
        count, kib = (int(x) for x in spec.lower().split("x"))
        n = kib * 1024 // 4
        hs = {
            "DeepNVMe": ds_op.aio_handle(args.block_size, qd, False, True, par),
            "deepio": dio_op.aio_handle(args.block_size, qd, False, True, par),
        }
        hs["batch"] = hs["deepio"]
        example = torch.zeros(1, dtype=torch.float32)
        bufs = {k: [h.new_cpu_locked_tensor(n, example) for _ in range(count)] for k, h in hs.items() if k != "batch"}
        bufs["batch"] = bufs["deepio"]
        for b in bufs["deepio"]:
            b.uniform_()
        folder = os.path.join(args.folder, f"many-{spec}")
        os.makedirs(folder, exist_ok=True)
        gib = count * n * 4 / GIB
        written: list[list[str]] = []  # the paths of every write sample so far, in order

        def names(count=count, folder=folder, written=written) -> list[str]:
            # The paths the next write sample writes, with the previous sample's blocks freed.
            if args.fresh == "recreate":
                paths = [os.path.join(folder, f"t{i:05d}") for i in range(count)]
                for p in paths:
                    if os.path.exists(p):
                        os.unlink(p)
                if not written:
                    leftovers.extend(paths)
            else:
                if written:
                    for p in written[-1]:
                        os.truncate(p, 0)
                paths = [os.path.join(folder, f"s{len(written):03d}-t{i:05d}") for i in range(count)]
                leftovers.extend(paths)
            written.append(paths)
            return paths

        def run(
            name: str, write: bool, durable: str = "loop", hs=hs, bufs=bufs, written=written
        ) -> tuple[float, float]:
            # durable (writes): "none" (until wait()), "loop" (then os.fsync of each file from
            # Python), "engine" (deepio's fsync=True: the engine syncs each file itself).
            h, bs = hs[name], bufs[name]
            if write:
                paths = names()
            else:
                paths = written[-1]
                for p in paths:
                    drop_file_cache(p)
            kw = {"fsync": True} if write and durable == "engine" else {}
            c0, t0 = cpu_seconds(), time.perf_counter()
            if name == "batch":
                (h.async_pwrite_batch if write else h.async_pread_batch)(bs, paths, **kw)
            else:
                call = h.async_pwrite if write else h.async_pread
                for b, p in zip(bs, paths):
                    call(b, p, **kw)
            h.wait()
            if write and durable == "loop":
                for p in paths:
                    fd = os.open(p, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            return time.perf_counter() - t0, cpu_seconds() - c0

        def row(case: str, res: dict, cols: tuple, count=count, gib=gib) -> None:
            t = {k: statistics.median(x for x, _ in v) for k, v in res.items()}
            c = {k: statistics.median(y for _, y in v) / gib for k, v in res.items()}
            ds, d1, d2 = cols
            r1 = [a[0] / b[0] for a, b in zip(res[ds], res[d1])]
            r2 = [a[0] / b[0] for a, b in zip(res[ds], res[d2])]
            print(
                f"{case:36} {count / t[ds]:13.0f} {count / t[d1]:11.0f} {count / t[d2]:10.0f} "
                f"{statistics.median(r1):10.2f} {statistics.median(r2):9.2f} {c[ds]:13.3f} {c[d1]:7.3f} {c[d2]:7.3f}"
                f"   {min(r1):.2f}-{max(r1):.2f} {min(r2):.2f}-{max(r2):.2f}",
                flush=True,
            )

        names_ = ["DeepNVMe", "deepio", "batch"]
        probe0 = inode_probe(folder, "before", leftovers)
        # Writes: every variant in each round, order reversed every other round.
        variants = [(k, d) for d in ("none", "loop") for k in names_] + [("deepio", "engine"), ("batch", "engine")]
        wres: dict[tuple[str, str], list[tuple[float, float]]] = {v: [] for v in variants}
        for i in range(args.pairs):
            for v in variants if i % 2 == 0 else variants[::-1]:
                wres[v].append(run(v[0], True, v[1]))
        probe1 = inode_probe(folder, "after", leftovers)
        print(
            f"inode probe {spec} ({args.fresh}): {probe0:.0f} us per empty-file create before the writes, "
            f"{probe1:.0f} after",
            flush=True,
        )
        cs = f"{count}x{kib}KiB"
        row(f"write {cs}", wres, (("DeepNVMe", "none"), ("deepio", "none"), ("batch", "none")))
        row(f"write+fsync loop {cs}", wres, (("DeepNVMe", "loop"), ("deepio", "loop"), ("batch", "loop")))
        row(f"write durable {cs}", wres, (("DeepNVMe", "loop"), ("deepio", "engine"), ("batch", "engine")))
        rres: dict[str, list[tuple[float, float]]] = {k: [] for k in names_}
        for i in range(args.pairs):
            for name in names_ if i % 2 == 0 else names_[::-1]:
                rres[name].append(run(name, False))
        row(f"read {cs}", rres, ("DeepNVMe", "deepio", "batch"))
        for k, h in hs.items():
            if k != "batch":
                for b in bufs[k]:
                    h.free_cpu_locked_tensor(b)


if __name__ == "__main__":
    main()
