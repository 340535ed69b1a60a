"""How often and how long a download tries (`[download]` in the configuration): the retry
policy with its backoff, the deadline of a whole fetch, and the retry loop that `download.py`
runs each try in.  A host name that does not resolve is never retried (offline: one line at
once); other connection errors, 5xx, 408 and 429 are, with `Retry-After` honoured and capped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from rocforge_build.errors import NetworkError


def _say(message: str) -> None:
    print(f"rocforge: {message}", file=sys.stderr, flush=True)


@dataclass
class RetryPolicy:
    attempts: int = 5
    backoff: float = 0.5  # first delay, doubled each time
    max_delay: float = 30.0
    connect_timeout: float = 15.0
    read_timeout: float = 60.0  # no byte at all for this long: a stall
    min_rate: float = 1024.0  # bytes/s, averaged over rate_window; 0 turns the check off
    rate_window: float = 30.0
    deadline: float = 21600.0  # seconds for a whole download, tries and waits included
    listing_deadline: float = 300.0  # the same for a listing page or a `.sha256`
    max_listing_bytes: int = 32 << 20
    max_unsized_bytes: int = 64 << 30  # a download whose size nobody declares
    notify: Callable[[str], None] | None = _say  # told about each retry; None: silent

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_delay)
            except ValueError:
                pass
        return min(self.backoff * (2 ** attempt), self.max_delay)


DEFAULT_POLICY = RetryPolicy()  # the defaults of data/defaults.toml [download]
_sleep: Callable[[float], None] = time.sleep  # tests replace it


_INT_KEYS = ("attempts", "max_listing_bytes", "max_unsized_bytes")
_FLOAT_KEYS = ("connect_timeout", "read_timeout", "min_rate", "rate_window", "deadline",
               "listing_deadline")


def policy_from_config(cfg: dict, notify: Callable[[str], None] | None = None) -> RetryPolicy:
    """The `[download]` table of the configuration as a RetryPolicy; each key's type and range
    is checked by config.check_value, the one place that knows them."""
    from rocforge_build import config

    table = cfg.get("download", {})
    values: dict = {}
    for key in (*_INT_KEYS, *_FLOAT_KEYS):
        if key in table:
            config.check_value(f"download.{key}", table[key], source="the [download] table")
            values[key] = int(table[key]) if key in _INT_KEYS else float(table[key])
    return RetryPolicy(**values, **({"notify": notify} if notify else {}))


def policy_or_config(policy: RetryPolicy | None) -> RetryPolicy:
    """The policy given, else the configuration's (so every caller honours `[download]`)."""
    if policy is not None:
        return policy
    from rocforge_build import config

    return policy_from_config(config.effective())


@dataclass(frozen=True)
class Deadline:
    """When a whole fetch must have ended, and the configuration key that set the limit."""

    at: float
    seconds: float
    key: str

    @classmethod
    def start(cls, seconds: float, key: str) -> Deadline:
        return cls(time.monotonic() + seconds, seconds, key)

    def left(self) -> float:
        return self.at - time.monotonic()

    def timeout(self, seconds: float) -> float:
        """`seconds`, shortened so that a wait ends by the deadline."""
        return max(0.01, min(seconds, self.left()))

    def words(self) -> str:
        return f"the {self.seconds:g} s limit ({self.key})"


class Pace:
    """One stream's pace against the policy: past the whole deadline, or under `min_rate` bytes/s
    averaged over the last `rate_window` seconds (once a window has passed), it is to stop.  The
    one rule every transfer follows: a download, a listing, a substitute store's blob or
    manifest."""

    def __init__(self, policy: RetryPolicy, deadline: Deadline):
        self.min_rate, self.window, self.deadline = policy.min_rate, policy.rate_window, deadline
        self.start = time.monotonic()
        self.marks: list[tuple[float, int]] = [(self.start, 0)]
        self.got = 0

    def add(self, count: int) -> str | None:
        """`count` more bytes arrived: why the stream must stop now, or None."""
        self.got += count
        if self.deadline.left() <= 0:
            return f"still receiving at {self.deadline.words()}"
        if not self.min_rate:
            return None
        now = time.monotonic()
        self.marks.append((now, self.got))
        while len(self.marks) > 1 and self.marks[1][0] <= now - self.window:
            self.marks.pop(0)
        t0, n0 = self.marks[0]
        if now - self.start >= self.window and now - t0 >= self.window * 0.5 and \
                (self.got - n0) / (now - t0) < self.min_rate:
            return (f"too slow: {(self.got - n0) / (now - t0):.0f} bytes/s over the last "
                    f"{now - t0:.0f} s, below download.min_rate {self.min_rate:.0f}")
        return None


class Retry(Exception):
    def __init__(self, reason: str, retry_after: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def with_retries(policy: RetryPolicy, attempt_once, what: str, deadline: Deadline):
    """Call `attempt_once` until it returns, retrying `Retry` and connection errors with the
    policy's backoff (and saying so through `policy.notify`), never past the deadline.  Returns
    (True, result, attempts, False) or (False, last failure text, attempts, expired); final
    errors (4xx, RocforgeError, a host name that does not resolve) propagate at once."""
    last = ""
    for attempt in range(policy.attempts):
        if deadline.left() <= 0:
            return False, last or "no answer", attempt, True
        try:
            return True, attempt_once(), attempt + 1, False
        except Retry as exc:
            last, retry_after = exc.reason, exc.retry_after
        except requests_errors() as exc:
            unresolved = unresolved_host(exc)
            if unresolved is not None:
                raise NetworkError(
                    f"cannot resolve the host name {unresolved!r}: {describe(exc)}",
                    "you may be offline, or DNS does not know the host: check your network "
                    "connection or proxy, or point rocforge at a mirror (`--index URL`)",
                ) from None
            last, retry_after = describe(exc), None
        if deadline.left() <= 0:
            return False, last, attempt + 1, True
        if attempt + 1 < policy.attempts:
            delay = policy.delay(attempt, retry_after)
            if delay >= deadline.left():  # waiting would end past the deadline: stop now
                return False, last, attempt + 1, True
            if policy.notify:
                policy.notify(f"{what}: {last}; retrying in {delay:.1f} s "
                              f"(attempt {attempt + 2} of {policy.attempts})")
            _sleep(delay)
    return False, last, policy.attempts, False


def unresolved_host(exc: BaseException) -> str | None:
    """The host name when `exc` is (caused by) a DNS lookup failure, which retrying within
    seconds does not cure; None otherwise."""
    import socket

    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if type(e).__name__ == "NameResolutionError" or isinstance(e, socket.gaierror):
            host = getattr(getattr(e, "conn", None), "host", None)
            return host or "?"
        # `reason` is a str on some errors (ssl.SSLError: 'WRONG_VERSION_NUMBER'): only
        # exceptions are followed
        stack += [c for c in (e.__cause__, e.__context__, getattr(e, "reason", None),
                              *getattr(e, "args", ())) if isinstance(c, BaseException)]
    return None


def requests_errors() -> tuple[type[BaseException], ...]:
    import http.client

    import requests
    import urllib3

    return (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
            requests.exceptions.ContentDecodingError, urllib3.exceptions.HTTPError,
            http.client.HTTPException, ConnectionError, TimeoutError)


def describe(exc: BaseException) -> str:
    """What went wrong, short and whole: the innermost cause's words (urllib3 nests the real
    reason several layers deep), never cut mid-word; an OS error by its words, not its errno or
    class ("Connection refused", not "ConnectionRefusedError: [Errno 111] ...")."""
    from rocforge_build.errors import reason

    inner = exc
    while True:
        nxt = getattr(inner, "reason", None) or (inner.args[0] if inner.args and isinstance(
            inner.args[0], BaseException) else None) or inner.__cause__
        if not isinstance(nxt, BaseException) or nxt is inner:
            break
        inner = nxt
    text = reason(inner)
    # urllib3 prefixes "<connection object at 0x...>: " to the OS error
    if text.startswith("<") and ">: " in text:
        text = text.split(">: ", 1)[1]
    if len(text) > 300:
        text = text[:300].rsplit(" ", 1)[0] + " ..."
    return text
