"""What deepio.dcp's writers and readers share: threads side by side, a planned item's bytes,
and the order torch's writer takes tensor items in. No state; thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


def side_by_side(tasks: list[Callable[[], None]], name: str) -> None:
    """Runs ``tasks[0]`` on the calling thread and each other task on a thread of its own
    (named ``name-N``), and returns once every one has ended."""
    helpers = [threading.Thread(target=task, name=f"{name}-{n}") for n, task in enumerate(tasks) if n]
    for t in helpers:
        t.start()
    try:
        tasks[0]()
    finally:
        for t in helpers:
            t.join()


def item_nbytes(item: Any) -> int:
    """The bytes of a planned tensor item (torch's ``_item_size``)."""
    return int(item.tensor_data.size.numel()) * item.tensor_data.properties.dtype.itemsize


def overlapping_order(writer: Any) -> bool:
    """Whether torch's writer would take its tensor items through ``_OverlappingCpuLoader``
    (which hands them over smallest first, stable): one thread, an accelerator, copy-ahead on.
    Its files then hold the tensors in that order, and so do deepio's."""
    backend = getattr(torch, torch._C._get_privateuse1_backend_name(), None)
    accel = torch.cuda.is_available() or bool(backend is not None and backend.is_available())
    return writer.thread_count == 1 and accel and writer.per_thread_copy_ahead > 0
