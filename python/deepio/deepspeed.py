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
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["ENV_VAR", "install", "installed", "status"]

#: The environment variable the start-up hook reads.
ENV_VAR = "DEEPIO_DEEPSPEED"

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


def swap_in_tensors(swap_handle: Any, tensor_buffers: Any, swap_paths: Any) -> None:
    """DeepSpeed's swap_in_tensors as one batch on a deepio handle (see the module doc)."""
    batch = getattr(swap_handle, "async_pread_batch", None)
    if batch is None:
        return _swap_originals["swap_in_tensors"](swap_handle, tensor_buffers, swap_paths)
    pairs = list(zip(tensor_buffers, swap_paths))  # zip's length, as DeepSpeed's loop
    batch([b for b, _ in pairs], [p for _, p in pairs])
    return None


def swap_out_tensors(swap_handle: Any, tensor_buffers: Any, swap_paths: Any) -> None:
    """DeepSpeed's swap_out_tensors as one batch on a deepio handle (see the module doc)."""
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


def install() -> bool:
    """Switches DeepSpeed to deepio's async_io, gds, pin_memory and utils ops, whether
    DeepSpeed is imported already or later. Idempotent. Returns True when DeepSpeed is installed (the
    switch then has something to act on), False when it is not (nothing is changed)."""
    global _finder
    if _deepspeed_spec() is None:
        return False
    with _lock:
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
    whether it is on in this process."""
    spec = _deepspeed_spec()
    version = ""
    if spec is not None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("deepspeed")
        except Exception:
            version = "unknown version"
    hook = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deepio-deepspeed.pth")
    return {
        "deepspeed_installed": spec is not None,
        "deepspeed_version": version,
        "startup_hook": os.path.isfile(hook),
        "env": os.environ.get(ENV_VAR, ""),
        "env_on": _switch_on(os.environ.get(ENV_VAR)),
        "active": installed(),
    }


def _startup() -> None:
    """Called by deepio-deepspeed.pth at interpreter start-up."""
    if _switch_on(os.environ.get(ENV_VAR)):
        install()
