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


# -- 11: a read-only HOME, cache, data or config directory -------------------------------------

_RO_SCRIPT = r"""
set -u
mount -t tmpfs -o ro,size=64k tmpfs "$RO" || exit 99
cd "$RO"
i=0
for args in "$@"; do
    i=$((i + 1))
    eval "set -- $args"
    "$PY" -m rocforge_build "$@" >"$OUTDIR/$i.out" 2>"$OUTDIR/$i.err"
    echo $? >"$OUTDIR/$i.rc"
done
"""


def run_on_read_only_home(tmp_path, commands: list[list[str]], env_extra: dict) -> list[tuple]:
    """Run each rocforge command with HOME on a real read-only tmpfs, mounted in a private
    user and mount namespace (`unshare -rm`: works for root, whom chmod 0555 does not stop,
    and for an unprivileged user alike; the mount vanishes with the namespace)."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    ro, outdir = tmp_path / "ro-home", tmp_path / "out"
    ro.mkdir()
    outdir.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROCFORGE_", "XDG_"))}
    env.update(HOME=str(ro), RO=str(ro), OUTDIR=str(outdir), PY=sys.executable,
               PYTHONPATH=str(Path(__file__).resolve().parent.parent), **env_extra)
    res = subprocess.run(["unshare", "-rm", "sh", "-c", _RO_SCRIPT, "sh",
                          *[shlex.join(c) for c in commands]], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not any(ro.iterdir())  # outside the namespace: nothing was written where HOME was
    return [(int((outdir / f"{i}.rc").read_text()), (outdir / f"{i}.err").read_text())
            for i in range(1, len(commands) + 1)]


def test_read_only_home_names_the_directory_and_its_variable(tmp_path):
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    build = ["build", str(RECIPE), "--target", "gfx1030", "--source", str(tb),
             "--prefix", str(tmp_path / "prefix")]
    results = run_on_read_only_home(tmp_path, [
        [*build, "--dry-run"],
        build,
        ["config", "set", "download.attempts", "3"],
    ], {})
    expected = [("cache", "ROCFORGE_CACHE_DIR"), ("cache", "ROCFORGE_CACHE_DIR"),
                ("config", "ROCFORGE_CONFIG_DIR")]
    for (rc, err), (kind, var) in zip(results, expected, strict=True):
        assert rc == 2, err
        assert "internal error" not in err and "Traceback" not in err
        lines = error_lines(err)
        assert len(lines) == 1, err
        assert f"the {kind} directory {tmp_path / 'ro-home'}" in lines[0] and var in lines[0]
        assert "Read-only file system" in lines[0]
    assert not (tmp_path / "prefix").exists()


def test_read_only_data_dir_override_is_named(tmp_path):
    """A ROCFORGE_DATA_DIR on the read-only mount (cache and config writable elsewhere)."""
    ro = tmp_path / "ro-home"
    results = run_on_read_only_home(tmp_path, [
        ["build", str(RECIPE), "--target", "gfx1030", "--source", str(project_copy(tmp_path / "s"))],
    ], {"ROCFORGE_DATA_DIR": str(ro / "data"), "ROCFORGE_CACHE_DIR": str(tmp_path / "cache"),
        "ROCFORGE_CONFIG_DIR": str(tmp_path / "config")})
    rc, err = results[0]
    assert rc == 2, err
    lines = error_lines(err)
    assert len(lines) == 1 and f"the data directory {ro / 'data'}" in lines[0], err
    assert "ROCFORGE_DATA_DIR" in lines[0]


# -- 13: preflight before fetching; a dry run exits as the build would -------------------------

@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "build"])
def test_no_rocm_stops_before_any_download(http_server, tmp_path, capsys, dry):
    """llama-cpp's default backend for gfx1151 is HIP; on a root without any ROCm the build
    (and its dry run) stops with exit 5 before the source is asked for."""
    url = http_server.add("/llama.cpp.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    empty = tmp_path / "root"
    empty.mkdir()
    argv = ["--root", str(empty), "build", "llama-cpp", "--target", "gfx1151", "--source", url]
    rc = main(argv + (["--dry-run"] if dry else []))
    err = capsys.readouterr().err
    assert rc == 5, err
    assert len(error_lines(err)) == 1 and "no ROCm toolchain found for gfx1151" in err
    assert http_server.requests == []  # not a single request, not even a HEAD


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "build"])
def test_foreign_prefix_refused_before_any_download(http_server, tmp_path, capsys, dry):
    url = http_server.add("/fixture-1.2.0.tar.gz", tarball(tmp_path / "t.tar.gz").read_bytes())
    prefix = tmp_path / "mine"
    prefix.mkdir()
    (prefix / "notes.txt").write_text("the user's own file\n")
    argv = ["build", str(RECIPE), "--target", "gfx1030", "--source", url, "--prefix", str(prefix)]
    rc = main(argv + (["--dry-run"] if dry else []))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(error_lines(err)) == 1 and "refusing to replace --prefix" in err
    assert http_server.requests == []
    assert (prefix / "notes.txt").read_text() == "the user's own file\n"


def test_dry_run_and_build_exit_alike_on_missing_toolchain_after_fetch(tmp_path, capsys):
    """A backend whose toolchain is missing, found out with a local source (no download to
    spare): the dry run no longer prints a plan with "toolchain MISSING" and exits 0."""
    src = project_copy(tmp_path / "src")
    empty = tmp_path / "root"
    empty.mkdir()
    codes = []
    for extra in (["--dry-run"], []):
        codes.append(main(["--root", str(empty), "build", str(RECIPE), "--target", "gfx1151",
                           "--backend", "hip", "--source", str(src),
                           "--prefix", str(tmp_path / "p"), *extra]))
    err = capsys.readouterr().err
    assert codes == [5, 5], err
    assert not (tmp_path / "p").exists()
