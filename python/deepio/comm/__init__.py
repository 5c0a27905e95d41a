"""deepio.comm: 1-bit compressed allreduce with error feedback (DeepSpeed's MpiBackend algorithm).

Every rank contributes a float32 vector; every rank receives (approximately) their average,
sent as signs plus one scale per chunk: about 32x less traffic than an fp32 allreduce. The
compression error is fed back into the next call through two persistent buffers per tensor,
``worker_error`` (N float32, N = the padded length, a multiple of 8*W) and ``server_error``
(N/W float32). Use :func:`padded_size` to size them. The exact algorithm is in docs/comm.md.

Transports:

* MPI (any mpi4py communicator, default ``MPI.COMM_WORLD``): :func:`compressed_allreduce` and
  :class:`MpiBackend` (drop-in for ``deepspeed.runtime.comm.mpi.MpiBackend``).
* ``torch.distributed`` (gloo; CPU tensors): :func:`compressed_allreduce_torch` and
  :class:`TorchBackend`. Same packing code and wire layout, so the same results bit for bit.

Buffers: NumPy arrays or torch CPU tensors, float32. ``worker_error`` and ``server_error``
must be 1-D and contiguous; they are updated in place (the same memory holds the new
residuals, so views of them stay valid).

Errors are deepio's own family (docs/errors.md, docs/comm.md): sizes that break the rules
raise ``deepio.InvalidArgumentError`` (an ``OSError`` with errno EINVAL and a ``ValueError``)
on every rank, never a hang, with ``reason`` (the agreement's reason code), ``reason_name``
and ``rank``; the same class for other bad arguments (an unknown kernel, ``world_size`` 0, a
null or inter-communicator). An MPI failure raises ``OSError`` (errno EIO) with
``mpi_error_class``. A wrong dtype or type raises ``TypeError``; a non-contiguous buffer
``ValueError``.

All calls are collective over the communicator/group. They release the GIL while they run.
"""

from __future__ import annotations

from typing import Any

from .. import _comm

__all__ = [
    "compressed_allreduce",
    "compressed_allreduce_torch",
    "MpiBackend",
    "TorchBackend",
    "padded_size",
    "pack_signs",
    "unpack_signs",
    "best_kernel",
]


def best_kernel() -> str:
    """The packing kernel this CPU uses: ``"avx2"`` or ``"scalar"``."""
    return _comm.best_kernel()


def padded_size(n: int, world_size: int) -> int:
    """Smallest valid ``worker_error`` length for ``n`` elements on ``world_size`` ranks
    (``n`` rounded up to a multiple of 8 * world_size)."""
    return _comm.padded_size(n, world_size)


# ---- buffers ---------------------------------------------------------------------------------


def _is_torch(a: Any) -> bool:
    return type(a).__module__.startswith("torch")


def _numel(a: Any) -> int:
    return a.numel() if _is_torch(a) else int(a.size)


def _check_f32(a: Any, name: str) -> None:
    if _is_torch(a):
        import torch

        if a.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {a.dtype}")
        if a.device.type != "cpu":
            raise TypeError(f"{name} must be a CPU tensor here, got device {a.device}")
    else:
        import numpy as np

        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")
        if a.dtype != np.float32:
            raise TypeError(f"{name} must be float32, got {a.dtype}")


def _is_contiguous(a: Any) -> bool:
    return a.is_contiguous() if _is_torch(a) else bool(a.flags.c_contiguous)


def _flat_view(a: Any, name: str) -> Any:
    """A 1-D view of a contiguous float32 buffer (never a copy: results must land in it)."""
    _check_f32(a, name)
    if not _is_contiguous(a):
        raise ValueError(f"{name} must be contiguous (the result would otherwise land in a copy)")
    # detach(): same storage, but exportable through DLPack even if it requires grad.
    return a.detach().view(-1) if _is_torch(a) else a.reshape(-1)


def _error_buffer(a: Any, name: str) -> Any:
    _check_f32(a, name)
    if len(a.shape) != 1 or not _is_contiguous(a):
        raise ValueError(f"{name} must be a 1-D contiguous float32 buffer")
    if not _is_torch(a) and not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return a.detach() if _is_torch(a) else a


def _empty_like_flat(a: Any, n: int) -> Any:
    if _is_torch(a):
        import torch

        return torch.empty(n, dtype=torch.float32)
    import numpy as np

    return np.empty(n, dtype=np.float32)


def _flat_input(a: Any) -> Any:
    """1-D read-only input: a view when contiguous, else a contiguous copy."""
    _check_f32(a, "buffer")
    if _is_torch(a):
        return a.detach().reshape(-1).contiguous()
    import numpy as np

    return np.ascontiguousarray(a).reshape(-1)


# ---- MPI -------------------------------------------------------------------------------------


def _comm_handle(comm: Any) -> int:
    if isinstance(comm, int):
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("deepio.comm's MPI transport needs mpi4py (pip install mpi4py)") from e
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    return MPI._handleof(comm)


def compressed_allreduce(buffer: Any, worker_error: Any, server_error: Any, comm: Any = None) -> Any:
    """Average ``buffer`` across ``comm`` with 1-bit compression; the result replaces the
    contents of ``buffer`` (any shape, contiguous, float32, N0 <= N elements), which is returned.

    ``worker_error`` (N) and ``server_error`` (N/W) are the persistent residuals, updated in
    place. ``comm`` is an mpi4py intracommunicator (default ``MPI.COMM_WORLD``). Collective.
    """
    flat = _flat_view(buffer, "buffer")
    we = _error_buffer(worker_error, "worker_error")
    se = _error_buffer(server_error, "server_error")
    _comm.compressed_allreduce(flat, flat, we, se, _comm_handle(comm))
    return buffer


class MpiBackend:
    """Drop-in for DeepSpeed's ``deepspeed.runtime.comm.mpi.MpiBackend`` on CPU buffers.

    ``compressed_allreduce(buffer_m, worker_error, server_error, local_rank)`` returns what
    DeepSpeed returns: when ``buffer_m`` is contiguous and already padded (numel == N), the
    result is written into it and ``buffer_m`` is returned; otherwise ``buffer_m`` is left
    alone and a new buffer of its shape is returned. ``local_rank`` is accepted and ignored
    (it selects a GPU in DeepSpeed). The communicator defaults to ``MPI.COMM_WORLD`` like
    DeepSpeed's, but any mpi4py communicator may be given.

    ``cuda_aware``: CUDA tensors are staged through host memory whatever its value (device
    kernels are not built yet); the flag is kept for signature compatibility.
    """

    def __init__(self, cuda_aware: bool = False, comm: Any = None) -> None:
        from mpi4py import MPI

        self.cuda_aware = bool(cuda_aware)
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._handle = _comm_handle(self.comm)

    def compressed_allreduce(self, buffer_m: Any, worker_error: Any, server_error: Any, local_rank: Any = None) -> Any:
        return _deepspeed_call(
            buffer_m,
            worker_error,
            server_error,
            lambda i, o, we, se: _comm.compressed_allreduce(i, o, we, se, self._handle),
        )


def _deepspeed_call(buffer_m: Any, worker_error: Any, server_error: Any, run: Any) -> Any:
    """DeepSpeed's in-place/padding return semantics around a transport call."""
    staged = _is_torch(buffer_m) and buffer_m.device.type != "cpu"
    if staged:  # host staging for device tensors: copy in, run on host, copy back
        host_we, host_se = worker_error.cpu(), server_error.cpu()
        out = _deepspeed_call(buffer_m.cpu(), host_we, host_se, run)
        worker_error.copy_(host_we)
        server_error.copy_(host_se)
        if _numel(buffer_m) == _numel(worker_error) and buffer_m.is_contiguous():
            buffer_m.copy_(out)
            return buffer_m
        return out.to(buffer_m.device)

    we = _error_buffer(worker_error, "worker_error")
    se = _error_buffer(server_error, "server_error")
    _check_f32(buffer_m, "buffer_m")
    if _numel(buffer_m) == _numel(we) and _is_contiguous(buffer_m):
        flat = _flat_view(buffer_m, "buffer_m")
        run(flat, flat, we, se)
        return buffer_m
    flat_in = _flat_input(buffer_m)
    out = _empty_like_flat(buffer_m, flat_in.shape[0])
    run(flat_in, out, we, se)
    return out.reshape(tuple(buffer_m.shape))


# ---- torch.distributed -----------------------------------------------------------------------

def _torch_transport(inp: Any, out: Any, we: Any, se: Any, group: Any) -> None:
    import torch
    import torch.distributed as dist

    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    # Size agreement: the C++ stage the MPI transport runs too (same checks, same reason codes);
    # every rank raises deepio.InvalidArgumentError, or none does.
    # Buffers are torch tensors; _comm takes any framework's (its stub says NDArray): Any.
    agree: Any = torch.empty(7, dtype=torch.int64)
    _comm.agreement_message(inp, out, we, se, w, rank, agree)
    dist.all_reduce(agree, op=dist.ReduceOp.MAX, group=group)
    _comm.agreement_verdict(agree, inp, out, we, se, w, rank, "compressed_allreduce_torch: ")
    ns = _numel(se)
    if _numel(inp) == 0:
        we[:] = 0
        se[:] = 0
        return

    stride = _comm.block_stride(ns)
    send: Any = torch.empty(w * stride, dtype=torch.uint8)
    recv: Any = torch.empty(w * stride, dtype=torch.uint8)
    own: Any = torch.empty(stride, dtype=torch.uint8)
    gathered: Any = torch.empty(w * stride, dtype=torch.uint8)
    _comm.worker_stage(inp, we, w, send)
    dist.all_to_all_single(recv, send, group=group)
    _comm.server_stage(recv, se, w, own)
    try:
        dist.all_gather_into_tensor(gathered, own, group=group)
    except (RuntimeError, NotImplementedError):  # backends without allgather_into_tensor
        dist.all_gather(list(gathered.view(w, stride).unbind(0)), own, group=group)
    _comm.decode(gathered, w, ns, out)


def compressed_allreduce_torch(buffer: Any, worker_error: Any, server_error: Any, group: Any = None) -> Any:
    """:func:`compressed_allreduce` over ``torch.distributed`` (CPU tensors or NumPy arrays,
    e.g. the gloo backend) instead of MPI. ``group`` defaults to the world group."""
    flat = _flat_view(buffer, "buffer")
    we = _error_buffer(worker_error, "worker_error")
    se = _error_buffer(server_error, "server_error")
    _torch_transport(flat, flat, we, se, group)
    return buffer


class TorchBackend:
    """:class:`MpiBackend`'s interface over ``torch.distributed`` (for jobs not launched with
    MPI). ``group`` defaults to the world group. Same return semantics as DeepSpeed's."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def compressed_allreduce(self, buffer_m: Any, worker_error: Any, server_error: Any, local_rank: Any = None) -> Any:
        return _deepspeed_call(
            buffer_m, worker_error, server_error, lambda i, o, we, se: _torch_transport(i, o, we, se, self.group)
        )


# ---- packing primitives ----------------------------------------------------------------------


def pack_signs(x: Any, out: Any | None = None, kernel: str = "best") -> Any:
    """Pack the sign bits of a float32 vector (1 for x >= 0, -0.0 and NaN; MSB first, as
    ``numpy.packbits(x >= 0)``) into ``out`` (uint8, ceil(n/8) bytes; allocated if None)."""
    flat = _flat_input(x)
    packed: Any = out  # a NumPy array or a torch tensor: _comm takes either
    if packed is None:
        n = (flat.shape[0] + 7) // 8
        if _is_torch(x):
            import torch

            packed = torch.empty(n, dtype=torch.uint8)
        else:
            import numpy as np

            packed = np.empty(n, dtype=np.uint8)
    _comm.pack_signs(flat, packed, kernel)
    return packed


def unpack_signs(packed: Any, out: Any, scale: float = 1.0, kernel: str = "best") -> Any:
    """Write ``scale`` for every 1 bit and ``-scale`` for every 0 bit into ``out`` (float32)."""
    flat = _flat_view(out, "out")
    _comm.unpack_signs(packed, flat, float(scale), kernel)
    return out
