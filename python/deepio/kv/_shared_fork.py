"""Fork and a shared deepio.kv store: a forked child closes its copies of the store's sockets.

A socket's end is what tells an owner that a client died, and a client that its owner died;
a forked child (a DataLoader worker, say) that kept copies of those descriptors would hide
both for as long as it lives. So every owner's server and client connection is tracked here
(weakly), and the child's copies are closed right after the fork, on the forking thread, with
no lock taken (a lock another parent thread held stays held in the child).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

_live: weakref.WeakSet[Any] = weakref.WeakSet()


def track(obj: Any) -> None:
    """obj.after_fork_in_child() runs in every child forked while obj lives."""
    _live.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_live):
        try:
            obj.after_fork_in_child()
        except Exception:
            pass
    _live.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
