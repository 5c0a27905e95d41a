#!/usr/bin/env python3
"""deepio.kv.sglang through SGLang's cache-controller page functions, round after round, over
one host-pool layout: a small program to compare two builds of deepio (run it with each
build's Python, alternating), e.g. how a change moves `page_first` or `layer_first` pages.

A CPU host pool of --layout (32 layers x 16 tokens, heads x head_dim chosen so that a page is
--page-bytes; bench/kv_bench.py's sglang_pool), deepio's HiCache backend over the --folder(s)
(default the RAM-backed drives of bench/ram_drives.sh), --pages pages put then got back in
batches of --batch per round (bench/kv_bench.py's run_sglang, which checks the bytes), --rounds
rounds; the first is a warm-up. Prints the medians of the other rounds' GiB/s per phase. Needs
SGLang (scripts/setup-kv-engines.sh).

Usage: python3 bench/sglang_rounds.py --layout layer_first [--page-bytes 65536] [--pages 2048]
                                      [--batch 128] [--rounds 4] [--folder DIR ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import drive_folders  # noqa: E402
from kv_bench import activate_engines, deepio_sglang_backend, run_sglang, sglang_pool  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", choices=("page_first", "layer_first"), default="page_first")
    ap.add_argument("--page-bytes", type=int, default=65536)
    ap.add_argument("--pages", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--folder", action="append", default=[], help="a folder per drive (repeat)")
    a = ap.parse_args()
    bases = drive_folders(a.folder)
    if a.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (the first is a warm-up)")
    activate_engines()
    pool, _ = sglang_pool(a.page_bytes, a.batch, a.layout)
    dirs = [os.path.join(f, "sglang-rounds") for f in bases]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    backend = deepio_sglang_backend(dirs, int(a.pages * (a.page_bytes + 4096) * 1.3), pool, a.layout == "page_first")
    gib_s: dict[str, list[float]] = {}
    try:
        for r in range(a.rounds):
            got = run_sglang("deepio-sglang", backend, pool, a.pages, a.batch, f"r{r}")
            if r == 0:
                continue
            for s in got:
                gib_s.setdefault(s["phase"], []).append(s["bytes"] / s["seconds"] / 2**30)
        medians = {k: round(statistics.median(v), 2) for k, v in gib_s.items()}
        print(f"{a.layout} {a.page_bytes}: GiB/s {medians}", flush=True)
    finally:
        backend.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
