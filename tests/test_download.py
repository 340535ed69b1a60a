"""download.py against a real HTTP server on 127.0.0.1: resume, retry, integrity, disk full."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import pytest

from rocforge_build import download as dl
from rocforge_build import download_policy
from rocforge_build.errors import IntegrityError, NetworkError

DATA = os.urandom(3 * 1024 * 1024 + 123)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(download_policy, "_sleep", slept.append)
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
    policy = download_policy.RetryPolicy(attempts=2)
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
        dl.download(url, tmp_path / "a.tar.gz", progress=False, policy=download_policy.RetryPolicy(attempts=3))
    assert not (tmp_path / "a.tar.gz").exists()


def test_checksum_mismatch_deletes_everything(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    with pytest.raises(IntegrityError, match="sha256 is"):
        dl.download(url, tmp_path / "a.tar.gz", sha256="0" * 64, progress=False)
    assert list(tmp_path.iterdir()) == []


def _part(tmp_path, url, data):
    """A `.part` as an interrupted download leaves it: bytes plus the server's validator."""
    import requests

    (tmp_path / "a.tar.gz.part").write_bytes(data)
    etag = requests.head(url, timeout=5).headers["ETag"]
    (tmp_path / "a.tar.gz.part.validator").write_text(json.dumps({"if_range": etag}))


def test_mismatch_after_resume_refetches_whole_file(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    _part(tmp_path, url, b"garbage" * 1000)  # damaged bytes under a still-valid validator
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.sha256 == SHA and res.resumed_from == 0
    gets = http_server.gets("/a.tar.gz")
    assert gets[0]["Range"] == "bytes=7000-" and "Range" not in gets[1]
    assert list(tmp_path.iterdir()) == [tmp_path / "a.tar.gz"]  # no part, no validator left


def test_replaced_file_is_never_spliced_onto_an_old_part(http_server, tmp_path, _no_sleep):
    """The server replaces the file between two runs (same name, same size): the resume asks
    with If-Range, gets the whole new file, and the result is the new file, not old+new."""
    url = http_server.add("/a.tar.gz", DATA)
    for _ in range(2):
        http_server.fail("/a.tar.gz", drop_after=1_000_000)
    with pytest.raises(NetworkError):
        dl.download(url, tmp_path / "a.tar.gz", progress=False, policy=download_policy.RetryPolicy(attempts=2))
    assert (tmp_path / "a.tar.gz.part").stat().st_size > 1_000_000
    new = os.urandom(len(DATA))
    http_server.add("/a.tar.gz", new)  # replaced on the server
    res = dl.download(url, tmp_path / "a.tar.gz", progress=False)  # no checksum to catch it
    last = http_server.gets("/a.tar.gz")[-1]
    assert last["Range"].startswith("bytes=") and last["If-Range"].startswith('"')
    assert res.resumed_from == 0 and (tmp_path / "a.tar.gz").read_bytes() == new


def test_part_without_validator_starts_over(http_server, tmp_path):
    url = http_server.add("/a.tar.gz", DATA)
    (tmp_path / "a.tar.gz.part").write_bytes(DATA[:5000])  # nothing proves which file it was
    res = dl.download(url, tmp_path / "a.tar.gz", progress=False)
    assert res.resumed_from == 0 and "Range" not in http_server.gets("/a.tar.gz")[0]
    assert (tmp_path / "a.tar.gz").read_bytes() == DATA


def test_complete_archive_of_the_listed_size_is_reused(http_server, tmp_path):
    """An install interrupted while unpacking left its complete archive: not fetched again."""
    url = http_server.add("/a.tar.gz", DATA)
    dl.download(url, tmp_path / "a.tar.gz", progress=False)
    res = dl.download(url, tmp_path / "a.tar.gz", expected_size=len(DATA), progress=False)
    assert res.attempts == 0 and res.sha256 == SHA and len(http_server.gets("/a.tar.gz")) == 1
    # another size: fetched anew (and refused here, the server's file not being that size)
    with pytest.raises(IntegrityError, match="expected"):
        dl.download(url, tmp_path / "a.tar.gz", expected_size=len(DATA) + 1, progress=False)
    assert len(http_server.gets("/a.tar.gz")) == 2


def test_trickling_server_is_dropped_and_the_retry_is_said(http_server, tmp_path, capsys):
    """1 byte every 0.05 s: under download.min_rate, each try is dropped after rate_window and
    retried (saying so); in the end a NetworkError naming the rate, the bytes kept."""
    url = http_server.add("/a.tar.gz", DATA[:4000])
    for _ in range(2):
        http_server.fail("/a.tar.gz", trickle=0.05)
    policy = download_policy.RetryPolicy(attempts=2, min_rate=1000, rate_window=1.0)
    with pytest.raises(NetworkError, match="too slow") as exc:
        dl.download(url, tmp_path / "a.tar.gz", progress=False, policy=policy)
    assert "bytes kept" in exc.value.message
    err = capsys.readouterr().err
    assert "too slow" in err and "retrying in 0.5 s (attempt 2 of 2)" in err


def test_reading_stops_at_the_advertised_size(tmp_path):
    """A chunked body that never ends (no Content-Length): reading stops at the size the
    listing gave, the file is that size, and the server sees the client hang up."""
    import http.server
    import threading

    sent = {"bytes": 0}

    class Endless(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"z" * 65536
            try:
                for _ in range(2000):  # 128 MiB if nobody stops reading
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                    sent["bytes"] += len(block)
            except OSError:
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/endless.tar.gz"
        res = dl.download(url, tmp_path / "e.tar.gz", expected_size=100_000, progress=False)
    finally:
        server.shutdown()
        server.server_close()
    assert res.size == 100_000 and (tmp_path / "e.tar.gz").stat().st_size == 100_000
    assert sent["bytes"] < 64 << 20


def test_checksum_file_is_read_with_a_cap(http_server):
    """4 MiB where a checksum line is expected: refused at the announced length (exit 6, as
    every listing past its cap), and also when the server announces no length."""
    url = http_server.add("/a.tar.gz.sha256", b"0" * (4 << 20))
    with pytest.raises(NetworkError, match="larger than 65536 bytes: it announces 4194304"):
        dl.get_text(url, missing_ok=True, max_bytes=65536)
    http_server.fail("/a.tar.gz.sha256", endless=True)
    with pytest.raises(NetworkError, match="larger than 65536 bytes: it sent more"):
        dl.get_text(url, missing_ok=True, max_bytes=65536)


def test_dns_failure_fails_at_once(tmp_path, _no_sleep, capsys):
    """A name that cannot resolve (RFC 6761 reserves .invalid) is not transient: no retries."""
    with pytest.raises(NetworkError, match="cannot resolve the host name 'rocforge-test.invalid'"):
        dl.download("http://rocforge-test.invalid/x.tar.gz", tmp_path / "x", progress=False)
    with pytest.raises(NetworkError, match="cannot resolve"):
        dl.get_text("http://rocforge-test.invalid/index.html")
    assert _no_sleep == [] and "retrying" not in capsys.readouterr().err


def test_policy_from_config_checks_its_keys():
    policy = download_policy.policy_from_config({"download": {"min_rate": 10, "rate_window": 2}})
    assert policy.min_rate == 10.0 and policy.rate_window == 2.0 and policy.attempts == 5
    from rocforge_build.errors import ConfigError

    with pytest.raises(ConfigError, match="download.attempts"):
        download_policy.policy_from_config({"download": {"attempts": 0}})


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
    _part(tmp_path, url, DATA)
    res = dl.download(url, tmp_path / "a.tar.gz", sha256=SHA, progress=False)
    assert res.sha256 == SHA and (tmp_path / "a.tar.gz").read_bytes() == DATA
    assert res.resumed_from == len(DATA)


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
                    policy=download_policy.RetryPolicy(attempts=2))
    assert exc.value.hint
    # the innermost reason, whole (urllib3's wrapping used to push it past a 200-character cut)
    assert exc.value.message.endswith(": Connection refused")
    assert "Errno" not in exc.value.message and "ConnectionRefusedError" not in exc.value.message


def test_the_resume_validator_is_never_written_through_a_link(tmp_path):
    """`<file>.part.validator` is rocforge's own name: whatever sits there (a link to a user's
    file, say) is removed, never written through."""
    from rocforge_build import download as dl

    victim = tmp_path / "victim.txt"
    victim.write_text("user data\n")
    part = tmp_path / "x.tar.gz.part"
    dl.validator_path(part).symlink_to(victim)
    dl._write_validator(part, {"ETag": '"abc"'})
    assert victim.read_text() == "user data\n"
    assert not dl.validator_path(part).is_symlink()
    import json

    assert json.loads(dl.validator_path(part).read_text()) == {"if_range": '"abc"'}
