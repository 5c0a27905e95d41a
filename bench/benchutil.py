"""What the Python benchmark programs share: cold caches and the process's CPU time.

Imported as ``from benchutil import ...`` by the programs in bench/ (run as scripts, so
this folder is on sys.path).
"""

from __future__ import annotations

import os
import resource


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
