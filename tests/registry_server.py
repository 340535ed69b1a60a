"""OCI registries for tests, on 127.0.0.1: a real one (Debian's `docker-registry`, distribution
2.8, which has no referrers API) over plain HTTP or over TLS with a CA made here and htpasswd
basic auth; a proxy in front of it that drops a blob's connection mid-body; and an in-memory fake
registry whose answers a test can replace with hostile ones.

    with start_registry(tmp_path) as reg:                    # plain HTTP
        store = RegistryStore(reg.store_url("team/cache"), timeout=5)
    tls = make_tls(tmp_path)                                  # CA + certificate for 127.0.0.1, localhost
    with start_registry(tmp_path, tls=tls, users={"ci": "pw"}) as reg: ...   # oci://, basic auth
    with FaultProxy(reg.base) as proxy:                       # proxy.drop_blobs_after(1000, times=1)
    with FakeRegistry() as fake:                              # fake.route("GET", r"/tags/list", fn)
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.client
import ipaddress
import json
import re
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

START_TIMEOUT = 15.0


# what a machine running the tests may have set that would decide a store's answer instead
STORE_ENVIRONMENT = ("ROCFORGE_STORE_USERNAME", "ROCFORGE_STORE_PASSWORD", "DOCKER_CONFIG",
                     "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")


def clear_store_environment(monkeypatch) -> None:
    """No credential or CA from the machine running the tests decides an answer."""
    for name in STORE_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


@dataclass(frozen=True)
class TlsFiles:
    ca: Path    # the test CA's certificate (what a client trusts)
    cert: Path  # the server's certificate, for 127.0.0.1 and localhost
    key: Path


def make_tls(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """A CA of this test and a server certificate it signs for `hosts` (IP or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rocforge test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.TraditionalOpenSSL,
                                            serialization.NoEncryption()))
    return files


# -- the real registry -----------------------------------------------------------------------

@dataclass
class RealRegistry:
    host: str          # 127.0.0.1:PORT
    base: str          # http(s)://127.0.0.1:PORT
    scheme: str        # oci or oci+http
    root: Path         # its storage
    log: Path
    start_seconds: float
    process: subprocess.Popen

    def store_url(self, repo: str) -> str:
        return f"{self.scheme}://{self.host}/{repo}"


def htpasswd_file(path: Path, users: dict[str, str]) -> Path:
    """An htpasswd file with bcrypt entries (what distribution accepts), made by `htpasswd -Bbn`."""
    lines = [subprocess.run(["htpasswd", "-Bbn", user, password], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
             for user, password in users.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def start_registry(directory: Path, *, tls: TlsFiles | None = None,
                   users: dict[str, str] | None = None) -> Iterator[RealRegistry]:
    """A real docker-registry on 127.0.0.1 (a free port it picks), stopped on exit."""
    directory = directory / f"registry-{uuid.uuid4().hex[:8]}"
    directory.mkdir(parents=True)
    root = directory / "storage"
    config = [
        "version: 0.1",
        "log:", "  level: info", "  accesslog:", "    disabled: true",
        "storage:", "  filesystem:", f"    rootdirectory: {root}", "  delete:", "    enabled: true",
        "  maintenance:", "    uploadpurging:", "      enabled: false",
        "http:", "  addr: 127.0.0.1:0", "  secret: rocforge-test-secret",
    ]
    if tls is not None:
        config += ["  tls:", f"    certificate: {tls.cert}", f"    key: {tls.key}"]
    if users:
        config += ["auth:", "  htpasswd:", "    realm: rocforge-test",
                   f"    path: {htpasswd_file(directory / 'htpasswd', users)}"]
    (directory / "config.yml").write_text("\n".join(config) + "\n")
    log = directory / "registry.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(["docker-registry", "serve", str(directory / "config.yml")],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={"PATH": "/usr/bin:/bin", "HOME": str(directory)})
    try:
        address = None
        while address is None:
            found = re.search(rb"listening on (127\.0\.0\.1:\d+)", log.read_bytes())
            if found:
                address = found.group(1).decode()
            elif process.poll() is not None or time.monotonic() - started > START_TIMEOUT:
                raise RuntimeError(f"docker-registry did not start: {log.read_text()[-2000:]}")
            else:
                time.sleep(0.01)
        scheme = "https" if tls else "http"
        yield RealRegistry(address, f"{scheme}://{address}", "oci" if tls else "oci+http", root,
                           log, time.monotonic() - started, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# -- a proxy that drops blobs mid-body ----------------------------------------------------------

class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client hanging up is normal here
        pass


def _serve(handler_class, tls: TlsFiles | None = None) -> tuple[ThreadingHTTPServer, threading.Thread]:
    server = _QuietServer(("127.0.0.1", 0), handler_class)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    return server, thread


class FaultProxy:
    """A plain-HTTP proxy in front of a plain-HTTP registry that passes everything through (and
    notes each request), except that the next `times` blob GETs send `after` bytes of the body
    and then close."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.drops: list[int] = []
        self.blob_gets: list[dict] = []
        self.seen: list[tuple[str, str]] = []  # (method, path) of every request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                proxy.seen.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port,
                                                      timeout=30)
                headers = dict(self.headers.items())  # Host too: the registry's Locations name the proxy
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                drop = None
                if self.command == "GET" and "/blobs/sha256:" in self.path:
                    proxy.blob_gets.append(dict(self.headers.items()))
                    if proxy.drops:
                        drop = proxy.drops.pop(0)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if drop is not None:
                    self.wfile.write(data[:drop])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                elif self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

        self.server, self.thread = _serve(Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def drop_blobs_after(self, after: int, times: int = 1) -> None:
        self.drops += [after] * times

    def store_url(self, repo: str) -> str:
        return f"oci+http://{self.host}/{repo}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- an in-memory fake registry whose answers a test replaces ------------------------------------

Answer = tuple[int, dict, bytes]
Route = Callable[["FakeRequest"], "Answer | None"]


@dataclass
class FakeRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    handler: BaseHTTPRequestHandler = field(repr=False)


class FakeRegistry:
    """A small OCI distribution server (blobs, manifests, tags, uploads; no referrers API) over
    HTTP or TLS.  `route(method, path_regex, fn)` puts `fn` before it: fn(request) returns
    (status, headers, body), or None to let the registry answer, or writes to
    `request.handler` itself and returns ("raw", ...) to misbehave at the socket."""

    def __init__(self, tls: TlsFiles | None = None, *, host: str = "127.0.0.1"):
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.tag_map: dict[str, str] = {}
        self.uploads: dict[str, bool] = {}
        self.routes: list[tuple[str, re.Pattern, Route]] = []
        self.requests: list[FakeRequest] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = FakeRequest(self.command, parts.path, parse_qs(parts.query),
                                      dict(self.headers.items()), body, self)
                fake.requests.append(request)
                answer = None
                for method, pattern, fn in list(fake.routes):
                    if method == self.command and pattern.search(parts.path):
                        answer = fn(request)
                        if answer is not None:
                            break
                if answer is None:
                    answer = fake._answer(request)
                if answer[0] == "raw":
                    return
                status, headers, data = answer
                self.send_response(status)
                headers = dict(headers)
                headers.setdefault("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

        self.server, self.thread = _serve(Handler, tls)
        port = self.server.server_address[1]
        self.host = f"{host}:{port}"
        self.base = f"{'https' if tls else 'http'}://{self.host}"
        self.scheme = "oci" if tls else "oci+http"

    def store_url(self, repo: str = "test/repo") -> str:
        return f"{self.scheme}://{self.host}/{repo}"

    def route(self, method: str, path_regex: str, fn: Route) -> None:
        self.routes.insert(0, (method, re.compile(path_regex), fn))

    def add_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest

    def _answer(self, r: FakeRequest) -> Answer:
        m = re.fullmatch(r"/v2/(.+)/(blobs|manifests)/([^/]+)", r.path)
        if r.path == "/v2/" or r.path == "/v2":
            return 200, {}, b"{}"
        if m and m.group(2) == "blobs" and r.method in ("GET", "HEAD"):
            data = self.blobs.get(m.group(3))
            if data is None:
                return 404, {"Content-Type": "application/json"}, b'{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}'
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", r.headers.get("Range", ""))
            if wanted and r.method == "GET":
                start = int(wanted.group(1))
                end = min(int(wanted.group(2) or len(data) - 1), len(data) - 1)
                return 206, {"Content-Range": f"bytes {start}-{end}/{len(data)}"}, data[start:end + 1]
            return 200, {"Content-Type": "application/octet-stream",
                         "Content-Length": str(len(data))}, data
        if m and m.group(2) == "manifests":
            ref = m.group(3)
            if r.method == "PUT":
                digest = "sha256:" + hashlib.sha256(r.body).hexdigest()
                self.manifests[digest] = (r.body, r.headers.get("Content-Type", ""))
                if not ref.startswith("sha256:"):
                    self.tag_map[ref] = digest
                return 201, {"Docker-Content-Digest": digest}, b""
            digest = self.tag_map.get(ref, ref)
            if digest not in self.manifests:
                return 404, {}, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
            data, media_type = self.manifests[digest]
            return 200, {"Content-Type": media_type, "Docker-Content-Digest": digest}, data
        if r.path.endswith("/blobs/uploads/") and r.method == "POST":
            session = uuid.uuid4().hex
            self.uploads[session] = True
            return 202, {"Location": f"/upload/{session}?_state=x"}, b""
        if r.path.startswith("/upload/") and r.method == "PUT":
            digest = r.query.get("digest", [""])[0]
            if "sha256:" + hashlib.sha256(r.body).hexdigest() != digest:
                return 400, {}, b'{"errors":[{"code":"DIGEST_INVALID","message":"digest invalid"}]}'
            self.blobs[digest] = r.body
            return 201, {"Location": f"/v2/x/blobs/{digest}"}, b""
        if r.path.endswith("/tags/list"):
            return 200, {"Content-Type": "application/json"}, json.dumps(
                {"name": "x", "tags": sorted(self.tag_map)}).encode()
        return 404, {}, b"404 page not found"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeRegistry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
