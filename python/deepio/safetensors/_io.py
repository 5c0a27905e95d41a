"""The engine requests of loads and saves: the process's default engine, reads of a byte range
cut into large requests queued as one batch, and waiting for every request.

Errors: each request's failure is an ``OSError`` from the engine (errno, file name, offset);
``run`` waits for all of them before raising the first, so nothing is left in flight when a
load or save raises. Thread-safe as the engine is (these functions keep no state; the knob
``_CHUNK_BYTES`` is read at each call)."""

from __future__ import annotations

from typing import Any, Callable

from .._engine import default as _default_engine

_CHUNK_BYTES = 64 << 20  # engine requests per file: large, several in flight (docs/models.md)


def engine() -> Any:
    """The process's default engine (deepio._engine), for host and CUDA memory (GPUDirect
    Storage where usable, staged otherwise: the engine's device route "auto")."""
    return _default_engine()


def run(ops: list[Any]) -> None:
    """Waits for every operation, then raises the first failure (none is left running)."""
    first: BaseException | None = None
    for op in ops:
        try:
            op.result(None)
        except BaseException as e:  # KeyboardInterrupt too: the others must finish first
            if first is None:
                first = e
    if first is not None:
        raise first


def submit_read(h: Any, cut: Callable[[int, int], Any], path: str, offset: int, nbytes: int, ops: list[Any]) -> None:
    """Queues reads of [offset, offset + nbytes) of ``path`` into the destination in requests
    of up to _CHUNK_BYTES, as one batch (one call, the file opened once off this thread),
    appending their operations to ``ops``; ``cut(at, n)`` returns the destination's bytes
    [at, at + n) (a memoryview slice, a CUDA tensor slice, any buffer the engine takes), which
    must stay alive until ``run(ops)`` returns."""
    starts = range(0, nbytes, _CHUNK_BYTES)
    if starts:
        views = [cut(at, min(_CHUNK_BYTES, nbytes - at)) for at in starts]
        ops.extend(h.submit_batch(False, views, path, [offset + at for at in starts], True))
