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
import time
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
pytestmark = [
    pytest.mark.skipif(CLI is None, reason="the deepio command is not built (set DEEPIO_CLI)"),
    # fio ceilings and vm.nr_hugepages are the machine's: no other test runs meanwhile (scripts/test.sh).
    pytest.mark.machine,
]


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


# ---------------------------------------------------------------------------------- comparison mode

COMPARE_KEYS = {
    "schema",
    "version",
    "folder",
    "filesystem",
    "direct_io",
    "size_bytes",
    "size_reason",
    "runs",
    "page_locked",
    "memlock_limit_bytes",
    "config",
    "ceiling",
    "results",
    "gpu",  # added by issue 11 (GPU rows)
    "device",  # added by issue 15 (the queue limits that make a ceiling segment-friendly or not)
    "folders",
    "same_device_note",
}  # added by issue 27 (several folders at once)
RESULT_KEYS = {
    "op",
    "engine",
    "label",
    "gib_per_sec",
    "samples_gib_per_sec",
    "speedup_vs_naive",
    "percent_of_ceiling",
    "cpu_sec_per_gib",
    "io_path",
    "verified",
    "flagged",
    "flag",  # added by issue 11 (figures above the disk ceiling)
    "vs_ceiling",  # added by issue 25 (below / at_ceiling / above / none)
    "bytes",
    "folder_bytes",
}  # added by issue 27 (bytes per run, and per folder)
# Issue 15: "write" (a fresh file) and "overwrite" (in place) are separate rows; the ceiling says
# what its buffers were; percent_of_ceiling is null for a figure above the ceiling (flagged).
# Issue 25: only a figure beyond every ceiling sample by more than the noise margin is flagged.
CEILING_KEYS = {
    "source",
    "description",
    "fio_write_command",
    "fio_read_command",
    "note",
    "buffers",
    "buffers_detail",
    "hugepages_reserved",
    "noise_floor",
    "preallocated",
    "deepio_preallocated_writes",
}
OPS = ("write", "overwrite", "read")
ABOVE = "above every ceiling sample ("


def nr_hugepages() -> str:
    return Path("/proc/sys/vm/nr_hugepages").read_text().strip()


def assert_hugepages_back(before: str) -> None:
    """The huge pages a run added to vm.nr_hugepages are gone. Polled for a while: another test
    process (the C++ tools tests under `ctest -j`) may hold a loan of its own for a moment."""
    deadline = time.monotonic() + 30
    while nr_hugepages() != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert nr_hugepages() == before


def splits_a_1m_request(device: dict) -> bool:
    """The device takes fewer segments per request than a 1 MiB request has 4 KiB pages."""
    return 0 < device["max_segments"] < 2**20 // os.sysconf("SC_PAGESIZE")


def check_rows(j: dict, runs: int) -> None:
    assert [(x["op"], x["engine"]) for x in j["results"]] == [
        (op, e) for op in OPS for e in ("deepio", "naive", "ceiling")
    ]
    for x in j["results"]:
        assert set(x) == RESULT_KEYS
        assert len(x["samples_gib_per_sec"]) == runs and x["gib_per_sec"] > 0
        if x["engine"] == "ceiling":
            assert x["percent_of_ceiling"] == pytest.approx(100.0) and not x["flagged"]
            assert x["vs_ceiling"] == "at_ceiling", x
        elif x["flagged"]:  # beyond the ceiling: a measurement problem, never a percentage over 100
            assert x["percent_of_ceiling"] is None and x["vs_ceiling"] == "above", x
            assert x["flag"].startswith(ABOVE) or "4 KiB-page buffers" in x["flag"], x
        elif x["vs_ceiling"] == "below":  # under every ceiling run
            assert 0 < x["percent_of_ceiling"] < 100.0 and x["flag"] == "", x
        else:  # within the ceiling's runs, or above them by no more than the margin
            assert x["vs_ceiling"] == "at_ceiling" and x["flag"] == "", x
            assert x["percent_of_ceiling"] > 0, x
        if x["engine"] == "naive":
            assert x["speedup_vs_naive"] == pytest.approx(1.0)
        if x["op"] == "read" and x["engine"] != "ceiling":
            assert x["verified"] is True
    naive = {x["op"]: x["io_path"] for x in j["results"] if x["engine"] == "naive"}
    assert naive["overwrite"].endswith("in place") and not naive["write"].endswith("in place")


@pytest.mark.parametrize("fio", [False, True])
def test_compare_json_schema(tmp_dir, fio):
    if fio and shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    args = ["bench", "--folder", str(tmp_dir), "--size", "4M", "--runs", "2", "--json"]
    if not fio:
        args.append("--no_fio")
    before = nr_hugepages()
    r = run(*args)
    assert r.returncode == 0, r.stderr
    assert_hugepages_back(before)  # huge pages reserved for fio went back
    j = json.loads(r.stdout)
    assert set(j) == COMPARE_KEYS
    assert j["schema"] == "deepio.bench.compare/3" and j["size_bytes"] == 4 * 2**20 and j["runs"] == 2
    check_rows(j, 2)
    c = j["ceiling"]
    assert set(c) == CEILING_KEYS
    assert c["buffers"] in ("hugetlb", "thp", "pages") and c["buffers_detail"]
    assert 0.0 <= j["config"]["buffers_thp_fraction"] <= 1.0
    if fio and j["direct_io"]["supported"] and c["source"] == "fio":
        assert "--output-format=json" in c["fio_read_command"]
        # fio's ordinary buffers only where the device does not split their requests.
        if splits_a_1m_request(j["device"]):
            assert c["buffers"] == "hugetlb" and "--mem=shmhuge" in c["fio_read_command"], c
        if c["buffers"] == "hugetlb":
            assert "--mem=shmhuge" in c["fio_write_command"] and "hugetlb pages" in c["buffers_detail"]
    if fio and c["source"] == "raw":  # no segment-friendly fio (or it failed mid-run): the note says why
        assert any(w in c["note"] for w in ("fio not used", "fio skipped", "raw O_DIRECT loop instead")), c
    if not fio:
        assert c["source"] == "raw" and c["buffers"] in ("thp", "pages")
        assert c["buffers_detail"].startswith("deepio's buffers (") and "transparent huge pages" in c["buffers_detail"]
    # The temporary folder is gone.
    assert not Path(j["folder"]).exists()
    # Issue 27: one folder is a list of one, without a note; every row moved --size there.
    assert [f["folder"] for f in j["folders"]] == [j["folder"]] and j["same_device_note"] == ""
    assert j["folders"][0]["parent"] == str(tmp_dir)
    assert all(x["bytes"] == 4 * 2**20 and x["folder_bytes"] == [4 * 2**20] for x in j["results"])


TABLE_ROW = re.compile(
    r"^(write|overwrite|read)\s+(deepio|naive 1-thread buffered copy|raw O_DIRECT \(ceiling\)|"
    r"fio \(device ceiling\))\s+([\d.]+)\s+([\d.]+)x\s+(\d+%|above|at ceiling)\s+([\d.]+)  (.*)$",
    re.M,
)


def test_compare_text_table(tmp_dir):
    r = run("bench", "--folder", str(tmp_dir), "--size", "2M", "--runs", "1", "--no_fio")
    assert r.returncode == 0, r.stderr
    assert "vs naive" in r.stdout and "vs ceiling" in r.stdout and "CPU s/GiB" in r.stdout
    rows = TABLE_ROW.findall(r.stdout)
    assert [(op, engine.split()[0]) for op, engine, *_ in rows] == [
        (op, e) for op in OPS for e in ("deepio", "naive", "raw")
    ], r.stdout
    for op, engine, _gib, _, pct, _, path in rows:
        if pct == "above":
            assert path.startswith("FLAGGED: "), path
        elif pct != "at ceiling":
            assert int(pct[:-1]) <= 100, (op, engine, pct)  # never a percentage over 100
    assert re.search(r"^ceiling buffers: (thp|pages) \(deepio's buffers \(", r.stdout, re.M), r.stdout
    assert " write (fresh file): deepio " in r.stdout and " overwrite (in place): deepio " in r.stdout
    assert "data verified" in r.stdout
    assert list(tmp_dir.iterdir()) == []


# ---------------------------------------------------------------------------------- several folders
# Issue 27: `--folder A --folder B ...` measures every folder at once; each row reports the
# aggregate, per-folder bytes in JSON. The folders here share one disk (the note says so).


def some_folders(tmp_dir: Path, n: int) -> list[Path]:
    folders = [tmp_dir / f"drive{i}" for i in range(n)]
    for f in folders:
        f.mkdir()
    return folders


@pytest.mark.parametrize("fio", [False, True])
def test_compare_several_folders_json(tmp_dir, fio):
    if fio and shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    folders = some_folders(tmp_dir, 3)
    args = ["bench", "--size", "2M", "--runs", "1", "--json"]
    for f in folders:
        args += ["--folder", str(f)]
    if not fio:
        args.append("--no_fio")
    before = nr_hugepages()
    r = run(*args)
    assert r.returncode == 0, r.stderr
    assert_hugepages_back(before)
    j = json.loads(r.stdout)
    assert set(j) == COMPARE_KEYS
    size = 2 * 2**20
    assert j["size_bytes"] == size
    assert [f["parent"] for f in j["folders"]] == [str(f) for f in folders]
    assert [Path(f["folder"]).parent for f in j["folders"]] == folders and j["folder"] == j["folders"][0]["folder"]
    assert all(f["free_bytes"] > 0 for f in j["folders"])
    assert "same file system" in j["same_device_note"] and "not a sum of drives" in j["same_device_note"]
    check_rows(j, 1)
    for x in j["results"]:
        assert x["folder_bytes"] == [size] * 3, x
        assert x["bytes"] == sum(x["folder_bytes"]) == 3 * size, x
        if x["op"] == "read" and x["engine"] != "ceiling":
            assert x["verified"] is True, x  # every folder's file read back as written
    c = j["ceiling"]
    if c["source"] == "fio":
        assert fio
        for cmd in (c["fio_write_command"], c["fio_read_command"]):
            names = re.findall(r"--name=(\S+)", cmd)
            assert names == [f"deepio-ceiling-{i}" for i in range(3)], cmd  # one job per folder, one run
            assert "--group_reporting" not in cmd
            for f in folders:
                assert f"--filename={f}/deepio-bench-" in cmd, cmd
        assert "3 folders at once" in c["description"]
    else:
        assert not fio or c["note"], c
        assert "in each of 3 folders at once" in c["description"]
    # Every temporary folder and file is gone.
    for f in folders:
        assert list(f.iterdir()) == [], f


def test_compare_several_folders_text_and_keep(tmp_dir):
    folders = some_folders(tmp_dir, 2)
    r = run(
        "bench",
        "--folder",
        str(folders[0]),
        "--folder",
        str(folders[1]),
        "--size",
        "1M",
        "--runs",
        "1",
        "--no_fio",
        "--keep",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("deepio ") and " bench: 1 MiB per file in each of 2 folders, at once\n" in r.stdout
    assert "folders: 2 at once, 1 MiB per folder per run; every figure is the aggregate" in r.stdout, r.stdout
    assert re.search(r"^note: '.*drive0' and '.*drive1' are on the same file system", r.stdout, re.M), r.stdout
    rows = TABLE_ROW.findall(r.stdout)
    assert len(rows) == 9, r.stdout
    # --keep: each folder keeps its temporary folder with the files of that folder's rows.
    for f in folders:
        kept = list(f.iterdir())
        assert len(kept) == 1 and kept[0].name.startswith("deepio-bench-"), kept
        assert {p.name for p in kept[0].iterdir()} >= {"deepio.bin", "naive.bin", "ceiling.bin"}
        assert (kept[0] / "deepio.bin").stat().st_size == 2**20


def test_compare_one_folder_text_unchanged(tmp_dir):
    r = run("bench", "--folder", str(tmp_dir), "--size", "1M", "--runs", "1", "--no_fio")
    assert r.returncode == 0, r.stderr
    assert "folders:" not in r.stdout and "note:" not in r.stdout
    assert r.stdout.startswith("deepio ") and f" per file in {tmp_dir}/deepio-bench-" in r.stdout.splitlines()[0]


def test_several_folders_refused_where_they_cannot_be(tmp_dir):
    a, b = some_folders(tmp_dir, 2)
    bad(
        "bench",
        "--folder",
        str(a),
        "--folder",
        str(b),
        "--folder",
        f"{a}/.",
        "--size",
        "1M",
        expect=[f"--folder: folder '{a}/.' is given twice (the same folder as '{a}')"],
    )
    bad(
        "bench",
        "--folder",
        str(a),
        "--folder",
        str(tmp_dir / "absent"),
        "--size",
        "1M",
        expect=[f"folder '{tmp_dir / 'absent'}' does not exist"],
    )
    bad(
        "bench",
        "--folder",
        str(a),
        "--folder",
        str(b),
        "--io_size",
        "1M",
        expect=["--folder given 2 times: in ds_io mode (--io_size) give one --folder", "--folder_to_device_mapping"],
    )
    bad(
        "bench",
        "--folder",
        str(a),
        "--folder",
        str(b),
        "--size",
        "1M",
        "--gpu",
        expect=["--gpu measures one folder: give one --folder"],
    )
    bad("bench", "--folder", f"{a},{b}", "--size", "1M", expect=["for several folders, repeat --folder"])
    bad("tune", "--folder", str(a), "--folder", str(a), expect=["--folder: folder '" + str(a) + "' is given twice"])
    bad("tune", "--nvme_dir", str(a), str(b), str(a), expect=["--nvme_dir: folder '" + str(a) + "' is given twice"])
    assert list(a.iterdir()) == [] and list(b.iterdir()) == []


def sweep_space(tmp_dir, **values) -> str:
    """A --sweep_config file: one block size (256K), queue depths 4 and 8, one worker,
    overlapped and batched submissions, with `values` replacing any of them."""
    space = tmp_dir / "space.json"
    axes = {"block_size": ["256K"], "queue_depth": [4, 8], "io_parallel": [1]}
    axes |= {"sequential_requests": [False], "single_submit": [False]}
    space.write_text(json.dumps(axes | values))
    return str(space)


def test_tune_several_folders_at_once(tmp_dir):
    space = sweep_space(tmp_dir)
    a, b = some_folders(tmp_dir, 2)
    args = ["tune", "--folder", str(a), "--folder", str(b), "--io_size", "1M", "--sweep_config", str(space)]
    r = run(*args, "--exhaustive", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["folders"] == [str(a), str(b)] and "not a sum of drives" in j["same_device_note"]
    assert j["configurations_measured"] == 2 and j["ds_io_runs"] == 4
    check_aio_section({"aio": j["aio"]})
    r = run(*args, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"2 folders at once (aggregate): {a} {b}" in r.stdout and "note: " in r.stdout, r.stdout
    assert list(a.iterdir()) == [] and list(b.iterdir()) == []


def slow_fio(folder: Path) -> Path:
    """A stand-in for fio on PATH whose every job reports 4 MiB in 100 s: a ceiling that every
    real figure is above. No real device can be made that slow on demand, and this is the case
    the flag exists for (a ceiling measured wrong)."""
    report = {
        "fio version": "fio-3.33",
        "jobs": [
            {
                "jobname": "deepio-ceiling",
                "usr_cpu": 1.0,
                "sys_cpu": 1.0,
                "job_runtime": 100000,
                "read": {"io_bytes": 4 * 2**20, "runtime": 100000},
                "write": {"io_bytes": 4 * 2**20, "runtime": 100000},
            }
        ],
    }
    (folder / "report.json").write_text(json.dumps(report))
    fio = folder / "fio"
    fio.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo fio-3.33; exit 0; }}\n'
        f"echo \"$@\" >> '{folder}/calls'\ncat '{folder}/report.json'\n"
    )
    fio.chmod(0o755)
    return fio


@pytest.mark.parametrize("reserve", [True, False])
def test_figures_above_the_ceiling_are_flagged(tmp_dir, reserve):
    bin_dir, work = tmp_dir / "bin", tmp_dir / "work"
    bin_dir.mkdir()
    work.mkdir()
    slow_fio(bin_dir)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    args = ["bench", "--folder", str(work), "--size", "4M", "--runs", "2"]
    if not reserve:
        args.append("--no_hugepage_reserve")
    before = nr_hugepages()
    r = run(*args, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert_hugepages_back(before)
    j = json.loads(r.stdout)
    c = j["ceiling"]
    if c["source"] == "raw":
        # Without huge pages for fio, on a device that splits its 4 KiB-page requests, the ceiling
        # is the raw loop on deepio's own buffers, and the note says why.
        assert not reserve or os.geteuid() != 0, c
        assert splits_a_1m_request(j["device"]) and "fio not used: its 4 KiB-page buffers" in c["note"], c
        assert c["buffers"] in ("thp", "pages")
        assert not (bin_dir / "calls").exists()
        return
    assert c["buffers"] in ("hugetlb", "pages"), c
    if c["buffers"] == "hugetlb":
        assert "--mem=shmhuge" in (bin_dir / "calls").read_text()
    rows = {(x["op"], x["engine"]): x for x in j["results"]}
    for op in OPS:
        assert rows[(op, "ceiling")]["gib_per_sec"] == pytest.approx(4 / 1024 / 100)
        for engine in ("deepio", "naive"):
            x = rows[(op, engine)]
            assert x["flagged"] and x["flag"].startswith(ABOVE) and x["percent_of_ceiling"] is None, x
            assert x["gib_per_sec"] > 1.0 / 1024  # the figure itself is kept
    text = run(*args, env=env)
    assert text.returncode == 0, text.stderr
    assert_hugepages_back(before)
    rows = TABLE_ROW.findall(text.stdout)
    assert {(op, pct) for op, engine, _, _, pct, _, _ in rows if not engine.startswith("fio")} == {
        (op, "above") for op in OPS
    }, text.stdout
    assert " read: deepio " in text.stdout and "x the naive copy, FLAGGED: " + ABOVE in text.stdout
    assert all(int(p) <= 100 for p in re.findall(r"(\d+)%", text.stdout)), text.stdout  # no 177%, no 369%


# ---------------------------------------------------------------------------------- tune

# DeepSpeed's runtime/swap_tensor/aio_config.py: the keys of the "aio" section and their types.
AIO_KEYS = {
    "block_size": int,
    "queue_depth": int,
    "intra_op_parallelism": int,
    "single_submit": bool,
    "overlap_events": bool,
    "use_gds": bool,
}


def check_aio_section(doc: dict) -> dict:
    assert set(doc) == {"aio"}
    aio = doc["aio"]
    assert set(aio) == set(AIO_KEYS)
    for k, t in AIO_KEYS.items():
        assert type(aio[k]) is t, (k, aio[k])  # real booleans, not "true" strings
    assert aio["block_size"] > 0 and aio["queue_depth"] > 0 and aio["intra_op_parallelism"] > 0
    return aio


SMALL_SPACE = {
    "block_size": ["256K", "1M"],
    "queue_depth": [4, 16],
    "io_parallel": [1, 2],
    "sequential_requests": [False, True],
    "single_submit": [False],
}


@pytest.mark.parametrize("mode", ["search", "exhaustive"])
def test_tune_output_is_deepspeed_aio_section(tmp_dir, mode):
    space = tmp_dir / "space.json"
    space.write_text(json.dumps(SMALL_SPACE))
    work = tmp_dir / "nvme"
    work.mkdir()
    out, chart = tmp_dir / "aio.json", tmp_dir / "tune.svg"
    args = [
        "tune",
        "--nvme_dir",
        str(work),
        "--io_size",
        "2M",
        "--sweep_config",
        str(space),
        "--output",
        str(out),
        "--chart",
        str(chart),
    ]
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
    space = sweep_space(tmp_dir, single_submit=[False, True])
    r = run(
        "tune",
        "--nvme_dir",
        str(tmp_dir),
        "--io_size",
        "1M",
        "--sweep_config",
        str(space),
        "--exhaustive",
        "--json",
        "--no_write",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["schema"] == "deepio.tune/1" and j["mode"] == "exhaustive"
    assert j["space_size"] == 4 and j["configurations_measured"] == 4 and j["ds_io_runs"] == 4
    assert all(m["write_gib_per_sec"] is None and m["read_gib_per_sec"] > 0 for m in j["measurements"])
    check_aio_section({"aio": j["aio"]})


def test_tune_log_dir_matches_ds_nvme_tune(tmp_dir):
    space = tmp_dir / "space.json"
    space.write_text(
        json.dumps(
            {
                "block_size": ["1M"],
                "queue_depth": [8],
                "io_parallel": [2],
                "sequential_requests": [False],
                "single_submit": [False],
            }
        )
    )
    logs = tmp_dir / "logs"
    r = run(
        "tune",
        "--nvme_dir",
        str(tmp_dir),
        "--io_size",
        "2M",
        "--sweep_config",
        str(space),
        "--exhaustive",
        "--log_dir",
        str(logs),
    )
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
