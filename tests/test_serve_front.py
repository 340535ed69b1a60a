"""serve's canary front (serve/front.py) against a real HTTP server on 127.0.0.1 made here
(`Upstream`: llama-server's part — streamed SSE answers, echoed bodies, any status — played by
http.server, since what is tested is the front's forwarding and scheduling, not llama.cpp; the real
server is in tests/e2e/test_serve_front_llama.py).  The canary is injected as a checker callable, so a
failing one is a test's choice.  Seconds in all."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import threading
import time
from argparse import ArgumentTypeError
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from fake_clock import FakeClock

from rocforge_build import argtypes, proc
from rocforge_build.proc import free_loopback_port
from rocforge_build.serve import front as serve_front


class _UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _query(self) -> dict:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if status not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status not in (204, 304) and self.command != "HEAD":
            self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _any(self):
        route = urlsplit(self.path).path
        q = self._query()
        up: Upstream = self.server.upstream
        up.seen.append((self.command, self.path, dict(self.headers)))
        if route.startswith("/status/"):
            status = int(route.rsplit("/", 1)[1])
            return self._reply(status, json.dumps({"status": status}).encode())
        if route == "/slow":
            time.sleep(float(q.get("s", "1")))
            return self._reply(200, b'{"slow": true}')
        if route == "/hold":  # answered once the test releases it
            up.release.wait(30)
            return self._reply(200, b'{"held": true}')
        if route == "/count":
            left, total = int(self.headers.get("Content-Length", "0")), 0
            while left:
                piece = self.rfile.read(min(left, 1 << 16))
                if not piece:
                    break
                left -= len(piece)
                total += len(piece)
            return self._reply(200, json.dumps({"length": total}).encode())
        if route.startswith("/sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            gap = float(q.get("gap", "0.2"))
            n = int(q.get("n", "1000000"))
            try:
                for i in range(n):
                    self._chunk(f"data: {json.dumps({'i': i, 't': time.monotonic()})}\n\n".encode())
                    if route == "/sse-die" and i == 1:
                        self.connection.shutdown(socket.SHUT_RDWR)  # the server dies mid-answer
                        self.close_connection = True
                        return
                    time.sleep(gap)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                up.client_gone.set()  # the front closed its connection: the client went away
                self.close_connection = True
            return
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else b""
        return self._reply(200, json.dumps({"method": self.command, "path": self.path, "length": len(body),
                                            "sha256": hashlib.sha256(body).hexdigest(),
                                            "headers": dict(self.headers)}).encode())

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _any


class Upstream:
    """A real HTTP/1.1 server on 127.0.0.1 playing llama-server's part (see the module)."""

    def __init__(self):
        self.seen: list = []
        self.client_gone = threading.Event()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _UpstreamHandler)
        self.server.daemon_threads = True
        self.server.upstream = self
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.close()


class Verdict:
    def __init__(self, passed: bool, failures=()):
        self.passed, self.failures, self.seconds = passed, tuple(failures), 0.01

    def to_json(self):
        return {"passed": self.passed, "failures": list(self.failures)}


def front_for(upstream, **kw) -> serve_front.Front:
    return serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", upstream.port), **kw).start()


@pytest.fixture
def front(upstream):
    f = front_for(upstream)
    yield f
    f.stop()


def ask(front, method, path, body=None, headers=None, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    c.request(method, path, body, headers or {})
    r = c.getresponse()
    return r.status, dict(r.getheaders()), r.read()


# -- forwarding ------------------------------------------------------------------------------------

def test_a_streamed_answer_passes_through_chunk_by_chunk(front):
    """Each SSE event reaches the client when llama-server sends it, not when the answer ends:
    5 events 0.3 s apart arrive ~0.3 s apart, each within 0.1 s of being sent."""
    c = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    c.request("POST", "/sse?n=5&gap=0.3", b"{}", {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    events, got = [], b""
    while True:
        piece = r.read1(65536)
        if not piece:
            break
        got += piece
        while b"\n\n" in got:
            event, got = got.split(b"\n\n", 1)
            events.append((json.loads(event.removeprefix(b"data: ")), time.monotonic()))
    assert [e["i"] for e, _ in events] == [0, 1, 2, 3, 4]
    for sent, arrived in events:
        assert arrived - sent["t"] < 0.1  # the same clock: server and front run in this process
    assert events[-1][1] - events[0][1] > 1.0


def test_bodies_methods_paths_and_headers_reach_the_server(front, upstream):
    body = bytes(range(256)) * 800  # 200 KB, every byte value
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        status, _, out = ask(front, method, "/v1/x?a=1&b=%20", body, {"Authorization": "Bearer k", "X-Y": "z"})
        d = json.loads(out)
        assert status == 200 and d["method"] == method and d["path"] == "/v1/x?a=1&b=%20"
        assert d["length"] == len(body) and d["sha256"] == hashlib.sha256(body).hexdigest()
        assert d["headers"]["Authorization"] == "Bearer k" and d["headers"]["X-Y"] == "z"
    status, headers, out = ask(front, "HEAD", "/echo")
    assert status == 200 and out == b"" and int(headers["Content-Length"]) > 0


def test_status_codes_and_error_bodies_pass_through(front):
    for code in (400, 401, 404, 500, 503):
        status, _, out = ask(front, "GET", f"/status/{code}")
        assert status == code and json.loads(out) == {"status": code}
    status, _, out = ask(front, "GET", "/status/204")
    assert status == 204 and out == b""


def test_the_client_connection_is_kept_alive(front):
    c = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    ask(front, "GET", "/echo", conn=c)
    first = c.sock
    for path in ("/sse?n=3&gap=0", "/status/404", "/echo"):
        ask(front, "POST", path, b"x", conn=c)
    assert c.sock is first  # one TCP connection for four requests, a streamed one among them


def test_an_expect_100_continue_client_is_answered(front):
    """curl sends `Expect: 100-continue` before a large body and waits for the 100."""
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"abc")
        answer = b""
        while b'"sha256"' not in answer:
            answer += s.recv(4096)
    assert hashlib.sha256(b"abc").hexdigest().encode() in answer


# -- the canary --------------------------------------------------------------------------------------

def test_a_failed_canary_makes_every_new_request_a_503_naming_the_check(upstream):
    recorded = []
    f = front_for(upstream, every=3600, record=recorded.append,
                  checker=lambda: Verdict(False, ["canary: request 1: kld_mean 0.93 (limit <= 0.05)"]))
    try:
        assert ask(f, "GET", "/echo")[0] == 200
        assert f.run_canary() == serve_front.FAILED
        for method, path in (("GET", "/health"), ("POST", "/v1/chat/completions")):
            status, headers, out = ask(f, method, path, b"{}")
            err = json.loads(out)["error"]
            assert status == 503 and err["type"] == "canary_failed"
            assert "kld_mean 0.93" in err["message"] and err["failures"] == [
                "canary: request 1: kld_mean 0.93 (limit <= 0.05)"]
        assert len(recorded) == 1 and not recorded[0].passed
        assert [m for m, *_ in upstream.seen] == ["GET"]  # nothing reached the server after the failure
    finally:
        f.stop()


def test_what_a_check_costs_is_said_and_past_one_percent_so_is_the_interval_that_keeps_it_under(upstream):
    """A check holds the server at most its own seconds once an interval: 0.5 s every 10 s is up to
    5 % of its time, over the 1 % bar, so 50 s (0.5 / 0.01) is named, once; 0.05 s every 10 s is
    0.5 %, said with the first pass only."""

    def verdict(seconds: float) -> Verdict:
        v = Verdict(True)
        v.seconds = seconds
        return v

    said: list[str] = []
    f = front_for(upstream, every=10, checker=lambda: verdict(0.5), say=said.append)
    try:
        assert f.run_canary() == serve_front.PASSED and f.run_canary() == serve_front.PASSED
    finally:
        f.stop()
    assert sorted(said) == [
        "canary: a check took 0.50 s: every 10 s that is up to 5 % of the server's time, more than 1 %; "
        "--canary-every 50s or more keeps it under",
        "canary: the first check while serving passed in 0.50 s (at most 5 % of the server's time every 10 s)"]
    assert (f.stats.canary_seconds, f.stats.most_share) == (1.0, 0.05)
    said.clear()
    f = front_for(upstream, every=10, checker=lambda: verdict(0.05), say=said.append)
    try:
        assert f.run_canary() == serve_front.PASSED and f.run_canary() == serve_front.PASSED
    finally:
        f.stop()
    assert said == ["canary: the first check while serving passed in 0.05 s (at most 0.5 % of the server's time every 10 s)"]


def test_a_canary_that_could_not_run_never_blocks_clients(upstream):
    """A checker that raises (canary.CanaryError: a timeout, a refused connection) measured nothing:
    clients are still answered, it is said each time with its count, recorded once per streak, and
    tried again `NOT_RUN_RETRY_SECONDS` later (or sooner at a short `every`)."""
    from rocforge_build.serve.canary import CanaryError

    said, recorded, failed = [], [], []

    def broken():
        raise CanaryError("http://127.0.0.1:1/completion did not answer within 120 s")

    clock = Clock()
    f = front_for(upstream, every=3600, checker=broken, say=said.append, record=failed.append,
                  record_not_run=recorded.append, clock=clock)
    try:
        assert f.run_canary() == serve_front.NOT_RUN and f.run_canary() == serve_front.NOT_RUN
        status, _, _ = ask(f, "GET", "/x")
        assert status == 200 and f.failure is None and failed == []
        assert len(recorded) == 1 and "did not answer within 120 s" in recorded[0].failures[0]
        assert ["1 in a row" in said[0], "2 in a row" in said[1]] == [True, True]
        assert "clients are still served" in said[1]
        assert f._due - clock.now == 30.0  # retried in 30 s, not an hour later
    finally:
        f.stop()


# A canary.check against a real HTTP server playing llama-server's /completion: the reference says
# token 5 at p=0.99 four times; `right` answers that, `wrong` answers token 6 (a clear parting).
def _probs(token: int) -> bytes:
    other = 11 - token
    return json.dumps({"completion_probabilities": [
        {"id": token, "top_logprobs": [{"id": token, "logprob": -0.01}, {"id": other, "logprob": -5.0}]}] * 4}).encode()


class _OneSlot(BaseHTTPRequestHandler):
    """llama-server with -np 1: one /completion at a time; `X-Hold: 1` holds the slot until the test
    sets `release`."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.slot:
            if self.headers.get("X-Hold"):  # a long generation, until the test releases it
                self.server.holding.set()
                self.server.release.wait(30)
            body = _probs(self.server.token)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST


@pytest.fixture
def one_slot():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OneSlot)
    server.daemon_threads, server.slot, server.token = True, threading.Lock(), 5
    server.holding, server.release = threading.Event(), threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _real_checker(port: int, timeout: float):
    from rocforge_build.serve import canary

    plan = canary.CanaryPlan(("x",), 0, 0, 4, 10, None, None)
    ref = canary.Reference(((1, 2, 3),), ((canary.Position(5, {5: -0.01, 6: -5.0}),) * 4,), ("request 1",), 0.0)
    target = canary.Target(f"http://127.0.0.1:{port}", {}, 4096, 1)
    return lambda: canary.check(plan, target, ref, timeout=timeout)


def test_a_long_request_holding_the_only_slot_never_makes_the_front_refuse(one_slot):
    """A client's long generation holds the one slot; the canary, overdue, runs beside it and
    cannot get an answer within its 0.4 s: not run, never a 503; once the slot is free it is
    retried (`NOT_RUN_RETRY_SECONDS` later on the front's clock) and passes."""
    clock = Clock()
    port = one_slot.server_address[1]
    f = serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", port), every=60.0, clock=clock,
                          checker=_real_checker(port, 0.4)).start()
    try:
        answers = []
        held = threading.Thread(target=lambda: answers.append(ask(f, "POST", "/completion", b"{}", {"X-Hold": "1"})),
                                daemon=True)
        held.start()
        assert one_slot.holding.wait(15) and f._in_flight == 1
        clock.advance(120.0)  # overdue: it runs beside the long request
        assert until(lambda: f.stats.not_run == 1) and f.stats.overdue_runs == 1 and f.failure is None
        one_slot.release.set()
        held.join(15)
        assert answers[0][0] == 200 and ask(f, "GET", "/health")[0] == 200 and f.failure is None
        assert f._due - clock.now == serve_front.NOT_RUN_RETRY_SECONDS
        clock.advance(serve_front.NOT_RUN_RETRY_SECONDS)
        assert until(lambda: f.stats.passed == 1)
        assert f.stats.not_run_in_a_row == 0 and f.failure is None
    finally:
        f.stop()


def test_a_wrong_answer_still_latches_the_503(one_slot):
    """The same server answering token 6 where the reference clearly says 5: compared and wrong."""
    one_slot.token = 6
    f = serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", one_slot.server_address[1]), every=3600,
                          checker=_real_checker(one_slot.server_address[1], 5.0)).start()
    try:
        assert f.run_canary() == serve_front.FAILED
        status, _, out = ask(f, "GET", "/health")
        assert status == 503 and "parted from the reference" in json.loads(out)["error"]["message"]
    finally:
        f.stop()


def test_what_the_front_says_reaches_the_terminal_escaped(upstream, capfd):
    """A server's status line carrying ESC, BEL and CR (it could paint a fake "all good" line over
    the warning) is quoted in the canary's line: every control is written as its escape."""
    from rocforge_build.serve.canary import CanaryError

    def hostile():
        raise CanaryError("http://127.0.0.1:1/completion failed: BadStatusLine: "
                          "'\x1b[31mEVIL\x1b]0;owned\x07\rrocforge: serve: all good'")

    f = front_for(upstream, every=3600, checker=hostile, say=serve_front.say_to_stderr)
    try:
        f.run_canary()
    finally:
        f.stop()
    err = capfd.readouterr().err
    assert not any(c in err for c in "\x1b\x07\r") and "\\x1b[31mEVIL" in err
    assert len(err.splitlines()) == 1 and "\\rrocforge: serve: all good" in err


def test_the_inner_server_is_asked_for_its_props_only_once_it_answered(monkeypatch):
    """serve_front.run reads /props (canary.target_of) after serve.run saw its own llama-server
    answer /health and warm up, never before it started (the port could be anyone's then); it
    takes the build, the model and the reference from the session and opens none of them."""
    from types import SimpleNamespace

    from rocforge_build.measure import gguf, verify_reference
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.serve import canary
    from rocforge_build.serve import server as serve

    def opened(*a, **k):
        raise AssertionError("the front opened what the session holds")

    events = []
    monkeypatch.setattr(LlamaBuild, "open", staticmethod(opened))
    monkeypatch.setattr(gguf, "check", opened)
    monkeypatch.setattr(verify_reference, "independent_reference", opened)
    monkeypatch.setattr(canary, "reference", lambda *a, **k: events.append("reference") or "answers")
    monkeypatch.setattr(canary, "target_of", lambda url, argv: events.append("target_of") or canary.Target(url, {}, 1, 1))

    def fake_run(inner, *, wait_s, on_ready, before_ready):
        events.append("inner up")
        on_ready(0.1)
        return 0

    monkeypatch.setattr(serve, "run", fake_run)
    port = free_loopback_port()
    p = serve.Plan("long", "auto", {}, ["/b/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port",
                                         str(port)], f"http://127.0.0.1:{port}", [], "127.0.0.1", port)
    session = SimpleNamespace(build=SimpleNamespace(prefix="/b"), reference=SimpleNamespace(prefix="/r"),
                              model=SimpleNamespace(path="/m.gguf", sha256="0" * 64, file_type=None, n_vocab=None,
                                                    n_ctx_train=None), store=None, host={})
    fronts = []
    monkeypatch.setattr(serve_front.Front, "start", lambda self: fronts.append(self) or self)
    code = serve_front.run(session, p, every=3600, wait_s=1, on_ready=lambda s: None, argv=[])
    assert code == 0 and events == ["reference", "inner up", "target_of"]
    assert fronts[0].request_seconds == 1  # clients' deadline: --wait unless --request-timeout says
    serve_front.run(session, p, every=3600, wait_s=1, on_ready=lambda s: None, argv=[], request_s=42.0)
    assert fronts[1].request_seconds == 42.0


def test_request_timeout_without_the_front_is_one_line(capsys):
    """--request-timeout bounds requests through the front; without --canary-every there is none."""
    from rocforge_build import cli

    assert cli.main(["serve", "m", "--request-timeout", "30"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(lines) == 1 and "--request-timeout" in lines[0] and "--canary-every" in err, err


Clock = FakeClock  # the front's clock, moved by the test (tests/fake_clock.py)


def until(condition, seconds: float = 15.0) -> bool:
    """Whether `condition()` came true within `seconds` (looked at every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_canary_waits_for_the_request_in_flight(upstream):
    """Due (not yet overdue) while a request is in flight: it runs once that request ends, with
    nothing in flight, and not again before another interval.  The front's clock is the test's:
    no timing window (`settled`: the schedule looked at the new time and went back to waiting)."""
    calls, clock = [], Clock()
    f = serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", upstream.port), every=60.0, clock=clock,
                          checker=lambda: calls.append(f._in_flight) or Verdict(True)).start()
    try:
        held = threading.Thread(target=ask, args=(f, "GET", "/hold"), daemon=True)
        held.start()
        assert until(lambda: f._in_flight == 1)
        clock.advance(90.0)  # due 30 s ago, overdue only at 120 s
        assert clock.settled() and calls == []
        upstream.release.set()
        held.join(15)
        assert until(lambda: f.stats.passed == 1) and calls == [0] and f.stats.overdue_runs == 0
        clock.advance(59.0)
        assert clock.settled() and calls == [0]  # 59 s after it: not yet
        clock.advance(1.0)
        assert until(lambda: f.stats.passed == 2) and len(calls) == 2
    finally:
        f.stop()


def test_a_benchmark_can_place_the_canary_by_its_last_run(upstream):
    """benchmarks/bench_canary.py sets `_last_canary` back so the canary falls inside its window:
    the schedule takes the new time at once."""
    calls, clock = [], Clock()
    f = front_for(upstream, every=60.0, clock=clock, checker=lambda: calls.append(1) or Verdict(True))
    try:
        assert clock.settled() and calls == []
        f._last_canary = clock.now - 59.5  # due in 0.5 s
        clock.advance(0.5)
        assert until(lambda: calls == [1])
    finally:
        f.stop()


def test_a_never_idle_server_gets_the_canary_once_overdue(upstream):
    """A request always in flight: due at 60 s, the canary waits; once it is an interval overdue
    (120 s) it runs beside the traffic, not never."""
    calls, clock = [], Clock()
    f = front_for(upstream, every=60.0, clock=clock, checker=lambda: calls.append(f._in_flight) or Verdict(True))
    try:
        held = threading.Thread(target=ask, args=(f, "GET", "/hold"), daemon=True)
        held.start()
        assert until(lambda: f._in_flight == 1)
        clock.advance(60.0)
        assert clock.settled() and calls == []  # due, but a request is in flight
        clock.advance(60.0)
        assert until(lambda: f.stats.passed == 1) and calls == [1] and f.stats.overdue_runs == 1
        upstream.release.set()
        held.join(15)
    finally:
        f.stop()


def test_the_default_clock_runs_the_canary_on_its_own_schedule(upstream):
    """serve's own clock (MonotonicClock: real seconds, the schedule waiting on its condition until
    the canary is due, not looking every second): with nothing in flight, a canary every 0.2 s runs
    again and again by itself."""
    calls = []
    f = front_for(upstream, every=0.2, checker=lambda: calls.append(1) or Verdict(True))
    try:
        assert isinstance(f.clock, serve_front.MonotonicClock)
        assert until(lambda: f.stats.passed >= 3) and f.stats.overdue_runs == 0
    finally:
        f.stop()


def test_behind_moves_the_server_to_a_private_loopback_port():
    from rocforge_build.serve import server as serve

    p = serve.Plan("long", "auto", {}, ["/b/llama-server", "-m", "/m.gguf", "-c", "8192", "-np", "4", "--host",
                                         "0.0.0.0", "--port", "8080"], "http://127.0.0.1:8080", [], "0.0.0.0", 8080)
    inner = serve_front.behind(p, 41234)
    assert inner.argv[-4:] == ["--host", "127.0.0.1", "--port", "41234"] and inner.url == "http://127.0.0.1:41234"
    assert p.argv[-1] == "8080"  # the user's plan is left as it was



def test_behind_never_gives_llama_server_the_fronts_own_port(monkeypatch):
    """The front binds the plan's port only once llama-server is warm, so until then that port is
    free and the kernel may hand it out as the private one (two bind(0) draws here were equal about
    once in 22,000); then the front could not listen.  The kernel's first draw is the front's port."""
    from types import SimpleNamespace

    from rocforge_build.serve import server as serve

    draws = iter([8080, 41235])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, addr):
            self.port = next(draws)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(proc, "socket", SimpleNamespace(socket=Socket))  # the one free-port helper
    p = serve.Plan("long", "auto", {}, ["/b/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port",
                                         "8080"], "http://127.0.0.1:8080", [], "127.0.0.1", 8080)
    assert serve_front.behind(p).port == 41235

# -- --canary-every's type -------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("30s", 30), ("5m", 300), ("1h", 3600), ("90", 90), ("1.5m", 90)])
def test_canary_every_takes_durations(text, seconds):
    assert argtypes.canary_every(text) == seconds


@pytest.mark.parametrize("text", ["4s", "0", "-5s", "abc", "5 minutes", "1e3", "nan", "inf", "9999999h", "5d"])
def test_canary_every_refuses_other_text_in_one_line(text):
    with pytest.raises(ArgumentTypeError) as e:
        argtypes.canary_every(text)
    assert "\n" not in str(e.value) and ("duration" in str(e.value) or "range" in str(e.value))


@pytest.mark.parametrize("text", ["9" * 100_000, "x\x1b[2J" * 20_000])
def test_canary_every_quotes_a_huge_value_cut_to_one_short_line(text):
    with pytest.raises(ArgumentTypeError) as e:
        argtypes.canary_every(text)
    assert len(str(e.value)) < 200 and "\x1b" not in str(e.value)
