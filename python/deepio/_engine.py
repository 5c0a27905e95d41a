"""The process's default engine: one handle shared by ``deepio.File``, ``save``/``load``,
``Writer``/``Reader``, ``deepio.safetensors`` and ``deepio.dcp``, for host and CUDA memory
alike, made on first use. Its device route is "auto": CUDA memory goes through GPUDirect
Storage (cuFile) where it is usable, staged through host memory otherwise, decided by the
engine on its first operation on CUDA memory (a process that never reads into CUDA memory
never loads cuFile); its ``stats()`` say which route each operation took.

Tuning, once for all of them (docs/settings.md): 1 MiB requests, two workers with 32 in
flight each, completions reaped as they come (``overlap_events``). One direct request
stream is not enough to keep a fast NVMe busy from one submitter; two workers are.

Fork: a handle's worker threads stay in the parent, so a forked child (a DataLoader worker)
must not use the parent's. ``os.register_at_fork`` drops the default engine in the child
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

_handle: Any = None
_lock = threading.Lock()
# Engines a forked child inherited: kept referenced so that nothing destroys them there
# (destruction would refuse anyway; keeping them costs nothing and keeps it quiet).
_inherited: list[Any] = []


def default() -> Any:
    """The default engine: one ``_deepio.Handle`` (device route "auto") for host and CUDA
    memory."""
    global _handle
    h = _handle
    if h is not None:
        return h
    with _lock:
        if _handle is None:
            _handle = _deepio.Handle(*DEFAULT_OPTIONS, device_route="auto")
        return _handle


def _after_fork_in_child() -> None:
    global _handle, _lock
    if _handle is not None:
        _inherited.append(_handle)
    _handle = None
    _lock = threading.Lock()  # another parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
# Failures the engine reported from its threads after the last deepio call: warned at exit.
atexit.register(_deepio.flush_unobserved)
