"""deepio.safetensors against the real safetensors.torch (0.8): byte-identical files both
ways, equal tensors, every dtype both share (hypothesis), odd sizes, views, the device
argument, shards, and the benchmark program. Corrupt files, I/O failures and durable saves:
test_safetensors_failures.py; the GPU read path and the page-cache and direct backends:
test_safetensors_backends.py; shared helpers: safetensors_support.py."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from conftest import require_module  # noqa: E402

torch = require_module("torch")
st = require_module("safetensors.torch")
hypothesis = require_module("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

import deepio.safetensors as ds  # noqa: E402
from conftest import REPO  # noqa: E402
from deepio import _wholefile  # noqa: E402
from safetensors_support import (  # noqa: E402
    EXAMPLES,
    assert_same_dict,
    make_shards,
    metadatas,
    rand_tensor,
    same,
    same_layout,
    state_dicts,
)


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
