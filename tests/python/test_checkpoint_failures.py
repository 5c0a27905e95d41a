"""deepio.save/load durability (a writer killed mid-save, exceptions, write errors, RLIMIT_FSIZE,
a full device: the old file stays) and the failures a user can cause (missing file,
permissions, folders, truncated or corrupt files, a umask without read)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest

import deepio
from checkpoint_support import _child, _leftovers, assert_same
from conftest import require_module, sigkilled_on_exit

torch = require_module("torch")


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
