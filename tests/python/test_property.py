"""Property tests: random sequences of reads and writes through deepio (any size, offset,
address, handle shape and backend) leave files and buffers byte-identical to what
os.pwrite/os.pread produce on a shadow copy."""

from __future__ import annotations

import os

import pytest

from conftest import require_module  # noqa: E402

hypothesis = require_module("hypothesis")
np = require_module("numpy")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import deepio  # noqa: E402

MAX_FILE = 96 * 1024

handles = st.builds(
    lambda bs, qd, ss, ov, p, backend: (bs, qd, ss, ov, p, backend),
    st.sampled_from([512, 1000, 4096, 65536]),
    st.integers(1, 8),
    st.booleans(),
    st.booleans(),
    st.integers(1, 4),
    st.sampled_from(["auto", "threads", "libaio"]),
)

ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "read", "async_write", "async_read", "wait"]),
        st.integers(0, MAX_FILE - 1),  # offset
        st.integers(0, 20000),  # size
        st.integers(0, 63),  # misalignment of the buffer address
    ),
    min_size=1,
    max_size=12,
)


def _available(backend: str) -> bool:
    return backend == "auto" or any(b["name"] == backend and b["available"] for b in deepio.info()["backends"])


@settings(
    max_examples=int(os.environ.get("DEEPIO_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(shape=handles, seq=ops, seed=st.integers(0, 2**32 - 1))
def test_random_io_matches_os_pread_pwrite(tmp_dir, shape, seq, seed):
    bs, qd, ss, ov, par, backend = shape
    if not _available(backend):
        backend = "auto"
    h = deepio.aio_handle(bs, qd, ss, ov, par, backend=backend)
    rng = np.random.default_rng(seed)
    path = str(tmp_dir / f"prop_{seed}.bin")
    initial = rng.integers(0, 256, int(rng.integers(0, MAX_FILE)), dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(initial)
    shadow = bytearray(initial)  # what the file must hold, maintained with plain semantics
    queued_reads = []  # (buffer view, expected bytes, offset) checked when collected
    queued_write_ranges = []
    committed = len(shadow)  # the file's size for sure: queued writes may or may not have landed
    for kind, offset, size, skew in seq:
        if kind == "wait":
            h.wait()
            for view, expected, _ in queued_reads:
                assert view.tobytes() == expected
            queued_reads.clear()
            queued_write_ranges.clear()
            committed = len(shadow)
            continue
        backing = np.empty(size + 64, np.uint8)
        buf = backing[skew : skew + size]
        if kind.endswith("write"):
            # deepio does not order overlapping async ops (neither does DeepNVMe): keep
            # queued writes disjoint from each other and from queued reads
            if any(o < offset + size and offset < o + s for o, s in queued_write_ranges):
                continue
            if any(o < offset + size and offset < o + len(e) for _, e, o in queued_reads):
                continue
            buf[:] = rng.integers(0, 256, size, dtype=np.uint8)
            data = buf.tobytes()
            if kind == "write":
                assert h.sync_pwrite(buf, path, offset) == 1
            else:
                assert h.async_pwrite(buf, path, offset) == 0
                queued_write_ranges.append((offset, size))
            end = offset + size
            if size > 0 and end > len(shadow):  # like pwrite(2): writing 0 bytes never extends
                shadow.extend(b"\0" * (end - len(shadow)))
            shadow[offset:end] = data
            if kind == "write" and size > 0:  # landed (a sync call waits for its own op only)
                committed = max(committed, end)
        else:
            if any(o < offset + size and offset < o + s for o, s in queued_write_ranges):
                continue  # a read racing a queued write of the same bytes is undefined
            if committed < offset + size <= len(shadow):
                continue  # whether the file is long enough yet depends on queued writes
            if offset + size > len(shadow):
                with pytest.raises(deepio.EndOfFileError):
                    (h.sync_pread if kind == "read" else h.async_pread)(buf, path, offset)
                continue
            expected = bytes(shadow[offset : offset + size])
            if kind == "read":  # its own op only: what was queued stays queued
                assert h.sync_pread(buf, path, offset) == 1
                assert buf.tobytes() == expected
            else:
                assert h.async_pread(buf, path, offset) == 0
                queued_reads.append((buf, expected, offset))
    h.wait()
    for view, expected, _ in queued_reads:
        assert view.tobytes() == expected
    with open(path, "rb") as f:
        on_disk = f.read()
    assert on_disk == bytes(shadow)
    # and os.pread agrees with deepio on a final random range
    if shadow:
        fd = os.open(path, os.O_RDONLY)
        try:
            off = int(rng.integers(0, len(shadow)))
            n = int(rng.integers(0, len(shadow) - off + 1))
            out = np.empty(n, np.uint8)
            h.sync_pread(out, path, off)
            assert out.tobytes() == os.pread(fd, n, off)
        finally:
            os.close(fd)
    os.unlink(path)
