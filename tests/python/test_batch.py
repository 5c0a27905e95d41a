"""Batched submission: aio_handle.async_pread_batch / async_pwrite_batch and the raw
_deepio.Handle.submit_batch, against plain file reads and writes."""

from __future__ import annotations

import errno
import gc
import os
import shutil
import sys
import threading

import numpy as np
import pytest
import torch

import deepio
from deepio import _deepio


def _data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_batches_of_many_files_write_and_read_back_exact_bytes(tmp_path):
    sizes = [1, 4095, 4096, 65536 + 7, 1 << 20, 3 * 4096 + 1] * 20
    arrays = [_data(n, i) for i, n in enumerate(sizes)]
    paths = [str(tmp_path / f"t{i}") for i in range(len(sizes))]
    with deepio.aio_handle(block_size=65536, queue_depth=16, intra_op_parallelism=2) as h:
        assert h.async_pwrite_batch(arrays, paths) == len(arrays)
        assert h.wait() == len(arrays)
        for a, p in zip(arrays, paths):
            with open(p, "rb") as f:
                assert f.read() == a.tobytes()
        back = [np.empty_like(a) for a in arrays]
        assert h.async_pread_batch(back, paths) == len(back)
        assert h.wait() == len(back)
    for a, b in zip(arrays, back):
        assert np.array_equal(a, b)


def test_one_file_at_offsets_by_path_and_by_descriptor(tmp_path):
    path = tmp_path / "one"
    chunk = 300_001  # not aligned: heads and tails go buffered, the middles direct
    parts = [torch.from_numpy(_data(chunk, 10 + i)) for i in range(9)]
    offsets = [i * chunk for i in range(len(parts))]
    h = deepio.aio_handle(intra_op_parallelism=3)
    h.async_pwrite_batch(parts, path, offsets)
    assert h.wait() == len(parts)
    assert path.read_bytes() == b"".join(p.numpy().tobytes() for p in parts)
    fd = os.open(path, os.O_RDONLY)
    try:
        back = [torch.empty(chunk, dtype=torch.uint8) for _ in parts]
        h.async_pread_batch(back, fd, offsets)
        assert h.wait() == len(back)
    finally:
        os.close(fd)
    for p, b in zip(parts, back):
        assert torch.equal(p, b)


def test_a_file_that_cannot_be_opened_fails_in_wait_and_the_rest_completes(tmp_path):
    good = tmp_path / "good"
    good.write_bytes(bytes(range(256)) * 64)
    bufs = [np.zeros(16384, np.uint8), np.zeros(10, np.uint8), np.zeros(16384, np.uint8), np.zeros(5, np.uint8)]
    files = [good, tmp_path / "missing", good, tmp_path / "missing-too"]
    h = deepio.aio_handle()
    assert h.async_pread_batch(bufs, files) == 4, "open failures are not raised at submission"
    with pytest.raises(FileNotFoundError) as ei:
        h.wait()
    assert ei.value.filename == str(tmp_path / "missing")
    assert len(ei.value.other_errors) == 1
    assert isinstance(ei.value.other_errors[0], FileNotFoundError)
    assert bufs[0].tobytes() == good.read_bytes() and bufs[2].tobytes() == good.read_bytes()
    assert h.pending() == 0
    assert h.wait() == 0


def test_read_past_end_of_file_is_that_requests_failure(tmp_path):
    p = tmp_path / "short"
    p.write_bytes(b"x" * 1000)
    h = deepio.aio_handle()
    h.async_pread_batch([np.zeros(1000, np.uint8), np.zeros(1001, np.uint8)], p)
    with pytest.raises(deepio.EndOfFileError):
        h.wait()


@pytest.mark.parametrize(
    "buffers, files, offsets, exc",
    [
        ([np.zeros(4, np.uint8)] * 2, ["a"], None, deepio.InvalidArgumentError),  # one file short
        ([np.zeros(4, np.uint8)] * 2, "a", [0], deepio.InvalidArgumentError),  # one offset short
        ([np.zeros(4, np.uint8), "not a buffer"], "a", None, TypeError),
        ([np.zeros(4, np.uint8)] * 2, "a", [0, -1], deepio.InvalidArgumentError),
        ([np.zeros(4, np.uint8)] * 2, ["a", 3.5], None, TypeError),
        (np.zeros((2, 4), np.uint8), "a", None, TypeError),  # an array is not a list of buffers
        ((b for b in [np.zeros(4, np.uint8)]), "a", None, TypeError),
        ([np.zeros(4, np.uint8)] * 2, "a", [0, 4.5], TypeError),  # names offsets[1]
        ([np.zeros(4, np.uint8)] * 2, "a", [0, True], TypeError),
    ],
)
def test_bad_arguments_refuse_the_whole_batch(tmp_path, buffers, files, offsets, exc):
    os.chdir(tmp_path)
    h = deepio.aio_handle()
    with pytest.raises(exc):
        h.async_pwrite_batch(buffers, files, offsets)
    assert h.pending() == 0
    assert not (tmp_path / "a").exists(), "nothing of a refused batch was written"


def test_the_raw_binding_refuses_an_array_as_the_list_of_buffers_and_names_a_bad_offset(tmp_path):
    raw = _deepio.Handle()
    with pytest.raises(TypeError, match="list or tuple"):
        raw.submit_batch(True, np.zeros(8, np.uint8), str(tmp_path / "a"))
    with pytest.raises(TypeError, match=r"offsets\[1\]"):
        raw.submit_batch(True, [np.zeros(4, np.uint8)] * 2, str(tmp_path / "a"), [0, "8"])
    assert raw.pending() == 0 and not (tmp_path / "a").exists()
    raw.close()


def test_a_read_only_destination_refuses_the_batch(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"y" * 64)
    ro = np.zeros(64, np.uint8)
    ro.setflags(write=False)
    h = deepio.aio_handle()
    with pytest.raises((ValueError, TypeError)):
        h.async_pread_batch([np.zeros(64, np.uint8), ro], p)
    assert h.pending() == 0


def test_buffers_stay_alive_until_collected(tmp_path):
    h = deepio.aio_handle(block_size=4096, queue_depth=2)
    expected = [_data(1 << 20, 30 + i).tobytes() for i in range(8)]
    h.async_pwrite_batch([np.frombuffer(e, np.uint8).copy() for e in expected], [tmp_path / f"k{i}" for i in range(8)])
    gc.collect()  # the caller kept no reference: the handle does
    assert h.wait() == 8
    for i, e in enumerate(expected):
        assert (tmp_path / f"k{i}").read_bytes() == e


def test_futures_from_the_raw_handle_are_collected_one_by_one(tmp_path):
    raw = _deepio.Handle(intra_op_parallelism=2)
    arrays = [_data(70_000 + i, i) for i in range(40)]
    ops = raw.submit_batch(True, arrays, [str(tmp_path / f"f{i}") for i in range(40)], None, futures=True)
    assert len(ops) == 40
    assert [op.result() for op in ops] == [a.nbytes for a in arrays]
    assert raw.wait() == 0, "ops with futures belong to their futures"
    bad = raw.submit_batch(False, [np.zeros(3, np.uint8)], str(tmp_path / "nope"), None, futures=True)
    assert isinstance(bad[0].exception(), FileNotFoundError)
    raw.close()


def test_many_threads_submitting_batches_at_once(tmp_path):
    h = deepio.aio_handle(block_size=65536, queue_depth=8, intra_op_parallelism=2)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            arrays = [_data(50_000 + i, 1000 * t + i) for i in range(25)]
            paths = [tmp_path / f"th{t}-{i}" for i in range(25)]
            h.async_pwrite_batch(arrays, paths)
            back = [np.empty_like(a) for a in arrays]
            h.wait()  # collects this thread's writes (and maybe others': each counted once)
            h.async_pread_batch(back, paths)
            h.wait()
            for a, b in zip(arrays, back):
                assert np.array_equal(a, b)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    h.close()


def test_an_empty_batch_queues_nothing(tmp_path):
    h = deepio.aio_handle()
    assert h.async_pwrite_batch([], tmp_path / "e") == 0
    assert h.wait() == 0
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_thousands_of_4k_reads_at_random_offsets_land_byte_for_byte(tmp_path, where):
    # The submission-bound case of bench/batch_submit.py: views of one locked array, a
    # memoryview, a bytearray and torch tensors mixed in, one file read at a random
    # permutation of 4 KiB offsets; a read past the end fails alone and wait() reports it.
    if where == "tmpfs":
        if not os.access("/dev/shm", os.W_OK):
            pytest.skip("no /dev/shm")
        folder = f"/dev/shm/deepio-pytest-{os.getpid()}"
        os.makedirs(folder, exist_ok=True)
    else:
        folder = str(tmp_path)
    path = os.path.join(folder, "small")
    count, size = 8192, 4096
    data = _data(count * size, 80)
    try:
        data.tofile(path)
        h = deepio.aio_handle(block_size=1 << 20, queue_depth=128)
        pool = h.new_cpu_locked_tensor(count * size, np.empty(0, np.uint8))
        pool[:] = 0x5A
        bufs: list = [pool[i * size : (i + 1) * size] for i in range(count)]
        bufs[1] = memoryview(bufs[1])
        extra_ba = bytearray(size)
        extra_t = torch.zeros(size, dtype=torch.uint8)
        bufs[2] = extra_ba
        bufs[3] = extra_t
        order = np.random.default_rng(81).permutation(count)
        offsets = [int(o) * size for o in order]
        past = np.zeros(size, np.uint8)
        bufs.insert(5000, past)
        offsets.insert(5000, count * size - 10)
        assert h.async_pread_batch(bufs, path, offsets) == count + 1
        with pytest.raises(OSError) as e:
            h.wait()
        assert e.value.errno == errno.ENODATA
        assert h.pending() == 0
        view = pool.reshape(count, size)
        for i, o in enumerate(order):
            want = data[o * size : (o + 1) * size]
            got = {2: np.frombuffer(extra_ba, np.uint8), 3: extra_t.numpy()}.get(i, view[i])
            assert np.array_equal(got, want), i
        h.close()
    finally:
        if where == "tmpfs":
            shutil.rmtree(folder, ignore_errors=True)


def test_batch_buffers_are_held_until_wait_and_released_by_it(tmp_path):
    # Without futures the batch's buffers share one keep-alive: each stays exported (a
    # bytearray cannot be resized, an array keeps a reference) until wait() collects the
    # batch, and nothing is held after it.
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 64)
    arrays = [np.zeros(4096, np.uint8) for _ in range(3)]
    ba = bytearray(4096)
    before = [sys.getrefcount(a) for a in arrays]
    h = deepio.aio_handle()
    h.async_pread_batch([*arrays, ba], path, [0, 4096, 8192, 12288])
    assert all(sys.getrefcount(a) > b for a, b in zip(arrays, before)), "held by the pending batch"
    with pytest.raises(BufferError):
        ba.extend(b"x")  # still exported to the batch
    assert h.wait() == 4
    assert [sys.getrefcount(a) for a in arrays] == before
    ba.extend(b"x")  # released
    assert bytes(ba[:4096]) == (bytes(range(256)) * 64)[12288:16384]
    assert all(
        np.array_equal(a, np.frombuffer(path.read_bytes()[i * 4096 : (i + 1) * 4096], np.uint8))
        for i, a in enumerate(arrays)
    )
    h.close()
