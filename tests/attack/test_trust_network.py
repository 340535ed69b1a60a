"""Attack tests (issue 25, network): a server that trickles, streams forever or redirects to a
non-HTTP(S) scheme, played for real by a server on 127.0.0.1 (tests/http_fixture.py) against
`rocforge nightly list --index URL` and `rocforge nightly install`.  Each ends in one error line
and exit 6 within the configured deadline, and leaves nothing behind."""

from __future__ import annotations

import time

import pytest
from therock_tarballs import Mirror, make_tarball

from rocforge_build import cli, download_policy
from rocforge_build import download as dl
from rocforge_build.errors import IntegrityError, NetworkError

DEADLINE = 1.0  # short: a fast test; the defaults are 6 h and 5 min
# the bound an ended fetch must meet: the deadline, plus one socket wait's rounding, the
# CLI's own start-up and a loaded 2-core CI machine's scheduling
MARGIN = 1.5
VERSION = "7.10.0a20251101"


def run(capsys, *argv) -> tuple[int, str, str, float]:
    start = time.monotonic()
    rc = cli.main(list(argv))
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    return rc, out, err, elapsed


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rocforge: error:")]


def set_config(capsys, *pairs: tuple[str, str]) -> None:
    for key, value in pairs:
        assert cli.main(["config", "set", key, value]) == 0
    capsys.readouterr()


@pytest.fixture
def fast_limits(capsys):
    """Both deadlines at 1 s; the min-rate check at 10 bytes/s over 0.5 s, so the trickles
    below (20 bytes/s) stay above it and only the deadline can end them."""
    set_config(capsys, ("download.deadline", str(DEADLINE)),
               ("download.listing_deadline", str(DEADLINE)),
               ("download.min_rate", "10"), ("download.rate_window", "0.5"))


# (fault, what it plays): every one would hold a fetch far past 1 s
SLOW_SERVERS = [
    ({"trickle": 0.05}, "20 bytes/s, above download.min_rate: never dropped for slowness"),
    ({"trickle": 3.0}, "a byte every 3 s: each read waits longer than the whole deadline"),
    ({"endless": True, "trickle": 0.05}, "a chunked body trickling forever, no size"),
]


@pytest.mark.parametrize("fault,_plays", SLOW_SERVERS, ids=["above-min-rate", "byte-per-3s",
                                                          "endless-trickle"])
def test_listing_from_a_slow_server_ends_at_the_deadline(http_server, capsys, fast_limits,
                                                         fault, _plays):
    page = http_server.add("/slow/", "<html>" + "x" * 4000 + "</html>")
    for _ in range(10):  # every retry meets the same server
        http_server.fail("/slow/", **fault)
    rc, _out, err, elapsed = run(capsys, "nightly", "list", "--index", page)
    assert rc == 6, err
    assert elapsed < DEADLINE + MARGIN, elapsed
    lines = error_lines(err)
    assert len(lines) == 1 and "download.listing_deadline" in lines[0], err
    assert "Traceback" not in err


def test_listing_that_streams_forever_stops_at_the_size_cap(http_server, capsys, fast_limits):
    """Full speed, no end, no Content-Length: the cap (here 1 MiB) ends it, long before the deadline
    (30 s here, so a loaded machine reading slowly still meets the cap first)."""
    set_config(capsys, ("download.max_listing_bytes", str(1 << 20)), ("download.listing_deadline", "30"))
    http_server.fail("/forever/", endless=True)
    rc, _out, err, elapsed = run(capsys, "nightly", "list", "--index",
                                 http_server.url("/forever/"))
    assert rc == 6 and elapsed < 30, (err, elapsed)
    lines = error_lines(err)
    assert len(lines) == 1 and "larger than 1048576 bytes" in lines[0], err


# Location values a hostile or broken server may send: none is http(s)
BAD_LOCATIONS = ["file:///etc/passwd", "ftp://127.0.0.1/x.tar.gz", "gopher://127.0.0.1:70/1",
                 "javascript:alert(1)", "data:text/html,<h1>x</h1>"]


@pytest.mark.parametrize("location", BAD_LOCATIONS)
def test_listing_redirect_to_another_scheme_is_refused(http_server, capsys, location):
    http_server.fail("/moved/", status=302, headers={"Location": location})
    rc, out, err, _ = run(capsys, "nightly", "list", "--index", http_server.url("/moved/"))
    lines = error_lines(err)
    assert rc == 6 and out == "" and len(lines) == 1, err
    assert "redirects to" in lines[0] and location.split(":")[0] in lines[0]
    assert "Traceback" not in err
    assert len(http_server.gets("/moved/")) == 1  # refused, not retried


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    return make_tarball(tmp_path_factory.mktemp("net"), "gfx1151", VERSION, ["gfx1151"],
                        payload=20_000)


@pytest.fixture
def site(http_server, tarball, capsys):
    mirror = Mirror(http_server, "/tarball/")
    mirror.add_file(tarball, 1761980000.0)
    set_config(capsys, ("nightly.sources.cdn.url", mirror.url), ("nightly.use", '["cdn"]'))
    return mirror, "/tarball/" + tarball.name


def install(capsys, prefix):
    return run(capsys, "nightly", "install", "--target", "gfx1151", "--prefix", str(prefix),
               "--no-progress")


@pytest.mark.parametrize("fault,_plays", SLOW_SERVERS, ids=["above-min-rate", "byte-per-3s",
                                                          "endless-trickle"])
def test_install_from_a_slow_server_ends_at_the_deadline(site, tmp_path, capsys, fast_limits,
                                                         http_server, fault, _plays):
    _mirror, path = site
    for _ in range(10):
        http_server.fail(path, **fault)
    prefix = tmp_path / "rocm"
    rc, _out, err, elapsed = install(capsys, prefix)
    assert rc == 6, err
    # the listing and the HEAD for the size come first, at full speed
    assert elapsed < DEADLINE + MARGIN, elapsed
    lines = error_lines(err)
    assert len(lines) == 1 and "download.deadline" in lines[0], err
    assert not (prefix / "current").exists()


@pytest.mark.parametrize("location", BAD_LOCATIONS)
def test_install_redirect_to_another_scheme_is_refused(site, tmp_path, capsys, http_server,
                                                       location):
    _mirror, path = site
    http_server.fail(path, status=302, headers={"Location": location})
    prefix = tmp_path / "rocm"
    rc, _out, err, _ = install(capsys, prefix)
    lines = error_lines(err)
    assert rc == 6 and len(lines) == 1 and "redirects to" in lines[0], err
    assert not (prefix / "current").exists()
    downloads = prefix / ".downloads"
    assert not downloads.exists() or not any(downloads.iterdir())


# -- download.py directly -------------------------------------------------------------------------

def test_http_redirects_are_still_followed(http_server, tmp_path):
    data = b"payload" * 1000
    http_server.add("/real/a.tar.gz", data)
    http_server.fail("/old/a.tar.gz", status=301, headers={"Location": "/real/a.tar.gz"})
    res = dl.download(http_server.url("/old/a.tar.gz"), tmp_path / "a.tar.gz", progress=False)
    assert res.size == len(data) and (tmp_path / "a.tar.gz").read_bytes() == data


def test_a_redirect_loop_stops(http_server, tmp_path):
    for _ in range(dl.MAX_REDIRECTS + 1):
        http_server.fail("/loop", status=302, headers={"Location": "/loop"})
    with pytest.raises(NetworkError, match="more than 10 redirects"):
        dl.download(http_server.url("/loop"), tmp_path / "x", progress=False)
    assert len(http_server.gets("/loop")) == dl.MAX_REDIRECTS + 1


def test_download_without_a_size_stops_at_the_cap(http_server, tmp_path):
    """No Content-Length, no size from a listing, a body without end: read up to the cap (here
    1 MiB) plus one byte, then refused and the partial file deleted."""
    http_server.fail("/forever.tar.gz", endless=True)
    policy = download_policy.RetryPolicy(attempts=1, max_unsized_bytes=1 << 20, notify=None)
    with pytest.raises(NetworkError, match="download.max_unsized_bytes"):
        dl.download(http_server.url("/forever.tar.gz"), tmp_path / "f.tar.gz", progress=False,
                    policy=policy)
    assert list(tmp_path.iterdir()) == []


def test_a_size_other_than_the_listing_is_refused_before_reading(http_server, tmp_path):
    """The listing says 100 bytes, the server announces 4 MiB: refused at the headers."""
    http_server.add("/a.tar.gz", b"y" * (4 << 20))
    http_server.fail("/a.tar.gz", trickle=1.0)  # were the body read, this would take days
    start = time.monotonic()
    with pytest.raises(IntegrityError, match="announces 4194304 bytes, expected 100"):
        dl.download(http_server.url("/a.tar.gz"), tmp_path / "a.tar.gz", expected_size=100,
                    progress=False)
    assert time.monotonic() - start < 1.0 and list(tmp_path.iterdir()) == []


def test_an_unfetchable_scheme_given_by_the_user_is_exit_2(capsys):
    rc, _out, err, _ = run(capsys, "nightly", "list", "--index", "ftp://127.0.0.1/tarball/")
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and "only http://, https:// and file://" in lines[0]
