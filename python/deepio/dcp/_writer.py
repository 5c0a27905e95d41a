"""``deepio.dcp.FileSystemWriter``: torch.distributed.checkpoint's FileSystemWriter whose data
files are written through deepio's engine and whose ``.metadata`` is put in place durably.

What is torch's and what is deepio's. The class is torch's ``FileSystemWriter`` (planning,
storage prefixes, staging for ``async_save``, ``storage_meta``, ``validate_checkpoint_id``)
with these steps replaced:

- ``write_data``: each data file (``__{rank}_{n}.distcp``, the same files and the same bytes
  torch writes) is written by ``_datafile.write_file`` through the engine instead of a Python
  file object. A writer with stream extensions (``_extensions``) or another
  ``serialization_format`` uses torch's own write path.
- the checkpoint's start (``prepare_local_plan``/``prepare_global_plan``): an existing
  checkpoint is refused with ``FileExistsError`` under ``overwrite=False``. The coordinator
  takes the checkpoint's save lock (``_savelock``: one save of a checkpoint at a time; a
  second one waits, in ``prepare_global_plan``, until the first gave it back) and, under it,
  names the save's files (``_Naming``, in each rank's global plan; ``_owner``): torch's names
  in the main path for a first save; under ``overwrite=True`` over an existing checkpoint,
  new names in a folder of the save's own there (``save.<id>/``), so the old checkpoint stays
  whole until the new ``.metadata`` replaces its own; in each extra folder, always a folder of
  the save's own (``<name of path>.<id>/``, its ``owner`` file first). Every file not at
  torch's names ends with the save's owner mark, which the reader checks. Each save has an id
  of its own, drawn in ``set_up_storage_writer`` (also where a writer saves again without
  ``reset``), so a save never writes over the files of the checkpoint in place.
- ``finish``: ``.metadata`` (torch's pickle of torch's ``Metadata``) is written last, under a
  temporary name, flushed, renamed into place and the folder flushed (``deepio._durable``,
  the same steps as ``deepio.save``); the folder is flushed before the rename too, so the
  data files' names are on disk before the metadata that points at them. Without
  ``sync_files`` only the rename is kept (no flushes, as torch). Then the files no save needs
  are removed on this host (``_cleanup``: the old ``.metadata``'s and those of saves that never
  finished, never one the new ``.metadata`` names), and the save lock is given back. Every
  other rank removes such files in its own extra folders at the start of its next
  ``write_data`` (its host's node-local folders included); without collectives each rank is
  its own coordinator and removes its own files in ``finish``.

One save through one writer at a time: a second ``dcp.save`` with the same writer object (an
``async_save`` not awaited) waits in ``reset``/``set_up_storage_writer`` until the first is
over (``_savelock``).

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
import os
import pickle
import queue
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from .._durable import fsync_path, replacing
from . import _datafile, _owner, _savelock
from . import _torchapi as T
from ._cleanup import make_folder, make_save_folder, named_files, remove_stale
from ._common import overlapping_order, side_by_side


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


@dataclasses.dataclass
class _Naming(T.StoragePrefix):
    """A rank's plan's names for one save (the coordinator's, in its global plan): torch's
    prefix (``__{rank}_``), the save's id and the folder of its files in the main path
    (``_owner.main_dir``; empty: torch's names at the top of the main path)."""

    save_id: str = ""
    main_dir: str = ""


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
    torch's ``_extensions`` or another ``serialization_format``.

    Two saves of one ``path`` (threads, processes, an ``async_save`` not awaited) run one after
    the other, the second waiting for the first's lock (``_savelock``); so do two saves through
    one writer object."""

    save_id: str  # torch's: the id of the save under way (StorageMeta.save_id)

    def __init__(self, path: Any, *args: Any, extra_paths: Sequence[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.extra_paths: list[str] = _check_extra_paths(path, extra_paths)
        if self.extra_paths and not self._deepio_path():
            raise ValueError(
                "deepio.dcp: extra_paths needs deepio's write path: no _extensions and serialization_format TORCH_SAVE"
            )
        self._coordinator = True
        self._ranks = 0  # the ranks of the save under way (the coordinator's global plan)
        self._save_lock: _savelock.SaveLock | None = None

    def __getstate__(self) -> dict[str, Any]:
        # torch's PROCESS async_save pickles the writer to a background process: what this
        # process holds (a save's lock and turn) stays here.
        state = dict(self.__dict__)
        state["_save_lock"] = None
        state.pop("_deepio_turn", None)
        return state

    def reset(self, checkpoint_id: Any = None) -> None:
        # A save under way through this writer keeps its path and id: wait for it to end
        # (torch's save() calls reset first; a reset outside a save waits without a turn).
        _savelock.take_turn(self, hold=_savelock.in_dcp_save())
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

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        _savelock.take_turn(self)  # one save through this writer at a time (_savelock)
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self._coordinator = bool(is_coordinator)
        # A save id of this save's own, also for a writer saving again without reset() (torch's
        # save() resets only when given a checkpoint_id) or a copy of one pickled for each save
        # (async_save's PROCESS checkpointer): its files never take the names of the checkpoint
        # in place (_owner.main_dir). torch's finish records it (storage_meta()).
        self.save_id = str(uuid.uuid4())

    def _deepio_path(self) -> bool:
        return not self.transforms.extensions and self.serialization_format == T.TORCH_SAVE

    def _meta_path(self) -> str:
        if not self.use_collectives and self.rank is not None:
            return os.fspath(self._get_metadata_path(self.rank))
        return os.fspath(self._get_metadata_path())

    def _lock_file(self) -> str:
        """The lock file of this save (``_savelock``): one per checkpoint, one per rank's
        ``.metadata`` without collectives."""
        main = os.path.abspath(os.fspath(self.path))
        if not self.use_collectives and self.rank is not None:
            return os.path.join(main, f".deepio-save-{self.rank}.lock")
        return os.path.join(main, ".deepio-save.lock")

    def _refuse_existing(self) -> None:
        raise FileExistsError(
            errno.EEXIST,
            f"deepio.dcp: {os.fspath(self.path)!r} holds a checkpoint already (its .metadata exists) "
            "and the writer was made with overwrite=False",
            os.fspath(self.path),
        )

    def _give_back(self) -> None:
        held, self._save_lock = self._save_lock, None
        if held is not None:
            held.release()

    def prepare_local_plan(self, plan: Any) -> Any:
        self.fs.mkdir(self.path)
        if self._metadata_exists() and not self.overwrite:
            self._refuse_existing()
        for folder in self.extra_paths:
            make_folder(folder, self.sync_files)
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=T.StoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        # The coordinator (each rank without collectives), after every rank's local plan and
        # before any rank writes: this save's lock on the checkpoint, held until finish (a save
        # of it under way is waited for), then the names of this save (_owner), the same for
        # every rank, decided under it.
        self._save_lock = _savelock.lock(self._lock_file())
        try:
            over = os.path.exists(self._meta_path())
            if over and not self.overwrite:
                self._refuse_existing()  # a save that finished while this one waited
            plans = super().prepare_global_plan(plans)
            self._ranks = len(plans)
        except BaseException:
            self._give_back()
            raise
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
        over = os.path.exists(self._meta_path())
        return _Naming(storage.prefix, self.save_id, _owner.main_dir(self.save_id) if over else "")

    def _remove_before_writing(self, naming: _Naming) -> None:
        """A rank other than the coordinator, with collectives, while the coordinator holds the
        save lock: the files of this checkpoint in its extra folders (on its host) that neither
        the ``.metadata`` in place nor this save names (``_cleanup``)."""
        main = os.path.abspath(os.fspath(self.path))
        live = named_files(self._meta_path(), main)
        if live is not None:  # an unreadable .metadata: nothing is known unused
            remove_stale(main, self.extra_paths, live, current=naming.save_id, in_main=False)

    def write_data(self, plan: Any, planner: Any) -> Any:
        last = self.use_collectives and not self._coordinator  # this rank's last hook of the save
        try:
            if last and self.extra_paths and isinstance(plan.storage_data, _Naming):
                self._remove_before_writing(plan.storage_data)
            fut = self._write_files(plan, planner) if self._deepio_path() else super().write_data(plan, planner)
        except BaseException:
            # This rank's part of the save is over, and finish will not come. Where no other
            # rank writes for this save, the save is over: its lock goes back now (with
            # collectives and other ranks, once torch's save has returned: _savelock).
            if not self.use_collectives or self._ranks == 1:
                self._give_back()
            _savelock.end_turn(self)
            raise
        if last:
            _savelock.end_turn(self)
        return fut

    def _write_files(self, plan: Any, planner: Any) -> Any:
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
            make_folder(os.path.join(main, naming.main_dir), self.sync_files)
            used.add(os.path.join(main, naming.main_dir))
        if self.extra_paths:
            files = [(key, bucket) for key, bucket in files if bucket]  # no empty files on the drives
            sizes = [_datafile.estimate_bytes(bucket) for _, bucket in files]
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
                        make_save_folder(folder, mark, self.sync_files)
                        used.add(folder)
                    full = os.path.join(folder, key)
                    jobs.put((full, full, bucket, where[n]))
        else:
            for key, bucket in files:
                jobs.put((*in_main(key), bucket, 0))
        results: list[Any] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        by_size = overlapping_order(self)

        def work() -> None:
            while not errors:
                try:
                    path, key, items, _drive = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    own = mark if os.path.isabs(key) or naming.main_dir else b""
                    done = _datafile.write_file(path, key, items, planner, self.sync_files, by_size, None, mark=own)
                except BaseException as e:
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    results.extend(done)

        side_by_side([work] * threads, "deepio.dcp")
        if errors:
            raise errors[0]
        if self.sync_files:
            for folder in sorted(used):  # the files' names on each drive (finish flushes the main path)
                fsync_path(folder)
        fut: torch.futures.Future[list[Any]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        try:
            self._commit(metadata, results)
        finally:
            # Every rank's writes are over (torch calls finish after gathering them): the
            # next save of this checkpoint, and through this writer, may start.
            self._give_back()
            _savelock.end_turn(self)

    def _commit(self, metadata: Any, results: list[list[Any]]) -> None:
        metadata.version = T.CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        final = self._meta_path()
        main = os.path.abspath(os.fspath(self.path))
        replaced = named_files(final, main) or set()  # under the save lock: what the switch replaces
        folder = os.path.dirname(os.path.abspath(final))
        if self.sync_files:
            fsync_path(folder)  # the data files' names first: the metadata points at them
        with replacing(final, durable=self.sync_files) as tmp, open(tmp, "wb") as f:
            pickle.dump(metadata, f)
        # The new checkpoint is in place: only now do the files no save needs go (a save that
        # fails or is killed leaves the old checkpoint whole), never one the new metadata
        # names; without collectives, only this rank's own (_cleanup).
        keep = {os.path.join(main, info.relative_path) for info in storage_md.values()}
        prefix = "" if self.use_collectives or self.rank is None else f"__{self.rank}_"
        remove_stale(main, self.extra_paths, keep, prefix=prefix, also=replaced)
