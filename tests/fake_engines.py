"""A docker client that answers what rocforge's engine check asks, for tests that must not
depend on the machine's own docker (CI's has no daemon and no buildx plugin).

tests/conftest.py loads this module as a plugin:

    def test_x(docker_ok):          # a working fake docker first on PATH; docker_ok is its bin dir
        ...
    fake_docker(bindir, buildx=False, daemon=False)   # a client without BuildKit and daemon

Every call is appended to `bindir/docker.calls` (one line of arguments), so a test can see that
a dry run asked the engine's questions and ran nothing else.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

_SCRIPT = """#!/bin/sh
echo "$*" >> "{calls}"
case "$1 $2" in
  "buildx version")
    {buildx}
    ;;
  "version --format"*)
    {daemon}
    ;;
esac
echo "fake docker: not a command this test expects: $*" >&2
exit 3
"""
_BUILDX_OK = 'echo "github.com/docker/buildx v0.17.1"; exit 0'
_BUILDX_MISSING = 'echo "docker: unknown command: docker buildx" >&2; exit 1'
_DAEMON_OK = 'echo "27.3.1"; exit 0'
_DAEMON_MISSING = ('echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. '
                   'Is the docker daemon running?"; exit 1')


def fake_docker(bindir: Path, *, buildx: bool = True, daemon: bool = True) -> Path:
    """Write `bindir/docker`; returns bindir."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "docker"
    exe.write_text(_SCRIPT.format(calls=bindir / "docker.calls",
                                  buildx=_BUILDX_OK if buildx else _BUILDX_MISSING,
                                  daemon=_DAEMON_OK if daemon else _DAEMON_MISSING))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bindir


def calls(bindir: Path) -> list[str]:
    log = bindir / "docker.calls"
    return log.read_text().splitlines() if log.is_file() else []


@pytest.fixture
def docker_ok(tmp_path, monkeypatch) -> Path:
    """A docker with BuildKit and a daemon, first on PATH; the bin directory it is in."""
    bindir = fake_docker(tmp_path / "fake-docker-bin")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bindir
