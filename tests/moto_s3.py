"""moto's S3 server (PyPI, the `test` extra) on 127.0.0.1 for the tests that need a real S3 API:
started once per caller on a free port with its buckets made, stopped on exit.  Where the venv
lacks it, the test skips as a missing tool (NOT RUN; a failure under CI=true, which installs it)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# what the S3 clients (rocforge's store, sccache) are told beside the endpoint
CREDENTIALS = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@contextlib.contextmanager
def moto_s3(*buckets: str) -> Iterator[str]:
    """The server's endpoint URL, each of `buckets` made."""
    server = Path(sys.executable).parent / "moto_server"
    if not server.is_file():
        pytest.skip("lacks moto_server (pip install -e '.[test]')")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for bucket in buckets:
            deadline = time.monotonic() + 20
            while True:  # the first bucket waits for the server to listen
                try:
                    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def use_s3(monkeypatch, endpoint: str) -> None:
    """This process's S3 clients (rocforge's s3:// stores) talk to `endpoint`."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for var, value in CREDENTIALS.items():
        monkeypatch.setenv(var, value)
