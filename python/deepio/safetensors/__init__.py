"""Loading and saving safetensors files through deepio's engine (``import deepio.safetensors``).

The functions have the signatures and results of ``safetensors.torch``::

    from deepio.safetensors import load_file, save_file, load_files
    sd = load_file("model.safetensors")                 # dict[str, torch.Tensor] on the CPU
    sd = load_file("model.safetensors", device="cuda:0")
    sd = load_files("llama-70b/")                       # every *.safetensors in the folder
    save_file(sd, "copy.safetensors", metadata={"format": "pt"})   # byte-identical to safetensors'

Reading checks each header completely before any data is read: a corrupt or truncated file
raises ``deepio.CorruptFileError`` (a ValueError) naming the file and the tensor, and no dict is
returned half filled. Saving is durable: after ``save_file`` returns the file is on stable
storage, and a save that fails or is killed leaves the old file untouched. docs/models.md says
what happens in detail, what it costs, and where it differs from safetensors.

Importing this package does not import torch (the first load or save does). Its parts, one job
each: ``_format`` (the format itself, pure: header bytes to ``Header`` and back), ``_load``
(reading), ``_save`` (writing), ``_cpu`` (where CPU loads land: the direct backend through
deepio's one whole-file reader ``deepio._wholefile``, the mmap backend), ``_io`` (the engine
requests of CUDA loads and saves), ``_tensors`` (dtypes and shapes as torch's). The tuning knobs
live in the module that reads them (``_io._CHUNK_BYTES``, ``_cpu._MMAP_THREADS``, and the
whole-file reader's ``deepio._wholefile.CHUNK``, ``HUGEPAGES``, ``POPULATE_THREADS``, which
``deepio.load`` shares): set them there, not on this package. bench/load_safetensors.py
measures a load against the disk.
"""

from __future__ import annotations

# Also importable from here, as before the split (not in __all__): the header's types, the
# header size limit, the default CPU load backend and the path type of the signatures.
from ._format import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from ._format import Header as Header
from ._format import TensorInfo as TensorInfo
from ._load import DEFAULT_BACKEND as DEFAULT_BACKEND
from ._load import PathArg as PathArg
from ._load import load, load_file, load_files, read_header
from ._save import save, save_file

__all__ = ["load_file", "load_files", "save_file", "load", "save", "read_header"]
