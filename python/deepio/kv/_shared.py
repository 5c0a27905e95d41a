"""``deepio.kv.Store(folders, ..., shared=True)``: one store per node, shared by its processes
(docs/kv-sharing.md, "Sharing a store between processes").

The first process to open the folders owns the store (it holds their ``kv.lock``, as an
unshared store does) and serves it on an abstract Unix socket named from the folders
(``_shared_server``); a process that then finds the folders locked connects to that owner as a
client (``_shared_client``) and gets the same API. Every call of a client goes through the
owner's one store, so each process sees the others' completed puts at once, and every get is
verified by the owner's store (its CRC): a stale or reused slot is a miss, never wrong bytes.

Failure strategy: when the owner dies or closes, a client's calls in flight fail (False per
page; ConnectionError for a synchronous call already sent), and its next call reopens: it takes
the lock and becomes the owner (the store's crash recovery), or, where another client was
first, connects to that one. A client that dies costs the owner nothing but its staging map.

Thread safety: every call may come from any thread; ``_mode_lock`` guards the switch from
client to owner.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from deepio import _deepio

from . import MAX_KEY_BYTES, Future, Key, Store
from . import _shared_wire as w
from ._shared_client import Connection, SharedFuture, connect_refused
from ._shared_group import NONE, check_group
from ._shared_server import Server

#: Seconds a process keeps trying to open or reach a store whose folders are locked while no
#: one serves them yet (an owner that is still opening, or one that just died).
OPEN_TIMEOUT = 30.0
#: The staging region of a client: this many bytes (at least 4 pages).
STAGING_BYTES = 64 << 20

# File systems where a shared store is refused: their locks and memory are not one host's.
_NETWORK_FS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "9p", "afs", "coda", "ncpfs", "lustre",
    "gpfs", "glusterfs", "ocfs2", "gfs2", "beegfs", "orangefs", "pvfs2", "fuse.sshfs",
    "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.glusterfs", "fuse.ceph-fuse",
    "fuse.juicefs", "fuse.blobfuse", "fuse.blobfuse2", "fuse.goofys", "fuse.mountpoint-s3",
    "fuse.cephfs", "fuse.lizardfs", "fuse.moosefs", "fuse.weka", "wekafs",
}  # fmt: skip


def file_system_type(path: str) -> str:
    """The type of the file system holding ``path`` as /proc/self/mountinfo names it ("ext4",
    "nfs4", "fuse.sshfs"), matched by device number; "" when not found."""
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == want and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        pass
    return ""


def is_network_fs(fstype: str) -> bool:
    return fstype in _NETWORK_FS or fstype.split(".")[0] in _NETWORK_FS


def _pool_rows(pool: Any, page_bytes: int) -> tuple[int, int]:
    """(address of row 0, rows) of a CPU pool [slots, page_bytes], checked as the store checks
    a pool; ValueError otherwise (a CUDA pool: not through a shared store's client yet)."""
    import ctypes

    from deepio import _buffers

    if _buffers.is_device_buffer(pool):
        raise ValueError("deepio.kv: a shared store's client takes CPU pools only (CUDA pools: owner only, for now)")
    if _buffers.is_torch_tensor(pool):
        if pool.dim() != 2 or not pool.is_contiguous() or pool.shape[1] * pool.element_size() != page_bytes:
            raise ValueError(f"deepio.kv: the pool must be 2-D [slots, {page_bytes} bytes], C-contiguous")
        return int(pool.data_ptr()), int(pool.shape[0])
    mv = memoryview(pool)
    if mv.ndim != 2 or not mv.c_contiguous or mv.shape[1] * mv.itemsize != page_bytes:  # type: ignore[index]
        raise ValueError(f"deepio.kv: the pool must be 2-D [slots, {page_bytes} bytes], C-contiguous")
    if mv.readonly:
        raise ValueError("deepio.kv: the pool must be writable")
    if mv.nbytes == 0:
        return 0, 0
    return ctypes.addressof(ctypes.c_char.from_buffer(mv)), int(mv.shape[0])  # type: ignore[index]


class SharedStore(Store):
    """A Store opened with ``shared=True``: the owner's Store, or a client of another process's.
    Same calls and results as Store; ``is_owner`` says which this process is now."""

    def __init__(
        self,
        folders: Any,
        capacity_bytes: int = 0,
        page_bytes: int = 2 << 20,
        *,
        shared: bool = True,
        group: tuple[str, int, int] | None = None,
        **options: Any,
    ) -> None:
        #: (name, rank, size) of this process's group (docs/kv-sharing.md, "Groups"), or None.
        self.group = None if group is None else check_group(group)
        if isinstance(folders, (str, bytes, os.PathLike)):
            folders = [folders]
        self.folders = [os.fsdecode(os.fspath(f)) for f in folders]
        self.fingerprint = options.get("fingerprint", "")
        self._args = (capacity_bytes, page_bytes)
        self._options = options
        self._page_bytes = page_bytes
        self._pid = os.getpid()
        self._mode_lock = threading.Lock()
        self._owner: Store | None = None
        self._server: Server | None = None
        self._conn: Connection | None = None
        self._pool: Any = None
        self._pool_at: tuple[int, int] = (0, 0)
        self._pool_host = False  # the pool is CPU memory (a group's get in the owner copies into it)
        self._closed = False
        for f in self.folders:
            os.makedirs(f, exist_ok=True)
            fstype = file_system_type(f)
            if is_network_fs(fstype):
                raise OSError(
                    _errno.EOPNOTSUPP,
                    f"deepio.kv: a shared store needs a local file system; {f} is on {fstype} "
                    "(its locks and the owner's socket are not one host's)",
                    f,
                )
        self._attach()

    # -- opening: owner or client ---------------------------------------------------------------
    def _attach(self) -> None:
        """Becomes the owner or a client (under _mode_lock, or in the constructor)."""
        name, ids = w.socket_name(self.folders)
        capacity_bytes, page_bytes = self._args
        hello = {"page_bytes": page_bytes, "fingerprint": self.fingerprint, "folders": ids, "pid": os.getpid()}
        if self.group is not None:
            hello["group"] = list(self.group)
        deadline = time.monotonic() + OPEN_TIMEOUT
        delay = 0.005
        while True:
            try:
                store = Store(self.folders, capacity_bytes, page_bytes, **self._options)
            except OSError as e:
                if e.errno != _errno.EBUSY:
                    raise
                busy = e
            else:
                try:
                    self._server = Server(store, self.folders, self.fingerprint)
                except BaseException:
                    store.close()
                    raise
                self._owner, self._conn = store, None
                if self.group is not None:
                    self._server.hub.join(self.group[0], self.group[2])
                if self._pool is not None:
                    store.register(self._pool)
                return
            try:
                slots = max(4, STAGING_BYTES // max(page_bytes, 1))
                self._conn = Connection(name, hello, page_bytes, slots)
                self._owner = None
                return
            except OSError as e:  # nobody serves yet, or an owner that is dying: again
                if not (connect_refused(e) or isinstance(e, ConnectionError)):
                    raise
            if time.monotonic() > deadline:
                raise OSError(
                    _errno.EBUSY,
                    f"{busy.strerror or busy}; and no process serves it as a shared store: its owner "
                    f"opened it with shared=False (or is still opening it after {OPEN_TIMEOUT:.0f} s)",
                    self.folders[0],
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _live(self) -> tuple[Store | None, Connection | None]:
        """The owner's store or the connection to use now; reopens after the owner went away."""
        if os.getpid() != self._pid:
            raise _deepio.ForkedHandleError(
                "deepio.kv: this shared store was opened in another process (before a fork); open it anew"
            )
        with self._mode_lock:
            if self._closed:
                raise ValueError("deepio.kv: operation on a closed store")
            if self._owner is None and (self._conn is None or self._conn.peer_gone()):
                if self._conn is not None:
                    self._conn._lost()  # what is in flight fails (the receiver may not know yet)
                    self._conn = None
                self._attach()  # (again, when an earlier reopen raised to its caller)
            return self._owner, self._conn

    def _call(self, op: int, body: bytes = b"") -> bytes:
        """A synchronous request through the owner; once more after a reopen if the owner went
        (made here when that reopen made this process the owner)."""
        for attempt in (0, 1):
            owner, conn = self._live()
            if conn is None:  # took the store over since the caller looked (or in the retry)
                assert self._server is not None
                return self._server.answer(op, body)
            try:
                return conn.call(op, body)
            except ConnectionError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    @property
    def is_owner(self) -> bool:
        """True while this process owns the store (and serves it to the others)."""
        return self._owner is not None

    # -- the Store API ----------------------------------------------------------------------------
    def register(self, pool: Any) -> None:
        owner, conn = self._live()
        if owner is not None:
            owner.register(pool)
            try:
                self._pool_at, self._pool_host = _pool_rows(pool, self._page_bytes), True
            except ValueError:
                self._pool_host = False  # a CUDA pool: the owner's gets do not go through the group
        else:
            self._pool_at, self._pool_host = _pool_rows(pool, self._page_bytes), True
        self._pool = pool  # registered again with a store this process comes to own

    def _rows(self, slots: Iterable[int], n: int) -> list[list[tuple[int, int]]]:
        base, rows = self._pool_at
        if self._pool is None:
            raise ValueError("deepio.kv: register a pool before put/get")
        out = []
        for s in slots:
            s = int(s)
            if not 0 <= s < rows:
                raise ValueError(f"deepio.kv: slot {s} is outside the pool's {rows} rows")
            out.append([(base + s * self._page_bytes, self._page_bytes)])
        if len(out) != n:
            raise ValueError(f"deepio.kv: {n} keys but {len(out)} slots")
        return out

    def _pages(self, op: int, keys: Sequence[Key], addrs: list[list[tuple[int, int]]], conn: Connection) -> Future:
        # The same deepio.kv.Future as the owner's (a concurrent.futures.Future), over the
        # client's own completion (SharedFuture) instead of the store's native one.
        return Future(conn.pages(op, w.key_bytes(keys, MAX_KEY_BYTES), addrs))

    def _grouped(self, put: bool, keys: Sequence[Key], addrs: list[list[tuple[int, int]]]) -> Future:
        """A put or get of the owner's own, through its group (the hub, like its clients')."""
        server = self._server
        assert server is not None and self.group is not None
        kb = w.key_bytes(keys, MAX_KEY_BYTES)
        fut = SharedFuture(len(kb))
        fut._left = 1
        hub = server.hub

        def reply(ok: list[bool], slots: list[int]) -> None:
            arena = hub.arena
            if arena is not None:  # the pages in the group's arena: copied here, then released
                for i, s in enumerate(slots):
                    if ok[i] and s != NONE:
                        at = arena.base + s * arena.page_bytes
                        for dst, n in addrs[i]:
                            ctypes.memmove(dst, at, n)
                            at += n
                hub.release([s for s in slots if s != NONE])
            fut._piece_done(0, ok)

        (hub.put if put else hub.get)(self.group, kb, addrs, reply)
        return Future(fut)

    def _changed(self, keys: Sequence[Key] | None, puts_too: bool = False) -> None:
        server = self._server
        if server is not None:
            server.hub.changed(None if keys is None else w.key_bytes(keys, MAX_KEY_BYTES), puts_too)

    def put(self, keys: Sequence[Key], slots: Iterable[int]) -> Future:
        owner, conn = self._live()
        if owner is not None:
            if self.group is not None and self._pool_host:
                return self._grouped(True, keys, self._rows(slots, len(keys)))
            self._changed(keys)
            return owner.put(keys, slots)
        assert conn is not None
        return self._pages(w.PUT, keys, self._rows(slots, len(keys)), conn)

    def get(self, keys: Sequence[Key], slots: Iterable[int]) -> Future:
        owner, conn = self._live()
        if owner is not None:
            if self.group is not None and self._pool_host:
                return self._grouped(False, keys, self._rows(slots, len(keys)))
            return owner.get(keys, slots)
        assert conn is not None
        return self._pages(w.GET, keys, self._rows(slots, len(keys)), conn)

    def _segments(
        self, keys: Sequence[Key], segments: Sequence[Sequence[tuple[int, int]]]
    ) -> list[list[tuple[int, int]]]:
        if len(segments) != len(keys):
            raise ValueError(f"deepio.kv: {len(keys)} keys but {len(segments)} segment lists")
        out = []
        for i, seg in enumerate(segments):
            pieces = [(int(a), int(n)) for a, n in seg]
            if sum(n for _, n in pieces) > self._page_bytes:
                raise ValueError(f"deepio.kv: page {i}'s segments exceed page_bytes {self._page_bytes}")
            out.append(pieces)
        return out

    def put_segments(self, keys: Sequence[Key], segments: Sequence[Sequence[tuple[int, int]]]) -> Future:
        owner, conn = self._live()
        if owner is not None:
            if self.group is not None:
                return self._grouped(True, keys, self._segments(keys, segments))
            self._changed(keys)
            return owner.put_segments(keys, segments)
        assert conn is not None
        return self._pages(w.PUT, keys, self._segments(keys, segments), conn)

    def get_segments(self, keys: Sequence[Key], segments: Sequence[Sequence[tuple[int, int]]]) -> Future:
        owner, conn = self._live()
        if owner is not None:
            if self.group is not None:
                return self._grouped(False, keys, self._segments(keys, segments))
            return owner.get_segments(keys, segments)
        assert conn is not None
        return self._pages(w.GET, keys, self._segments(keys, segments), conn)

    def exists(self, keys: Sequence[Key]) -> int:
        owner, _ = self._live()
        if owner is not None:
            return owner.exists(keys)
        return int.from_bytes(
            self._call(w.EXISTS, w.encode_keys(w.key_bytes(keys, MAX_KEY_BYTES))), "little", signed=True
        )

    def contains(self, keys: Sequence[Key]) -> list[bool]:
        owner, _ = self._live()
        if owner is not None:
            return owner.contains(keys)
        return [b == 1 for b in self._call(w.CONTAINS, w.encode_keys(w.key_bytes(keys, MAX_KEY_BYTES)))]

    def remove(self, keys: Sequence[Key]) -> int:
        owner, _ = self._live()
        if owner is not None:
            self._changed(keys, puts_too=True)
            return owner.remove(keys)
        return int.from_bytes(
            self._call(w.REMOVE, w.encode_keys(w.key_bytes(keys, MAX_KEY_BYTES))), "little", signed=True
        )

    def clear(self) -> int:
        owner, _ = self._live()
        if owner is not None:
            self._changed(None, puts_too=True)
            return owner.clear()
        return int.from_bytes(self._call(w.CLEAR), "little", signed=True)

    def checkpoint(self) -> None:
        owner, _ = self._live()
        if owner is not None:
            owner.checkpoint()
        else:
            self._call(w.CHECKPOINT)

    def retry_failed(self) -> int:
        owner, _ = self._live()
        if owner is not None:
            return owner.retry_failed()
        return int.from_bytes(self._call(w.RETRY), "little", signed=True)

    def stats(self) -> dict[str, Any]:
        """The store's stats (the owner's), plus ``shared_role`` ("owner"/"client") and
        ``shared_clients`` (clients connected to the owner)."""
        import json

        owner, _ = self._live()
        if owner is not None:
            st = owner.stats()
            server = self._server
            st["shared_clients"] = server.client_count if server is not None else 0
            st.update(server.hub.stats() if server is not None else {})
            st["shared_role"] = "owner"
            return st
        st = json.loads(self._call(w.STATS))
        st["shared_role"] = "owner" if self.is_owner else "client"
        return dict(st)

    @property
    def page_bytes(self) -> int:
        return self._page_bytes if self._owner is None else self._owner.page_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Client: waits for its requests in flight, then hangs up. Owner: stops serving, closes
        the store (every batch in flight finishes, the checkpoint is written), then hangs up on
        the clients (their next call reopens: one of them becomes the owner). Idempotent."""
        if os.getpid() != self._pid:
            raise _deepio.ForkedHandleError("deepio.kv: this shared store was opened in another process")
        with self._mode_lock:
            if self._closed:
                return
            self._closed = True
            owner, server, conn = self._owner, self._server, self._conn
        if conn is not None:
            conn.close()
            self._conn = None  # its staging map goes with it
        if server is not None:
            server.close()
        try:
            if owner is not None:
                owner.close()
        finally:
            if server is not None:
                server.drop_clients()

    def _warn(self) -> None:
        pass  # the owner's store warns in the owner's process

    def __del__(self) -> None:
        # Dropped without close(): close now (an owner's server thread would keep its store
        # open and locked for as long as the process lives). Not in a forked child.
        if not getattr(self, "_closed", True) and getattr(self, "_pid", None) == os.getpid():
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        role = "closed" if self._closed else ("owner" if self.is_owner else "client")
        return f"deepio.kv.Store({self.folders!r}, shared=True, {role})"


__all__ = ["SharedStore", "file_system_type", "is_network_fs"]
