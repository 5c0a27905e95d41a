"""The safetensors header parser (deepio/safetensors/_format.py) under fuzzing: whatever the
bytes, ``parse`` returns a Header whose tensors tile the file's data section, or raises
deepio.CorruptFileError naming the file, and nothing else (no KeyError, TypeError,
OverflowError, RecursionError, UnicodeDecodeError, ...). The inputs: arbitrary bytes, and valid
files (built by the writer's own ``encode``) truncated, bit-flipped, with their length field
or data section altered, or with their JSON mutated (wrong types, negative or huge integers,
overlapping or out-of-order ranges, unknown dtypes, shapes that do not match their bytes).

Pure: no torch, no I/O; a few seconds."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from typing import Any

import pytest

from conftest import require_module  # noqa: E402

hypothesis = require_module("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

from deepio import CorruptFileError  # noqa: E402
from deepio.safetensors import _format  # noqa: E402

# At least 300 examples per property (DEEPIO_HYPOTHESIS_EXAMPLES raises it).
EXAMPLES = max(300, int(os.environ.get("DEEPIO_HYPOTHESIS_EXAMPLES", "0")))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAME = "fuzz.safetensors"


def parse_or_refuse(data: bytes, file_size: int | None = None) -> _format.Header | None:
    """``_format.parse``: the Header, checked against the file it came from, or None where it
    refused the bytes with CorruptFileError. Any other exception fails the test."""
    try:
        h = _format.parse(NAME, data, file_size)
    except CorruptFileError as e:
        assert e.filename == NAME and str(e).startswith(NAME + ": not a valid safetensors file: ")
        assert len(str(e)) < 2000  # readable whatever the header holds
        return None
    size = len(data) if file_size is None else file_size
    (n,) = struct.unpack_from("<Q", data, 0)
    assert h.path == NAME and h.file_size == size and h.data_offset == 8 + n <= size
    assert n <= _format.MAX_HEADER_BYTES
    at = 0
    for t in h.tensors:  # sorted by their data, tiling the data section: all inside the file
        assert t.begin == at <= t.end and h.data_offset + t.end <= size
        assert t.dtype in _format.BITS and all(isinstance(d, int) and d >= 0 for d in t.shape)
        assert math.prod(t.shape) * _format.BITS[t.dtype] == 8 * t.nbytes
        assert math.prod(max(d, 1) for d in t.shape) < 2**63  # torch can stride it
        at = t.end
    assert at == h.data_bytes
    assert len({t.name for t in h.tensors}) == len(h.tensors)
    assert h.metadata is None or all(isinstance(v, str) for v in h.metadata.values())
    return h


# --------------------------------------------------------------------------------- inputs

dtypes = hs.sampled_from([name for name, _, _ in _format.DTYPES])
shapes = hs.lists(hs.integers(0, 5), max_size=3)
names = hs.text(max_size=6).filter(lambda s: s != "__metadata__")


@hs.composite
def valid_files(draw: Any) -> bytes:
    """A valid file: tensors of any dtype and small shape (whole bytes), optional metadata,
    each tensor's bytes random."""
    entries = []
    for name in draw(hs.lists(names, max_size=5, unique=True)):
        dtype, shape = draw(dtypes), draw(shapes)
        bits = math.prod(shape) * _format.BITS[dtype]
        if bits % 8:
            shape = [*shape, 2]  # 4- and 6-bit values: an even count makes whole bytes
            bits *= 2
            if bits % 8:
                shape[-1] = 4
                bits *= 2
        entries.append((name, dtype, shape, bits // 8))
    metadata = draw(hs.none() | hs.dictionaries(hs.text(max_size=4), hs.text(max_size=4), max_size=3))
    head, _ = _format.encode(entries, metadata)
    data = draw(hs.binary(min_size=sum(e[3] for e in entries), max_size=sum(e[3] for e in entries)))
    return head + data


# JSON values of every kind, the numbers a parser could trip on among them.
scalars = (
    hs.none()
    | hs.booleans()
    | hs.integers(-(2**70), 2**70)
    | hs.sampled_from([-1, 0, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30])
    | hs.floats(allow_nan=False)
    | hs.text(max_size=5)
    | dtypes
)
json_values = hs.recursive(
    scalars,
    lambda kids: hs.lists(kids, max_size=3) | hs.dictionaries(hs.text(max_size=4), kids, max_size=3),
    max_leaves=8,
)
fields = hs.sampled_from(["dtype", "shape", "data_offsets", "extra"])
# Dimensions: small ones, and ones past int64, past uint64, past a float.
dims = hs.integers(-1, 5) | hs.sampled_from([2**31, 2**62, 2**63, 2**64, 10**400]) | hs.integers(-(2**70), 2**70)


def _list(x: Any) -> list:
    return x if isinstance(x, list) else []


@hs.composite
def mutated_json_files(draw: Any) -> bytes:
    """A valid file whose header JSON is edited: a field replaced by any value, removed, a
    range moved onto or before another, an entry or the metadata replaced, a shape changed
    (or given a zero and huge other dimensions);
    then re-encoded with a correct length and a data section of any size."""
    base = draw(valid_files())
    (n,) = struct.unpack_from("<Q", base, 0)
    doc = json.loads(base[8 : 8 + n])
    data_bytes = len(base) - 8 - n
    keys = [k for k in doc if k != "__metadata__"]
    for _ in range(draw(hs.integers(1, 3))):
        what = draw(hs.sampled_from(["field", "drop", "offsets", "entry", "metadata", "shape", "empty", "dtype"]))
        if what == "metadata":
            doc["__metadata__"] = draw(json_values)
            continue
        if not keys:
            doc[draw(hs.text(max_size=3))] = draw(json_values)
            continue
        empty = [k for k in keys if isinstance(doc[k], dict) and 0 in _list(doc[k].get("shape"))]
        k = draw(hs.sampled_from(empty if what == "empty" and empty else keys))
        entry = doc[k]
        if what == "entry" or not isinstance(entry, dict):
            doc[k] = draw(json_values)
        elif what == "field":
            entry[draw(fields)] = draw(json_values)
        elif what == "drop":
            entry.pop(draw(fields), None)
        elif what == "offsets":  # in range, but overlapping, reversed, shifted or past the end
            a = draw(hs.integers(-3, data_bytes + 3))
            entry["data_offsets"] = [a, draw(hs.integers(a - 3, data_bytes + 9))]
        elif what == "shape":
            entry["shape"] = draw(hs.lists(dims, max_size=4))
        elif what == "empty":  # still no elements (a zero-size entry stays valid), other dimensions huge
            huge = draw(hs.lists(hs.sampled_from([1, 2**31, 2**62, 2**63, 2**64, 10**400]), min_size=1, max_size=3))
            entry["shape"] = [*huge[:1], 0, *huge[1:]]
        else:
            entry["dtype"] = draw(hs.sampled_from(["F128", "f32", "", "BOOL ", "U4"]) | dtypes)
    text = json.dumps(doc, separators=draw(hs.sampled_from([(",", ":"), (", ", ": ")]))).encode()
    text += b" " * draw(hs.integers(0, 8))
    data = draw(hs.binary(max_size=data_bytes + 8)) if draw(hs.booleans()) else base[8 + n :]
    return struct.pack("<Q", len(text)) + text + data


@hs.composite
def damaged_files(draw: Any) -> bytes:
    """A valid file cut short, with bits flipped, bytes spliced in, or its length field or
    data section altered."""
    b = bytearray(draw(valid_files()))
    for _ in range(draw(hs.integers(1, 3))):
        what = draw(hs.sampled_from(["truncate", "flip", "length", "splice", "append"]))
        if what == "truncate":
            del b[draw(hs.integers(0, len(b))) :]
        elif what == "flip" and b:
            i = draw(hs.integers(0, len(b) - 1))
            b[i] ^= 1 << draw(hs.integers(0, 7))
        elif what == "length" and len(b) >= 8:
            (n,) = struct.unpack_from("<Q", b, 0)
            near = min(max(n + draw(hs.integers(-16, 16)), 0), 2**64 - 1)  # stays a u64
            new = near if draw(hs.booleans()) else draw(hs.integers(0, 2**64 - 1))
            struct.pack_into("<Q", b, 0, new)
        elif what == "splice":
            i = draw(hs.integers(0, len(b)))
            b[i:i] = draw(
                hs.binary(min_size=1, max_size=4) | hs.sampled_from([b"\xff", b'"', b"{", b"\\u", b"\xed\xa0"])
            )
        elif what == "append":
            b += draw(hs.binary(max_size=9))
    return bytes(b)


# ------------------------------------------------------------------------------ properties


@FUZZ
@given(data=hs.binary(max_size=300))
def test_any_bytes(data):
    parse_or_refuse(data)


@FUZZ
@given(body=hs.binary(max_size=200), length=hs.integers(0, 2**64 - 1) | hs.integers(0, 210))
def test_any_bytes_behind_any_length(body, length):
    parse_or_refuse(struct.pack("<Q", length) + body)


@FUZZ
@given(data=damaged_files())
def test_damaged_files(data):
    parse_or_refuse(data)


@FUZZ
@given(data=mutated_json_files())
def test_mutated_json(data):
    parse_or_refuse(data)


@FUZZ
@given(data=valid_files(), extra=hs.integers(0, 100), cut=hs.integers(0, 400))
def test_valid_files_parse_and_any_prefix_of_a_larger_file_is_handled(data, extra, cut):
    """A valid file parses to exactly what was encoded; given only its first ``cut`` bytes (at
    least the header's end) with the file size, the same; fewer: refused, never misread."""
    h = parse_or_refuse(data)
    assert h is not None
    assert parse_or_refuse(data + bytes(extra)) is None or extra == 0
    prefix = data[: max(cut, 0)]
    got = parse_or_refuse(prefix, len(data))
    if len(prefix) >= min(len(data), _format.header_end(data)):
        assert got is not None and [(t.name, t.begin, t.end) for t in got.tensors] == [
            (t.name, t.begin, t.end) for t in h.tensors
        ]
    else:
        assert got is None


@FUZZ
@given(
    entries=hs.lists(hs.tuples(names, dtypes, shapes), max_size=6, unique_by=lambda e: e[0]),
    metadata=hs.none() | hs.dictionaries(hs.text(max_size=5), hs.text(max_size=5), max_size=3),
)
def test_encode_then_parse_round_trips(entries, metadata):
    """What the writer encodes, the parser reads back: every tensor where the layout put it,
    in safetensors' order (dtype rank highest first, then name), the header padded to 8."""
    full = []
    for name, dtype, shape in entries:
        bits = math.prod(shape) * _format.BITS[dtype]
        shape = shape if bits % 8 == 0 else [*shape, 4]
        full.append((name, dtype, shape, math.prod(shape) * _format.BITS[dtype] // 8))
    head, layout = _format.encode(full, metadata)
    assert len(head) % 8 == 0
    h = parse_or_refuse(head + bytes(sum(e[3] for e in full)))
    assert h is not None and h.data_offset == len(head)
    assert h.metadata == (None if metadata is None else dict(metadata))
    by_name = {t.name: t for t in h.tensors}
    assert [i for i, _ in layout] == sorted(range(len(full)), key=lambda i: (-_format.RANK[full[i][1]], full[i][0]))
    for i, at in layout:
        name, dtype, shape, nbytes = full[i]
        t = by_name[name]
        assert (t.dtype, list(t.shape), t.begin, t.end) == (dtype, shape, at, at + nbytes)


# ---------------------------------------------------------------------- fixed hostile cases


def file_with(text: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: str, shape: bytes, offsets: bytes = b"[0,0]") -> bytes:
    return b'{"w":{"dtype":"' + dtype.encode() + b'","shape":' + shape + b',"data_offsets":' + offsets + b"}}"


HOSTILE = {  # the header, what the message says
    "arrays nested 100000 deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "objects nested 100000 deep": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
    "an integer of 5000 digits": (entry("F32", b"[" + b"9" * 5000 + b"]"), "not valid JSON"),
    "a zero-size shape past uint64": (entry("F32", b"[0,%d]" % 2**64), "64-bit strides"),
    "a zero-size shape past int64 strides": (entry("U8", b"[0,%d,2]" % 2**62), "64-bit strides"),
    "a shape past a float": (entry("F32", b"[%d]" % 10**400), "64-bit strides"),
    "offsets past a float": (entry("U8", b"[2]", b"[0,%d]" % 10**400), "needs 2 bytes"),
    "a float dimension": (entry("U8", b"[1e400]"), "non-negative integers"),
    "a NaN dimension": (entry("U8", b"[NaN]"), "non-negative integers"),
    "a lone surrogate as the name": (b'{"\\ud800":' + entry("U8", b"[1]", b"[0,2]")[5:], "needs 1 bytes"),
    "half a byte": (entry("F4", b"[3]", b"[0,1]"), "not whole bytes"),
    "a name of 100000 characters": (b'{"' + b"n" * 100_000 + b'":3}', "not an object"),
    "metadata twice": (b'{"__metadata__":{"a":"b"},"__metadata__":{}}', "twice"),
    "metadata a list": (b'{"__metadata__":[]}', "__metadata__"),
    "a byte order mark": (b"\xef\xbb\xbf{}", "not valid JSON"),
    "a NUL after the object": (b"{}\x00", "not valid JSON"),
    "a UTF-8 surrogate": (b"\xed\xa0\x80", "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers(case):
    text, what = HOSTILE[case]
    with pytest.raises(CorruptFileError, match=what):
        _format.parse(NAME, file_with(text))


def test_shape_with_a_zero_and_dimensions_torch_can_stride_is_accepted():
    """A zero-size tensor's other dimensions may be large, as long as torch can stride them."""
    h = _format.parse(NAME, file_with(b'{"w":{"dtype":"F64","shape":[0,2305843009213693952,2],"data_offsets":[0,0]}}'))
    assert h.tensors[0].shape == (0, 2**61, 2) and h.tensors[0].nbytes == 0


def test_a_header_cut_short_by_the_caller_is_refused():
    """Fewer bytes than the header needs (a file that shrank between reads): refused."""
    whole = file_with(b'{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"ab")
    assert parse_or_refuse(whole) is not None
    with pytest.raises(CorruptFileError, match="cut short"):
        _format.parse(NAME, whole[:20], len(whole))
    with pytest.raises(CorruptFileError, match="first 8"):
        _format.parse(NAME, whole[:5], len(whole))


def test_the_format_imports_neither_torch_nor_numpy():
    code = "import sys, deepio.safetensors._format; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
