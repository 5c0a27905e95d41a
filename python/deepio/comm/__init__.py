"""deepio.comm: 1-bit compressed allreduce with error feedback (DeepSpeed's MpiBackend algorithm).

Every rank contributes a float32 vector; every rank receives (approximately) their average,
sent as signs plus one scale per chunk: about 32x less traffic than an fp32 allreduce. The
compression error is fed back into the next call through two persistent buffers per tensor,
``worker_error`` (N float32, N = the padded length, a multiple of 8*W) and ``server_error``
(N/W float32). Use :func:`padded_size` to size them. The exact algorithm is in docs/comm.md.

Transports:

* MPI (any mpi4py communicator, default ``MPI.COMM_WORLD``): :func:`compressed_allreduce` and
  :class:`MpiBackend` (drop-in for ``deepspeed.runtime.comm.mpi.MpiBackend``).
* ``torch.distributed``: :func:`compressed_allreduce_torch`, :class:`TorchBackend` and
  :class:`NcclBackend` (drop-in for ``deepspeed.runtime.comm.nccl.NcclBackend``): NCCL for CUDA
  tensors, gloo for CPU tensors. Same wire layout, so the same results bit for bit.

Engines (``engine=``): ``"native"`` runs the C++ kernels on host memory (NumPy arrays, torch CPU
tensors); ``"torch"`` runs the same arithmetic as torch tensor operations on the tensors' own
device (module ``_torchops``), so CUDA tensors are compressed on the GPU and only the packed
signs and scales (about N/8 bytes) cross to the host -- or nothing does, with a CUDA-aware MPI
(``cuda_aware=True``) or NCCL. ``"auto"`` (default) picks ``"torch"`` for tensors on a device
and ``"native"`` otherwise. Both engines give the same bits (docs/comm.md, "Norms").

Buffers: NumPy arrays or torch tensors, float32; ``worker_error`` and ``server_error`` must be
1-D and contiguous, on the buffer's device; they are updated in place (the same memory holds
the new residuals, so views of them stay valid).

Errors are deepio's own family (docs/errors.md, docs/comm.md): sizes that break the rules
raise ``deepio.InvalidArgumentError`` (an ``OSError`` with errno EINVAL and a ``ValueError``)
on every rank, never a hang, with ``reason`` (the agreement's reason code), ``reason_name``
and ``rank``; the same class for other bad arguments (an unknown kernel, ``world_size`` 0, a
null or inter-communicator). An MPI failure raises ``OSError`` (errno EIO) with
``mpi_error_class``. A wrong dtype, type or device mix raises ``TypeError``; a non-contiguous
buffer ``ValueError``. ``cuda_aware=True`` with an MPI that is not CUDA-aware warns once
(:class:`CudaAwareWarning`, naming the reason) and stages only the packed data.

All calls are collective over the communicator/group. The native engine releases the GIL.
"""

from __future__ import annotations

import importlib.util
from typing import Any

try:
    from .. import _comm
except ImportError as e:  # the binary wheel, or a source build that found no MPI
    # `from .. import _comm` names the package ("deepio"), not the module, when the module is
    # missing; a _comm that is there but fails to load (no libmpi.so) raises its own error.
    if importlib.util.find_spec("deepio._comm") is not None:
        raise
    raise ImportError(
        "deepio.comm needs deepio built with MPI: this deepio has no deepio._comm (the binary wheel "
        "leaves it out). Build from source where Open MPI is installed: apt install libopenmpi-dev; "
        "pip install --no-binary deepio deepio (docs/comm.md)",
        name="deepio._comm",
    ) from e
from . import _torchops
from ._cuda_aware import CudaAwareWarning

__all__ = [
    "compressed_allreduce",
    "compressed_allreduce_torch",
    "MpiBackend",
    "TorchBackend",
    "NcclBackend",
    "CudaAwareWarning",
    "mpi_cuda_support",
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


# ---- engines ---------------------------------------------------------------------------------

_ENGINES = ("auto", "native", "torch")


def _on_device(a: Any) -> bool:
    return _is_torch(a) and a.device.type != "cpu"


def _use_torch_ops(buffer: Any, engine: str) -> bool:
    if engine not in _ENGINES:
        raise ValueError(f"engine must be one of {', '.join(_ENGINES)}, got {engine!r}")
    return engine == "torch" or (engine == "auto" and _on_device(buffer))


def _as_torch(a: Any, name: str) -> Any:
    """A torch float32 tensor sharing ``a``'s memory (NumPy arrays through torch.from_numpy)."""
    import torch

    if not _is_torch(a):
        _check_f32(a, name)
        return torch.from_numpy(a)
    if a.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {a.dtype}")
    return a.detach()


def _torch_error_buffers(buf: Any, worker_error: Any, server_error: Any, buf_name: str) -> tuple[Any, Any]:
    """The error buffers as torch tensors, checked as the C++ path checks them (1-D,
    contiguous, on the buffer's device) before any collective runs."""
    we = _as_torch(worker_error, "worker_error")
    se = _as_torch(server_error, "server_error")
    for t, name in ((we, "worker_error"), (se, "server_error")):
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a 1-D contiguous float32 buffer")
        if t.device != buf.device:
            raise TypeError(f"{name} is on {t.device} but {buf_name} is on {buf.device}: all must be on one device")
    return we, se


def _torch_ops_call(buffer_m: Any, worker_error: Any, server_error: Any, transport: Any, where: str) -> Any:
    """DeepSpeed's return semantics around one torch-ops call (buffers on one device)."""
    buf = _as_torch(buffer_m, "buffer_m")
    we, se = _torch_error_buffers(buf, worker_error, server_error, "buffer_m")
    if buf.numel() == we.numel() and buf.is_contiguous():
        flat = buf.view(-1)
        _torchops.compressed_allreduce(flat, flat, we, se, transport, where)
        return buffer_m
    flat_in = buf.reshape(-1).contiguous()
    import torch

    out = torch.empty_like(flat_in)
    _torchops.compressed_allreduce(flat_in, out, we, se, transport, where)
    res = out.view(tuple(buf.shape))
    return res if _is_torch(buffer_m) else res.numpy()


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


def mpi_cuda_support() -> tuple[bool, str]:
    """``(True, reason)`` when the MPI library mpi4py loaded takes CUDA device buffers, else
    ``(False, reason)``; asked of the library at run time (Open MPI's
    ``MPIX_Query_cuda_support()``, MPICH's ``MPIX_GPU_query_support``) and cached."""
    from ._cuda_aware import query

    return query()


class _MpiTransport(_torchops.Transport):
    """mpi4py collectives for the torch-ops engine. ``direct``: hand device tensors to MPI
    (CUDA-aware MPI); otherwise blocks are staged through page-locked host memory."""

    def __init__(self, comm: Any, direct: bool) -> None:
        self.comm = comm
        self.world_size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.device_type = "cuda" if direct else "cpu"

    @staticmethod
    def _buf(t: Any) -> Any:
        from mpi4py import MPI

        if t.device.type == "cpu":
            return [t.numpy(), MPI.BYTE]
        import torch

        torch.cuda.current_stream(t.device).synchronize()  # MPI reads device memory outside torch's streams
        return [t, MPI.BYTE]  # mpi4py takes it through __dlpack__ / __cuda_array_interface__

    def allreduce_max(self, message: Any) -> None:
        from mpi4py import MPI

        self.comm.Allreduce(MPI.IN_PLACE, message.numpy(), op=MPI.MAX)

    def all_to_all(self, send: Any, recv: Any) -> None:
        self.comm.Alltoall(self._buf(send), self._buf(recv))

    def all_gather(self, own: Any, gathered: Any) -> None:
        self.comm.Allgather(self._buf(own), self._buf(gathered))


def compressed_allreduce(
    buffer: Any, worker_error: Any, server_error: Any, comm: Any = None, engine: str = "auto"
) -> Any:
    """Average ``buffer`` across ``comm`` with 1-bit compression; the result replaces the
    contents of ``buffer`` (any shape, contiguous, float32, N0 <= N elements), which is returned.

    ``worker_error`` (N) and ``server_error`` (N/W) are the persistent residuals, updated in
    place. ``comm`` is an mpi4py intracommunicator (default ``MPI.COMM_WORLD``). ``engine``: see
    the module docstring (device tensors go through the torch-ops engine, staging only the
    packed blocks; use :class:`MpiBackend` with ``cuda_aware=True`` to skip the staging).
    Collective.
    """
    if _use_torch_ops(buffer, engine):
        from mpi4py import MPI

        buf = _as_torch(buffer, "buffer")
        if not buf.is_contiguous():
            raise ValueError("buffer must be contiguous (the result would otherwise land in a copy)")
        flat = buf.view(-1)
        we, se = _torch_error_buffers(buf, worker_error, server_error, "buffer")
        transport = _MpiTransport(MPI.COMM_WORLD if comm is None else comm, direct=False)
        _torchops.compressed_allreduce(flat, flat, we, se, transport, "compressed_allreduce: ")
        return buffer
    flat = _flat_view(buffer, "buffer")
    we = _error_buffer(worker_error, "worker_error")
    se = _error_buffer(server_error, "server_error")
    _comm.compressed_allreduce(flat, flat, we, se, _comm_handle(comm))
    return buffer


class MpiBackend:
    """Drop-in for DeepSpeed's ``deepspeed.runtime.comm.mpi.MpiBackend``.

    ``compressed_allreduce(buffer_m, worker_error, server_error, local_rank)`` returns what
    DeepSpeed returns: when ``buffer_m`` is contiguous and already padded (numel == N), the
    result is written into it and ``buffer_m`` is returned; otherwise ``buffer_m`` is left
    alone and a new buffer of its shape is returned. ``local_rank`` is accepted and ignored
    (the tensors' own device is used). The communicator defaults to ``MPI.COMM_WORLD`` like
    DeepSpeed's, but any mpi4py communicator may be given.

    CUDA tensors are compressed on their GPU (torch-ops engine). ``cuda_aware=True``: when the
    MPI library reports CUDA support (:func:`mpi_cuda_support`), the packed device blocks go to
    MPI directly; when it does not, a :class:`CudaAwareWarning` naming the reason is issued once
    and the packed blocks (only those) are staged through page-locked host memory, as with
    ``cuda_aware=False``. ``engine``: ``"auto"``, ``"native"`` (C++ kernels; device tensors are
    then copied whole to the host and back) or ``"torch"`` (torch operations on any device).
    """

    def __init__(self, cuda_aware: bool = False, comm: Any = None, engine: str = "auto") -> None:
        from mpi4py import MPI

        if engine not in _ENGINES:
            raise ValueError(f"engine must be one of {', '.join(_ENGINES)}, got {engine!r}")
        self.cuda_aware = bool(cuda_aware)
        self.engine = engine
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._handle = _comm_handle(self.comm)
        direct = False
        if self.cuda_aware:
            from ._cuda_aware import query, warn_once

            direct, reason = query()
            if not direct:
                warn_once(reason)
        #: True when device tensors are handed to MPI directly (cuda_aware and supported).
        self.direct = direct
        self._transport = _MpiTransport(self.comm, direct)

    def compressed_allreduce(self, buffer_m: Any, worker_error: Any, server_error: Any, local_rank: Any = None) -> Any:
        if _use_torch_ops(buffer_m, self.engine):
            return _torch_ops_call(buffer_m, worker_error, server_error, self._transport, "compressed_allreduce: ")
        return _deepspeed_call(
            buffer_m,
            worker_error,
            server_error,
            lambda i, o, we, se: _comm.compressed_allreduce(i, o, we, se, self._handle),
        )


def _deepspeed_call(buffer_m: Any, worker_error: Any, server_error: Any, run: Any) -> Any:
    """DeepSpeed's in-place/padding return semantics around a native transport call."""
    staged = _on_device(buffer_m)
    if staged:  # engine="native" on device tensors: whole buffers copied to the host and back
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


class _DistTransport(_torchops.Transport):
    """torch.distributed collectives for the torch-ops engine. Blocks stay on the buffers'
    device when the group's backend takes it (NCCL: CUDA), else they are staged on the host."""

    def __init__(self, group: Any, device_type: str) -> None:
        import torch.distributed as dist

        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.device_type = device_type

    def allreduce_max(self, message: Any) -> None:
        import torch.distributed as dist

        if self.device_type == "cpu":
            dist.all_reduce(message, op=dist.ReduceOp.MAX, group=self.group)
            return
        on_dev = message.to(self.device_type)
        dist.all_reduce(on_dev, op=dist.ReduceOp.MAX, group=self.group)
        message.copy_(on_dev)

    def all_to_all(self, send: Any, recv: Any) -> None:
        import torch.distributed as dist

        dist.all_to_all_single(recv, send, group=self.group)

    def all_gather(self, own: Any, gathered: Any) -> None:
        import torch.distributed as dist

        try:
            dist.all_gather_into_tensor(gathered, own, group=self.group)
        except (RuntimeError, NotImplementedError):  # backends without allgather_into_tensor
            dist.all_gather(list(gathered.view(self.world_size, -1).unbind(0)), own, group=self.group)


def _dist_device_type(group: Any, buffer: Any) -> str:
    """Where the torch.distributed collectives take the blocks: the buffer's device under NCCL,
    else the host."""
    import torch.distributed as dist

    dev = buffer.device.type if _is_torch(buffer) else "cpu"
    if dev != "cpu" and "nccl" not in str(dist.get_backend(group)).lower():
        return "cpu"
    return dev


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


def compressed_allreduce_torch(
    buffer: Any, worker_error: Any, server_error: Any, group: Any = None, engine: str = "auto"
) -> Any:
    """:func:`compressed_allreduce` over ``torch.distributed`` instead of MPI (gloo for CPU
    tensors or NumPy arrays, NCCL for CUDA tensors). ``group`` defaults to the world group."""
    if _use_torch_ops(buffer, engine):
        buf = _as_torch(buffer, "buffer")
        if not buf.is_contiguous():
            raise ValueError("buffer must be contiguous (the result would otherwise land in a copy)")
        flat = buf.view(-1)
        transport = _DistTransport(group, _dist_device_type(group, buf))
        we = _as_torch(worker_error, "worker_error")
        se = _as_torch(server_error, "server_error")
        _torchops.compressed_allreduce(flat, flat, we, se, transport, "compressed_allreduce_torch: ")
        return buffer
    flat = _flat_view(buffer, "buffer")
    we = _error_buffer(worker_error, "worker_error")
    se = _error_buffer(server_error, "server_error")
    _torch_transport(flat, flat, we, se, group)
    return buffer


class TorchBackend:
    """:class:`MpiBackend`'s interface over ``torch.distributed`` (for jobs not launched with
    MPI). ``group`` defaults to the world group. Same return semantics as DeepSpeed's. CUDA
    tensors are compressed on their GPU; under NCCL the blocks never leave the device, under
    gloo only they are staged through host memory. ``engine`` as for :class:`MpiBackend`."""

    def __init__(self, group: Any = None, engine: str = "auto") -> None:
        import torch.distributed as dist

        if engine not in _ENGINES:
            raise ValueError(f"engine must be one of {', '.join(_ENGINES)}, got {engine!r}")
        self.group = group
        self.engine = engine
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def compressed_allreduce(self, buffer_m: Any, worker_error: Any, server_error: Any, local_rank: Any = None) -> Any:
        if _use_torch_ops(buffer_m, self.engine):
            transport = _DistTransport(self.group, _dist_device_type(self.group, buffer_m))
            return _torch_ops_call(buffer_m, worker_error, server_error, transport, "compressed_allreduce_torch: ")
        return _deepspeed_call(
            buffer_m, worker_error, server_error, lambda i, o, we, se: _torch_transport(i, o, we, se, self.group)
        )


class NcclBackend(TorchBackend):
    """Drop-in for DeepSpeed's ``deepspeed.runtime.comm.nccl.NcclBackend(mpu=None)``: the group is
    ``mpu.get_data_parallel_group()`` when an ``mpu`` is given, else the world group (DeepSpeed
    makes a new group over all ranks: the same ranks). ``compressed_allreduce(buffer_m,
    worker_error, server_error, local_rank)`` as :class:`MpiBackend`'s: NCCL moves the packed
    blocks of CUDA tensors device to device; CPU tensors run on gloo. Same wire layout and the
    same bits as the MPI path. ``group=`` overrides the group."""

    def __init__(self, mpu: Any = None, group: Any = None, engine: str = "auto") -> None:
        if group is None and mpu is not None:
            group = mpu.get_data_parallel_group()
        super().__init__(group=group, engine=engine)
        self.mpu = mpu


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
