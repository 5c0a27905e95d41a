"""deepio.kv.Store: reopen after a crash (checkpoint + journal) and CRC-32C speed.

A child process makes a store of --capacity-pages slots, puts --checkpoint-after pages and
checkpoints, puts --pages more and dies (os._exit, no close: those pages are in no checkpoint,
only in the slot journal; --clean closes instead). This process then times Store(...) (its
stats' open_seconds: checkpoint read, journal read, the header and page of each slot the
journal lists since the checkpoint read and verified, index rebuilt) and checks, outside the
timed region, that every page came back and a sample reads whole. --drop-caches (root) drops
the page cache first, so that the open reads the drive. Also times the store's CRC-32C.

    python bench/kv_reopen.py --folder /mnt/nvme0/kvbench --pages 100000 --page-bytes 4096
    python bench/kv_reopen.py --folder /var/tmp/kvbench --capacity-pages 2000000 \
        --checkpoint-after 100000 --pages 100000 --drop-caches
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np

import deepio
import deepio.kv

_WRITER = textwrap.dedent(
    """
    import os, sys, numpy as np, deepio.kv
    folder, clean = sys.argv[1], sys.argv[5] == "1"
    pages, page, batch = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    capacity, before = int(sys.argv[6]), int(sys.argv[7])
    store = deepio.kv.Store([folder], capacity_bytes=capacity * (4096 + -(-page // 4096) * 4096),
                            page_bytes=page, checkpoint_interval=0)
    pool = np.random.default_rng(1).integers(0, 256, (batch, page), dtype=np.uint8)
    store.register(pool)
    def put(first, count):
        for b in range(first, first + count, batch):
            n = min(batch, first + count - b)
            ok = store.put([f"page-{b + i}" for i in range(n)], range(n)).result()
            assert all(ok)
    put(0, before)
    if before:
        store.checkpoint()
    put(before, pages)
    if clean:
        store.close()
    os._exit(0)  # a crash: no close, no checkpoint
    """
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", required=True, help="a fresh folder on the drive (removed first)")
    ap.add_argument("--pages", type=int, default=100_000, help="pages put after the checkpoint")
    ap.add_argument("--checkpoint-after", type=int, default=0, help="pages put (and checkpointed) first")
    ap.add_argument("--capacity-pages", type=int, default=0, help="slots of the store (default 1.25 x all pages)")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before the open (root)")
    ap.add_argument("--page-bytes", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--clean", action="store_true", help="close the writer (checkpoint) instead of crashing")
    ap.add_argument("--crc-mib", type=int, default=256, help="buffer size for the CRC-32C timing")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    total = a.checkpoint_after + a.pages
    capacity = a.capacity_pages or int(total * 1.25)

    caps = deepio._deepio.capabilities()
    probe = deepio._deepio.probe_direct_io(os.path.dirname(os.path.abspath(a.folder)) or ".")
    config = {
        "pages": a.pages,
        "checkpoint_after": a.checkpoint_after,
        "capacity_pages": capacity,
        "page_bytes": a.page_bytes,
        "batch": a.batch,
        "crash": not a.clean,
        "drop_caches": a.drop_caches,
        "folder": a.folder,
        "filesystem": probe["filesystem"],
        "direct_io": probe["supported"],
        "backend": caps["auto_backend"],
    }
    print("config:", json.dumps(config), flush=True)

    shutil.rmtree(a.folder, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            _WRITER,
            a.folder,
            str(a.pages),
            str(a.page_bytes),
            str(a.batch),
            "1" if a.clean else "0",
            str(capacity),
            str(a.checkpoint_after),
        ],
        check=True,
    )
    write_s = time.perf_counter() - t
    if a.drop_caches:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")

    t = time.perf_counter()
    store = deepio.kv.Store([a.folder], page_bytes=a.page_bytes)  # the layout is on disk
    wall_open = time.perf_counter() - t
    s = store.stats()
    # Verification, outside the timed region.
    sample = list(range(0, total, max(1, total // 256)))[:256]
    pool = np.zeros((len(sample), a.page_bytes), np.uint8)
    store.register(pool)
    ok = store.get([f"page-{i}" for i in sample], range(len(sample))).result()
    store.close()
    verified = s["recovered_pages"] == total and all(ok)

    buf = np.random.default_rng(2).integers(0, 256, a.crc_mib << 20, dtype=np.uint8)
    deepio.kv.crc32c(buf[: 1 << 20])
    t = time.perf_counter()
    reps = 4
    for _ in range(reps):
        deepio.kv.crc32c(buf)
    crc_gbs = reps * buf.nbytes / (time.perf_counter() - t) / 1e9

    result = {
        **config,
        "write_seconds": round(write_s, 3),
        "open_seconds": round(s["open_seconds"], 3),
        "open_wall_seconds": round(wall_open, 3),
        "recovered_pages": s["recovered_pages"],
        "open_headers_read": s["open_headers_read"],
        "open_pages_read": s["open_pages_read"],
        "verified": verified,
        "crc32c_gb_per_s_one_core": round(crc_gbs, 2),
    }
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    if not verified:
        sys.exit(1)


if __name__ == "__main__":
    main()
