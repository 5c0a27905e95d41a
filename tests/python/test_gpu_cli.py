"""`deepio bench --gpu/--use_gds` (ds_io's GPU modes) and the main table's GPU rows, run
against the fake CUDA and cuFile drivers of tests/gpu ("device memory" is host memory the fake
hands out from cuMemAlloc; it refuses calls without a current context, as the real driver
does), and where they cannot run: one error line naming the cause, exit status 2. CUDA and
cuFile are switched off with DEEPIO_CUDA_LIBRARY / DEEPIO_CUFILE_LIBRARY=none, so the refusals
hold on a GPU machine too. `deepio tune --gpu/--gds` still refuses, naming bench --gpu."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile

import pytest

from cli_support import CLI  # the binary cli_support.py found ($DEEPIO_CLI, PATH, build/*/tools)
from test_gpu_fake import build_fakes

pytestmark = pytest.mark.skipif(CLI is None, reason="the deepio command is not built (set DEEPIO_CLI)")


def run(args, **env_over):
    env = dict(os.environ)
    env.update(env_over)
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def one_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--io_size", "1M", "--gpu"],
        ["bench", "--io_size", "1M", "--gpu", "--use_gds"],
        ["bench", "--size", "1M", "--gpu"],
        ["tune", "--gpu"],
        ["tune", "--gpu", "--gds"],
    ],
)
def test_gpu_flags_without_cuda(args):
    folder = tempfile.mkdtemp()
    args = [args[0], "--nvme_dir" if args[0] == "tune" else "--folder", folder, *args[1:]]
    try:
        one_error(
            run(args, DEEPIO_CUDA_LIBRARY="none", DEEPIO_CUFILE_LIBRARY="none"),
            "--gpu: no usable CUDA driver",
            "DEEPIO_CUDA_LIBRARY=none",
        )
    finally:
        os.rmdir(folder)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    return build_fakes(tmp_path_factory.mktemp("fakes"))


def fake_env(fakes, cufile=True):
    return {"DEEPIO_CUDA_LIBRARY": str(fakes[0]), "DEEPIO_CUFILE_LIBRARY": str(fakes[1]) if cufile else "none"}


def ds_io_lines(out, op):
    """ds_io's four result lines, parsed: {"Task Latency": s, "Task Speed": GiB/s, ...}."""
    got = {}
    for line in out.splitlines():
        for kind in ("Task", "E2E"):
            for what, unit in (("Latency", "sec"), ("Speed", "GB/sec")):
                head = f"{kind} {op} {what} = "
                if line.startswith(head):
                    assert line.endswith(f" {unit}"), line
                    got[f"{kind} {what}"] = float(line[len(head) : -len(unit) - 1])
    assert sorted(got) == ["E2E Latency", "E2E Speed", "Task Latency", "Task Speed"], out
    assert all(v > 0 for v in got.values()), got
    return got


@pytest.mark.parametrize("gds", [False, True], ids=["staged", "gds"])
@pytest.mark.parametrize("read", [False, True], ids=["write", "read"])
def test_ds_io_gpu_modes_run_and_validate(fakes, tmp_path, gds, read):
    args = (
        [
            "bench",
            "--folder",
            str(tmp_path),
            "--io_size",
            "2M",
            "--block_size",
            "256K",
            "--loops",
            "2",
            "--gpu",
            "--validate",
        ]
        + (["--use_gds"] if gds else [])
        + (["--read"] if read else [])
    )
    r = run(args, **fake_env(fakes))
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout
    assert f"gpu=True, use_gds={gds}" in out
    assert "Configuring 1 gpu to folder mapping\n[0]: gpu 0 <----> " in out
    ds_io_lines(out, "Read" if read else "Write")
    if gds:
        # The fake cuFile accepts the file: every byte went through cuFile.
        assert "tid 0: gds_handle gds; cuFile 100%, staged 0%" in out, out
    else:
        assert "tid 0: GPU memory staged through page-locked slots (aio_handle)" in out, out
    # The files are ds_io's, and hold what the device buffer held (--validate passed above).
    assert (tmp_path / f"_aio_{'read' if read else 'write'}_{2 << 20}.pt.0_0").stat().st_size == 2 << 20


def test_ds_io_use_gds_without_cufile_stages_and_says_so(fakes, tmp_path):
    r = run(
        ["bench", "--folder", str(tmp_path), "--io_size", "1M", "--gpu", "--use_gds", "--validate", "--json"],
        **fake_env(fakes, cufile=False),
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["gpu"]["use_gds"] is True
    assert doc["gpu"]["mode"].startswith("compat: ") and "DEEPIO_CUFILE_LIBRARY=none" in doc["gpu"]["mode"]
    assert doc["gpu"]["bytes_cufile"] == 0 and doc["gpu"]["bytes_staged"] > 0


def test_ds_io_gpu_processes_each_on_its_device(fakes, tmp_path):
    # Two forked processes on device 0 (the fake has one): CUDA is probed in a child first, so
    # the forked workers start with an uninitialised driver, as the real one requires.
    f = str(tmp_path)
    r = run(
        ["bench", "--folder_to_device_mapping", f"{f}:0", f"{f}:0", "--io_size", "1M", "--gpu", "--read", "--validate"],
        **fake_env(fakes),
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "[0]: gpu 0 <----> " in r.stdout and "[1]: gpu 0 <----> " in r.stdout
    ds_io_lines(r.stdout, "Read")
    # ds_io's rule: a mapped device that does not exist is an argument error.
    one_error(
        run(["bench", "--folder", f, "--multi_process", "2", "--io_size", "1M", "--gpu"], **fake_env(fakes)),
        "--multi_process: device 1 does not exist (1 CUDA device(s))",
    )


def test_main_table_has_gpu_rows_with_cuda(fakes, tmp_path):
    r = run(
        ["bench", "--folder", str(tmp_path), "--size", "16M", "--runs", "1", "--no_fio", "--json"], **fake_env(fakes)
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["schema"] == "deepio.bench.compare/3"
    assert doc["gpu"]["available"] is True and doc["gpu"]["rows"] is True
    rows = {(x["op"], x["engine"]): x for x in doc["results"]}
    assert len(rows) == 15  # write and read x 6, overwrite x 3 (deepio, naive, ceiling: no GPU rows)
    for op in ("write", "read"):
        for engine in ("deepio", "naive", "ceiling", "gpu_staged", "gpu_gds"):
            assert (op, engine) in rows
        for engine in ("gpu_staged", "gpu_gds"):
            row = rows[(op, engine)]
            assert row["verified"] is True, row
            assert row["gib_per_sec"] > 0
            # The one ceiling rule of every disk row: flagged exactly when beyond the fastest of
            # this run's ceiling samples by more than max(their spread, noise_floor x fastest).
            ceiling = [s for s in rows[(op, "ceiling")]["samples_gib_per_sec"] if s > 0]
            limit = math.inf  # no ceiling measured: nothing is flagged
            if ceiling:
                hi, lo = max(ceiling), min(ceiling)
                limit = hi + max(hi - lo, doc["ceiling"]["noise_floor"] * hi)
            assert row["flagged"] == (row["gib_per_sec"] > limit), (row, ceiling)
            assert row["flagged"] == (row["vs_ceiling"] == "above"), row
            assert bool(row["flag"]) == row["flagged"]
    assert rows[("read", "h2d")]["io_path"] == "cuMemcpyHtoD from CUDA-registered host memory"
    assert rows[("write", "d2h")]["gib_per_sec"] > 0
    assert rows[("write", "gpu_gds")]["label"] == "GPU gds (gds)"

    text = run(["bench", "--folder", str(tmp_path), "--size", "16M", "--runs", "1", "--no_fio"], **fake_env(fakes))
    assert text.returncode == 0, text.stderr
    assert "gpu: CUDA driver 12040, device 0 of 1" in text.stdout
    for label in (
        "GPU staged (aio_handle)",
        "GPU gds (gds)",
        "host->device copy (ceiling)",
        "device->host copy (ceiling)",
    ):
        assert label in text.stdout, text.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


def no_memory_driver(fakes, out):
    """A CUDA driver whose cuMemAlloc always answers CUDA_ERROR_OUT_OF_MEMORY: a library that
    defines only cuMemAlloc_v2 and depends on the fake, which dlsym() finds for the rest."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the out-of-memory driver")
    src, lib = out / "nomem.c", out / "libnomem_cuda.so"
    src.write_text(
        '__attribute__((visibility("default"))) int cuMemAlloc_v2(unsigned long long* p, '
        "unsigned long n) { (void)p; (void)n; return 2; }\n"
    )
    fake_dir = fakes[0].parent
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-o",
            str(lib),
            str(src),
            "-Wl,--no-as-needed",
            f"-L{fake_dir}",
            "-ldeepio_fake_cuda",
            f"-Wl,-rpath,{fake_dir}",
        ],
        check=True,
    )
    return lib


CORRUPT_DTOH = r"""
#include <dlfcn.h>
typedef int (*dtoh_fn)(void*, unsigned long long, unsigned long);
__attribute__((visibility("default"))) int cuMemcpyDtoH_v2(void* dst, unsigned long long src, unsigned long n) {
  void* fake = dlopen("libdeepio_fake_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  dtoh_fn real = fake ? (dtoh_fn)dlsym(fake, "cuMemcpyDtoH_v2") : 0;
  int r = real ? real(dst, src, n) : 999;
  if (r == 0 && n > 100) ((unsigned char*)dst)[100] ^= 0xff;
  return r;
}
"""


def test_ds_io_gpu_validate_checks_the_device_bytes(fakes, tmp_path):
    # A driver whose device-to-host copy flips byte 100: --validate must see it, so it really
    # compares what is in device memory (copied back) with the file.
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the corrupting driver")
    src, lib = tmp_path / "corrupt.c", tmp_path / "libcorrupt_cuda.so"
    src.write_text(CORRUPT_DTOH)
    fake_dir = fakes[0].parent
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-o",
            str(lib),
            str(src),
            "-Wl,--no-as-needed",
            f"-L{fake_dir}",
            "-ldeepio_fake_cuda",
            f"-Wl,-rpath,{fake_dir}",
            "-ldl",
        ],
        check=True,
    )
    work = tmp_path / "work"
    work.mkdir()
    for extra in ([], ["--read"], ["--use_gds"]):
        r = run(
            ["bench", "--folder", str(work), "--io_size", "1M", "--gpu", "--validate", *extra],
            DEEPIO_CUDA_LIBRARY=str(lib),
            DEEPIO_CUFILE_LIBRARY=str(fakes[1]),
        )
        assert r.returncode == 1, (extra, r.stdout, r.stderr)
        assert "validation failed" in r.stderr and "differs from the buffer at byte 100" in r.stderr, r.stderr
        # Without --validate nothing copies back: the same run succeeds.
        assert (
            run(
                ["bench", "--folder", str(work), "--io_size", "1M", "--gpu", *extra],
                DEEPIO_CUDA_LIBRARY=str(lib),
                DEEPIO_CUFILE_LIBRARY=str(fakes[1]),
            ).returncode
            == 0
        )


def test_gpu_set_up_failure_drops_the_rows_or_fails_when_asked_for(fakes, tmp_path):
    lib = no_memory_driver(fakes, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"DEEPIO_CUDA_LIBRARY": str(lib), "DEEPIO_CUFILE_LIBRARY": "none"}
    base = ["bench", "--folder", str(work), "--size", "16M", "--runs", "1", "--no_fio"]
    # Without --gpu the table goes on without GPU rows and says why.
    r = run([*base, "--json"], **env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["gpu"]["available"] is True and doc["gpu"]["rows"] is False
    assert "GPU set-up failed: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in doc["gpu"]["reason"]
    assert len(doc["results"]) == 9  # write, overwrite, read x deepio, naive, ceiling
    # With --gpu the GPU rows were asked for: the run fails (exit 1), saying why.
    r = run([*base, "--gpu"], **env)
    assert r.returncode == 1 and "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in r.stderr, (r.stdout, r.stderr)
    r = run(["bench", "--folder", str(work), "--io_size", "1M", "--gpu"], **env)
    assert r.returncode == 1 and "process 0: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in r.stderr, r.stderr
    assert "Task Write Speed" not in r.stdout


def test_main_table_without_cuda_has_no_gpu_rows(tmp_path):
    r = run(
        ["bench", "--folder", str(tmp_path), "--size", "16M", "--runs", "1", "--no_fio", "--json"],
        DEEPIO_CUDA_LIBRARY="none",
        DEEPIO_CUFILE_LIBRARY="none",
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["gpu"]["available"] is False and doc["gpu"]["rows"] is False
    assert "DEEPIO_CUDA_LIBRARY=none" in doc["gpu"]["reason"]
    assert [x["engine"] for x in doc["results"]] == ["deepio", "naive", "ceiling"] * 3  # write, overwrite, read


def test_several_folders_have_no_gpu_rows_and_say_why(fakes, tmp_path):
    # Issue 27: the GPU rows take one folder; with several, CUDA usable, the table says why not.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    args = ["bench", "--folder", str(a), "--folder", str(b), "--size", "1M", "--runs", "1", "--no_fio"]
    r = run([*args, "--json"], **fake_env(fakes))
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["gpu"]["available"] is True and doc["gpu"]["rows"] is False
    assert doc["gpu"]["reason"] == "the GPU rows are measured with one folder only"
    assert [x["engine"] for x in doc["results"]] == ["deepio", "naive", "ceiling"] * 3
    r = run([*args, "--gpu"], **fake_env(fakes))
    assert r.returncode == 2 and "--gpu measures one folder: give one --folder" in r.stderr, r.stderr


def test_tune_gpu_points_at_bench(fakes, tmp_path):
    one_error(
        run(["tune", "--nvme_dir", str(tmp_path), "--gpu"], **fake_env(fakes)),
        "--gpu: GPU runs are not in deepio tune yet",
        "deepio bench --io_size ... --gpu",
    )
