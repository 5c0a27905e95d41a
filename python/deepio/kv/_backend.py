"""What the engines' backends (sglang.py, lmcache.py, vllm.py) share when they open a store.

- ``fingerprint(backend, fields)``: what the stored bytes mean (model, layout, dtype, page
  shape, TP rank and size: whatever the engine's config gives), as canonical JSON (sorted keys,
  no spaces) of at most ``MAX_FINGERPRINT_BYTES``. The store keeps it in its ``kv.meta``; an
  open with another one raises (or, with ``clear_on_mismatch``, drops every page), so a page
  written under one configuration is never a hit under another.
- ``open_store(...)``: the store with an explicit capacity for a fresh folder (one without
  ``kv.meta``): a missing capacity raises ValueError naming the folder and the setting to set,
  instead of letting the store refuse with its own message; a fingerprint mismatch keeps the
  store's error and adds a note naming the backend's ``clear_on_mismatch`` setting.
  ``shared=True`` opens the node's one store on those folders (docs/kv-sharing.md, "Sharing a store
  between processes"); ``group=(name, rank, size)`` names the ranks that load the same pages
  together (an MLA model's TP ranks), passed on only where ``deepio.kv.Store`` takes it
  (``group_supported()``): without it every rank reads its pages itself (correct, N x the bytes).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import deepio
from deepio.kv import Store

#: The longest fingerprint the store keeps (deepio::kv::StoreOptions::fingerprint).
MAX_FINGERPRINT_BYTES = 4096


def digest(value: Any) -> str:
    """A short stand-in (16 hex digits of SHA-256 of its JSON) for a long value, e.g. a model's
    layer names, so that the fingerprint stays small."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint(backend: str, fields: Mapping[str, Any]) -> str:
    """``{"backend": backend, **fields}`` as canonical JSON; values that are not JSON types
    (torch dtypes, enums) become their ``str``. ValueError over MAX_FINGERPRINT_BYTES."""
    text = json.dumps({"backend": backend, **fields}, sort_keys=True, separators=(",", ":"), default=str)
    if len(text.encode()) > MAX_FINGERPRINT_BYTES:
        raise ValueError(f"deepio {backend} backend: fingerprint of {len(text.encode())} bytes: {text[:200]}...")
    return text


@functools.cache
def group_supported() -> bool:
    """Whether this deepio's shared store takes ``group=(name, rank, size)`` (reads split across
    the ranks that load the same pages; docs/kv-sharing.md, "Sharing a store between processes")."""
    from deepio.kv import _shared

    return any("group" in inspect.signature(f).parameters for f in (Store.__init__, _shared.SharedStore.__init__))


def bool_setting(value: Any, name: str, where: str) -> bool:
    """A backend's true/false setting ``name``: a bool (JSON true/false), or the strings
    "true"/"false"/"1"/"0"; anything else raises ValueError naming it and ``where``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and str(value).lower() in ("true", "1", "false", "0"):
        return str(value).lower() in ("true", "1")
    raise ValueError(f'"{name}" in {where} must be true or false, not {value!r}')


def clear_setting(value: Any, where: str) -> bool:
    """The backends' ``clear_on_mismatch`` setting (bool_setting)."""
    return bool_setting(value, "clear_on_mismatch", where)


def open_store(
    who: str,
    where: str,
    folders: Sequence[str],
    *,
    capacity_bytes: int,
    page_bytes: int,
    fingerprint: str,
    clear_on_mismatch: bool,
    capacity_setting: str = '"capacity_bytes"',
    group: tuple[str, int, int] | None = None,
    **options: Any,
) -> Store:
    """Opens the store of a backend. ``who`` names the backend in messages, ``where`` where its
    settings are given (e.g. "--hicache-storage-backend-extra-config"), ``capacity_setting``
    the setting that gives the capacity, as the user writes it. A capacity of 0 is accepted
    only where every folder holds a store already (its layout is kept). ``group`` is passed on
    with a shared store of a size over 1, where the store takes it (``group_supported()``)."""
    if capacity_bytes <= 0:
        for folder in folders:
            if not os.path.exists(os.path.join(folder, "kv.meta")):
                raise ValueError(
                    f"{who}: folder {folder} holds no store yet and no capacity is set: set "
                    f"{capacity_setting} (bytes, over all folders) in {where}; deepio never sizes a "
                    "store by the free space of a drive (a drive that failed to mount would fill "
                    "the file system below it)"
                )
    if group is not None and group[2] > 1 and options.get("shared") and group_supported():
        options["group"] = group
    try:
        return Store(
            list(folders),
            capacity_bytes=capacity_bytes,
            page_bytes=page_bytes,
            fingerprint=fingerprint,
            clear_on_mismatch=clear_on_mismatch,
            **options,
        )
    except deepio.InvalidArgumentError as e:
        if "fingerprint" in str(e):
            e.add_note(
                f"{who}: the folders hold pages written under another configuration; give other "
                f'folders, or set "clear_on_mismatch": true in {where} to drop those pages and start '
                "empty"
            )
        raise
