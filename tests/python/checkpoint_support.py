"""What the deepio.save/load test files (test_checkpoint*.py) share: the hypothesis strategies
for tensors and containers of them, the exact comparison of loaded objects, a child Python,
and the check that no temporary file is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from hypothesis import strategies as st

from conftest import require_module

np = require_module("numpy")
torch = require_module("torch")

EXAMPLES = int(os.environ.get("DEEPIO_HYPOTHESIS_EXAMPLES", "40"))
SMALL = {"buffer_size": 8192, "buffers": 3}  # many buffer turns on small data


def _child(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".deepio-tmp-" in n)


DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 9), min_size=0, max_size=3))
    n = 1
    for s in shape:
        n *= s
    base = torch.from_numpy(np.frombuffer(draw(st.binary(min_size=n * 16, max_size=n * 16)), np.uint8).copy())
    if n == 0:
        t = torch.empty(0, dtype=dtype)
    elif dtype == torch.bool:
        t = (base[:n] & 1).bool()
    else:
        t = base[: n * torch.empty(0, dtype=dtype).element_size()].view(dtype)
    t = t.reshape(shape)
    kind = draw(st.sampled_from(["plain", "transposed", "sliced"]))
    if kind == "transposed" and t.dim() >= 2:
        t = t.transpose(0, 1)  # non-contiguous
    elif kind == "sliced" and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]  # a view with a storage offset
    return t


def containers():
    leaves = tensors() | st.integers() | st.text(max_size=5) | st.none()
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=12,
    )


def raw(t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert a.storage_offset() == b.storage_offset()
        # Compare bytes: NaN payloads and float8 compare exactly, and == is not defined for float8.
        assert raw(a) == raw(b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b
