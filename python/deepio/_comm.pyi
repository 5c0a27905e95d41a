"""
deepio 1-bit compressed allreduce (C++ core); use deepio.comm instead of this module
"""

from typing import Annotated

import numpy
from numpy.typing import NDArray


def best_kernel() -> str: ...

def kernel_available(arg: str, /) -> bool: ...

def padded_size(n: int, world_size: int) -> int: ...

def compressed_allreduce(input: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], output: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')], worker_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')], server_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')], comm_handle: int) -> None:
    """
    MPI compressed allreduce of input into output (which may be the same array). Collective.
    """

def pack_signs(x: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], packed: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu')], kernel: str = 'best') -> None: ...

def unpack_signs(packed: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], out: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')], scale: float = 1.0, kernel: str = 'best') -> None: ...

def agreement_message(input: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], output: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], worker_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], server_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], world_size: int, rank: int, message: Annotated[NDArray[numpy.int64], dict(shape=(7), order='C', device='cpu')]) -> None:
    """
    Size agreement, step 1: this rank's checks and lengths into message (7 int64), to be reduced with MAX over all ranks.
    """

def agreement_verdict(reduced: Annotated[NDArray[numpy.int64], dict(shape=(7), order='C', device='cpu')], input: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], output: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], worker_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], server_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)], world_size: int, rank: int, where: str) -> None:
    """
    Size agreement, step 2: raises deepio.InvalidArgumentError on every rank (or on none) from the reduced message.
    """

def block_stride(chunk: int) -> int: ...

def worker_stage(input: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], worker_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')], world_size: int, send: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu')]) -> float:
    """
    Worker side: compensate, scale, residual, pack W blocks into send. Returns the worker scale.
    """

def server_stage(recv: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], server_error: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')], world_size: int, own: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu')]) -> float:
    """
    Server side: average the W received blocks, compensate, residual, pack into own. Returns the server scale.
    """

def decode(gathered: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], world_size: int, chunk: int, out: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu')]) -> None:
    """Decode the W gathered server blocks into out."""
