"""DeepSpeed-shaped entry points: change one import, keep the code.

    # from deepspeed.ops.op_builder import AsyncIOBuilder
    from deepio.compat import AsyncIOBuilder

    h = AsyncIOBuilder().load().aio_handle()
    h.async_pwrite(tensor, "/local_nvme/t.pt")
    h.wait()

``AsyncIOBuilder().load()`` returns an object shaped like DeepSpeed's ``async_io`` module:
``aio_handle``, ``aio_read``, ``aio_write``, ``deepspeed_memcpy``. Nothing is compiled at run
time; ``is_compatible()`` is True whenever deepio imported. ``GDSBuilder().load()`` gives
DeepSpeed's ``gds`` module (``gds_handle``); its ``is_compatible()`` is False, with the reason
in ``.reason``, when no CUDA driver is usable. ``PinMemoryBuilder`` gives
DeepSpeed's ``pin_memory`` module (``pin_handle``) over the same process-wide registry.
``UtilsBuilder`` gives DeepSpeed's ``utils`` op (``cast_to_byte_tensor``, ``flatten``,
``unflatten``, which FastPersist's checkpoint writer needs) in plain torch, so no C++ is
compiled at run time and it works on DeepSpeed's CPU accelerator too.
"""

from __future__ import annotations

import types
from typing import Any

from . import _buffers, _deepio
from ._aio import aio_handle
from ._gds import gds_handle

__all__ = [
    "AsyncIOBuilder",
    "GDSBuilder",
    "PinMemoryBuilder",
    "UtilsBuilder",
    "async_io",
    "gds",
    "pin_memory",
    "utils",
]


def aio_read(
    buffer: Any,
    filename: Any,
    block_size: int,
    queue_depth: int,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
    /,
) -> int:
    """One-shot blocking read of ``buffer.nbytes`` bytes from the start of ``filename``; 0."""
    with aio_handle(block_size, queue_depth, single_submit, overlap_events, 1) as h:
        return h.read(buffer, filename, validate)


def aio_write(
    buffer: Any,
    filename: Any,
    block_size: int,
    queue_depth: int,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
    /,
) -> int:
    """One-shot blocking write of ``buffer`` at the start of ``filename``; 0."""
    with aio_handle(block_size, queue_depth, single_submit, overlap_events, 1) as h:
        return h.write(buffer, filename, validate)


def deepspeed_memcpy(dest: Any, src: Any, /) -> int:
    """Copies ``dest.nbytes`` bytes from ``src`` into ``dest`` (GIL released); 0."""
    _deepio.memcpy(dest, src)
    return 0


async_io = types.ModuleType("deepio.compat.async_io", "DeepSpeed's async_io module, served by deepio.")
async_io.aio_handle = aio_handle  # type: ignore[attr-defined]
async_io.aio_read = aio_read  # type: ignore[attr-defined]
async_io.aio_write = aio_write  # type: ignore[attr-defined]
async_io.deepspeed_memcpy = deepspeed_memcpy  # type: ignore[attr-defined]


gds = types.ModuleType("deepio.compat.gds", "DeepSpeed's gds module, served by deepio.")
gds.gds_handle = gds_handle  # type: ignore[attr-defined]


class pin_handle:  # noqa: N801 - DeepSpeed's name
    """DeepSpeed's pin_memory.pin_handle over deepio's one process-wide registry: a tensor
    locked here is locked (``is_pinned``, in DeepNVMe's word) for every aio_handle and
    gds_handle, and the other way round."""

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any) -> Any:
        """A 1-D page-locked tensor of ``num_elem`` elements of ``example_tensor``'s dtype."""
        return _buffers.new_locked(num_elem, example_tensor)

    def free_cpu_locked_tensor(self, locked_tensor: Any) -> bool:
        """Frees a tensor from new_cpu_locked_tensor (any handle's): its memory is unlocked
        and returned at once. False for anything else or a second free."""
        return _buffers.free_locked(locked_tensor)

    def free_cpu_locked_tensor_by_ptr(self, address: int) -> bool:
        """Frees the locked allocation whose base address is ``address`` (what
        ``tensor.data_ptr()`` gave for the tensor new_cpu_locked_tensor returned). False for
        any other address or a second free."""
        return _buffers.free_locked_address(address)

    def is_pinned(self, buffer: Any) -> bool:
        """DeepNVMe's name: True for buffers inside one live locked allocation and for
        torch-pinned tensors."""
        return _buffers.is_locked_or_pinned(buffer)


pin_memory = types.ModuleType("deepio.compat.pin_memory", "DeepSpeed's pin_memory module, served by deepio.")
pin_memory.pin_handle = pin_handle  # type: ignore[attr-defined]


def cast_to_byte_tensor(src_tensor: Any) -> Any:
    """A uint8 view of the memory of a contiguous torch tensor (or of each tensor of a list),
    as DeepSpeed's utils op gives: same storage, ``nbytes`` elements; a tensor of at most one
    byte is returned as it is."""
    if isinstance(src_tensor, (list, tuple)):
        return [cast_to_byte_tensor(t) for t in src_tensor]
    import torch

    if src_tensor.nbytes <= 1:
        return src_tensor
    if not src_tensor.is_contiguous():
        raise ValueError("cast_to_byte_tensor() needs a contiguous tensor")
    return src_tensor.reshape(-1).view(torch.uint8)


def flatten(tensors: Any) -> Any:
    """One contiguous 1-D tensor holding ``tensors`` one after the other."""
    from torch._utils import _flatten_dense_tensors

    return _flatten_dense_tensors(tensors)


def unflatten(flat: Any, tensors: Any) -> Any:
    """Views of ``flat`` shaped like ``tensors`` (the inverse of flatten())."""
    from torch._utils import _unflatten_dense_tensors

    return _unflatten_dense_tensors(flat, tensors)


utils = types.ModuleType("deepio.compat.utils", "DeepSpeed's utils op, in plain torch.")
utils.cast_to_byte_tensor = cast_to_byte_tensor  # type: ignore[attr-defined]
utils.flatten = flatten  # type: ignore[attr-defined]
utils.unflatten = unflatten  # type: ignore[attr-defined]


class _Builder:
    NAME = ""
    BUILD_VAR = ""
    _module: types.ModuleType

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.NAME

    def absolute_name(self) -> str:
        return f"deepio.compat.{self.NAME}"

    def is_compatible(self, verbose: bool = False) -> bool:
        """Always True: deepio is compiled ahead of time, with every backend it found."""
        return True

    def load(self, verbose: bool = True) -> types.ModuleType:
        return self._module

    def jit_load(self, verbose: bool = True) -> types.ModuleType:
        return self._module

    def builder(self) -> None:
        raise NotImplementedError("deepio needs no build step; use load()")


class AsyncIOBuilder(_Builder):
    """``AsyncIOBuilder().load()`` → an ``async_io``-shaped module backed by deepio."""

    NAME = "async_io"
    BUILD_VAR = "DS_BUILD_AIO"
    _module = async_io


class PinMemoryBuilder(_Builder):
    """``PinMemoryBuilder().load()`` → a ``pin_memory``-shaped module backed by deepio."""

    NAME = "pin_memory"
    BUILD_VAR = "DS_BUILD_PIN_MEMORY"
    _module = pin_memory


class UtilsBuilder(_Builder):
    """``UtilsBuilder().load()`` → DeepSpeed's ``utils`` op (needs torch)."""

    NAME = "utils"
    BUILD_VAR = "DS_BUILD_UTILS"
    _module = utils


class GDSBuilder(_Builder):
    """``GDSBuilder().load()`` → a ``gds``-shaped module (``gds_handle``) backed by deepio.

    ``is_compatible()`` is True when a CUDA driver is usable: gds_handle then runs through
    GPUDirect Storage, or staged through host memory where cuFile or nvidia-fs is missing
    (``gds_handle(...).mode`` says which; ``deepio.gpu_info()`` says why). Otherwise False,
    with the reason in ``self.reason``; ``load()`` then raises RuntimeError naming it, as
    DeepSpeed does for an incompatible op."""

    NAME = "gds"
    BUILD_VAR = "DS_BUILD_GDS"
    _module = gds

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.reason = ""

    def is_compatible(self, verbose: bool = False) -> bool:
        info = _deepio.gpu_info()
        if not info["cuda_found"]:
            self.reason = f"gds needs a CUDA driver: {info['cuda_reason']}"
            return False
        self.reason = "" if info["gds_mode"] == "gds" else info["gds_reason"]
        return True

    def load(self, verbose: bool = True) -> types.ModuleType:
        if not self.is_compatible():
            raise RuntimeError(f"Unable to load the gds op: {self.reason}")
        return self._module

    def jit_load(self, verbose: bool = True) -> types.ModuleType:
        return self.load(verbose)
