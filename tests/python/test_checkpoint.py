"""deepio.save/load and the file-like deepio.Writer/Reader: torch compatibility both ways,
other serializers, durability (a writer killed mid-save, exceptions, RLIMIT_FSIZE) and the
failures a user can cause (missing file, permissions, folders, truncated or corrupt files)."""

from __future__ import annotations

import errno
import io
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepio
from conftest import require_module, sigkilled_on_exit

np = require_module("numpy")
torch = require_module("torch")

EXAMPLES = int(os.environ.get("DEEPIO_HYPOTHESIS_EXAMPLES", "40"))
SMALL = {"buffer_size": 8192, "buffers": 3}  # many buffer turns on small data


def _child(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".deepio-tmp-" in n)


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


# ---------------------------------------------------------------------- torch round trips

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 9), min_size=0, max_size=3))
    n = 1
    for s in shape:
        n *= s
    base = torch.from_numpy(np.frombuffer(draw(st.binary(min_size=n * 16, max_size=n * 16)), np.uint8).copy())
    if n == 0:
        t = torch.empty(0, dtype=dtype)
    elif dtype == torch.bool:
        t = (base[:n] & 1).bool()
    else:
        t = base[: n * torch.empty(0, dtype=dtype).element_size()].view(dtype)
    t = t.reshape(shape)
    kind = draw(st.sampled_from(["plain", "transposed", "sliced"]))
    if kind == "transposed" and t.dim() >= 2:
        t = t.transpose(0, 1)  # non-contiguous
    elif kind == "sliced" and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]  # a view with a storage offset
    return t


def containers():
    leaves = tensors() | st.integers() | st.text(max_size=5) | st.none()
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=12,
    )


def raw(t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert a.storage_offset() == b.storage_offset()
        # Compare bytes: NaN payloads and float8 compare exactly, and == is not defined for float8.
        assert raw(a) == raw(b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.wheel
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=containers())
def test_round_trips_with_torch(tmp_dir, obj):
    ours, theirs = tmp_dir / "ours.pt", tmp_dir / "theirs.pt"
    deepio.save(obj, ours)
    torch.save(obj, theirs)
    assert_same(obj, torch.load(ours))  # deepio.save -> torch.load
    assert_same(obj, deepio.load(theirs))  # torch.save -> deepio.load
    assert_same(obj, deepio.load(ours))  # deepio.save -> deepio.load


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=containers())
def test_round_trips_through_the_storage_filling_route(tmp_dir, obj):
    """The route deepio.save takes for objects with CUDA storages (torch writes the file with
    the bytes left out, the Writer puts each storage in its place), forced for CPU objects:
    the file must load in torch exactly as torch.save's does."""
    from deepio import checkpoint

    p = tmp_dir / "filled.pt"
    checkpoint._force_filling = True
    try:
        deepio.save(obj, p)
    finally:
        checkpoint._force_filling = False
    assert_same(obj, torch.load(p))
    assert_same(obj, deepio.load(p))


def test_storage_filling_route_keeps_sharing_and_large_storages(tmp_dir):
    import zipfile

    from deepio import checkpoint

    base = torch.randn(3 << 20)  # 12 MiB: crosses staging buffers
    obj = {"all": base, "view": base[5:100], "other": [torch.arange(7)], "empty": torch.zeros(0)}
    p = tmp_dir / "filled.pt"
    checkpoint._force_filling = True
    try:
        deepio.save(obj, p, buffer_size=1 << 20)
    finally:
        checkpoint._force_filling = False
    got = torch.load(p)
    assert torch.equal(got["all"], base) and torch.equal(got["view"], base[5:100])
    assert got["view"].untyped_storage().data_ptr() == got["all"].untyped_storage().data_ptr()
    with zipfile.ZipFile(p) as z:  # host storages' CRC-32s computed beside the writes
        assert z.testzip() is None
        crcs = {i.filename: i.CRC for i in z.infolist() if "/data/" in i.filename}
    assert sorted(crcs.values()) == sorted([0, zlib.crc32(raw(base)), zlib.crc32(raw(obj["other"][0]))])


def _quantized():
    with warnings.catch_warnings():  # torch deprecates quantized tensors; they still load
        warnings.simplefilter("ignore")
        g = torch.Generator().manual_seed(5)
        per_tensor = torch.quantize_per_tensor(torch.randn(300, generator=g), 0.05, 7, torch.quint8)
        per_channel = torch.quantize_per_channel(
            torch.randn(4, 50, generator=g),
            torch.tensor([0.1, 0.2, 0.3, 0.4]),
            torch.tensor([0, 1, 2, 3]),
            0,
            torch.qint8,
        )
        return per_tensor, per_channel


def _nested():
    with warnings.catch_warnings():  # the strided nested layout is a prototype
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.arange(6.0).reshape(2, 3), torch.ones(4, 3)])


def assert_odd_same(a, b):
    """assert_same for the tensors assert_same does not cover: quantized, sparse, nested, meta."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_odd_same(a[k], b[k])
    elif not isinstance(a, torch.Tensor):
        assert_same(a, b)
    elif a.is_quantized:
        assert b.is_quantized and a.qscheme() == b.qscheme() and a.dtype == b.dtype
        assert torch.equal(a.int_repr(), b.int_repr()) and torch.equal(a.dequantize(), b.dequantize())
    elif a.is_nested:
        assert b.is_nested and all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind(), strict=True))
    elif a.layout != torch.strided:
        assert b.layout == a.layout and a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a.to_dense(), b.to_dense())
    elif a.device.type == "meta":
        assert b.device.type == "meta" and a.shape == b.shape and a.dtype == b.dtype
    else:
        assert_same(a, b)


def _odd_state_dict():
    """Storages the hypothesis round trips do not draw: every layout torch.save writes, and one
    storage seen through several views at other offsets and strides."""
    per_tensor, per_channel = _quantized()
    raw8 = torch.arange(256, dtype=torch.uint8)
    big = torch.randn(3 << 18)  # 3 MiB: several staging buffers on the filling route
    return {
        "quantized": per_tensor,
        "quantized_per_channel": per_channel,
        "quantized_view": per_tensor[10:20],
        "nested": _nested(),
        "sparse_coo": torch.randn(6, 5).relu().to_sparse(),
        "sparse_csr": torch.randn(6, 5).relu().to_sparse_csr(),
        "complex128": torch.randn(7, dtype=torch.complex128),
        "complex_view": torch.randn(4, 6, dtype=torch.complex64).t()[1:],
        "bytes": raw8,
        "slice": raw8[4:68],  # one storage seen at several offsets (torch refuses other dtypes)
        "strided": raw8.as_strided((4, 3), (7, 2), 3),
        "reversed_rows": raw8[:60].reshape(6, 10).t()[2:, 1:],
        "big": big,
        "big_tail": big[(3 << 18) - 5 :],
        "zero_size_storage": torch.empty(0, dtype=torch.float64),
        "zero_size_view": big[7:7],
        "meta": torch.empty(3, 4, device="meta"),
        "parameter": torch.nn.Parameter(torch.randn(3, 2)),
        "scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "step": 7,
    }


@pytest.mark.parametrize("route", ["plain", "filling"])
def test_odd_storages_round_trip(tmp_dir, monkeypatch, route):
    """Quantized, nested, sparse, meta, complex, zero-size, shared reinterpreted storages:
    deepio.save on both routes (the filling route, forced, leaves quantized and nested tensors
    to the plain one) loads in torch.load as torch.save's file does, and deepio.load reads
    both files back the same; sharing survives."""
    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_force_filling", route == "filling")
    sd = _odd_state_dict()
    ours, theirs = tmp_dir / "ours.pt", tmp_dir / "theirs.pt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepio.save(sd, ours)
    assert not [w for w in caught if "skip_data" in str(w.message)]  # torch.save warns of none either
    torch.save(sd, theirs)
    for got in (
        torch.load(ours, weights_only=False),
        deepio.load(ours, weights_only=False),
        deepio.load(theirs, weights_only=False),
    ):
        assert_odd_same(sd, got)
        for k in ("slice", "strided", "reversed_rows"):
            assert got[k].untyped_storage().data_ptr() == got["bytes"].untyped_storage().data_ptr()
        assert got["big_tail"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    # weights_only (torch's default) decides the same way for both loaders
    try:
        want = torch.load(theirs)
    except Exception as e:
        with pytest.raises(type(e)):
            deepio.load(theirs)
    else:
        assert_odd_same(want, deepio.load(theirs))
    assert _leftovers(tmp_dir) == []


@pytest.mark.parametrize("what", ["quantized", "quantized_per_channel", "nested"])
def test_filling_route_saves_tensors_torch_refuses_under_skip_data(tmp_dir, monkeypatch, what):
    """Regression: on the route deepio.save takes once CUDA is initialized, torch refuses
    quantized and nested tensors ("Cannot serialize qtensor under skip_data"). The dry pass
    sees them and the save takes the plain route: a complete file (CRC-32 in its records, as
    torch.save writes them), equal through torch.load and deepio.load, the old file replaced,
    no temporary file left."""
    import zipfile

    from deepio import checkpoint

    per_tensor, per_channel = _quantized()
    tensor = {"quantized": per_tensor, "quantized_per_channel": per_channel, "nested": _nested()}[what]
    sd = {"w": torch.randn(1 << 20), "t": tensor, "bias": torch.arange(5.0), "n": 3}
    p = tmp_dir / "q.pt"
    p.write_bytes(b"old contents")
    monkeypatch.setattr(checkpoint, "_force_filling", True)
    deepio.save(sd, p)
    assert_odd_same(sd, torch.load(p, weights_only=False))
    assert_odd_same(sd, deepio.load(p, weights_only=False))
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None  # every record complete, CRCs right
        assert 0 not in {i.CRC for i in z.infolist() if "/data/" in i.filename and i.file_size}
    assert _leftovers(tmp_dir) == []


class RefusedUnderSkipData:
    """An object torch's serializer refuses under skip_data, as a future torch might refuse
    some tensor the dry pass does not know about."""

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        if torch.serialization._serialization_tls.skip_data:
            raise RuntimeError("Cannot serialize this object under skip_data context manager")
        return (RefusedUnderSkipData, (self.value,))


def test_filling_route_restarts_on_a_refusal_the_dry_pass_missed(tmp_dir, monkeypatch):
    """When torch refuses something under skip_data that the dry pass let through, the save
    starts again on the plain route in a fresh, truncated temporary file: the result is the
    complete file (no bytes of the first attempt), and other RuntimeErrors still fail."""
    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_force_filling", True)
    sd = {"w": torch.randn(3 << 18), "odd": RefusedUnderSkipData(41), "b": torch.arange(9)}
    p = tmp_dir / "r.pt"
    p.write_bytes(b"old")
    deepio.save(sd, p, buffer_size=1 << 20)
    for got in (torch.load(p, weights_only=False), deepio.load(p, weights_only=False)):
        assert torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"])
        assert got["odd"].value == 41
    plain = tmp_dir / "plain.pt"
    monkeypatch.setattr(checkpoint, "_force_filling", False)
    deepio.save(sd, plain, buffer_size=1 << 20)
    assert p.read_bytes() == plain.read_bytes()  # the plain route's file, byte for byte
    assert _leftovers(tmp_dir) == []


def test_loads_torch_legacy_format(tmp_dir):
    sd = {"a": torch.randn(1000, 100), "b": [torch.arange(5)], "v": torch.ones(10)[2:]}
    p = tmp_dir / "legacy.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=False)  # the pre-1.6 format: not a zip
    assert_same(sd, deepio.load(p))


class Counted:
    calls = 0

    def __reduce__(self):
        Counted.calls += 1
        return (int, (5,))


@pytest.mark.skipif(torch.cuda.is_initialized(), reason="CUDA is initialized: the dry pass must run")
def test_cpu_saves_pickle_once(tmp_dir):
    """Without CUDA initialized no CUDA storage can exist: no dry pickling pass."""
    Counted.calls = 0
    deepio.save({"c": Counted(), "t": torch.ones(3)}, tmp_dir / "once.pt")
    assert Counted.calls == 1
    assert deepio.load(tmp_dir / "once.pt", weights_only=False)["c"] == 5


def test_shared_storages_stay_shared(tmp_dir):
    base = torch.arange(100, dtype=torch.float32)
    obj = {"all": base, "view": base[10:20], "t": base.view(10, 10).t(), "bf": torch.randn(5).bfloat16()}
    p = tmp_dir / "shared.pt"
    deepio.save(obj, p)
    for got in (torch.load(p), deepio.load(p)):
        assert got["all"].untyped_storage().data_ptr() == got["view"].untyped_storage().data_ptr()
        assert got["t"].untyped_storage().data_ptr() == got["all"].untyped_storage().data_ptr()
        got["all"][15] = -1
        assert got["view"][5] == -1  # one storage, as torch.load gives
        assert_same(obj["bf"], got["bf"])


def test_large_state_dict_and_map_location(tmp_dir):
    sd = {f"w{i}": torch.randn(1 << 18) for i in range(12)}  # 12 MiB: several buffer turns
    sd["small"] = torch.ones(3)
    p = tmp_dir / "sd.pt"
    deepio.save(sd, p)
    got = deepio.load(p, map_location="cpu")
    for k in sd:
        assert torch.equal(got[k], sd[k])
    got = deepio.load(p, map_location=lambda storage, loc: storage)
    assert torch.equal(got["w3"], sd["w3"])
    nn = torch.nn.Linear(30, 20)
    deepio.save(nn.state_dict(), p)
    fresh = torch.nn.Linear(30, 20)
    fresh.load_state_dict(deepio.load(p))
    assert torch.equal(fresh.weight, nn.weight)


@pytest.mark.parametrize("stdlib_crc", [False, True], ids=["installed-crc", "zlib-crc"])
@pytest.mark.parametrize("crc32", [None, True, False])
def test_large_saves_compute_their_crcs_beside_the_writes(tmp_dir, monkeypatch, crc32, stdlib_crc):
    """Host storages of a save from _FILL_MIN bytes take the filling route; where CRC-32s are
    wanted: torch writes the zip without their bytes and CRCs, helper threads compute each
    CRC (zlib-ng's where installed, in pieces combined with its crc32_combine; else zlib's, one
    piece a storage: both run) while the Writer places the storage,
    and the CRCs are written into the data descriptors and the central directory afterwards.
    The file must be what zip tools accept (every CRC checked) and load in torch exactly;
    crc32=False leaves every CRC 0."""
    import zipfile

    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_FILL_MIN", 1 << 20)
    monkeypatch.setattr(checkpoint, "_CRC_PIECE", (1 << 20) - 64)  # storages' CRCs in pieces, combined
    if stdlib_crc:  # as without zlib-ng: no crc32_combine, one piece a storage
        monkeypatch.setattr(checkpoint, "_crc32", zlib.crc32)
        monkeypatch.setattr(checkpoint, "_crc32_combine", None)
    patched = []
    real_patch = checkpoint._patch_crcs
    monkeypatch.setattr(
        checkpoint, "_patch_crcs", lambda path, crcs: (patched.append(len(crcs)), real_patch(path, crcs))
    )
    base = torch.randn(3 << 18)  # 3 MiB across 1 MiB staging buffers
    sd = {
        "w": torch.randn(700, 1001),
        "half": torch.randn(333, 77).half(),
        "view": base[7:5000],
        "base": base,
        "empty": torch.zeros(0),
        "int": torch.arange(13, dtype=torch.int16),
        "n": [1, "x"],
    }
    p = tmp_dir / "big.pt"
    deepio.save(sd, p, crc32=crc32, buffer_size=1 << 20)
    for got in (torch.load(p), deepio.load(p)):
        assert_same(sd, got)
    with zipfile.ZipFile(p) as z:
        data = {i.filename: i.CRC for i in z.infolist() if "/data/" in i.filename and i.file_size}
        if crc32 is False:
            assert set(data.values()) == {0} and patched == []
            return
        assert z.testzip() is None
    want = sorted(zlib.crc32(raw(t)) for t in (sd["w"], sd["half"], base, sd["int"]))
    assert sorted(data.values()) == want
    assert patched == [4]  # the four non-empty host storages went by the filling route
    out = subprocess.run(["unzip", "-tq", str(p)], capture_output=True, text=True, check=False)
    if out.returncode != 127 and "not found" not in out.stderr:
        assert out.returncode == 0, out.stdout + out.stderr


def test_saves_take_zlib_ngs_crc_where_it_is_installed():
    """scripts/setup.sh installs zlib-ng (the "checkpoint" extra): deepio.save must then use its
    CRC-32 (3.5x zlib's on one core here), and it must agree with zlib's on every length and
    alignment a storage can have, views into numpy memory included."""
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
    import numpy as np

    from deepio import checkpoint

    assert checkpoint._crc32 is zlib_ng.crc32
    raw_bytes = np.random.default_rng(5).integers(0, 256, size=(1 << 20) + 77, dtype=np.uint8)
    for lo, n in [(0, 0), (0, 1), (3, 4095), (1, 1 << 20), (64, 65536 + 13), (0, raw_bytes.size)]:
        view = raw_bytes[lo : lo + n]
        assert checkpoint._crc32(view) == zlib.crc32(view), (lo, n)


def _page_aligned(t, shift: int = 0):
    """A copy of ``t`` in a storage of its own starting ``shift`` bytes past a page boundary
    (an anonymous mapping): page-aligned, as tensors torch.load(mmap=True) and deepio.load give
    from a page-aligned file, or torch's allocator gives under THP_MEM_ALLOC_ENABLE=1."""
    import mmap

    a = np.frombuffer(mmap.mmap(-1, t.nbytes + shift), dtype=np.uint8, count=t.nbytes, offset=shift)
    out = torch.from_numpy(a).view(t.dtype).reshape(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 4096 == shift
    return out


def _records(path) -> dict[str, tuple[int, bytes]]:
    """{record name: (file offset of its data, the data)} of a zip, from each record's local
    header (no CRC check: crc32=False leaves them 0)."""
    import zipfile

    from deepio import checkpoint

    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        out = {}
        for i in z.infolist():
            f.seek(i.header_offset)
            start = checkpoint._data_start(i.header_offset, f.read(30))
            f.seek(start)
            out[i.filename.split("/", 1)[1]] = (start, f.read(i.file_size))
        return out


@pytest.mark.parametrize("crc32", [None, False])
def test_large_saves_write_storages_from_their_own_memory(tmp_dir, monkeypatch, crc32):
    """A large save writes each storage of _IN_PLACE_MIN bytes or more whose memory the device
    takes for direct I/O through the engine straight from that memory, not copied into the
    staging buffers; its records start on page boundaries, so page-aligned memory (here an
    anonymous mapping) qualifies wherever the folder takes direct I/O. Memory the device does
    not take (64 bytes past a page where direct I/O wants 512: torch's allocator gives 64) is
    staged, never bounced through the engine's slots (slower). Storages whose length is no
    multiple of a block, views, and storages too small to go in place sit between them; the
    file is the one torch.load reads (zip tools too, with every CRC-32)."""
    import zipfile

    from deepio import _deepio, checkpoint

    copied = []
    real_copy = checkpoint._copy
    monkeypatch.setattr(checkpoint, "_copy", lambda dest, src: (copied.append(len(src)), real_copy(dest, src)))
    big = _page_aligned(torch.randn((3 << 20) + 5))  # 12 MiB and 20 bytes: a tail past the last block
    sd = {
        "aligned": _page_aligned(torch.randn(1 << 20)),  # 4 MiB
        "big_view": big[1000:],
        "odd": torch.randn((1 << 20) + 3),  # memory where torch's allocator put it
        "shifted": _page_aligned(torch.randn(1 << 20), shift=64),
        "small": torch.arange(1000, dtype=torch.int16),
        "half": torch.randn(1 << 21).half(),  # 4 MiB of another dtype
    }
    h = _deepio.Handle(block_size=1 << 20, queue_depth=32, intra_op_parallelism=2)
    p = tmp_dir / "inplace.pt"
    deepio.save(sd, p, crc32=crc32, handle=h, buffer_size=1 << 20)
    for got in (torch.load(p), deepio.load(p), torch.load(p, mmap=True)):
        assert_same(sd, got)
    stored = big.nbytes + sum(sd[k].nbytes for k in ("aligned", "odd", "shifted", "small", "half"))
    aligned = big.nbytes + sd["aligned"].nbytes
    records = _records(p)
    assert all(at % 4096 == 0 for name, (at, _) in records.items() if name.startswith("data/"))
    assert records[".storage_alignment"][1] == b"4096"
    if crc32 is None:
        with zipfile.ZipFile(p) as z:
            assert z.testzip() is None
    probe = _deepio.probe_direct_io(str(tmp_dir))
    stats = h.stats()
    assert stats["bytes_bounced"] == 0, stats
    if probe["supported"] and probe["mem_align"] <= 4096:
        assert sum(copied) <= stored - aligned + (1 << 20)  # the aligned storages were not copied
        assert stats["bytes_direct"] >= (big.nbytes // 4096 + sd["aligned"].nbytes // 4096) * 4096, stats
        if probe["mem_align"] > 64:
            assert sum(copied) >= sd["shifted"].nbytes
    else:  # no direct I/O here: everything staged
        assert sum(copied) >= stored


def test_a_checkpoint_deepio_loaded_saves_again_from_its_own_memory(tmp_dir, monkeypatch):
    """Resuming and saving again: deepio.load of a large deepio.save file gives page-aligned
    storages (its records are), so saving them again writes them straight from that memory
    wherever the folder takes direct I/O at page alignment, whatever torch's allocator gave
    the first time; the second file holds the same tensors."""
    from deepio import _deepio, checkpoint

    sd = {"embed": torch.randn(1 << 20), "w": torch.randn(1500, 1001), "b": torch.randn(1001)}
    first = tmp_dir / "first.pt"
    deepio.save(sd, first)
    loaded = deepio.load(first)
    assert all(loaded[k].untyped_storage().data_ptr() % 4096 == 0 for k in sd)
    copied = []
    real_copy = checkpoint._copy
    monkeypatch.setattr(checkpoint, "_copy", lambda dest, src: (copied.append(len(src)), real_copy(dest, src)))
    h = _deepio.Handle(block_size=1 << 20, queue_depth=32, intra_op_parallelism=2)
    second = tmp_dir / "second.pt"
    deepio.save(loaded, second, handle=h)
    assert_same(sd, torch.load(second))
    probe = _deepio.probe_direct_io(str(tmp_dir))
    if probe["supported"] and probe["mem_align"] <= 4096:
        large = sd["embed"].nbytes + sd["w"].nbytes
        assert sum(copied) < 1 << 20
        assert h.stats()["bytes_direct"] >= large // 4096 * 4096 - 4096


def test_saves_from_many_threads_at_once(tmp_dir):
    """Four threads save large state dicts at once through the shared checkpoint handle (the
    same page-aligned tensors written in place by all of them, torch-allocated ones staged,
    CRC-32s on each save's helper threads), two of them to one path, while a fifth loads: every
    file is whole (every CRC checked) and holds what was saved; of the shared path, one of the
    two saves."""
    import threading
    import zipfile

    shared = {"a": _page_aligned(torch.randn(1 << 20)), "b": _page_aligned(torch.randn((1 << 20) + 3))}
    own = [{"x": torch.full((1 << 20,), float(i)), "s": torch.arange(i + 5)} for i in range(4)]
    paths = [tmp_dir / f"t{i}.pt" for i in range(3)] + [tmp_dir / "t2.pt"]  # two threads on t2
    deepio.save(shared, tmp_dir / "read.pt")
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as e:  # reported below
            errors.append(e)

    def saver(i: int) -> None:
        for _ in range(2):
            deepio.save({**shared, **own[i]}, paths[i])

    def loader() -> None:
        for _ in range(4):
            assert_same(shared, deepio.load(tmp_dir / "read.pt"))

    threads = [threading.Thread(target=run, args=(lambda i=i: saver(i),)) for i in range(4)]
    threads.append(threading.Thread(target=run, args=(loader,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i, p in enumerate(paths[:2]):
        assert_same({**shared, **own[i]}, torch.load(p))
    got = torch.load(paths[2])
    assert any(torch.equal(got["x"], own[i]["x"]) and torch.equal(got["s"], own[i]["s"]) for i in (2, 3))
    assert_same(shared, {k: got[k] for k in shared})
    for p in set(paths):
        with zipfile.ZipFile(p) as z:
            assert z.testzip() is None
    assert _leftovers(tmp_dir) == []


@pytest.mark.parametrize("case", ["page-aligned", "many-small", "torch-without-the-record"])
def test_torch_load_computes_the_offsets_of_a_large_save(tmp_dir, monkeypatch, case):
    """torch.load can compute each storage's offset from the file's ``.storage_alignment``
    instead of reading the records' headers (torch's calculate_storage_offsets, checked against
    the headers under TORCH_SERIALIZATION_DEBUG=1): the record must say the alignment the file
    was written with, page-aligned or, where padding every record to a page would cost more
    than 1/64 of the bytes (thousands of small tensors), torch's own; under a torch whose
    serializer writes no such record, deepio.save writes it."""
    from torch.utils.serialization import config

    many_small = case == "many-small"
    if case == "torch-without-the-record":
        real_save = torch.serialization._save

        def save_without_the_record(obj, zip_file, *args):
            class Skipping:
                def __getattr__(self, name):
                    return getattr(zip_file, name)

                def write_record(self, name, data, nbytes):
                    if name != ".storage_alignment":
                        zip_file.write_record(name, data, nbytes)

            return real_save(obj, Skipping(), *args)

        monkeypatch.setattr(torch.serialization, "_save", save_without_the_record)

    sd = {"w": torch.randn(3 << 20), "b": torch.randn(1001)}
    if many_small:
        sd.update({f"n{i}": torch.randn(17) for i in range(3000)})
    p = tmp_dir / "offsets.pt"
    deepio.save(sd, p)
    records = _records(p)
    alignment = int(records[".storage_alignment"][1])
    assert alignment == (torch.serialization._get_storage_alignment() if many_small else 4096)
    assert all(at % alignment == 0 for name, (at, _) in records.items() if name.startswith("data/"))
    monkeypatch.setattr(config.load, "calculate_storage_offsets", True)
    monkeypatch.setenv("TORCH_SERIALIZATION_DEBUG", "1")
    got = torch.load(p, mmap=True)
    assert_same(sd, got)
    if not many_small:
        assert got["w"].data_ptr() % 4096 == 0


def test_a_torch_without_skip_data_saves_on_the_plain_route(tmp_dir, monkeypatch):
    """torch before 2.5 has no skip_data: large saves take the plain route (torch's CRCs)."""
    import zipfile

    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_FILL_MIN", 1 << 20)
    monkeypatch.setattr(checkpoint, "_patch_crcs", lambda path, crcs: pytest.fail("filling route taken"))
    monkeypatch.delattr(torch.serialization, "skip_data")
    sd = {"w": torch.randn(1 << 19), "b": torch.arange(3)}
    p = tmp_dir / "old-torch.pt"
    deepio.save(sd, p)
    assert_same(sd, torch.load(p))
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None


def test_crc_patching_leaves_a_file_it_cannot_read_alone(tmp_dir):
    """A file that is not the zip torch writes keeps its bytes; a warning names it."""
    from deepio import checkpoint

    p = tmp_dir / "not-a-zip.pt"
    p.write_bytes(b"PK\x03\x04 but nothing after it" * 10)
    before = p.read_bytes()
    with pytest.warns(RuntimeWarning, match="left without CRC-32"):
        checkpoint._patch_crcs(str(p), {30: (4, 1234)})
    assert p.read_bytes() == before


class _Growing:
    """Pickles as a tensor of another size each time."""

    def __init__(self):
        self.calls = 0

    def __reduce__(self):
        self.calls += 1
        return (torch.clone, (torch.full((self.calls * 300_000,), float(self.calls)),))

    def last(self):
        return torch.full((self.calls * 300_000,), float(self.calls))


class _OneMore(_Growing):
    """Pickles as one more tensor each time (a lazily made buffer, a growing history)."""

    def __reduce__(self):
        self.calls += 1
        return (list, ([torch.full((1 << 18,), float(i + 1)) for i in range(self.calls)],))

    def last(self):
        return [torch.full((1 << 18,), float(i + 1)) for i in range(self.calls)]


class _Swapping(_Growing):
    """Pickles two same-size tensors, in the other order each time."""

    def __init__(self):
        super().__init__()
        self.ts = [torch.full((1 << 18,), 1.0), torch.full((1 << 18,), 2.0)]

    def _order(self):
        return self.ts if self.calls % 2 else self.ts[::-1]

    def __reduce__(self):
        self.calls += 1
        a, b = self._order()
        return (dict, ([("first", a), ("second", b)],))

    def last(self):
        a, b = self._order()
        return {"first": a, "second": b}


@pytest.mark.parametrize("kind", [_Growing, _OneMore, _Swapping], ids=["other-size", "one-more", "swapped"])
def test_a_save_whose_second_pickling_differs_holds_what_torch_pickled(tmp_dir, monkeypatch, kind):
    """The dry pass decides the filling route; the records are filled with the storages torch's
    own pickling gave them (queued as torch's pickler sees them), so an object that pickles
    differently the second time is saved as torch.save saves it: another size, one more
    storage (once a hole of zeros with CRC 0, found by review) or the same sizes in another
    order (once each other's bytes, with matching CRCs)."""
    import zipfile

    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_FILL_MIN", 1 << 20)
    odd = kind()
    sd = {"w": torch.randn(1 << 19), "odd": odd}
    p = tmp_dir / "g.pt"
    deepio.save(sd, p, buffer_size=1 << 20)
    assert odd.calls == 2  # the dry pass and torch's: no restart
    got = torch.load(p, weights_only=False)
    assert torch.equal(got["w"], sd["w"])
    assert_same(odd.last(), got["odd"])
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
    assert _leftovers(tmp_dir) == []


def test_a_writer_filling_storages_refuses_a_skip_where_no_storage_goes(tmp_dir):
    """While filling, a forward skip with no storage queued for it would leave a hole of zeros
    in the file: the Writer raises _FillMismatch (save() then starts again on the plain route)."""
    import os

    from deepio import checkpoint
    from deepio.checkpoint import _filling

    w = _filling.FillingWriter(tmp_dir / "w.bin")
    w.write(b"head")
    w._filling = True
    with pytest.raises(checkpoint._FillMismatch, match="no storage goes"):
        w.seek(4096, os.SEEK_CUR)
    with pytest.raises(checkpoint._FillMismatch):  # the Writer stays failed, and closes
        w.close()
    assert w.closed


@pytest.mark.parametrize("head", [0, 100, 4095])
def test_a_writer_filling_a_storage_in_place_stages_its_unaligned_ends(tmp_dir, monkeypatch, head):
    """A storage placed where the file is not on a block boundary (torch's 64-byte record
    alignment, many small tensors): the bytes up to the next boundary and after the last one go
    through the staging buffers, the blocks between straight from the storage's memory when its
    address lines up with the file's blocks (here: ``head`` bytes past a page, the storage's
    first byte at file offset ``head`` too); nothing is bounced, and the file is exact."""
    import mmap
    import os

    from deepio import _deepio, checkpoint
    from deepio.checkpoint import _filling

    copied = []
    real_copy = checkpoint._copy
    monkeypatch.setattr(checkpoint, "_copy", lambda dest, src: (copied.append(len(src)), real_copy(dest, src)))
    n = (5 << 20) + 77
    m = mmap.mmap(-1, n + head)
    src = np.frombuffer(m, dtype=np.uint8, count=n, offset=head)
    src[:] = np.random.default_rng(head).integers(0, 256, n, dtype=np.uint8)
    h = _deepio.Handle(block_size=1 << 20, queue_depth=8, intra_op_parallelism=2)
    p = tmp_dir / "w.bin"
    with _filling.FillingWriter(p, handle=h, buffer_size=1 << 20) as w:
        w.write(b"h" * head)
        w._filling = True
        w._fills.append((n, src))
        assert w.seek(n, os.SEEK_CUR) == head + n
        w._filling = False
        w.write(b"trailer")
    assert p.read_bytes() == b"h" * head + src.tobytes() + b"trailer"
    probe = _deepio.probe_direct_io(str(tmp_dir))
    if probe["supported"] and probe["mem_align"] <= 4096:
        stats = h.stats()
        assert stats["bytes_bounced"] == 0, stats
        assert stats["bytes_direct"] >= (n - 4096) // 4096 * 4096, stats
        assert sum(copied) <= head + 2 * 4096 + len(b"trailer")  # the ends only


@pytest.mark.parametrize("crc32", [None, True, False])
def test_crc32_choice(tmp_dir, crc32):
    import zipfile

    sd = {"a": torch.randn(5000), "b": torch.arange(10)}
    p = tmp_dir / "crc.pt"
    deepio.save(sd, p, crc32=crc32)
    for got in (torch.load(p), deepio.load(p)):
        assert torch.equal(got["a"], sd["a"]) and torch.equal(got["b"], sd["b"])
    with zipfile.ZipFile(p) as z:
        crcs = {i.filename: i.CRC for i in z.infolist()}
        assert crcs["archive/data/0"] == (0 if crc32 is False else zlib.crc32(raw(sd["a"])))
        if crc32 is not False:
            assert z.testzip() is None  # every record's CRC checks out


class Custom:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Custom) and other.v == self.v


def test_weights_only_follows_torch_load(tmp_dir):
    p = tmp_dir / "custom.pt"
    deepio.save({"c": Custom(3), "t": torch.ones(2)}, p)
    with pytest.raises(pickle.UnpicklingError) as ei:
        torch.load(p)  # torch 2.6+: weights_only=True by default
    with pytest.raises(pickle.UnpicklingError) as ei2:
        deepio.load(p)  # the same default, the same exception type
    assert str(p) in str(ei2.value) and "weights_only" in str(ei.value)
    assert deepio.load(p, weights_only=False)["c"] == Custom(3)
    assert deepio.load(p, mmap=True, weights_only=False)["c"] == Custom(3)


def _resident_fraction(addr: int, nbytes: int) -> float:
    """The share of the whole pages of [addr, addr + nbytes) resident in this process's memory
    (mincore(2)); 0.0 where the range is no longer mapped. The pages themselves decide, not the
    process's RSS, which other threads move."""
    import ctypes

    page = os.sysconf("SC_PAGE_SIZE")
    lo, hi = -(-addr // page) * page, (addr + nbytes) // page * page
    n = (hi - lo) // page
    if n <= 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    vec = ctypes.create_string_buffer(n)
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
        assert ctypes.get_errno() == errno.ENOMEM, os.strerror(ctypes.get_errno())
        return 0.0  # unmapped
    return sum(b & 1 for b in vec.raw) / n


def test_a_loaded_storage_gives_its_memory_back_when_it_goes(tmp_dir):
    """deepio.load reads the whole file into one buffer and makes each storage a view of its
    record there; a storage the caller drops (a model's weights once load_state_dict copied
    them, while the optimizer keeps its own tensors) gives its pages back at once instead of
    living as long as the last tensor of the load."""
    import gc

    sd = {"big": torch.randn(16 << 20), "keep": torch.randn(1 << 18)}
    sd["view"] = sd["big"][10:20]
    p = tmp_dir / "parts.pt"
    deepio.save(sd, p)
    got = deepio.load(p, map_location="cpu")
    assert_same(sd, got)
    assert got["view"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    big = (got["big"].untyped_storage().data_ptr(), got["big"].untyped_storage().nbytes())
    keep = (got["keep"].untyped_storage().data_ptr(), got["keep"].untyped_storage().nbytes())
    assert _resident_fraction(*big) > 0.99  # read in
    del got["big"]
    gc.collect()
    assert _resident_fraction(*big) > 0.99  # the view still holds the storage
    del got["view"]
    gc.collect()
    assert _resident_fraction(*big) < 0.01  # its 64 MiB given back while "keep" lives on
    assert _resident_fraction(*keep) > 0.99
    assert torch.equal(got["keep"], sd["keep"])
    got["keep"].add_(1)  # still its own, writable memory
    assert torch.equal(got["keep"], sd["keep"] + 1)


def test_loaded_tensors_keep_their_bytes_for_atexit_handlers(tmp_dir):
    """Giving a dropped storage's pages back must not run at interpreter exit, before an atexit
    handler of the caller's that still reads the tensors (registered first of all: atexit runs
    the last registered first)."""
    p = tmp_dir / "exit.pt"
    r = _child(f"""
        import atexit
        atexit.register(lambda: print("equal" if torch.equal(got["w"], sd["w"]) else "changed"))
        import torch, deepio
        sd = {{"w": torch.arange(1 << 20, dtype=torch.float32)}}
        deepio.save(sd, {str(p)!r})
        got = deepio.load({str(p)!r}, map_location="cpu")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "equal"


_effects: list[int] = []


def _effect(v):
    _effects.append(v)
    return v


class SideEffect:
    def __reduce__(self):
        return (_effect, (1,))


class FailsToLoad:
    def __reduce__(self):
        return (int, ("not a number",))


def test_a_failing_load_runs_the_files_code_once(tmp_dir):
    """With weights_only=False unpickling runs the file's code: a load that fails while
    unpickling raises (named) after running it once, as torch.load does, and does not read
    and unpickle the file a second time by another route."""
    p = tmp_dir / "fails.pt"
    torch.save({"w": torch.randn(1000), "side": SideEffect(), "boom": FailsToLoad()}, p)
    for loader in (torch.load, deepio.load):
        _effects.clear()
        with pytest.raises(ValueError) as ei:
            loader(p, map_location="cpu", weights_only=False)
        assert _effects == [1], loader
    assert str(p) in str(ei.value)  # deepio names the file


# ---------------------------------------------------------------------------- durability


def test_killed_writer_leaves_the_old_file_intact(tmp_dir):
    p = tmp_dir / "ckpt.pt"
    old = {"old": torch.arange(1000)}
    deepio.save(old, p)
    good = p.read_bytes()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, torch, deepio
                big = {{f"t{{i}}": torch.randn(1 << 22) for i in range(48)}}  # 768 MiB
                print("ready", flush=True)
                while True:
                    deepio.save(big, {str(p)!r})
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    with sigkilled_on_exit(child):
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the temporary file is well under way
            tmp = [tmp_dir / n for n in _leftovers(tmp_dir)]
            if tmp and tmp[0].exists() and tmp[0].stat().st_size > 64 << 20:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the writer never got going")
    assert p.read_bytes() == good  # the final name still holds the old file
    assert torch.equal(torch.load(p)["old"], old["old"])
    left = _leftovers(tmp_dir)  # the killed writer's temporary file, recognisable by name
    assert len(left) == 1 and left[0].startswith(".ckpt.pt.deepio-tmp-"), left
    os.unlink(tmp_dir / left[0])


class Explodes:
    def __reduce__(self):
        raise RuntimeError("boom while pickling")


def test_save_keeps_the_replaced_files_permissions(tmp_dir):
    p = tmp_dir / "private.pt"
    deepio.save({"v": torch.ones(1)}, p)
    os.chmod(p, 0o600)
    deepio.save({"v": torch.zeros(1)}, p)
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert torch.equal(torch.load(p)["v"], torch.zeros(1))


def test_exception_mid_save_keeps_the_old_file(tmp_dir):
    p = tmp_dir / "ckpt.pt"
    deepio.save({"v": torch.ones(10)}, p)
    good = p.read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        deepio.save({"a": torch.randn(1 << 20), "b": Explodes()}, p)
    assert p.read_bytes() == good and _leftovers(tmp_dir) == []


def test_write_error_mid_save_keeps_the_old_file(tmp_dir, fault):
    p = tmp_dir / "ckpt.pt"
    deepio.save({"v": torch.ones(10)}, p)
    good = p.read_bytes()
    fault("write", errno=errno.EIO, after=3, path_contains="deepio-tmp")  # a later block of the body
    with pytest.raises(OSError) as ei:
        deepio.save({f"t{i}": torch.randn(1 << 20) for i in range(8)}, p, buffer_size=1 << 20)
    assert ei.value.errno == errno.EIO and ".ckpt.pt.deepio-tmp-" in ei.value.filename
    assert p.read_bytes() == good and _leftovers(tmp_dir) == []


def test_file_size_limit_mid_save_keeps_the_old_file(tmp_dir):
    """RLIMIT_FSIZE in a child (SIGXFSZ ignored): the save fails with EFBIG, the old file and
    its name are intact and no temporary file is left."""
    p = tmp_dir / "ckpt.pt"
    deepio.save({"v": torch.ones(10)}, p)
    good = p.read_bytes()
    r = _child(f"""
        import errno, resource, signal, os, torch, deepio
        big = {{f"t{{i}}": torch.randn(1 << 20) for i in range(16)}}  # 64 MiB
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))
        try:
            deepio.save(big, {str(p)!r})
        except OSError as e:
            assert e.errno == errno.EFBIG, e
            print("EFBIG")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "EFBIG"
    assert p.read_bytes() == good and _leftovers(tmp_dir) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is missing")
def test_full_device_through_writer():
    with pytest.raises(OSError) as ei:
        with deepio.Writer("/dev/full", durable=False) as f:
            f.write(b"x" * 100000)
    assert ei.value.errno == errno.ENOSPC


# ------------------------------------------------------------------ failures a user causes


def test_missing_file_and_folder_paths(tmp_dir):
    with pytest.raises(FileNotFoundError) as ei:
        deepio.load(tmp_dir / "nope.pt")
    assert ei.value.filename == str(tmp_dir / "nope.pt")
    with pytest.raises(FileNotFoundError):
        deepio.save({"x": torch.ones(1)}, tmp_dir / "no-such-folder" / "x.pt")
    with pytest.raises(IsADirectoryError):
        deepio.load(tmp_dir)
    with pytest.raises(IsADirectoryError):
        deepio.save({"x": torch.ones(1)}, tmp_dir)
    with pytest.raises(IsADirectoryError):
        deepio.Writer(tmp_dir)
    with pytest.raises(TypeError):
        deepio.save({}, io.BytesIO())
    assert _leftovers(tmp_dir) == []


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "cut-central-directory", "flipped-pickle"])
def test_corrupt_files_name_the_file(tmp_dir, how):
    p = tmp_dir / f"{how}.pt"
    torch.save({"w": torch.randn(1000), "n": 3}, p)
    data = bytearray(p.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif how == "empty":
        data = bytearray()
    elif how == "cut-central-directory":
        data = data[:-30]
    else:
        i = data.index(b"data.pkl") + 40
        data[i : i + 20] = b"\xff" * 20
    p.write_bytes(bytes(data))
    with pytest.raises(Exception) as theirs:
        torch.load(p)
    with pytest.raises(Exception) as ours:
        deepio.load(p)
    assert str(p) in str(ours.value), ours.value
    if isinstance(theirs.value, ValueError):  # UnicodeDecodeError of a flipped pickle, ...
        # deepio.CorruptFileError, a ValueError too: `except ValueError` still catches it.
        assert isinstance(ours.value, deepio.CorruptFileError) and ours.value.filename == str(p), ours.value
        return
    # torch's exception type, or the nearest base class of it that takes a message: an
    # `except` written for torch.load still catches it.
    assert isinstance(theirs.value, type(ours.value)) and type(ours.value) is not Exception, (theirs.value, ours.value)


def test_permission_denied_as_unprivileged_user(tmp_dir):
    """root ignores file modes, so the calls run as nobody in a child process."""
    if os.getuid() != 0:
        pytest.skip("needs root to switch to another user")
    secret = tmp_dir / "root_only.pt"
    torch.save({"x": torch.ones(2)}, secret)
    os.chmod(secret, 0o600)
    locked = tmp_dir / "locked"
    locked.mkdir(mode=0o755)
    os.chmod(tmp_dir, 0o755)
    r = _child(f"""
        import os, torch, deepio
        os.setgid(65534); os.setuid(65534)
        for call in (lambda: deepio.load({str(secret)!r}),
                     lambda: deepio.save({{"x": torch.ones(1)}}, {str(locked / "x.pt")!r}),
                     lambda: deepio.Reader({str(secret)!r})):
            try:
                call()
            except PermissionError as e:
                print("EACCES", e.filename)
            else:
                raise SystemExit("no PermissionError")
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == f"EACCES {secret}" and lines[2] == f"EACCES {secret}"
    assert lines[1].startswith(f"EACCES {locked}/.x.pt.deepio-tmp-")  # the temporary name it tried
    assert os.listdir(locked) == []


@pytest.mark.parametrize("crc32", [None, False])
def test_a_large_save_under_a_umask_without_read_completes(crc32):
    """A umask that takes the owner's read bit (0o477) leaves the temporary file write-only,
    as torch.save's file would be: the Writer cannot open it again to ask about direct I/O (the
    large storages are staged), the durable flush opens it for writing, and the CRC-32s that
    would have to be read back in stay 0 with a warning. The save completes and loads. As
    nobody, in a child: root ignores file modes."""
    if os.getuid() != 0:
        pytest.skip("needs root to switch to another user")
    import pathlib
    import shutil
    import tempfile

    out = pathlib.Path(tempfile.mkdtemp(dir="/var/tmp"))  # a folder nobody can reach
    os.chown(out, 65534, 65534)
    p = out / "w.pt"
    r = _child(f"""
        import os, torch, deepio
        import deepio._buffers, torch.utils.serialization  # imported lazily: before the switch
        os.setgid(65534); os.setuid(65534)
        os.umask(0o477)
        torch.manual_seed(3)
        deepio.save({{"w": torch.randn(3 << 20), "b": torch.randn(5)}}, {str(p)!r}, crc32={crc32})
        print(oct(os.stat({str(p)!r}).st_mode & 0o777))
    """)
    try:
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "0o200"
        assert ("records left without CRC-32" in r.stderr) == (crc32 is None), r.stderr
        torch.manual_seed(3)
        want = {"w": torch.randn(3 << 20), "b": torch.randn(5)}
        assert_same(want, torch.load(p))
    finally:
        shutil.rmtree(out, ignore_errors=True)


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


@pytest.mark.parametrize(("ahead", "huge"), [(True, False), (False, False), (True, True)])
def test_load_populating_destinations(tmp_dir, monkeypatch, ahead, huge):
    """deepio.load faults large destinations in ahead of the copies (a helper thread, pieces
    of 3 pages + 1 byte from destinations of 2 pages on; through a Reader with 2-page chunks
    too: many chunks per piece), or in one call first, with or without the huge-page hint:
    the same tensors as torch.load every way; a truncated file still fails naming the file."""
    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_WHOLE_FILE", False)  # the Reader's route
    monkeypatch.setattr(checkpoint, "_PREFAULT_MIN", 2 * 4096)
    monkeypatch.setattr(checkpoint, "_POPULATE_PIECE", 3 * 4096 + 1)
    monkeypatch.setattr(checkpoint, "_POPULATE_AHEAD", ahead)
    monkeypatch.setattr(checkpoint, "_HUGEPAGE_HINT", huge)
    g = torch.Generator().manual_seed(3)
    sd = {
        "big": torch.randn(3 << 18, generator=g),  # 3 MiB
        "odd": torch.randint(0, 255, ((1 << 20) + 3,), dtype=torch.uint8, generator=g),
        "small": torch.arange(7, dtype=torch.int16),
        "view": torch.randn(64, 129, generator=g).t()[3:],
    }
    p = tmp_dir / "pop.pt"
    torch.save(sd, p)
    assert_same(torch.load(p), deepio.load(p))
    with checkpoint.Reader(p, buffer_size=2 * 4096) as f:
        assert_same(torch.load(p), torch.load(f))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception) as ei:
        deepio.load(p)
    assert str(p) in str(ei.value)


# --------------------------------------------------------- deepio.load: the whole-file route


def _data_offsets(path) -> dict[str, int]:
    """File offset of each zip record's data (local header + name + extra), by the zipfile module."""
    import struct as _struct
    import zipfile

    out = {}
    with open(path, "rb") as f, zipfile.ZipFile(path) as z:
        for info in z.infolist():
            f.seek(info.header_offset)
            head = f.read(30)
            name_len, extra_len = _struct.unpack("<HH", head[26:30])
            out[info.filename] = info.header_offset + 30 + name_len + extra_len
    return out


def _mapped(lo: int, nbytes: int) -> bool:
    """Whether all of [lo, lo + nbytes) of this process's address space is mapped (by one
    mapping or adjacent ones: a huge-page hint splits a mapping)."""
    with open("/proc/self/maps") as f:
        ranges = sorted(tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f)
    at = lo
    for start, end in ranges:
        if start <= at < end:
            at = end
    return at >= lo + nbytes


@pytest.mark.parametrize(
    ("map_location", "huge"), [(None, True), ("cpu", True), (torch.device("cpu"), False), (None, False)]
)
def test_load_makes_every_storage_a_view_of_one_buffer_with_the_file(tmp_dir, monkeypatch, map_location, huge):
    """On a machine without an accelerator (or with map_location "cpu") deepio.load reads the
    whole file into one page-aligned buffer (2 MiB-aligned, for huge pages) and every storage
    is the view of its record's bytes there: storage address minus the buffer's start = the record's offset in the file.
    The views keep the buffer alive; it is unmapped when the last tensor goes."""
    import gc

    from deepio import checkpoint

    if map_location is None and not checkpoint._to_host(None):
        pytest.skip("an accelerator is available: map_location=None takes the Reader's route")
    g = torch.Generator().manual_seed(11)
    sd = {f"w{i}": torch.randn(1000 * i + 7, generator=g) for i in range(1, 9)}
    sd["big"] = torch.randn(3 << 20, generator=g)  # 12 MiB: several read requests of 4 MiB
    sd["view"] = sd["big"][100:200]
    sd["empty"] = torch.zeros(0)
    p = tmp_dir / "whole.pt"
    torch.save(sd, p)
    size = p.stat().st_size
    monkeypatch.setattr(checkpoint, "_WHOLE_CHUNK", 4 << 20)
    monkeypatch.setattr(checkpoint, "_WHOLE_HUGEPAGES", huge)
    got = deepio.load(p, map_location=map_location)
    assert_same(sd, got)
    data = sorted(off for name, off in _data_offsets(p).items() if "/data/" in name and name in _with_bytes(p))
    ptrs = sorted({t.untyped_storage().data_ptr() for t in got.values() if t.untyped_storage().nbytes()})
    base = ptrs[0] - data[0]
    assert base % ((2 << 20) if huge else 4096) == 0  # aligned: the file's bytes read with direct I/O
    assert [ptr - base for ptr in ptrs] == data  # each storage is its record's bytes, 1:1
    assert got["view"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()
    keep = got["w3"]
    want = keep.clone()
    del got
    gc.collect()
    assert _mapped(base, size)  # one small view keeps the whole buffer
    junk = [torch.randn(1 << 18) for _ in range(8)]
    assert torch.equal(keep, want)
    del junk, keep
    gc.collect()
    assert not _mapped(base, size)  # the last view gone: unmapped


def _with_bytes(path) -> set[str]:
    import zipfile

    with zipfile.ZipFile(path) as z:
        return {i.filename for i in z.infolist() if i.file_size}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=containers())
def test_reader_route_round_trips(tmp_dir, obj):
    """The Reader's route (files deepio.load does not read whole: map_location callables,
    accelerators, legacy files) gives torch.load's result too."""
    from deepio import checkpoint

    p = tmp_dir / "r.pt"
    torch.save(obj, p)
    checkpoint._WHOLE_FILE = False
    try:
        got = deepio.load(p)
    finally:
        checkpoint._WHOLE_FILE = True
    assert_same(obj, got)
    assert_same(obj, deepio.load(p, map_location=lambda storage, loc: storage))  # callable: the Reader


def test_load_routes_torch_load_handles_itself(tmp_dir, monkeypatch):
    """Files and options the whole-file route leaves to torch.load's own logic load as
    torch.load loads them: TorchScript archives (handed to torch.jit.load, weights_only=False
    needed), the legacy format, pickle_load_args, and the weights_only environment variables."""
    m = torch.jit.script(torch.nn.Linear(3, 2))
    p = tmp_dir / "script.pt"
    torch.jit.save(m, p)
    with pytest.raises(Exception) as want:
        torch.load(p)
    with pytest.raises(type(want.value)):
        deepio.load(p)
    with pytest.warns(UserWarning, match="TorchScript"):
        got = deepio.load(p, weights_only=False)
    assert torch.equal(got.weight, m.weight)

    c = tmp_dir / "custom.pt"
    torch.save({"c": Custom(4), "t": torch.ones(3)}, c)
    assert deepio.load(c, weights_only=False, encoding="latin1")["c"] == Custom(4)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")  # beats weights_only=False
    with pytest.raises(pickle.UnpicklingError):
        torch.load(c, weights_only=False)
    with pytest.raises(pickle.UnpicklingError):
        deepio.load(c, weights_only=False)
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # beats the default, with a warning
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        assert deepio.load(c)["c"] == Custom(4)


def test_load_read_error_names_the_file(tmp_dir, fault):
    """An I/O error in the whole-file read is the OSError with the file's name (every read
    waited for first); a short read falls back to the Reader's route, which reads it again."""
    sd = {f"t{i}": torch.randn(1 << 20) for i in range(6)}  # 24 MiB: several requests
    p = tmp_dir / "eio.pt"
    torch.save(sd, p)
    fault("read", errno=errno.EIO, after=5)
    with pytest.raises(OSError) as ei:
        deepio.load(p)
    assert ei.value.errno == errno.EIO and ei.value.filename == str(p)
    fault("read", short=100, after=3)
    assert_same(sd, deepio.load(p))


def test_load_gives_back_the_pickles_pages(tmp_dir):
    """The views keep the whole-file buffer alive, but not the bytes no storage uses: a 24 MiB
    pickled object's pages are given back once the load returns (they read as zeros), while
    the storages on either side keep their bytes."""
    import ctypes

    g = torch.Generator().manual_seed(2)
    blob = os.urandom(24 << 20)
    sd = {"a": torch.randn(1 << 20, generator=g), "blob": blob, "b": torch.randn(3 << 18, generator=g)}
    p = tmp_dir / "blob.pt"
    torch.save(sd, p)
    got = deepio.load(p, weights_only=False)
    assert got["blob"] == blob and torch.equal(got["a"], sd["a"]) and torch.equal(got["b"], sd["b"])
    offsets = _data_offsets(p)
    pkl = next(off for name, off in offsets.items() if name.endswith("/data.pkl"))
    first = min(off for name, off in offsets.items() if "/data/" in name and name in _with_bytes(p))
    base = min(t.untyped_storage().data_ptr() for t in (got["a"], got["b"])) - first
    inside = -(-(base + pkl) // 4096) * 4096 + (1 << 20)  # well inside the pickle's record
    assert ctypes.string_at(inside, 4096) == bytes(4096)  # given back: zero-filled on demand
    assert blob.find(ctypes.string_at(inside, 64)) < 0


def test_checkpoint_settings_set_on_the_package_take_effect_where_they_are_read():
    """deepio.checkpoint is a package; its settings and test hooks live in the module that reads
    them (deepio.checkpoint._save._force_filling, ...). Reading or setting one through the
    package by its old name reaches that module, so `checkpoint._force_filling = True` (and
    monkeypatch.setattr) still changes what deepio.save does; a name the table forwards to a
    module that lacks it fails here, not silently."""
    from deepio import checkpoint

    for name, (module, attr) in checkpoint._FORWARDED.items():
        assert hasattr(module, attr), (name, module.__name__, attr)
        old = getattr(module, attr)
        assert getattr(checkpoint, name) is old
        marker = object()
        setattr(checkpoint, name, marker)
        try:
            assert getattr(module, attr) is marker and getattr(checkpoint, name) is marker
            assert name not in vars(checkpoint)  # never a stale copy on the package
        finally:
            setattr(checkpoint, name, old)
        assert getattr(module, attr) is old
    from deepio.checkpoint import _force_filling  # importable by name, as before

    assert _force_filling is False


@pytest.mark.parametrize("reported_as", [RuntimeError, ValueError, OSError])
def test_a_fill_mismatch_never_reaches_the_caller(tmp_dir, monkeypatch, reported_as):
    """_FillMismatch is deepio's own: whatever exception torch's writer turns the refused skip
    into (its own "unexpected pos" RuntimeError, or another type), deepio.save starts again on
    the plain route and writes the complete file; no _FillMismatch reaches the caller."""
    import os

    from deepio import checkpoint
    from deepio.checkpoint import _filling

    real = _filling._torch_zip
    refused = []

    def torch_zip(obj, w, *args):
        if getattr(w, "_filling", False):
            try:
                w.seek(12345, os.SEEK_CUR)  # torch skipping bytes where no storage goes
            except _filling._FillMismatch as e:
                refused.append(e)
                raise reported_as("unexpected pos 12345") from None
        return real(obj, w, *args)

    monkeypatch.setattr(checkpoint, "_force_filling", True)
    monkeypatch.setattr(_filling, "_torch_zip", torch_zip)
    sd = {"w": torch.randn(1 << 18), "b": torch.arange(9)}
    p = tmp_dir / "m.pt"
    deepio.save(sd, p)
    assert len(refused) == 1
    assert_same(sd, torch.load(p))
    assert _leftovers(tmp_dir) == []
