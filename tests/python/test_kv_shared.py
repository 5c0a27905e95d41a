"""deepio.kv.Store(..., shared=True): one store for several processes (docs/kv-sharing.md, "Sharing a
store between processes"). Real processes (kv_shared_program.py under subprocess), real
sockets and real SIGKILLs; the pytest process is the owner or a client itself where that is
the point.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import deepio
import deepio.kv
from deepio.kv import _shared, _shared_client, _shared_wire

np = pytest.importorskip("numpy")

from kv_shared_program import page_of  # noqa: E402  (needs numpy)
from line_process import LineProcess  # noqa: E402

PAGE = 8192
CAPACITY = 512 * (4096 + PAGE)
PROGRAM = Path(__file__).with_name("kv_shared_program.py")


def folders(tmp_dir: Path) -> list[str]:
    return [str(tmp_dir / "a"), str(tmp_dir / "b")]


def open_shared(tmp_dir: Path, **kw) -> deepio.kv.Store:
    kw.setdefault("checkpoint_interval", 0)
    kw.setdefault("batch_threads", 2)
    return deepio.kv.Store(folders(tmp_dir), CAPACITY, kw.pop("page_bytes", PAGE), shared=True, **kw)


class Worker(LineProcess):
    """A kv_shared_program.py process: commands in, one JSON line out per command."""

    def __init__(self, tmp_dir: Path, fingerprint: str = "", wait: bool = True) -> None:
        argv = [sys.executable, str(PROGRAM), ",".join(folders(tmp_dir)), str(PAGE), str(CAPACITY), fingerprint]
        super().__init__(argv, "worker")
        self.hello = self.read() if wait else {}


def fill(pool, keys, start=0):
    for i, k in enumerate(keys):
        pool[start + i] = page_of(k, PAGE)


def test_two_processes_see_each_others_puts_removes_and_stats(tmp_dir):
    with open_shared(tmp_dir) as owner:
        assert owner.is_owner and isinstance(owner, deepio.kv.Store)
        pool = np.zeros((8, PAGE), np.uint8)
        owner.register(pool)
        fill(pool, ["from-a"])
        assert owner.put(["from-a"], [0]).result() == [True]
        b = Worker(tmp_dir)
        try:
            assert b.hello["role"] == "client"
            assert b.ask("get", keys=["from-a", "nothing"]) == {"ok": [True, False], "bad": []}
            assert b.ask("put", keys=["from-b", "from-b2"])["ok"] == [True, True]
            pool[:] = 0
            assert owner.get(["from-b", "from-b2"], [1, 2]).result() == [True, True]
            assert (pool[1] == page_of("from-b", PAGE)).all() and (pool[2] == page_of("from-b2", PAGE)).all()
            assert b.ask("contains", keys=["from-a", "from-b", "x"])["ok"] == [True, True, False]
            assert owner.remove(["from-a"]) == 1
            assert b.ask("contains", keys=["from-a"])["ok"] == [False]
            assert b.ask("remove", keys=["from-b2", "x"])["n"] == 1
            assert owner.contains(["from-b2"]) == [False]
            st = b.ask("stats")
            assert st["shared_role"] == "client" and st["shared_clients"] == 1
            assert st["pages"] == 1 and st["page_bytes"] == PAGE and st["hits"] >= 3
        finally:
            b.stop()


def test_four_processes_each_get_every_others_pages(tmp_dir):
    workers = [Worker(tmp_dir)]
    try:
        assert workers[0].hello["role"] == "owner"
        workers += [Worker(tmp_dir, wait=False) for _ in range(3)]  # starting side by side
        for w in workers[1:]:
            w.hello = w.read()
        assert [w.hello["role"] for w in workers[1:]] == ["client"] * 3
        keys = {i: [f"w{i}-{j}" for j in range(6)] for i in range(4)}
        for i, w in enumerate(workers):
            w.send("put", keys=keys[i])
        assert all(w.read()["ok"] == [True] * 6 for w in workers)
        every = [k for i in range(4) for k in keys[i]]
        for w in workers:
            w.send("get", keys=every)
        for w in workers:
            assert w.read() == {"ok": [True] * 24, "bad": []}
        assert workers[3].ask("stats")["shared_clients"] == 3
    finally:
        for w in workers:
            w.stop()


def test_an_in_process_client_futures_and_a_batch_larger_than_its_staging(tmp_dir, monkeypatch):
    """A second shared open in the same process is a client too; a batch over the staging size
    goes in pieces (the dispatcher thread); futures behave as the store's."""
    monkeypatch.setattr(_shared, "STAGING_BYTES", 4 * PAGE)
    with open_shared(tmp_dir) as owner, open_shared(tmp_dir) as client:
        assert owner.is_owner and not client.is_owner
        keys = [f"k{i}" for i in range(21)]
        pool = np.zeros((32, PAGE), np.uint8)
        client.register(pool)
        fill(pool, keys)
        seen = []
        fut = client.put(keys, range(21))
        fut.add_done_callback(lambda f: seen.append(f.result()))
        assert fut.result(timeout=30) == [True] * 21 and fut.done()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [[True] * 21]
        assert isinstance(fut, deepio.kv.Future) and isinstance(fut, concurrent.futures.Future)

        async def awaited() -> list[bool]:
            return await client.get(["k3"], [3])

        assert asyncio.run(awaited()) == [True]
        fs = [client.get([k], [i]) for i, k in enumerate(keys[:4])]
        assert not concurrent.futures.wait(fs, timeout=30).not_done
        pool[:] = 0
        ok = client.get([*keys, "absent"], [*range(21), 31]).result(timeout=30)
        assert ok == [True] * 21 + [False]
        assert all((pool[i] == page_of(k, PAGE)).all() for i, k in enumerate(keys))
        after = []
        client.get(["k0"], [0]).add_done_callback(after.append)  # at once if already done
        assert client.exists(["k0", "k1", "absent", "k2"]) == 2
        with pytest.raises(ValueError, match="outside the pool"):
            client.get(["k0"], [32])
        with pytest.raises(TypeError, match="key 1"):
            client.contains(["k0", 5])
        client.checkpoint()
        assert client.stats()["checkpoints"] >= 1
        # close() from a done callback (the receiver thread) does not wait for itself.
        third = open_shared(tmp_dir)
        third.register(pool)
        f1, f2 = third.get(["k1"], [1]), third.get(["k2"], [2])
        f1.add_done_callback(lambda f: third.close())
        assert f1.result(timeout=30) == [True] and f2.result(timeout=30) == [True]
        deadline = time.monotonic() + 10
        while not third.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert third.closed
    with pytest.raises(ValueError, match="closed"):
        client.contains(["k0"])


def test_clients_that_come_and_go_leave_no_staging_or_descriptor_behind(tmp_dir):
    def staging_maps() -> int:
        with open("/proc/self/maps") as f:
            return sum("deepio-kv-staging" in line for line in f)

    with open_shared(tmp_dir) as owner:
        pool = np.zeros((2, PAGE), np.uint8)
        owner.register(pool)
        assert owner.put(["x"], [0]).result() == [True]
        gc.collect()  # earlier tests' connections (cycles through their threads)
        fds, maps = len(os.listdir("/proc/self/fd")), staging_maps()
        for _ in range(20):
            with open_shared(tmp_dir) as client:
                client.register(pool)
                assert client.get(["x"], [1]).result() == [True]
        deadline = time.monotonic() + 10
        while (staging_maps() > maps or owner.stats()["shared_clients"]) and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.02)
        assert staging_maps() <= maps and owner.stats()["shared_clients"] == 0
        assert len(os.listdir("/proc/self/fd")) <= fds


def test_options_that_differ_are_refused_naming_both_and_unshared_opens_still_get_ebusy(tmp_dir, monkeypatch):
    with open_shared(tmp_dir, fingerprint="model-a"):
        with pytest.raises(ValueError) as info:
            open_shared(tmp_dir, fingerprint="model-b")
        assert "model-a" in str(info.value) and "model-b" in str(info.value)
        with pytest.raises(ValueError, match="model-a"):  # a store others use is never cleared
            open_shared(tmp_dir, fingerprint="model-b", clear_on_mismatch=True)
        with pytest.raises(ValueError, match=f"{PAGE}.*{2 * PAGE}"):
            open_shared(tmp_dir, fingerprint="model-a", page_bytes=2 * PAGE)
        # The owner's own check (the store's is first for an existing store): a client's hello.
        name, ids = _shared_wire.socket_name(folders(tmp_dir))
        hello = {"page_bytes": 2 * PAGE, "fingerprint": "model-b", "folders": ids, "pid": os.getpid()}
        with pytest.raises(deepio.InvalidArgumentError) as info:
            _shared_client.Connection(name, hello, 2 * PAGE, 4)
        for part in (f"page_bytes={2 * PAGE}", f"page_bytes={PAGE}", "'model-a'", "'model-b'"):
            assert part in str(info.value)
        with pytest.raises(OSError) as busy:
            deepio.kv.Store(folders(tmp_dir), CAPACITY, PAGE, fingerprint="model-a")
        assert busy.value.errno == errno.EBUSY
    monkeypatch.setattr(_shared, "OPEN_TIMEOUT", 0.3)
    with deepio.kv.Store(folders(tmp_dir), CAPACITY, PAGE, checkpoint_interval=0, fingerprint="model-a"):
        with pytest.raises(OSError, match="shared=False") as busy:
            open_shared(tmp_dir, fingerprint="model-a")
        assert busy.value.errno == errno.EBUSY


def test_the_owner_sigkilled_mid_stream_fails_calls_in_flight_then_a_client_takes_over(tmp_dir):
    owner, other, forked = Worker(tmp_dir), None, 0
    try:
        assert owner.hello["role"] == "owner"
        theirs = [f"o{i}" for i in range(16)]
        assert owner.ask("put", keys=theirs)["ok"] == [True] * 16
        forked = owner.ask("fork")["child"]  # its copies of the sockets must not hide the death
        other = Worker(tmp_dir)  # a second client: reconnects to whoever owns the store next
        assert other.hello["role"] == "client"
        client = open_shared(tmp_dir)
        assert not client.is_owner
        pool = np.zeros((256, PAGE), np.uint8)
        client.register(pool)
        completed: list[str] = []
        in_flight: list[tuple[str, object]] = []
        t_kill = None
        i = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (t_kill is None or i % 64):
            key = f"c{i}"
            pool[i % 64] = page_of(key, PAGE)
            in_flight.append((key, client.put([key], [i % 64])))
            in_flight.append(("", client.get([theirs[i % 16]], [64 + i % 64])))  # gets alongside
            i += 1
            if len(in_flight) >= 16:
                key, fut = in_flight.pop(0)
                if fut.result(timeout=30) == [True] and key:
                    completed.append(key)
            if t_kill is None and len(completed) >= 40:
                os.kill(owner.p.pid, signal.SIGKILL)
                t_kill = time.monotonic()
        assert t_kill is not None, "the stream did not get going"
        for key, fut in in_flight:  # in flight at the kill: done, True or False, in bounded time
            if fut.result(timeout=30) == [True] and key:
                completed.append(key)
        owner.p.wait(30)
        # The next call reopens: this process takes the lock and owns the store (recovered).
        present = client.contains(completed + theirs)
        assert client.is_owner
        assert all(present), "a put completed before the owner's death is missing"
        pool[:] = 0
        keys = completed[-100:] + theirs
        assert client.get(keys, range(len(keys))).result(timeout=30) == [True] * len(keys)
        assert all((pool[j] == page_of(k, PAGE)).all() for j, k in enumerate(keys))
        assert time.monotonic() - t_kill < 30
        assert other.ask("get", keys=completed[:8] + theirs[:8]) == {"ok": [True] * 16, "bad": []}
        assert other.ask("stats")["shared_role"] == "client" and client.stats()["shared_clients"] == 1
        client.close()
    finally:
        owner.kill()
        if forked:
            os.kill(forked, signal.SIGKILL)
        if other is not None:
            other.stop()


def test_a_client_sigkilled_mid_request_leaves_the_owner_serving_the_others(tmp_dir):
    with open_shared(tmp_dir) as owner:
        pool = np.zeros((64, PAGE), np.uint8)
        owner.register(pool)
        doomed, other = Worker(tmp_dir), Worker(tmp_dir)
        try:
            doomed.send("stream_puts", prefix="d", batch=48)
            for _ in range(3):
                assert doomed.read()["done"]
            doomed.kill()  # most likely mid-batch: it never waits between batches
            assert other.ask("put", keys=["after"])["ok"] == [True]
            assert other.ask("get", keys=["after", "d0"]) == {"ok": [True, True], "bad": []}
            fill(pool, ["mine"])
            assert owner.put(["mine"], [0]).result(timeout=30) == [True]
            assert other.ask("get", keys=["mine"])["ok"] == [True]
            deadline = time.monotonic() + 10
            while owner.stats()["shared_clients"] != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            st = owner.stats()
            assert st["shared_clients"] == 1
            assert all(f["state"] == "ok" for f in st["folders"])
        finally:
            doomed.kill()
            other.stop()


def test_the_owner_closing_hands_the_store_to_a_client(tmp_dir):
    owner = open_shared(tmp_dir)
    pool = np.zeros((4, PAGE), np.uint8)
    owner.register(pool)
    fill(pool, ["before"])
    assert owner.put(["before"], [0]).result() == [True]
    b = Worker(tmp_dir)
    try:
        assert b.hello["role"] == "client"
        owner.close()
        assert b.ask("get", keys=["before"]) == {"ok": [True], "bad": []}  # reopened as the owner
        assert b.ask("stats")["shared_role"] == "owner"
    finally:
        b.stop()


def test_network_file_systems_are_refused_and_local_ones_recognised(tmp_dir):
    for t in ("nfs", "nfs4", "cifs", "smb3", "ceph", "lustre", "fuse.sshfs", "fuse.gcsfuse", "9p"):
        assert _shared.is_network_fs(t), t
    for t in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", "fuse.lxcfs", ""):
        assert not _shared.is_network_fs(t), t
    fstype = _shared.file_system_type(str(tmp_dir))
    assert fstype and not _shared.is_network_fs(fstype)


_SQUATTER = r"""
import fcntl, os, socket, sys, time
from deepio.kv._shared_wire import socket_name
folders = sys.argv[1].split(",")
locks = [os.open(os.path.join(f, "kv.lock"), os.O_RDWR | os.O_CREAT, 0o666) for f in folders]
for fd in locks:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
name, _ = socket_name(folders)
os.setuid(65534)  # SO_PEERCRED records the listener's credentials at listen()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(name)
s.listen(4)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_socket_served_by_another_user_is_refused(tmp_dir):
    for f in folders(tmp_dir):
        os.makedirs(f)
    child = subprocess.Popen(
        [sys.executable, "-c", _SQUATTER, ",".join(folders(tmp_dir))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(PermissionError, match="uid 65534"):
            open_shared(tmp_dir)
    finally:
        child.kill()
        child.wait(30)
