"""Saving files so a crash never leaves a truncated file under the final name.

``with replacing(path) as tmp:`` yields a temporary path in the same folder, created empty
with the permission bits of the file it replaces (or 0666 less the umask); write the whole
file there (through the engine or anything else). When the block ends without an exception,
the temporary file is flushed to stable storage (``fsync``), renamed over ``path`` and the
folder is flushed too, so the new name survives a power cut. When the block raises, the
temporary file is removed and ``path`` (old contents or absent) is untouched.

A writer killed mid-save (SIGKILL, power cut) leaves its temporary file behind. The next save
to the same ``path`` removes such leftovers when they were made on this host by a process that
no longer exists; a leftover of a live process (a save still under way) or of another host (a
shared file system) is never touched.
"""

from __future__ import annotations

import os
import socket
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Union

PathArg = Union[str, "os.PathLike[str]"]


def fsync_path(path: PathArg) -> None:
    """Flush a file's data and metadata (or a folder's entries) to stable storage. A file its
    owner may write but not read (made under a umask such as 0o477) is opened for writing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError:
        if os.path.isdir(path):
            raise
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
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


def _host_tag() -> str:
    """8 hex digits naming this host in temporary names (a hash: host names can be long)."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def _tmp_prefix(final: str) -> str:
    return f".{os.path.basename(final)}.deepio-tmp-"


def _tmp_name(final: str) -> str:
    return f"{_tmp_prefix(final)}{_host_tag()}-{os.getpid()}-{threading.get_ident()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def remove_stale_temporaries(final: str) -> list[str]:
    """Removes the temporary files of earlier saves to ``final`` whose writer was killed: made on
    this host (the name's host tag) by a process that no longer exists. Returns their names."""
    folder = os.path.dirname(os.path.abspath(final))
    prefix, host = _tmp_prefix(final), _host_tag()
    removed: list[str] = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for name in entries:
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("-")
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue  # another host's, or not one of ours: never touched
        if int(parts[1]) == os.getpid() or _pid_alive(int(parts[1])):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            continue  # gone already (another saver cleaned it), or not ours to remove
        removed.append(name)
    return removed


@contextmanager
def replacing(path: PathArg, *, durable: bool = True) -> Iterator[str]:
    """Yields a fresh temporary name beside ``path``; when the block ends, the temporary file
    replaces ``path`` (removed instead if the block raised). ``durable`` (the default): the
    file is flushed before the rename and the folder after it; ``durable=False`` only renames,
    for callers whose user turned syncing off."""
    final = os.fspath(path)
    if isinstance(final, bytes):
        raise TypeError("path must be a str or os.PathLike[str]")
    folder = os.path.dirname(os.path.abspath(final))
    if os.path.isdir(final):
        raise IsADirectoryError(21, "Is a directory", final)
    # Unique per host, process and thread; a leftover from a killed writer never collides with
    # a live one, is recognisable by name, and is removed by the next save to the same path.
    remove_stale_temporaries(final)
    tmp = os.path.join(folder, _tmp_name(final))
    _create_fresh(tmp, final)
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_path(folder)
