"""deepio.dcp's CRC-32 check at load on several threads (issue 46): the combination of the
pieces' CRC-32s (zlib's crc32_combine, in Python where zlib-ng is missing) against zlib's CRC
of the whole; a flipped byte anywhere in a stored tensor's data caught on full loads and on
partial ones (a resharded load's rows: the piece read straight into its destination, the rest
of the record into scratch, their CRC-32s combined), whatever the pieces; many records small
and large on the load's threads. Real saves and loads on the test disk.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from conftest import needs_hypothesis, require_module

dcp = require_module("torch.distributed.checkpoint", "torch")
import torch  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem  # noqa: E402

import deepio  # noqa: E402
import deepio.dcp  # noqa: E402
from deepio.dcp import _crc, _reader, _record  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # needs_hypothesis skips (or fails under DEEPIO_REQUIRE) the tests below
    given = settings = st = None  # type: ignore[assignment]


def _combined(data: bytes, cuts: list[int], combine) -> int:
    bounds = [0, *sorted(cuts), len(data)]
    crc = 0
    for lo, hi in zip(bounds, bounds[1:]):
        crc = combine(crc, zlib.crc32(data[lo:hi]), hi - lo)
    return crc


if st is not None:

    @needs_hypothesis
    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=5000), st.lists(st.integers(0, 5000), max_size=8))
    def test_combining_pieces_gives_zlibs_crc_of_the_whole(data, cuts):
        cuts = [c % (len(data) + 1) for c in cuts]  # empty pieces too
        assert _combined(data, cuts, _crc._combine) == zlib.crc32(data)
        assert _combined(data, cuts, _crc.crc32_combine) == zlib.crc32(data)

    @needs_hypothesis
    @settings(max_examples=200, deadline=None)
    @given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**48), st.integers(0, 2**48))
    def test_combining_is_associative_at_any_length(a, b, n, m):
        """Lengths far past what a test can hash: (A+B)+C == A+(B+C), with zlib-ng's where it
        is installed as the reference."""
        c = zlib.crc32(b"deepio")
        left = _crc._combine(_crc._combine(a, b, n), c, 6)
        right = _crc._combine(a, _crc._combine(b, c, 6), n + 6)
        assert left == right
        assert _crc._combine(a, b, n + m) == _crc._combine(_crc._combine(a, 0, n), b, m)
        try:
            from zlib_ng import zlib_ng
        except ImportError:
            return
        assert _crc._combine(a, b, n) == zlib_ng.crc32_combine(a, b, n)


COLS = 256


def _places(main: Path) -> dict[str, tuple[str, int, int]]:
    md = deepio.dcp.FileSystemReader(main).read_metadata()
    return {i.fqn: (str(main / s.relative_path), s.offset, s.length) for i, s in md.storage_data.items()}


def _data_range(main: Path, fqn: str) -> tuple[str, int, int]:
    """(data file, first byte of the stored tensor's data in the file, its bytes)."""
    path, offset, length = _places(main)[fqn]
    with open(path, "rb") as f:
        f.seek(offset)
        item = f.read(length)
    lay = _record.layout(item[:4096], item[-4096:], length)
    assert lay is not None and lay.crc
    return path, offset + lay.data_start, lay.data_nbytes


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


class _Planner:
    """What read_data needs of a load planner: one destination, the commits recorded."""

    def __init__(self, dest: torch.Tensor) -> None:
        self.dest, self.committed = dest, []

    def resolve_tensor(self, req):
        return self.dest

    def commit_tensor(self, req, tensor):
        self.committed.append(tensor)

    def load_bytes(self, req, value):  # pragma: no cover - no bytes items here
        raise AssertionError(req)


def _load_rows(main: Path, rows: tuple[int, int], verify: bool = True) -> torch.Tensor:
    """Rows [r0, r1) of the stored "t" through deepio's reader, as a resharded load plans them
    (a piece of the stored tensor, one run of its bytes)."""
    reader = deepio.dcp.FileSystemReader(main, verify_crc=verify)
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)
    idx = next(i for i in md.storage_data if i.fqn == "t")
    r0, r1 = rows
    dest = torch.empty(r1 - r0, COLS)
    req = ReadItem(
        type=LoadItemType.TENSOR,
        dest_index=MetadataIndex("t", [r0, 0]),
        dest_offsets=torch.Size([0, 0]),
        storage_index=idx,
        storage_offsets=torch.Size([r0, 0]),
        lengths=torch.Size([r1 - r0, COLS]),
    )
    planner = _Planner(dest)
    reader.read_data(LoadPlan([req]), planner).wait()
    assert len(planner.committed) == 1 and planner.committed[0].data_ptr() == dest.data_ptr()  # straight into it
    return dest


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """A stored tensor of 512 rows (512 KiB), saved once; each test works on a copy."""
    folder = tmp_path_factory.mktemp("dcp-crc") / "ck"
    full = torch.randn(512, COLS, generator=torch.Generator().manual_seed(46))
    dcp.save({"t": full}, storage_writer=deepio.dcp.FileSystemWriter(folder))
    return folder, full


def _copy(saved, tmp_dir: Path) -> Path:
    import shutil

    main = tmp_dir / "ck"
    shutil.copytree(saved[0], main)
    return main


ROWS = [(0, 512), (0, 100), (100, 300), (411, 512), (7, 8)]


# The stored item read whole and the piece copied from there (items up to WHOLE_BYTES), or
# its first and last bytes read, then the piece straight into its destination and the rest
# of the record into scratch, in pieces of PIECE_BYTES.
ROUTES = [(1 << 20, 16 << 20), (0, 16 << 20), (0, 4096), (0, 12345)]


@pytest.mark.parametrize(("whole_bytes", "piece_bytes"), ROUTES)
@pytest.mark.parametrize("rows", ROWS)
def test_full_and_partial_loads_read_the_right_bytes(saved, tmp_dir, monkeypatch, rows, whole_bytes, piece_bytes):
    monkeypatch.setattr(_reader, "WHOLE_BYTES", whole_bytes)
    monkeypatch.setattr(_crc, "PIECE_BYTES", piece_bytes)
    main = _copy(saved, tmp_dir)
    for verify in (True, False):
        got = _load_rows(main, rows, verify)
        assert torch.equal(got, saved[1][rows[0] : rows[1]])


def _where(data_nbytes: int, rows: tuple[int, int], rng: random.Random) -> list[int]:
    """Bytes of the stored data to flip: its first and last, the piece's first and last and
    the bytes beside them, a byte in the middle of the piece and before and after it, and two
    random ones."""
    lo, hi = rows[0] * COLS * 4, rows[1] * COLS * 4
    out = {0, data_nbytes - 1, lo, hi - 1, (lo + hi) // 2, lo // 2, (hi + data_nbytes) // 2}
    out |= {lo - 1, hi} | {rng.randrange(data_nbytes) for _ in range(2)}
    return sorted(x for x in out if 0 <= x < data_nbytes)


@pytest.mark.parametrize(("whole_bytes", "piece_bytes"), ROUTES[:3])
@pytest.mark.parametrize("rows", ROWS)
def test_a_flipped_byte_anywhere_in_the_record_is_caught(saved, tmp_dir, monkeypatch, rows, whole_bytes, piece_bytes):
    """Full loads and partial ones (where the byte lies in the piece read or in the rest of
    the record, read to check it): CorruptFileError naming the file and the item; with
    verify_crc=False a byte outside the piece goes unread (where the item is not read whole)
    and the piece loads."""
    monkeypatch.setattr(_reader, "WHOLE_BYTES", whole_bytes)
    monkeypatch.setattr(_crc, "PIECE_BYTES", piece_bytes)
    main = _copy(saved, tmp_dir)
    path, start, nbytes = _data_range(main, "t")
    rng = random.Random(hash(rows) ^ piece_bytes)
    lo, hi = rows[0] * COLS * 4, rows[1] * COLS * 4
    for at in _where(nbytes, rows, rng):
        _flip(path, start + at)
        with pytest.raises(deepio.CorruptFileError) as e:
            _load_rows(main, rows)
        assert e.value.filename == path and "item 't'" in str(e.value) and "CRC-32" in str(e.value)
        if not lo <= at < hi:
            assert torch.equal(_load_rows(main, rows, verify=False), saved[1][rows[0] : rows[1]])
        _flip(path, start + at)  # back
    assert torch.equal(_load_rows(main, rows), saved[1][rows[0] : rows[1]])


def _many() -> dict:
    """Many records: 300 small tensors of many sizes (read whole, checked by _record.bad_record
    on the load's threads), large ones read straight into their destinations (several of 4 MiB
    and more: deepio's filling route) in many pieces, and an object."""
    g = torch.Generator().manual_seed(7)
    sd = {f"s{i}": torch.randn(1 + (i * 37) % 3000, generator=g) for i in range(300)}
    sd |= {f"l{i}": torch.randn(1024 * (1 + i), 1024 + i, generator=g) for i in range(3)}
    sd["i8"] = torch.randint(-128, 127, (3 << 20,), dtype=torch.int8, generator=g)
    sd["step"] = 17
    return sd


def _zeros(sd: dict) -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in sd.items()}


def _cause(info: pytest.ExceptionInfo) -> BaseException:
    e = info.value
    return next(iter(e.failures.values()))[0] if isinstance(e, CheckpointException) else e


@pytest.mark.parametrize("extra", [False, True])
def test_many_records_small_and_large_on_the_loads_threads(tmp_dir, monkeypatch, extra):
    """Hundreds of records, large ones in 64 KiB pieces (a few hundred CRC jobs at once on
    the pool; with extra folders, two folders' threads share it): every value loads; a
    flipped byte in a small record, in a large one's middle or in its last byte is refused
    naming that item."""
    monkeypatch.setattr(_crc, "PIECE_BYTES", 64 << 10)
    main = tmp_dir / "ck"
    sd = _many()
    extra_paths = [tmp_dir / "nvme1"] if extra else None
    dcp.save(sd, storage_writer=deepio.dcp.FileSystemWriter(main, extra_paths=extra_paths))
    out = _zeros(sd)
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    assert all(torch.equal(out[k], v) if isinstance(v, torch.Tensor) else out[k] == v for k, v in sd.items())
    for fqn, where in (("s123", 0.5), ("l1", 0.5), ("l2", 1.0), ("i8", 0.0)):
        path, offset, length = _places(main)[fqn]
        with open(path, "rb") as f:
            f.seek(offset)
            item = f.read(length)
        lay = _record.layout(item[:4096], item[-4096:], length) if length > 8192 else None
        if lay is None:  # a small item: find its data record through the zip itself
            import zipfile
            from io import BytesIO

            with zipfile.ZipFile(BytesIO(item)) as z:
                info = next(i for i in z.infolist() if "/data/" in i.filename)
            from deepio.checkpoint._zip import _data_start

            start = _data_start(info.header_offset, item[info.header_offset : info.header_offset + 30])
            at, n = offset + start, info.file_size
        else:
            at, n = offset + lay.data_start, lay.data_nbytes
        at += min(n - 1, int(n * where))
        _flip(path, at)
        with pytest.raises(CheckpointException) as e:
            dcp.load(_zeros(sd), storage_reader=deepio.dcp.FileSystemReader(main))
        cause = _cause(e)
        assert isinstance(cause, deepio.CorruptFileError) and cause.filename == path
        assert f"item {fqn!r}" in str(cause) and "CRC-32" in str(cause)
        _flip(path, at)
    out = _zeros(sd)
    dcp.load(out, storage_reader=deepio.dcp.FileSystemReader(main))
    assert torch.equal(out["l2"], sd["l2"])


@pytest.mark.parametrize("whole_bytes", [1 << 20, 0])
def test_a_flipped_byte_in_data_pkl_is_caught(saved, tmp_dir, monkeypatch, whole_bytes):
    """data.pkl says which bytes are the tensor's: a flipped byte in it (every seventh byte
    tried) is refused, where the item is read whole and where only its first and last bytes
    are read before the piece goes straight into its destination."""
    monkeypatch.setattr(_reader, "WHOLE_BYTES", whole_bytes)
    main = _copy(saved, tmp_dir)
    path, offset, length = _places(main)["t"]
    with open(path, "rb") as f:
        f.seek(offset)
        item = f.read(length)
    lay = _record.layout(item[:4096], item[-4096:], length)
    assert lay is not None and lay.pkl_crc and lay.pkl_nbytes > 50
    for at in range(lay.pkl_start, lay.pkl_start + lay.pkl_nbytes, 7):
        _flip(path, offset + at)
        with pytest.raises(deepio.CorruptFileError) as e:
            _load_rows(main, (0, 100))
        assert "item 't'" in str(e.value) and "CRC-32" in str(e.value), at
        _flip(path, offset + at)


def test_the_pool_is_stopped_after_each_load(saved, tmp_dir):
    """A load's CRC threads end with it, also where it failed."""
    import threading

    main = _copy(saved, tmp_dir)
    _load_rows(main, (0, 100))
    path, start, _ = _data_range(main, "t")
    _flip(path, start + 5)
    with pytest.raises(deepio.CorruptFileError):
        _load_rows(main, (0, 512))
    assert not [t for t in threading.enumerate() if t.name.startswith("deepio-dcp-crc")]


@pytest.mark.parametrize("crc32", [True, False])
def test_the_fast_directory_reading_gives_zipfiles_layout(monkeypatch, crc32):
    """layout() reads torch's plain zip directories itself (_record._directory): the same
    Layout as through zipfile, for tensors of many dtypes and shapes (empty, 0-dim, large
    enough for a 64-byte-aligned record past 4 KiB of head), with and without torch's CRC-32s;
    and the item sizes a load meets where the directory is not all in the tail."""
    import io

    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc32)
    try:
        g = torch.Generator().manual_seed(3)
        tensors = [
            torch.randn(17, 5, generator=g),
            torch.tensor(3.0),
            torch.empty(0, 4),
            torch.arange(100, dtype=torch.int64),
            torch.randn(3, 3, dtype=torch.float64, generator=g),
            (torch.arange(10) % 3 == 0),
            torch.randn(1 << 16, generator=g).bfloat16(),
            torch.randn(512, 300, generator=g),
        ]
        for t in tensors:
            b = io.BytesIO()
            torch.save(t, b)
            item = b.getvalue()
            for h, tl in ((4096, 4096), (len(item), len(item)), (4096, 64)):
                head, tail = item[:h], item[-tl:]
                fast = _record.layout(head, tail, len(item))
                monkeypatch.setattr(_record, "_FAST_DIRECTORY", False)
                slow = _record.layout(head, tail, len(item))
                monkeypatch.setattr(_record, "_FAST_DIRECTORY", True)
                assert fast == slow, (t.dtype, tuple(t.shape), h, tl)
                if tl >= 1024:
                    assert _record._directory(tail, len(item)) is not None
    finally:
        torch.serialization.set_crc32_options(before)


def test_checks_run_at_once_or_on_the_pool_and_raise_as_their_job_did():
    """Sums.run: a check of at most INLINE_BYTES runs on the calling thread, a larger one on
    the pool; either way result() gives its value or raises its exception; close() waits."""
    import threading

    sums = _crc.Sums()
    here = threading.get_ident()
    try:
        assert sums.run(threading.get_ident, 10).result() == here
        assert sums.run(threading.get_ident, _crc.INLINE_BYTES + 1).result() != here
        for n in (10, _crc.INLINE_BYTES + 1):
            with pytest.raises(ZeroDivisionError):
                sums.run(lambda: 1 // 0, n).result()
        rec = sums.record(3, zlib.crc32(b"abcdefgh"))
        for k, part in enumerate((b"abc", b"", b"defgh")):
            rec.landed(
                k, torch.frombuffer(bytearray(part), dtype=torch.uint8) if part else torch.empty(0, dtype=torch.uint8)
            )
        assert rec.crc() == rec.expected
    finally:
        sums.close()


@pytest.mark.slow
def test_the_bench_loads_with_a_baseline_reader_and_unchecked(tmp_dir):
    """bench/dcp_bench.py --baseline-dcp DIR --unchecked (2 gloo ranks, tiny): the other
    package's reader (here this one's own folder, imported a second time beside it) and
    verify_crc=False each load every round, checked against the saved tensors, with their
    ratios."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    args = ["--dir", str(tmp_dir), "--gib", "0.02", "--rounds", "1", "--threads", "1", "--no-async"]
    args += ["--baseline-dcp", os.path.dirname(deepio.dcp.__file__), "--unchecked", "--json"]
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "dcp_bench.py"), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("deepio load", "deepio baseline load", "deepio unchecked load", "torch load"):
        assert doc["results"][name]["kind"] == "load" and doc["results"][name]["gib_per_s"] > 0, name
    for label in ("load deepio / deepio baseline", "load deepio / deepio unchecked", "load deepio baseline / torch"):
        assert doc["ratios"][label]["median"] > 0, label
