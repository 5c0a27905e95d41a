"""One DCP data file (``__{rank}_{n}.distcp``) written through deepio's engine: the same
bytes torch's ``FileSystemWriter`` writes, for ``deepio.dcp.FileSystemWriter.write_data``.

``write_file`` writes one file: a ``FillingWriter`` (deepio.save's ``deepio.Writer``:
page-locked staging buffers, aligned direct I/O through the process's default engine,
``fsync`` when durable) instead of a Python file object; a small file gets staging the size of
its estimated bytes (``_staging_for``). Each item's bytes are what torch's own writer puts
there, in its order (bytes items first, then the tensors as planned, or smallest first where
torch's writer would take them through its overlapping loader: one thread and an accelerator,
``_common.overlapping_order``). Tensors are made contiguous CPU tensors first exactly as
torch's loader does (``detach().cpu()``, cloned where the storage holds more than the view),
except CUDA tensors of ``_FILL_MIN`` bytes or more: for those torch's record is pickled from an
unfilled host stand-in of the same sizes and strides (``_device_twin``), and the Writer fills
it from device memory through a small ring of page-locked buffers, computing the CRC-32 from
the same host bytes (``FillingWriter._write_staged``): no whole host copy of the tensor. A
non-dense CUDA tensor is cloned on its device first (torch's loader makes it dense on the
host). A tensor of ``_FILL_MIN`` bytes or more takes deepio.save's filling route
(``_write_filled``; checkpoint/_filling.py): ``torch.save`` under skip_data writes its zip,
with torch's record alignment and CRC option, from the item's offset without the storage's
bytes; the Writer places the storage where torch seeks over it (from the tensor's own memory
by direct I/O where its address suits the device), helper threads compute its CRC-32, and once
every item of the file is written ``_zip._patch_crcs`` puts each item's CRC-32s (and the
serialization id torch derives from them) into that item's zip, before the file is closed and
fsynced: the bytes torch's writer writes. Where the route is refused (a tensor torch refuses
under skip_data) or starts again (``_FillMismatch``), the item is written from its start as a
smaller tensor is: ``torch.save`` into the Writer (torch's zip record and its CRC-32, on the
writing thread); the file is cut at its end. A bytes item (``io.BytesIO`` from the planner:
non-tensor objects pickled by torch) is written as it is. A file not at torch's names ends with
its save's owner mark (``_owner.mark``) past the last item. A write error on either route is
the Writer's, naming the file.

``_FILL_MIN`` and ``_STAGED_DEVICES`` are read from this module at each use (tests set them).
Thread-safety: each call writes its own file; calls may run on several threads at once.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, cast

import torch

from ..checkpoint import DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS, Writer, _filling, _zip
from ..checkpoint._save import _crc_wanted
from . import _torchapi as T
from ._common import item_nbytes


def _contiguous_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """What torch's _SerialCpuLoader hands its writer: detached, on the host, and owning only
    its own bytes (torch.save writes a view's whole storage)."""
    t = tensor.detach().cpu()
    if t.untyped_storage().size() != t.numel() * t.element_size():
        t = t.clone()
    return t


#: The buffer that gathers torch.save's small writes of one item (see write_file): 2,000 items
#: of 1 KiB took 2.7x less CPU through it (0.49 against 1.29 s on the development VM).
_COALESCE = 64 << 10


class _NoClose(io.RawIOBase):
    """The Writer as torch.save sees it: writes go through, close() only flushes (torch.save
    closes the file object it is given; the data file goes on after the item)."""

    def __init__(self, w: Writer) -> None:
        super().__init__()
        self._w = w

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return self._w.write(b)

    def tell(self) -> int:
        return self._w.tell()

    def flush(self) -> None:
        pass  # the Writer keeps staging: nothing must reach the disk before close()


#: Devices whose tensor items of ``_FILL_MIN`` bytes or more are written from device memory
#: through host staging (``_device_twin``; FillingWriter._write_staged) instead of a whole host
#: copy first. Read at each use (tests add "cpu" to run the same route on the host).
_STAGED_DEVICES = frozenset({"cuda"})


def _device_twin(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For a tensor item on a ``_STAGED_DEVICES`` device: (a host stand-in, the device bytes
    of its storage as a flat uint8 tensor). The stand-in is what torch's loader hands its
    writer (``.cpu()``, or ``.to("cpu")``: the same sizes and strides, a storage of its own
    bytes), left unfilled: pickled under skip_data it gives the record torch writes. The
    device bytes are laid out as its storage: the tensor's own span of its storage where its
    strides are the stand-in's (dense; a view's offset kept), else a device clone. None for
    other devices."""
    d = data.detach()
    if d.device.type not in _STAGED_DEVICES:
        return None
    stand = torch.empty_like(d, device="cpu")
    if stand.stride() != d.stride():  # not dense: .cpu() makes it contiguous, as clone() does
        d = d.clone()
        stand = torch.empty_like(d, device="cpu")
    src = torch.empty(0, dtype=torch.uint8, device=d.device)
    src.set_(d.untyped_storage(), d.storage_offset() * d.element_size(), (d.numel() * d.element_size(),), (1,))
    return stand, src


#: torch.save's zip around one tensor's bytes (local headers, data.pkl, directory, padding)
#: is under 2 KiB; a bytes item of unknown size is guessed at this.
_ITEM_OVERHEAD = 4096


def estimate_bytes(items: list[Any]) -> int:
    """A data file's size as its items' plan says: each tensor's bytes, each bytes item's
    size where the planner knows it, plus ``_ITEM_OVERHEAD`` an item."""
    estimate = 0
    for item in items:
        if item.tensor_data is not None:
            estimate += item_nbytes(item)
        elif item.bytes_io_data is not None:
            estimate += int(item.bytes_io_data.nbytes)
        estimate += _ITEM_OVERHEAD
    return estimate


def _staging_for(items: list[Any]) -> tuple[int, int]:
    """The Writer's staging (buffer size, count) for a file of these items: the default for a
    large file, one buffer's worth of the file's estimated size for a small one (staging is
    page-locked memory, made and freed per file: 16 MiB x 4 of it cost 12 ms a file on the
    development VM, which one file per item, of thousands, would pay each time)."""
    estimate = estimate_bytes(items)
    if estimate >= DEFAULT_WRITE_BUFFER:
        return DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS
    return max(4096, -(-estimate // 4096) * 4096), 2


#: Tensor items of this many bytes or more take deepio.save's filling route (see the module);
#: smaller ones are serialized by torch.save into the staging buffers (one pickling pass, their
#: copy and CRC-32 cost less than the route's dry pass and thread pool). Read at each use.
_FILL_MIN = 4 << 20


def _write_filled(
    t: torch.Tensor, w: _filling.FillingWriter, crc: bool, pool: ThreadPoolExecutor | None = None
) -> tuple[dict[int, tuple[int, int]] | None, bool]:
    """Writes the contiguous CPU tensor ``t`` at ``w``'s write position as torch.save writes
    it, on deepio.save's filling route (torch's record alignment, so the bytes torch's writer
    writes; the CRC-32s on ``pool``, the file's). Returns ({file offset of a storage record's
    data: (nbytes, CRC-32)} for _zip._patch_crcs, empty without ``crc``; whether an attempt
    started again). The dict is
    None where the route is not taken (a tensor torch refuses under skip_data, a torch
    without skip_data) or started again (_filling._starts_again: ``w`` is back at the item's
    start, and bytes of the attempt may lie past it, for later items or the caller's truncate
    to replace): the caller then writes the item on the plain route. Other errors are
    raised."""
    if not hasattr(torch.serialization, "skip_data"):
        return None, False
    protocol = torch.serialization.DEFAULT_PROTOCOL  # torch.save's default: what torch's writer uses
    found = _filling._storages(t, protocol)
    if found is None:
        return None, False
    offset = w.tell()
    try:
        return _filling._save_filling(t, w, protocol, found, crc=crc, aligned=False, pool=pool), False
    except Exception as e:
        if not _filling._starts_again(e, w):
            raise
    w._rewind(offset)
    return None, True


def write_file(
    path: str,
    key: str,
    items: list[Any],
    planner: Any,
    durable: bool,
    by_size: bool = False,
    handle: Any = None,
    mark: bytes = b"",
) -> list[Any]:
    """Writes one data file: the bytes items, then the tensors (torch's order: as planned, or
    smallest first with ``by_size``, as torch's overlapping loader hands them over); returns
    the WriteResults with each item's place (torch's _StorageInfo). Tensors of ``_FILL_MIN``
    bytes or more go on the filling route (a ``_STAGED_DEVICES`` tensor as its host
    stand-in's record, filled from device memory through host staging), the others through
    torch.save of their host copy; the CRC-32s of the filled records (computed on one thread
    pool for the file) are put in once every item is written, before the file is closed (and
    flushed to stable storage when ``durable``). ``handle``: the engine (None: the default).
    ``mark``: the owner mark written past the last item (``_owner.mark``; empty: none)."""
    results = []
    size, count = _staging_for(items)
    w = _filling.FillingWriter(path, durable=durable, buffer_size=size, buffers=count, handle=handle)
    crc = _crc_wanted(None)  # torch.save's choice: torch's writer calls it with its defaults
    crcs: dict[int, tuple[int, int]] = {}
    archives: list[tuple[int, int]] = []  # (offset, length) of each filled item's zip
    started_again = False
    pool = ThreadPoolExecutor(_filling._crc_threads(), thread_name_prefix="deepio-crc") if crc else None
    try:
        tensors = [i for i in items if i.type != T.WriteItemType.BYTE_IO]
        ordered = [i for i in items if i.type == T.WriteItemType.BYTE_IO]
        ordered += sorted(tensors, key=item_nbytes) if by_size else tensors
        for item in ordered:
            data = planner.resolve_data(item)
            offset = w.tell()
            if item.type == T.WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise TypeError(f"deepio.dcp: bytes item {item.index.fqn!r} resolved to {type(data).__name__}")
                w.write(data.getbuffer())
            else:
                twin = _device_twin(data) if data.nbytes >= _FILL_MIN else None
                t = twin[0] if twin is not None else _contiguous_cpu(data)
                if twin is not None:
                    w._twins[t.untyped_storage()._cdata] = _filling._Staged(twin[1])
                filled, again = (
                    _write_filled(t, w, crc, pool) if t.untyped_storage().nbytes() >= _FILL_MIN else (None, False)
                )
                if twin is not None:
                    w._twins.clear()
                    if filled is None:  # the plain route needs the bytes on the host
                        t = _contiguous_cpu(data)
                started_again = started_again or again
                if filled is not None:
                    crcs.update(filled)
                    archives.append((offset, w.tell() - offset))
                else:
                    # torch.save makes some 30 small writes an item (zip headers, the pickle)
                    # around the one of the tensor's bytes: a small buffer in front of the Writer
                    # turns them into one call; the tensor's bytes still go straight to the Writer.
                    out = io.BufferedWriter(_NoClose(w), _COALESCE)
                    torch.save(t, cast(IO[bytes], out))
                    out.flush()
            length = w.tell() - offset
            place = T.StorageInfo(key, offset, length)
            results.append(T.WriteResult(index=item.index, size_in_bytes=length, storage_data=place))
        if mark:
            w.write(mark)  # past every item: no reader's range reaches it
        if started_again:
            w.truncate()  # what a filling attempt left past the last item
        if crcs:
            w.flush()  # every byte in the file: the CRC-32s go into the zips there
            _zip._patch_crcs(path, crcs, archives)
        w.close()  # flushes, and fsyncs when durable: raises the first write error
    except BaseException as e:
        cause = w._error
        w.discard()
        if isinstance(cause, OSError) and cause is not e:
            # torch's writer goes on after write() or seek() raised and fails on its own
            # ("unexpected pos"): the Writer's error, naming the file, is the one to report.
            raise cause from None
        raise
    finally:
        if pool is not None:  # threads start with the first filled item, if any
            pool.shutdown(wait=True)
    return results
