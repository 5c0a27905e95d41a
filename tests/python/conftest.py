"""Fixtures for the deepio Python tests.

Files go to a fresh folder on a real disk: $DEEPIO_TEST_DIR if set (point it at another
mount to test that file system), else build/pytest under the repository, else /var/tmp.
tmpfs is avoided on purpose: it refuses O_DIRECT, which would skip the direct-I/O paths.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import deepio
from deepio import _deepio

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in the test requirements
    np = None

try:
    import torch
except ImportError:
    torch = None

REPO = Path(__file__).resolve().parents[2]

# The helper modules that test files share (not test files themselves): their asserts get
# pytest's messages too. CTest's --noconftest run of test_cli*.py does without them.
pytest.register_assert_rewrite(
    "checkpoint_support", "cli_support", "gpu_fake_support", "safetensors_support", "dcp_support", "comm_mpi_support"
)

# ------------------------------------------------------------------ optional test dependencies
# A test that needs an optional package carries a capability mark (needs_torch, ...): it skips,
# with the reason, where the package is missing. DEEPIO_REQUIRE=torch,numpy,... (comma-separated;
# scripts/test.sh sets it for CI) turns that skip into a failure, so that a broken CI image cannot
# pass by skipping. DEEPIO_REQUIRE_DEEPSPEED=1, the older spelling, still means "deepspeed".
OPTIONAL = ("torch", "numpy", "safetensors", "hypothesis", "deepspeed", "sglang", "lmcache", "vllm")


# The inference engines of deepio.kv's backends live in a folder of their own, off sys.path
# (scripts/setup-kv-engines.sh, kv_engines.py); test_kv_backends.py puts it on sys.path itself.
KV_ENGINES = ("sglang", "lmcache", "vllm")


def _have(module: str) -> bool:
    try:
        if importlib.util.find_spec(module) is not None:
            return True
    except (ImportError, ValueError):
        return False
    if module in KV_ENGINES:
        import kv_engines

        return (kv_engines.folder() / module / "__init__.py").is_file()
    return False


def _required() -> frozenset[str]:
    raw = os.environ.get("DEEPIO_REQUIRE", "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = names - set(OPTIONAL)
    if unknown:
        raise pytest.UsageError(f"DEEPIO_REQUIRE={raw!r}: unknown {sorted(unknown)}; known: {', '.join(OPTIONAL)}")
    legacy = os.environ.get("DEEPIO_REQUIRE_DEEPSPEED", "")
    if legacy not in ("", "0", "1"):
        raise pytest.UsageError(f"DEEPIO_REQUIRE_DEEPSPEED={legacy!r}: must be 1 or 0")
    if legacy == "1":
        names.add("deepspeed")
    return frozenset(names)


REQUIRED = _required()
HAVE = {name: _have(name) for name in OPTIONAL}


def needs(name: str) -> pytest.MarkDecorator:
    """The capability mark for optional package `name` (one of OPTIONAL)."""
    assert name in OPTIONAL, name
    return pytest.mark.deepio_needs(name)


def require_module(module: str, name: str | None = None):
    """For a test file that cannot even be imported without `module` (module-level use):
    returns it; where it is missing, skips the file with the reason, or, when DEEPIO_REQUIRE
    names the package, fails its collection."""
    name = name or module.split(".")[0]
    if name in REQUIRED and not _have(module):
        raise RuntimeError(f"DEEPIO_REQUIRE names {name}, but {module} cannot be imported")
    return pytest.importorskip(module, reason=f"{name} is not installed")


def pytest_configure(config):
    config.addinivalue_line("markers", "deepio_needs(name): the test needs optional package `name`")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("deepio_needs"):
        name = mark.args[0]
        if HAVE[name]:
            continue
        if name in REQUIRED:
            pytest.fail(f"DEEPIO_REQUIRE names {name}, but it is not installed", pytrace=False)
        pytest.skip(f"{name} is not installed")


needs_torch = needs("torch")
needs_numpy = needs("numpy")
needs_safetensors = needs("safetensors")
needs_hypothesis = needs("hypothesis")
needs_deepspeed = needs("deepspeed")


def _torch_pinning_works() -> bool:
    if torch is None:
        return False
    try:
        return bool(torch.empty(8).pin_memory().is_pinned())
    except Exception:
        return False


TORCH_PINNED = _torch_pinning_works()
needs_torch_pinning = pytest.mark.skipif(
    not TORCH_PINNED, reason="torch cannot pin host memory here (no CUDA/accelerator runtime)"
)


def _fs_type(path: Path) -> str:
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if str(path).startswith(mnt) and len(mnt) > len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return fstype


def _base_dir() -> Path:
    env = os.environ.get("DEEPIO_TEST_DIR")
    if env:
        return Path(env)
    for cand in (REPO / "build" / "pytest", Path("/var/tmp/deepio-pytest")):
        try:
            cand.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if _fs_type(cand.resolve()) != "tmpfs":
            return cand
    return Path(tempfile.gettempdir())


@pytest.fixture(scope="session")
def session_dir():
    base = BASE_DIR
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tmp_dir(session_dir):
    d = session_dir / uuid.uuid4().hex[:12]
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: "2m") mounted on a fresh ``folder/tmpfs`` for a test
    that must fill a file system (ENOSPC); root only (see mounted())."""
    with mounted(folder, "tmpfs", f"size={size}") as mnt:
        yield mnt


@contextmanager
def mounted(folder: Path, fstype: str, options: str | None = None) -> Iterator[Path]:
    """A fresh file system of type ``fstype`` (tmpfs, ramfs) mounted on a new ``folder/<fstype>``;
    root only: skips with the reason otherwise, and where the mount fails. Unmounted afterwards
    (lazily when still busy: the test fails on what it found anyway)."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {fstype} needs root")
    mnt = folder / fstype
    mnt.mkdir()
    cmd = ["mount", "-t", fstype] + (["-o", options] if options else []) + [fstype, str(mnt)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {fstype} here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


@pytest.fixture
def random_file(tmp_dir):
    """make(nbytes, name=None) -> (path, bytes): a file of random bytes."""

    def make(nbytes: int, name: str | None = None):
        data = os.urandom(nbytes)
        p = tmp_dir / (name or f"ref_{nbytes}_{uuid.uuid4().hex[:6]}.bin")
        p.write_bytes(data)
        return p, data

    return make


def _open_fds() -> set:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            out.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except OSError:
            pass
    return out


BASE_DIR = _base_dir()

# The fault-injection hooks (_deepio._set_fault, _clear_fault, _fault_hits) are compiled only
# into test builds: scripts/test.sh installs with -Ccmake.define.DEEPIO_TEST_HOOKS=ON. A default
# build (any wheel) lacks them, and the tests that inject faults skip through `fault` below.
HAS_TEST_HOOKS = hasattr(_deepio, "_set_fault")
NO_TEST_HOOKS = "built without DEEPIO_TEST_HOOKS (pip install -Ccmake.define.DEEPIO_TEST_HOOKS=ON ...)"


def _locked_allocations() -> int:
    """Live locked allocations that are nobody's staging memory: the blocks the engines' pools
    lend and keep (bounce arenas, Writer/Reader windows) are the engines' to hold."""
    s = deepio.locked_memory_stats()
    return s["allocations"] - s["staging_blocks"]


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Every test: no descriptor left open on a test file, no locked allocation left alive,
    no fault hook left installed."""
    before = _open_fds()
    locked_before = _locked_allocations()
    yield
    if HAS_TEST_HOOKS:
        _deepio._clear_fault()
    base = str(BASE_DIR.resolve())
    leaked = [(fd, target) for fd, target in _open_fds() - before if target.startswith(base)]
    assert not leaked, f"leaked descriptors: {leaked}"
    locked_after = _locked_allocations()
    if locked_after > locked_before:
        gc.collect()  # costly with torch loaded, so only when something looks leaked
        locked_after = _locked_allocations()
    assert locked_after <= locked_before, f"leaked locked allocations: {locked_before} -> {locked_after}"


# Events for tests of waiting: the fault hook's `delay` has no "entered" signal, but a worker
# sitting in it is a thread of this process asleep in nanosleep, which /proc shows. Tests wait
# for that state instead of sleeping for a guessed time and hoping the worker got there.
_NANOSLEEP_SYSCALLS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}.get(platform.machine(), set())


def threads_in_fault_delay() -> int:
    """Threads of this process asleep in nanosleep (engine workers held by a fault's `delay`;
    the tests that ask run no other sleeping thread)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/self/task/{tid}/syscall") as f:
                nr = f.read().split(" ", 1)[0]
        except OSError:
            continue
        if "nanosleep" in wchan or nr in _NANOSLEEP_SYSCALLS:
            n += 1
    return n


class InThread:
    """Runs ``fn(*args)`` on a thread of its own, started at once; ``errors`` collects what it
    raised (BaseException included: a test's assertion in it), ``join()`` waits for it."""

    def __init__(self, fn, *args) -> None:
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(fn, *args))
        self.thread.start()

    def _run(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:
            self.errors.append(e)

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)


def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    """Polls `predicate` until it holds. The bound only keeps a broken engine from hanging the
    suite; it is never what a test asserts."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.001)


@pytest.fixture
def fault():
    """_deepio._set_fault with automatic clearing. The one gate on the test hooks: a test that
    takes this fixture skips, with the reason, when the extension was built without them."""
    if not HAS_TEST_HOOKS:
        pytest.skip(NO_TEST_HOOKS)
    yield _deepio._set_fault
    _deepio._clear_fault()


# ---------------------------------------------------------------------------------- buffers

FRAMEWORKS = [
    pytest.param("torch", marks=needs_torch),
    pytest.param("numpy", marks=needs_numpy),
]


def make_buffer(framework: str, nbytes: int, kind: str = "plain", handle=None):
    """A uint8 buffer of nbytes: kind "plain" (ordinary memory), "locked"
    (new_cpu_locked_tensor) or "pinned" (torch pin_memory)."""
    if kind == "locked":
        h = handle or deepio.aio_handle()
        example = torch.empty(0, dtype=torch.uint8) if framework == "torch" else np.empty(0, dtype=np.uint8)
        return h.new_cpu_locked_tensor(nbytes, example)
    if framework == "torch":
        t = torch.empty(nbytes, dtype=torch.uint8)
        return t.pin_memory() if kind == "pinned" else t
    assert kind == "plain"
    return np.empty(nbytes, dtype=np.uint8)


def fill(buf, data: bytes):
    if torch is not None and isinstance(buf, torch.Tensor):
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    else:
        buf[...] = np.frombuffer(data, dtype=np.uint8)


def as_bytes(buf) -> bytes:
    if torch is not None and isinstance(buf, torch.Tensor):
        return buf.contiguous().view(torch.uint8).numpy().tobytes() if np is not None else bytes(buf.tolist())
    if np is not None and isinstance(buf, np.ndarray):
        return buf.tobytes()
    return bytes(buf)


# ---------------------------------------------------------------------------------- processes


@contextmanager
def sigkilled_on_exit(child) -> Iterator:
    """Yields the subprocess.Popen `child`; on leaving the block, however it is left, the
    child gets SIGKILL (a crash mid-work, for the tests that kill a writer) and is reaped."""
    try:
        yield child
    finally:
        child.kill()  # SIGKILL; nothing when it has already exited
        child.wait(30)


def pytest_report_header(config):
    base = BASE_DIR
    return [
        f"deepio {deepio.__version__} from {Path(deepio.__file__).parent}; test hooks: {HAS_TEST_HOOKS}; "
        f"test files under {base} ({_fs_type(base.resolve()) or '?'})",
        f"torch: {getattr(torch, '__version__', 'missing')}; numpy: {getattr(np, '__version__', 'missing')}; "
        f"torch pinning: {TORCH_PINNED}; python {sys.version.split()[0]}",
    ]
