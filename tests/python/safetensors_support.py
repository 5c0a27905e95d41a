"""What the deepio.safetensors test files (test_safetensors*.py) share: every dtype torch and
safetensors share, random tensors of them (every bit pattern), exact comparison, hypothesis
strategies for state dicts, and sharded checkpoints written by the real safetensors.torch."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from conftest import require_module

torch = require_module("torch")
st = require_module("safetensors.torch")
hypothesis = require_module("hypothesis")
from hypothesis import strategies as hs  # noqa: E402

EXAMPLES = int(os.environ.get("DEEPIO_HYPOTHESIS_EXAMPLES", "60"))

# Every dtype torch and safetensors share (the ones this torch has).
DTYPES = [
    getattr(torch, n)
    for n in (
        "float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 bool complex64 uint64 uint32 uint16 "
        "float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2"
    ).split()
    if hasattr(torch, n)
]


def rand_tensor(shape, dtype, seed=0):
    """Random bytes viewed as dtype (every bit pattern: NaNs included, so compare bytes)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    item = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * item,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same(a, b) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.device == b.device
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def assert_same_dict(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert same(got[k], want[k]), k


def same_layout(a: bytes, b: bytes) -> bool:
    """Same header length, same parsed header (metadata as a dict), same data bytes."""
    (na,), (nb,) = struct.unpack_from("<Q", a), struct.unpack_from("<Q", b)
    return na == nb and json.loads(a[8 : 8 + na]) == json.loads(b[8 : 8 + nb]) and a[8 + na :] == b[8 + nb :]


names = hs.text(alphabet=hs.sampled_from("abz._0é☃"), min_size=1, max_size=6)


@hs.composite
def tensors(draw):
    dtype = draw(hs.sampled_from(DTYPES))
    shape = tuple(draw(hs.lists(hs.integers(0, 5), max_size=3)))
    if dtype == getattr(torch, "float4_e2m1fn_x2", None) and not shape:
        shape = (1,)  # safetensors cannot store a 0-d F4 tensor (no axis to halve)
    return rand_tensor(shape, dtype, draw(hs.integers(0, 1 << 30)))


state_dicts = hs.dictionaries(names.filter(lambda s: s != "__metadata__"), tensors(), max_size=8)
metadatas = hs.none() | hs.dictionaries(hs.text(max_size=5), hs.text(max_size=8), max_size=3)


def make_shards(folder: Path, n: int = 3):
    want = {}
    for i in range(n):
        sd = {
            f"layer{i}.w": rand_tensor((64, 33), torch.bfloat16, i),
            f"layer{i}.b": rand_tensor((33,), torch.float32, i),
        }
        st.save_file(sd, str(folder / f"model-{i:05d}-of-{n:05d}.safetensors"))
        want.update(sd)
    (folder / "model.safetensors.index.json").write_text("{}")  # ignored
    return want
