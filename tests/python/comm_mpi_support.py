"""What the MPI test files (test_comm_mpi.py, test_comm_torchops.py) share, on both sides.

pytest side: mpirun and the interpreter the ranks run, a probe for optional modules, and
run_world (one ``mpirun -np N python script --worker``, each case's JSON result line).

Worker side: the reference written from the specification in NumPy (docs/comm.md, onebit.md
§1): fp32 operations in the specified order and the specified fp64 norm order, so the library
must match it bit for bit at every W. None of it calls deepio's packing code. Then the checks
the cases share: a ValueError raised on every rank, a gloo process group over MPI's ranks, and
Skip, which a case raises where it cannot run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

# ---------------------------------------------------------------------------------------------
# pytest side


def _mpirun():
    return shutil.which("mpirun") or shutil.which("mpiexec")


def _python():
    """This interpreter, with -S if we run without site (so workers import what we import)."""
    return [sys.executable, "-S"] if sys.flags.no_site else [sys.executable]


def _have(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


def run_world(script, np_, timeout, extra_env=None):
    """Runs ``script --worker`` on ``np_`` MPI ranks; returns (each case's JSON result line by
    case name, mpirun's exit code, stdout, stderr). Shared by the MPI test files."""
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    env.update(extra_env or {})
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-np", str(np_), *_python(), script, "--worker"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = "timeout (hang?)", -1
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            res[d["case"]] = d
    return res, rc, out, err


# ---------------------------------------------------------------------------------------------
# worker side: the reference (NumPy, from the spec)


def ref_scale(v):
    """||v|| / sqrt(n) in the specified order: fp64 squares, lane l = i % 8, leaves of 64
    consecutive lane terms (512 elements) summed in order from +0.0, leaves summed by a perfect
    binary tree padded with zero leaves, lanes combined ((0+1)+(2+3))+((4+5)+(6+7))."""
    import numpy as np

    v64 = v.astype(np.float64)
    sq = v64 * v64
    leaf = 512
    n_leaves = -(-v.size // leaf)
    span = 1
    while span < n_leaves:
        span *= 2
    padded = np.zeros(span * leaf, np.float64)
    padded[: v.size] = sq
    rows = padded.reshape(span, leaf // 8, 8)
    leaves = np.zeros((span, 8), np.float64)
    for r in range(leaf // 8):  # in order, one row at a time
        leaves = leaves + rows[:, r, :]
    while leaves.shape[0] > 1:  # the tree, level by level
        leaves = leaves[0::2] + leaves[1::2]
    lanes = [np.float64(x) for x in leaves[0]] if n_leaves else [np.float64(0.0)] * 8
    total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    return np.float32(np.sqrt(total)) / np.float32(np.sqrt(np.float64(v.size)))


def sgn(x):
    import numpy as np

    return np.where(x < 0, np.float32(-1), np.float32(1)).astype(np.float32)  # NaN, -0.0 -> +1


def simulate(inputs, worker_errors, server_errors):
    """One call on all W ranks; updates the error lists; returns the common output."""
    import numpy as np

    w = len(inputs)
    n0 = inputs[0].size
    n = worker_errors[0].size
    c = n // w
    if n0 == 0:
        for e in worker_errors + server_errors:
            e[:] = 0
        return np.empty(0, np.float32)
    scales, signs = [], []
    for r in range(w):
        x = np.zeros(n, np.float32)
        x[:n0] = inputs[r]
        x = x + worker_errors[r]
        s = ref_scale(x)
        scales.append(s)
        signs.append(sgn(x))
        worker_errors[r][:] = x - s * sgn(x)
    inv_w = np.float32(1.0 / w)
    out = np.empty(n, np.float32)
    for r in range(w):
        acc = None
        for j in range(w):
            term = (scales[j] * inv_w) * signs[j][r * c : (r + 1) * c]
            acc = term if acc is None else acc + term
        cv = acc + server_errors[r]
        s = ref_scale(cv)
        server_errors[r][:] = cv - s * sgn(cv)
        out[r * c : (r + 1) * c] = s * sgn(cv)
    return out[:n0]


def make_input(n0, key, call, salt=0):
    import numpy as np

    g = np.random.default_rng([key, call, salt])
    return (g.random(n0, dtype=np.float32) - np.float32(0.5) + np.float32(0.01) * np.float32(key)).astype(np.float32)


def same_bits(a, b):
    import numpy as np

    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and a.view(np.uint32).tobytes() == b.view(np.uint32).tobytes()


class Skip(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# worker side: what the cases share


def _invalid_argument_error():
    """deepio's class for refused arguments (python/src/errors.cpp), shared by I/O and comm."""
    from deepio import _deepio

    return _deepio.InvalidArgumentError


def _expect_value_error_everywhere(comm, fn, needle, reason=None, rank=None):
    """fn() must raise deepio.InvalidArgumentError (an OSError with errno EINVAL and a
    ValueError) on every rank, with `needle` in the message and, when given, the agreement's
    reason name and failing rank (-1: lengths differ across ranks)."""
    import errno

    ok = False
    try:
        fn()
    except ValueError as e:
        problems = []
        if needle not in str(e):
            problems.append("message")
        if type(e) is not _invalid_argument_error() or not isinstance(e, OSError) or e.errno != errno.EINVAL:
            problems.append(f"type {type(e).__mro__} errno {getattr(e, 'errno', None)}")
        if reason is not None and getattr(e, "reason_name", None) != reason:
            problems.append(f"reason {getattr(e, 'reason_name', None)} (code {getattr(e, 'reason', None)})")
        if rank is not None and getattr(e, "rank", None) != rank:
            problems.append(f"rank {getattr(e, 'rank', None)}")
        ok = not problems
        if not ok:
            print(f"rank {comm.Get_rank()}: unexpected {problems}: {e!r}", file=sys.stderr)
    oks = comm.allgather(ok)
    assert all(oks), f"{needle!r}: not raised as expected everywhere: {oks}"


_torch_pg = None


def _init_gloo(comm):
    global _torch_pg
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise Skip("needs torch") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise Skip("torch.distributed with gloo unavailable")
    if not dist.is_initialized():
        port = comm.bcast(_free_port() if comm.Get_rank() == 0 else None)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(), world_size=comm.Get_size()
        )
    return torch, dist


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
