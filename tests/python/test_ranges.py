"""Ranged reads and writes: aio_handle.async_pread_ranges / async_pwrite_ranges, one operation
over many ranges of one file. The bytes equal NumPy's fancy indexing of the file (or one
pread/pwrite per range) for offsets given as NumPy arrays of any integer width, lists and torch
tensors, on disk and tmpfs; refused arguments name the range and queue nothing; an injected
EIO fails the operation as a whole; the buffer is held until wait() and released by it."""

from __future__ import annotations

import array
import errno
import gc
import os
import threading
import weakref

import numpy as np
import pytest

import deepio
from conftest import needs_torch, torch

PAGE = 4096


def _data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(params=["disk", "tmpfs"])
def where(request, tmp_dir):
    if request.param == "disk":
        yield tmp_dir
        return
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield Path(d)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32])
def test_gather_of_pages_in_random_order_equals_fancy_indexing(where, dtype):
    n = 2048
    data = _data(n * PAGE, 1)
    path = where / "f"
    data.tofile(path)
    pages = np.random.default_rng(2).permutation(n)
    h = deepio.aio_handle(queue_depth=64, intra_op_parallelism=2)
    out = np.empty(n * PAGE, dtype=np.uint8)
    assert h.async_pread_ranges(out, path, (pages * PAGE).astype(dtype), PAGE) == n * PAGE
    assert h.wait() == 1  # one operation, whatever the range count
    assert np.array_equal(out.reshape(n, PAGE), data.reshape(n, PAGE)[pages])
    # One size as a NumPy scalar, the offsets as a strided view: the same bytes.
    out2 = np.zeros_like(out)
    both = np.stack([pages * PAGE, pages], axis=1).astype(dtype)
    assert not both[:, 0].flags.c_contiguous  # a column: a view with a stride
    h.async_pread_ranges(out2, path, both[:, 0], np.int64(PAGE))
    h.wait()
    assert np.array_equal(out2, out)
    h.close()


def test_ranges_of_any_size_and_alignment_with_buffer_offsets_and_gaps(tmp_dir):
    data = _data((2 << 20) + 333, 3)
    path = tmp_dir / "f"
    data.tofile(path)
    rng = np.random.default_rng(4)
    sizes = rng.integers(0, 70_000, 300)
    sizes[::37] = (1 << 20) + 5  # some larger than a block: cut across the workers
    offsets = np.array([rng.integers(0, len(data) - s + 1) for s in sizes])
    gaps = rng.integers(0, 3000, 300)
    buf_offsets = np.cumsum(gaps + sizes) - sizes  # each range after a gap
    order = rng.permutation(300)
    out = np.full(int(buf_offsets[-1] + sizes[-1]), 0xA5, dtype=np.uint8)
    expect = out.copy()
    for o, s, b in zip(offsets, sizes, buf_offsets):
        expect[b : b + s] = data[o : o + s]
    h = deepio.aio_handle(block_size=1 << 16, queue_depth=16, intra_op_parallelism=3)
    # As lists, in a shuffled order: the order of the ranges changes nothing.
    n = h.async_pread_ranges(
        out, path, offsets[order].tolist(), sizes[order].tolist(), buffer_offsets=buf_offsets[order].tolist()
    )
    assert n == int(sizes.sum())
    h.wait()
    assert np.array_equal(out, expect)
    h.close()


def test_scatter_write_then_durable_write_syncs_once(tmp_dir):
    h = deepio.aio_handle(block_size=1 << 16, queue_depth=16, intra_op_parallelism=2)
    n = 1000
    src = _data(n * PAGE, 5)
    slots = np.random.default_rng(6).permutation(n) * PAGE
    h.async_pwrite_ranges(src, tmp_dir / "w", slots, PAGE)
    assert h.wait() == 1
    back = np.fromfile(tmp_dir / "w", dtype=np.uint8)
    assert np.array_equal(back.reshape(n, PAGE)[slots // PAGE], src.reshape(n, PAGE))
    assert h.stats()["synced"] == 0
    # The same buffer bytes to two places of the file is fine for a write; synced once.
    h.async_pwrite_ranges(src, tmp_dir / "d", [0, 10_000], [100, 100], buffer_offsets=[7, 7], fsync=True)
    assert h.wait() == 1
    assert h.stats()["synced"] == 1
    d = np.fromfile(tmp_dir / "d", dtype=np.uint8)
    assert len(d) == 10_100
    assert np.array_equal(d[:100], src[7:107]) and np.array_equal(d[10_000:], src[7:107])
    assert not d[100:10_000].any()
    h.close()


@needs_torch
def test_torch_tensors_as_buffer_and_as_offsets(tmp_dir):
    data = _data(64 * PAGE, 7)
    data.tofile(tmp_dir / "f")
    h = deepio.aio_handle()
    pages = torch.randperm(64)
    out = torch.empty(64 * PAGE, dtype=torch.uint8)
    h.async_pread_ranges(out, tmp_dir / "f", pages * PAGE, torch.full((64,), PAGE))
    h.wait()
    assert np.array_equal(out.numpy().reshape(64, PAGE), data.reshape(64, PAGE)[pages.numpy()])
    with pytest.raises(TypeError, match="integers"):
        h.async_pread_ranges(out, tmp_dir / "f", (pages * PAGE).float(), PAGE)
    assert h.wait() == 0
    h.close()


def test_descriptor_form_and_array_module(tmp_dir):
    data = _data(16 * PAGE, 8)
    data.tofile(tmp_dir / "f")
    fd = os.open(tmp_dir / "f", os.O_RDONLY)
    try:
        h = deepio.aio_handle()
        out = bytearray(2 * PAGE)
        h.async_pread_ranges(out, None, array.array("q", [5 * PAGE, 2 * PAGE]), PAGE, fd=fd)
        h.wait()
        assert bytes(out) == data[5 * PAGE : 6 * PAGE].tobytes() + data[2 * PAGE : 3 * PAGE].tobytes()
        h.close()
    finally:
        os.close(fd)


def test_refused_ranges_name_the_range_and_queue_nothing(tmp_dir):
    data = _data(16 * PAGE, 9)
    path = tmp_dir / "f"
    data.tofile(path)
    h = deepio.aio_handle()
    out = np.empty(4 * PAGE, dtype=np.uint8)
    cases = [
        # (args, exception, text)
        (([0, PAGE], [PAGE, 4 * PAGE]), deepio.InvalidArgumentError, "range 1: buffer bytes"),
        (([0, PAGE, 2 * PAGE], PAGE, [0, 2 * PAGE, 100]), deepio.InvalidArgumentError, "ranges 0 and 2 overlap"),
        (([-PAGE], PAGE), deepio.InvalidArgumentError, "file_offset must be non-negative, got -4096"),
        (([0], [-1]), deepio.InvalidArgumentError, r"sizes\[0\] must be non-negative"),
        (([0], np.int32(-1)), deepio.InvalidArgumentError, "sizes must be non-negative, got -1"),
        (([0], np.float32(1)), TypeError, "integers"),
        (([0, 1], [1]), deepio.InvalidArgumentError, "sizes has 1 items for 2 file_offsets"),
        (([0], 1, [0, 1]), deepio.InvalidArgumentError, "buffer_offsets has 2 items"),
        (([0], 1, [-1]), deepio.InvalidArgumentError, "buffer bytes"),
        ((np.zeros((2, 2), dtype=np.int64), 1), deepio.InvalidArgumentError, "one-dimensional"),
        ((np.array([True]), 1), TypeError, "integers"),
        (([0.5], 1), TypeError, r"file_offsets\[0\] must be an integer"),
        (([True], 1), TypeError, r"file_offsets\[0\] must be an integer"),
        (("0", 1), TypeError, "file_offsets must be a sequence"),
        (([0, 15 * PAGE + 1], PAGE), deepio.EndOfFileError, "range 1 reads past end of file"),
        # Python integers beyond 64 bits: named, as an unsigned array item above 2^63 - 1 is
        (([0, 2**63], 1), deepio.InvalidArgumentError, r"file_offsets\[1\] is above 2\^63 - 1"),
        (([0], [2**64]), deepio.InvalidArgumentError, r"sizes\[0\] is above 2\^63 - 1"),
        (([0], 2**63), deepio.InvalidArgumentError, r"sizes is above 2\^63 - 1"),
        (([-(2**64)], 1), deepio.InvalidArgumentError, r"file_offsets\[0\] must be non-negative"),
        ((np.array([2**63], dtype=np.uint64), 1), deepio.InvalidArgumentError, r"file_offsets\[0\] is above"),
        (([0], np.True_), TypeError, "integers"),
    ]
    if torch is not None:  # a 0-d bool tensor is not a size either
        cases.append((([0], torch.tensor(True)), TypeError, "integer"))
    for args, exc, text in cases:
        with pytest.raises(exc, match=text):
            h.async_pread_ranges(out, path, *args)
    with pytest.raises(deepio.InvalidArgumentError, match="ranges 0 and 1 overlap in the file"):
        h.async_pwrite_ranges(out, tmp_dir / "new", [0, 100], [PAGE, 10])
    with pytest.raises(FileNotFoundError, match="for reading"):
        h.async_pread_ranges(out, tmp_dir / "missing", [0], 1)
    with pytest.raises(ValueError, match="read-only|writable"):
        h.async_pread_ranges(bytes(10), path, [0], 1)
    assert not (tmp_dir / "new").exists()
    assert h.wait() == 0
    assert h.stats()["ops_completed"] == 0
    # No ranges at all: an operation that moves nothing.
    assert h.async_pread_ranges(out, path, [], 1) == 0
    assert h.wait() == 1
    h.close()


def test_injected_eio_fails_the_whole_operation(tmp_dir, fault):
    data = _data(256 * PAGE, 10)
    data.tofile(tmp_dir / "f")
    h = deepio.aio_handle(queue_depth=8)
    out = np.empty_like(data)
    pages = np.random.default_rng(11).permutation(256) * PAGE
    fault("read", errno=errno.EIO, after=100, count=1)
    h.async_pread_ranges(out, tmp_dir / "f", pages, PAGE)
    with pytest.raises(OSError) as e:
        h.wait()
    assert e.value.errno == errno.EIO
    assert e.value.filename == str(tmp_dir / "f")
    assert h.stats()["ops_failed"] == 1
    # The handle goes on: the same gather succeeds now.
    h.async_pread_ranges(out, tmp_dir / "f", pages, PAGE)
    assert h.wait() == 1
    assert np.array_equal(out.reshape(256, PAGE), data.reshape(256, PAGE)[pages // PAGE])
    h.close()


def test_buffer_is_held_until_wait_and_released_by_it(tmp_dir):
    data = _data(64 * PAGE, 12)
    data.tofile(tmp_dir / "f")
    h = deepio.aio_handle()
    out = np.empty(64 * PAGE, dtype=np.uint8)
    ref = weakref.ref(out)
    h.async_pread_ranges(out, tmp_dir / "f", np.arange(64) * PAGE, PAGE)
    del out
    gc.collect()
    assert ref() is not None, "the engine holds the buffer while the read may run"
    h.wait()
    gc.collect()
    assert ref() is None, "wait() released it"
    h.close()


def test_many_threads_each_gathering_at_once(tmp_dir):
    n = 512
    data = _data(n * PAGE, 13)
    data.tofile(tmp_dir / "f")
    wrong: list[int] = []

    def run(seed: int) -> None:
        h = deepio.aio_handle(queue_depth=32)
        for round_ in range(5):
            pages = np.random.default_rng(seed * 10 + round_).permutation(n)[:200]
            out = np.empty(200 * PAGE, dtype=np.uint8)
            h.async_pread_ranges(out, tmp_dir / "f", pages * PAGE, PAGE)
            h.wait()
            if not np.array_equal(out.reshape(200, PAGE), data.reshape(n, PAGE)[pages]):
                wrong.append(seed)
        h.close()

    threads = [threading.Thread(target=run, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_file_pread_ranges_and_pwrite_ranges_return_futures(tmp_dir):
    data = _data(32 * PAGE, 14)
    data.tofile(tmp_dir / "f")
    pages = np.random.default_rng(15).permutation(32)
    out = np.empty(32 * PAGE, dtype=np.uint8)
    with deepio.File(tmp_dir / "f", "r") as f:
        fut = f.pread_ranges(out, pages * PAGE, PAGE)
        assert fut.result(timeout=60) == 32 * PAGE
        with pytest.raises(deepio.InvalidArgumentError, match="ranges 0 and 1 overlap in the buffer"):
            f.pread_ranges(out, [0, PAGE], PAGE, buffer_offsets=[0, 10])
        with pytest.raises(deepio.EndOfFileError, match="range 0"):
            f.pread_ranges(out, [32 * PAGE], 1)
    assert np.array_equal(out.reshape(32, PAGE), data.reshape(32, PAGE)[pages])
    with deepio.File(tmp_dir / "g", "w") as g:
        assert g.pwrite_ranges(out, pages * PAGE, PAGE).result(timeout=60) == 32 * PAGE
    assert np.array_equal(np.fromfile(tmp_dir / "g", dtype=np.uint8), data)
    with pytest.raises(ValueError, match="closed file"):
        g.pread_ranges(out, [0], 1)
