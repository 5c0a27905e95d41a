"""What the deepio.dcp test files (test_dcp.py, test_dcp_extra_paths.py, test_dcp_filling.py,
test_dcp_staged.py) share: a nested state dict, the exact comparison of loaded ones, the
exception a rank raised, the data files of a checkpoint, saves by both writers under one
CRC-32 option, and the check that every tensor item is a zip whose CRC-32s hold."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from conftest import require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import deepio.dcp  # noqa: E402


def _state(fill: bool = True) -> dict:
    """A nested state dict: tensors of several dtypes, views DCP must make contiguous (a
    transposed one; a slice of a larger storage), an empty tensor, objects, and an
    optimizer-like part."""
    g = torch.Generator().manual_seed(1)

    def t(x: torch.Tensor) -> torch.Tensor:
        return x if fill else torch.zeros_like(x)

    big = torch.randn(64, 32, generator=g)
    return {
        "model": {
            "f32": t(torch.randn(17, 5, generator=g)),
            "f16": t(torch.randn(33, generator=g).half()),
            "bf16": t(torch.randn(4, 4, generator=g).bfloat16()),
            "i64": t(torch.arange(-50, 50, dtype=torch.int64)),
            "i8": t(torch.arange(-100, 100, 3, dtype=torch.int8)),
            "u8": t(torch.arange(0, 250, 7, dtype=torch.uint8)),
            "bool": t(torch.arange(10) % 3 == 0),
            "c64": t(torch.randn(6, dtype=torch.complex64, generator=g)),
            "f64": t(torch.randn(3, 3, 3, dtype=torch.float64, generator=g)),
            "transposed": t(torch.randn(7, 9, generator=g).t()),
            "slice": t(big[10:20, 3:8]),  # a view of part of a larger storage
            "empty": t(torch.empty(0, 4)),
        },
        "optim": {
            "state": {
                "0": {"step": t(torch.tensor(12.0)), "exp_avg": t(torch.randn(17, 5, generator=g))},
                "1": {"step": t(torch.tensor(12.0)), "exp_avg_sq": t(torch.rand(33, generator=g))},
            },
            "param_groups": [{"lr": 0.01 if fill else 0.0, "betas": (0.9, 0.999), "params": ["0", "1"]}],
        },
        "epoch": 3 if fill else 0,
        "name": "run-7" if fill else "",
        "blob": {"bytes": b"\x00\x01deepio" if fill else b"", "list": [1, 2.5, "x"] if fill else []},
    }


def _assert_same(got, want, where: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{got.shape}"
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), where
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)) and any(isinstance(x, (dict, torch.Tensor)) for x in want):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _cause(excinfo: pytest.ExceptionInfo) -> BaseException:
    """The exception a rank raised, from dcp's CheckpointException (or the exception itself)."""
    e = excinfo.value
    if isinstance(e, CheckpointException):
        return next(iter(e.failures.values()))[0]
    return e


def _data_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.distcp"))}


def _items_are_zips_with_their_crcs(folder: Path) -> None:
    """Every tensor item of the checkpoint, read alone, is a zip whose CRC-32s all hold."""
    import zipfile

    md = dcp.FileSystemReader(folder).read_metadata()
    for index, place in md.storage_data.items():
        with open(folder / place.relative_path, "rb") as f:
            f.seek(place.offset)
            raw = f.read(place.length)
        if raw[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                assert z.testzip() is None, index.fqn


def _save_both_with_crc32(sd: dict, folder: Path, crc32: bool) -> None:
    """Saves ``sd`` with deepio's writer into ``folder/d`` and torch's into ``folder/t``, with
    torch.serialization's CRC-32 option set to ``crc32`` (restored after)."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc32)
    try:
        dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(folder / "d"))
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(folder / "t"))
    finally:
        torch.serialization.set_crc32_options(before)
