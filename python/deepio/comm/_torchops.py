"""The compressed allreduce with torch's own tensor operations (the "torch-ops" path).

These are the stages of ``src/comm/stages.hpp`` written as torch tensor operations, so that they
run wherever the caller's tensors live: on a GPU the sign packing, the scales, the error-feedback
updates and the unpacking stay on the device and only the packed blocks (about N/8 bytes) move,
with nothing to compile (deepio never links CUDA; torch brings its kernels). On torch CPU tensors
the same operations run on the CPU, which is how CI proves this path without a GPU.

Bit-for-bit contract: for the same inputs every function here produces the same bytes as the C++
stage of the same name (worker_stage, server_stage, decode_block; same wire layout
``[fp32 scale][C/8 sign bytes]`` per block). Only IEEE operations whose result does not depend on
the implementation are used: fp32 elementwise additions, subtractions, multiplications and sign
flips in the order the C++ kernels use; exact fp64 squares; the sums of squares in the fixed order
of docs/comm.md "Norms" (leaves of 64 rows of 8 summed row by row with elementwise additions, then a
pairwise tree), never torch's own reductions, whose order is unspecified; the correctly rounded
fp64 square root; integer packing. Sign flips are written as ``copysign(s, ±1)``
(exact: every scale is >= +0). Caveat (as between the scalar and AVX2 C++ kernels): the sign bit
and payload of a NaN result (a NaN input, or inf - inf after an fp32 overflow) depend on the
hardware and on the instruction (x86 and CUDA differ); results are NaN on both paths and a NaN
reads as sign bit 1, so every other value stays identical.

The collectives are the caller's (see :class:`Transport`): an int64 MAX-allreduce of the size
agreement message (on the host), an all-to-all and an all-gather of byte blocks.
"""

from __future__ import annotations

import math
from typing import Any

LEAF_ROWS = 64  # = SumSq::kLeafRows in src/comm/kernels.hpp
_SHIFTS: dict[Any, Any] = {}


def _shifts(device: Any) -> Any:
    """uint8 [7, 6, ..., 0] on ``device`` (bit 7 - j of byte k is element 8k + j)."""
    import torch

    key = str(device)
    t = _SHIFTS.get(key)
    if t is None:
        t = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)
        _SHIFTS[key] = t
    return t


def pack(bits: Any, out: Any) -> None:
    """Packs a bool tensor of 8k elements (True = bit 1) MSB first into ``out`` (k uint8)."""
    import torch

    b = bits.view(-1, 8).to(torch.uint8) << _shifts(bits.device)
    torch.sum(b, dim=1, dtype=torch.uint8, out=out)


def signs(packed: Any) -> Any:
    """+1.0 for every 1 bit and -1.0 for every 0 bit of ``packed`` ([..., B] uint8), as float32
    [..., 8B]: one table lookup per byte (a 256 x 8 table)."""
    import torch

    key = ("signs", str(packed.device))
    lut = _SHIFTS.get(key)
    if lut is None:
        bits = (torch.arange(256, dtype=torch.int32).unsqueeze(1) >> torch.arange(7, -1, -1)) & 1
        lut = (bits * 2 - 1).to(torch.float32).to(packed.device)
        _SHIFTS[key] = lut
    flat = lut.index_select(0, packed.reshape(-1).to(torch.int32))
    return flat.view(*packed.shape[:-1], packed.shape[-1] * 8)


def unpack(packed: Any) -> Any:
    """The bits of ``packed`` (any shape [..., B] uint8) as a bool tensor [..., 8B]."""
    p = packed.unsqueeze(-1) >> _shifts(packed.device)
    return (p & 1).bool().flatten(-2)


def sum_squares(x: Any) -> Any:
    """Sum of x[i]^2 in fp64 in the order of docs/comm.md "Norms" (a 0-d fp64 tensor).
    ``x``: 1-D float32, numel a multiple of 8."""
    import torch

    n = x.numel()
    if n == 0:
        return torch.zeros((), dtype=torch.float64, device=x.device)
    leaf = 8 * LEAF_ROWS
    n_leaves = -(-n // leaf)
    # Row r of every leaf side by side: rows[r] is [n_leaves, 8] and contiguous, so that the
    # 63 additions below run over contiguous memory.
    rows = torch.empty((LEAF_ROWS, n_leaves, 8), dtype=torch.float64, device=x.device)
    full = n // leaf
    if full:
        rows[:, :full, :].copy_(x[: full * leaf].view(full, LEAF_ROWS, 8).transpose(0, 1))
    if full < n_leaves:  # the last leaf, padded with zero rows
        tail = torch.zeros(leaf, dtype=torch.float64, device=x.device)
        tail[: n - full * leaf].copy_(x[full * leaf :])
        rows[:, full, :].copy_(tail.view(LEAF_ROWS, 8))
    rows.mul_(rows)  # exact: a float squared fits in a double
    acc = rows[0].clone()  # +0.0 + a == a
    for r in range(1, LEAF_ROWS):  # each lane in increasing index, as the streaming kernels do
        acc.add_(rows[r])
    while acc.shape[0] > 1:  # the perfect tree; an odd last node pairs with a zero leaf (exact)
        m = acc.shape[0]
        pairs = acc[0 : m - 1 : 2] + acc[1:m:2]
        acc = torch.cat([pairs, acc[m - 1 :]]) if m % 2 else pairs
    lane = acc[0]
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]))


def scale_of(x: Any) -> Any:
    """||x|| / sqrt(n) as the C++ scale_of: fp32(sqrt(total)) / fp32(sqrt(n)) (0-d fp32)."""
    import torch

    norm = torch.sqrt(sum_squares(x)).to(torch.float32)
    return norm / torch.tensor(math.sqrt(x.numel()), dtype=torch.float32, device=x.device)


def _scales(blocks: Any) -> Any:
    """The fp32 scale headers of [W, stride] blocks, as a fresh fp32 tensor [W]."""
    import torch

    return blocks[:, :4].reshape(-1).clone().view(torch.float32)


def _residual(e: Any, s: Any) -> None:
    """e <- e - (bit(e) ? s : -s), bit(e) = !(e < 0). As copysign(s, e + 0.0): s >= +0 (a norm),
    and e + 0.0 turns -0.0 into +0.0, so -0.0 takes +s; a NaN e stays NaN either way."""
    import torch

    e.sub_(torch.copysign(s, e + 0.0))


def worker_stage(inp: Any, we: Any, w: int, send: Any) -> Any:
    """Compensate (we <- pad(inp) + we), pack the W blocks of ``send`` (uint8, W * stride) with
    the worker scale in each header, and turn ``we`` into the residual. Returns s_w (0-d)."""
    import torch

    n0, n = inp.numel(), we.numel()
    c = n // w
    stride = c // 8 + 4
    head = we[:n0]
    torch.add(inp, head, out=head)  # x = in + e (the C++ operand order)
    if n0 < n:
        we[n0:].add_(0.0)  # padding: x = 0.0f + e (turns -0.0 into +0.0, as the kernels do)
    neg = we < 0
    blocks = send.view(w, stride)
    packed = torch.empty(n // 8, dtype=torch.uint8, device=we.device)
    pack(~neg, packed)
    blocks[:, 4:].copy_(packed.view(w, c // 8))
    s = scale_of(we)
    blocks[:, :4].copy_(s.reshape(1).view(torch.uint8).expand(w, 4))
    _residual(we, s)
    return s


def server_stage(recv: Any, se: Any, w: int, own: Any) -> Any:
    """Average the W received blocks (left to right, from the j = 0 term), add ``se``, pack the
    result with its scale into ``own`` (uint8, stride) and leave the residual in ``se``."""
    import torch

    c = se.numel()
    stride = c // 8 + 4
    blocks = recv.view(w, stride)
    scales = _scales(blocks)
    t = scales * torch.tensor(1.0 / w, dtype=torch.float32, device=se.device)  # s_j * fp32(1/W)
    terms = torch.copysign(t.view(w, 1), signs(blocks[:, 4:]))  # bit ? t_j : -t_j, [W, C] (t_j >= +0)
    acc = terms[0].clone()
    for j in range(1, w):
        acc.add_(terms[j])
    torch.add(acc, se, out=se)  # c = sum + es
    neg = se < 0
    pack(~neg, own[4:])
    s = scale_of(se)
    own[:4].copy_(s.reshape(1).view(torch.uint8))
    _residual(se, s)
    return s


def decode(gathered: Any, w: int, c: int, out: Any) -> None:
    """out[i] = s_k * sgn_k for i < len(out), k = i // c, from the W gathered blocks."""
    import torch

    n0 = out.numel()
    if n0 == 0:
        return
    blocks = gathered.view(w, c // 8 + 4)
    scales = _scales(blocks).view(w, 1)
    out.copy_(torch.copysign(scales, signs(blocks[:, 4:])).view(-1)[:n0])  # bit ? s_k : -s_k


class Transport:
    """The three collectives one call needs; subclasses move bytes (see python/deepio/comm).

    ``device_type``: where the blocks must be for all_to_all/all_gather: the buffers' device type
    when the transport takes device memory, else ``"cpu"`` (then only the packed blocks are
    staged, through page-locked host memory).
    """

    device_type: str = "cpu"
    world_size: int
    rank: int

    def allreduce_max(self, message: Any) -> None:  # int64[7] CPU tensor, in place
        raise NotImplementedError

    def all_to_all(self, send: Any, recv: Any) -> None:
        raise NotImplementedError

    def all_gather(self, own: Any, gathered: Any) -> None:
        raise NotImplementedError


def compressed_allreduce(inp: Any, out: Any, we: Any, se: Any, transport: Transport, where: str) -> None:
    """One call on 1-D float32 tensors of one device (``out`` is ``inp`` or disjoint). The size
    agreement is the C++ one (``_comm.agreement_message``/``agreement_verdict``): the same checks,
    reason codes and messages on every rank as the MPI transport."""
    import torch

    from .. import _comm

    w, rank = transport.world_size, transport.rank
    message: Any = torch.empty(7, dtype=torch.int64)
    _comm.agreement_message(inp, out, we, se, w, rank, message)
    transport.allreduce_max(message)
    _comm.agreement_verdict(message, inp, out, we, se, w, rank, where)
    if inp.numel() == 0:
        we.zero_()
        se.zero_()
        return
    c = se.numel()
    stride = c // 8 + 4
    dev = inp.device
    send = torch.empty(w * stride, dtype=torch.uint8, device=dev)
    worker_stage(inp, we, w, send)
    recv = transport_buffer(transport, send, w * stride)
    own = torch.empty(stride, dtype=torch.uint8, device=dev)
    server_stage(recv, se, w, own)
    gathered = exchange_gather(transport, own, w * stride)
    decode(gathered, w, c, out)


def transport_buffer(transport: Transport, send: Any, nbytes: int) -> Any:
    """All-to-all of ``send``; the received blocks on send's device."""
    import torch

    if transport.device_type == send.device.type:
        recv = torch.empty(nbytes, dtype=torch.uint8, device=send.device)
        transport.all_to_all(send, recv)
        return recv
    host_send, host_recv = transport_staging(transport, "a2a", nbytes)
    host_send.copy_(send)
    transport.all_to_all(host_send, host_recv)
    # Blocking: the staging buffers are reused by the next call, which may run on another
    # stream; a copy still queued would read them while the next exchange overwrites them.
    return host_recv.to(send.device, non_blocking=False)


def exchange_gather(transport: Transport, own: Any, nbytes: int) -> Any:
    """All-gather of ``own``; the gathered blocks on own's device."""
    import torch

    if transport.device_type == own.device.type:
        gathered = torch.empty(nbytes, dtype=torch.uint8, device=own.device)
        transport.all_gather(own, gathered)
        return gathered
    host_own, host_gathered = transport_staging(transport, "ag", nbytes)
    host_own = host_own[: own.numel()]
    host_own.copy_(own)
    transport.all_gather(host_own, host_gathered)
    return host_gathered.to(own.device, non_blocking=False)  # reused buffers: see transport_buffer


def transport_staging(transport: Any, key: str, nbytes: int) -> tuple[Any, Any]:
    """Two page-locked host buffers of ``nbytes`` (reused across calls of one transport)."""
    import torch

    cache = transport.__dict__.setdefault("_staging", {})
    bufs = cache.get(key)
    if bufs is None or bufs[0].numel() != nbytes:
        pin = torch.cuda.is_available()
        bufs = (
            torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin),
            torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin),
        )
        cache[key] = bufs
    return bufs
