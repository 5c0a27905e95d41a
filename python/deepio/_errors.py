"""How deepio words an exception where it cannot raise it (a warning, a note)."""

from __future__ import annotations

import errno as _errno
import os
from typing import Any


def describe(e: BaseException) -> str:
    """An exception for a warning or a note: type, errno with its name and text, message,
    file name (str(OSError) leaves out the errno's text)."""
    if isinstance(e, OSError) and e.errno is not None:
        name = _errno.errorcode.get(e.errno, str(e.errno))
        where = f" {e.filename!r}" if e.filename is not None else ""
        return f"{type(e).__name__} [{name}: {os.strerror(e.errno)}] {e.strerror}{where}"
    return repr(e)


class CorruptFileError(ValueError):
    """A file deepio reads is not what its format says: a safetensors header that is not
    valid, a torch checkpoint whose zip records or CRC-32s do not match, a file shorter than
    its own index. A ``ValueError`` (what such errors were before), with ``filename``: the
    file, and the message naming what is wrong and where."""

    def __init__(self, filename: str | bytes | os.PathLike[str] | os.PathLike[bytes], what: str) -> None:
        self.filename = os.fsdecode(filename) if not isinstance(filename, str) else filename
        self.what = what
        super().__init__(f"{self.filename}: {what}")

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's would call the class with ``args`` (the message alone); the
        # arguments are (filename, what), and notes or other attributes ride in the state.
        return type(self), (self.filename, self.what), self.__dict__


def with_name(e: OSError, name: str | bytes | None) -> OSError:
    """``e`` with ``filename`` set to ``name`` when the engine named only the descriptor
    ("fd N", ``filename`` None); unchanged otherwise. In place: the type, ``offset``,
    ``nbytes``, ``other_errors``, notes and traceback stay as they are, and ``str(e)`` names
    the file.

    ``args`` becomes ``(errno, strerror)``, what ``OSError(errno, strerror, name)`` keeps: the
    binding builds the error as ``OSError(errno, message, None)``, whose ``args`` keep that
    None, and ``OSError.__reduce__`` rebuilds from ``args`` (adding ``filename`` only to a
    two-item ``args``): without this a pickled copy (how torch.distributed.checkpoint gathers
    a rank's error to the coordinator, how a process pool returns one) would lose the name.
    The other attributes travel in the instance's ``__dict__``, which pickle keeps."""
    if name is not None and e.filename is None:
        if len(e.args) == 3 and e.args[2] is None and e.args[:2] == (e.errno, e.strerror):
            e.args = e.args[:2]
        e.filename = name
    return e
