"""``deepio.save``: torch's format through the engine, durably, and the choice of route.

Routes. The plain route runs torch's own serializer (``_zip._torch_zip``) into a Writer,
which copies every storage torch hands ``write()`` into its staging buffers. The filling route
(``_filling``) runs it under skip_data and places each storage from its own memory; it is
taken when the object holds CUDA storages (never a whole host copy), when its dicts, lists
and tuples hold ``_FILL_MIN`` bytes of CPU storages or more (the CRC-32s then run beside the
writes), and for any object under ``_force_filling`` (tests). A dry pickling pass decides;
it runs only where the route could differ. Where torch refuses a tensor under skip_data, the
plain route saves the object; a refusal or mismatch met mid-save starts the file again on it.

``_force_filling`` and ``_FILL_MIN`` are read from this module at each save.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

from .._durable import replacing
from . import _filling, _zip
from ._staging import PathArg
from ._writer import DEFAULT_WRITE_BUFFER, Writer

_force_filling = False  # tests: take the filling route (skip_data + filling) for any object

#: Saves whose host storages hold at least this many bytes take the filling route too: torch
#: writes the file with the storages' bytes and their CRC-32s left out, the Writer places each
#: storage (from its own memory, from _filling._IN_PLACE_MIN bytes on), _filling._crc32 computes
#: its CRC-32 on a helper thread while it is written, and _zip._patch_crcs puts the CRCs into
#: the zip. torch computes its CRC-32 on the saving thread before handing a record over: on a
#: device faster than this VM's disk that halved deepio.save's speed (docs/benchmarks.md), and
#: the plain route copies every storage into the staging buffers. Below this size the plain
#: route is cheaper (one pickling pass).
_FILL_MIN = 8 << 20


def _fspath(path: Any, what: str) -> str:
    if hasattr(path, "write") or hasattr(path, "read"):
        raise TypeError(f"deepio.{what}() takes a file name; for a file object use deepio.Writer/Reader with torch")
    p = os.fspath(path)
    if isinstance(p, bytes):
        raise TypeError("path must be a str or os.PathLike[str]")
    return p


def save(
    obj: Any,
    path: PathArg,
    *,
    pickle_protocol: int = 2,
    crc32: bool | None = None,
    buffer_size: int = DEFAULT_WRITE_BUFFER,
    handle: Any = None,
) -> None:
    """Saves ``obj`` as ``torch.save(obj, path)`` does (torch's zip format; plain
    ``torch.load`` reads it), through the engine, durably: the file is written under a
    temporary name in the same folder, flushed to stable storage, renamed over ``path`` and
    the folder flushed. On any error (ENOSPC, EFBIG, an exception while pickling) ``path``
    keeps its old contents (or stays absent) and the temporary file is removed.

    torch's serializer pickles the object and hands each tensor storage's own memory to
    ``Writer.write()`` (no pickled copy); the Writer stages it in page-locked memory and writes
    aligned direct I/O. When ``obj`` holds CUDA storages, torch writes the file with every
    storage's bytes left out (``torch.serialization.skip_data``) and the Writer puts each storage
    in its place as torch passes it: CPU storages through the staging buffers, CUDA storages
    through the engine's GPU path (pinned staging slots, device-to-host copies overlapped with
    the disk), never a whole host copy; records of CUDA storages carry no CRC-32 (as
    ``crc32=False``).
    torch refuses some tensors under skip_data (quantized, nested, xla/maia/mtia): an object
    holding one is saved on the plain route (torch copies CUDA storages to the host, as
    ``torch.save`` does), and a refusal met only mid-save starts the file again on that route.

    ``crc32``: whether the zip records carry their CRC-32. ``None`` follows torch
    (``torch.serialization.get_crc32_options()``, True by default); ``False`` saves the CPU
    time of computing it (most of a save's CPU): ``torch.load`` does not check it, but zip
    tools reading the file will report bad CRCs. A save whose dicts, lists and tuples hold
    8 MiB of CPU tensors or more takes the filling route too: each storage's CRC-32 (where
    wanted) is computed on a helper thread while it is written and put into the zip afterwards
    (torch computes its CRCs on the saving thread, which bounds a save on a fast device), each
    storage of 4 MiB or more is written from its own memory (by direct I/O straight from it
    where its address suits the device), and the records start on page boundaries (unless
    the padding would cost more than 1/64 of the bytes), as the file's ``.storage_alignment``
    says. The tensors must not change until the save returns.
    """

    final = _fspath(path, "save")
    with replacing(final) as tmp:
        # Opened before anything is pickled: a file that cannot be created fails first.
        filler = _filling.FillingWriter(tmp, buffer_size=buffer_size, handle=handle, durable=False)
        w: Writer = filler  # replacing() fsyncs
        try:
            want_crc = _crc_wanted(crc32)
            large = _large_host_tensors(obj, _FILL_MIN)
            # The dry pass finds the storages; None: the object holds a tensor torch refuses to
            # write under skip_data. CUDA storages can exist only once torch initialized CUDA, and
            # host storages matter only for a large save: no dry pass else (the object is
            # pickled once).
            look = _force_filling or large or _cuda_initialized()
            found = _filling._storages(obj, pickle_protocol) if look else ([], False)
            crcs: dict[int, tuple[int, int]] | None = None
            if found is not None and _takes_filling_route(found[0], large):
                try:
                    crcs = _filling._save_filling(obj, filler, pickle_protocol, found, crc=want_crc)
                except Exception as e:
                    if not _filling._starts_again(e, filler):
                        raise
                    # Start again on the plain route, in a fresh Writer on the same, truncated
                    # temporary file.
                    w.discard()
                    w = Writer(tmp, buffer_size=buffer_size, handle=handle, durable=False)
            if crcs is None:
                _zip._torch_zip(obj, w, pickle, pickle_protocol, want_crc)
            w.close()
            if crcs:
                _zip._patch_crcs(tmp, crcs)
            _keep_mode(final, tmp)
        except BaseException as e:
            cause = w._error
            w.discard()
            if cause is not None and cause is not e and not isinstance(cause, _filling._FillMismatch):
                # torch's writer goes on after write() raised and fails on its own
                # ("unexpected pos"): the Writer's error is the one to report.
                raise cause from None
            raise


def _keep_mode(final: str, tmp: str) -> None:
    """The new file gets the permission bits of the file it replaces (torch.save, writing in
    place, keeps them): a private checkpoint stays private."""
    try:
        mode = os.stat(final).st_mode & 0o7777
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)


def _crc_wanted(crc32: bool | None) -> bool:
    if crc32 is not None:
        return bool(crc32)
    get = getattr(sys.modules["torch"].serialization, "get_crc32_options", None)
    return True if get is None else bool(get())


def _large_host_tensors(obj: Any, at_least: int) -> bool:
    """Whether the containers of ``obj`` (dicts, lists, tuples, four levels deep: a state dict,
    an optimizer's, a training checkpoint of both) hold CPU tensors whose storages add up to
    ``at_least`` bytes. A cheap look, without pickling, that decides whether a save is worth a
    dry pickling pass; objects that hide their tensors (a pickled module) are not looked into."""
    torch = sys.modules["torch"]
    seen: set[int] = set()
    total, todo, budget = 0, [(obj, 0)], 100_000
    while todo and budget > 0:
        o, depth = todo.pop()
        budget -= 1
        if isinstance(o, torch.Tensor):
            if o.device.type != "cpu" or o.is_sparse or o.is_quantized or o.is_nested:
                continue
            try:
                st = o.untyped_storage()
                key, n = st.data_ptr(), st.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
            if key not in seen:
                seen.add(key)
                total += n
                if total >= at_least:
                    return True
        elif depth < 4 and isinstance(o, dict):
            todo.extend((v, depth + 1) for v in o.values())
        elif depth < 4 and isinstance(o, (list, tuple)):
            todo.extend((v, depth + 1) for v in o)
    return False


def _takes_filling_route(storages: list[Any], large: bool) -> bool:
    if not hasattr(sys.modules["torch"].serialization, "skip_data"):
        return False  # torch before 2.5: the plain route (CUDA storages copied to the host)
    if _force_filling or any(st.device.type == "cuda" for st in storages):
        return True
    return large and sum(st.nbytes() for st in storages if st.device.type == "cpu") >= _FILL_MIN


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return True  # cannot tell: look at the storages
