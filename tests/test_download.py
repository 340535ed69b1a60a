"""download.py against a real HTTP server on 127.0.0.1: resume, retry, integrity, disk full."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from rocforge_build import download as dl
from rocforge_build.errors import IntegrityError, NetworkError

DATA = os.urandom(3 * 1024 * 1024 + 123)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(dl, "_sleep", slept.append)
    return slept


def test_plain_download_records_sha256_and_size(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    res = dl.download(url, tmp_path / "a.tar.gz", progress=False)
    assert res.sha256 == SHA and res.size == len(DATA)
    assert (tmp_path / "a.tar.gz").read_bytes() == DATA
    assert not (tmp_path / "a.tar.gz.part").exists()


def test_dropped_connection_is_resumed_with_range(http_server, tmp_path, _no_sleep):
    url = http_server.add("/a.tar.gz", DATA)
    http_server.fail("/a.tar.gz", drop_after=1_000_000)
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    # what was received before the drop (whole network chunks) is kept and resumed
    assert res.sha256 == SHA and res.attempts == 2
    assert 1_000_000 - dl.NET_CHUNK < res.resumed_from <= 1_000_000
    gets = http_server.gets("/a.tar.gz")
    assert "Range" not in gets[0] and gets[1]["Range"] == f"bytes={res.resumed_from}-"
    assert (tmp_path / "a.tar.gz").read_bytes() == DATA
    assert _no_sleep == [0.5]


def test_interrupted_part_survives_and_next_call_resumes(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    for _ in range(2):
        http_server.fail("/a.tar.gz", drop_after=500_000)
    policy = dl.RetryPolicy(attempts=2)
    with pytest.raises(NetworkError) as exc:
        dl.download(url, tmp_path / "a.tar.gz", progress=False, policy=policy)
    assert "bytes kept" in exc.value.message and "resumes" in exc.value.hint
    assert not (tmp_path / "a.tar.gz").exists()
    kept = (tmp_path / "a.tar.gz.part").stat().st_size
    assert kept > 500_000  # two partial attempts accumulated
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.resumed_from == kept and res.sha256 == SHA


def test_http_500_then_success_with_backoff(http_server, tmp_path, _no_sleep):
    url = http_server.add("/a.tar.gz", DATA)
    http_server.fail("/a.tar.gz", status=500)
    http_server.fail("/a.tar.gz", status=503)
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.attempts == 3 and _no_sleep == [0.5, 1.0]


def test_retry_after_is_honoured_for_429(http_server, tmp_path, _no_sleep):
    url = http_server.add("/a.tar.gz", DATA)
    http_server.fail("/a.tar.gz", status=429, headers={"Retry-After": "7"})
    dl.download(url, tmp_path / "a.tar.gz", progress=False)
    assert _no_sleep == [7.0]


def test_404_is_not_retried(http_server, tmp_path, _no_sleep):
    with pytest.raises(dl.HttpStatusError) as exc:
        dl.download(http_server.url("/missing.tar.gz"), tmp_path / "m.tar.gz", progress=False)
    assert exc.value.status == 404 and "--index" in exc.value.hint
    assert len(http_server.gets("/missing.tar.gz")) == 1 and _no_sleep == []
    assert list(tmp_path.iterdir()) == []


def test_retries_exhausted_is_a_network_error(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    for _ in range(3):
        http_server.fail("/a.tar.gz", status=502)
    with pytest.raises(NetworkError, match="after 3 attempts: HTTP 502"):
        dl.download(url, tmp_path / "a.tar.gz", progress=False, policy=dl.RetryPolicy(attempts=3))
    assert not (tmp_path / "a.tar.gz").exists()


def test_checksum_mismatch_deletes_everything(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    with pytest.raises(IntegrityError, match="sha256 is"):
        dl.download(url, tmp_path / "a.tar.gz", sha256="0" * 64, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_mismatch_after_resume_refetches_whole_file(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    (tmp_path / "a.tar.gz.part").write_bytes(b"garbage" * 1000)  # a stale part of another file
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.sha256 == SHA and res.resumed_from == 0
    gets = http_server.gets("/a.tar.gz")
    assert gets[0]["Range"] == "bytes=7000-" and "Range" not in gets[1]


def test_expected_size_mismatch(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    with pytest.raises(IntegrityError, match="expected 5"):
        dl.download(url, tmp_path / "a.tar.gz", expected_size=5, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_server_ignoring_range_starts_over(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    (tmp_path / "a.tar.gz.part").write_bytes(DATA[:4096])
    http_server.fail("/a.tar.gz", ignore_range=True)
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.resumed_from == 0 and res.size == len(DATA)


def test_complete_part_answered_416_is_accepted(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    (tmp_path / "a.tar.gz.part").write_bytes(DATA)
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.sha256 == SHA and (tmp_path / "a.tar.gz").read_bytes() == DATA


def test_existing_dest_with_matching_sha_is_not_fetched(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    (tmp_path / "a.tar.gz").write_bytes(DATA)
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.attempts == 0 and http_server.gets("/a.tar.gz") == []


def test_disk_full_removes_partial_file(http_server, tmp_path, monkeypatch):
    url = http_server.add("/a.tar.gz", DATA)
    real_write = dl._write
    calls = {"n": 0}

    class _Full:
        def __init__(self, fh):
            self.fh = fh

        def write(self, chunk):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.fh.write(chunk)

        def close(self):
            self.fh.close()

    monkeypatch.setattr(dl, "_write", lambda fh, chunk, part: real_write(_Full(fh), chunk, part))
    with pytest.raises(dl.DiskFullError, match="no space left") as exc:
        dl.download(url, tmp_path / "a.tar.gz", progress=False)
    assert "df -h" in exc.value.hint
    assert list(tmp_path.iterdir()) == []


def test_file_url_mirror(tmp_path):
    src = tmp_path / "mirror" / "therock-dist-linux-gfx1151-7.10.0a20251021.tar.gz"
    src.parent.mkdir()
    src.write_bytes(DATA)
    res = dl.download(src.as_uri(), tmp_path / "out" / "x.tar.gz", sha256=SHA, progress=False)
    assert res.size == len(DATA)
    with pytest.raises(NetworkError, match="does not exist"):
        dl.download((tmp_path / "nope.tar.gz").as_uri(), tmp_path / "y", progress=False)


def test_get_text_and_missing_ok(http_server, tmp_path):
    url = http_server.add("/index.html", "hello")
    http_server.fail("/index.html", status=500)
    assert dl.get_text(url) == "hello"
    assert dl.get_text(http_server.url("/nope.sha256"), missing_ok=True) is None
    with pytest.raises(dl.HttpStatusError):
        dl.get_text(http_server.url("/nope.sha256"))
    (tmp_path / "index.html").write_text("local page")
    assert dl.get_text(tmp_path.as_uri() + "/") == "local page"
    assert dl.get_text((tmp_path / "x.sha256").as_uri(), missing_ok=True) is None


def test_unreachable_host_is_a_network_error(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(NetworkError, match="failed after 2 attempts") as exc:
        dl.download(f"http://127.0.0.1:{port}/x.tar.gz", tmp_path / "x", progress=False,
                    policy=dl.RetryPolicy(attempts=2))
    assert exc.value.hint
