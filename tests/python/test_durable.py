"""deepio._durable.replacing(): the temporary file every saver writes through."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from conftest import sigkilled_on_exit
from deepio._durable import _host_tag, remove_stale_temporaries, replacing


def _leftover_name(final, host=None, pid=None, tid=None) -> str:
    host = _host_tag() if host is None else host
    pid = os.getpid() if pid is None else pid
    tid = threading.get_ident() if tid is None else tid
    name = f".{os.path.basename(final)}.deepio-tmp-{host}-{pid}-{tid}"
    return os.path.join(os.path.dirname(final), name)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


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


def test_the_next_save_removes_a_killed_writers_leftover_and_nothing_else(tmp_path):
    final = str(tmp_path / "ckpt")
    other = str(tmp_path / "other")
    dead = _dead_pid()
    stale = _leftover_name(final, pid=dead, tid=1)  # this host, writer gone: removed
    live = _leftover_name(final, pid=os.getppid(), tid=2)  # a live process's save under way: kept
    foreign = _leftover_name(final, host="0badc0de" if _host_tag() != "0badc0de" else "0badc0df", pid=dead, tid=3)
    old_style = os.path.join(tmp_path, f".ckpt.deepio-tmp-{dead}-4")  # unknown host: kept
    not_ours = _leftover_name(other, pid=dead, tid=5)  # another file's leftover: kept by this save
    for p in (stale, live, foreign, old_style, not_ours):
        with open(p, "wb") as f:
            f.write(b"x" * 1000)
    with replacing(final) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
    left = set(os.listdir(tmp_path))
    assert os.path.basename(stale) not in left
    assert {os.path.basename(p) for p in (live, foreign, old_style, not_ours)} <= left
    assert "ckpt" in left and len(left) == 5
    assert remove_stale_temporaries(other) == [os.path.basename(not_ours)]


def test_a_writer_killed_mid_save_leaves_a_leftover_the_next_save_removes(tmp_path):
    final = tmp_path / "ckpt"
    final.write_bytes(b"old")
    code = (
        "import sys, time\n"
        "from deepio._durable import replacing\n"
        "with replacing(sys.argv[1]) as tmp:\n"
        "    open(tmp, 'wb').write(b'half')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(final)], stdout=subprocess.PIPE, text=True)
    with sigkilled_on_exit(child):
        assert child.stdout.readline().strip() == "writing"
    left = [n for n in os.listdir(tmp_path) if ".deepio-tmp-" in n]
    assert len(left) == 1 and f"-{child.pid}-" in left[0], left
    assert final.read_bytes() == b"old"
    with replacing(final) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
    assert os.listdir(tmp_path) == ["ckpt"] and final.read_bytes() == b"new"
