"""A member of a group of a shared deepio.kv store, for test_kv_group.py and
bench/kv_group_load.py: opens deepio.kv.Store(..., shared=True, group=(name, rank, size)) and
obeys JSON commands, one a line on stdin, answering each with one JSON line on stdout.

argv: folders (joined by ","), page_bytes, capacity_bytes, name, rank, size ("-" for name:
no group). The first line out is {"role": "owner" | "client", "pid": ...}. Commands:

- get with "keys" (and "slots": pool rows, default 0..n-1): answers "ok" (pages found),
  "bad" (keys found whose bytes differ from page_of(key): must never happen), "seconds";
- put with "keys": page bytes are page_of(key); answers "ok";
- stats: the store's stats; exit.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib

import numpy as np

import deepio.kv


def page_of(key: str, page_bytes: int) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(key.encode())).integers(0, 256, page_bytes, dtype=np.uint8)


def main() -> None:
    folders, page_bytes, capacity = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    name, rank, size = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    group = None if name == "-" else (name, rank, size)
    store = deepio.kv.Store(folders, capacity, page_bytes, shared=True, group=group, checkpoint_interval=0)
    rows = int(os.environ.get("KV_GROUP_ROWS", "256"))
    pool = np.zeros((rows, page_bytes), np.uint8)
    store.register(pool)

    def say(obj: object) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"role": "owner" if store.is_owner else "client", "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        op, keys = cmd["op"], cmd.get("keys", [])
        if op == "get":
            slots = cmd.get("slots", list(range(len(keys))))
            pool[slots] = 0
            t0 = time.monotonic()
            ok = store.get(keys, slots).result(timeout=120)
            dt = time.monotonic() - t0
            bad = []
            if cmd.get("check", True):
                bad = [k for k, s, o in zip(keys, slots, ok) if o and not (pool[s] == page_of(k, page_bytes)).all()]
            say({"ok": sum(ok), "bad": bad, "seconds": dt})
        elif op == "put":
            for i, k in enumerate(keys):
                pool[i] = page_of(k, page_bytes)
            say({"ok": sum(store.put(keys, range(len(keys))).result(timeout=120))})
        elif op == "stats":
            say(store.stats())
        elif op == "exit":
            break
    store.close()


if __name__ == "__main__":
    main()
