"""A process of test_kv_shared_crash.py: opens deepio.kv.Store(..., shared=True) and puts,
gets, removes and checkpoints at random until a stop file appears, logging every call to its
own file (one JSON line per record, each written with one O_APPEND write before the next call:
a SIGKILL cannot lose a record written, nor tear one but the last).

argv: folders (joined by ","), page_bytes, capacity_bytes, log path, writer id, seed, workers,
stop file. Keys: its own "p<id>-<n>" (put once, some replaced by this writer, some removed) and
"s<j>" (put by every writer). A page names its key, writer and version in its first bytes and
is page_of(key, writer, version): a get checks the bytes it got against the page they name.

Records: {"op": "open", "role"}; {"op": "role", "role", "t"} when it took the store over;
{"op": "put", "t0", "items": [[key, version], ...]} before a put and {"op": "putdone", "t1",
"ok": [...]} after; {"op": "rm", "t0", "keys"} and {"op": "rmdone", "t1", "n"} (or "rmerr");
{"op": "get", "t0", "t1", "got": [[key, writer, version] or [key, null, null] (a miss)],
"bad": [[key, why]]}; {"op": "stopped"} at the stop file, after which it waits for a line (or
EOF) on stdin and closes the store. Times are time.monotonic(), one clock for every process of
the host.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import zlib

import numpy as np

import deepio.kv
import deepio.kv._shared

HEAD = 64  # bytes of "key|writer|version|" at the start of a page
SHARED_KEYS = 12


def page_of(key: str, writer: int, version: int, page_bytes: int) -> np.ndarray:
    name = f"{key}|{writer}|{version}|".encode()
    body = np.random.default_rng(zlib.crc32(name)).integers(0, 256, page_bytes, dtype=np.uint8)
    body[:HEAD] = 0
    body[: len(name)] = np.frombuffer(name, np.uint8)
    return body


def named(page: np.ndarray) -> tuple[str, int, int] | None:
    """The (key, writer, version) a page's first bytes name, or None."""
    try:
        key, writer, version, _ = bytes(page[:HEAD]).split(b"|", 3)
        return key.decode(), int(writer), int(version)
    except (ValueError, UnicodeDecodeError):
        return None


def main() -> None:
    folders, page_bytes, capacity = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    log_path, me, seed, workers, stop = sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(**rec: object) -> None:
        os.write(fd, (json.dumps(rec) + "\n").encode())

    if rng.random() < 0.3:  # a staging of 4 pages: batches go in pieces (the client's queue)
        deepio.kv._shared.STAGING_BYTES = 4 * page_bytes
    store = deepio.kv.Store(
        folders,
        capacity,
        page_bytes,
        shared=True,
        checkpoint_interval=rng.choice([0, 0, 0.05]),
        batch_threads=2,
    )
    pool = np.zeros((16, page_bytes), np.uint8)  # rows 0-7 for puts, 8-15 for gets
    store.register(pool)
    log(op="open", role="owner" if store.is_owner else "client", pid=os.getpid())
    version = 0  # one counter for every page this writer puts: (writer, version) names a put
    mine: list[str] = []  # own keys put so far (not removed)
    gone: list[str] = []  # own keys removed
    n_own = 0

    def put_keys() -> list[str]:
        nonlocal n_own
        keys: list[str] = []
        for _ in range(rng.randint(1, 8)):
            c = rng.random()
            if c < 0.6 or not mine:
                keys.append(f"p{me}-{n_own}")
                n_own += 1
            elif c < 0.7 or (c < 0.75 and not gone):
                keys.append(rng.choice(mine))
            elif c < 0.75:
                keys.append(rng.choice(gone))  # put again after its removal
            else:
                keys.append(f"s{rng.randrange(SHARED_KEYS)}")
        return list(dict.fromkeys(keys))

    def get() -> None:
        keys = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.3:
                keys.append(f"s{rng.randrange(SHARED_KEYS)}")
            else:
                w = rng.randrange(workers)
                keys.append(f"p{w}-{rng.randrange(max(n_own, 8) + 4)}")
        keys = list(dict.fromkeys(keys))
        pool[8 : 8 + len(keys)] = 0
        t0 = time.monotonic()
        ok = store.get(keys, range(8, 8 + len(keys))).result(timeout=120)
        t1 = time.monotonic()
        got, bad = [], []
        for i, k in enumerate(keys):
            page = pool[8 + i]
            if not ok[i]:
                got.append([k, None, None])
                continue
            name = named(page)
            if name is None or name[0] != k:
                bad.append([k, f"names {name}"])
            elif not (page == page_of(k, name[1], name[2], page_bytes)).all():
                bad.append([k, f"bytes differ from {name}'s page"])
            else:
                got.append([k, name[1], name[2]])
        log(op="get", t0=t0, t1=t1, got=got, bad=bad)

    owner = store.is_owner
    while not os.path.exists(stop):
        if store.is_owner != owner:  # took the store over (its owner died)
            owner = store.is_owner
            log(op="role", role="owner" if owner else "client", t=time.monotonic())
        r = rng.random()
        if r < 0.45:  # a put: new own keys, replaced or removed own keys, shared keys
            keys = put_keys()
            items = []
            for i, k in enumerate(keys):
                version += 1
                pool[i] = page_of(k, me, version, page_bytes)
                items.append([k, version])
            log(op="put", t0=time.monotonic(), items=items)
            fut = store.put(keys, range(len(keys)))
            if rng.random() < 0.3:
                get()  # while the put is in flight
            ok = fut.result(timeout=120)
            log(op="putdone", t1=time.monotonic(), ok=ok)
            mine += [k for k in keys if k.startswith("p") and k not in mine]
            gone = [k for k in gone if k not in keys]
        elif r < 0.5 and mine:  # a remove of own keys
            keys = list(dict.fromkeys(rng.choice(mine) for _ in range(rng.randint(1, 2))))
            log(op="rm", t0=time.monotonic(), keys=keys)
            try:
                n = store.remove(keys)
            except (ConnectionError, OSError) as e:  # the owner died under the call, and its retry
                log(op="rmerr", t1=time.monotonic(), error=str(e))
            else:
                log(op="rmdone", t1=time.monotonic(), n=n)
            mine = [k for k in mine if k not in keys]
            gone += keys
        elif r < 0.52:
            try:
                store.checkpoint()
            except (ConnectionError, OSError):
                pass
        else:  # a get of anyone's keys
            get()
    log(op="stopped", role="owner" if store.is_owner else "client")
    sys.stdin.readline()
    store.close()
    log(op="closed")


if __name__ == "__main__":
    main()
