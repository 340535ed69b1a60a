"""A substitute store in an OCI registry: `oci://HOST[:PORT]/REPO` over TLS and
`oci+http://HOST[:PORT]/REPO` over plain HTTP (loopback, a private network).  oras-py's Registry
carries the requests and the registry's WWW-Authenticate handshake (bearer tokens, basic auth,
docker's credentials); this module bounds what it does, since a registry's answers are data from
the network: a timeout on every request, redirects followed only where that is safe, every
answer read up to a cap, and every failure one line."""

from __future__ import annotations

import contextlib
import http.client
import http.cookiejar
import json
import logging
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import BinaryIO, NoReturn
from urllib.parse import urlencode, urljoin, urlsplit

import oras.auth
import oras.auth.utils
import oras.container
import oras.provider
import requests
import urllib3

from rocforge_build import credentials
from rocforge_build.credentials import remember
from rocforge_build.errors import ConfigError, RocforgeError, UsageError
from rocforge_build.shellsafe import one_line
from rocforge_build.substitute import oci
from rocforge_build.substitute.oci import NotFound, StoreError, StoreUnreachable

USER_AGENT = "rocforge (+https://github.com/rocforge)"
USERNAME_ENV = credentials.USERNAME_ENV
PASSWORD_ENV = credentials.PASSWORD_ENV
CREDENTIALS_HINT = credentials.REGISTRY_CREDENTIALS_HINT
TLS_HINT = ("a registry with a private CA: point REQUESTS_CA_BUNDLE (or SSL_CERT_FILE) at the CA's "
            "certificate; a registry on a private network without TLS: oci+http://HOST:PORT/REPO")

MAX_REDIRECTS = 5
MAX_SMALL_ANSWER = oci.MAX_MANIFEST  # a manifest, a tags page, a referrers page, a token
TAGS_PAGE = 1000
MAX_TAGS = 100_000
MAX_PAGES = 200
_REDIRECT = (301, 302, 303, 307, 308)
# the distribution spec's repository name: path components of lowercase words and separators
_REPOSITORY = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]")
_TOKEN = re.compile(r"[\x21-\x7e]{1,16384}")


def _quiet_oras() -> None:
    """oras-py logs its own view of failures (through `logging`, to stderr); rocforge says each
    failure once, in its own line, so oras's records go nowhere."""
    log = logging.getLogger("oras.logger")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    log.propagate = False


def parse_url(url: str) -> tuple[str, str, str]:
    """(http or https, HOST[:PORT], REPO) of a registry store URL, or one UsageError line; a URL
    holding credentials is refused without being repeated."""
    if not isinstance(url, str) or len(url) > 2000 or any(ord(c) < 0x21 or ord(c) >= 0x7f for c in url):
        raise UsageError("registry store URL: empty, too long, or holds spaces, control or "
                         "non-ASCII characters")
    refused = credentials.url_refusal(url, "registry store URL")  # the one rule for every store URL
    if refused:
        raise UsageError(*refused)
    scheme, sep, rest = url.partition("://")
    http_scheme = {"oci": "https", "oci+http": "http"}.get(scheme)
    if not sep or http_scheme is None:
        raise UsageError(f"registry store URL {url[:200]!r}: oci://HOST[:PORT]/REPO (TLS) or "
                         "oci+http://HOST[:PORT]/REPO (plain HTTP)")
    netloc, _, path = rest.partition("/")
    host, colon, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
    if not colon:
        host, port = netloc, ""
    if not _HOST.fullmatch(host) or (colon and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536)):
        raise UsageError(f"registry store URL {url[:200]!r}: {netloc[:100]!r} is not HOST[:PORT]")
    repo = path.strip("/")
    if len(repo) > 255 or not _REPOSITORY.fullmatch(repo):
        raise UsageError(f"registry store URL {url[:200]!r}: {repo[:100]!r} is not a repository "
                         "name (lowercase words and digits separated by / . _ -)")
    return http_scheme, netloc.lower(), repo


def _tls_verify() -> bool | str:
    """What requests verifies a registry's certificate against: its default bundle, or
    REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (requests reads those itself), or SSL_CERT_FILE, which
    OpenSSL's own tools honour and requests does not."""
    if os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE"):
        return True
    return os.environ.get("SSL_CERT_FILE") or True


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port or {"https": 443, "http": 80}.get(scheme, -1)


def _shown_host(url: str) -> str:
    """The scheme and host[:port] of a URL a server gave, safe on one line."""
    parts = urlsplit(url)
    return one_line(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}")[:120]


def _not_again(url: str, read: set[str], where: str) -> None:
    """A next-page link to a page already read is a loop: stopped at once, not after MAX_PAGES."""
    if url in read:
        raise StoreError(f"{where}: the next page links back to a page already read (stopped)")
    read.add(url)


def _reason(exc: BaseException) -> str:
    """The innermost readable cause of a network exception ("connection refused"), not requests'
    nest of wrapper reprs."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 12:
        seen += 1
        if isinstance(current, OSError) and isinstance(current.strerror, str) and current.strerror:
            return one_line(current.strerror)[:160]
        following = getattr(current, "reason", None)
        if not isinstance(following, BaseException):
            following = current.__cause__ or current.__context__
        if following is None and current.args and isinstance(current.args[0], BaseException):
            following = current.args[0]
        if following is None:
            break
        current = following
    text = one_line(str(current if current is not None else exc))
    text = re.sub(r"<[^>]*object at 0x[0-9a-f]+>:?", "", text).strip()
    return (text or type(exc).__name__)[:160]


@contextlib.contextmanager
def _network_errors(where: str, timeout: float, transfer: oci.Transfer | None = None) -> Iterator[None]:
    """Every way a request or a streamed read fails, as one StoreUnreachable line; a wait cut
    short by the transfer's deadline says so (the limit and its key)."""
    try:
        yield
    except RocforgeError:
        raise
    except requests.exceptions.SSLError as exc:
        raise StoreUnreachable(f"{where}: TLS failed: {_reason(exc)}", TLS_HINT) from None
    except (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError):
        if transfer is not None and transfer.expired():
            raise transfer.expired_error() from None
        raise StoreUnreachable(f"{where}: no answer within {timeout:g} s",
                               "the registry is down or overloaded; try again later") from None
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
            http.client.HTTPException, OSError) as exc:
        raise StoreUnreachable(f"{where}: connection failed or dropped ({_reason(exc)})") from None


class _LargeBlocks(requests.adapters.HTTPAdapter):
    """urllib3 sends a request body in blocks of 1 MiB, not its default 16 KiB: a layer of
    hundreds of MB goes out in a few hundred writes (docs/measurements/substitutes.md measured
    the push against curl with both)."""

    def init_poolmanager(self, *args, **kwargs):
        kwargs["blocksize"] = oci.CHUNK
        super().init_poolmanager(*args, **kwargs)


class _BoundedSession(requests.Session):
    """requests' Session as a registry client needs it: a connect and read timeout on every
    request (oras-py's token requests too), each ending by the store's transfer's deadline,
    redirects left to the caller, no ~/.netrc (a registry's credentials come from rocforge's
    variables or docker's), and an answer not asked to stream read whole only up to
    MAX_SMALL_ANSWER bytes, within the transfer's deadline and at its least rate."""

    def __init__(self, timeout: float, where: str):
        super().__init__()
        self.timeout = timeout
        self.where = where
        self.transfer = None  # set by RegistryStore: (what) -> the oci.Transfer under way
        self.headers["User-Agent"] = USER_AGENT
        self.headers["Accept-Encoding"] = "identity"  # a blob's bytes are its digest's bytes
        self.auth = _no_netrc
        for prefix in ("http://", "https://"):
            self.mount(prefix, _LargeBlocks())

    def current(self, what: str) -> oci.Transfer | None:
        return self.transfer(what) if self.transfer is not None else None

    def request(self, method, url, *args, **kwargs):
        stream = kwargs.pop("stream", False)
        what = f"{method} {_shown_path(url)}"
        transfer = self.current(what)
        if transfer is not None and transfer.expired():
            raise transfer.expired_error()
        wait = transfer.timeout(self.timeout) if transfer is not None else self.timeout
        kwargs["timeout"] = (wait, wait)
        kwargs["allow_redirects"] = False
        response = super().request(method, url, *args, stream=True, **kwargs)
        if not stream:
            _read_small(response, self.timeout, f"{self.where}: {what}", transfer)
        return response


def _no_netrc(request):
    """An auth hook that adds nothing: its presence keeps requests from reading ~/.netrc."""
    return request


def _shown_path(url: str) -> str:
    return one_line(urlsplit(url).path)[:160]


def _read_small(response: requests.Response, timeout: float, where: str,
                transfer: oci.Transfer | None) -> None:
    """Read a small answer's body into `response.content`: at most MAX_SMALL_ANSWER bytes, under
    the transfer's whole deadline and least rate (download_policy's, as every download), each
    read's wait ending by that deadline, so a registry trickling bytes cannot hold rocforge."""
    pace = transfer.pace() if transfer is not None else None
    sock = oci.socket_of(response.raw)
    parts: list[bytes] = []
    got = 0
    ok = False
    try:
        raw = response.raw
        while True:
            if sock is not None and transfer is not None:
                sock.settimeout(transfer.timeout(timeout))
            chunk = raw.read1(65536) if hasattr(raw, "read1") else raw.read(65536)
            if not chunk:
                break
            got += len(chunk)
            if got > MAX_SMALL_ANSWER:
                raise StoreError(f"{where}: an answer past the {MAX_SMALL_ANSWER}-byte cap")
            parts.append(chunk)
            why = pace.add(len(chunk)) if pace is not None else None
            if why is not None:
                raise transfer.stop(why)
        response._content = b"".join(parts)
        response._content_consumed = True
        ok = True
    finally:
        if ok:
            response.raw.release_conn()
        else:
            response.close()


class _TokenAuth(oras.auth.TokenAuth):
    """oras-py's token handshake, with docker's credential helpers run under a timeout (oras-py
    waits for a helper without one) and their answers read as data."""

    def __init__(self, *, timeout: float, where: str):
        super().__init__()
        self.helper_timeout = timeout
        self.where = where

    def _get_auth_from_creds_store(self, suffix: str, hostname: str) -> str | None:
        if not isinstance(suffix, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", suffix):
            raise ConfigError(f"docker's config.json names a credential helper {one_line(suffix)[:60]!r} "
                              "that is not a program name")
        program = shutil.which(f"docker-credential-{suffix}")
        if program is None:
            return None
        from rocforge_build import proc

        try:  # through proc: a deadline, and the helper's children stopped with it
            helper = proc.run([program, "get"], check=False, input=hostname, timeout=self.helper_timeout,
                              stderr=subprocess.DEVNULL, group=True)
        except proc.ToolTimedOut:
            raise StoreUnreachable(f"{self.where}: docker-credential-{suffix} did not answer within "
                                   f"{self.helper_timeout:g} s") from None
        except RocforgeError as exc:
            raise ConfigError(f"docker-credential-{suffix}: {exc.message}") from None
        except OSError as exc:
            raise ConfigError(f"docker-credential-{suffix}: {_reason(exc)}") from None
        if helper.returncode != 0:
            return None  # the helper holds nothing for this host
        try:
            answer = json.loads(helper.stdout[:65536])
            username, secret = answer["Username"], answer["Secret"]
        except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
            raise ConfigError(f"docker-credential-{suffix} answered something that is not "
                              "credentials") from None
        if not (isinstance(username, str) and isinstance(secret, str) and secret):
            raise ConfigError(f"docker-credential-{suffix} answered something that is not credentials")
        remember(secret)
        basic = oras.auth.utils.get_basic_auth(username, secret)
        remember(basic)
        return basic


class _Registry(oras.provider.Registry):
    """oras-py's registry client held to rocforge's rules (see `do_request`)."""

    def __init__(self, *, http_scheme: str, netloc: str, repo: str, timeout: float, where: str):
        _quiet_oras()
        super().__init__(hostname=netloc, insecure=http_scheme == "http", tls_verify=_tls_verify(),
                         auth_backend="token")
        self.session.close()
        self.session = _BoundedSession(timeout, where)
        self.session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self.auth = _TokenAuth(timeout=timeout, where=where)
        self.auth.session = self.session
        self.auth.prefix = http_scheme
        self.auth._tls_verify = self._tls_verify
        self.timeout = timeout
        self.where = where
        self.repo = repo
        self.origin = _origin(f"{http_scheme}://{netloc}/")
        self.blob_path = f"/v2/{repo}/blobs/sha256:"
        self.authorization: str | None = None
        self.credentials_loaded = False

    def do_request(self, url: str, method: str = "GET", data=None, headers: dict | None = None,
                   json=None, stream: bool = False) -> requests.Response:
        """One request to the registry, answering its authentication challenge, without
        following a redirect automatically.  A redirect to the registry itself (same scheme,
        host and port) is followed, at most MAX_REDIRECTS times; one to anywhere else is refused,
        except one: a blob GET (or HEAD) from a TLS registry may go to another https host,
        without the Authorization header, since ghcr.io and registries kept in S3 serve blobs
        from a storage host, and the blob's digest (checked by oci.Store) makes those bytes as
        safe as the registry's own.  Nothing goes from https to http."""
        headers = dict(headers or {})
        first = url
        blob_get = method in ("GET", "HEAD") and urlsplit(url).path.startswith(self.blob_path)
        on_registry = True
        body_start = data.tell() if hasattr(data, "seek") else None

        def rewind() -> None:
            if body_start is not None:
                data.seek(body_start)

        for _ in range(MAX_REDIRECTS + 1):
            rewind()
            with _network_errors(self.where, self.timeout, self.session.current(method)):
                response = self._send(url, method, data, headers, json, stream, on_registry, rewind)
            if response.status_code not in _REDIRECT:
                return response
            location = response.headers.get("Location", "").strip()
            response.close()
            if not location:
                raise StoreError(f"{self.where}: HTTP {response.status_code} with no Location")
            target = urljoin(url, location)
            if on_registry and _origin(target) == self.origin:
                pass
            elif blob_get and self.origin[0] == "https" and _origin(target)[0] == "https":
                on_registry = False
            else:
                raise StoreError(
                    f"{self.where}: {_shown_host(first)} redirects {method} to {_shown_host(target)}; "
                    "refused (a registry's redirects are followed only to itself, and a blob's "
                    "from a TLS registry only to another https host)")
            if method not in ("GET", "HEAD") and response.status_code not in (307, 308):
                raise StoreError(f"{self.where}: HTTP {response.status_code} redirects a {method}; "
                                 "refused")
            url = target
        raise StoreError(f"{self.where}: more than {MAX_REDIRECTS} redirects (stopped)")

    def _send(self, url, method, data, headers, json, stream, authorize: bool,
              rewind) -> requests.Response:
        sent = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        if authorize and self.authorization:
            sent["Authorization"] = self.authorization
        response = self.session.request(method, url, data=data, json=json, headers=sent,
                                        stream=stream, verify=self._tls_verify)
        if response.status_code != 401 or not authorize:
            return response
        self._answer_challenge(response)
        response.close()
        rewind()
        sent["Authorization"] = self.authorization
        response = self.session.request(method, url, data=data, json=json, headers=sent,
                                        stream=stream, verify=self._tls_verify)
        if response.status_code == 401:
            response.close()
            whose = "the credentials" if getattr(self.auth, "_basic_auth", None) else "anonymous access"
            raise StoreUnreachable(f"{self.where}: the registry refused {whose} (HTTP 401)",
                                   CREDENTIALS_HINT)
        return response

    def _answer_challenge(self, response: requests.Response) -> None:
        """Set `authorization` for the registry's WWW-Authenticate challenge: Basic with the
        credentials, or Bearer with a token from the realm oras-py asks (with the credentials,
        or anonymously without)."""
        challenge = one_line(response.headers.get("WWW-Authenticate", ""))
        scheme = challenge.split(" ", 1)[0].lower() if challenge else ""
        self._load_credentials()
        basic = getattr(self.auth, "_basic_auth", None)
        if scheme == "basic":
            if not basic:
                raise StoreUnreachable(f"{self.where}: the registry asks for a username and password",
                                       CREDENTIALS_HINT)
            if self.authorization == f"Basic {basic}":
                raise StoreUnreachable(f"{self.where}: the registry refused the credentials "
                                       "(HTTP 401)", CREDENTIALS_HINT)
            self.authorization = f"Basic {basic}"
            _remember_basic(basic)
        elif scheme == "bearer":
            realm = oras.auth.utils.parse_auth_header(challenge).realm or ""
            realm_scheme = urlsplit(realm).scheme.lower()
            if realm_scheme not in ("http", "https") or (self.origin[0] == "https" and realm_scheme != "https"):
                wanted = "an https" if self.origin[0] == "https" else "an http(s)"
                raise StoreUnreachable(f"{self.where}: the registry's token service "
                                       f"{one_line(realm)[:120]!r} is not {wanted} URL; refused")
            try:
                answered, changed = self.auth.authenticate_request(response, {}, refresh=True)
            except RocforgeError:
                raise
            except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
                raise StoreUnreachable(f"{self.where}: the token service {_shown_host(realm)} "
                                       "answered something that is not a token") from None
            token = answered.get("Authorization", "") if changed else ""
            if not changed or not _TOKEN.fullmatch(token.removeprefix("Bearer ")):
                raise StoreUnreachable(
                    f"{self.where}: the token service {_shown_host(realm)} gave no token"
                    + (" for these credentials" if basic else " without credentials"),
                    CREDENTIALS_HINT)
            self.authorization = token
            remember(token.removeprefix("Bearer "))
        else:
            raise StoreUnreachable(f"{self.where}: HTTP 401 with no authentication scheme rocforge "
                                   f"knows ({scheme[:20]!r})", CREDENTIALS_HINT)

    def _load_credentials(self) -> None:
        """The credentials for this registry: rocforge's two variables when set, else docker's
        config.json (`docker_config`) and its credential helpers, through oras-py."""
        if self.credentials_loaded:
            return
        self.credentials_loaded = True
        username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
        if username or password:
            if not (username and password):
                raise UsageError(f"{USERNAME_ENV} and {PASSWORD_ENV} go together: only one is set")
            remember(password)
            self.auth.set_basic_auth(username, password)
            remember(getattr(self.auth, "_basic_auth", None))
            return
        try:
            # oras-py's own loader also merges ~/.docker/config.json into any config it is given,
            # which docker does not do when DOCKER_CONFIG is set: rocforge reads docker's one file
            self.auth._auth_config = docker_config()
            self.auth.load_configs(oras.container.Container(f"{self.hostname}/{self.repo}"))
            _remember_basic(getattr(self.auth, "_basic_auth", None))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ConfigError(f"docker's credentials for {self.hostname} (config.json or its "
                              f"credential helper) could not be read ({type(exc).__name__})",
                              CREDENTIALS_HINT) from None



MAX_DOCKER_CONFIG = 1 << 20


def _remember_basic(basic: object) -> None:
    """A Basic credential (base64 of user:password, docker's `auth`) and its password, for
    credentials.py: a registry that repeats either in an answer has it blanked."""
    if not isinstance(basic, str) or not basic:
        return
    remember(basic)
    import base64
    import binascii

    try:
        _, _, password = base64.b64decode(basic, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, ValueError):
        return
    remember(password)


def docker_config() -> dict:
    """Docker's credentials as docker itself finds them: $DOCKER_CONFIG/config.json when the
    variable is set, else ~/.docker/config.json (docs.docker.com, "docker CLI configuration
    file"); its `auths`, `credsStore` and `credHelpers`, each of the type docker writes, in the
    shape oras-py's auth reads.  No file is no credentials."""
    directory = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    path = os.path.join(directory, "config.json")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_DOCKER_CONFIG + 1)
    except FileNotFoundError:
        return {"auths": {}, "credsStore": None, "credHelpers": {}}
    if len(data) > MAX_DOCKER_CONFIG:
        raise ValueError("config.json is larger than 1 MiB")
    cfg = json.loads(data)
    if not isinstance(cfg, dict):
        raise TypeError("config.json is not an object")
    auths, helpers, store = cfg.get("auths", {}), cfg.get("credHelpers", {}), cfg.get("credsStore")
    if not (isinstance(auths, dict) and all(isinstance(v, dict) for v in auths.values())
            and isinstance(helpers, dict) and all(isinstance(v, str) for v in helpers.values())
            and (store is None or isinstance(store, str))):
        raise TypeError("config.json's auths, credHelpers or credsStore is not of docker's types")
    return {"auths": auths, "credsStore": store, "credHelpers": helpers}

class _BlobStream:
    """A blob's body as a binary stream: reads hand over what has arrived (so a dropped
    connection loses little), each bounded by the read timeout and, once a Transfer sets
    `deadline` (oci._PacedReader), ending by it; each failure one line."""

    deadline = None

    def __init__(self, response: requests.Response, where: str, timeout: float):
        self.response = response
        self.where = where
        self.timeout = timeout
        self.sock = oci.socket_of(response.raw)

    def read(self, size: int = -1) -> bytes:
        if self.sock is not None and self.deadline is not None:
            self.sock.settimeout(self.deadline.timeout(self.timeout))
        with _network_errors(self.where, self.timeout):
            if size is None or size < 0:
                return self.response.raw.read(decode_content=False)
            return self.response.raw.read1(size, decode_content=False)

    def readinto(self, buffer: memoryview) -> int:
        """What has arrived, into `buffer`: http.client's own readinto under urllib3 (no bytes
        object per read), which keeps to the answer's Content-Length; urllib3's read1 where the
        layout differs."""
        if self.sock is not None and self.deadline is not None:
            self.sock.settimeout(self.deadline.timeout(self.timeout))
        with _network_errors(self.where, self.timeout):
            inner = getattr(self.response.raw, "_fp", None)
            if isinstance(inner, http.client.HTTPResponse):
                count = inner.readinto(buffer)
                self.ended = not count
                return count
            chunk = self.response.raw.read1(len(buffer), decode_content=False)
            buffer[:len(chunk)] = chunk
            self.ended = not chunk
            return len(chunk)

    ended = False  # the answer's body was read to its end (the connection can serve another)

    def abort(self) -> None:
        """End a read under way in another thread (a parallel pull that stops)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)

    def discard(self, count: int) -> None:
        while count > 0:
            chunk = self.read(min(count, oci.CHUNK))
            if not chunk:
                raise StoreUnreachable(f"{self.where}: ended before the resumed position")
            count -= len(chunk)


class RegistryStore(oci.Store):
    """An OCI registry as a substitute store (see the module docstring); referrers through the
    registry's referrers API where it has one (OCI 1.1), else through the tag schema."""

    def __init__(self, url: str, *, timeout: float = 30.0, policy=None):
        http_scheme, netloc, repo = parse_url(url)
        self.policy = policy  # download_policy.RetryPolicy; None: the configuration's [download]
        self.url = f"{'oci' if http_scheme == 'https' else 'oci+http'}://{netloc}/{repo}"
        self.timeout = timeout
        self.base = f"{http_scheme}://{netloc}/v2/{repo}"
        self.registry = _Registry(http_scheme=http_scheme, netloc=netloc, repo=repo,
                                  timeout=timeout, where=self.url)
        self.registry.session.transfer = self.current_transfer
        self.subject_acknowledged: set[str] = set()
        self.referrers_api = True  # until the registry shows it has none

    def close(self) -> None:
        self.registry.session.close()

    # -- the primitives oci.Store checks -----------------------------------------------------
    @contextlib.contextmanager
    def _open_blob(self, digest: str, start: int = 0) -> Iterator[BinaryIO]:
        oci.check_digest(digest, self.url)
        where = f"{self.url}: blob {digest[:19]}"
        headers = {"Range": f"bytes={start}-"} if start else {}
        response = self.registry.do_request(f"{self.base}/blobs/{digest}", "GET", headers=headers,
                                            stream=True)
        try:
            skip = 0
            if response.status_code == 206 and start:
                content_range = response.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise StoreError(f"{where}: asked from byte {start}, answered "
                                     f"{one_line(content_range)[:60]!r}")
            elif response.status_code == 200:
                skip = start
            else:
                self._refuse(response, where)
            stream = _BlobStream(response, where, self.timeout)
            stream.discard(skip)
            yield stream  # type: ignore[misc]
        finally:
            response.close()

    ranged = True

    @contextlib.contextmanager
    def _open_range(self, digest: str, start: int, end: int, size: int) -> Iterator[BinaryIO]:
        oci.check_digest(digest, self.url)
        where = f"{self.url}: blob {digest[:19]}"
        response = self.registry.do_request(f"{self.base}/blobs/{digest}", "GET",
                                            headers={"Range": f"bytes={start}-{end}"}, stream=True)
        stream = None
        try:
            if response.status_code == 200:
                raise oci.RangeRefused(f"{where}: answered a range request with the whole blob")
            if response.status_code != 206:
                self._refuse(response, where)
            oci.check_range(response.headers.get("Content-Range", ""),
                            response.headers.get("Content-Length"), start, end, size, where)
            stream = _BlobStream(response, where, self.timeout)
            yield stream  # type: ignore[misc]
        finally:
            if stream is not None and stream.ended:
                response.raw.release_conn()  # read to its end: the connection serves the next range
            else:
                response.close()

    def has_blob(self, digest: str) -> bool:
        oci.check_digest(digest, self.url)
        response = self.registry.do_request(f"{self.base}/blobs/{digest}", "HEAD")
        if response.status_code == 200:
            return True
        if response.status_code == 404:
            return False
        self._refuse(response, f"{self.url}: blob {digest[:19]}")

    def _put_blob(self, fh: BinaryIO, desc: oci.Descriptor) -> None:
        where = f"{self.url}: pushing blob {desc.digest[:19]}"
        response = self.registry.do_request(f"{self.base}/blobs/uploads/", "POST",
                                            headers={"Content-Length": "0"})
        if response.status_code != 202:
            self._refuse(response, where)
        location = response.headers.get("Location", "").strip()
        upload = urljoin(f"{self.base}/blobs/uploads/", location)
        if not location or _origin(upload) != self.registry.origin:
            raise StoreError(f"{where}: the upload's Location {_shown_host(upload)!s} is not the "
                             "registry; refused")
        upload += ("&" if urlsplit(upload).query else "?") + urlencode({"digest": desc.digest})
        response = self.registry.do_request(upload, "PUT", data=fh, headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(desc.size)})
        if response.status_code not in (201, 204):
            self._refuse(response, where)

    def _get_manifest(self, ref: str) -> tuple[bytes, str]:
        self._check_ref(ref)
        response = self.registry.do_request(f"{self.base}/manifests/{ref}", "GET",
                                            headers={"Accept": f"{oci.MANIFEST}, {oci.INDEX}"})
        if response.status_code != 200:
            self._refuse(response, f"{self.url}: manifest {ref[:80]}", missing=f"manifest {ref[:80]}")
        media_type = response.headers.get("Content-Type", "").split(";", 1)[0].strip()
        return response.content, media_type

    def _put_manifest(self, data: bytes, media_type: str, ref: str) -> None:
        self._check_ref(ref)
        response = self.registry.do_request(f"{self.base}/manifests/{ref}", "PUT", data=data,
                                            headers={"Content-Type": media_type})
        if response.status_code not in (200, 201, 204):
            self._refuse(response, f"{self.url}: pushing manifest {ref[:80]}")
        if response.headers.get("OCI-Subject"):
            self.subject_acknowledged.add(oci.sha256_digest(data))

    def _pages(self, url: str, accept: str, where: str, what: str) -> Iterator[tuple[int, requests.Response]]:
        """Each page of a paginated answer (tags, referrers) in order, following the `Link`
        header's next page on this registry; a link back to a page read, or more than
        MAX_PAGES pages, stops with one line."""
        read = {url}
        for page in range(MAX_PAGES):
            response = self.registry.do_request(url, "GET", headers={"Accept": accept})
            yield page, response
            url = self._next_page(response, url, where)
            if url is None:
                return
            _not_again(url, read, where)
        raise StoreError(f"{where}: more than {MAX_PAGES} pages of {what} (stopped)")

    def _tags(self) -> list[str]:
        where = f"{self.url}: tags"
        found: list[str] = []
        for page, response in self._pages(f"{self.base}/tags/list?n={TAGS_PAGE}", "application/json",
                                          where, "tags"):
            if response.status_code == 404 and page == 0:
                return []  # a repository nothing was pushed to yet
            if response.status_code != 200:
                self._refuse(response, where)
            names = oci.json_object(response.content, where).get("tags")
            if names is None:
                names = []
            if not isinstance(names, list) or not all(isinstance(n, str) and oci.TAG.fullmatch(n)
                                                      for n in names):
                raise StoreError(f"{where}: the tags list is not a list of OCI tags")
            found += names
            if len(found) > MAX_TAGS:
                raise StoreError(f"{where}: more than {MAX_TAGS} tags (stopped)")
        return found

    def _native_referrers(self, digest: str) -> list[oci.Descriptor] | None:
        """The referrers API's answer; None once the registry has shown it has none (the spec
        forbids a 404 from a registry that has one), so the tag schema is asked alone after."""
        if not self.referrers_api:
            return None
        where = f"{self.url}: referrers of {digest[:19]}"
        url = f"{self.base}/referrers/{oci.check_digest(digest, self.url)}"
        found: list[oci.Descriptor] = []
        for page, response in self._pages(url, oci.INDEX, where, "referrers"):
            media_type = response.headers.get("Content-Type", "").split(";", 1)[0].strip()
            if page == 0 and (response.status_code in (404, 405) or
                              (response.status_code == 200 and media_type != oci.INDEX)):
                self.referrers_api = False  # distribution 2.8: the tag schema holds them
                return None
            if response.status_code != 200 or media_type != oci.INDEX:
                self._refuse(response, where)
            found += oci.parse_index(response.content, where)
            if len(found) > oci.MAX_REFERRERS:
                raise StoreError(f"{where}: more than {oci.MAX_REFERRERS} referrers (stopped)")
        return found

    def _referrers_native_on_push(self, man: oci.Manifest) -> bool:
        return man.digest in self.subject_acknowledged

    # -- removal (`rocforge store gc`): the distribution spec's DELETE by digest ----------------
    def _delete(self, path: str, what: str) -> None:
        where = f"{self.url}: removing {what}"
        response = self.registry.do_request(f"{self.base}/{path}", "DELETE")
        if response.status_code in (200, 202, 204, 404):
            response.close()
            return
        if response.status_code == 405:
            detail = _registry_error(response)
            response.close()
            raise StoreError(f"{self.url}: the registry refuses deletion: HTTP 405{detail}",
                             "distribution (docker-registry): set storage.delete.enabled: "
                             "true in its config.yml and restart it; other registries: their own "
                             "retention settings")
        self._refuse(response, where)

    def delete_manifest(self, digest: str, size: int) -> None:
        self._delete(f"manifests/{oci.check_digest(digest, self.url)}", f"manifest {digest[:19]}")

    def delete_blob(self, digest: str) -> None:
        self._delete(f"blobs/{oci.check_digest(digest, self.url)}", f"blob {digest[:19]}")

    def delete_tag(self, tag: str) -> None:
        """A tag goes with the manifest it names (distribution 2.8 has no tag deletion)."""
        try:
            data, _ = self._get_manifest(oci.check_tag(tag, self.url))
        except NotFound:
            return
        self.delete_manifest(oci.sha256_digest(data), len(data))

    # -- helpers -----------------------------------------------------------------------------
    def _check_ref(self, ref: str) -> None:
        if ref.startswith("sha256:"):
            oci.check_digest(ref, self.url)
        else:
            oci.check_tag(ref, self.url)

    def _next_page(self, response: requests.Response, url: str, where: str) -> str | None:
        """The next page of a paginated answer (the Link header's rel="next"), on the registry."""
        link = response.headers.get("Link")
        if not link:
            return None
        try:
            target = response.links.get("next", {}).get("url")
        except (ValueError, AttributeError):
            target = None
        if not target:
            return None
        following = urljoin(url, target)
        if _origin(following) != self.registry.origin:
            raise StoreError(f"{where}: the next page is on {_shown_host(following)}; refused")
        return following

    def _refuse(self, response: requests.Response, where: str, *,
                missing: str | None = None) -> NoReturn:
        """One line for an answer that is not the one asked for."""
        code = response.status_code
        detail = _registry_error(response)
        response.close()
        if code == 404:
            raise NotFound(f"{self.url}: no {missing}" if missing else f"{where}: not found (HTTP 404)")
        if code in (401, 403):
            raise StoreUnreachable(f"{where}: access refused (HTTP {code}){detail}", CREDENTIALS_HINT)
        if code == 429 or code >= 500:
            raise StoreUnreachable(f"{where}: HTTP {code}{detail}", "the registry is overloaded or "
                                   "failing; try again later")
        speaks_tls = (code == 400 and self.registry.origin[0] == "http"
                      and b"HTTPS" in (response._content or b"")[:200])
        raise StoreError(f"{where}: HTTP {code}{detail}",
                         "the registry speaks TLS: oci://HOST[:PORT]/REPO" if speaks_tls else None)


def _registry_error(response: requests.Response) -> str:
    """The registry's own words for a refusal (the distribution spec's errors[0]), when it read
    as a small answer; else nothing."""
    if not response._content_consumed or not response._content:
        return ""
    try:
        doc = json.loads(response._content[:65536])
        first = doc["errors"][0]
        text = f"{first.get('code', '')}: {first.get('message', '')}"
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        return ""
    return f" ({one_line(text)[:160]})"
