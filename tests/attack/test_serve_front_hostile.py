"""Hostile clients and a dying server against serve's canary front (measure/serve_front.py): a
slowloris head, huge headers and bodies, too many connections, a client gone mid-stream, a
llama-server that is not there or dies mid-answer.  Each ends in one status line or a closed
connection within its bound, no traceback, the front still serving the next request, and memory
bounded.  The upstream is tests/test_measure_serve_front.py's real HTTP server on 127.0.0.1 (the one
fake here: a real llama-server cannot be told to die mid-answer on cue).  Seconds in all."""

from __future__ import annotations

import http.client
import json
import socket
import time
import tracemalloc

import pytest
from test_measure_serve_front import Upstream, ask, front_for

from rocforge_build.measure import serve_front


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
    monkeypatch.setattr(serve_front, "HEAD_SECONDS", 1.0)
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
    monkeypatch.setattr(serve_front, "HEAD_SECONDS", 1.0)
    monkeypatch.setattr(serve_front, "IDLE_SECONDS", 2.0)
    out, took = _drip(front, [], 0.4, 8.0)
    assert out.startswith(b"HTTP/1.1 408 ") and 0.9 <= took < 2.0
    still_serving(front)


def test_blank_lines_after_an_answer_do_not_extend_the_idle_bound(front, monkeypatch):
    """After a whole request, blank lines again: the head deadline (1 s) bounds them too."""
    monkeypatch.setattr(serve_front, "HEAD_SECONDS", 1.0)
    monkeypatch.setattr(serve_front, "IDLE_SECONDS", 2.0)
    out, took = _drip(front, [b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"], 0.4, 8.0)
    assert out.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in out and took < 2.5


def test_blank_lines_before_a_request_in_time_are_ignored(front, monkeypatch):
    monkeypatch.setattr(serve_front, "HEAD_SECONDS", 1.0)
    out = raw(front, b"\r\n\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ")


def test_an_idle_keep_alive_connection_is_closed_quietly(front, monkeypatch):
    monkeypatch.setattr(serve_front, "IDLE_SECONDS", 0.5)
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
    monkeypatch.setattr(serve_front, "IO_SECONDS", 0.5)
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
