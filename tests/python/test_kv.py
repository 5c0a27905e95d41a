"""deepio.kv.Store: the Python contract (issue 39 item 1) on real files in temporary folders.

Round trips (hypothesis), zero-copy segments, a flipped byte on disk, a SIGKILLed writer, puts
of 3 x capacity, two threads on one key, every bad argument, EIO on one folder, done
callbacks, reopen, a failed folder probed back (by hand, by itself, never with 0)
and what a crash after its recovery finds. Small pages keep it fast; the long cases are marked slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import deepio
import deepio.kv
from conftest import needs_numpy, needs_torch, sigkilled_on_exit

np = pytest.importorskip("numpy")  # the pool of every test below; torch has its own test

PAGE = 8192
SLOT = 4096 + PAGE


def make_store(tmp_dir, pages=64, folders=("a", "b"), **kw):
    return deepio.kv.Store(
        [str(tmp_dir / f) for f in folders],
        capacity_bytes=pages * SLOT,
        page_bytes=PAGE,
        checkpoint_interval=kw.pop("checkpoint_interval", 0),
        batch_threads=2,
        workers=1,
        queue_depth=32,
        **kw,
    )


def in_folder(tmp_dir, name: str) -> str:
    """A fault filter (path_contains) that matches the files of the store's folder `name` and
    nothing else: its absolute path, not a bare name that a parent folder may also carry."""
    return str(tmp_dir / name) + os.sep


def page(key: str, salt: int = 0, n: int = PAGE) -> np.ndarray:
    rng = np.random.default_rng(abs(hash((key, salt))) % (1 << 32))
    return rng.integers(0, 256, n, dtype=np.uint8)


@needs_numpy
def test_round_trip_exists_contains_remove(tmp_dir):
    with make_store(tmp_dir) as store:
        pool = np.zeros((16, PAGE), np.uint8)
        store.register(pool)
        keys = ["k0", b"k1", "k\u00e92", "k3"]
        for i, k in enumerate(keys):
            pool[i] = page(str(k))
        want = pool[:4].copy()
        assert store.put(keys, [0, 1, 2, 3]).result() == [True] * 4
        pool[:] = 0
        assert store.get(keys + ["absent"], [4, 5, 6, 7, 8]).result() == [True, True, True, True, False]
        assert (pool[4:8] == want).all()
        assert store.exists(["k0", b"k1", "nope", "k3"]) == 2
        assert store.contains(["k0", "nope", "k3"]) == [True, False, True]
        assert store.remove(["k0", "nope"]) == 1
        assert store.exists(["k0"]) == 0
        s = store.stats()
        assert s["pages"] == 3 and s["hits"] == 4 and s["misses"] == 1
        assert [f["state"] for f in s["folders"]] == ["ok", "ok"]
    assert store.closed
    store.close()  # idempotent


@needs_numpy
def test_clear_removes_every_page_for_good(tmp_dir):
    # The crash right after clear() is tests/cpp/test_kv.cpp's ClearIsDurableWhenItReturns.
    with make_store(tmp_dir) as store:
        pool = np.zeros((8, PAGE), np.uint8)
        store.register(pool)
        keys = [f"c{i}" for i in range(8)]
        for i, k in enumerate(keys):
            pool[i] = page(k)
        assert store.put(keys, range(8)).result() == [True] * 8
        assert store.clear() == 8
        assert store.contains(keys) == [False] * 8
        assert store.get(keys, range(8)).result() == [False] * 8
        assert store.stats()["removes"] == 8
        assert store.put(["after"], [0]).result() == [True]
    with make_store(tmp_dir) as store:
        assert store.stats()["recovered_pages"] == 1
        assert store.contains(keys + ["after"]) == [False] * 8 + [True]


@needs_numpy
def test_replace_and_reopen(tmp_dir):
    pool = np.zeros((4, PAGE), np.uint8)
    with make_store(tmp_dir) as store:
        store.register(pool)
        pool[0] = page("x", 1)
        assert store.put(["x"], [0]).result() == [True]
        pool[0] = page("x", 2)
        assert store.put(["x"], [0]).result() == [True]
    with make_store(tmp_dir) as store:
        store.register(pool)
        pool[:] = 0
        assert store.get(["x"], [1]).result() == [True]
        assert (pool[1] == page("x", 2)).all()
        assert store.stats()["recovered_pages"] == 1


def test_a_folder_in_use_is_refused(tmp_dir):
    """A second store on a folder another one has open raises OSError EBUSY naming the folder
    (two stores would hand out the same slots); once the first closes it opens."""
    import errno

    first = make_store(tmp_dir)
    with pytest.raises(OSError) as info:
        make_store(tmp_dir, folders=("c", "b"))
    assert info.value.errno == errno.EBUSY
    assert str(tmp_dir / "b") in str(info.value)
    first.close()
    make_store(tmp_dir, folders=("c", "b")).close()


@needs_torch
def test_torch_pool_and_wider_dtype(tmp_dir):
    import torch

    with make_store(tmp_dir) as store:
        pool = torch.zeros((4, PAGE // 4), dtype=torch.float32)  # rows of page_bytes bytes
        store.register(pool)
        pool[0] = torch.arange(PAGE // 4, dtype=torch.float32)
        assert store.put(["t"], [0]).result() == [True]
        assert store.get(["t"], [3]).result() == [True]
        assert torch.equal(pool[3], pool[0])


@needs_numpy
def test_segments_zero_copy_and_length_rule(tmp_dir):
    with make_store(tmp_dir) as store:
        k_half = page("k", n=3000)
        v_half = page("v", n=2000)
        segs = [[(k_half.ctypes.data, k_half.nbytes), (v_half.ctypes.data, v_half.nbytes)]]
        assert store.put_segments(["kv"], segs).result() == [True]
        out = np.zeros(5000, np.uint8)
        assert store.get_segments(["kv"], [[(out.ctypes.data, 1000), (out.ctypes.data + 1000, 4000)]]).result() == [
            True
        ]
        assert (out[:3000] == k_half).all() and (out[3000:] == v_half).all()
        # The stored length must equal what the get fills.
        assert store.get_segments(["kv"], [[(out.ctypes.data, 4999)]]).result() == [False]
        store.register(np.zeros((2, PAGE), np.uint8))
        assert store.get(["kv"], [0]).result() == [False]  # 5000 stored, a row is 8192


@needs_numpy
def test_round_trips_hypothesis(tmp_dir):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    store = make_store(tmp_dir, pages=256)
    model: dict[bytes, bytes] = {}

    @hypothesis.settings(max_examples=30, deadline=None)
    @hypothesis.given(
        st.lists(st.tuples(st.binary(min_size=1, max_size=40), st.binary(min_size=0, max_size=PAGE)), max_size=6)
    )
    def check(items):
        keys = [k for k, _ in items]
        datas = [np.frombuffer(v, np.uint8).copy() for _, v in items]
        segs = [[(d.ctypes.data, d.nbytes)] if d.nbytes else [] for d in datas]
        ok = store.put_segments(keys, segs).result()
        assert ok == [True] * len(keys)
        for k, v in items:
            model[k] = v  # the last of a key's duplicates in a batch wins
        outs = [np.zeros(len(model[k]), np.uint8) for k in keys]
        got = store.get_segments(keys, [[(o.ctypes.data, o.nbytes)] if o.nbytes else [] for o in outs]).result()
        assert got == [True] * len(keys)
        for k, o in zip(keys, outs):
            assert o.tobytes() == model[k]

    try:
        check()
    finally:
        store.close()


@needs_numpy
def test_flipped_byte_on_disk_is_a_miss(tmp_dir):
    pool = np.zeros((2, PAGE), np.uint8)
    with make_store(tmp_dir, pages=4, folders=("a",)) as store:
        store.register(pool)
        pool[0] = page("f")
        assert store.put(["f"], [0]).result() == [True]
    slab = tmp_dir / "a" / "slab-0000.bin"
    with open(slab, "r+b") as f:
        for slot in range(4):
            f.seek(slot * SLOT + 4096 + 77)
            b = f.read(1)
            f.seek(slot * SLOT + 4096 + 77)
            f.write(bytes([b[0] ^ 1]))
    with make_store(tmp_dir, pages=4, folders=("a",)) as store:
        store.register(pool)
        assert store.get(["f"], [1]).result() == [False]
        assert store.stats()["corrupt"] == 1


@needs_numpy
def test_three_times_capacity(tmp_dir):
    with make_store(tmp_dir, pages=32) as store:
        pool = np.zeros((8, PAGE), np.uint8)
        store.register(pool)
        for r in range(12):
            keys = [f"c{r}-{i}" for i in range(8)]
            for i, k in enumerate(keys):
                pool[i] = page(k)
            assert store.put(keys, range(8)).result() == [True] * 8
        s = store.stats()
        assert s["pages"] <= 32 and s["evictions"] > 0
        assert store.exists(keys) == 8
        assert store.get(keys, range(8)).result() == [True] * 8
        assert (pool[7] == page(keys[7])).all()


@needs_numpy
def test_one_key_from_two_threads(tmp_dir):
    with make_store(tmp_dir, pages=16) as store:
        pool = np.zeros((8, PAGE), np.uint8)
        store.register(pool)
        versions = [page("hot", v) for v in range(4)]
        for v in range(4):
            pool[v] = versions[v]
        store.put(["hot"], [0]).result()
        done = threading.Event()

        def writer():
            for i in range(30):
                assert store.put(["hot"], [i % 4]).result() == [True]
            done.set()

        t = threading.Thread(target=writer)
        t.start()
        hits = 0
        while not done.is_set():
            if store.get(["hot"], [5]).result() == [True]:
                hits += 1
                assert any((pool[5] == v).all() for v in versions)
        t.join()
        assert hits > 0


@needs_numpy
def test_bad_arguments(tmp_dir):
    with make_store(tmp_dir) as store:
        with pytest.raises(ValueError, match="register"):
            store.put(["a"], [0])
        with pytest.raises(ValueError, match="2-D"):
            store.register(np.zeros(PAGE, np.uint8))
        with pytest.raises(ValueError, match="page_bytes"):
            store.register(np.zeros((4, PAGE - 1), np.uint8))
        with pytest.raises(ValueError, match="contiguous"):
            store.register(np.zeros((4, 2 * PAGE), np.uint8)[:, ::2])
        with pytest.raises((ValueError, TypeError)):
            ro = np.zeros((4, PAGE), np.uint8)
            ro.flags.writeable = False
            store.register(ro)
        store.register(np.zeros((4, PAGE), np.uint8))
        with pytest.raises(TypeError, match=r"keys\[1\]"):
            store.put(["a", 3], [0, 1])
        with pytest.raises(TypeError, match="single str"):
            store.exists("abc")
        with pytest.raises(ValueError, match=r"keys\[0\]"):
            store.get([""], [0])
        with pytest.raises(ValueError, match=r"keys\[0\]"):
            store.get(["x" * (deepio.kv.MAX_KEY_BYTES + 1)], [0])
        with pytest.raises(ValueError, match=r"slots\[1\] is 4"):
            store.put(["a", "b"], [0, 4])
        with pytest.raises(ValueError, match=r"slots\[0\] is -1"):
            store.get(["a"], [-1])
        with pytest.raises(TypeError, match=r"slots\[0\]"):
            store.put(["a"], [1.5])
        with pytest.raises(ValueError, match="one slot per key"):
            store.put(["a", "b"], [0])
        with pytest.raises(ValueError, match="more than page_bytes"):
            store.put_segments(["a"], [[(1, PAGE + 1)]])
        with pytest.raises(TypeError, match="pair"):
            store.put_segments(["a"], [["x"]])
        with pytest.raises(ValueError, match="timeout"):
            store.get(["a"], [0]).result(timeout=-1)
    with pytest.raises(ValueError, match="closed"):
        store.exists(["a"])
    with pytest.raises(ValueError):
        deepio.kv.Store([], capacity_bytes=SLOT, page_bytes=PAGE)
    with pytest.raises(ValueError, match="page_bytes"):
        deepio.kv.Store([str(tmp_dir / "a")], capacity_bytes=64 * SLOT, page_bytes=4096)  # layout of 8192
    with pytest.raises(TypeError):
        deepio.kv.Store([str(tmp_dir / "z")], capacity_bytes=-1, page_bytes=PAGE)


@needs_numpy
def test_done_callback(tmp_dir):
    with make_store(tmp_dir) as store:
        pool = np.zeros((2, PAGE), np.uint8)
        store.register(pool)
        seen = []
        ev = threading.Event()
        fut = store.put(["cb"], [0])
        fut.add_done_callback(lambda f: (seen.append(f.result()), ev.set()))
        assert ev.wait(30)
        assert seen == [[True]]
        fut.add_done_callback(lambda f: seen.append("again"))  # already done: at once
        assert seen[-1] == "again"
        assert fut.done()


@needs_numpy
def test_eio_on_one_folder(tmp_dir, fault):
    with make_store(tmp_dir, folders=("bad", "good")) as store:
        pool = np.zeros((16, PAGE), np.uint8)
        store.register(pool)
        keys = [f"e{i}" for i in range(16)]
        for i, k in enumerate(keys):
            pool[i] = page(k)
        want = pool.copy()
        assert store.put(keys, range(16)).result() == [True] * 16
        fault("read", errno=5, count=1 << 30, path_contains=in_folder(tmp_dir, "bad"))
        # The warning comes with the first call after the batch failed the folder: the get's own
        # return when its batch was that quick, else the next call.
        with pytest.warns(deepio.kv.FolderFailedWarning, match="bad"):
            ok = store.get(keys, range(16)).result()
            s = store.stats()
        deepio._deepio._clear_fault()
        assert 0 < sum(ok) < 16
        for i, g in enumerate(ok):
            if g:
                assert (pool[i] == want[i]).all()
        bad, good = s["folders"]
        assert bad["state"] == "failed" and bad["last_errno"] == 5 and bad["errors"] >= 1
        assert good["state"] == "ok"
        assert store.put(["later"], [0]).result() == [True]
        assert store.get(["later"], [1]).result() == [True]


@needs_numpy
def test_write_failure_on_one_folder(tmp_dir, fault):
    # ENOSPC on the data writes of one folder: the folder is failed and named, and its pages
    # are put again on the other folder (every put True).
    with make_store(tmp_dir, folders=("full", "ok")) as store:
        pool = np.zeros((16, PAGE), np.uint8)
        store.register(pool)
        keys = [f"w{i}" for i in range(16)]
        fault("write", errno=28, count=1 << 30, path_contains=in_folder(tmp_dir, "full"))
        with pytest.warns(deepio.kv.FolderFailedWarning, match="full"):  # the put's return or the next call
            ok = store.put(keys, range(16)).result()
            assert store.contains(keys) == ok
        deepio._deepio._clear_fault()
        assert ok == [True] * 16
        s = store.stats()
        assert s["folders"][0]["state"] == "failed" and s["folders"][0]["last_errno"] == 28
        assert s["folders"][1]["used"] == 16 and s["puts"] == 16 and s["puts_failed"] == 0
        assert store.put(keys, range(16)).result() == [True] * 16
        assert store.get(keys, range(16)).result() == [True] * 16


def fail_bad_folder(tmp_dir, store, fault, n=16):
    """Puts n pages over ("bad", "good"), then fails "bad" by a get under EIO on its reads (the
    fault stays on); returns the keys."""
    pool = np.zeros((max(n, 32), PAGE), np.uint8)
    store.register(pool)
    keys = [f"e{i}" for i in range(n)]
    for i, k in enumerate(keys):
        pool[i] = page(k)
    assert store.put(keys, range(n)).result() == [True] * n
    fault("read", errno=5, count=1 << 30, path_contains=in_folder(tmp_dir, "bad"))
    with pytest.warns(deepio.kv.FolderFailedWarning, match="bad"):  # the get's return or the next call
        assert 0 < sum(store.get(keys, range(n)).result()) < n
        assert store.stats()["folders"][0]["state"] == "failed"
    return keys


@needs_numpy
def test_a_failed_folder_comes_back_once_it_works(tmp_dir, fault):
    """retry_failed() fails while the fault lasts (still failed, one more error each time), then
    brings the folder back: a FolderRecoveredWarning (not a FolderFailedWarning), recoveries
    counted, errors kept; its old pages stay dropped; it takes new pages and serves them."""
    with make_store(tmp_dir, folders=("bad", "good")) as store:
        old = fail_bad_folder(tmp_dir, store, fault)
        errors = store.stats()["folders"][0]["errors"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a failed probe of a failed folder warns no more
            assert store.retry_failed() == 0
            assert store.retry_failed() == 0
        bad = store.stats()["folders"][0]
        assert bad["state"] == "failed" and bad["errors"] == errors + 2 and bad["recoveries"] == 0
        deepio._deepio._clear_fault()
        with pytest.warns(deepio.kv.FolderRecoveredWarning, match=r"folder .*bad recovered") as rec:
            assert store.retry_failed() == 1
        assert not any(issubclass(w.category, deepio.kv.FolderFailedWarning) for w in rec)
        assert not issubclass(deepio.kv.FolderRecoveredWarning, deepio.kv.FolderFailedWarning)
        bad = store.stats()["folders"][0]
        assert bad["state"] == "ok" and bad["recoveries"] == 1
        assert bad["errors"] == errors + 2 and bad["last_errno"] == 5 and bad["used"] == 0
        assert store.retry_failed() == 0
        present = store.contains(old)
        assert 0 < sum(present) < len(old)  # those on "bad" stay dropped
        pool = np.zeros((32, PAGE), np.uint8)
        store.register(pool)
        keys = [f"n{i}" for i in range(32)]
        for i, k in enumerate(keys):
            pool[i] = page(k)
        want = pool.copy()
        assert store.put(keys, range(32)).result() == [True] * 32
        assert store.stats()["folders"][0]["used"] > 0
        pool[:] = 0
        assert store.get(keys, range(32)).result() == [True] * 32
        assert (pool == want).all()


def _until(cond, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@needs_numpy
def test_a_failed_folder_is_probed_after_retry_failed_after(tmp_dir, fault):
    """retry_failed_after=0.05: a batch that finds the folder failed that long ago probes it;
    while the fault lasts the probes fail, then one brings it back."""
    with make_store(tmp_dir, folders=("bad", "good"), retry_failed_after=0.05) as store:
        fail_bad_folder(tmp_dir, store, fault)
        errors = store.stats()["folders"][0]["errors"]

        def batch_then(cond):
            assert store.put(["tick"], [0]).result() == [True]
            return cond(store.stats()["folders"][0])

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert _until(lambda: batch_then(lambda f: f["errors"] >= errors + 2))
            assert store.stats()["folders"][0]["state"] == "failed"
            assert not seen  # failed probes of a failed folder warn no more
            deepio._deepio._clear_fault()
            assert _until(lambda: batch_then(lambda f: f["state"] == "ok"))
        assert [w.category for w in seen] == [deepio.kv.FolderRecoveredWarning]
        assert "bad recovered" in str(seen[0].message)
        assert store.stats()["folders"][0]["recoveries"] == 1


@needs_numpy
def test_retry_failed_after_zero_never_probes_by_itself(tmp_dir, fault):
    with make_store(tmp_dir, folders=("bad", "good"), retry_failed_after=0) as store:
        fail_bad_folder(tmp_dir, store, fault)
        deepio._deepio._clear_fault()
        errors = store.stats()["folders"][0]["errors"]
        for _ in range(20):
            assert store.put(["tick"], [0]).result() == [True]
            time.sleep(0.005)
        bad = store.stats()["folders"][0]
        assert bad["state"] == "failed" and bad["errors"] == errors
        with pytest.warns(deepio.kv.FolderRecoveredWarning):
            assert store.retry_failed() == 1
    with pytest.raises(ValueError, match="retry_failed_after"):
        make_store(tmp_dir, folders=("c",), retry_failed_after=-1)


@needs_numpy
def test_a_recovered_folder_does_not_bring_back_dropped_pages_after_a_crash(tmp_dir, fault):
    """The folder's checkpoint on disk lists the pages its failure dropped: a crash after the
    recovery must not bring them back. The crash is a copy of its files taken while open."""
    with make_store(tmp_dir, pages=32, folders=("bad",)) as store:
        pool = np.zeros((9, PAGE), np.uint8)
        store.register(pool)
        keys = [f"d{i}" for i in range(8)]
        for i, k in enumerate(keys):
            pool[i] = page(k)
        assert store.put(keys, range(8)).result() == [True] * 8
        store.checkpoint()
        fault("read", errno=5, count=1 << 30, path_contains=in_folder(tmp_dir, "bad"))
        with pytest.warns(deepio.kv.FolderFailedWarning):  # the get's return or the next call
            assert store.get(keys, range(8)).result() == [False] * 8
            assert store.stats()["folders"][0]["state"] == "failed"
        deepio._deepio._clear_fault()
        with pytest.warns(deepio.kv.FolderRecoveredWarning):
            assert store.retry_failed() == 1
        pool[8] = page("after")
        assert store.put(["after"], [8]).result() == [True]
        shutil.copytree(tmp_dir / "bad", tmp_dir / "crashed")
    with make_store(tmp_dir, pages=32, folders=("crashed",)) as again:
        assert again.contains(keys) == [False] * 8
        pool = np.zeros((1, PAGE), np.uint8)
        again.register(pool)
        assert again.get(["after"], [0]).result() == [True]
        assert (pool[0] == page("after")).all()


_WRITER = textwrap.dedent(
    """
    import sys, numpy as np, deepio.kv
    folder, page = sys.argv[1], int(sys.argv[2])
    store = deepio.kv.Store([folder + "/a", folder + "/b"], capacity_bytes=4096 * (4096 + page),
                            page_bytes=page, checkpoint_interval=0.05)
    pool = np.zeros((8, page), np.uint8)
    store.register(pool)
    i = 0
    while True:
        keys = [f"w{i + j}" for j in range(8)]
        for j in range(8):
            pool[j] = np.random.default_rng(i + j).integers(0, 256, page, dtype=np.uint8)
        ok = store.put(keys, range(8)).result()
        print(" ".join(k for k, o in zip(keys, ok) if o), flush=True)
        i += 8
    """
)


@needs_numpy
@pytest.mark.slow
def test_sigkill_in_a_stream_of_puts(tmp_dir):
    page_n = 8192
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_dir), str(page_n)], stdout=subprocess.PIPE, text=True
    )
    completed: list[str] = []
    with sigkilled_on_exit(child):
        deadline = time.monotonic() + 60
        while len(completed) < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            completed += line.split()
    assert len(completed) >= 400, "the writer did not get going"
    store = deepio.kv.Store(
        [str(tmp_dir / "a"), str(tmp_dir / "b")], capacity_bytes=4096 * (4096 + page_n), page_bytes=page_n
    )
    try:
        n_all = len(completed) + 64
        keys = [f"w{i}" for i in range(n_all)]
        present = store.contains(keys)
        assert all(present[: len(completed)]), "a put whose future completed is missing"
        pool = np.zeros((len(keys), page_n), np.uint8)
        store.register(pool)
        ok = store.get(keys, range(len(keys))).result()
        for i, (p, g) in enumerate(zip(present, ok)):
            if p:
                assert g, f"{keys[i]} listed but not whole"
                assert (pool[i] == np.random.default_rng(i).integers(0, 256, page_n, dtype=np.uint8)).all()
    finally:
        store.close()


@needs_numpy
@pytest.mark.slow
def test_reopen_recovers_every_page(tmp_dir):
    """A reopen from the checkpoint finds every page put, reading no slot (its speed is a benchmark's:
    bench/kv_reopen.py, docs/benchmarks.md; test_reopen_bench_smoke runs it small)."""
    n = 40 * 512
    page_n = 4096
    store = deepio.kv.Store([str(tmp_dir / "s")], capacity_bytes=2 * n * 8192, page_bytes=page_n, checkpoint_interval=0)
    pool = np.zeros((512, page_n), np.uint8)
    store.register(pool)
    for b in range(0, n, 512):
        store.put([f"p{b + i}" for i in range(512)], range(512)).result()
    store.close()
    store = deepio.kv.Store([str(tmp_dir / "s")], capacity_bytes=2 * n * 8192, page_bytes=page_n)
    try:
        s = store.stats()
        assert s["recovered_pages"] == s["pages"] == n
        # After a clean close the checkpoint holds every key, length and CRC: no slot is read.
        assert s["open_headers_read"] == 0 and s["open_pages_read"] == 0
        assert s["open_seconds"] > 0 and s["bytes_read"] == 0 and s["gets"] == 0
        assert store.contains([f"p{i}" for i in range(0, n, 97)]) == [True] * len(range(0, n, 97))
    finally:
        store.close()


@needs_numpy
def test_reopen_bench_smoke(tmp_dir):
    """bench/kv_reopen.py at a tiny size (docs/benchmarks.md runs it at 100k pages)."""
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "kv_reopen.py")
    out = subprocess.run(
        [sys.executable, bench, "--folder", str(tmp_dir / "b"), "--pages", "300", "--batch", "64", "--crc-mib", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("config:") and "verified: True" in out.stdout
