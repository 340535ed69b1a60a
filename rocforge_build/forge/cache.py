"""The compiler cache of `rocforge build`, local and remote: ccache or sccache as the compiler
launcher, a remote store they speak (Redis, HTTP: ccache's `remote_storage`, bazel-remote;
Redis/S3 for sccache).

* `setup_cache()`: the launcher and its variables, the remote store checked before the build
  (an unreachable or wrong-protocol server is left out with one line: the build goes on with the
  local cache), credentials kept out of everything that is printed or written;
* after the build, `read_stats()` (ccache's per-build stats log) and `sccache_stats()` give the
  manifest's `[cache]` table and the hit-rate line.

Distributed compiles are in `distributed.py`, the job count in `jobs.py`, and what one plan gets
of all three in `parallel.py`.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rocforge_build import proc
from rocforge_build.errors import ConfigError, RocforgeError
from rocforge_build.proc import which

# ccache 4.7 (Debian 12) remote_storage schemes (ccache manual, "Remote storage backends");
# sccache's: SCCACHE_REDIS_ENDPOINT (SCCACHE_REDIS before 0.7), S3 bucket settings.
CCACHE_SCHEMES = ("redis", "http", "file")
SCCACHE_SCHEMES = ("redis", "s3")
PROBE_TIMEOUT = 3.0
# ccache's stats log lines (4.x `stats_log`): one record per compile, "# <source>" first
_HIT = ("direct_cache_hit", "preprocessed_cache_hit")


@dataclass
class CacheSetup:
    """The launcher and what it is told; `secret_env` carries credentials and is never shown."""

    launcher: str | None  # executable path
    kind: str | None  # "ccache" | "sccache"
    remote: str | None = None  # URL without credentials
    remote_status: str = ""  # "answers" | why it was left out | "not checked: ..."
    remote_only: bool = False
    env: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)
    hip: str = ""  # how HIP translation units are cached
    notes: list[str] = field(default_factory=list)

    @property
    def remote_used(self) -> bool:
        return self.remote is not None and (self.remote_status == "answers"
                                            or self.remote_status.startswith("not checked"))

    def to_json(self) -> dict:
        return {"launcher": self.launcher, "kind": self.kind, "remote": self.remote,
                "remote_status": self.remote_status, "remote_only": self.remote_only,
                "hip": self.hip}


def redact(url: str) -> str:
    """The URL without user name and password (`redis://:pw@host:6379` -> `redis://host:6379`):
    rocforge's one redaction (credentials.py)."""
    from rocforge_build.credentials import redact as redacted

    return redacted(url)


def _port(parts) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def find_launcher(choice: str, path: str | None) -> tuple[str | None, str | None]:
    """(executable, kind): `cache.launcher` = auto (ccache, else sccache), ccache, sccache, none."""
    if choice == "none":
        return None, None
    if choice not in ("auto", "ccache", "sccache"):
        raise ConfigError(f"cache.launcher must be auto, ccache, sccache or none, not {choice!r}",
                          "rocforge config set cache.launcher ccache")
    for tool in (("ccache", "sccache") if choice == "auto" else (choice,)):
        exe = which(tool, path)
        if exe:
            return exe, tool
    return None, None


def setup_cache(cfg: Mapping, *, no_cache: bool, hip: bool, work: Path,
                environ: Mapping[str, str]) -> CacheSetup:
    """The launcher, its base dir, remote storage and HIP note for one build."""
    if no_cache:
        return CacheSetup(None, None)
    exe, kind = find_launcher(cfg.get("launcher", "auto"), environ.get("PATH"))
    if exe is None:
        return CacheSetup(None, None)
    setup = CacheSetup(exe, kind)
    _base_dir(setup, work, environ)
    if hip:
        setup.hip = _hip_note(setup)
    url = cfg.get("remote", "")
    if url:
        _remote(setup, url, bool(cfg.get("remote_only", False)))
    return setup


def _base_dir(setup: CacheSetup, work: Path, environ: Mapping[str, str]) -> None:
    """Paths below the work area hash alike: another prefix, another machine, another user's
    data dir all compile `<work>/src/...` with the same relative paths."""
    var = "CCACHE_BASEDIR" if setup.kind == "ccache" else "SCCACHE_BASEDIRS"
    if var in environ:
        return
    setup.env[var] = str(work.parent) if setup.kind == "ccache" else str(work)
    setup.reasons[var] = ("paths below the work area hash alike, so builds in other work dirs "
                          "(other prefixes, other machines sharing a remote cache) hit the same entries")
    if setup.kind == "ccache":
        # the work dir's own name (a hash of the prefix) is part of the relative paths the
        # compiler sees from the build dir: ../src/... is the same everywhere
        setup.env["CCACHE_NOHASHDIR"] = "true"
        setup.reasons["CCACHE_NOHASHDIR"] = ("with -g ccache hashes the build dir (hash_dir); work dirs differ between prefixes and machines")


def _hip_note(setup: CacheSetup) -> str:
    if setup.kind == "ccache":
        return ("HIP translation units go through ccache (CMAKE_HIP_COMPILER_LAUNCHER): ccache "
                "caches `clang -x hip` since ccache/ccache#666 (checked with ccache 4.7 and "
                "clang 15 here: a second compile is a hit); hipcc-driven builds need "
                "HIP_CLANG_LAUNCHER (ROCm/llvm-project#1490, ROCm 7.13+)")
    version = _sccache_version(setup.launcher)
    if version and version < (0, 8):
        setup.notes.append(
            f"sccache {'.'.join(map(str, version))} does not cache HIP compiles (`-x hip` is "
            "'non-cacheable'; HIP support came with mozilla/sccache#2045, sccache 0.8): HIP "
            "translation units compile every time — install ccache or a newer sccache")
        return "not cached: this sccache predates HIP support (mozilla/sccache#2045)"
    return ("HIP translation units go through sccache (CMAKE_HIP_COMPILER_LAUNCHER): sccache "
            "caches `clang -x hip` since mozilla/sccache#2045 (checked with sccache 0.16 and "
            "clang 15 here: the second compile is a HIP hit); hipcc-driven builds need "
            "HIP_CLANG_LAUNCHER (ROCm/llvm-project#1490, ROCm 7.13+; Debian's hipcc 5.2 has none)")


def _sccache_version(exe: str | None) -> tuple[int, ...] | None:
    if not exe:
        return None
    try:
        out = proc.run([exe, "--version"], check=False, stderr=subprocess.PIPE).stdout
    except (RocforgeError, OSError):
        return None
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(g) for g in m.groups()) if m else None


def _remote(setup: CacheSetup, url: str, remote_only: bool) -> None:
    shown = redact(url)
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    schemes = CCACHE_SCHEMES if setup.kind == "ccache" else SCCACHE_SCHEMES
    setup.remote = shown
    if scheme not in schemes:
        setup.remote_status = (f"left out: {setup.kind} cannot use a {scheme or 'scheme-less'} URL "
                               f"(it speaks {', '.join(s + '://' for s in schemes)})")
        return
    if scheme == "s3":
        setup.remote_status = "not checked: S3 needs the bucket's credentials (sccache's own)"
    else:
        setup.remote_status = probe(url)
        if setup.remote_status != "answers":
            return
    if setup.kind == "ccache":
        setup.secret_env["CCACHE_REMOTE_STORAGE"] = _ccache_url(url)
        setup.env["CCACHE_REMOTE_STORAGE"] = shown
        setup.reasons["CCACHE_REMOTE_STORAGE"] = "cache.remote (shown without credentials)"
        setup.env["CCACHE_COMPILERCHECK"] = "content"
        setup.reasons["CCACHE_COMPILERCHECK"] = ("machines sharing the remote hash the compiler "
                                                 "by its content, not its install time: another "
                                                 "compiler version never hits")
        if remote_only:
            setup.env["CCACHE_REMOTE_ONLY"] = "true"
            setup.reasons["CCACHE_REMOTE_ONLY"] = "cache.remote_only: no local cache directory"
        setup.remote_only = remote_only
        return
    if scheme == "redis":
        version = _sccache_version(setup.launcher)
        if version and version < (0, 7):
            setup.secret_env["SCCACHE_REDIS"] = url
            setup.env["SCCACHE_REDIS"] = shown
            setup.reasons["SCCACHE_REDIS"] = "cache.remote (shown without credentials)"
            return
        # sccache 0.16 with the password in the endpoint URL never authenticates: its server
        # hangs at start-up while reconnecting and PINGing without AUTH (hundreds of thousands
        # of NOAUTH-rejected PINGs a minute, checked with redis-server 7.0 --requirepass); with
        # SCCACHE_REDIS_USERNAME/PASSWORD it sends AUTH and works
        setup.env["SCCACHE_REDIS_ENDPOINT"] = shown
        setup.reasons["SCCACHE_REDIS_ENDPOINT"] = "cache.remote (without credentials)"
        auth = _redis_auth(urlsplit(url))
        if auth:
            setup.secret_env["SCCACHE_REDIS_PASSWORD"] = auth[-1]
            if len(auth) == 2:
                setup.secret_env["SCCACHE_REDIS_USERNAME"] = auth[0]
    else:
        parts = urlsplit(url)
        setup.env["SCCACHE_BUCKET"] = parts.hostname or ""
        setup.reasons["SCCACHE_BUCKET"] = "cache.remote s3://BUCKET/PREFIX"
        if parts.path.strip("/"):
            setup.env["SCCACHE_S3_KEY_PREFIX"] = parts.path.strip("/")
            setup.reasons["SCCACHE_S3_KEY_PREFIX"] = "cache.remote s3://BUCKET/PREFIX"
    if remote_only:
        setup.notes.append("cache.remote_only applies to ccache; sccache with a remote store "
                           "keeps no local copy anyway")


def _ccache_url(url: str) -> str:
    """ccache 4.7 reads `redis://:PASSWORD@host` as user "" + password and fails AUTH (every
    compile a remote error, checked with redis-server 7.0); its own form is `redis://PASSWORD@host`."""
    parts = urlsplit(url)
    if parts.scheme.lower() == "redis" and parts.username == "" and parts.password:
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, f"{parts.password}@{host}", parts.path, parts.query,
                           parts.fragment))
    return url


def _redis_auth(parts) -> list[str]:
    """AUTH arguments as ccache sends them: `user:pw@`, `:pw@` and `pw@` (a lone user part is
    the password, ccache's redis://[[USERNAME:]PASSWORD@]HOST)."""
    if parts.password is not None:
        return [parts.username, parts.password] if parts.username else [parts.password]
    return [parts.username] if parts.username else []


def probe(url: str, timeout: float = PROBE_TIMEOUT) -> str:
    """"answers" when the server at `url` speaks its protocol, else why not (no credentials in
    the text)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return "answers" if Path(parts.path).is_dir() else f"left out: {parts.path} is not a directory"
    host = parts.hostname
    if not host:
        return "left out: the URL names no host"
    port = _port(parts) or {"redis": 6379, "http": 80}.get(scheme, 0)
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            if scheme == "redis":
                return _probe_redis(s, parts, where)
            return _probe_http(s, parts, where)
    except TimeoutError:
        return f"left out: {where} did not answer within {timeout:.0f} s"
    except OSError as exc:
        return f"left out: {where} does not answer ({exc.strerror or exc})"


def _probe_redis(s: socket.socket, parts, where: str) -> str:
    cmds = []
    auth = _redis_auth(parts)
    if auth:
        cmds.append(["AUTH", *auth])
    cmds.append(["PING"])
    for cmd in cmds:
        s.sendall(b"".join([f"*{len(cmd)}\r\n".encode()]
                           + [f"${len(a.encode())}\r\n{a}\r\n".encode() for a in cmd]))
        reply = s.recv(512)
        if not reply:
            return f"left out: {where} closed the connection (not a Redis server?)"
        if reply[:1] not in (b"+", b"-"):
            return f"left out: {where} does not speak Redis (it answered {printable(reply)})"
        if reply.startswith(b"-") and cmd[0] == "AUTH":
            return f"left out: {where} rejected the credentials"
        if reply.startswith((b"-NOAUTH", b"-ERR")) and cmd[0] == "PING":
            return f"left out: {where} wants a password (redis://:PASSWORD@host:port)"
    return "answers"


def _probe_http(s: socket.socket, parts, where: str) -> str:
    path = parts.path or "/"
    s.sendall(f"HEAD {path} HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
    reply = s.recv(512)
    if not reply.startswith(b"HTTP/"):
        return (f"left out: {where} does not speak HTTP"
                + (f" (it answered {printable(reply)})" if reply else " (it closed the connection)"))
    return "answers"


def printable(data: bytes) -> str:
    return repr(data[:40].decode("latin-1"))


# -- after the build ------------------------------------------------------------------------------

def stats_log(work: Path) -> Path:
    return work / "ccache-stats.log"


def read_stats(path: Path) -> dict[str, int]:
    """This build's counts from ccache's stats log: hits, misses, remote_hits, remote_errors."""
    out = {"hits": 0, "misses": 0, "remote_hits": 0, "remote_errors": 0, "uncacheable": 0}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for record in text.split("# ")[1:]:
        counters = set(record.splitlines()[1:])
        if counters & set(_HIT):
            out["hits"] += 1
            if "remote_storage_hit" in counters:
                out["remote_hits"] += 1
        elif "cache_miss" in counters:
            out["misses"] += 1
        else:
            out["uncacheable"] += 1
        if counters & {"remote_storage_error", "remote_storage_timeout"}:
            out["remote_errors"] += 1
    return out


def run_sccache(cache: CacheSetup, *args: str, env: Mapping[str, str] | None = None) -> str:
    try:
        return proc.run([cache.launcher, *args], check=False, timeout=30, stderr=subprocess.PIPE,
                        env={**cache.env, **cache.secret_env, **(env or {})}).stdout
    except (RocforgeError, OSError):
        return ""


def sccache_stats(cache: CacheSetup, env: Mapping[str, str] | None = None) -> dict[str, int]:
    """This build's counts from the sccache server (zeroed before the build; a server shared
    with other builds at the same time counts theirs too). With a remote store sccache keeps no
    local tier, so its hits are remote hits."""
    import json

    out = {"hits": 0, "misses": 0, "remote_hits": 0, "remote_errors": 0, "uncacheable": 0}
    try:
        doc = json.loads(run_sccache(cache, "--show-stats", "--stats-format", "json", env=env))
        st = doc["stats"]
    except (ValueError, KeyError, TypeError):
        return out
    out["hits"] = sum(st.get("cache_hits", {}).get("counts", {}).values())
    out["misses"] = sum(st.get("cache_misses", {}).get("counts", {}).values())
    # one storage per server (0.16 with no multi-level chain): "redis, name: ..." / "S3, ..." or
    # "Local disk: ..."; sccache counts no remote hits apart, the storage says where hits came from
    location = str(doc.get("cache_location", ""))
    remote = cache.remote_used and not location.lower().startswith("local disk")
    out["remote_hits"] = out["hits"] if remote else 0
    out["remote_errors"] = st.get("cache_read_errors", 0) + st.get("cache_write_errors", 0)
    out["uncacheable"] = st.get("requests_not_cacheable", 0)
    out["distributed"] = sum((st.get("dist_compiles") or {}).values())
    return out


def summary(cache: CacheSetup, stats: Mapping[str, int]) -> list[str]:
    """The end-of-build lines: the hit rate, and once, a remote store that went away."""
    if cache.kind is None:
        return []
    total = stats["hits"] + stats["misses"]
    if total == 0:
        return [f"compiler cache ({cache.kind}): no compiles ran"]
    line = (f"compiler cache ({cache.kind}): {stats['hits']}/{total} hits "
            f"({100 * stats['hits'] / total:.0f} %)")
    if cache.remote and cache.remote_used:
        line += f", {stats['remote_hits']} from {cache.remote}"
    if stats.get("distributed"):
        line += f"; {stats['distributed']} compiled on sccache-dist servers"
    lines = [line]
    if stats["remote_errors"]:
        lines.append(f"cache server {cache.remote} stopped answering during the build: "
                     f"{stats['remote_errors']} compile(s) went on without it (local cache and "
                     "compiler); the build is complete")
    return lines


def manifest_table(cache: CacheSetup, stats: Mapping[str, int]) -> dict:
    return {"launcher": cache.launcher or "none", "remote": cache.remote or "",
            "remote_status": cache.remote_status, "hits": stats["hits"],
            "misses": stats["misses"], "remote_hits": stats["remote_hits"],
            "remote_errors": stats["remote_errors"],
            **({"distributed": stats["distributed"]} if "distributed" in stats else {})}
