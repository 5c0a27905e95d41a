"""The parts of torch.distributed.checkpoint that deepio.dcp builds on, imported in one place.

``FileSystemWriter``/``FileSystemReader``, the planner types and ``Metadata`` are torch's public
API. ``_StorageInfo`` (where an item lies in a data file: the record DCP's ``.metadata`` keeps),
``_StoragePrefix``, ``_split_by_size_and_type``, ``_metadata_fn``, ``CURRENT_DCP_VERSION`` and ``SerializationFormat``
are private to ``torch/distributed/checkpoint/filesystem.py``: they are the file format, so
deepio must use torch's own to stay byte-compatible. Should a torch lack one, importing
deepio.dcp fails with ``ImportError`` naming the torch version, never later mid-save.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from torch.distributed.checkpoint import filesystem as _fs
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
    from torch.distributed.checkpoint.planner import (
        LoadItemType,
        LoadPlan,
        LoadPlanner,
        SavePlan,
        SavePlanner,
        WriteItem,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import WriteResult

    FileSystemWriter: Any = _fs.FileSystemWriter
    FileSystemReader: Any = _fs.FileSystemReader
    StorageInfo: Any = _fs._StorageInfo
    StoragePrefix: Any = _fs._StoragePrefix
    split_by_size_and_type: Any = _fs._split_by_size_and_type
    METADATA_NAME: str = _fs._metadata_fn
    DATA_SUFFIX: str = _fs.DEFAULT_SUFFIX
    TORCH_SAVE: Any = _fs.SerializationFormat.TORCH_SAVE
    CURRENT_DCP_VERSION: str = _fs.CURRENT_DCP_VERSION
    narrow_tensor_by_index: Any = _fs.narrow_tensor_by_index
except (ImportError, AttributeError) as e:  # pragma: no cover - depends on the torch installed
    raise ImportError(
        f"deepio.dcp needs torch.distributed.checkpoint's file system storage as torch 2.13 has it; "
        f"torch {torch.__version__} lacks {e}"
    ) from e

__all__ = [
    "CURRENT_DCP_VERSION",
    "narrow_tensor_by_index",
    "DATA_SUFFIX",
    "FileSystemReader",
    "FileSystemWriter",
    "LoadItemType",
    "LoadPlan",
    "LoadPlanner",
    "METADATA_NAME",
    "Metadata",
    "SavePlan",
    "SavePlanner",
    "StorageInfo",
    "StorageMeta",
    "StoragePrefix",
    "TORCH_SAVE",
    "WriteItem",
    "WriteItemType",
    "WriteResult",
    "split_by_size_and_type",
]
