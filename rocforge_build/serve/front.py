"""`rocforge serve --canary-every DURATION`: a thin front on the user's --host/--port forwards every
request to llama-server on a private loopback port, and between requests runs the short numerics
canary (serve/canary.py, `plan(short=True)`) against that private port, so that a server that
goes wrong while serving stops being trusted.

Why a front and not a timer beside the server: only a front knows when no request is in flight (the
canary then costs no client any latency) and can stop new requests without killing anything.
Its HTTP side (reading heads, forwarding, copying answers back) is serve/front_http.py.

On a failed canary the front answers every new request (any path, /health too) with HTTP 503 and a
JSON body naming the failed check, instead of stopping the server: the process stays up for
inspection (its log, its /slots, a debugger), a load balancer's health check takes it out of
rotation, and each client is told why rather than seeing a refused connection it might retry on the
same host.  Requests already in flight finish.  The failure is written to the results store with
the host fingerprint (`store_recorder`).

Design: one thread per client connection (socketserver.ThreadingTCPServer) with blocking sockets,
not asyncio: the stdlib's http.client reads llama-server's chunked SSE replies chunk by chunk
(`read1`), and each chunk is written to the client the moment it is read — a copy between two
sockets in one thread, no queue, no event loop hop per token; the number of connections is small
(llama-server's slots) and bounded here (`MAX_CONNECTIONS`).  Each request opens a fresh loopback
connection to llama-server (tens of microseconds): llama-server (cpp-httplib) closes idle
keep-alive connections after 5 s, and a reused one that it closed would cost a request.  The
client's connection is kept alive.  The request head is read here, bounded in size and in time by
deadlines that bytes do not move: a kept-alive connection may wait `IDLE_SECONDS` for its next
request's first byte, and from that byte on (a blank line counts: RFC 9112 2.2 lets a client send
them, a slowloris sends nothing else) the whole head must arrive within `HEAD_SECONDS`, so a client
holds a thread for at most IDLE_SECONDS + HEAD_SECONDS between requests.  There is no cap per client
address: behind a load balancer or a reverse proxy every client has the proxy's address, and a cap
there would refuse real traffic; `MAX_CONNECTIONS` bounds the threads, the deadlines how long each
is held.  The body is streamed, never held.

What latches the 503: only a canary that compared the server's answers with the reference's and
found them wrong (a failing comparison in canary.Verdict's rows).  A canary that could not measure
(a CanaryError or any exception from the checker, or a verdict whose failing rows have no answer to
compare: a timeout because every slot is busy with a long generation, a refused connection) is "not
run": clients are served, the canary is retried at the next chance (`NOT_RUN_RETRY_SECONDS` later,
or `every` when that is shorter, still only when no request is in flight unless overdue), and each
one says a warning line naming why and how many in a row — a busy server is allowed to be busy,
and one client's long request must not take the server from everyone.  The first of each such
streak is one `canary` row with status `not_run` in the results store (`record` with status
"not_run"): a row per retry would bury the rows that matter.  But a check that cannot run is not
a pass: a server answering only canary-shaped requests with NaN or junk, or never answering them,
would dodge it for ever.  Once it has not run `NOT_RUN_LIMIT` times in a row over at least
`NOT_RUN_SECONDS` (retries come every 30 s at most, so about five minutes), it counts as failed:
503, said in one line and recorded as a failure.

Client requests have a deadline too: llama-server silent for `request_seconds` (`serve
--request-timeout`, default `--wait`: the longest a fresh GPU's first answer is expected to take)
on a request — before its answer's head, or between two of its pieces — gets the client HTTP 504
(or its answer cut), and `TIMEOUT_LIMIT` such requests in a row with no answer between fail the
server (503 naming why) unless it still answers /health (busy, not hung: llama-server answers it
with every slot taken): a server that hangs every request would otherwise hold every client for
ever and never be marked failed.  A long generation that streams is never cut; a non-streamed one
must end within the deadline.

When the canary runs: once at least `every` seconds passed since the last one, as soon as no
request is in flight.  A server that is never idle gets it anyway once it is `every` seconds
overdue (two intervals since the last one), alongside the traffic: a busy server is where a wrong
answer costs most, and the short canary is one request of a few tokens on one slot."""

from __future__ import annotations

import contextlib
import json
import math
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from rocforge_build import proc
from rocforge_build.errors import RocforgeError
from rocforge_build.serve.front_http import server_for

REQUEST_SECONDS = 600.0  # llama-server silent this long on a client's request: 504 (serve --request-timeout, default --wait)
TIMEOUT_LIMIT = 3  # client requests in a row that llama-server left silent that long, and /health too: failed (503)
HEALTH_SECONDS = 5.0  # the /health llama-server answers even with every slot busy, asked then
MAX_CONNECTIONS = 256  # client connections at once; past it, 503 and close (each holds a thread)
NOT_RUN_RETRY_SECONDS = 30.0  # a canary that could not run is tried again this soon (or at `every`)
NOT_RUN_LIMIT = 3  # canaries in a row that could not run, ...
NOT_RUN_SECONDS = 300.0  # ... over at least this long: the check counts as failed (503)
COST_BAR = 0.01  # the share of the server's time the canary may take: a check's seconds over `every`
PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"


class Clock(Protocol):
    """What the front counts the canary's schedule in: monotonic seconds, and a wait for them."""

    def __call__(self) -> float: ...

    def wait(self, condition: threading.Condition, seconds: float) -> None:
        """Wait on `condition` (held by the caller) until notified or `seconds` pass on this clock."""


class MonotonicClock:
    """The front's clock: time.monotonic, waited in real seconds."""

    def __call__(self) -> float:
        return time.monotonic()

    def wait(self, condition: threading.Condition, seconds: float) -> None:
        condition.wait(seconds)


@dataclass(frozen=True)
class Failure:
    """Why the front stopped taking requests, as it tells clients: when, what failed (one line
    each), and the kind: a canary that compared wrong answers, a canary that could not run past
    its bound, or a llama-server that left client requests unanswered past theirs."""

    at: str  # UTC, ISO 8601
    failures: tuple[str, ...]
    seconds: float
    kind: str = "canary_failed"  # or "canary_not_run", "server_not_answering"

    def body(self) -> bytes:
        first = self.failures[0] if self.failures else "canary failed"
        what = {"canary_failed": "the numerics canary failed", "canary_not_run": "the numerics canary could not run",
                "server_not_answering": "llama-server stopped answering"}[self.kind]
        return json.dumps({"error": {
            "code": 503, "type": self.kind,
            "message": f"rocforge serve stopped taking requests: {what} at {self.at}: {first}",
            "failures": list(self.failures)}}).encode()


@dataclass
class Stats:
    """What the front did: canaries run and passed, requests forwarded."""

    canaries: int = 0
    passed: int = 0
    forwarded: int = 0
    overdue_runs: int = 0  # canaries run beside traffic because the server was never idle
    not_run: int = 0  # canaries that could not measure (timeout, busy slots, refused): clients still served
    not_run_in_a_row: int = 0
    timeouts: int = 0  # client requests llama-server left silent for the front's request deadline (504)
    timeouts_in_a_row: int = 0
    canary_seconds: float = 0.0  # the measured checks' time, in all
    most_share: float = 0.0  # the largest share of the server's time one check took: its seconds over `every`


class Front:
    """The front: `start()` listens on `listen` (host, port) and forwards to `upstream`; with
    `every` seconds and a `checker` (returns an object with .passed, .failures, .seconds,
    .to_json(): canary.Verdict), the canary runs between requests; `record(verdict)` is called once
    on the first failure.  `request_seconds`: how long llama-server may say nothing on a client's
    request before the client gets 504 (TIMEOUT_LIMIT such in a row fail the server).  `clock`:
    the monotonic seconds the canary's schedule and bounds are counted in, and how the schedule
    waits for them (`MonotonicClock`; a test's own clock moves by its steps: tests/fake_clock.py)."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], *, every: float | None = None,
                 checker: Callable[[], object] | None = None, record: Callable[[object], None] | None = None,
                 say: Callable[[str], None] | None = None, request_seconds: float = REQUEST_SECONDS,
                 record_not_run: Callable[[object], None] | None = None,
                 clock: Clock | Callable[[], float] | None = None):
        self.listen = listen
        self.upstream = upstream
        self.every = every
        self.checker = checker
        self.record = record
        self.record_not_run = record_not_run
        self.say = say or (lambda text: None)
        self.request_seconds = request_seconds
        self.clock = clock = clock or MonotonicClock()
        self.stats = Stats()
        self.failure: Failure | None = None
        self.recorded = threading.Event()  # set once a failure was recorded (or could not be)
        self._idle = threading.Condition()
        self._in_flight = 0
        self._due = clock()  # when the next canary is due (`every` after a measured one)
        self._unchecked_since: float | None = None  # when the running streak of not-run canaries began
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._server: socketserver.ThreadingTCPServer | None = None

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> Front:
        self._server = server_for(self)
        self._due = self.clock() + (self.every or 0.0)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                         name="serve front", daemon=True).start()
        if self.every and self.checker:
            threading.Thread(target=self._canary_loop, name="serve canary", daemon=True).start()
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else self.listen[1]

    def stop(self) -> None:
        self._stop.set()
        with self._idle:
            self._idle.notify_all()
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def _last_canary(self) -> float:
        """When the canary's interval last began (`_due` minus `every`): benchmarks/bench_canary.py
        sets it to place the canary inside a measured window."""
        return self._due - (self.every or 0.0)

    @_last_canary.setter
    def _last_canary(self, at: float) -> None:
        with self._idle:
            self._due = at + (self.every or 0.0)
            self._idle.notify_all()  # the schedule looks at the new time now

    def _wait(self, seconds: float) -> None:
        """The schedule's wait (the `_idle` condition held): until a request ends, the front stops,
        or `seconds` pass on its clock.  A clock that is only a function (no `wait`) is looked at
        again within a second of real time."""
        wait = getattr(self.clock, "wait", None)
        if wait is not None:
            wait(self._idle, seconds)
        else:
            self._idle.wait(min(seconds, 1.0))

    # -- the canary -------------------------------------------------------------------------------
    def _canary_loop(self) -> None:
        while not self._stop.is_set() and self.failure is None:
            with self._idle:
                while not self._stop.is_set():
                    now = self.clock()
                    due = self._due
                    overdue = due + self.every
                    if now >= due and (self._in_flight == 0 or now >= overdue):
                        break
                    self._wait(max((due if now < due else overdue) - now, 0.01))
                if self._stop.is_set():
                    return
                beside_traffic = self._in_flight > 0
            self.run_canary(beside_traffic=beside_traffic)

    def run_canary(self, *, beside_traffic: bool = False) -> str:
        """One canary now: PASSED, FAILED (the answers were compared and are wrong: every new
        request gets 503 from now on) or NOT_RUN (nothing could be compared: clients are still
        served and it is retried soon)."""
        try:
            verdict = self.checker()
            passed, failures, seconds = bool(verdict.passed), tuple(verdict.failures), float(verdict.seconds)
            measured = passed or _compared_wrong(verdict)
        except RocforgeError as exc:
            verdict = _Raised(f"canary: could not run: {exc.message}")
            passed, failures, seconds, measured = False, verdict.failures, 0.0, False
        except Exception as exc:  # noqa: BLE001 - a broken checker is one line, never a dead canary thread
            verdict = _Raised(f"canary: could not run: {type(exc).__name__}: {exc}"[:300])
            passed, failures, seconds, measured = False, verdict.failures, 0.0, False
        self.stats.canaries += 1
        self.stats.overdue_runs += beside_traffic
        if not measured:
            return self._not_run(verdict, failures)
        self._due = self.clock() + (self.every or 0.0)
        self.stats.not_run_in_a_row = 0
        self._unchecked_since = None
        self._count_cost(seconds)
        if passed:
            self.stats.passed += 1
            if self.stats.passed == 1:  # one line, not one a minute: that it runs, and what it costs
                self.say(f"canary: the first check while serving passed in {seconds:.2f} s"
                         + (f" (at most {_percent(seconds / self.every)} of the server's time every {self.every:g} s)"
                            if self.every else ""))
            return PASSED
        self._fail(Failure(_utc_now(), failures or ("canary failed",), seconds),
                   f"canary FAILED after {self.stats.passed} passed", verdict)
        return FAILED

    def _fail(self, failure: Failure, headline: str, verdict) -> None:
        """Latch the 503 (the first failure stays the one clients are told), say it in one line and
        record it."""
        with self._idle:
            if self.failure is not None:
                return
            self.failure = failure
        self.say(f"{headline}: {failure.failures[0]}; new requests get HTTP 503 (the server is kept for "
                 "inspection; Ctrl-C stops it)")
        self._record(self.record, verdict)
        self.recorded.set()

    def _count_cost(self, seconds: float) -> None:
        """A check holds the server at most its own seconds once every `every`: that share of its
        time bounds what the canary takes of throughput (less when it runs between requests).  Said
        once when a check takes more than COST_BAR, with the interval that keeps it under."""
        self.stats.canary_seconds += seconds
        if not self.every or seconds <= 0:
            return
        share = seconds / self.every
        over_before = self.stats.most_share > COST_BAR
        self.stats.most_share = max(self.stats.most_share, share)
        if share > COST_BAR and not over_before:
            self.say(f"canary: a check took {seconds:.2f} s: every {self.every:g} s that is up to {_percent(share)} of "
                     f"the server's time, more than {_percent(COST_BAR)}; --canary-every "
                     f"{math.ceil(seconds / COST_BAR)}s or more keeps it under")

    def _not_run(self, verdict, failures: tuple[str, ...]) -> str:
        """A canary that measured nothing: retried soon, clients still served, until it has not
        run NOT_RUN_LIMIT times in a row over NOT_RUN_SECONDS; then it is a failed check.  A
        server that answers only the canary with NaN or junk, or never answers it, would
        otherwise dodge it for ever; the bound in time spares a server briefly too busy for it."""
        now = self.clock()
        retry = min(self.every or NOT_RUN_RETRY_SECONDS, NOT_RUN_RETRY_SECONDS)
        self._due = now + retry
        self.stats.not_run += 1
        self.stats.not_run_in_a_row += 1
        if self._unchecked_since is None:
            self._unchecked_since = now
        why = failures[0] if failures else "canary: no answer could be compared"
        unchecked = now - self._unchecked_since
        if self.stats.not_run_in_a_row >= NOT_RUN_LIMIT and unchecked >= NOT_RUN_SECONDS:
            self._fail(Failure(_utc_now(), (f"{why} ({self.stats.not_run_in_a_row} checks in a row could not run "
                                            f"over {unchecked:.0f} s: a check that cannot run counts as failed past "
                                            f"{NOT_RUN_LIMIT} in a row and {NOT_RUN_SECONDS:g} s)",), 0.0,
                               kind="canary_not_run"),
                       "canary could not run, counted as FAILED", verdict)
            return FAILED
        self.say(f"canary not run ({self.stats.not_run_in_a_row} in a row): {why}; clients are still served, "
                 f"it is tried again in {retry:g} s")
        if self.stats.not_run_in_a_row == 1:
            self._record(self.record_not_run, verdict)
        return NOT_RUN

    def _record(self, record, verdict) -> None:
        if not record:
            return
        try:
            record(verdict)
        except RocforgeError as exc:
            self.say(f"the canary's result could not be recorded in the results store: {exc.message}")
        except Exception as exc:  # noqa: BLE001 - a record's bug is one line, not a dead thread
            self.say(f"the canary's result could not be recorded in the results store: "
                     f"{type(exc).__name__}: {exc}"[:300])

    def _begin(self) -> None:
        with self._idle:
            self._in_flight += 1
            self.stats.forwarded += 1

    def _end(self) -> None:
        with self._idle:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def _answers_health(self) -> bool:
        from rocforge_build.serve.canary import CanaryError, exchange

        try:
            status, _ = exchange("GET", f"http://{self.upstream[0]}:{self.upstream[1]}", "/health", None, {},
                                 HEALTH_SECONDS)
        except CanaryError:
            return False
        return status == 200

    def _answered(self) -> None:
        with self._idle:
            self.stats.timeouts_in_a_row = 0

    def _timed_out(self) -> int:
        """Count a client's request llama-server left silent for `request_seconds` (before the
        client is told, so an answer it asks for next counts after it); returns how many in a row."""
        with self._idle:
            self.stats.timeouts += 1
            self.stats.timeouts_in_a_row += 1
            return self.stats.timeouts_in_a_row

    def _judge_timeouts(self, n: int, target: str) -> None:
        """TIMEOUT_LIMIT silent requests in a row (no answer between) and the server is failed,
        since a server that hangs every request would otherwise keep taking clients, each told only
        504 — unless it still answers /health within HEALTH_SECONDS (llama-server does with every
        slot busy on long generations): then it is busy, not hung, and what its completions say is
        the canary's to judge."""
        self.say(f"llama-server said nothing for {self.request_seconds:g} s on a client's request ({n} in a row): "
                 f"the client got HTTP 504 (serve --request-timeout sets the bound)")
        if n >= TIMEOUT_LIMIT and self._answers_health():
            self.say(f"llama-server still answers /health: taken as busy, not failed ({n} requests in a row "
                     f"got 504)")
        elif n >= TIMEOUT_LIMIT:
            line = (f"llama-server said nothing for {self.request_seconds:g} s on {n} client requests in a row "
                    f"(the last: {target[:200]}), nor on /health within {HEALTH_SECONDS:g} s")
            self._fail(Failure(_utc_now(), (line,), 0.0, kind="server_not_answering"),
                       "llama-server stopped answering", _Raised(line))


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _percent(share: float) -> str:
    return f"{share * 100:.2g} %" if share < 0.1 else f"{share * 100:.0f} %"


def _compared_wrong(verdict) -> bool:
    """Whether a failing verdict compared an answer and found it wrong: a canary.Verdict row with
    a comparison of at least one position (or a clear parting) that failed.  Rows with no answer
    (timeout, refused, a reply that is not one) measured nothing.  A verdict without rows (a
    checker of another kind) is taken at its word."""
    rows = getattr(verdict, "rows", None)
    if rows is None:
        return True
    for row in rows:
        c = getattr(row, "comparison", None)
        if getattr(row, "failed", None) and c is not None and (c.compared > 0 or c.clear_parting):
            return True
    return False


@dataclass(frozen=True)
class _Raised:
    """The verdict of a checker that raised."""

    line: str

    @property
    def failures(self) -> tuple[str, ...]:
        return (self.line,)

    passed = False
    seconds = 0.0

    def to_json(self) -> dict:
        return {"passed": False, "failures": [self.line], "rows": [], "seconds": 0.0}


# -------------------------------------------------------------------------------- wiring into serve

def behind(p, private_port: int | None = None):
    """The serve plan of the llama-server behind the front: the same command with --host
    127.0.0.1 and a free private --port; the front takes the plan's own address."""
    argv = list(p.argv)
    port = private_port or proc.free_loopback_port(avoid=frozenset({p.port}))
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    return replace(p, argv=argv, url=f"http://127.0.0.1:{port}", host="127.0.0.1", port=port)


def short_reference(model, ref, *, progress=None):
    """(plan, the reference's answers) of the short canary (canary.reference, cached on disk):
    the short plan is one text of a few tokens whatever the server's slots, so it is made before
    the server under test runs."""
    from rocforge_build.serve import canary

    plan_ = canary.plan(model, canary.Target("", {}, 0, 1), short=True)
    return plan_, canary.reference(plan_, ref, model, progress=progress)


def short_checker(model, ref, target, *, timeout: float = 120.0, progress=None) -> Callable[[], object]:
    """The short canary against `target` as a no-argument callable: its plan and the reference's
    answers are made once, here."""
    from rocforge_build.serve import canary

    plan_, answers = short_reference(model, ref, progress=progress)
    return lambda: canary.check(plan_, target, answers, timeout=timeout)


_STORE_LOCK = threading.Lock()  # a store shared by the front's threads: one record at a time


def store_recorder(base: dict, build, argv: list[str], url: str, every: float, stats: Callable[[], Stats],
                   status: str = "failed", *, store=None, host: dict | None = None):
    """`record` for a Front: the verdict as one `canary` row (`while_serving` set, `status`: failed,
    or not_run for a canary that could not measure) of its own run, with the host fingerprint, the
    build and the model.  `store`: the serve's results store, open for the whole serve (opened with
    `threads`: the front records from its own threads); `host`: the serve's fingerprint.  Without
    them, the store is opened and the fingerprint read at each record."""
    def record(verdict) -> None:
        from dataclasses import asdict

        from rocforge_build.measure import provenance
        from rocforge_build.measure.store import Store

        here = host if host is not None else provenance.host()
        row = {**base, "host": here, "prefix": str(build.prefix), "backend": build.backend, "stamp": build.stamp,
               "url": url, "every_s": every, "while_serving": asdict(stats()), **verdict.to_json()}
        with _STORE_LOCK, contextlib.ExitStack() as opened:
            db = store if store is not None else opened.enter_context(Store())
            run_id = db.start_run("canary", argv, {"host": here, "url": url, "while_serving": True})
            db.add_row(run_id, "canary", row, status=status)
            db.finish_run(run_id, status)
    return record


def say_to_stderr(text: str) -> None:
    """`rocforge: serve: TEXT` on one line, every terminal control (CR and LF too) written as its
    escape (shellsafe.escaped, the writer cli's report uses): the text quotes servers' replies, and
    a status line can carry ESC, BEL or a CR that would paint a line of its own over this one.
    Every line `rocforge serve` writes goes through here."""
    from rocforge_build.shellsafe import escaped

    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"rocforge: serve: {escaped(text)}\n")
        sys.stderr.flush()


def run(session, p, *, every: float, wait_s: float, on_ready, before_ready=None, argv: list[str],
        request_s: float | None = None) -> int:
    """serve.run of the plan's llama-server moved behind the front (`behind`), for `session`
    (serve/session.py: its build, model, reference, store and fingerprint, each opened once): the
    short canary's reference answers are made first (the reference build's own llama-server,
    before this one takes the memory), the front listens on the plan's address once llama-server
    is ready and warmed up, then `on_ready` says the URL.  `request_s`: the clients' deadline
    (Front's `request_seconds`), `wait_s` when None.  Returns llama-server's exit status."""
    from rocforge_build.serve import canary
    from rocforge_build.serve import server as serve

    build, model = session.build, session.model
    inner = behind(p)
    plan_, answers = short_reference(model, session.reference, progress=say_to_stderr)
    front = Front((p.host, p.port), ("127.0.0.1", inner.port), every=every, say=say_to_stderr,
                  request_seconds=request_s or wait_s)
    base = {"model_sha256": model.sha256, "model": {"path": model.path}}
    front.record = store_recorder(base, build, argv, p.url, every, lambda: front.stats,
                                  store=session.store, host=session.host)
    front.record_not_run = store_recorder(base, build, argv, p.url, every, lambda: front.stats, status="not_run",
                                          store=session.store, host=session.host)

    def ready(warm_s: float) -> None:
        # only now: serve.run saw this llama-server (our child) answer /health and a warm-up request,
        # so the /props read for its slots and API key is its own, not whatever held the port before
        target = canary.target_of(inner.url, inner.argv)
        front.checker = lambda: canary.check(plan_, target, answers, timeout=120.0)
        try:
            front.start()
        except OSError as exc:
            raise serve.ServeError(f"the canary front cannot listen on {p.url}: {exc.strerror or exc}",
                                   "serve on another port: --port N") from None
        on_ready(warm_s)
        say_to_stderr(f"the short canary runs between requests, every {every:g} s at most; "
                      f"llama-server itself listens on {inner.url}")

    try:
        return serve.run(inner, wait_s=wait_s, on_ready=ready, before_ready=before_ready)
    finally:
        front.stop()
