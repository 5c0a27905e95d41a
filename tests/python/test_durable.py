"""deepio._durable.replacing(): the temporary file every saver writes through."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from deepio._durable import replacing


def _leftover_name(final) -> str:
    name = f".{os.path.basename(final)}.deepio-tmp-{os.getpid()}-{threading.get_ident()}"
    return os.path.join(os.path.dirname(final), name)


def test_a_killed_writers_leftover_never_leaks_its_tail_into_the_new_file(tmp_path):
    final = str(tmp_path / "ckpt")
    with open(_leftover_name(final), "wb") as f:  # a larger file left by a writer that was killed
        f.write(b"S" * 100_000)
    with replacing(final) as tmp:
        assert os.path.getsize(tmp) == 0, "the temporary file starts empty"
        fd = os.open(tmp, os.O_WRONLY)  # a writer that never truncates (the engine does not)
        os.write(fd, b"new")
        os.close(fd)
    with open(final, "rb") as f:
        assert f.read() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_private_file_stays_private_while_it_is_rewritten(tmp_path):
    final = tmp_path / "secret"
    final.write_bytes(b"old")
    os.chmod(final, 0o600)
    with replacing(final) as tmp:
        assert stat.S_IMODE(os.stat(tmp).st_mode) == 0o600, "never readable by others, even mid-save"
        with open(tmp, "wb") as f:
            f.write(b"new")
    assert stat.S_IMODE(os.stat(final).st_mode) == 0o600
    assert final.read_bytes() == b"new"


def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        with replacing(tmp_path / "fresh") as tmp:
            with open(tmp, "wb") as f:
                f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o640


def test_an_error_mid_save_leaves_the_old_file_and_no_temporary(tmp_path):
    final = tmp_path / "f"
    final.write_bytes(b"good")
    with pytest.raises(RuntimeError):
        with replacing(final) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("the serializer failed")
    assert final.read_bytes() == b"good"
    assert os.listdir(tmp_path) == ["f"]


def test_a_folder_as_the_path_is_refused_before_anything_is_created(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        with replacing(tmp_path / "d"):
            pass
    assert os.listdir(tmp_path) == ["d"]
