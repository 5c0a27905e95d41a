"""A client's connection to the owner of a shared deepio.kv store, and its futures.

Lifecycle: ``Connection(name, hello)`` connects, checks that the owner runs as this user
(SO_PEERCRED), makes the staging region (a memfd of ``staging_slots`` pages, mapped here and
sent to the owner) and starts a receiver thread. A put copies the caller's rows into free
staging slots and sends the request; a get sends it, and the receiver copies each verified
page from staging into the caller's row when the reply comes. A batch larger than the free
staging waits its turn on a dispatcher thread (FIFO), in pieces of at most the staging size.
A group member (docs/kv-sharing.md "Groups") also maps the group's arena (a memfd with the hello's
reply): a get's reply may say a page is in an arena slot; it is copied from there, and the
slots are released to the owner (RELEASE) once copied.

Failure strategy: the owner's end of the socket closing (its death or close) completes every
request in flight and every one still waiting for staging as failed: False for each page of
a put or get, ConnectionError for a synchronous call; the connection is then ``dead`` and the
store facade reopens on its next call. Nothing waits without bound on a dead owner.

Thread safety: every method may be called from any thread; ``_lock`` guards the staging's free
list, the pending table and the queue; done callbacks run on the receiver thread (or at once
on the caller's if already done), outside that lock.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import json
import mmap
import os
import select
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from . import _shared_fork as _fork
from . import _shared_wire as w
from ._shared_group import NONE

_CALL_TIMEOUT = 60.0  # seconds a synchronous call (contains, stats, ...) waits for its reply


class SharedFuture:
    """The completion of a put or get through a shared store's owner, with the interface of
    the store's native future that ``deepio.kv.Future`` wraps: ``done()``,
    ``result(timeout=None) -> list[bool]`` (TimeoutError when the timeout passes),
    ``add_done_callback(fn)`` (``fn(future)`` once, from the client's receiver thread, or at
    once on the calling thread if already done; an exception in ``fn`` is reported as
    unraisable)."""

    def __init__(self, n: int) -> None:
        self._cond = threading.Condition()
        self._ok = [False] * n
        self._left = 0  # pieces not yet answered
        self._done = n == 0
        self._callbacks: list[Callable[[SharedFuture], Any]] = []

    def done(self) -> bool:
        with self._cond:
            return self._done

    def result(self, timeout: float | None = None) -> list[bool]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError("deepio.kv: the shared store's batch is not done yet")
            return list(self._ok)

    def add_done_callback(self, fn: Callable[[SharedFuture], Any]) -> None:
        with self._cond:
            if not self._done:
                self._callbacks.append(fn)
                return
        self._call(fn)

    def _call(self, fn: Callable[[SharedFuture], Any]) -> None:
        try:
            fn(self)
        except Exception as e:
            _Unraisable(e)  # reported as unraisable (sys.unraisablehook), as the store's futures do

    def _piece_done(self, at: int, ok: Sequence[bool]) -> None:
        with self._cond:
            self._ok[at : at + len(ok)] = ok
            self._left -= 1
            if self._left:
                return
            self._done = True
            self._cond.notify_all()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._call(fn)


class _Unraisable:
    """Hands an exception to sys.unraisablehook: raised from __del__, where Python reports it."""

    def __init__(self, e: BaseException) -> None:
        self.e = e

    def __del__(self) -> None:
        raise self.e


class _ReadOnlyMap:
    """A read-only shared map of a memfd (a group's arena: a member cannot write another's
    pages), unmapped when dropped. Python's mmap gives no address for a read-only map."""

    def __init__(self, fd: int, size: int) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._munmap = libc.munmap
        self.size = size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise OSError(err, f"deepio.kv: cannot map the group's arena: {os.strerror(err)}")
        self.addr = int(addr)

    def __del__(self) -> None:
        if getattr(self, "addr", 0):
            self._munmap(self.addr, self.size)
            self.addr = 0


class _Piece:
    """Up to the staging's size of one batch: rows [at, at + n) of the future's keys."""

    def __init__(
        self, op: int, fut: SharedFuture, at: int, keys: list[bytes], addrs: list[list[tuple[int, int]]]
    ) -> None:
        self.op, self.fut, self.at, self.keys, self.addrs = op, fut, at, keys, addrs
        self.slots: list[int] = []


class Connection:
    def __init__(self, name: bytes, hello: dict[str, Any], page_bytes: int, staging_slots: int) -> None:
        self.page_bytes = page_bytes
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.settimeout(10.0)
            self.sock.connect(name)  # ConnectionRefusedError / FileNotFoundError: nobody serves
            uid, pid = w.peer_uid_pid(self.sock)
            if uid != os.getuid():
                raise PermissionError(
                    f"deepio.kv: the shared store's socket {name[1:].decode()!r} is served by process {pid} "
                    f"of uid {uid}, not this user's (uid {os.getuid()}): refused"
                )
            self.owner_pid = pid
            fd = os.memfd_create("deepio-kv-staging", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, staging_slots * page_bytes)
                self.staging = mmap.mmap(fd, staging_slots * page_bytes)
                msg = w.message(w.HELLO, 0, json.dumps(dict(hello, staging_slots=staging_slots)).encode())
                socket.send_fds(self.sock, [msg], [fd])
            finally:
                os.close(fd)
            self.arena: _ReadOnlyMap | None = None  # a group's arena (docs/kv-sharing.md "Groups")
            self.arena_base = 0
            got = self._hello_reply() if hello.get("group") is not None else w.recv_message(self.sock)
            if got is None:
                raise ConnectionError(f"deepio.kv: the shared store's owner (pid {pid}) hung up at connect")
            if got[0] != w.OK:
                w.raise_error(got[2])
            self.sock.settimeout(None)
        except BaseException:
            self.sock.close()
            raise
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.staging))
        self.free = list(range(staging_slots - 1, -1, -1))
        self.capacity = staging_slots
        self._lock = threading.Condition()
        self.pending: dict[int, Any] = {}  # id -> _Piece, or [event, reply] of a synchronous call
        self.queue: deque[_Piece] = deque()
        self.next_id = 1
        self.dead = False
        self.send_lock = threading.Lock()
        self.receiver = threading.Thread(target=self._receive, name="deepio-kv-shared-client", daemon=True)
        self.receiver.start()
        self.dispatcher: threading.Thread | None = None
        _fork.track(self)

    def _hello_reply(self) -> tuple[int, int, bytes] | None:
        """The hello's reply to a group member, with the group's arena (a memfd) when OK."""
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 1)
        if not msg:
            return None
        try:
            while len(msg) < w.HEADER.size or len(msg) < w.HEADER.size + w.HEADER.unpack_from(msg)[0]:
                more = self.sock.recv(1 << 16)
                if not more:
                    return None
                msg += more
            n, status, rid = w.HEADER.unpack_from(msg)
            if status == w.OK and fds:
                self.arena = _ReadOnlyMap(fds[0], os.fstat(fds[0]).st_size)
                self.arena_base = self.arena.addr
            return status, rid, msg[w.HEADER.size : w.HEADER.size + n]
        finally:
            for fd in fds:
                os.close(fd)

    def after_fork_in_child(self) -> None:
        """In a forked child: closes the child's copy of the socket (no shutdown), so that the
        owner sees this client's end when this process ends, whatever children it forked."""
        self.dead = True
        try:
            self.sock.close()
        except OSError:
            pass

    def peer_gone(self) -> bool:
        """True once the owner's end of the socket has closed (POLLRDHUP; the receiver thread
        may not have read that end yet): a call made now would only fail."""
        if self.dead:
            return True
        p = select.poll()
        p.register(self.sock, select.POLLRDHUP | select.POLLHUP)
        try:
            return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in p.poll(0))
        except (OSError, ValueError):
            return True

    # -- calls ----------------------------------------------------------------------------------
    def pages(self, op: int, keys: list[bytes], addrs: list[list[tuple[int, int]]]) -> SharedFuture:
        """A put or get of len(keys) pages; addrs[i]: page i's (address, nbytes) pieces in the
        caller's host memory, in order (one piece for a pool row)."""
        fut = SharedFuture(len(keys))
        if not keys:
            return fut
        pieces = [
            _Piece(op, fut, at, keys[at : at + self.capacity], addrs[at : at + self.capacity])
            for at in range(0, len(keys), self.capacity)
        ]
        fut._left = len(pieces)
        with self._lock:
            ready = not self.dead and not self.queue and len(self.free) >= len(keys)
            if ready:
                for p in pieces:
                    p.slots = [self.free.pop() for _ in p.keys]
            elif not self.dead:
                self.queue.extend(pieces)
                if self.dispatcher is None:
                    self.dispatcher = threading.Thread(
                        target=self._dispatch, name="deepio-kv-shared-queue", daemon=True
                    )
                    self.dispatcher.start()
                self._lock.notify_all()
                return fut
        if not ready:  # dead: every page failed
            for p in pieces:
                fut._piece_done(p.at, [False] * len(p.keys))
            return fut
        for p in pieces:
            self._send_piece(p)
        return fut

    def call(self, op: int, body: bytes = b"") -> bytes:
        """A synchronous request: its reply's body. ConnectionError if the owner is gone (before
        or during the call), TimeoutError after _CALL_TIMEOUT seconds; the owner's error as is."""
        ev = threading.Event()
        slot: list[Any] = [ev, None]
        with self._lock:
            if self.dead:
                raise ConnectionError("deepio.kv: the shared store's owner is gone")
            rid = self.next_id
            self.next_id += 1
            self.pending[rid] = slot
        self._send(w.message(op, rid, body))
        if not ev.wait(_CALL_TIMEOUT):
            with self._lock:
                self.pending.pop(rid, None)
            raise TimeoutError(
                f"deepio.kv: the shared store's owner (pid {self.owner_pid}) did not answer in {_CALL_TIMEOUT} s"
            )
        status, reply = slot[1]
        if status is None:
            raise ConnectionError(f"deepio.kv: the shared store's owner (pid {self.owner_pid}) is gone")
        if status != w.OK:
            w.raise_error(reply)
        return bytes(reply)

    def close(self) -> None:
        """Waits for the requests in flight (or the owner's end), then hangs up. From a done
        callback (the receiver thread, which answers them) that wait runs on a thread of its own."""
        if threading.current_thread() is self.receiver:
            threading.Thread(target=self.close, name="deepio-kv-shared-close", daemon=True).start()
            return
        with self._lock:
            self._lock.wait_for(lambda: self.dead or (not self.pending and not self.queue))
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.receiver.join()
        self.sock.close()

    # -- internals ------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            with self.send_lock:
                self.sock.sendall(data)
        except OSError:
            self._lost()  # the receiver may not have seen the end yet

    def _send_piece(self, p: _Piece) -> None:
        pb = self.page_bytes
        lengths = [sum(n for _, n in a) for a in p.addrs]
        if p.op == w.PUT:
            for slot, addr in zip(p.slots, p.addrs):
                at = self.base + slot * pb
                for src, n in addr:
                    ctypes.memmove(at, src, n)  # releases the GIL
                    at += n
        with self._lock:
            if self.dead:
                self._release(p.slots)
                fail = True
            else:
                rid = self.next_id
                self.next_id += 1
                self.pending[rid] = p
                fail = False
        if fail:
            p.fut._piece_done(p.at, [False] * len(p.keys))
            return
        self._send(w.message(p.op, rid, w.encode_pages(p.slots, lengths, p.keys)))

    def _release(self, slots: list[int]) -> None:  # under _lock
        self.free.extend(slots)
        self._lock.notify_all()

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self.dead or (self.queue and len(self.free) >= len(self.queue[0].keys)))
                if self.dead:
                    return  # _lost failed the queue
                p = self.queue.popleft()
                p.slots = [self.free.pop() for _ in p.keys]
            self._send_piece(p)

    def _receive(self) -> None:
        try:
            while True:
                got = w.recv_message(self.sock)
                if got is None:
                    break
                status, rid, body = got
                with self._lock:
                    item = self.pending.pop(rid, None)
                if isinstance(item, _Piece):
                    self._answer(item, status, body)
                elif item is not None:
                    item[1] = (status, body)
                    item[0].set()
                with self._lock:
                    self._lock.notify_all()
        except (OSError, ValueError, struct.error):
            pass
        self._lost()

    def _answer(self, p: _Piece, status: int, body: bytes) -> None:
        n_keys = len(p.keys)
        where: Sequence[int] = ()
        if self.arena is not None and p.op == w.GET and status == w.OK and len(body) == 5 * n_keys:
            where = struct.unpack(f"<{n_keys}I", body[n_keys:])  # a group's arena slots
            body = body[:n_keys]
        ok = [b == 1 for b in body] if status == w.OK and len(body) == n_keys else [False] * n_keys
        if p.op == w.GET:
            pb = self.page_bytes
            release = []
            for i, (slot, addr) in enumerate(zip(p.slots, p.addrs)):
                if where and where[i] != NONE:
                    release.append(where[i])
                if ok[i]:
                    at = self.base + slot * pb
                    if where and where[i] != NONE:
                        at = self.arena_base + where[i] * pb
                    for dst, n in addr:
                        ctypes.memmove(dst, at, n)
                        at += n
            if release:  # copied: the owner may reuse those slots
                self._send(w.message(w.RELEASE, 0, struct.pack(f"<{len(release)}I", *release)))
        with self._lock:
            self._release(p.slots)
        p.fut._piece_done(p.at, ok)

    def _lost(self) -> None:
        """The owner's end is gone: everything in flight or queued fails, now and for good."""
        with self._lock:
            if self.dead:
                return
            self.dead = True
            pending, self.pending = self.pending, {}
            queued, self.queue = list(self.queue), deque()
            self._lock.notify_all()
        for item in list(pending.values()) + queued:
            if isinstance(item, _Piece):
                item.fut._piece_done(item.at, [False] * len(item.keys))
            else:
                item[1] = (None, b"")
                item[0].set()


def connect_refused(e: OSError) -> bool:
    """True for the errors of a socket name nobody serves (yet)."""
    return isinstance(e, (ConnectionRefusedError, FileNotFoundError)) or e.errno in (_errno.ECONNREFUSED, _errno.ENOENT)
