"""The first hour: the traps a new user met (issue 25, items 11-14 and 18), each tried for real.

Real files, a real read-only mount for the home/cache/data/config directories, a real HTTP
server on 127.0.0.1 (tests/http_fixture.py) that records every request, fake sysfs roots in the
kernel's formats (tests/fixtures_roots.py).
"""

from __future__ import annotations

import pytest
from buildfixtures import RECIPE, project_copy, tarball

from rocforge_build import download
from rocforge_build.cli import main


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rocforge: error:")]


@pytest.fixture
def no_sleep(monkeypatch):
    """Download retries without their backoff waits (the retries themselves still happen)."""
    monkeypatch.setattr(download, "_sleep", lambda seconds: None)


# -- 14: a download error whose cause carries a str `reason` -----------------------------------

def test_container_run_dry_run_tls_error_is_one_network_line(http_server, no_sleep, tmp_path,
                                                             capsys):
    """`container run --dry-run` without --backend reads the source to choose the backend; an
    https:// URL answered by a plain-HTTP server fails the TLS handshake with an ssl.SSLError
    whose `reason` is a str ('WRONG_VERSION_NUMBER') — which used to end in an internal error."""
    url = http_server.add("/llama.cpp.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    https = url.replace("http://", "https://", 1)
    rc = main(["container", "run", "llama-cpp", "--target", "gfx1151", "--engine", "docker",
               "--source", https, "--dry-run", "--", "true"])
    err = capsys.readouterr().err
    assert rc == 6, err
    assert "internal error" not in err
    lines = error_lines(err)
    assert len(lines) == 1 and "SSL" in lines[0], err
