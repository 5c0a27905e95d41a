"""Saving: ``save_file`` and ``save``, byte-identical to ``safetensors.torch``'s.

The header comes from ``_format.encode``; the header and the tensors are written through the
engine to a temporary name in the same folder, flushed (fsync) and renamed over the
destination, then the folder is flushed (``deepio._durable.replacing``): after ``save_file``
returns the file is on stable storage, and a save that fails or is killed leaves the old file
untouched. Small tensors are packed with the header into host buffers; each large tensor is
written from its own memory (CPU or CUDA), no copy.

Errors: what safetensors refuses raises before anything is written, with safetensors' types;
I/O raises the engine's OSError after every write finished. Thread-safe as the engine is; the
tensors must not change during a save."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._durable import replacing
from ._format import TORCH_NAME, encode
from ._io import engine, run
from ._load import PathArg
from ._tensors import as_bytes, torch_module

if TYPE_CHECKING:  # pragma: no cover
    import torch

_SMALL_BYTES = 1 << 20  # tensors below this are packed into one host buffer with the header


def _plan(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None) -> tuple[bytes, list[tuple[Any, int]]]:
    """(header bytes padded to 8, [(contiguous CPU-or-CUDA tensor, offset in the data section)])
    in safetensors' order; raises as safetensors.torch.save_file does for what it refuses."""
    torch = torch_module()
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    names = {v: k for k, v in TORCH_NAME.items() if v}
    entries = []
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensor names must be str, not {type(k).__name__} ({k!r})")
        if k == "__metadata__":
            raise ValueError("'__metadata__' is reserved for the metadata: it cannot name a tensor")
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            raise ValueError(f"tensor {k!r} is sparse ({v.layout}): make it dense with .to_dense() first")
        if not v.is_contiguous():
            raise ValueError(f"tensor {k!r} is not contiguous: call .contiguous() before saving")
        dname = names.get(str(v.dtype).split(".")[-1])
        if dname is None:
            raise ValueError(f"tensor {k!r}: dtype {v.dtype} has no safetensors equivalent")
        shape = list(v.shape)
        if dname == "F4":
            if not shape:
                raise ValueError(f"tensor {k!r}: a 0-d float4_e2m1fn_x2 tensor cannot be saved (no last axis)")
            shape[-1] *= 2
        entries.append((k, dname, shape, v))
    _check_not_shared(entries)
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
            isinstance(a, str) and isinstance(b, str) for a, b in metadata.items()
        ):
            raise TypeError("metadata must be a dict of str to str")
    head, layout = encode([(k, d, s, v.numel() * v.element_size()) for k, d, s, v in entries], metadata)
    return head, [(entries[i][3], at) for i, at in layout]


def _check_not_shared(entries: list[tuple[str, str, list[int], Any]]) -> None:
    """safetensors refuses tensors whose memory overlaps (RuntimeError); so do we."""
    spans = []
    for k, _, _, v in entries:
        n = v.numel() * v.element_size()
        if n:
            spans.append((str(v.device), v.data_ptr(), v.data_ptr() + n, k))
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if a[0] == b[0] and b[1] < a[2]:
            raise RuntimeError(
                f"Some tensors share memory, this will lead to duplicate memory on disk: {a[3]!r} and {b[3]!r}"
            )


def _runs(head: bytes, plan: list[tuple[Any, int]]) -> list[tuple[int, Any]]:
    """[(file offset, source)]: the header and each run of small tensors packed into one
    bytearray; each large tensor as its own 1-D uint8 view (CPU or CUDA memory, no copy)."""
    torch = torch_module()
    base = len(head)
    out: list[tuple[int, Any]] = []
    run_: list[tuple[Any, int, int]] = []  # (uint8 view, offset, nbytes) of the open run
    run_at, run_end = 0, base  # the first run holds the header

    def close_run() -> None:
        if run_end <= run_at:
            return
        buf = bytearray(run_end - run_at)
        if run_at == 0:
            buf[:base] = head
        for src, off, n in run_:
            torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=base + off - run_at).copy_(src)
        out.append((run_at, buf))

    for v, off in plan:
        n = v.numel() * v.element_size()
        if n == 0:
            continue
        src = as_bytes(v.detach())
        if n < _SMALL_BYTES:
            if not run_ and run_end != base + off:  # a new run after a large tensor
                run_at = base + off
            run_.append((src, off, n))
            run_end = base + off + n
            continue
        close_run()
        run_, run_at, run_end = [], base + off + n, base + off + n
        out.append((base + off, src))
    close_run()
    return out


def _write(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None, path: str) -> None:
    _write_planned(_plan(tensors, metadata), path)


def _write_planned(head_plan: tuple[bytes, list[tuple[Any, int]]], path: str) -> None:
    head, plan = head_plan
    runs = _runs(head, plan)
    # One batch: one call, the file opened once off this thread; run waits for every write
    # and raises the first failure (an open failure included).
    if runs:
        run(engine().submit_batch(True, [src for _, src in runs], path, [offset for offset, _ in runs], True))


def save_file(
    tensors: Mapping[str, torch.Tensor], filename: PathArg, metadata: Mapping[str, str] | None = None
) -> None:
    """Writes ``tensors`` to ``filename`` in the safetensors format, byte-identical to
    ``safetensors.torch.save_file``, durably (temporary name, fsync, rename, fsync of the
    folder). Tensors may be on the CPU or a CUDA device. Raises ValueError/TypeError/
    RuntimeError for what safetensors refuses (non-contiguous, sparse or overlapping
    tensors, non-string metadata), OSError for I/O (the old file is then untouched)."""
    name = os.fspath(filename)
    with replacing(name) as tmp:
        _write(tensors, metadata, tmp)
        try:  # the permission bits of the file replaced stay (safetensors writes in place)
            os.chmod(tmp, os.stat(name).st_mode & 0o7777)
        except FileNotFoundError:
            pass


def write_in_place(tensors: Mapping[str, Any], filename: PathArg, metadata: Mapping[str, str] | None = None) -> None:
    """``save_file`` without its durability: the file is truncated (or created, 0666 less the
    umask) and written under its own name, nothing flushed (what a writer asked not to sync
    wants). A failure leaves a partial file. Errors as for ``save_file``, the safetensors
    refusals still raised before the file is touched."""
    name = os.fspath(filename)
    head_plan = _plan(tensors, metadata)  # refusals first: the old file stays
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666))
    _write_planned(head_plan, name)


def save(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes ``save_file`` would write (``safetensors.torch.save``)."""
    torch = torch_module()
    head, plan = _plan(tensors, metadata)
    out = bytearray(len(head) + sum(v.numel() * v.element_size() for v, _ in plan))
    out[: len(head)] = head
    for v, off in plan:
        n = v.numel() * v.element_size()
        if n:
            torch.frombuffer(out, dtype=torch.uint8, count=n, offset=len(head) + off).copy_(as_bytes(v.detach()))
    return bytes(out)
