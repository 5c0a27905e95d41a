"""``deepio.gds_handle``: DeepNVMe's gds_handle over ``deepio::GdsHandle``.

CUDA tensors go through GPUDirect Storage (cuFile), or, where GDS itself is not usable
(no nvidia-fs, unsupported file system, no libcufile), through cuFile's compatibility mode
or deepio's staging through host memory; ``mode`` says which. Everything else (CPU tensors,
arrays, and any buffer given with a file descriptor) uses the CPU path of ``aio_handle``,
as DeepNVMe's gds_handle does for non-CUDA tensors.

Differences from DeepNVMe, deliberate: every cuFile/CUDA error raises an OSError subclass
(DeepNVMe calls ``exit()``); the GIL is released while waiting and while opening files;
nothing is written to the working directory; a view may lie anywhere inside a pinned buffer
(a range running past its end is an error instead of a crash); pinned tensors are kept alive
until unpinned, so a registration never outlives its memory.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Optional, Union

from . import _buffers, _deepio
from ._aio import FileArg, _bool_arg, _int_arg, aio_handle

_MODES = ("auto", "cufile", "compat")

# Pinned device tensors by address, kept alive while registered (registrations are
# process-wide, like DeepNVMe's registry).
_pinned: Dict[int, Any] = {}
_pinned_lock = threading.Lock()


def gpu_info() -> dict:
    """What CUDA and cuFile this process can use: ``cuda_found``/``cuda_reason``,
    ``cufile_found``/``cufile_reason``, ``driver_version``, ``device_count``,
    ``nvidia_fs_loaded``, ``gds_mode`` ("gds", "compat" or "unavailable") and
    ``gds_reason``. Never raises."""
    return _deepio.gpu_info()


class gds_handle(aio_handle):  # noqa: N801 - DeepNVMe's name
    """Reads and writes between files and CUDA tensors through GPUDirect Storage.

    ``gds_handle(block_size=1048576, queue_depth=128, single_submit=False,
    overlap_events=False, intra_op_parallelism=1, *, mode="auto", backend="auto",
    direct_io="auto")``

    Requests on CUDA tensors are cut into ``block_size`` chunks spread over
    ``intra_op_parallelism`` workers, each a cuFileRead/cuFileWrite. ``mode``: "auto"
    (cuFile where it accepts the file, else deepio's staged path, reported by ``mode``),
    "cufile" (cuFile only: an error where it refuses), "compat" (never cuFile). CPU buffers,
    and any buffer given with a descriptor, take ``aio_handle``'s path (``backend`` and
    ``direct_io`` configure it). Raises OSError (ENOTSUP/ENODEV) when no CUDA driver is
    usable; ``deepio.gpu_info()`` says why.

    Has every ``aio_handle`` method, plus ``pin_device_tensor``, ``unpin_device_tensor``,
    ``new_pinned_device_tensor`` and ``free_pinned_device_tensor``. Thread-safe.
    """

    def __init__(
        self,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
        *,
        mode: str = "auto",
        backend: str = "auto",
        direct_io: Union[str, bool, None] = "auto",
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        # The GDS engine first: without CUDA this raises before any worker starts.
        self._g = _deepio.GdsHandle(
            _int_arg("block_size", block_size),
            _int_arg("queue_depth", queue_depth),
            _bool_arg("single_submit", single_submit),
            _bool_arg("overlap_events", overlap_events),
            _int_arg("intra_op_parallelism", intra_op_parallelism),
            mode,
        )
        super().__init__(
            block_size,
            queue_depth,
            single_submit,
            overlap_events,
            intra_op_parallelism,
            backend=backend,
            direct_io=direct_io,
        )

    # ------------------------------------------------------------------------ getters
    def get_alignment(self) -> int:
        """DeepNVMe's value for gds_handle, 512. deepio needs no alignment."""
        return 512

    @property
    def mode(self) -> str:
        """"gds" (GPUDirect Storage proper) or "compat" (staged through host memory, by
        cuFile's compatibility mode or by deepio); turns "compat" once a file was staged."""
        return self._g.mode

    @property
    def mode_reason(self) -> str:
        """Why ``mode`` is not "gds" ("" when it is)."""
        return self._g.mode_reason

    def get_mode(self) -> str:
        return self._g.mode

    # --------------------------------------------------------------------------- I/O
    def _gds_route(self, buffer: Any, file: FileArg) -> bool:
        return not isinstance(file, int) and _buffers.is_device_buffer(buffer)

    def read(self, buffer: Any, filename: FileArg, validate: bool = False, file_offset: int = 0) -> int:
        """Reads ``buffer.nbytes`` bytes at ``file_offset``; returns 0. For a CUDA tensor this
        also collects the other GDS operations pending on the handle."""
        if not self._gds_route(buffer, filename):
            return super().read(buffer, filename, validate, file_offset)
        _buffers.sync_producer_stream(buffer)
        self._g.submit(False, buffer, filename, file_offset)
        self._g.wait()
        if _bool_arg("validate", validate):
            self._validate(buffer, filename, file_offset)
        return 0

    def write(self, buffer: Any, filename: FileArg, validate: bool = False, file_offset: int = 0) -> int:
        """Writes ``buffer`` at ``file_offset`` (creating, never truncating); returns 0."""
        if not self._gds_route(buffer, filename):
            return super().write(buffer, filename, validate, file_offset)
        _buffers.sync_producer_stream(buffer)
        self._g.submit(True, buffer, filename, file_offset)
        self._g.wait()
        if _bool_arg("validate", validate):
            self._validate(buffer, filename, file_offset)
        return 0

    def wait(self) -> int:
        """Blocks (GIL released) until every queued operation, GDS and CPU, completed;
        returns how many (0 if none). Raises the first failure once all finished."""
        checks, self._to_validate = self._to_validate, []
        n = self._wait_both()
        for buffer, file, offset in checks:
            self._validate(buffer, file, offset)
        return n

    def pending(self) -> int:
        return self._h.pending() + self._g.pending()

    def stats(self) -> dict:
        """``aio_handle``'s counters for the CPU path, plus ``gds``: operations, chunks,
        bytes moved by cuFile and bytes staged, files cuFile refused."""
        d = self._h.stats()
        d["gds"] = self._g.stats()
        return d

    def close(self) -> None:
        """Waits for every pending operation (raising the first failure), then stops."""
        first: Optional[BaseException] = None
        for close in (self._g.close, self._h.close):
            try:
                close()
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: PERF203 - two iterations
                if first is None:
                    first = e
        if first is not None:
            raise first

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __repr__(self) -> str:
        if self._h.closed:
            return "<deepio.gds_handle closed>"
        return (
            f"<deepio.gds_handle mode={self._g.mode!r} block_size={self._g.block_size} "
            f"queue_depth={self._g.queue_depth} intra_op_parallelism={self._g.intra_op_parallelism}>"
        )

    # ------------------------------------------------------------- pinned device tensors
    def pin_device_tensor(self, tensor: Any) -> bool:
        """Registers the CUDA tensor's memory with cuFile (cuFileBufRegister); I/O on it or on
        any view inside it then uses the registration. The tensor is kept alive until
        unpinned. True; raises OSError (EEXIST: overlaps another pinned tensor; the cuFile
        error) or TypeError (not CUDA memory)."""
        with _pinned_lock:
            addr = self._g.pin(tensor)
            _pinned.setdefault(addr, tensor)
        return True

    def unpin_device_tensor(self, tensor: Any) -> bool:
        """Deregisters a tensor pinned at exactly this address: True; False when it was not
        pinned. Raises OSError EBUSY while operations on it are in flight."""
        with _pinned_lock:
            ok, addr = self._g.unpin(tensor)
            _pinned.pop(addr, None)
        return bool(ok)

    def new_pinned_device_tensor(self, num_elem: int, example_tensor: Any = None, **kwargs: Any) -> Any:
        """A 1-D torch CUDA tensor of ``num_elem`` elements with ``example_tensor``'s dtype
        (on its device when it is a CUDA tensor, else the current device), not zeroed, pinned.
        DeepNVMe's misspelled keyword ``example_tenosr`` is accepted. Needs torch with CUDA:
        RuntimeError otherwise."""
        if "example_tenosr" in kwargs:
            if example_tensor is not None:
                raise TypeError("pass example_tensor or example_tenosr, not both")
            example_tensor = kwargs.pop("example_tenosr")
        if kwargs:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
        num_elem = _int_arg("num_elem", num_elem)
        if num_elem <= 0:
            raise ValueError(f"num_elem must be positive, got {num_elem}")
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch  # noqa: PLC0415 - optional dependency
            except ImportError:
                raise RuntimeError("new_pinned_device_tensor() makes a torch CUDA tensor: torch is not installed") from None
        if example_tensor is None or not isinstance(example_tensor, torch.Tensor):
            raise TypeError("new_pinned_device_tensor() needs a torch tensor as the example (example_tensor=)")
        if not torch.cuda.is_available():
            raise RuntimeError(
                "new_pinned_device_tensor() makes a torch CUDA tensor, but torch has no usable CUDA "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False); allocate device "
                "memory another way and use pin_device_tensor()"
            )
        device = example_tensor.device if example_tensor.is_cuda else torch.device("cuda", torch.cuda.current_device())
        t = torch.empty(num_elem, dtype=example_tensor.dtype, device=device)
        self.pin_device_tensor(t)
        return t

    def free_pinned_device_tensor(self, tensor: Any) -> bool:
        """Unpins a tensor made by new_pinned_device_tensor() (its memory goes with the last
        reference): True; False when it was not pinned."""
        return self.unpin_device_tensor(tensor)

    # -------------------------------------------------------------------------- helpers
    def _sync(self, write: bool, buffer: Any, file: FileArg, offset: int, validate: Any) -> int:
        _buffers.sync_producer_stream(buffer)
        if self._gds_route(buffer, file):
            self._g.submit(write, buffer, file, offset)
        else:
            self._h.submit(write, buffer, file, offset)
        n = self._wait_both()
        if _bool_arg("validate", validate):
            self._validate(buffer, file, offset)
        return n

    def _async(self, write: bool, buffer: Any, file: FileArg, offset: int, validate: Any) -> int:
        if not self._gds_route(buffer, file):
            return super()._async(write, buffer, file, offset, validate)
        _buffers.sync_producer_stream(buffer)
        self._g.submit(write, buffer, file, offset)
        if _bool_arg("validate", validate):
            self._to_validate.append((buffer, file, offset))
        return 0

    def _wait_both(self) -> int:
        n = 0
        first: Optional[BaseException] = None
        for wait in (self._g.wait, self._h.wait):
            try:
                n += wait()
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: PERF203 - two iterations
                if first is None:
                    first = e
        if first is not None:
            raise first
        return n
