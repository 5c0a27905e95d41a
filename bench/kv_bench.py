#!/usr/bin/env python3
"""KV-cache pages on local drives (issue 39 item 3): deepio.kv.Store against fio and against
SGLang's shipped HiCacheFile backend, interleaved in one run.

Per round (--rounds, the order of the tools rotating from round to round), each tool writes
then reads --pages pages of --page-bytes in batches of --batch, cold (the page cache dropped
before the reads and between tools, where allowed: root):
  deepio   deepio.kv.Store over the --folder(s): put(keys, slots).result() per batch, then
           get(keys, slots).result() per batch, from and into a registered pool of --batch
           rows (keys new each round; removed after the round)
  sglang   SGLang's cache-controller page functions over a real CPU MHATokenToKVPoolHost
           (page_first; 32 layers x 16 tokens, heads x head_dim chosen so a page is
           --page-bytes), as SGLang runs them for each backend:
             deepio-sglang  deepio.kv.sglang through HiCacheController._page_set_zero_copy /
                            _page_get_zero_copy (batch_set_v1 / batch_get_v1, "interface_v1")
             hicache-file   SGLang's HiCacheFile through _generic_page_set / _generic_page_get
                            (batch_set / batch_get of flat pages: HiCacheFile has no v1 calls in
                            0.5.23), in the first folder; its writes are not durable (no fsync:
                            tofile + rename), deepio's are
  fio      fio --rw=randwrite --fdatasync=BATCH (durable per batch, as deepio's puts) then
           --rw=randread, --bs=PAGE_BYTES --iodepth=QUEUE_DEPTH --ioengine=io_uring --direct=1,
           one job per folder, each over its own file of pages x page_bytes / folders
Reported per tool and phase: medians over rounds of GiB/s, of the p50 and p99 batch latency
(fio: its per-I/O completion latency percentiles, marked), and of CPU seconds per GiB (the
process's, every thread; fio: usr+sys). The configuration is printed first; the bytes read back
by each deepio and SGLang run are checked against those written, outside the timed region.
--json prints every sample too.

Usage: python3 bench/kv_bench.py [--folder DIR ...] [--pages 1024] [--page-bytes 2M] [--batch 128]
                                 [--rounds 3] [--queue-depth 128] [--tools deepio,deepio-sglang,hicache-file,fio]
                                 [--json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import numpy as np

import deepio
import deepio.kv
from benchutil import block_device, cpu_seconds, drop_caches

GIB = 1 << 30
TOOLS = ("deepio", "deepio-sglang", "hicache-file", "fio")
SGL_LAYERS, SGL_TOKENS = 32, 16


def size_arg(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def sample(tool: str, phase: str, nbytes: int, secs: float, cpu: float, lat: list[float]) -> dict:
    return {
        "tool": tool,
        "phase": phase,
        "bytes": nbytes,
        "seconds": secs,
        "cpu_seconds": cpu,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
    }


# ---- deepio.kv.Store ------------------------------------------------------------------------


def aligned_pool(rows: int, row_bytes: int) -> np.ndarray:
    """Page-aligned anonymous memory (what O_DIRECT wants), touched once."""
    buf = mmap.mmap(-1, rows * row_bytes)
    pool = np.frombuffer(buf, dtype=np.uint8).reshape(rows, row_bytes)
    pool[:] = np.random.default_rng(1).integers(0, 256, row_bytes, dtype=np.uint8)
    return pool


def run_store(store, pool: np.ndarray, pages: int, batch: int, tag: str) -> list[dict]:
    keys = [f"{tag}-{i}" for i in range(pages)]
    slots = list(range(batch))
    out = []
    for phase, call in (("put", store.put), ("get", store.get)):
        if phase == "get":
            drop_caches()
            pool[:, :8] = 0
        lat = []
        c0, t0 = cpu_seconds(), time.perf_counter()
        for b in range(0, pages, batch):
            ks = keys[b : b + batch]
            if phase == "put":
                pool[: len(ks), :8] = np.arange(b, b + len(ks), dtype=np.uint64).view(np.uint8).reshape(-1, 8)
            s = time.perf_counter()
            ok = call(ks, slots[: len(ks)]).result()
            lat.append(time.perf_counter() - s)
            if not all(ok):
                raise SystemExit(f"deepio {phase}: {ok.count(False)} of {len(ks)} pages failed")
        out.append(sample("deepio", phase, pages * pool.shape[1], time.perf_counter() - t0, cpu_seconds() - c0, lat))
    # The last batch read back holds pages last..: their index stamps, checked untimed.
    last = list(range(pages - pages % batch if pages % batch else pages - batch, pages))
    got = pool[: len(last), :8].copy().view(np.uint64).reshape(-1).tolist()
    if got != last:
        raise SystemExit(f"deepio: the pages read back are not those written ({got[:4]} vs {last[:4]})")
    store.remove(keys)
    return out


# ---- SGLang ---------------------------------------------------------------------------------


def activate_engines() -> None:
    """The engines of scripts/setup-kv-engines.sh importable (tests/python/kv_engines.py),
    SGLang's logging quiet."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
    import logging

    import kv_engines  # the engines' folder of scripts/setup-kv-engines.sh

    kv_engines.activate()
    logging.getLogger("sglang").setLevel(logging.ERROR)


def sglang_pool(page_bytes: int, batch: int, layout: str = "page_first"):
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    unit = 2 * SGL_LAYERS * SGL_TOKENS * 2  # K and V, fp16: bytes per (head x head_dim) element
    if page_bytes % unit:
        raise SystemExit(f"--page-bytes must be a multiple of {unit} for the SGLang host pool")
    hd = page_bytes // unit
    head_dim = next(d for d in (128, 64, 32, 16, 8, 4, 2, 1) if hd % d == 0)
    tokens = batch * SGL_TOKENS
    device = MHATokenToKVPool(
        tokens, SGL_TOKENS, torch.float16, hd // head_dim, head_dim, SGL_LAYERS, "cpu", False,
        start_layer=0, end_layer=SGL_LAYERS,
    )  # fmt: skip
    info = device.get_device_pool_infos()[0].buffer_info
    pool = MHATokenToKVPoolHost(
        info, 2.0, 0, SGL_TOKENS, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=tokens, start_layer=0, end_layer=SGL_LAYERS,
    )  # fmt: skip
    del device
    pool.kv_buffer.view(torch.uint8).copy_(
        torch.randint(0, 256, pool.kv_buffer.view(torch.uint8).shape, dtype=torch.uint8)
    )
    return pool, f"{hd // head_dim} heads x {head_dim}"


def sglang_config(extra: dict, page_first: bool = True):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=page_first, model_name="bench", extra_config=extra,
    )  # fmt: skip


def deepio_sglang_backend(folders: list[str], capacity: int, pool, page_first: bool = True):
    """deepio.kv.sglang's backend over ``folders``, made by SGLang's factory from the "dynamic"
    config (``interface_v1``) as SGLang makes it, and attached to the host pool."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = {
        "backend_name": "deepio", "module_path": "deepio.kv.sglang", "class_name": "DeepioHiCacheStorage",
        "interface_v1": 1, "folders": folders, "capacity_bytes": capacity,
    }  # fmt: skip
    backend = StorageBackendFactory.create_backend("dynamic", sglang_config(extra, page_first), pool)
    backend.register_mem_pool_host(pool)
    return backend


def run_sglang(tool: str, backend, pool, pages: int, batch: int, tag: str) -> list[dict]:
    import torch
    from sglang.srt.managers.cache_controller import HiCacheController as C

    ctl = types.SimpleNamespace(
        storage_backend=backend, storage_host_pool=pool, mem_pool_host=pool, page_size=pool.page_size
    )
    op = types.SimpleNamespace(request_id=tag, is_terminated=lambda: False)
    page_set, page_get = (
        (C._page_set_zero_copy, C._page_get_zero_copy)
        if tool == "deepio-sglang"
        else (C._generic_page_set, C._generic_page_get)
    )
    indices = torch.arange(batch * pool.page_size, dtype=torch.int64)
    page_bytes = pool.get_size_per_token() * pool.page_size
    keys = [f"{tag}-{i}" for i in range(pages)]
    first = pool.get_data_page(0, flat=True).view(torch.uint8).clone()  # bytes: random fp16 has NaNs
    out = []
    for phase in ("put", "get"):
        if phase == "get":
            drop_caches()
            pool.kv_buffer.zero_()
        lat = []
        c0, t0 = cpu_seconds(), time.perf_counter()
        for b in range(0, pages, batch):
            ks = keys[b : b + batch]
            idx = indices[: len(ks) * pool.page_size]
            s = time.perf_counter()
            if phase == "put":
                ok = page_set(ctl, ks, idx)
            else:
                ok = page_get(ctl, op, ks, idx) == len(ks)
            lat.append(time.perf_counter() - s)
            if not ok:
                raise SystemExit(f"{tool} {phase}: a batch failed")
        out.append(sample(tool, phase, pages * page_bytes, time.perf_counter() - t0, cpu_seconds() - c0, lat))
    # Every batch wrote the same host pages, so page 0 read back must be the page written.
    if not torch.equal(pool.get_data_page(0, flat=True).view(torch.uint8), first):
        raise SystemExit(f"{tool}: the page read back is not the one written")
    return out


# ---- fio ------------------------------------------------------------------------------------


def run_fio(files: list[str], per_file: int, bs: int, qd: int, batch: int, rw: str, extra: tuple = ()) -> dict:
    cmd = ["fio", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", "--ioengine=io_uring", "--direct=1",
           f"--size={per_file}", "--norandommap", "--randrepeat=0", "--group_reporting",
           "--output-format=json", *extra]  # fmt: skip
    if rw == "randwrite":
        cmd.append(f"--fdatasync={batch}")
    for i, f in enumerate(files):
        cmd += [f"--name=j{i}", f"--filename={f}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    part = job["write" if rw.endswith("write") else "read"]
    secs = part["runtime"] / 1000.0
    clat = part.get("clat_ns", {}).get("percentile", {})
    return {
        "tool": "fio",
        "phase": "put" if rw.endswith("write") else "get",
        "bytes": part["io_bytes"],
        "seconds": secs,
        # usr_cpu/sys_cpu of a group: percent of job_runtime, the sum of its jobs' runtimes
        "cpu_seconds": (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * job.get("job_runtime", part["runtime"]) / 1000.0,
        "p50_ms": clat.get("50.000000", 0) / 1e6,
        "p99_ms": clat.get("99.000000", 0) / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", action="append", default=[], help="a folder per drive (repeat; default: one temporary)")
    ap.add_argument("--pages", type=int, default=1024, help="pages written then read per tool and round")
    ap.add_argument("--page-bytes", type=size_arg, default=2 << 20)
    ap.add_argument("--batch", type=int, default=128, help="pages per put/get call (SGLang's STORAGE_BATCH_SIZE)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queue-depth", type=int, default=128, help="the store's queue depth = fio's iodepth per job")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tools = [t for t in a.tools.split(",") if t]
    if unknown := set(tools) - set(TOOLS):
        raise SystemExit(f"unknown tools {sorted(unknown)}; known: {', '.join(TOOLS)}")
    if "fio" in tools and shutil.which("fio") is None:
        raise SystemExit("fio is not installed (apt-get install -y fio)")
    if {"deepio-sglang", "hicache-file"} & set(tools):
        activate_engines()

    made = not a.folder
    folders = a.folder or [tempfile.mkdtemp(prefix="deepio-kv-bench-", dir="/var/tmp")]
    run_id = uuid.uuid4().hex[:8]
    store_dirs = [os.path.join(f, f"deepio-kv-{run_id}") for f in folders]
    capacity = int(a.pages * a.page_bytes * 1.5)
    page, batch, pages = a.page_bytes, a.batch, a.pages
    store = pool = sg_pool = None
    backends: dict = {}
    geometry = ""
    if "deepio" in tools:
        store = deepio.kv.Store(store_dirs, capacity_bytes=capacity, page_bytes=page, queue_depth=a.queue_depth)
        pool = aligned_pool(batch, page)
        store.register(pool)
    if {"deepio-sglang", "hicache-file"} & set(tools):
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

        sg_pool, geometry = sglang_pool(page, batch)
        if "deepio-sglang" in tools:
            backends["deepio-sglang"] = deepio_sglang_backend([d + "-sglang" for d in store_dirs], capacity, sg_pool)
        if "hicache-file" in tools:
            path = os.path.join(folders[0], f"hicache-file-{run_id}")
            backends["hicache-file"] = StorageBackendFactory.create_backend(
                "file", sglang_config({"file_storage_path": path}), sg_pool
            )
            backends["hicache-file"].register_mem_pool_host(sg_pool)
    fio_files = [os.path.join(f, f"fio-{run_id}.bin") for f in folders]
    per_file = -(-pages // len(folders)) * page
    if "fio" in tools:  # laid out once, untimed (fio's first write allocates the file)
        subprocess.run(["fio", "--name=layout", "--rw=write", f"--bs={page}", f"--size={per_file}",
                        "--direct=1", *[f"--filename={f}" for f in fio_files[:1]]],
                       check=True, capture_output=True)  # fmt: skip
        for f in fio_files[1:]:
            subprocess.run(["fio", "--name=layout", "--rw=write", f"--bs={page}", f"--size={per_file}",
                            "--direct=1", f"--filename={f}"], check=True, capture_output=True)  # fmt: skip

    devs = sorted({block_device(f) or "?" for f in folders})
    cold = drop_caches()
    print(
        f"deepio {deepio.__version__}; kv.Store over {len(folders)} folder(s) {folders} (devices {devs}); "
        f"{pages} pages of {page >> 10} KiB per tool and round, batches of {batch}, queue depth {a.queue_depth}; "
        f"rounds {a.rounds}, order rotating; tools {tools}; "
        + (
            f"SGLang host pool page_first {SGL_LAYERS} layers x {SGL_TOKENS} tokens x {geometry} fp16; "
            if geometry
            else ""
        )
        + ("fio io_uring --direct=1, randwrite --fdatasync=batch, one job per folder; " if "fio" in tools else "")
        + f"page cache {'dropped before reads and between tools' if cold else 'NOT dropped (not root)'}"
    )
    samples: list[dict] = []
    try:
        # Untimed warm-up: the store's slabs and the pools touched once.
        if store is not None:
            run_store(store, pool, min(pages, batch), batch, "warm")
        for r in range(a.rounds):
            order = tools[r % len(tools) :] + tools[: r % len(tools)]
            for tool in order:
                drop_caches()
                tag = f"r{r}"
                if tool == "deepio":
                    got = run_store(store, pool, pages, batch, tag)
                elif tool == "fio":
                    got = [
                        run_fio(fio_files, per_file, page, a.queue_depth, batch, rw) for rw in ("randwrite", "randread")
                    ]
                else:
                    got = run_sglang(tool, backends[tool], sg_pool, pages, batch, tag)
                for s in got:
                    s["round"] = r
                samples.extend(got)
    finally:
        for b in backends.values():
            if hasattr(b, "close"):
                b.close()
        if store is not None:
            store.close()
        for f in fio_files:
            if os.path.exists(f):
                os.unlink(f)
        for d in [*store_dirs, *(d + "-sglang" for d in store_dirs)]:
            shutil.rmtree(d, ignore_errors=True)
        if "hicache-file" in backends:
            shutil.rmtree(os.path.join(folders[0], f"hicache-file-{run_id}"), ignore_errors=True)
        if made:
            shutil.rmtree(folders[0], ignore_errors=True)

    rows = []
    for tool in tools:
        for phase in ("put", "get"):
            ss = [s for s in samples if s["tool"] == tool and s["phase"] == phase]
            rows.append({
                "tool": tool,
                "phase": phase,
                "gib_s": statistics.median(s["bytes"] / GIB / s["seconds"] for s in ss),
                "p50_ms": statistics.median(s["p50_ms"] for s in ss),
                "p99_ms": statistics.median(s["p99_ms"] for s in ss),
                "cpu_s_per_gib": statistics.median(s["cpu_seconds"] / (s["bytes"] / GIB) for s in ss),
            })  # fmt: skip
    print(f"{'tool':<14} {'phase':<5} | {'GiB/s':>7} | {'p50 ms':>8} {'p99 ms':>8} | {'CPU s/GiB':>9}")
    for row in rows:
        mark = " (per I/O)" if row["tool"] == "fio" else ""
        print(
            f"{row['tool']:<14} {row['phase']:<5} | {row['gib_s']:>7.3f} | "
            f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} | {row['cpu_s_per_gib']:>9.3f}{mark}"
        )
    med = {(r["tool"], r["phase"]): r["gib_s"] for r in rows}
    for phase in ("put", "get"):
        if ("deepio", phase) in med:
            for other in ("fio", "hicache-file"):
                if (other, phase) in med:
                    print(f"deepio/{other} {phase}: {med[('deepio', phase)] / med[(other, phase)]:.2f}x")
    if a.json:
        print(json.dumps({"rows": rows, "samples": samples}))


if __name__ == "__main__":
    main()
