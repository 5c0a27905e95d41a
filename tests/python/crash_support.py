"""A simulated power loss for Python tests (issue 47): what a crash of the machine can leave of
a save, in a forked child.

``PowerLoss`` starts the engine's recorder (``_deepio._crash_start``: every write and flush the
engine makes, src/platform/crash_sim.hpp) and wraps the calls through which deepio's savers
flush and rename (``os.fsync``/``os.fdatasync``, ``os.replace``/``os.rename``, ``os.unlink``):
they still run, and also tell the recorder of a file's flush, or note a rename until a flush of
its folder makes it durable (keeping the replaced file under a hidden hard link meanwhile).
``crash(seed)`` then makes the power loss: every later call of the wrapped functions blocks
for good (nothing more reaches the disk), the engine's recorder rewrites the files (writes
after their file's last flush kept, dropped or torn), and each rename no folder flush covered
is undone or kept, by seed. The process must end next (``os._exit``).

Not simulated: writes that do not go through the engine (kept at once), file creation and
removal (kept at once).
"""

from __future__ import annotations

import os
import random
import stat
import threading
from typing import Any

from deepio import _deepio


class PowerLoss:
    def __init__(self, tear_bytes: int = 512) -> None:
        self._crashed = threading.Event()
        self._lock = threading.Lock()
        self._renames: list[tuple[str, str, str | None]] = []  # (src, dst, backup of the old dst)
        self._real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace", "rename", "unlink")}
        _deepio._crash_start(tear_bytes)
        os.fsync = self._flush("fsync")  # type: ignore[assignment]
        os.fdatasync = self._flush("fdatasync")  # type: ignore[assignment]
        os.replace = self._rename("replace")  # type: ignore[assignment]
        os.rename = self._rename("rename")  # type: ignore[assignment]
        os.unlink = self._unlink  # type: ignore[assignment]

    def _halt_if_crashed(self) -> None:
        if self._crashed.is_set():
            threading.Event().wait()  # the power is off: nothing after it happens

    def _flush(self, name: str) -> Any:
        real = self._real[name]

        def flush(fd: int) -> None:
            self._halt_if_crashed()
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                folder = os.path.realpath(f"/proc/self/fd/{fd}")
                real(fd)
                with self._lock:
                    kept = []
                    for src, dst, backup in self._renames:
                        if os.path.dirname(dst) == folder:
                            if backup is not None:
                                self._real["unlink"](backup)
                        else:
                            kept.append((src, dst, backup))
                    self._renames = kept
                return
            _deepio._crash_flush(fd)
            real(fd)

        return flush

    def _rename(self, name: str) -> Any:
        real = self._real[name]

        def rename(src: Any, dst: Any, **kw: Any) -> None:
            self._halt_if_crashed()
            s, d = os.path.realpath(os.fspath(src)), os.path.realpath(os.fspath(dst))
            backup = None
            if os.path.exists(d):
                backup = os.path.join(os.path.dirname(d), f".powerloss-{len(self._renames)}-{os.path.basename(d)}")
                os.link(d, backup)
            real(src, dst, **kw)
            with self._lock:
                self._renames.append((s, d, backup))

        return rename

    def _unlink(self, path: Any, **kw: Any) -> None:
        self._halt_if_crashed()
        self._real["unlink"](path, **kw)

    def crash(self, seed: int) -> dict[str, int]:
        """The power loss (see the module's text); returns the engine recorder's report."""
        self._crashed.set()
        report = dict(_deepio._crash(seed))
        rng = random.Random(seed)
        with self._lock:
            undone = 0
            for src, dst, backup in reversed(self._renames):
                if rng.random() < 0.5:
                    continue  # the rename reached the disk
                undone += 1
                self._real["rename"](dst, src)
                if backup is not None:
                    self._real["rename"](backup, dst)
            for _, _, backup in self._renames:
                if backup is not None and os.path.exists(backup):
                    self._real["unlink"](backup)
        report["renames_undone"] = undone
        return report
