"""deepio.kv.Store(..., shared=True, group=(name, rank, size)): a group's gets of the same keys
read each page from the drives once, and each member gets every page right (docs/kv-sharing.md,
"Groups"). Real member processes (kv_group_program.py under subprocess), real SIGKILLs; the
pytest process owns the store (a member too where that is the point), so its stats count the
reads, and an in-process client stands in for a second member where a process adds nothing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import deepio
import deepio.kv
from deepio.kv import _shared_group, _shared_server

np = pytest.importorskip("numpy")

from kv_group_program import page_of  # noqa: E402  (needs numpy)
from line_process import LineProcess  # noqa: E402

PAGE = 64 << 10
CAPACITY = 64 << 20
PROGRAM = Path(__file__).with_name("kv_group_program.py")


def folders(tmp_dir: Path) -> list[str]:
    return [str(tmp_dir / "a"), str(tmp_dir / "b")]


def open_shared(tmp_dir: Path, group=None, **kw) -> deepio.kv.Store:
    kw.setdefault("checkpoint_interval", 0)
    kw.setdefault("batch_threads", 2)
    return deepio.kv.Store(folders(tmp_dir), CAPACITY, PAGE, shared=True, group=group, **kw)


class Member(LineProcess):
    """A kv_group_program.py process: member ``rank`` of ``size`` in group ``name``."""

    def __init__(self, tmp_dir: Path, name: str, rank: int, size: int) -> None:
        args = [",".join(folders(tmp_dir)), str(PAGE), str(CAPACITY), name, str(rank), str(size)]
        super().__init__([sys.executable, str(PROGRAM), *args], "member")


def members(tmp_dir: Path, name: str, ranks: range, size: int) -> list[Member]:
    ms = [Member(tmp_dir, name, r, size) for r in ranks]
    for m in ms:
        assert m.read()["role"] == "client"
    return ms


def put_pages(store, pool, keys) -> None:
    for i, k in enumerate(keys):
        pool[i] = page_of(k, PAGE)
    assert all(store.put(keys, range(len(keys))).result(timeout=60))


def delta(after: dict, before: dict, name: str) -> int:
    return after[name] - before.get(name, 0)


def arena_all_free(store, timeout: float = 10.0) -> None:
    """Every slot of the owner's group arena comes back (members release what they copied;
    a member that died releases at its hang-up; reads kept for late members go after WINDOW)."""
    arena = store._server.hub.arena
    assert arena is not None
    deadline = time.monotonic() + timeout
    while len(arena.free) != arena.slots:
        hub = store._server.hub
        held = {s: (e.refs, e.done_at, e.done, e.ok, sorted(e.ranks)) for s, e in hub._slot_entry.items()}
        assert time.monotonic() < deadline, f"{arena.slots - len(arena.free)} arena slots still held: {held}"
        time.sleep(0.02)


@pytest.mark.parametrize("n", [2, 4])
def test_every_member_gets_every_page_and_each_page_is_read_once(tmp_dir, n):
    # N = 4: the owner (this process) is member 0 and calls get directly; N = 2: it is no member.
    keys = [f"p{i}" for i in range(48)]
    owner_rank = 0 if n == 4 else None
    store = open_shared(tmp_dir, group=("tp", 0, n) if owner_rank is not None else None)
    ms: list[Member] = []
    try:
        pool = np.zeros((64, PAGE), np.uint8)
        store.register(pool)
        put_pages(store, pool, keys)
        ms = members(tmp_dir, "tp", range(1 if owner_rank is not None else 0, n), n)
        before = store.stats()
        for m in ms:
            m.send("get", keys=keys)
        if owner_rank is not None:
            pool[:] = 0
            assert all(store.get(keys, range(len(keys))).result(timeout=60))
            assert all((pool[i] == page_of(k, PAGE)).all() for i, k in enumerate(keys))
        for m in ms:
            got = m.read()
            assert got["ok"] == len(keys) and got["bad"] == []
        after = store.stats()
        assert delta(after, before, "bytes_read") == len(keys) * PAGE  # once, not n times
        assert delta(after, before, "group_pages_read") == len(keys)
        assert delta(after, before, "group_pages_shared") == (n - 1) * len(keys)
        arena_all_free(store)
    finally:
        for m in ms:
            m.stop()
        store.close()


def test_a_late_member_reads_what_it_lacks_itself_and_the_first_waits_for_no_one(tmp_dir, monkeypatch):
    monkeypatch.setattr(_shared_group, "WINDOW", 0.2)
    keys = [f"late{i}" for i in range(16)]
    store = open_shared(tmp_dir)
    ms: list[Member] = []
    try:
        pool = np.zeros((16, PAGE), np.uint8)
        store.register(pool)
        put_pages(store, pool, keys)
        ms = members(tmp_dir, "g", range(2), 2)
        before = store.stats()
        ms[0].send("get", keys=keys)  # rank 1 has not asked: rank 0 is answered all the same
        got = ms[0].read()
        assert got["ok"] == len(keys) and got["bad"] == []
        time.sleep(0.2 + 0.5)  # past the window: the group's read is dropped
        assert store.stats()["group_bytes_held"] == 0
        assert store.stats()["group_arena_slots_used"] == 0
        ms[1].send("get", keys=keys)
        got = ms[1].read()
        assert got["ok"] == len(keys) and got["bad"] == []
        after = store.stats()
        assert delta(after, before, "group_pages_read") == 2 * len(keys)
        assert delta(after, before, "bytes_read") == 2 * len(keys) * PAGE
        arena_all_free(store)
    finally:
        for m in ms:
            m.stop()
        store.close()


def test_a_member_sigkilled_mid_batch_does_not_stop_the_others(tmp_dir, monkeypatch):
    monkeypatch.setattr(_shared_group, "WINDOW", 0.3)
    keys = [f"kill{i}" for i in range(200)]
    store = open_shared(tmp_dir)
    ms: list[Member] = []
    try:
        pool = np.zeros((200, PAGE), np.uint8)
        store.register(pool)
        put_pages(store, pool, keys)
        ms = members(tmp_dir, "g", range(3), 3)
        for m in ms:
            m.send("get", keys=keys)
        ms[0].p.kill()  # mid-batch: its request may have started the group's read
        ms[0].p.wait(30)
        for m in ms[1:]:
            got = m.read()
            assert got["ok"] == len(keys) and got["bad"] == []
        ms[1].send("get", keys=keys[:8])  # the owner serves on
        assert ms[1].read()["ok"] == 8
        assert store.stats()["shared_clients"] == 2
        arena_all_free(store)
    finally:
        for m in ms:
            m.stop()
        store.close()


def test_a_put_another_member_made_is_not_written_again_and_a_put_drops_the_groups_reads(tmp_dir):
    # The owner (this process) is member 0, an in-process client member 1.
    keys = [f"w{i}" for i in range(16)]
    a = open_shared(tmp_dir, group=("g", 0, 2))
    b = open_shared(tmp_dir, group=("g", 1, 2))
    try:
        assert a.is_owner and not b.is_owner
        # The client maps the group's arena read-only (the owner: read-write).
        lines = Path("/proc/self/maps").read_text().splitlines()
        maps = [line.split()[1] for line in lines if "deepio-kv-group-arena" in line]
        assert sorted(maps) == ["r--s", "rw-s"]
        pa, pb = np.zeros((16, PAGE), np.uint8), np.zeros((16, PAGE), np.uint8)
        a.register(pa)
        b.register(pb)
        before = a.stats()
        for i, k in enumerate(keys):
            pa[i] = pb[i] = page_of(k, PAGE)
        fa, fb = a.put(keys, range(16)), b.put(keys, range(16))
        assert all(fa.result(timeout=60)) and all(fb.result(timeout=60))
        after = a.stats()
        assert delta(after, before, "bytes_written") == len(keys) * PAGE
        assert delta(after, before, "group_puts_deduped") == len(keys)
        # Member 0 reads (the group keeps the bytes for member 1), then a put of new bytes from
        # outside the group: member 1 reads the new ones, never the group's old copy.
        pa[:] = 0
        assert all(a.get(keys, range(16)).result(timeout=60))
        assert (pa[0] == page_of(keys[0], PAGE)).all()
        c = open_shared(tmp_dir)
        try:
            pc = np.zeros((1, PAGE), np.uint8)
            c.register(pc)
            pc[0] = page_of("other", PAGE)
            assert c.put(keys[:1], [0]).result(timeout=60) == [True]
        finally:
            c.close()
        pb[:] = 0
        assert all(b.get(keys, range(16)).result(timeout=60))
        assert (pb[0] == page_of("other", PAGE)).all()
        assert all((pb[i] == page_of(k, PAGE)).all() for i, k in enumerate(keys) if i)
        # get_segments through the group, and a miss: False for every member that asks.
        seg = np.zeros(PAGE, np.uint8)
        addr = seg.ctypes.data
        assert b.get_segments([keys[3], "absent"], [[(addr, PAGE)], [(addr, PAGE)]]).result(timeout=60)[1] is False
        assert a.get_segments([keys[3]], [[(addr, PAGE)]]).result(timeout=60) == [True]
        assert (seg == page_of(keys[3], PAGE)).all()
    finally:
        b.close()
        a.close()


@pytest.mark.parametrize(
    "group",
    [("g", 2, 2), ("g", -1, 2), ("g", 0, 0), ("", 0, 1), (1, 0, 1), ("g", True, 2), ("g", 0), "g", ("g", 0.0, 1)],
)
def test_a_bad_group_is_a_value_error(tmp_dir, group):
    with pytest.raises(ValueError, match="group"):
        open_shared(tmp_dir, group=group)


def test_a_group_needs_shared_and_one_size(tmp_dir):
    with pytest.raises(ValueError, match="shared=True"):
        deepio.kv.Store(folders(tmp_dir), CAPACITY, PAGE, group=("g", 0, 1))
    a = open_shared(tmp_dir, group=("g", 0, 2))
    try:
        with pytest.raises(ValueError, match="size 2"):
            open_shared(tmp_dir, group=("g", 1, 3))
        assert a.group == ("g", 0, 2)
    finally:
        a.close()


def test_a_group_no_member_is_connected_to_may_come_back_with_another_size(tmp_dir):
    owner = open_shared(tmp_dir)
    try:
        a = open_shared(tmp_dir, group=("g", 0, 2))
        a.close()
        deadline = time.monotonic() + 10
        while True:  # the owner hears the hang-up on its server thread
            try:
                b = open_shared(tmp_dir, group=("g", 0, 1))
                break
            except ValueError:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        b.close()
    finally:
        owner.close()


def test_with_the_arena_full_pages_go_through_the_owners_copies_and_wait_for_late_members(tmp_dir, monkeypatch):
    # An arena of one slot: the other pages take the copying path (read into the first member's
    # staging, copied by the owner to the others, kept for the member still to come).
    monkeypatch.setattr(_shared_server, "ARENA_BYTES", 0)
    keys = [f"full{i}" for i in range(48)]
    store = open_shared(tmp_dir)
    ms: list[Member] = []
    try:
        pool = np.zeros((48, PAGE), np.uint8)
        store.register(pool)
        put_pages(store, pool, keys)
        ms = members(tmp_dir, "g", range(3), 3)
        assert store._server.hub.arena.slots == 1
        before = store.stats()
        for m in ms[:2]:
            m.send("get", keys=keys)
        for m in ms[:2]:
            got = m.read()
            assert got["ok"] == len(keys) and got["bad"] == []
        assert store.stats()["group_bytes_held"] > 0  # kept for rank 2, within the window
        ms[2].send("get", keys=keys)
        got = ms[2].read()
        assert got["ok"] == len(keys) and got["bad"] == []
        after = store.stats()
        assert delta(after, before, "bytes_read") == len(keys) * PAGE
        assert after["group_bytes_held"] == 0  # all three took every page
        arena_all_free(store)
    finally:
        for m in ms:
            m.stop()
        store.close()
