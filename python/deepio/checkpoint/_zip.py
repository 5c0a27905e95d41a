"""torch's zip checkpoint format as deepio.save and deepio.load need it: torch's zip writer
driven with deepio's choices (CRC-32s, record alignment), the CRC-32s written into records
torch left without them, where a record's data starts, and a file over memory for torch's
zip reader.

Offsets here are file offsets; a record's data starts after its local header's 30 bytes, its
name and its extra field (whose lengths may differ from the central directory's). Nothing
here holds state; ``_patch_crcs`` changes the file only where the archive looks as torch
writes it, and otherwise warns and leaves the CRC-32s at 0 (an ``OSError`` of the file itself
is raised). Parsing errors of ``_data_start``/``_storage_spans`` are ``zipfile.BadZipFile``
for their callers to handle: neither deepio.save nor deepio.load lets one reach its caller.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import warnings
import zipfile
import zlib
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ._writer import Writer

#: The filling route's records start at multiples of this (torch's storage_alignment, which
#: the file records: torch.load's offset arithmetic follows it), so a storage whose memory is
#: aligned too goes to the disk by direct I/O straight from that memory; tensors torch.load or
#: deepio.load read from such a file are page-aligned. Only where the padding (under a page a
#: record) costs at most 1/_ALIGN_PADDING_SHARE of the storages' bytes; else torch's default.
_RECORD_ALIGNMENT = 4096
_ALIGN_PADDING_SHARE = 64


def _record_alignment(storages: list[Any]) -> int | None:
    """_RECORD_ALIGNMENT where its padding is cheap for these storages, else None (torch's)."""
    total = sum(st.nbytes() for st in storages)
    return _RECORD_ALIGNMENT if len(storages) * _RECORD_ALIGNMENT * _ALIGN_PADDING_SHARE <= total else None


def _data_start(header_offset: int, head: bytes) -> int:
    """Where a zip record's data starts, from the 30 bytes of its local header (at
    ``header_offset``): the header's own name and extra field lengths, which may differ from
    the central directory's."""
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header at {header_offset}")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return header_offset + 30 + name_len + extra_len


def _patch_crcs(path: str, crcs: dict[int, tuple[int, int]], archives: list[tuple[int, int]] | None = None) -> None:
    """Writes the CRC-32s of the records whose data starts at a key of ``crcs`` ({file offset:
    (nbytes, CRC-32)}) into the zip torch wrote under skip_data, where they are 0: the record's
    data descriptor (its local header, without one) and its central directory entry. A record
    of another size or with a CRC set is left alone. The archive's ``.data/serialization_id``
    (torch derives its second half from every record's CRC-32, in the order written) is
    rewritten to what torch would have written with those CRCs. ``archives``: [(file offset,
    length)] of the zips in the file, each read as a zip of its own (a DCP data file holds one
    an item, one after the other); None: the whole file is one zip. Should an archive not
    look as torch writes it, the file keeps CRC 0 for its records (as crc32=False gives;
    torch.load does not check them) and a warning says so."""
    patches: list[tuple[int, bytes]] = []
    placed = 0
    try:
        f = open(path, "r+b")
    except PermissionError as e:  # a umask without the owner's read bit: written, not readable
        warnings.warn(f"deepio: {path}: records left without CRC-32 ({e})", RuntimeWarning, stacklevel=3)
        return
    with f:
        for base, length in archives if archives is not None else [(0, os.fstat(f.fileno()).st_size)]:
            try:
                got, n = _archive_patches(_FileWindow(f, base, length), base, crcs)
            except (zipfile.BadZipFile, struct.error, ValueError) as e:
                warnings.warn(
                    f"deepio: {path}: records of the zip at {base} left without CRC-32 ({e})",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
            patches += got
            placed += n
        for at, data in patches:
            f.seek(at)
            f.write(data)
    if placed != len(crcs):
        warnings.warn(
            f"deepio: {path}: {len(crcs) - placed} of {len(crcs)} records left without CRC-32",
            RuntimeWarning,
            stacklevel=3,
        )


#: torch's record of a unique id for the archive, and the largest value of its size_t.
_SERIALIZATION_ID = ".data/serialization_id"
_SIZE_T = (1 << 64) - 1


def _archive_patches(f: Any, base: int, crcs: dict[int, tuple[int, int]]) -> tuple[list[tuple[int, bytes]], int]:
    """What _patch_crcs writes into the zip ``f`` (its offset 0 at file offset ``base``) for the
    records whose data starts at a key of ``crcs``: ([(file offset, bytes)], how many records
    got their CRC-32). The serialization id is torch's (caffe2 PyTorchStreamWriter::
    writeSerializationId): 20 digits of a hash of the record names, then 20 of
    c10::hash_combine folded over each record's CRC-32 in the order written; its own record's
    CRC-32 changes with it."""
    patches: list[tuple[int, bytes]] = []
    crc_at: dict[int, tuple[int, int]] = {}  # per record of the archive: (descriptor CRC field, entry CRC field)
    id_info = None
    combined = 0
    placed = 0
    with zipfile.ZipFile(f) as z:
        infos, entry_at = z.infolist(), z.start_dir
    for n, info in enumerate(infos):
        name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
        entry, entry_at = entry_at, entry_at + 46 + len(name) + len(info.extra) + len(info.comment)
        f.seek(info.header_offset)
        start = _data_start(info.header_offset, f.read(30))
        at = info.header_offset + 14  # the local header's CRC field
        if info.flag_bits & 0x08:  # a data descriptor follows the data
            f.seek(start + info.file_size)
            at = start + info.file_size + (4 if f.read(4) == b"PK\x07\x08" else 0)
        crc_at[n] = (at, entry + 16)
        crc = info.CRC
        want = crcs.get(base + start)
        fits = info.compress_type == zipfile.ZIP_STORED and info.compress_size == info.file_size
        if want is not None and want[0] == info.file_size and info.CRC == 0 and fits:
            f.seek(entry)
            if f.read(4) != b"PK\x01\x02":
                raise zipfile.BadZipFile(f"no central directory entry at {entry}")
            crc = want[1]
            patches += [(base + at, struct.pack("<I", crc)), (base + entry + 16, struct.pack("<I", crc))]
            placed += 1
        if info.filename.endswith("/" + _SERIALIZATION_ID):
            id_info = (n, info, start)
        else:
            combined = combined ^ ((crc + 0x9E3779B9 + ((combined << 6) & _SIZE_T) + (combined >> 2)) & _SIZE_T)
    if placed and id_info is not None:
        n, info, start = id_info
        f.seek(start)
        old = f.read(info.file_size)
        if len(old) == 40 and old.isdigit():
            new = old[:20] + b"%020d" % combined
            id_crc = struct.pack("<I", zlib.crc32(new))
            patches += [(base + start, new), (base + crc_at[n][0], id_crc), (base + crc_at[n][1], id_crc)]
    return patches, placed


def _torch_zip(
    obj: Any, w: Writer, pickle_module: Any, pickle_protocol: int, crc32: bool, alignment: int | None = None
) -> None:
    """torch.save's own steps (torch.serialization._save into torch's zip writer on ``w``) with
    the CRC choice, and the records' alignment where ``alignment`` is given, made here rather
    than in torch's global options (which other threads may be saving under)."""
    import torch

    ser = torch.serialization
    get_alignment = getattr(ser, "_get_storage_alignment", None)
    zf: Any
    if get_alignment is None:  # a torch whose writer has no alignment: its own
        zf = torch._C.PyTorchFileWriter(cast(IO[bytes], w), crc32)
    else:
        zf = torch._C.PyTorchFileWriter(cast(IO[bytes], w), crc32, alignment or get_alignment())
        if alignment:
            zf = _AlignedZip(zf, alignment)
    ser._save(obj, zf, pickle_module, pickle_protocol, False)
    if isinstance(zf, _AlignedZip) and not zf.said:  # a torch whose _save does not write it
        zf.write_record(".storage_alignment", str(alignment), len(str(alignment)))
    zf.write_end_of_file()
    w.flush()


class _AlignedZip:
    """torch's zip writer, whose ``.storage_alignment`` record (torch.save writes torch's
    global option there) says the alignment it was made with: torch.load computes storage
    offsets from it (``torch.utils.serialization.config.load.calculate_storage_offsets``)."""

    def __init__(self, zf: Any, alignment: int) -> None:
        self._zf, self._alignment = zf, alignment
        self.said = False  # whether the record was written

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if name == ".storage_alignment":
            data = str(self._alignment)
            nbytes = len(data)
            self.said = True
        self._zf.write_record(name, data, nbytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._zf, name)


# What torch.load raises on a corrupt or truncated file (random bytes give UnpicklingError,
# IndexError "pop from empty list", UnicodeDecodeError, KeyError; a truncated zip EOFError or


class _Seekable(io.RawIOBase):
    """A read-only, seekable file of ``self._len`` bytes; subclasses say what its bytes are
    (``readinto`` at ``self._pos``)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self._len, self._pos = length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._len}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos


class _FileWindow(_Seekable):
    """A read-only file of the ``length`` bytes of the open file ``f`` from ``base`` on (one
    zip among others in a file, for zipfile)."""

    def __init__(self, f: io.BufferedRandom, base: int, length: int) -> None:
        super().__init__(length)
        self._f, self._base = f, base

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = max(0, min(len(dest), self._len - self._pos))
        self._f.seek(self._base + self._pos)
        got = self._f.readinto(dest[:n]) or 0
        self._pos += got
        return got


class _MemoryFile(_Seekable):
    """A read-only file over a memoryview, for torch's zip reader (the archive's directory
    and its small records; the storages are never read through it)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self._view = view

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = max(0, min(len(dest), len(self._view) - self._pos))
        dest[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


def _storage_spans(view: memoryview) -> list[tuple[int, int]]:
    """[(start, end)] of the data of every non-empty storage record (the archive's ``/data/``
    entries) of the zip checkpoint ``view``, sorted; raises ``zipfile.BadZipFile`` (or
    ``struct.error``, ``ValueError``) where the archive cannot be read."""
    spans: list[tuple[int, int]] = []
    with zipfile.ZipFile(cast(IO[bytes], _MemoryFile(view))) as z:
        for info in z.infolist():
            if "/data/" in info.filename and info.file_size:
                start = _data_start(info.header_offset, bytes(view[info.header_offset : info.header_offset + 30]))
                spans.append((start, start + info.file_size))
    return sorted(spans)
