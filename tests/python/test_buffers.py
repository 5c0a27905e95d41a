"""Any CPU buffer: torch (every dtype, views, Parameters), NumPy (incl. structured dtypes),
the buffer protocol (bytearray, memoryview, array.array, mmap), DLPack-only producers; any
size, offset and address; unusable ones refused with a message naming the problem."""

from __future__ import annotations

import array
import mmap
import os

import pytest

import deepio
from conftest import needs_numpy, needs_torch


@pytest.fixture
def h():
    return deepio.aio_handle(4096, 4, False, True, 3)


@needs_torch
@pytest.mark.parametrize(
    "dtype",
    [
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "bool",
    ],
)
def test_torch_dtypes_roundtrip(h, dtype, tmp_dir):
    import torch

    dt = getattr(torch, dtype)
    src = (torch.rand(1001) * 100).to(dt) if dt != torch.bool else torch.rand(1001) > 0.5
    path = str(tmp_dir / "t.bin")
    assert h.sync_pwrite(src, path) == 1
    assert os.path.getsize(path) == src.nbytes
    dst = torch.empty_like(src)
    assert h.sync_pread(dst, path) == 1
    assert torch.equal(dst, src)


@needs_torch
def test_torch_views_parameters_and_2d(h, tmp_dir):
    import torch

    path = str(tmp_dir / "v.bin")
    p = torch.nn.Parameter(torch.randn(64, 33))  # requires grad: used through a detached view
    assert h.sync_pwrite(p, path) == 1
    m = torch.empty(64, 33)
    assert h.sync_pread(m, path) == 1
    assert torch.equal(m, p.detach())
    row = torch.zeros(64, 33)
    assert h.sync_pread(row[5], path, 33 * 4 * 5) == 1  # a row view at an unaligned address
    assert torch.equal(row[5], p.detach()[5])
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pread(m[:, 1], path)


@needs_numpy
def test_numpy_kinds(h, tmp_dir):
    import numpy as np

    path = str(tmp_dir / "n.bin")
    rec = np.zeros(100, dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S3")])
    rec["a"] = np.arange(100)
    rec["b"] = np.linspace(0, 1, 100)
    rec["c"] = b"xyz"
    assert h.sync_pwrite(rec, path) == 1
    back = np.empty_like(rec)
    assert h.sync_pread(back, path) == 1
    assert (back == rec).all()
    cube = np.random.default_rng(0).random((7, 11, 13))
    assert h.sync_pwrite(cube, path, 5) == 1
    out = np.empty_like(cube)
    assert h.sync_pread(out, path, 5) == 1
    assert (out == cube).all()
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pwrite(np.asfortranarray(cube), path)  # F order: memory order != logical order
    empty = np.empty(0, np.float32)
    assert h.sync_pwrite(empty, path) == 1
    assert h.sync_pread(empty, path) == 1
    assert h.sync_pread(empty, path, os.path.getsize(path)) == 1  # zero bytes at the very end


def test_buffer_protocol_objects(h, tmp_dir):
    path = str(tmp_dir / "b.bin")
    data = os.urandom(10007)
    assert h.sync_pwrite(data, path) == 1  # bytes: fine as a source
    ba = bytearray(len(data))
    assert h.sync_pread(ba, path) == 1 and bytes(ba) == data
    mv = memoryview(bytearray(100))
    assert h.sync_pread(mv[10:50], path, 3) == 1 and bytes(mv[10:50]) == data[3:43]
    arr = array.array("d", [0.0] * 100)
    assert h.sync_pread(arr, path) == 1 and arr.tobytes() == data[:800]
    with mmap.mmap(-1, 8192) as m:
        assert h.sync_pread(m, path, 1) == 1 and m[:] == data[1:8193]
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pread(memoryview(bytearray(100))[::2], path)
    with pytest.raises(ValueError, match="read-only"):
        h.sync_pread(memoryview(b"x" * 10), path)
    with pytest.raises(TypeError):
        h.sync_pwrite([1, 2, 3], path)
    with pytest.raises(TypeError):
        h.sync_pwrite(None, path)


@needs_numpy
def test_dlpack_only_producer(h, tmp_dir):
    """An object offering nothing but __dlpack__ (like JAX or CuPy host arrays)."""
    import numpy as np

    class OnlyDLPack:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, *args, **kwargs):
            return self._a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    src = np.arange(1000, dtype=np.int32)
    path = str(tmp_dir / "d.bin")
    assert h.sync_pwrite(OnlyDLPack(src), path) == 1
    dst = np.zeros_like(src)
    assert h.sync_pread(OnlyDLPack(dst), path) == 1
    assert (dst == src).all()


@needs_numpy
@pytest.mark.parametrize("parallelism", [1, 2, 3, 7])
@pytest.mark.parametrize(
    "size,offset,skew",
    [(1, 0, 0), (511, 1, 3), (4096, 4096, 0), (4097, 4095, 1), (100_003, 12_345, 7), (262_144, 512, 0)],
)
def test_unaligned_sizes_offsets_addresses(parallelism, size, offset, skew, tmp_dir):
    """Sizes not divisible by the parallelism or 512, odd offsets and buffer addresses:
    byte-identical to os.pread/os.pwrite."""
    import numpy as np

    h = deepio.aio_handle(4096, 4, False, True, parallelism)
    path = str(tmp_dir / "u.bin")
    base = os.urandom(offset + size + 100)
    with open(path, "wb") as f:
        f.write(base)
    backing = np.empty(size + 64, np.uint8)
    buf = backing[skew : skew + size]
    assert h.sync_pread(buf, path, offset) == 1
    assert buf.tobytes() == base[offset : offset + size]
    new = np.frombuffer(os.urandom(size), np.uint8)
    buf[:] = new
    assert h.sync_pwrite(buf, path, offset) == 1
    expected = base[:offset] + new.tobytes() + base[offset + size :]
    with open(path, "rb") as f:
        assert f.read() == expected  # nothing before or after the range changed
