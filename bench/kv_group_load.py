"""N ranks loading the same P pages from one shared deepio.kv store (issue 48 item 4; docs/kv-sharing.md
"Groups"): bytes read from the drives and the time until every rank holds every page.

This process owns the store (it is no rank): it puts P pages of page_bytes, drops them from the
page cache (fsync + POSIX_FADV_DONTNEED on the store's files), and for each N and each way
starts N rank processes (clients; their pools touched before), tells them all to go, and takes
the time from "go" until the last rank holds every page (each rank's own CLOCK_MONOTONIC end)
and the sectors read from the folders' devices over that time (/proc/diskstats). Ways:

- group: each rank opens the store with group=("load", rank, N) and gets all P pages;
- each: each rank gets all P pages itself (shared store, no group): N x the bytes;
- one+copy: rank 0 gets all P pages, copies them into a node-shared region (a /dev/shm file),
  then the other ranks copy them from there into their pools (Dynamo-style "one loads, the
  others receive", in shared memory instead of NCCL).

Rounds interleave the ways (N = 1 once: the three are the same there); prints each case's
median over the rounds, and each round.

    python bench/kv_group_load.py /mnt/group0/kv /mnt/group1/kv [--pages 128] [--page-mib 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import deepio.kv

SHM = "/dev/shm/deepio-kv-group-load"


def devices(folders: list[str]) -> set[tuple[int, int]]:
    return {(os.major(os.stat(f).st_dev), os.minor(os.stat(f).st_dev)) for f in folders}


def sectors_read(devs: set[tuple[int, int]]) -> int:
    n = 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) in devs:
                n += int(fields[5])
    return n


def drop_cache(folders: list[str]) -> None:
    for folder in folders:
        for root, _, files in os.walk(folder):
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def rank_main(folders: list[str], page: int, pages: int, way: str, rank: int, n: int) -> None:
    group = ("load", rank, n) if way == "group" else None
    store = deepio.kv.Store(folders, 0, page, shared=True, group=group)
    pool = np.ones((pages, page), np.uint8)  # touched: no page faults while timing
    store.register(pool)
    keys = [f"page{i}" for i in range(pages)]
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "get":
            ok = sum(store.get(keys, range(pages)).result())
            if cmd.get("publish"):
                with open(SHM, "r+b") as f, mmap.mmap(f.fileno(), pages * page) as m:
                    np.frombuffer(m, np.uint8).reshape(pages, page)[:] = pool
            print(json.dumps({"ok": ok, "end": time.monotonic()}), flush=True)
        elif cmd["op"] == "copy":
            with open(SHM, "rb") as f, mmap.mmap(f.fileno(), pages * page, prot=mmap.PROT_READ) as m:
                pool[:] = np.frombuffer(m, np.uint8).reshape(pages, page)
            print(json.dumps({"ok": pages, "end": time.monotonic()}), flush=True)
        else:
            break
    store.close()


class Rank:
    def __init__(self, args: argparse.Namespace, way: str, rank: int, n: int) -> None:
        argv = [sys.executable, __file__, *args.folders, "--pages", str(args.pages), "--page-mib", str(args.page_mib)]
        argv += ["--rank", f"{way},{rank},{n}"]
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, op: str, **kw: object) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.p.stdin.flush()

    def answer(self) -> dict:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        assert line, f"rank {self.p.pid} ended (rc {self.p.wait()})"
        return json.loads(line)

    def stop(self) -> None:
        self.ask("exit")
        self.p.wait(60)


def load(args: argparse.Namespace, store: deepio.kv.Store, way: str, n: int) -> tuple[float, float]:
    """(seconds until every rank holds every page, bytes read from the drives / pages' bytes)."""
    ranks = [Rank(args, way, r, n) for r in range(n)]
    try:
        for r in ranks:
            r.answer()
        drop_cache(args.folders)
        total = args.pages * args.page_bytes
        devs = devices(args.folders)
        s0 = sectors_read(devs)
        t0 = time.monotonic()
        if way == "one+copy":
            with open(SHM, "wb") as f:
                f.truncate(total)
            ranks[0].ask("get", publish=n > 1)
            first = ranks[0].answer()
            assert first["ok"] == args.pages, first
            for r in ranks[1:]:
                r.ask("copy")
            ends = [first["end"]] + [r.answer()["end"] for r in ranks[1:]]
        else:
            for r in ranks:
                r.ask("get")
            got = [r.answer() for r in ranks]
            assert all(g["ok"] == args.pages for g in got), got
            ends = [g["end"] for g in got]
        seconds = max(ends) - t0
        read = (sectors_read(devs) - s0) * 512 / total
    finally:
        for r in ranks:
            r.stop()
        if os.path.exists(SHM):
            os.unlink(SHM)
    return seconds, read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page-mib", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.page_bytes = int(args.page_mib * (1 << 20))
    if args.rank:
        way, rank, n = args.rank.split(",")
        rank_main(args.folders, args.page_bytes, args.pages, way, int(rank), int(n))
        return
    total = args.pages * args.page_bytes
    store = deepio.kv.Store(args.folders, 2 * total + (64 << 20), args.page_bytes, shared=True)
    assert store.is_owner
    pool = np.zeros((args.pages, args.page_bytes), np.uint8)
    store.register(pool)
    rng = np.random.default_rng(1)
    pool[:] = rng.integers(0, 256, pool.shape, dtype=np.uint8)
    keys = [f"page{i}" for i in range(args.pages)]
    assert all(store.put(keys, range(args.pages)).result())
    store.checkpoint()
    del pool
    ways = ("group", "each", "one+copy")
    cases = [(1, "group")] + [(n, w) for n in map(int, args.ranks.split(",")) if n > 1 for w in ways]
    results: dict[tuple[int, str], list[tuple[float, float]]] = {c: [] for c in cases}
    print(f"{args.pages} pages x {args.page_bytes >> 10} KiB = {total / (1 << 20):.0f} MiB; folders {args.folders}")
    for rnd in range(args.rounds):
        for n, way in cases:
            s, r = load(args, store, way, n)
            results[(n, way)].append((s, r))
            rate = total / s / (1 << 30)
            print(f"round {rnd}: N={n} {way:9s} {s:7.3f} s  read {r:5.2f}x  {rate:6.2f} GiB/s", flush=True)
    print("\nmedians (N, way, seconds until every rank holds every page, drive bytes / pages' bytes, rounds' seconds)")
    for n, way in cases:
        ss = [s for s, _ in results[(n, way)]]
        rr = [r for _, r in results[(n, way)]]
        each = " ".join(f"{s:.3f}" for s in ss)
        print(f"N={n} {way:9s} {statistics.median(ss):7.3f} s  read {statistics.median(rr):5.2f}x  ({each})")
    st = store.stats()
    print(f"owner: group_pages_read {st['group_pages_read']}, group_pages_shared {st['group_pages_shared']}")
    store.close()


if __name__ == "__main__":
    main()
