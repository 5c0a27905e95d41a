"""Checkpoints through the engine: ``deepio.save``/``deepio.load`` (torch's file format) and
the file-like ``deepio.Writer``/``deepio.Reader`` any serializer can use.

Writer protocol. Bytes handed to ``write()`` are copied into a ring of ``buffers``
page-locked staging buffers (``buffer_size`` each). A full buffer is submitted to the engine
as one positional write and filling continues in the next buffer while the earlier ones are on
their way to the disk; before a buffer is filled again its write is waited for (and its error
raised). Buffers cover file ranges that end at multiples of ``buffer_size``, so every full
buffer is an aligned request from aligned memory, written with direct I/O; a partial buffer
(``flush()``, ``seek()`` elsewhere, ``close()``) is written as it is and the engine puts its
unaligned edges through the page cache. ``write()`` never keeps the caller's memory: when it
returns, the bytes are copied (torch hands ``write()`` views of tensor storages that are only
valid during the call). ``flush()`` writes everything staged and waits for it; ``close()``
also flushes the file to stable storage (``fsync``) unless ``durable=False``. A failed write
is raised by the call that waits for it and again by every later call; ``close()`` releases
everything anyway.

Reader protocol. The file is read in aligned chunks of ``buffer_size`` into a ring of
``buffers`` page-locked buffers (direct I/O into aligned memory), and copied from there into
the caller's memory. A large read starts every chunk it covers, up to the ring's size ahead,
plus the chunk after it; a small read that continues the previous one starts the next chunk.
Reading straight into the caller's memory would be slower: a tensor's memory is rarely
page-aligned, and the engine then bounces every block (measured in docs/checkpoints.md).

Neither object is thread-safe: use one from one thread at a time, as with ``open()``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import io
import mmap
import os
import pickle
import struct
import sys
import warnings
import weakref
import zipfile
import zlib
from concurrent.futures import Future as _CrcFuture
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Callable, Union, cast

from . import _deepio, _populate
from ._durable import replacing
from ._errors import describe
from ._file import File, Future

PathArg = Union[str, "os.PathLike[str]"]

#: Staging buffers of a Writer and read-ahead chunks of a Reader: size and count.
DEFAULT_WRITE_BUFFER = 16 << 20
DEFAULT_WRITE_BUFFERS = 4
DEFAULT_READ_BUFFER = 8 << 20
DEFAULT_READ_BUFFERS = 4
_SMALL_COPY = 64 << 10  # below this a slice assignment beats a GIL-releasing memcpy

# The CRC-32 of the zip records deepio.save computes beside its writes: zlib-ng's (PyPI
# "zlib-ng", the "checkpoint" extra; carry-less multiplication, 12 GiB/s on one core of the
# development VM) when it is installed, else the standard library's zlib (3.5 GiB/s there), whose
# CRC then bounds a save on a fast device. Both release the GIL and give the same values.
_crc32: Callable[[Any], int]
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
#: it for direct I/O (Writer._direct_unit); smaller ones, and the others, are copied into the
#: staging buffers with the zip's headers around them.
_IN_PLACE_MIN = 4 << 20

#: A Writer window's first byte sits at its file offset modulo this in the staging buffer
#: (Writer._shift()); staging buffer sizes are multiples of it (_check_sizes).
_WINDOW_ALIGN = 4096

_PREFAULT_MIN = 8 << 20  # readinto() destinations from this size get _prefault()

def _check_sizes(buffer_size: Any, buffers: Any) -> int:
    """buffer_size rounded up to whole pages (aligned for any device)."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 4096:
        raise ValueError(f"buffer_size must be an integer of at least 4096, got {buffer_size!r}")
    if isinstance(buffers, bool) or not isinstance(buffers, int) or not 2 <= buffers <= 64:
        raise ValueError(f"buffers must be an integer from 2 to 64, got {buffers!r}")
    return -(-buffer_size // 4096) * 4096


class _Staging:
    """One page-locked (when RLIMIT_MEMLOCK allows; else page-aligned) buffer of nbytes,
    seen as a writable memoryview of bytes. release() unlocks it at once; the memory stays
    mapped while any view of it lives (the ctypes array holds the allocation), so an
    operation interrupted before it finished can never write into freed memory."""

    __slots__ = ("owner", "view")

    def __init__(self, nbytes: int) -> None:
        capsule, self.owner = _deepio.alloc_locked(nbytes, "raw")
        raw = (ctypes.c_char * nbytes).from_address(self.owner.address)
        raw._deepio_allocation = capsule  # type: ignore[attr-defined]
        self.view = memoryview(raw).cast("B")

    def release(self) -> None:
        self.owner.release()


def _byte_view(b: Any) -> memoryview:
    from ._buffers import is_torch_tensor

    if is_torch_tensor(b):  # torch tensors have no buffer protocol: their bytes, via NumPy
        b = b.detach().contiguous().reshape(-1).view(sys.modules["torch"].uint8).numpy()
    mv = b if isinstance(b, memoryview) else memoryview(b)
    if mv.ndim == 1 and mv.format in ("B", "b", "c") and mv.contiguous:
        return mv if mv.format == "B" else mv.cast("B")
    if mv.contiguous:
        return mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
    return memoryview(mv.tobytes())


def _copy(dest: memoryview, src: memoryview) -> None:
    if len(src) >= _SMALL_COPY:
        _deepio.memcpy(dest, src)  # GIL released
    else:
        dest[:] = src


_HUGEPAGE_HINT = False  # MADV_HUGEPAGE on large destinations (where THP is in madvise mode)
_POPULATE_PIECE = 8 << 20  # destinations are faulted in ahead of the copies in pieces of this
_POPULATE_AHEAD = True  # False: one MADV_POPULATE_WRITE of the whole destination before copying


def _prefault(dest: memoryview) -> _populate.Ahead | None:
    """Starts faulting in a large destination on a helper thread (``_populate.Ahead``:
    MADV_POPULATE_WRITE piece by piece, ahead of the copies into it), after asking for huge
    pages. torch.load reads every storage into freshly allocated memory, and faulting that in
    a 4 KiB page at a time inside the copies cost more than the disk on this VM
    (docs/checkpoints.md); on the helper the faults run beside the copies and the disk. Hints
    only: None (nothing to wait for) where the kernel has no MADV_POPULATE_WRITE."""
    if not _populate.available():
        return None
    addr, n = _populate.address(dest), len(dest)
    if _HUGEPAGE_HINT:
        lo, hi = _populate.whole_pages(addr, n, _populate.HUGE)
        if hi > lo:
            _populate.advise(lo, hi - lo, _populate.MADV_HUGEPAGE)
    if not _POPULATE_AHEAD:
        _populate.populate(addr, n)
        return None
    return _populate.Ahead([(addr, n)], _POPULATE_PIECE, 1)


def _is_device(b: Any) -> bool:
    from ._buffers import is_device_buffer

    return is_device_buffer(b)


def _with_name(e: OSError, name: str) -> OSError:
    """The engine's error for a descriptor (filename None) with the file's name put in."""
    if e.filename is not None:
        return e
    try:
        named = type(e)(e.errno, e.strerror, name)
    except Exception:
        return e
    for attr in ("offset", "nbytes", "other_errors"):
        if hasattr(e, attr):
            try:
                setattr(named, attr, getattr(e, attr))
            except AttributeError:
                pass
    named.__traceback__ = e.__traceback__
    return named


class _EngineFile(io.RawIOBase):
    """What Writer and Reader share: the io protocol answers, the O_DIRECT report, seek
    targets, and closing when collected. ``_writes`` says which of the two it is."""

    _writes = False
    _file: Any
    name: str

    def readable(self) -> bool:
        self._check()
        return not self._writes

    def writable(self) -> bool:
        self._check()
        return self._writes

    def seekable(self) -> bool:
        self._check()
        return True

    def fileno(self) -> int:
        # Not offered: I/O on the descriptor directly would bypass the staged bytes.
        what = "write to" if self._writes else "read from"
        raise io.UnsupportedOperation(f"deepio.{type(self).__name__} has no file descriptor to {what}")

    @property
    def direct(self) -> bool:
        """True when the file is open with O_DIRECT (full buffers or chunks bypass the page cache)."""
        return bool(self._file is not None and self._file.direct)

    def _seek_target(self, offset: int, whence: int, current: int, end: Any) -> int:
        """The absolute position seek(offset, whence) names; `end()` gives the file's end."""
        if whence == os.SEEK_SET:
            target = offset
        elif whence == os.SEEK_CUR:
            target = current + offset
        elif whence == os.SEEK_END:
            target = end() + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if target < 0:  # as os.lseek and open() files say it
            raise OSError(errno.EINVAL, f"Invalid argument: negative seek position {target}", self.name)
        return target

    def _check(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        if getattr(self, "_file", None) is None:
            return
        try:
            self.close()
        except Exception as e:  # nobody can catch it here: never silently
            warnings.warn(
                f"deepio.{type(self).__name__} {self.name!r} was garbage-collected unclosed and closing it "
                f"failed: {describe(e)}",
                _deepio.UnobservedFailureWarning,
                stacklevel=2,
            )


class Writer(_EngineFile):
    """A binary file opened for writing whose bytes go through deepio's engine.

    ``Writer(path, *, buffer_size=16 MiB, buffers=4, handle=None, direct_io="auto",
    durable=True)``
    creates or truncates ``path``. ``write(b)`` accepts anything with the buffer protocol
    (and CUDA memory: torch CUDA tensors or kDLCUDA DLPack producers, written through the
    engine's GPU staging pipeline) and always consumes all of it. ``tell()``, ``seek()``
    (within what is staged: free; elsewhere: staged bytes are written first), ``flush()``,
    ``close()`` (``fsync`` when ``durable``), context manager. Errors are ``OSError``
    subclasses with errno and file name; ``ValueError`` after close.
    """

    def __init__(
        self,
        path: PathArg,
        *,
        buffer_size: int = DEFAULT_WRITE_BUFFER,
        buffers: int = DEFAULT_WRITE_BUFFERS,
        handle: Any = None,
        direct_io: str | bool | None = "auto",
        durable: bool = True,
    ) -> None:
        super().__init__()
        self._file: File | None = None
        self._bufs: list[_Staging] = []
        buffer_size = _check_sizes(buffer_size, buffers)
        self.name = os.fspath(path)
        self._file = File(path, "w", handle=handle, direct_io=direct_io)
        try:
            self._bufs = [_Staging(buffer_size) for _ in range(buffers)]
        except BaseException:
            self._release()
            raise
        self._size = buffer_size
        self._pending: list[Future | None] = [None] * buffers  # the write of each buffer
        self._other: list[Future] = []  # writes from the caller's device memory
        self._cur = 0  # buffer being filled
        self._base = 0  # file offset of its first byte
        self._pos = 0  # write position inside it
        self._fill = 0  # bytes of it holding data
        self._limit = buffer_size  # its capacity: ends at a multiple of buffer_size
        self._error: BaseException | None = None
        self._durable = durable
        # (nbytes, source) for save()'s storages: torch (skip_data) seeks over each record's
        # bytes, and the seek writes the source there instead (see _save_filling).
        self._fills: collections.deque[tuple[int, Any]] = collections.deque()
        self._filling = False  # under _save_filling: every forward skip is a storage's record
        self._dio: tuple[int, int] | None = None  # (memory alignment, block) of direct I/O here
        # save()'s CRC-32s of host storages placed by _fills, computed on a helper thread while
        # the bytes are written: {file offset of the record's data: (nbytes, future CRC)}.
        self._crc_pool: ThreadPoolExecutor | None = None
        self._crcs: dict[int, tuple[int, list[tuple[int, _CrcFuture[int]]]]] = {}

    _writes = True

    # --------------------------------------------------------------------- io.RawIOBase
    def tell(self) -> int:
        self._check()
        return self._base + self._pos

    def write(self, b: Any) -> int:
        self._check()
        if _is_device(b):
            return self._write_device(b)
        src = _byte_view(b)
        n = len(src)
        done = 0
        while done < n:
            room = self._limit - self._pos
            k = min(room, n - done)
            at = self._shift() + self._pos
            _copy(self._bufs[self._cur].view[at : at + k], src[done : done + k])
            self._pos += k
            done += k
            if self._pos > self._fill:
                self._fill = self._pos
            if self._pos == self._limit:
                self._submit()
        return n

    def _shift(self) -> int:
        """Where in its staging buffer the window's first byte sits: its file offset's place in
        a page (at most ``_base % _size``: the window fits the buffer), so that the buffer's
        bytes at every block boundary of the file are aligned and the engine writes them by
        direct I/O. A window starting mid-block (after a seek, or a write from device memory)
        would otherwise be bounced through the engine's slots."""
        return self._base % _WINDOW_ALIGN

    def _write_device(self, b: Any) -> int:
        from ._buffers import sync_producer_stream

        sync_producer_stream(b)
        return self._write_in_place(b, int(getattr(b, "nbytes", 0)))

    def _write_in_place(self, b: Any, nbytes: int) -> int:
        """Writes ``b`` from its own memory through the engine, with no copy into the staging
        buffers (CUDA memory through the GPU path; host memory from _write_host_in_place).
        What was staged before it is written first; staging goes on after it. ``b`` must not
        change until the Writer is flushed."""
        assert self._file is not None
        at = self._flush_to_position()
        self._reap()
        self._other.append(self._file.pwrite(b, at))
        self._restart(at + nbytes)
        return nbytes

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

    def _reap(self) -> None:
        """Drops the in-place writes that finished, raising the first one's error: a full disk
        stops a save at the next storage, not at close()."""
        running = []
        for f in self._other:
            if f.done():
                self._wait(f)
            else:
                running.append(f)
        self._other = running

    def _flush_to_position(self) -> int:
        """Submits what is staged; returns the write position, from which a new window starts
        (after waiting for every write, when the position lies inside what was staged)."""
        at = self._base + self._pos
        self._submit_partial()
        if at != self._base:
            self._drain()
            self._restart(at)
        return at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        if whence == os.SEEK_CUR and self._filling and offset > 0:
            if not self._fills:  # a skip where no storage was pickled: never leave a hole
                self._error = _FillMismatch(f"deepio.save: torch skipped {offset} bytes where no storage goes")
                raise self._error
            nbytes, source = self._fills.popleft()
            if nbytes != offset:
                self._error = _FillMismatch(
                    f"deepio.save: torch skipped {offset} bytes where a {nbytes}-byte storage goes"
                )
                raise self._error
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
        target = self._seek_target(offset, whence, self._base + self._pos, self._end_after_flush)
        if self._base <= target <= self._base + self._fill:
            self._pos = target - self._base  # inside what is staged: nothing to write yet
        else:
            self._flush_to_position()
            self._drain()
            self._restart(target)
        return target

    def flush(self) -> None:
        """Writes everything staged through the engine and waits for it (no fsync)."""
        if self._file is None:
            return
        self._check()
        self._flush_to_position()
        self._drain()

    def truncate(self, size: int | None = None) -> int:
        self.flush()
        assert self._file is not None
        size = self.tell() if size is None else size
        self._file.truncate(size)
        return size

    def close(self) -> None:
        """Flushes, fsyncs (``durable``), closes and frees the staging buffers. Raises the
        first write error (again, if an earlier call raised it already)."""
        if self._file is None:
            super().close()
            return
        err: BaseException | None = None
        try:
            if self._error is None:
                self._submit_partial()
            self._drain()
            if self._durable:
                self._file.fsync()
        except BaseException as e:
            err = e
        finally:
            self._release()
            super().close()
        if err is not None:
            raise err
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        """Closes without writing what is still staged (the file keeps what reached it)."""
        if self._file is not None:
            self._error = self._error or OSError("deepio.Writer discarded")
            try:
                self.close()
            except BaseException:
                pass

    # ------------------------------------------------------------------------ internals
    def _end_after_flush(self) -> int:
        self.flush()
        assert self._file is not None
        return int(self._file.size())

    def _check(self) -> None:
        if self._file is None:
            raise ValueError("I/O operation on a closed deepio.Writer")
        if self._error is not None:
            raise self._error

    def _wait(self, fut: Future | None) -> None:
        if fut is None:
            return
        try:
            fut.result()
        except OSError as e:
            if self._error is None:
                self._error = _with_name(e, self.name)
            raise self._error from None
        except BaseException as e:
            if self._error is None:
                self._error = e
            raise

    def _submit(self) -> None:
        """Writes the current buffer's data and moves to the other buffer (waiting for the
        write it was holding)."""
        assert self._file is not None
        if self._fill:
            shift = self._shift()
            buf = self._bufs[self._cur].view[shift : shift + self._fill]
            self._pending[self._cur] = self._file.pwrite(buf, self._base)
        self._restart(self._base + self._fill, switch=True)

    def _submit_partial(self) -> None:
        if self._fill:
            self._submit()

    def _restart(self, offset: int, switch: bool = False) -> None:
        if switch:
            self._cur = (self._cur + 1) % len(self._bufs)
            fut, self._pending[self._cur] = self._pending[self._cur], None
            self._wait(fut)
        self._base = offset
        self._pos = self._fill = 0
        self._limit = self._size - offset % self._size

    def _drain(self) -> None:
        futs = [f for f in self._pending if f is not None] + self._other
        self._pending = [None] * len(self._pending)
        self._other = []
        first: BaseException | None = None
        for f in futs:  # wait for all before raising: no write may outlive its buffer
            try:
                self._wait(f)
            except BaseException as e:
                first = first or e
        if first is not None:
            raise first

    def _release(self) -> None:
        try:
            self._drain()
        except BaseException:
            pass
        f, self._file = self._file, None
        for b in self._bufs:
            b.release()
        self._bufs = []
        if f is not None:
            f.close()

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"pos={self.tell()}"
        return f"<deepio.Writer {self.name!r} {state}>"


class Reader(_EngineFile):
    """A binary file opened for reading through deepio's engine, with read-ahead.

    ``Reader(path, *, buffer_size=8 MiB, buffers=4, handle=None, direct_io="auto")``:
    ``read(n=-1)``, ``readinto(b)`` (fills ``b`` unless the end of the file comes first),
    ``readall()``, ``seek()``, ``tell()``, ``readable()``/``seekable()``, context manager.
    Missing files, permissions and folders raise at construction, as ``open()`` does.
    """

    def __init__(
        self,
        path: PathArg,
        *,
        buffer_size: int = DEFAULT_READ_BUFFER,
        buffers: int = DEFAULT_READ_BUFFERS,
        handle: Any = None,
        direct_io: str | bool | None = "auto",
    ) -> None:
        super().__init__()
        self._file: File | None = None
        self._bufs: list[_Staging] = []
        buffer_size = _check_sizes(buffer_size, buffers)
        self.name = os.fspath(path)
        if os.path.isdir(self.name):  # O_RDONLY opens a folder; reading it would say EISDIR late
            raise IsADirectoryError(21, "Is a directory", self.name)
        self._file = File(path, "r", handle=handle, direct_io=direct_io)
        try:
            self._end = self._file.size()
            self._bufs = [_Staging(buffer_size) for _ in range(buffers)]
        except BaseException:
            self._close_all()
            raise
        self._size = buffer_size
        self._chunk: list[int] = [-1] * buffers  # chunk index each buffer holds (or is reading)
        self._fut: list[Future | None] = [None] * buffers
        self._pos = 0
        self._last_chunk = -2  # chunk the previous read ended in

    def tell(self) -> int:
        self._check()
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        target = self._seek_target(offset, whence, self._pos, lambda: self._end)
        self._pos = target
        return target

    def readinto(self, b: Any) -> int:
        self._check()
        dest = b if isinstance(b, memoryview) else memoryview(b)
        if dest.readonly or not dest.c_contiguous:
            raise ValueError("readinto() needs a writable C-contiguous buffer")
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        n = max(0, min(len(dest), self._end - self._pos))
        if n == 0:
            return 0
        first, last = self._pos // self._size, (self._pos + n - 1) // self._size
        # Read ahead: through the end of a large read (and the chunk after it, where the next
        # record's header usually is), or one chunk after a small read that continues the last.
        sequential = first in (self._last_chunk, self._last_chunk + 1)
        ahead = last + 1 if (last > first or sequential) else last
        pop: _populate.Ahead | None = None
        if n >= _PREFAULT_MIN:
            self._start_range(first, min(ahead, first + len(self._bufs) - 1))  # disk first
            pop = _prefault(dest[:n])
        try:
            done = 0
            while done < n:
                pos = self._pos + done
                k = pos // self._size
                self._start_range(k, min(ahead, k + len(self._bufs) - 1))
                i = self._chunk.index(k)
                view = self._ready(i)
                start = pos - k * self._size
                m = min(n - done, len(view) - start)
                if pop is not None:  # the pages copied into next are populated first
                    pop.wait_through(done + m)
                _copy(dest[done : done + m], view[start : start + m])
                done += m
        finally:
            if pop is not None:
                pop.close()
        self._last_chunk = last
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._check()
        if size is None or size < 0:
            return self.readall()
        out = bytearray(max(0, min(size, self._end - self._pos)))
        n = self.readinto(out)
        del out[n:]
        return bytes(out)

    def readall(self) -> bytes:
        self._check()
        return self.read(max(0, self._end - self._pos))

    def close(self) -> None:
        if self._file is not None:
            self._close_all()
        super().close()

    def _close_all(self) -> None:
        for i, f in enumerate(self._fut):
            if f is not None:
                f.wait()  # a read-ahead nobody asked for: its outcome does not matter
                self._fut[i] = None
        f_, self._file = self._file, None
        for b in self._bufs:
            b.release()
        self._bufs = []
        if f_ is not None:
            f_.close()

    def _check(self) -> None:
        if self._file is None:
            raise ValueError("I/O operation on a closed deepio.Reader")

    def _ready(self, i: int) -> memoryview:
        fut, self._fut[i] = self._fut[i], None
        if fut is not None:
            try:
                fut.result()
            except BaseException:
                self._chunk[i] = -1
                raise
        k = self._chunk[i]
        return self._bufs[i].view[: min(self._size, self._end - k * self._size)]

    def _start_range(self, k: int, upto: int) -> None:
        """Starts reading every chunk of [k, upto] (within the file) not already held, into
        buffers holding chunks outside that range."""
        upto = min(upto, (self._end - 1) // self._size)
        for j in range(k, upto + 1):
            if j in self._chunk:
                continue
            free = [i for i, c in enumerate(self._chunk) if not k <= c <= upto]
            # Prefer empty buffers, then the chunk furthest behind.
            i = min(free, key=lambda i: (self._chunk[i] >= 0, self._chunk[i] if self._chunk[i] < k else -1))
            self._start(i, j)

    def _start(self, i: int, k: int) -> None:
        fut, self._fut[i] = self._fut[i], None
        if fut is not None:
            fut.wait()  # a read-ahead never used: the buffer must be free before reuse
        self._chunk[i] = -1
        off = k * self._size
        length = min(self._size, self._end - off)
        assert self._file is not None
        self._fut[i] = self._file.pread(self._bufs[i].view[:length], off)
        self._chunk[i] = k

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"pos={self._pos}"
        return f"<deepio.Reader {self.name!r} {state}>"


# ------------------------------------------------------------------------ save and load


def _fspath(path: Any, what: str) -> str:
    if hasattr(path, "write") or hasattr(path, "read"):
        raise TypeError(f"deepio.{what}() takes a file name; for a file object use deepio.Writer/Reader with torch")
    p = os.fspath(path)
    if isinstance(p, bytes):
        raise TypeError("path must be a str or os.PathLike[str]")
    return p


def save(
    obj: Any,
    path: PathArg,
    *,
    pickle_protocol: int = 2,
    crc32: bool | None = None,
    buffer_size: int = DEFAULT_WRITE_BUFFER,
    handle: Any = None,
) -> None:
    """Saves ``obj`` as ``torch.save(obj, path)`` does (torch's zip format; plain
    ``torch.load`` reads it), through the engine, durably: the file is written under a
    temporary name in the same folder, flushed to stable storage, renamed over ``path`` and
    the folder flushed. On any error (ENOSPC, EFBIG, an exception while pickling) ``path``
    keeps its old contents (or stays absent) and the temporary file is removed.

    torch's serializer pickles the object and hands each tensor storage's own memory to
    ``Writer.write()`` (no pickled copy); the Writer stages it in page-locked memory and writes
    aligned direct I/O. When ``obj`` holds CUDA storages, torch writes the file with every
    storage's bytes left out (``torch.serialization.skip_data``) and the Writer puts each storage
    in its place as torch passes it: CPU storages through the staging buffers, CUDA storages
    through the engine's GPU path (pinned staging slots, device-to-host copies overlapped with
    the disk), never a whole host copy; records of CUDA storages carry no CRC-32 (as
    ``crc32=False``).
    torch refuses some tensors under skip_data (quantized, nested, xla/maia/mtia): an object
    holding one is saved on the plain route (torch copies CUDA storages to the host, as
    ``torch.save`` does), and a refusal met only mid-save starts the file again on that route.

    ``crc32``: whether the zip records carry their CRC-32. ``None`` follows torch
    (``torch.serialization.get_crc32_options()``, True by default); ``False`` saves the CPU
    time of computing it (most of a save's CPU): ``torch.load`` does not check it, but zip
    tools reading the file will report bad CRCs. A save whose dicts, lists and tuples hold
    8 MiB of CPU tensors or more takes the filling route too: each storage's CRC-32 (where
    wanted) is computed on a helper thread while it is written and put into the zip afterwards
    (torch computes its CRCs on the saving thread, which bounds a save on a fast device), each
    storage of 4 MiB or more is written from its own memory (by direct I/O straight from it
    where its address suits the device), and the records start on page boundaries (unless
    the padding would cost more than 1/64 of the bytes), as the file's ``.storage_alignment``
    says. The tensors must not change until the save returns.
    """

    final = _fspath(path, "save")
    with replacing(final) as tmp:
        w = Writer(tmp, buffer_size=buffer_size, handle=handle, durable=False)  # replacing() fsyncs
        try:
            want_crc = _crc_wanted(crc32)
            large = _large_host_tensors(obj, _FILL_MIN)
            # The dry pass finds the storages; None: the object holds a tensor torch refuses to
            # write under skip_data. CUDA storages can exist only once torch initialized CUDA, and
            # host storages matter only for a large save: no dry pass else (the object is
            # pickled once).
            look = _force_filling or large or _cuda_initialized()
            found = _storages(obj, pickle_protocol) if look else ([], False)
            crcs: dict[int, tuple[int, int]] | None = None
            if found is not None and _takes_filling_route(found[0], large):
                try:
                    crcs = _save_filling(obj, w, pickle_protocol, found, crc=want_crc)
                except RuntimeError as e:
                    # torch's writer reports a failed seek() as its own error ("unexpected pos")
                    mismatch = isinstance(e, _FillMismatch) or isinstance(w._error, _FillMismatch)
                    if not mismatch and "skip_data" not in str(e):
                        raise
                    # A refusal the dry pass did not foresee (a newer torch), or an object whose
                    # pickling gave other storages the second time: start again on the plain
                    # route, in a fresh Writer on the same, truncated temporary file.
                    w.discard()
                    w = Writer(tmp, buffer_size=buffer_size, handle=handle, durable=False)
            if crcs is None:
                _torch_zip(obj, w, pickle, pickle_protocol, want_crc)
            w.close()
            if crcs:
                _patch_crcs(tmp, crcs)
            _keep_mode(final, tmp)
        except BaseException as e:
            cause = w._error
            w.discard()
            if cause is not None and cause is not e:
                # torch's writer goes on after write() raised and fails on its own
                # ("unexpected pos"): the Writer's error is the one to report.
                raise cause from None
            raise


def _keep_mode(final: str, tmp: str) -> None:
    """The new file gets the permission bits of the file it replaces (torch.save, writing in
    place, keeps them): a private checkpoint stays private."""
    try:
        mode = os.stat(final).st_mode & 0o7777
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)


_force_filling = False  # tests: take the filling route (skip_data + filling) for any object

#: Saves whose host storages hold at least this many bytes take the filling route too: torch
#: writes the file with the storages' bytes and their CRC-32s left out, the Writer places each
#: storage (from its own memory, Writer._write_in_place, from _IN_PLACE_MIN bytes), _crc32
#: computes its CRC-32 on a helper thread while it is written, and _patch_crcs puts the CRCs into
#: the zip. torch computes its CRC-32 on the saving thread before handing a record over: on a
#: device faster than this VM's disk that halved deepio.save's speed (docs/benchmarks.md), and
#: the plain route copies every storage into the staging buffers. Below this size the plain
#: route is cheaper (one pickling pass).
_FILL_MIN = 8 << 20

#: The filling route's records start at multiples of this (torch's storage_alignment, which
#: the file records: torch.load's offset arithmetic follows it), so a storage whose memory is
#: aligned too goes to the disk by direct I/O straight from that memory; tensors torch.load or
#: deepio.load read from such a file are page-aligned. Only where the padding (under a page a
#: record) costs at most 1/_ALIGN_PADDING_SHARE of the storages' bytes; else torch's default.
_RECORD_ALIGNMENT = 4096
_ALIGN_PADDING_SHARE = 64


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


def _crc_wanted(crc32: bool | None) -> bool:
    if crc32 is not None:
        return bool(crc32)
    get = getattr(sys.modules["torch"].serialization, "get_crc32_options", None)
    return True if get is None else bool(get())


def _large_host_tensors(obj: Any, at_least: int) -> bool:
    """Whether the containers of ``obj`` (dicts, lists, tuples, four levels deep: a state dict,
    an optimizer's, a training checkpoint of both) hold CPU tensors whose storages add up to
    ``at_least`` bytes. A cheap look, without pickling, that decides whether a save is worth a
    dry pickling pass; objects that hide their tensors (a pickled module) are not looked into."""
    torch = sys.modules["torch"]
    seen: set[int] = set()
    total, todo, budget = 0, [(obj, 0)], 100_000
    while todo and budget > 0:
        o, depth = todo.pop()
        budget -= 1
        if isinstance(o, torch.Tensor):
            if o.device.type != "cpu" or o.is_sparse or o.is_quantized or o.is_nested:
                continue
            try:
                st = o.untyped_storage()
                key, n = st.data_ptr(), st.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
            if key not in seen:
                seen.add(key)
                total += n
                if total >= at_least:
                    return True
        elif depth < 4 and isinstance(o, dict):
            todo.extend((v, depth + 1) for v in o.values())
        elif depth < 4 and isinstance(o, (list, tuple)):
            todo.extend((v, depth + 1) for v in o)
    return False


def _takes_filling_route(storages: list[Any], large: bool) -> bool:
    if not hasattr(sys.modules["torch"].serialization, "skip_data"):
        return False  # torch before 2.5: the plain route (CUDA storages copied to the host)
    if _force_filling or any(st.device.type == "cuda" for st in storages):
        return True
    return large and sum(st.nbytes() for st in storages if st.device.type == "cpu") >= _FILL_MIN


def _record_alignment(storages: list[Any]) -> int | None:
    """_RECORD_ALIGNMENT where its padding is cheap for these storages, else None (torch's)."""
    total = sum(st.nbytes() for st in storages)
    return _RECORD_ALIGNMENT if len(storages) * _RECORD_ALIGNMENT * _ALIGN_PADDING_SHARE <= total else None


class _FillMismatch(RuntimeError):
    """torch's second pickling pass asked for storages other than the dry pass found."""


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return True  # cannot tell: look at the storages


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


def _filling_pickle_module(w: Writer) -> Any:
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
                        w._fills.append(_fill_source(st))
                return pid

            cls.persistent_id = persistent_id  # type: ignore[method-assign]

    return _PickleModule(Pickler)


def _save_filling(
    obj: Any, w: Writer, pickle_protocol: int, found: tuple[list[Any], bool], crc: bool = False
) -> dict[int, tuple[int, int]]:
    """torch.save under skip_data into ``w``, which puts each storage in its record (the
    storages torch's pickler saw, queued by _filling_pickle_module), records aligned as
    _record_alignment says for the dry pass's storages ``found`` (and whether it saw a meta
    tensor). With ``crc``, the CRC-32 of every host storage is computed on a helper thread as
    it is placed; returns {file offset of a record's data: (nbytes, CRC-32)} for _patch_crcs
    (empty without ``crc``)."""
    import torch

    storages, meta = found
    with warnings.catch_warnings() if meta else contextlib.nullcontext():
        if meta:  # torch warns that a meta tensor under skip_data is a no-op; it is saved as
            # torch.save saves it (no data), so the warning would only puzzle the caller
            warnings.filterwarnings("ignore", message="Serializing tensors on the meta device under skip_data")
        pool = ThreadPoolExecutor(_crc_threads(), thread_name_prefix="deepio-crc") if crc else None
        w._crc_pool = pool
        w._filling = True
        try:
            with torch.serialization.skip_data():
                _torch_zip(obj, w, _filling_pickle_module(w), pickle_protocol, crc, _record_alignment(storages))
        finally:
            w._filling = False
            w._crc_pool = None
            if pool is not None:
                pool.shutdown(wait=True)  # no CRC still reading a storage after this
    if w._fills:
        raise _FillMismatch(f"deepio.save: {len(w._fills)} storage(s) were not placed (torch changed its format?)")
    crcs = {at: (n, _crc_of_pieces(pieces)) for at, (n, pieces) in w._crcs.items()}
    w._crcs = {}
    return crcs


def _data_start(header_offset: int, head: bytes) -> int:
    """Where a zip record's data starts, from the 30 bytes of its local header (at
    ``header_offset``): the header's own name and extra field lengths, which may differ from
    the central directory's."""
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header at {header_offset}")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return header_offset + 30 + name_len + extra_len


def _patch_crcs(path: str, crcs: dict[int, tuple[int, int]]) -> None:
    """Writes the CRC-32s of the records whose data starts at a key of ``crcs`` ({offset:
    (nbytes, CRC-32)}) into the zip torch wrote under skip_data, where they are 0: the record's
    data descriptor (its local header, without one) and its central directory entry. A record
    of another size or with a CRC set is left alone. Should the archive not look as torch
    writes it, the file keeps CRC 0 for those records (as crc32=False gives; torch.load does
    not check them) and a warning says so."""
    patches: list[tuple[int, int]] = []
    try:
        f = open(path, "r+b")
    except PermissionError as e:  # a umask without the owner's read bit: written, not readable
        warnings.warn(f"deepio.save: {path}: records left without CRC-32 ({e})", RuntimeWarning, stacklevel=3)
        return
    with f:
        try:
            with zipfile.ZipFile(f) as z:
                infos, entry_at = z.infolist(), z.start_dir
            for info in infos:
                name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
                entry, entry_at = entry_at, entry_at + 46 + len(name) + len(info.extra) + len(info.comment)
                f.seek(info.header_offset)
                start = _data_start(info.header_offset, f.read(30))
                want = crcs.get(start)
                if want is None or want[0] != info.file_size or info.CRC != 0:
                    continue
                if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                    continue
                f.seek(entry)
                if f.read(4) != b"PK\x01\x02":
                    raise zipfile.BadZipFile(f"no central directory entry at {entry}")
                at = info.header_offset + 14  # the local header's CRC field
                if info.flag_bits & 0x08:  # a data descriptor follows the data
                    f.seek(start + info.file_size)
                    at = start + info.file_size + (4 if f.read(4) == b"PK\x07\x08" else 0)
                patches += [(at, want[1]), (entry + 16, want[1])]
        except (zipfile.BadZipFile, struct.error, ValueError) as e:
            warnings.warn(f"deepio.save: {path}: records left without CRC-32 ({e})", RuntimeWarning, stacklevel=3)
            return
        for at, crc in patches:
            f.seek(at)
            f.write(struct.pack("<I", crc))
    if len(patches) != 2 * len(crcs):
        warnings.warn(
            f"deepio.save: {path}: {len(crcs) - len(patches) // 2} of {len(crcs)} records left without CRC-32",
            RuntimeWarning,
            stacklevel=3,
        )


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
# RuntimeError; a corrupt length MemoryError/OverflowError).
_LOAD_ERRORS = (
    RuntimeError,
    EOFError,
    pickle.UnpicklingError,
    zipfile.BadZipFile,
    ValueError,
    LookupError,
    ArithmeticError,
    MemoryError,
    struct.error,
)


def load(path: PathArg, map_location: Any = None, *, weights_only: bool | None = None, **kwargs: Any) -> Any:
    """Loads a file written by ``torch.save`` or ``deepio.save``, as ``torch.load(path,
    map_location, weights_only=...)`` does, reading through the engine.

    Where every storage stays in host memory (``map_location="cpu"``, or None on a machine
    without an accelerator) and the file is torch's zip format, the whole file is read into
    one buffer (transparent huge pages, faulted in on a helper thread ahead of large direct
    reads, all in flight) and every storage is a view of its bytes there, as with
    ``torch.load(mmap=True)`` but read now: no copy, no second allocation. A storage that
    is freed gives its pages back at once; the buffer's mapping goes with the last. Otherwise
    (other map_locations, the legacy format, TorchScript, pickle keywords) through a
    ``Reader``: aligned direct-I/O chunks read ahead into page-locked buffers and copied into
    each storage's memory, which a helper thread faults in ahead of the copies.

    ``weights_only=None`` leaves the choice to torch, exactly as ``torch.load`` does (torch
    2.6 and later: ``True`` unless ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says otherwise), so
    files holding arbitrary Python objects need ``weights_only=False`` from a trusted source.
    Other keywords go to ``torch.load`` (``mmap=True`` maps the file instead of reading it).
    A missing file, a folder or a permission raise the ``OSError`` subclass, as ``open()``
    does; a truncated or corrupt file raises torch's exception type with the file named.
    """
    import torch

    p = _fspath(path, "load")
    if kwargs.get("mmap"):
        return torch.load(p, map_location=map_location, weights_only=weights_only, **kwargs)
    if _WHOLE_FILE and not kwargs and _to_host(map_location):
        taken = _load_whole(p, map_location, weights_only)
        if taken is not None:
            return taken[0]
    with Reader(p) as f:
        try:
            return torch.load(cast(IO[bytes], f), map_location=map_location, weights_only=weights_only, **kwargs)
        except OSError:
            raise
        except _LOAD_ERRORS as e:
            raise _naming(e, p) from e


def _naming(e: BaseException, path: str) -> BaseException:
    msg = f"deepio.load({path!r}): cannot load it as a torch checkpoint (truncated or corrupt?): {e}"
    for cls in type(e).__mro__:  # the nearest class that takes a message (UnicodeDecodeError does not)
        try:
            named = cls(msg)
        except Exception:
            continue
        if isinstance(named, BaseException):
            return named
    return RuntimeError(msg)


# ------------------------------------------------------------- load: the whole file at once

#: deepio.load reads a zip checkpoint whole into one page-aligned buffer and makes every
#: storage a view of it (False: through a Reader into memory torch allocates per storage).
_WHOLE_FILE = True
_WHOLE_CHUNK = 16 << 20  # engine request size of the whole-file read
_WHOLE_POPULATE_THREADS = 1  # helper threads faulting the buffer in ahead of the reads (0: none)
# Transparent huge pages for the buffer: on the development VM a load on them cost 0.16-0.20
# CPU s/GiB against 0.50-0.57 on 4 KiB pages (faulting fresh memory in is paid per page) and ran
# about 2x as fast (docs/benchmarks.md, "deepio.load reads the whole file into huge pages").
_WHOLE_HUGEPAGES = True


def _to_host(map_location: Any) -> bool:
    """Whether every storage of the load stays in host memory, so that views of one host buffer
    are the result: map_location "cpu", or None where no accelerator could be the saved
    location (a file saved from CUDA would otherwise hold the whole host buffer until every
    storage is on the device)."""
    torch = sys.modules["torch"]
    if map_location is None:
        try:
            acc = getattr(torch, "accelerator", None)
            if acc is not None and hasattr(acc, "is_available"):
                return not acc.is_available()
            return not torch.cuda.is_available()
        except Exception:
            return False
    if isinstance(map_location, str):
        return map_location == "cpu"
    return isinstance(map_location, torch.device) and map_location.type == "cpu" and map_location.index is None


def _weights_only_as_torch_load(weights_only: bool | None) -> bool | None:
    """The weights_only torch.load decides on; None where deepio leaves it to torch.load (an
    unknown torch, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD overriding a default: torch warns, both
    force variables set: torch raises)."""
    ser = sys.modules["torch"].serialization
    not_set = weights_only is None
    if not_set:
        default = getattr(ser, "_default_to_weights_only", None)
        if default is None:
            return None
        weights_only = bool(default(None))
    yes = ("1", "y", "yes", "true")
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in yes
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in yes
    if force and force_no:
        return None
    if force:
        return True
    if force_no and not_set:
        return None
    return bool(weights_only)


class _MemoryFile(io.RawIOBase):
    """A read-only file over a memoryview, for torch's zip reader (the archive's directory
    and its small records; the storages are never read through it)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = max(0, min(len(dest), len(self._view) - self._pos))
        dest[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


def _read_whole(p: str) -> tuple[mmap.mmap, int, int] | None:
    """The whole file in fresh page-aligned anonymous memory (the buffer, the offset of the
    file's first byte in it, the file's size), read through the engine in _WHOLE_CHUNK requests, all in
    flight (direct I/O: file offsets and addresses share their alignment), each submitted once
    a helper thread has faulted its memory in. With _WHOLE_HUGEPAGES the file starts on a
    2 MiB boundary of a buffer 2 MiB larger, asked for transparent huge pages. None for a file
    too short to be a zip checkpoint."""
    if os.path.isdir(p):  # O_RDONLY opens a folder; reading it would say EISDIR late
        raise IsADirectoryError(errno.EISDIR, "Is a directory", p)
    with File(p, "r", handle=None) as f:
        size = f.size()
        if size < 4:
            return None
        buf, off = _populate.anonymous(size, _WHOLE_HUGEPAGES)
        addr = _populate.address(buf)
        view = memoryview(buf)[off : off + size]
        futs: list[tuple[Future, int]] = []
        ahead = None
        if _WHOLE_POPULATE_THREADS > 0 and _populate.available():
            ahead = _populate.Ahead([(addr + off, size)], _WHOLE_CHUNK, _WHOLE_POPULATE_THREADS)
        first: BaseException | None = None
        try:
            for at in range(0, size, _WHOLE_CHUNK):
                n = min(_WHOLE_CHUNK, size - at)
                if ahead is not None:
                    ahead.wait_through(at + n)
                futs.append((f.pread(view[at : at + n], at), n))
        except BaseException as e:  # Ctrl-C: no read may outlive the buffer
            first = e
        finally:
            if ahead is not None:
                ahead.close()
        short = False
        for fut, n in futs:
            try:
                short = short or fut.result() != n
            except BaseException as e:
                first = first or (_with_name(e, p) if isinstance(e, OSError) else e)
        del view, futs
        if first is not None or short:
            try:
                buf.close()
            except BufferError:  # a view still exported: freed with its last reference
                pass
        if first is not None:
            raise first
        # short: the file shrank under us, and the Reader's route says what is wrong
        return None if short else (buf, off, size)


def _load_whole(p: str, map_location: Any, weights_only: bool | None) -> tuple[Any] | None:
    """torch.load's zip route with every storage a view of one buffer holding the whole file
    (torch's own ``overall_storage``, which torch.load(mmap=True) gives a mapping of the
    file). None where the Reader's route should load the file instead: not a zip (torch's
    legacy format), a TorchScript archive, a torch without these internals, or any failure to
    load before unpickling starts, and a weights-only load that fails (the Reader's route then
    raises torch.load's own exception, named); a failure while unpickling with
    weights_only=False is raised (named) without loading again: the file's code ran once."""
    import torch

    ser = torch.serialization
    load_zip = getattr(ser, "_load", None)
    unpickler = getattr(ser, "_weights_only_unpickler", None)
    wo = _weights_only_as_torch_load(weights_only)
    if load_zip is None or unpickler is None or wo is None:
        return None
    read = _read_whole(p)
    if read is None:
        return None
    buf, off, size = read
    try:
        view = memoryview(buf)[off : off + size]
        if bytes(view[:4]) != b"PK\x03\x04":
            return None
        zf = torch._C.PyTorchFileReader(cast(IO[bytes], _MemoryFile(view)))
        if "constants.pkl" in zf.get_all_records():
            return None  # TorchScript: torch.load hands it to torch.jit.load
        storages = _RecordStorages(buf, off)
    except Exception:
        return None
    try:
        result = load_zip(zf, map_location, unpickler if wo else pickle, overall_storage=storages, encoding="utf-8")
    except TypeError as e:
        if "overall_storage" in str(e):
            return None  # a torch whose loader has no such parameter
        raise
    except Exception as e:
        if wo:
            # The weights-only unpickler runs no code of the file's: the Reader's route loads
            # it again for torch.load's own message (how to allow the globals it refused).
            return None
        # Unpickling ran the file's code (weights_only=False): never a second time, as
        # torch.load raises; named as the Reader's route names it.
        if isinstance(e, OSError) or not isinstance(e, _LOAD_ERRORS):
            raise
        raise _naming(e, p) from e
    _release_outside_storages(_populate.address(buf) + off, view)
    return (result,)


_MADV_DONTNEED = 4
_RELEASE_MIN = 2 << 20  # gaps between storage records from this size are given back


class _RecordStorages:
    """What torch's zip loader takes as ``overall_storage`` (it only slices it: one slice per
    storage record): each slice is a storage of its own over the record's bytes in the buffer
    (``torch.frombuffer`` of a ctypes view, which keeps the buffer mapped), and when that storage
    is freed the whole pages inside its record go back to the kernel (MADV_DONTNEED). So a
    storage the caller drops (a model's weights once ``load_state_dict`` copied them) stops
    holding memory while other storages of the same load live on; the mapping itself goes
    with the last of them."""

    def __init__(self, buf: mmap.mmap, off: int) -> None:
        self._buf, self._off = buf, off
        self._addr = _populate.address(buf) + off

    def __getitem__(self, s: slice) -> Any:
        torch = sys.modules["torch"]
        start, stop = int(s.start), int(s.stop)
        if stop <= start:
            return torch.UntypedStorage(0)
        piece = (ctypes.c_char * (stop - start)).from_buffer(self._buf, self._off + start)
        # Not at exit: an atexit handler of the caller's may still read the tensor then.
        weakref.finalize(piece, _give_back, self._addr + start, stop - start).atexit = False
        return torch.frombuffer(piece, dtype=torch.uint8).untyped_storage()


def _give_back(addr: int, nbytes: int) -> None:
    """MADV_DONTNEED on the whole pages of [addr, addr + nbytes) (a hint: never raises)."""
    lo, hi = _populate.whole_pages(addr, nbytes)
    if hi > lo:
        _populate.advise(lo, hi - lo, _MADV_DONTNEED)


def _release_outside_storages(addr: int, view: memoryview) -> None:
    """Gives the buffer's pages that hold no storage bytes back to the kernel (MADV_DONTNEED:
    the pickle, zip headers and directory, records torch copied out), where a gap is at least
    _RELEASE_MIN: the buffer stays mapped while any storage lives (each gives back only its own
    record's pages when it goes), and a checkpoint with a large pickled object would otherwise
    keep that object's bytes too. Storage records are the archive's ``/data/``
    entries; torch read every other record into memory of its own. A hint: on any doubt
    (a directory zipfile cannot read), nothing is released."""
    if len(view) < 2 * _RELEASE_MIN:
        return
    keep: list[tuple[int, int]] = []
    try:
        with zipfile.ZipFile(cast(IO[bytes], _MemoryFile(view))) as z:
            for info in z.infolist():
                if "/data/" in info.filename and info.file_size:
                    start = _data_start(info.header_offset, bytes(view[info.header_offset : info.header_offset + 30]))
                    keep.append((start, start + info.file_size))
    except Exception:
        return
    at = 0
    for start, end in [*sorted(keep), (len(view), len(view))]:
        lo, hi = _populate.whole_pages(addr + at, start - at)
        if hi - lo >= _RELEASE_MIN:
            _populate.advise(lo, hi - lo, _MADV_DONTNEED)
        at = max(at, end)
