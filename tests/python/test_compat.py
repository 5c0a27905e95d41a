"""deepio.compat: DeepSpeed-style code runs with one import changed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import deepio
from conftest import needs_numpy, needs_torch
from deepio.compat import AsyncIOBuilder, PinMemoryBuilder

# Written the way DeepSpeed's tutorial and swappers use DeepNVMe; only the import differs.
DEEPSPEED_STYLE = textwrap.dedent("""
    import os, sys
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    folder = sys.argv[1]
    assert AsyncIOBuilder().is_compatible()
    aio_op = AsyncIOBuilder().load()

    # --- the tutorial: blocking and non-blocking writes, parallel, pinned -------------
    t = torch.empty(1024**2, dtype=torch.uint8).random_(0, 255)
    h = aio_op.aio_handle()
    path = os.path.join(folder, "test_1MB.pt")
    assert not os.path.isfile(path)
    h.sync_pwrite(t, path)
    assert os.path.getsize(path) == 1024**2
    h = aio_op.aio_handle(num_threads=4)
    h.async_pwrite(t, path)
    assert h.wait() == 1

    # --- a ZeRO-Infinity-style swapper: locked buffers, narrowed views, offsets ------
    block_size, queue_depth, single_submit, overlap_events, intra_op = 1048576, 8, False, True, 2
    handle = aio_op.aio_handle(block_size, queue_depth, single_submit, overlap_events, intra_op)
    numel = 3 * 100_003   # not a multiple of anything in particular
    buffer = handle.new_cpu_locked_tensor(numel, torch.Tensor())  # float32, like the swappers
    assert handle.is_pinned(buffer)
    params = [torch.randn(100_003) for _ in range(3)]
    swap_path = os.path.join(folder, "params.swp")
    offset = 0
    for p in params:
        view = buffer.narrow(0, offset, p.numel())
        view.copy_(p)
        handle.async_pwrite(view, swap_path, offset * 4)
        offset += p.numel()
    assert handle.wait() == 3
    buffer.zero_()
    offset = 0
    for p in params:
        handle.async_pread(buffer.narrow(0, offset, p.numel()), swap_path, offset * 4)
        offset += p.numel()
    assert handle.wait() == 3
    for i, p in enumerate(params):
        assert torch.equal(buffer.narrow(0, i * 100_003, 100_003), p)
    assert handle.free_cpu_locked_tensor(buffer)

    # --- the DeepNVMe pread/pwrite flavour with validate/async positionals -----------
    out = torch.empty_like(params[0])
    assert handle.pread(out, swap_path, False, False, 0) == 1
    assert torch.equal(out, params[0])
    assert handle.pwrite(out, swap_path, False, True, 0) == 0
    assert handle.wait() == 1

    # --- module-level helpers -------------------------------------------------------
    one_shot = os.path.join(folder, "one_shot.pt")
    assert aio_op.aio_write(params[1], one_shot, 65536, 4, False, False, False) == 0
    back = torch.empty_like(params[1])
    assert aio_op.aio_read(back, one_shot, 65536, 4, False, False, False) == 0
    assert torch.equal(back, params[1])
    dst = torch.zeros(100)
    assert aio_op.deepspeed_memcpy(dst, params[2][:100]) == 0
    assert torch.equal(dst, params[2][:100])
    print("deepspeed-style script OK")
""")


@needs_torch
def test_deepspeed_style_script_runs_with_one_import_changed(tmp_dir):
    script = DEEPSPEED_STYLE.replace(
        "from deepspeed.ops.op_builder import AsyncIOBuilder", "from deepio.compat import AsyncIOBuilder"
    )
    assert script != DEEPSPEED_STYLE
    r = subprocess.run(
        [sys.executable, "-c", script, str(tmp_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "deepspeed-style script OK"
    assert r.stderr == ""  # nothing printed by the library


def test_builders():
    b = AsyncIOBuilder()
    assert b.is_compatible() and b.is_compatible(verbose=True)
    mod = b.load()
    assert mod is b.load(verbose=False) is b.jit_load()
    assert {"aio_handle", "aio_read", "aio_write", "deepspeed_memcpy"} <= set(dir(mod))
    assert mod.aio_handle is deepio.aio_handle
    assert b.NAME == "async_io"
    pin = PinMemoryBuilder().load().pin_handle()
    assert hasattr(pin, "new_cpu_locked_tensor") and hasattr(pin, "free_cpu_locked_tensor")


def test_deepnvme_method_set():
    """Every method DeepNVMe's aio_handle exposes exists (reference §1.3–§1.8)."""
    h = AsyncIOBuilder().load().aio_handle()
    for name in (
        "get_block_size",
        "get_queue_depth",
        "get_single_submit",
        "get_overlap_events",
        "get_intra_op_parallelism",
        "get_thread_count",
        "get_alignment",
        "read",
        "write",
        "pread",
        "pwrite",
        "sync_pread",
        "sync_pwrite",
        "async_pread",
        "async_pwrite",
        "wait",
        "new_cpu_locked_tensor",
        "free_cpu_locked_tensor",
        "is_pinned",
    ):
        assert callable(getattr(h, name)), name


@needs_numpy
def test_memcpy_checks_sizes():
    import numpy as np

    dst = np.zeros(10, np.float32)
    with pytest.raises(ValueError):
        AsyncIOBuilder().load().deepspeed_memcpy(dst, np.ones(5, np.float32))


def test_import_does_not_import_torch():
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, deepio, deepio.compat; h = deepio.aio_handle(); "
            "b = bytearray(8); h.wait(); print('torch' in sys.modules, 'numpy' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_typing_files_ship():
    pkg = os.path.dirname(deepio.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    assert os.path.exists(os.path.join(pkg, "_deepio.pyi"))
