"""One save of a checkpoint at a time, and one save through a writer at a time.

The save lock (``lock``/``SaveLock``). A save of the checkpoint at MAIN holds the lock file
``MAIN/.deepio-save.lock`` from before it names its files until its clean-up is done; without
collectives each rank is a save of its own (it writes its own ``__{rank}.metadata``) and holds
``MAIN/.deepio-save-{rank}.lock``. One save, not one rank, holds it: the coordinator takes it in
``prepare_global_plan``, which torch runs after every rank's local plan and before it hands
the plans out (so before any rank writes a file), and gives it back at the end of ``finish``.
A second save of MAIN waits for it: the threads of one process on one another (a condition
variable), processes through an exclusive ``flock`` on the file (which reaches other hosts
where the file system carries flock: local ones, NFS v4, Lustre mounted with ``flock``; where
it does not, ``flock`` fails with ``ENOLCK``/``EOPNOTSUPP`` and the save goes on with a
``RuntimeWarning``, kept apart from this process's other saves only).
Given back, the lock file is removed while still locked; a waiter that then gets the lock on
the removed file sees its inode gone and opens the file anew. A finished checkpoint's folder
thus holds no lock file; a killed save leaves one, unlocked, that the next save takes and
removes.

A save that fails never reaches ``finish`` (where another rank failed, the coordinator's
writer is not even told). Its lock is given back once that save is over, which is known
without it: each hold records the thread that took it and the outermost frame of
``torch.distributed.checkpoint`` on that thread's stack at the time (the frame of ``dcp.save``,
or of the thread ``async_save`` runs it on; where the hooks are called without torch, the
frame that called the hook); the save is over once that frame is no longer on that thread's
stack (the thread ended, returned, or runs another save). The thread that runs the next save
takes such a hold over at once; a waiter on another thread looks every ``_POLL_S`` seconds;
the writer's finalizer gives it back when the writer is dropped. Another process waits until
one of those happens in the holder's process, or that process exits (the kernel drops the
flock).

The writer's turn (``take_turn``/``end_turn``). A writer object keeps its save's state between
hooks (the save id, the path, the rank, the lock), so a second save through the same writer
(``async_save`` with the writer of a save still under way) waits in ``reset`` or
``set_up_storage_writer`` until the first is over, by the same rule.

After ``fork`` the child forgets the parent's holds (its threads are gone) and closes their
files: its own saves take the lock as any other process's do.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import threading
import warnings
import weakref
from types import CodeType, FrameType
from typing import Any

#: How often a waiter looks whether the save that holds a lock or a writer ended without
#: giving it back (a save that failed on another rank): a normal give-back wakes it at once.
_POLL_S = 0.5

_cond = threading.Condition()


def _dcp_frame() -> FrameType | None:
    """The outermost frame of torch.distributed.checkpoint on this thread's stack: the save
    this thread runs."""
    f: FrameType | None = sys._getframe(1)
    outer = None
    while f is not None:
        if str(f.f_globals.get("__name__", "")).startswith("torch.distributed.checkpoint"):
            outer = f
        f = f.f_back
    return outer


def _caller_frame() -> FrameType:
    """The innermost frame on this thread's stack outside deepio: who called the hook."""
    f = sys._getframe(1)
    while f.f_back is not None and str(f.f_globals.get("__name__", "")).startswith("deepio."):
        f = f.f_back
    return f


class _Holder:
    """A save as a hold sees it: its thread and the frame that runs it (see the module)."""

    __slots__ = ("code", "frame_id", "thread")

    def __init__(self, frame: FrameType) -> None:
        self.thread = threading.get_ident()
        self.frame_id = id(frame)
        self.code: CodeType = frame.f_code

    def running(self) -> bool:
        """Whether the save is still under way: its frame is on its thread's stack."""
        f: FrameType | None = sys._current_frames().get(self.thread)
        while f is not None:
            if id(f) == self.frame_id and f.f_code is self.code:
                return True
            f = f.f_back
        return False

    def mine(self) -> bool:
        """Whether it is the save this thread runs now."""
        return self.thread == threading.get_ident() and self.running()


def _holder_here() -> _Holder:
    return _Holder(_dcp_frame() or _caller_frame())


class _Entry:
    """A lock file this process holds (fd >= 0), or is taking (fd -1), for ``holder``, whose
    ``SaveLock`` is ``token`` (a weak reference: dropping it gives the lock back)."""

    __slots__ = ("fd", "holder", "token")

    def __init__(self, holder: _Holder) -> None:
        self.holder = holder
        self.fd = -1
        self.token: weakref.ref[SaveLock] | None = None


_paths: dict[str, _Entry] = {}


#: flock's errors on a file system that does not carry it (NFS mounted with ``nolock``, some
#: FUSE file systems): the save goes on, excluded from this process's other saves only, with a
#: warning.
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


def _flock(path: str) -> int:
    """Opens (creating) and locks ``path`` exclusively, waiting for another process; returns
    the descriptor once the locked file is the one at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    raise
                warnings.warn(
                    f"deepio.dcp: cannot lock {path!r} ({os.strerror(e.errno)}): saves of this checkpoint "
                    "from other processes are not kept apart on this file system",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return fd
            held = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # its holder removed it when giving it back: lock the file there now


class SaveLock:
    """A save's hold on a checkpoint's lock file (``lock``). ``release()`` gives it back (once;
    a hold taken over by a later save is that save's then, and releasing it here does
    nothing); so does dropping it."""

    def __init__(self, path: str, holder: _Holder) -> None:
        self.path = path
        self._holder = holder
        self._finalizer = weakref.finalize(self, _release, path, holder)

    def release(self) -> None:
        self._finalizer()


def _release(path: str, holder: _Holder) -> None:
    with _cond:
        entry = _paths.get(path)
        if entry is None or entry.holder is not holder:
            return
        del _paths[path]
        if entry.fd >= 0:
            try:
                os.unlink(path)  # still locked: a waiter on this file sees it gone and retries
            except OSError:
                pass
            os.close(entry.fd)
        _cond.notify_all()


def lock(path: str) -> SaveLock:
    """Takes the save lock file ``path`` (absolute) for the save this thread runs, waiting
    while another save holds it (see the module); the same save taking it again gets the same
    ``SaveLock``. Raises what opening or locking the file raises (``OSError`` naming it)."""
    me = _holder_here()
    with _cond:
        while True:
            entry = _paths.get(path)
            if entry is None:
                entry = _paths[path] = _Entry(me)
                break
            if entry.fd >= 0 and (entry.holder.mine() or not entry.holder.running()):
                # The same save again, or a save that is over (it failed before finish): the
                # file stays locked, and this save holds it now.
                same = entry.holder.mine()
                held = entry.token() if same and entry.token is not None else None
                if held is not None:
                    return held
                entry.holder = me
                return _token(path, entry)
            _cond.wait(_POLL_S)
    try:
        fd = _flock(path)  # another process's save: wait for it
    except BaseException:
        with _cond:
            del _paths[path]
            _cond.notify_all()
        raise
    with _cond:
        entry.fd = fd
        return _token(path, entry)


def _token(path: str, entry: _Entry) -> SaveLock:
    held = SaveLock(path, entry.holder)
    entry.token = weakref.ref(held)
    return held


def take_turn(writer: Any, *, hold: bool = True) -> None:
    """Waits until no other save runs through ``writer`` (see the module); with ``hold``, makes
    it the writer of the save this thread runs until ``end_turn``."""
    me = _holder_here() if hold else None
    with _cond:
        while True:
            turn: _Holder | None = writer.__dict__.get("_deepio_turn")
            if turn is None or turn.mine() or not turn.running():
                break
            _cond.wait(_POLL_S)
        if me is not None and (turn is None or not turn.mine()):
            writer.__dict__["_deepio_turn"] = me


def end_turn(writer: Any) -> None:
    """Ends the turn of the save this thread runs through ``writer`` (none: nothing)."""
    with _cond:
        turn = writer.__dict__.get("_deepio_turn")
        if turn is not None and turn.thread == threading.get_ident():
            writer.__dict__["_deepio_turn"] = None
            _cond.notify_all()


def in_dcp_save() -> bool:
    """Whether this thread runs torch.distributed.checkpoint code (a save) further up."""
    return _dcp_frame() is not None


def _after_fork_in_child() -> None:
    global _cond
    _cond = threading.Condition()
    for entry in _paths.values():
        if entry.fd >= 0:
            try:
                os.close(entry.fd)  # the parent's lock stays the parent's
            except OSError:
                pass
    _paths.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
