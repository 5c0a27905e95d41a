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
