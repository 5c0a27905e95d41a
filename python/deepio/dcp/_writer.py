"""``deepio.dcp.FileSystemWriter``: torch.distributed.checkpoint's FileSystemWriter whose data
files are written through deepio's engine and whose ``.metadata`` is put in place durably.

What is torch's and what is deepio's. The class is torch's ``FileSystemWriter`` (planning,
storage prefixes, staging for ``async_save``, ``storage_meta``, ``validate_checkpoint_id``)
with three steps replaced:

- ``write_data``: each data file (``__{rank}_{n}.distcp``, the same files and the same bytes
  torch writes) is a ``FillingWriter`` (deepio.save's ``deepio.Writer``: page-locked staging
  buffers, aligned direct I/O through the process's default engine, ``fsync`` when
  ``sync_files``) instead of a Python file object; a small file gets staging the size of its
  estimated bytes (``_staging_for``).
  Each item's bytes are what torch's own writer puts there, in its order (bytes items first,
  then the tensors as planned, or smallest first where torch's writer would take them
  through its overlapping loader: one thread and an accelerator, ``_overlapping_order``).
  Tensors are made contiguous CPU tensors first exactly as torch's loader does
  (``detach().cpu()``, cloned where the storage holds more than the view), except CUDA
  tensors of ``_FILL_MIN`` bytes or more: for those torch's record is pickled from an
  unfilled host stand-in of the same sizes and strides (``_device_twin``), and the Writer
  fills it from device memory through a small ring of page-locked buffers, computing the
  CRC-32 from the same host bytes (``FillingWriter._write_staged``): no whole host copy of
  the tensor. A non-dense CUDA tensor is cloned on its device first (torch's loader makes it
  dense on the host). A tensor of ``_FILL_MIN`` bytes or more takes deepio.save's
  filling route (``_write_filled``; checkpoint/_filling.py): ``torch.save`` under skip_data
  writes its zip, with torch's record alignment and CRC option, from the item's offset without
  the storage's bytes; the Writer places the storage where torch seeks over it (from the
  tensor's own memory by direct I/O where its address suits the device), helper threads
  compute its CRC-32, and once every item of the file is written ``_zip._patch_crcs`` puts each
  item's CRC-32s (and the serialization id torch derives from them) into that item's zip,
  before the file is closed and fsynced: the bytes torch's writer writes. Where the route is
  refused (a tensor torch refuses under skip_data) or starts again (``_FillMismatch``), the
  item is written from its start as a smaller tensor is: ``torch.save`` into the Writer
  (torch's zip record and its CRC-32, on the writing thread); the file is cut at its end. A
  bytes item (``io.BytesIO`` from the planner: non-tensor objects pickled by torch) is written
  as it is. A write error on either route is the Writer's, naming the file. A writer with
  stream extensions (``_extensions``) or another ``serialization_format`` uses torch's own
  write path.
- the checkpoint's start (``prepare_local_plan``/``prepare_global_plan``): an existing
  checkpoint is refused with ``FileExistsError`` under ``overwrite=False``. The coordinator
  names the save's files (``_Naming``, in each rank's global plan; ``_owner``): torch's names
  in the main path for a first save; under ``overwrite=True`` over an existing checkpoint,
  new names in a folder of the save's own there (``save.<id>/``), so the old checkpoint stays
  whole until the new ``.metadata`` replaces its own; in each extra folder, always a folder of
  the save's own (``<name of path>.<id>/``, its ``owner`` file first). Every file not at
  torch's names ends with the save's owner mark, which the reader checks.
- ``finish``: ``.metadata`` (torch's pickle of torch's ``Metadata``) is written last, under a
  temporary name, flushed, renamed into place and the folder flushed (``deepio._durable``,
  the same steps as ``deepio.save``); the folder is flushed before the rename too, so the
  data files' names are on disk before the metadata that points at them. Without
  ``sync_files`` only the rename is kept (no flushes, as torch). Then the files the old
  ``.metadata`` named, and those of saves of this checkpoint that never finished, are removed
  (``_remove_unused``).

Several drives without RAID (``extra_paths``, deepio's own argument): each rank's data files
are spread over the main path and the extra folders. With ``single_file_per_rank`` a rank's
items are split by size (torch's split) into max(``thread_count``, folders) files, empty ones
dropped; the files go largest first each to the folder with the fewest bytes so far, ties to
the folders from the rank's own (``assign_folders``), and are written by as many threads as
folders (at least), all through the process's default engine (its workers serve every drive
at once: a lane per device, docs/engine.md).
A file in an extra folder is recorded in the metadata by its absolute
path (torch's ``StorageInfo.relative_path``: joined to the main path, an absolute path stands
alone, so torch's own reader loads such a checkpoint too while the folders stay put); files
in the main path by their name, as always: without extra folders nothing changes. The extra
folders are made where missing (their parent flushed under ``sync_files``), may be shared by
checkpoints (each save's files are in a folder of its own there), and are flushed by each rank
that wrote there before its ``write_data`` returns, so before the coordinator puts
``.metadata`` in place. A writer's ``reset`` to another ``checkpoint_id`` raises
``ValueError`` (make a writer per checkpoint). One tensor is not split across folders.

Threads: ``thread_count`` threads each write their own files (torch's split of the items
by size); the engine is shared and thread-safe. The first failure of any thread is raised by
``write_data`` after all threads stopped.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import pickle
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, cast

import torch

from .._durable import fsync_path, replacing
from ..checkpoint import DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS, Writer, _filling, _zip
from ..checkpoint._save import _crc_wanted
from . import _owner
from . import _torchapi as T


def _contiguous_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """What torch's _SerialCpuLoader hands its writer: detached, on the host, and owning only
    its own bytes (torch.save writes a view's whole storage)."""
    t = tensor.detach().cpu()
    if t.untyped_storage().size() != t.numel() * t.element_size():
        t = t.clone()
    return t


#: The buffer that gathers torch.save's small writes of one item (see _write_file): 2,000 items
#: of 1 KiB took 2.7x less CPU through it (0.49 against 1.29 s on the development VM).
_COALESCE = 64 << 10


class _NoClose(io.RawIOBase):
    """The Writer as torch.save sees it: writes go through, close() only flushes (torch.save
    closes the file object it is given; the data file goes on after the item)."""

    def __init__(self, w: Writer) -> None:
        super().__init__()
        self._w = w

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return self._w.write(b)

    def tell(self) -> int:
        return self._w.tell()

    def flush(self) -> None:
        pass  # the Writer keeps staging: nothing must reach the disk before close()


def _nbytes(item: Any) -> int:
    """The bytes of a planned tensor item (torch's ``_item_size``)."""
    return int(item.tensor_data.size.numel()) * item.tensor_data.properties.dtype.itemsize


def _overlapping_order(writer: Any) -> bool:
    """Whether torch's writer would take its tensor items through ``_OverlappingCpuLoader``
    (which hands them over smallest first, stable): one thread, an accelerator, copy-ahead on.
    Its files then hold the tensors in that order, and so do deepio's."""
    backend = getattr(torch, torch._C._get_privateuse1_backend_name(), None)
    accel = torch.cuda.is_available() or bool(backend is not None and backend.is_available())
    return writer.thread_count == 1 and accel and writer.per_thread_copy_ahead > 0


#: Devices whose tensor items of ``_FILL_MIN`` bytes or more are written from device memory
#: through host staging (``_device_twin``; FillingWriter._write_staged) instead of a whole host
#: copy first. Read at each use (tests add "cpu" to run the same route on the host).
_STAGED_DEVICES = frozenset({"cuda"})


def _device_twin(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For a tensor item on a ``_STAGED_DEVICES`` device: (a host stand-in, the device bytes
    of its storage as a flat uint8 tensor). The stand-in is what torch's loader hands its
    writer (``.cpu()``, or ``.to("cpu")``: the same sizes and strides, a storage of its own
    bytes), left unfilled: pickled under skip_data it gives the record torch writes. The
    device bytes are laid out as its storage: the tensor's own span of its storage where its
    strides are the stand-in's (dense; a view's offset kept), else a device clone. None for
    other devices."""
    d = data.detach()
    if d.device.type not in _STAGED_DEVICES:
        return None
    stand = torch.empty_like(d, device="cpu")
    if stand.stride() != d.stride():  # not dense: .cpu() makes it contiguous, as clone() does
        d = d.clone()
        stand = torch.empty_like(d, device="cpu")
    src = torch.empty(0, dtype=torch.uint8, device=d.device)
    src.set_(d.untyped_storage(), d.storage_offset() * d.element_size(), (d.numel() * d.element_size(),), (1,))
    return stand, src


#: torch.save's zip around one tensor's bytes (local headers, data.pkl, directory, padding)
#: is under 2 KiB; a bytes item of unknown size is guessed at this.
_ITEM_OVERHEAD = 4096


def _estimate_bytes(items: list[Any]) -> int:
    """A data file's size as its items' plan says: each tensor's bytes, each bytes item's
    size where the planner knows it, plus ``_ITEM_OVERHEAD`` an item."""
    estimate = 0
    for item in items:
        if item.tensor_data is not None:
            estimate += _nbytes(item)
        elif item.bytes_io_data is not None:
            estimate += int(item.bytes_io_data.nbytes)
        estimate += _ITEM_OVERHEAD
    return estimate


def _staging_for(items: list[Any]) -> tuple[int, int]:
    """The Writer's staging (buffer size, count) for a file of these items: the default for a
    large file, one buffer's worth of the file's estimated size for a small one (staging is
    page-locked memory, made and freed per file: 16 MiB x 4 of it cost 12 ms a file on the
    development VM, which one file per item, of thousands, would pay each time)."""
    estimate = _estimate_bytes(items)
    if estimate >= DEFAULT_WRITE_BUFFER:
        return DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS
    return max(4096, -(-estimate // 4096) * 4096), 2


def assign_folders(sizes: list[int], folders: int, first: int = 0) -> list[int]:
    """Which folder (0 the main path, 1... the extra paths) each of a rank's data files goes
    to: the files largest first, each to the folder with the fewest bytes so far (round robin
    by size); ties go to the folder nearest after ``first`` in order (the rank, modulo the
    folders: ranks of one file each then start on different drives). Returns one folder index
    per size, in the order of ``sizes``. Pure; ``folders`` >= 1."""
    load = [0] * folders
    where = [0] * len(sizes)
    for n in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = min(range(folders), key=lambda f: (load[f], (f - first) % folders))
        where[n] = k
        load[k] += sizes[n]
    return where


#: Tensor items of this many bytes or more take deepio.save's filling route (see the module);
#: smaller ones are serialized by torch.save into the staging buffers (one pickling pass, their
#: copy and CRC-32 cost less than the route's dry pass and thread pool). Read at each use.
_FILL_MIN = 4 << 20


def _write_filled(
    t: torch.Tensor, w: _filling.FillingWriter, crc: bool, pool: ThreadPoolExecutor | None = None
) -> tuple[dict[int, tuple[int, int]] | None, bool]:
    """Writes the contiguous CPU tensor ``t`` at ``w``'s write position as torch.save writes
    it, on deepio.save's filling route (torch's record alignment, so the bytes torch's writer
    writes; the CRC-32s on ``pool``, the file's). Returns ({file offset of a storage record's
    data: (nbytes, CRC-32)} for _zip._patch_crcs, empty without ``crc``; whether an attempt
    started again). The dict is
    None where the route is not taken (a tensor torch refuses under skip_data, a torch
    without skip_data) or started again (_filling._starts_again: ``w`` is back at the item's
    start, and bytes of the attempt may lie past it, for later items or the caller's truncate
    to replace): the caller then writes the item on the plain route. Other errors are
    raised."""
    if not hasattr(torch.serialization, "skip_data"):
        return None, False
    protocol = torch.serialization.DEFAULT_PROTOCOL  # torch.save's default: what torch's writer uses
    found = _filling._storages(t, protocol)
    if found is None:
        return None, False
    offset = w.tell()
    try:
        return _filling._save_filling(t, w, protocol, found, crc=crc, aligned=False, pool=pool), False
    except Exception as e:
        if not _filling._starts_again(e, w):
            raise
    w._rewind(offset)
    return None, True


def _write_file(
    path: str,
    key: str,
    items: list[Any],
    planner: Any,
    durable: bool,
    by_size: bool = False,
    handle: Any = None,
    mark: bytes = b"",
) -> list[Any]:
    """Writes one data file: the bytes items, then the tensors (torch's order: as planned, or
    smallest first with ``by_size``, as torch's overlapping loader hands them over); returns
    the WriteResults with each item's place (torch's _StorageInfo). Tensors of ``_FILL_MIN``
    bytes or more go on the filling route (a ``_STAGED_DEVICES`` tensor as its host
    stand-in's record, filled from device memory through host staging), the others through
    torch.save of their host copy; the CRC-32s of the filled records (computed on one thread
    pool for the file) are put in once every item is written, before the file is closed (and
    flushed to stable storage when ``durable``). ``handle``: the engine (None: the default).
    ``mark``: the owner mark written past the last item (``_owner.mark``; empty: none)."""
    results = []
    size, count = _staging_for(items)
    w = _filling.FillingWriter(path, durable=durable, buffer_size=size, buffers=count, handle=handle)
    crc = _crc_wanted(None)  # torch.save's choice: torch's writer calls it with its defaults
    crcs: dict[int, tuple[int, int]] = {}
    archives: list[tuple[int, int]] = []  # (offset, length) of each filled item's zip
    started_again = False
    pool = ThreadPoolExecutor(_filling._crc_threads(), thread_name_prefix="deepio-crc") if crc else None
    try:
        tensors = [i for i in items if i.type != T.WriteItemType.BYTE_IO]
        ordered = [i for i in items if i.type == T.WriteItemType.BYTE_IO]
        ordered += sorted(tensors, key=_nbytes) if by_size else tensors
        for item in ordered:
            data = planner.resolve_data(item)
            offset = w.tell()
            if item.type == T.WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise TypeError(f"deepio.dcp: bytes item {item.index.fqn!r} resolved to {type(data).__name__}")
                w.write(data.getbuffer())
            else:
                twin = _device_twin(data) if data.nbytes >= _FILL_MIN else None
                t = twin[0] if twin is not None else _contiguous_cpu(data)
                if twin is not None:
                    w._twins[t.untyped_storage()._cdata] = _filling._Staged(twin[1])
                filled, again = (
                    _write_filled(t, w, crc, pool) if t.untyped_storage().nbytes() >= _FILL_MIN else (None, False)
                )
                if twin is not None:
                    w._twins.clear()
                    if filled is None:  # the plain route needs the bytes on the host
                        t = _contiguous_cpu(data)
                started_again = started_again or again
                if filled is not None:
                    crcs.update(filled)
                    archives.append((offset, w.tell() - offset))
                else:
                    # torch.save makes some 30 small writes an item (zip headers, the pickle)
                    # around the one of the tensor's bytes: a small buffer in front of the Writer
                    # turns them into one call; the tensor's bytes still go straight to the Writer.
                    out = io.BufferedWriter(_NoClose(w), _COALESCE)
                    torch.save(t, cast(IO[bytes], out))
                    out.flush()
            length = w.tell() - offset
            place = T.StorageInfo(key, offset, length)
            results.append(T.WriteResult(index=item.index, size_in_bytes=length, storage_data=place))
        if mark:
            w.write(mark)  # past every item: no reader's range reaches it
        if started_again:
            w.truncate()  # what a filling attempt left past the last item
        if crcs:
            w.flush()  # every byte in the file: the CRC-32s go into the zips there
            _zip._patch_crcs(path, crcs, archives)
        w.close()  # flushes, and fsyncs when durable: raises the first write error
    except BaseException as e:
        cause = w._error
        w.discard()
        if isinstance(cause, OSError) and cause is not e:
            # torch's writer goes on after write() or seek() raised and fails on its own
            # ("unexpected pos"): the Writer's error, naming the file, is the one to report.
            raise cause from None
        raise
    finally:
        if pool is not None:  # threads start with the first filled item, if any
            pool.shutdown(wait=True)
    return results


def _side_by_side(tasks: list[Callable[[], None]], name: str) -> None:
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


def _check_extra_paths(path: Any, extra_paths: Sequence[Any] | None) -> list[str]:
    """The extra folders as absolute paths (what the metadata records), in order; refuses a
    lone string (a folder's name is not a list of folders), the main path and duplicates."""
    if extra_paths is None:
        return []
    if isinstance(extra_paths, (str, bytes, os.PathLike)):
        raise TypeError("deepio.dcp: extra_paths is a list of folders, not one folder")
    main = os.path.abspath(os.fspath(path))
    out: list[str] = []
    for p in extra_paths:
        folder = os.path.abspath(os.fsdecode(p))
        if folder == main:
            raise ValueError(f"deepio.dcp: extra path {folder!r} is the checkpoint's main path")
        if folder in out:
            raise ValueError(f"deepio.dcp: extra path {folder!r} given twice")
        out.append(folder)
    return out


def _data_files_in(folder: str) -> list[str]:
    """The DCP data files (``*.distcp``) in ``folder``, sorted; none where it does not exist."""
    try:
        return sorted(n for n in os.listdir(folder) if n.endswith(T.DATA_SUFFIX))
    except FileNotFoundError:
        return []


def _make_save_folder(folder: str, mark: bytes, durable: bool) -> None:
    """Makes a save's folder in an extra folder with its ``_owner.OWNER_FILE`` (the save's
    owner mark), before any data file goes there: what the next save of the same checkpoint
    removes, should this one never finish, is known by it."""
    _make_folder(folder, durable)
    path = os.path.join(folder, _owner.OWNER_FILE)
    if not os.path.exists(path):  # each rank of the save makes it alike
        with replacing(path, durable=durable) as tmp, open(tmp, "wb") as f:
            f.write(mark)


def _make_folder(folder: str, durable: bool) -> None:
    """Makes ``folder`` (and its parents); where it made it and ``durable``, flushes its
    parent, so that the folder's name outlives a crash as its files do."""
    if os.path.isdir(folder):
        return
    os.makedirs(folder, exist_ok=True)
    if durable:
        fsync_path(os.path.dirname(folder) or ".")


@dataclasses.dataclass
class _Naming(T.StoragePrefix):
    """A rank's plan's names for one save (the coordinator's, in its global plan): torch's
    prefix (``__{rank}_``), the save's id and the folder of its files in the main path
    (``_owner.main_dir``; empty: torch's names at the top of the main path)."""

    save_id: str = ""
    main_dir: str = ""


def _owned_by(folder: str, main: str) -> bool:
    """Whether the save folder ``folder`` (in an extra folder) is one of the checkpoint at
    ``main``: its ``_owner.OWNER_FILE`` names it."""
    try:
        with open(os.path.join(folder, _owner.OWNER_FILE), "rb") as f:
            found = _owner.owner(f.read(_owner.MAX_MARK))
    except OSError:
        return False
    return found is not None and found.checkpoint == main


def _remove_unused(main: str, extra: list[str], replaced: set[str], keep: set[str], sweep: bool) -> None:
    """After a save's ``.metadata`` is in place: removes the files of ``replaced`` (the ones the
    previous ``.metadata`` named) that ``keep`` (the new one's) does not name and, with
    ``sweep`` (one ``.metadata`` for the whole checkpoint), the data files of saves of this
    checkpoint that never finished: in ``main`` and its save folders, those it does not name;
    in the ``extra`` folders, those in folders of this checkpoint's naming whose owner mark
    names ``main`` (extra folders may be shared: another checkpoint's files stay). Then the
    folders of this module's naming left empty. Best effort: the new checkpoint is whole
    already, and a file that cannot be removed is only space."""
    gone = sorted(replaced - keep)
    if sweep:
        try:
            names = os.listdir(main)
        except OSError:
            names = []
        for name in names:
            full = os.path.join(main, name)
            if name.endswith(T.DATA_SUFFIX) and full not in keep:
                gone.append(full)
            elif _owner.is_save_dir(name):
                gone += [os.path.join(full, n) for n in _data_files_in(full) if os.path.join(full, n) not in keep]
        mine = _owner.extra_dir(main, "")[: -len(_owner.short(""))]  # "<name of main>."
        for folder in extra:
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                full = os.path.join(folder, name)
                if name.startswith(mine) and _owner.is_extra_dir(name) and _owned_by(full, main):
                    gone += [p for p in (os.path.join(full, n) for n in _data_files_in(full)) if p not in keep]
    for path in gone:
        try:
            os.unlink(path)
        except OSError:
            pass
    for folder in sorted({os.path.dirname(p) for p in gone}):
        if folder != main and folder not in extra and not _data_files_in(folder):
            try:
                os.unlink(os.path.join(folder, _owner.OWNER_FILE))
            except OSError:
                pass
            try:
                os.rmdir(folder)  # only where empty
            except OSError:
                pass


class FileSystemWriter(T.FileSystemWriter):
    """``torch.distributed.checkpoint.FileSystemWriter`` through deepio's engine (see the
    module). Same arguments as torch's: ``path``, ``single_file_per_rank=True``,
    ``sync_files=True``, ``thread_count=1``, ``per_thread_copy_ahead=10_000_000`` (kept for
    torch's staging; deepio copies device tensors to the host one at a time),
    ``cache_staged_state_dict=False``, ``overwrite=True``, and torch's experimental
    ``_extensions``/``serialization_format`` (which take torch's own write path). Use it as
    torch's: ``dcp.save(state_dict, storage_writer=deepio.dcp.FileSystemWriter(path))``.

    deepio's own argument, keyword only: ``extra_paths``, folders (one per drive, which
    checkpoints may share: each save's files go to a folder of its own there) over which each rank's data files are
    spread with ``path`` (``assign_folders``); ``.metadata`` stays in ``path`` and records
    where each file went, so ``deepio.dcp.FileSystemReader(path)`` finds them (see the
    module). Raises ``ValueError`` for an extra path that is ``path`` or given twice, and with
    torch's ``_extensions`` or another ``serialization_format``."""

    def __init__(self, path: Any, *args: Any, extra_paths: Sequence[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.extra_paths: list[str] = _check_extra_paths(path, extra_paths)
        if self.extra_paths and not self._deepio_path():
            raise ValueError(
                "deepio.dcp: extra_paths needs deepio's write path: no _extensions and serialization_format TORCH_SAVE"
            )

    def reset(self, checkpoint_id: Any = None) -> None:
        if (
            checkpoint_id
            and self.extra_paths
            and os.path.abspath(os.fspath(checkpoint_id)) != os.path.abspath(os.fspath(self.path))
        ):
            # The extra folders belong to one checkpoint: another checkpoint_id with the same
            # ones would write over the files the earlier checkpoint's metadata points at.
            raise ValueError(
                f"deepio.dcp: this writer's extra_paths {self.extra_paths} belong to the checkpoint at "
                f"{os.fspath(self.path)!r}; for checkpoint_id {os.fspath(checkpoint_id)!r} make a writer "
                "with that path and its own extra folders"
            )
        super().reset(checkpoint_id)

    def _deepio_path(self) -> bool:
        return not self.transforms.extensions and self.serialization_format == T.TORCH_SAVE

    def _meta_path(self) -> str:
        if not self.use_collectives and self.rank is not None:
            return os.fspath(self._get_metadata_path(self.rank))
        return os.fspath(self._get_metadata_path())

    def _old_files(self) -> set[str]:
        """The data files (absolute paths) the checkpoint in place (its ``.metadata``)
        points at; empty where there is none or it cannot be read."""
        try:
            with open(self._meta_path(), "rb") as f:
                old = pickle.load(f)
            infos = old.storage_data.values()
        except Exception:  # no checkpoint, or not one this writer can read: nothing to remove
            return set()
        main = os.path.abspath(os.fspath(self.path))
        return {os.path.join(main, info.relative_path) for info in infos}

    def prepare_local_plan(self, plan: Any) -> Any:
        self.fs.mkdir(self.path)
        if self._metadata_exists() and not self.overwrite:
            raise FileExistsError(
                errno.EEXIST,
                f"deepio.dcp: {os.fspath(self.path)!r} holds a checkpoint already (its .metadata exists) "
                "and the writer was made with overwrite=False",
                os.fspath(self.path),
            )
        for folder in self.extra_paths:
            _make_folder(folder, self.sync_files)
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=T.StoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        # The coordinator, after every rank's local plan and before any rank writes data:
        # the names of this save (_owner), the same for every rank.
        self._replaced = self._old_files()
        over = self._metadata_exists()
        plans = super().prepare_global_plan(plans)
        return [
            dataclasses.replace(
                p,
                storage_data=_Naming(
                    p.storage_data.prefix, self.save_id, _owner.main_dir(self.save_id) if over else ""
                ),
            )
            if isinstance(p.storage_data, T.StoragePrefix)
            else p
            for p in plans
        ]

    def _naming(self, plan: Any) -> _Naming:
        storage = plan.storage_data
        if isinstance(storage, _Naming):
            return storage
        # A plan the coordinator did not name (not through prepare_global_plan): this rank's own.
        over = self._metadata_exists()
        return _Naming(storage.prefix, self.save_id, _owner.main_dir(self.save_id) if over else "")

    def write_data(self, plan: Any, planner: Any) -> Any:
        if not self._deepio_path():
            return super().write_data(plan, planner)
        naming = self._naming(plan)
        prefix = naming.prefix
        main = os.fspath(self.path)
        mark = _owner.mark(main, naming.save_id)

        def in_main(name: str) -> tuple[str, str]:
            if not naming.main_dir:  # torch's names: torch's bytes, no mark
                return os.fspath(self.fs.concat_path(self.path, name)), name
            key = f"{naming.main_dir}/{name}"
            return os.path.join(main, naming.main_dir, name), key

        folders = len(self.extra_paths) + 1
        threads = max(1, self.thread_count)
        if self.single_file_per_rank:
            # Spread over drives: at least one file a folder, written side by side.
            buckets = T.split_by_size_and_type(max(threads, folders), plan.items)
        else:
            buckets = [[item] for item in plan.items]
        files = [(f"{prefix}{n}{T.DATA_SUFFIX}", bucket) for n, bucket in enumerate(buckets)]
        jobs: queue.Queue[tuple[str, str, list[Any], int]] = queue.Queue()  # (path, key, items, folder)
        used: set[str] = set()  # folders this rank made files in, outside the main path's top
        if naming.main_dir:
            _make_folder(os.path.join(main, naming.main_dir), self.sync_files)
            used.add(os.path.join(main, naming.main_dir))
        if self.extra_paths:
            files = [(key, bucket) for key, bucket in files if bucket]  # no empty files on the drives
            sizes = [_estimate_bytes(bucket) for _, bucket in files]
            where = assign_folders(sizes, folders, (self.rank or 0) % folders)
            threads = max(threads, min(folders, len(files)))
            for n in sorted(range(len(files)), key=lambda i: -sizes[i]):  # the largest start first
                key, bucket = files[n]
                if where[n] == 0:
                    jobs.put((*in_main(key), bucket, 0))
                else:
                    # The metadata records the file by its absolute path: torch's
                    # StorageInfo.relative_path, which both readers join to the main path
                    # (an absolute one stands alone: pathlib's and os.path's rule). The
                    # file is in a folder of this save's own (_owner.extra_dir).
                    folder = os.path.join(self.extra_paths[where[n] - 1], _owner.extra_dir(main, naming.save_id))
                    if folder not in used:
                        _make_save_folder(folder, mark, self.sync_files)
                        used.add(folder)
                    full = os.path.join(folder, key)
                    jobs.put((full, full, bucket, where[n]))
        else:
            for key, bucket in files:
                jobs.put((*in_main(key), bucket, 0))
        results: list[Any] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        by_size = _overlapping_order(self)

        def work() -> None:
            while not errors:
                try:
                    path, key, items, _drive = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    own = mark if os.path.isabs(key) or naming.main_dir else b""
                    done = _write_file(path, key, items, planner, self.sync_files, by_size, None, mark=own)
                except BaseException as e:
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    results.extend(done)

        _side_by_side([work] * threads, "deepio.dcp")
        if errors:
            raise errors[0]
        if self.sync_files:
            for folder in sorted(used):  # the files' names on each drive (finish flushes the main path)
                fsync_path(folder)
        fut: torch.futures.Future[list[Any]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        metadata.version = T.CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        final = self._meta_path()
        folder = os.path.dirname(os.path.abspath(final))
        if self.sync_files:
            fsync_path(folder)  # the data files' names first: the metadata points at them
        with replacing(final, durable=self.sync_files) as tmp, open(tmp, "wb") as f:
            pickle.dump(metadata, f)
        # The new checkpoint is in place: the old one's files go (never before: a save that
        # fails or is killed leaves the old checkpoint whole), and leftovers of saves that
        # never finished in the main path (extra folders may be shared: only files the old
        # metadata named are removed there).
        main = os.path.abspath(os.fspath(self.path))
        keep = {os.path.join(main, info.relative_path) for info in storage_md.values()}
        _remove_unused(main, self.extra_paths, getattr(self, "_replaced", set()), keep, sweep=self.use_collectives)
