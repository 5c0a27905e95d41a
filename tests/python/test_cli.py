"""Smoke tests of the `deepio` command (bench, tune, info) at tiny sizes.

Which binary: $DEEPIO_CLI (CTest sets it to the one it built), else `deepio` on PATH (what
`pip install .` installs), else the newest build/*/tools/deepio of this checkout.
Self-contained (CTest runs it with --noconftest, without the Python package): files go to a
fresh folder under $DEEPIO_TEST_DIR, else /var/tmp (a disk, not tmpfs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _find_cli() -> str | None:
    env = os.environ.get("DEEPIO_CLI")
    if env:
        return env
    on_path = shutil.which("deepio")
    if on_path:
        return on_path
    built = sorted(REPO.glob("build/*/tools/deepio"), key=lambda p: p.stat().st_mtime, reverse=True)
    return str(built[0]) if built else None


CLI = _find_cli()
pytestmark = pytest.mark.skipif(CLI is None, reason="the deepio command is not built (set DEEPIO_CLI)")

@pytest.fixture
def tmp_dir():
    base = Path(os.environ.get("DEEPIO_TEST_DIR") or "/var/tmp")
    if not base.is_dir():
        base = Path(tempfile.gettempdir())
    d = Path(tempfile.mkdtemp(prefix="deepio-cli-test-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


DS_IO_LINE = re.compile(r"^(Task|E2E) (Read|Write) (Latency|Speed) = (\S+) (sec|GB/sec)$")


def run(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


def ds_io_lines(stdout: str) -> dict:
    """{('E2E', 'Read', 'Speed'): float, ...} from ds_io's four result lines."""
    out = {}
    for line in stdout.splitlines():
        m = DS_IO_LINE.match(line)
        if m:
            kind, op, what, value, unit = m.groups()
            assert unit == ("sec" if what == "Latency" else "GB/sec"), line
            out[(kind, op, what)] = float(value)  # Python's float repr parses back
    return out


# ---------------------------------------------------------------------------------- basics


def test_version_and_help():
    r = run("--version")
    assert r.returncode == 0 and re.match(r"^deepio \d+\.\d+\.\d+$", r.stdout.strip()), r
    for cmd in ("bench", "tune", "info"):
        r = run(cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"usage: deepio {cmd}"), r.stdout
    assert run("--help").returncode == 0
    r = run()
    assert r.returncode == 2 and "usage: deepio" in r.stderr


def test_info_text_and_json(tmp_dir):
    r = run("info", "--folder", str(tmp_dir))
    assert r.returncode == 0, r.stderr
    for needle in ("async_io", "gds", "backends (auto picks", "RLIMIT_MEMLOCK", "CUDA driver", "cuFile", "MPI"):
        assert needle in r.stdout, needle
    r = run("info", "--folder", str(tmp_dir), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["schema"] == "deepio.info/1"
    assert {b["name"] for b in j["backends"]} == {"io_uring", "libaio", "threads"}
    assert j["auto_backend"] in ("io_uring", "libaio", "threads")
    assert isinstance(j["folder"]["direct_io"], bool) and j["folder"]["offset_align"] >= 0
    assert isinstance(j["cuda"]["found"], bool) and isinstance(j["cufile"]["found"], bool)
    assert isinstance(j["mpi"]["plugin"], bool)
    assert isinstance(j["memlock_limit_bytes"], int)


# ---------------------------------------------------------------------------------- ds_io mode


@pytest.mark.parametrize("op", ["write", "read"])
def test_ds_io_lines_parse(tmp_dir, op):
    args = ["bench", "--folder", str(tmp_dir), "--io_size", "1M", "--block_size", "256K", "--queue_depth", "4",
            "--loops", "2"]
    if op == "read":
        args += ["--read", "--validate"]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    assert "Successful validation of command line arguments" in r.stdout
    assert "Configuring 1 process to folder mapping" in r.stdout
    assert f"[0]: process 0 <----> {tmp_dir}" in r.stdout
    Op = op.capitalize()
    vals = ds_io_lines(r.stdout)
    assert set(vals) == {(k, Op, w) for k in ("Task", "E2E") for w in ("Latency", "Speed")}, r.stdout
    assert all(v > 0 for v in vals.values()), vals
    # Speed = bytes / latency / 2^30 with bytes = io_size x loops.
    assert vals[("E2E", Op, "Speed")] == pytest.approx(2 * 2**20 / vals[("E2E", Op, "Latency")] / 2**30, rel=1e-6)
    assert (tmp_dir / f"_aio_{op}_1048576.pt.0_0").exists()


def test_ds_io_multi_process_and_mapping(tmp_dir):
    a, b = tmp_dir / "a", tmp_dir / "b"
    a.mkdir()
    b.mkdir()
    r = run("bench", "--folder", str(a), "--io_size", "512K", "--multi_process", "2", "--loops", "1", "--read")
    assert r.returncode == 0, r.stderr
    assert "Configuring 2 process to folder mapping" in r.stdout
    assert len(ds_io_lines(r.stdout)) == 4
    assert (a / "_aio_read_524288.pt.1_0").exists()
    r = run("bench", "--folder_to_device_mapping", f"{a}:0", f"{b}:1", "--io_size", "512K", "--loops", "1",
            "--different_file_each_iteration", "--warmup_loops", "0")
    assert r.returncode == 0, r.stderr
    assert f"[1]: process 1 <----> {b}" in r.stdout
    assert (b / "_aio_write_524288.pt.1_0").exists()


DS_IO_JSON_KEYS = {"schema", "version", "op", "io_size", "processes", "mpi", "loops", "warmup_loops", "config",
                   "task_latency_sec", "task_gib_per_sec", "e2e_latency_sec", "e2e_gib_per_sec", "bytes",
                   "cpu_sec_per_gib", "io", "processes_detail",
                   "gpu"}  # added by issue 11 (bench --gpu); tests/python/test_gpu_cli.py checks it


def test_ds_io_json_schema(tmp_dir):
    r = run("bench", "--folder", str(tmp_dir), "--io_size", "1M", "--loops", "1", "--json", "--io_parallel", "2",
            "--single_submit", "--sequential_requests")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert set(j) == DS_IO_JSON_KEYS
    assert j["schema"] == "deepio.bench.ds_io/1" and j["op"] == "write" and j["bytes"] == 2**20
    assert j["config"] == {"block_size": 2**20, "queue_depth": 32, "single_submit": True, "overlap_events": False,
                           "intra_op_parallelism": 2, "backend": j["config"]["backend"], "direct_io": "auto"}
    assert j["config"]["backend"] in ("io_uring", "libaio", "threads")
    assert set(j["io"]) == {"bytes_direct", "bytes_bounced", "bytes_buffered", "direct_refused", "summary"}
    assert j["io"]["bytes_direct"] + j["io"]["bytes_bounced"] + j["io"]["bytes_buffered"] >= 2**20


# ---------------------------------------------------------------------------------- comparison mode

COMPARE_KEYS = {"schema", "version", "folder", "filesystem", "direct_io", "size_bytes", "size_reason", "runs",
                "page_locked", "memlock_limit_bytes", "config", "ceiling", "results",
                "gpu"}  # added by issue 11 (GPU rows)
RESULT_KEYS = {"op", "engine", "label", "gib_per_sec", "samples_gib_per_sec", "speedup_vs_naive",
               "percent_of_ceiling", "cpu_sec_per_gib", "io_path", "verified",
               "flagged", "flag"}  # added by issue 11 (figures above the disk ceiling)


@pytest.mark.parametrize("fio", [False, True])
def test_compare_json_schema(tmp_dir, fio):
    if fio and shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    args = ["bench", "--folder", str(tmp_dir), "--size", "4M", "--runs", "2", "--json"]
    if not fio:
        args.append("--no_fio")
    r = run(*args)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert set(j) == COMPARE_KEYS
    assert j["schema"] == "deepio.bench.compare/1" and j["size_bytes"] == 4 * 2**20 and j["runs"] == 2
    assert [(x["op"], x["engine"]) for x in j["results"]] == [
        (op, e) for op in ("write", "read") for e in ("deepio", "naive", "ceiling")]
    for x in j["results"]:
        assert set(x) == RESULT_KEYS
        assert len(x["samples_gib_per_sec"]) == 2 and x["gib_per_sec"] > 0
        if x["engine"] == "ceiling":
            assert x["percent_of_ceiling"] == pytest.approx(100.0)
        if x["engine"] == "naive":
            assert x["speedup_vs_naive"] == pytest.approx(1.0)
        if x["op"] == "read" and x["engine"] != "ceiling":
            assert x["verified"] is True
    src = j["ceiling"]["source"]
    if fio and j["direct_io"]["supported"]:
        assert src == "fio" and "--output-format=json" in j["ceiling"]["fio_read_command"]
    if not fio:
        assert src == "raw"
    # The temporary folder is gone.
    assert not Path(j["folder"]).exists()


def test_compare_text_table(tmp_dir):
    r = run("bench", "--folder", str(tmp_dir), "--size", "2M", "--runs", "1", "--no_fio")
    assert r.returncode == 0, r.stderr
    assert "vs naive" in r.stdout and "% ceiling" in r.stdout and "CPU s/GiB" in r.stdout
    assert re.search(r"^read\s+deepio\s+[\d.]+\s+[\d.]+x\s+\d+%", r.stdout, re.M), r.stdout
    assert "data verified" in r.stdout
    assert list(tmp_dir.iterdir()) == []


# ---------------------------------------------------------------------------------- tune

# DeepSpeed's runtime/swap_tensor/aio_config.py: the keys of the "aio" section and their types.
AIO_KEYS = {"block_size": int, "queue_depth": int, "intra_op_parallelism": int, "single_submit": bool,
            "overlap_events": bool, "use_gds": bool}


def check_aio_section(doc: dict) -> dict:
    assert set(doc) == {"aio"}
    aio = doc["aio"]
    assert set(aio) == set(AIO_KEYS)
    for k, t in AIO_KEYS.items():
        assert type(aio[k]) is t, (k, aio[k])  # real booleans, not "true" strings
    assert aio["block_size"] > 0 and aio["queue_depth"] > 0 and aio["intra_op_parallelism"] > 0
    return aio


SMALL_SPACE = {"block_size": ["256K", "1M"], "queue_depth": [4, 16], "io_parallel": [1, 2],
               "sequential_requests": [False, True], "single_submit": [False]}


@pytest.mark.parametrize("mode", ["search", "exhaustive"])
def test_tune_output_is_deepspeed_aio_section(tmp_dir, mode):
    space = tmp_dir / "space.json"
    space.write_text(json.dumps(SMALL_SPACE))
    work = tmp_dir / "nvme"
    work.mkdir()
    out, chart = tmp_dir / "aio.json", tmp_dir / "tune.svg"
    args = ["tune", "--nvme_dir", str(work), "--io_size", "2M", "--sweep_config", str(space), "--output", str(out),
            "--chart", str(chart)]
    if mode == "exhaustive":
        args.append("--exhaustive")
    r = run(*args, timeout=120)
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.split("\n", 1)
    assert re.match(r"^Best performance \(GB/sec\): read = +[\d.]+, write = +[\d.]+$", first), first
    aio = check_aio_section(json.loads(rest[: rest.index("\n}\n") + 3]))
    assert aio == check_aio_section(json.loads(out.read_text()))
    assert aio["block_size"] in (256 * 1024, 2**20) and aio["queue_depth"] in (4, 16)
    assert aio["intra_op_parallelism"] in (1, 2) and aio["single_submit"] is False and aio["use_gds"] is False
    assert chart.read_text().startswith("<svg") and "</svg>" in chart.read_text()
    assert list(work.iterdir()) == []  # data files removed


def test_tune_json_counts(tmp_dir):
    space = tmp_dir / "space.json"
    space.write_text(json.dumps({"block_size": ["256K"], "queue_depth": [4, 8], "io_parallel": [1],
                                 "sequential_requests": [False], "single_submit": [False, True]}))
    r = run("tune", "--nvme_dir", str(tmp_dir), "--io_size", "1M", "--sweep_config", str(space), "--exhaustive",
            "--json", "--no_write")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["schema"] == "deepio.tune/1" and j["mode"] == "exhaustive"
    assert j["space_size"] == 4 and j["configurations_measured"] == 4 and j["ds_io_runs"] == 4
    assert all(m["write_gib_per_sec"] is None and m["read_gib_per_sec"] > 0 for m in j["measurements"])
    check_aio_section({"aio": j["aio"]})


def test_tune_log_dir_matches_ds_nvme_tune(tmp_dir):
    space = tmp_dir / "space.json"
    space.write_text(json.dumps({"block_size": ["1M"], "queue_depth": [8], "io_parallel": [2],
                                 "sequential_requests": [False], "single_submit": [False]}))
    logs = tmp_dir / "logs"
    r = run("tune", "--nvme_dir", str(tmp_dir), "--io_size", "2M", "--sweep_config", str(space), "--exhaustive",
            "--log_dir", str(logs))
    assert r.returncode == 0, r.stderr
    for op in ("read", "write"):
        f = logs / f"_aio_bench_{op}_logs" / f"{op}_block_overlap_ftd1_d8_bs1M_p2.txt"
        vals = ds_io_lines(f.read_text())
        assert ("E2E", op.capitalize(), "Speed") in vals


# ---------------------------------------------------------------------------------- bad input


def bad(*args: str, expect: list[str]) -> None:
    r = run(*args)
    assert r.returncode not in (0,) and r.returncode > 0, (args, r.returncode, r.stderr)  # no signal, no core
    assert "Traceback" not in r.stderr and "core dumped" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln]
    for needle in expect:
        assert any(needle in ln for ln in lines), (needle, r.stderr)
    for ln in lines:
        assert ln.startswith("deepio"), ln  # one line per problem, each naming the command


@pytest.fixture
def a_file(tmp_dir):
    p = tmp_dir / "plain_file"
    p.write_bytes(b"x")
    return p


def test_bad_inputs_bench(tmp_dir, a_file):
    d = str(tmp_dir)
    bad("bench", "--bogus", expect=["unknown flag --bogus"])
    bad("bench", "--folder", d, "--io_size", "M", expect=["--io_size: 'M' is not a size"])
    bad("bench", "--folder", d, "--io_size", "", expect=["is not a size"])
    bad("bench", "--folder", d, "--io_size", expect=["--io_size needs a value"])
    bad("bench", "--folder", "/nonexistent/deepio", "--io_size", "1M", expect=["does not exist"])
    bad("bench", "--folder", str(a_file), "--io_size", "1M", expect=["is not a folder"])
    bad("bench", "--folder", d, "--io_size", "1M", "--use_gds", expect=["--use_gds requires --gpu"])
    bad("bench", "--folder", d, "--io_size", "64K", "--block_size", "1M", expect=["smaller than --block_size"])
    bad("bench", "--folder", d, "--io_size", "1M", "--queue_depth", "abc", expect=["--queue_depth: 'abc'"])
    bad("bench", "--folder", d, "--io_size", "1M", "--queue_depth", "0", expect=["--queue_depth: must be at least 1"])
    bad("bench", "--folder", d, "--io_size", "1M", "--engine", "nope", expect=["--engine: 'nope'"])
    bad("bench", "--folder_to_device_mapping", "nocolon", "--io_size", "1M", expect=["is not FOLDER:DEVICE_ID"])
    bad("bench", "--io_size", "1M", expect=["exactly one of --folder or --folder_to_device_mapping"])
    bad("bench", "--read", expect=["--read is a ds_io-mode flag"])
    bad("bench", "--folder", d, "--size", "1M", "--block_size", "8M", expect=["--size (1M) is smaller"])
    bad("bench", "--backend", "floppy", "--folder", d, expect=["--backend: 'floppy'"])
    bad("frobnicate", expect=["unknown command 'frobnicate'"])


def test_bad_inputs_are_collected(tmp_dir):
    bad("bench", "--bogus", "--io_size", "M", "--folder", "/nonexistent/deepio", "--use_gds",
        expect=["unknown flag --bogus", "'M' is not a size", "does not exist", "--use_gds requires --gpu"])


def test_bad_inputs_tune(tmp_dir):
    d = str(tmp_dir)
    bad_json = tmp_dir / "bad.json"
    bad_json.write_text("{not json")
    unknown_key = tmp_dir / "unknown.json"
    unknown_key.write_text('{"loops": [1]}')
    bad("tune", "--nvme_dir", "/nonexistent/deepio", expect=["does not exist"])
    bad("tune", "--nvme_dir", d, "--gds", expect=["--gds requires --gpu"])
    bad("tune", "--nvme_dir", d, "--sweep_config", str(bad_json), expect=["is not a JSON object"])
    bad("tune", "--nvme_dir", d, "--sweep_config", str(unknown_key), expect=['unsupported key "loops"'])
    bad("tune", "--nvme_dir", d, "--io_size", "1M", expect=["smaller than the largest block_size"])
    bad("tune", "--nvme_dir", d, "--no_read", "--no_write", expect=["leave nothing to measure"])
    bad("tune", "--nvme_dir", expect=["--nvme_dir needs at least one value"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: no unwritable folder to test with")
def test_unwritable_folder(tmp_dir):
    ro = tmp_dir / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        bad("bench", "--folder", str(ro), "--io_size", "1M", expect=["is not writable"])
    finally:
        ro.chmod(0o700)


def test_unwritable_folder_proc():
    # Writable by mode bits for root, but no file can be created there.
    bad("bench", "--folder", "/proc", "--io_size", "1M", expect=["'/proc' is not writable"])
