"""Which checkpoint a DCP data file belongs to: the names a save gives its files, and the
owner mark at the end of the files that are not at torch's own names.

Names (``data_dir``). A save of the checkpoint at MAIN with save id S (torch's
``StorageMeta.save_id``, a uuid the coordinator draws per save and ``.metadata`` records) writes:

- in MAIN, torch's names (``__{rank}_{n}.distcp``) where MAIN holds no checkpoint yet: the
  files torch's writer writes, byte for byte;
- in MAIN, ``save.{S16}/__{rank}_{n}.distcp`` where MAIN holds one (a save over it, under
  ``overwrite=True``): the old files stay whole until the new ``.metadata`` is in place;
- in an extra folder X, ``X/{basename(MAIN)}.{S16}/__{rank}_{n}.distcp``, always.

``S16`` is the first 16 hex digits of S: two saves, of one checkpoint or of two, never name
the same file. Every file not at torch's names in MAIN ends, past its last item, with an owner
mark (``mark``): ``{"checkpoint": MAIN, "save_id": S}`` as JSON, its length (4 bytes, little
endian) and ``MAGIC``. Readers read items by their offsets and never reach it (torch's too).
``owner(tail)`` parses a mark from a file's last bytes: None where there is none. Each save's
folder in an extra folder holds ``OWNER_FILE``, the mark alone, from before its first data file.

Pure functions: no I/O, no state; thread-safe.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import NamedTuple

MAGIC = b"DEEPIO-DCP-OWNER\n"
#: In each save's folder in an extra folder: the save's mark alone, written before any data
#: file, so that the next save of the same checkpoint knows the folder of one that never
#: finished as its own (another checkpoint's folders in a shared extra folder stay).
OWNER_FILE = "owner"
#: A mark is at most this long (a path of PATH_MAX bytes, escaped, and the save id).
MAX_MARK = 32 << 10
_SAVE_DIR = re.compile(r"^save\.[0-9a-f]{16}$")
_EXTRA_DIR = re.compile(r"^.+\.[0-9a-f]{16}$")


class Owner(NamedTuple):
    checkpoint: str  # the main path the save was given (absolute)
    save_id: str

    def __str__(self) -> str:
        return f"the checkpoint at {self.checkpoint!r} (save {self.save_id})"


def short(save_id: str) -> str:
    """The 16 hex digits of a save id that its file names carry."""
    digits = "".join(c for c in save_id.lower() if c in "0123456789abcdef")
    return (digits + "0" * 16)[:16]


def main_dir(save_id: str) -> str:
    """The folder in the main path of a save over an existing checkpoint."""
    return f"save.{short(save_id)}"


def is_save_dir(name: str) -> bool:
    """Whether ``name`` is a folder ``main_dir`` makes (a leftover the next save may remove)."""
    return bool(_SAVE_DIR.match(name))


def is_extra_dir(name: str) -> bool:
    """Whether ``name`` looks like a folder ``extra_dir`` makes."""
    return bool(_EXTRA_DIR.match(name))


def extra_dir(main: str, save_id: str) -> str:
    """The folder of a save's files in each extra folder: the main path's name and the save."""
    return f"{os.path.basename(os.path.abspath(main)) or 'checkpoint'}.{short(save_id)}"


def mark(main: str, save_id: str) -> bytes:
    payload = json.dumps({"checkpoint": os.path.abspath(main), "save_id": save_id}).encode()
    return payload + struct.pack("<I", len(payload)) + MAGIC


def owner(tail: bytes) -> Owner | None:
    """The owner a file's last bytes (``tail``, up to MAX_MARK of them) name; None where they
    hold no mark."""
    if len(tail) < len(MAGIC) + 4 or not tail.endswith(MAGIC):
        return None
    (n,) = struct.unpack("<I", tail[-len(MAGIC) - 4 : -len(MAGIC)])
    start = len(tail) - len(MAGIC) - 4 - n
    if start < 0:
        return None
    try:
        d = json.loads(tail[start : start + n])
        return Owner(str(d["checkpoint"]), str(d["save_id"]))
    except (ValueError, KeyError, TypeError):
        return None
