"""The benchmark programs' own measuring: what they read from the system must be what they
print. bench/durable_one_file.py once read the disk's discard ticks as its flush count and
reported a write-back disk as one that never flushes (docs/benchmarks.md, "Durable writes on
this VM are bounded by the virtual disk's write-back cache")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, needs, needs_deepspeed, needs_torch

sys.path.insert(0, str(REPO / "bench"))
import benchutil  # noqa: E402


def _bench(program: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs bench/<program> with ``args``, this interpreter and this test run's import path."""
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / program), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        timeout=timeout,
        check=False,
    )


def test_disk_stat_counts_the_flush_an_fdatasync_sends(tmp_dir):
    """On a disk with a volatile cache, each fdatasync of a written file sends the disk one
    flush: the counter benchutil reads must grow by at least one per call, and the write
    counters by at least the request."""
    dev = benchutil.block_device(str(tmp_dir))
    if dev is None or "flushes" not in benchutil.disk_stat(dev):
        pytest.skip(f"{tmp_dir} is not on a block device whose statistics say how many flushes it did")
    if benchutil.write_cache(dev) != "write back":
        pytest.skip(f"{dev} has no volatile cache: the kernel sends it no flushes")
    path = tmp_dir / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        before = benchutil.disk_stat(dev)
        for i in range(3):
            os.pwrite(fd, b"x" * 8192, i * 8192)
            os.fdatasync(fd)
        after = benchutil.disk_stat(dev)
    finally:
        os.close(fd)
    assert after["flushes"] - before["flushes"] >= 3
    assert after["write_ios"] - before["write_ios"] >= 3
    assert after["write_sectors"] - before["write_sectors"] >= 3 * 8192 // 512


def test_durable_many_files_runs_and_counts_its_flushes(tmp_dir):
    """A small run of the durable split: every mode is printed, the mode without a sync sends
    no flush of its own and the fdatasync loop at least one per file (where the disk has a
    volatile cache and nothing else flushes it meanwhile: allow others' flushes on top)."""
    out = _bench(
        "durable_many_files.py",
        *["--dir", str(tmp_dir), "--count", "16", "--size", "8192", "--pairs", "1", "--probe-mib", "1"],
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line[:11].strip(): line.split() for line in out.stdout.splitlines()}
    for mode in ("no sync", "fsync=True", "fsync loop", "one syncfs"):
        assert mode in rows, out.stdout
    assert out.stdout.count("flush probe") == 3
    dev = benchutil.block_device(str(tmp_dir))
    if dev is not None and benchutil.write_cache(dev) == "write back":
        flushes = rows["fsync loop"][-3]  # "... flushes  ratio (range)"
        assert int(flushes) >= 16, out.stdout
    assert not list(tmp_dir.iterdir())  # the program leaves nothing behind


@needs_torch
@pytest.mark.slow
def test_save_load_saves_only_runs_its_variants_and_verifies(tmp_dir):
    """A small run of bench/save_load.py's save side with the variants (the all-staged save, the
    CRC settings): every method is timed, the saved file is checked against the state dict
    (the program exits non-zero on a mismatch), and the alignment line says what it found."""
    out = _bench("save_load.py", "--dir", str(tmp_dir), "--gib", "0.03", "--pairs", "1", "--saves-only", "--variants")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# verified" in out.stdout and "of the bytes page-aligned" in out.stdout
    table = out.stdout.split("(medians of 1)")[1]
    for name in ("deepio.save ", "deepio.save, all staged", "deepio.save, CRC whole", "torch.save+fsync"):
        assert name in table, out.stdout
    assert "torch.load" not in table  # --saves-only


def test_file_object_bench_runs_every_mode_and_verifies(tmp_dir):
    """A small run of bench/file_object.py: every mode is timed against its baseline, the bytes
    are verified after the rounds (the program exits non-zero on a mismatch), and the JSON row
    of each mode names it."""
    out = _bench(
        "file_object.py", "--dir", str(tmp_dir), "--file-size", "4M", "--count", "200", "--rounds", "2", "--json"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "O_DIRECT" in out.stdout.splitlines()[0]
    rows = json.loads(out.stdout.splitlines()[-1])
    assert [r["mode"] for r in rows] == ["path", "fd", "file", "path-sync", "file-sync", "file-ranges"]
    assert all(r["reads_per_s"] > 0 for r in rows)
    assert [r["vs"] for r in rows] == ["path", "path", "path", "path-sync", "path-sync", "path"]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install -y fio)")
def test_file_vs_fio_bench_runs_both_tools_and_verifies(tmp_dir):
    """A tiny run of bench/file_vs_fio.py: both tools timed at each block size, deepio's bytes
    verified (non-zero exit on a mismatch), the JSON rows carry both tools and the ratio."""
    out = _bench(
        "file_vs_fio.py", "--dir", str(tmp_dir), "--file-size", "8M", "--sizes", "4K,64K", "--bytes", "1M",
        "--bytes-4k", "256K", "--queue-depth", "4", "--rounds", "1", "--json",
    )  # fmt: skip
    if out.returncode != 0 and "O_DIRECT" in out.stderr and "refuse" in out.stderr:
        pytest.skip(f"{tmp_dir} refuses O_DIRECT")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fio" in out.stdout.splitlines()[0] and "queue depth 4" in out.stdout.splitlines()[0]
    report = json.loads(out.stdout.splitlines()[-1])
    assert [r["bs"] for r in report["rows"]] == [4096, 65536]
    for r in report["rows"]:
        assert r["fio"]["iops"] > 0 and r["deepio"]["iops"] > 0 and r["ratio"] > 0
    assert {s["tool"] for s in report["samples"]} == {"fio", "deepio"}
    assert not os.path.exists(tmp_dir / "file_vs_fio.bin"), "the test file was left behind"


@needs_torch
@pytest.mark.slow
def test_save_load_runs_only_the_methods_named(tmp_dir):
    """--method keeps the named methods only (a load without the saves that write its file
    gets that file written before the clock), and refuses a name it does not know."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return _bench("save_load.py", "--dir", str(tmp_dir), "--gib", "0.02", *args)

    out = run("--pairs", "2", "--method", "deepio.save", "--method", "torch.load")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split()[0] for line in out.stdout.split("(medians of 2)")[1].splitlines()[1:] if line[:1] != "#"]
    assert rows == ["deepio.save", "torch.load"], out.stdout
    bad = run("--pairs", "1", "--method", "deepio.sav")
    assert bad.returncode != 0 and "unknown methods" in bad.stderr


@needs_torch
@pytest.mark.slow
def test_dcp_bench_runs_every_method_and_verifies(tmp_dir):
    """A tiny run of bench/dcp_bench.py (2 gloo ranks): every save, load and async_save row is
    timed, each load is checked against the saved tensors (the program exits non-zero on a
    difference), the JSON carries the ratios the docs quote, and nothing is left behind."""
    out = _bench("dcp_bench.py", "--dir", str(tmp_dir), "--gib", "0.02", "--rounds", "1", "--json", timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# verified" in out.stdout and "page cache before each load:" in out.stdout
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ranks"] == 2 and doc["rounds"] == 1 and doc["cache"] in ("drop_caches", "fadvise")
    methods = doc["results"]
    for name in ("engine write", "deepio", "torch t=1", "torch t=2", "torch t=4", "torch t=8"):
        assert methods[name]["kind"] == "save", name
    for name in ("engine read", "engine read->dest", "deepio load", "torch load"):
        assert methods[name]["kind"] == "load", name
    for name in ("deepio async_save", "torch async_save"):
        assert methods[name]["kind"] == "async" and methods[name]["blocking_s"] > 0, name
    for m in methods.values():
        assert m["gib_per_s"] > 0 and m["cpu_s_per_gib"] >= 0 and len(m["wall_s"]) == 1
    assert doc["torch_best"] in methods
    for label in ("save deepio / torch best", "save deepio / torch fastest in each round", "load deepio / torch"):
        r = doc["ratios"][label]
        assert r["range"][0] <= r["median"] <= r["range"][1]
    assert "async_save blocking time deepio / torch" in doc["ratios"]
    assert not list(tmp_dir.iterdir())  # the program leaves nothing behind


@needs_torch
@pytest.mark.slow
def test_dcp_hf_bench_times_both_writers_and_readers_and_verifies(tmp_dir):
    """A tiny run of bench/dcp_hf_bench.py: each of the four methods timed in every round, the
    loads checked against the saved values (an assertion in the program), nothing left."""
    out = _bench("dcp_hf_bench.py", "--dir", str(tmp_dir), "--gib", "0.05", "--rounds", "2", "--files", "2", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(doc["samples"]) == {"save torch", "save deepio", "load torch", "load deepio"}
    for name, samples in doc["samples"].items():
        assert len(samples) == 2 and all(bw > 0 and cpu >= 0 for bw, cpu in samples), name
    assert not list(tmp_dir.iterdir())


@pytest.mark.slow
def test_writer_files_compares_two_packages(tmp_dir):
    """bench/writer_files.py --compare with the same package on both sides: both sides run
    every round and the ratio line is printed."""
    here = os.pathsep.join(sys.path)
    out = _bench(
        "writer_files.py", "--dir", str(tmp_dir), "--files", "3", "--mib", "1", "--rounds", "2", "--compare", here, here
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("old: ") and lines[1].startswith("new: ") and lines[2].startswith("new/old: files/s ")
    assert not list(tmp_dir.iterdir())


@needs_torch
@pytest.mark.slow
def test_dcp_bench_extra_dirs_spreads_and_verifies(tmp_dir):
    """--extra-dirs adds the "deepio N folders" save and load rows (deepio.dcp's extra_paths),
    verified like the others, and leaves nothing behind in any of the folders."""
    main, a, b = (tmp_dir / n for n in ("main", "a", "b"))
    for d in (main, a, b):
        d.mkdir()
    out = _bench(
        "dcp_bench.py", "--dir", str(main), "--extra-dirs", f"{a},{b}", "--gib", "0.02", "--rounds", "1",
        "--threads", "1", "--no-async", "--json", timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    methods = json.loads(out.stdout.strip().splitlines()[-1])["results"]
    assert methods["deepio 3 folders"]["kind"] == "save" and methods["deepio 3 folders"]["gib_per_s"] > 0
    assert methods["deepio load 3 folders"]["kind"] == "load" and methods["deepio load 3 folders"]["gib_per_s"] > 0
    assert not [p for d in (main, a, b) for p in d.iterdir()]


@needs_torch
@needs_deepspeed
def test_deepspeed_swap_folders_spreads_verifies_and_cleans_up(tmp_dir):
    """bench/deepspeed_swap_folders.py at a tiny size over two folders: DeepSpeed's swapper
    over one folder and over both, data checked, the files of the spread case over both
    folders, one row per measurement, nothing left behind."""
    a, b = tmp_dir / "a", tmp_dir / "b"
    for d in (a, b):
        d.mkdir()
    out = _bench(
        "deepspeed_swap_folders.py", "--folders", f"{a},{b}", "--tensors", "4", "--total-mib", "2", "--pairs", "1",
        "--json", timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 folders: 4 files over 2 folders" in out.stdout, out.stdout
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["folders"] == 2 and set(report["rows"]) == {"out fresh", "out overwrite", "in"}
    assert all(r["one_gib_s"] > 0 and r["n_gib_s"] > 0 for r in report["rows"].values())
    assert not [p for d in (a, b) for p in d.iterdir()]


@pytest.mark.skipif(os.geteuid() != 0, reason="bench/dcp_drive_timeline.py empties the page cache: needs root")
@pytest.mark.slow
def test_dcp_drive_timeline_reports_every_drives_file(tmp_dir):
    """bench/dcp_drive_timeline.py saves over three folders, loads (checked) and prints one
    line per data file with its folder and when its reading started and ended."""
    folders = [tmp_dir / n for n in ("main", "a", "b")]
    out = _bench("dcp_drive_timeline.py", *map(str, folders), "--mib", "64", timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("load 6") and "GiB/s" in lines[0], lines
    # The drive of each file: the folder under tmp_dir (an extra folder holds its files in a folder
    # of the save's own, docs/checkpoints.md).
    assert {Path(line.split()[0]).relative_to(tmp_dir).parts[0] for line in lines[1:]} == {"main", "a", "b"}, lines
    assert all(" -> " in line and "s on " in line for line in lines[1:]), lines


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("losetup") is None or not Path("/sys/fs/cgroup/blkio").is_dir(),
    reason="bench/slow_drive.py needs root, loop devices and cgroup v1 blkio throttling",
)
@pytest.mark.slow
def test_slow_drive_bench_times_the_fast_drive_while_the_slow_one_holds_its_work():
    """bench/slow_drive.py (issue 45): every case's fast read, get or put returned while the
    throttled drive still held all of its work (the program checks the bytes of both)."""
    out = _bench(
        "slow_drive.py", "--json", "--runs", "1", "--backends", "io_uring,threads", "--size-gib", "1", timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert {(r["backend"], r["case"]) for r in rows} == {(b, c) for b in ("io_uring", "threads") for c in "AB"} | {
        ("kv default", "C"),
        ("kv default", "D"),
    }
    assert all(r["slow_still_pending"] for r in rows), rows


def test_threads_backend_bench_reads_and_verifies(tmp_dir):
    """bench/threads_backend.py makes its file, reads it at random through the threads
    backend's pool (direct and cached) and checks every byte against the file."""
    path = tmp_dir / "tb.bin"
    for direct in ("auto", "off"):
        out = _bench("threads_backend.py", str(path), "--runs", "1", "--direct-io", direct, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.strip().splitlines()
        assert lines[0].startswith("# deepio") and "backend threads" in lines[0], lines
        assert [line.split()[0] for line in lines[1:]] == ["4096", "1048576"], lines
        assert all("reads/s" in line and "CPU" in line for line in lines[1:]), lines


# The ceiling rule's cases, as the C++ table tests state them: Reports.CeilingVerdictTable
# (tests/tools/test_reports.cpp) and GpuReports.GpuRowsFollowTheOneCeilingRule
# (tests/tools/test_gpu.cpp). benchutil.judge_against_ceiling mirrors tools/lib's rule, so the
# same figures must read the same. (what, figure, ceiling samples GiB/s, standing, percent of
# the median, start of the reason)
_ABOVE_2 = "above every ceiling sample (1.80-1.80 GiB/s) by more than their noise margin (1.98 GiB/s)"
CEILING_CASES = [
    ("within the spread", 2.55, [2.5, 2.6, 2.7], "at_ceiling", 100.0 * 2.55 / 2.6, ""),
    ("at the slowest sample", 2.5, [2.5, 2.6, 2.7], "at_ceiling", 100.0 * 2.5 / 2.6, ""),
    ("2% above the fastest", 1.02 * 1.87, [1.80, 1.84, 1.87], "at_ceiling", 100.0 * 1.02 * 1.87 / 1.84, ""),
    ("above the fastest by less than the spread", 3.19, [2.0, 2.6], "at_ceiling", 100.0 * 3.19 / 2.3, ""),
    ("above the fastest by a little more than the spread", 3.21, [2.0, 2.6], "above", 0, "above every ceiling"),
    (
        "clearly above every sample",
        3.43,
        [2.5, 2.6],
        "above",
        0,
        "above every ceiling sample (2.50-2.60 GiB/s) by more than their noise margin (2.86 GiB/s)",
    ),
    ("more than twice the ceiling", 3.37, [1.47, 1.49, 1.52], "above", 0, "above every ceiling sample (1.47-1.52"),
    ("below the ceiling", 2.0, [2.5, 2.6], "below", 100.0 * 2.0 / 2.55, ""),
    ("just below the slowest sample", 2.49, [2.5, 2.6], "below", 100.0 * 2.49 / 2.55, ""),
    ("one sample, figure equal", 1.8, [1.8], "at_ceiling", 100.0, ""),
    ("one sample, 9% above: the noise floor", 1.8 * 1.09, [1.8], "at_ceiling", 109.0, ""),
    ("one sample, 11% above", 1.8 * 1.11, [1.8], "above", 0, "above every ceiling sample (1.80-1.80"),
    ("one sample, below", 0.9, [1.8], "below", 50.0, ""),
    ("no ceiling measured", 9.0, [], "none", 0, ""),
    ("a failed ceiling: zero", 9.0, [0.0], "none", 0, ""),
    ("failed runs beside good ones are ignored", 2.0, [0.0, 2.5, 2.6], "below", 100.0 * 2.0 / 2.55, ""),
    ("nothing moved, against a ceiling", 0.0, [2.5], "below", 0.0, ""),
    # GpuReports.GpuRowsFollowTheOneCeilingRule's GPU rows.
    ("GPU: below the ceiling", 1.7, [1.8], "below", 100 * 1.7 / 1.8, ""),
    ("GPU: just above, in the noise", 1.95, [1.8], "at_ceiling", 100 * 1.95 / 1.8, ""),
    ("GPU: in the spread", 2.0, [1.8, 1.9, 2.1], "at_ceiling", 100 * 2.0 / 1.9, ""),
    # gpu_vs_host.py's old rule (ceiling x 1.1 = 2.2) flagged this; the margin is the spread.
    ("GPU: above median x 1.1", 2.4, [1.8, 2.0, 2.2], "at_ceiling", 100 * 2.4 / 2.0, ""),
    ("GPU: just beyond the noise margin", 2.0, [1.8], "above", 0, _ABOVE_2),
    ("GPU: well above the ceiling (issue 11)", 8.7, [1.8], "above", 0, _ABOVE_2),
    ("GPU: no ceiling measured", 8.7, [], "none", 0, ""),
    ("GPU: the ceiling failed (zero)", 8.7, [0.0], "none", 0, ""),
]


@pytest.mark.parametrize(
    "what,figure,samples,standing,percent,reason", CEILING_CASES, ids=[c[0] for c in CEILING_CASES]
)
def test_judge_against_ceiling_is_the_rule_of_deepio_bench(what, figure, samples, standing, percent, reason):
    v = benchutil.judge_against_ceiling(figure, samples)
    assert v.standing == standing
    assert v.percent == pytest.approx(percent, abs=1e-9)
    assert v.flagged == (standing == "above")
    assert v.reason.startswith(reason)
    assert (v.reason == "") == (reason == "")


def test_gpu_vs_host_help_runs_without_a_gpu():
    """The GPU benchmark's options parse here; its judgement of rows is the one ceiling rule,
    with no tolerance of its own."""
    out = _bench("gpu_vs_host.py", "--help", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--allow-flagged" in out.stdout
    assert "--tolerance" not in out.stdout
    assert "judge_against_ceiling" in out.stdout


@pytest.mark.slow
def test_gpu_vs_host_runs_on_the_fake_driver_and_judges_its_rows(tmp_dir, tmp_path):
    """The whole script at 4 MiB, one round, on the fake CUDA driver and cuFile of tests/gpu
    (its figures mean nothing): every row verified, every file row judged by the one ceiling
    rule and its standing in the JSON. Needs gpu_bench from a CMake build tree."""
    from test_gpu_fake import build_fakes

    benches = sorted((REPO / "build").glob("*/bench/gpu_bench"))
    if not benches:
        pytest.skip("no gpu_bench under build/*/bench (cmake --build --preset ci --target gpu_bench)")
    cuda, cufile = build_fakes(tmp_path)
    out = tmp_path / "gpu.json"
    env = dict(os.environ, DEEPIO_CUDA_LIBRARY=str(cuda), DEEPIO_CUFILE_LIBRARY=str(cufile))
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "gpu_vs_host.py"),
            *("--bench", str(benches[0]), "--dir", str(tmp_dir), "--size", str(4 << 20), "--rounds", "1"),
            *("--qd", "4", "--cold", "fadvise", "--allow-flagged", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    for op in ("read", "write"):
        assert report["ceiling_samples"][op], report
        for mem in ("host", "device", "bounce", "gds"):
            assert report["vs_ceiling"][f"{op}/{mem}"] in ("below", "at_ceiling", "above"), report


def _kv_bench(tmp_dir: Path, tools: str, folders: int) -> dict:
    args = [a for i in range(folders) for a in ("--folder", str(tmp_dir / f"f{i}"))]
    for i in range(folders):
        (tmp_dir / f"f{i}").mkdir()
    out = _bench(
        "kv_bench.py", *args, "--pages", "6", "--batch", "4", "--page-bytes", "64K", "--rounds", "2",
        "--queue-depth", "4", "--tools", tools, "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert {(r["tool"], r["phase"]) for r in report["rows"]} == {
        (t, p) for t in tools.split(",") for p in ("put", "get")
    }
    assert all(r["gib_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in report["rows"])
    assert len(report["samples"]) == 2 * 2 * len(tools.split(","))
    for i in range(folders):
        assert not any((tmp_dir / f"f{i}").iterdir()), "the benchmark left files behind"
    return report


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_kv_bench_runs_store_and_fio_over_two_folders_and_cleans_up(tmp_dir):
    """A tiny run of bench/kv_bench.py: deepio.kv.Store and fio (one job per folder) both
    timed for puts and gets, the pages read back checked (non-zero exit on a mismatch)."""
    _kv_bench(tmp_dir, "deepio,fio", 2)


@pytest.mark.slow
@needs("sglang")
def test_kv_bench_runs_the_sglang_backends(tmp_dir):
    """The SGLang rows (SGLang 0.5.23 from scripts/setup-kv-engines.sh): deepio's backend and
    SGLang's HiCacheFile through SGLang's controller page functions."""
    _kv_bench(tmp_dir, "deepio-sglang,hicache-file", 1)


def test_kv_crc_bench_times_each_implementation_and_size():
    """A tiny run of bench/kv_crc.py: a row per implementation and size with a positive
    figure (its values are checked against google-crc32c where that is installed)."""
    r = _bench("kv_crc.py", "--sizes", "4K,300K", "--bytes", "1M", "--rounds", "1", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(("deepio.kv", "zlib"))]
    assert [(row[0], int(row[-3])) for row in rows] == [
        ("deepio.kv.crc32c", 4096),
        ("deepio.kv.crc32c", 300 * 1024),
        ("zlib.crc32", 4096),
        ("zlib.crc32", 300 * 1024),
    ]
    assert all(float(row[-2]) > 0 and float(row[-1]) >= 0 for row in rows)


def _fast_drive_folders(tmp_dir: Path, name: str) -> list[Path] | None:
    """Two RAM-backed drives of bench/ram_drives.sh named ``name`` (None where they cannot be
    made here: no loop devices in this container, ...)."""
    env = dict(os.environ, DEEPIO_DRIVES_NAME=name)
    up = subprocess.run(
        [str(REPO / "bench" / "ram_drives.sh"), "up", "2", "1"], env=env, capture_output=True, text=True, check=False
    )
    if up.returncode == 0:
        return [Path(f"/mnt/{name}{i}") for i in range(2)]
    subprocess.run([str(REPO / "bench" / "ram_drives.sh"), "down"], env=env, capture_output=True, check=False)
    return None


_FAST_DRIVES_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("fio") is None,
    reason="bench/fast_drives.py empties the page cache and bench/ram_drives.sh mounts drives: needs root and fio",
)


def _fast_drives(tmp_dir: Path, sizes: list[int], *args: str) -> tuple[dict, str]:
    """A tiny run of bench/fast_drives.py over two drives of bench/ram_drives.sh (made and taken
    down here; two folders of tmp_dir where loop devices cannot be made): the rows of every
    page size in ``sizes`` (and "seq" unless --no-seq) are all there and no others, every
    deepio run's bytes were checked, the printed ratios parse, the drives are left empty.
    Returns the --json report and the output."""
    name = f"fdtest{os.getpid()}"
    drives = _fast_drive_folders(tmp_dir, name)
    folders = drives or [tmp_dir / "a", tmp_dir / "b"]
    for f in folders:
        f.mkdir(exist_ok=True)
    try:
        out = _bench(
            "fast_drives.py", *[x for f in folders for x in ("--folder", str(f))], "--file-size", "8M",
            "--bytes-4k", "1M", "--seq-bytes", "4M", "--rounds", "1", "--aio-buffer", "1M", "--batch", "16",
            "--per-call", "8", "--sglang-pages", "16", "--json", "--sizes", ",".join(map(str, sizes)), *args,
            timeout=120,
        )  # fmt: skip
        if drives is None and out.returncode != 0 and "O_DIRECT" in out.stderr:
            pytest.skip(f"no loop devices here, and {tmp_dir} refuses O_DIRECT")
        assert out.returncode == 0, out.stdout + out.stderr
        left = [p for f in folders for p in f.iterdir() if p.name != "lost+found"]
    finally:
        if drives:
            subprocess.run(
                [str(REPO / "bench" / "ram_drives.sh"), "down"],
                env=dict(os.environ, DEEPIO_DRIVES_NAME=name),
                check=True,
                capture_output=True,
            )
    assert not left, f"the benchmark left {left} behind"
    report = json.loads(out.stdout.splitlines()[-1])
    import fast_drives  # bench/ is on sys.path (above)

    big = [s for s in sizes if s != 4096]
    where = {"page": sizes, "kv": big, "sglang": big, "seq": [] if "--no-seq" in args else ["seq"]}
    skipped = report["skipped"]  # SGLang's: all of it, or a page size's (its host pool wants 10 GB left free)
    want = {
        (what, g, base)
        for _, what, base, kind in fast_drives.ROWS
        for g in where[kind]
        if kind != "sglang" or not {"sglang", f"sglang {fast_drives.group_name(g)}"} & set(skipped)
    }
    rows = report["rows"]
    assert {(r["what"], r["group"], r["vs"]) for r in rows} == want, out.stdout
    for r in rows:
        assert r["gib_s"] > 0 and r["cpu_s_per_gib"] >= 0, r
        assert r["verified"] is (None if r["what"].startswith("fio") else True), r
        assert (r["vs"] is None) == ("ratio" not in r), r
        if r["vs"] is not None:
            assert r["ratio_min"] <= r["ratio"] * (1 + 1e-9) and r["ratio"] <= r["ratio_max"] * (1 + 1e-9), r
    # The printed table: each compared row ends with "RATIOx (MIN-MAX)".
    compared = [line for line in out.stdout.splitlines() if line.rstrip().endswith(")") and "x (" in line]
    assert len(compared) == sum(r["vs"] is not None for r in rows), out.stdout
    for line in compared:
        ratio, spread = line.rsplit(" ", 2)[-2:]
        assert float(ratio.rstrip("x")) > 0 and all(float(x) > 0 for x in spread.strip("()").split("-")), line
    return report, out.stdout


@_FAST_DRIVES_ROOT
@pytest.mark.slow
def test_fast_drives_bench_runs_every_row_over_two_ram_drives(tmp_dir):
    """bench/fast_drives.py at 4 KiB (engine rows only) and 64 KiB (kv too) and sequentially,
    without SGLang (its import alone takes longer than this test should)."""
    report, out = _fast_drives(tmp_dir, [4096, 65536], "--no-sglang")
    assert report["skipped"] == {"sglang": "--no-sglang"}
    assert "# sglang rows skipped: --no-sglang" in out


@_FAST_DRIVES_ROOT
@pytest.mark.slow
@needs("sglang")
def test_fast_drives_bench_runs_the_sglang_layouts(tmp_dir):
    """The SGLang rows: page_first and layer_first pages through deepio.kv.sglang, checked."""
    report, _ = _fast_drives(tmp_dir, [65536], "--no-seq")
    if why := report["skipped"].get("sglang 64 KiB"):
        pytest.skip(why)  # SGLang's host pool refuses to be made with less than 10 GB of memory left
    assert not report["skipped"]
    assert {r["what"] for r in report["rows"]} >= {"sglang page_first get", "sglang layer_first get"}
