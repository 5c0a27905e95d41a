"""deepio.safetensors refusing what it must: corrupt and truncated files (a clear ValueError
naming the file, as safetensors.torch refuses them), missing and unreadable files, read errors
that fail the whole load, and durable saves (a failed save, RLIMIT_FSIZE, a full file system
and permission bits leave the old file)."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from conftest import require_module  # noqa: E402

torch = require_module("torch")
st = require_module("safetensors.torch")
hypothesis = require_module("hypothesis")

import deepio  # noqa: E402
import deepio.safetensors as ds  # noqa: E402
from deepio import _deepio, _wholefile  # noqa: E402
from deepio.safetensors import _io  # noqa: E402
from safetensors_support import assert_same_dict, make_shards, rand_tensor  # noqa: E402

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
