"""What ``Writer`` and ``Reader`` share: staging buffers lent by their engine, byte views of
what callers hand over, the copy between them, and the ``io.RawIOBase`` answers of an engine
file.

``_copy`` is looked up through this module at each call (``_staging._copy``), so that a test
replacing it here sees every copy of both classes.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import sys
import warnings
from typing import Any, Union

from .. import _deepio
from .._errors import describe

PathArg = Union[str, "os.PathLike[str]"]

_SMALL_COPY = 64 << 10  # below this a slice assignment beats a GIL-releasing memcpy


def _check_sizes(buffer_size: Any, buffers: Any) -> int:
    """buffer_size rounded up to whole pages (aligned for any device)."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 4096:
        raise ValueError(f"buffer_size must be an integer of at least 4096, got {buffer_size!r}")
    if isinstance(buffers, bool) or not isinstance(buffers, int) or not 2 <= buffers <= 64:
        raise ValueError(f"buffers must be an integer from 2 to 64, got {buffers!r}")
    return -(-buffer_size // 4096) * 4096


class _Staging:
    """One buffer of nbytes of the engine's staging memory (``_deepio.lend_staging``: the pool
    the engine's bounce slots come from; page-aligned, locked when RLIMIT_MEMLOCK allows), seen
    as a writable memoryview of bytes. The block goes back to the engine's pool, for the next
    file's window, when the last view of it dies (the ctypes array holds the lease): never
    while an operation, even one interrupted before it finished, still holds a view of it."""

    __slots__ = ("view",)

    def __init__(self, nbytes: int, engine: Any) -> None:
        lease = _deepio.lend_staging(engine, nbytes)
        raw = (ctypes.c_char * nbytes).from_address(lease.address)
        raw._deepio_lease = lease  # type: ignore[attr-defined]
        self.view = memoryview(raw).cast("B")


def _byte_view(b: Any) -> memoryview:
    from .._buffers import is_torch_tensor

    if is_torch_tensor(b):  # torch tensors have no buffer protocol: their bytes, via NumPy
        b = b.detach().contiguous().reshape(-1).view(sys.modules["torch"].uint8).numpy()
    mv = b if isinstance(b, memoryview) else memoryview(b)
    if mv.ndim == 1 and mv.format in ("B", "b", "c") and mv.contiguous:
        return mv if mv.format == "B" else mv.cast("B")
    if mv.contiguous:
        return mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
    return memoryview(mv.tobytes())


def _copy(dest: memoryview, src: memoryview) -> None:
    if len(src) >= _SMALL_COPY:
        _deepio.memcpy(dest, src)  # GIL released
    else:
        dest[:] = src


def _is_device(b: Any) -> bool:
    from .._buffers import is_device_buffer

    return is_device_buffer(b)


class _EngineFile(io.RawIOBase):
    """What Writer and Reader share: the io protocol answers, the O_DIRECT report, seek
    targets, and closing when collected. ``_writes`` says which of the two it is."""

    _writes = False
    _file: Any
    name: str

    def readable(self) -> bool:
        self._check()
        return not self._writes

    def writable(self) -> bool:
        self._check()
        return self._writes

    def seekable(self) -> bool:
        self._check()
        return True

    def fileno(self) -> int:
        # Not offered: I/O on the descriptor directly would bypass the staged bytes.
        what = "write to" if self._writes else "read from"
        raise io.UnsupportedOperation(f"deepio.{type(self).__name__} has no file descriptor to {what}")

    @property
    def direct(self) -> bool:
        """True when the file is open with O_DIRECT (full buffers or chunks bypass the page cache)."""
        return bool(self._file is not None and self._file.direct)

    def _seek_target(self, offset: int, whence: int, current: int, end: Any) -> int:
        """The absolute position seek(offset, whence) names; `end()` gives the file's end."""
        if whence == os.SEEK_SET:
            target = offset
        elif whence == os.SEEK_CUR:
            target = current + offset
        elif whence == os.SEEK_END:
            target = end() + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if target < 0:  # as os.lseek and open() files say it
            raise OSError(errno.EINVAL, f"Invalid argument: negative seek position {target}", self.name)
        return target

    def _check(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        if getattr(self, "_file", None) is None:
            return
        try:
            self.close()
        except Exception as e:  # nobody can catch it here: never silently
            warnings.warn(
                f"deepio.{type(self).__name__} {self.name!r} was garbage-collected unclosed and closing it "
                f"failed: {describe(e)}",
                _deepio.UnobservedFailureWarning,
                stacklevel=2,
            )
