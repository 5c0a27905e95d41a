"""deepio.load: weights_only as torch.load decides it, loaded storages giving their memory back,
a failing load running the file's code once, destinations populated ahead of the copies, and
the whole-file route (one buffer with the file, every storage a view of its record) beside
the Reader's route and what it leaves to torch.load."""

from __future__ import annotations

import errno
import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings

import deepio
from checkpoint_support import EXAMPLES, _child, assert_same, containers
from conftest import require_module

torch = require_module("torch")


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
