"""Where a DCP tensor item's bytes lie: the layout of ``torch.save(tensor)`` (a small zip that
DCP stores per tensor item) from the item's first and last bytes, and which bytes of the
stored tensor a load's piece of it covers.

``layout(head, tail, length)`` gives a ``Layout`` (dtype, size, stride, storage offset, and
the item-relative range of the storage's bytes) from ``head`` (the item's first bytes) and
``tail`` (its last bytes: the zip's central directory, which holds the records' sizes: torch's
zip writer leaves them out of the local headers). It returns None for anything else than one
dense little-endian tensor over one stored record whose data.pkl and local headers lie in
``head`` and whose directory lies in ``tail``: the caller then reads the whole item and lets
torch.load rebuild it. The pickle is read by an unpickler that knows only torch's tensor
rebuild function, torch's storage classes and OrderedDict (anything else: None), so nothing
from the file runs. ``piece(layout, offsets, lengths)`` gives the (start, nbytes) of the bytes
a contiguous piece covers, or None where the piece is not one run of bytes.

Pure functions: no I/O, no state; thread-safe.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import warnings
import zipfile
from typing import IO, Any, NamedTuple, cast

import torch

from ..checkpoint._zip import _data_start, _MemoryFile, _Seekable


class Layout(NamedTuple):
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int  # elements
    data_start: int  # the storage's first byte, from the item's start
    data_nbytes: int
    crc: int = 0  # the CRC-32 the zip records for the storage's bytes (0: none recorded)
    record: str = ""  # the storage's record's name in the zip
    pkl_start: int = 0  # data.pkl's bytes, from the item's start (in ``head``)
    pkl_nbytes: int = 0
    pkl_crc: int = 0  # the CRC-32 the zip records for data.pkl (0: none recorded)


class _Sparse(_Seekable):
    """An item of ``length`` bytes of which only ``head`` (at 0) and ``tail`` (at the end) are
    known, for zipfile's reader; reading elsewhere raises ``zipfile.BadZipFile``."""

    def __init__(self, head: bytes, tail: bytes, length: int) -> None:
        super().__init__(length)
        self._head, self._tail = head, tail

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = max(0, min(len(dest), self._len - self._pos))
        start, end = self._pos, self._pos + n
        tail_at = self._len - len(self._tail)
        if end <= len(self._head):
            dest[:n] = self._head[start:end]
        elif start >= tail_at:
            dest[:n] = self._tail[start - tail_at : end - tail_at]
        else:
            raise zipfile.BadZipFile("outside the bytes read")
        self._pos = end
        return n


def _storage_dtypes() -> dict[str, torch.dtype]:
    """torch's typed storage classes by name (FloatStorage, ...) and their dtypes, read once
    (each class's ``dtype`` warns that TypedStorage is deprecated)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in dir(torch):
            dtype = getattr(getattr(torch, name, None), "dtype", None) if name.endswith("Storage") else None
            if isinstance(dtype, torch.dtype):
                out[name] = dtype
    return out


_STORAGE_DTYPES = _storage_dtypes()


class _Storage(NamedTuple):
    dtype: torch.dtype
    key: str
    numel: int


def _rebuild(storage: Any, storage_offset: int, size: Any, stride: Any, *rest: Any) -> tuple[Any, ...]:
    return (storage, int(storage_offset), tuple(int(s) for s in size), tuple(int(s) for s in stride), rest)


class _LayoutUnpickler(pickle.Unpickler):
    """data.pkl of torch.save(tensor): only what a dense tensor needs is known."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # the persistent id then carries the dtype
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage" or pid[3] != "cpu":
            raise pickle.UnpicklingError("not a CPU storage")
        if not isinstance(pid[1], torch.dtype):
            raise pickle.UnpicklingError("not a typed storage")
        return _Storage(pid[1], str(pid[2]), int(pid[4]))


#: Whether ``layout`` reads plain central directories itself (``_directory``); tests turn it
#: off to compare with zipfile's reading. Read at each use.
_FAST_DIRECTORY = True


class _Info(NamedTuple):
    """What ``layout`` reads of a central directory entry (zipfile.ZipInfo's names)."""

    filename: str
    compress_type: int
    header_offset: int
    file_size: int
    CRC: int


def _directory(tail: bytes, length: int) -> dict[str, Any] | None:
    """The central directory of a zip of ``length`` bytes from its last bytes ``tail``, where
    it is the plain kind torch writes for a tensor (no comment, one disk, entries without
    zip64 fields, all of it in ``tail``; torch ends every zip with a zip64 end record and its
    locator before the classic one): {record name after the archive folder: _Info}. None
    otherwise: zipfile then reads it (a few times slower: a per-item cost of a load)."""
    end = len(tail) - 22  # the classic end record
    if end < 0 or tail[end : end + 4] != b"PK\x05\x06":
        return None
    disk, cd_disk, n_disk, n, cd_size, cd_off, comment = struct.unpack_from("<HHHHIIH", tail, end + 4)
    if comment or disk or cd_disk:
        return None
    tail_at = length - len(tail)
    if end >= 20 and tail[end - 20 : end - 16] == b"PK\x06\x07":  # zip64's locator, then its end record
        z64 = end - 20 - 56
        if z64 < 0 or tail[z64 : z64 + 4] != b"PK\x06\x06":
            return None
        size, disk64, cd_disk64, n_disk, n, cd_size, cd_off = struct.unpack_from("<Q4xIIQQQQ", tail, z64 + 4)
        (at,) = struct.unpack_from("<Q", tail, end - 20 + 8)
        if size != 44 or disk64 or cd_disk64 or at != tail_at + z64:
            return None
        end = z64
    if n_disk != n or cd_off < tail_at or cd_off + cd_size != tail_at + end:
        return None
    out: dict[str, Any] = {}
    pos = cd_off - tail_at
    for _ in range(n):
        if pos + 46 > end:
            return None
        sig, method, crc, _, usize, nlen, xlen, clen, hoff = struct.unpack_from("<4s6xH4xIIIHHH8xI", tail, pos)
        if sig != b"PK\x01\x02" or 0xFFFFFFFF in (usize, hoff):
            return None
        try:
            name = tail[pos + 46 : pos + 46 + nlen].decode("ascii")
        except UnicodeDecodeError:
            return None
        out[name.split("/", 1)[-1]] = _Info(name, method, hoff, usize, crc)
        pos += 46 + nlen + xlen + clen
    return out if pos == end else None


def layout(head: bytes, tail: bytes, length: int) -> Layout | None:
    try:
        # torch names records "<archive folder>/<name>": data.pkl, byteorder, data/<key>
        infos = _directory(tail, length) if _FAST_DIRECTORY else None
        if infos is None:
            with zipfile.ZipFile(cast(IO[bytes], _Sparse(head, tail, length))) as z:
                infos = {i.filename.split("/", 1)[-1]: i for i in z.infolist()}
        pkl, order = infos.get("data.pkl"), infos.get("byteorder")
        if pkl is None or pkl.compress_type != zipfile.ZIP_STORED:
            return None
        start = _data_start(pkl.header_offset, head[pkl.header_offset : pkl.header_offset + 30])
        if start + pkl.file_size > len(head):
            return None
        if order is not None:
            at = _data_start(order.header_offset, head[order.header_offset : order.header_offset + 30])
            if head[at : at + order.file_size] != b"little":
                return None
        obj = _LayoutUnpickler(io.BytesIO(head[start : start + pkl.file_size])).load()
        storage, offset, size, stride, _ = obj
        if not isinstance(storage, _Storage):
            return None
        rec = infos.get(f"data/{storage.key}")
        if rec is None or rec.compress_type != zipfile.ZIP_STORED:
            return None
        data = _data_start(rec.header_offset, head[rec.header_offset : rec.header_offset + 30])
        nbytes = storage.numel * torch.empty((), dtype=storage.dtype).element_size()
        if rec.file_size != nbytes or data + nbytes > length:
            return None
        return Layout(
            storage.dtype, size, stride, offset, data, nbytes, rec.CRC, rec.filename, start, pkl.file_size, pkl.CRC
        )
    except (zipfile.BadZipFile, pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, EOFError):
        return None


def bad_record(item: Any, crc32: Any) -> tuple[str, int, int] | None:
    """The first record of the zip ``item`` (a whole DCP tensor item: bytes, a memoryview)
    whose stored bytes do not match the CRC-32 its central directory records: (its name, the
    recorded CRC-32, the CRC-32 of its bytes); None where all match. Records that carry no
    CRC-32 (0: torch's crc32 option off) are not checked; nor is an item that is not a zip
    of stored records (torch.load reports what it makes of that). ``crc32(data, value=0)`` as
    zlib's."""
    view = memoryview(item).cast("B")
    try:
        with zipfile.ZipFile(cast(IO[bytes], _MemoryFile(view))) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError):
        return None
    for info in infos:
        if info.CRC == 0 or info.compress_type != zipfile.ZIP_STORED:
            continue
        try:
            start = _data_start(info.header_offset, bytes(view[info.header_offset : info.header_offset + 30]))
        except zipfile.BadZipFile:
            return info.filename, info.CRC, 0
        got = crc32(view[start : start + info.file_size]) & 0xFFFFFFFF
        if start + info.file_size > len(view) or got != info.CRC:
            return info.filename, info.CRC, got
    return None


def bad_pkl(lay: Layout, head: Any, crc32: Any) -> tuple[str, int, int] | None:
    """As ``bad_record`` for the data.pkl record of ``lay``'s item, from ``head`` (the item's
    first bytes, as ``layout`` was given them): the pickle that says which bytes are the
    tensor's, checked where the tensor's bytes are read straight into a destination."""
    if not lay.pkl_crc:
        return None
    got = crc32(memoryview(head).cast("B")[lay.pkl_start : lay.pkl_start + lay.pkl_nbytes]) & 0xFFFFFFFF
    return None if got == lay.pkl_crc else ("data.pkl", lay.pkl_crc, got)


def bad_layout(lay: Layout, item: Any, crc32: Any) -> tuple[str, int, int] | None:
    """As ``bad_record`` for a whole item whose layout is ``lay``: its data.pkl and its
    storage's record (``item``: the item's bytes), without parsing the zip again."""
    view = memoryview(item).cast("B")
    bad = bad_pkl(lay, view, crc32)
    if bad is not None or not lay.crc:
        return bad
    got = crc32(view[lay.data_start : lay.data_start + lay.data_nbytes]) & 0xFFFFFFFF
    return None if got == lay.crc else (lay.record, lay.crc, got)


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(size):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def piece(lay: Layout, offsets: Any, lengths: Any) -> tuple[int, int] | None:
    """(start from the item's first byte, nbytes) of the stored tensor's piece at ``offsets``
    with ``lengths`` (a load's narrowing of it), where the tensor is row-major and the piece is
    one run of its bytes: every dimension after the last narrowed one whole, every one before
    it of length 1. None otherwise (and for a piece outside the tensor)."""
    size, offsets, lengths = lay.size, [int(o) for o in offsets], [int(n) for n in lengths]
    if len(offsets) != len(size) or len(lengths) != len(size):
        return None
    if any(o < 0 or n < 0 or o + n > s for o, n, s in zip(offsets, lengths, size)):
        return None
    if lay.stride != _contiguous_strides(size) and any(n > 1 for n in size):
        return None
    narrowed = [d for d in range(len(size)) if lengths[d] != size[d]]
    if narrowed and any(lengths[d] != 1 for d in range(narrowed[-1])):
        return None
    item = torch.empty((), dtype=lay.dtype).element_size()
    first = lay.storage_offset + sum(o * st for o, st in zip(offsets, _contiguous_strides(size)))
    numel = 1
    for n in lengths:
        numel *= n
    start, nbytes = first * item, numel * item
    if start + nbytes > lay.data_nbytes:
        return None
    return lay.data_start + start, nbytes
