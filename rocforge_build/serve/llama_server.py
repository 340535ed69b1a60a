"""One llama-server that rocforge runs, start to stop: the served one (serve/server.py) and the
canary's reference (serve/canary.py) alike, so that each is started, asked and stopped the same way.

- `start()`: in a process group of its own, marked (proc.spawn) and stopped with rocforge even by
  SIGKILL (`die_with_parent`); its output read to the end by a daemon thread, relayed to stderr
  with every terminal control escaped (it echoes the model's metadata) or only kept, its last lines
  ready for an error.
- `wait_ready(seconds)`: until `/health` answers 200 from a socket that is the child's own (or one
  of its descendants': proc.port_holder), so that another program on the port is never taken for
  it; waiting on the child itself between looks, never a bare sleep.  `NotReady` says why not.
- `request(...)`: one HTTP exchange with a deadline on the whole of it (a server that trickles its
  answer too) and a cap on the reply's size (`exchange`).
- `stop()`: the whole process tree, a descendant that daemonized included (proc.stop_group); as a
  context manager, whatever ends the block stops it."""

from __future__ import annotations

import collections
import contextlib
import http.client
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from rocforge_build.errors import RocforgeError
from rocforge_build.shellsafe import one_line

MAX_REPLY = 8 << 20  # bytes read of one reply
LOOK_SECONDS = 0.25  # between two looks at /health, spent waiting on the child (its exit ends it)
HEALTH_SECONDS = 2.0  # one /health request
OUTSIDE_CHARS = 200  # characters of a server's text (an error, a label) a line quotes


class ServerError(RocforgeError):
    """A request to a llama-server failed (no answer in time, a refused connection, a reply too large)."""

    exit_code = 1


class NotReady(Exception):
    """Why a started llama-server is not ready: `why` is "exited" (its exit `code`), "other" (another
    program answers on its port) or "silent" (no /health 200 from it in time); `last` its last
    line of output (one printable line, or "")."""

    def __init__(self, why: str, *, code: int | None = None, last: str = ""):
        super().__init__(why)
        self.why, self.code, self.last = why, code, last


def outside(text: object) -> str:
    """Text from outside (a server's status line, an exception's text, its output) as a line may
    quote it: one printable line, bounded."""
    line = one_line(text)
    return line if len(line) <= OUTSIDE_CHARS else line[:OUTSIDE_CHARS - 3] + "..."


def url_host(address: str) -> str:
    """An IP literal as a URL's host: an IPv6 address in brackets (RFC 3986 3.2.2)."""
    return f"[{address}]" if ":" in address else address


def dial_address(host: str) -> str:
    """Where rocforge (and a printed URL) connects to a server listening on `host`: the host
    itself, or the loopback address of its family for a wildcard (0.0.0.0, ::)."""
    import ipaddress

    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if addr.is_unspecified:
        return "127.0.0.1" if addr.version == 4 else "::1"
    return host


def exchange(method: str, url: str, path: str, body: bytes | None, headers: dict, timeout: float, *,
             cut: bool = True, limit: int = MAX_REPLY, error: type[RocforgeError] = ServerError) -> tuple[int, bytes]:
    """One HTTP request and its (status, reply): the whole exchange (a server that trickles its
    headers or its body a byte at a time too) bounded by `timeout` seconds, the reply by `limit`
    bytes; any failure is one `error` line.  `cut`: at the deadline the connection is shut down, so
    the read in progress ends at once; a caller that stops the server next anyway leaves it (the
    server then never sees its client vanish mid-answer, and has nothing to complain of)."""
    parts = urlsplit(url)
    outcome: dict = {}
    state = {"abandoned": False, "sock": None}
    lock = threading.Lock()
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=max(timeout, 0.001))

    def ask():
        came_to: tuple[str, object] | None = None
        try:
            conn.connect()
            with lock:
                if state["abandoned"]:
                    return
                state["sock"] = conn.sock
            conn.request(method, path, body, headers)
            r = conn.getresponse()
            came_to = ("reply", (r.status, r.read(limit + 1)))
        except Exception as exc:  # noqa: BLE001 - any failure is the exchange's one line, its type kept
            came_to = ("error", f"{type(exc).__name__}: {outside(exc)}")
        finally:  # here, not from the caller: closing it under a read in progress breaks http.client
            conn.close()
        with lock:  # once abandoned, the outcome is the deadline's: the read it cut short is no error of its own
            if came_to and not state["abandoned"]:
                outcome[came_to[0]] = came_to[1]

    t = threading.Thread(target=ask, name=f"http {method} {path}", daemon=True)
    t.start()
    t.join(timeout)
    with lock:
        state["abandoned"] = True
        sock = state["sock"]
    if cut and sock is not None and t.is_alive():  # ends a read still going: it fails at once, and closes
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    if "error" in outcome:
        raise error(f"{url}{path} failed: {outcome['error']}")
    if "reply" not in outcome:
        raise error(f"{url}{path} did not answer within {math.ceil(timeout)} s")
    status, reply = outcome["reply"]
    if len(reply) > limit:
        raise error(f"{url}{path} replied with more than "
                    + (f"{limit >> 20} MB" if limit >= 1 << 20 else f"{limit} bytes"))
    return status, reply


class LlamaServer:
    """A llama-server started with `argv` (which names its --host and --port: `host`, `port`) and
    `env` on top of rocforge's own.  `relay`: its output goes to stderr, escaped, as it comes;
    else it is only kept (`last_words`).  `grace`: the seconds a stop at the end of its `with`
    block gives it after SIGTERM."""

    def __init__(self, argv: Sequence[str], *, host: str, port: int, env: dict | None = None,
                 relay: bool = True, keep: int = 20, grace: float = 5.0):
        self.argv = [str(a) for a in argv]
        self.env = dict(env or {})
        self.host, self.port = host, port
        self.relay, self.grace = relay, grace
        self.child = None  # proc.spawn's process, once started
        self._tail: collections.deque = collections.deque(maxlen=keep)
        self._reader: threading.Thread | None = None
        self._stopped = False

    @classmethod
    def on_loopback(cls, argv: Sequence[str], *, port: int | None = None, **kw) -> LlamaServer:
        """`argv` told to listen on 127.0.0.1 at `port` (a free one when None: proc.free_loopback_port)."""
        from rocforge_build.proc import free_loopback_port

        port = port or free_loopback_port()
        return cls([*argv, "--host", "127.0.0.1", "--port", str(port)], host="127.0.0.1", port=port, **kw)

    @property
    def dial(self) -> str:
        return dial_address(self.host)

    @property
    def url(self) -> str:
        return f"http://{url_host(self.dial)}:{self.port}"

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def returncode(self) -> int | None:
        return self.child.poll()

    # -- life -----------------------------------------------------------------------------------
    def start(self) -> LlamaServer:
        from rocforge_build.proc import merged_env, spawn

        self.child = spawn(self.argv, env=merged_env(self.env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", die_with_parent=True)
        self.read_output(self.child.stdout)
        return self

    def read_output(self, stream) -> threading.Thread:
        """Read `stream` (its output) to the end in a daemon thread (a pipe held open by a stray
        descendant never holds rocforge): relayed or kept (`relay`), the last lines kept."""
        self._reader = threading.Thread(target=self._pump, args=(stream,), daemon=True,
                                        name=f"{self.argv[0].rsplit('/', 1)[-1]} output")
        self._reader.start()
        return self._reader

    def _pump(self, stream) -> None:
        """Read its output to the end whatever happens to stderr (a full pipe would stop the
        server); stop() closes the pipe, maybe between two lines: the next read's ValueError ends
        this quietly."""
        from rocforge_build.shellsafe import escaped

        with contextlib.suppress(OSError, ValueError):
            for line in stream:
                self._tail.append(line.rstrip("\n"))
                if self.relay:
                    with contextlib.suppress(OSError, ValueError):
                        sys.stderr.write(escaped(line.rstrip("\n")) + "\n")
                        sys.stderr.flush()

    def __enter__(self) -> LlamaServer:
        return self if self.child else self.start()

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self.stop(self.grace)
            return
        from rocforge_build import signals

        with signals.deferred():  # a second Ctrl-C must not cut the clean-up short
            self.stop(self.grace)

    def stop(self, grace: float = 5.0) -> None:
        """It and everything it started, a child that daemonized included (proc.stop_group); also
        after it ended by itself: what it left running is stopped.  Once: its process id, reaped,
        is never signalled again."""
        from rocforge_build.proc import stop_group

        if self.child is not None and not self._stopped:
            self._stopped = True
            stop_group(self.child, grace=grace)

    def wait(self, seconds: float | None = None) -> int | None:
        """Its exit status once it ends (None if it still runs after `seconds`)."""
        try:
            return self.child.wait(seconds)
        except subprocess.TimeoutExpired:
            return None

    def last_words(self, wait_s: float = 2.0) -> str:
        """The last line it wrote (one printable line, "" for none), once its output is read to
        the end (its exit closes the pipe; a stray descendant holding it open is waited `wait_s`)."""
        if self._reader is not None:
            self._reader.join(wait_s)
        lines = [one_line(t) for t in list(self._tail) if t.strip()]
        return lines[-1] if lines else ""

    # -- ready ----------------------------------------------------------------------------------
    def holder(self) -> str:
        """Who takes a connection to its address and port (proc.port_holder)."""
        from rocforge_build.proc import port_holder

        return port_holder(self.child.pid, self.dial, self.port)

    def healthy(self, timeout: float = HEALTH_SECONDS) -> bool:
        with contextlib.suppress(ServerError):
            return self.request("GET", "/health", timeout=timeout)[0] == 200
        return False

    def wait_ready(self, seconds: float) -> None:
        """Until /health answers 200 from a socket the child (or its descendants) listens on;
        NotReady once it exited, or after `seconds` ("other" when another program has the port)."""
        deadline = time.monotonic() + seconds
        while True:
            if self.child.poll() is not None:
                raise NotReady("exited", code=self.child.returncode, last=self.last_words())
            holder = self.holder()
            left = deadline - time.monotonic()
            if holder in ("ours", "unknown") and self.healthy(min(HEALTH_SECONDS, max(left, 0.001))):
                return
            if time.monotonic() > deadline:
                raise NotReady("other" if holder == "other" else "silent")
            self.wait(LOOK_SECONDS)  # returns at once when it exits: the next look says so

    # -- asking ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None, *,
                timeout: float, cut: bool = True, limit: int = MAX_REPLY,
                error: type[RocforgeError] = ServerError) -> tuple[int, bytes]:
        """(status, reply) of one request to it (`exchange`: a deadline on the whole exchange, the
        reply capped at `limit` bytes, any failure one `error` line)."""
        return exchange(method, self.url, path, body, headers or {}, timeout, cut=cut, limit=limit, error=error)
