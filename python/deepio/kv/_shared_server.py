"""The owner's side of a shared deepio.kv store: serves its Store to client processes.

Lifecycle: ``Server(store, folders, fingerprint)`` binds the abstract socket and starts one
thread that accepts clients and reads their requests. A client's HELLO brings its staging memfd
(mapped here) and its options (refused, naming both, when they differ from the owner's). A
PUT/GET becomes one ``put_segments``/``get_segments`` of the owner's store over the client's
staging slots; its reply is sent by the future's done callback (the store's batch thread).
The other requests run on the server thread.

Failure strategy: a client that hangs up (EOF, a reset, a malformed message, 10 s without
taking a reply) is dropped: its socket closes; its staging map stays until the last of its
batches in flight is done (each done callback holds it), so the store never writes into
memory that is gone. The owner's store is never closed by a client.

Thread safety: a client's socket is written under its own lock (server thread and batch
threads); ``close()`` stops the thread, then the caller closes the store, then
``drop_clients()`` hangs up on the clients (their calls in flight then complete as failed).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import json
import mmap
import os
import selectors
import socket
import struct
import threading
import time
from typing import Any

from . import _shared_fork as _fork
from . import _shared_wire as w
from ._shared_group import NONE, Arena, Hub, check_group

#: Bytes of the arena a group's reads land in (a memfd every member maps; docs/kv-sharing.md "Groups").
ARENA_BYTES = 256 << 20

_IO_TIMEOUT = 10.0  # seconds a client may take to send the rest of a message or take a reply


class _Client:
    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.send_lock = threading.Lock()
        self.staging: mmap.mmap | None = None
        self.base = 0
        self.slots = 0
        self.page_bytes = 0
        self.group: tuple[str, int, int] | None = None  # (name, rank, size): docs/kv-sharing.md "Groups"
        self.left = False  # its group was told it left
        self.held: dict[int, int] = {}  # arena slot -> pages this client has yet to release
        self.gone = False

    def send(self, data: bytes) -> None:
        with self.send_lock:
            if self.gone:
                return
            try:
                self.sock.sendall(data)
            except OSError:
                self.gone = True
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # the server thread sees EOF, drops it
                except OSError:
                    pass


class Server:
    def __init__(self, store: Any, folders: list[str], fingerprint: str) -> None:
        self.store = store  # a deepio.kv.Store (shared=False), owned by the caller
        self.hub = Hub(store)  # the groups' coalesced gets and puts (_shared_group)
        self.fingerprint = fingerprint
        self.name, self.ids = w.socket_name(folders)
        self.uid = os.getuid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        deadline = time.monotonic() + 2.0
        while True:
            try:
                self.listener.bind(self.name)
                break
            except OSError as e:
                if e.errno != _errno.EADDRINUSE or time.monotonic() > deadline:
                    self.listener.close()
                    raise OSError(
                        e.errno,
                        f"deepio.kv: cannot serve the shared store on the abstract socket "
                        f"{self.name[1:].decode()!r}: {e.strerror} (another process holds that name)",
                    ) from None
                time.sleep(0.05)
        self.listener.listen(64)
        self.clients: dict[int, _Client] = {}
        self.lock = threading.Lock()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="deepio-kv-shared-server", daemon=True)
        self.thread.start()
        _fork.track(self)

    @property
    def client_count(self) -> int:
        with self.lock:
            return len(self.clients)

    def close(self) -> None:
        """Stops accepting and reading requests (idempotent); replies of batches in flight
        still go out as they complete."""
        if self.stopping:
            return
        self.stopping = True
        self.hub.close()
        os.write(self.wake_w, b"x")
        if threading.current_thread() is not self.thread:
            self.thread.join()

    def after_fork_in_child(self) -> None:
        """In a forked child: closes the child's copies of the sockets (no shutdown: the
        parent's stay as they are), so that the parent's death still ends its clients' sockets."""
        self.stopping = True
        for sock in [self.listener, *(c.sock for c in list(self.clients.values()))]:
            try:
                sock.close()
            except OSError:
                pass

    def drop_clients(self) -> None:
        with self.lock:
            clients = list(self.clients.values())
            self.clients.clear()
        for c in clients:
            self._hang_up(c)
        for fd in (self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the server thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopping:
                events = self.sel.select()
                while events and not self.stopping:  # no name keeps a dropped client (its staging)
                    self._event(events.pop()[0])
        finally:
            self.sel.close()
            self.listener.close()

    def _event(self, key: selectors.SelectorKey) -> None:
        try:
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj != self.wake_r:
                self._serve(key.data)
        except Exception:  # never lose the thread that every client waits on
            if isinstance(key.data, _Client):
                self._hang_up(key.data)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.settimeout(_IO_TIMEOUT)
        uid, pid = w.peer_uid_pid(sock)
        c = _Client(sock, pid)
        try:
            self._hello(c, uid)
        except Exception as e:  # a refusal or a broken client: it hears why, if it still listens
            c.send(w.message(w.ERR, 0, w.error_body(e)))
            self._hang_up(c)
            return
        with self.lock:
            self.clients[sock.fileno()] = c
        self.sel.register(sock, selectors.EVENT_READ, c)

    def _hello(self, c: _Client, uid: int) -> None:
        msg, fds, _flags, _addr = socket.recv_fds(c.sock, 1 << 16, 1)
        for fd in fds[1:]:
            os.close(fd)
        try:
            if len(msg) >= w.HEADER.size:  # the rest of a hello the stream cut (it is small)
                rest = w.HEADER.size + w.HEADER.unpack_from(msg)[0] - len(msg)
                msg += (w.recv_exact(c.sock, rest) or b"") if 0 < rest <= 1 << 16 else b""
            if uid != self.uid:
                raise PermissionError(
                    f"deepio.kv: a shared store is served only to its owner's user (uid {self.uid}); "
                    f"the process {c.pid} runs as uid {uid}"
                )
            (n, op, _rid) = w.HEADER.unpack_from(msg)
            if op != w.HELLO or len(msg) != w.HEADER.size + n or not fds:
                raise ValueError("deepio.kv shared store: the client did not start with a hello and its staging")
            hello = json.loads(msg[w.HEADER.size :])
            page_bytes = self.store.page_bytes
            if hello["folders"] != self.ids:
                raise ValueError("deepio.kv: the client opened other folders than the owner's shared store")
            if hello["page_bytes"] != page_bytes or hello["fingerprint"] != self.fingerprint:
                import deepio

                raise deepio.InvalidArgumentError(
                    f"deepio.kv: a shared store's options differ: this process asked page_bytes="
                    f"{hello['page_bytes']}, fingerprint={hello['fingerprint']!r}; the store's owner "
                    f"(pid {os.getpid()}) has page_bytes={page_bytes}, fingerprint={self.fingerprint!r}"
                )
            if hello.get("group") is not None:
                group = check_group(tuple(hello["group"]))
                self.hub.join(group[0], group[2])
                c.group = group  # after the join: a refused member never leaves
                if self.hub.arena is None:
                    self.hub.arena = Arena(self.store.page_bytes, ARENA_BYTES)
            c.slots = int(hello["staging_slots"])
            c.page_bytes = page_bytes
            c.staging = mmap.mmap(fds[0], c.slots * page_bytes)
            c.base = ctypes.addressof(ctypes.c_char.from_buffer(c.staging))
        finally:
            os.close(fds[0]) if fds else None
        reply = w.message(w.OK, 0, json.dumps({"pid": os.getpid(), "page_bytes": page_bytes}).encode())
        arena = self.hub.arena if c.group is not None else None
        if arena is None:
            c.send(reply)
            return
        with c.send_lock:  # a member maps the arena: its memfd goes with the reply
            socket.send_fds(c.sock, [reply], [arena.fd])

    def _hang_up(self, c: _Client) -> None:
        with c.send_lock:
            c.gone = True
            held, c.held = c.held, {}
        self.hub.release([s for s, n in held.items() for _ in range(n)])  # copied or not: gone
        if c.group is not None and not c.left:
            c.left = True
            self.hub.leave(c.group[0])
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError, RuntimeError):
            pass
        with self.lock:
            self.clients.pop(c.sock.fileno(), None)
        c.sock.close()  # the staging map goes with the last done callback that holds c

    def _serve(self, c: _Client) -> None:
        try:
            got = w.recv_message(c.sock)
        except OSError:
            got = None
        if got is None:
            self._hang_up(c)
            return
        op, rid, body = got
        try:
            self._request(c, op, rid, body)
        except Exception as e:
            c.send(w.message(w.ERR, rid, w.error_body(e)))

    def _request(self, c: _Client, op: int, rid: int, body: bytes) -> None:
        store = self.store
        if op in (w.PUT, w.GET):
            slots, lengths, keys = w.decode_pages(body)
            segments = []
            for s, n in zip(slots, lengths):
                if s >= c.slots or n > c.page_bytes:  # never outside the client's staging
                    raise ValueError(f"deepio.kv shared store: staging slot {s} ({n} bytes) out of range")
                segments.append([(c.base + s * c.page_bytes, n)])
            if c.group is not None:

                def reply(ok: list[bool], slots: list[int], c: _Client = c, rid: int = rid) -> None:
                    body = bytes(1 if x else 0 for x in ok)  # c keeps the staging mapped
                    if op == w.GET:  # and where each page is: an arena slot, or the staging
                        body += struct.pack(f"<{len(slots)}I", *slots)
                        with c.send_lock:
                            if not c.gone:
                                for s in slots:
                                    if s != NONE:
                                        c.held[s] = c.held.get(s, 0) + 1
                                slots = []
                        self.hub.release([s for s in slots if s != NONE])  # a member gone
                    c.send(w.message(w.OK, rid, body))

                (self.hub.put if op == w.PUT else self.hub.get)(c.group, keys, segments, reply)
                return
            if op == w.PUT:
                self.hub.changed(keys)
            call = store.put_segments if op == w.PUT else store.get_segments
            fut = call(keys, segments)

            def done(f: Any, c: _Client = c, rid: int = rid) -> None:  # c keeps the staging mapped
                try:
                    ok = bytes(1 if x else 0 for x in f.result())
                except Exception as e:
                    c.send(w.message(w.ERR, rid, w.error_body(e)))
                    return
                c.send(w.message(w.OK, rid, ok))

            fut.add_done_callback(done)
            return
        if op == w.RELEASE:  # a member copied its pages out of these arena slots: no reply
            mine = []  # only what it holds: a slot it was never given is not its to release
            with c.send_lock:
                for s in struct.unpack(f"<{len(body) // 4}I", body):
                    if c.held.get(s, 0) > 0:
                        c.held[s] -= 1
                        mine.append(s)
                        if not c.held[s]:
                            del c.held[s]
            self.hub.release(mine)
            return
        c.send(w.message(w.OK, rid, self.answer(op, body)))

    def answer(self, op: int, body: bytes) -> bytes:
        """The reply's body of a synchronous request (not a put or get), made by the owner's
        store: for a client's request, or the owner's own retry of one it had sent as a client
        before it took the store over."""
        store = self.store
        if op == w.CONTAINS:
            out = bytes(1 if x else 0 for x in store.contains(w.decode_keys(body)))
        elif op in (w.EXISTS, w.REMOVE):
            keys = w.decode_keys(body)
            if op == w.REMOVE:
                self.hub.changed(keys, puts_too=True)
            out = struct.pack("<q", (store.exists if op == w.EXISTS else store.remove)(keys))
        elif op in (w.CLEAR, w.RETRY):
            if op == w.CLEAR:
                self.hub.changed(None, puts_too=True)
            out = struct.pack("<q", store.clear() if op == w.CLEAR else store.retry_failed())
        elif op == w.CHECKPOINT:
            store.checkpoint()
            out = b""
        elif op == w.STATS:
            st = store.stats()
            st["shared_clients"] = self.client_count
            st.update(self.hub.stats())
            out = json.dumps(st).encode()
        else:
            raise ValueError(f"deepio.kv shared store: unknown request {op}")
        return out
