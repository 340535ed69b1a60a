"""THE download: every byte rocforge fetches over HTTP(S) (or from a file:// mirror) comes here.

- Streams to `<dest>.part` and renames onto `dest` only when complete and verified, so `dest` is
  never half-written.  An interrupted `.part` is resumed with an HTTP `Range` request carrying
  `If-Range` (the ETag or Last-Modified of the response that began it, kept beside the part in
  `<dest>.part.validator`): a file replaced on the server comes back whole and is never spliced
  onto the old bytes; a part with no validator is started over.  A server that ignores the
  range gets a fresh start; a 416 on an already complete part is accepted.  A complete `dest`
  of the expected size (or sha256) is reused without a request.
- Reading stops at the advertised size (the server's length, else the listing's): a body that
  never ends cannot fill the disk.
- Retries with exponential backoff on connection errors, dropped streams, 5xx, 408 and 429
  (`Retry-After` honoured, capped), saying so on stderr; never on other 4xx, and never when
  the host name does not resolve (offline: one line at once).
- A connection slower than `min_rate` bytes/s over `rate_window` seconds (or silent for
  `read_timeout`) is dropped and retried (resuming).  Whatever the pace, the whole fetch (every
  try and wait) ends at `deadline` seconds (`listing_deadline` for a listing or `.sha256`): a
  trickle just above `min_rate`, or a byte every few seconds, cannot hold an install forever.
  Every socket read waits at most until the deadline.  `download_policy.py` holds the policy,
  the deadline and the retry loop; its `policy_from_config` reads these from the `[download]`
  config table (ranges checked in config.py); with no policy given, the
  configuration's is used.
- Size caps: a download is never read past the size its server announces or its listing
  declares (a disagreement between the two is refused before reading); one with neither stops
  at `max_unsized_bytes`; a listing or `.sha256` stops at `max_listing_bytes` (exit 6).
- Redirects are followed here, not by requests: at most MAX_REDIRECTS, and only to http(s): a
  server's `Location: file:///...` (or ftp:, data:, javascript:) is refused in one line, exit 6
  (the server's answer is at fault, as with an HTTP 404).  The URL given by the user or the
  configuration must be http(s) or file: (exit 2 otherwise).
- The sha256 is always computed (and returned); verified when given. The size is checked against
  `expected_size` and the server's own length.  A mismatch deletes the file; if the bytes came
  partly from a resumed `.part` the whole file is fetched once more before giving up.
- A rich progress bar only when asked for and stderr is a terminal (`progress.DownloadProgress`).
- Running out of disk deletes the partial file and raises `DiskFullError` (nothing half-written).

`requests` and `rich` are imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.download_policy import (
    Deadline,
    Pace,
    Retry,
    RetryPolicy,
    policy_or_config,
    requests_errors,
    with_retries,
)
from rocforge_build.errors import DiskFullError, IntegrityError, NetworkError, UsageError
from rocforge_build.progress import DownloadProgress

CHUNK = 1 << 20  # file reads and hashing
NET_CHUNK = 1 << 17  # network reads: small enough that a dropped stream loses little
USER_AGENT = "rocforge (+https://github.com/rocforge)"
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# S3 and CloudFront answer 403 for a missing key when listing is not allowed
_MISSING_STATUS = frozenset({403, 404, 410})
_REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 10  # curl's --max-redirs default is 50, browsers stop near 20: a mirror needs 1-2
_FETCHED_SCHEMES = ("http", "https")


class HttpStatusError(NetworkError):
    """The server answered with a final (non-retryable, or retries exhausted) HTTP status."""

    def __init__(self, message: str, hint: str | None, status: int):
        super().__init__(message, hint)
        self.status = status


@dataclass(frozen=True)
class DownloadResult:
    path: Path
    sha256: str
    size: int
    resumed_from: int = 0  # bytes taken from an earlier `.part`
    attempts: int = 1


# -- public API ------------------------------------------------------------------------------------

def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    expected_size: int | None = None,
    progress: bool = True,
    session=None,
    policy: RetryPolicy | None = None,
    resume: bool = True,
) -> DownloadResult:
    """Fetch `url` to `dest`; see the module docstring for the guarantees."""
    dest = Path(dest)
    _check_scheme(url)
    policy = policy_or_config(policy)
    want = sha256.lower().strip() if sha256 else None
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_file() and (want or expected_size is not None):
        # `dest` only ever appears complete (renamed from a verified part): an install that was
        # interrupted while unpacking finds its archive here and does not fetch it again
        size, digest = _hash_file(dest)
        if (digest == want if want else True) and (expected_size is None or size == expected_size):
            return DownloadResult(dest, digest, size, attempts=0)
    part = part_path(dest)
    if not resume:
        _discard_part(part)
    attempts_total = 0
    deadline = Deadline.start(policy.deadline, "download.deadline")
    for fresh_retry in (False, True):
        result, attempts = _fetch_to_part(url, part, expected_size, progress, session, policy,
                                          deadline)
        attempts_total += attempts
        problem = _integrity_problem(result, want, expected_size)
        if problem is None:
            os.replace(part, dest)
            _unlink(validator_path(part))
            return DownloadResult(dest, result.sha256, result.size, result.resumed_from,
                                  attempts_total)
        _discard_part(part)
        if result.resumed_from == 0 or fresh_retry:
            raise IntegrityError(
                f"{_name(url)}: {problem}; the file was deleted",
                "the published file may have been replaced mid-download or the mirror is "
                "corrupt: try again later, or check the URL and checksum you gave",
            )
        # the bytes partly came from an old `.part`: fetch the whole file once more
    raise AssertionError("unreachable")  # pragma: no cover


def get_text(url: str, *, session=None, policy: RetryPolicy | None = None,
             missing_ok: bool = False, max_bytes: int | None = None) -> str | None:
    """A small text resource (a listing page, a `.sha256` file) with the same retry policy,
    within `policy.listing_deadline` and read up to `max_bytes` (at most
    `policy.max_listing_bytes`): a larger answer is a NetworkError, what was read is dropped.

    file:// URLs ending in `/` read the directory's `index.html` (a local mirror of a CDN page).
    With `missing_ok`, a 404/403/410 (or a missing local file) returns None instead of raising.
    """
    _check_scheme(url)
    policy = policy_or_config(policy)
    cap, cap_key = policy.max_listing_bytes, "download.max_listing_bytes"
    if max_bytes is not None and max_bytes < cap:
        cap, cap_key = max_bytes, None
    if url.startswith("file:"):
        return _read_local_text(url, cap, cap_key, missing_ok)
    sess = session or _session()
    deadline = Deadline.start(policy.listing_deadline, "download.listing_deadline")
    _MISS = object()

    def once():
        resp = _get(sess, url, policy, deadline)
        with resp:
            if resp.status_code in _MISSING_STATUS and missing_ok:
                return _MISS
            if resp.status_code in RETRY_STATUS:
                raise Retry(f"HTTP {resp.status_code}", resp.headers.get("Retry-After"))
            if resp.status_code >= 400:
                raise _status_error(url, resp.status_code)
            declared = _declared_length(resp)
            if declared is not None and declared > cap:
                raise _too_big(url, cap, cap_key, f"it announces {declared} bytes")
            data = bytearray()
            for chunk in _paced(_chunks(resp, policy, deadline), policy, deadline):
                data += chunk
                if len(data) > cap:
                    raise _too_big(url, cap, cap_key, "it sent more")
            return bytes(data).decode(resp.encoding or "utf-8", errors="replace")

    ok, value, attempts, expired = with_retries(policy, once, _name(url), deadline)
    if ok:
        return None if value is _MISS else value
    raise NetworkError(
        f"could not fetch {url}: "
        + (f"stopped at {deadline.words()} after " if expired else "failed after ")
        + f"{_tries(attempts)}: {value}",
        "check your network connection or proxy; if the host moved, point rocforge at the new "
        "one with `rocforge config set` or `--index URL`"
        + (f"; a slow link may raise the limit: rocforge config set {deadline.key} SECONDS"
           if expired else ""),
    )


def _read_local_text(url: str, cap: int, cap_key: str | None, missing_ok: bool) -> str | None:
    """get_text of a file:// URL (a directory: its index.html), with the same cap."""
    path = _file_url_path(url)
    if path.is_dir():
        path = path / "index.html"
    try:
        with open(path, "rb") as fh:
            data = fh.read(cap + 1)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise NetworkError(f"{path} does not exist", "check the file:// URL or mirror path") from None
    except OSError as exc:
        raise NetworkError(f"cannot read {path}: {exc.strerror}", None) from exc
    if len(data) > cap:
        raise _too_big(url, cap, cap_key, "the file is larger")
    return data.decode("utf-8", errors="replace")


def _too_big(url: str, cap: int, cap_key: str | None, why: str) -> NetworkError:
    """A listing or checksum file past its cap: a server streaming forever, or something else
    published at that name."""
    where = f" ({cap_key})" if cap_key else ""
    return NetworkError(f"{url} is larger than {cap} bytes{where}: {why}; not the small text "
                        "file expected there (stopped reading)",
                        "the server streams something else at that name; report it to the "
                        "mirror" + (f", or raise the cap: rocforge config set {cap_key} BYTES"
                                    if cap_key else ""))


def _tries(n: int) -> str:
    return f"{n} attempt" + ("" if n == 1 else "s")


def _declared_length(resp) -> int | None:
    length = resp.headers.get("Content-Length")
    return int(length) if length and length.isascii() and length.isdigit() else None


def _check_scheme(url: str) -> None:
    """The URL given (command line or configuration) must be one rocforge can fetch."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in (*_FETCHED_SCHEMES, "file"):
        raise UsageError(f"cannot fetch {_shown(url)}: only http://, https:// and file:// URLs "
                         "are supported", "give the mirror's http(s) address or a file:// path")


def _shown(text: str) -> str:
    """A server's or user's string, safe on one terminal line (control characters escaped)."""
    text = text if len(text) <= 200 else text[:200] + "..."
    return ascii(text)


def _get(sess, url: str, policy: RetryPolicy, deadline: Deadline, *, headers=None,
         method: str = "get"):
    """GET (or HEAD) `url`, streaming, following redirects here rather than in requests: at most
    MAX_REDIRECTS, only to http(s) (requests would follow 30, and hand a `file:` or `ftp:`
    Location to whatever adapter it has), each hop's timeouts ending by the deadline."""
    first = url
    for _ in range(MAX_REDIRECTS + 1):
        timeout = (deadline.timeout(policy.connect_timeout),
                   deadline.timeout(policy.read_timeout))
        resp = getattr(sess, method)(url, headers=headers or {}, stream=True,
                                     allow_redirects=False, timeout=timeout)
        location = resp.headers.get("Location")
        if resp.status_code not in _REDIRECT_STATUS or location is None:
            return resp
        resp.close()
        target = urllib.parse.urljoin(url, location.strip())
        scheme = urllib.parse.urlsplit(target).scheme.lower()
        if scheme not in _FETCHED_SCHEMES:
            raise NetworkError(
                f"{first} redirects to {_shown(target)}: only http and https redirects are "
                "followed (refused)",
                "the server (or something between) sends rocforge elsewhere; check the URL, "
                "or use a mirror that serves the files over http(s)")
        url = target
    raise NetworkError(f"{first}: more than {MAX_REDIRECTS} redirects (stopped)",
                       "the server redirects in a loop; check the URL")


def validator_path(part: Path) -> Path:
    """Where the ETag/Last-Modified of the response that began a `.part` is kept."""
    return part.with_name(part.name + ".validator")


def _discard_part(part: Path) -> None:
    _unlink(part)
    _unlink(validator_path(part))


def remote_size(url: str, *, session=None, policy: RetryPolicy | None = None) -> int | None:
    """The size of a remote file (HEAD, redirects followed), or None when the server won't say."""
    _check_scheme(url)
    policy = policy_or_config(policy)
    if url.startswith("file:"):
        try:
            return _file_url_path(url).stat().st_size
        except OSError:
            return None
    sess = session or _session()
    deadline = Deadline.start(policy.listing_deadline, "download.listing_deadline")
    try:
        with _get(sess, url, policy, deadline, method="head") as resp:
            length = _declared_length(resp)
            return length if resp.status_code == 200 else None
    except (*requests_errors(), NetworkError):
        return None  # the download itself says what is wrong


# -- internals -------------------------------------------------------------------------------------

@dataclass
class _Fetched:
    sha256: str
    size: int
    total: int | None  # what the server said the full size is
    resumed_from: int


def _fetch_to_part(url, part, expected_size, progress, session, policy, deadline):
    if url.startswith("file:"):
        return _copy_local(url, part, progress), 1
    sess = session or _session()
    ok, value, attempts, expired = with_retries(
        policy, lambda: _http_once(url, part, expected_size, progress, sess, policy, deadline),
        _name(url), deadline)
    if ok:
        return value, attempts
    last = value
    have = part.stat().st_size if part.exists() else 0
    kept = f"; {have} bytes kept in {part} for the next try" if have else ""
    how = f"stopped at {deadline.words()} after" if expired else "failed after"
    raise NetworkError(
        f"download of {_name(url)} {how} {_tries(attempts)}: {last}{kept}",
        "check your network connection or proxy and run the same command again: it resumes "
        "where it stopped"
        + (f"; a slow link may raise the limit: rocforge config set {deadline.key} SECONDS"
           if expired else ""),
    )


def _http_once(url, part, expected_size, progress, sess, policy, deadline) -> _Fetched:
    have = part.stat().st_size if part.exists() else 0
    validator = _read_validator(part) if have else None
    if have and (validator is None or (expected_size is not None and have > expected_size)):
        # no ETag/Last-Modified to prove the server still has the same file: start over
        _discard_part(part)
        have = 0
    # identity: the bytes on disk are the file's bytes, and Range offsets count those bytes
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        headers["If-Range"] = validator
    resp = _get(sess, url, policy, deadline, headers=headers)
    with resp:
        status = resp.status_code
        if status == 416 and have:
            total = _content_range_total(resp.headers.get("Content-Range"))
            if total == have:  # the part is already complete
                size, digest = _hash_file(part)
                return _Fetched(digest, size, total, have)
            _discard_part(part)
            raise Retry("HTTP 416: stale partial file discarded")
        if status in RETRY_STATUS:
            raise Retry(f"HTTP {status}", resp.headers.get("Retry-After"))
        if status >= 400:
            raise _status_error(url, status)
        hasher = hashlib.sha256()
        if status == 206 and have:
            start = _content_range_start(resp.headers.get("Content-Range"))
            if start != have:
                _discard_part(part)
                raise Retry("server answered a different range; starting over")
            total = _content_range_total(resp.headers.get("Content-Range"))
            _refuse_other_size(url, part, total, expected_size)
            _hash_into(part, hasher)
            mode = "ab"
        else:  # 200: whole body (a server that ignores Range, or a changed file, starts over)
            have = 0
            total = _declared_length(resp)
            _refuse_other_size(url, part, total, expected_size)
            mode = "wb"
            _write_validator(part, resp.headers)
        size = have
        declared = total if total is not None else expected_size
        # nobody says how large: read one byte past the cap to know it was passed
        limit = declared if declared is not None else policy.max_unsized_bytes + 1
        bar = DownloadProgress(_name(url), declared, size, progress)
        try:
            with open(part, mode) as fh:
                size += _pump(_paced(_chunks(resp, policy, deadline), policy, deadline), fh,
                              part, hasher, bar, limit - have)
        finally:
            bar.close()
        if declared is None and size > policy.max_unsized_bytes:
            _discard_part(part)
            raise NetworkError(
                f"{_name(url)}: the server announced no size and sent more than "
                f"{policy.max_unsized_bytes} bytes (download.max_unsized_bytes); the partial "
                "file was deleted",
                "a server streaming without end, or a larger file than expected: check the URL, "
                "or raise the cap: rocforge config set download.max_unsized_bytes BYTES")
        if total is not None and size < total:
            raise Retry(f"connection closed after {size} of {total} bytes")
        return _Fetched(hasher.hexdigest(), size, total, have)


def _refuse_other_size(url: str, part: Path, total: int | None,
                       expected_size: int | None) -> None:
    """The server's file is not the size the listing gave: not the file listed (replaced, or
    another at that name).  Refused before reading a byte of it, the old part dropped."""
    if total is not None and expected_size is not None and total != expected_size:
        _discard_part(part)
        raise IntegrityError(
            f"{_name(url)}: the server announces {total} bytes, expected {expected_size} (the "
            "listing's size); nothing was kept",
            "the published file may have been replaced since it was listed: list again and "
            "retry, or check the URL and size you gave")


def _write_validator(part: Path, headers) -> None:
    """Keep what identifies this version of the file, for `If-Range` on a resume.  A weak ETag
    (W/...) cannot be used with If-Range (RFC 9110 13.1.5); Last-Modified then stands in."""
    etag = headers.get("ETag")
    value = etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")
    path = validator_path(part)
    _unlink(path)  # never write through whatever is at that name (a link, say)
    if value:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"if_range": value}))


def _read_validator(part: Path) -> str | None:
    try:
        value = json.loads(validator_path(part).read_text(encoding="utf-8"))["if_range"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) and value.isprintable() else None


def _paced(chunks, policy: RetryPolicy, deadline: Deadline):
    """Pass chunks through; a stream slower than `policy.min_rate` bytes/s over the last
    `policy.rate_window` seconds is dropped (and retried, resuming after what arrived), and one
    still going at the deadline ends there (however fast: `with_retries` then stops)."""
    pace = Pace(policy, deadline)
    for chunk in chunks:
        yield chunk
        why = pace.add(len(chunk))
        if why is not None:
            raise Retry(why)


def _chunks(resp, policy: RetryPolicy, deadline: Deadline):
    """Body chunks as they arrive: `read1` hands over whatever the socket had, so a stream that
    drops keeps (and later resumes after) nearly every byte received.  Before each read the
    socket's timeout is shortened to end by the deadline: a server sending a byte every few
    seconds is not waited for past it."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 < 2
        yield from resp.iter_content(NET_CHUNK)
        return
    sock = _socket_of(resp)
    while True:
        if sock is not None:
            sock.settimeout(deadline.timeout(policy.read_timeout))
        chunk = read1(NET_CHUNK, decode_content=True)
        if not chunk:
            return
        yield chunk


def _socket_of(resp):
    """The socket under a streaming requests response (urllib3 2), or None where the layout
    differs: the timeout given to the request (already ending by the deadline) then holds."""
    conn = getattr(resp.raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    return sock if hasattr(sock, "settimeout") else None


def _copy_local(url: str, part: Path, progress: bool) -> _Fetched:
    src = _file_url_path(url)
    try:
        total = src.stat().st_size
        fin = open(src, "rb")
    except FileNotFoundError:
        raise HttpStatusError(f"{src} does not exist", "check the file:// URL or mirror path",
                              404) from None
    except OSError as exc:
        raise NetworkError(f"cannot read {src}: {exc.strerror}", None) from exc
    hasher = hashlib.sha256()
    bar = DownloadProgress(src.name, total, 0, progress)
    try:
        with fin, open(part, "wb") as fh:
            size = _pump(iter(lambda: fin.read(CHUNK), b""), fh, part, hasher, bar)
    finally:
        bar.close()
    return _Fetched(hasher.hexdigest(), size, total, 0)


def _pump(chunks, fh, part: Path, hasher, bar, limit: int | None = None) -> int:
    """Write chunks to the part file, hashing and advancing the progress bar; returns bytes.
    With `limit`, stops reading once that many bytes are written (the advertised size)."""
    written = 0
    for chunk in chunks:
        if not chunk:
            continue
        if limit is not None and written + len(chunk) > limit:
            chunk = chunk[:limit - written]
        _write(fh, chunk, part)
        hasher.update(chunk)
        written += len(chunk)
        bar.advance(len(chunk))
        if limit is not None and written >= limit:
            break
    return written


def _write(fh, chunk: bytes, part: Path) -> None:
    try:
        fh.write(chunk)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fh.close()
            _discard_part(part)
            raise DiskFullError(
                f"no space left on the device while writing {part.name}; the partial file was removed",
                f"free space on {part.parent} (`df -h {part.parent}`) or choose another location",
            ) from exc
        raise


def _integrity_problem(result: _Fetched, want: str | None, expected_size: int | None) -> str | None:
    if result.total is not None and result.size != result.total:
        return f"got {result.size} bytes but the server announced {result.total}"
    if expected_size is not None and result.size != expected_size:
        return f"size is {result.size} bytes, expected {expected_size}"
    if want and result.sha256 != want:
        return f"sha256 is {result.sha256}, expected {want}"
    return None


def _status_error(url: str, status: int) -> HttpStatusError:
    if status == 404:
        hint = ("the file is gone or the host moved: list what is there with `rocforge nightly "
                "list`, or point at the new host with `rocforge config set` / `--index URL`")
    elif status in (401, 403):
        hint = "the server refused access: check the URL (S3 needs the public bucket's region host)"
    else:
        hint = "check the URL"
    return HttpStatusError(f"HTTP {status} for {url}", hint, status)


def _content_range_total(value: str | None) -> int | None:
    # "bytes 100-199/200" or "bytes */200"
    if not value or "/" not in value:
        return None
    total = value.rsplit("/", 1)[1].strip()
    return int(total) if total.isascii() and total.isdigit() else None


def _content_range_start(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _hash_file(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = _hash_into(path, h)
    return size, h.hexdigest()


def _hash_into(path: Path, hasher) -> int:
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return size


def sha256_file(path: Path) -> str:
    return _hash_file(Path(path))[1]


def _file_url_path(url: str) -> Path:
    parsed = urllib.parse.urlparse(url)
    return Path(urllib.request.url2pathname(parsed.path))


def _name(url: str) -> str:
    path = urllib.parse.urlparse(url).path
    return urllib.parse.unquote(path.rstrip("/").rsplit("/", 1)[-1]) or url


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _session():
    import requests

    sess = requests.Session()
    sess.headers["User-Agent"] = USER_AGENT
    return sess


def free_bytes(path: Path) -> int:
    """Free space on the filesystem holding `path` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free
