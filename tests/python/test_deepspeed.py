"""DeepSpeed itself on deepio, with the switch (deepio.deepspeed, DEEPIO_DEEPSPEED=1).

Against the real client: DeepSpeed from PyPI (pinned in scripts/test.sh, its ops not built),
driven through its public API in fresh interpreters. Skipped where DeepSpeed or torch is not
installed, unless DEEPIO_REQUIRE names deepspeed (CI sets it; DEEPIO_REQUIRE_DEEPSPEED=1 still
works), where that is a failure.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import deepio
from conftest import REQUIRED, mounted

HERE = Path(__file__).resolve().parent
HAVE = importlib.util.find_spec("deepspeed") is not None and importlib.util.find_spec("torch") is not None
_MISSING = {name for name in ("deepspeed", "torch") if importlib.util.find_spec(name) is None}
if _MISSING and ("deepspeed" in REQUIRED or _MISSING & REQUIRED):
    raise RuntimeError(
        f"DEEPIO_REQUIRE names {sorted(REQUIRED)}, but {sorted(_MISSING)} is not installed "
        "(scripts/test.sh installs them)"
    )
pytestmark = pytest.mark.skipif(not HAVE, reason="DeepSpeed and torch are not installed")

# Where the wheel put deepio-deepspeed.pth: in a site directory the interpreter processes it at
# start-up; for an install elsewhere (pip --target, on PYTHONPATH) the child adds it as one.
_SITE = str(Path(deepio.__file__).resolve().parents[1])
_IN_SITE = _SITE in {str(Path(p).resolve()) for p in site.getsitepackages()}
_PRELUDE = "" if _IN_SITE else f"import site; site.addsitedir({_SITE!r})\n"


def _env(switch: str | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DEEPIO_DEEPSPEED", None)
    env.pop("DEEPIO_NVME_PATHS", None)
    if switch is not None:
        env["DEEPIO_DEEPSPEED"] = switch
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str], cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _last_json(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# Every way DeepSpeed hands out the three builders, printed as the module that defines what it got.
_PROBE = """
    import json
    import deepspeed
    import deepspeed.ops.op_builder as ob
    import deepspeed.ops.aio as aio, deepspeed.ops.gds as gds, deepspeed.ops.pin_memory as pm
    import deepspeed.runtime.swap_tensor.partitioned_param_swapper as pps
    import deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper as pos
    import deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper as pls
    import deepspeed.runtime.model_checkpointing.writer_factory as wf
    import deepspeed.io.fast_file_writer as ffw
    import deepspeed.nvme.ds_aio_handle as dah
    import deepspeed.runtime.swap_tensor.utils as swu
    import deepspeed.runtime.swap_tensor.async_swapper as asw
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    acc = get_accelerator()
    def m(x):
        return getattr(x, "__module__", type(x).__module__)
    print(json.dumps({
        "op_builder": [m(ob.AsyncIOBuilder), m(ob.GDSBuilder), m(ob.PinMemoryBuilder), m(ob.UtilsBuilder)],
        "ops": [m(aio.AsyncIOBuilder), m(gds.GDSBuilder), m(pm.PinMemoryBuilder)],
        "importers": [m(pps.AsyncIOBuilder), m(pps.GDSBuilder), m(pos.AsyncIOBuilder), m(pls.AsyncIOBuilder),
                      m(wf.AsyncIOBuilder), m(wf.GDSBuilder), m(ffw.UtilsBuilder), m(dah.GDSBuilder)],
        "get_op_builder": [m(acc.get_op_builder(n)) for n in
                           ("AsyncIOBuilder", "GDSBuilder", "PinMemoryBuilder", "UtilsBuilder")],
        "create_op_builder": [m(acc.create_op_builder(n)) for n in ("AsyncIOBuilder", "PinMemoryBuilder")],
        "all_ops": {k: m(v) for k, v in ALL_OPS.items() if k in ("async_io", "gds", "pin_memory", "utils")},
        "other_op": m(acc.get_op_builder("CPUAdamBuilder")),
        "defining_module_kept": m(__import__("deepspeed.ops.op_builder.async_io",
                                             fromlist=["AsyncIOBuilder"]).AsyncIOBuilder),
        "pin_handle": type(ob.PinMemoryBuilder().load().pin_handle()).__module__,
        "swap_functions": [m(f) for f in (swu.swap_in_tensors, swu.swap_out_tensors, pps.swap_in_tensors,
                                          pps.swap_out_tensors, pos.swap_in_tensors, pos.swap_out_tensors,
                                          asw.swap_out_tensors)],
    }))
"""


def _all_deepio(report: dict) -> None:
    for key in ("op_builder", "ops", "importers", "get_op_builder", "create_op_builder"):
        assert report[key] == ["deepio.compat"] * len(report[key]), (key, report[key])
    assert set(report["all_ops"].values()) == {"deepio.compat"}, report["all_ops"]
    assert "async_io" in report["all_ops"] and "pin_memory" in report["all_ops"]
    assert report["other_op"].startswith("deepspeed."), "only the I/O ops are switched"
    assert report["defining_module_kept"].startswith("deepspeed."), "DeepSpeed's own classes stay where they are"
    assert report["pin_handle"] == "deepio.compat"
    assert report["swap_functions"] == ["deepio.deepspeed"] * 7, report["swap_functions"]


def _deepspeed_sources_digest() -> str:
    root = Path(importlib.util.find_spec("deepspeed").origin).parent  # type: ignore[union-attr, arg-type]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("when", ["before", "after"])
def test_install_switches_every_way_deepspeed_gets_its_io_ops(tmp_path, when):
    digest = _deepspeed_sources_digest()
    body = textwrap.dedent(_PROBE)
    install = "import deepio.deepspeed\nassert deepio.deepspeed.install() is True\n"
    if when == "before":
        code = install + body
    else:  # DeepSpeed and the modules that import its builders are loaded first
        imports, rest = body.split("acc = get_accelerator()\n", 1)
        code = imports + install + "acc = get_accelerator()\n" + rest
    _all_deepio(_last_json(_python(code, _env(None), tmp_path)))
    assert _deepspeed_sources_digest() == digest, "DeepSpeed's files were edited"


def test_swap_functions_submit_a_deepio_handles_tensors_as_one_batch(tmp_path):
    """DeepSpeed's swap_out/swap_in on a deepio handle: one batch (so a file that cannot be
    opened is raised by wait(), not by the call); any other handle keeps DeepSpeed's loop."""
    code = f"""
        import json, torch
        import deepio.deepspeed
        deepio.deepspeed.install()
        from deepspeed.ops.op_builder import AsyncIOBuilder
        from deepspeed.runtime.swap_tensor.utils import swap_in_tensors, swap_out_tensors
        h = AsyncIOBuilder().load().aio_handle(1 << 20, 8, False, True, 1)
        ts = [torch.randn(1000 + 37 * i) for i in range(20)]
        paths = [{str(tmp_path)!r} + f"/s{{i}}.swp" for i in range(20)]
        swap_out_tensors(h, ts, paths)
        out = h.wait()
        back = [torch.empty_like(t) for t in ts]
        swap_in_tensors(h, back, iter(paths))  # any iterables, zip's length, as DeepSpeed's loop
        got = h.wait()
        same = all(torch.equal(a, b) for a, b in zip(ts, back))
        swap_in_tensors(h, [torch.empty(4)], [{str(tmp_path)!r} + "/missing.swp"])
        try:
            h.wait()
            missing = "not raised"
        except FileNotFoundError:
            missing = "raised by wait"
        class Loop:  # not a deepio handle: DeepSpeed's own loop, call by call
            calls = []
            def async_pwrite(self, b, p, o):
                self.calls.append(p)
                return 0
        loop = Loop()
        swap_out_tensors(loop, ts[:3], paths[:3])
        print(json.dumps({{"out": out, "in": got, "same": same, "missing": missing,
                          "loop_calls": len(loop.calls)}}))
    """
    r = _last_json(_python(code, _env(None), tmp_path))
    assert r == {"out": 20, "in": 20, "same": True, "missing": "raised by wait", "loop_calls": 3}


def test_environment_variable_switches_at_interpreter_start(tmp_path):
    """DEEPIO_DEEPSPEED=1: the program never mentions deepio."""
    _all_deepio(_last_json(_python(_PROBE, _env("1"), tmp_path)))


@pytest.mark.parametrize("value", [None, "0", ""])
def test_without_the_switch_deepspeed_keeps_its_own_ops(tmp_path, value):
    code = """
        import json, sys
        import deepspeed.ops.op_builder as ob
        print(json.dumps({"builder": ob.AsyncIOBuilder.__module__, "deepio_imported": "deepio" in sys.modules}))
    """
    report = _last_json(_python(code, _env(value), tmp_path))
    assert report["builder"].startswith("deepspeed."), report
    assert report["deepio_imported"] is False, "the start-up hook imports deepio only when asked"


def test_without_deepspeed_install_does_nothing(tmp_path):
    code = """
        import importlib.abc, json, sys
        class Hide(importlib.abc.MetaPathFinder):   # this interpreter has no DeepSpeed
            def find_spec(self, name, path, target=None):
                if name == "deepspeed" or name.startswith("deepspeed."):
                    raise ModuleNotFoundError(name)
                return None
        sys.meta_path.insert(0, Hide())
        finders = list(sys.meta_path)
        import deepio.deepspeed as dd
        print(json.dumps({"result": dd.install(), "unchanged": sys.meta_path == finders,
                          "installed": dd.installed(), "status": dd.status()}))
    """
    report = _last_json(_python(code, _env(None), tmp_path))
    assert report == {
        "result": False,
        "unchanged": True,
        "installed": False,
        "status": report["status"],
    }
    assert report["status"]["deepspeed_installed"] is False


def test_status_reports_what_deepio_info_prints(tmp_path):
    code = """
        import json
        import deepio.deepspeed as dd
        print(json.dumps(dd.status()))
    """
    on = _last_json(_python(code, _env("1"), tmp_path))
    off = _last_json(_python(code, _env(None), tmp_path))
    assert on["deepspeed_installed"] and on["deepspeed_version"]
    assert on["startup_hook"] is True, "the wheel installs deepio-deepspeed.pth"
    assert (on["env_on"], on["active"]) == (True, True)
    assert (off["env_on"], off["active"]) == (False, False)


def _refused(nvme_paths: object) -> BaseException:
    """What install(nvme_paths=...) raises for a bad list, checked to change nothing."""
    import deepio.deepspeed as dd

    with pytest.raises((OSError, ValueError, TypeError)) as ei:
        dd.install(nvme_paths=nvme_paths)  # type: ignore[arg-type]
    assert not dd.installed(), "a refused list installs nothing"
    return ei.value


def test_bad_nvme_folder_lists_are_refused_naming_the_folder(tmp_path):
    """install(nvme_paths=...): each mistake a user can make is its own clear error, naming
    the entry (and, for a folder, its path as the OSError's filename)."""
    good, file = tmp_path / "good", tmp_path / "file"
    good.mkdir()
    file.write_bytes(b"x")
    (tmp_path / "link").symlink_to(good)

    e = _refused([good, tmp_path / "missing"])
    assert isinstance(e, FileNotFoundError) and e.errno == errno.ENOENT, e
    assert e.filename == str(tmp_path / "missing") and "entry 2 of 2: no such folder" in str(e), e
    e = _refused([file])
    assert isinstance(e, NotADirectoryError) and e.filename == str(file), e
    for same in (good / ".", tmp_path / "link", str(good) + "/"):
        e = _refused([good, same])
        assert type(e) is ValueError and "is the same folder as" in str(e) and str(good) in str(e), e
    e = _refused([good, ""])
    assert type(e) is ValueError and "entry 2 of 2 is empty" in str(e), e
    e = _refused([])
    assert type(e) is ValueError and "empty list" in str(e), e
    e = _refused(f"{good},{good}")  # the variable's spelling, given as one string
    assert type(e) is TypeError and "a list of folders" in str(e), e
    e = _refused([good, 3])
    assert type(e) is TypeError and "entry 2 of 2" in str(e), e


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("{good},,{good}", "entry 2 of 3 is empty"),
        ("{good},", "entry 2 of 2 is empty"),
        ("{good},{missing}", "entry 2 of 2: no such folder"),
        ("{good}, {good}/.", "is the same folder as"),
        ("", ""),
        (" ", ""),
    ],
)
def test_bad_nvme_paths_variable_is_reported_by_status(tmp_path, monkeypatch, value, error):
    """DEEPIO_NVME_PATHS is read when a swapper is made; status() (what `deepio info` asks)
    reports the folders or why they are refused. Empty or blank: DeepSpeed's one nvme_path."""
    import deepio.deepspeed as dd

    good = tmp_path / "good"
    good.mkdir()
    monkeypatch.setenv("DEEPIO_NVME_PATHS", value.format(good=good, missing=tmp_path / "missing"))
    st = dd.status()
    assert error in st["nvme_paths_error"] and bool(st["nvme_paths_error"]) == bool(error), st
    assert st["nvme_paths"] == [], st
    monkeypatch.setenv("DEEPIO_NVME_PATHS", f" {good} ,{tmp_path}")
    assert dd.status()["nvme_paths"] == [str(good), str(tmp_path)]


def test_unwritable_nvme_folder_is_refused(tmp_dir):
    """A folder this process cannot write: PermissionError naming it (as an unprivileged
    user: a child that gives up root when run as root)."""
    folder = tmp_dir / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            _PRELUDE
            + textwrap.dedent(f"""
                import os
                import deepio.deepspeed as dd
                if os.geteuid() == 0:  # after the imports: the interpreter may live under /root
                    os.setgid(65534); os.setuid(65534)
                try:
                    dd.install(nvme_paths=[{str(folder)!r}])
                except PermissionError as e:
                    print("ok", e.filename)
            """),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", str(folder)]


def test_nvme_folder_on_a_read_only_file_system_is_refused(tmp_path):
    import deepio.deepspeed as dd

    with mounted(tmp_path, "tmpfs", "ro,size=1m") as ro:
        with pytest.raises(OSError) as ei:
            dd.install(nvme_paths=[tmp_path, ro])
        assert ei.value.errno == errno.EROFS and ei.value.filename == str(ro), ei.value
        assert "entry 2 of 2: on a read-only file system" in str(ei.value)
        assert not dd.installed()


def test_bad_nvme_paths_variable_fails_deepspeed_initialize(tmp_path):
    """Through DeepSpeed itself: a missing folder in DEEPIO_NVME_PATHS fails
    deepspeed.initialize with FileNotFoundError naming the variable and the folder."""
    good, missing = tmp_path / "good", tmp_path / "missing"
    good.mkdir()
    p = _program(
        ["train", "nvme", "bf16", str(good), str(tmp_path / "out.pt")],
        tmp_path,
        MASTER_PORT="29640",
        DEEPIO_NVME_PATHS=f"{good},{missing}",
    )
    assert p.returncode != 0
    assert f"FileNotFoundError: [Errno 2] DEEPIO_NVME_PATHS: entry 2 of 2: no such folder: '{missing}'" in p.stderr, (
        p.stderr[-3000:]
    )
    assert not (tmp_path / "out.pt").exists()


_RUN_PROGRAM = "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')"


def _program(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + _RUN_PROGRAM, str(HERE / "deepspeed_program.py"), *args],
        env=_env("1", **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _train(tmp_path: Path, offload: str, dtype: str, port: int, nvme_paths: list[Path] | None = None) -> dict:
    """One training run; its nvme_path is tmp_path/<offload>-<dtype>[-spread], and with
    ``nvme_paths`` DEEPIO_NVME_PATHS lists those folders."""
    import torch

    name = f"{offload}-{dtype}" + ("-spread" if nvme_paths else "")
    folder = tmp_path / name
    folder.mkdir()
    out = tmp_path / f"{name}.pt"
    env = {"MASTER_PORT": str(port)}
    if nvme_paths:
        env["DEEPIO_NVME_PATHS"] = ",".join(map(str, nvme_paths))
    p = _program(["train", offload, dtype, str(folder), str(out)], tmp_path, **env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return torch.load(out, weights_only=False)


def _swap_files(folder: Path) -> set[str]:
    """The swap files under ``folder``, as paths relative to it."""
    return {str(f.relative_to(folder)) for f in folder.rglob("*.swp")}


# bf16 swaps parameters and optimizer state (three handles): the default run's case; fp32 is slow.
@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp32", marks=pytest.mark.slow)])
def test_zero3_nvme_offload_trains_bit_identically_to_cpu_offload(tmp_path, dtype):
    """ZeRO-3 with the optimizer state (and, in bf16, the parameters) on NVMe through deepio,
    plain swapper on one folder and pipelined swapper over two (DEEPIO_NVME_PATHS):
    losses and final parameters equal, bit for bit, to the same run offloading to CPU. Over
    two folders, every swap file of the one-folder run is in exactly one of them, both
    folders are used, each swapper's bytes are split evenly, and none is left under
    DeepSpeed's nvme_path."""
    import torch

    port = 29600 + (0 if dtype == "bf16" else 10)
    reference = _train(tmp_path, "cpu", dtype, port)
    drives = [tmp_path / "drive0", tmp_path / "drive1"]
    for d in drives:
        d.mkdir()
    # The pipelined swapper over two folders: its files are the plain one's, in two places.
    runs = [("nvme", None), ("nvme-pipelined", drives)]
    for i, (offload, nvme_paths) in enumerate(runs):
        run = _train(tmp_path, offload, dtype, port + 1 + i, nvme_paths)
        assert run["builder"] == "deepio.compat"
        assert run["losses"] == reference["losses"], (offload, run["losses"], reference["losses"])
        assert run["params"].keys() == reference["params"].keys()
        for name, value in reference["params"].items():
            assert torch.equal(run["params"][name], value), (offload, name)
        # The swaps really went through deepio's handles: bytes moved, nothing failed.
        handles = run["handles"]
        assert len(handles) == (3 if dtype == "bf16" else 1), handles
        for stats in handles:
            assert stats["ops_completed"] > 0 and stats["ops_failed"] == 0, handles
        assert sum(s["bytes_direct"] + s["bytes_buffered"] + s["bytes_bounced"] for s in handles) > 8 << 20

    one = _swap_files(tmp_path / f"nvme-{dtype}")
    spread = [_swap_files(d) for d in drives]
    assert one and spread[0] | spread[1] == one, (one, spread)
    assert not spread[0] & spread[1], "a file in both folders"
    assert not _swap_files(tmp_path / f"nvme-pipelined-{dtype}-spread"), "files left under nvme_path"
    assert spread[0] and spread[1], f"a folder unused: {spread}"
    # Both swappers spread (the parameter swapper has one file: this model has one weight of
    # at least 1 MiB), each evenly: its folders' bytes differ by at most its largest file.
    swappers = {"zero_stage_3/optimizer/rank0"} | ({"zero_stage_3/bfloat16params/rank0"} if dtype == "bf16" else set())
    assert {os.path.dirname(f) for f in one} == swappers, one
    for swapper in swappers:
        sizes = [
            [(d / f).stat().st_size for f in files if f.startswith(swapper + "/")] for d, files in zip(drives, spread)
        ]
        assert abs(sum(sizes[0]) - sum(sizes[1])) <= max(sizes[0] + sizes[1]), (swapper, sizes)


def test_fastpersist_checkpoint_writer_saves_through_deepio(tmp_path):
    """DeepSpeed's fast checkpoint writer (FastPersist) saves through deepio's aio_handle and a
    buffer locked by deepio's pin_memory op; torch.load reads the checkpoint back equal."""
    import torch

    folder = tmp_path / "ckpt"
    out = tmp_path / "ckpt.pt"
    # DeepSpeed's CPU accelerator pins through the pin_memory op only in its native mode.
    p = _program(["checkpoint", str(folder), str(out)], tmp_path, MASTER_PORT="29631", DS_PIN_MEMORY_BACKEND="native")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    r = torch.load(out, weights_only=False)
    assert r["builder"] == "deepio.compat"
    assert r["buffer_pinned_for_deepio"] is True, "the pin_memory op's buffer is locked for deepio too"
    assert r["saved"].keys() == r["live"].keys() and len(r["live"]) == 6
    for name, value in r["live"].items():
        assert torch.equal(r["saved"][name], value), name
    (stats,) = r["handles"]
    assert stats["ops_completed"] > 0 and stats["ops_failed"] == 0
    assert stats["bytes_direct"] + stats["bytes_buffered"] + stats["bytes_bounced"] >= 4 << 20


@pytest.mark.parametrize("read", [False, True])
def test_deepspeeds_ds_io_runs_on_deepio(tmp_path, read):
    """DeepSpeed's own ds_io (its DeepNVMe benchmark) with the switch on."""
    code = f"""
        import sys
        sys.argv = ["ds_io", "--folder", {str(tmp_path)!r}, "--io_size", "4M", "--loops", "2", "--validate"]
        if {read}:
            sys.argv.append("--read")
        import deepspeed.ops.op_builder as ob
        assert ob.AsyncIOBuilder.__module__ == "deepio.compat", ob.AsyncIOBuilder
        from deepspeed.nvme import ds_io_main
        ds_io_main()
    """
    p = _python(code, _env("1"), tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    kind = "Read" if read else "Write"
    speed = [line for line in p.stdout.splitlines() if line.startswith(f"E2E {kind} Speed = ")]
    assert speed and float(speed[0].split("=")[1].split()[0]) > 0, p.stdout[-2000:]
    files = [f for f in tmp_path.iterdir() if f.name.startswith(f"_aio_{kind.lower()}_")]
    assert files and all(f.stat().st_size == 4 << 20 for f in files)


def test_deepio_info_says_whether_deepspeed_is_there_and_switched():
    from cli_support import CLI, run

    if CLI is None:
        pytest.skip("the deepio command is not built")
    starts_hook = _PRELUDE == ""  # deepio is in a site directory: its .pth runs at start-up
    for value, on in (("1", starts_hook), ("0", False)):
        r = run("info", "--json", env={"DEEPIO_PYTHON": sys.executable, "DEEPIO_DEEPSPEED": value})
        assert r.returncode == 0, r.stderr
        ds = json.loads(r.stdout)["deepspeed"]
        assert ds["python"] == sys.executable
        assert ds["installed"] is True, ds
        assert ds["switch_on"] is on, ds
        assert ds["detail"].startswith(importlib.metadata.version("deepspeed")), ds
    text = run("info", env={"DEEPIO_PYTHON": sys.executable, "DEEPIO_DEEPSPEED": "0"}).stdout
    assert "DeepSpeed (for " in text and "switch off" in text
    missing = run("info", "--json", env={"DEEPIO_PYTHON": "/nonexistent/python3"})
    assert missing.returncode == 0
    assert "not importable" in json.loads(missing.stdout)["deepspeed"]["detail"]


def test_cuda_and_cpu_accelerators_hand_out_deepios_builders(tmp_path):
    """The CUDA accelerator (DeepSpeed's default on GPU machines) is switched like the CPU
    one; its class is imported and asked without a GPU (the switch answers before CUDA)."""
    code = """
        import json
        import deepio.deepspeed
        deepio.deepspeed.install()
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
        out = {}
        for cls in (CUDA_Accelerator, CPU_Accelerator):
            acc = cls.__new__(cls)   # no __init__: it would look for a device
            names = ("AsyncIOBuilder", "GDSBuilder", "PinMemoryBuilder", "UtilsBuilder")
            out[cls.__name__] = [acc.get_op_builder(n).__module__ for n in names]
            out[cls.__name__].append(type(acc.create_op_builder("GDSBuilder")).__module__)
        print(json.dumps(out))
    """
    report = _last_json(_python(code, _env(None), tmp_path))
    assert report == {name: ["deepio.compat"] * 5 for name in ("CUDA_Accelerator", "CPU_Accelerator")}
