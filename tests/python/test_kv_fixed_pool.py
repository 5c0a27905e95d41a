"""A pool registered with deepio.kv.Store moves through io_uring registered ("fixed") buffers
(issue 46): its pages are pinned once, not at every request. stats()["bytes_fixed"] counts the
bytes that went so; a pool above the 8 GiB adoption limit takes the ordinary path; the
registration ends with the store (the kernel's pinned-page count, VmPin, goes back down)."""

from __future__ import annotations

import mmap
import time

import pytest

import deepio
import deepio.kv

np = pytest.importorskip("numpy")

PAGE = 64 << 10


def _uring() -> None:
    if deepio.aio_handle().backend != "io_uring":
        pytest.skip("no io_uring here: registered buffers are io_uring's")


def _vm_pin_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPin:"):
                return int(line.split()[1])
    pytest.skip("no VmPin in /proc/self/status")


def _pool(rows: int, page: int = PAGE) -> np.ndarray:
    """The caller's own memory (anonymous, page-aligned, not deepio's)."""
    return np.frombuffer(mmap.mmap(-1, rows * page), dtype=np.uint8).reshape(rows, page)


def _store(tmp_dir, name: str, pages: int) -> deepio.kv.Store:
    return deepio.kv.Store([str(tmp_dir / name)], capacity_bytes=pages * (PAGE + 8192) * 2, page_bytes=PAGE)


def test_a_registered_pool_moves_through_registered_buffers_until_the_store_closes(tmp_dir):
    _uring()
    pages = 64
    pool = _pool(pages)
    pool[:] = np.random.default_rng(1).integers(0, 256, pool.shape, dtype=np.uint8)
    want = pool.copy()
    before = _vm_pin_kib()
    store = _store(tmp_dir, "a", pages)
    try:
        store.register(pool)
        keys = [f"k{i}" for i in range(pages)]
        assert all(store.put(keys, range(pages)).result())
        pool[:] = 0
        assert all(store.get(keys, range(pages)).result())
        assert np.array_equal(pool, want)
        st = store.stats()
        # The pages both ways, and each put's 4 KiB slot header (written from the batch
        # thread's locked header buffer, registered too).
        assert st["bytes_fixed"] == 2 * pages * PAGE + pages * 4096, st
        assert _vm_pin_kib() > before, "the pool's registration pins its pages"
    finally:
        store.close()
    deadline = time.monotonic() + 30  # the kernel unpins a released registration a little later
    while _vm_pin_kib() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _vm_pin_kib() <= before, "closing the store ended the registration"


def test_a_pool_over_the_adoption_limit_takes_the_ordinary_path(tmp_dir):
    _uring()
    rows = (9 << 30) // PAGE  # 9 GiB of address space; only the rows used are ever touched
    pool = _pool(rows)
    pool[:4] = 7
    store = _store(tmp_dir, "b", 8)
    try:
        store.register(pool)
        assert all(store.put(["x", "y"], [0, 1]).result())
        pool[2:4] = 0
        assert all(store.get(["x", "y"], [2, 3]).result())
        assert (pool[2:4] == 7).all()
        assert store.stats()["bytes_fixed"] == 2 * 4096  # the two slot headers only, no page
    finally:
        store.close()
