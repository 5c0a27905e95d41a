"""The process's default engine: one handle shared by ``deepio.File``, ``save``/``load``,
``Writer``/``Reader`` and ``deepio.safetensors`` (and, for CUDA memory where GPUDirect
Storage is usable, one ``GdsHandle`` beside it), made on first use.

Tuning, once for all of them (docs/settings.md): 1 MiB requests, two workers with 32 in
flight each, completions reaped as they come (``overlap_events``). One direct request
stream is not enough to keep a fast NVMe busy from one submitter; two workers are.

Fork: a handle's worker threads stay in the parent, so a forked child (a DataLoader worker)
must not use the parent's. ``os.register_at_fork`` drops the default engines in the child
(the old objects are left to leak: they refuse use and touch nothing there) and the next
call makes new ones; ``spawn``/``forkserver`` children start fresh anyway.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from . import _deepio

#: (block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism)
DEFAULT_OPTIONS = (1 << 20, 32, False, True, 2)

_handles: dict[str, Any] = {}
_lock = threading.Lock()
# Engines a forked child inherited: kept referenced so that nothing destroys them there
# (destruction would refuse anyway; keeping them costs nothing and keeps it quiet).
_inherited: list[Any] = []


def default(kind: str = "cpu") -> Any:
    """The default engine handle: a ``_deepio.Handle`` ("cpu") or, for "gds", a
    ``_deepio.GdsHandle`` for CUDA memory (GPUDirect Storage where usable, else staged)."""
    h = _handles.get(kind)
    if h is not None:
        return h
    with _lock:
        h = _handles.get(kind)
        if h is None:
            if kind == "gds":
                h = _deepio.GdsHandle(*DEFAULT_OPTIONS, "auto")
            elif kind == "cpu":
                h = _deepio.Handle(*DEFAULT_OPTIONS)
            else:
                raise ValueError(f"unknown engine kind {kind!r}")
            _handles[kind] = h
        return h


def _after_fork_in_child() -> None:
    global _lock
    _inherited.extend(_handles.values())
    _handles.clear()
    _lock = threading.Lock()  # another parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
# Failures the engine reported from its threads after the last deepio call: warned at exit.
atexit.register(_deepio.flush_unobserved)
