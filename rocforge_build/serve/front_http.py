"""The HTTP side of serve's canary front (serve/front.py): one thread per client
connection, the request head read within its deadlines and bounds, the request forwarded to
llama-server and its answer copied back piece by piece (the design and its bounds:
serve_front's docstring).  This module is the protocol; serve_front decides (when the canary
runs, when the server is failed), and the handler asks it through the front it is given."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import socketserver
import time
from dataclasses import dataclass, replace

HEAD_MAX = 64 * 1024  # bytes of a request line + headers (cpp-httplib and nginx allow about this much)
HEADERS_MAX = 100  # header lines of one request
HEAD_SECONDS = 20.0  # to send a whole request head, from its first byte (slowloris)
IDLE_SECONDS = 75.0  # a kept-alive client connection with no new request is closed after this
IO_SECONDS = 60.0  # one read of a request body, or one write to the client, that makes no progress
PIECE = 64 * 1024
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "expect", "content-length"})
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")


class _Closed(Exception):
    """The client went away or broke the protocol; the connection is dropped."""


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 128
    front: object  # serve_front.Front (not imported: it imports this module)

    def process_request(self, request, client_address):
        if not self.front._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(_simple(503, b'{"error": {"code": 503, "type": "unavailable_error", '
                                        b'"message": "too many connections to this server"}}', close=True))
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.front._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.front._slots.release()

    def handle_error(self, request, client_address):  # a connection's fault is never a traceback
        pass


def server_for(front) -> _Server:
    """The front's listening server on `front.listen`, its handler reading `front`."""
    host, port = front.listen
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    cls = type("_FrontServer", (_Server,), {"address_family": family, "front": front})
    return cls((host, port), _Handler)


def _simple(status: int, body: bytes, *, close: bool = False, reason: str | None = None) -> bytes:
    reason = reason or http.client.responses.get(status, "Error")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode() + body


def _error(status: int, kind: str, message: str) -> bytes:
    return json.dumps({"error": {"code": status, "type": kind, "message": message}}).encode()


@dataclass(frozen=True)
class Request:
    """One parsed request head."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]  # as sent, hop-by-hop ones included
    length: int

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        return "close" not in tokens if self.version == "HTTP/1.1" else "keep-alive" in tokens


class _Handler(socketserver.BaseRequestHandler):
    """One client connection: requests one after another (keep-alive), each forwarded whole."""

    def setup(self):
        self.sock: socket.socket = self.request
        self.buf = b""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self):
        front = self.server.front  # serve_front.Front
        with contextlib.suppress(_Closed, OSError):
            while True:
                req = self._read_head()
                if req is None:
                    return
                if front.failure is not None:
                    self._send(_simple(503, front.failure.body(), close=True, reason="Service Unavailable"))
                    return
                if not self._forward(front, req) or not req.keep_alive:
                    return

    # -- reading the request -----------------------------------------------------------------------
    def _recv(self, timeout: float) -> bytes:
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(PIECE)
        except TimeoutError:
            raise _Closed from None
        if not data:
            raise _Closed
        return data

    def _read_head(self) -> Request | None:
        """The next request's head; None at a clean end of the connection (or one idle for
        IDLE_SECONDS).  Deadlines are fixed when set, never moved by bytes: IDLE_SECONDS for the
        first byte, then HEAD_SECONDS from it for the whole head (blank lines before the request
        line count).  A head too large, too slow or malformed is answered with its status and
        the connection closed."""
        started = bool(self.buf)  # pipelined bytes: the head's clock runs from now
        deadline = time.monotonic() + (HEAD_SECONDS if started else IDLE_SECONDS)
        self.buf = self.buf.lstrip(b"\r\n")  # empty lines before a request line are ignored (RFC 9112 2.2)
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > HEAD_MAX:
                self._refuse(431, "the request's headers are larger than 64 KiB")
            wait = deadline - time.monotonic()
            try:
                if wait <= 0:
                    raise _Closed
                data = self._recv(wait)
            except _Closed:
                if started and time.monotonic() >= deadline:
                    self._refuse(408, f"the request's headers did not arrive within {HEAD_SECONDS:g} s")
                if not self.buf:
                    return None
                raise
            if not started:
                started = True
                deadline = time.monotonic() + HEAD_SECONDS
            self.buf = (self.buf + data).lstrip(b"\r\n")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        if len(head) > HEAD_MAX:
            self._refuse(431, "the request's headers are larger than 64 KiB")
        return self._parse(head)

    def _parse(self, head: bytes) -> Request:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if (len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1])
                or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0")):
            self._refuse(400, "not an HTTP/1.x request line")
        if len(lines) - 1 > HEADERS_MAX:
            self._refuse(431, f"more than {HEADERS_MAX} header lines")
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.fullmatch(name) or any(c in value for c in b"\r\n\x00"):
                self._refuse(400, "a malformed header line")
            headers.append((name.decode("ascii"), value.strip(b" \t").decode("latin-1")))
        req = Request(parts[0].decode("ascii"), parts[1].decode("ascii"), parts[2].decode("ascii"),
                      tuple(headers), 0)
        if req.header("transfer-encoding") is not None:
            self._refuse(411, "a chunked request body is not taken here: send Content-Length")
        lengths = {v for k, v in headers if k.lower() == "content-length"}
        if len(lengths) > 1 or (lengths and not re.fullmatch(r"[0-9]{1,15}", next(iter(lengths)))):
            self._refuse(400, "an invalid Content-Length")
        return replace(req, length=int(next(iter(lengths))) if lengths else 0)

    def _refuse(self, status: int, message: str):
        with contextlib.suppress(OSError):
            self._send(_simple(status, _error(status, "invalid_request_error", message), close=True))
        raise _Closed

    def _send(self, data: bytes) -> None:
        self.sock.settimeout(IO_SECONDS)
        try:
            self.sock.sendall(data)
        except (OSError, TimeoutError):
            raise _Closed from None

    def _body_pieces(self, length: int):
        """The request body, as it comes: what was read with the head first."""
        left = length
        if self.buf:
            first, self.buf = self.buf[:left], self.buf[left:]
            left -= len(first)
            yield first
        while left > 0:
            data = self._recv(IO_SECONDS)
            piece, self.buf = data[:left], data[left:]
            left -= len(piece)
            yield piece

    # -- forwarding --------------------------------------------------------------------------------
    def _forward(self, front, req: Request) -> bool:
        """Send the request to llama-server and its answer back as it comes; False when the client
        connection cannot go on (the answer was cut, or it was close-delimited)."""
        if (req.header("expect") or "").lower() == "100-continue" and req.length:
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
        named = {t.strip().lower() for t in (req.header("connection") or "").split(",")}
        front._begin()
        up = http.client.HTTPConnection(*front.upstream, timeout=front.request_seconds)
        sent_head = False
        try:
            try:
                up.putrequest(req.method, req.target, skip_host=True, skip_accept_encoding=True)
                for k, v in req.headers:
                    if k.lower() not in HOP_BY_HOP and k.lower() not in named:
                        up.putheader(k, v)
                if req.header("host") is None:
                    up.putheader("Host", f"{front.upstream[0]}:{front.upstream[1]}")
                if req.length or req.method in ("POST", "PUT", "PATCH"):
                    up.putheader("Content-Length", str(req.length))
                up.endheaders()
                for piece in self._body_pieces(req.length):
                    up.send(piece)
                answer = up.getresponse()
            except TimeoutError:
                n = front._timed_out()
                with contextlib.suppress(_Closed):  # the client first, then whether the server is failed
                    self._send(_simple(504, _error(504, "timeout_error",
                                                   f"the llama-server behind this front said nothing for "
                                                   f"{front.request_seconds:g} s"), close=True, reason="Gateway Timeout"))
                front._judge_timeouts(n, req.target)
                return False
            except (OSError, http.client.HTTPException) as exc:
                self._send(_simple(502, _error(502, "unavailable_error",
                                               f"the llama-server behind this front did not answer ({type(exc).__name__})"),
                                   close=True))
                return False
            front._answered()
            length = answer.getheader("content-length")
            bodiless = req.method == "HEAD" or answer.status in (204, 304) or 100 <= answer.status < 200
            chunked = not bodiless and length is None and req.version == "HTTP/1.1"
            keep = req.keep_alive and (bodiless or length is not None or chunked)
            lines = [f"HTTP/1.1 {answer.status} {answer.reason}"]
            upstream_named = {t.strip().lower() for t in (answer.getheader("connection") or "").split(",")}
            for k, v in answer.getheaders():
                if k.lower() not in HOP_BY_HOP - {"content-length"} and k.lower() not in upstream_named:
                    lines.append(f"{k}: {v}")
            if chunked:
                lines.append("Transfer-Encoding: chunked")
            lines.append("Connection: keep-alive" if keep else "Connection: close")
            self._send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            sent_head = True
            if bodiless:
                return keep
            while True:
                try:
                    piece = answer.read1(PIECE)
                except TimeoutError:
                    front._judge_timeouts(front._timed_out(), req.target)
                    return False  # silent mid-answer past the bound: the client sees the answer cut
                except (OSError, http.client.HTTPException):
                    return False  # llama-server died mid-answer: the client sees the answer cut
                if not piece:
                    break
                self._send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                self._send(b"0\r\n\r\n")
            return keep
        except _Closed:
            if not sent_head:
                raise
            return False
        finally:
            up.close()  # a client gone mid-answer: llama-server sees the close and stops generating
            front._end()
