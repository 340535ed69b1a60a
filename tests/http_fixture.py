"""A real HTTP server on 127.0.0.1 for tests (reusable by every team).

tests/conftest.py loads this module as a plugin, so every test can ask for `http_server`:

    def test_x(http_server):
        url = http_server.add("/files/a.tar.gz", data)          # serve bytes, with Range support
        http_server.fail("/files/a.tar.gz", drop_after=1000)   # next GET sends 1000 bytes, then closes
        http_server.fail("/files/a.tar.gz", status=500)        # next GET answers 500
        http_server.fail("/files/a.tar.gz", trickle=0.5)       # next GET: one byte every 0.5 s
        http_server.fail("/files/a.tar.gz", endless=True)      # next GET: a body that never ends
        http_server.fail("/x", status=302, headers={"Location": "file:///etc/passwd"})
        http_server.requests                                   # [(method, path, headers), ...]

Files are served as a static file server does: a strong `ETag` (a hash of the bytes) and a
`Last-Modified`, `Range` answered with 206, and `If-Range` honoured (RFC 9110 13.1.5: a validator
that no longer matches gets the whole new file with 200).  `add()` of new bytes at a path is a
file replaced on the server.

Faults are queued per path and consumed one per GET, in order.  `add_handler(path, fn)` serves
anything computed (`fn(query: dict[str, list[str]], headers) -> (status, headers, body)`);
`add_s3_bucket(path, keys, max_keys=)` emulates an anonymous S3 ListObjectsV2 endpoint
(`?list-type=2&prefix=&continuation-token=`) with real pagination, and `cdn_index_html(files)`
renders a page in the format of TheRock's `index_generation_s3_tar.py` (an embedded
`const files = [...]` JSON array, links built in JavaScript).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

import pytest


@dataclass
class Fault:
    status: int | None = None  # answer this status (with an empty body)
    drop_after: int | None = None  # send this many body bytes, then close the connection
    ignore_range: bool = False  # answer 200 with the whole body even when a Range was asked
    headers: dict = field(default_factory=dict)  # extra headers (e.g. Retry-After)
    delay: float = 0.0  # seconds to wait before answering
    trickle: float | None = None  # send the body one byte at a time, this many seconds apart
    # answer 200 with a chunked body (no Content-Length) that never ends: 64 KiB blocks, or
    # one byte every `trickle` seconds; stops when the client hangs up (or after 60 s)
    endless: bool = False


Handler = Callable[[dict, dict], tuple[int, dict, bytes]]


class LocalHttpServer:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.modified: dict[str, float] = {}
        self.handlers: dict[str, Handler] = {}
        self.faults: dict[str, deque[Fault]] = {}
        self.requests: list[tuple[str, str, dict]] = []
        self._lock = threading.Lock()
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                server._serve(self, head=True)

            def do_GET(self):
                server._serve(self, head=False)

        class _Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client hanging up is normal
                pass

        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._thread.start()

    # -- set-up ----------------------------------------------------------------------------
    def url(self, path: str) -> str:
        return self.base + path

    def add(self, path: str, data: bytes | str) -> str:
        """Serve `data` at `path` (an already URL-encoded path); returns the full URL."""
        self.files[path] = data.encode() if isinstance(data, str) else data
        # a replaced file is newer (whole seconds: HTTP dates have no fraction)
        self.modified[path] = max(time.time(), self.modified.get(path, 0) + 1)
        return self.url(path)

    def add_handler(self, path: str, fn: Handler) -> str:
        self.handlers[path] = fn
        return self.url(path)

    def fail(self, path: str, **kwargs) -> None:
        with self._lock:
            self.faults.setdefault(path, deque()).append(Fault(**kwargs))

    def gets(self, path: str) -> list[dict]:
        """Headers of each GET of `path` so far."""
        return [h for m, p, h in self.requests if m == "GET" and p == path]

    def add_s3_bucket(self, path: str, objects: dict[str, tuple[bytes, float]], *,
                      max_keys: int = 1000, bucket: str = "therock-nightly-tarball") -> str:
        """Emulate an S3 bucket at `path` (e.g. "/s3"): the bucket URL lists with ListObjectsV2
        and each key is served at `<path>/<key>`. `objects`: key -> (data, LastModified epoch)."""
        keys = sorted(objects)
        for key, (data, _mtime) in objects.items():
            self.add(f"{path}/{urllib.parse.quote(key)}", data)

        def listing(query: dict, headers: dict) -> tuple[int, dict, bytes]:
            if query.get("list-type", [""])[0] != "2":
                return 400, {}, b"only ListObjectsV2 is emulated"
            prefix = query.get("prefix", [""])[0]
            token = query.get("continuation-token", [None])[0]
            limit = min(int(query.get("max-keys", [max_keys])[0]), max_keys)
            chosen = [k for k in keys if k.startswith(prefix)]
            start = int(base64.b64decode(token).decode()) if token else 0
            page = chosen[start:start + limit]
            more = start + limit < len(chosen)
            body = s3_list_xml(bucket, prefix, page, objects, limit, token,
                               base64.b64encode(str(start + limit).encode()).decode() if more else None)
            return 200, {"Content-Type": "application/xml"}, body.encode()

        self.add_handler(path + "/", listing)
        self.add_handler(path, listing)
        return self.url(path + "/")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- serving ---------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        parsed = urllib.parse.urlsplit(h.path)
        path = parsed.path
        headers = {k: v for k, v in h.headers.items()}
        self.requests.append(("HEAD" if head else "GET", path, headers))
        fault = None
        if not head:
            with self._lock:
                queue = self.faults.get(path)
                if queue:
                    fault = queue.popleft()
        fault = fault or Fault()
        if fault.delay:
            time.sleep(fault.delay)
        if fault.status is not None:
            self._respond(h, fault.status, {"Content-Length": "0", **fault.headers}, b"", head)
            return
        if fault.endless and not head:
            self._stream_forever(h, fault.trickle)
            return
        if path in self.handlers:
            status, extra, body = self.handlers[path](urllib.parse.parse_qs(parsed.query), headers)
            self._respond(h, status, {"Content-Length": str(len(body)), **extra}, body, head)
            return
        data = self.files.get(path)
        if data is None:
            self._respond(h, 404, {"Content-Length": "0"}, b"", head)
            return
        etag = '"' + hashlib.sha1(data).hexdigest() + '"'
        modified = email.utils.formatdate(self.modified[path], usegmt=True)
        status, out, extra = 200, data, {"Accept-Ranges": "bytes", "ETag": etag,
                                         "Last-Modified": modified}
        rng = headers.get("Range")
        if_range = headers.get("If-Range")
        if if_range is not None and if_range not in (etag, modified):
            rng = None  # the file changed since the client's copy began: send it whole
        if rng and not fault.ignore_range and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            start = int(first)
            end = int(last) if last else len(data) - 1
            if start >= len(data):
                self._respond(h, 416, {"Content-Range": f"bytes */{len(data)}",
                                       "Content-Length": "0"}, b"", head)
                return
            status, out = 206, data[start:end + 1]
            extra["Content-Range"] = f"bytes {start}-{start + len(out) - 1}/{len(data)}"
        extra["Content-Length"] = str(len(out))
        extra.update(fault.headers)
        if fault.trickle is not None and not head:
            h.send_response(status)
            for k, v in extra.items():
                h.send_header(k, v)
            h.end_headers()
            try:
                for i in range(len(out)):
                    h.wfile.write(out[i:i + 1])
                    h.wfile.flush()
                    time.sleep(fault.trickle)
            except OSError:  # the client gave up: what a trickling server sees
                pass
            h.close_connection = True
            return
        if fault.drop_after is not None and not head:
            h.send_response(status)
            for k, v in extra.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(out[:fault.drop_after])
            h.wfile.flush()
            h.close_connection = True
            return
        self._respond(h, status, extra, out, head)

    @staticmethod
    def _stream_forever(h, trickle: float | None, limit_s: float = 60.0) -> None:
        """What a broken or hostile server does: a body without end (the 60 s bound only keeps
        a test's server thread from outliving the test run)."""
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        block = b"z" if trickle is not None else b"z" * 65536
        end = time.monotonic() + limit_s
        try:
            while time.monotonic() < end:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                h.wfile.flush()
                if trickle is not None:
                    time.sleep(trickle)
        except OSError:  # the client gave up
            pass
        h.close_connection = True

    @staticmethod
    def _respond(h, status: int, headers: dict, body: bytes, head: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if not head and body:
            h.wfile.write(body)


def s3_list_xml(bucket: str, prefix: str, page: list[str], objects: dict, max_keys: int,
                token: str | None, next_token: str | None) -> str:
    """A ListBucketResult document as S3 returns it for `?list-type=2`."""
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>\n',
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
        f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
        f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
    ]
    if token:
        parts.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
    parts.append(f"<IsTruncated>{'true' if next_token else 'false'}</IsTruncated>")
    if next_token:
        parts.append(f"<NextContinuationToken>{escape(next_token)}</NextContinuationToken>")
    for key in page:
        data, mtime = objects[key]
        stamp = datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        parts.append(
            f"<Contents><Key>{escape(key)}</Key><LastModified>{stamp}</LastModified>"
            f'<ETag>&quot;{len(data):032x}&quot;</ETag><Size>{len(data)}</Size>'
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    parts.append("</ListBucketResult>")
    return "".join(parts)


def cdn_index_html(files: list[tuple[str, float]], title: str = "ROCm SDK nightly tarballs") -> str:
    """An index page in the shape TheRock's index_generation_s3_tar.py writes: the file list is
    a JSON array in a script; links are made in JavaScript with encodeURIComponent."""
    files_js = json.dumps([{"name": n, "mtime": m} for n, m in files])
    return f"""
    <html>
    <head>
        <title>{title}</title>
        <meta charset="utf-8"/>
        <script>
            const files = {files_js};
            function renderFiles(fileList) {{
                const ul = document.getElementById('fileList');
                ul.innerHTML = '';
                fileList.forEach(file => {{
                    const li = document.createElement('li');
                    const href = encodeURIComponent(file.name).replace(/%2F/g, '/');
                    li.innerHTML = `<a href="${{href}}" target="_blank">${{file.name}}</a>`;
                    ul.appendChild(li);
                }});
            }}
            document.addEventListener('DOMContentLoaded', function() {{
                renderFiles([...files].sort((a, b) => b.mtime - a.mtime));
            }});
        </script>
    </head>
    <body>
        <h1>{title}</h1>
        <ul id="fileList"></ul>
    </body>
    </html>
    """


@pytest.fixture
def http_server():
    server = LocalHttpServer()
    try:
        yield server
    finally:
        server.close()
