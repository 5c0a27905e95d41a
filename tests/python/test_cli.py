"""Smoke tests of the `deepio` command at tiny sizes: version, help, info, the ds_io mode (its
result lines, several processes, JSON) and refused input (one line a problem, naming the
command). The comparison mode is in test_cli_compare.py, tune in test_cli_tune.py; what they
share (which binary, the marks, the folder) in cli_support.py.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from cli_support import MARKS, bad, ds_io_lines, fresh_folder, run

pytestmark = MARKS


@pytest.fixture
def tmp_dir():
    yield from fresh_folder()


# ---------------------------------------------------------------------------------- basics


@pytest.mark.wheel
def test_version_and_help():
    r = run("--version")
    assert r.returncode == 0 and re.match(r"^deepio \d+\.\d+\.\d+$", r.stdout.strip()), r
    for cmd in ("bench", "tune", "info"):
        r = run(cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"usage: deepio {cmd}"), r.stdout
        # Issue 25: one spelling per flag across bench and tune; the old ones work, unlisted.
        if cmd in ("bench", "tune"):
            assert re.search(r"^  --use_gds ", r.stdout, re.M), r.stdout
            assert not re.search(r"^  --gds\b", r.stdout, re.M), r.stdout
        if cmd == "bench":
            assert "--direct_io MODE" in r.stdout and "--direct MODE" not in r.stdout, r.stdout
    assert run("--help").returncode == 0
    r = run()
    assert r.returncode == 2 and "usage: deepio" in r.stderr


@pytest.mark.wheel
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
    args = [
        "bench",
        "--folder",
        str(tmp_dir),
        "--io_size",
        "1M",
        "--block_size",
        "256K",
        "--queue_depth",
        "4",
        "--loops",
        "2",
    ]
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
    r = run(
        "bench",
        "--folder_to_device_mapping",
        f"{a}:0",
        f"{b}:1",
        "--io_size",
        "512K",
        "--loops",
        "1",
        "--different_file_each_iteration",
        "--warmup_loops",
        "0",
    )
    assert r.returncode == 0, r.stderr
    assert f"[1]: process 1 <----> {b}" in r.stdout
    assert (b / "_aio_write_524288.pt.1_0").exists()


DS_IO_JSON_KEYS = {
    "schema",
    "version",
    "op",
    "io_size",
    "processes",
    "mpi",
    "loops",
    "warmup_loops",
    "config",
    "task_latency_sec",
    "task_gib_per_sec",
    "e2e_latency_sec",
    "e2e_gib_per_sec",
    "bytes",
    "cpu_sec_per_gib",
    "io",
    "processes_detail",
    "gpu",
}  # added by issue 11 (bench --gpu); tests/python/test_gpu_cli.py checks it


@pytest.mark.wheel
def test_ds_io_json_schema(tmp_dir):
    r = run(
        "bench",
        "--folder",
        str(tmp_dir),
        "--io_size",
        "1M",
        "--loops",
        "1",
        "--json",
        "--io_parallel",
        "2",
        "--single_submit",
        "--sequential_requests",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert set(j) == DS_IO_JSON_KEYS
    assert j["schema"] == "deepio.bench.ds_io/1" and j["op"] == "write" and j["bytes"] == 2**20
    assert j["config"] == {
        "block_size": 2**20,
        "queue_depth": 32,
        "single_submit": True,
        "overlap_events": False,
        "intra_op_parallelism": 2,
        "backend": j["config"]["backend"],
        "direct_io": "auto",
    }
    assert j["config"]["backend"] in ("io_uring", "libaio", "threads")
    assert set(j["io"]) == {"bytes_direct", "bytes_bounced", "bytes_buffered", "direct_refused", "summary"}
    assert j["io"]["bytes_direct"] + j["io"]["bytes_bounced"] + j["io"]["bytes_buffered"] >= 2**20


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
    # Issue 25: a new user who wanted a smaller main job is told which flag that is.
    bad("bench", "--io_size", "1M", expect=["--io_size selects ds_io mode, which needs --folder", "give --size 1M"])
    bad(
        "bench",
        "--io_size",
        "1M",
        "--folder",
        d,
        "--folder_to_device_mapping",
        f"{d}:0",
        expect=["exactly one of --folder or --folder_to_device_mapping"],
    )
    bad("bench", "--folder", d, "--io_size", "1M", "--direct_io", "maybe", expect=["--direct_io: 'maybe'"])
    bad("bench", "--folder", d, "--io_size", "1M", "--direct", "maybe", expect=["--direct_io: 'maybe'"])
    bad("bench", "--folder", d, "--io_size", "1M", "--gds", expect=["--use_gds requires --gpu"])
    bad("bench", "--read", expect=["--read is a ds_io-mode flag"])
    bad(
        "bench",
        "--folder",
        d,
        "--io_size",
        "1M",
        "--no_hugepage_reserve",
        expect=["--no_hugepage_reserve belongs to the comparison mode"],
    )
    bad("bench", "--folder", d, "--size", "1M", "--block_size", "8M", expect=["--size (1M) is smaller"])
    bad("bench", "--backend", "floppy", "--folder", d, expect=["--backend: 'floppy'"])
    bad("frobnicate", expect=["unknown command 'frobnicate'"])


def test_bad_inputs_are_collected(tmp_dir):
    bad(
        "bench",
        "--bogus",
        "--io_size",
        "M",
        "--folder",
        "/nonexistent/deepio",
        "--use_gds",
        expect=["unknown flag --bogus", "'M' is not a size", "does not exist", "--use_gds requires --gpu"],
    )


def test_bad_inputs_tune(tmp_dir):
    d = str(tmp_dir)
    bad_json = tmp_dir / "bad.json"
    bad_json.write_text("{not json")
    unknown_key = tmp_dir / "unknown.json"
    unknown_key.write_text('{"loops": [1]}')
    bad("tune", "--nvme_dir", "/nonexistent/deepio", expect=["does not exist"])
    # One spelling across bench and tune (--use_gds); ds_nvme_tune's --gds still works.
    bad("tune", "--nvme_dir", d, "--gds", expect=["--use_gds requires --gpu"])
    bad("tune", "--nvme_dir", d, "--use_gds", expect=["--use_gds requires --gpu"])
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
