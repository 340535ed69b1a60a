"""A large layer pulled as parallel range requests (oci._RangedPull: a layer begins as one
stream and, its first range's worth having come slower than oci.RANGED_ENOUGH, the rest comes
as ranges), from a registry that misbehaves for real on a socket: one that ignores Range, one that answers a range of another
length or for another blob size, one whose bytes are not the digest's, one that stalls a range,
one that drops a range mid-body.  The threshold and the range size are forced low so that a
blob of a few hundred kB is pulled in many ranges.  Each time: the right bytes (resumed, or the
rest in one stream), or one line and no file left behind, within the transfer's limits."""

from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest
from registry_server import FakeRegistry, clear_store_environment

from rocforge_build.download_policy import RetryPolicy
from rocforge_build.substitute import oci
from rocforge_build.substitute.oci import StoreError, StoreUnreachable, TransferExpired
from rocforge_build.substitute.store_registry import RegistryStore

PIECE = 64 << 10
DATA = bytes(range(256)) * 1200 + b"tail"  # 307,204 bytes: 5 ranges, the last one short


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    clear_store_environment(monkeypatch)
    monkeypatch.setattr(oci, "RANGED_THRESHOLD", 1)
    monkeypatch.setattr(oci, "RANGED_PIECE", PIECE)
    monkeypatch.setattr(oci, "RANGED_STREAMS", 3)
    monkeypatch.setattr(oci, "RANGED_ENOUGH", float("inf"))  # no link is fast enough for one stream



@pytest.fixture
def fake():
    with FakeRegistry() as registry:
        yield registry


def _store(fake: FakeRegistry, **limits) -> RegistryStore:
    return RegistryStore(fake.store_url(), timeout=5,
                         policy=RetryPolicy(**{"min_rate": 0.0, "notify": None, **limits}))


def _one_line(exc: Exception) -> str:
    assert "\n" not in exc.message and len(exc.message) < 400, exc.message
    return exc.message


def _blob(fake: FakeRegistry, data: bytes = DATA) -> oci.Descriptor:
    return oci.Descriptor(oci.BUNDLE_LAYER, fake.add_blob(data), len(data))


def _ranges(fake: FakeRegistry) -> list[str | None]:
    return [r.headers.get("Range") for r in fake.requests if "/blobs/" in r.path]


def _range_of(request) -> tuple[int, int] | None:
    found = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("Range", ""))
    return (int(found.group(1)), int(found.group(2))) if found else None


def _partial_head(h, start: int, end: int, *, chunked: bool = False) -> None:
    """A 206 answer's head for bytes start..end of DATA: its Content-Range, and its length (or chunked)."""
    h.send_response(206)
    h.send_header("Content-Range", f"bytes {start}-{end}/{len(DATA)}")
    h.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(end - start + 1))))
    h.end_headers()


def test_parallel_ranges_give_the_blob_and_its_digest(fake, tmp_path):
    desc = _blob(fake)
    _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert (tmp_path / "out").read_bytes() == DATA
    first, *ranged = _ranges(fake)  # one stream for the first range's worth, then the ranges
    assert first is None
    assert sorted(ranged, key=lambda r: int(r.split("=")[1].split("-")[0])) == [
        f"bytes={at}-{min(at + PIECE, len(DATA)) - 1}" for at in range(PIECE, len(DATA), PIECE)]


def test_a_link_fast_enough_for_one_stream_stays_one_stream(fake, tmp_path, monkeypatch):
    """The first range's worth came at RANGED_ENOUGH bytes/s or more, on a machine of fewer than
    RANGED_CORES cores: the one GET goes on."""
    monkeypatch.setattr(oci, "RANGED_ENOUGH", 0.0)
    monkeypatch.setattr(oci, "RANGED_CORES", (os.cpu_count() or 1) + 1)
    desc = _blob(fake)
    _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert (tmp_path / "out").read_bytes() == DATA
    assert _ranges(fake) == [None]


def test_a_machine_of_many_cores_takes_the_rest_as_ranges_even_on_a_fast_link(fake, tmp_path, monkeypatch):
    """With RANGED_CORES cores or more the ranges' threads leave the hashing core its time (16
    cores: four ranges 1.07 GB/s against one stream's 0.89 at 2 GB), so a fast first range's
    worth is followed by ranges all the same, and the file is the blob."""
    monkeypatch.setattr(oci, "RANGED_ENOUGH", 0.0)
    monkeypatch.setattr(oci, "RANGED_CORES", 1)
    desc = _blob(fake)
    _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert (tmp_path / "out").read_bytes() == DATA
    first, *ranged = _ranges(fake)
    assert first is None and f"bytes={PIECE}-{2 * PIECE - 1}" in ranged


def test_a_registry_that_ignores_range_gives_the_blob_in_one_stream(fake, tmp_path):
    """A 200 with the whole blob to the ranges (each closed at its headers): the rest comes
    as one stream again, from the first byte not yet hashed."""
    desc = _blob(fake)
    fake.route("GET", "/blobs/", lambda request: (200, {}, DATA))
    _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert (tmp_path / "out").read_bytes() == DATA
    first, *ranged, rest = _ranges(fake)
    assert (first, rest) == (None, f"bytes={PIECE}-")
    assert 1 <= len(ranged) <= 3 and f"bytes={PIECE}-{2 * PIECE - 1}" in ranged


def test_a_registry_that_stops_answering_ranges_midway_gives_the_rest_in_one_stream(fake, tmp_path):
    """206s for the first two ranges, then 200s: what was hashed stays, the rest comes as one
    stream from there (the registry's 200 skipped up to it), and the file is the blob."""
    desc = _blob(fake)

    def later_whole(request):
        asked = _range_of(request)
        return (200, {}, DATA) if asked and asked[0] >= 2 * PIECE else None

    fake.route("GET", "/blobs/", later_whole)
    _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert (tmp_path / "out").read_bytes() == DATA
    assert _ranges(fake)[-1].endswith("-") and int(_ranges(fake)[-1][6:-1]) >= PIECE


@pytest.mark.parametrize("lie", ["total", "start", "length"])
def test_a_registry_lying_about_a_range_is_one_line_and_no_file(fake, tmp_path, lie):
    """A 206 for another blob size, for other bytes than asked, or a Content-Length other than
    the range's: refused before its body is used."""
    desc = _blob(fake)

    def lying(request):
        asked = _range_of(request)
        if asked is None or asked[0] < 2 * PIECE:
            return None
        start, end = asked
        body = DATA[start:end + 1]
        if lie == "total":
            return 206, {"Content-Range": f"bytes {start}-{end}/{len(DATA) + 1000}"}, body
        if lie == "start":
            return 206, {"Content-Range": f"bytes 0-{end - start}/{len(DATA)}"}, DATA[:end - start + 1]
        return 206, {"Content-Range": f"bytes {start}-{end}/{len(DATA)}"}, body + b"more"

    fake.route("GET", "/blobs/", lying)
    with pytest.raises(StoreError) as info:
        _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    line = _one_line(info.value)
    assert re.search({"total": "the store says the blob is 308204 bytes, its descriptor 307204",
                      "start": r"asked for bytes (\d+)-\d+, answered 'bytes 0-",
                      "length": "bytes for a range of"}[lie], line), line
    assert not (tmp_path / "out").exists()


def test_a_range_longer_than_asked_is_refused(fake, tmp_path):
    """A chunked answer (no Content-Length) that goes on past the range's end."""
    desc = _blob(fake)

    def longer(request):
        if _range_of(request) is None:
            return None
        start, end = _range_of(request)
        h = request.handler
        _partial_head(h, start, end, chunked=True)
        body = DATA[start:end + 1] + b"x" * 100
        h.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        h.wfile.flush()
        return "raw", {}, b""

    fake.route("GET", "/blobs/", longer)
    with pytest.raises(StoreError) as info:
        _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert "is longer than its" in _one_line(info.value) and not (tmp_path / "out").exists()


def test_bytes_that_are_not_the_digest_are_refused_and_the_file_removed(fake, tmp_path):
    desc = _blob(fake)
    evil = bytearray(DATA)
    evil[len(DATA) - 10] ^= 1  # one bit in the last range
    fake.blobs[desc.digest] = bytes(evil)
    with pytest.raises(StoreError) as info:
        _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert "do not match its digest" in _one_line(info.value) and not (tmp_path / "out").exists()


def test_a_range_dropped_midway_is_resumed_within_the_range(fake, tmp_path):
    desc = _blob(fake)
    dropped = []

    def drop_once(request):
        start, end = _range_of(request) or (0, 0)
        if start != PIECE or dropped:
            return None
        dropped.append(start)
        h = request.handler
        _partial_head(h, start, end)
        h.wfile.write(DATA[start:start + 1000])
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)
        return "raw", {}, b""

    fake.route("GET", "/blobs/", drop_once)
    _store(fake).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    assert (tmp_path / "out").read_bytes() == DATA
    assert f"bytes={PIECE + 1000}-{2 * PIECE - 1}" in _ranges(fake)


def test_a_stalled_range_stops_at_the_whole_deadline_with_no_file(fake, tmp_path):
    """One range sends its headers and a few bytes, then nothing (each wait within the 5 s
    timeout): the pull ends at download.deadline (1 s here), one line, every stream stopped."""
    desc = _blob(fake)
    release = threading.Event()

    def stall(request):
        start, end = _range_of(request) or (0, 0)
        if start != 3 * PIECE:
            return None
        h = request.handler
        _partial_head(h, start, end)
        h.wfile.write(DATA[start:start + 10])
        h.wfile.flush()
        release.wait(20)
        h.close_connection = True
        return "raw", {}, b""

    fake.route("GET", "/blobs/", stall)
    started = time.monotonic()
    try:
        with pytest.raises(TransferExpired) as info:
            _store(fake, deadline=1.0).fetch_blob(desc, tmp_path / "out", cap=1 << 20)
    finally:
        release.set()
    assert _one_line(info.value) == (f"{fake.store_url()}: layer {desc.digest[:19]}: still receiving "
                                     "at the 1 s limit (download.deadline)")
    assert time.monotonic() - started < 4 and not (tmp_path / "out").exists()


def test_the_least_rate_judges_all_ranges_together(fake, tmp_path):
    """Every range trickled (the first one stream's worth came at once): the streams together
    stay under download.min_rate, so the pull stops with the min_rate line once the resumes are
    spent (never past the deadline)."""
    desc = _blob(fake)

    def trickle(request):
        if _range_of(request) is None:
            return None
        start, end = _range_of(request)
        h = request.handler
        _partial_head(h, start, end)
        try:
            for at in range(start, min(end + 1, start + 400), 20):
                h.wfile.write(DATA[at:at + 20])
                h.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
        h.close_connection = True
        return "raw", {}, b""

    fake.route("GET", "/blobs/", trickle)
    started = time.monotonic()
    with pytest.raises(StoreUnreachable) as info:
        _store(fake, deadline=30.0, min_rate=100_000.0, rate_window=0.3).fetch_blob(
            desc, tmp_path / "out", cap=1 << 20, retries=1)
    assert "below download.min_rate 100000" in _one_line(info.value)
    assert time.monotonic() - started < 5 and not (tmp_path / "out").exists()


def test_the_size_cap_holds_before_any_range(fake, tmp_path):
    desc = _blob(fake)
    with pytest.raises(StoreError) as info:
        _store(fake).fetch_blob(desc, tmp_path / "out", cap=len(DATA) - 1)
    assert "past the" in _one_line(info.value) and not _ranges(fake)
    assert not (tmp_path / "out").exists()

