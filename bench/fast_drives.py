#!/usr/bin/env python3
"""deepio beside fio where the disk is not the limit (issue 46, items 5 and 6): random and
sequential I/O through the engine, deepio.kv and SGLang's layouts over fast drives (by default
the RAM-backed drives of bench/ram_drives.sh, /mnt/ramdrive0 and 1), with fio on the same files
in the same run.

Each folder (one per drive) holds one preallocated file of --file-size that fio and the engine
both read and overwrite. Per page size (--sizes), --rounds rounds; in each, every tool runs once,
the order rotating from round to round, the page cache dropped before every run (root):
  fio randread     fio --rw=randread --ioengine=io_uring --direct=1 --iodepth=QD --bs=PAGE, one
                   job per drive over its file (bench/kv_bench.py's run_fio), plus --fio-opts
                   (default --fixedbufs --registerfiles, as bench/file_vs_fio.py: registered
                   buffers and files, as deepio's io_uring backend uses them)
  fio randwrite    the same with --rw=randwrite --fdatasync=BATCH (a flush per BATCH writes per drive)
  pread_ranges     deepio.File.pread_ranges of --per-call random pages per drive per call,
                   --inflight calls per drive kept running (one aio_handle: queue depth QD x drives)
  aio_pread        aio_handle.async_pread of each page on its own, one wait() per buffer-full
  pwrite_ranges    aio_handle.async_pwrite_ranges of BATCH random pages per drive with fsync=True
                   (the engine's fdatasync after the op), a wave of one op per drive, then wait()
  kv               deepio.kv.Store over a folder per drive (defaults but capacity): durable puts
                   then gets of all pages in batches of BATCH pages per drive (so each drive
                   syncs every BATCH pages, as fio's --fdatasync=BATCH per job; bench/kv_bench.py's
                   run_store)
  sglang           deepio.kv.sglang through SGLang's controller page functions over a
                   page_first and a layer_first host pool (bench/kv_bench.py's run_sglang), where
                   SGLang is importable (scripts/setup-kv-engines.sh); else skipped, the reason said
Random pages cover the file's first --file-size bytes (--bytes-4k at 4 KiB pages, where kv and
SGLang do not run): every tool moves that many bytes per drive per run, each page once (the
engine: a random permutation; fio: --norandommap). Then, on the first drive, 1 sequential
--seq-bytes read and write in 1 MiB blocks: one aio_handle.async_pread/async_pwrite of the whole
buffer and one wait() against fio --rw=read / --rw=write --bs=1M, O_DIRECT, no flush.
Reported per row and page size: medians of GiB/s and CPU seconds per GiB (deepio: the process's,
every thread; fio: usr+sys), and deepio/fio (the medians' ratio, the per-round range beside it;
SGLang: layer_first / page_first). The bytes each deepio run moved are checked after it, outside
the timing (pages against plain reads of the file; kv and SGLang check their own pages). --json
prints every sample too.

Usage: sudo bench/ram_drives.sh up 2 4
       sudo python3 bench/fast_drives.py [--folder DIR ...] [--sizes 4K,64K,256K,2M] [--rounds 3]
                                         [--file-size 1G] [--bytes-4k 256M] [--seq-bytes 1G]
                                         [--fio-opts '--fixedbufs --registerfiles'] [--no-sglang] [--json]
       sudo bench/ram_drives.sh down
Memory: the drives fill up to ~2.5 GiB each at the defaults, the buffers take ~2 GiB more, and
SGLang's host pool refuses to be made with less than 10 GB available (those rows are then
skipped, the reason printed).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import time
import uuid

import numpy as np

import deepio
import deepio.kv
from benchutil import block_device, cpu_seconds, drive_folders, drop_caches
from file_vs_fio import size_arg
from kv_bench import aligned_pool, run_fio, run_store

GIB = 1 << 30
SEQ_BS = 1 << 20

# (label, deepio's samples, the baseline's samples, which groups): a row of the report.
ROWS = [
    ("fio randread, all drives", "fio randread", None, "page"),
    ("engine: File.pread_ranges", "pread_ranges", "fio randread", "page"),
    ("aio_handle: async_pread per page, one wait()", "aio_pread", "fio randread", "page"),
    ("fio randwrite --fdatasync=BATCH", "fio randwrite", None, "page"),
    ("engine: pwrite_ranges BATCH pages, fsync=True", "pwrite_ranges", "fio randwrite", "page"),
    ("deepio.kv gets, BATCH pages per drive a batch", "kv get", "fio randread", "kv"),
    ("deepio.kv durable puts, BATCH pages per drive a batch", "kv put", "fio randwrite", "kv"),
    ("SGLang page_first puts (deepio.kv.sglang)", "sglang page_first put", None, "sglang"),
    ("SGLang layer_first puts (vs page_first)", "sglang layer_first put", "sglang page_first put", "sglang"),
    ("SGLang page_first gets (deepio.kv.sglang)", "sglang page_first get", None, "sglang"),
    ("SGLang layer_first gets (vs page_first)", "sglang layer_first get", "sglang page_first get", "sglang"),
    ("fio read, 1 MiB, one drive", "fio read", None, "seq"),
    ("aio_handle: one async_pread, one drive", "aio read", "fio read", "seq"),
    ("fio write, 1 MiB, one drive", "fio write", None, "seq"),
    ("aio_handle: one async_pwrite, one drive", "aio write", "fio write", "seq"),
]


def timed(fn) -> tuple[float, float]:
    """Runs fn(); returns (wall seconds, process CPU seconds)."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def sample(what: str, nbytes: int, secs: float, cpu: float, verified: bool | None) -> dict:
    return {"what": what, "bytes": nbytes, "seconds": secs, "cpu_seconds": cpu, "verified": verified}


def check_pages(plain_fd: int, view: np.ndarray, offsets, bs: int, what: str) -> None:
    """The pages of ``view`` (packed, one per offset; at most 8 looked at) equal the file's."""
    for i, off in enumerate(list(offsets)[:8]):
        if os.pread(plain_fd, bs, int(off)) != view[i * bs : (i + 1) * bs].tobytes():
            raise SystemExit(f"{what}: {bs} B at offset {off} differ from the file")


class Bench:
    """The drives' files, one engine handle over them, and a run of each tool."""

    def __init__(self, a, folders: list[str], run_id: str) -> None:
        self.a, self.nd, self.run_id = a, len(folders), run_id
        self.rng = np.random.default_rng(7)
        self.paths = [os.path.join(f, f"fast-drives-{run_id}.bin") for f in folders]
        chunk = np.random.default_rng(1).integers(0, 256, 16 << 20, dtype=np.uint8)
        for p in self.paths:  # preallocated: every block written, each 4 KiB stamped with its offset
            with open(p, "wb") as out:
                for at in range(0, a.file_size, len(chunk)):
                    piece = chunk[: min(len(chunk), a.file_size - at)].copy()
                    piece.view(np.uint64)[::512] = np.arange(at, at + len(piece), 4096, dtype=np.uint64)
                    out.write(piece.tobytes())
                os.fsync(out.fileno())
        self.h = deepio.aio_handle(
            block_size=max(1 << 20, max(a.sizes)),
            queue_depth=a.queue_depth * self.nd,
            overlap_events=True,
            intra_op_parallelism=a.workers,
            direct_io="on",
        )
        self.files = [deepio.File(p, "r+", handle=self.h, direct_io="on") for p in self.paths]
        self.fds = [f.fileno() for f in self.files]
        self.plain = [os.open(p, os.O_RDONLY) for p in self.paths]
        self.buf = self.views = None

    def close(self) -> None:
        for f in self.files:
            f.close()
        for fd in self.plain:
            os.close(fd)
        for p in self.paths:
            os.unlink(p)

    def region(self, bs: int) -> int:
        return min(self.a.file_size, self.a.bytes_4k) if bs == 4096 else self.a.file_size

    def buffer(self, bs: int) -> None:
        """The locked buffer of a page size: a slot of a call's pages per drive and call in
        flight, at least --aio-buffer (the pages async_pread fills before a wait()); random
        bytes, each 4 KiB stamped with its index (what writes write)."""
        a = self.a
        self.slot_pages = max(a.per_call * a.inflight, a.batch)
        self.buf = self.views = None
        nbytes = max(self.nd * self.slot_pages * bs, a.aio_buffer // bs * bs)
        self.buf = self.h.new_cpu_locked_tensor(nbytes, np.empty(0, np.uint8))
        block = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
        self.buf[:] = np.resize(block, self.buf.nbytes)
        self.buf.view(np.uint64)[::512] = np.arange(self.buf.nbytes // 4096, dtype=np.uint64)
        self.views = [self.buf[i * bs : (i + 1) * bs] for i in range(self.buf.nbytes // bs)]

    def slot(self, d: int, k: int, pages: int, bs: int) -> np.ndarray:
        at = (d * self.slot_pages + k * pages) * bs
        return self.buf[at : at + pages * bs]

    def offsets(self, bs: int) -> list[np.ndarray]:
        """Each drive's pages in a random order (each once), as byte offsets."""
        n = self.region(bs) // bs
        return [self.rng.permutation(n).astype(np.int64) * bs for _ in range(self.nd)]

    def ranges(self, bs: int, write: bool) -> dict:
        """pread_ranges (--per-call pages a call, --inflight calls per drive running) or
        pwrite_ranges (--batch pages a call with fsync, one per drive, then wait())."""
        a, nd = self.a, self.nd
        per = a.batch if write else a.per_call
        inflight = 1 if write else a.inflight
        offs = self.offsets(bs)
        calls = [(d, offs[d][i : i + per]) for i in range(0, len(offs[0]), per) for d in range(nd)]
        slots = [[self.slot(d, k, per, bs) for k in range(inflight)] for d in range(nd)]

        def go() -> None:
            if write:
                for i in range(0, len(calls), nd):
                    for d, o in calls[i : i + nd]:
                        self.h.async_pwrite_ranges(slots[d][0], None, o, bs, fd=self.fds[d], fsync=True)
                    self.h.wait()
                return
            running: collections.deque = collections.deque()
            for i, (d, o) in enumerate(calls):
                if len(running) >= inflight * nd:
                    running.popleft().result()
                running.append(self.files[d].pread_ranges(slots[d][(i // nd) % inflight], o, bs))
            for fut in running:
                fut.result()

        secs, cpu = timed(go)
        last = (len(calls) // nd - 1) % inflight
        for d in range(nd):
            check_pages(
                self.plain[d], slots[d][last], calls[-nd + d][1], bs, "pwrite_ranges" if write else "pread_ranges"
            )
        return sample("pwrite_ranges" if write else "pread_ranges", nd * len(offs[0]) * bs, secs, cpu, True)

    def aio_pages(self, bs: int) -> dict:
        """One async_pread per page into its own part of the buffer; wait() once it is full."""
        offs = self.offsets(bs)
        pairs = [(self.fds[d], int(offs[d][i])) for i in range(len(offs[0])) for d in range(self.nd)]
        views, h = self.views, self.h

        def go() -> None:
            for i, (fd, off) in enumerate(pairs):
                if i and i % len(views) == 0:
                    h.wait()
                h.async_pread(views[i % len(views)], None, off, fd=fd)
            h.wait()

        secs, cpu = timed(go)
        for i in range(max(0, len(pairs) - 8), len(pairs)):
            fd, off = pairs[i]
            check_pages(self.plain[self.fds.index(fd)], views[i % len(views)], [off], bs, "async_pread")
        return sample("aio_pread", len(pairs) * bs, secs, cpu, True)

    def seq(self, h, buf: np.ndarray, write: bool) -> dict:
        """The first --seq-bytes of the first drive's file in one operation and one wait()."""
        fd = self.fds[0]
        call = h.async_pwrite if write else h.async_pread

        def go() -> None:
            call(buf, None, 0, fd=fd)
            h.wait()

        secs, cpu = timed(go)
        for at in self.rng.integers(0, buf.nbytes // SEQ_BS, 4) * SEQ_BS:
            check_pages(self.plain[0], buf[at : at + SEQ_BS], [at], SEQ_BS, "aio " + ("write" if write else "read"))
        return sample("aio write" if write else "aio read", buf.nbytes, secs, cpu, True)

    def fio(self, bs: int, rw: str, seq: bool = False) -> dict:
        files, size = ([self.paths[0]], self.a.seq_bytes) if seq else (self.paths, self.region(bs))
        s = run_fio(files, size, bs, self.a.queue_depth, self.a.batch, rw, tuple(self.a.fio_opts.split()))
        # fio says its runtime in whole milliseconds: a tiny run's may read 0
        return sample(f"fio {rw}", s["bytes"], max(s["seconds"], 1e-3), s["cpu_seconds"], None)


def sglang_reason() -> str | None:
    """Why the SGLang rows cannot run here; None where they can."""
    try:
        from kv_bench import activate_engines

        activate_engines()
        import sglang.srt.managers.cache_controller  # noqa: F401
        import sglang.srt.mem_cache.pool_host.mha  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure: the reason is printed)
        return f"SGLang not importable ({type(e).__name__}: {str(e)[:120]}; scripts/setup-kv-engines.sh installs it)"
    return None


class KvGroup:
    """deepio.kv.Store and the SGLang backends of one page size, over store folders per drive."""

    def __init__(self, a, folders: list[str], run_id: str, bs: int, pages: int, skipped: dict) -> None:
        self.a, self.bs, self.pages = a, bs, pages
        self.dirs = [os.path.join(f, f"fast-drives-kv-{run_id}") for f in folders]
        self.store = deepio.kv.Store(self.dirs, capacity_bytes=int(pages * bs * 1.25), page_bytes=bs)
        # A kv batch spreads its pages over the drives and syncs each drive once; fio's
        # --fdatasync=BATCH syncs each job (drive) every BATCH writes: BATCH pages per drive
        # per call makes the flushes per byte the same.
        self.kv_batch = a.batch * len(folders)
        self.pool = aligned_pool(self.kv_batch, bs)
        self.store.register(self.pool)
        run_store(self.store, self.pool, min(pages, self.kv_batch), self.kv_batch, "warm")  # untimed: slabs touched
        self.sg: dict = {}
        self.sg_pages = min(pages, a.sglang_pages)
        if "sglang" in skipped:
            return
        from kv_bench import SGL_LAYERS, SGL_TOKENS, deepio_sglang_backend, sglang_pool

        try:
            for layout in ("page_first", "layer_first"):
                pool, geometry = sglang_pool(bs, a.batch, layout)
                sub = [f"{d}-sglang-{layout}" for d in self.dirs]
                cap = int(self.sg_pages * bs * 1.25)
                self.sg[layout] = (deepio_sglang_backend(sub, cap, pool, layout == "page_first"), pool, sub)
        except (ValueError, RuntimeError, MemoryError) as e:  # SGLang's host pool wants 10 GB left free
            skipped[f"sglang {group_name(bs)}"] = why = f"SGLang's host pools not made: {e}"
            print(f"# sglang rows of {group_name(bs)} skipped: {why}")
            self.close_sglang()
            return
        print(f"# {group_name(bs)}: SGLang host pools {SGL_LAYERS} layers x {SGL_TOKENS} tokens x {geometry} fp16")

    def tools(self) -> list[str]:
        return ["kv", *(f"sglang {layout}" for layout in self.sg)]

    def run(self, tool: str, tag: str) -> list[dict]:
        if tool == "kv":
            got = run_store(self.store, self.pool, self.pages, self.kv_batch, tag)
            return [sample(f"kv {s['phase']}", s["bytes"], s["seconds"], s["cpu_seconds"], True) for s in got]
        from kv_bench import run_sglang

        layout = tool.split()[1]
        backend, pool, _ = self.sg[layout]
        got = run_sglang("deepio-sglang", backend, pool, self.sg_pages, self.a.batch, tag)
        backend.clear()  # untimed: the next round writes new keys into the same space
        return [sample(f"{tool} {s['phase']}", s["bytes"], s["seconds"], s["cpu_seconds"], True) for s in got]

    def close_sglang(self) -> None:
        for backend, _, sub in self.sg.values():
            backend.close()
            for d in sub:
                shutil.rmtree(d, ignore_errors=True)
        self.sg = {}

    def close(self) -> None:
        self.close_sglang()
        self.store.close()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def measure(a, b: Bench, group, skipped: dict, samples: list[dict]) -> None:
    """--rounds rounds of one group (a page size, or "seq"), the tools' order rotating."""
    kv = None
    if group == "seq":
        b.buf = b.views = None  # the page sizes' buffer, freed before the sequential one is made
        seq_h = deepio.aio_handle(block_size=SEQ_BS, queue_depth=a.queue_depth, overlap_events=True,
                                  intra_op_parallelism=a.workers, direct_io="on")  # fmt: skip
        seq_buf = seq_h.new_cpu_locked_tensor(a.seq_bytes, np.empty(0, np.uint8))
        seq_buf[:] = np.resize(np.random.default_rng(4).integers(0, 256, 1 << 20, dtype=np.uint8), a.seq_bytes)
        tools = {
            "fio read": lambda r: [b.fio(SEQ_BS, "read", seq=True)],
            "fio write": lambda r: [b.fio(SEQ_BS, "write", seq=True)],
            "aio read": lambda r: [b.seq(seq_h, seq_buf, False)],
            "aio write": lambda r: [b.seq(seq_h, seq_buf, True)],
        }
    else:
        bs = group
        b.buffer(bs)
        tools = {
            "fio randread": lambda r: [b.fio(bs, "randread")],
            "fio randwrite": lambda r: [b.fio(bs, "randwrite")],
            "pread_ranges": lambda r: [b.ranges(bs, False)],
            "aio_pread": lambda r: [b.aio_pages(bs)],
            "pwrite_ranges": lambda r: [b.ranges(bs, True)],
        }
        if bs != 4096:
            pages = b.nd * b.region(bs) // bs
            kv = KvGroup(a, a.folder, b.run_id, bs, pages, skipped)
            for t in kv.tools():
                tools[t] = lambda r, t=t: kv.run(t, f"r{r}")
    names = list(tools)
    try:
        for r in range(a.rounds):
            for tool in names[r % len(names) :] + names[: r % len(names)]:
                drop_caches()
                for s in tools[tool](r):
                    s.update(group=group, round=r)
                    samples.append(s)
    finally:
        if kv is not None:
            kv.close()


def summarize(samples: list[dict], batch: int) -> list[dict]:
    rows = []
    groups = list(dict.fromkeys(s["group"] for s in samples))
    for label, what, base, _ in ROWS:
        for g in groups:
            mine = [s for s in samples if s["group"] == g and s["what"] == what]
            if not mine:
                continue
            row = {"row": label.replace("BATCH", str(batch)), "what": what, "group": g, "vs": base}
            row.update(stats(mine))
            row["verified"] = all(s["verified"] for s in mine) if mine[0]["verified"] is not None else None
            theirs = [s for s in samples if s["group"] == g and s["what"] == base]
            if theirs:
                row["base_gib_s"] = stats(theirs)["gib_s"]
                row["ratio"] = row["gib_s"] / row["base_gib_s"]
                per = {s["round"]: s["bytes"] / s["seconds"] for s in theirs}
                rr = [s["bytes"] / s["seconds"] / per[s["round"]] for s in mine if s["round"] in per]
                row["ratio_min"], row["ratio_max"] = min(rr), max(rr)
            rows.append(row)
    return rows


def stats(ss: list[dict]) -> dict:
    return {
        "gib_s": statistics.median(s["bytes"] / GIB / s["seconds"] for s in ss),
        "cpu_s_per_gib": statistics.median(s["cpu_seconds"] / (s["bytes"] / GIB) for s in ss),
        "n": len(ss),
    }


def group_name(g) -> str:
    return "seq" if g == "seq" else (f"{g >> 20} MiB" if g >= 1 << 20 else f"{g >> 10} KiB")


def report(rows: list[dict], groups: list) -> None:
    print(f"{'row':<48} {'page':>7} | {'GiB/s':>7} {'CPU s/GiB':>9} | {'vs':<22} {'ratio':>6} (range)")
    for r in rows:
        vs = f"{r['vs']:<22} {r['ratio']:>5.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})" if "ratio" in r else ""
        print(f"{r['row']:<48} {group_name(r['group']):>7} | {r['gib_s']:>7.3f} {r['cpu_s_per_gib']:>9.3f} | {vs}")
    pages = [g for g in groups if g != "seq"]
    print("\n| | " + " | ".join(group_name(g) for g in pages) + " |")
    print("|---|" + "---|" * len(pages))
    for label in dict.fromkeys(r["row"] for r in rows if r["group"] != "seq"):
        cells = []
        for g in pages:
            r = next((x for x in rows if x["row"] == label and x["group"] == g), None)
            cells.append(
                "-" if r is None else f"{r['gib_s']:.2f}" + (f" (**{r['ratio']:.2f}×**)" if "ratio" in r else "")
            )
        print(f"| {label} | " + " | ".join(cells) + " |")
    for r in rows:
        if r["group"] == "seq" and "ratio" in r:
            print(f"| {r['row']} | {r['gib_s']:.2f} GiB/s vs {r['base_gib_s']:.2f} (**{r['ratio']:.2f}×**) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--folder", action="append", default=[], help="a folder per drive (repeat; default: the ram drives)"
    )
    ap.add_argument("--sizes", default="4K,64K,256K,2M", help="page sizes (4 KiB: engine rows only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--file-size", type=size_arg, default=1 << 30, help="each drive's file: bytes per drive per run")
    ap.add_argument("--bytes-4k", type=size_arg, default=256 << 20, help="bytes per drive per run of 4 KiB pages")
    ap.add_argument(
        "--seq-bytes", type=size_arg, default=1 << 30, help="the sequential read and write (<= --file-size)"
    )
    ap.add_argument("--queue-depth", type=int, default=32, help="fio's iodepth per drive; the engine's per drive")
    ap.add_argument("--per-call", type=int, default=64, help="pages per drive per pread_ranges call")
    ap.add_argument("--inflight", type=int, default=2, help="pread_ranges calls per drive kept running")
    ap.add_argument("--batch", type=int, default=128, help="pages per kv call, per synced write op; fio --fdatasync")
    ap.add_argument("--workers", type=int, default=1, help="the engine handle's intra_op_parallelism")
    ap.add_argument("--aio-buffer", type=size_arg, default=256 << 20, help="async_pread pages per wait() (bytes)")
    ap.add_argument("--sglang-pages", type=int, default=256, help="pages per SGLang run (at most the kv pages)")
    ap.add_argument(
        "--fio-opts",
        default="--fixedbufs --registerfiles",
        help="more fio options (default: registered buffers and files, as deepio's io_uring backend uses; '' for "
        "plain fio, whose O_DIRECT requests then pin their pages one by one)",
    )
    ap.add_argument("--no-sglang", action="store_true", help="skip the SGLang rows")
    ap.add_argument("--no-seq", action="store_true", help="skip the sequential rows")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.sizes = [size_arg(s) for s in a.sizes.split(",") if s]
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (apt-get install -y fio)")
    a.folder = drive_folders(a.folder)
    if a.file_size % 4096 or a.seq_bytes % SEQ_BS or a.bytes_4k % 4096:
        raise SystemExit("--file-size and --bytes-4k must be whole 4 KiB blocks, --seq-bytes whole MiB")
    if not a.no_seq and a.seq_bytes > a.file_size:
        raise SystemExit("--seq-bytes must be at most --file-size (the first drive's file is read and written)")
    skipped = {}
    if a.no_sglang:
        skipped["sglang"] = "--no-sglang"
    elif any(bs != 4096 for bs in a.sizes) and (why := sglang_reason()):
        skipped["sglang"] = why
    run_id = uuid.uuid4().hex[:8]
    b = Bench(a, a.folder, run_id)
    cold = drop_caches()
    fio_v = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"deepio {deepio.__version__}; backend {b.h.backend}; {b.nd} drives {a.folder} (devices "
        f"{[block_device(p) for p in b.paths]}); file {a.file_size >> 20} MiB per drive "
        f"({a.bytes_4k >> 20} MiB at 4 KiB); page sizes {[group_name(s) for s in a.sizes]}; rounds {a.rounds}, "
        f"order rotating; {fio_v} io_uring --direct=1 --iodepth={a.queue_depth} per drive {a.fio_opts}, "
        "one job per drive; "
        f"engine: one aio_handle, queue depth {a.queue_depth * b.nd}, intra_op_parallelism {a.workers}, "
        f"overlap_events, O_DIRECT; pread_ranges {a.per_call} pages x {a.inflight} in flight per drive; "
        f"batches of {a.batch} (kv calls, fsync'd write ops, fio --fdatasync); kv.Store defaults; "
        f"sequential {a.seq_bytes >> 20} MiB on {a.folder[0]}; "
        f"page cache {'dropped before every run' if cold else 'NOT dropped (not root)'}"
    )
    for k, why in skipped.items():
        print(f"# {k} rows skipped: {why}")
    samples: list[dict] = []
    groups = [*a.sizes, *([] if a.no_seq else ["seq"])]
    try:
        for g in groups:
            t0 = time.perf_counter()
            measure(a, b, g, skipped, samples)
            print(f"# {group_name(g)}: {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        b.close()
    rows = summarize(samples, a.batch)
    report(rows, groups)
    if a.json:
        print(json.dumps({"rows": rows, "samples": samples, "skipped": skipped}))


if __name__ == "__main__":
    main()
