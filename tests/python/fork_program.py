"""Forked and spawned children reading through deepio after their parent used it: run by
test_fork.py in a fresh interpreter (so a hang is a timeout of that process, not of pytest).
Not a test module itself.

    python fork_program.py dataloader START_METHOD FOLDER   # a real DataLoader, 2 workers
    python fork_program.py parent-handle FOLDER              # a parent's handle in a child

Prints one line per check ("ok NAME" or "FAIL NAME: why") and exits 0 when all passed.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

import deepio
import deepio.safetensors

N = 8  # items
SIZE = 1 << 18  # float32 elements per item (1 MiB)


def item(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(SIZE, generator=g)


def paths(folder: str, i: int) -> dict[str, str]:
    return {k: os.path.join(folder, f"{k}{i}") for k in ("raw", "pt", "st")}


def write_inputs(folder: str) -> None:
    for i in range(N):
        t, p = item(i), paths(folder, i)
        t.numpy().tofile(p["raw"])
        deepio.save({"t": t}, p["pt"])
        deepio.safetensors.save_file({"t": t}, p["st"])


class Items(torch.utils.data.Dataset):
    """Each item read four ways: deepio.File (the default engine), deepio.load,
    deepio.safetensors.load_file, and an aio_handle of the worker's own, made on first use."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.handle: deepio.aio_handle | None = None
        self.handle_pid = -1

    def __getstate__(self) -> dict:
        # spawn pickles the dataset: a handle is not picklable (it is per process anyway).
        return {"folder": self.folder, "handle": None, "handle_pid": -1}

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        p = paths(self.folder, i)
        a = torch.empty(SIZE)
        with deepio.File(p["raw"], "r") as f:
            f.read_into(a)
        if self.handle is None or self.handle_pid != os.getpid():
            self.handle, self.handle_pid = deepio.aio_handle(), os.getpid()
        b = torch.empty(SIZE)
        assert self.handle.sync_pread(b, p["raw"]) == 1
        return {
            "file": a,
            "aio": b,
            "load": deepio.load(p["pt"])["t"],
            "safetensors": deepio.safetensors.load_file(p["st"])["t"],
            "pid": torch.tensor(os.getpid()),
        }


def check(name: str, ok: bool, why: str = "") -> bool:
    print(f"ok {name}" if ok else f"FAIL {name}: {why}", flush=True)
    return ok


def dataloader(method: str, folder: str) -> bool:
    write_inputs(folder)
    ds = Items(folder)
    ds[0]  # the parent uses every path first: default engines, its own handle
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=method)
    good = True
    pids = set()
    for i, got in enumerate(loader):
        want = item(i)
        for k in ("file", "aio", "load", "safetensors"):
            good &= check(f"{method} item {i} via {k}", torch.equal(got[k], want), "bytes differ")
        pids.add(int(got["pid"]))
    good &= check(f"{method} ran in workers", os.getpid() not in pids and len(pids) >= 1, f"pids {pids}")
    # The parent's engines still work after its children came and went.
    good &= check(f"{method} parent after", torch.equal(ds[1]["file"], item(1)), "bytes differ")
    return good


def _locked_allocations() -> int:
    """Live locked allocations, less the engines' staging blocks (their pools hold those)."""
    s = deepio.locked_memory_stats()
    return s["allocations"] - s["staging_blocks"]


def _vmlck_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    return -1


def parent_handle(folder: str) -> bool:
    data = np.arange(1 << 20, dtype=np.uint8)
    p = os.path.join(folder, "parent.bin")
    h = deepio.aio_handle(intra_op_parallelism=2)
    assert h.sync_pwrite(data, p) == 1
    locked = h.new_cpu_locked_tensor(1 << 20, np.empty(0, dtype=np.uint8))
    locked_before = _locked_allocations()
    opened = deepio.File(p, "r", handle=h)  # on the parent's handle
    default = deepio.File(p, "r")  # on the default engine
    assert default.read_into(np.empty_like(data)) == data.nbytes
    # A read of the default-engine File still running in the parent when it forks (held 1.5 s
    # in the engine by the test hook): closing the File in the child must not wait for it.
    from deepio import _deepio

    hooks = hasattr(_deepio, "_set_fault")
    if hooks:
        _deepio._set_fault("read", delay=1.5, count=1)
    slow_file = deepio.File(p, "r")
    slow = slow_file.pread(np.empty_like(data))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into the caller
        os.close(r)
        lines = []
        buf = np.empty_like(data)
        for name, call in (
            ("aio_handle.sync_pread", lambda: h.sync_pread(buf, p)),
            ("aio_handle.async_pread", lambda: h.async_pread(buf, p)),
            ("aio_handle.wait", h.wait),
            ("File on the parent's handle", lambda: opened.read_into(buf)),
        ):
            t0 = time.monotonic()
            try:
                call()
                lines.append(f"FAIL {name}: no error in the child")
            except deepio.ForkedHandleError as e:
                dt = time.monotonic() - t0
                # It raised instead of waiting on the parent's workers, which the child lacks
                # (waiting would never end: the parent's harness times the child out), naming
                # the parent. No wall-clock bound: a loaded machine may take its time.
                ok = str(os.getppid()) in str(e) and isinstance(e, OSError)
                lines.append(f"ok {name}" if ok else f"FAIL {name}: {dt:.2f} s, {e}")
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                lines.append(f"FAIL {name}: {type(e).__name__}: {e}")
        # A File opened in the parent on the default engine works in the child (its own engine).
        try:
            buf[:] = 0
            default.read_into(buf)
            lines.append("ok File on the default engine" if np.array_equal(buf, data) else "FAIL default: bytes")
        except BaseException as e:  # noqa: BLE001
            lines.append(f"FAIL File on the default engine: {type(e).__name__}: {e}")
        # The parent's running read: not this process's; close() forgets it at once, and its
        # future refuses to answer here (done() included: a loop polling it would never end).
        try:
            slow_file.close()
            try:
                slow.done()
                lines.append("FAIL close: the parent's future answered done() in the child")
            except deepio.ForkedHandleError:
                note = "" if hooks else " (not held: no test hooks)"
                lines.append(f"ok close with a parent's read in flight{note}")
        except BaseException as e:  # noqa: BLE001
            lines.append(f"FAIL close with a parent's read in flight: {type(e).__name__}: {e}")
        # A handle of the child's own works.
        try:
            mine = deepio.aio_handle()
            buf[:] = 0
            mine.sync_pread(buf, p)
            mine.close()  # its staging memory (locked, as the parent's) goes with it
            lines.append("ok child's own handle" if np.array_equal(buf, data) else "FAIL own: bytes")
        except BaseException as e:  # noqa: BLE001
            lines.append(f"FAIL child's own handle: {type(e).__name__}: {e}")
        # Locked memory inherited from the parent: the kernel did not lock it here (mlock is
        # not inherited), and freeing it frees this process's copy once, nothing more.
        try:
            vmlck = _vmlck_kib()
            freed = h.free_cpu_locked_tensor(locked)
            again = h.free_cpu_locked_tensor(locked)
            after = _locked_allocations()
            # What the child locked itself: the staging memory of its new default engine.
            own = deepio._engine.default().stats()
            own_kib = (own["staging_lent_bytes"] + own["staging_kept_bytes"]) // 1024
            ok = vmlck <= own_kib and freed and not again and after == locked_before - 1
            lines.append(
                "ok inherited locked memory"
                if ok
                else f"FAIL locked: {vmlck} kB > {own_kib}, {freed}, {again}, {after}"
            )
        except BaseException as e:  # noqa: BLE001
            lines.append(f"FAIL inherited locked memory: {type(e).__name__}: {e}")
        os.write(w, ("\n".join(lines) + "\n").encode())
        os._exit(0)  # the parent's handles are left as they are (leaked) in the child
    os.close(w)
    out = b""
    while chunk := os.read(r, 1 << 16):
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = out.decode()
    print(text, end="", flush=True)
    good = "FAIL" not in text and text.count("ok ") == 8 and os.waitstatus_to_exitcode(status) == 0
    good &= check("parent's read across the fork", slow.result() == data.nbytes)
    slow_file.close()
    if hooks:
        _deepio._clear_fault()
    after = _locked_allocations()
    good &= check("parent's locked memory after the child", after == locked_before, f"{after} != {locked_before}")
    h.free_cpu_locked_tensor(locked)
    # The parent's handle and files are untouched by what the child did.
    back = np.empty_like(data)
    good &= check("parent's handle after the child", h.sync_pread(back, p) == 1 and np.array_equal(back, data))
    good &= check("parent's File after the child", opened.read_into(back) == data.nbytes)
    opened.close()
    default.close()
    h.close()
    return good


if __name__ == "__main__":
    if sys.argv[1] == "dataloader":
        ok = dataloader(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "parent-handle":
        ok = parent_handle(sys.argv[2])
    else:
        raise SystemExit(f"unknown case {sys.argv[1]!r}")
    sys.exit(0 if ok else 1)
