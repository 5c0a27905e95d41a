"""deepio.kv.Store's batch queue (issue 46 item 3): a get queued behind puts is started before
them, and the puts waiting to start are counted in stats() (the back-pressure signal)."""

from __future__ import annotations

import threading

import pytest

import deepio.kv

np = pytest.importorskip("numpy")

PAGE = 256 << 10
PAGES = 32  # per put batch: 8 MiB, written durably


def test_a_get_goes_ahead_of_queued_puts_and_pending_puts_are_counted(tmp_dir):
    puts = 12
    store = deepio.kv.Store(
        [str(tmp_dir / "a")],
        capacity_bytes=(puts + 2) * PAGES * (PAGE + 8192) * 2,
        page_bytes=PAGE,
        checkpoint_interval=0,
        batch_threads=1,  # one batch at a time: the queue's order is the order they run
    )
    try:
        pool = np.zeros((PAGES, PAGE), dtype=np.uint8)
        pool[:, :8] = np.arange(PAGES, dtype=np.uint64).view(np.uint8).reshape(-1, 8)
        store.register(pool)
        assert all(store.put([f"g{i}" for i in range(4)], list(range(4))).result())
        order: list[str] = []
        lock = threading.Lock()

        def done(name):
            def cb(_f):
                with lock:
                    order.append(name)

            return cb

        futures = []
        for p in range(puts):
            f = store.put([f"p{p}-{i}" for i in range(PAGES)], list(range(PAGES)))
            f.add_done_callback(done(f"put{p}"))
            futures.append(f)
        s = store.stats()
        got = np.zeros((4, PAGE), dtype=np.uint8)
        g = store.get_segments([f"g{i}" for i in range(4)], [[(got[i].ctypes.data, PAGE)] for i in range(4)])
        with lock:  # at most the batches done by the time the get was queued (a busy machine)
            done_before = len(order)
        g.add_done_callback(done("get"))
        # Queued behind `puts` put batches (the first perhaps started), the puts not started
        # are counted with their pages and bytes.
        assert 1 <= s["pending_puts"] <= puts
        assert s["pending_put_pages"] == s["pending_puts"] * PAGES
        assert s["pending_put_bytes"] == s["pending_put_pages"] * PAGE
        assert all(g.result())
        for f in futures:
            assert all(f.result())
        with lock:
            # The get ran before every put queued after the one running when it came.
            assert order.index("get") <= done_before + 1, (done_before, order)
        assert got[:, :8].copy().view(np.uint64).reshape(-1).tolist() == [0, 1, 2, 3]
        s = store.stats()
        assert s["pending_puts"] == s["pending_put_pages"] == s["pending_put_bytes"] == 0
    finally:
        store.close()
