"""deepio.comm engines on torch tensors, under mpirun (a program, not a test).

    mpirun --allow-run-as-root --oversubscribe -np 2 python3 bench/comm/bench_torch_ops.py \
        [--log2n 20 22 24] [--pairs 7] [--json]

Rows (one compressed allreduce per call, medians over interleaved pairs A B A B ...):

* CPU tensors: the C++ kernels (``engine="native"``) against torch's own operations
  (``engine="torch"``, the code that compresses CUDA tensors on the GPU), so the cost of the
  torch-ops path is known where no GPU is. Both give the same bits (checked after timing).
* CUDA tensors (only when torch sees a GPU; else printed as "not measured: no GPU"): the torch
  engine on device buffers (``cuda_aware=False``: packed blocks staged through page-locked host
  memory; ``cuda_aware=True`` when the MPI is CUDA-aware), the native engine on device buffers
  (whole buffers copied to the host and back: the pre-issue-14 behaviour), the same call on CPU
  tensors, and ``MPI_Allreduce`` (mpi4py ``Allreduce``, SUM) of the same fp32 buffer.

Columns: seconds per call (median, rank 0's clock after a barrier), "GiB/s" = fp32 buffer bytes /
time, "CPU s/GiB" = this process's CPU seconds per GiB of buffer (rank 0), and the bytes each call
moves device->host ("D2H/call") where it applies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from mpi4py import MPI

import deepio.comm as dcomm


def timed(comm, fn):
    comm.Barrier()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    comm.Barrier()
    return time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, nargs="+", default=[20, 22, 24])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    w, me = comm.Get_size(), comm.Get_rank()
    gpu = torch.cuda.is_available()
    cuda_ok, cuda_reason = dcomm.mpi_cuda_support()
    rows = []
    if me == 0:
        print(
            f"# bench_torch_ops: W={w} ranks, pairs={args.pairs}, torch {torch.__version__}, "
            f"threads/rank {torch.get_num_threads()}, C++ kernel {dcomm.best_kernel()}, "
            f"MPI {MPI.Get_library_version().split(',')[0]}"
        )
        print(f"# GPU: {torch.cuda.get_device_name(0) if gpu else 'none'}; CUDA-aware MPI: {cuda_ok} ({cuda_reason})")
        print(f"{'row':44s} {'log2n':>5s} {'s/call':>9s} {'GiB/s':>7s} {'CPU s/GiB':>9s} {'D2H/call':>12s}")

    def emit(name, log2n, samples, d2h=""):
        if me != 0:
            return
        t = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        gib = 4 * 2**log2n / 2**30
        rows.append({"row": name, "log2n": log2n, "s_per_call": t, "gib_s": gib / t, "cpu_s_per_gib": cpu / gib})
        print(f"{name:44s} {log2n:5d} {t:9.4f} {gib / t:7.2f} {cpu / gib:9.3f} {d2h:>12s}", flush=True)

    def one_size(log2n):
        n = dcomm.padded_size(2**log2n, w)
        g = torch.Generator().manual_seed(me)
        x = torch.rand(n, generator=g) - 0.5
        # CPU tensors: native vs torch engine, interleaved, independent residuals.
        be = {e: dcomm.MpiBackend(engine=e) for e in ("native", "torch")}
        st = {e: (torch.zeros(n), torch.zeros(n // w)) for e in be}
        res = {e: [] for e in be}
        bufs = {e: x.clone() for e in be}
        for _ in range(args.pairs + 1):  # the first pair warms up
            for e in ("native", "torch"):
                bufs[e].copy_(x)
                res[e].append(timed(comm, lambda e=e: be[e].compressed_allreduce(bufs[e], *st[e], me)))
        for e in ("native", "torch"):
            emit(f"cpu tensors, engine={e}", log2n, res[e][1:])
        same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(st["native"], st["torch"]))
        same = same and torch.equal(bufs["native"].view(torch.int32), bufs["torch"].view(torch.int32))
        if not comm.allreduce(same, op=MPI.LAND):
            raise SystemExit("engines disagree")
        stride = n // w // 8 + 4
        d2h = f"{w * stride + stride} B"
        if not gpu:
            if me == 0:
                for name in (
                    "cuda tensors, torch engine, cuda_aware=False",
                    "cuda tensors, torch engine, cuda_aware=True",
                    "cuda tensors, native engine (whole copies)",
                    "MPI_Allreduce fp32 of the cuda buffer",
                ):
                    print(f"{name:44s} {log2n:5d} not measured: no GPU")
            return
        dev = torch.device("cuda", me % torch.cuda.device_count())
        xd = x.to(dev)
        cases = {
            "cuda tensors, torch engine, cuda_aware=False": (dcomm.MpiBackend(cuda_aware=False), d2h),
            "cuda tensors, torch engine, cuda_aware=True": (
                dcomm.MpiBackend(cuda_aware=True),
                "0 B" if cuda_ok else d2h,
            ),
            "cuda tensors, native engine (whole copies)": (dcomm.MpiBackend(engine="native"), f"{4 * n * 3} B"),
        }
        st = {k: (torch.zeros(n, device=dev), torch.zeros(n // w, device=dev)) for k in cases}
        res = {k: [] for k in cases}
        res["MPI_Allreduce fp32 of the cuda buffer"] = []
        bd = xd.clone()
        host = torch.empty(n)

        def allreduce():
            if cuda_ok:
                torch.cuda.synchronize()
                comm.Allreduce(MPI.IN_PLACE, [bd, MPI.FLOAT], op=MPI.SUM)
            else:
                host.copy_(bd)
                comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.SUM)
                bd.copy_(host)

        for _ in range(args.pairs + 1):
            for k, (b, _) in cases.items():
                bd.copy_(xd)

                def call(b=b, k=k):
                    b.compressed_allreduce(bd, *st[k], me)
                    torch.cuda.synchronize()

                res[k].append(timed(comm, call))
            bd.copy_(xd)
            res["MPI_Allreduce fp32 of the cuda buffer"].append(timed(comm, allreduce))
        for k, (_, d) in cases.items():
            emit(k, log2n, res[k][1:], d)
        emit(
            "MPI_Allreduce fp32 of the cuda buffer",
            log2n,
            res["MPI_Allreduce fp32 of the cuda buffer"][1:],
            "0 B" if cuda_ok else f"{4 * n} B",
        )

    for log2n in args.log2n:
        one_size(log2n)
    if args.json and me == 0:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
