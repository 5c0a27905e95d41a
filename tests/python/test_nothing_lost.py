"""A failure always reaches someone (issue 24): writes that hit a real limit (RLIMIT_FSIZE:
EFBIG; a small tmpfs: ENOSPC) raise from File.fsync(), File.close(), the end of a with
block, deepio.save, deepio.safetensors.save_file and aio_handle; a failure nobody can
collect any more (a dropped Future, a File garbage-collected unclosed) becomes a
deepio.UnobservedFailureWarning naming the file and the error; aio_handle.__exit__ keeps a
close() failure on the exception that propagates.

The limit cases run in a fresh interpreter (RLIMIT_FSIZE is per process; the tmpfs is
mounted for the test), which prints what each call raised.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import deepio
from conftest import needs_numpy, needs_torch, small_tmpfs

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

# Run in a child: CASE names the call; the child writes 2 x 3 MiB where at most 4 MiB fit.
CHILD = textwrap.dedent(
    """
    import errno, json, os, resource, signal, sys
    import numpy as np
    import deepio
    case, folder, limit = sys.argv[1], sys.argv[2], sys.argv[3]
    if limit == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
    a = np.full(3 << 20, 7, dtype=np.uint8)
    p = os.path.join(folder, "out.bin")
    out = {"raised": None, "errno": None, "exists": None}
    try:
        if case == "fsync":
            f = deepio.File(p, "w")
            f.pwrite(a, 0); f.pwrite(a, len(a))
            try:
                f.fsync()
            finally:
                try:
                    f.close()
                except OSError:
                    out["close_raised_again"] = True
        elif case == "close":
            f = deepio.File(p, "w")
            f.pwrite(a, 0); f.pwrite(a, len(a))
            f.close()
        elif case == "with":
            with deepio.File(p, "w") as f:
                f.pwrite(a, 0); f.pwrite(a, len(a))
        elif case == "save":
            import torch
            deepio.save({"a": torch.from_numpy(a), "b": torch.from_numpy(a.copy())}, p)
        elif case == "save_file":
            import torch
            import deepio.safetensors
            deepio.safetensors.save_file({"a": torch.from_numpy(a), "b": torch.from_numpy(a.copy())}, p)
        elif case == "aio_handle":
            h = deepio.aio_handle()
            h.async_pwrite(a, p, 0); h.async_pwrite(a, p, len(a))
            h.wait()
        elif case == "aio_handle_sync":
            h = deepio.aio_handle()
            h.sync_pwrite(a, p, 0); h.sync_pwrite(a, p, len(a))
    except OSError as e:
        out["raised"], out["errno"] = type(e).__name__, e.errno
        out["filename"] = e.filename
    out["exists"] = os.path.exists(p)
    out["leftovers"] = sorted(n for n in os.listdir(folder) if n != "out.bin")
    print(json.dumps(out))
    """
)

CASES = [
    pytest.param("fsync", marks=needs_numpy),
    pytest.param("close", marks=needs_numpy),
    pytest.param("with", marks=needs_numpy),
    pytest.param("save", marks=needs_torch),
    pytest.param("save_file", marks=needs_torch),
    pytest.param("aio_handle", marks=needs_numpy),
    pytest.param("aio_handle_sync", marks=needs_numpy),
]


def _child(case: str, folder: str, limit: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, case, folder, limit], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(out: dict, case: str, want: int) -> None:
    assert out["raised"] is not None, f"{case}: nothing raised: {out}"
    assert out["errno"] == want, out
    assert out["filename"] and "out.bin" in os.path.basename(out["filename"]), out
    if case in ("save", "save_file"):
        # Durable writers: no file claims to be complete, no temporary left behind.
        assert not out["exists"], out
        assert out["leftovers"] == [], out
    if case == "fsync":
        assert "close_raised_again" not in out, "a failure is raised once, by the first call that drains it"


@pytest.mark.parametrize("case", CASES)
def test_rlimit_fsize_failure_is_raised(tmp_dir, case):
    _check(_child(case, str(tmp_dir), "fsize"), case, errno.EFBIG)


@pytest.fixture
def tmpfs_4m(tmp_dir):
    with small_tmpfs(tmp_dir, "4m") as mnt:
        yield mnt


@pytest.mark.parametrize("case", CASES)
def test_full_file_system_failure_is_raised(tmpfs_4m, case):
    _check(_child(case, str(tmpfs_4m), "none"), case, errno.ENOSPC)


# ------------------------------------------------------------------- failures nobody collected


def _unobserved(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, deepio.UnobservedFailureWarning)]


@needs_numpy
def test_dropped_failed_future_warns_with_path_and_errno(tmp_dir, fault):
    from deepio import _deepio

    p = str(tmp_dir / "f.bin")
    h = _deepio.Handle()
    fault("write", errno=errno.EIO, count=1000)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        op = h.submit_future(True, np.ones(8192, dtype=np.uint8), p, 0)
        fut = deepio.Future(op)
        assert fut.wait(30)
        del fut, op
        gc.collect()
    msgs = _unobserved(record)
    assert len(msgs) == 1, msgs
    assert p in msgs[0] and "Input/output error" in msgs[0], msgs[0]
    h.close()


@needs_numpy
def test_future_dropped_while_running_warns_when_it_fails(tmp_dir, fault):
    from deepio import _deepio

    p = str(tmp_dir / "f.bin")
    h = _deepio.Handle()
    # The write is held 0.3 s in the worker, then fails: the Future is long gone by then.
    fault("write", errno=errno.EIO, count=1000, delay=0.3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        op = h.submit_future(True, np.ones(8192, dtype=np.uint8), p, 0)
        done = op.done()
        del op
        h.close()  # waits for it; the engine reported it when it finished
    assert not done
    msgs = _unobserved(record)
    assert len(msgs) == 1, msgs
    assert p in msgs[0] and "Input/output error" in msgs[0], msgs[0]


@needs_numpy
def test_file_collected_unclosed_with_a_failed_write_warns(tmp_dir, fault):
    p = str(tmp_dir / "f.bin")
    fault("write", errno=errno.EIO, count=1000)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        f = deepio.File(p, "w")
        f.pwrite(np.ones(8192, dtype=np.uint8), 0)  # its Future dropped at once
        del f
        gc.collect()
    msgs = _unobserved(record)
    assert len(msgs) == 1, msgs
    assert p in msgs[0] and "EIO: Input/output error" in msgs[0], msgs[0]


@needs_numpy
def test_file_close_raises_first_failure_others_attached(tmp_dir, fault):
    p = str(tmp_dir / "f.bin")
    fault("write", errno=errno.EIO, count=1000)
    f = deepio.File(p, "w")
    for i in range(3):
        f.pwrite(np.ones(4096, dtype=np.uint8), i * 4096)
    with pytest.raises(OSError) as ei:
        f.close()
    assert ei.value.errno == errno.EIO and ei.value.filename == p
    assert len(ei.value.other_errors) == 2
    assert f.closed
    f.close()  # once closed, nothing more to raise


@needs_numpy
def test_failure_retrieved_through_the_future_is_not_raised_again(tmp_dir, fault):
    p = str(tmp_dir / "f.bin")
    fault("write", errno=errno.EIO, count=1000)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with deepio.File(p, "w") as f:
            fut = f.pwrite(np.ones(4096, dtype=np.uint8), 0)
            assert isinstance(fut.exception(), OSError)
            f.fsync()  # retrieved through the Future: not raised here, nor at the end of the block
        del fut
        gc.collect()
    assert _unobserved(record) == []


@needs_numpy
def test_aio_handle_exit_keeps_close_failure_on_propagating_exception(tmp_dir, fault):
    p = str(tmp_dir / "f.bin")
    fault("write", errno=errno.EIO, count=1000)
    with pytest.raises(KeyError) as ei:
        with deepio.aio_handle() as h:
            h.async_pwrite(np.ones(4096, dtype=np.uint8), p)
            raise KeyError("the user's own error")
    notes = getattr(ei.value, "__notes__", [])
    assert any("close() also failed" in n and "Input/output error" in n for n in notes), notes
    assert isinstance(ei.value.close_error, OSError) and ei.value.close_error.errno == errno.EIO
