"""``deepio.load``: torch checkpoints read through the engine, by one of two routes.

Routes. Where every storage stays in host memory (``_to_host``) and the file is torch's zip
format, the whole file is read into one buffer (``deepio._wholefile``) and torch's zip loader
makes every storage a view of its record's bytes there (``_RecordStorages``); the buffer's
pages outside the storage records, and each storage's pages once it is freed, go back to the
kernel. Otherwise (other map_locations, the legacy format, TorchScript, pickle keywords, a
failure before unpickling) torch.load reads the file through a ``Reader``.

Errors. A missing file, a folder or a permission raise the ``OSError`` subclass at once. A
truncated or corrupt file raises torch's exception type with the file named (``_naming``);
where that type is a ``ValueError``, ``deepio.CorruptFileError`` (a ``ValueError`` too). A
file whose unpickling ran its code (``weights_only=False``) is never unpickled a second time.

``_WHOLE_FILE`` is read from this module at each load.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import struct
import sys
import weakref
import zipfile
from typing import IO, Any, cast

from .. import _populate, _wholefile
from .._errors import CorruptFileError
from ._reader import Reader
from ._save import _fspath
from ._staging import PathArg
from ._zip import _MemoryFile, _storage_spans

#: deepio.load reads a zip checkpoint whole into one page-aligned buffer and makes every
#: storage a view of it (False: through a Reader into memory torch allocates per storage).
_WHOLE_FILE = True

# What torch.load raises on a corrupt or truncated file (random bytes give UnpicklingError,
# IndexError "pop from empty list", UnicodeDecodeError, KeyError; a truncated zip EOFError or
# RuntimeError; a corrupt length MemoryError/OverflowError).
_LOAD_ERRORS = (
    RuntimeError,
    EOFError,
    pickle.UnpicklingError,
    zipfile.BadZipFile,
    ValueError,
    LookupError,
    ArithmeticError,
    MemoryError,
    struct.error,
)


def load(path: PathArg, map_location: Any = None, *, weights_only: bool | None = None, **kwargs: Any) -> Any:
    """Loads a file written by ``torch.save`` or ``deepio.save``, as ``torch.load(path,
    map_location, weights_only=...)`` does, reading through the engine.

    Where every storage stays in host memory (``map_location="cpu"``, or None on a machine
    without an accelerator) and the file is torch's zip format, the whole file is read into
    one buffer (transparent huge pages, faulted in on a helper thread ahead of large direct
    reads, all in flight) and every storage is a view of its bytes there, as with
    ``torch.load(mmap=True)`` but read now: no copy, no second allocation. A storage that
    is freed gives its pages back at once; the buffer's mapping goes with the last. Otherwise
    (other map_locations, the legacy format, TorchScript, pickle keywords) through a
    ``Reader``: aligned direct-I/O chunks read ahead into page-locked buffers and copied into
    each storage's memory, which a helper thread faults in ahead of the copies.

    ``weights_only=None`` leaves the choice to torch, exactly as ``torch.load`` does (torch
    2.6 and later: ``True`` unless ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says otherwise), so
    files holding arbitrary Python objects need ``weights_only=False`` from a trusted source.
    Other keywords go to ``torch.load`` (``mmap=True`` maps the file instead of reading it).
    A missing file, a folder or a permission raise the ``OSError`` subclass, as ``open()``
    does; a truncated or corrupt file raises torch's exception type with the file named
    (``deepio.CorruptFileError`` where torch raised a ``ValueError``).
    """
    import torch

    p = _fspath(path, "load")
    if kwargs.get("mmap"):
        return torch.load(p, map_location=map_location, weights_only=weights_only, **kwargs)
    if _WHOLE_FILE and not kwargs and _to_host(map_location):
        taken = _load_whole(p, map_location, weights_only)
        if taken is not None:
            return taken[0]
    with Reader(p) as f:
        try:
            return torch.load(cast(IO[bytes], f), map_location=map_location, weights_only=weights_only, **kwargs)
        except OSError:
            raise
        except _LOAD_ERRORS as e:
            raise _naming(e, p) from e


def _naming(e: BaseException, path: str) -> BaseException:
    """What deepio.load raises for torch's exception ``e`` about the file ``path``: a message
    naming the file, as a ``CorruptFileError`` where ``e`` is a ``ValueError``, else as the
    nearest class of ``e``'s that takes a message, so that an ``except`` written for
    torch.load still catches it."""
    msg = f"deepio.load({path!r}): cannot load it as a torch checkpoint (truncated or corrupt?): {e}"
    if isinstance(e, ValueError):
        return CorruptFileError(path, f"cannot load it as a torch checkpoint (truncated or corrupt?): {e}")
    for cls in type(e).__mro__:  # the nearest class that takes a message (UnicodeDecodeError does not)
        try:
            named = cls(msg)
        except Exception:
            continue
        if isinstance(named, BaseException):
            return named
    return RuntimeError(msg)


def _to_host(map_location: Any) -> bool:
    """Whether every storage of the load stays in host memory, so that views of one host buffer
    are the result: map_location "cpu", or None where no accelerator could be the saved
    location (a file saved from CUDA would otherwise hold the whole host buffer until every
    storage is on the device)."""
    torch = sys.modules["torch"]
    if map_location is None:
        try:
            acc = getattr(torch, "accelerator", None)
            if acc is not None and hasattr(acc, "is_available"):
                return not acc.is_available()
            return not torch.cuda.is_available()
        except Exception:
            return False
    if isinstance(map_location, str):
        return map_location == "cpu"
    return isinstance(map_location, torch.device) and map_location.type == "cpu" and map_location.index is None


def _weights_only_as_torch_load(weights_only: bool | None) -> bool | None:
    """The weights_only torch.load decides on; None where deepio leaves it to torch.load (an
    unknown torch, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD overriding a default: torch warns, both
    force variables set: torch raises)."""
    ser = sys.modules["torch"].serialization
    not_set = weights_only is None
    if not_set:
        default = getattr(ser, "_default_to_weights_only", None)
        if default is None:
            return None
        weights_only = bool(default(None))
    yes = ("1", "y", "yes", "true")
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in yes
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in yes
    if force and force_no:
        return None
    if force:
        return True
    if force_no and not_set:
        return None
    return bool(weights_only)


def _load_whole(p: str, map_location: Any, weights_only: bool | None) -> tuple[Any] | None:
    """torch.load's zip route with every storage a view of one buffer holding the whole file
    (torch's own ``overall_storage``, which torch.load(mmap=True) gives a mapping of the
    file). None where the Reader's route should load the file instead: not a zip (torch's
    legacy format), a TorchScript archive, a torch without these internals, or any failure to
    load before unpickling starts, and a weights-only load that fails (the Reader's route then
    raises torch.load's own exception, named); a failure while unpickling with
    weights_only=False is raised (named) without loading again: the file's code ran once."""
    import torch

    ser = torch.serialization
    load_zip = getattr(ser, "_load", None)
    unpickler = getattr(ser, "_weights_only_unpickler", None)
    wo = _weights_only_as_torch_load(weights_only)
    if load_zip is None or unpickler is None or wo is None:
        return None
    whole = _wholefile.read(p, at_least=4)  # None: too short to be a zip
    if whole is None:
        return None
    buf, off = whole.buffer, whole.offset
    try:
        view = whole.view()
        if bytes(view[:4]) != b"PK\x03\x04":
            return None
        zf = torch._C.PyTorchFileReader(cast(IO[bytes], _MemoryFile(view)))
        if "constants.pkl" in zf.get_all_records():
            return None  # TorchScript: torch.load hands it to torch.jit.load
        storages = _RecordStorages(buf, off)
    except Exception:
        return None
    try:
        result = load_zip(zf, map_location, unpickler if wo else pickle, overall_storage=storages, encoding="utf-8")
    except TypeError as e:
        if "overall_storage" in str(e):
            return None  # a torch whose loader has no such parameter
        raise
    except Exception as e:
        if wo:
            # The weights-only unpickler runs no code of the file's: the Reader's route loads
            # it again for torch.load's own message (how to allow the globals it refused).
            return None
        # Unpickling ran the file's code (weights_only=False): never a second time, as
        # torch.load raises; named as the Reader's route names it.
        if isinstance(e, OSError) or not isinstance(e, _LOAD_ERRORS):
            raise
        raise _naming(e, p) from e
    _release_outside_storages(_populate.address(buf) + off, view)
    return (result,)


_MADV_DONTNEED = 4
_RELEASE_MIN = 2 << 20  # gaps between storage records from this size are given back


class _RecordStorages:
    """What torch's zip loader takes as ``overall_storage`` (it only slices it: one slice per
    storage record): each slice is a storage of its own over the record's bytes in the buffer
    (``torch.frombuffer`` of a ctypes view, which keeps the buffer mapped), and when that storage
    is freed the whole pages inside its record go back to the kernel (MADV_DONTNEED). So a
    storage the caller drops (a model's weights once ``load_state_dict`` copied them) stops
    holding memory while other storages of the same load live on; the mapping itself goes
    with the last of them."""

    def __init__(self, buf: mmap.mmap, off: int) -> None:
        self._buf, self._off = buf, off
        self._addr = _populate.address(buf) + off

    def __getitem__(self, s: slice) -> Any:
        torch = sys.modules["torch"]
        start, stop = int(s.start), int(s.stop)
        if stop <= start:
            return torch.UntypedStorage(0)
        piece = (ctypes.c_char * (stop - start)).from_buffer(self._buf, self._off + start)
        # Not at exit: an atexit handler of the caller's may still read the tensor then.
        weakref.finalize(piece, _give_back, self._addr + start, stop - start).atexit = False
        return torch.frombuffer(piece, dtype=torch.uint8).untyped_storage()


def _give_back(addr: int, nbytes: int) -> None:
    """MADV_DONTNEED on the whole pages of [addr, addr + nbytes) (a hint: never raises)."""
    lo, hi = _populate.whole_pages(addr, nbytes)
    if hi > lo:
        _populate.advise(lo, hi - lo, _MADV_DONTNEED)


def _release_outside_storages(addr: int, view: memoryview) -> None:
    """Gives the buffer's pages that hold no storage bytes back to the kernel (MADV_DONTNEED:
    the pickle, zip headers and directory, records torch copied out), where a gap is at least
    _RELEASE_MIN: the buffer stays mapped while any storage lives (each gives back only its own
    record's pages when it goes), and a checkpoint with a large pickled object would otherwise
    keep that object's bytes too. Storage records are the archive's ``/data/``
    entries; torch read every other record into memory of its own. A hint: on any doubt
    (a directory zipfile cannot read), nothing is released."""
    if len(view) < 2 * _RELEASE_MIN:
        return
    try:
        keep = _storage_spans(view)
    except Exception:
        return
    at = 0
    for start, end in [*keep, (len(view), len(view))]:
        lo, hi = _populate.whole_pages(addr + at, start - at)
        if hi - lo >= _RELEASE_MIN:
            _populate.advise(lo, hi - lo, _MADV_DONTNEED)
        at = max(at, end)
