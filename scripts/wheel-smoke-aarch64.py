"""The aarch64 wheel's smoke set, run by scripts/test-wheel-aarch64.sh under qemu-aarch64 with
Debian's arm64 CPython 3.11 (no NumPy or torch there: plain buffers only).

    python3.11 wheel-smoke-aarch64.py TARGET    (TARGET: where the wheel is installed)

Checks: the package and its extension come from TARGET and are aarch64's; all three backends are
compiled in; a file written and read back through the engine with each backend this kernel and
emulator allow (threads at least); deepio.kv put, get, close, reopen and get again; CRC-32C
against its known value and a table-driven reference. (The `deepio` command is the shell
script's to run: an aarch64 program started from here would need binfmt_misc.)
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile

import deepio
import deepio.kv
from deepio import _deepio


def crc32c_reference(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli, reflected 0x82F63B78) a byte at a time from a table."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def check(what: str, ok: bool, detail: object = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}{f': {detail}' if detail != '' else ''}", flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    target = os.path.realpath(sys.argv[1])
    check("machine", platform.machine() == "aarch64", platform.machine())
    where = os.path.realpath(deepio.__file__)
    check("deepio imported from the install", where.startswith(target + os.sep), where)
    ext = os.path.basename(_deepio.__file__)
    check("extension built for aarch64", ext.endswith(".cpython-311-aarch64-linux-gnu.so"), ext)
    check("no test hooks", not hasattr(_deepio, "_set_fault"))

    info = deepio.info()
    backends = {b["name"]: b for b in info["backends"]}
    compiled = all(backends[n]["compiled"] for n in ("io_uring", "libaio", "threads"))
    check("io_uring, libaio and threads compiled in", compiled, backends)
    available = [n for n in ("io_uring", "libaio", "threads") if backends[n]["available"]]
    unavailable = {n: b["reason"] for n, b in backends.items() if not b["available"]}
    check("threads available", "threads" in available, f"auto: {info['auto_backend']}; unavailable {unavailable}")

    with tempfile.TemporaryDirectory(prefix="deepio-aarch64-") as tmp:
        data = bytearray(os.urandom(3 * 4096 + 5))
        for name in available:
            path = os.path.join(tmp, f"{name}.bin")
            h = deepio.aio_handle(backend=name)
            with deepio.File(path, "w", handle=h) as f:
                n = f.pwrite(data, 0).result(timeout=60)
            back = bytearray(len(data))
            with deepio.File(path, "r", handle=h) as f:
                m = f.pread(back, 0).result(timeout=60)
            h.close()
            check(f"file round trip through the engine, backend {name}", (n, m, back) == (len(data), len(data), data))

        page, slots = 4096, 8
        # The pool: a 2-D [slots, page] view of a bytearray (a memoryview has no row views: the
        # rows are sliced from the bytearray).
        mem = bytearray(page * slots)
        pool = memoryview(mem).cast("B", (slots, page))
        row = lambda m, i: m[i * page : (i + 1) * page]  # noqa: E731
        pages = {f"key{i}": os.urandom(page) for i in range(4)}
        folder = os.path.join(tmp, "kv")
        with deepio.kv.Store(folder, capacity_bytes=64 * page, page_bytes=page, checkpoint_interval=0) as store:
            store.register(pool)
            for slot, value in enumerate(pages.values()):
                mem[slot * page : (slot + 1) * page] = value
            stored = store.put(list(pages), range(len(pages))).result(timeout=60)
            check("kv put", stored == [True] * len(pages), stored)
            got = store.get(list(pages), range(4, 4 + len(pages))).result(timeout=60)
            same = all(row(mem, 4 + i) == v for i, v in enumerate(pages.values()))
            check("kv get", got == [True] * len(pages) and same, got)
        mem2 = bytearray(page * slots)
        with deepio.kv.Store(folder, page_bytes=page) as store:
            store.register(memoryview(mem2).cast("B", (slots, page)))
            check("kv reopen: pages listed", store.contains([*pages, "absent"]) == [True] * len(pages) + [False])
            got = store.get(list(pages), range(len(pages))).result(timeout=60)
            same = all(row(mem2, i) == v for i, v in enumerate(pages.values()))
            check("kv reopen: pages read back whole", got == [True] * len(pages) and same, got)

    check("crc32c('123456789') == 0xE3069283", deepio.kv.crc32c(b"123456789") == 0xE3069283)
    blob = os.urandom(3 * 65536 + 17)  # long enough for the three-stream path, and a tail
    for size in (0, 1, 7, 64, 1000, 4096, 65536 + 3, len(blob)):
        want = crc32c_reference(blob[:size])
        check(f"crc32c of {size} bytes", deepio.kv.crc32c(blob[:size]) == want, hex(want))
    check("crc32c continued", deepio.kv.crc32c(blob[1000:], deepio.kv.crc32c(blob[:1000])) == want)

    print(f"smoke: {len(available)} backend(s) round-tripped ({', '.join(available)}); deepio {deepio.__version__}")


if __name__ == "__main__":
    main()
