"""Failures reach Python as exceptions with errno, filename, offset and size: real ones (end
of file, missing files, permissions, RLIMIT_FSIZE, a full device) and injected ones (EIO,
short transfers) through the extension's test-only fault hook."""

from __future__ import annotations

import errno
import gc
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import weakref

import pytest

import deepio
import deepio.compat
from conftest import needs_numpy
from deepio import _deepio

try:
    import numpy as np
except ImportError:
    np = None

pytestmark = needs_numpy  # every test here uses NumPy buffers; torch ones live elsewhere


def _child(script: str, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


# ------------------------------------------------------------------------------ end of file


@pytest.mark.parametrize("how", ["sync_pread", "async_pread", "read", "pread"])
def test_read_past_end_of_file(how, random_file):
    path, data = random_file(5000)
    h = deepio.aio_handle(1024, 4, False, False, 2)
    buf = np.empty(4096, dtype=np.uint8)
    call = {
        "sync_pread": lambda: h.sync_pread(buf, str(path), 1000),
        "async_pread": lambda: h.async_pread(buf, str(path), 1000),
        "read": lambda: h.read(buf, str(path), False, 1000),
        "pread": lambda: h.pread(buf, str(path), False, False, 1000),
    }[how]
    with pytest.raises(deepio.EndOfFileError) as ei:
        call()
    e = ei.value
    assert isinstance(e, EOFError) and isinstance(e, OSError)
    assert e.errno == errno.ENODATA
    assert e.filename == str(path)
    assert (e.offset, e.nbytes) == (1000, 4096)
    assert "offset 1000" in str(e) and "4096 bytes" in str(e)
    assert h.wait() == 0  # nothing was queued
    # the exact remainder works
    tail = np.empty(4000, dtype=np.uint8)
    assert h.sync_pread(tail, str(path), 1000) == 1
    assert tail.tobytes() == data[1000:]


def test_eof_caught_as_eoferror(random_file):
    path, _ = random_file(10)
    h = deepio.aio_handle()
    try:
        h.sync_pread(bytearray(11), str(path))
    except EOFError:
        pass
    else:  # pragma: no cover
        pytest.fail("no EOFError")


def test_file_truncated_under_a_read_is_an_error(random_file, fault):
    """A read that meets end of file during the transfer (the file shrank) fails with
    EndOfFileError from wait(), not silently. Simulated: every read returns 0 bytes."""
    path, _ = random_file(8192)
    h = deepio.aio_handle(4096, 2, False, False, 1, backend="threads")
    fault("read", short=0, count=100)
    buf = np.empty(8192, dtype=np.uint8)
    h.async_pread(buf, str(path))
    with pytest.raises(deepio.EndOfFileError):
        h.wait()


# -------------------------------------------------------------------------- open failures


@pytest.mark.parametrize("method", ["sync_pread", "async_pread", "read"])
def test_missing_file(method, tmp_dir):
    h = deepio.aio_handle()
    missing = tmp_dir / "nope.bin"
    with pytest.raises(FileNotFoundError) as ei:
        getattr(h, method)(np.empty(100, np.uint8), str(missing))
    assert ei.value.errno == errno.ENOENT
    assert ei.value.filename == str(missing)
    assert "100 bytes" in str(ei.value) and "for reading" in str(ei.value)
    assert h.pending() == 0


def test_write_under_a_file_used_as_directory(tmp_dir):
    f = tmp_dir / "plainfile"
    f.write_bytes(b"x")
    h = deepio.aio_handle()
    with pytest.raises(NotADirectoryError):
        h.sync_pwrite(np.zeros(10, np.uint8), str(f / "child.bin"))
    with pytest.raises(FileNotFoundError):
        h.async_pwrite(np.zeros(10, np.uint8), str(tmp_dir / "no" / "such" / "dir.bin"))


def test_reading_a_directory(tmp_dir):
    h = deepio.aio_handle()
    with pytest.raises(IsADirectoryError) as ei:
        h.sync_pread(np.zeros(10, np.uint8), str(tmp_dir))
    assert ei.value.filename == str(tmp_dir)


def test_permission_denied_as_unprivileged_user(tmp_dir):
    """root ignores file modes, so the operation runs as nobody in a child process."""
    target = tmp_dir / "root_only.bin"
    target.write_bytes(b"\0" * 4096)
    os.chmod(target, 0o600)
    os.chmod(tmp_dir, 0o755)
    if os.getuid() != 0:
        pytest.skip("needs root to switch to another user (an unprivileged run tests this as-is elsewhere)")
    r = _child(f"""
        import os, errno
        import numpy as np, deepio
        os.setgid(65534); os.setuid(65534)
        h = deepio.aio_handle()
        for call in (lambda: h.sync_pread(np.empty(4096, np.uint8), {str(target)!r}),
                     lambda: h.async_pwrite(np.zeros(4096, np.uint8), {str(target)!r}, 0)):
            try:
                call()
            except PermissionError as e:
                assert e.errno == errno.EACCES and e.filename == {str(target)!r}, e
            else:
                raise SystemExit("no PermissionError")
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_permission_denied_on_immutable_file(tmp_dir):
    target = tmp_dir / "immutable.bin"
    target.write_bytes(b"\1" * 4096)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(target)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE and ext4/xfs/btrfs)")
    try:
        h = deepio.aio_handle()
        with pytest.raises(PermissionError) as ei:
            h.sync_pwrite(np.zeros(4096, np.uint8), str(target))
        assert ei.value.errno == errno.EPERM
        out = np.zeros(4096, np.uint8)
        assert h.sync_pread(out, str(target)) == 1  # reading is still allowed
        assert (out == 1).all()
    finally:
        subprocess.run([chattr, "-i", str(target)], check=True)


def test_injected_open_failure(tmp_dir, fault):
    fault("open", errno=errno.EMFILE, path_contains="victim")
    h = deepio.aio_handle()
    with pytest.raises(OSError) as ei:
        h.sync_pwrite(np.zeros(10, np.uint8), str(tmp_dir / "victim.bin"))
    assert ei.value.errno == errno.EMFILE
    assert h.sync_pwrite(np.zeros(10, np.uint8), str(tmp_dir / "other.bin")) == 1


# ------------------------------------------------------------------- transfer failures


def test_file_size_limit_gives_efbig(tmp_dir):
    """RLIMIT_FSIZE (in a child, with SIGXFSZ ignored): writing past it is EFBIG, with the
    failing part's offset; nothing lands past the limit."""
    target = tmp_dir / "big.bin"
    r = _child(f"""
        import errno, resource, signal, os
        import numpy as np, deepio
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        for backend in ("threads", "auto"):
            h = deepio.aio_handle(65536, 4, False, True, 2, backend=backend)
            try:
                h.sync_pwrite(np.ones(2 << 20, np.uint8), {str(target)!r})
            except OSError as e:
                assert e.errno == errno.EFBIG, e
                assert e.filename == {str(target)!r}
                assert e.offset >= 1 << 20, e.offset
            else:
                raise SystemExit("no EFBIG with " + backend)
            assert h.wait() == 0
            assert os.path.getsize({str(target)!r}) <= 1 << 20
            os.unlink({str(target)!r})
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is missing")
def test_full_device_gives_enospc():
    h = deepio.aio_handle()
    with pytest.raises(OSError) as ei:
        h.sync_pwrite(np.ones(8192, np.uint8), "/dev/full")
    assert ei.value.errno == errno.ENOSPC
    assert ei.value.filename == "/dev/full"


@pytest.mark.parametrize("backend", ["auto", "threads"])
@pytest.mark.parametrize("point", ["read", "write"])
def test_injected_eio_raises_from_wait_after_all_finished(backend, point, random_file, tmp_dir, fault):
    path, data = random_file(1 << 16)
    h = deepio.aio_handle(4096, 4, False, True, 2, backend=backend)
    n = 6
    bufs = [np.empty(1 << 16, np.uint8) for _ in range(n)]
    outs = [tmp_dir / f"o{i}.bin" for i in range(n)]
    fault(point, errno=errno.EIO, after=3, count=1)
    for b, o in zip(bufs, outs):
        if point == "read":
            assert h.async_pread(b, str(path)) == 0
        else:
            b[:] = 7
            assert h.async_pwrite(b, str(o)) == 0
    with pytest.raises(OSError) as ei:
        h.wait()
    e = ei.value
    assert e.errno == errno.EIO and not isinstance(e, deepio.EndOfFileError)
    assert e.nbytes > 0 and e.offset % 4096 == 0
    assert _deepio._fault_hits() == 1
    assert h.pending() == 0  # everything finished and was collected
    assert h.wait() == 0
    # the handle keeps working
    _deepio._clear_fault()
    b = np.empty(1 << 16, np.uint8)
    assert h.sync_pread(b, str(path)) == 1
    assert b.tobytes() == data


def test_several_failures_first_raised_others_attached(random_file, fault):
    path, _ = random_file(4096)
    h = deepio.aio_handle(4096, 1, False, False, 1, backend="threads")
    fault("read", errno=errno.EIO, count=3)
    for _ in range(4):
        h.async_pread(np.empty(4096, np.uint8), str(path))
    with pytest.raises(OSError) as ei:
        h.wait()
    assert len(ei.value.other_errors) == 2
    assert all(x.errno == errno.EIO for x in ei.value.other_errors)
    if sys.version_info >= (3, 11):
        assert "2 more of the 4 operations" in "".join(ei.value.__notes__)


def _round_trip(e: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(e))


def test_engine_errors_survive_pickle(random_file, tmp_dir, fault):
    """An engine error pickled and unpickled (how torch.distributed.checkpoint gathers a
    rank's error to its coordinator, how a process pool returns one) keeps its type, errno,
    message, file name, offset, size, notes and other_errors: whether the engine named the
    file itself or only the descriptor, which deepio.File then names (_errors.with_name)."""
    missing = tmp_dir / "nope.bin"
    with pytest.raises(FileNotFoundError) as ei:
        deepio.aio_handle().sync_pread(np.empty(100, np.uint8), str(missing))
    path, _ = random_file(4096)
    h = deepio.aio_handle(4096, 1, False, False, 1, backend="threads")
    with pytest.raises(deepio.EndOfFileError) as eof:
        h.sync_pread(np.empty(8192, np.uint8), str(path))
    f = deepio.File(str(path), "r", handle=h)
    fault("read", errno=errno.EIO, count=3)
    futures = [f.pread(np.empty(1024, np.uint8), 1024 * i) for i in range(4)]
    with pytest.raises(OSError) as eio:
        f.close()  # the failures nobody retrieved: the first, the others in other_errors
    del futures
    assert len(eio.value.other_errors) == 2
    for e in (ei.value, eof.value, eio.value, *eio.value.other_errors):
        got = _round_trip(e)
        assert type(got) is type(e) and str(got) == str(e), (got, e)
        assert (got.errno, got.strerror, got.filename) == (e.errno, e.strerror, e.filename)
        assert (got.offset, got.nbytes) == (e.offset, e.nbytes)
        assert getattr(got, "__notes__", None) == getattr(e, "__notes__", None)
    assert ei.value.filename == str(missing)
    assert eof.value.filename == eio.value.filename == str(path)
    assert isinstance(_round_trip(eof.value), EOFError)
    others = _round_trip(eio.value).other_errors
    assert [(x.errno, x.filename) for x in others] == [(errno.EIO, str(path))] * 2


def test_invalid_argument_and_corrupt_file_errors_survive_pickle(tmp_dir):
    with pytest.raises(deepio.InvalidArgumentError) as ei:
        deepio.aio_handle(block_size=-1)
    got = _round_trip(ei.value)
    assert type(got) is deepio.InvalidArgumentError and str(got) == str(ei.value)
    assert got.errno == errno.EINVAL and isinstance(got, ValueError)
    e = deepio.CorruptFileError(tmp_dir / "x.safetensors", "header is not JSON")
    e.add_note("while loading")
    got = _round_trip(e)
    assert type(got) is deepio.CorruptFileError and str(got) == str(e)
    assert (got.filename, got.what, got.__notes__) == (e.filename, e.what, ["while loading"])


def test_sync_call_leaves_an_earlier_async_failure_to_wait(random_file, fault):
    """A synchronous call raises only its own failure (issue 38): the sync read returns its
    bytes, and the earlier async read's EIO is raised by the next wait(), which counts it."""
    path, data = random_file(4096)
    bad, _ = random_file(4096)
    h = deepio.aio_handle(backend="threads")
    # The async read's own file: the threads backend may run the two reads at once on its pool.
    fault("read", errno=errno.EIO, count=1, path_contains=bad.name)
    h.async_pread(np.empty(4096, np.uint8), str(bad))
    out = np.empty(4096, np.uint8)
    assert h.sync_pread(out, str(path)) == 1
    assert out.tobytes() == data
    with pytest.raises(OSError) as e:
        h.wait()
    assert e.value.errno == errno.EIO
    assert h.wait() == 0


@pytest.mark.parametrize("backend", ["auto", "threads", "libaio"])
@pytest.mark.parametrize("point", ["read", "write"])
def test_injected_short_transfers_are_finished(backend, point, random_file, tmp_dir, fault):
    """Every transfer reports only 100 bytes: deepio resubmits the rest until done."""
    if backend == "libaio" and not any(b["name"] == "libaio" and b["available"] for b in deepio.info()["backends"]):
        pytest.skip("libaio backend unavailable")
    size = 3 * 4096 + 77
    path, data = random_file(size)
    h = deepio.aio_handle(4096, 4, False, True, 2, backend=backend)
    fault(point, short=100, count=10)
    if point == "read":
        buf = np.empty(size, np.uint8)
        assert h.sync_pread(buf, str(path)) == 1
        assert buf.tobytes() == data
    else:
        out = tmp_dir / "short.bin"
        buf = np.frombuffer(data, np.uint8)
        assert h.sync_pwrite(buf, str(out)) == 1
        assert out.read_bytes() == data
    assert _deepio._fault_hits() > 0
    assert h.stats()["short_transfers"] >= _deepio._fault_hits()


# ------------------------------------------------------------------------- bad arguments


def test_bad_constructor_arguments():
    with pytest.raises(ValueError):
        deepio.aio_handle(0)
    with pytest.raises(ValueError):
        deepio.aio_handle(queue_depth=-1)
    with pytest.raises(ValueError):
        deepio.aio_handle(intra_op_parallelism=0)
    with pytest.raises(TypeError):
        deepio.aio_handle("1M")
    with pytest.raises(TypeError):
        deepio.aio_handle(True)
    with pytest.raises(ValueError, match="backend"):
        deepio.aio_handle(backend="spdk")
    with pytest.raises(ValueError, match="direct_io"):
        deepio.aio_handle(direct_io="maybe")
    with pytest.raises(TypeError):
        deepio.aio_handle(single_submit="yes")
    with pytest.raises(TypeError):
        deepio.aio_handle(4096, 8, False, False, 3, num_threads=2)


def test_bad_io_arguments(random_file):
    path, _ = random_file(4096)
    h = deepio.aio_handle()
    with pytest.raises(ValueError, match="file_offset"):
        h.sync_pread(np.empty(10, np.uint8), str(path), -1)
    with pytest.raises(TypeError, match="not str"):
        h.sync_pwrite("not a buffer", str(path))
    with pytest.raises(TypeError):
        h.async_pwrite(np.empty(10, np.uint8), True)  # a bool is not a descriptor
    with pytest.raises(TypeError):
        h.async_pwrite(np.empty(10, np.uint8), 3.5)
    with pytest.raises(TypeError):
        h.async_pwrite(np.empty(10, np.uint8))
    with pytest.raises(TypeError):
        h.async_pwrite(np.empty(10, np.uint8), str(path), fd=3)
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        h.sync_pread(ro, str(path))
    assert h.sync_pwrite(ro, str(path)) == 1  # a read-only source is fine
    with pytest.raises(ValueError, match="read-only"):
        h.sync_pread(b"immutable bytes", str(path))
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pread(np.zeros((8, 8), np.uint8)[:, ::2], str(path))
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pwrite(np.zeros((8, 8), np.uint8).T, str(path))
    with pytest.raises(OSError) as ei:
        h.async_pwrite(np.zeros(4, np.uint8), 987654)  # not an open descriptor
    assert ei.value.errno == errno.EBADF
    assert "fd 987654" in str(ei.value)
    assert h.pending() == 0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": -4096}, "block_size"),
        ({"queue_depth": -1}, "queue_depth"),
        ({"queue_depth": 65537}, "queue_depth"),
        ({"intra_op_parallelism": 0}, "intra_op_parallelism"),
        ({"num_threads": 1025}, "intra_op_parallelism"),  # DeepNVMe's older name, same check
        ({"backend": "spdk"}, "backend"),
        ({"direct_io": "maybe"}, "direct_io"),
    ],
)
def test_bad_options_are_einval_value_errors(kwargs, name):
    """The engine checks options once; its EINVAL reaches Python as deepio.InvalidArgumentError,
    both a ValueError and an OSError, naming the parameter and the value as written."""
    with pytest.raises(ValueError, match=name) as ei:
        deepio.aio_handle(**kwargs)
    e = ei.value
    assert isinstance(e, deepio.InvalidArgumentError) and isinstance(e, OSError)
    assert e.errno == errno.EINVAL
    value = next(iter(kwargs.values()))
    if isinstance(value, int):
        assert f"got {value}" in str(e)


def test_bad_options_positional_like_deepnvme():
    with pytest.raises(ValueError, match="queue_depth"):
        deepio.aio_handle(4096, 0, False, False, 1)
    with pytest.raises(ValueError, match="intra_op_parallelism"):
        deepio.aio_handle(4096, 8, False, False, -2)
    with pytest.raises(ValueError, match="block_size"):
        deepio.compat.aio_read(bytearray(1), "/nonexistent", 0, 8, False, False, False)
    # the bounds themselves are accepted
    assert deepio.aio_handle(1, 65536, False, False, 1, backend="threads").get_queue_depth() == 65536
    assert deepio.aio_handle(1, 8, False, False, 1024, backend="threads").get_intra_op_parallelism() == 1024


@pytest.mark.parametrize(
    "call", ["async_pread", "async_pwrite", "sync_pread", "sync_pwrite", "read", "write", "pread", "pwrite", "fd"]
)
def test_negative_offset_is_einval_value_error(call, random_file):
    path, data = random_file(4096)
    h = deepio.aio_handle(backend="threads")
    buf = np.zeros(16, np.uint8)
    ref = weakref.ref(buf)
    fd = os.open(path, os.O_RDWR)
    try:
        run = {
            "async_pread": lambda b: h.async_pread(b, str(path), -1),
            "async_pwrite": lambda b: h.async_pwrite(b, str(path), -1),
            "sync_pread": lambda b: h.sync_pread(b, str(path), -1),
            "sync_pwrite": lambda b: h.sync_pwrite(b, str(path), -1),
            "read": lambda b: h.read(b, str(path), False, -1),
            "write": lambda b: h.write(b, str(path), False, -1),
            "pread": lambda b: h.pread(b, str(path), False, True, file_offset=-1),
            "pwrite": lambda b: h.pwrite(b, str(path), False, False, -1),
            "fd": lambda b: h.async_pread(b, fd=fd, file_offset=-1),
        }[call]
        with pytest.raises(ValueError, match="file_offset") as ei:
            run(buf)
    finally:
        os.close(fd)
    e = ei.value
    assert isinstance(e, deepio.InvalidArgumentError) and e.errno == errno.EINVAL
    assert "got -1" in str(e)
    assert h.pending() == 0 and h.wait() == 0
    assert path.read_bytes() == data  # nothing was written
    del buf, run, e, ei  # (the traceback's frames reference the buffer too)
    gc.collect()
    assert ref() is None  # a refused submission keeps no reference to the buffer


def test_negative_offset_through_file_is_einval_value_error(random_file):
    path, data = random_file(4096)
    with deepio.File(path, "r+") as f:
        for submit in (f.pread, f.pwrite, f.read_into, f.write_from):
            with pytest.raises(ValueError, match="file_offset") as ei:
                submit(bytearray(8), -8)
            assert isinstance(ei.value, OSError) and ei.value.errno == errno.EINVAL
        assert f.pread(bytearray(8), 8).result() == 8  # the file and handle keep working
    assert path.read_bytes() == data


def test_einval_from_the_file_system_is_not_a_value_error(tmp_dir, fault):
    """EINVAL that the kernel or file system returns (here: O_DIRECT refused with
    direct_io="on", injected at open) stays a plain OSError."""
    fault("open", errno=errno.EINVAL, count=1)
    h = deepio.aio_handle(direct_io="on")
    with pytest.raises(OSError) as ei:
        h.sync_pwrite(np.zeros(4096, np.uint8), str(tmp_dir / "refuses_direct.bin"))
    assert ei.value.errno == errno.EINVAL
    assert not isinstance(ei.value, ValueError)


def test_closed_handle(random_file):
    path, _ = random_file(16)
    h = deepio.aio_handle()
    h.close()
    h.close()
    assert h.closed
    with pytest.raises(ValueError, match="closed"):
        h.sync_pread(bytearray(16), str(path))
    with pytest.raises(ValueError, match="closed"):
        h.get_block_size()
