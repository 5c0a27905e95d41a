"""``deepio.dcp.FileSystemWriter``: torch.distributed.checkpoint's FileSystemWriter whose data
files are written through deepio's engine and whose ``.metadata`` is put in place durably.

What is torch's and what is deepio's. The class is torch's ``FileSystemWriter`` (planning,
storage prefixes, staging for ``async_save``, ``storage_meta``, ``validate_checkpoint_id``)
with three steps replaced:

- ``write_data``: each data file (``__{rank}_{n}.distcp``, the same files and the same bytes
  torch writes) is a ``deepio.Writer`` (page-locked staging buffers, aligned direct I/O through
  the process's default engine, ``fsync`` when ``sync_files``) instead of a Python file object;
  a small file gets staging the size of its estimated bytes (``_staging_for``).
  Each item's bytes are what torch's own writer puts there: a tensor is serialized by
  ``torch.save`` into the Writer (torch's zip record and its CRC-32, on the writing thread), a
  bytes item (``io.BytesIO`` from the planner: non-tensor objects pickled by torch) is written
  as it is. Tensors are made contiguous CPU tensors first exactly as torch's loader does
  (``detach().cpu()``, cloned where the storage holds more than the view). A writer with stream
  extensions (``_extensions``) or another ``serialization_format`` uses torch's own write path.
- the checkpoint's start (``prepare_local_plan``/``prepare_global_plan``): an existing
  checkpoint is refused with ``FileExistsError`` under ``overwrite=False``; under
  ``overwrite=True`` its ``.metadata`` is removed (and the removal flushed) before any data
  file is rewritten, so a save killed midway never leaves old metadata over new data.
- ``finish``: ``.metadata`` (torch's pickle of torch's ``Metadata``) is written last, under a
  temporary name, flushed, renamed into place and the folder flushed (``deepio._durable``,
  the same steps as ``deepio.save``); the folder is flushed before the rename too, so the
  data files' names are on disk before the metadata that points at them. Without
  ``sync_files`` only the rename is kept (no flushes, as torch).

Threads: ``thread_count`` threads each write their own files (torch's split of the items
by size); the engine is shared and thread-safe. The first failure of any thread is raised by
``write_data`` after all threads stopped.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import queue
import threading
from typing import IO, Any, cast

import torch

from .._durable import fsync_path, replacing
from ..checkpoint import DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS, Writer
from . import _torchapi as T


def _contiguous_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """What torch's _SerialCpuLoader hands its writer: detached, on the host, and owning only
    its own bytes (torch.save writes a view's whole storage)."""
    t = tensor.detach().cpu()
    if t.untyped_storage().size() != t.numel() * t.element_size():
        t = t.clone()
    return t


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


#: torch.save's zip around one tensor's bytes (local headers, data.pkl, directory, padding)
#: is under 2 KiB; a bytes item of unknown size is guessed at this.
_ITEM_OVERHEAD = 4096


def _staging_for(items: list[Any]) -> tuple[int, int]:
    """The Writer's staging (buffer size, count) for a file of these items: the default for a
    large file, one buffer's worth of the file's estimated size for a small one (staging is
    page-locked memory, made and freed per file: 16 MiB x 4 of it cost 12 ms a file on the
    development VM, which one file per item, of thousands, would pay each time)."""
    estimate = 0
    for item in items:
        if item.tensor_data is not None:
            numel = 1
            for n in item.tensor_data.size:
                numel *= int(n)
            estimate += numel * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()
        elif item.bytes_io_data is not None:
            estimate += int(item.bytes_io_data.nbytes)
        estimate += _ITEM_OVERHEAD
    if estimate >= DEFAULT_WRITE_BUFFER:
        return DEFAULT_WRITE_BUFFER, DEFAULT_WRITE_BUFFERS
    return max(4096, -(-estimate // 4096) * 4096), 2


def _write_file(path: str, key: str, items: list[Any], planner: Any, durable: bool) -> list[Any]:
    """Writes one data file: the bytes items, then the tensors (torch's order); returns the
    WriteResults with each item's place (torch's _StorageInfo)."""
    results = []
    size, count = _staging_for(items)
    w = Writer(path, durable=durable, buffer_size=size, buffers=count)
    try:
        ordered = [i for i in items if i.type == T.WriteItemType.BYTE_IO]
        ordered += [i for i in items if i.type != T.WriteItemType.BYTE_IO]
        for item in ordered:
            data = planner.resolve_data(item)
            offset = w.tell()
            if item.type == T.WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise TypeError(f"deepio.dcp: bytes item {item.index.fqn!r} resolved to {type(data).__name__}")
                w.write(data.getbuffer())
            else:
                torch.save(_contiguous_cpu(data), cast(IO[bytes], _NoClose(w)))
            length = w.tell() - offset
            place = T.StorageInfo(key, offset, length)
            results.append(T.WriteResult(index=item.index, size_in_bytes=length, storage_data=place))
        w.close()  # flushes, and fsyncs when durable: raises the first write error
    except BaseException:
        w.discard()
        raise
    return results


class FileSystemWriter(T.FileSystemWriter):
    """``torch.distributed.checkpoint.FileSystemWriter`` through deepio's engine (see the
    module). Same arguments as torch's: ``path``, ``single_file_per_rank=True``,
    ``sync_files=True``, ``thread_count=1``, ``per_thread_copy_ahead=10_000_000`` (kept for
    torch's staging; deepio copies device tensors to the host one at a time),
    ``cache_staged_state_dict=False``, ``overwrite=True``, and torch's experimental
    ``_extensions``/``serialization_format`` (which take torch's own write path). Use it as
    torch's: ``dcp.save(state_dict, storage_writer=deepio.dcp.FileSystemWriter(path))``."""

    def _deepio_path(self) -> bool:
        return not self.transforms.extensions and self.serialization_format == T.TORCH_SAVE

    def _meta_path(self) -> str:
        if not self.use_collectives and self.rank is not None:
            return os.fspath(self._get_metadata_path(self.rank))
        return os.fspath(self._get_metadata_path())

    def _clear_old_metadata(self) -> None:
        """Under overwrite=True: the old checkpoint stops being one before any of its data
        files is rewritten (its .metadata removed and the removal flushed)."""
        meta = self._meta_path()
        try:
            os.unlink(meta)
        except FileNotFoundError:
            return
        if self.sync_files:
            fsync_path(os.fspath(self.path))

    def prepare_local_plan(self, plan: Any) -> Any:
        self.fs.mkdir(self.path)
        if self._metadata_exists() and not self.overwrite:
            raise FileExistsError(
                errno.EEXIST,
                f"deepio.dcp: {os.fspath(self.path)!r} holds a checkpoint already (its .metadata exists) "
                "and the writer was made with overwrite=False",
                os.fspath(self.path),
            )
        if not self.use_collectives:
            self._clear_old_metadata()  # every rank its own __{rank}.metadata
        if self.rank is not None and not self.use_collectives:
            import dataclasses

            plan = dataclasses.replace(plan, storage_data=T.StoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        # The coordinator, after every rank's local plan and before any rank writes data.
        self._clear_old_metadata()
        return super().prepare_global_plan(plans)

    def write_data(self, plan: Any, planner: Any) -> Any:
        if not self._deepio_path():
            return super().write_data(plan, planner)
        prefix = plan.storage_data.prefix
        if self.single_file_per_rank:
            buckets = T.split_by_size_and_type(max(1, self.thread_count), plan.items)
        else:
            buckets = [[item] for item in plan.items]
        jobs: queue.Queue[tuple[str, str, list[Any]]] = queue.Queue()
        for n, bucket in enumerate(buckets):
            key = f"{prefix}{n}{T.DATA_SUFFIX}"
            jobs.put((os.fspath(self.fs.concat_path(self.path, key)), key, bucket))
        results: list[Any] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def work() -> None:
            while not errors:
                try:
                    path, key, items = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    done = _write_file(path, key, items, planner, self.sync_files)
                except BaseException as e:
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    results.extend(done)

        threads = [threading.Thread(target=work, name=f"deepio.dcp-{i}") for i in range(1, self.thread_count)]
        for t in threads:
            t.start()
        try:
            work()
        finally:
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
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
