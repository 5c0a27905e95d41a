#!/usr/bin/env python3
"""deepio.kv puts and gets of two (or more) deepio builds beside fio, interleaved in one run:
a before/after of the store's cost per page on fast drives (issue 46).

Each build is a Python with its own deepio installed (a venv per build); --py NAME=PYTHON names
one. Per page size (--sizes) and round (--rounds), each tool runs once, the order rotating from
round to round, the page cache dropped before each (root):
  fio randread / randwrite   fio --ioengine=io_uring --direct=1 --iodepth=32 per drive,
                             --fixedbufs --registerfiles (as bench/fast_drives.py), randwrite
                             with --fdatasync=128, over one --bytes/drives file per drive
  NAME put / get             a fresh process of that Python: a deepio.kv.Store over a folder per
                             drive (defaults but capacity), a pool of one batch registered;
                             --bytes of pages put in batches of 128 pages per drive (durable:
                             each drive syncs once per 128 pages, as fio), then got back
                             cold, each call's .result() waited for (bench/kv_bench.py's
                             pattern); an untimed warm-up batch first; the last batch's bytes
                             checked. CPU seconds per GiB: the process's, every thread.
Reported per size and tool: medians of GiB/s (range over rounds) and CPU s/GiB, and the
ratio to fio's median (gets to randread, puts to randwrite). The last line holds every sample
as JSON.

Usage: sudo python3 bench/kv_before_after.py --folder /mnt/d0 --folder /mnt/d1 \
           --py old=/venv-old/bin/python --py new=/venv-new/bin/python [--sizes 64K,256K,2M]
           [--rounds 3] [--bytes 512M]
"""

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def worker(bs, total, folders, batch=128):
    import numpy as np

    import deepio
    import deepio.kv
    from benchutil import cpu_seconds, drop_caches

    pages = total // bs
    rid = uuid.uuid4().hex[:6]
    dirs = [f"{f}/kv-before-after-{rid}" for f in folders]
    st = deepio.kv.Store(dirs, capacity_bytes=int(pages * bs * 1.2), page_bytes=bs)
    buf = mmap.mmap(-1, batch * bs)
    pool = np.frombuffer(buf, np.uint8).reshape(batch, bs)
    pool[:] = np.random.default_rng(1).integers(0, 256, bs, dtype=np.uint8)
    st.register(pool)
    slots = list(range(batch))
    out = {}
    try:
        for tag in ("warm", "run"):
            keys = [f"{tag}{i}" for i in range(pages if tag == "run" else batch)]
            for phase, call in (("put", st.put), ("get", st.get)):
                if phase == "get":
                    drop_caches()
                    pool[:, :8] = 0
                c0, t0 = cpu_seconds(), time.perf_counter()
                for b in range(0, len(keys), batch):
                    ks = keys[b : b + batch]
                    if phase == "put":
                        pool[: len(ks), :8] = np.arange(b, b + len(ks), dtype=np.uint64).view(np.uint8).reshape(-1, 8)
                    ok = call(ks, slots[: len(ks)]).result()
                    if not all(ok):
                        raise SystemExit(f"{phase}: {ok.count(False)} failed")
                t = time.perf_counter() - t0
                c = cpu_seconds() - c0
                out[phase] = {"gib_s": len(keys) * bs / t / 2**30, "cpu": c / (len(keys) * bs / 2**30)}
            last = pool[:batch, :8].copy().view(np.uint64).reshape(-1).tolist()
            assert last == list(range(len(keys) - batch, len(keys))), "wrong bytes"
        out["io_ops"] = st.stats().get("io_ops")
    finally:
        st.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(out))


def size_arg(s):
    u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * u[s[-1]] if s[-1] in u else int(s)


def main():
    if sys.argv[1:2] == ["--worker"]:
        folders = sys.argv[4:]
        # 128 pages per drive a batch: each drive syncs once per 128 pages, as fio's
        # --fdatasync=128 per job (bench/fast_drives.py does the same).
        return worker(int(sys.argv[2]), int(sys.argv[3]), folders, batch=128 * len(folders))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64K,256K,2M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bytes", type=size_arg, default=1 << 30, help="per tool run, both drives")
    ap.add_argument("--folder", action="append", default=[], help="a folder per drive (repeat)")
    ap.add_argument("--py", action="append", default=[], help="name=python")
    ap.add_argument("--no-fio", action="store_true")
    a = ap.parse_args()
    folders = a.folder or ["/mnt/ramdrive0", "/mnt/ramdrive1"]
    pys = dict(p.split("=", 1) for p in a.py)
    from benchutil import drop_caches
    from kv_bench import run_fio

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    res = []
    per = a.bytes // len(folders)
    files = [f"{f}/kv-before-after-fio.bin" for f in folders]
    for f in files:
        subprocess.run(
            ["fio", "--name=l", "--rw=write", "--bs=1M", f"--size={per}", "--direct=1", f"--filename={f}"],
            check=True,
            capture_output=True,
        )
    try:
        for bs in map(size_arg, a.sizes.split(",")):
            tools = ([] if a.no_fio else ["fio randread", "fio randwrite"]) + list(pys)
            for r in range(a.rounds):
                for t in tools[r % len(tools) :] + tools[: r % len(tools)]:
                    drop_caches()
                    if t.startswith("fio"):
                        s = run_fio(files, per, bs, 32, 128, t.split()[1], ("--fixedbufs", "--registerfiles"))
                        gib = s["bytes"] / 2**30
                        res.append(
                            {
                                "bs": bs,
                                "tool": t,
                                "round": r,
                                "gib_s": gib / s["seconds"],
                                "cpu": s["cpu_seconds"] / gib,
                            }
                        )
                    else:
                        o = subprocess.run(
                            [pys[t], __file__, "--worker", str(bs), str(a.bytes), *folders],
                            check=True,
                            capture_output=True,
                            text=True,
                            env=env,
                        ).stdout
                        o = json.loads(o.strip().splitlines()[-1])
                        for ph in ("put", "get"):
                            res.append({"bs": bs, "tool": f"{t} {ph}", "round": r, **o[ph], "io_ops": o.get("io_ops")})
                    print(json.dumps(res[-1]), flush=True)
    finally:
        for f in files:
            os.unlink(f)
    print("\nbs tool: median GiB/s [min-max] cpu s/GiB (ratio to fio)")
    for bs in dict.fromkeys(x["bs"] for x in res):
        med = {}
        for t in dict.fromkeys(x["tool"] for x in res if x["bs"] == bs):
            ss = [x for x in res if x["bs"] == bs and x["tool"] == t]
            g = [x["gib_s"] for x in ss]
            med[t] = statistics.median(g)
            base = med.get("fio randwrite" if t.endswith("put") else "fio randread")
            ratio = f" ({med[t] / base:.2f}x)" if base and not t.startswith("fio") else ""
            cpu = statistics.median(x["cpu"] for x in ss)
            print(f"{bs >> 10}K {t:<14} {med[t]:6.2f} [{min(g):.2f}-{max(g):.2f}] {cpu:.3f}{ratio}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
