"""Large deepio.save calls: the storage-filling route with CRC-32s computed beside the writes,
storages written by direct I/O straight from their own memory, torch.load computing the
records' offsets, saves from many threads, objects that pickle differently the second time,
and the restart on the plain route when torch refuses a skip."""

from __future__ import annotations

import subprocess
import zlib

import pytest

import deepio
from checkpoint_support import _leftovers, assert_same, raw
from conftest import require_module

np = require_module("numpy")
torch = require_module("torch")


@pytest.mark.parametrize("stdlib_crc", [False, True], ids=["installed-crc", "zlib-crc"])
@pytest.mark.parametrize("crc32", [None, True, False])
def test_large_saves_compute_their_crcs_beside_the_writes(tmp_dir, monkeypatch, crc32, stdlib_crc):
    """Host storages of a save from _FILL_MIN bytes take the filling route; where CRC-32s are
    wanted: torch writes the zip without their bytes and CRCs, helper threads compute each
    CRC (zlib-ng's where installed, in pieces combined with its crc32_combine; else zlib's, one
    piece a storage: both run) while the Writer places the storage,
    and the CRCs are written into the data descriptors and the central directory afterwards.
    The file must be what zip tools accept (every CRC checked) and load in torch exactly;
    crc32=False leaves every CRC 0."""
    import zipfile

    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_FILL_MIN", 1 << 20)
    monkeypatch.setattr(checkpoint, "_CRC_PIECE", (1 << 20) - 64)  # storages' CRCs in pieces, combined
    if stdlib_crc:  # as without zlib-ng: no crc32_combine, one piece a storage
        monkeypatch.setattr(checkpoint, "_crc32", zlib.crc32)
        monkeypatch.setattr(checkpoint, "_crc32_combine", None)
    patched = []
    real_patch = checkpoint._patch_crcs
    monkeypatch.setattr(
        checkpoint, "_patch_crcs", lambda path, crcs: (patched.append(len(crcs)), real_patch(path, crcs))
    )
    base = torch.randn(3 << 18)  # 3 MiB across 1 MiB staging buffers
    sd = {
        "w": torch.randn(700, 1001),
        "half": torch.randn(333, 77).half(),
        "view": base[7:5000],
        "base": base,
        "empty": torch.zeros(0),
        "int": torch.arange(13, dtype=torch.int16),
        "n": [1, "x"],
    }
    p = tmp_dir / "big.pt"
    deepio.save(sd, p, crc32=crc32, buffer_size=1 << 20)
    for got in (torch.load(p), deepio.load(p)):
        assert_same(sd, got)
    with zipfile.ZipFile(p) as z:
        data = {i.filename: i.CRC for i in z.infolist() if "/data/" in i.filename and i.file_size}
        if crc32 is False:
            assert set(data.values()) == {0} and patched == []
            return
        assert z.testzip() is None
    want = sorted(zlib.crc32(raw(t)) for t in (sd["w"], sd["half"], base, sd["int"]))
    assert sorted(data.values()) == want
    assert patched == [4]  # the four non-empty host storages went by the filling route
    out = subprocess.run(["unzip", "-tq", str(p)], capture_output=True, text=True, check=False)
    if out.returncode != 127 and "not found" not in out.stderr:
        assert out.returncode == 0, out.stdout + out.stderr


def test_saves_take_zlib_ngs_crc_where_it_is_installed():
    """scripts/setup.sh installs zlib-ng (the "checkpoint" extra): deepio.save must then use its
    CRC-32 (3.5x zlib's on one core here), and it must agree with zlib's on every length and
    alignment a storage can have, views into numpy memory included."""
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
    import numpy as np

    from deepio import checkpoint

    assert checkpoint._crc32 is zlib_ng.crc32
    raw_bytes = np.random.default_rng(5).integers(0, 256, size=(1 << 20) + 77, dtype=np.uint8)
    for lo, n in [(0, 0), (0, 1), (3, 4095), (1, 1 << 20), (64, 65536 + 13), (0, raw_bytes.size)]:
        view = raw_bytes[lo : lo + n]
        assert checkpoint._crc32(view) == zlib.crc32(view), (lo, n)


def _page_aligned(t, shift: int = 0):
    """A copy of ``t`` in a storage of its own starting ``shift`` bytes past a page boundary
    (an anonymous mapping): page-aligned, as tensors torch.load(mmap=True) and deepio.load give
    from a page-aligned file, or torch's allocator gives under THP_MEM_ALLOC_ENABLE=1."""
    import mmap

    a = np.frombuffer(mmap.mmap(-1, t.nbytes + shift), dtype=np.uint8, count=t.nbytes, offset=shift)
    out = torch.from_numpy(a).view(t.dtype).reshape(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 4096 == shift
    return out


def _records(path) -> dict[str, tuple[int, bytes]]:
    """{record name: (file offset of its data, the data)} of a zip, from each record's local
    header (no CRC check: crc32=False leaves them 0)."""
    import zipfile

    from deepio import checkpoint

    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        out = {}
        for i in z.infolist():
            f.seek(i.header_offset)
            start = checkpoint._data_start(i.header_offset, f.read(30))
            f.seek(start)
            out[i.filename.split("/", 1)[1]] = (start, f.read(i.file_size))
        return out


@pytest.mark.parametrize("crc32", [None, False])
def test_large_saves_write_storages_from_their_own_memory(tmp_dir, monkeypatch, crc32):
    """A large save writes each storage of _IN_PLACE_MIN bytes or more whose memory the device
    takes for direct I/O through the engine straight from that memory, not copied into the
    staging buffers; its records start on page boundaries, so page-aligned memory (here an
    anonymous mapping) qualifies wherever the folder takes direct I/O. Memory the device does
    not take (64 bytes past a page where direct I/O wants 512: torch's allocator gives 64) is
    staged, never bounced through the engine's slots (slower). Storages whose length is no
    multiple of a block, views, and storages too small to go in place sit between them; the
    file is the one torch.load reads (zip tools too, with every CRC-32)."""
    import zipfile

    from deepio import _deepio, checkpoint

    copied = []
    real_copy = checkpoint._copy
    monkeypatch.setattr(checkpoint, "_copy", lambda dest, src: (copied.append(len(src)), real_copy(dest, src)))
    big = _page_aligned(torch.randn((3 << 20) + 5))  # 12 MiB and 20 bytes: a tail past the last block
    sd = {
        "aligned": _page_aligned(torch.randn(1 << 20)),  # 4 MiB
        "big_view": big[1000:],
        "odd": torch.randn((1 << 20) + 3),  # memory where torch's allocator put it
        "shifted": _page_aligned(torch.randn(1 << 20), shift=64),
        "small": torch.arange(1000, dtype=torch.int16),
        "half": torch.randn(1 << 21).half(),  # 4 MiB of another dtype
    }
    h = _deepio.Handle(block_size=1 << 20, queue_depth=32, intra_op_parallelism=2)
    p = tmp_dir / "inplace.pt"
    deepio.save(sd, p, crc32=crc32, handle=h, buffer_size=1 << 20)
    for got in (torch.load(p), deepio.load(p), torch.load(p, mmap=True)):
        assert_same(sd, got)
    stored = big.nbytes + sum(sd[k].nbytes for k in ("aligned", "odd", "shifted", "small", "half"))
    aligned = big.nbytes + sd["aligned"].nbytes
    records = _records(p)
    assert all(at % 4096 == 0 for name, (at, _) in records.items() if name.startswith("data/"))
    assert records[".storage_alignment"][1] == b"4096"
    if crc32 is None:
        with zipfile.ZipFile(p) as z:
            assert z.testzip() is None
    probe = _deepio.probe_direct_io(str(tmp_dir))
    stats = h.stats()
    assert stats["bytes_bounced"] == 0, stats
    if probe["supported"] and probe["mem_align"] <= 4096:
        assert sum(copied) <= stored - aligned + (1 << 20)  # the aligned storages were not copied
        assert stats["bytes_direct"] >= (big.nbytes // 4096 + sd["aligned"].nbytes // 4096) * 4096, stats
        if probe["mem_align"] > 64:
            assert sum(copied) >= sd["shifted"].nbytes
    else:  # no direct I/O here: everything staged
        assert sum(copied) >= stored


def test_a_checkpoint_deepio_loaded_saves_again_from_its_own_memory(tmp_dir, monkeypatch):
    """Resuming and saving again: deepio.load of a large deepio.save file gives page-aligned
    storages (its records are), so saving them again writes them straight from that memory
    wherever the folder takes direct I/O at page alignment, whatever torch's allocator gave
    the first time; the second file holds the same tensors."""
    from deepio import _deepio, checkpoint

    sd = {"embed": torch.randn(1 << 20), "w": torch.randn(1500, 1001), "b": torch.randn(1001)}
    first = tmp_dir / "first.pt"
    deepio.save(sd, first)
    loaded = deepio.load(first)
    assert all(loaded[k].untyped_storage().data_ptr() % 4096 == 0 for k in sd)
    copied = []
    real_copy = checkpoint._copy
    monkeypatch.setattr(checkpoint, "_copy", lambda dest, src: (copied.append(len(src)), real_copy(dest, src)))
    h = _deepio.Handle(block_size=1 << 20, queue_depth=32, intra_op_parallelism=2)
    second = tmp_dir / "second.pt"
    deepio.save(loaded, second, handle=h)
    assert_same(sd, torch.load(second))
    probe = _deepio.probe_direct_io(str(tmp_dir))
    if probe["supported"] and probe["mem_align"] <= 4096:
        large = sd["embed"].nbytes + sd["w"].nbytes
        assert sum(copied) < 1 << 20
        assert h.stats()["bytes_direct"] >= large // 4096 * 4096 - 4096


def test_saves_from_many_threads_at_once(tmp_dir):
    """Four threads save large state dicts at once through the shared checkpoint handle (the
    same page-aligned tensors written in place by all of them, torch-allocated ones staged,
    CRC-32s on each save's helper threads), two of them to one path, while a fifth loads: every
    file is whole (every CRC checked) and holds what was saved; of the shared path, one of the
    two saves."""
    import threading
    import zipfile

    shared = {"a": _page_aligned(torch.randn(1 << 20)), "b": _page_aligned(torch.randn((1 << 20) + 3))}
    own = [{"x": torch.full((1 << 20,), float(i)), "s": torch.arange(i + 5)} for i in range(4)]
    paths = [tmp_dir / f"t{i}.pt" for i in range(3)] + [tmp_dir / "t2.pt"]  # two threads on t2
    deepio.save(shared, tmp_dir / "read.pt")
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as e:  # reported below
            errors.append(e)

    def saver(i: int) -> None:
        for _ in range(2):
            deepio.save({**shared, **own[i]}, paths[i])

    def loader() -> None:
        for _ in range(4):
            assert_same(shared, deepio.load(tmp_dir / "read.pt"))

    threads = [threading.Thread(target=run, args=(lambda i=i: saver(i),)) for i in range(4)]
    threads.append(threading.Thread(target=run, args=(loader,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i, p in enumerate(paths[:2]):
        assert_same({**shared, **own[i]}, torch.load(p))
    got = torch.load(paths[2])
    assert any(torch.equal(got["x"], own[i]["x"]) and torch.equal(got["s"], own[i]["s"]) for i in (2, 3))
    assert_same(shared, {k: got[k] for k in shared})
    for p in set(paths):
        with zipfile.ZipFile(p) as z:
            assert z.testzip() is None
    assert _leftovers(tmp_dir) == []


@pytest.mark.parametrize("case", ["page-aligned", "many-small", "torch-without-the-record"])
def test_torch_load_computes_the_offsets_of_a_large_save(tmp_dir, monkeypatch, case):
    """torch.load can compute each storage's offset from the file's ``.storage_alignment``
    instead of reading the records' headers (torch's calculate_storage_offsets, checked against
    the headers under TORCH_SERIALIZATION_DEBUG=1): the record must say the alignment the file
    was written with, page-aligned or, where padding every record to a page would cost more
    than 1/64 of the bytes (thousands of small tensors), torch's own; under a torch whose
    serializer writes no such record, deepio.save writes it."""
    from torch.utils.serialization import config

    many_small = case == "many-small"
    if case == "torch-without-the-record":
        real_save = torch.serialization._save

        def save_without_the_record(obj, zip_file, *args):
            class Skipping:
                def __getattr__(self, name):
                    return getattr(zip_file, name)

                def write_record(self, name, data, nbytes):
                    if name != ".storage_alignment":
                        zip_file.write_record(name, data, nbytes)

            return real_save(obj, Skipping(), *args)

        monkeypatch.setattr(torch.serialization, "_save", save_without_the_record)

    sd = {"w": torch.randn(3 << 20), "b": torch.randn(1001)}
    if many_small:
        sd.update({f"n{i}": torch.randn(17) for i in range(3000)})
    p = tmp_dir / "offsets.pt"
    deepio.save(sd, p)
    records = _records(p)
    alignment = int(records[".storage_alignment"][1])
    assert alignment == (torch.serialization._get_storage_alignment() if many_small else 4096)
    assert all(at % alignment == 0 for name, (at, _) in records.items() if name.startswith("data/"))
    monkeypatch.setattr(config.load, "calculate_storage_offsets", True)
    monkeypatch.setenv("TORCH_SERIALIZATION_DEBUG", "1")
    got = torch.load(p, mmap=True)
    assert_same(sd, got)
    if not many_small:
        assert got["w"].data_ptr() % 4096 == 0


def test_a_torch_without_skip_data_saves_on_the_plain_route(tmp_dir, monkeypatch):
    """torch before 2.5 has no skip_data: large saves take the plain route (torch's CRCs)."""
    import zipfile

    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_FILL_MIN", 1 << 20)
    monkeypatch.setattr(checkpoint, "_patch_crcs", lambda path, crcs: pytest.fail("filling route taken"))
    monkeypatch.delattr(torch.serialization, "skip_data")
    sd = {"w": torch.randn(1 << 19), "b": torch.arange(3)}
    p = tmp_dir / "old-torch.pt"
    deepio.save(sd, p)
    assert_same(sd, torch.load(p))
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None


def test_crc_patching_leaves_a_file_it_cannot_read_alone(tmp_dir):
    """A file that is not the zip torch writes keeps its bytes; a warning names it."""
    from deepio import checkpoint

    p = tmp_dir / "not-a-zip.pt"
    p.write_bytes(b"PK\x03\x04 but nothing after it" * 10)
    before = p.read_bytes()
    with pytest.warns(RuntimeWarning, match="left without CRC-32"):
        checkpoint._patch_crcs(str(p), {30: (4, 1234)})
    assert p.read_bytes() == before


class _Growing:
    """Pickles as a tensor of another size each time."""

    def __init__(self):
        self.calls = 0

    def __reduce__(self):
        self.calls += 1
        return (torch.clone, (torch.full((self.calls * 300_000,), float(self.calls)),))

    def last(self):
        return torch.full((self.calls * 300_000,), float(self.calls))


class _OneMore(_Growing):
    """Pickles as one more tensor each time (a lazily made buffer, a growing history)."""

    def __reduce__(self):
        self.calls += 1
        return (list, ([torch.full((1 << 18,), float(i + 1)) for i in range(self.calls)],))

    def last(self):
        return [torch.full((1 << 18,), float(i + 1)) for i in range(self.calls)]


class _Swapping(_Growing):
    """Pickles two same-size tensors, in the other order each time."""

    def __init__(self):
        super().__init__()
        self.ts = [torch.full((1 << 18,), 1.0), torch.full((1 << 18,), 2.0)]

    def _order(self):
        return self.ts if self.calls % 2 else self.ts[::-1]

    def __reduce__(self):
        self.calls += 1
        a, b = self._order()
        return (dict, ([("first", a), ("second", b)],))

    def last(self):
        a, b = self._order()
        return {"first": a, "second": b}


@pytest.mark.parametrize("kind", [_Growing, _OneMore, _Swapping], ids=["other-size", "one-more", "swapped"])
def test_a_save_whose_second_pickling_differs_holds_what_torch_pickled(tmp_dir, monkeypatch, kind):
    """The dry pass decides the filling route; the records are filled with the storages torch's
    own pickling gave them (queued as torch's pickler sees them), so an object that pickles
    differently the second time is saved as torch.save saves it: another size, one more
    storage (once a hole of zeros with CRC 0, found by review) or the same sizes in another
    order (once each other's bytes, with matching CRCs)."""
    import zipfile

    from deepio import checkpoint

    monkeypatch.setattr(checkpoint, "_FILL_MIN", 1 << 20)
    odd = kind()
    sd = {"w": torch.randn(1 << 19), "odd": odd}
    p = tmp_dir / "g.pt"
    deepio.save(sd, p, buffer_size=1 << 20)
    assert odd.calls == 2  # the dry pass and torch's: no restart
    got = torch.load(p, weights_only=False)
    assert torch.equal(got["w"], sd["w"])
    assert_same(odd.last(), got["odd"])
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
    assert _leftovers(tmp_dir) == []


def test_a_writer_filling_storages_refuses_a_skip_where_no_storage_goes(tmp_dir):
    """While filling, a forward skip with no storage queued for it would leave a hole of zeros
    in the file: the Writer raises _FillMismatch (save() then starts again on the plain route)."""
    import os

    from deepio import checkpoint
    from deepio.checkpoint import _filling

    w = _filling.FillingWriter(tmp_dir / "w.bin")
    w.write(b"head")
    w._filling = True
    with pytest.raises(checkpoint._FillMismatch, match="no storage goes"):
        w.seek(4096, os.SEEK_CUR)
    with pytest.raises(checkpoint._FillMismatch):  # the Writer stays failed, and closes
        w.close()
    assert w.closed


@pytest.mark.parametrize("head", [0, 100, 4095])
def test_a_writer_filling_a_storage_in_place_stages_its_unaligned_ends(tmp_dir, monkeypatch, head):
    """A storage placed where the file is not on a block boundary (torch's 64-byte record
    alignment, many small tensors): the bytes up to the next boundary and after the last one go
    through the staging buffers, the blocks between straight from the storage's memory when its
    address lines up with the file's blocks (here: ``head`` bytes past a page, the storage's
    first byte at file offset ``head`` too); nothing is bounced, and the file is exact."""
    import mmap
    import os

    from deepio import _deepio, checkpoint
    from deepio.checkpoint import _filling

    copied = []
    real_copy = checkpoint._copy
    monkeypatch.setattr(checkpoint, "_copy", lambda dest, src: (copied.append(len(src)), real_copy(dest, src)))
    n = (5 << 20) + 77
    m = mmap.mmap(-1, n + head)
    src = np.frombuffer(m, dtype=np.uint8, count=n, offset=head)
    src[:] = np.random.default_rng(head).integers(0, 256, n, dtype=np.uint8)
    h = _deepio.Handle(block_size=1 << 20, queue_depth=8, intra_op_parallelism=2)
    p = tmp_dir / "w.bin"
    with _filling.FillingWriter(p, handle=h, buffer_size=1 << 20) as w:
        w.write(b"h" * head)
        w._filling = True
        w._fills.append((n, src))
        assert w.seek(n, os.SEEK_CUR) == head + n
        w._filling = False
        w.write(b"trailer")
    assert p.read_bytes() == b"h" * head + src.tobytes() + b"trailer"
    probe = _deepio.probe_direct_io(str(tmp_dir))
    if probe["supported"] and probe["mem_align"] <= 4096:
        stats = h.stats()
        assert stats["bytes_bounced"] == 0, stats
        assert stats["bytes_direct"] >= (n - 4096) // 4096 * 4096, stats
        assert sum(copied) <= head + 2 * 4096 + len(b"trailer")  # the ends only


@pytest.mark.parametrize("reported_as", [RuntimeError, ValueError, OSError])
def test_a_fill_mismatch_never_reaches_the_caller(tmp_dir, monkeypatch, reported_as):
    """_FillMismatch is deepio's own: whatever exception torch's writer turns the refused skip
    into (its own "unexpected pos" RuntimeError, or another type), deepio.save starts again on
    the plain route and writes the complete file; no _FillMismatch reaches the caller."""
    import os

    from deepio import checkpoint
    from deepio.checkpoint import _filling

    real = _filling._torch_zip
    refused = []

    def torch_zip(obj, w, *args):
        if getattr(w, "_filling", False):
            try:
                w.seek(12345, os.SEEK_CUR)  # torch skipping bytes where no storage goes
            except _filling._FillMismatch as e:
                refused.append(e)
                raise reported_as("unexpected pos 12345") from None
        return real(obj, w, *args)

    monkeypatch.setattr(checkpoint, "_force_filling", True)
    monkeypatch.setattr(_filling, "_torch_zip", torch_zip)
    sd = {"w": torch.randn(1 << 18), "b": torch.arange(9)}
    p = tmp_dir / "m.pt"
    deepio.save(sd, p)
    assert len(refused) == 1
    assert_same(sd, torch.load(p))
    assert _leftovers(tmp_dir) == []
