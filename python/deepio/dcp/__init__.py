"""deepio.dcp: ``torch.distributed.checkpoint`` storage through deepio's engine.

``FileSystemWriter`` and ``FileSystemReader`` are drop-in replacements for torch's (same
arguments, same folder of ``.distcp`` data files and ``.metadata``, byte-identical items:
torch's reader loads what deepio writes and the other way round)::

    import torch.distributed.checkpoint as dcp
    import deepio.dcp
    dcp.save(state_dict, storage_writer=deepio.dcp.FileSystemWriter("/nvme/step100"))
    dcp.load(state_dict, storage_reader=deepio.dcp.FileSystemReader("/nvme/step100"))

Several drives without RAID: ``FileSystemWriter(path, extra_paths=[folder_on_drive2, ...])``
spreads each rank's data files over ``path`` and those folders (which checkpoints may share:
each save's files go to a folder of its own there); the metadata in ``path`` records where
each went, so ``FileSystemReader(path)`` finds them (``folder_map={old: new}`` where extra
folders moved).

``HuggingFaceStorageWriter`` and ``HuggingFaceStorageReader`` are torch's storage of a folder
of ``.safetensors`` files, the writer's files written durably through the engine (byte-identical
to torch's), the reader's tensors read through the engine straight into their destinations where
they can be (``_hf``: what is deepio's, what is torch's)::

    dcp.save(state_dict, storage_writer=deepio.dcp.HuggingFaceStorageWriter("/nvme/hf"))
    dcp.load(state_dict, storage_reader=deepio.dcp.HuggingFaceStorageReader("/nvme/hf"))

Data files are written and read through the engine (``_writer``, ``_reader``: each module's
docstring says what is still torch's code). A checkpoint owns its files (``_owner``): a save
over an existing checkpoint writes new names and switches ``.metadata`` last and durably, so a
save killed midway leaves the old checkpoint loadable (a first save killed leaves a folder
``dcp.load`` refuses); the reader refuses a data file another save wrote, and checks the
CRC-32 of every record it reads (``FileSystemReader(path, verify_crc=False)`` skips that), both
with ``deepio.CorruptFileError``. Two saves of one checkpoint at once run one after the other
(``_savelock``), and every rank removes the files no save needs on its own host (``_cleanup``).
Importing this package imports torch.distributed.checkpoint (``import deepio`` does not). See
docs/checkpoints.md, "Distributed checkpoint (DCP)".
"""

from __future__ import annotations

from typing import Any

from ._reader import FileSystemReader
from ._writer import FileSystemWriter

__all__ = ["FileSystemReader", "FileSystemWriter", "HuggingFaceStorageReader", "HuggingFaceStorageWriter"]


def __getattr__(name: str) -> Any:
    # Imported on first use: torch's HuggingFace storage is newer than its file system
    # storage, and a torch without it must not cost users the two classes above.
    if name in ("HuggingFaceStorageReader", "HuggingFaceStorageWriter"):
        from . import _hf

        return getattr(_hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
