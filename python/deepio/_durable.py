"""Saving files so a crash never leaves a truncated file under the final name.

``with replacing(path) as tmp:`` yields a temporary path in the same folder; write the whole
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
