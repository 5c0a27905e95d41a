"""Locked (page-locked) host memory: DeepNVMe's test_pinned_manager.py (reference §5.4) and the
lifetime guarantees deepio adds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import deepio
from conftest import TORCH_PINNED, needs_numpy, needs_torch
from deepio.compat import PinMemoryBuilder


def _examples():
    out = []
    try:
        import torch as _t

        out.append(pytest.param(lambda: _t.empty(1, dtype=_t.float32), id="torch"))
    except ImportError:
        out.append(pytest.param(None, id="torch", marks=pytest.mark.skip(reason="torch is not installed")))
    try:
        import numpy as _np

        out.append(pytest.param(lambda: _np.empty(1, dtype=_np.float32), id="numpy"))
    except ImportError:
        out.append(pytest.param(None, id="numpy", marks=pytest.mark.skip(reason="numpy is not installed")))
    return out


EXAMPLES = _examples()
N = 4096


def _narrow(t, start, length):
    return t[start : start + length]


@pytest.mark.parametrize("example", EXAMPLES)
def test_narrow_of_locked_buffer_is_pinned(example):
    h = deepio.aio_handle(1024, 2, False, False, 1)
    buf = h.new_cpu_locked_tensor(N, example())
    assert h.is_pinned(buf)
    assert h.is_pinned(_narrow(buf, 1024, 1024))
    assert h.free_cpu_locked_tensor(buf)


@pytest.mark.parametrize("example", EXAMPLES)
def test_buffer_is_shared_across_handles(example):
    a = deepio.aio_handle(1024, 2, False, False, 1)
    b = deepio.aio_handle(1024, 2, False, False, 1)
    buf = a.new_cpu_locked_tensor(N, example())
    assert b.is_pinned(buf)
    del a  # allocations survive the handle that made them
    assert b.is_pinned(buf)
    assert b.free_cpu_locked_tensor(buf)


@pytest.mark.parametrize("example", EXAMPLES)
def test_unmanaged_buffer_is_not_pinned(example):
    h = deepio.aio_handle(1024, 2, False, False, 1)
    ex = example()
    assert not h.is_pinned(ex)
    assert not h.free_cpu_locked_tensor(ex)


@pytest.mark.parametrize("example", EXAMPLES)
def test_pin_handle_and_aio_handle_agree(example):
    pin = PinMemoryBuilder().load().pin_handle()
    h = deepio.aio_handle(1024, 2, False, False, 1)
    p = pin.new_cpu_locked_tensor(N, example())
    assert pin.is_pinned(p) and h.is_pinned(p) and h.is_pinned(_narrow(p, 1024, 1024))
    q = h.new_cpu_locked_tensor(N, example())
    assert pin.is_pinned(q)
    assert h.free_cpu_locked_tensor(p) and pin.free_cpu_locked_tensor(q)


@needs_torch
def test_locked_tensor_kind_dtype_alignment():
    import torch

    h = deepio.aio_handle()
    for dtype in (
        torch.uint8,
        torch.int16,
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.float16,
        torch.bool,
        torch.complex64,
        torch.int64,
    ):
        ex = torch.zeros(3, dtype=dtype)
        t = h.new_cpu_locked_tensor(1000, ex)
        assert isinstance(t, torch.Tensor) and t.dtype == dtype and t.shape == (1000,) and t.device.type == "cpu"
        assert t.data_ptr() % os.sysconf("SC_PAGE_SIZE") == 0
        assert h.is_pinned(t)
        assert h.free_cpu_locked_tensor(t)
    t = h.new_cpu_locked_tensor(0, torch.empty(0))
    assert t.numel() == 0
    assert h.free_cpu_locked_tensor(t)
    t = h.new_cpu_locked_tensor(num_elem=10, example_tenosr=torch.empty(1))  # DeepNVMe's spelling
    assert t.shape == (10,)
    assert h.free_cpu_locked_tensor(t)


@needs_numpy
def test_locked_array_kind_dtype():
    import numpy as np

    h = deepio.aio_handle()
    for dtype in (np.uint8, np.float32, np.complex128, np.dtype([("a", "<i4"), ("b", "<f8")])):
        a = h.new_cpu_locked_tensor(100, np.zeros(1, dtype=dtype))
        assert isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == (100,)
        assert a.ctypes.data % os.sysconf("SC_PAGE_SIZE") == 0
        assert a.flags.writeable and a.flags.c_contiguous
        assert h.free_cpu_locked_tensor(a)
    with pytest.raises(TypeError):
        h.new_cpu_locked_tensor(10, np.zeros(1, dtype=object))
    with pytest.raises(ValueError):
        h.new_cpu_locked_tensor(-1, np.zeros(1))
    with pytest.raises(TypeError):
        h.new_cpu_locked_tensor(10)


@pytest.mark.parametrize("example", EXAMPLES)
def test_free_semantics_and_no_dangling(example):
    """free returns True once, False for views and second frees; the memory is unlocked and
    uncounted at the free, and a tensor used after its free is still valid memory with its
    data (deepio unmaps it only when the last reference dies)."""
    h = deepio.aio_handle()
    t = h.new_cpu_locked_tensor(N, example())
    t[0] = 7
    stats = deepio.locked_memory_stats()
    assert stats["allocations"] >= 1
    assert not h.free_cpu_locked_tensor(_narrow(t, 1, 10))  # not the base
    view = _narrow(t, 0, 10)
    assert h.free_cpu_locked_tensor(t)
    assert not h.free_cpu_locked_tensor(t)  # second free
    assert not h.is_pinned(t)
    assert not h.is_pinned(view)  # views of a freed allocation are not pinned either
    after_free = deepio.locked_memory_stats()
    assert after_free["allocations"] == stats["allocations"] - 1, "freed memory is uncounted at the free"
    assert after_free["released_but_referenced"] >= 1
    assert float(t[0]) == 7  # still mapped, data intact: no crash, nothing changed under a late reader
    t[0] = 1  # must not crash: the range is still mapped while referenced
    view[1] = 2
    del t, view
    assert deepio.locked_memory_stats()["allocations"] == after_free["allocations"]
    assert deepio.locked_memory_stats()["released_but_referenced"] == after_free["released_but_referenced"] - 1


@pytest.mark.parametrize("example", EXAMPLES)
def test_dropping_a_locked_tensor_frees_it(example):
    h = deepio.aio_handle()
    before = deepio.locked_memory_stats()
    t = h.new_cpu_locked_tensor(1 << 20, example())
    mid = deepio.locked_memory_stats()
    assert mid["allocations"] == before["allocations"] + 1
    del t
    assert deepio.locked_memory_stats() == before


@needs_torch
@pytest.mark.skipif(not TORCH_PINNED, reason="torch cannot pin host memory here (no CUDA runtime)")
def test_torch_pinned_counts_as_pinned():  # pragma: no cover - needs a CUDA runtime
    import torch

    assert deepio.aio_handle().is_pinned(torch.empty(16).pin_memory())


@needs_numpy
def test_unlocked_fallback_warns(tmp_dir):
    """Where RLIMIT_MEMLOCK forbids locking (an unprivileged process over the limit), the
    allocation is aligned, unlocked, usable, and a LockedMemoryWarning says so."""
    script = textwrap.dedent("""
        import os, resource, warnings, sys
        import numpy as np, deepio   # before dropping privileges: site-packages may be private
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
        if os.getuid() == 0:
            os.setgid(65534); os.setuid(65534)   # drop CAP_IPC_LOCK, which ignores the limit
        h = deepio.aio_handle()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = h.new_cpu_locked_tensor(1 << 20, np.empty(1, dtype=np.uint8))
        assert any(issubclass(x.category, deepio.LockedMemoryWarning) for x in w), [str(x.message) for x in w]
        assert "RLIMIT_MEMLOCK" in str(w[0].message)
        assert h.is_pinned(a) and a.ctypes.data % os.sysconf("SC_PAGE_SIZE") == 0
        st = deepio.locked_memory_stats()
        assert st["locked_bytes"] == 0 and st["bytes"] == 1 << 20, st
        a[:] = 7
        assert h.free_cpu_locked_tensor(a)
        print("ok")
    """)
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@needs_numpy
@pytest.mark.parametrize("example", EXAMPLES)
def test_locked_tensors_use_io_uring_registered_buffers(example, tmp_path):
    """Locked tensors are transferred through io_uring registered buffers (stats
    "bytes_fixed"); ordinary memory is not, and both read back the same bytes."""
    import numpy as np

    if deepio.aio_handle().backend != "io_uring":
        pytest.skip("io_uring is not available here")
    if tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 19):
        pytest.skip("kernel older than 5.19: no sparse registered-buffer table")
    h = deepio.aio_handle(65536, 8, False, True, 1, backend="io_uring")
    buf = h.new_cpu_locked_tensor(1 << 18, example())  # 2^18 float32: 1 MiB
    if not h.is_pinned(buf):
        pytest.skip("no locked memory here")
    view = (buf if isinstance(buf, np.ndarray) else buf.numpy()).view(np.uint8).reshape(-1)
    n = view.size
    assert n == 1 << 20
    data = np.arange(n, dtype=np.uint32).astype(np.uint8) ^ 0x5A
    view[:] = data
    path = str(tmp_path / "f")
    assert h.sync_pwrite(buf, path) == 1
    assert h.stats()["bytes_fixed"] == n
    plain = np.zeros(n, dtype=np.uint8)
    assert h.sync_pread(plain, path) == 1
    assert h.stats()["bytes_fixed"] == n, "ordinary memory is not registered"
    assert np.array_equal(plain, data)
    view[:] = 0
    assert h.sync_pread(buf, path) == 1
    assert h.stats()["bytes_fixed"] == 2 * n
    assert np.array_equal(view, data)
    assert h.free_cpu_locked_tensor(buf)


# Run in a fresh interpreter: VmLck/VmPin are per process, and other tests keep memory locked.
_GIVEN_BACK = r"""
import json, re, sys
import numpy as np
import deepio
from deepio.compat import PinMemoryBuilder

def vm():
    status = open("/proc/self/status").read()
    return {k: int(re.search(k + r":\s+(\d+)", status).group(1)) for k in ("VmLck", "VmPin")}

path, cycles = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    f.write(np.random.default_rng(0).integers(0, 255, 1 << 16, dtype=np.uint8).tobytes())
start = vm()
pin = PinMemoryBuilder().load().pin_handle()
h = deepio.aio_handle(65536, 8, False, True, 1)
kept, during = [], None
for i in range(cycles):
    # Made by one, read through a handle (io_uring registers it: VmPin), freed by another.
    maker, freer = [(pin, h), (h, pin), (pin, pin)][i % 3]
    t = maker.new_cpu_locked_tensor(1 << 16, np.empty(0, dtype=np.uint8))
    assert pin.is_pinned(t) and h.is_pinned(t)
    assert h.sync_pread(t, path) == 1
    during = during or vm()
    if i % 2:
        assert freer.free_cpu_locked_tensor(t)
    else:
        assert pin.free_cpu_locked_tensor_by_ptr(t.ctypes.data)
        assert not pin.free_cpu_locked_tensor_by_ptr(t.ctypes.data)
    assert not pin.is_pinned(t) and not h.is_pinned(t)
    kept.append(t)  # still referenced after its free, as DeepSpeed's callers may do
freed = vm()
del h
print(json.dumps({"start": start, "during": during, "freed": freed, "end": vm(),
                  "backend": deepio.aio_handle().backend}))
"""


@needs_numpy
@pytest.mark.parametrize("cycles", [1, 10, 100])
def test_freed_locked_memory_is_given_back(tmp_path, cycles):
    """Issue 12: VmLck and VmPin in /proc/self/status return to their starting values after
    free_cpu_locked_tensor / free_cpu_locked_tensor_by_ptr, whichever handle made or freed
    the tensor, even while the freed tensors are still referenced."""
    p = subprocess.run(
        [sys.executable, "-c", _GIVEN_BACK, str(tmp_path / "f"), str(cycles)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r = __import__("json").loads(p.stdout.strip().splitlines()[-1])
    if r["during"]["VmLck"] == r["start"]["VmLck"]:
        pytest.skip("memory cannot be locked here (RLIMIT_MEMLOCK)")
    assert r["during"]["VmLck"] >= r["start"]["VmLck"] + 64
    assert r["freed"] == r["start"], r
    assert r["end"] == r["start"], r


def test_free_by_ptr_refuses_what_it_does_not_own():
    pin = PinMemoryBuilder().load().pin_handle()
    assert pin.free_cpu_locked_tensor_by_ptr(0) is False
    assert pin.free_cpu_locked_tensor_by_ptr(12345) is False
    with pytest.raises(TypeError):
        pin.free_cpu_locked_tensor_by_ptr(True)
    with pytest.raises(TypeError):
        pin.free_cpu_locked_tensor_by_ptr("0x1000")


# deepio's own word for the memory it allocates page-aligned and mlocks is "locked"
# (docs/python.md, "Words"); "pinned" in a Python name is DeepNVMe's, kept exactly as DeepNVMe
# spells it: is_pinned (deepio's locked memory or torch-pinned memory), and the GDS
# registrations of device memory.
DEEPNVME_PIN_NAMES = {
    "aio_handle": {"is_pinned"},
    "gds_handle": {
        "is_pinned",
        "pin_device_tensor",
        "unpin_device_tensor",
        "new_pinned_device_tensor",
        "free_pinned_device_tensor",
    },
    "pin_handle": {"is_pinned"},
}


def test_pinned_in_a_public_name_is_deepnvmes_only():
    from deepio import compat

    assert [n for n in deepio.__all__ if "pin" in n.lower()] == []
    assert [n for n in dir(deepio) if "pin" in n.lower()] == []
    for name, cls in (
        ("aio_handle", deepio.aio_handle),
        ("gds_handle", deepio.gds_handle),
        ("pin_handle", compat.pin_handle),
    ):
        assert {n for n in dir(cls) if "pin" in n.lower()} == DEEPNVME_PIN_NAMES[name], name
    # DeepSpeed's module and builder names.
    assert {n for n in dir(compat) if "pin" in n.lower()} == {"PinMemoryBuilder", "pin_handle", "pin_memory"}


@needs_numpy
def test_is_pinned_is_deepios_locked_check():
    """DeepNVMe's is_pinned, on every handle and on pin_handle, answers what deepio's locked
    check does (the binding's is_locked_range over deepio::is_locked) for deepio's memory,
    views of it, foreign memory and freed memory."""
    import numpy as np

    from deepio import _buffers, _deepio

    pin = PinMemoryBuilder().load().pin_handle()
    h = deepio.aio_handle(1024, 2, False, False, 1)
    buf = h.new_cpu_locked_tensor(N, np.empty(1, dtype=np.float32))
    foreign = np.zeros(N, dtype=np.float32)
    cases = {"locked": buf, "view": buf[1024:2048], "foreign": foreign}
    for name, b in cases.items():
        want = name != "foreign"
        assert _deepio.is_locked_range(b) is want, name
        assert _buffers.is_locked_or_pinned(b) is want, name
        assert h.is_pinned(b) is want and pin.is_pinned(b) is want, name
    view = buf[1024:2048]
    assert h.free_cpu_locked_tensor(buf)
    for b in (buf, view):
        assert not _deepio.is_locked_range(b)
        assert not _buffers.is_locked_or_pinned(b) and not h.is_pinned(b) and not pin.is_pinned(b)
