"""deepio's native extension. Use the `deepio` package, not this module."""

from collections.abc import Sequence


__version__: str

class EndOfFileError(OSError, EOFError):
    """
    A read reached the end of the file before the requested range (errno ENODATA).
    Both an OSError (errno, filename, offset, nbytes) and an EOFError.
    """

    offset: int
    nbytes: int

class InvalidArgumentError(OSError, ValueError):
    """
    deepio refused an argument before doing any I/O (errno EINVAL): a bad block_size,
    queue_depth, intra_op_parallelism, backend or direct_io, a negative file_offset.
    Both an OSError (errno EINVAL) and a ValueError; the message names the parameter.
    """

    offset: int
    nbytes: int

class ForkedHandleError(OSError, RuntimeError):
    """
    A deepio handle (or a deepio.File opened on one) made in another process was used in a
    child made by fork(): its worker threads stayed in the parent, so the call refuses at
    once (errno EBADF) instead of hanging. Make a new handle in the child. Both an OSError
    and a RuntimeError. The library's own default engine is made anew in a child.
    """

    offset: int
    nbytes: int

class UnobservedFailureWarning(RuntimeWarning):
    """
    An operation failed and nobody could collect the failure any more: a deepio.Future
    dropped before result()/exception() was called, a handle destroyed with failed
    operations never waited for, or a finalizer (File/Writer garbage-collected unclosed)
    whose close() failed. The message names the file, the offset and the error.
    """

def flush_unobserved() -> None:
    """
    Turns the failures the engine reported as unobservable into UnobservedFailureWarnings.
    """

class Op:
    """One operation submitted through deepio.File; wrapped by deepio.Future."""

    def done(self) -> bool:
        """True once the operation finished (successfully or not). Never blocks."""

    def add_done_callback(self, fn: object) -> None:
        """
        Calls fn(op) once when done: at once if done, else from the engine thread that completes it (GIL held).
        """

    def wait(self, timeout: float | None = None) -> bool:
        """
        Blocks (GIL released) until done or `timeout` seconds passed; returns done().
        """

    def result(self, timeout: float | None = None) -> int:
        """
        Waits, then returns the number of bytes transferred or raises the operation's OSError.
        """

    def exception(self, timeout: float | None = None) -> object:
        """Waits, then returns the operation's exception or None."""

    def take_unobserved(self) -> object:
        """
        The failure of a finished operation nobody retrieved (marking it retrieved), or None.
        """

    def unobserved_failure(self) -> bool:
        """True for a finished, failed operation whose failure nobody retrieved."""

    @property
    def collected(self) -> bool: ...

    @property
    def write(self) -> bool: ...

    @property
    def offset(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

class File:
    """
    A file opened once by the engine (deepio.File's); its operations go through any handle.
    """

    @property
    def fd(self) -> int:
        """The descriptor (-1 once closed); the File owns it."""

    @property
    def direct(self) -> bool:
        """Whether it was opened with O_DIRECT."""

    @property
    def closed(self) -> bool: ...

    def close(self) -> None:
        """
        Drops this hold on the descriptors: they close once no operation on the file is running.
        """

    def submit(self, handle: Handle, write: bool, buffer: object, file_offset: int = 0) -> Op:
        """
        One read or write through handle, tracked for close(); returns its Op. ValueError once the file is closed or closing.
        """

    def submit_ranges(self, handle: Handle, write: bool, buffer: object, file_offsets: object, sizes: object, buffer_offsets: object | None = None) -> Op:
        """
        One operation over many ranges (Handle.submit_ranges, future=True), tracked for close().
        """

    def enter(self) -> int:
        """
        Counts a call using the descriptor until leave(); returns it. ValueError once closed or closing.
        """

    def leave(self) -> None: ...

    def begin_close(self) -> bool:
        """
        Refuses new calls, waits for the submissions under way; False if closed already or another close() is under way (after waiting for it).
        """

    def drain(self) -> list:
        """
        Waits for every tracked operation; returns the failures nobody retrieved (marked retrieved).
        """

    @property
    def tracked(self) -> tuple[int, int]:
        """
        (operations not yet seen done, done ones with an unretrieved failure); for tests.
        """

class Handle:
    """
    The engine handle behind deepio.aio_handle (keeps buffers alive until collected).
    """

    def __init__(self, block_size: int = 1048576, queue_depth: int = 128, single_submit: bool = False, overlap_events: bool = False, intra_op_parallelism: int = 1, backend: str = 'auto', direct_io: str = 'auto', device_route: str = 'auto') -> None: ...

    def submit(self, write: bool, buffer: object, file: object, file_offset: int = 0, fsync: bool = False) -> None:
        """
        Queues a read or write for wait(); raises on submission failures. fsync (writes): the operation completes once fdatasync made it durable.
        """

    def sync(self, write: bool, buffer: object, file: object, file_offset: int = 0, fsync: bool = False) -> int:
        """
        Submits and waits for this operation alone (raising only its failure); returns 1. What was queued for wait() before stays queued. fsync as for submit().
        """

    def submit_future(self, write: bool, buffer: object, file: object, file_offset: int = 0) -> Op: ...

    def submit_batch(self, write: bool, buffers: object, files: object, offsets: object | None = None, futures: bool = False, fsync: bool = False) -> object:
        """
        Submits many reads or writes in one call; files are opened off the calling thread. Returns the count (queued for wait()) or, with futures=True, a list of Op. fsync (writes): each completes once fdatasync made it durable.
        """

    def submit_ranges(self, write: bool, buffer: object, file: object, file_offsets: object, sizes: object, buffer_offsets: object | None = None, fsync: bool = False, future: bool = False) -> object:
        """
        Queues one operation over many ranges of one file for wait(); returns the bytes it moves (future=True: an Op of its own instead). buffer_offsets None: the ranges packed one after another in the buffer.
        """

    def open_file(self, path: object, flags: int, direct_io: str = 'auto') -> File:
        """
        Opens path once with the os.open flags the way the engine opens its own files (O_DIRECT unless direct_io='off' or the file system refuses it; 'on' makes that an error); returns a File for submit_future and submit_ranges, usable through any handle.
        """

    def wait(self) -> int:
        """Waits for every queued operation; returns how many were collected."""

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    def pending(self) -> int: ...

    def stats(self) -> dict: ...

    @property
    def block_size(self) -> int: ...

    @property
    def queue_depth(self) -> int: ...

    @property
    def single_submit(self) -> bool: ...

    @property
    def overlap_events(self) -> bool: ...

    @property
    def intra_op_parallelism(self) -> int: ...

    @property
    def backend(self) -> str: ...

    @property
    def device_route(self) -> str: ...

    @property
    def direct_io(self) -> str: ...

class StagingLease:
    """
    One block of a handle's staging memory; back to the handle's pool when this object dies.
    """

    @property
    def address(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def locked(self) -> bool: ...

def lend_staging(handle: Handle, nbytes: int) -> StagingLease:
    """
    A block of at least nbytes (whole pages) of the handle's staging memory (page-aligned, locked where RLIMIT_MEMLOCK allows), from the pool its workers' bounce slots come from; it goes back there when the returned StagingLease dies. Keep the lease alive from every view of the block.
    """

class LockedAllocation:
    """
    Owner of one page-aligned (and, when the limit allows, locked) allocation.
    """

    @property
    def address(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def locked(self) -> bool: ...

    @property
    def lock_errno(self) -> int: ...

    @property
    def released(self) -> bool: ...

    def release(self) -> bool:
        """
        Frees the allocation (free_cpu_locked_tensor): unlocked at once; False if it already was. The memory stays mapped until the last array using it dies.
        """

def alloc_locked(nbytes: int, framework: str = 'numpy') -> tuple:
    """
    Allocates `nbytes` page-aligned bytes, locked when RLIMIT_MEMLOCK allows, as a 1-D uint8 array of the given framework ('numpy', 'torch', or anything else for a DLPack-capable array). Returns (array, owner).
    """

def free_locked_array(buffer: object) -> bool:
    """
    Frees the allocation whose base address `buffer` starts at (unlocked at once); False for anything else (a view not at the base, foreign memory, a second free).
    """

def free_locked_address(address: int) -> bool:
    """
    Frees the allocation whose base address is `address` (DeepSpeed's free_cpu_locked_tensor_by_ptr); False for any other address or a second free.
    """

def is_locked_range(buffer: object) -> bool:
    """
    True iff the buffer lies entirely inside one live deepio locked allocation.
    """

def locked_memory_stats() -> dict: ...

def gpu_info() -> dict:
    """
    What CUDA and cuFile this process can use (deepio::gpu_info()); never raises.
    """

class GdsHandle(Handle):
    """
    deepio::GdsHandle behind deepio.gds_handle: a Handle whose engine can move CUDA memory through GPUDirect Storage.
    """

    def __init__(self, block_size: int = 1048576, queue_depth: int = 128, single_submit: bool = False, overlap_events: bool = False, intra_op_parallelism: int = 1, mode: str = 'auto', backend: str = 'auto', direct_io: str = 'auto') -> None: ...

    def pin(self, tensor: object) -> int:
        """cuFileBufRegister the tensor; returns its address."""

    def unpin(self, tensor: object) -> tuple[bool, int]:
        """Deregisters; returns (was pinned, address)."""

    def gds_stats(self) -> dict:
        """
        Device-memory counters: ops, chunks, bytes through cuFile, bytes staged, files that fell back.
        """

    @property
    def mode(self) -> str: ...

    @property
    def mode_reason(self) -> str: ...

class KvFuture:
    """The completion of a deepio.kv.Store put or get batch."""

    def done(self) -> bool:
        """True once every page of the batch is stored or read (or failed)."""

    def result(self, timeout: float | None = None) -> list:
        """
        Waits (GIL released, Ctrl-C honoured) and returns one bool per key; TimeoutError when the timeout passes.
        """

    def add_done_callback(self, fn: object) -> None:
        """
        Calls fn(future) once when done: at once if done, else from the store's batch thread (GIL held).
        """

class KvStore:
    """deepio::kv::Store (use deepio.kv.Store)."""

    def __init__(self, folders: Sequence[str], capacity_bytes: int, page_bytes: int, high_watermark: float, low_watermark: float, slab_bytes: int, checkpoint_interval: float, batch_threads: int, queue_depth: int, workers: int, device_pages_in_flight: int, retry_failed_after: float, fingerprint: str, clear_on_mismatch: bool) -> None: ...

    def register(self, pool: object) -> None: ...

    def put(self, keys: object, slots: object) -> KvFuture: ...

    def get(self, keys: object, slots: object) -> KvFuture: ...

    def put_segments(self, keys: object, segments: object) -> KvFuture: ...

    def get_segments(self, keys: object, segments: object) -> KvFuture: ...

    def exists(self, keys: object) -> int: ...

    def contains(self, keys: object) -> list: ...

    def remove(self, keys: object) -> int: ...

    def stats(self) -> dict: ...

    def take_warnings(self) -> list[str]: ...

    def checkpoint(self) -> None: ...

    def clear(self) -> int: ...

    def retry_failed(self) -> int: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def page_bytes(self) -> int: ...

KV_MAX_KEY_BYTES: int = 1024

def kv_crc32c(buffer: object, crc: int = 0) -> int:
    """
    CRC-32C (Castagnoli) of a host buffer's bytes, continuing from crc: the store's page checksum.
    """

def live_handles() -> int:
    """
    How many engine handles exist in this process now (deepio::live_handles()).
    """

def compare_with_file(buffer: object, file: object, file_offset: int = 0) -> int:
    """
    Index of the first byte where the file range differs from the buffer, or -1 (validate=True).
    """

def memcpy(dest: object, src: object) -> None:
    """Copies dest.nbytes bytes from src into dest (GIL released)."""

def capabilities() -> dict:
    """What this build and machine can do (backends, why one is unavailable)."""

def probe_direct_io(folder: object) -> dict:
    """Direct-I/O facts for files in `folder` (or the file itself)."""
