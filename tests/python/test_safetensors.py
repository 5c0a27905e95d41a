"""deepio.safetensors against the real safetensors.torch (0.8): byte-identical files both
ways, equal tensors, every dtype both share, shards, corrupt and truncated files, I/O
failures, durable saves, and the GPU read path under the fake CUDA driver."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import require_module  # noqa: E402

torch = require_module("torch")
st = require_module("safetensors.torch")
hypothesis = require_module("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

import deepio  # noqa: E402
import deepio.safetensors as ds  # noqa: E402
from conftest import REPO  # noqa: E402
from deepio import _deepio, _wholefile  # noqa: E402
from deepio.safetensors import _cpu, _io, _load  # noqa: E402

EXAMPLES = int(os.environ.get("DEEPIO_HYPOTHESIS_EXAMPLES", "60"))

# Every dtype torch and safetensors share (the ones this torch has).
DTYPES = [
    getattr(torch, n)
    for n in (
        "float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 bool complex64 uint64 uint32 uint16 "
        "float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2"
    ).split()
    if hasattr(torch, n)
]


def rand_tensor(shape, dtype, seed=0):
    """Random bytes viewed as dtype (every bit pattern: NaNs included, so compare bytes)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    item = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * item,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same(a, b) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.device == b.device
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def assert_same_dict(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert same(got[k], want[k]), k


def same_layout(a: bytes, b: bytes) -> bool:
    """Same header length, same parsed header (metadata as a dict), same data bytes."""
    (na,), (nb,) = struct.unpack_from("<Q", a), struct.unpack_from("<Q", b)
    return na == nb and json.loads(a[8 : 8 + na]) == json.loads(b[8 : 8 + nb]) and a[8 + na :] == b[8 + nb :]


# ---------------------------------------------------------------------------- properties

names = hs.text(alphabet=hs.sampled_from("abz._0é☃"), min_size=1, max_size=6)


@hs.composite
def tensors(draw):
    dtype = draw(hs.sampled_from(DTYPES))
    shape = tuple(draw(hs.lists(hs.integers(0, 5), max_size=3)))
    if dtype == getattr(torch, "float4_e2m1fn_x2", None) and not shape:
        shape = (1,)  # safetensors cannot store a 0-d F4 tensor (no axis to halve)
    return rand_tensor(shape, dtype, draw(hs.integers(0, 1 << 30)))


state_dicts = hs.dictionaries(names.filter(lambda s: s != "__metadata__"), tensors(), max_size=8)
metadatas = hs.none() | hs.dictionaries(hs.text(max_size=5), hs.text(max_size=8), max_size=3)


@pytest.mark.wheel
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sd=state_dicts, md=metadatas)
def test_same_bytes_and_tensors_as_safetensors(sd, md, tmp_dir):
    if not sd and md == {}:
        md = None  # safetensors 0.8 writes invalid JSON for ({}, {}): test_empty_dict_and_empty_metadata
    ours, theirs = tmp_dir / "ours.safetensors", tmp_dir / "theirs.safetensors"
    ds.save_file(sd, ours, metadata=md)
    st.save_file(sd, str(theirs), metadata=md)
    if md is None or len(md) < 2:
        assert ours.read_bytes() == theirs.read_bytes()
        assert ds.save(sd, metadata=md) == theirs.read_bytes()
    else:  # safetensors orders metadata keys at random (a Rust HashMap); we sort them
        assert ours.read_bytes() == ds.save(sd, metadata=md) == ds.save(sd, metadata=dict(reversed(md.items())))
        assert same_layout(ours.read_bytes(), theirs.read_bytes())
    assert_same_dict(st.load_file(str(ours)), sd)  # ours -> theirs
    assert_same_dict(ds.load_file(theirs), sd)  # theirs -> ours
    assert_same_dict(ds.load(theirs.read_bytes()), sd)
    assert ds.read_header(theirs).metadata == md


@pytest.mark.parametrize("sizes", [[3 << 20], [5, 3 << 20, 7, (2 << 20) + 3, 1], [(1 << 20) - 1, 1 << 20, 1]])
def test_large_and_odd_sized_tensors(sizes, tmp_dir):
    """Tensors from 1 byte to several MiB, odd sizes: runs of small ones are packed with the
    header, large ones written from their own memory; direct I/O heads and tails everywhere."""
    sd = {f"t{i}": rand_tensor((n,), torch.uint8, i) for i, n in enumerate(sizes)}
    sd["f"] = rand_tensor((1000, 3), torch.float32, 99)
    ours, theirs = tmp_dir / "o.safetensors", tmp_dir / "t.safetensors"
    ds.save_file(sd, ours)
    st.save_file(sd, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    assert_same_dict(ds.load_file(theirs), sd)


def test_tiny_engine_requests(tmp_dir, monkeypatch):
    """Many data requests per file (the whole-file reader's chunks of 4 KiB + 1): same result."""
    monkeypatch.setattr(_wholefile, "CHUNK", 4097)
    sd = {"a": rand_tensor((300, 77), torch.bfloat16, 1), "b": rand_tensor((5,), torch.int64, 2)}
    p = tmp_dir / "m.safetensors"
    st.save_file(sd, str(p))
    assert_same_dict(ds.load_file(p), sd)


def test_empty_dict_and_only_empty_tensors(tmp_dir):
    for sd in ({}, {"e": torch.zeros(0, 4), "s": torch.zeros((0,), dtype=torch.bfloat16)}):
        p = tmp_dir / "e.safetensors"
        ds.save_file(sd, p, metadata={"k": "v"})
        assert p.read_bytes() == st.save(sd, metadata={"k": "v"})
        assert_same_dict(ds.load_file(p), sd)


def test_empty_dict_and_empty_metadata(tmp_dir):
    """safetensors 0.8 writes `{},"__metadata__":{}}` for no tensors and empty metadata, which
    it cannot read back itself; we write the valid `{"__metadata__":{}}` instead."""
    p = tmp_dir / "e.safetensors"
    ds.save_file({}, p, metadata={})
    assert p.read_bytes() == struct.pack("<Q", 24) + b'{"__metadata__":{}}     '
    assert ds.load_file(p) == {} and ds.read_header(p).metadata == {}
    with pytest.raises(Exception, match="invalid JSON"):
        st.load(st.save({}, metadata={}))


def test_views_own_storages_and_keep_the_buffer_alive(tmp_dir):
    sd = {"a": rand_tensor((1 << 18,), torch.float32, 1), "b": rand_tensor((3, 3), torch.float16, 2)}
    p = tmp_dir / "v.safetensors"
    st.save_file(sd, str(p))
    got = ds.load_file(p)
    for v in got.values():  # as safetensors gives: a storage per tensor, exactly its bytes
        assert v.untyped_storage().nbytes() == v.numel() * v.element_size()
        assert v.is_contiguous()
    a = got.pop("a")
    del got
    import gc

    gc.collect()
    assert same(a, sd["a"])  # the shared buffer lives as long as any tensor
    a += 1  # writable, like safetensors' tensors
    st.save_file({"a": a}, str(tmp_dir / "again.safetensors"))  # safetensors accepts our tensors


def test_misaligned_tensors_from_other_writers_are_copied(tmp_dir):
    """A writer that does not pad the header to 8 bytes: tensors land on odd addresses and
    are copied into tensors of their own; values still right."""
    sd = {"a": rand_tensor((7,), torch.float64, 1), "b": rand_tensor((5,), torch.int32, 2)}
    header = {
        "a": {"dtype": "F64", "shape": [7], "data_offsets": [0, 56]},
        "b": {"dtype": "I32", "shape": [5], "data_offsets": [56, 76]},
    }
    text = json.dumps(header).encode() + b" "  # deliberately not a multiple of 8
    assert len(text) % 8
    data = sd["a"].view(torch.uint8).numpy().tobytes() + sd["b"].view(torch.uint8).numpy().tobytes()
    p = tmp_dir / "odd.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + data)
    assert_same_dict(st.load_file(str(p)), sd)
    got = ds.load_file(p)
    assert_same_dict(got, sd)
    assert got["a"].data_ptr() % 8 == 0


def test_save_refuses_what_safetensors_refuses(tmp_dir):
    p = tmp_dir / "r.safetensors"
    base = torch.zeros(8)
    cases = [
        ({"x": base[::2]}, ValueError),  # not contiguous
        ({"x": base[:4], "y": base[2:6]}, RuntimeError),  # overlapping memory
        ({"x": [1, 2]}, ValueError),  # not a tensor
        ([("x", base)], ValueError),  # not a dict
        ({"x": base.to_sparse()}, ValueError),
        ({1: base}, TypeError),
    ]
    for sd, exc in cases:
        with pytest.raises(exc):
            ds.save_file(sd, p)
        with pytest.raises(exc):
            st.save_file(sd, str(p))
    with pytest.raises(TypeError):
        ds.save_file({"x": base}, p, metadata={"a": 1})
    with pytest.raises(ValueError, match="reserved"):
        ds.save_file({"__metadata__": base}, p)
    with pytest.raises(ValueError, match="0-d"):
        ds.save_file({"x": torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}, p)
    assert not p.exists()
    # Non-overlapping views of one storage are fine (as in safetensors), same bytes.
    sd = {"x": base[:4], "y": base[4:]}
    ds.save_file(sd, p)
    assert p.read_bytes() == st.save(sd)


def test_device_argument(tmp_dir):
    p = tmp_dir / "d.safetensors"
    st.save_file({"x": torch.ones(3)}, str(p))
    assert same(ds.load_file(p, device=torch.device("cpu"))["x"], torch.ones(3))
    with pytest.raises(ValueError, match="device"):
        ds.load_file(p, device="meta")
    if not torch.cuda.is_available():
        for dev in ("cuda", "cuda:0", 0):
            with pytest.raises(RuntimeError, match="CUDA"):
                ds.load_file(p, device=dev)


# ------------------------------------------------------------------------------- shards


def make_shards(folder: Path, n: int = 3):
    want = {}
    for i in range(n):
        sd = {
            f"layer{i}.w": rand_tensor((64, 33), torch.bfloat16, i),
            f"layer{i}.b": rand_tensor((33,), torch.float32, i),
        }
        st.save_file(sd, str(folder / f"model-{i:05d}-of-{n:05d}.safetensors"))
        want.update(sd)
    (folder / "model.safetensors.index.json").write_text("{}")  # ignored
    return want


def test_load_files_folder_and_list(tmp_dir):
    want = make_shards(tmp_dir)
    assert_same_dict(ds.load_files(tmp_dir), want)
    assert_same_dict(ds.load_files(str(tmp_dir)), want)
    paths = sorted(tmp_dir.glob("*.safetensors"))
    assert_same_dict(ds.load_files(paths), want)
    assert_same_dict(ds.load_files(paths[:1]), st.load_file(str(paths[0])))


def test_load_files_duplicate_names_name_both_files(tmp_dir):
    st.save_file({"w": torch.ones(2), "a": torch.ones(1)}, str(tmp_dir / "a.safetensors"))
    st.save_file({"w": torch.zeros(2)}, str(tmp_dir / "b.safetensors"))
    with pytest.raises(ValueError) as ei:
        ds.load_files(tmp_dir)
    msg = str(ei.value)
    assert "'w'" in msg and "a.safetensors" in msg and "b.safetensors" in msg


def test_load_files_empty_folder_and_bad_shard(tmp_dir):
    with pytest.raises(FileNotFoundError):
        ds.load_files(tmp_dir)
    make_shards(tmp_dir, 2)
    bad = tmp_dir / "z.safetensors"
    bad.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{]")
    with pytest.raises(ValueError, match="z.safetensors"):
        ds.load_files(tmp_dir)


# ------------------------------------------------------------------------- corrupt files


def file_with(
    header_obj=None, *, raw_header: bytes | None = None, data: bytes = b"", length: int | None = None
) -> bytes:
    text = raw_header if raw_header is not None else json.dumps(header_obj).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


GOOD = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
TWO = {
    "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "v": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]},
}

CORRUPT = {
    "shorter than 8 bytes": (b"\x01\x02", None, "shorter than the 8-byte"),
    "header length past the end": (file_with(GOOD, data=bytes(8), length=4096), None, "runs past the end"),
    "header length huge": (file_with(GOOD, data=bytes(8), length=1 << 60), None, "over the"),
    "JSON does not parse": (file_with(raw_header=b'{"w": {"dtype": '), None, "not valid JSON"),
    "not UTF-8": (file_with(raw_header=b'{"\xff": 1}'), None, "not UTF-8"),
    "header is a list": (file_with([1, 2]), None, "list, not an object"),
    "entry not an object": (file_with({"w": 3}), "w", "not an object"),
    "unknown dtype": (
        file_with({"w": {"dtype": "F128", "shape": [2], "data_offsets": [0, 32]}}, data=bytes(32)),
        "w",
        "unknown dtype",
    ),
    "dtype without torch": (
        file_with({"w": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, data=bytes(3)),
        "w",
        "no equivalent",
    ),
    "negative shape": (
        file_with({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, data=bytes(8)),
        "w",
        "shape",
    ),
    "shape past torch's strides": (
        file_with({"w": {"dtype": "U8", "shape": [0, 2**62, 2], "data_offsets": [0, 0]}}),
        "w",
        "64-bit strides",
    ),
    "bool in shape": (
        file_with({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, data=bytes(4)),
        "w",
        "shape",
    ),
    "offsets not a pair": (
        file_with({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}, data=bytes(8)),
        "w",
        "data_offsets",
    ),
    "offsets reversed": (
        file_with({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}}, data=bytes(8)),
        "w",
        "data_offsets",
    ),
    "size does not match shape": (
        file_with({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, data=bytes(8)),
        "w",
        "needs 12 bytes",
    ),
    "offsets past the data": (
        file_with({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, data=bytes(8)),
        "w",
        "past the end",
    ),
    "data section truncated": (file_with(TWO, data=bytes(10)), "v", "past the end"),
    "overlapping": (
        file_with(
            {
                "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "v": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]},
            },
            data=bytes(8),
        ),
        "w",
        "overlaps",
    ),
    "gap": (file_with({"w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, data=bytes(8)), "w", "gap"),
    "trailing bytes": (file_with(GOOD, data=bytes(9)), None, "data section holds 9"),
    "duplicate name": (
        file_with(
            raw_header=b'{"w":' + json.dumps(GOOD["w"]).encode() + b',"w":' + json.dumps(GOOD["w"]).encode() + b"}",
            data=bytes(8),
        ),
        "w",
        "twice",
    ),
    "metadata not str": (file_with({"__metadata__": {"a": 1}, **GOOD}, data=bytes(8)), None, "__metadata__"),
    "F4 odd last axis": (
        file_with({"w": {"dtype": "F4", "shape": [3, 2, 3], "data_offsets": [0, 9]}}, data=bytes(9)),
        "w",
        "even last dimension",
    ),
}


# Valid files that torch cannot hold: a plain ValueError, not a CorruptFileError.
TORCH_CANNOT = {"dtype without torch", "F4 odd last axis"}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_is_a_clear_value_error(case, tmp_dir):
    """deepio.CorruptFileError (a ValueError) with the file as ``filename``, naming what is wrong
    and the tensor at fault; a plain ValueError for what only this torch lacks."""
    content, tensor, what = CORRUPT[case]
    p = tmp_dir / f"bad-{case.replace(' ', '_')}.safetensors"
    p.write_bytes(content)
    calls = (
        (str(p), lambda: ds.load_file(p)),
        (str(p), lambda: ds.load_files([p])),
        ("<bytes>", lambda: ds.load(content)),
    )
    for name, call in calls:
        with pytest.raises(ValueError) as ei:
            call()
        msg = str(ei.value)
        assert what in msg, msg
        assert name in msg, msg
        if tensor is not None:
            assert f"'{tensor}'" in msg, msg
        if case in TORCH_CANNOT:
            assert type(ei.value) is ValueError
        else:
            assert isinstance(ei.value, deepio.CorruptFileError)
            assert ei.value.filename == name
    if case not in TORCH_CANNOT:
        with pytest.raises(deepio.CorruptFileError, match=what):
            ds.read_header(p)
    if case != "duplicate name":  # safetensors takes one of the two silently; we refuse
        with pytest.raises(Exception):  # noqa: B017 - safetensors refuses it too (its own exception types)
            st.load_file(str(p))


def test_every_truncation_of_a_real_file_is_refused(tmp_dir):
    sd = {"a": rand_tensor((5, 3), torch.float32, 1), "b": rand_tensor((6,), torch.bfloat16, 2)}
    whole = st.save(sd, metadata={"m": "x"})
    p = tmp_dir / "cut.safetensors"
    for n in list(range(0, 40)) + list(range(len(whole) - 40, len(whole))):
        p.write_bytes(whole[:n])
        with pytest.raises(deepio.CorruptFileError, match="cut.safetensors"):
            ds.load_file(p)
    p.write_bytes(whole)
    assert_same_dict(ds.load_file(p), sd)


def test_missing_file_and_folder(tmp_dir):
    with pytest.raises(FileNotFoundError):
        ds.load_file(tmp_dir / "nope.safetensors")
    with pytest.raises(FileNotFoundError):
        ds.load_files([tmp_dir / "nope.safetensors"])
    with pytest.raises(IsADirectoryError):
        ds.load_file(tmp_dir)


def test_unreadable_file(tmp_dir):
    """PermissionError, as an unprivileged user (a child that gives up root when run as root)."""
    p = tmp_dir / "x.safetensors"
    st.save_file({"a": torch.ones(1)}, str(p))
    p.chmod(0)
    r = _child(f"""
        import os, torch
        import deepio.safetensors as ds
        if os.geteuid() == 0:  # after the imports: the interpreter may live under /root
            os.setgid(65534); os.setuid(65534)
        try:
            ds.load_file({str(p)!r})
        except PermissionError as e:
            print("ok", e.filename)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", str(p)]


def test_read_error_raises_and_returns_nothing(tmp_dir, fault):
    """EIO from the disk in the middle of the data: OSError with errno, no dict."""
    sd = {"a": rand_tensor((1 << 20,), torch.uint8, 1), "b": rand_tensor((1 << 19,), torch.float32, 2)}
    p = tmp_dir / "eio.safetensors"
    st.save_file(sd, str(p))
    fault("read", errno=errno.EIO, after=2, count=1, path_contains="eio.safetensors")
    with pytest.raises(OSError) as ei:
        ds.load_file(p)
    assert ei.value.errno == errno.EIO
    assert ei.value.filename == str(p)
    _deepio._clear_fault()
    assert_same_dict(ds.load_file(p), sd)  # the module's engine keeps working


def test_read_error_in_one_shard_fails_the_whole_load(tmp_dir, fault, monkeypatch):
    """Many requests over three shards in flight at once; EIO in one of them: OSError naming
    its shard after every request finished, no dict; the next load works."""
    monkeypatch.setattr(_wholefile, "CHUNK", 1000)  # 5 requests per shard
    want = make_shards(tmp_dir)
    fault("read", errno=errno.EIO, after=6, count=1)
    with pytest.raises(OSError) as ei:
        ds.load_files(tmp_dir)
    assert ei.value.errno == errno.EIO
    assert ei.value.filename in {str(p) for p in tmp_dir.glob("*.safetensors")}
    _deepio._clear_fault()
    assert _io.engine().pending() == 0
    assert_same_dict(ds.load_files(tmp_dir), want)


def test_file_shrinking_under_the_reader(tmp_dir, fault):
    """A short read (the file shrank between header and data) is finished or reported."""
    sd = {"a": rand_tensor((1 << 20,), torch.uint8, 1)}
    p = tmp_dir / "short.safetensors"
    st.save_file(sd, str(p))
    fault("read", short=100, after=1, count=1, path_contains="short.safetensors")
    assert_same_dict(ds.load_file(p), sd)  # a short transfer is resubmitted, not lost


# ------------------------------------------------------------------------------ durability


def test_failed_save_leaves_old_file_and_no_temporary(tmp_dir, fault):
    p = tmp_dir / "keep.safetensors"
    old = {"old": torch.arange(10.0)}
    st.save_file(old, str(p))
    before = p.read_bytes()
    new = {"new": rand_tensor((3 << 20,), torch.uint8, 5), "small": torch.ones(3)}
    fault("write", errno=errno.ENOSPC, after=1, count=1, path_contains="keep.safetensors")
    with pytest.raises(OSError) as ei:
        ds.save_file(new, p)
    assert ei.value.errno == errno.ENOSPC
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_dir)) == ["keep.safetensors"]
    _deepio._clear_fault()
    ds.save_file(new, p)
    assert_same_dict(st.load_file(str(p)), new)


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_file_size_limit_midway_keeps_old_file(tmp_dir):
    """RLIMIT_FSIZE in a child: the new file cannot be written past 1 MiB (EFBIG) while a
    3 MiB save is under way; the old file is intact, no temporary is left."""
    p = tmp_dir / "fsize.safetensors"
    st.save_file({"old": torch.ones(4)}, str(p))
    before = p.read_bytes()
    r = _child(f"""
        import errno, resource, signal, torch
        import deepio.safetensors as ds
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            ds.save_file({{"a": torch.ones(3 << 18), "b": torch.ones(5)}}, {str(p)!r})
        except OSError as e:
            assert e.errno == errno.EFBIG, e
            print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_dir)) == ["fsize.safetensors"]


def test_full_file_system_keeps_old_file(tmp_path_factory):
    """A real ENOSPC: a 2 MiB tmpfs (root only), a 3 MiB save."""
    mnt = tmp_path_factory.mktemp("tiny")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    try:
        p = mnt / "m.safetensors"
        st.save_file({"old": torch.ones(4)}, str(p))
        before = p.read_bytes()
        with pytest.raises(OSError) as ei:
            ds.save_file({"a": torch.ones(3 << 18)}, p)
        assert ei.value.errno == errno.ENOSPC
        assert p.read_bytes() == before
        assert os.listdir(mnt) == ["m.safetensors"]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_save_keeps_the_permission_bits_of_the_file_it_replaces(tmp_dir):
    p = tmp_dir / "private.safetensors"
    st.save_file({"a": torch.ones(1)}, str(p))
    p.chmod(0o600)
    ds.save_file({"b": torch.ones(2)}, p)
    assert p.stat().st_mode & 0o7777 == 0o600
    fresh = tmp_dir / "fresh.safetensors"
    ds.save_file({"b": torch.ones(2)}, fresh)
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.stat().st_mode & 0o7777 == 0o666 & ~umask


def test_save_is_renamed_into_place(tmp_dir):
    """The new file appears whole under its name (a new inode), never written in place."""
    p = tmp_dir / "r.safetensors"
    st.save_file({"a": torch.ones(1)}, str(p))
    ino = p.stat().st_ino
    ds.save_file({"b": torch.zeros(2)}, p)
    assert p.stat().st_ino != ino
    assert_same_dict(st.load_file(str(p)), {"b": torch.zeros(2)})


# -------------------------------------------------------------------- benchmark program


@pytest.mark.slow
def test_load_safetensors_bench_program(tmp_dir):
    """bench/load_safetensors.py (once ``python -m deepio.safetensors``): a tiny run prints the
    load beside the disk ceiling; a missing file and a CUDA device torch lacks are one line on
    stderr, no traceback."""

    def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        program = str(REPO / "bench" / "load_safetensors.py")
        return subprocess.run([sys.executable, program, *args], capture_output=True, text=True, timeout=timeout)

    make_shards(tmp_dir, 2)
    r = bench(str(tmp_dir), "--repeat", "1", "--no-drop-caches")
    assert r.returncode == 0, r.stderr
    assert "GB/s" in r.stdout and "ceiling" in r.stdout and "tensors" in r.stdout
    r = bench(str(tmp_dir / "nope.safetensors"), timeout=60)
    assert r.returncode != 0 and "nope.safetensors" in r.stderr and "Traceback" not in r.stderr
    if not torch.cuda.is_available():
        r = bench(str(tmp_dir), "--device", "cuda", "--no-drop-caches")
        assert r.returncode == 1 and "CUDA" in r.stderr and "Traceback" not in r.stderr


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
