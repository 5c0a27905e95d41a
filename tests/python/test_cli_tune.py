"""Smoke tests of `deepio tune` at tiny sizes: the DeepSpeed aio section it prints, its JSON
counts, the log folder ds_nvme_tune writes, several folders at once. Shared helpers:
cli_support.py."""

from __future__ import annotations

import json
import re

import pytest

from cli_support import MARKS, ds_io_lines, fresh_folder, run, some_folders

pytestmark = MARKS


@pytest.fixture
def tmp_dir():
    yield from fresh_folder()


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
