"""Hostile clients and a dying server against serve's canary front (serve/front.py): a
slowloris head, huge headers and bodies, too many connections, a client gone mid-stream, a
llama-server that is not there or dies mid-answer.  Each ends in one status line or a closed
connection within its bound, no traceback, the front still serving the next request, and memory
bounded.  The upstream is tests/test_serve_front.py's real HTTP server on 127.0.0.1 (the one
fake here: a real llama-server cannot be told to die mid-answer on cue).  Seconds in all."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
import time
import tracemalloc

import pytest
from test_serve_front import Clock, Upstream, ask, front_for, until

from rocforge_build.serve import front as serve_front
from rocforge_build.serve import front_http


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


@pytest.fixture
def front(upstream):
    f = front_for(upstream)
    yield f
    f.stop()


def raw(front, data: bytes, *, wait: float = 5.0) -> bytes:
    """Send `data`, read until the front closes (or `wait` passes)."""
    with socket.create_connection(("127.0.0.1", front.port), timeout=wait) as s:
        s.sendall(data)
        out = b""
        try:
            while piece := s.recv(65536):
                out += piece
        except TimeoutError:
            pass
    return out


def still_serving(front) -> None:
    status, _, out = ask(front, "POST", "/echo", b"ok")
    assert status == 200 and json.loads(out)["length"] == 2


def test_a_slowloris_head_is_cut_at_its_bound(front, monkeypatch, capfd):
    monkeypatch.setattr(front_http, "HEAD_SECONDS", 1.0)
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        out = b""
        for _ in range(20):  # a header byte every 0.2 s, never the end of the head
            try:
                s.sendall(b"X")
            except OSError:
                break
            time.sleep(0.2)
            s.settimeout(0.01)
            try:
                out += s.recv(4096)
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                break
            if out:
                break
    assert out.startswith(b"HTTP/1.1 408 ") and time.monotonic() - start < 2.5
    still_serving(front)
    assert "Traceback" not in capfd.readouterr().err


def _drip(front, pieces: list[bytes], gap: float, until: float) -> tuple[bytes, float]:
    """Send each piece `gap` seconds apart (then blank lines) until the front answers or closes, or
    `until` seconds pass: what came back and when the connection ended."""
    start = time.monotonic()
    out = b""
    with socket.create_connection(("127.0.0.1", front.port), timeout=until) as s:
        s.settimeout(gap)
        i = 0
        while time.monotonic() - start < until:
            try:
                s.sendall(pieces[i] if i < len(pieces) else b"\r\n")
                i += 1
                piece = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not piece:
                break
            out += piece
    return out, time.monotonic() - start


def test_blank_lines_do_not_keep_a_connection_open(front, monkeypatch):
    """A slowloris sending only CRLF every 0.4 s (scaled: head 1 s, idle 2 s; the real 20 s / 75 s):
    the first byte of any kind starts the head's one deadline, so it gets 408 at ~1 s, not never."""
    monkeypatch.setattr(front_http, "HEAD_SECONDS", 1.0)
    monkeypatch.setattr(front_http, "IDLE_SECONDS", 2.0)
    out, took = _drip(front, [], 0.4, 8.0)
    assert out.startswith(b"HTTP/1.1 408 ") and 0.9 <= took < 2.0
    still_serving(front)


def test_blank_lines_after_an_answer_do_not_extend_the_idle_bound(front, monkeypatch):
    """After a whole request, blank lines again: the head deadline (1 s) bounds them too."""
    monkeypatch.setattr(front_http, "HEAD_SECONDS", 1.0)
    monkeypatch.setattr(front_http, "IDLE_SECONDS", 2.0)
    out, took = _drip(front, [b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"], 0.4, 8.0)
    assert out.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in out and took < 2.5


def test_blank_lines_before_a_request_in_time_are_ignored(front, monkeypatch):
    monkeypatch.setattr(front_http, "HEAD_SECONDS", 1.0)
    out = raw(front, b"\r\n\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ")


def test_an_idle_keep_alive_connection_is_closed_quietly(front, monkeypatch):
    monkeypatch.setattr(front_http, "IDLE_SECONDS", 0.5)
    start = time.monotonic()
    assert raw(front, b"", wait=5) == b"" and time.monotonic() - start < 2


@pytest.mark.parametrize("head, status", [
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", b"431"),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n", b"431"),
    (b"NOT A REQUEST\r\n\r\n", b"400"),
    (b"GET / HTTP/2.0\r\n\r\n", b"400"),
    (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"400"),
    (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400"),
    (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", b"400"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"411"),
])
def test_a_malformed_or_huge_head_gets_one_status_and_a_close(front, upstream, head, status, capfd):
    out = raw(front, head)
    assert out.startswith(b"HTTP/1.1 " + status + b" ") and b"Connection: close" in out
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    assert not upstream.seen  # nothing malformed reaches llama-server
    still_serving(front)
    assert "Traceback" not in capfd.readouterr().err


def test_a_huge_body_streams_through_in_bounded_memory(front):
    """64 MB posted: the server counts every byte, the front never holds more than a few pieces."""
    size = 64 << 20
    piece = b"z" * (1 << 20)
    tracemalloc.start()
    try:
        c = http.client.HTTPConnection("127.0.0.1", front.port, timeout=30)
        c.putrequest("POST", "/count")
        c.putheader("Content-Length", str(size))
        c.endheaders()
        for _ in range(size // len(piece)):
            c.send(piece)
        r = c.getresponse()
        out = json.loads(r.read())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == {"length": size}
    assert peak < 8 << 20  # the test's own 1 MB piece and the front's 64 KB reads, not 64 MB


def test_a_body_shorter_than_its_length_is_dropped_at_the_io_bound(front, monkeypatch):
    monkeypatch.setattr(front_http, "IO_SECONDS", 0.5)
    start = time.monotonic()
    raw(front, b"POST /count HTTP/1.1\r\nContent-Length: 1000\r\n\r\nonly this", wait=5)
    assert time.monotonic() - start < 3
    still_serving(front)


def test_a_client_gone_mid_stream_stops_the_answer(front, upstream, capfd):
    """The front closes its connection to llama-server, which then stops generating (cpp-httplib
    sees the write fail); the request is no longer in flight, so the canary can run."""
    c = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    c.request("POST", "/sse-forever?gap=0.05", b"{}")
    r = c.getresponse()
    r.read1(100)
    c.sock.close()
    c.close()
    assert upstream.client_gone.wait(5)
    deadline = time.monotonic() + 3
    while front._in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert front._in_flight == 0
    still_serving(front)
    assert "Traceback" not in capfd.readouterr().err


def test_a_server_that_is_not_there_is_a_502_in_one_line(capfd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening: connections are refused
        f = serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", dead)).start()
        try:
            status, _, out = ask(f, "POST", "/v1/chat/completions", b"{}")
        finally:
            f.stop()
    assert status == 502 and "did not answer" in json.loads(out)["error"]["message"]
    assert "Traceback" not in capfd.readouterr().err


def test_a_server_dying_mid_answer_cuts_the_answer_without_a_hang(front, capfd):
    c = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    c.request("POST", "/sse-die?gap=0.05", b"{}")
    r = c.getresponse()
    start = time.monotonic()
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    assert time.monotonic() - start < 3
    still_serving(front)
    assert "Traceback" not in capfd.readouterr().err


def test_connections_past_the_bound_are_refused_with_a_503(upstream, monkeypatch):
    monkeypatch.setattr(serve_front, "MAX_CONNECTIONS", 4)
    f = front_for(upstream)
    held = [socket.create_connection(("127.0.0.1", f.port), timeout=5) for _ in range(4)]
    try:
        time.sleep(0.3)
        out = raw(f, b"GET /echo HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 503 ") and b"too many connections" in out
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    still_serving(f)
    f.stop()


# -- issue 38 item 7: the periodic canary cannot be dodged, no client waits without bound ----------
class _Dodger(http.server.BaseHTTPRequestHandler):
    """llama-server that answers clients well but a canary-shaped /completion (one asking for
    n_probs) with NaN probabilities or junk, or that hangs every request but GET /ok."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.server.kind == "hang" and self.path != "/ok" and not (self.path == "/health" and self.server.healthy):
            self.server.release.wait(60)
            return
        self._reply(b'{"status": "ok"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.kind == "hang":
            self.server.release.wait(60)
            return
        if b'"n_probs"' not in body:
            return self._reply(b'{"content": "a fine answer"}')
        if self.server.kind == "nan":
            item = {"id": 5, "top_logprobs": [{"id": 5, "logprob": float("nan")}, {"id": 6, "logprob": -5.0}]}
            return self._reply(json.dumps({"completion_probabilities": [item] * 4}).encode())
        self._reply(b"<html>nothing to see</html>")


@pytest.fixture
def dodger():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dodger)
    server.daemon_threads, server.release, server.healthy = True, threading.Event(), False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _dodged_front(server, clock, said, recorded, **kw):
    from test_serve_front import _real_checker

    port = server.server_address[1]
    return serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", port), checker=_real_checker(port, 5.0),
                             say=said.append, record=recorded.append, clock=clock, **kw).start()


@pytest.mark.parametrize(("kind", "why"), [("nan", "probability out of range"), ("junk", "is not JSON")])
def test_a_server_dodging_the_canary_is_failed_past_the_bound(dodger, kind, why):
    """NaN or junk only to the canary: each check is "not run" and clients are served, until it
    has not run NOT_RUN_LIMIT (3) times in a row over NOT_RUN_SECONDS (300 s); then every request
    gets 503 naming why, said in one line and recorded as a failure."""
    dodger.kind = kind
    clock, said, recorded = Clock(), [], []
    f = _dodged_front(dodger, clock, said, recorded)  # no `every`: only this test runs the canary
    try:
        for step in (0.0, 100.0, 100.0):  # three in a row, but over 200 s only: not yet
            clock.now += step
            assert f.run_canary() == serve_front.NOT_RUN
            assert ask(f, "POST", "/completion", b'{"prompt": "hi"}')[0] == 200
        clock.now += 100.0  # the fourth, 300 s after the first
        assert f.run_canary() == serve_front.FAILED
        status, _, out = ask(f, "POST", "/completion", b'{"prompt": "hi"}')
        error = json.loads(out)["error"]
        assert status == 503 and error["type"] == "canary_not_run", out
        assert why in error["message"] and "4 checks in a row could not run over 300 s" in error["message"]
        assert ask(f, "GET", "/health")[0] == 503
        assert len(recorded) == 1 and why in recorded[0].failures[0]
        assert [line for line in said if "counted as FAILED" in line] == [said[-1]] and "\n" not in said[-1]
    finally:
        f.stop()


def test_many_not_run_checks_in_a_short_time_are_not_yet_a_failure(dodger):
    """The time bound spares a server briefly too busy for the canary: ten in a row within a
    minute (as `--canary-every 5s` would retry it) are still "not run"."""
    dodger.kind = "nan"
    clock, said, recorded = Clock(), [], []
    f = _dodged_front(dodger, clock, said, recorded)
    try:
        for _ in range(10):
            clock.now += 5.0
            assert f.run_canary() == serve_front.NOT_RUN
        assert f.failure is None and recorded == []
    finally:
        f.stop()


def test_the_running_front_fails_a_dodger_on_its_own(dodger):
    """No test calls the canary here: the front's own schedule (its clock a minute further at each
    look) retries it and latches the 503."""
    dodger.kind = "junk"
    clock, said, recorded = Clock(), [], []

    class Ticking(Clock):
        def __call__(self):
            self.now += 60.0
            return self.now

    clock = Ticking()
    f = _dodged_front(dodger, clock, said, recorded, every=30)
    try:
        assert f.recorded.wait(30), said
        assert f.failure is not None and f.failure.kind == "canary_not_run"
        assert ask(f, "GET", "/v1/models")[0] == 503
    finally:
        f.stop()


def test_a_hanging_server_gets_clients_504_then_is_failed(dodger, monkeypatch):
    """Every request hangs, /health too: each client gets 504 at the deadline (0.5 s here), and
    the third in a row fails the server: 503 naming it, said and recorded."""
    monkeypatch.setattr(serve_front, "HEALTH_SECONDS", 0.5)
    dodger.kind = "hang"
    said, recorded = [], []
    f = _dodged_front(dodger, Clock(), said, recorded, request_seconds=0.5)
    try:
        for n in (1, 2, 3):
            start = time.monotonic()
            status, _, out = ask(f, "POST", "/completion", b'{"prompt": "hi"}')
            assert status == 504 and "said nothing for 0.5 s" in json.loads(out)["error"]["message"]
            assert time.monotonic() - start < 5.0
            assert until(lambda n=n: len(said) >= n) and f"({n} in a row)" in said[n - 1]  # said after the 504
        assert f.recorded.wait(15)  # the third's /health, asked after its client got the 504
        status, _, out = ask(f, "GET", "/ok")
        error = json.loads(out)["error"]
        assert status == 503 and error["type"] == "server_not_answering"
        assert "said nothing for 0.5 s on 3 client requests in a row" in error["message"]
        assert "nor on /health" in error["message"]
        assert len(recorded) == 1 and f.stats.timeouts == 3
    finally:
        f.stop()


def test_a_server_busy_on_every_slot_but_answering_health_is_not_failed(dodger):
    """Completions silent past the deadline (504 each), but /health answers, as llama-server's does
    with every slot on a long generation: busy, not hung, so no 503; the canary judges the rest."""
    dodger.kind, dodger.healthy = "hang", True
    said = []
    f = _dodged_front(dodger, Clock(), said, [], request_seconds=0.5)
    try:
        statuses = [ask(f, "POST", "/completion", b'{"prompt": "hi"}')[0] for _ in range(4)]
        assert statuses == [504] * 4 and f.stats.timeouts_in_a_row == 4
        assert until(lambda: sum("taken as busy, not failed" in line for line in said) == 2), said
        assert f.failure is None
    finally:
        f.stop()


def test_an_answer_between_timeouts_starts_the_count_again(dodger):
    dodger.kind = "hang"
    f = _dodged_front(dodger, Clock(), [], [], request_seconds=0.5)
    try:
        statuses = [ask(f, "GET", path)[0] for path in ("/a", "/b", "/ok", "/c", "/d", "/ok")]
        assert statuses == [504, 504, 200, 504, 504, 200] and f.failure is None
    finally:
        f.stop()


def test_a_streamed_answer_slower_in_all_than_the_deadline_is_not_cut(upstream):
    """The deadline is silence, not length: pieces every 0.2 s for 2 s pass a 1.5 s deadline."""
    f = front_for(upstream, request_seconds=1.5)
    try:
        status, _, out = ask(f, "GET", "/sse?n=10&gap=0.2")
        assert status == 200 and out.count(b"data: ") == 10 and f.stats.timeouts == 0
    finally:
        f.stop()
