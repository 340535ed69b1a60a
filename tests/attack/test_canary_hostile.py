"""The canary against hostile servers: a Python fake on 127.0.0.1 (a fake, said so: a real
llama-server never answers like this — too big, wrong types, NaN, missing fields, a hang, a dropped
connection).  Each ends the check with one failure line naming the request, within its timeout."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from rocforge_build.serve import canary

REAL = Path(__file__).resolve().parents[1] / "data" / "canary" / "llama-server-0.3.9-completion-tokens.json"


def reference() -> canary.Reference:
    """A reference of two requests, both answered (in the real reply) by the same four positions."""
    answer = canary.parse_reply(REAL.read_bytes(), 5)
    return canary.Reference(((1, 2, 3), (4, 5, 6)), (answer, answer), ("request 1", "request 2"), 0.0)


PLAN = canary.CanaryPlan(("a", "b"), 0, 0, 4, 5, "Q4_1", 49152)
def _nan_reply() -> bytes:
    d = json.loads(REAL.read_text())
    d["completion_probabilities"][1]["top_logprobs"][0]["logprob"] = float("nan")
    return json.dumps(d).encode()  # Python writes NaN, as a broken C++ server could


def _neginf_reply() -> bytes:
    d = json.loads(REAL.read_text())
    for item in d["completion_probabilities"]:
        for e in item["top_logprobs"]:
            e["logprob"] = -1e999  # -inf: every token impossible, a backend computing garbage
    return json.dumps(d).encode().replace(b"-Infinity", b"-1e999")


def behave(kind: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if kind in ("nested", "trickle"):
                self.do_POST()
            else:
                self.send_error(501)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if kind == "trickle":  # a byte a tenth of a second, for ever: each read is quick
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    self.wfile.write(b"1\r\n \r\n")
                    self.wfile.flush()
                    time.sleep(0.1)
            if kind == "hang":
                time.sleep(30)
                return
            if kind == "drop":
                self.connection.shutdown(2)
                return
            if kind == "badstatus":  # a status line that rewrites the terminal: a title, colour, CR
                self.wfile.write(b"\x1b[31mEVIL\x1b]0;owned\x07\rrocforge: serve: all good" + b"A" * 5000 + b"\r\n\r\n")
                return
            body = {
                "huge": b'{"content": "' + b"x" * (canary.MAX_REPLY + 10) + b'"}',
                "wrong-types": json.dumps({"completion_probabilities": [{"id": "1", "top_logprobs": "no"}]}).encode(),
                "nan": _nan_reply(),
                "nested": b"[" * 100000 + b"]" * 100000,  # past Python's recursion limit
                "neginf": _neginf_reply(),
                "missing": json.dumps({"content": "hello"}).encode(),
                "status": b"{}",
                "real": REAL.read_bytes(),
            }[kind]
            self.send_response(500 if kind == "status" else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@pytest.fixture
def fake():
    servers = []

    def start(kind: str) -> canary.Target:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), behave(kind))
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return canary.Target(f"http://127.0.0.1:{srv.server_address[1]}", {}, 4096, 2)

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.mark.parametrize("kind, says", [
    ("huge", "replied with more than 8 MB"),
    ("wrong-types", "lists no tokens"),
    ("nan", "probability out of range"),
    ("neginf", "ppl_ratio inf"),
    ("missing", "no completion_probabilities"),
    ("status", "answered HTTP 500"),
    ("hang", "did not answer within 3 s"),
    ("drop", "failed: RemoteDisconnected"),
    ("nested", "not JSON"),
    ("trickle", "did not answer within 3 s"),
])
def test_each_hostile_reply_is_one_failure_line_in_bounded_time(fake, kind, says):
    start = time.monotonic()
    verdict = canary.check(PLAN, fake(kind), reference(), timeout=3)
    assert time.monotonic() - start < 6
    assert not verdict.passed and len(verdict.failures) == 2
    for line in verdict.failures:
        assert "\n" not in line and line.startswith("canary: request ") and says in line, line
    json.dumps(verdict.to_json(), allow_nan=False)  # the stored row is plain JSON


def test_a_read_cut_short_at_the_deadline_is_the_deadline_not_an_error(fake, monkeypatch):
    """At the deadline the exchange shuts the socket under the read still going; that read then
    fails (IncompleteRead) on its own thread.  Held up right after the shutdown (as a loaded
    machine's scheduler may), that failure must not become the answer: the deadline is."""
    shutdown = socket.socket.shutdown

    def slow_shutdown(self, how):
        shutdown(self, how)
        time.sleep(0.3)  # the reading thread records its IncompleteRead now

    monkeypatch.setattr(socket.socket, "shutdown", slow_shutdown)
    target = fake("trickle")
    with pytest.raises(canary.CanaryError) as exc:
        canary.exchange("POST", target.url, "/completion", b"{}", {}, 1.0)
    assert exc.value.message == f"{target.url}/completion did not answer within 1 s"


def test_the_real_reply_passes_through_the_same_fake(fake):
    verdict = canary.check(PLAN, fake("real"), reference(), timeout=5)
    assert verdict.passed and all(r.comparison.kld_mean == 0 for r in verdict.rows)


def _target_of_within(url: str, argv: list[str], timeout: float, bound: float):
    """canary.target_of run where a hang shows as a failed test, not a stuck run."""
    outcome: dict = {}

    def run():
        try:
            outcome["target"] = canary.target_of(url, argv, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever came out
            outcome["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"target_of still reading after {bound:g} s"
    assert "error" not in outcome, repr(outcome.get("error"))
    return outcome["target"], time.monotonic() - start


@pytest.mark.parametrize("kind", ["nested", "trickle"])
def test_target_of_a_hostile_props_falls_back_to_its_flags_in_bounded_time(fake, kind, monkeypatch):
    """/props nested past the recursion limit, or trickled a byte at a time for ever (each read
    quick, so a per-read timeout never fires): the flags are used, within target_of's timeout, and
    the read given up on ends without a traceback of its own."""
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    t = fake(kind)
    got, took = _target_of_within(t.url, ["llama-server", "-c", "8192", "-np", "4"], timeout=2, bound=10)
    assert (got.parallel, got.ctx_per_slot) == (4, 2048) and took < 4
    deadline = time.monotonic() + 3
    while any(th.name == "canary GET /props" for th in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(th.name == "canary GET /props" for th in threading.enumerate()), "the read given up on goes on"
    assert not escaped, [e.exc_value for e in escaped]


def test_target_of_a_server_whose_props_are_junk_falls_back_to_its_flags(fake):
    t = fake("missing")  # no GET handler: /props answers 501
    got = canary.target_of(t.url, ["llama-server", "-c", "8192", "-np", "4", "--api-key", "k"], timeout=2)
    assert (got.parallel, got.ctx_per_slot, got.headers) == (4, 2048, {"Authorization": "Bearer k"})


def test_an_unforeseen_error_in_one_row_is_that_rows_failure_line(fake, monkeypatch):
    """A comparison that raises (here made to: a stand-in for a reply shape no check foresaw) ends
    that row with one line naming the exception's type, never a traceback out of the check."""
    def broken(ref, got):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(canary, "compare", broken)
    verdict = canary.check(PLAN, fake("real"), reference(), timeout=5)
    assert not verdict.passed and len(verdict.failures) == 2
    for line in verdict.failures:
        assert line.startswith("canary: request ") and "internal error: ZeroDivisionError: float division by zero" in line


def test_a_servers_raw_text_reaches_a_failure_line_printable_and_bounded(fake):
    """http.client's BadStatusLine carries the server's status line as it came (ESC, BEL, CR):
    the failure line holds none of it raw, and is bounded however long the line was."""
    verdict = canary.check(PLAN, fake("badstatus"), reference(), timeout=3)
    assert not verdict.passed and len(verdict.failures) == 2
    for line in verdict.failures:
        assert "BadStatusLine" in line and "EVIL" in line and line.isprintable() and len(line) < 400, repr(line)


def test_labels_from_a_reference_reach_a_failure_line_printable(fake):
    """The reference's labels come from a cache file on disk, which anything can have edited."""
    ref = reference()
    ref = canary.Reference(ref.prompts, ref.answers, ("request \x1b]0;owned\x07 1", "request\u202e 2"), 0.0)
    verdict = canary.check(PLAN, fake("status"), ref, timeout=3)
    assert len(verdict.failures) == 2 and all(line.isprintable() for line in verdict.failures), verdict.failures


class StandInBuild:
    """A stand-in for the reference build (a fake, said so: a real llama-server cannot be made to
    print escapes, hold a port another program has, or start slowly on demand): its llama-server is
    the given sh script."""

    gpu = False
    runtime_env: dict = {}

    def __init__(self, tmp_path: Path, script: str):
        self.exe = tmp_path / "llama-server"
        self.exe.write_text("#!/bin/sh\n" + script + "\n")
        self.exe.chmod(0o755)

    def program(self, name: str) -> Path:
        return self.exe

    def label(self) -> str:
        return "the stand-in reference"


class Model:
    path = "/nonexistent/model.gguf"


@pytest.fixture
def cache_at(tmp_path, monkeypatch):
    """The reference's cache file, at a path of the test's own."""
    path = tmp_path / "cache" / "reference.json"
    monkeypatch.setattr(canary, "_cache_file", lambda plan_, ref, model: path)
    return path


def test_the_reference_servers_last_words_are_printable_and_bounded(tmp_path, cache_at):
    build = StandInBuild(tmp_path, r"printf '\033]0;owned\007\033[2J%0500d bad model\r\n' 0 >&2; exit 3")
    with pytest.raises(canary.CanaryError) as e:
        canary.reference(PLAN, build, Model(), timeout=10)
    assert "exited with code 3" in e.value.message and e.value.message.isprintable(), repr(e.value.message)
    assert len(e.value.message) < 300


def test_an_unreadable_cache_entry_is_a_miss(tmp_path, cache_at):
    """A cache file nested past the recursion limit (or any other junk) is recomputed: the reference's
    server is started (here one that exits at once, which says it was), never a traceback."""
    build = StandInBuild(tmp_path, "echo 'the stand-in ran' >&2; exit 3")
    for junk in (b"[" * 100000 + b"]" * 100000, b'{"prompts": 1}', b'{"prompts": [[1]], "answers": [[{"token": 1, "top": 5}]], '
                 b'"labels": ["a"], "seconds": 0}', b"\xff"):
        cache_at.parent.mkdir(parents=True, exist_ok=True)
        cache_at.write_bytes(junk)
        with pytest.raises(canary.CanaryError) as e:
            canary.reference(PLAN, build, Model(), timeout=10)
        assert "exited with code 3: the stand-in ran" in e.value.message


def test_a_cached_reference_is_read_back(tmp_path, cache_at):
    build = StandInBuild(tmp_path, "exit 3")
    cache_at.parent.mkdir(parents=True)
    cache_at.write_text(json.dumps(reference().to_json()))
    assert canary.reference(PLAN, build, Model(), timeout=10) == reference()


def test_the_reference_asks_only_its_own_server(tmp_path, cache_at, monkeypatch):
    """Another program answering /health on the reference's port (it took the port between the
    free-port probe and the start) is not the reference: no prompt goes to it, and the error says so."""
    asked: list[str] = []

    class Impostor(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_GET

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setattr(canary, "free_loopback_port", lambda: srv.server_address[1])
    try:
        with pytest.raises(canary.CanaryError) as e:
            canary.reference(PLAN, StandInBuild(tmp_path, "exec sleep 30"), Model(), timeout=3)
    finally:
        srv.shutdown()
        srv.server_close()
    assert "another program" in e.value.message and not [p for p in asked if p != "/health"], (e.value.message, asked)


def test_the_reference_server_is_stopped_with_a_child_that_daemonized(tmp_path, cache_at):
    """The reference's llama-server starts a daemon (double fork, setsid: in no group or session of
    its own parent's) and never answers: once the canary gives up, the daemon is gone too."""
    import os
    import sys

    pidfile = tmp_path / "daemon"
    code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        open({str(pidfile)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
            f"        os.rename({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\n        time.sleep(3600)\n"
            f"    os._exit(0)\nos.wait()\n")
    (tmp_path / "daemonize.py").write_text(code)
    build = StandInBuild(tmp_path, f"'{sys.executable}' '{tmp_path / 'daemonize.py'}'; exec sleep 30")
    with pytest.raises(canary.CanaryError) as e:
        canary.reference(PLAN, build, Model(), timeout=3)
    assert "did not answer /health within 3 s" in e.value.message
    daemon = int(pidfile.read_text())

    def alive() -> bool:
        try:
            with open(f"/proc/{daemon}/stat") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    try:
        assert not alive()
    finally:
        if alive():
            os.kill(daemon, 9)
