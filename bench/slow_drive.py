#!/usr/bin/env python3
"""One slow drive must not stall another (issue 45): how long a 1 MiB read on a fast drive
takes while a slow drive's requests sit in the kernel.

Two drives: ext4 on two loop devices over files in /dev/shm; the slow one throttled by the
block layer to --rate-mib MiB/s for reads (cgroup v1 blkio.throttle.read_bps_device on the
root group, or the v2 io.max of this process's cgroup), so its requests are held in the kernel
for as long as the test wants. Every read goes through ``deepio.File.pread`` on one
``deepio.aio_handle`` made like the default engine (1 MiB blocks, queue depth 32, two
workers), with overlap_events on or off and each backend:

  A  one 8 MiB pread in flight on the slow drive, then a 1 MiB pread on the fast drive
  B  48 preads of 1 MiB queued on the slow drive, then the 1 MiB pread on the fast drive
  C  deepio.kv.Store over a folder on each drive (256 KiB pages, its own engine: defaults),
     a get of 16 pages of the slow folder in flight, then a get of 4 pages of the fast one
     (the fast read is then that get; once per run, not per backend: the store picks its
     engine's backend itself)
  D  the same store, the same slow get in flight, then a durable put of those 4 pages again
     (they stay on the fast folder: a key's folder is its hash's) — writes and fdatasync

The figure is the fast read's wall time (median of --runs; min and max beside it), with the
same read alone (no slow work) as the reference. After each timed read the throttle is lifted
so that the slow reads finish at once, and their bytes are checked; the slow drive's reads
are confirmed still pending when the fast one returned. Needs root.

  sudo python3 bench/slow_drive.py [--runs 5] [--backends io_uring,libaio,threads] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import deepio
import deepio.kv

MIB = 1 << 20
IMAGES = {"slow": "/dev/shm/deepio-slowbench-slow.img", "fast": "/dev/shm/deepio-slowbench-fast.img"}
MOUNTS = {"slow": Path("/mnt/deepio-slowbench-slow"), "fast": Path("/mnt/deepio-slowbench-fast")}
BLKIO_V1 = Path("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device")


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


class Throttle:
    """The read limit of one block device: cgroup v1 (root group) or this process's v2 io.max."""

    def __init__(self, majmin: str, bps: int) -> None:
        self.majmin, self.bps = majmin, bps
        if BLKIO_V1.exists():
            self.file, self.on, self.off = BLKIO_V1, f"{majmin} {bps}", f"{majmin} 0"
        else:
            rel = [ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")][0]
            mnt = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines() if ln.split()[2] == "cgroup2"]
            self.file = Path(mnt[0] + rel) / "io.max"
            self.on, self.off = f"{majmin} rbps={bps}", f"{majmin} rbps=max"
        self.kind = str(self.file)

    def set(self, on: bool) -> None:
        self.file.write_text((self.on if on else self.off) + "\n")


def setup(size_gib: int) -> tuple[dict[str, str], dict[str, Path]]:
    devs = {}
    for name, img in IMAGES.items():
        sh("truncate", "-s", f"{size_gib}G", img)
        dev = sh("losetup", "-f", "--show", img)
        sh("mkfs.ext4", "-q", "-F", dev)
        MOUNTS[name].mkdir(parents=True, exist_ok=True)
        sh("mount", dev, str(MOUNTS[name]))
        devs[name] = dev
    files = {"big": MOUNTS["slow"] / "big.bin", "many": MOUNTS["slow"] / "many.bin", "one": MOUNTS["fast"] / "one.bin"}
    for key, nbytes in (("big", 8 * MIB), ("many", 48 * MIB), ("one", MIB)):
        files[key].write_bytes(np.random.default_rng(len(key)).integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    os.sync()
    return devs, files


def teardown(devs: dict[str, str]) -> None:
    gc.collect()  # handles and files in reference cycles still hold descriptors on the drives
    for name, dev in devs.items():
        if subprocess.run(["umount", str(MOUNTS[name])], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(MOUNTS[name])], check=False)  # busy: detached when let go
        subprocess.run(["losetup", "-d", dev], check=False)
        if not os.path.ismount(MOUNTS[name]):
            MOUNTS[name].rmdir()
    for img in IMAGES.values():
        Path(img).unlink(missing_ok=True)


def uncache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def one_run(case: str, handle: deepio.aio_handle, files: dict[str, Path], throttle: Throttle) -> tuple[float, bool]:
    """The fast read's seconds while the slow drive holds `case`'s reads; whether they were all
    still pending when it returned."""
    for f in files.values():
        uncache(f)
    fast = deepio.File(files["one"], handle=handle)
    out = np.empty(MIB, dtype=np.uint8)
    if case == "A":
        slow = deepio.File(files["big"], handle=handle)
        bufs = [np.empty(8 * MIB, dtype=np.uint8)]
        offsets = [0]
    else:
        slow = deepio.File(files["many"], handle=handle)
        bufs = [np.empty(MIB, dtype=np.uint8) for _ in range(48)]
        offsets = [i * MIB for i in range(48)]
    throttle.set(True)
    try:
        futures = [slow.pread(b, o) for b, o in zip(bufs, offsets)]
        time.sleep(0.2)  # the slow reads reach the kernel (not timed)
        t0 = time.perf_counter()
        fast.pread(out).result()
        seconds = time.perf_counter() - t0
        pending = not any(f.done() for f in futures)
    finally:
        throttle.set(False)
    for f in futures:
        f.result()
    want = files["big" if case == "A" else "many"].read_bytes()
    got = b"".join(b.tobytes() for b in bufs)
    if got != want[: len(got)] or out.tobytes() != files["one"].read_bytes():
        raise SystemExit("slow_drive: bytes read differ from the files")
    slow.close()
    fast.close()
    return seconds, pending


KV_PAGE = 256 << 10


def kv_setup() -> tuple[deepio.kv.Store, np.ndarray, list[str], list[str]]:
    """A store over both drives with pages on each: the keys that landed on the slow folder
    and those on the fast one (told by each folder's `used` count after each put)."""
    folders = [str(MOUNTS["slow"] / "kv"), str(MOUNTS["fast"] / "kv")]
    store = deepio.kv.Store(folders, capacity_bytes=256 << 20, page_bytes=KV_PAGE, checkpoint_interval=0)
    pool = np.random.default_rng(7).integers(0, 256, (64, KV_PAGE), dtype=np.uint8)
    store.register(pool)
    slow: list[str] = []
    fast: list[str] = []
    for i in range(200):
        if len(slow) >= 16 and len(fast) >= 4:
            break
        before = [f["used"] for f in store.stats()["folders"]]
        key = f"page-{i}"
        if not store.put([key], [i % 20]).result()[0]:
            raise SystemExit("slow_drive: a kv put failed")
        after = [f["used"] for f in store.stats()["folders"]]
        (slow if after[0] > before[0] else fast).append(key)
    return store, pool, slow[:16], fast[:4]


def kv_run(
    store: deepio.kv.Store, slow: list[str], fast: list[str], throttle: Throttle, op: str = "get"
) -> tuple[float, bool]:
    """The fast folder's `op` ("get" or "put": a durable put of the same pages again) of 4
    pages while a get of the `slow` keys is held on the slow drive."""
    for folder in (MOUNTS["slow"] / "kv", MOUNTS["fast"] / "kv"):
        for f in folder.rglob("*"):
            if f.is_file():
                uncache(f)
    throttle.set(True)
    try:
        held = store.get(slow, list(range(20, 20 + len(slow))))
        time.sleep(0.2)  # the slow get reaches the kernel (not timed)
        t0 = time.perf_counter()
        ok = getattr(store, op)(fast, list(range(40, 44))).result()
        seconds = time.perf_counter() - t0
        pending = not held.done()
    finally:
        throttle.set(False)
    if not all(ok) or not all(held.result()):
        raise SystemExit(f"slow_drive: a kv {op} failed or a get missed")
    return seconds, pending


def alone(handle: deepio.aio_handle, files: dict[str, Path]) -> float:
    uncache(files["one"])
    out = np.empty(MIB, dtype=np.uint8)
    with deepio.File(files["one"], handle=handle) as f:
        t0 = time.perf_counter()
        f.pread(out).result()
        return time.perf_counter() - t0


def row(
    rows: list[dict], backend: str, overlap: bool | None, case: str, runs: list[tuple[float, bool]], base: float
) -> dict:
    """Appends (and returns) the row of one case: the fast operation's seconds over `runs`
    ((seconds, slow work still pending) each), beside `base`, the same operation alone."""
    secs = [t for t, _ in runs]
    rows.append(
        {
            "backend": backend,
            "overlap_events": overlap,
            "case": case,
            "fast_read_s_median": statistics.median(secs),
            "fast_read_s_min": min(secs),
            "fast_read_s_max": max(secs),
            "fast_alone_s_median": base,
            "slow_still_pending": all(p for _, p in runs),
        }
    )
    return rows[-1]


def summary(r: dict) -> str:
    return (
        f"{r['fast_read_s_median']:.4f} s median (min {r['fast_read_s_min']:.4f}, max {r['fast_read_s_max']:.4f}); "
        f"alone {r['fast_alone_s_median']:.4f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--backends", default="io_uring,libaio,threads")
    ap.add_argument("--rate-mib", type=float, default=1.0, help="the slow drive's read limit, MiB/s")
    ap.add_argument("--size-gib", type=int, default=1, help="each drive's size (sparse, in /dev/shm)")
    ap.add_argument("--cases", default="file,kv", help="file (A and B per backend), kv (C)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("slow_drive: needs root (loop devices, mount, blk-throttle)")
    devs: dict[str, str] = {}
    try:
        devs, files = setup(args.size_gib)
        majmin = sh("lsblk", "-no", "MAJ:MIN", devs["slow"]).strip()
        throttle = Throttle(majmin, int(args.rate_mib * MIB))
        config = {
            "deepio": getattr(deepio, "__version__", "?"),
            "module": os.path.dirname(deepio.__file__),
            "slow": f"{devs['slow']} ({majmin}) ext4 at {MOUNTS['slow']}, reads limited to {args.rate_mib} MiB/s "
            f"by {throttle.kind}",
            "fast": f"{devs['fast']} ext4 at {MOUNTS['fast']}, unthrottled",
            "handle": "aio_handle(block_size=1 MiB, queue_depth=32, intra_op_parallelism=2), direct_io auto, "
            "numpy buffers",
            "runs": args.runs,
        }
        if not args.json:
            for k, v in config.items():
                print(f"# {k}: {v}")
        rows = []
        for backend in args.backends.split(",") if "file" in args.cases else []:
            for overlap in (True, False):
                h = deepio.aio_handle(
                    block_size=MIB, queue_depth=32, overlap_events=overlap, intra_op_parallelism=2, backend=backend
                )
                base = statistics.median(alone(h, files) for _ in range(args.runs))
                for case in ("A", "B"):
                    runs = [one_run(case, h, files, throttle) for _ in range(args.runs)]
                    r = row(rows, backend, overlap, case, runs, base)
                    if not args.json:
                        print(
                            f"{backend:9} overlap={str(overlap):5} case {case}: fast read {summary(r)}; "
                            f"slow reads still pending: {r['slow_still_pending']}",
                            flush=True,
                        )
                del h
        if "kv" in args.cases:
            store, pool, slow_keys, fast_keys = kv_setup()
            # D after C: C's gets left the fast pages' bytes in rows 40-43, which D puts again.
            for case, op in (("C", "get"), ("D", "put")):
                base = statistics.median(kv_run(store, [], fast_keys, throttle, op)[0] for _ in range(args.runs))
                runs = [kv_run(store, slow_keys, fast_keys, throttle, op) for _ in range(args.runs)]
                r = row(rows, "kv default", None, case, runs, base)
                if not args.json:
                    print(
                        f"kv Store (defaults) case {case}: {op} of 4 pages {summary(r)}; "
                        f"slow get still pending: {r['slow_still_pending']}",
                        flush=True,
                    )
            for key, slot in zip(slow_keys + fast_keys, list(range(20, 36)) + list(range(40, 44))):
                want = pool[[int(key.split("-")[1]) % 20]].tobytes()
                if pool[slot].tobytes() != want:
                    raise SystemExit("slow_drive: kv bytes differ from what was put")
            store.close()
        if args.json:
            json.dump({"config": config, "rows": rows}, sys.stdout, indent=1)
            print()
    finally:
        if devs:
            teardown(devs)


if __name__ == "__main__":
    main()
