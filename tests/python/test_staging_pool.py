"""The engine's one staging pool seen from Python: deepio.Writer and deepio.Reader borrow their
windows from their handle's pool (the pool the workers' bounce slots come from), the next file
reuses them, and a block still used by an operation in flight is never lent again.
"""

from __future__ import annotations

import os

import pytest

import deepio
from conftest import threads_in_fault_delay, wait_until
from deepio import _deepio
from deepio.checkpoint import _staging

MIB = 1 << 20


def _stats(h: deepio.aio_handle) -> dict:
    s = h.stats()
    return {k: s[k] for k in ("staging_allocations", "staging_reuses", "staging_lent_bytes", "staging_kept_bytes")}


def test_the_next_files_windows_are_the_last_ones_memory(tmp_dir):
    h = deepio.aio_handle(intra_op_parallelism=1)
    data = os.urandom(3 * MIB + 123)
    with deepio.Writer(tmp_dir / "a", handle=h, buffer_size=MIB, buffers=2) as w:
        w.write(data)
    first = _stats(h)
    assert first["staging_allocations"] == 2 and first["staging_lent_bytes"] == 0
    assert first["staging_kept_bytes"] == 2 * MIB
    with deepio.Writer(tmp_dir / "b", handle=h, buffer_size=MIB, buffers=2) as w:
        w.write(data)
    with deepio.Reader(tmp_dir / "b", handle=h, buffer_size=MIB, buffers=2) as r:
        assert r.read() == data
    after = _stats(h)
    assert after["staging_allocations"] == first["staging_allocations"], "no new mapping for the next files"
    assert after["staging_reuses"] == 4
    assert (tmp_dir / "a").read_bytes() == data
    h.close()


def test_windows_of_files_open_at_once_are_distinct(tmp_dir):
    h = deepio.aio_handle(intra_op_parallelism=1)
    a, b = os.urandom(2 * MIB), os.urandom(2 * MIB)
    with deepio.Writer(tmp_dir / "a", handle=h, buffer_size=MIB, buffers=2) as wa:
        with deepio.Writer(tmp_dir / "b", handle=h, buffer_size=MIB, buffers=2) as wb:
            for k in range(0, 2 * MIB, 64 << 10):  # interleaved: any shared window would mix them
                wa.write(a[k : k + (64 << 10)])
                wb.write(b[k : k + (64 << 10)])
            assert _stats(h)["staging_lent_bytes"] == 4 * MIB
    assert (tmp_dir / "a").read_bytes() == a and (tmp_dir / "b").read_bytes() == b
    h.close()


def test_a_block_an_operation_still_uses_is_not_lent_again(tmp_dir, fault):
    h = deepio.aio_handle(intra_op_parallelism=1)
    path = tmp_dir / "slow"
    path.write_bytes(os.urandom(MIB))
    window = _staging._Staging(MIB, h._h)
    fault("read", delay=2.0, count=1)  # held in the engine; the checks hold however long it takes
    f = deepio.File(path, "r", handle=h)
    fut = f.pread(window.view, 0)
    wait_until(lambda: threads_in_fault_delay() >= 1, "the read to reach the engine")
    del window  # the Writer/Reader's own reference is gone; the read in flight still holds a view
    assert _stats(h)["staging_lent_bytes"] == MIB and _stats(h)["staging_kept_bytes"] == 0
    again = _staging._Staging(MIB, h._h)
    assert _stats(h)["staging_allocations"] == 2, "a fresh block, not the busy one"
    _deepio._clear_fault()
    assert fut.result() == MIB
    del fut
    f.close()
    assert _stats(h)["staging_kept_bytes"] == MIB, "given back once the read let go of it"
    del again
    h.close()


def test_a_lease_outlives_a_closed_handle(tmp_dir):
    h = deepio.aio_handle(intra_op_parallelism=1)
    window = _staging._Staging(MIB, h._h)
    window.view[:4] = b"abcd"
    h.close()
    assert bytes(window.view[:4]) == b"abcd"  # still mapped: freed when the last view goes
    del window


def test_a_lease_of_a_negative_size_is_refused():
    h = deepio.aio_handle(intra_op_parallelism=1)
    with pytest.raises(ValueError, match="non-negative"):
        _deepio.lend_staging(h._h, -1)
    h.close()


def test_staging_blocks_are_counted_apart_from_locked_allocations(tmp_dir):
    before = deepio.locked_memory_stats()
    h = deepio.aio_handle(intra_op_parallelism=1)
    window = _staging._Staging(MIB, h._h)
    mid = deepio.locked_memory_stats()
    assert mid["staging_blocks"] == before["staging_blocks"] + 1
    assert mid["allocations"] == before["allocations"] + 1
    del window
    h.close()
    end = deepio.locked_memory_stats()
    assert end["staging_blocks"] == before["staging_blocks"] and end["allocations"] == before["allocations"]
