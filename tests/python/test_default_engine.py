"""One default engine per process (issue 25, item 1): deepio.File, deepio.save/load,
Writer/Reader and deepio.safetensors share it, so after using all of them the process has
made ONE engine, no more (deepio::live_handles(), counted in a fresh interpreter; before,
each module kept its own: three).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import needs_torch

PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch
    import deepio, deepio.safetensors
    from deepio import _deepio

    d = sys.argv[1]
    sd = {f"t{i}": torch.randn(1 << 20) for i in range(4)}
    counts = {"start": _deepio.live_handles()}
    deepio.save(sd, os.path.join(d, "a.pt"))
    deepio.load(os.path.join(d, "a.pt"))
    deepio.safetensors.save_file(sd, os.path.join(d, "a.st"))
    deepio.safetensors.load_file(os.path.join(d, "a.st"))
    with deepio.File(os.path.join(d, "a.raw"), "w") as f:
        f.pwrite(np.ones(1 << 20, dtype=np.uint8), 0).result()
    with deepio.Writer(os.path.join(d, "a.w")) as w:
        w.write(b"x" * (3 << 20))
    with deepio.Reader(os.path.join(d, "a.w")) as r:
        r.read()
    counts["after"] = _deepio.live_handles()
    h = deepio.aio_handle()  # the user's own: one more, and gone when closed
    counts["with_own"] = _deepio.live_handles()
    h.close()
    counts["own_closed"] = _deepio.live_handles()
    print(json.dumps(counts))
    """
)


@pytest.mark.wheel
@needs_torch
def test_every_api_shares_one_engine(tmp_dir):
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_dir)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout.strip().splitlines()[-1])
    assert n == {"start": 0, "after": 1, "with_own": 2, "own_closed": 1}, n


def test_one_default_engine_for_host_and_cuda_memory():
    # Issue 38, item 5: no second ("gds") default engine. The one default engine's device
    # route is auto: CUDA memory goes through cuFile where usable, staged otherwise
    # (test_gpu_fake_cases.py reads host and device memory through it with the fake drivers).
    from deepio import _engine

    e = _engine.default()
    assert _engine.default() is e
    assert e.device_route == "auto"
    with pytest.raises(TypeError):
        _engine.default("gds")  # type: ignore[call-arg]
