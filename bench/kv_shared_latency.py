"""deepio.kv.Store(shared=True): a get in the owner process against the same get through a
client process (docs/kv-sharing.md, "Sharing a store between processes").

This process owns a store per page size and puts 64 pages; a child process opens the same
folder as a client. Rounds alternate (owner, client, owner, ...); each round is the median of
N gets of `batch` pages (1 and 32), every result checked outside the timed call. Prints the
median over the rounds and each round's median, in µs.

    python bench/kv_shared_latency.py /mnt/nvme0/kvshared [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

import deepio.kv

PAGES = [65536, 2 << 20]


def measure(store: deepio.kv.Store, n: int, keys: list[str], batch: int) -> float:
    times = []
    for i in range(n):
        k = [keys[(i * batch + j) % len(keys)] for j in range(batch)]
        t = time.perf_counter()
        ok = store.get(k, range(batch)).result()
        times.append(time.perf_counter() - t)
        assert all(ok), "a get missed"
    return statistics.median(times) * 1e6


def client(folder: str, page: int) -> None:
    store = deepio.kv.Store([folder], 0, page, shared=True)
    assert not store.is_owner
    store.register(np.zeros((32, page), np.uint8))
    keys = [f"k{i}" for i in range(64)]
    for line in sys.stdin:
        n, batch = map(int, line.split())
        print(measure(store, n, keys, batch), flush=True)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--client", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        return client(f"{a.folder}/p{a.client}", a.client)
    print(
        f"deepio {deepio.__version__}; folder {a.folder}; rounds {a.rounds}; owner vs client, one page get = median µs"
    )
    for page in PAGES:
        folder = f"{a.folder}/p{page}"
        store = deepio.kv.Store([folder], 256 * (page + 4096), page, shared=True, checkpoint_interval=0)
        pool = np.random.default_rng(0).integers(0, 256, (32, page), dtype=np.uint8)
        store.register(pool)
        keys = [f"k{i}" for i in range(64)]
        for i in range(0, 64, 32):
            assert all(store.put(keys[i : i + 32], range(32)).result())
        child = subprocess.Popen(
            [sys.executable, __file__, a.folder, "--client", str(page)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        for batch in (1, 32):
            n = 200 if page < (1 << 20) or batch == 1 else 30
            own, cli = [], []
            for _ in range(a.rounds):
                own.append(measure(store, n, keys, batch))
                child.stdin.write(f"{n} {batch}\n")
                child.stdin.flush()
                cli.append(float(child.stdout.readline()))
            rounds = f"rounds: owner {[round(x) for x in own]}, client {[round(x) for x in cli]}"
            print(
                f"page {page >> 10} KiB x{batch}: owner {statistics.median(own):.0f} us, "
                f"client {statistics.median(cli):.0f} us ({rounds})"
            )
        child.stdin.close()
        child.wait()
        store.close()


if __name__ == "__main__":
    main()
