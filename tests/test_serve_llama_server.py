"""serve/llama_server.py's LlamaServer on stand-ins (sh scripts and a Python http.server: what is
tested is the start, the readiness, the bounded request and the stop, not llama.cpp; the real
server is in tests/e2e/test_serve_*_llama.py, the hostile cases in tests/attack/test_canary_hostile.py
and tests/attack/test_trust_serve_proc.py)."""

from __future__ import annotations

import http.server
import sys
import threading
import time

import pytest
from test_proc import alive

from rocforge_build.serve.llama_server import LlamaServer, NotReady, ServerError, exchange


def sh(script: str) -> list[str]:
    """A stand-in llama-server: `script` run by sh, the --host/--port words it is given ignored."""
    return ["/bin/sh", "-c", script, "llama-server"]


def test_a_server_that_exits_is_not_ready_at_once_with_its_last_words():
    """wait_ready waits on the child between looks: its exit ends the wait (no sleep to run out),
    and its last line of output is read to the end."""
    with LlamaServer.on_loopback(sh("echo loading; echo 'error: no such model' >&2; exit 3"), relay=False) as server:
        start = time.monotonic()
        with pytest.raises(NotReady) as e:
            server.wait_ready(30)
    assert time.monotonic() - start < 5
    assert (e.value.why, e.value.code, e.value.last) == ("exited", 3, "error: no such model")


def test_a_silent_server_is_not_ready_after_its_bound_and_is_stopped_whole(tmp_path):
    """Never listening: "silent" after the bound; stop() ends it and the child it started, once
    (a second stop signals nothing: its reaped pid may be another process's by then)."""
    pids = tmp_path / "pids"
    server = LlamaServer.on_loopback(sh(f"sleep 3600 & echo $! > '{pids}'; wait"), relay=False).start()
    try:
        with pytest.raises(NotReady) as e:
            server.wait_ready(1.0)
        assert e.value.why == "silent"
    finally:
        server.stop(grace=2.0)
    grandchild = int(pids.read_text())
    assert server.returncode is not None and not alive(server.pid) and not alive(grandchild)
    server.stop()  # once: nothing left to signal, nothing raised


class _Big(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"x" * 4096
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_a_reply_past_the_cap_is_one_error_line():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Big)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        assert exchange("GET", url, "/x", None, {}, 5.0, limit=4096) == (200, b"x" * 4096)
        with pytest.raises(ServerError) as e:
            exchange("GET", url, "/x", None, {}, 5.0, limit=1024)
    finally:
        srv.shutdown()
        srv.server_close()
    assert e.value.message == f"{url}/x replied with more than 1024 bytes"


def test_a_ready_server_answers_its_requests_from_its_own_port():
    """A Python http.server as the stand-in: ready once /health answers from its own socket, then
    asked through request()."""
    code = ("import http.server, sys\n"
            "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
            "        self.wfile.write(b'ok')\n"
            "    def log_message(self, *a): pass\n"
            "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    with LlamaServer.on_loopback([sys.executable, "-c", code], relay=False) as server:
        server.wait_ready(30)
        assert server.holder() in ("ours", "unknown")
        assert server.request("GET", "/props", timeout=5.0) == (200, b"ok")
        pid = server.pid
    assert not alive(pid)
