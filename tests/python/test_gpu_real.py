"""GPU tensors on a real GPU (torch with CUDA): DeepNVMe's §5.2 GDS checklist and the GPU
rows of §5.1/§5.3, in Python. Every test carries needs_gpu and skips with the reason where
torch has no CUDA device (here: the development machines). Run on a GPU machine with
    python -m pytest tests/python/test_gpu_real.py -v
(and DEEPIO_TEST_DIR pointing at a local NVMe ext4/xfs folder for GPUDirect Storage)."""

from __future__ import annotations

import threading

import pytest

import deepio

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


def _gpu_reason() -> str:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA GPU (torch {torch.__version__}: torch.cuda.is_available() is False)"
    info = deepio.gpu_info()
    if not info["cuda_found"]:
        return f"deepio cannot use the CUDA driver: {info['cuda_reason']}"
    return ""


GPU_REASON = _gpu_reason()
needs_gpu = pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")

BLOCK, QD, IO, PAR = 262144, 2, 1 << 20, 2


def ref(n: int):
    return torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")


@needs_gpu
@pytest.mark.parametrize("nbytes", [IO, IO + 4097, 777])
@pytest.mark.parametrize("single_submit,overlap", [(False, False), (True, True)])
def test_aio_handle_gpu_tensor_roundtrip(tmp_dir, nbytes, single_submit, overlap):
    h = deepio.aio_handle(1024, 2, single_submit, overlap, 2)
    t = ref(nbytes)
    f = str(tmp_dir / "a.bin")
    assert h.async_pwrite(t, f) == 0 and h.wait() == 1
    out = torch.zeros_like(t)
    assert h.sync_pread(out, f) == 1
    assert torch.equal(out, t)
    cpu = torch.empty(nbytes, dtype=torch.uint8)
    assert h.sync_pread(cpu, f) == 1  # written from the GPU, read back on the CPU
    assert torch.equal(cpu, t.cpu())


@needs_gpu
@pytest.mark.parametrize("nbytes", [IO, IO + 4097, 777])
@pytest.mark.parametrize("mode", ["auto", "compat"])
def test_gds_checklist(tmp_dir, nbytes, mode):
    h = deepio.gds_handle(BLOCK, QD, False, False, PAR, mode=mode)
    print("gds mode:", h.mode, h.mode_reason)
    assert h.get_intra_op_parallelism() == PAR
    t = h.new_pinned_device_tensor(nbytes, torch.empty(0, dtype=torch.uint8, device="cuda"))
    t.copy_(ref(nbytes))
    f = str(tmp_dir / "g.bin")
    assert h.sync_pwrite(t, f) == 1
    out = torch.zeros_like(t)
    h.pin_device_tensor(out)
    assert h.async_pread(out, f) == 0 and h.wait() == 1
    assert torch.equal(out, t)
    # a view inside a pinned buffer, at an offset
    half = nbytes // 2
    out.zero_()
    assert h.sync_pread(out.narrow(0, half, nbytes - half), f, half) == 1
    assert torch.equal(out[half:], t[half:])
    assert h.unpin_device_tensor(out) and h.free_pinned_device_tensor(t)


@needs_gpu
def test_concurrent_gpu_and_cpu_ops_on_one_handle(tmp_dir):
    h = deepio.aio_handle(4096, 2, True, True, 2)
    g, c = ref(IO), torch.randint(0, 255, (IO,), dtype=torch.uint8)
    fg, fc = str(tmp_dir / "g"), str(tmp_dir / "c")
    h.sync_pwrite(g, fg)
    h.sync_pwrite(c, fc)
    og, oc = torch.zeros_like(g), torch.zeros_like(c)
    res = []
    ts = [
        threading.Thread(target=lambda: res.append(h.sync_pread(og, fg))),
        threading.Thread(target=lambda: res.append(h.sync_pread(oc, fc))),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert res == [1, 1] and torch.equal(og, g) and torch.equal(oc, c)


@needs_gpu
def test_dcp_of_cuda_tensors_with_either_reader(tmp_dir, monkeypatch):
    # deepio.dcp on CUDA state: saved by deepio's writer (CUDA tensors large enough for the
    # filling route, staged from device memory through host buffers in several pieces; a view;
    # an unaligned size; a CPU tensor and bytes), loaded into CUDA destinations by deepio's
    # reader (straight into them through the engine's GPU path) and by torch's, and torch's
    # checkpoint by deepio's reader. The files are torch's byte for byte (its writer takes the
    # tensors smallest first here: one thread and a GPU).
    import torch.distributed.checkpoint as dcp

    import deepio.dcp
    from deepio.checkpoint import _filling
    from deepio.dcp import _reader

    monkeypatch.setattr(_filling, "_STAGE_CHUNK", 5 << 20)  # the 12 MiB tensor in 3 pieces
    staged: list[int] = []
    real_staged = _filling.FillingWriter._write_staged

    def staging(self, src):
        staged.append(int(src.numel()))
        return real_staged(self, src)

    monkeypatch.setattr(_filling.FillingWriter, "_write_staged", staging)
    into: list[str] = []  # the device of each destination read straight into
    real_destination = _reader.FileSystemReader._destination

    def destination(req, lay, planner):
        got = real_destination(req, lay, planner)
        if got is not None:
            into.append(got[0].device.type)
        return got

    monkeypatch.setattr(_reader.FileSystemReader, "_destination", staticmethod(destination))

    def state(fill: bool) -> dict:
        g = torch.Generator(device="cuda").manual_seed(7)
        big = torch.randn(3 << 20, device="cuda", generator=g)  # 12 MiB
        made = {
            "big": big,
            "odd": torch.randn((1 << 18) + 3, device="cuda", generator=g).to(torch.bfloat16),
            "view": big[4096:8192].clone(),
            "cpu": torch.arange(1000, dtype=torch.int64),
            "step": 3,
        }
        if not fill:
            made = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in made.items()}
        return made

    want = state(True)
    dcp.save(want, storage_writer=deepio.dcp.FileSystemWriter(tmp_dir / "d"))
    assert staged == [want["big"].nbytes]
    dcp.save(want, storage_writer=dcp.FileSystemWriter(tmp_dir / "t"))
    for folder, reader in (
        (tmp_dir / "d", deepio.dcp.FileSystemReader),
        (tmp_dir / "d", dcp.FileSystemReader),
        (tmp_dir / "t", deepio.dcp.FileSystemReader),
    ):
        got = state(False)
        dcp.load(got, storage_reader=reader(folder))
        for k, v in want.items():
            if isinstance(v, torch.Tensor):
                assert got[k].device == v.device and torch.equal(got[k], v), (folder.name, reader, k)
    assert into.count("cuda") == 3 * 2  # "big", "odd" and "view" (> 8 KiB), from both folders
    assert {p.name: p.read_bytes() for p in (tmp_dir / "d").glob("*.distcp")} == {
        p.name: p.read_bytes() for p in (tmp_dir / "t").glob("*.distcp")
    }


@needs_gpu
def test_deepio_save_of_cuda_tensors_loads_in_torch_and_deepio(tmp_dir):
    # deepio.save's CUDA route: storages on the GPU, a view, a CPU tensor sharing the file, and a
    # storage large enough to span several write buffers; torch.load and deepio.load (to the
    # CPU and back to cuda) give the same tensors on the same devices.
    g = torch.Generator(device="cuda").manual_seed(5)
    big = torch.randn(5 << 20, device="cuda", generator=g)  # 20 MiB: more than one 16 MiB buffer
    obj = {
        "big": big,
        "view": big[1000:3000],
        "bf16": torch.randn(333, 7, device="cuda", generator=g).to(torch.bfloat16),
        "cpu": torch.arange(100, dtype=torch.int64),
        "scalar": torch.tensor(3.5, device="cuda"),
    }
    f = tmp_dir / "cuda.pt"
    deepio.save(obj, f)
    for loaded in (torch.load(f, weights_only=True), deepio.load(f, weights_only=True)):
        assert set(loaded) == set(obj)
        for k, v in obj.items():
            assert loaded[k].device == v.device, k
            assert torch.equal(loaded[k], v), k
        assert loaded["view"].untyped_storage().data_ptr() == loaded["big"].untyped_storage().data_ptr()
    on_cpu = deepio.load(f, map_location="cpu", weights_only=True)
    assert all(t.device.type == "cpu" for t in on_cpu.values())
    assert torch.equal(on_cpu["big"], big.cpu())
    back = deepio.load(f, map_location="cuda", weights_only=True)
    assert back["cpu"].is_cuda and torch.equal(back["cpu"].cpu(), obj["cpu"])


@needs_gpu
def test_kv_store_round_trips_a_cuda_pool(tmp_dir):
    """deepio.kv.Store with a torch CUDA pool: put, get into other rows, bytes compared on the
    GPU; a missing key leaves its row untouched (docs/kv.md, "CUDA memory")."""
    import deepio.kv

    page, rows = 1 << 20, 8
    pool = torch.zeros((rows, page), dtype=torch.uint8, device="cuda")
    pool[:4] = torch.randint(0, 255, (4, page), dtype=torch.uint8, device="cuda")
    pool[7] = 0xEE
    want = pool[:4].clone()
    # no synchronize: the store's copies follow torch's current stream (docs/kv.md)
    with deepio.kv.Store([str(tmp_dir / "kv")], capacity_bytes=16 * (page + 4096), page_bytes=page) as store:
        store.register(pool)
        assert store.put(["a", "b", "c", "d"], [0, 1, 2, 3]).result(timeout=60) == [True] * 4
        assert store.get(["d", "c", "b", "a", "zz"], [4, 5, 6, 3, 7]).result(timeout=60) == [True] * 4 + [False]
        assert torch.equal(pool[3:7], torch.stack([want[0], want[3], want[2], want[1]]))
        assert bool((pool[7] == 0xEE).all())
        assert store.stats()["device_pages"] == 8
