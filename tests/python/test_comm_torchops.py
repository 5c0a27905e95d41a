"""The torch-ops engine of deepio.comm (issue 14): torch tensor operations that compress on the
tensors' own device, proven on torch CPU tensors (CI has no GPU) to give the same bytes as the C++
kernels; CUDA-awareness detection; NcclBackend over torch.distributed.

1. In one process, no MPI (hypothesis): each stage (worker, server, decode) of
   ``deepio.comm._torchops`` against the C++ stage of the same name (``deepio._comm``), byte for
   byte, and whole multi-rank calls simulated in one process (the all-to-all and all-gather are
   rearrangements of blocks) over consecutive calls, at random sizes and world sizes.
2. Under ``mpirun -np 2`` and ``-np 4``: MpiBackend with ``engine="torch"`` against the native
   engine on every rank over consecutive calls; ``cuda_aware=True`` on this (not CUDA-aware) Open
   MPI warns once naming ``MPIX_Query_cuda_support() = 0``, agreeing with ``ompi_info``;
   NcclBackend on gloo (both engines) equals the MPI path; size errors on the torch-ops path.
3. NcclBackend in plain gloo ranks (subprocesses, no MPI at all) equals the MPI path's results
   for the same inputs, at 2 and 4 ranks.
4. On a GPU only (skipped here): the simulated calls of (1) on CUDA tensors against the C++
   bytes, and NcclBackend at one rank, CUDA tensors over NCCL against CPU tensors over gloo.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import traceback

import pytest

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
from comm_mpi_support import _have, _python, run_world  # noqa: E402 - the folder is on sys.path now

needs_comm = pytest.mark.skipif(
    not (_have("torch") and _have("deepio.comm")), reason="needs torch and deepio._comm (MPI build)"
)
needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None or not _have("mpi4py"), reason="needs mpirun and mpi4py"
)


def _cuda_available():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _bits(t):
    import torch

    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _same(a, b):
    """Bitwise equality of two float32 buffers, except that any two NaNs are equal: a NaN created
    by an operation (inf - inf after an overflow) has a hardware-defined payload and sign."""
    import numpy as np

    a = np.frombuffer(a if isinstance(a, bytes) else _bits(a), np.float32)
    b = np.frombuffer(b if isinstance(b, bytes) else _bits(b), np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | both_nan))


def _values(draw_or_rng, n, nasty):
    """n float32 values: uniform, optionally salted with +-0.0, denormals and large values."""
    import numpy as np

    g = draw_or_rng
    v = (g.random(n, dtype=np.float32) - np.float32(0.5)) * np.float32(g.choice([1e-3, 1.0, 1e3]))
    if nasty and n:
        specials = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-45, 3e38, -3e38], np.float32)
        idx = g.integers(0, n, size=max(1, n // 7))
        v[idx] = specials[g.integers(0, specials.size, size=idx.size)]
    return v.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# 1. single process: stages and simulated calls, torch ops against the C++ kernels

if _have("hypothesis"):
    from hypothesis import given, settings
    from hypothesis import strategies as st
else:  # pragma: no cover - hypothesis is a test dependency
    given = None


def _cxx_call(inputs, wes, ses):
    """One simulated W-rank call through the C++ stages; returns the common output."""
    import numpy as np

    from deepio import _comm

    w = len(inputs)
    n = wes[0].size
    c = n // w
    stride = _comm.block_stride(c)
    sends = []
    for r in range(w):
        send = np.empty(w * stride, np.uint8)
        _comm.worker_stage(inputs[r], wes[r], w, send)
        sends.append(send)
    owns = []
    for r in range(w):
        recv = np.concatenate([sends[j][r * stride : (r + 1) * stride] for j in range(w)])
        own = np.empty(stride, np.uint8)
        _comm.server_stage(recv, ses[r], w, own)
        owns.append(own)
    out = np.empty(inputs[0].size, np.float32)
    _comm.decode(np.concatenate(owns), w, c, out)
    return out


def _torch_call(inputs, wes, ses):
    """The same call through deepio.comm._torchops on torch tensors (of the inputs' device)."""
    import torch

    from deepio.comm import _torchops

    w = len(inputs)
    n = wes[0].numel()
    c = n // w
    stride = c // 8 + 4
    dev = wes[0].device
    sends = []
    for r in range(w):
        send = torch.empty(w * stride, dtype=torch.uint8, device=dev)
        _torchops.worker_stage(inputs[r], wes[r], w, send)
        sends.append(send)
    owns = []
    for r in range(w):
        recv = torch.cat([sends[j][r * stride : (r + 1) * stride] for j in range(w)])
        own = torch.empty(stride, dtype=torch.uint8, device=dev)
        _torchops.server_stage(recv, ses[r], w, own)
        owns.append(own)
    out = torch.empty(inputs[0].numel(), dtype=torch.float32, device=dev)
    _torchops.decode(torch.cat(owns), w, c, out)
    return out.cpu()


if given is not None:

    @needs_comm
    @settings(max_examples=40, deadline=None)
    @given(
        w=st.integers(1, 5),
        groups=st.integers(1, 300),
        short=st.integers(0, 40),
        calls=st.integers(1, 4),
        nasty=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def test_simulated_calls_equal_cxx(w, groups, short, calls, nasty, seed):
        _simulated_calls(w, groups, short, calls, nasty, seed, "cpu")

    @needs_comm
    @pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    @settings(max_examples=40, deadline=None)
    @given(
        w=st.integers(1, 5),
        groups=st.integers(1, 3000),
        short=st.integers(0, 40),
        calls=st.integers(1, 4),
        nasty=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def test_simulated_calls_on_gpu_equal_cxx(w, groups, short, calls, nasty, seed):
        # The same on CUDA tensors: the GPU's fp32/fp64 arithmetic must give the C++ bytes.
        _simulated_calls(w, groups, short, calls, nasty, seed, "cuda")

    def _simulated_calls(w, groups, short, calls, nasty, seed, device):
        import numpy as np
        import torch

        n = 8 * w * groups
        n0 = max(0, n - short)
        g = np.random.default_rng(seed)
        wes_c = [_values(g, n, nasty) for _ in range(w)]  # nonzero residuals from the start
        ses_c = [_values(g, n // w, nasty) for _ in range(w)]
        wes_t = [torch.from_numpy(e.copy()).to(device) for e in wes_c]
        ses_t = [torch.from_numpy(e.copy()).to(device) for e in ses_c]
        for call in range(calls):
            inputs = [_values(g, n0, nasty) for _ in range(w)]
            out_c = _cxx_call(inputs, wes_c, ses_c)
            out_t = _torch_call([torch.from_numpy(x.copy()).to(device) for x in inputs], wes_t, ses_t)
            assert _same(out_c.tobytes(), out_t), f"output differs at call {call}"
            for r in range(w):
                assert _same(wes_c[r].tobytes(), wes_t[r].cpu()), f"worker_error of rank {r}, call {call}"
                assert _same(ses_c[r].tobytes(), ses_t[r].cpu()), f"server_error of rank {r}, call {call}"

    @needs_comm
    @settings(max_examples=60, deadline=None)
    @given(rows=st.integers(1, 3000), nasty=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def test_scale_equals_cxx(rows, nasty, seed):
        # The norm over one chunk, across leaf (512) and tree boundaries: the C++ worker stage
        # at W = 1 returns it; the torch one must return the same float.
        import numpy as np
        import torch

        from deepio import _comm
        from deepio.comm import _torchops

        g = np.random.default_rng(seed)
        x = _values(g, 8 * rows, nasty)
        zeros = np.zeros(8 * rows, np.float32)
        send = np.empty(rows + 4, np.uint8)
        s_c = np.float32(_comm.worker_stage(x, zeros, 1, send))
        s_t = _torchops.scale_of(torch.from_numpy(x))
        assert _same(s_c.tobytes(), s_t.reshape(1))


@needs_comm
def test_packing_matches_cxx_kernels():
    import numpy as np
    import torch

    import deepio.comm as dcomm
    from deepio.comm import _torchops

    g = np.random.default_rng(5)
    x = _values(g, 8 * 1001, True)
    x[:4] = [np.nan, -np.nan, -0.0, 0.0]
    packed = torch.empty(1001, dtype=torch.uint8)
    _torchops.pack(~(torch.from_numpy(x) < 0), packed)
    assert packed.numpy().tobytes() == dcomm.pack_signs(x).tobytes()
    assert _torchops.unpack(packed).numpy().tolist() == (np.unpackbits(packed.numpy()) == 1).tolist()


@needs_comm
def test_engine_argument_is_checked():
    import torch

    import deepio.comm as dcomm

    with pytest.raises(ValueError, match="engine must be one of"):
        dcomm.compressed_allreduce_torch(torch.zeros(8), torch.zeros(8), torch.zeros(8), engine="gpu")


# ---------------------------------------------------------------------------------------------
# 2. under mpirun

CASES = ["engines_agree", "cuda_aware_detection", "nccl_backend_on_gloo", "torch_ops_errors", "dump_results"]
_results: dict = {}


def _run_world(np_, out_dir):
    key = (np_, str(out_dir))
    if key not in _results:
        _results[key] = run_world(HERE, np_, 300, {"DEEPIO_TEST_OUT": str(out_dir)})
    return _results[key]


@pytest.fixture(scope="module")
def mpi_out(tmp_path_factory):
    return tmp_path_factory.mktemp("mpi_results")


@needs_comm
@needs_mpirun
@pytest.mark.parametrize("case", CASES)
# Two ranks in the default run; three and four (slow) in the full run (scripts/test.sh --full).
@pytest.mark.parametrize("np_", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_torchops_mpi(np_, case, mpi_out):
    res, rc, out, err = _run_world(np_, mpi_out)
    if case not in res:
        pytest.fail(f"no result for {case} (mpirun rc={rc})\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    d = res[case]
    if d["status"] == "skip":
        pytest.skip(d["detail"])
    assert d["status"] == "pass", d["detail"]


@needs_comm
@needs_mpirun
@pytest.mark.parametrize("np_", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_nccl_backend_gloo_ranks_equal_mpi_path(np_, mpi_out, tmp_path):
    # Plain torch.distributed ranks (no MPI in these processes) against the MPI job's files.
    res, rc, out, err = _run_world(np_, mpi_out)
    assert res.get("dump_results", {}).get("status") == "pass", f"mpi side failed: {res}\n{err[-3000:]}"
    port = _free_port()
    procs = []
    for r in range(np_):
        env = dict(os.environ, DEEPIO_TEST_OUT=str(tmp_path), RANK=str(r), WORLD_SIZE=str(np_), PORT=str(port))
        cmd = [*_python(), HERE, "--gloo-worker"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    for r in range(np_):
        for name in ("out", "we", "se"):
            mpi_file = mpi_out / f"np{np_}_r{r}_{name}.bin"
            for engine in ("native", "torch"):
                gloo_file = tmp_path / f"np{np_}_r{r}_{name}_{engine}.bin"
                assert gloo_file.read_bytes() == mpi_file.read_bytes(), f"rank {r} {name} ({engine} engine)"


@needs_comm
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_nccl_backend_one_rank_on_gpu(tmp_path):
    # NCCL refuses two ranks on one GPU, so on a one-GPU machine NcclBackend runs at one rank:
    # CUDA tensors through NCCL against CPU tensors through gloo (native engine), 4 calls.
    code = f"""
import torch, torch.distributed as dist
import deepio.comm as dcomm
dist.init_process_group("cpu:gloo,cuda:nccl", init_method="tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
n0, n = 8 * 700 - 13, 8 * 700
g = torch.Generator().manual_seed(3)
be = dcomm.NcclBackend()
dev = (torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda"))
host = (torch.zeros(n), torch.zeros(n))
for call in range(4):
    x = torch.rand(n0, generator=g) - 0.5
    a = be.compressed_allreduce(x.clone(), host[0], host[1], 0)
    b = be.compressed_allreduce(x.cuda(), dev[0], dev[1], 0)
    assert torch.equal(a.view(torch.int32), b.cpu().view(torch.int32)), call
    assert torch.equal(host[0].view(torch.int32), dev[0].cpu().view(torch.int32)), call
    assert torch.equal(host[1].view(torch.int32), dev[1].cpu().view(torch.int32)), call
dist.destroy_process_group()
print("ok")
"""
    p = subprocess.run([*_python(), "-c", code], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# worker side


def _inputs(n0, rank, call):
    import torch

    from comm_mpi_support import make_input

    return torch.from_numpy(make_input(n0, rank, call, 1414))


N_CALLS = 5


def _sizes(w):
    n0 = 8 * w * 700 - 13  # several leaves per chunk, a padded tail
    return n0, 8 * w * 700


def case_engines_agree(comm):
    import torch

    import deepio.comm as dcomm

    w, me = comm.Get_size(), comm.Get_rank()
    for n0, n in (_sizes(w), (8 * w * 3, 8 * w * 3), (5, 8 * w)):
        state = {e: (torch.zeros(n), torch.zeros(n // w)) for e in ("native", "torch", "staged", "fn")}
        be = {
            "native": dcomm.MpiBackend(engine="native"),
            "torch": dcomm.MpiBackend(engine="torch"),
            "staged": dcomm.MpiBackend(engine="torch"),
        }
        # The staging route of device tensors, run on CPU tensors: a transport that claims to take
        # "cuda" memory makes the engine copy only the packed blocks into (here unpinned) host
        # buffers, exchange those, and copy the received blocks back.
        be["staged"]._transport.device_type = "cuda"
        for call in range(N_CALLS):
            x = _inputs(n0, me, call)
            outs = {e: be[e].compressed_allreduce(x.clone(), *state[e], me) for e in be}
            y = x.clone()
            padded = torch.zeros(n)
            padded[:n0] = y
            # compressed_allreduce (function form) on the torch engine, in place on a padded buffer
            outs["fn"] = dcomm.compressed_allreduce(padded, *state["fn"], engine="torch")[:n0]
            for e in ("torch", "staged", "fn"):
                assert _bits(outs[e]) == _bits(outs["native"]), f"output {e} n0={n0} call {call}"
                for i in (0, 1):
                    assert _bits(state[e][i]) == _bits(state["native"][i]), f"residual {i} {e} n0={n0} call {call}"
        # What was staged: the W packed blocks out, this rank's block out, W blocks back in each
        # way; device->host bytes per call <= 1/16 of the fp32 buffer at realistic sizes.
        stride = n // w // 8 + 4
        staging = be["staged"]._transport._staging
        assert staging["a2a"][0].numel() == w * stride and staging["ag"][0].numel() == w * stride
        if n >= 8 * w * 700:
            assert w * stride + stride <= 4 * n // 16, (w, n, stride)
        # every rank holds the same output
        allout = comm.allgather(_bits(outs["torch"]))
        assert all(o == allout[0] for o in allout)
    # NumPy buffers through the torch engine land in place too
    import numpy as np

    n0, n = _sizes(w)
    a = np.zeros(n, np.float32)
    a[:n0] = _inputs(n0, me, 0).numpy()
    b = a.copy()
    wa, wb = np.zeros(n, np.float32), np.zeros(n, np.float32)
    sa, sb = np.zeros(n // w, np.float32), np.zeros(n // w, np.float32)
    dcomm.compressed_allreduce(a, wa, sa, engine="native")
    dcomm.compressed_allreduce(b, wb, sb, engine="torch")
    assert a.tobytes() == b.tobytes() and wa.tobytes() == wb.tobytes() and sa.tobytes() == sb.tobytes()


def case_cuda_aware_detection(comm):
    import warnings

    import deepio.comm as dcomm

    ok, reason = dcomm.mpi_cuda_support()
    # Cross-check with the installation's own report (build-time flag).
    ompi_info = shutil.which("ompi_info")
    if ompi_info:
        text = subprocess.run([ompi_info, "--parsable", "--all"], capture_output=True, text=True).stdout
        built = [ln.rsplit(":", 1)[1] for ln in text.splitlines() if "built_with_cuda_support:value" in ln]
        assert built, "ompi_info does not report built_with_cuda_support"
        assert ok == (built[0] == "true"), (ok, reason, built)
    if ok:
        with warnings.catch_warnings():
            warnings.simplefilter("error", dcomm.CudaAwareWarning)
            assert dcomm.MpiBackend(cuda_aware=True).direct
        return
    assert "MPIX_Query_cuda_support() = 0" in reason or "no CUDA-support query" in reason, reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        be = dcomm.MpiBackend(cuda_aware=True)
        be2 = dcomm.MpiBackend(cuda_aware=True)  # once per process: no second warning
        quiet = dcomm.MpiBackend(cuda_aware=False)
    ours = [c for c in caught if issubclass(c.category, dcomm.CudaAwareWarning)]
    assert len(ours) == 1, [str(c.message) for c in caught]
    msg = str(ours[0].message)
    assert reason in msg and "page-locked" in msg, msg
    assert not be.direct and not be2.direct and not quiet.direct
    assert be._transport.device_type == "cpu"


def case_nccl_backend_on_gloo(comm):
    import torch

    import deepio.comm as dcomm
    from comm_mpi_support import _init_gloo

    _init_gloo(comm)
    w, me = comm.Get_size(), comm.Get_rank()
    n0, n = _sizes(w)

    class Mpu:  # DeepSpeed's mpu protocol: the data-parallel group
        def get_data_parallel_group(self):
            return None

    backends = {
        "mpi": dcomm.MpiBackend(),
        "nccl_native": dcomm.NcclBackend(),
        "nccl_torch": dcomm.NcclBackend(mpu=Mpu(), engine="torch"),
        "fn_torch": None,
    }
    state = {k: (torch.zeros(n), torch.zeros(n // w)) for k in backends}
    for call in range(N_CALLS):
        x = _inputs(n0, me, call)
        outs = {}
        for k, b in backends.items():
            if b is None:
                p = torch.zeros(n)
                p[:n0] = x
                outs[k] = dcomm.compressed_allreduce_torch(p, *state[k], engine="torch")[:n0]
            else:
                outs[k] = b.compressed_allreduce(x.clone(), *state[k], me)
        for k in backends:
            assert _bits(outs[k]) == _bits(outs["mpi"]), f"{k} call {call}"
            assert _bits(state[k][0]) == _bits(state["mpi"][0]) and _bits(state[k][1]) == _bits(state["mpi"][1]), k


def case_torch_ops_errors(comm):
    import torch

    import deepio.comm as dcomm
    from comm_mpi_support import _expect_value_error_everywhere

    w, me = comm.Get_size(), comm.Get_rank()
    n = 8 * w * 4
    be = dcomm.MpiBackend(engine="torch")
    _expect_value_error_everywhere(
        comm,
        lambda: be.compressed_allreduce(torch.ones(n), torch.zeros(n + 8 if me == 0 else n), torch.zeros(n // w), 0),
        "invalid arguments on rank 0",
        "worker_not_multiple",
        0,
    )
    _expect_value_error_everywhere(
        comm,
        lambda: be.compressed_allreduce(torch.ones(n - 1 if me == w - 1 else n), torch.zeros(n), torch.zeros(n // w)),
        "input length differs across ranks",
        "input_mismatch",
        -1,
    )
    buf = torch.ones(n)
    _expect_value_error_everywhere(
        comm,
        lambda: be.compressed_allreduce(buf, torch.zeros(n), buf[: n // w] if me == 0 else torch.zeros(n // w), 0),
        "overlaps another argument",
        "error_overlap",
        0,
    )
    # Local refusals (no collective): a dtype, a device mix (the meta device stands in for a GPU).
    with_f64 = (torch.ones(n, dtype=torch.float64), torch.zeros(n), torch.zeros(n // w))
    mixed = (torch.ones(n), torch.zeros(n, device="meta"), torch.zeros(n // w))
    for args, needle in ((with_f64, "float32"), (mixed, "one device")):
        try:
            be.compressed_allreduce(*args)
            raise AssertionError(f"accepted: {needle}")
        except TypeError as e:
            assert needle in str(e), e
    # The function form checks the error buffers as the backend does (ours, not torch's error).
    strided = torch.zeros(2 * n)[::2]
    for args, exc, needle in (
        ((torch.ones(n), strided, torch.zeros(n // w)), ValueError, "worker_error must be a 1-D contiguous"),
        ((torch.ones(n), torch.zeros(n), torch.zeros(n // w, device="meta")), TypeError, "one device"),
    ):
        try:
            dcomm.compressed_allreduce(*args, engine="torch")
            raise AssertionError(f"accepted: {needle}")
        except exc as e:
            assert needle in str(e), e
    x = torch.ones(n)
    be.compressed_allreduce(x, torch.zeros(n), torch.zeros(n // w))  # still in step
    assert torch.equal(x, torch.ones(n))


def case_dump_results(comm):
    # The MPI path's results (native engine) for the gloo-only ranks of the pytest side.
    import torch

    import deepio.comm as dcomm

    w, me = comm.Get_size(), comm.Get_rank()
    n0, n = _sizes(w)
    we, se = torch.zeros(n), torch.zeros(n // w)
    be = dcomm.MpiBackend()
    for call in range(N_CALLS):
        out = be.compressed_allreduce(_inputs(n0, me, call), we, se, me)
    d = os.environ["DEEPIO_TEST_OUT"]
    for name, t in (("out", out), ("we", we), ("se", se)):
        with open(os.path.join(d, f"np{w}_r{me}_{name}.bin"), "wb") as f:
            f.write(_bits(t))


def worker_main():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    for case in CASES:
        status, detail = "pass", ""
        try:
            globals()["case_" + case](comm)
        except Exception as e:
            if type(e).__name__ == "Skip":
                status, detail = "skip", str(e)
            else:
                status, detail = "fail", f"rank {me}: " + traceback.format_exc()
        statuses = comm.gather((status, detail), root=0)
        if me == 0:
            kinds = {s for s, _ in statuses}
            final = "fail" if "fail" in kinds else ("skip" if kinds == {"skip"} else "pass")
            details = "\n".join(d for s, d in statuses if s == final and d)
            print(json.dumps({"case": case, "status": final, "detail": details}), flush=True)
        comm.Barrier()


def gloo_worker_main():
    import torch
    import torch.distributed as dist

    import deepio.comm as dcomm

    me, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}", rank=me, world_size=w)
    n0, n = _sizes(w)
    for engine in ("native", "torch"):
        we, se = torch.zeros(n), torch.zeros(n // w)
        be = dcomm.NcclBackend(engine=engine)
        for call in range(N_CALLS):
            out = be.compressed_allreduce(_inputs(n0, me, call), we, se, me)
        for name, t in (("out", out), ("we", we), ("se", se)):
            with open(os.path.join(os.environ["DEEPIO_TEST_OUT"], f"np{w}_r{me}_{name}_{engine}.bin"), "wb") as f:
                f.write(_bits(t))
    dist.destroy_process_group()


if __name__ == "__main__" and "--worker" in sys.argv:
    worker_main()
if __name__ == "__main__" and "--gloo-worker" in sys.argv:
    gloo_worker_main()
