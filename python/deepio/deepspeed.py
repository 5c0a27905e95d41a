"""DeepSpeed on deepio with one switch.

    import deepio.deepspeed
    deepio.deepspeed.install()      # before or after `import deepspeed`

or, for a program started by DeepSpeed's launcher or any other, with no code change::

    DEEPIO_DEEPSPEED=1 deepspeed train.py

(the wheel installs ``deepio-deepspeed.pth``, which calls install() at interpreter start-up
when ``DEEPIO_DEEPSPEED`` is 1/true/yes/on). After install(), every way DeepSpeed obtains its
``AsyncIOBuilder``, ``GDSBuilder`` and ``PinMemoryBuilder`` gives deepio's (deepio.compat):
``deepspeed.ops.op_builder``, ``deepspeed.ops.aio``/``gds``/``pin_memory``, the names its
modules imported from there (the swappers, the checkpoint writer, ds_io), ``all_ops.ALL_OPS``,
and every accelerator's ``get_op_builder``/``create_op_builder``. DeepSpeed's files are never
edited: modules already imported are patched in memory, modules imported later are patched as
they load (an import hook on ``sys.meta_path``). Without DeepSpeed installed it does nothing.
``UtilsBuilder`` (``cast_to_byte_tensor``, which FastPersist's checkpoint writer loads) is
served too, in plain torch: no op is compiled at run time, on any accelerator.

DeepSpeed's swappers submit through ``swap_tensor.utils.swap_in_tensors``/``swap_out_tensors``
(one ``async_pread``/``async_pwrite`` per tensor). With the switch on, those names (in
``utils`` and in every swapper module that imported them) submit a deepio handle's tensors
as one batch (``async_pread_batch``/``async_pwrite_batch``: one call, files opened off the
training thread); any other handle gets DeepSpeed's loop. One difference follows from it: a
swap file that cannot be opened is raised by the handle's ``wait()``, not by the swap call.

Several drives without RAID: ``DEEPIO_NVME_PATHS=/mnt/nvme0,/mnt/nvme1`` (or
``install(nvme_paths=[...])``) spreads the swap files that DeepSpeed's parameter and optimizer
swappers would put under their ``nvme_path`` over those folders, so one swap call reads and
writes every drive at once through the one engine. Each swapper's folder (for example
``<nvme_path>/zero_stage_3/bfloat16params/rank0``) is made under every listed folder at the same
relative path, and each new swap file goes to the folder that holds the fewest bytes of that
swapper's files so far (ties: the next one in turn), where it stays for the life of the
process. DeepSpeed's own paths are translated in the two swap functions above, the only way
its swappers reach the files. Unset (or empty), nothing changes: every byte and path is
DeepSpeed's. The folders are checked (they exist, are folders, are writable, no folder named
twice, no empty entry) when a swapper is made, so a bad list fails ``deepspeed.initialize``.
"""

from __future__ import annotations

import errno
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import threading
import types
import warnings
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["ENV_VAR", "NVME_PATHS_VAR", "install", "installed", "status"]

#: The environment variable the start-up hook reads.
ENV_VAR = "DEEPIO_DEEPSPEED"
#: The environment variable that lists the folders DeepSpeed's swap files are spread over.
NVME_PATHS_VAR = "DEEPIO_NVME_PATHS"

# DeepSpeed's builder names -> deepio.compat's attribute of the same name.
_NAMES = ("AsyncIOBuilder", "GDSBuilder", "PinMemoryBuilder", "UtilsBuilder")
# The package that defines DeepSpeed's own builders (and its per-accelerator subpackages):
# those modules keep their classes (GDSBuilder subclasses AsyncIOBuilder there), only the
# package's public names and the places that hand builders out are switched.
_BUILDER_PACKAGES = ("deepspeed.ops.op_builder", "op_builder")

_lock = threading.RLock()
_finder: _Finder | None = None


def _ours() -> dict[str, Any]:
    from . import compat

    return {name: getattr(compat, name) for name in _NAMES}


def _deepspeed_spec() -> importlib.machinery.ModuleSpec | None:
    """DeepSpeed's spec without importing it; None when it cannot be found."""
    try:
        return importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return None


def _switch_on(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


_MISSING = object()


def _wrap_accelerator(cls: type) -> None:
    """Makes `cls.get_op_builder`/`create_op_builder` answer deepio's builders."""
    ours = _ours()
    get = cls.__dict__.get("get_op_builder")
    if get is not None and not getattr(get, "_deepio", False):

        def get_op_builder(self: Any, class_name: str, _orig: Any = get) -> Any:
            return ours[class_name] if class_name in ours else _orig(self, class_name)

        get_op_builder._deepio = True  # type: ignore[attr-defined]
        cls.get_op_builder = get_op_builder  # type: ignore[attr-defined]
    create = cls.__dict__.get("create_op_builder")
    if create is not None and not getattr(create, "_deepio", False):

        def create_op_builder(self: Any, class_name: str, _orig: Any = create) -> Any:
            return ours[class_name]() if class_name in ours else _orig(self, class_name)

        create_op_builder._deepio = True  # type: ignore[attr-defined]
        cls.create_op_builder = create_op_builder  # type: ignore[attr-defined]


_SWAP_MODULE = "deepspeed.runtime.swap_tensor.utils"
# DeepSpeed's own swap functions, kept for handles that are not deepio's.
_swap_originals: dict[str, Any] = {}


# --- Several folders (DEEPIO_NVME_PATHS) ---------------------------------------------------
#
# Protocol: a swapper's constructor (wrapped below) checks the folders, runs DeepSpeed's own
# code, then makes the swapper's folder under every listed folder and registers it in
# _spreads, keyed by the folder DeepSpeed joins its file names to. swap_in_tensors and
# swap_out_tensors translate each path whose folder is registered; any other path (nothing is
# registered when the variable is unset) passes untouched. A file's place is chosen once, at
# its first swap, and kept: reads find what writes put. Guarded by _spread_lock.

# install(nvme_paths=...): the folders given in code, which take precedence over the variable.
_nvme_paths_given: tuple[str, ...] | None = None


def _split_nvme_paths(value: str) -> list[str]:
    """DEEPIO_NVME_PATHS's entries: comma-separated, blanks around each one ignored. ValueError
    for an empty entry ("a,,b", a trailing comma); an empty or blank variable is no list."""
    if not value.strip():
        return []
    entries = [e.strip() for e in value.split(",")]
    for i, e in enumerate(entries):
        if not e:
            raise ValueError(
                f"{NVME_PATHS_VAR}={value!r}: entry {i + 1} of {len(entries)} is empty "
                "(a comma-separated list of folders, none empty)"
            )
    return entries


def _check_nvme_folders(entries: Sequence[Any], source: str) -> tuple[str, ...]:
    """The folders as absolute paths, each checked: a non-empty path (ValueError), that exists
    (FileNotFoundError), is a folder (NotADirectoryError), can be written (PermissionError;
    OSError with EROFS on a read-only file system) and is not named twice, under any spelling
    or through a link (ValueError). Every error names ``source`` and the entry."""
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
        raise TypeError(f"{source}: a list of folders, not {type(entries).__name__}")
    entries = list(entries)
    if not entries:
        raise ValueError(f"{source}: an empty list of folders (give at least one)")
    seen: dict[tuple[int, int], str] = {}
    out = []
    for i, entry in enumerate(entries):
        where = f"{source}: entry {i + 1} of {len(entries)}"
        try:
            path = os.fspath(entry)
        except TypeError:
            raise TypeError(f"{where}: a folder path, not {type(entry).__name__}") from None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not path.strip():
            raise ValueError(f"{where} is empty")
        path = os.path.abspath(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"{where}: no such folder", path) from None
        except OSError as e:
            raise type(e)(e.errno, f"{where}: cannot reach the folder ({e.strerror})", path) from None
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, f"{where}: not a folder", path)
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, f"{where}: on a read-only file system", path)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, f"{where}: not writable by this process", path)
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise ValueError(f"{where} ({path!r}) is the same folder as {seen[key]!r}: name each folder once")
        seen[key] = path
        out.append(path)
    return tuple(out)


def _nvme_folders() -> tuple[str, ...] | None:
    """The folders to spread over, checked; None for DeepSpeed's one nvme_path."""
    if _nvme_paths_given is not None:
        return _check_nvme_folders(_nvme_paths_given, "deepio.deepspeed.install(nvme_paths=...)")
    entries = _split_nvme_paths(os.environ.get(NVME_PATHS_VAR, ""))
    return _check_nvme_folders(entries, NVME_PATHS_VAR) if entries else None


class _Spread:
    """Where the files of one swapper's folder go: ``targets``, that folder's twin under each
    listed folder. A new name goes to the target holding the fewest bytes so far; a tie goes
    to the first such target at or after the cursor, which then moves past it (equal sizes:
    round-robin from ``start``)."""

    def __init__(self, targets: tuple[str, ...], start: int) -> None:
        self.targets = targets
        self.cursor = start % len(targets)
        self.nbytes = [0] * len(targets)
        self.placed: dict[str, str] = {}

    def place(self, name: str, nbytes: int) -> str:
        path = self.placed.get(name)
        if path is None:
            n = len(self.targets)
            least = min(self.nbytes)
            i = next(j % n for j in range(self.cursor, self.cursor + n) if self.nbytes[j % n] == least)
            self.nbytes[i] += nbytes
            self.cursor = (i + 1) % n
            path = os.path.join(self.targets[i], name)
            self.placed[name] = path
        return path


_spread_lock = threading.Lock()
_spreads: dict[str, _Spread] = {}


def _spread_swap_folder(swapper: Any, folders: tuple[str, ...], wipe: bool) -> None:
    """Makes ``swapper.swap_folder``'s twin under each of ``folders`` (emptied first when
    ``wipe``, as DeepSpeed empties its own) and registers them for the swap functions."""
    own = os.fspath(swapper.swap_folder)
    base = os.fspath(swapper.swap_config.nvme_path)
    rel = os.path.relpath(own, base)
    if rel == os.curdir or rel.split(os.sep, 1)[0] == os.pardir:
        raise RuntimeError(
            f"deepio.deepspeed: DeepSpeed's swap folder {own!r} is not inside its nvme_path {base!r}; "
            f"{NVME_PATHS_VAR} cannot spread it (a DeepSpeed version this switch does not know)"
        )
    targets = tuple(os.path.join(f, rel) for f in folders)
    for t in targets:
        if wipe and not (os.path.isdir(t) and os.path.samefile(t, own)):
            shutil.rmtree(t, ignore_errors=True)
        os.makedirs(t, exist_ok=True)
    spread = _Spread(targets, zlib.crc32(rel.encode()))
    with _spread_lock:
        current = _spreads.get(own)
        if wipe or current is None or current.targets != targets:
            _spreads[own] = spread
            _spreads[os.path.normpath(own)] = spread


def _spread_path(path: Any, nbytes: int) -> Any:
    """Where the swap file ``path`` really is; ``path`` itself outside a spread folder.
    Called with _spread_lock held."""
    folder, name = os.path.split(os.fspath(path))
    spread = _spreads.get(folder) or _spreads.get(os.path.normpath(folder))
    return path if spread is None else spread.place(name, nbytes)


def _spread_paths(tensor_buffers: Any, swap_paths: Any) -> tuple[list[Any], list[Any]]:
    """A swap call's buffers and paths (zip's length, as DeepSpeed's loop), each path where
    its file really is."""
    pairs = list(zip(tensor_buffers, swap_paths))
    with _spread_lock:
        return [b for b, _ in pairs], [_spread_path(p, getattr(b, "nbytes", 0)) for b, p in pairs]


def _wrap_swapper(cls: Any, method: str, wipe: bool) -> None:
    """Wraps DeepSpeed's ``cls.method`` (the code that makes a swapper's folder): the folders
    are checked first, DeepSpeed's code runs, then the folder is spread (idempotent)."""
    orig = cls.__dict__.get(method)
    if orig is None or getattr(orig, "_deepio", False):
        return

    @functools.wraps(orig)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        folders = _nvme_folders()
        result = orig(self, *args, **kwargs)
        if folders is not None:
            _spread_swap_folder(self, folders, wipe)
        return result

    wrapper._deepio = True  # type: ignore[attr-defined]
    setattr(cls, method, wrapper)


# DeepSpeed's modules -> (class, method that makes the swap folder, whether DeepSpeed empties it).
_SWAPPERS = {
    "deepspeed.runtime.swap_tensor.partitioned_param_swapper": (
        "AsyncPartitionedParameterSwapper",
        "_configure_aio",
        True,
    ),
    "deepspeed.runtime.swap_tensor.optimizer_utils": ("OptimizerSwapper", "__init__", False),
}


def swap_in_tensors(swap_handle: Any, tensor_buffers: Any, swap_paths: Any) -> None:
    """DeepSpeed's swap_in_tensors as one batch on a deepio handle (see the module doc)."""
    if _spreads:
        tensor_buffers, swap_paths = _spread_paths(tensor_buffers, swap_paths)
    batch = getattr(swap_handle, "async_pread_batch", None)
    if batch is None:
        return _swap_originals["swap_in_tensors"](swap_handle, tensor_buffers, swap_paths)
    pairs = list(zip(tensor_buffers, swap_paths))  # zip's length, as DeepSpeed's loop
    batch([b for b, _ in pairs], [p for _, p in pairs])
    return None


def swap_out_tensors(swap_handle: Any, tensor_buffers: Any, swap_paths: Any) -> None:
    """DeepSpeed's swap_out_tensors as one batch on a deepio handle (see the module doc)."""
    if _spreads:
        tensor_buffers, swap_paths = _spread_paths(tensor_buffers, swap_paths)
    batch = getattr(swap_handle, "async_pwrite_batch", None)
    if batch is None:
        return _swap_originals["swap_out_tensors"](swap_handle, tensor_buffers, swap_paths)
    pairs = list(zip(tensor_buffers, swap_paths))
    batch([b for b, _ in pairs], [p for _, p in pairs])
    return None


_SWAP_FUNCTIONS = {"swap_in_tensors": swap_in_tensors, "swap_out_tensors": swap_out_tensors}


def _patch_swap(module: types.ModuleType) -> None:
    for attr, ours in _SWAP_FUNCTIONS.items():
        current = module.__dict__.get(attr, _MISSING)
        if current is _MISSING or current is ours:
            continue
        if getattr(current, "__module__", None) != _SWAP_MODULE:
            continue  # a name of the same spelling that is not DeepSpeed's function
        _swap_originals.setdefault(attr, current)
        setattr(module, attr, ours)


def _patch(module: types.ModuleType) -> None:
    """Switches one DeepSpeed module over to deepio's builders (idempotent)."""
    name = module.__name__
    _patch_swap(module)
    swapper = _SWAPPERS.get(name)
    if swapper is not None:
        cls = module.__dict__.get(swapper[0])
        if isinstance(cls, type) and swapper[1] in cls.__dict__:
            _wrap_swapper(cls, swapper[1], swapper[2])
        elif _nvme_paths_given is not None or _split_nvme_paths(os.environ.get(NVME_PATHS_VAR, "")):
            # A DeepSpeed whose swapper is not where this switch knows it: its files would
            # all go to nvme_path while the user asked for several folders. Said, not hidden.
            warnings.warn(
                f"deepio.deepspeed: {name}.{swapper[0]}.{swapper[1]} not found in this DeepSpeed; "
                f"its swap files stay in nvme_path, not spread over {NVME_PATHS_VAR}",
                RuntimeWarning,
                stacklevel=2,
            )
    ours = _ours()
    inside_builders = any(name.startswith(p + ".") for p in _BUILDER_PACKAGES)
    if not inside_builders:
        # deepspeed.ops.op_builder itself, deepspeed.ops.aio, the swappers, ds_io, ...
        for attr in _NAMES:
            current = module.__dict__.get(attr, _MISSING)
            if current is not _MISSING and current is not ours[attr]:
                setattr(module, attr, ours[attr])
    if name.endswith("op_builder.all_ops"):
        all_ops = module.__dict__.get("ALL_OPS")
        if isinstance(all_ops, dict):
            for cls in ours.values():
                builder = cls()
                if builder.name in all_ops and not isinstance(all_ops[builder.name], cls):
                    all_ops[builder.name] = builder
    if name.startswith("deepspeed.accelerator.") or name.startswith("accelerator."):
        for value in list(module.__dict__.values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                _wrap_accelerator(value)


def _watched(fullname: str) -> bool:
    return fullname == "deepspeed" or fullname.startswith(("deepspeed.", "op_builder", "accelerator."))


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then _patch() on the module it made."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module's loader is the real one, for anything that reads sources or resources.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _lock:
            if _finder is not None:
                _patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds DeepSpeed's modules through the other finders and wraps their loaders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not _watched(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install(nvme_paths: Sequence[str | os.PathLike[str]] | None = None) -> bool:
    """Switches DeepSpeed to deepio's async_io, gds, pin_memory and utils ops, whether
    DeepSpeed is imported already or later. Idempotent. Returns True when DeepSpeed is installed (the
    switch then has something to act on), False when it is not (nothing is changed).

    ``nvme_paths``: the folders to spread DeepSpeed's swap files over (see the module doc),
    taking precedence over DEEPIO_NVME_PATHS for the swappers made after the call; None keeps
    what is set (at first: the variable). Checked at once: ValueError (an empty list, an empty
    entry, a folder named twice), TypeError (not a list of paths), FileNotFoundError,
    NotADirectoryError, PermissionError or OSError(EROFS) naming the folder; nothing is changed
    then."""
    global _finder, _nvme_paths_given
    if nvme_paths is not None:
        given = _check_nvme_folders(nvme_paths, "deepio.deepspeed.install(nvme_paths=...)")
    if _deepspeed_spec() is None:
        return False
    with _lock:
        if nvme_paths is not None:
            _nvme_paths_given = given
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
        for name, module in list(sys.modules.items()):
            if module is not None and _watched(name):
                _patch(module)
    return True


def installed() -> bool:
    """True while install() is in effect."""
    return _finder is not None


def status() -> dict[str, Any]:
    """What `deepio info` reports: whether DeepSpeed is installed (and its version), whether
    the start-up hook file is installed, whether DEEPIO_DEEPSPEED asks for the switch, and
    whether it is on in this process; and the folders DeepSpeed's swap files are spread over
    (``nvme_paths``: empty for DeepSpeed's one nvme_path; ``nvme_paths_error``: why the list
    is refused, else empty)."""
    spec = _deepspeed_spec()
    version = ""
    if spec is not None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("deepspeed")
        except Exception:
            version = "unknown version"
    hook = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deepio-deepspeed.pth")
    try:
        folders, folders_error = list(_nvme_folders() or ()), ""
    except (OSError, ValueError, TypeError) as e:
        folders, folders_error = [], str(e)
    return {
        "deepspeed_installed": spec is not None,
        "deepspeed_version": version,
        "startup_hook": os.path.isfile(hook),
        "env": os.environ.get(ENV_VAR, ""),
        "env_on": _switch_on(os.environ.get(ENV_VAR)),
        "active": installed(),
        "nvme_paths": folders,
        "nvme_paths_error": folders_error,
    }


def _startup() -> None:
    """Called by deepio-deepspeed.pth at interpreter start-up."""
    if _switch_on(os.environ.get(ENV_VAR)):
        install()
