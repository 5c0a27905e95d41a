"""How deepio words an exception where it cannot raise it (a warning, a note)."""

from __future__ import annotations

import errno as _errno
import os


def describe(e: BaseException) -> str:
    """An exception for a warning or a note: type, errno with its name and text, message,
    file name (str(OSError) leaves out the errno's text)."""
    if isinstance(e, OSError) and e.errno is not None:
        name = _errno.errorcode.get(e.errno, str(e.errno))
        where = f" {e.filename!r}" if e.filename is not None else ""
        return f"{type(e).__name__} [{name}: {os.strerror(e.errno)}] {e.strerror}{where}"
    return repr(e)
