#!/usr/bin/env python3
"""File after file through deepio.Writer: what each file's staging windows cost.

A checkpoint of many files (DCP with one file per item, a folder of shards, deepio.save in a
loop) opens one deepio.Writer per file, and each Writer takes ``buffers`` windows of
``buffer_size`` staging memory. This program writes ``--files`` files of ``--mib`` MiB each,
one Writer at a time (default ring: 4 x 16 MiB), and reports files/s, GiB/s and CPU seconds
per GiB for one run. Run it once per package to compare (same run, interleaved, medians):

  python3 bench/writer_files.py --compare OLD_SITE NEW_SITE [--rounds 5]

runs this program alternately with PYTHONPATH=OLD_SITE and NEW_SITE (pip --target folders or
overlays) and prints each side's median and new/old. ``--durable`` makes each file durable
(fsync at close) as deepio.Writer does by default; off by default, so that the device's flush
does not hide the staging cost being compared. Every round writes into a fresh folder under
``--dir`` that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def one_run(args: argparse.Namespace) -> dict[str, float]:
    import deepio

    data = os.urandom(1 << 20) * args.mib
    folder = tempfile.mkdtemp(prefix="writer-files-", dir=args.dir)
    try:
        with deepio.Writer(os.path.join(folder, "warm"), durable=False) as w:  # the engine made, once
            w.write(data[: 1 << 20])
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(args.files):
            with deepio.Writer(os.path.join(folder, f"f{i}"), durable=args.durable) as w:
                w.write(data)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    gib = args.files * args.mib / 1024
    return {"files_per_s": args.files / wall, "gib_per_s": gib / wall, "cpu_s_per_gib": cpu / gib}


def compare(args: argparse.Namespace) -> None:
    sides = {"old": args.compare[0], "new": args.compare[1]}
    got: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    cmd = [sys.executable, __file__, "--json", "--files", str(args.files), "--mib", str(args.mib), "--dir", args.dir]
    if args.durable:
        cmd.append("--durable")
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = dict(os.environ, PYTHONPATH=sides[name])
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            got[name].append(json.loads(out))
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in got.items()}
    for name in ("old", "new"):
        m = med[name]
        spread = [round(x["files_per_s"], 1) for x in got[name]]
        print(
            f"{name}: {m['files_per_s']:.1f} files/s, {m['gib_per_s']:.2f} GiB/s, "
            f"{m['cpu_s_per_gib']:.2f} CPU s/GiB (files/s per round: {spread})"
        )
    print(
        f"new/old: files/s {med['new']['files_per_s'] / med['old']['files_per_s']:.2f}, "
        f"CPU s/GiB {med['new']['cpu_s_per_gib'] / med['old']['cpu_s_per_gib']:.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=64, help="files written one after another (default 64)")
    p.add_argument("--mib", type=int, default=8, help="MiB per file (default 8)")
    p.add_argument("--dir", default="/var/tmp", help="where the files go (default /var/tmp)")
    p.add_argument("--durable", action="store_true", help="fsync each file at close")
    p.add_argument("--json", action="store_true", help="one run, its figures as JSON")
    p.add_argument("--compare", nargs=2, metavar=("OLD_SITE", "NEW_SITE"), help="alternate two packages")
    p.add_argument("--rounds", type=int, default=5, help="runs per side with --compare (default 5)")
    args = p.parse_args()
    if args.compare:
        compare(args)
        return
    r = one_run(args)
    print(
        json.dumps(r)
        if args.json
        else f"{r['files_per_s']:.1f} files/s, {r['gib_per_s']:.2f} GiB/s, {r['cpu_s_per_gib']:.2f} CPU s/GiB"
    )


if __name__ == "__main__":
    main()
