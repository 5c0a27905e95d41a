"""deepio.Writer and deepio.Reader as Python file objects: writes, seeks and flushes against an
io.BytesIO model, random and sequential reads into any memory, other serializers (NumPy,
pickle, torch.save to an open file), and device memory written through the engine."""

from __future__ import annotations

import errno
import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepio
from checkpoint_support import EXAMPLES, SMALL
from conftest import require_module

np = require_module("numpy")
torch = require_module("torch")


# ------------------------------------------------------------------------ Writer / Reader


@pytest.mark.parametrize("kw", [{}, SMALL, {"buffer_size": 4096, "buffers": 2, "direct_io": "off"}])
def test_writer_sequence_of_writes_is_the_concatenation(tmp_dir, kw):
    rng = np.random.default_rng(1)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 4095, 4096, 4097, 30000, 7, 65536)]
    p = tmp_dir / "w.bin"
    with deepio.Writer(p, **kw) as f:
        assert f.writable() and f.seekable() and not f.readable()
        for i, piece in enumerate(pieces):
            # bytes, bytearray, memoryview, NumPy and torch all arrive through the buffer protocol
            src = [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)][i % 4](piece)
            assert f.write(src) == len(piece)
        assert f.tell() == sum(map(len, pieces))
    assert p.read_bytes() == b"".join(pieces)
    assert f.closed
    with pytest.raises(ValueError):
        f.write(b"x")


def test_writer_takes_strided_and_typed_buffers(tmp_dir):
    t = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    bf = torch.randn(3, 5).bfloat16()
    with deepio.Writer(tmp_dir / "t.bin") as f:
        f.write(t.numpy())  # 2-D float64: written as its bytes
        f.write(np.arange(10, dtype=np.int32)[::2])  # not contiguous: copied first
        f.write(bf.t())  # torch tensors too (no buffer protocol), any dtype, any strides
        f.write(torch.tensor(7, dtype=torch.int16))
    data = (tmp_dir / "t.bin").read_bytes()
    want = t.numpy().tobytes() + np.arange(10, dtype=np.int32)[::2].tobytes()
    want += bf.t().contiguous().view(torch.uint8).numpy().tobytes() + np.int16(7).tobytes()
    assert data == want


def test_writer_flush_makes_bytes_visible_and_seek_overwrites(tmp_dir):
    p = tmp_dir / "s.bin"
    body = os.urandom(50000)
    with deepio.Writer(p, **SMALL) as f:
        f.write(body)
        f.flush()
        assert p.read_bytes() == body  # flush() waits for the engine
        assert f.seek(10) == 10  # far behind what is staged: written, then restarted
        f.write(b"HEAD")
        assert f.seek(0, os.SEEK_END) == len(body)
        f.write(b"TAIL")
        assert f.seek(-2, os.SEEK_CUR) == len(body) + 2
        f.write(b"ZZ")  # inside what is staged
        f.seek(len(body) + 100)  # past the end: a hole
        f.write(b"!")
    want = bytearray(body)
    want[10:14] = b"HEAD"
    want += b"TAZZ" + b"\0" * 96 + b"!"
    assert p.read_bytes() == bytes(want)
    with pytest.raises(ValueError):
        deepio.Writer(p, buffer_size=100)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("write"), st.integers(0, 20000)),
            st.tuples(st.just("seek"), st.integers(0, 40000), st.sampled_from([0, 1, 2])),
            st.tuples(st.just("flush")),
        ),
        max_size=25,
    ),
    kw=st.sampled_from([SMALL, {"buffer_size": 4096, "buffers": 2}]),
)
def test_writer_matches_a_bytesio_model(tmp_dir, ops, kw):
    """Any sequence of writes, seeks (from the start, current position or end) and flushes
    gives the file io.BytesIO gives, and the same positions."""
    model = io.BytesIO()
    p = tmp_dir / "model.bin"
    counter = 0
    with deepio.Writer(p, **kw) as f:
        for op in ops:
            if op[0] == "write":
                data = bytes((counter + i) % 251 for i in range(op[1]))
                counter += 1
                assert f.write(data) == model.write(data)
            elif op[0] == "seek":
                off = {0: op[1], 1: op[1] - 20000, 2: op[1] - 20000}[op[2]]
                want = {0: off, 1: model.tell() + off, 2: len(model.getbuffer()) + off}[op[2]]
                if want < 0:
                    continue
                assert f.seek(off, op[2]) == model.seek(off, op[2])
            else:
                f.flush()
            assert f.tell() == model.tell()
    assert p.read_bytes() == model.getvalue()


def test_writer_windows_starting_mid_block_go_by_direct_io(tmp_dir):
    """A staging window that starts mid-block (after a seek past what is staged, or after a
    write from device memory) keeps its bytes at their place in a page of the staging buffer,
    so the engine writes its whole blocks by direct I/O straight from the buffer instead of
    bouncing them through its own slots; the file holds what a plain file would."""
    from deepio import _deepio

    h = _deepio.Handle(block_size=1 << 20, queue_depth=8, intra_op_parallelism=2)
    data = os.urandom(3 << 20)
    p = tmp_dir / "w.bin"
    want = io.BytesIO()
    with deepio.Writer(p, handle=h, buffer_size=1 << 20) as w:
        for f in (w, want):
            f.write(b"head")
            f.seek(12345)
            f.write(data)
            f.seek((5 << 20) + 77)
            f.write(data[:100001])
    assert p.read_bytes() == want.getvalue()
    probe = _deepio.probe_direct_io(str(tmp_dir))
    stats = h.stats()
    if probe["supported"] and probe["mem_align"] <= 4096:
        assert stats["bytes_bounced"] == 0, stats
        assert stats["bytes_direct"] + stats["bytes_fixed"] >= len(data) - (1 << 20), stats


def test_writer_truncates_existing_file(tmp_dir):
    p = tmp_dir / "old.bin"
    p.write_bytes(b"x" * 100000)
    with deepio.Writer(p) as f:
        f.write(b"short")
    assert p.read_bytes() == b"short"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.integers(0, 70000),
    reads=st.lists(st.tuples(st.integers(0, 80000), st.integers(-1, 40000)), min_size=1, max_size=12),
    kw=st.sampled_from([SMALL, {"buffer_size": 4096, "buffers": 2}, {}]),
)
def test_reader_random_reads_match_the_file(tmp_dir, size, reads, kw):
    data = os.urandom(size)
    p = tmp_dir / "r.bin"
    p.write_bytes(data)
    with deepio.Reader(p, **kw) as f:
        assert f.readable() and f.seekable() and not f.writable()
        for off, n in reads:
            assert f.seek(off) == off
            if n % 2:
                got = f.read(n)
            else:
                buf = bytearray(max(n, 0))
                got = bytes(buf[: f.readinto(buf)])
            want = data[off:] if n < 0 else data[off : off + n]
            assert got == want
            assert f.tell() == off + len(want)
    assert f.closed


def test_reader_sequential_reads_and_readinto_torch(tmp_dir):
    data = os.urandom(3 * 8192 + 123)
    p = tmp_dir / "seq.bin"
    p.write_bytes(data)
    with deepio.Reader(p, **SMALL) as f:
        out = b"".join(iter(lambda: f.read(1000), b""))
        assert out == data
        assert f.read(10) == b"" and f.readinto(bytearray(10)) == 0
        f.seek(5)
        t = torch.empty(len(data) - 5, dtype=torch.uint8)
        assert f.readinto(memoryview(t.numpy())) == len(data) - 5
        assert t.numpy().tobytes() == data[5:]
        with pytest.raises(ValueError):
            f.readinto(b"read-only")
        with pytest.raises(OSError) as ei:
            f.seek(-1)
        assert ei.value.errno == errno.EINVAL
        with pytest.raises(io.UnsupportedOperation):
            f.fileno()


def test_reader_large_reads_into_fresh_and_mapped_memory(tmp_dir):
    """Large destinations get huge-page and prefault hints before the copies: contents must
    be exact whatever the memory (fresh torch memory, NumPy, a shared file mapping)."""
    import mmap

    data = os.urandom(20 << 20)
    p = tmp_dir / "big.bin"
    p.write_bytes(data)
    with deepio.Reader(p) as f:
        t = torch.empty(len(data) - 3, dtype=torch.uint8)
        f.seek(3)
        assert f.readinto(memoryview(t.numpy())) == len(data) - 3
        assert t.numpy().tobytes() == data[3:]
        a = np.empty(len(data), np.uint8)
        f.seek(0)
        assert f.readinto(a) == len(data)
        assert a.tobytes() == data
        m = tmp_dir / "mapped.bin"
        m.write_bytes(b"\0" * len(data))
        with open(m, "r+b") as fm, mmap.mmap(fm.fileno(), len(data)) as mm:
            f.seek(0)
            assert f.readinto(mm) == len(data)
            assert mm[:] == data
        assert m.read_bytes() == data


def test_other_serializers_through_writer_and_reader(tmp_dir):
    arr = np.random.default_rng(0).standard_normal((300, 700))
    p = tmp_dir / "a.npy"
    with deepio.Writer(p) as f:
        np.save(f, arr)
    assert np.array_equal(np.load(p), arr)  # plain NumPy reads the file
    with deepio.Reader(p) as f:
        assert np.array_equal(np.load(f), arr)
    obj = {"list": list(range(1000)), "blob": os.urandom(100000), "nested": ({"a": 1.5},)}
    with deepio.Writer(tmp_dir / "o.pkl", **SMALL) as f:
        pickle.dump(obj, f, protocol=5)
    with deepio.Reader(tmp_dir / "o.pkl", **SMALL) as f:
        assert pickle.load(f) == obj
    with deepio.Writer(tmp_dir / "t.pt") as f:
        torch.save({"x": torch.arange(5)}, f)  # torch.save to a file object, kept open
    assert torch.equal(torch.load(tmp_dir / "t.pt")["x"], torch.arange(5))


# ------------------------------------------------------------------------ CUDA memory (fake)


def test_writer_takes_device_memory_through_the_engine(tmp_dir, tmp_path_factory):
    """Writer.write(CUDA buffer) goes through the engine's GPU staging path (here the fake
    CUDA driver of tests/gpu, in a child process: the driver is chosen once per process),
    between staged host bytes, at the right offset."""
    from test_gpu_fake import build_fakes

    cuda, cufile = build_fakes(tmp_path_factory.mktemp("fakes"))
    p = tmp_dir / "dev.bin"
    script = f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import deepio
        from gpu_fake_support import FakeCuda, FakeCudaTensor
        cuda = FakeCuda()
        data = os.urandom(3_000_017)
        dev = FakeCudaTensor(cuda, len(data))
        dev.write(data)
        with deepio.Writer({str(p)!r}, buffer_size=1 << 20, buffers=2) as f:
            f.write(b"head" * 1000)
            assert f.write(dev) == len(data)
            f.write(dev.view(5, 100))
            f.write(b"tail")
            assert f.tell() == 4000 + len(data) + 104
        want = b"head" * 1000 + data + data[5:105] + b"tail"
        assert open({str(p)!r}, "rb").read() == want
        dev.free()
        print("ok")
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "DEEPIO_GPU_TEST_MODE": "fake",
        "DEEPIO_CUDA_LIBRARY": str(cuda),
        "DEEPIO_CUFILE_LIBRARY": "none",
    }
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
