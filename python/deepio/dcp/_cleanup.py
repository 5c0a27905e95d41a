"""The folders a save of a DCP checkpoint makes, and the removal of the files no save needs.

Which files are whose (``_owner`` names them): a checkpoint at MAIN owns, on each host, the
``*.distcp`` files at the top of MAIN (torch's names, a first save's), those in MAIN's save
folders (``save.<16 hex>/``) and those in the folders of its saves in each extra folder
(``<name of MAIN>.<16 hex>/``, whose ``owner`` file names MAIN: an extra folder may be shared
with other checkpoints, whose folders stay). A file is *live* while the ``.metadata`` in place
names it, or while it belongs to the save under way (its folders carry that save's id).

``remove_stale`` removes what is neither, on the host it runs on; the writer calls it only
while it holds the checkpoint's save lock (``_savelock``: no other save of the checkpoint is
under way, and ``.metadata`` does not change meanwhile):

- the coordinator (each rank without collectives), once its ``.metadata`` is in place: in MAIN
  and in its extra folders, every file of this checkpoint the new ``.metadata`` does not name,
  and the files the replaced ``.metadata`` named (where an extra folder was dropped since);
- every other rank (with collectives), at the start of its ``write_data``: in its own extra
  folders (node-local ones included, which the coordinator's host cannot see), every file of
  this checkpoint that neither the ``.metadata`` in place nor the save under way names. A host
  other than the coordinator's thus keeps the files of the checkpoint before the latest until
  the next save: the room a save needs (the checkpoint in place and the new one) is the same.

Without collectives each rank is a save of its own (its own ``__{rank}.metadata``, save id and
folders): ``prefix`` (``__{rank}_``) keeps it to its own files at the top of MAIN. Removal is
best effort: a file that cannot be removed is space, never a broken checkpoint. Folders this
module's naming made are removed once they hold no data file.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable

from .._durable import fsync_path, replacing
from . import _owner
from . import _torchapi as T


def data_files_in(folder: str) -> list[str]:
    """The DCP data files (``*.distcp``) in ``folder``, sorted; none where it does not exist."""
    try:
        return sorted(n for n in os.listdir(folder) if n.endswith(T.DATA_SUFFIX))
    except (FileNotFoundError, NotADirectoryError):
        return []


def make_folder(folder: str, durable: bool) -> None:
    """Makes ``folder`` (and its parents); where it made it and ``durable``, flushes its
    parent, so that the folder's name outlives a crash as its files do."""
    if os.path.isdir(folder):
        return
    os.makedirs(folder, exist_ok=True)
    if durable:
        fsync_path(os.path.dirname(folder) or ".")


def make_save_folder(folder: str, mark: bytes, durable: bool) -> None:
    """Makes a save's folder in an extra folder with its ``_owner.OWNER_FILE`` (the save's
    owner mark), before any data file goes there: what the next save of the same checkpoint
    removes, should this one never finish, is known by it."""
    make_folder(folder, durable)
    path = os.path.join(folder, _owner.OWNER_FILE)
    if not os.path.exists(path):  # each rank of the save makes it alike
        with replacing(path, durable=durable) as tmp, open(tmp, "wb") as f:
            f.write(mark)


def owned_by(folder: str, main: str) -> bool:
    """Whether the save folder ``folder`` (in an extra folder) is one of the checkpoint at
    ``main``: its ``_owner.OWNER_FILE`` names it."""
    try:
        with open(os.path.join(folder, _owner.OWNER_FILE), "rb") as f:
            found = _owner.owner(f.read(_owner.MAX_MARK))
    except OSError:
        return False
    return found is not None and found.checkpoint == main


def named_files(meta_path: str, main: str) -> set[str] | None:
    """The data files (absolute paths) the ``.metadata`` at ``meta_path`` names: an empty set
    where there is none (no checkpoint in place); None where it exists but cannot be read
    (then nothing may be taken for unused)."""
    try:
        with open(meta_path, "rb") as f:
            meta = pickle.load(f)
        infos = meta.storage_data.values()
        return {os.path.join(main, info.relative_path) for info in infos}
    except FileNotFoundError:
        return set()
    except Exception:  # not a checkpoint this writer can read
        return None


def _unused_in(folder: str, live: set[str], prefix: str) -> list[str]:
    return [
        p for p in (os.path.join(folder, n) for n in data_files_in(folder) if n.startswith(prefix)) if p not in live
    ]


def remove_stale(
    main: str,
    extra: Iterable[str],
    live: set[str],
    *,
    current: str = "",
    prefix: str = "",
    in_main: bool = True,
    also: Iterable[str] = (),
) -> list[str]:
    """Removes the files of the checkpoint at ``main`` (absolute) on this host that no save
    needs (see the module): in the folders of its saves in each of ``extra`` and, with
    ``in_main``, at the top of ``main`` and in its save folders, each data file that ``live``
    (absolute paths) does not hold, whose name starts with ``prefix``, outside the folders of
    the save ``current`` (a save id; empty: none under way); and the files of ``also`` that
    ``live`` does not hold. Then the folders of this module's naming left without data files.
    Never raises for a file it cannot remove. Returns the paths it removed."""
    extra = list(extra)
    gone = [p for p in also if p not in live]
    keep_dir = {_owner.main_dir(current), _owner.extra_dir(main, current)} if current else set()
    if in_main:
        try:
            names = os.listdir(main)
        except OSError:
            names = []
        for name in names:
            full = os.path.join(main, name)
            if name.endswith(T.DATA_SUFFIX) and name.startswith(prefix) and full not in live:
                gone.append(full)
            elif _owner.is_save_dir(name) and name not in keep_dir:
                gone += _unused_in(full, live, prefix)
    mine = _owner.extra_dir(main, "")[: -len(_owner.short(""))]  # "<name of main>."
    for folder in extra:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            full = os.path.join(folder, name)
            if name.startswith(mine) and _owner.is_extra_dir(name) and name not in keep_dir and owned_by(full, main):
                gone += _unused_in(full, live, prefix)
    removed = []
    for path in gone:
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    roots = {main, *extra}
    for folder in sorted({os.path.dirname(p) for p in gone}):
        if folder not in roots and not data_files_in(folder):
            try:
                os.unlink(os.path.join(folder, _owner.OWNER_FILE))
            except OSError:
                pass
            try:
                os.rmdir(folder)  # only where empty
            except OSError:
                pass
    return removed
