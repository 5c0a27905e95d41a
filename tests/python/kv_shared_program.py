"""A process of test_kv_shared.py: opens deepio.kv.Store(..., shared=True) and obeys JSON
commands, one a line on stdin, answering each with one JSON line on stdout.

argv: folders (joined by ","), page_bytes, capacity_bytes, fingerprint. The first line out is
{"role": "owner" | "client", "pid": ...}. Commands ({"op": ...}):

- put/get/contains/remove/stats with "keys": page bytes are page_of(key); a get answers "ok"
  and "bad" (keys found whose bytes differ: must never happen);
- fork: forks a child that sleeps a minute (answers {"child": pid});
- stream_puts with "prefix" and "batch": puts batches of keys prefix0, prefix1, ... for ever,
  printing {"done": [keys]} after each batch's True pages (the test kills the process).
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import numpy as np

import deepio.kv


def page_of(key: str, page_bytes: int) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(key.encode())).integers(0, 256, page_bytes, dtype=np.uint8)


def main() -> None:
    folders, page_bytes, capacity, fingerprint = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = deepio.kv.Store(
        folders, capacity, page_bytes, shared=True, fingerprint=fingerprint, checkpoint_interval=0, batch_threads=2
    )
    pool = np.zeros((256, page_bytes), np.uint8)
    store.register(pool)
    out = sys.stdout

    def say(obj: object) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    say({"role": "owner" if store.is_owner else "client", "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        op, keys = cmd["op"], cmd.get("keys", [])
        if op == "put":
            for i, k in enumerate(keys):
                pool[i] = page_of(k, page_bytes)
            say({"ok": store.put(keys, range(len(keys))).result(timeout=60)})
        elif op == "get":
            pool[: len(keys)] = 0
            ok = store.get(keys, range(len(keys))).result(timeout=60)
            bad = [k for i, k in enumerate(keys) if ok[i] and not (pool[i] == page_of(k, page_bytes)).all()]
            say({"ok": ok, "bad": bad})
        elif op == "contains":
            say({"ok": store.contains(keys)})
        elif op == "remove":
            say({"n": store.remove(keys)})
        elif op == "stats":
            say(store.stats())
        elif op == "stream_puts":
            n, batch = 0, cmd["batch"]
            while True:
                ks = [f"{cmd['prefix']}{n + i}" for i in range(batch)]
                for i, k in enumerate(ks):
                    pool[i] = page_of(k, page_bytes)
                ok = store.put(ks, range(batch)).result(timeout=60)
                say({"done": [k for k, good in zip(ks, ok) if good]})
                n += batch
        elif op == "fork":  # a child that keeps whatever descriptors it inherited for a minute
            pid = os.fork()
            if pid == 0:
                import time

                time.sleep(60)
                os._exit(0)
            say({"child": pid})
        elif op == "close":
            store.close()
            say({"closed": True})
        elif op == "exit":
            return


if __name__ == "__main__":
    main()
