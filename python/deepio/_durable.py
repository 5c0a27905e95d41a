"""Saving files so a crash never leaves a truncated file under the final name.

``with replacing(path) as tmp:`` yields a temporary path in the same folder, created empty
with the permission bits of the file it replaces (or 0666 less the umask); write the whole
file there (through the engine or anything else). When the block ends without an exception,
the temporary file is flushed to stable storage (``fsync``), renamed over ``path`` and the
folder is flushed too, so the new name survives a power cut. When the block raises, the
temporary file is removed and ``path`` (old contents or absent) is untouched.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Union

PathArg = Union[str, "os.PathLike[str]"]


def fsync_path(path: PathArg) -> None:
    """Flush a file's data and metadata (or a folder's entries) to stable storage."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_fresh(tmp: str, final: str) -> None:
    """Creates `tmp` empty, with the permission bits of the file it will replace from the
    start (a private file is never readable by others while it is written), and never on top
    of a leftover of a killed writer with the same name (its stale tail would survive a
    writer that does not truncate)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        mode: int | None = os.stat(final).st_mode & 0o7777
    except FileNotFoundError:
        mode = None  # a new file: 0666 less the umask, as open() would make it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600 if mode is not None else 0o666)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)


@contextmanager
def replacing(path: PathArg) -> Iterator[str]:
    final = os.fspath(path)
    if isinstance(final, bytes):
        raise TypeError("path must be a str or os.PathLike[str]")
    folder = os.path.dirname(os.path.abspath(final))
    if os.path.isdir(final):
        raise IsADirectoryError(21, "Is a directory", final)
    # Unique per process and thread; a leftover from a killed writer never collides with a
    # live one and is recognisable by name.
    name = f".{os.path.basename(final)}.deepio-tmp-{os.getpid()}-{threading.get_ident()}"
    tmp = os.path.join(folder, name)
    _create_fresh(tmp, final)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_path(folder)
