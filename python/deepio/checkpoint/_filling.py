"""deepio.save's filling route: torch writes the zip with every storage's bytes left out
(``torch.serialization.skip_data``) and seeks over each record's data; the ``FillingWriter``
puts the storage there instead, from its own memory where it can.

Protocol. A dry pickling pass (``_storages``) finds the storages torch will write, or sees a
tensor torch refuses under skip_data (the plain route then saves the object). Then torch's own
pickler runs under skip_data with a pickle module (``_filling_pickle_module``) that queues on
``FillingWriter._fills``, in torch's record order, each storage torch's pickler gives a new
record key. While ``_filling``, every forward ``seek(n, SEEK_CUR)`` must be the next queued
storage's record of ``n`` bytes: CUDA storages go through the engine's GPU path; host storages
of ``_IN_PLACE_MIN`` bytes or more straight from their memory by direct I/O where the device
takes their address (``_direct_unit``), their unaligned ends staged; smaller ones are staged.
A host stand-in's storage that the caller twinned with device bytes (``FillingWriter._twins``,
deepio.dcp's CUDA items: the record of the tensor's host copy, CRC-32 included) gets those
bytes through host memory in pieces (``_write_staged``).
With CRC-32s wanted, each host storage's CRC-32 is computed on helper threads (``_crc32``, in
``_CRC_PIECE`` pieces combined where zlib-ng can) while it is written; ``_save_filling``
returns them for ``_zip._patch_crcs`` to put into the file once it is closed.

Errors. A skip where no storage, or another size of storage, is queued, and storages left
unplaced at the end, raise ``_FillMismatch``, a ``RuntimeError`` that never reaches the
caller: deepio.save starts again on the plain route (``_starts_again``). The Writer keeps the
mismatch as its error, so torch's own complaint about the failed seek ("unexpected pos") is
recognised too. The CRC threads are shut down before ``_save_filling`` returns or raises: none
reads a storage after it.

Hooks and settings (``_crc32``, ``_crc32_combine``, ``_CRC_PIECE``, ``_IN_PLACE_MIN``,
``_STAGE_CHUNK``, ``_STAGE_BUFFERS``) are read from this module at each use.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import pickle
import warnings
import zlib
from concurrent import futures
from concurrent.futures import Future as _CrcFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .. import _deepio, _populate
from ._staging import _byte_view, _is_device
from ._writer import Writer
from ._zip import _record_alignment, _torch_zip

# The CRC-32 of the zip records deepio.save computes beside its writes: zlib-ng's (PyPI
# "zlib-ng", the "checkpoint" extra; carry-less multiplication, 12 GiB/s on one core of the
# development VM) when it is installed, else the standard library's zlib (3.5 GiB/s there), whose
# CRC then bounds a save on a fast device. Both release the GIL and give the same values.
_crc32: Callable[..., int]  # (data, value=0), as zlib's
# zlib-ng's crc32_combine(crc1, crc2, len2): the CRC-32 of two pieces one after the other, so a
# large storage's CRC is computed in _CRC_PIECE pieces on all the helper threads at once (the
# standard library's zlib has none: a storage is one piece there).
_crc32_combine: Callable[[int, int, int], int] | None
try:
    from zlib_ng import zlib_ng as _zlib_ng

    _crc32 = _zlib_ng.crc32
    _crc32_combine = _zlib_ng.crc32_combine
except ImportError:  # depends on what is installed
    _crc32 = zlib.crc32
    _crc32_combine = None
_CRC_PIECE = 32 << 20

#: save()'s storages from this size are written from their own memory where the device takes
#: it for direct I/O (FillingWriter._direct_unit); smaller ones, and the others, are copied into the
#: staging buffers with the zip's headers around them.
_IN_PLACE_MIN = 4 << 20

#: A device storage placed through host memory (FillingWriter._write_staged) goes in pieces of
#: this size through a ring of this many page-locked buffers.
_STAGE_CHUNK = 32 << 20
_STAGE_BUFFERS = 3


class _Staged:
    """A storage's bytes on a device (``src``: a flat uint8 tensor) that the Writer places
    through host memory with their CRC-32 (FillingWriter._write_staged), not from device
    memory through the engine's GPU path as CUDA sources are."""

    __slots__ = ("src",)

    def __init__(self, src: Any) -> None:
        self.src = src


class _FillMismatch(RuntimeError):
    """torch's second pickling pass asked for storages other than the dry pass found."""


class FillingWriter(Writer):
    """The Writer deepio.save writes through. Outside ``_save_filling`` (``_filling`` False)
    it is a plain ``Writer``; while filling, each forward skip of torch's writer places the
    next queued storage (the module's docstring). save() opens one before pickling anything,
    so that a file it cannot create fails first, whichever route the save then takes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (nbytes, source) for save()'s storages: torch (skip_data) seeks over each record's
        # bytes, and the seek writes the source there instead (see _save_filling).
        self._fills: collections.deque[tuple[int, Any]] = collections.deque()
        self._filling = False  # under _save_filling: every forward skip is a storage's record
        self._dio: tuple[int, int] | None = None  # (memory alignment, block) of direct I/O here
        # save()'s CRC-32s of host storages placed by _fills, computed on a helper thread while
        # the bytes are written: {file offset of the record's data: (nbytes, future CRC)}.
        self._crc_pool: ThreadPoolExecutor | None = None
        self._crcs: dict[int, tuple[int, list[tuple[int, _CrcFuture[int]]]]] = {}
        # {_cdata of a host stand-in's storage: _Staged}: deepio.dcp pickles a device tensor's
        # host stand-in (the record torch's writer writes for the tensor's host copy) and
        # places the device bytes in its record, staged through host memory (_write_staged).
        self._twins: dict[int, _Staged] = {}

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if not (self._filling and whence == os.SEEK_CUR and offset > 0):
            return super().seek(offset, whence)
        self._check()
        if not self._fills:  # a skip where no storage was pickled: never leave a hole
            self._error = _FillMismatch(f"deepio.save: torch skipped {offset} bytes where no storage goes")
            raise self._error
        nbytes, source = self._fills.popleft()
        if nbytes != offset:
            self._error = _FillMismatch(f"deepio.save: torch skipped {offset} bytes where a {nbytes}-byte storage goes")
            raise self._error
        if isinstance(source, _Staged):
            self._write_staged(source.src)
            return self.tell()
        if _is_device(source):
            self._write_device(source)
            return self.tell()
        view = _byte_view(source)
        if self._crc_pool is not None:
            self._crcs[self.tell()] = (nbytes, _crc_pieces(self._crc_pool, view))
        if nbytes >= _IN_PLACE_MIN and (unit := self._direct_unit(source, self.tell())):
            self._write_host_in_place(view, unit)
        else:
            self.write(view)
        return self.tell()

    def _write_staged(self, src: Any) -> None:
        """Writes the bytes of ``src`` (a flat uint8 tensor, on a device) at the write position
        through host memory: ``_STAGE_CHUNK`` pieces copied into a ring of
        ``_STAGE_BUFFERS`` page-locked host buffers (CUDA: on a stream of their own, ordered
        after the caller's current stream, the next pieces' copies in flight while one is
        written), each written into the staging buffers and its CRC-32 computed on the CRC
        threads (or, without zlib-ng's combine, on this thread) from the same host bytes: the
        record torch's writer writes for the tensor's host copy, with no whole host copy. A
        piece's buffer is taken again only once its CRC is done; on an error every copy in
        flight is waited for before the buffers go."""
        import torch

        n = int(src.numel())
        chunk = max(1, min(_STAGE_CHUNK, n))
        count = -(-n // chunk)
        cuda = src.device.type == "cuda"
        ring = [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(min(_STAGE_BUFFERS, count))]
        stream = torch.cuda.Stream(src.device) if cuda else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(src.device))
        pool = self._crc_pool
        pieces: list[tuple[int, _CrcFuture[int]]] = []
        if pool is not None:
            self._crcs[self.tell()] = (n, pieces)
        busy: list[_CrcFuture[int] | None] = [None] * len(ring)  # the CRC still reading a buffer
        copies: collections.deque[tuple[int, Any, Any]] = collections.deque()
        running = 0  # the CRC-32 so far, where pieces cannot be combined

        def start(i: int) -> None:
            slot = i % len(ring)
            reading = busy[slot]
            if reading is not None:
                futures.wait([reading])
            k = min(chunk, n - i * chunk)
            dst, piece = ring[slot][:k], src[i * chunk : i * chunk + k]
            event = None
            if stream is not None:
                with torch.cuda.stream(stream):
                    dst.copy_(piece, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
            else:
                dst.copy_(piece)
            copies.append((slot, dst, event))

        try:
            for i in range(len(ring) - 1):
                start(i)
            for i in range(count):
                if i + len(ring) - 1 < count:
                    start(i + len(ring) - 1)  # into the buffer the piece before this one used
                slot, dst, event = copies.popleft()
                if event is not None:
                    event.synchronize()
                view = memoryview(dst.numpy()).cast("B")
                self.write(view)
                if pool is not None and _crc32_combine is not None:
                    crc = pool.submit(_crc32, view)
                    busy[slot] = crc
                    pieces.append((len(view), crc))
                elif pool is not None:
                    running = _crc32(view, running)
            if pool is not None and _crc32_combine is None:
                whole: _CrcFuture[int] = _CrcFuture()
                whole.set_result(running)
                pieces.append((n, whole))
        finally:
            if stream is not None:
                stream.synchronize()  # no copy into a buffer that goes back to torch's cache

    def _rewind(self, offset: int) -> None:
        """After a _save_filling into this Writer that is to start again (_starts_again): forgets
        the mismatch, the storages still queued and the CRC-32s begun, and moves the write
        position back to ``offset``, where the object is written again over what the attempt
        left (the caller cuts off what lies past its last byte). Another error of the Writer
        is raised."""
        if isinstance(self._error, _FillMismatch):
            self._error = None
        self._fills.clear()
        self._crcs = {}
        self._twins.clear()
        self.seek(offset)

    def _write_host_in_place(self, src: memoryview, unit: int) -> None:
        """Writes host bytes ``src`` at the write position by direct I/O straight from their
        memory (``unit`` from _direct_unit): the part before the first ``unit`` boundary of
        the file and the part after the last are staged, so that both the in-place write and
        every staged write around it start and end on block boundaries (a staged window
        starting mid-block would be bounced through the engine's slots)."""
        n = len(src)
        head = min(n, -self.tell() % unit)
        body = (n - head) // unit * unit
        if head:
            self.write(src[:head])
        if body:
            self._write_in_place(src[head : head + body], body)
        if head + body < n:
            self.write(src[head + body :])

    def _direct_unit(self, source: Any, at: int) -> int:
        """The block the engine would write ``source``, placed at file offset ``at``, in by
        direct I/O straight from its memory (the file takes direct I/O and the address of the
        bytes at the first block boundary suits the device, STATX_DIOALIGN), or 0. Where it
        would not, the engine bounces the bytes through its own small aligned slots, slower
        than the staging buffers on this VM's disk (docs/benchmarks.md): such a storage is
        staged."""
        if self._dio is None:
            self._dio = (0, 0)
            try:  # opens the file again, for reading: a umask may forbid that (then staged)
                info = _deepio.probe_direct_io(self.name) if self.direct else {"supported": False}
            except OSError:
                info = {"supported": False}
            if info["supported"]:
                self._dio = (info["mem_align"], max(info["offset_align"], mmap.PAGESIZE))
        mem_align, unit = self._dio
        if not mem_align:
            return 0
        face = getattr(source, "__array_interface__", None)  # what _fill_source gives: NumPy
        try:
            addr = face["data"][0] if face is not None else _populate.address(_byte_view(source))
        except (TypeError, ValueError):  # a read-only buffer of another kind: staged
            return 0
        return unit if (addr + -at % unit) % mem_align == 0 else 0


def _crc_threads() -> int:
    """Threads computing CRC-32s, one piece of a storage each: one on two cores (the saving
    thread and the engine need the other), up to four where there are cores to spare."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _crc_pieces(pool: ThreadPoolExecutor, view: memoryview) -> list[tuple[int, _CrcFuture[int]]]:
    """Starts the CRC-32 of the bytes ``view`` on ``pool``, in _CRC_PIECE pieces where they can
    be combined: [(piece length, future CRC-32 of the piece)] for _crc_of_pieces."""
    n = len(view)
    step = _CRC_PIECE if _crc32_combine is not None else max(n, 1)
    return [(min(step, n - at), pool.submit(_crc32, view[at : at + step])) for at in range(0, max(n, 1), step)]


def _crc_of_pieces(pieces: list[tuple[int, _CrcFuture[int]]]) -> int:
    crc = pieces[0][1].result()
    for n, f in pieces[1:]:
        assert _crc32_combine is not None
        crc = _crc32_combine(crc, f.result(), n)
    return crc


class _NullSink:
    def write(self, b: Any) -> int:
        return len(b)


class _Refused(Exception):
    """The dry pass met a tensor torch does not write under skip_data."""


def _refused_under_skip_data(t: Any) -> bool:
    """Whether torch.save refuses tensor ``t`` under ``skip_data`` (torch/_tensor.py,
    ``_reduce_ex_internal``): quantized and nested tensors, and xla/maia/mtia (and storage-less
    privateuse1) tensors, which torch saves through a host copy made while pickling."""
    import torch

    dev = t.device.type
    if dev in ("xla", "maia", "mtia") or t.is_quantized or t.is_nested:
        return True
    has_storage = getattr(torch._C, "_has_storage", None)
    return bool(has_storage is not None and dev == torch._C._get_privateuse1_backend_name() and not has_storage(t))


def _storages(obj: Any, pickle_protocol: int) -> tuple[list[Any], bool] | None:
    """The untyped storages torch.save will write, in its order ("data/0", "data/1", ...):
    a dry pickling pass with torch's rule (TypedStorage or torch.is_storage, first seen first,
    one key per StorageImpl), and whether a meta tensor was seen. Cheap: the storages
    themselves are not pickled. None when the object holds a tensor torch refuses to write
    under skip_data (the pass stops there: an xla tensor is never copied to the host for
    nothing)."""
    import torch

    order: list[Any] = []
    seen: set[int] = set()

    class Finder(pickle.Pickler):
        meta = False

        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, torch.Tensor):
                if _refused_under_skip_data(o):
                    raise _Refused
                if o.device.type == "meta":
                    self.meta = True
            if isinstance(o, torch.storage.TypedStorage) or torch.is_storage(o):
                st = o._untyped_storage if isinstance(o, torch.storage.TypedStorage) else o
                if st._cdata not in seen:
                    seen.add(st._cdata)
                    order.append(st)
                return ("storage", st._cdata)
            return None

    finder = Finder(_NullSink(), protocol=pickle_protocol)
    try:
        finder.dump(obj)
    except _Refused:
        return None
    return order, finder.meta


def _fill_source(storage: Any) -> tuple[int, Any]:
    """(nbytes, what the Writer writes) for a storage torch skips under skip_data: CUDA memory
    through the engine's GPU path; CPU memory as it is; other devices (xpu, mps, ...) copied to
    the host first, as torch.save does."""
    import torch

    t = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return storage.nbytes(), t if t.device.type == "cuda" else t.cpu().numpy()


class _PickleModule:
    """What torch.save needs of a pickle module: its name (torch checks it for dill) and a
    Pickler."""

    __name__ = "deepio.checkpoint._filling_pickle"

    def __init__(self, pickler: type) -> None:
        self.Pickler = pickler


def _filling_pickle_module(w: FillingWriter) -> Any:
    """A pickle module for torch.save that queues on ``w._fills`` each storage torch's own
    pickler gives a new record key, as it does: torch writes the records in that order once
    the pickling is done. So the Writer fills each record with the storage torch pickled into
    it, even when an object pickles differently than in the dry pass (another storage, one
    more, the same ones in another order). torch subclasses ``Pickler`` to define its
    ``persistent_id``; ``__init_subclass__`` wraps that method to see what it returns."""
    import torch

    keys: set[str] = set()

    class Pickler(pickle.Pickler):
        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            inner = cls.persistent_id

            def persistent_id(self: Any, o: Any) -> Any:
                pid = inner(self, o)
                if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and pid[2] not in keys:
                    keys.add(pid[2])
                    st = o._untyped_storage if isinstance(o, torch.storage.TypedStorage) else o
                    if st.nbytes():  # torch skips nothing for an empty record
                        twin = w._twins.get(st._cdata)
                        w._fills.append((st.nbytes(), twin) if twin is not None else _fill_source(st))
                return pid

            cls.persistent_id = persistent_id  # type: ignore[method-assign]

    return _PickleModule(Pickler)


def _save_filling(
    obj: Any,
    w: FillingWriter,
    pickle_protocol: int,
    found: tuple[list[Any], bool],
    crc: bool = False,
    aligned: bool = True,
    pool: ThreadPoolExecutor | None = None,
) -> dict[int, tuple[int, int]]:
    """torch.save under skip_data into ``w`` from its write position on, which puts each
    storage in its record (the storages torch's pickler saw, queued by
    _filling_pickle_module), records aligned as _record_alignment says for the dry pass's
    storages ``found`` (and whether it saw a meta tensor); with ``aligned`` False, as torch's
    own option says (the records torch.save would write: deepio.dcp's). With ``crc``, the
    CRC-32 of every host storage is computed on a helper thread as it is placed (on ``pool``
    where given, a caller's pool for many objects; else on a pool of its own); returns
    {file offset of a record's data: (nbytes, CRC-32)} for _patch_crcs (empty without
    ``crc``). No CRC still reads a storage when it returns or raises. Raises _FillMismatch
    where torch's records and the storages queued for them disagree (_starts_again)."""
    import torch

    storages, meta = found
    with warnings.catch_warnings() if meta else contextlib.nullcontext():
        if meta:  # torch warns that a meta tensor under skip_data is a no-op; it is saved as
            # torch.save saves it (no data), so the warning would only puzzle the caller
            warnings.filterwarnings("ignore", message="Serializing tensors on the meta device under skip_data")
        own = ThreadPoolExecutor(_crc_threads(), thread_name_prefix="deepio-crc") if crc and pool is None else None
        w._crc_pool = (pool or own) if crc else None
        w._filling = True
        try:
            with torch.serialization.skip_data():
                alignment = _record_alignment(storages) if aligned else None
                _torch_zip(obj, w, _filling_pickle_module(w), pickle_protocol, crc, alignment)
        finally:
            w._filling = False
            w._crc_pool = None
            if own is not None:
                own.shutdown(wait=True)  # no CRC still reading a storage after this
            elif pool is not None:  # the caller's pool goes on: wait for this object's CRCs
                futures.wait([f for _, pieces in w._crcs.values() for _, f in pieces])
    if w._fills:
        raise _FillMismatch(f"deepio.save: {len(w._fills)} storage(s) were not placed (torch changed its format?)")
    crcs = {at: (n, _crc_of_pieces(pieces)) for at, (n, pieces) in w._crcs.items()}
    w._crcs = {}
    return crcs


def _starts_again(e: BaseException, w: FillingWriter) -> bool:
    """Whether the failure ``e`` of _save_filling into ``w`` means "save this object on the
    plain route instead": a mismatch between torch's records and the queued storages (raised
    by the Writer, or reported by torch's writer as its own error after the Writer's seek
    raised: "unexpected pos"), or a refusal under skip_data the dry pass did not foresee (a
    newer torch). A _FillMismatch never reaches deepio.save's caller."""
    if isinstance(e, _FillMismatch) or isinstance(w._error, _FillMismatch):
        return True
    return isinstance(e, RuntimeError) and "skip_data" in str(e)
