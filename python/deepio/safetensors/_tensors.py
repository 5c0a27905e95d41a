"""Between the format and torch: torch imported on first use (``import deepio.safetensors``
does not import it), a file's dtype and shape as torch's, a tensor's memory as bytes.

Thread-safe (no state of its own)."""

from __future__ import annotations

from typing import Any

from ._format import TORCH_NAME, Header, TensorInfo


def torch_module() -> Any:
    """The torch module, imported here on first use."""
    import torch

    return torch


def torch_dtype(h: Header, t: TensorInfo) -> Any:
    """torch's dtype for tensor ``t`` of file ``h``; ValueError (naming both) where this torch
    has none: the file is valid, this torch cannot hold it."""
    torch = torch_module()
    dt = getattr(torch, TORCH_NAME[t.dtype] or "-", None)
    if dt is None:
        raise ValueError(
            f"{h.path}: tensor {t.name!r}: dtype {t.dtype} has no equivalent in this torch ({torch.__version__})"
        )
    return dt


def torch_shape(h: Header, t: TensorInfo) -> tuple[int, ...]:
    """torch's shape for tensor ``t`` of file ``h``: the file's, but F4's last axis halved (the
    file counts values, torch two per element); ValueError for an F4 tensor torch cannot pack."""
    if t.dtype != "F4":
        return t.shape
    if not t.shape or t.shape[-1] % 2:
        raise ValueError(
            f"{h.path}: tensor {t.name!r}: F4 needs an even last dimension for torch's float4_e2m1fn_x2, "
            f"got shape {list(t.shape)}"
        )
    return (*t.shape[:-1], t.shape[-1] // 2)


def as_bytes(t: Any) -> Any:
    """A contiguous tensor's memory as a 1-D uint8 view (no copy)."""
    return t.reshape(-1).view(torch_module().uint8)
