"""Groups of a shared deepio.kv store: the members' gets of the same keys are read once
(docs/kv-sharing.md, "Groups: one read per node for the ranks that want the same pages").

``Store(folders, shared=True, group=(name, rank, size))`` makes this process member ``rank``
of group ``name`` (``size`` members). A group lives in the owner (``Hub``, one per served
store): a member's get (a client's, or the owner's own) asks the hub, which, per key, either
joins a read of that key the group already has (in flight, or done within ``WINDOW`` seconds
and not yet taken by this rank), or starts one: the owner's store reads the page once (and
verifies it: key, generation, CRC) into a slot of the ``Arena``, a memfd every member maps
(the server sends it with the hello's reply). Each member is told the slot and copies the page
into its own memory itself, then releases the slot; a slot is reused once its read is dropped
and all it was given to released it. A key's read is dropped once all ``size`` members took
it, or ``WINDOW`` seconds after it completed; a member that asks later reads it again (nobody
waits on a member). With the arena full, the read goes straight into the first member's memory
and the hub copies it to the others (and keeps a copy for members still to come).
Puts: a member's put of a key that another member of the group has in flight, or completed
within ``WINDOW`` seconds (and this rank has not put since), is not written again: it
completes with that put's result (the members of a group put the same bytes: TP ranks of an
MLA model). Any put, remove or clear drops the group reads of those keys.

Failure strategy: a read belongs to the hub, not to the member that started it: a member that
dies mid-batch costs the others nothing; the server releases its slots at its hang-up. A read
that fails or misses answers False to every member that joined it. Past ``MAX_BYTES`` of pages
kept on the copying path, a key is not kept for members still to come (they read it again).

Thread safety: ``_lock`` guards the tables, the arena's free list and the slots' counts; reads
complete on the store's batch threads, where the copies of the copying path run
(ctypes.memmove, without the GIL, on up to COPY_THREADS more threads) outside the lock.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Seconds a group's completed read (or put) stays for the members that have not taken it.
WINDOW = 2.0
#: Threads that copy a group's pages to its members in parallel (besides the batch thread).
COPY_THREADS = 3
#: Bytes of pages the hub holds for groups at most (over that, keys are not shared).
MAX_BYTES = 1 << 30

Segments = list[list[tuple[int, int]]]


def check_group(group: Any) -> tuple[str, int, int]:
    """(name, rank, size) checked: ValueError naming what is wrong."""
    if not isinstance(group, (tuple, list)) or len(group) != 3:
        raise ValueError(f"deepio.kv: group must be a tuple (name, rank, size), not {group!r}")
    name, rank, size = group
    if not isinstance(name, str) or not name:
        raise ValueError(f"deepio.kv: a group's name must be a non-empty str, not {name!r}")
    for what, v in (("rank", rank), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"deepio.kv: a group's {what} must be an int, not {v!r}")
    if size < 1:
        raise ValueError(f"deepio.kv: a group's size must be >= 1, not {size}")
    if not 0 <= rank < size:
        raise ValueError(f"deepio.kv: a group's rank must be in [0, {size}), not {rank}")
    return name, rank, size


NONE = 0xFFFFFFFF  # no arena slot: the page is in the member's own memory


class Arena:
    """A memfd of pages every member maps (the owner's clients read-only): a group's read lands
    in a slot, and each member copies its page from there itself (the owner copies none)."""

    def __init__(self, page_bytes: int, nbytes: int) -> None:
        self.page_bytes = page_bytes
        self.slots = max(nbytes // max(page_bytes, 1), 1)
        self.fd = os.memfd_create("deepio-kv-group-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.slots * page_bytes)
        self.map = mmap.mmap(self.fd, self.slots * page_bytes)
        view = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(view)
        del view
        self.free = list(range(self.slots - 1, -1, -1))


class _Request:
    """One member's get or put of n keys: answers ``reply(ok, slots)`` once every key resolved
    (slots[i]: the arena slot key i's page is in, for the member to copy and release; NONE)."""

    def __init__(self, n: int, reply: Callable[[list[bool], list[int]], Any]) -> None:
        self.ok = [False] * n
        self.slots = [NONE] * n
        self.left = n
        self.reply = reply
        self.lock = threading.Lock()

    def resolve(self, i: int, ok: bool, slot: int = NONE) -> None:
        with self.lock:
            self.ok[i] = ok
            self.slots[i] = slot if ok else NONE
            self.left -= 1
            last = self.left == 0
        if last:
            self.reply(self.ok, self.slots)


class _Entry:
    """One key's read (or put) for a group: who took it, who waits, its bytes once done."""

    __slots__ = ("addr", "length", "buf", "ranks", "waiters", "done", "ok", "done_at", "bytes", "src", "slot", "refs")

    def __init__(self, rank: int, length: int) -> None:
        self.addr = 0  # where the page's bytes are: the hub's map, or the first member's memory
        self.src = 0  # read straight into the first member's memory (one piece) at this address
        self.length = length
        self.buf: Any = None  # keeps the pages' memory
        self.ranks = {rank}
        self.waiters: list[tuple[_Request, int, list[tuple[int, int]]]] = []
        self.done = False
        self.ok = False
        self.done_at = 0.0
        self.bytes = 0
        self.slot = NONE  # the arena slot the page is read into
        self.refs = 0  # members answered with that slot that have not released it


class _Group:
    def __init__(self, size: int) -> None:
        self.size = size
        self.members = 0  # connected now: a group none is connected to may come back with another size
        self.reads: dict[bytes, _Entry] = {}
        self.puts: dict[bytes, _Entry] = {}


def _copy(src: int, dst: list[tuple[int, int]]) -> None:
    for addr, n in dst:
        ctypes.memmove(addr, src, n)  # releases the GIL
        src += n


class Hub:
    """The groups of one served store (in its owner)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._held = 0  # bytes of pages held for groups
        self.pages_read = 0  # pages read from the store for groups
        self.pages_shared = 0  # pages a member got from another member's read
        self.puts_deduped = 0  # pages a member's put did not write again
        self._sweeper: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._copiers: concurrent.futures.ThreadPoolExecutor | None = None
        self.arena: Arena | None = None  # set by the server before its first group member
        self._slot_entry: dict[int, _Entry] = {}

    def join(self, name: str, size: int) -> None:
        """A member of group ``name`` of ``size`` arrives: ValueError if its size differs from
        that of the members connected now."""
        with self._lock:
            g = self._groups.get(name)
            if g is None or (g.members == 0 and g.size != size):
                g = self._groups[name] = _Group(size)
            elif g.size != size:
                raise ValueError(
                    f"deepio.kv: group {name!r} has size {g.size} in this store ({g.members} members "
                    f"connected); this member says {size}"
                )
            g.members += 1

    def leave(self, name: str) -> None:
        """A member of group ``name`` hung up or closed."""
        with self._lock:
            g = self._groups.get(name)
            if g is not None and g.members > 0:
                g.members -= 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "group_pages_read": self.pages_read,
                "group_pages_shared": self.pages_shared,
                "group_puts_deduped": self.puts_deduped,
                "group_bytes_held": self._held,
                "group_arena_slots_used": 0 if self.arena is None else self.arena.slots - len(self.arena.free),
            }

    # -- gets -------------------------------------------------------------------------------------
    def get(
        self,
        group: tuple[str, int, int],
        keys: Sequence[bytes],
        dests: Segments,
        reply: Callable[[list[bool], list[int]], Any],
    ) -> None:
        """Fills dests[i] with key i's page (verified), through the group, or says which arena
        slot holds it; ``reply(ok, slots)`` once all are answered (on a batch thread, or on this
        one); the member copies each slot's page, then ``release``s the slots."""
        name, rank, size = group
        req = _Request(len(keys), reply)
        if not keys:
            reply([], [])
            return
        now_ready: list[tuple[_Entry, Any, int]] = []  # joined reads already done: copy now
        read_keys: list[bytes] = []
        read_entries: list[_Entry] = []
        straight: list[int] = []  # indices read into the member's own destination
        with self._lock:
            g = self._groups.setdefault(name, _Group(size))
            for i, (k, dst) in enumerate(zip(keys, dests)):
                length = sum(n for _, n in dst)
                e = g.reads.get(k)
                if e is not None and rank not in e.ranks and e.length == length:
                    e.ranks.add(rank)
                    if e.done and e.slot != NONE:
                        e.refs += 1 if e.ok else 0  # (a miss is dropped when done: not found here)
                        now_ready.append((e, None, i))
                    elif e.done:
                        now_ready.append((e, e.buf, i))  # the map lives while we copy
                    else:
                        e.waiters.append((req, i, dst))
                    self.pages_shared += 1
                    if len(e.ranks) >= g.size and e.done:
                        self._drop(g.reads, k, e)
                    continue
                if e is not None:  # this rank took it already (a new round), or another length
                    self._drop(g.reads, k, e)
                direct = len(dst) == 1
                if not direct and self._held + length > MAX_BYTES:
                    straight.append(i)
                    continue
                e = _Entry(rank, length)
                e.waiters.append((req, i, dst))
                arena = self.arena
                if arena is not None and arena.free and length <= arena.page_bytes:
                    e.slot = arena.free.pop()
                    e.addr = arena.base + e.slot * arena.page_bytes
                    self._slot_entry[e.slot] = e
                elif direct:  # read into this member's memory; kept in the hub only if needed
                    e.src = e.addr = dst[0][0]
                else:
                    e.bytes = length
                    self._held += length
                g.reads[k] = e
                read_keys.append(k)
                read_entries.append(e)
        for e, _buf, i in now_ready:
            if e.slot != NONE:
                req.resolve(i, e.ok, e.slot)
                continue
            if e.ok:
                _copy(e.addr, dests[i])
            req.resolve(i, e.ok)
        if straight:
            fut = self.store.get_segments([keys[i] for i in straight], [dests[i] for i in straight])
            fut.add_done_callback(lambda f, idx=straight: self._straight_done(req, idx, f))
        if read_keys:
            self._read(name, read_keys, read_entries)

    @staticmethod
    def _map(entries: list[_Entry]) -> tuple[Any, int]:
        """A map for the entries' pages (released with the last entry that holds it)."""
        buf = mmap.mmap(-1, max(sum(e.length for e in entries), 1))
        view = ctypes.c_char.from_buffer(buf)
        base = ctypes.addressof(view)
        del view
        return buf, base

    def _read(self, name: str, keys: list[bytes], entries: list[_Entry]) -> None:
        mapped = [e for e in entries if not e.src and e.slot == NONE]
        if mapped:
            buf, at = self._map(mapped)
            for e in mapped:
                e.buf, e.addr = buf, at
                at += e.length
        segs = [[(e.addr, e.length)] for e in entries]
        with self._lock:
            self.pages_read += len(keys)
        try:
            fut = self.store.get_segments(keys, segs)
        except Exception:
            self._read_done(name, keys, entries, [False] * len(keys))
            raise
        fut.add_done_callback(lambda f: self._read_done(name, keys, entries, _result(f, len(keys))))

    def _read_done(self, name: str, keys: list[bytes], entries: list[_Entry], ok: list[bool]) -> None:
        # Pages read into the first member's memory that members still to come may want go into
        # a map of the hub's first: that memory is the member's again once it is answered.
        with self._lock:
            g = self._groups.get(name)
            keep = []
            room = MAX_BYTES - self._held  # past it, members still to come read again
            for k, e, good in zip(keys, entries, ok):
                if good and e.src and g is not None and g.reads.get(k) is e and len(e.ranks) < g.size:
                    if e.length <= room:
                        keep.append((k, e))
                        room -= e.length
        kept: Any = None
        addrs = []
        if keep:
            kept, at = self._map([e for _, e in keep])
            for _, e in keep:
                ctypes.memmove(at, e.src, e.length)
                addrs.append(at)
                at += e.length
        now = time.monotonic()
        waiting = []
        with self._lock:
            g = self._groups.get(name)
            for (k, e), at in zip(keep, addrs):
                if g is not None and g.reads.get(k) is e:  # not dropped meanwhile (a put)
                    e.buf, e.addr, e.bytes = kept, at, e.length
                    self._held += e.length
            for k, e, good in zip(keys, entries, ok):
                e.done, e.ok, e.done_at = True, bool(good), now
                if e.slot != NONE and e.ok:
                    e.refs += len(e.waiters)  # released by each member once it copied
                waiting.append((e, e.addr, e.buf, e.waiters))  # the map lives while we copy
                e.waiters = []
                gone = g is None or g.reads.get(k) is not e  # dropped in flight (a put)
                if gone or g is None or len(e.ranks) >= g.size or not e.ok or (e.src and e.buf is None):
                    self._drop(g.reads if g is not None else {}, k, e)  # a miss is not kept
            self._start_sweeper()
        # Member by member (not key by key): a member's reply goes out after its own copies, and
        # its next batch can start a read while the others' copies go on; a member others copy
        # from (its memory holds the read) is answered last.
        by_req: dict[int, list[tuple[_Request, int, int, list[tuple[int, int]], bool, bool]]] = {}
        last: set[int] = set()
        for e, src, _buf, ws in waiting:
            if e.slot != NONE:  # in the arena: each member copies it itself
                for req, i, _dst in ws:
                    req.resolve(i, e.ok, e.slot)
                continue
            for req, i, dst in ws:
                own = bool(e.src) and len(dst) == 1 and dst[0][0] == e.src
                by_req.setdefault(id(req), []).append((req, i, src, dst, e.ok and not own, e.ok))
                if own:
                    last.add(id(req))

        def serve(r: int) -> None:
            for req, i, src, dst, copy, good in by_req[r]:
                if copy:
                    _copy(src, dst)
                req.resolve(i, good)

        first = [r for r in by_req if r not in last]
        copier = self._copier() if len(first) > 1 else None
        # The members' copies in parallel (memmove runs without the GIL), the last one here.
        helped = [copier.submit(serve, r) for r in first[:-1]] if copier is not None else []
        for r in first[len(helped) :]:
            serve(r)
        for f in helped:
            f.result()
        for r in last:
            serve(r)
        del kept, waiting  # the maps go with the last entry that holds them

    @staticmethod
    def _straight_done(req: _Request, idx: list[int], f: Any) -> None:
        for i, ok in zip(idx, _result(f, len(idx))):
            req.resolve(i, ok)

    def _drop(self, table: dict[bytes, _Entry], k: bytes, e: _Entry) -> None:  # under _lock
        if table.get(k) is e:
            del table[k]
        if e.bytes:
            self._held -= e.bytes
            e.bytes = 0
        if e.done:
            e.buf = None  # the waiters were served; joiners to come read again
            if e.slot != NONE and e.refs == 0:
                self._free(e)
            e.done_at = -1.0  # dropped: its slot goes with the last release

    def _free(self, e: _Entry) -> None:  # under _lock
        if self.arena is not None and self._slot_entry.get(e.slot) is e:
            del self._slot_entry[e.slot]
            self.arena.free.append(e.slot)

    def release(self, slots: Sequence[int]) -> None:
        """A member copied its pages out of these arena slots (or died: the server says so)."""
        with self._lock:
            for s in slots:
                e = self._slot_entry.get(s)
                if e is None or e.refs <= 0:
                    continue
                e.refs -= 1
                if e.refs == 0 and e.done_at < 0:
                    self._free(e)

    # -- puts -------------------------------------------------------------------------------------
    def put(
        self,
        group: tuple[str, int, int],
        keys: Sequence[bytes],
        srcs: Segments,
        reply: Callable[[list[bool], list[int]], Any],
    ) -> None:
        """Writes key i's page from srcs[i], unless another member of the group has the same
        key's put in flight or completed within WINDOW (then its result)."""
        name, rank, size = group
        req = _Request(len(keys), reply)
        if not keys:
            reply([], [])
            return
        now_ready: list[tuple[bool, int]] = []
        write: list[int] = []
        entries: list[_Entry] = []
        with self._lock:
            self._invalidate_reads(keys)
            g = self._groups.setdefault(name, _Group(size))
            for i, k in enumerate(keys):
                e = g.puts.get(k)
                if e is not None and rank not in e.ranks:
                    e.ranks.add(rank)
                    self.puts_deduped += 1
                    if e.done:
                        now_ready.append((e.ok, i))
                        if len(e.ranks) >= g.size:
                            self._drop(g.puts, k, e)
                    else:
                        e.waiters.append((req, i, []))
                    continue
                if e is not None:  # this rank put it already: a new round
                    self._drop(g.puts, k, e)
                e = _Entry(rank, 0)
                e.waiters.append((req, i, []))
                g.puts[k] = e
                write.append(i)
                entries.append(e)
        for ok, i in now_ready:
            req.resolve(i, ok)
        if not write:
            return
        wkeys = [keys[i] for i in write]
        try:
            fut = self.store.put_segments(wkeys, [srcs[i] for i in write])
        except Exception:
            self._put_done(name, wkeys, entries, [False] * len(write))
            raise
        fut.add_done_callback(lambda f: self._put_done(name, wkeys, entries, _result(f, len(wkeys))))

    def _put_done(self, name: str, keys: list[bytes], entries: list[_Entry], ok: list[bool]) -> None:
        now = time.monotonic()
        waiting = []
        with self._lock:
            g = self._groups.get(name)
            for k, e, good in zip(keys, entries, ok):
                e.done, e.ok, e.done_at = True, bool(good), now
                waiting.append((e, e.waiters))
                e.waiters = []
                if g is not None and (len(e.ranks) >= g.size or not e.ok):
                    self._drop(g.puts, k, e)
            self._start_sweeper()
        for e, ws in waiting:
            for req, i, _ in ws:
                req.resolve(i, e.ok)

    # -- invalidation and expiry ------------------------------------------------------------------
    def _invalidate_reads(self, keys: Sequence[bytes]) -> None:  # under _lock
        for g in self._groups.values():
            for k in keys:
                e = g.reads.get(k)
                if e is not None:
                    self._drop(g.reads, k, e)

    def changed(self, keys: Sequence[bytes] | None, puts_too: bool = False) -> None:
        """Keys were put (or removed: ``puts_too``; None: every key) outside a group: no group
        serves their earlier bytes (or put results) any more."""
        with self._lock:
            if keys is None:
                for g in self._groups.values():
                    for table in (g.reads, g.puts) if puts_too else (g.reads,):
                        for k, e in list(table.items()):
                            self._drop(table, k, e)
                return
            self._invalidate_reads(keys)
            if puts_too:
                for g in self._groups.values():
                    for k in keys:
                        pe = g.puts.get(k)
                        if pe is not None:
                            self._drop(g.puts, k, pe)

    def _start_sweeper(self) -> None:  # under _lock
        if self._sweeper is None and not self._closed:
            self._sweeper = threading.Thread(target=self._sweep, name="deepio-kv-group-sweep", daemon=True)
            self._sweeper.start()

    def _sweep(self) -> None:
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                left = False
                for g in self._groups.values():
                    for table in (g.reads, g.puts):
                        for k, e in list(table.items()):
                            if e.done and now - e.done_at >= WINDOW:
                                self._drop(table, k, e)
                            else:
                                left = True
                if not left:
                    self._sweeper = None
                    return
                self._wake.wait(WINDOW / 4)

    def _copier(self) -> concurrent.futures.ThreadPoolExecutor | None:
        with self._lock:
            if self._copiers is None and not self._closed:
                self._copiers = concurrent.futures.ThreadPoolExecutor(COPY_THREADS, "deepio-kv-group-copy")
            return self._copiers

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            copiers, self._copiers = self._copiers, None
            if self.arena is not None:
                os.close(self.arena.fd)  # the map stays for the reads still in flight
                self.arena.fd = -1
        if copiers is not None:
            copiers.shutdown(wait=False)


def _result(f: Any, n: int) -> list[bool]:
    try:
        return [bool(x) for x in f.result()]
    except Exception:
        return [False] * n


__all__ = ["Hub", "check_group", "WINDOW", "MAX_BYTES"]
