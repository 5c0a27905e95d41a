#!/usr/bin/env python3
"""Gets under saturating puts (issue 46 item 3): does a load wait behind stores?

One deepio.kv.Store over the --folders. Before the rounds, --get-pages pages of --page-bytes
are put (each page's bytes a function of its index). Per round (--rounds, the order of the
phases rotating from round to round):
  gets alone   one thread: get(16 random keys of those pages).result(), again and again for
               --seconds; each batch's latency is taken
  gets+puts    the same while --put-threads threads put batches of --put-batch pages
               (put(keys, slots).result() in a loop, over --put-keys keys of their own,
               overwritten round after round) as fast as the store takes them
  puts alone   the put threads without the gets
Reported: medians over rounds of the gets' p50/p95/p99 batch latency (ms) and of the puts'
GiB/s, and the ratio p95 under puts / p95 alone (the target of item 3: at most 1.5). Every
get's pages are checked (each row's 8-byte index stamp) and one batch per round byte for byte,
outside the timed region. --json prints the medians and every round's figures as one JSON
object (the last line).

Usage: python3 bench/gets_under_puts.py [--folders DIR ...] [--page-bytes 256K] [--batch 16]
           [--get-pages 256] [--put-threads 3] [--put-batch 16] [--put-keys 64]
           [--seconds 3] [--rounds 3] [--queue-depth 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

import deepio.kv

GIB = 1 << 30
PHASES = ("gets alone", "gets+puts", "puts alone")


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def page_bytes_of(index: int, page: int) -> np.ndarray:
    """The bytes of get page `index`: its index as 8 bytes, then a pattern made from it."""
    row = np.random.default_rng(index).integers(0, 256, page, dtype=np.uint8)
    row[:8] = np.array([index], dtype=np.uint64).view(np.uint8)
    return row


def pct(lat: list[float], q: float) -> float:
    return float(np.percentile(np.array(lat), q)) * 1e3 if lat else float("nan")


class Putters:
    """--put-threads threads putting batches until stopped; counts the bytes of puts done."""

    def __init__(self, store, pool: np.ndarray, first_row: int, a: argparse.Namespace, tag: str) -> None:
        self.store, self.pool, self.a = store, pool, a
        self.first_row, self.tag = first_row, tag
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done_bytes = 0
        self.failed = 0
        self.threads = [threading.Thread(target=self.run, args=(t,), daemon=True) for t in range(a.put_threads)]

    def run(self, t: int) -> None:
        a = self.a
        rows = list(range(self.first_row + t * a.put_batch, self.first_row + (t + 1) * a.put_batch))
        i = 0
        while not self.stop.is_set():
            keys = [f"{self.tag}-p{t}-{(i + k) % a.put_keys}" for k in range(a.put_batch)]
            i += a.put_batch
            ok = self.store.put(keys, rows).result()
            with self.lock:
                self.done_bytes += sum(ok) * a.page_bytes
                self.failed += ok.count(False)

    def bytes_now(self) -> int:
        with self.lock:
            return self.done_bytes

    def __enter__(self) -> Putters:
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for th in self.threads:
            th.join()


def run_gets(store, pool: np.ndarray, a: argparse.Namespace, rng: random.Random) -> tuple[list[float], int]:
    """Gets for a.seconds; returns their latencies and the number of pages checked."""
    slots = list(range(a.batch))
    lat: list[float] = []
    checked = 0
    end = time.perf_counter() + a.seconds
    while time.perf_counter() < end:
        idx = rng.sample(range(a.get_pages), a.batch)
        keys = [f"g-{i}" for i in idx]
        pool[: a.batch, :8] = 0
        s = time.perf_counter()
        ok = store.get(keys, slots).result()
        lat.append(time.perf_counter() - s)
        if not all(ok):
            raise SystemExit(f"get: {ok.count(False)} of {a.batch} pages failed")
        got = pool[: a.batch, :8].copy().view(np.uint64).reshape(-1).tolist()
        if got != idx:
            raise SystemExit(f"get: the pages read are not those asked for ({got[:4]} vs {idx[:4]})")
        checked += a.batch
    # The last batch, byte for byte.
    for r, i in enumerate(idx):
        if not np.array_equal(pool[r], page_bytes_of(i, a.page_bytes)):
            raise SystemExit(f"get: page g-{i} came back with other bytes")
    return lat, checked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folders", nargs="+", default=None, help="the store's folders (default: one under /var/tmp)")
    ap.add_argument("--page-bytes", type=parse_size, default=256 << 10)
    ap.add_argument("--batch", type=int, default=16, help="pages per get")
    ap.add_argument("--get-pages", type=int, default=256, help="pages the gets choose from")
    ap.add_argument("--put-threads", type=int, default=3)
    ap.add_argument("--put-batch", type=int, default=16)
    ap.add_argument("--put-keys", type=int, default=64, help="keys each put thread cycles over")
    ap.add_argument("--seconds", type=float, default=3.0, help="per phase and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queue-depth", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    made = not a.folders
    folders = a.folders or [tempfile.mkdtemp(prefix="deepio-gup-", dir="/var/tmp")]
    run_id = uuid.uuid4().hex[:8]
    dirs = [os.path.join(f, f"deepio-gup-{run_id}") for f in folders]
    pages_total = a.get_pages + a.put_threads * a.put_keys
    capacity = pages_total * a.page_bytes * 3
    rows = a.batch + a.put_threads * a.put_batch
    print(
        f"# deepio {deepio.__version__}: {len(dirs)} folder(s) {folders}; pages of {a.page_bytes >> 10} KiB; "
        f"gets of {a.batch} pages over {a.get_pages}; {a.put_threads} put threads x {a.put_batch} pages; "
        f"{a.seconds:g} s per phase, {a.rounds} rounds; queue_depth {a.queue_depth}",
        flush=True,
    )
    store = deepio.kv.Store(dirs, capacity_bytes=capacity, page_bytes=a.page_bytes, queue_depth=a.queue_depth)
    try:
        buf = mmap.mmap(-1, rows * a.page_bytes)
        pool = np.frombuffer(buf, dtype=np.uint8).reshape(rows, a.page_bytes)
        store.register(pool)
        for b in range(0, a.get_pages, a.batch):
            idx = list(range(b, min(b + a.batch, a.get_pages)))
            for r, i in enumerate(idx):
                pool[r] = page_bytes_of(i, a.page_bytes)
            ok = store.put([f"g-{i}" for i in idx], list(range(len(idx)))).result()
            if not all(ok):
                raise SystemExit("prefill: a put failed")
        pool[a.batch :] = np.random.default_rng(7).integers(0, 256, (rows - a.batch, a.page_bytes), dtype=np.uint8)

        rounds: list[dict] = []
        rng = random.Random(1)
        for rnd in range(a.rounds):
            out: dict = {}
            order = PHASES[rnd % 3 :] + PHASES[: rnd % 3]
            for phase in order:
                if phase == "gets alone":
                    lat, _ = run_gets(store, pool, a, rng)
                    out["alone"] = {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99), "n": len(lat)}
                    continue
                with Putters(store, pool, a.batch, a, f"r{rnd}") as p:
                    time.sleep(min(0.5, a.seconds / 4))  # the puts reach their pace
                    b0, t0 = p.bytes_now(), time.perf_counter()
                    if phase == "gets+puts":
                        lat, _ = run_gets(store, pool, a, rng)
                    else:
                        time.sleep(a.seconds)
                    put_gibs = (p.bytes_now() - b0) / (time.perf_counter() - t0) / GIB
                if p.failed:
                    raise SystemExit(f"{phase}: {p.failed} puts failed")
                if phase == "gets+puts":
                    out["under"] = {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99), "n": len(lat)}
                    out["under"]["put_gibs"] = put_gibs
                else:
                    out["puts_alone_gibs"] = put_gibs
            out["ratio_p95"] = out["under"]["p95"] / out["alone"]["p95"]
            rounds.append(out)
            print(
                f"round {rnd}: alone p50/p95/p99 {out['alone']['p50']:.2f}/{out['alone']['p95']:.2f}/"
                f"{out['alone']['p99']:.2f} ms; under puts {out['under']['p50']:.2f}/{out['under']['p95']:.2f}/"
                f"{out['under']['p99']:.2f} ms (puts {out['under']['put_gibs']:.2f} GiB/s); "
                f"puts alone {out['puts_alone_gibs']:.2f} GiB/s; p95 ratio {out['ratio_p95']:.2f}",
                flush=True,
            )
    finally:
        store.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if made:
            shutil.rmtree(folders[0], ignore_errors=True)

    def med(f) -> float:
        return statistics.median(f(r) for r in rounds)

    summary = {
        "alone": {q: med(lambda r, q=q: r["alone"][q]) for q in ("p50", "p95", "p99")},
        "under": {q: med(lambda r, q=q: r["under"][q]) for q in ("p50", "p95", "p99", "put_gibs")},
        "puts_alone_gibs": med(lambda r: r["puts_alone_gibs"]),
        "ratio_p95": med(lambda r: r["ratio_p95"]),
    }
    print("| | p50 ms | p95 ms | p99 ms | puts GiB/s |\n|---|---|---|---|---|")
    s = summary
    print(f"| gets alone | {s['alone']['p50']:.2f} | {s['alone']['p95']:.2f} | {s['alone']['p99']:.2f} | |")
    print(
        f"| gets under {a.put_threads} put threads | {s['under']['p50']:.2f} | {s['under']['p95']:.2f} | "
        f"{s['under']['p99']:.2f} | {s['under']['put_gibs']:.2f} |"
    )
    print(f"| puts alone | | | | {s['puts_alone_gibs']:.2f} |")
    print(f"p95 under puts / p95 alone: {s['ratio_p95']:.2f} (medians of {a.rounds} rounds)")
    if a.json:
        print(json.dumps({"config": vars(a) | {"folders": folders}, "summary": summary, "rounds": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
