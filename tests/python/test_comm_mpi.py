"""deepio.comm under mpirun at 2, 3 and 4 ranks (oversubscribed).

pytest side: one ``mpirun -np N python this_file`` per N runs every case below on every
rank and prints one JSON line per case from rank 0 (pass/fail/skip with the failures of
every rank); each (N, case) is one pytest item. Worker side (``__main__``): the cases.

The reference they are checked against (NumPy, from the specification) and the helpers the
MPI test files share: comm_mpi_support.py.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import pytest

from comm_mpi_support import (
    Skip,
    _expect_value_error_everywhere,
    _have,
    _init_gloo,
    _invalid_argument_error,
    _mpirun,
    make_input,
    run_world,
    same_bits,
    simulate,
)

HERE = os.path.abspath(__file__)
CASES = [
    "spec_numpy",
    "spec_torch",
    "mpibackend_semantics",
    "size_errors",
    "local_argument_errors",
    "mpi_failure",
    "type_errors",
    "empty",
    "sub_communicator",
    "torch_distributed_matches_mpi",
    "error_feedback_converges",
]


# ---------------------------------------------------------------------------------------------
# pytest side


_results = {}


def _run_world(np_):
    if np_ not in _results:
        _results[np_] = run_world(HERE, np_, 240)
    return _results[np_]


@pytest.mark.skipif(_mpirun() is None, reason="needs mpirun")
@pytest.mark.skipif(not _have("mpi4py"), reason="needs mpi4py")
@pytest.mark.skipif(not _have("deepio.comm"), reason="deepio built without MPI (no deepio._comm)")
@pytest.mark.parametrize("case", CASES)
# Two ranks in the default run; three and four (slow) in the full run (scripts/test.sh --full).
@pytest.mark.parametrize("np_", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_comm_mpi(np_, case):
    res, rc, out, err = _run_world(np_)
    if case not in res:
        pytest.fail(f"no result for {case} (mpirun rc={rc})\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    d = res[case]
    if d["status"] == "skip":
        pytest.skip(d["detail"])
    assert d["status"] == "pass", d["detail"]


# ---------------------------------------------------------------------------------------------
# worker side: the cases (each runs on every rank; failures raise AssertionError)


def _spec(comm, use_torch):
    import numpy as np

    import deepio.comm as dcomm

    if use_torch:
        try:
            import torch
        except ImportError:
            raise Skip("needs torch") from None
    w, me = comm.Get_size(), comm.Get_rank()
    keys = comm.allgather(me)
    shapes = [(1, 0, True), (37, 0, True), (37, 11, False), (37, 8 * w + 3, True), (1000, 5, True)]
    for chunks, short, in_place in shapes:
        n = 8 * w * chunks
        n0 = n - short
        we_ref = [np.zeros(n, np.float32) for _ in range(w)]
        se_ref = [np.zeros(n // w, np.float32) for _ in range(w)]
        we = np.zeros(n, np.float32)
        se = np.zeros(n // w, np.float32)
        if use_torch:
            we_t, se_t = torch.from_numpy(we), torch.from_numpy(se)  # share memory with we/se
        for call in range(4):
            inputs = [make_input(n0, keys[r], call, chunks) for r in range(w)]
            expected = simulate(inputs, we_ref, se_ref)
            mine = inputs[me].copy()
            if use_torch:
                t = torch.from_numpy(mine.copy())
                if in_place:
                    res = dcomm.compressed_allreduce(t, we_t, se_t, comm)
                    assert res is t
                    got = t.numpy()
                else:
                    got = dcomm.MpiBackend(comm=comm).compressed_allreduce(t, we_t, se_t, 0).numpy()
            else:
                if in_place:
                    dcomm.compressed_allreduce(mine, we, se, comm)
                    got = mine
                else:
                    got = dcomm.MpiBackend(comm=comm).compressed_allreduce(mine, we, se, 0)
            where = f"W={w} rank={me} n0={n0} n={n} call={call} in_place={in_place}"
            assert same_bits(got, expected), f"output differs from the spec simulation: {where}"
            assert same_bits(we, we_ref[me]), f"worker_error differs: {where}"
            assert same_bits(se, se_ref[me]), f"server_error differs: {where}"


def case_spec_numpy(comm):
    _spec(comm, use_torch=False)


def case_spec_torch(comm):
    _spec(comm, use_torch=True)


def case_mpibackend_semantics(comm):
    import numpy as np

    import deepio.comm as dcomm

    w = comm.Get_size()
    be = dcomm.MpiBackend(cuda_aware=False)
    assert be.size == w and be.rank == comm.Get_rank()
    n = 8 * w * 16
    # Unpadded, contiguous: in place, the same object comes back.
    a = make_input(n, comm.Get_rank(), 0).reshape(8 * w, 16)
    we, se = np.zeros(n, np.float32), np.zeros(n // w, np.float32)
    before = a.copy()
    r = be.compressed_allreduce(a, we, se, 0)
    assert r is a and r.shape == (8 * w, 16)
    assert not np.array_equal(a, before)
    # Padded: the caller's buffer is untouched, a new one of its shape comes back.
    b = make_input(n - 10, comm.Get_rank(), 1)
    b_before = b.copy()
    r = be.compressed_allreduce(b, we, se, 0)
    assert r is not b and r.shape == b.shape and np.array_equal(b, b_before)
    # All ranks hold the same result.
    allr = comm.allgather(r.tobytes())
    assert all(x == allr[0] for x in allr)
    # The result has one magnitude per chunk (the server scale) and the signs.
    c = n // w
    for k in range(w):
        mags = np.unique(np.abs(r[k * c : min(r.size, (k + 1) * c)]))
        assert mags.size == 1, mags
    try:
        import torch
    except ImportError:
        return
    t = torch.from_numpy(make_input(n, comm.Get_rank(), 2))
    wt, st = torch.zeros(n), torch.zeros(n // w)
    out = be.compressed_allreduce(t, wt, st, 0)
    assert out is t
    t2 = torch.from_numpy(make_input(n, comm.Get_rank(), 3))[: n - 3]
    out2 = be.compressed_allreduce(t2, wt, st, 0)
    assert out2.data_ptr() != t2.data_ptr() and out2.shape == t2.shape
    # A tensor that requires grad (DLPack refuses to export those) still works, in place.
    g = torch.from_numpy(make_input(n, comm.Get_rank(), 4)).requires_grad_()
    before_g = g.detach().clone()
    assert be.compressed_allreduce(g, wt, st, 0) is g and not torch.equal(g.detach(), before_g)


def case_size_errors(comm):
    import numpy as np

    import deepio.comm as dcomm

    w, me = comm.Get_size(), comm.Get_rank()
    n = 8 * w * 4

    def call(n0, nw, ns):
        dcomm.compressed_allreduce(np.ones(n0, np.float32), np.zeros(nw, np.float32), np.zeros(ns, np.float32), comm)

    _expect_value_error_everywhere(
        comm, lambda: call(n, n + w, (n + w) // w), "not a multiple of 8 * W", "worker_not_multiple", 0
    )
    _expect_value_error_everywhere(
        comm,
        lambda: call(n, n + 8 if me == w - 1 else n, n // w),
        f"invalid arguments on rank {w - 1}",
        "worker_not_multiple",
        w - 1,
    )
    _expect_value_error_everywhere(
        comm,
        lambda: call(n, 2 * n if me == 0 else n, 2 * n // w if me == 0 else n // w),
        "differs across ranks",
        "worker_mismatch",
        -1,
    )
    _expect_value_error_everywhere(
        comm, lambda: call(0 if me == 0 else n, n, n // w), "differs across ranks", "input_mismatch", -1
    )
    _expect_value_error_everywhere(
        comm, lambda: call(n + 1, n, n // w), "longer than worker_error", "input_too_long", 0
    )
    # Aliasing: worker_error and server_error in one array, on the last rank only.
    both = np.zeros(n + n // w, np.float32)

    def aliased():
        we = both[:n] if me == w - 1 else np.zeros(n, np.float32)
        se = both[n - 8 : n - 8 + n // w] if me == w - 1 else np.zeros(n // w, np.float32)
        dcomm.compressed_allreduce(np.ones(n, np.float32), we, se, comm)

    _expect_value_error_everywhere(comm, aliased, "overlaps another argument", "error_overlap", w - 1)
    # Still in step afterwards.
    a = np.ones(n, np.float32)
    dcomm.compressed_allreduce(a, np.zeros(n, np.float32), np.zeros(n // w, np.float32), comm)
    assert np.allclose(a, 1.0)


def case_local_argument_errors(comm):
    """Arguments refused on one rank before any communication: the same class, reason 0."""
    import errno

    import numpy as np
    from mpi4py import MPI

    import deepio.comm as dcomm

    cls = _invalid_argument_error()
    n = 8 * comm.Get_size()
    for fn, needle in [
        (lambda: dcomm.padded_size(10, 0), "w must be >= 1"),
        (lambda: dcomm.pack_signs(np.ones(8, np.float32), kernel="sse9"), "unknown kernel"),
        (
            lambda: dcomm.compressed_allreduce(
                np.ones(n, np.float32), np.zeros(n, np.float32), np.zeros(8, np.float32), MPI.COMM_NULL
            ),
            "MPI_COMM_NULL",
        ),
    ]:
        try:
            fn()
        except cls as e:
            assert isinstance(e, OSError) and isinstance(e, ValueError) and e.errno == errno.EINVAL, repr(e)
            assert needle in str(e), repr(e)
            assert e.reason == 0 and e.reason_name == "none" and e.rank == -1, (e.reason, e.rank)
        else:
            raise AssertionError(f"expected {cls.__name__} with {needle!r}")


def case_mpi_failure(comm):
    """A real MPI failure: MPI refuses a zero communicator handle (a null pointer in Open MPI,
    an invalid integer in MPICH) and reports it through COMM_WORLD's error handler, here
    MPI_ERRORS_RETURN. It must arrive as OSError(EIO) with the MPI error class, not as a
    ValueError."""
    import errno

    import numpy as np
    from mpi4py import MPI

    import deepio.comm as dcomm

    if MPI._handleof(MPI.COMM_NULL) == 0:
        raise Skip("this MPI's MPI_COMM_NULL is handle 0")
    n = 8 * comm.Get_size()
    before = MPI.COMM_WORLD.Get_errhandler()
    MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)
    try:
        dcomm.compressed_allreduce(np.ones(n, np.float32), np.zeros(n, np.float32), np.zeros(8, np.float32), 0)
    except OSError as e:
        assert type(e) is OSError and not isinstance(e, ValueError), type(e).__mro__
        assert e.errno == errno.EIO, e.errno
        assert e.mpi_error_class == MPI.ERR_COMM, e.mpi_error_class
        assert MPI.Get_error_string(MPI.ERR_COMM) in str(e), str(e)
    else:
        raise AssertionError("no error for a zero communicator handle")
    finally:
        MPI.COMM_WORLD.Set_errhandler(before)
        before.Free()


def case_type_errors(comm):
    import numpy as np

    import deepio.comm as dcomm

    w = comm.Get_size()
    n = 8 * w

    def zeros(shape):
        return np.zeros(shape, np.float32)

    for bad, exc in [
        (lambda: dcomm.compressed_allreduce(np.ones(n), zeros(n), zeros(8), comm), TypeError),
        (lambda: dcomm.compressed_allreduce(np.ones((n, 2), np.float32)[:, 0], zeros(n), zeros(8), comm), ValueError),
        (lambda: dcomm.compressed_allreduce(np.ones(n, np.float32), zeros((n, 1)), zeros(8), comm), ValueError),
        (lambda: dcomm.compressed_allreduce([1.0] * n, zeros(n), zeros(8), comm), TypeError),
        (lambda: dcomm.compressed_allreduce(np.ones(n, np.float32), zeros(n), zeros(8), "world"), TypeError),
    ]:
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError(f"expected {exc.__name__}")


def case_empty(comm):
    import numpy as np

    import deepio.comm as dcomm

    w = comm.Get_size()
    we, se = np.full(8 * w * 2, 3.0, np.float32), np.full(16, -1.0, np.float32)
    e = np.empty((0, 5), np.float32)
    r = dcomm.MpiBackend().compressed_allreduce(e, we, se, 0)
    assert r.shape == (0, 5)
    assert not we.any() and not se.any()


def case_sub_communicator(comm):
    import numpy as np

    import deepio.comm as dcomm

    me = comm.Get_rank()
    sub = comm.Split(me % 2, -me)
    try:
        w, sme = sub.Get_size(), sub.Get_rank()
        keys = sub.allgather(me)
        n = 8 * w * 20
        we_ref = [np.zeros(n, np.float32) for _ in range(w)]
        se_ref = [np.zeros(n // w, np.float32) for _ in range(w)]
        we, se = np.zeros(n, np.float32), np.zeros(n // w, np.float32)
        for call in range(3):
            inputs = [make_input(n - 7, keys[r], call, 5) for r in range(w)]
            expected = simulate(inputs, we_ref, se_ref)
            mine = inputs[sme].copy()
            dcomm.compressed_allreduce(mine, we, se, sub)
            assert same_bits(mine, expected), f"sub-communicator W={w} call {call}"
            assert same_bits(we, we_ref[sme]) and same_bits(se, se_ref[sme])
    finally:
        sub.Free()


def case_torch_distributed_matches_mpi(comm):
    torch, dist = _init_gloo(comm)
    import deepio.comm as dcomm

    w, me = comm.Get_size(), comm.Get_rank()
    n = 8 * w * 100
    we1, se1 = torch.zeros(n), torch.zeros(n // w)
    we2, se2 = torch.zeros(n), torch.zeros(n // w)
    tb = dcomm.TorchBackend()
    mb = dcomm.MpiBackend()
    for call in range(4):
        x = torch.from_numpy(make_input(n - 9, me, call, 77))
        a = mb.compressed_allreduce(x.clone(), we1, se1, 0)
        b = tb.compressed_allreduce(x.clone(), we2, se2, 0)
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"call {call}"
        assert torch.equal(we1.view(torch.int32), we2.view(torch.int32))
        assert torch.equal(se1.view(torch.int32), se2.view(torch.int32))
    # Size violations raise everywhere on this transport too, through the same C++ agreement:
    # same class, same reason codes as the MPI transport.
    _expect_value_error_everywhere(
        comm,
        lambda: dcomm.compressed_allreduce_torch(
            torch.ones(n), torch.zeros(n + 8 if me == 0 else n), torch.zeros(n // w)
        ),
        "invalid arguments on rank 0",
        "worker_not_multiple",
        0,
    )
    _expect_value_error_everywhere(
        comm,
        lambda: dcomm.compressed_allreduce_torch(
            torch.ones(n - 1 if me == w - 1 else n), torch.zeros(n), torch.zeros(n // w)
        ),
        "input length differs across ranks",
        "input_mismatch",
        -1,
    )
    buf = torch.ones(n)
    _expect_value_error_everywhere(
        comm,
        lambda: tb.compressed_allreduce(buf, torch.zeros(n), buf[: n // w] if me == 0 else torch.zeros(n // w), 0),
        "overlaps another argument",
        "error_overlap",
        0,
    )
    # Still in step afterwards.
    x = torch.ones(n)
    dcomm.compressed_allreduce_torch(x, torch.zeros(n), torch.zeros(n // w))
    assert torch.allclose(x, torch.ones(n))


def case_error_feedback_converges(comm):
    import numpy as np

    import deepio.comm as dcomm

    w, me = comm.Get_size(), comm.Get_rank()
    n0 = 8 * w * 32 - 3
    n = dcomm.padded_size(n0, w)
    avg = np.mean([make_input(n0, r, 0, 9).astype(np.float64) for r in range(w)], axis=0)
    x = make_input(n0, me, 0, 9)
    we, se = np.zeros(n, np.float32), np.zeros(n // w, np.float32)
    total = np.zeros(n0)
    errs = {}
    for k in range(1, 201):
        out = x.copy()
        dcomm.compressed_allreduce(out, we, se, comm)
        total += out
        if k in (1, 10, 200):
            errs[k] = np.linalg.norm(total / k - avg) / np.linalg.norm(avg)
    assert errs[10] < errs[1] and errs[200] < errs[10] / 5 and errs[200] < 0.05, errs


def worker_main():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    for case in CASES:
        status, detail = "pass", ""
        try:
            globals()["case_" + case](comm)
        except Skip as e:
            status, detail = "skip", str(e)
        except Exception:
            status, detail = "fail", f"rank {me}: " + traceback.format_exc()
        statuses = comm.gather((status, detail), root=0)
        if me == 0:
            kinds = {s for s, _ in statuses}
            final = "fail" if "fail" in kinds else ("skip" if kinds == {"skip"} else "pass")
            details = "\n".join(d for s, d in statuses if s == final and d)
            print(json.dumps({"case": case, "status": final, "detail": details}), flush=True)
        comm.Barrier()


if __name__ == "__main__" and "--worker" in sys.argv:
    worker_main()
