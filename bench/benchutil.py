"""What the Python benchmark programs share: cold caches, the process's CPU time, and the one
rule for judging a figure against the ceiling measured in the same run.

Imported as ``from benchutil import ...`` by the programs in bench/ (run as scripts, so
this folder is on sys.path).
"""

from __future__ import annotations

import os
import resource
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

RAM_DRIVE_FOLDERS = ["/mnt/ramdrive0", "/mnt/ramdrive1"]  # bench/ram_drives.sh up 2


def drive_folders(given: list[str]) -> list[str]:
    """A program's --folder values (one per drive), or by default the RAM-backed drives of
    bench/ram_drives.sh; exits naming those that are not folders."""
    folders = given or RAM_DRIVE_FOLDERS
    if missing := [f for f in folders if not os.path.isdir(f)]:
        raise SystemExit(f"no folder {missing} (sudo bench/ram_drives.sh up, or name --folder DIR per drive)")
    return folders


def drop_caches() -> bool:
    """Writes dirty pages back and empties the whole page cache (root only); False where
    that is not allowed (the caller then reports its reads as warm)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def drop_file_cache(path: str) -> None:
    """Drops one file's clean pages from the page cache (any user; dirty pages stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def block_device(path: str) -> str | None:
    """The name under /sys/block of the disk holding ``path`` (the whole disk for a
    partition); None where sysfs does not say."""
    st = os.stat(path)
    link = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    try:
        name = os.path.basename(os.path.realpath(link))
    except OSError:
        return None
    parent = os.path.basename(os.path.dirname(os.path.realpath(link)))
    if os.path.exists(f"/sys/block/{parent}/stat"):
        return parent
    return name if os.path.exists(f"/sys/block/{name}/stat") else None


def disk_stat(dev: str | None) -> dict[str, int]:
    """Counters of /sys/block/<dev>/stat (Documentation/block/stat.rst): "write_ios",
    "write_sectors" and, from Linux 5.5, "flushes" (field 16) completed so far; {} where
    unreadable."""
    if dev is None:
        return {}
    try:
        with open(f"/sys/block/{dev}/stat") as f:
            v = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return {}
    out = {"write_ios": v[4], "write_sectors": v[6]}
    if len(v) > 15:
        out["flushes"] = v[15]
    return out


def stat_delta(before: dict[str, int], after: dict[str, int], key: str) -> int | None:
    """How much counter ``key`` of two disk_stat() readings grew; None where either lacks it."""
    return after[key] - before[key] if key in before and key in after else None


def fsync_path(path: str, data_only: bool = False) -> None:
    """fsync (fdatasync with ``data_only``) of a file or folder by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)


def write_cache(dev: str | None) -> str:
    """/sys/block/<dev>/queue/write_cache: "write back" where the disk has a volatile cache
    (every fsync then sends it a flush), "write through" where not; "unknown" elsewhere."""
    try:
        with open(f"/sys/block/{dev}/queue/write_cache") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


# The noise margin's floor, as a fraction of the fastest ceiling sample: kCeilingNoise of
# tools/lib/ceiling.hpp.
CEILING_NOISE = 0.10


@dataclass(frozen=True)
class CeilingVerdict:
    """Where a figure stands against the ceiling: CeilingVerdict of tools/lib/ceiling.hpp.
    ``standing`` is "none", "below", "at_ceiling" or "above" (its to_string())."""

    standing: str = "none"
    percent: float = 0.0  # 100 x figure / the ceiling samples' median ("below", "at_ceiling"); else 0
    lo: float = 0.0  # the slowest and fastest ceiling samples (GiB/s)
    hi: float = 0.0
    limit: float = 0.0  # hi + margin: a figure above it is flagged
    reason: str = ""  # "above": one short sentence saying why; else empty

    @property
    def flagged(self) -> bool:
        return self.standing == "above"


def judge_against_ceiling(figure: float, samples: Iterable[float]) -> CeilingVerdict:
    """The ceiling rule of ``deepio bench``, the same rule in Python: it mirrors
    judge_against_ceiling() of tools/lib/ceiling.cpp (change both together; the cases of
    tests/python/test_bench_programs.py are those of its C++ table tests).

    ``samples`` are the ceiling's GiB/s per run; samples of zero or less (a failed run) are
    ignored, and none left means "none". Of the rest, lo and hi are the slowest and fastest;
    margin = max(hi - lo, CEILING_NOISE x hi), the spread the device showed in this very run,
    but never less than its usual drift. Then:
      figure > hi + margin -> "above", reason "above every ceiling sample (lo-hi GiB/s) by more
                              than their noise margin (limit GiB/s)";
      figure >= lo         -> "at_ceiling" (percent of the median kept);
      otherwise            -> "below", percent = 100 x figure / median.
    """
    v = sorted(s for s in samples if s > 0)
    if not v:
        return CeilingVerdict()
    lo, hi = v[0], v[-1]
    limit = hi + max(hi - lo, CEILING_NOISE * hi)
    if figure > limit:
        return CeilingVerdict(
            "above",
            0.0,
            lo,
            hi,
            limit,
            f"above every ceiling sample ({lo:.2f}-{hi:.2f} GiB/s) by more than their noise margin ({limit:.2f} GiB/s)",
        )
    standing = "at_ceiling" if figure >= lo else "below"
    return CeilingVerdict(standing, 100.0 * figure / statistics.median(v), lo, hi, limit)
