"""Where deepio.safetensors' bytes go: the GPU read path under the fake CUDA driver (and a real
GPU where there is one), the page-cache (mmap) backend, and the direct backend populating
its destinations ahead of the copies."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module  # noqa: E402

torch = require_module("torch")
st = require_module("safetensors.torch")
hypothesis = require_module("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

import deepio  # noqa: E402
import deepio.safetensors as ds  # noqa: E402
from deepio import _deepio, _wholefile  # noqa: E402
from deepio.safetensors import _cpu, _io, _load  # noqa: E402
from safetensors_support import EXAMPLES, assert_same_dict, make_shards, rand_tensor, same, state_dicts  # noqa: E402

# --------------------------------------------------------------------------------- GPU


FAKE_CASE = r"""
import os, sys
import safetensors.torch as st, torch
sys.path.insert(0, {tests!r})
import gpu_fake_support as g
import deepio.safetensors as ds
from deepio.safetensors import _io
cuda = g.FakeCuda()
sd = {{"emb": torch.randn(300, 64).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.int64),
      "e": torch.zeros(0, 3), "s": torch.tensor(2.5)}}
p = {path!r}
st.save_file(sd, p)
h = ds.read_header(p)
for chunk in (_io._CHUNK_BYTES, 4096 + 3):
    _io._CHUNK_BYTES = chunk
    dest = g.FakeCudaTensor(cuda, h.data_bytes)
    ops = []
    eng = _io.engine()  # the one default engine, for host and device memory
    _io.submit_read(eng, dest.view, p, h.data_offset, h.data_bytes, ops)
    assert len(ops) == -(-h.data_bytes // chunk)
    _io.run(ops)
    got = dest.read()
    whole = open(p, "rb").read()
    assert got == whole[h.data_offset:], "device bytes differ"
    for t in h.tensors:
        want = sd[t.name].reshape(-1).view(torch.uint8).numpy().tobytes()
        assert got[t.begin:t.end] == want, t.name
    dest.free()
s = eng.stats()
assert s["device_ops_failed"] == 0, s
print("ok", s["device_bytes_cufile"] > 0, s["device_bytes_staged"] > 0)
"""


@pytest.mark.parametrize("cufile", ["fake", "none"])
def test_device_reads_with_the_fake_cuda_driver(cufile, tmp_dir):
    """The GPU read path (the data section read straight into one device allocation through
    the engine, in one or many requests; GDS where cuFile is present, staging otherwise) with
    the fake CUDA driver of tests/gpu. torch cannot make CUDA tensors over the fake, so the
    final tensor views on the device wait for a real GPU (test_load_to_gpu below)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_gpu_fake import build_fakes

    lib_cuda, lib_cufile = build_fakes(tmp_dir)
    env = dict(os.environ)
    env.update(
        DEEPIO_GPU_TEST_MODE="fake" if cufile == "fake" else "nocufile",
        DEEPIO_CUDA_LIBRARY=str(lib_cuda),
        DEEPIO_CUFILE_LIBRARY=str(lib_cufile) if cufile == "fake" else "none",
    )
    code = FAKE_CASE.format(tests=str(Path(__file__).parent), path=str(tmp_dir / "g.safetensors"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[0] == "ok"
    # The default engine's device route (auto) took cuFile where it is present, staging where not.
    via_cufile, via_staging = r.stdout.split()[1:3]
    assert (via_cufile, via_staging) == (("True", "False") if cufile == "fake" else ("False", "True")), r.stdout


def _gpu_reason() -> str:
    if not torch.cuda.is_available():
        return f"no CUDA GPU (torch {torch.__version__})"
    if not deepio.gpu_info()["cuda_found"]:
        return f"deepio cannot use the CUDA driver: {deepio.gpu_info()['cuda_reason']}"
    return ""


needs_gpu = pytest.mark.skipif(bool(_gpu_reason()), reason=_gpu_reason() or "GPU present")


@needs_gpu
def test_load_to_gpu(tmp_dir):
    sd = {
        "a": rand_tensor((1000, 33), torch.bfloat16, 1),
        "b": rand_tensor((3,), torch.int64, 2),
        "e": torch.zeros(0),
        "big": rand_tensor((5 << 20,), torch.uint8, 3),
    }
    p = tmp_dir / "gpu.safetensors"
    st.save_file(sd, str(p))
    for dev in ("cuda", "cuda:0", 0):
        got = ds.load_file(p, device=dev)
        want = st.load_file(str(p), device="cuda:0")
        assert_same_dict(got, want)
    ds.save_file(got, tmp_dir / "back.safetensors")  # CUDA tensors saved through the engine
    assert (tmp_dir / "back.safetensors").read_bytes() == p.read_bytes()


# ------------------------------------------- the page-cache backend and populating ahead


@settings(
    max_examples=max(EXAMPLES // 3, 5), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sd=state_dicts)
def test_mmap_backend_equals_safetensors(sd, tmp_dir):
    p = tmp_dir / "m.safetensors"
    st.save_file(sd, str(p))
    assert_same_dict(ds.load_file(p, backend="mmap"), sd)
    assert_same_dict(ds.load_files([p], backend="mmap"), sd)


def test_mmap_backend_many_pieces_threads_and_shards(tmp_dir, monkeypatch):
    """Pieces of 3 pages + 5 bytes (edges not page-aligned) on 3 threads over 3 shards."""
    monkeypatch.setattr(_cpu, "_MMAP_PIECE", 3 * 4096 + 5)
    monkeypatch.setattr(_cpu, "_MMAP_THREADS", 3)
    want = make_shards(tmp_dir)
    big = {"big": rand_tensor(((3 << 20) + 7,), torch.uint8, 5), "f": rand_tensor((999,), torch.float64, 6)}
    st.save_file(big, str(tmp_dir / "z-big.safetensors"))
    want.update(big)
    assert_same_dict(ds.load_files(tmp_dir, backend="mmap"), want)


def test_mmap_backend_tensors_are_private_copies_on_write(tmp_dir):
    """Each tensor its own storage of exactly its bytes (safetensors.save_file accepts them);
    writing to a tensor changes neither the file nor a second load; the tensors outlive the
    dict and the file's name."""
    sd = {"a": rand_tensor((1 << 18,), torch.float32, 1), "b": rand_tensor((3, 3), torch.float16, 2)}
    p = tmp_dir / "cow.safetensors"
    st.save_file(sd, str(p))
    before = p.read_bytes()
    got = ds.load_file(p, backend="mmap")
    for v in got.values():
        assert v.untyped_storage().nbytes() == v.numel() * v.element_size()
    a = got.pop("a")
    del got
    a += 1
    assert p.read_bytes() == before
    assert_same_dict(ds.load_file(p, backend="mmap"), sd)
    os.unlink(p)  # the mapping keeps the data: a replaced or removed file is no problem
    assert same(a, sd["a"] + 1)
    st.save_file({"a": a}, str(tmp_dir / "again.safetensors"))


def test_mmap_backend_errors(tmp_dir):
    """A file that shrank after its header was read: OSError naming it, no dict. An unknown
    backend: ValueError. Empty files and empty tensors map nothing."""
    sd = {"a": rand_tensor((1 << 16,), torch.uint8, 1)}
    p = tmp_dir / "s.safetensors"
    st.save_file(sd, str(p))
    h = ds.read_header(p)
    os.truncate(p, h.file_size - 100)
    with pytest.raises(OSError) as ei:
        _load._load_headers([h], "cpu", "mmap")
    assert ei.value.errno == errno.EIO and ei.value.filename == str(p)
    with pytest.raises(ValueError, match="backend"):
        ds.load_file(p, backend="pread")
    e = tmp_dir / "e.safetensors"
    st.save_file({"e": torch.zeros(0, 4)}, str(e))
    assert_same_dict(ds.load_file(e, backend="mmap"), {"e": torch.zeros(0, 4)})


def test_populate_read_reports_a_page_past_the_end_of_the_file(tmp_dir):
    """MADV_POPULATE_READ of a mapping whose file shrank: EFAULT, collected by Ahead (the mmap
    backend raises it as OSError); the pages still in the file are populated."""
    import mmap as _mmap

    from deepio import _populate

    if not _populate.available():
        pytest.skip("no MADV_POPULATE_* in this kernel")
    p = tmp_dir / "f.bin"
    p.write_bytes(os.urandom(64 << 10))
    with open(p, "rb") as f:
        m = _mmap.mmap(f.fileno(), 64 << 10, access=_mmap.ACCESS_COPY)
    os.truncate(p, 16 << 10)
    addr = _populate.address(m)
    assert _populate.populate(addr, 16 << 10, _populate.MADV_POPULATE_READ) == 0
    assert _populate.populate(addr, 64 << 10, _populate.MADV_POPULATE_READ) == errno.EFAULT
    a = _populate.Ahead([(addr, 64 << 10)], 16 << 10, 2, _populate.MADV_POPULATE_READ)
    for i in range(len(a.pieces)):
        a.wait(i)
    a.close()
    assert sorted(a.errors) == [(0, errno.EFAULT)] * 3


def test_populate_ahead_keeps_contents_and_covers_every_byte():
    """Populating memory already written changes nothing; pieces tile the ranges in order."""
    import mmap as _mmap

    from deepio import _populate

    m = _mmap.mmap(-1, 10 << 20)
    pattern = os.urandom(4096)
    for at in range(0, 10 << 20, 1 << 20):
        m[at : at + 4096] = pattern
    a = _populate.Ahead([(_populate.address(m), 10 << 20), (_populate.address(m) + 5, 12345)], 3 << 20, 2)
    a.wait_through(10 << 20)
    for i in range(len(a.pieces)):
        a.wait(i)
    a.close()
    assert a.errors == []
    assert [(r, at) for r, at, _ in a.pieces] == [(0, 0), (0, 3 << 20), (0, 6 << 20), (0, 9 << 20), (1, 0)]
    assert sum(n for r, _, n in a.pieces if r == 0) == 10 << 20
    assert all(m[at : at + 4096] == pattern for at in range(0, 10 << 20, 1 << 20))


@pytest.mark.parametrize(("threads", "huge"), [(0, False), (1, True), (2, False), (2, True)])
def test_direct_backend_populating_ahead(threads, huge, tmp_dir, monkeypatch, fault):
    """The direct backend through the whole-file reader with 0-2 helper threads populating
    pieces of 2 pages + 3 bytes ahead of the reads (many requests), on 4 KiB or huge pages:
    same tensors; an EIO still fails the whole load naming its shard with nothing left in
    flight, and the next load works."""
    monkeypatch.setattr(_wholefile, "POPULATE_THREADS", threads)
    monkeypatch.setattr(_wholefile, "HUGEPAGES", huge)
    monkeypatch.setattr(_wholefile, "CHUNK", 2 * 4096 + 3)
    want = make_shards(tmp_dir)
    big = {"big": rand_tensor(((3 << 20) + 7,), torch.uint8, 5)}  # over 2 MiB: huge pages apply
    st.save_file(big, str(tmp_dir / "z-big.safetensors"))
    want.update(big)
    assert_same_dict(ds.load_files(tmp_dir), want)
    fault("read", errno=errno.EIO, after=20, count=1)
    with pytest.raises(OSError) as ei:
        ds.load_files(tmp_dir)
    assert ei.value.errno == errno.EIO
    assert ei.value.filename in {str(p) for p in tmp_dir.glob("*.safetensors")}
    _deepio._clear_fault()
    assert _io.engine().pending() == 0
    assert_same_dict(ds.load_files(tmp_dir), want)


@pytest.mark.parametrize("cut", [1, 5000, "all"])
def test_direct_backend_file_shrank_after_its_header(tmp_dir, cut):
    """A file cut short between its header and its data (by a byte, by more than a request,
    to nothing): OSError EIO naming that file, after the other file's reads finished; no dict.
    Put back, the same headers load."""
    sd = {"a": rand_tensor((1 << 16,), torch.uint8, 1), "b": rand_tensor((999,), torch.float64, 2)}
    p, q = tmp_dir / "s.safetensors", tmp_dir / "t.safetensors"
    st.save_file(sd, str(p))
    st.save_file({"c": rand_tensor((1 << 15,), torch.int32, 3)}, str(q))
    whole = p.read_bytes()
    hs = [ds.read_header(q), ds.read_header(p)]
    os.truncate(p, 0 if cut == "all" else len(whole) - cut)
    with pytest.raises(OSError) as ei:
        _load._load_headers(hs, "cpu", "direct")
    assert ei.value.errno == errno.EIO and ei.value.filename == str(p)
    assert "shrank" in str(ei.value)
    assert _io.engine().pending() == 0
    p.write_bytes(whole)
    got = _load._load_headers(hs, "cpu", "direct")
    assert_same_dict({k: got[k] for k in sd}, sd)
