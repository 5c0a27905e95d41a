"""The safetensors format itself, both ways, with no I/O and no torch: bytes in, ``Header`` out;
tensor descriptions in, header bytes out.

The format (public, https://github.com/huggingface/safetensors): 8 bytes little-endian header
length N, N bytes of UTF-8 JSON ``{"name": {"dtype", "shape", "data_offsets": [begin, end]},
..., "__metadata__": {str: str}}`` padded with spaces to a multiple of 8, then the data
section; offsets are relative to it and the tensors tile it exactly.

``parse`` is the specification of what deepio accepts. It returns a Header only when all of
this holds, and otherwise raises ``deepio.CorruptFileError`` (a ValueError naming the file and,
whenever one is at fault, the tensor) and never any other exception, whatever the bytes:

* the file has its 8-byte length; the length is at most MAX_HEADER_BYTES (safetensors' limit)
  and the header fits in the file;
* the header is UTF-8 JSON, an object, naming no key twice, nested no deeper than Python's
  JSON parser can follow;
* ``__metadata__``, when present and not null, maps strings to strings;
* every other entry is an object with a known ``dtype`` (a string), a ``shape`` of
  non-negative integers whose product, each zero counted as one, fits in a signed 64-bit
  integer (so that every stride does: torch refuses larger ones), and ``data_offsets``
  ``[begin, end]`` of integers with ``0 <= begin <= end``;
* shape x dtype width is a whole number of bytes equal to ``end - begin``;
* the ranges, sorted, tile ``[0, file size - 8 - N)`` with neither overlap nor gap: every
  tensor lies within the file and the file is exactly as long as declared.

Thread-safe (pure functions over immutable inputs).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import CorruptFileError

# safetensors' dtype names, in the order of its Dtype enum (the writer sorts tensors by this
# rank, highest first, then by name), with their width in bits and torch's name.
DTYPES: list[tuple[str, int, str]] = [
    ("BOOL", 8, "bool"),
    ("F4", 4, "float4_e2m1fn_x2"),  # two values per byte; the file's shape counts values
    ("F6_E2M3", 6, ""),  # no torch dtype
    ("F6_E3M2", 6, ""),
    ("U8", 8, "uint8"),
    ("I8", 8, "int8"),
    ("F8_E5M2", 8, "float8_e5m2"),
    ("F8_E4M3", 8, "float8_e4m3fn"),
    ("F8_E8M0", 8, "float8_e8m0fnu"),
    ("F8_E4M3FNUZ", 8, "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", 8, "float8_e5m2fnuz"),
    ("I16", 16, "int16"),
    ("U16", 16, "uint16"),
    ("F16", 16, "float16"),
    ("BF16", 16, "bfloat16"),
    ("I32", 32, "int32"),
    ("U32", 32, "uint32"),
    ("F32", 32, "float32"),
    ("C64", 64, "complex64"),
    ("F64", 64, "float64"),
    ("I64", 64, "int64"),
    ("U64", 64, "uint64"),
]
RANK = {name: i for i, (name, _, _) in enumerate(DTYPES)}
BITS = {name: bits for name, bits, _ in DTYPES}
TORCH_NAME = {name: tname for name, _, tname in DTYPES}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
_MAX_ELEMENTS = (1 << 63) - 1  # torch's strides are int64


class TensorInfo:
    """One tensor of a file's header: ``name``, ``dtype`` (safetensors' name, e.g. "BF16"),
    ``shape`` (as in the file), ``begin``/``end`` (byte range within the data section)."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def __repr__(self) -> str:
        return f"TensorInfo({self.name!r}, {self.dtype}, {list(self.shape)}, [{self.begin}, {self.end}])"


class Header:
    """A parsed, checked header: ``tensors`` (in file order of their data), ``metadata``
    (dict or None), ``data_offset`` (where the data section starts: 8 + header length) and
    ``file_size``."""

    __slots__ = ("path", "tensors", "metadata", "data_offset", "file_size")

    def __init__(
        self, path: str, tensors: list[TensorInfo], metadata: dict[str, str] | None, data_offset: int, file_size: int
    ) -> None:
        self.path, self.tensors, self.metadata = path, tensors, metadata
        self.data_offset, self.file_size = data_offset, file_size

    @property
    def data_bytes(self) -> int:
        return self.file_size - self.data_offset


def _bad(path: str, what: str) -> CorruptFileError:
    return CorruptFileError(path, f"not a valid safetensors file: {what}")


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _fits(shape: list[int]) -> bool:
    """Whether the product of ``shape``, each zero counted as one, is at most 2**63 - 1
    (stopping early: a hostile header may hold huge integers)."""
    n = 1
    for d in shape:
        n *= max(d, 1)
        if n > _MAX_ELEMENTS:
            return False
    return True


def _short(x: Any) -> str:
    """``repr(x)`` cut to 200 characters: a message must stay readable whatever the header holds."""
    r = repr(x)
    return r if len(r) <= 200 else r[:200] + "..."


def header_end(data: bytes | bytearray | memoryview) -> int:
    """How many bytes from the start of a file ``parse`` looks at: 8 + the header length that
    ``data``'s first 8 bytes declare; 8 where ``data`` is shorter than that or the length is
    over MAX_HEADER_BYTES (``parse`` then refuses the file without reading further)."""
    if len(data) < 8:
        return 8
    (n,) = struct.unpack_from("<Q", data, 0)
    return 8 + n if n <= MAX_HEADER_BYTES else 8


def parse(path: str, data: bytes | bytearray | memoryview, file_size: int | None = None) -> Header:
    """Parses and checks the header of a file (the rules are in this module's docstring).

    ``data``: the file's first bytes, at least ``min(file_size, header_end(data))`` of them
    (the whole file will do); ``file_size``: the whole file's size (default: ``len(data)``);
    ``path``: the file's name, for the messages. Raises CorruptFileError, only."""
    size = len(data) if file_size is None else file_size
    if size < len(data):
        raise ValueError(f"file_size {size} is smaller than the {len(data)} bytes given")
    if size < 8:
        raise _bad(path, f"{size} bytes, shorter than the 8-byte header length")
    if len(data) < 8:
        raise _bad(path, f"the first 8 of its {size} bytes were not given (the file shrank?)")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > MAX_HEADER_BYTES:
        raise _bad(path, f"header length {n} is over the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > size:
        raise _bad(path, f"header length {n} runs past the end of the {size}-byte file (truncated?)")
    if 8 + n > len(data):
        raise _bad(path, f"the {n}-byte header was cut short at {len(data) - 8} bytes (the file shrank?)")
    metadata, tensors = _entries(path, bytes(data[8 : 8 + n]), size - 8 - n)
    _check_tiling(path, tensors, size - 8 - n)
    return Header(path, tensors, metadata, 8 + n, size)


def _document(path: str, raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(path, f"the header is not UTF-8 ({e})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise _bad(path, f"the header names {_short(e.args[0])} twice") from None
    except ValueError as e:  # json.JSONDecodeError; integers over Python's digit limit
        raise _bad(path, f"the header is not valid JSON ({e})") from None
    except RecursionError:
        raise _bad(path, "the header's JSON is nested too deeply") from None
    if not isinstance(doc, dict):
        raise _bad(path, f"the header is a JSON {type(doc).__name__}, not an object")
    return doc


def _entries(path: str, raw: bytes, data_bytes: int) -> tuple[dict[str, str] | None, list[TensorInfo]]:
    """(metadata, tensors in header order), each entry checked on its own against a data
    section of ``data_bytes``."""
    doc = _document(path, raw)
    metadata = doc.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _bad(path, "__metadata__ must map strings to strings")
    tensors: list[TensorInfo] = []
    for name, entry in doc.items():
        where = f"tensor {_short(name)}"
        if not isinstance(entry, dict):
            raise _bad(path, f"{where}: the entry is a {type(entry).__name__}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise _bad(path, f"{where}: missing or non-string dtype")
        if dtype not in BITS:
            raise _bad(path, f"{where}: unknown dtype {_short(dtype)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _bad(path, f"{where}: shape must be a list of non-negative integers, got {_short(shape)}")
        if not _fits(shape):
            raise _bad(path, f"{where}: shape {_short(shape)} is too large for 64-bit strides")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(
                path, f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {_short(offsets)}"
            )
        bits = math.prod(shape) * BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            need = f"{bits // 8} bytes" if bits % 8 == 0 else f"{bits} bits (not whole bytes)"
            raise _bad(
                path,
                f"{where}: shape {_short(shape)} of {dtype} needs {need} but data_offsets {_short(offsets)} hold "
                f"{_short(offsets[1] - offsets[0])}",
            )
        if offsets[1] > data_bytes:
            raise _bad(
                path,
                f"{where}: data_offsets {_short(offsets)} run past the end of the {data_bytes}-byte data section "
                "(truncated?)",
            )
        tensors.append(TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1]))
    return metadata, tensors


def _check_tiling(path: str, tensors: list[TensorInfo], data_bytes: int) -> None:
    """Sorts ``tensors`` by their data and checks that they tile [0, data_bytes) exactly."""
    tensors.sort(key=lambda t: (t.begin, t.end))
    at, prev = 0, None
    for t in tensors:
        if t.begin < at:
            raise _bad(
                path, f"tensor {_short(t.name)} [{t.begin}, {t.end}] overlaps tensor {_short(prev)} (ends at {at})"
            )
        if t.begin > at:
            after = f"tensor {_short(prev)} ends" if prev is not None else "the data section starts"
            raise _bad(path, f"tensor {_short(t.name)} starts at {t.begin} but {after} at {at}: a gap")
        at, prev = t.end, t.name
    if at != data_bytes:
        raise _bad(path, f"the tensors cover {at} bytes but the data section holds {data_bytes}")


def encode(
    entries: Sequence[tuple[str, str, Sequence[int], int]], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[tuple[int, int]]]:
    """The header safetensors writes for ``entries`` (name, dtype name, shape as the file
    counts it, nbytes) and ``metadata``: (the 8-byte length and the JSON padded with spaces to a
    multiple of 8, [(index into ``entries``, offset in the data section)] in file order:
    dtype rank highest first, then name). The caller has checked names, dtypes and metadata."""
    order = sorted(range(len(entries)), key=lambda i: (-RANK[entries[i][1]], entries[i][0]))
    doc: dict[str, Any] = {}
    if metadata is not None:
        # Sorted: safetensors orders these keys at random (a Rust HashMap), so equal inputs
        # give equal files here only; with at most one key the files are byte-identical.
        doc["__metadata__"] = dict(sorted(metadata.items()))
    at = 0
    layout = []
    for i in order:
        name, dtype, shape, n = entries[i]
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + n]}
        layout.append((i, at))
        at += n
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, layout
