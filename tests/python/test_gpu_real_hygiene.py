"""Issue 26 on a real GPU: what deepio must not do to the caller's CUDA state, and how it
classifies memory, checked against the real driver (no fake can prove these). Skips with the
reason where torch has no CUDA device; on the GPU machine ``scripts/gpu-check.sh`` runs this
file in its ``pytest_gpu`` step, where a skip counts as a failure.

* The calling thread's current CUDA context is the same after every public call as before:
  a fresh thread has no context current, and after pinning, reading, writing and unpinning a
  CUDA tensor through ``gds_handle`` and ``aio_handle`` it still has none (deepio works in the
  buffer's context on its own threads, or pushes and pops it).
* CUDA managed memory (CuPy's ``malloc_managed``) is host-addressable: both handles move it
  as host memory (no staging, no cuFile), and the bytes arrive.
* A file system cuFile refuses is asked once, not per operation.
* A producer on a side stream: ``async_pwrite`` of a tensor that a kernel on the current
  (side) stream is still writing returns without waiting for the kernel, and the file gets
  the kernel's bytes.
"""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

import deepio
from test_gpu_real import needs_gpu, torch  # the same GPU check and skip reason

N = (4 << 20) + 4097


def _current_context() -> int:
    """cuCtxGetCurrent on the calling thread, from the real driver (0: none)."""
    lib = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return ctx.value or 0


def _handle(kind: str):
    cls = deepio.gds_handle if kind == "gds" else deepio.aio_handle
    return cls(1 << 20, 8, False, False, 2)


def _in_fresh_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the thread did not finish"
    if "error" in out:
        raise out["error"]
    return out["value"]


@needs_gpu
@pytest.mark.parametrize("kind", ["gds", "aio"])
def test_a_fresh_thread_keeps_no_current_context(tmp_dir, kind):
    t = torch.randint(0, 255, (N,), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    f = str(tmp_dir / "ctx.bin")

    def calls():
        before = _current_context()
        seen = []
        h = _handle(kind)
        if kind == "gds":
            assert h.pin_device_tensor(t)
            seen.append(("pin_device_tensor", _current_context()))
        assert h.sync_pwrite(t, f) == 1
        seen.append(("sync_pwrite", _current_context()))
        out = torch.empty_like(t)
        assert h.async_pread(out, f) == 0
        seen.append(("async_pread", _current_context()))
        assert h.wait() == 1
        seen.append(("wait", _current_context()))
        if kind == "gds":
            assert h.unpin_device_tensor(t)
            seen.append(("unpin_device_tensor", _current_context()))
            p = h.new_pinned_device_tensor(4096, t)
            seen.append(("new_pinned_device_tensor", _current_context()))
            assert h.free_pinned_device_tensor(p)
            seen.append(("free_pinned_device_tensor", _current_context()))
        h.close()
        seen.append(("close", _current_context()))
        return before, seen, out

    before, seen, out = _in_fresh_thread(calls)
    assert before == 0, "a new thread should start with no CUDA context current"
    changed = [name for name, ctx in seen if ctx != before]
    assert not changed, f"the calling thread's current context changed after: {changed}"
    assert torch.equal(out, t)


@needs_gpu
@pytest.mark.parametrize("kind", ["gds", "aio"])
def test_managed_memory_moves_as_host_memory(tmp_dir, kind):
    cupy = pytest.importorskip("cupy")
    n = N
    mem = cupy.cuda.malloc_managed(n)
    src = cupy.ndarray((n,), dtype=cupy.uint8, memptr=mem)
    src[...] = cupy.random.randint(0, 255, n, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()
    f = str(tmp_dir / "managed.bin")
    h = _handle(kind)
    assert h.sync_pwrite(src, f) == 1
    with open(f, "rb") as fh:
        assert fh.read() == cupy.asnumpy(src).tobytes()
    dst = cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.malloc_managed(n))
    dst[...] = 0
    cupy.cuda.Device().synchronize()
    assert h.sync_pread(dst, f) == 1
    assert bool((dst == src).all())
    if kind == "gds":
        g = h.stats()["gds"]
        assert g["ops_completed"] == 0 and g["bytes_staged"] == 0 and g["bytes_cufile"] == 0, (
            f"managed memory took the device route: {g}"
        )


@needs_gpu
def test_side_stream_producer_is_not_stalled_and_its_bytes_are_written(tmp_dir):
    n = 64 << 20
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    f = str(tmp_dir / "stream.bin")
    h = deepio.aio_handle(1 << 20, 8, False, False, 2)
    side = torch.cuda.Stream()
    # Calibrate a kernel that runs about a second on this GPU.
    cycles = 50_000_000
    start = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    per_cycle = (time.perf_counter() - start) / cycles
    cycles = int(1.0 / per_cycle)
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)  # the producer is busy...
        t.fill_(7)  # ...then writes the tensor, all on the side stream
        start = time.perf_counter()
        assert h.async_pwrite(t, f) == 0
        submitted = time.perf_counter() - start
        # Still running when the submission returned: it did not wait for the producer (the
        # stream's state decides, not a clock; the time is only for the message).
        producer_busy = not side.query()
    assert h.wait() == 1
    with open(f, "rb") as fh:
        data = fh.read()
    assert len(data) == n and data.count(7) == n, "the file does not hold the producer's bytes"
    assert producer_busy, f"async_pwrite returned after the producer's stream finished ({submitted:.3f} s: a stall)"


@needs_gpu
def test_a_refused_file_system_is_asked_once(tmp_dir):
    # Where cuFile refuses the file system (no nvidia-fs: 5027), the first file's refusal is
    # remembered: the other files are staged without asking cuFile again. Where cuFile accepts
    # (GDS proper), nothing is refused and nothing is skipped.
    t = torch.randint(0, 255, (N,), dtype=torch.uint8, device="cuda")
    h = deepio.gds_handle(1 << 20, 8, False, False, 2)
    files = [str(tmp_dir / f"f{i}.bin") for i in range(4)]
    for f in files:
        assert h.sync_pwrite(t, f) == 1
    out = torch.empty_like(t)
    for f in files:
        assert h.sync_pread(out, f) == 1
        assert torch.equal(out, t)
    g = h.stats()["gds"]
    if g["files_fallback"] == 0:
        assert g["registrations_skipped"] == 0 and g["bytes_cufile"] == 2 * len(files) * N, g
    else:
        assert g["files_fallback"] == 2 * len(files), g
        assert g["registrations_skipped"] == 2 * len(files) - 1, f"cuFile was asked again: {g}"
        assert h.mode == "compat" and h.mode_reason, h.mode_reason
