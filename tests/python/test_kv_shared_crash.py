"""The store's crash checks across several processes (issue 48): 3 or 4 real processes put,
replace, remove and get at once on one deepio.kv.Store(..., shared=True)
(kv_shared_crash_program.py, each logging every call), a SIGKILL hits one of them at a random
point (the owner or a client, mid-put or mid-get), sometimes a second one later (the new owner,
mid-takeover too), the others go on, sometimes joined by one more process that opens the store
after the kills. Then, from the logs: no get ever returned bytes other than a page put under
its key, nor one a later completed put had replaced, nor missed a completed put before the
first kill; and every completed put not replaced or removed since is there and whole, through
the surviving store and again after every process closed and the store reopened. A put whose
writer died before it completed (or that failed with the owner) is whole or absent.

DEEPIO_SHARED_CRASH_POINTS sets the kill points of the slow test (default 8;
scripts/crash-fuzz.sh --shared-points N); DEEPIO_SHARED_CRASH_SEED=<seed> replays a point (a
failure prints its seed; DEEPIO_SHARED_CRASH_KEEP=<folder> keeps a failed point's logs).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import deepio.kv

np = pytest.importorskip("numpy")

from kv_shared_crash_program import named, page_of  # noqa: E402  (needs numpy)

PAGE = 8192
CAPACITY = 8192 * (4096 + PAGE)  # more than a point puts: nothing is evicted (checked)
PROGRAM = Path(__file__).with_name("kv_shared_crash_program.py")
POINTS = int(os.environ.get("DEEPIO_SHARED_CRASH_POINTS", "8"))
INF = math.inf


def folders(d: Path) -> list[str]:
    return [str(d / "a"), str(d / "b")]


def read_log(path: Path) -> list[dict]:
    out = []
    if not path.exists():  # a process killed before it opened its log
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # only the last line, torn by the kill, can be
            pass
    return out


class History:
    """Every put, remove and get of every writer, from the logs."""

    def __init__(self, logs: dict[int, list[dict]]) -> None:
        self.puts: dict[str, list[dict]] = {}  # key -> [{w, v, t0, t1, ok}]
        self.rms: dict[str, list[tuple[float, float]]] = {}  # key -> [(t0, t1 or INF)]
        self.gets: list[tuple[int, dict]] = []
        self.failed_puts: list[tuple[int, float]] = []
        for w, recs in logs.items():
            put, rm = None, None
            for r in recs:
                op = r["op"]
                if op == "put":
                    put = [{"w": w, "v": v, "k": k, "t0": r["t0"], "t1": INF, "ok": None} for k, v in r["items"]]
                    for p in put:
                        self.puts.setdefault(p["k"], []).append(p)
                elif op == "putdone":
                    for p, ok in zip(put, r["ok"]):
                        p["t1"], p["ok"] = r["t1"], ok
                    if not all(r["ok"]):
                        self.failed_puts.append((w, r["t1"]))
                    put = None
                elif op == "rm":
                    rm = (r["t0"], r["keys"])
                elif op in ("rmdone", "rmerr"):
                    for k in rm[1]:
                        self.rms.setdefault(k, []).append((rm[0], r["t1"] if op == "rmdone" else INF))
                    rm = None
                elif op == "get":
                    self.gets.append((w, r))
            if rm is not None:  # in flight at the kill
                for k in rm[1]:
                    self.rms.setdefault(k, []).append((rm[0], INF))

    def last_remove_end(self, key: str, before: float = INF) -> float:
        """When the last remove of key (begun before `before`) ended; -INF if none, INF if one
        never completed. A removal is durable only at the next checkpoint: across a crash a
        removed key may come back as any page put under it before (docs/kv.md, Restart)."""
        ends = [t1 for t0, t1 in self.rms.get(key, []) if t0 < before]
        return max(ends, default=-INF)

    def why_not(self, key: str, state: tuple[int, int] | None, at: float = INF, end: float = INF) -> str | None:
        """Why `state` ((writer, version) or None: absent) may not be key's page for a read
        that ran from `at` to `end` (INF: the final state); None if it may."""
        puts = self.puts.get(key, [])
        after_rm = self.last_remove_end(key, end)  # a remove alongside the read may have won
        done = [p for p in puts if p["ok"] is True and p["t1"] < at and p["t0"] > after_rm]
        if state is None:
            if done:
                p = done[-1]
                return f"absent, but writer {p['w']}'s put of version {p['v']} completed (t1 {p['t1']:.3f})"
            return None
        mine = [p for p in puts if (p["w"], p["v"]) == state]
        if not mine:
            return f"returned writer {state[0]}'s version {state[1]}, never put under {key}"
        v = mine[0]
        newer = [p for p in done if p["t0"] > v["t1"]]
        if newer:
            p = newer[0]
            return f"returned version {state} (done {v['t1']:.3f}), replaced by {p['w']}/{p['v']} (began {p['t0']:.3f})"
        return None


def check_gets(h: History, first_kill: float) -> list[str]:
    errors = []
    for w, g in h.gets:
        errors += [f"writer {w}: get of {k}: wrong bytes: {why}" for k, why in g["bad"]]
        for k, gw, gv in g["got"]:
            if gv is None:
                if g["t1"] < first_kill and (why := h.why_not(k, None, g["t0"], g["t1"])):
                    errors.append(f"writer {w}: get at {g['t0']:.3f} before any kill: {k} {why}")
            elif why := h.why_not(k, (gw, gv), g["t0"], g["t1"]):
                errors.append(f"writer {w}: get at {g['t0']:.3f}: {k} {why}")
    return errors


def check_store(store: deepio.kv.Store, h: History, where: str) -> list[str]:
    keys = sorted(h.puts)
    pool = np.zeros((256, PAGE), np.uint8)
    store.register(pool)
    errors = []
    for at in range(0, len(keys), 256):
        part = keys[at : at + 256]
        pool[:] = 0
        ok = store.get(part, range(len(part))).result(timeout=60)
        for i, k in enumerate(part):
            state = None
            if ok[i]:
                name = named(pool[i])
                if name is None or name[0] != k or not (pool[i] == page_of(*name, PAGE)).all():
                    errors.append(f"{where}: {k}: wrong bytes (they name {name})")
                    continue
                state = name[1:]
            if why := h.why_not(k, state):
                errors.append(f"{where}: {k} {why}")
    return errors


def run_point(tmp_dir: Path, seed: int) -> str:
    """One kill point; returns what it did. Fails naming the seed."""
    rng = random.Random(seed)
    d = tmp_dir / f"point-{seed}"
    d.mkdir()
    stop = d / "stop"
    n = rng.choice([3, 4])
    late = rng.random() < 0.4  # one more process opens the store after the kills
    logs = [d / f"w{i}.log" for i in range(n + late)]
    procs: list[subprocess.Popen] = []

    def start(i: int) -> subprocess.Popen:
        args = [",".join(folders(d)), str(PAGE), str(CAPACITY), str(logs[i]), str(i), str(rng.getrandbits(32))]
        return subprocess.Popen(
            [sys.executable, str(PROGRAM), *args, str(n + late), str(stop)], stdin=subprocess.PIPE, cwd=PROGRAM.parent
        )

    def wait_for(i: int, op: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if logs[i].exists():
                for r in read_log(logs[i]):
                    if r["op"] == op:
                        return r
            assert procs[i].poll() is None, f"seed {seed}: worker {i} ended (rc {procs[i].returncode}) before {op!r}"
            time.sleep(0.01)
        raise AssertionError(f"seed {seed}: worker {i} did not log {op!r} in {timeout} s")

    ok = False
    try:
        procs.append(start(0))
        assert wait_for(0, "open")["role"] == "owner"
        procs += [start(i) for i in range(1, n)]
        early = rng.random() < 0.15  # the first kill while the clients open (connect, hello)
        for i in range(1, n if not early else 1):
            wait_for(i, "open")
        alive = list(range(n))
        kills: list[tuple[int, float]] = []
        time.sleep(rng.uniform(0.0, 0.4) if early else rng.uniform(0.1, 0.8))
        for nth in range(2):
            if nth and (rng.random() < 0.5 or len(alive) < 3):
                break
            if nth:
                time.sleep(rng.uniform(0.0, 0.6))  # the second: often mid-takeover
            victim = rng.choice(alive)
            if rng.random() < 0.5:  # the owner: the first one, or the one that took over
                owners = [i for i in alive if any(r.get("role") == "owner" for r in read_log(logs[i]))]
                victim = owners[-1] if owners else victim
            t = time.monotonic()
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait(30)
            alive.remove(victim)
            kills.append((victim, t))
        for i in alive:
            wait_for(i, "open")
        if late:  # joins while the others take over (or after)
            procs.append(start(n))
            alive.append(n)
            wait_for(n, "open")
        time.sleep(rng.uniform(0.3, 0.8))
        last_kill = kills[-1][1]
        deadline = time.monotonic() + 60
        for i in alive:  # the survivors go on after the kills (each completes a call)
            while not any(r["op"] in ("putdone", "rmdone", "get") and r["t1"] > last_kill for r in read_log(logs[i])):
                assert time.monotonic() < deadline, (
                    f"seed {seed}: survivor {i} completed nothing in 60 s after the kill"
                )
                assert procs[i].poll() is None, f"seed {seed}: survivor {i} ended (rc {procs[i].returncode})"
                time.sleep(0.02)
        stop.touch()
        for i in alive:
            wait_for(i, "stopped")
        h = History({i: read_log(logs[i]) for i in range(n + late)})
        errors = check_gets(h, kills[0][1])
        errors += [f"writer {w}: a put failed at {t:.3f} before any kill" for w, t in h.failed_puts if t < kills[0][1]]
        with deepio.kv.Store(folders(d), CAPACITY, PAGE, shared=True) as store:
            errors += check_store(store, h, "through the surviving store")
        for i in alive:
            procs[i].stdin.write(b"\n")
            procs[i].stdin.flush()
            assert procs[i].wait(60) == 0, f"seed {seed}: survivor {i} did not close cleanly"
        with deepio.kv.Store(folders(d), CAPACITY, PAGE) as store:
            errors += check_store(store, h, "after close and reopen")
            st = store.stats()
            assert st["evictions"] == 0, f"seed {seed}: the check assumes no eviction"
        acked = sum(p["ok"] is True for ps in h.puts.values() for p in ps)
        killed = [(v, round(t - kills[0][1], 3)) for v, t in kills]
        summary = (
            f"seed {seed}: {n} processes{' and one late' if late else ''}, killed {killed}"
            f"{' (the first while they opened)' if early else ''}, "
            f"{acked} pages put, {len(h.puts)} keys, {len(h.gets)} gets"
        )
        assert not errors, f"{summary}\n" + "\n".join(errors[:20])
        ok = True
        shutil.rmtree(d, ignore_errors=True)
        return summary
    finally:
        if not ok and os.environ.get("DEEPIO_SHARED_CRASH_KEEP"):  # the logs, to look into
            keep = Path(os.environ["DEEPIO_SHARED_CRASH_KEEP"]) / d.name
            shutil.copytree(d, keep, ignore=shutil.ignore_patterns("a", "b"), dirs_exist_ok=True)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)


def test_the_checks_catch_a_lost_put_a_replaced_page_and_a_version_never_put():
    """The checks themselves, on made-up logs: each kind of failure is caught, and what the
    store may legally do (an unacknowledged put whole or absent, a removed key back) is not."""
    logs = {
        0: [
            {"op": "put", "t0": 1.0, "items": [["p0-0", 1], ["s1", 2]]},
            {"op": "putdone", "t1": 2.0, "ok": [True, True]},
            {"op": "put", "t0": 3.0, "items": [["p0-0", 3]]},
            {"op": "putdone", "t1": 4.0, "ok": [True]},
            {"op": "put", "t0": 5.0, "items": [["p0-1", 4]]},
            {"op": "putdone", "t1": 6.0, "ok": [True]},
            {"op": "rm", "t0": 7.0, "keys": ["p0-1"]},
            {"op": "rmdone", "t1": 8.0, "n": 1},
            {"op": "put", "t0": 9.0, "items": [["p0-2", 5]]},  # the kill: never acknowledged
        ],
        1: [
            {"op": "put", "t0": 1.5, "items": [["s1", 1]]},  # alongside writer 0's
            {"op": "putdone", "t1": 2.6, "ok": [True]},
            {"op": "get", "t0": 2.7, "t1": 2.8, "got": [["p0-0", 0, 1], ["s1", None, None]], "bad": []},
            {"op": "get", "t0": 4.5, "t1": 4.6, "got": [["p0-0", 0, 1], ["s1", 0, 2]], "bad": []},
            {"op": "get", "t0": 4.7, "t1": 4.8, "got": [["p0-0", 1, 1]], "bad": [["s1", "torn"]]},
        ],
    }
    h = History(logs)
    assert h.why_not("p0-0", (0, 3)) is None and h.why_not("p0-0", None) is not None  # lost
    assert "replaced" in h.why_not("p0-0", (0, 1))  # version 3 began after version 1 completed
    assert h.why_not("s1", (0, 2)) is None and h.why_not("s1", (1, 1)) is None  # concurrent
    assert h.why_not("p0-1", None) is None and h.why_not("p0-1", (0, 4)) is None  # removed: may come back
    assert h.why_not("p0-2", None) is None and h.why_not("p0-2", (0, 5)) is None  # unacknowledged
    assert "never put" in h.why_not("p0-2", (0, 6))
    errors = check_gets(h, first_kill=8.5)
    assert len(errors) == 4, errors
    assert "before any kill" in errors[0] and "s1" in errors[0]  # a miss of a completed put
    assert "replaced" in errors[1] and "p0-0" in errors[1]  # read after version 3 completed
    assert "wrong bytes" in errors[2] and "never put" in errors[3]


@pytest.mark.parametrize("call", ["contains", "remove", "checkpoint", "stats"])
def test_a_client_whose_owner_dies_under_a_synchronous_call_takes_over_and_answers_it(tmp_dir, call):
    """The owner dies while a client's call waits for its answer (the owner is stopped, then
    SIGKILLed): the call's retry reopens, this process becomes the owner, and the retry is
    answered here (it was an AssertionError, found by the kill points above)."""
    owner = subprocess.Popen(
        [sys.executable, str(PROGRAM.with_name("kv_shared_program.py")), ",".join(folders(tmp_dir)), str(PAGE)]
        + [str(CAPACITY), ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=PROGRAM.parent,
    )
    try:
        assert json.loads(owner.stdout.readline())["role"] == "owner"
        with deepio.kv.Store(folders(tmp_dir), CAPACITY, PAGE, shared=True) as client:
            assert not client.is_owner
            pool = np.zeros((2, PAGE), np.uint8)
            client.register(pool)
            pool[0] = page_of("k", 9, 1, PAGE)
            assert client.put(["k"], [0]).result(timeout=30) == [True]
            os.kill(owner.pid, signal.SIGSTOP)
            out: list[object] = []
            t = threading.Thread(
                target=lambda: out.append(getattr(client, call)(*([["k"]] if call in ("contains", "remove") else [])))
            )
            t.start()
            conn = client._conn
            deadline = time.monotonic() + 10
            while not conn.pending and time.monotonic() < deadline:  # the request is sent
                time.sleep(0.005)
            assert conn.pending
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(30)
            t.join(60)
            assert out, "the call raised"
            assert client.is_owner
            want = {"contains": [True], "remove": 1, "checkpoint": None}
            if call == "stats":
                assert out[0]["shared_role"] == "owner" and out[0]["pages"] == 1
            else:
                assert out[0] == want[call]
    finally:
        owner.kill()
        owner.wait(30)


_UNSHARED = r"""
import sys
import deepio.kv
store = deepio.kv.Store(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]))
print("ready", flush=True)
sys.stdin.readline()
store.close()
"""


def test_a_client_whose_reopen_failed_reopens_on_its_next_call(tmp_dir, monkeypatch):
    """The owner died and the reopen failed (an unshared store held the folders past
    OPEN_TIMEOUT: EBUSY to the caller); once they are free the next call reopens (it was an
    AssertionError on every call from then on)."""
    monkeypatch.setattr(deepio.kv._shared, "OPEN_TIMEOUT", 0.3)
    program = str(PROGRAM.with_name("kv_shared_program.py"))
    owner = subprocess.Popen(
        [sys.executable, program, ",".join(folders(tmp_dir)), str(PAGE), str(CAPACITY), ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=PROGRAM.parent,
    )
    squatter = None
    try:
        assert json.loads(owner.stdout.readline())["role"] == "owner"
        with deepio.kv.Store(folders(tmp_dir), CAPACITY, PAGE, shared=True) as client:
            pool = np.zeros((2, PAGE), np.uint8)
            client.register(pool)
            pool[0] = page_of("k", 9, 1, PAGE)
            assert client.put(["k"], [0]).result(timeout=30) == [True]
            owner.kill()
            owner.wait(30)
            squatter = subprocess.Popen(
                [sys.executable, "-c", _UNSHARED, ",".join(folders(tmp_dir)), str(CAPACITY), str(PAGE)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert squatter.stdout.readline().strip() == "ready"
            with pytest.raises(OSError, match="shared=False"):
                client.contains(["k"])
            with pytest.raises(OSError, match="shared=False"):
                client.get(["k"], [1])
            squatter.stdin.write("\n")
            squatter.stdin.flush()
            assert squatter.wait(30) == 0
            assert client.get(["k"], [1]).result(timeout=30) == [True]
            assert client.is_owner and (pool[1] == pool[0]).all()
            assert client.contains(["k"]) == [True]
    finally:
        for p in (owner, squatter):
            if p is not None:
                p.kill()
                p.wait(30)


def seeds(count: int) -> list[int]:
    fixed = os.environ.get("DEEPIO_SHARED_CRASH_SEED")
    if fixed:
        return [int(fixed)]
    return [random.getrandbits(32) for _ in range(count)]


def test_a_sigkill_of_any_process_loses_no_completed_put_and_no_get_is_wrong(tmp_dir):
    for seed in seeds(2):
        print(run_point(tmp_dir, seed))


@pytest.mark.slow
def test_many_kill_points(tmp_dir):
    """DEEPIO_SHARED_CRASH_POINTS points (scripts/crash-fuzz.sh --shared-points N)."""
    t = time.monotonic()
    for seed in seeds(POINTS):
        print(run_point(tmp_dir, seed))
    print(f"shared store: {POINTS} kill points passed in {time.monotonic() - t:.0f} s")
