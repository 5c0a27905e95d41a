"""Framework detection and locked (page-locked) host memory, without importing torch or NumPy.

torch and NumPy are optional: an object can only be a torch tensor if the caller already
imported torch, so we look in ``sys.modules`` instead of importing anything.
"""

from __future__ import annotations

import operator
import os
import sys
import warnings
from typing import Any

from . import _deepio


class LockedMemoryWarning(RuntimeWarning):
    """A locked allocation could not be page-locked (RLIMIT_MEMLOCK); it is page-aligned
    but pageable memory instead. I/O still works, through the page cache's usual path."""


def is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_torch_cuda(obj: Any) -> bool:
    """A torch tensor in CUDA memory."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda


def is_device_buffer(obj: Any) -> bool:
    """A torch CUDA tensor, or an object whose ``__dlpack_device__()`` says kDLCUDA (2).

    This asks what the *framework* calls the object (such an object has no buffer protocol:
    its bytes reach the engine through DLPack), not where its memory is. Where the memory is
    (device memory, or CUDA managed memory, which deepio treats as host memory) is decided
    once, in C++, by the CUDA driver deepio loaded (``python/src/buffer.cpp``'s
    ``require_device`` over ``deepio::device_of``), when the engine imports the buffer."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return bool(obj.is_cuda)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) == 2
    except Exception:
        return False


def is_numpy_array(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


def _memlock_limit() -> str:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
    except Exception:  # pragma: no cover - non-POSIX
        return "unknown"


def new_locked(num_elem: int, example: Any, stacklevel: int = 3) -> Any:
    """A 1-D buffer of ``num_elem`` elements of ``example``'s dtype and kind (a torch tensor
    for a torch example, a NumPy array otherwise), page-aligned, not zeroed, and locked when
    the memlock limit allows (otherwise a LockedMemoryWarning is issued)."""
    if isinstance(num_elem, bool):
        raise TypeError("num_elem must be an integer, not bool")
    num_elem = operator.index(num_elem)
    if num_elem < 0:
        raise ValueError(f"num_elem must be non-negative, got {num_elem}")
    if example is None:
        raise TypeError("new_cpu_locked_tensor() needs an example tensor (example_tensor=) for the dtype")

    if is_torch_tensor(example):
        itemsize = example.element_size()
        array, owner = _deepio.alloc_locked(num_elem * itemsize, "torch")
        out = array if example.dtype == array.dtype else array.view(example.dtype)
        # torch gives empty tensors a null data pointer, so free_locked() could not find the
        # allocation by address: the tensor itself remembers it.
        out._deepio_allocation = owner
    else:
        try:
            import numpy as np
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TypeError(
                f"new_cpu_locked_tensor(): a {type(example).__qualname__} example needs NumPy "
                "(or pass a torch tensor as the example)"
            ) from e
        if isinstance(example, np.ndarray):
            dtype = example.dtype
        elif isinstance(example, np.dtype) or isinstance(example, type):
            dtype = np.dtype(example)
        else:
            try:
                dtype = (np.from_dlpack(example) if hasattr(example, "__dlpack__") else np.asarray(example)).dtype
            except Exception as e:
                raise TypeError(
                    f"new_cpu_locked_tensor(): cannot find the dtype of a {type(example).__qualname__} example"
                ) from e
        if dtype.hasobject:
            raise TypeError("new_cpu_locked_tensor(): object dtypes cannot live in raw memory")
        array, owner = _deepio.alloc_locked(num_elem * dtype.itemsize, "numpy")
        out = array.view(dtype)
    if not owner.locked:
        warnings.warn(
            f"deepio: could not lock {owner.nbytes} bytes ({os.strerror(owner.lock_errno)}; "
            f"RLIMIT_MEMLOCK is {_memlock_limit()}): the buffer is page-aligned but pageable",
            LockedMemoryWarning,
            stacklevel=stacklevel,
        )
    return out


def free_locked(buffer: Any) -> bool:
    """Releases a buffer made by new_locked(); False for anything else or a second free."""
    if is_torch_tensor(buffer):
        owner = getattr(buffer, "_deepio_allocation", None)
        if owner is not None:
            return bool(owner.release())
        if buffer.requires_grad:
            buffer = buffer.detach()
    return bool(_deepio.free_locked_array(buffer))


def free_locked_address(address: int) -> bool:
    """Releases the allocation made by new_locked() whose base address is ``address``."""
    if isinstance(address, bool):
        raise TypeError("address must be an integer, not bool")
    address = operator.index(address)
    if not 0 < address < 1 << 64:
        return False
    return bool(_deepio.free_locked_address(address))


def is_locked_or_pinned(buffer: Any) -> bool:
    """True for buffers lying inside one live locked allocation (deepio's page-locked memory)
    and for torch-pinned tensors (CUDA pinning): what DeepNVMe's ``is_pinned`` answers."""
    if is_torch_tensor(buffer):
        try:
            if buffer.is_pinned():
                return True
        except RuntimeError:
            pass
        if buffer.requires_grad:
            buffer = buffer.detach()
    return bool(_deepio.is_locked_range(buffer))
