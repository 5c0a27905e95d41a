"""A save cut by a power loss at a random instant (issue 47 item 2): ``deepio.save``,
``deepio.safetensors.save_file`` over an existing file and ``deepio.dcp``'s writer over an
existing checkpoint (with an extra folder) leave the old one or the new one, whole, never a torn
one. Each crash point is a forked child that saves under ``PowerLoss``
(crash_support.py: the engine's writes and flushes recorded, renames undone unless a folder
flush covered them) and cuts the power after a random delay; the parent then loads the file.
``DEEPIO_CRASH_POINTS`` sets the points per test (default 8); a failure names its seed."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import deepio
import deepio.safetensors
from deepio import _deepio

pytestmark = pytest.mark.skipif(not hasattr(_deepio, "_crash_start"), reason="needs the test-hooks build")

POINTS = int(os.environ.get("DEEPIO_CRASH_POINTS", "8"))


def _state(salt: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(salt)
    return {f"w{i}": torch.randn(64, 1024 + 7 * i, generator=g) for i in range(6)}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _crash_point(save: Callable[[Any, Path], None], new: Any, path: Path, delay: float, seed: int) -> dict[str, int]:
    """Forks a child that saves `new` to `path` and loses power after `delay` seconds; returns
    the child's report (what the power loss did)."""
    from crash_support import PowerLoss

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            os.close(r)
            power = PowerLoss(tear_bytes=512 if seed % 2 else 4096)
            saver = threading.Thread(target=lambda: save(new, path), daemon=True)
            saver.start()
            saver.join(delay)
            report = power.crash(seed)
            os.write(w, repr(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"seed {seed}: the child failed"
    return dict(eval(out.decode()))  # noqa: S307 - our own repr of a dict of ints


def _run(tmp_path: Path, save: Callable[[Any, Path], None], load: Callable[[Path], Any], suffix: str) -> None:
    old, new = _state(1), _state(2)
    base = random.SystemRandom().randrange(1 << 32)
    save(old, tmp_path / f"timing{suffix}")
    t0 = time.perf_counter()
    save(new, tmp_path / f"timing{suffix}")  # a save over an existing one, as the points make
    took = time.perf_counter() - t0
    fates = {"old": 0, "new": 0}
    for i in range(POINTS):
        seed = base + i
        path = tmp_path / f"point{i}{suffix}"
        save(old, path)  # durable before the child starts: the power loss cannot touch it
        delay = random.Random(seed).uniform(0, 3 * took + 0.02)
        report = _crash_point(save, new, path, delay, seed)
        try:
            got = load(path)
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            pytest.fail(f"seed {seed}: after the power loss ({report}) the file does not load: {e}")
        if _equal(got, old):
            fates["old"] += 1
        elif _equal(got, new):
            fates["new"] += 1
        else:
            pytest.fail(f"seed {seed}: after the power loss ({report}) the file is neither the old nor the new save")
    print(f"power loss, {suffix}: {POINTS} points from seed {base}: {fates}")


def test_deepio_save_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    _run(tmp_path, lambda obj, p: deepio.save(obj, p), lambda p: deepio.load(p, weights_only=True), ".pt")


def test_safetensors_save_file_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    _run(tmp_path, lambda obj, p: deepio.safetensors.save_file(obj, p), deepio.safetensors.load_file, ".safetensors")


def _dcp_save(obj: dict[str, torch.Tensor], path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    import deepio.dcp

    extra = [path.parent / f"{path.name}-extra"]  # data files in a second folder too
    dcp.save(obj, storage_writer=deepio.dcp.FileSystemWriter(path, extra_paths=extra))


def _dcp_load(path: Path) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    import deepio.dcp

    out = {k: torch.zeros_like(v) for k, v in _state(0).items()}
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(path))
    return out


def test_dcp_save_over_a_checkpoint_leaves_the_old_or_the_new_one(tmp_path: Path) -> None:
    """deepio.dcp's writer over an existing checkpoint (overwrite, an extra folder): after a
    power loss at any instant the old checkpoint or the new one loads whole (its CRCs checked)."""
    _run(tmp_path, _dcp_save, _dcp_load, ".ckpt")


def test_the_power_loss_really_drops_unflushed_writes(tmp_path: Path) -> None:
    """The simulator is not a no-op: a file written through the engine without a flush loses
    some of its writes for some seed (and a flushed one never does)."""
    path = tmp_path / "raw"
    flushed = tmp_path / "flushed"
    data = random.Random(7).randbytes(1 << 20)
    lost = 0
    for seed in range(6):
        for p in (path, flushed):
            if p.exists():
                p.unlink()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                from crash_support import PowerLoss

                power = PowerLoss()
                h = deepio.aio_handle(block_size=64 * 1024, queue_depth=8, intra_op_parallelism=1)
                buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                h.sync_pwrite(buf, str(path))
                h.sync_pwrite(buf, str(flushed))
                fd = os.open(flushed, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                power.crash(seed)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert flushed.read_bytes() == data, f"seed {seed}: a flushed file changed"
        lost += path.read_bytes() != data
    assert lost > 0, "six power losses kept every unflushed write"
