"""``deepio.gds_handle``: DeepNVMe's gds_handle over ``deepio::GdsHandle``.

A gds_handle is an aio_handle whose engine has one more route for CUDA memory: GPUDirect
Storage (cuFile). It is the same engine, so every method, wait() and error rule is
aio_handle's. Per operation on a CUDA tensor, cuFile moves the data where it accepts the file;
where GDS itself is not usable (no nvidia-fs, unsupported file system, no libcufile) cuFile's
compatibility mode or the engine's staging pipeline does (the same one aio_handle uses for CUDA
tensors), and ``mode`` says which. CPU tensors, arrays and any buffer take aio_handle's path,
as DeepNVMe's gds_handle does for non-CUDA tensors.

Differences from DeepNVMe, deliberate: every cuFile/CUDA error raises an OSError subclass
(DeepNVMe calls ``exit()``); the GIL is released while waiting and while opening files;
nothing is written to the working directory; a view may lie anywhere inside a pinned buffer
(a range running past its end is an error instead of a crash); pinned tensors are kept alive
until unpinned, so a registration never outlives its memory.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _deepio
from ._aio import _int_arg, aio_handle

# Pinned device tensors by address, kept alive while registered (registrations are
# process-wide, like DeepNVMe's registry).
_pinned: dict[int, Any] = {}
_pinned_lock = threading.Lock()


def gpu_info() -> dict:
    """What CUDA and cuFile this process can use: ``cuda_found``/``cuda_reason``,
    ``cufile_found``/``cufile_reason``, ``driver_version``, ``device_count``,
    ``nvidia_fs_loaded``, ``gds_mode`` ("gds", "compat" or "unavailable") and
    ``gds_reason``. Never raises."""
    return _deepio.gpu_info()


def _torch() -> Any:
    """The torch module (imported now if needed); RuntimeError when torch is not installed."""
    try:
        import torch
    except ImportError:
        raise RuntimeError("new_pinned_device_tensor() makes a torch CUDA tensor: torch is not installed") from None
    return torch


class gds_handle(aio_handle):  # noqa: N801 - DeepNVMe's name
    """Reads and writes between files and CUDA tensors through GPUDirect Storage.

    ``gds_handle(block_size=1048576, queue_depth=128, single_submit=False,
    overlap_events=False, intra_op_parallelism=1, *, mode="auto", backend="auto",
    direct_io="auto")``

    Requests on CUDA tensors (by file name or descriptor) are cut into ``block_size`` chunks
    spread over ``intra_op_parallelism`` workers, each a cuFileRead/cuFileWrite. ``mode``:
    "auto" (cuFile where it accepts the file, else the engine's staging pipeline, reported by
    ``mode``), "cufile" (cuFile only: an error where it refuses), "compat" (never cuFile). CPU
    buffers take ``aio_handle``'s path (``backend`` and ``direct_io`` configure it); it is one
    engine, so one ``wait()`` collects both. Raises OSError (ENOTSUP/ENODEV) when no CUDA
    driver is usable; ``deepio.gpu_info()`` says why.

    Has every ``aio_handle`` method, plus ``pin_device_tensor``, ``unpin_device_tensor``,
    ``new_pinned_device_tensor`` and ``free_pinned_device_tensor``. Thread-safe.
    """

    def __init__(self, *args: Any, mode: str = "auto", **kwargs: Any) -> None:
        # aio_handle's parameters, as aio_handle takes them (the class docstring lists them).
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a str, not {type(mode).__qualname__}")
        if "device_route" in kwargs:
            raise TypeError("gds_handle takes mode= (auto, cufile, compat), not device_route=")
        self._mode = mode
        super().__init__(*args, **kwargs)
        self._g: _deepio.GdsHandle = self._h  # type: ignore[assignment]

    def _engine(self, *args: Any) -> _deepio.Handle:
        block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, backend, direct = args
        return _deepio.GdsHandle(
            block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, self._mode, backend, direct
        )

    # ------------------------------------------------------------------------ getters
    def get_alignment(self) -> int:
        """DeepNVMe's value for gds_handle, 512. deepio needs no alignment."""
        return 512

    @property
    def mode(self) -> str:
        """ "gds" (GPUDirect Storage proper) or "compat" (staged through host memory, by
        cuFile's compatibility mode or by deepio); turns "compat" once a file was staged."""
        return self._g.mode

    @property
    def mode_reason(self) -> str:
        """Why ``mode`` is not "gds" ("" when it is)."""
        return self._g.mode_reason

    def get_mode(self) -> str:
        return self._g.mode

    # --------------------------------------------------------------------------- I/O
    def stats(self) -> dict:
        """``aio_handle``'s counters (every operation), plus ``gds``: operations on CUDA
        memory, chunks, bytes moved by cuFile and bytes staged, files cuFile refused."""
        d = self._h.stats()
        d["gds"] = self._g.gds_stats()
        return d

    def __repr__(self) -> str:
        if self._h.closed:
            return "<deepio.gds_handle closed>"
        return (
            f"<deepio.gds_handle mode={self._g.mode!r} block_size={self._h.block_size} "
            f"queue_depth={self._h.queue_depth} intra_op_parallelism={self._h.intra_op_parallelism} "
            f"backend={self._h.backend!r} direct_io={self._h.direct_io!r}>"
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
        torch = _torch()
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
