"""deepio._wholefile, the one whole-file reader (deepio.load and deepio.safetensors' CPU loads
use it): parts of many files read at once into page-aligned memory whose addresses share the
file offsets' alignment, files that are short or shrank given as None, and errors (I/O,
Ctrl-C) raised only after every read finished, naming the file."""

from __future__ import annotations

import errno
import mmap
import os

import pytest

from deepio import _deepio, _file, _populate, _wholefile
from deepio._engine import default as default_engine

PAGE = mmap.PAGESIZE


@pytest.fixture(params=[(0, False), (1, True), (2, False)], ids=["plain", "ahead-huge", "ahead2"])
def tuning(request, monkeypatch):
    """Small requests (many per file, edges not page-aligned), with and without populating
    ahead and huge pages."""
    threads, huge = request.param
    monkeypatch.setattr(_wholefile, "POPULATE_THREADS", threads)
    monkeypatch.setattr(_wholefile, "HUGEPAGES", huge)
    monkeypatch.setattr(_wholefile, "CHUNK", 3 * PAGE + 5)
    return request.param


def _files(tmp_dir, sizes):
    paths, datas = [], []
    for i, n in enumerate(sizes):
        p = tmp_dir / f"f{i}.bin"
        d = os.urandom(n)
        p.write_bytes(d)
        paths.append(str(p))
        datas.append(d)
    return paths, datas


def test_parts_of_many_files_land_aligned(tmp_dir, tuning):
    """Each part's bytes exactly, whatever its start (page boundary or not) and end (the file's
    end or a given size); the address of every byte is congruent with its file offset modulo
    the page (so the engine reads them by direct I/O); with huge pages the read starts on a
    2 MiB boundary."""
    paths, datas = _files(tmp_dir, [(3 << 20) + 11, 5 * PAGE, 1, 0, 100_000])
    parts = [
        _wholefile.Part(paths[0], 0),
        _wholefile.Part(paths[0], 12345, (3 << 20) + 11),
        _wholefile.Part(paths[1], 2 * PAGE, 4 * PAGE),  # a size below the file's: only that
        _wholefile.Part(paths[2]),
        _wholefile.Part(paths[3]),
        _wholefile.Part(paths[4], 99_999),
    ]
    got = _wholefile.read_many(parts)
    want = [datas[0], datas[0][12345:], datas[1][2 * PAGE : 4 * PAGE], datas[2], b"", datas[4][99_999:]]
    assert [bytes(w.view()) for w in got] == want
    for part, w in zip(parts, got):
        addr = _populate.address(w.buffer) + w.offset
        assert (addr - part.start) % PAGE == 0
    if tuning[1] and _populate.available():
        assert (_populate.address(got[0].buffer) + got[0].offset) % _populate.HUGE == 0
    assert default_engine().pending() == 0


def test_read_is_read_many_of_one_file(tmp_dir, tuning):
    """read(): the whole file, or None where it is empty or shorter than at_least."""
    paths, datas = _files(tmp_dir, [70_000, 3, 0])
    assert bytes(_wholefile.read(paths[0]).view()) == datas[0]
    assert _wholefile.read(paths[1], at_least=4) is None
    assert bytes(_wholefile.read(paths[1], at_least=3).view()) == datas[1]
    assert _wholefile.read(paths[2]) is None


def test_short_files_are_none_and_the_others_still_read(tmp_dir, tuning):
    """A file shorter than its part's size, or than its start: None; the others are read."""
    paths, datas = _files(tmp_dir, [50_000, 50_000])
    got = _wholefile.read_many(
        [
            _wholefile.Part(paths[0], 0, 50_001),
            _wholefile.Part(paths[1], 10),
            _wholefile.Part(paths[0], 50_001),
        ]
    )
    assert got[0] is None and got[2] is None
    assert bytes(got[1].view()) == datas[1][10:]


def test_file_shrinking_while_read_is_none(tmp_dir, monkeypatch):
    """A file cut short after it was opened, while its pieces are being submitted: the reads
    past its new end are refused or come back short: None for it, the other file read."""
    paths, datas = _files(tmp_dir, [40 * PAGE, 40 * PAGE])
    monkeypatch.setattr(_wholefile, "CHUNK", 4 * PAGE)
    monkeypatch.setattr(_wholefile, "POPULATE_THREADS", 1)
    real = _populate.Ahead

    class Cutting(real):  # the first file cut to 5 pages once its 3rd piece is about to go
        def wait(self, i):
            super().wait(i)
            if i == 2:
                os.truncate(paths[0], 5 * PAGE)

    monkeypatch.setattr(_populate, "Ahead", Cutting)
    monkeypatch.setattr(_populate, "available", lambda: True)
    got = _wholefile.read_many([_wholefile.Part(paths[0]), _wholefile.Part(paths[1])])
    assert got[0] is None
    assert bytes(got[1].view()) == datas[1]
    assert default_engine().pending() == 0


def test_errors_before_any_read(tmp_dir):
    """A folder, a missing file: raised (named) before anything is read."""
    paths, _ = _files(tmp_dir, [10_000])
    with pytest.raises(IsADirectoryError) as ei:
        _wholefile.read_many([_wholefile.Part(paths[0]), _wholefile.Part(str(tmp_dir))])
    assert ei.value.filename == str(tmp_dir)
    with pytest.raises(FileNotFoundError) as ei:
        _wholefile.read_many([_wholefile.Part(paths[0]), _wholefile.Part(str(tmp_dir / "nope"))])
    assert ei.value.filename == str(tmp_dir / "nope")


def test_io_error_names_its_file_after_every_read(tmp_dir, tuning, fault, monkeypatch):
    """EIO in the first file's first read, many reads of three files in flight: that OSError,
    naming that file, raised once every read finished; the next read works."""
    paths, datas = _files(tmp_dir, [200_000, 200_000, 200_000])
    futs = _record_futures(monkeypatch)
    fault("read", errno=errno.EIO, count=1, path_contains="f0.bin")
    with pytest.raises(OSError) as ei:
        _wholefile.read_many([_wholefile.Part(p) for p in paths])
    assert ei.value.errno == errno.EIO and ei.value.filename == paths[0]
    assert len(futs) > 3 and all(f.done() for f in futs)
    _deepio._clear_fault()
    assert [bytes(w.view()) for w in _wholefile.read_many([_wholefile.Part(p) for p in paths])] == datas


@pytest.mark.parametrize("where", ["submitting", "waiting"])
def test_ctrl_c_waits_for_every_read(tmp_dir, monkeypatch, fault, where):
    """KeyboardInterrupt while the pieces are submitted (in the wait for the populating
    helper) or while the reads are waited for: raised only after every read submitted has
    finished (one of them slow), so no read outlives its buffer."""
    paths, _ = _files(tmp_dir, [20 * PAGE, 20 * PAGE])
    monkeypatch.setattr(_wholefile, "CHUNK", 4 * PAGE)
    monkeypatch.setattr(_wholefile, "POPULATE_THREADS", 1)
    futs = _record_futures(monkeypatch)
    fault("read", delay=0.3, count=1)
    if where == "submitting":
        real = _populate.Ahead

        class Interrupted(real):
            def wait(self, i):
                super().wait(i)
                if i == 3:
                    raise KeyboardInterrupt

        monkeypatch.setattr(_populate, "Ahead", Interrupted)
        monkeypatch.setattr(_populate, "available", lambda: True)
    else:
        result = _file.Future.result
        calls = []

        def interrupted(self, timeout=None):
            calls.append(self)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return result(self, timeout)

        monkeypatch.setattr(_file.Future, "result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _wholefile.read_many([_wholefile.Part(p) for p in paths])
    assert futs and all(f.done() for f in futs)
    assert len(futs) == (3 if where == "submitting" else 10)
    assert default_engine().pending() == 0


def _record_futures(monkeypatch):
    """Every Future File.pread returns from now on (for this test), in a list."""
    futs = []
    pread = _file.File.pread

    def recording(self, buffer, offset=0):
        f = pread(self, buffer, offset)
        futs.append(f)
        return f

    monkeypatch.setattr(_file.File, "pread", recording)
    return futs
