"""``deepio.aio_handle``: DeepNVMe's aio_handle, method for method, over any tensor.

Differences from DeepNVMe, all deliberate (see docs/python.md):
  * failures raise OSError subclasses instead of returning -1, printing or aborting;
  * any size, offset and buffer address works (no 512-byte or per-thread divisibility rules);
  * ``read``/``pread`` read ``buffer.nbytes`` bytes at ``file_offset`` and need the file to
    hold them (EndOfFileError otherwise), instead of asserting buffer size == file size;
  * ``validate=True`` compares file and buffer after the transfer and raises
    ``deepio.ValidationError`` on a mismatch, instead of printing Pass/Fail;
  * ``wait()`` with nothing pending returns 0; a handle dropped with pending operations
    finishes them first.
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Sequence
from typing import Any, Union, cast

from . import _buffers, _deepio
from ._errors import describe

FileArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]", int]

# Aliases only: the names themselves ("auto", "on", "off") are checked by the engine, which
# raises deepio.InvalidArgumentError (a ValueError) naming direct_io for anything else.
_DIRECT_IO_ALIASES = {True: "on", False: "off", None: "auto"}


def _direct_io_arg(direct_io: Any) -> str:
    """direct_io as the engine takes it: True/False/None as "on"/"off"/"auto", a str as it is."""
    direct: Any = direct_io
    if direct_io is None or isinstance(direct_io, bool):
        direct = _DIRECT_IO_ALIASES[direct_io]
    if not isinstance(direct, str):
        raise ValueError(f"direct_io must be 'auto', 'on', 'off', True or False, not {direct_io!r}")
    return direct


class ValidationError(OSError):
    """validate=True found different bytes in the file than in the buffer (errno EIO)."""


# Type coercions for DeepNVMe's positional arguments (NumPy integers and bools in, bools not
# taken for integers). The values themselves are checked once, by the engine: a zero or
# negative size raises deepio.InvalidArgumentError (a ValueError) naming the parameter.
def _int_arg(name: str, value: Any) -> int:
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an integer, not {type(value).__qualname__}")


def _bool_arg(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be a bool, not {type(value).__qualname__}")


def _pick_file(filename: Any, fd: Any, method: str) -> FileArg:
    if fd is not None:
        if filename is not None:
            raise TypeError(f"{method}() takes a filename or fd=, not both")
        if isinstance(fd, bool) or not isinstance(fd, int):
            raise TypeError(f"fd must be an integer file descriptor, not {type(fd).__qualname__}")
        return fd
    if filename is None:
        raise TypeError(f"{method}() missing the file: pass a filename or fd=")
    return filename


def _async_flag(async_op: Any, kwargs: dict, method: str) -> bool:
    # DeepNVMe names this parameter `async`, which Python callers can only pass as **{"async": x}.
    if "async" in kwargs:
        if async_op is not None:
            raise TypeError(f"{method}() got both async_op and async")
        async_op = kwargs.pop("async")
    if kwargs:
        raise TypeError(f"{method}() got unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
    if async_op is None:
        raise TypeError(f"{method}() missing required argument: 'async_op'")
    return _bool_arg("async_op", async_op)


class aio_handle:  # noqa: N801 - DeepNVMe's name
    """Asynchronous reads and writes between files and CPU or CUDA memory (tensors, arrays,
    buffers).

    ``aio_handle(block_size=1048576, queue_depth=128, single_submit=False,
    overlap_events=False, intra_op_parallelism=1, *, backend="auto", direct_io="auto",
    device_route="auto")``

    A request larger than two blocks (``2 * block_size``) is split across
    ``intra_op_parallelism`` worker threads; a smaller one goes whole to one worker (the next
    in turn). Each worker cuts its part into ``block_size`` requests, with up to
    ``queue_depth`` in flight per worker.
    ``backend``: "auto" (io_uring, then libaio, then threads), "io_uring", "libaio",
    "threads". ``direct_io``: "auto" (O_DIRECT where the file system accepts it), "on"
    (O_DIRECT or EINVAL), "off" (page cache); True/False mean "on"/"off".
    ``device_route``: how CUDA tensors reach files. "auto" (GPUDirect Storage through cuFile
    where it is usable, else staged as described below; looked for on the first operation on
    CUDA memory, so a handle that never sees one never loads cuFile), "staged" (always staged,
    DeepNVMe's aio_handle), "gds" (cuFile required, as ``gds_handle(mode="cufile")``: OSError
    ENOTSUP at construction where CUDA or cuFile is missing). ``get_stats()``-style counters
    in ``stats()`` say which route each operation took (``device_ops_cufile``,
    ``device_ops_staged``, ``device_bytes_cufile``, ``device_bytes_staged``).
    DeepNVMe's older names ``num_threads``/``thread_count`` are accepted for
    ``intra_op_parallelism``.

    Staged CUDA tensors (torch ``is_cuda``, or any DLPack producer reporting kDLCUDA) are read
    and written through pinned host staging slots, disk reads overlapped with host-to-device
    copies; after ``wait()`` the data is in device memory, visible to every stream. The copies
    are ordered after the producer's work by a handshake on the device, never by stalling
    the caller: an event recorded at submission on torch's current stream (torch tensors) or
    DLPack's stream exchange (``__dlpack__(stream=...)``, other producers), which deepio's
    copy streams wait for. Without a usable CUDA driver such buffers raise TypeError saying
    why (see ``deepio.gpu_info()``).

    Thread-safe: any method may be called from several threads. Buffers passed to
    asynchronous calls are kept alive by the handle until ``wait()`` collects them; do not
    modify (writes) or read (reads) them before that.
    """

    def __init__(
        self,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
        *,
        backend: str = "auto",
        direct_io: str | bool | None = "auto",
        device_route: str = "auto",
        num_threads: int | None = None,
        thread_count: int | None = None,
    ) -> None:
        for alias, value in (("num_threads", num_threads), ("thread_count", thread_count)):
            if value is not None:
                if intra_op_parallelism not in (1, value):
                    raise TypeError(f"pass intra_op_parallelism or {alias}, not both")
                intra_op_parallelism = value
        block_size = _int_arg("block_size", block_size)
        queue_depth = _int_arg("queue_depth", queue_depth)
        intra_op_parallelism = _int_arg("intra_op_parallelism", intra_op_parallelism)
        single_submit = _bool_arg("single_submit", single_submit)
        overlap_events = _bool_arg("overlap_events", overlap_events)
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str, not {type(backend).__qualname__}")
        direct = _direct_io_arg(direct_io)
        if not isinstance(device_route, str):
            raise TypeError(f"device_route must be a str, not {type(device_route).__qualname__}")
        self._device_route = device_route
        self._h = self._engine(
            block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, backend, direct
        )
        # (buffer, file, offset) of asynchronous operations submitted with validate=True.
        self._to_validate: list[tuple[Any, FileArg, int]] = []

    def _engine(self, *args: Any) -> _deepio.Handle:
        """The engine behind this handle (gds_handle makes a GdsHandle, the same engine with
        the GPUDirect Storage route and its pinning calls)."""
        block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, backend, direct = args
        return _deepio.Handle(
            block_size,
            queue_depth,
            single_submit,
            overlap_events,
            intra_op_parallelism,
            backend,
            direct,
            self._device_route,
        )

    # ----------------------------------------------------------------- getters (DeepNVMe §1.3)
    def get_block_size(self) -> int:
        return self._h.block_size

    def get_queue_depth(self) -> int:
        return self._h.queue_depth

    def get_single_submit(self) -> bool:
        return self._h.single_submit

    def get_overlap_events(self) -> bool:
        return self._h.overlap_events

    def get_intra_op_parallelism(self) -> int:
        return self._h.intra_op_parallelism

    def get_thread_count(self) -> int:
        """DeepNVMe's older name of get_intra_op_parallelism()."""
        return self._h.intra_op_parallelism

    def get_alignment(self) -> int:
        """DeepNVMe's value, ``intra_op_parallelism * 512``, for code that pads buffers with
        it. deepio itself needs no alignment: any size, offset and address works."""
        return self._h.intra_op_parallelism * 512

    # ---------------------------------------------------------------------- synchronous I/O
    def read(self, buffer: Any, filename: FileArg, validate: bool = False, file_offset: int = 0) -> int:
        """Reads ``buffer.nbytes`` bytes at ``file_offset`` into ``buffer``; returns 0.
        Blocks (GIL released); does not wait for other pending operations."""
        self._h.sync(False, buffer, filename, file_offset)
        if _bool_arg("validate", validate):
            self._validate(buffer, filename, file_offset)
        return 0

    def write(
        self, buffer: Any, filename: FileArg, validate: bool = False, file_offset: int = 0, *, fsync: bool = False
    ) -> int:
        """Writes ``buffer`` at ``file_offset`` (creating the file, never truncating it);
        returns 0. Blocks (GIL released); does not wait for other pending operations.
        ``fsync=True``: returns once the data is on stable storage (fdatasync)."""
        self._h.sync(True, buffer, filename, file_offset, _bool_arg("fsync", fsync))
        if _bool_arg("validate", validate):
            self._validate(buffer, filename, file_offset)
        return 0

    # ------------------------------------------------------------------------- parallel I/O
    def pread(
        self,
        buffer: Any,
        filename: FileArg,
        validate: bool = False,
        async_op: bool | None = None,
        file_offset: int = 0,
        **kwargs: Any,
    ) -> int:
        """DeepNVMe's ``pread(buffer, filename, validate, async, file_offset=0)``: async
        queues the read and returns 0; otherwise it reads as sync_pread() does and returns 1."""
        if _async_flag(async_op, kwargs, "pread"):
            return self._async(False, buffer, filename, file_offset, validate)
        return self._sync(False, buffer, filename, file_offset, validate)

    def pwrite(
        self,
        buffer: Any,
        filename: FileArg,
        validate: bool = False,
        async_op: bool | None = None,
        file_offset: int = 0,
        *,
        fsync: bool = False,
        **kwargs: Any,
    ) -> int:
        """DeepNVMe's ``pwrite(buffer, filename, validate, async, file_offset=0)``.
        ``fsync=True`` (deepio extension): the write completes only once its data is on
        stable storage (see async_pwrite)."""
        if _async_flag(async_op, kwargs, "pwrite"):
            return self._async(True, buffer, filename, file_offset, validate, fsync)
        return self._sync(True, buffer, filename, file_offset, validate, fsync)

    def sync_pread(
        self, buffer: Any, filename: FileArg | None = None, file_offset: int = 0, *, fd: int | None = None
    ) -> int:
        """Reads and waits for this read alone; returns 1. Raises only this read's failure:
        operations queued before keep running, and their count and failures stay for wait()
        (DeepNVMe's sync calls also waited for and counted them; call wait() first for that)."""
        return self._sync(False, buffer, _pick_file(filename, fd, "sync_pread"), file_offset, False)

    def sync_pwrite(
        self,
        buffer: Any,
        filename: FileArg | None = None,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        fsync: bool = False,
    ) -> int:
        """Writes and waits for this write alone; returns 1 (operations queued before stay
        for wait(), as for sync_pread). ``fsync=True``: this write is on stable storage when
        the call returns."""
        return self._sync(True, buffer, _pick_file(filename, fd, "sync_pwrite"), file_offset, False, fsync)

    def async_pread(
        self, buffer: Any, filename: FileArg | None = None, file_offset: int = 0, *, fd: int | None = None
    ) -> int:
        """Queues a read of ``buffer.nbytes`` bytes at ``file_offset``; returns 0. ``filename``
        may be an integer descriptor (or pass ``fd=``), which deepio never closes and which
        must stay open until wait() returns."""
        return self._async(False, buffer, _pick_file(filename, fd, "async_pread"), file_offset, False)

    def async_pwrite(
        self,
        buffer: Any,
        filename: FileArg | None = None,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        fsync: bool = False,
    ) -> int:
        """Queues a write of ``buffer`` at ``file_offset`` (creating, never truncating);
        returns 0. ``filename`` may be an integer descriptor (or ``fd=``), never closed.

        ``fsync=True`` (deepio extension): once every block of the write is done, the engine
        calls fdatasync on the file from its own sync threads (many files at once, so the file
        system commits them together), and the operation counts as complete only after that:
        when wait() returns, the data is on stable storage. A failed sync (EIO, ...) is that
        operation's OSError from wait(), naming the file."""
        return self._async(True, buffer, _pick_file(filename, fd, "async_pwrite"), file_offset, False, fsync)

    def async_pread_batch(
        self, buffers: Sequence[Any], files: FileArg | Sequence[FileArg], file_offsets: Sequence[int] | None = None
    ) -> int:
        """Queues one read per buffer in a single call; returns how many were queued.

        ``files`` is one path or descriptor for every buffer (one file at several offsets) or
        a sequence with one per buffer; ``file_offsets`` one offset per buffer (default 0).
        The buffers are checked first (a bad one queues nothing and raises), then the call
        releases the GIL once and returns; the files are opened off the calling thread, so
        a file that cannot be opened, or a read past its end, is reported by wait() (the
        first failure raised, the others in its ``other_errors``), not here."""
        _check_buffer_list(buffers)
        return cast(int, self._h.submit_batch(False, buffers, files, file_offsets))

    def async_pwrite_batch(
        self,
        buffers: Sequence[Any],
        files: FileArg | Sequence[FileArg],
        file_offsets: Sequence[int] | None = None,
        *,
        fsync: bool = False,
    ) -> int:
        """Queues one write per buffer in a single call (creating files, never truncating);
        returns how many were queued. Arguments and failures as for async_pread_batch.
        ``fsync=True``: each write completes once fdatasync made it durable (see async_pwrite)."""
        _check_buffer_list(buffers)
        fsync = _bool_arg("fsync", fsync)
        return cast(int, self._h.submit_batch(True, buffers, files, file_offsets, False, fsync))

    def async_pread_ranges(
        self,
        buffer: Any,
        filename: FileArg | None,
        file_offsets: Any,
        sizes: Any,
        buffer_offsets: Any = None,
        *,
        fd: int | None = None,
    ) -> int:
        """Queues ONE read of many ranges of one file (deepio extension): range ``i`` is
        ``sizes[i]`` bytes at ``file_offsets[i]`` of the file, read into ``buffer`` at
        ``buffer_offsets[i]`` (default: the ranges packed one after another from the start of
        the buffer). A gather of rows, pages or records in one call: one operation for wait()
        (one completion, one file open, the ranges' requests filling the queue as one large
        read's do), where a batch costs one operation per buffer. Returns the bytes it moves.

        ``file_offsets``, ``sizes`` and ``buffer_offsets`` are 1-D integer arrays (NumPy,
        torch CPU tensors, ``array.array``) or lists of integers; ``sizes`` may be one integer
        for every range. Ranges may come in any order, any size and alignment. Refused at the
        call, with nothing queued (deepio.InvalidArgumentError naming the range): a range
        outside the buffer, a negative offset or size, two ranges whose buffer bytes overlap;
        a range past the end of the file raises EndOfFileError naming it. The operation fails
        as a whole (wait() raises the first failure; the buffer's contents are then
        unspecified). GPU buffers are staged through host memory (never GPUDirect Storage)."""
        return self._ranges(
            False, buffer, _pick_file(filename, fd, "async_pread_ranges"), file_offsets, sizes, buffer_offsets, False
        )

    def async_pwrite_ranges(
        self,
        buffer: Any,
        filename: FileArg | None,
        file_offsets: Any,
        sizes: Any,
        buffer_offsets: Any = None,
        *,
        fd: int | None = None,
        fsync: bool = False,
    ) -> int:
        """Queues ONE write of many ranges to one file (deepio extension; created if needed,
        never truncated): range ``i`` writes ``sizes[i]`` bytes of ``buffer`` from
        ``buffer_offsets[i]`` (default: packed) to ``file_offsets[i]``. Arguments and failures
        as for async_pread_ranges, except that it is the ranges' *file* bytes that must not
        overlap (buffer bytes may be written to several places). ``fsync=True``: the file is
        synced once, after every range is written, before wait() counts it complete."""
        return self._ranges(
            True, buffer, _pick_file(filename, fd, "async_pwrite_ranges"), file_offsets, sizes, buffer_offsets, fsync
        )

    def _ranges(
        self, write: bool, buffer: Any, file: FileArg, file_offsets: Any, sizes: Any, buffer_offsets: Any, fsync: Any
    ) -> int:
        return cast(
            int,
            self._h.submit_ranges(
                write,
                buffer,
                file,
                *_range_args(file_offsets, sizes, buffer_offsets),
                _bool_arg("fsync", fsync),
            ),
        )

    def wait(self) -> int:
        """Blocks (GIL released, Ctrl-C honoured) until every queued operation completed;
        returns how many (0 if none). If any failed, raises the first failure's OSError once
        all of them finished (the others are in its ``other_errors``). After a
        KeyboardInterrupt the operations keep running and the next wait() collects them."""
        checks, self._to_validate = self._to_validate, []
        n = self._h.wait()
        for buffer, file, offset in checks:
            self._validate(buffer, file, offset)
        return n

    # ------------------------------------------------------------------ locked host memory
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any = None, **kwargs: Any) -> Any:
        """A 1-D tensor/array of ``num_elem`` elements with ``example_tensor``'s dtype and
        kind (torch for a torch example, NumPy for a NumPy example), page-aligned, not
        zeroed, page-locked where RLIMIT_MEMLOCK allows (else a LockedMemoryWarning).
        DeepNVMe's misspelled keyword ``example_tenosr`` is accepted."""
        if "example_tenosr" in kwargs:
            if example_tensor is not None:
                raise TypeError("pass example_tensor or example_tenosr, not both")
            example_tensor = kwargs.pop("example_tenosr")
        if kwargs:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
        return _buffers.new_locked(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        """Releases a tensor made by new_cpu_locked_tensor() (through any handle): True;
        False for anything else (a view, foreign memory, a second free). The memory is
        returned when the last reference to the tensor (and its views) goes away; do not use
        the tensor after freeing it."""
        return _buffers.free_locked(tensor)

    def is_pinned(self, buffer: Any) -> bool:
        """DeepNVMe's name: True for buffers lying entirely inside a locked allocation (from
        any handle, views included) and for torch-pinned tensors."""
        return _buffers.is_locked_or_pinned(buffer)

    # ---------------------------------------------------------------------------- extras
    @property
    def backend(self) -> str:
        """The backend the workers really use: "io_uring", "libaio" or "threads"."""
        return self._h.backend

    @property
    def direct_io(self) -> str:
        return self._h.direct_io

    def pending(self) -> int:
        """Operations queued and not yet collected by wait()."""
        return self._h.pending()

    def stats(self) -> dict:
        """Counters: ops, bytes moved direct / bounced / buffered, short transfers, retries."""
        return self._h.stats()

    def close(self) -> None:
        """Waits for every pending operation (raising the first failure), then stops the
        workers. Further use raises ValueError. Idempotent."""
        self._h.close()

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __enter__(self) -> aio_handle:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            try:
                self.close()
            except Exception as e:
                # The exception already propagating wins; this one travels with it.
                if exc is not None and hasattr(exc, "add_note"):
                    exc.add_note(f"deepio.aio_handle.close() also failed while it propagated: {describe(e)}")
                    if not hasattr(exc, "close_error"):
                        try:
                            exc.close_error = e
                        except AttributeError:  # an exception type with __slots__
                            pass

    def __repr__(self) -> str:
        if self._h.closed:
            return "<deepio.aio_handle closed>"
        return (
            f"<deepio.aio_handle block_size={self._h.block_size} queue_depth={self._h.queue_depth} "
            f"single_submit={self._h.single_submit} overlap_events={self._h.overlap_events} "
            f"intra_op_parallelism={self._h.intra_op_parallelism} backend={self._h.backend!r} "
            f"direct_io={self._h.direct_io!r}>"
        )

    # ---------------------------------------------------------------------------- helpers
    def _sync(self, write: bool, buffer: Any, file: FileArg, offset: int, validate: Any, fsync: Any = False) -> int:
        n = self._h.sync(write, buffer, file, offset, _bool_arg("fsync", fsync))
        if _bool_arg("validate", validate):
            self._validate(buffer, file, offset)
        return n

    def _async(self, write: bool, buffer: Any, file: FileArg, offset: int, validate: Any, fsync: Any = False) -> int:
        self._h.submit(write, buffer, file, offset, _bool_arg("fsync", fsync))
        if _bool_arg("validate", validate):
            self._to_validate.append((buffer, file, offset))
        return 0

    @staticmethod
    def _validate(buffer: Any, file: FileArg, offset: int) -> None:
        if _buffers.is_device_buffer(buffer):
            if not _buffers.is_torch_cuda(buffer):
                raise TypeError("validate=True needs a torch tensor to copy a device buffer to the CPU")
            buffer = buffer.detach().cpu()
        where = _deepio.compare_with_file(buffer, file, offset)
        if where >= 0:
            name = file if not isinstance(file, int) else None
            err = ValidationError(
                5,  # EIO
                f"validation failed: the file differs from the buffer at byte {where} of the "
                f"range (offset {offset}, {_nbytes(buffer)} bytes)",
                name,
            )
            raise err


def _range_args(file_offsets: Any, sizes: Any, buffer_offsets: Any) -> tuple[Any, Any, Any]:
    """The ranges' arguments as the binding's submit_ranges reads them."""
    return (
        _index_array(file_offsets),
        _size_arg(sizes),
        None if buffer_offsets is None else _index_array(buffer_offsets),
    )


def _size_arg(sizes: Any) -> Any:
    """One size for every range as an int (Python, NumPy or torch scalar); anything else
    as an array for the binding to read."""
    if isinstance(sizes, int) and not isinstance(sizes, bool):
        return sizes
    dtype = getattr(sizes, "dtype", None)
    if getattr(sizes, "ndim", None) == 0 and dtype is not None:
        if "bool" in str(dtype):  # True is not a size (the binding refuses bools everywhere)
            raise TypeError(f"sizes must be an integer or integers, not a {dtype} scalar")
        try:
            return operator.index(sizes)
        except TypeError:
            pass  # not an integer: the binding names the item type
    return _index_array(sizes)


def _index_array(values: Any) -> Any:
    """A torch CPU tensor of integers as a NumPy view (the binding reads buffer-protocol
    arrays without a Python call per item); anything else as it is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise TypeError(f"offsets and sizes must be host integers, not a tensor on {values.device}")
        return values.detach().numpy()
    return values


def _check_buffer_list(buffers: Sequence[Any]) -> None:
    # A tensor or array is itself a sequence (of rows): refuse it rather than write its rows.
    if not isinstance(buffers, (list, tuple)):
        raise TypeError(f"buffers must be a list or tuple of buffers, not {type(buffers).__qualname__}")


def _nbytes(buffer: Any) -> int:
    n = getattr(buffer, "nbytes", None)
    if isinstance(n, int):
        return n
    return len(memoryview(buffer).cast("B"))
