"""Checkpoints through the engine: ``deepio.save``/``deepio.load`` (torch's file format) and
the file-like ``deepio.Writer``/``deepio.Reader`` any serializer can use.

One job a module:

- ``_staging``: page-locked staging buffers, byte views, the copy, the io answers Writer and
  Reader share;
- ``_writer``: ``Writer`` (staging windows over the buffers, written through the engine);
- ``_reader``: ``Reader`` (aligned chunks read ahead, copied out);
- ``_save``: ``save`` and its choice of route; ``_filling``: the filling route (storages
  written from their own memory, CRC-32s on helper threads);
- ``_zip``: torch's zip format (CRC patching, record alignment, where a record's data starts);
- ``_load``: ``load``, which reads a whole file with ``deepio._wholefile`` or goes through a
  ``Reader``.

Neither Writer nor Reader is thread-safe: use one from one thread at a time, as with
``open()``; save and load may run on many threads at once.

Settings and test hooks. The module-level settings and hooks below live in the module that
reads them at each use; this package forwards reading and setting each of them by its old
name (``checkpoint._force_filling = True``, ``monkeypatch.setattr(checkpoint, "_copy", f)``),
so that setting one here changes what the code does.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .. import _wholefile
from . import _filling, _load, _reader, _save, _staging, _zip
from ._filling import _FillMismatch as _FillMismatch
from ._load import _to_host as _to_host
from ._load import load
from ._reader import DEFAULT_READ_BUFFER, DEFAULT_READ_BUFFERS, Reader
from ._save import save
from ._writer import DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS, Writer
from ._zip import _data_start as _data_start

__all__ = [
    "DEFAULT_READ_BUFFER",
    "DEFAULT_READ_BUFFERS",
    "DEFAULT_WRITE_BUFFER",
    "DEFAULT_WRITE_BUFFERS",
    "Reader",
    "Writer",
    "load",
    "save",
]

# name here: (the module that reads it, its name there)
_FORWARDED: dict[str, tuple[types.ModuleType, str]] = {
    "_force_filling": (_save, "_force_filling"),
    "_FILL_MIN": (_save, "_FILL_MIN"),
    "_crc32": (_filling, "_crc32"),
    "_crc32_combine": (_filling, "_crc32_combine"),
    "_CRC_PIECE": (_filling, "_CRC_PIECE"),
    "_crc_threads": (_filling, "_crc_threads"),
    "_IN_PLACE_MIN": (_filling, "_IN_PLACE_MIN"),
    "_patch_crcs": (_zip, "_patch_crcs"),
    "_copy": (_staging, "_copy"),
    "_PREFAULT_MIN": (_reader, "_PREFAULT_MIN"),
    "_POPULATE_PIECE": (_reader, "_POPULATE_PIECE"),
    "_POPULATE_AHEAD": (_reader, "_POPULATE_AHEAD"),
    "_HUGEPAGE_HINT": (_reader, "_HUGEPAGE_HINT"),
    "_WHOLE_FILE": (_load, "_WHOLE_FILE"),
    "_WHOLE_CHUNK": (_wholefile, "CHUNK"),
    "_WHOLE_HUGEPAGES": (_wholefile, "HUGEPAGES"),
    "_WHOLE_POPULATE_THREADS": (_wholefile, "POPULATE_THREADS"),
}


class _Package(types.ModuleType):
    """This package's module type: reads and sets of a forwarded name go to where it lives."""

    def __getattr__(self, name: str) -> Any:
        where = _FORWARDED.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(where[0], where[1])

    def __setattr__(self, name: str, value: Any) -> None:
        where = _FORWARDED.get(name)
        if where is None:
            super().__setattr__(name, value)
        else:
            setattr(where[0], where[1], value)

    def __delattr__(self, name: str) -> None:
        if name in _FORWARDED:
            raise AttributeError(f"{__name__}.{name} is a setting: set it, do not delete it")
        super().__delattr__(name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_FORWARDED})


sys.modules[__name__].__class__ = _Package
