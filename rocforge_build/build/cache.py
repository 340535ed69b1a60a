"""Builds that outgrow one machine: the compiler cache (local and remote), distributed compiles
and how many jobs a build runs at once.

Everything here uses existing engines — ccache or sccache as the compiler launcher, a remote
store they speak (Redis, HTTP: ccache's `remote_storage`, bazel-remote; Redis/S3 for sccache),
distcc or icecream behind ccache's `prefix_command` — and decides three things for a plan:

* `setup_cache()`: the launcher and its variables, the remote store checked before the build
  (an unreachable or wrong-protocol server is left out with one line: the build goes on with the
  local cache), credentials kept out of everything that is printed or written;
* `setup_distribution()`: the hosts that answer *and* compile with this build's compiler (a host
  with another compiler version would give mixed objects and, behind ccache, cache entries stored
  under the local compiler's hash), `-j` raised to their capacity, links and HIP compiles local;
* `choose_jobs()`: min(cores, MemAvailable / the recipe's per-job memory).

After the build, `read_stats()` turns ccache's per-build stats log into the manifest's `[cache]`
table and the hit-rate line; `explain_oom()` names the setting to lower when the OOM killer
ended a build.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rocforge_build.errors import BuildError, ConfigError, UsageError
from rocforge_build.proc import which

# ccache 4.7 (Debian 12) remote_storage schemes (ccache manual, "Remote storage backends");
# sccache's: SCCACHE_REDIS_ENDPOINT (SCCACHE_REDIS before 0.7), S3 bucket settings.
CCACHE_SCHEMES = ("redis", "http", "file")
SCCACHE_SCHEMES = ("redis", "s3")
PROBE_TIMEOUT = 3.0
# per-job memory when a recipe has no `[[jobs]]` figure
DEFAULT_JOB_MB = 1024
# ccache's stats log lines (4.x `stats_log`): one record per compile, "# <source>" first
_HIT = ("direct_cache_hit", "preprocessed_cache_hit")
_OOM_RE = re.compile(r"Killed signal terminated program|unable to execute command: Killed|"
                     r"signal 9|^Killed$|terminated by signal 9|Out of memory", re.M | re.I)


# -- the compiler cache ---------------------------------------------------------------------------

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
    """The URL without user name and password (`redis://:pw@host:6379` -> `redis://host:6379`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if _port(parts) else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


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
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
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
            return f"left out: {where} does not speak Redis (it answered {_printable(reply)})"
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
                + (f" (it answered {_printable(reply)})" if reply else " (it closed the connection)"))
    return "answers"


def _printable(data: bytes) -> str:
    return repr(data[:40].decode("latin-1"))


# -- distributed compiles -------------------------------------------------------------------------

@dataclass
class Distribution:
    tool: str  # "distcc" | "icecc"
    hosts: list[str]  # the hosts used (distcc host specs)
    capacity: int  # remote job slots
    env: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # "host: why"
    local: list[str] = field(default_factory=list)  # what stays on this machine, and why
    daemon: str = ""  # icecc: where the local iceccd answered
    # sccache-dist with HIP: the variables of a second sccache server, without [dist], that HIP
    # compiles go to (CMAKE_HIP_COMPILER_LAUNCHER), and the config file it reads (path, text)
    hip_server: dict[str, str] = field(default_factory=dict)
    hip_conf: tuple[str, str] | None = None

    def to_json(self) -> dict:
        return {"tool": self.tool, "hosts": self.hosts, "capacity": self.capacity,
                "left_out": self.left_out, "local": self.local,
                **({"daemon": self.daemon} if self.tool == "icecc" else {})}


def setup_distribution(cfg: Mapping, cache: CacheSetup, *, local_jobs: int, hip: bool,
                       compilers: list[str], environ: Mapping[str, str],
                       work: Path | None = None) -> Distribution:
    """distcc hosts from `build.distcc_hosts` (or icecream's scheduler), each checked: it
    answers, takes a job, and compiles with this build's compilers."""
    hosts = list(cfg.get("distcc_hosts", []))
    scheduler = cfg.get("icecc_scheduler", "")
    link = ("link steps: CMake's link job pool is held to the local job count "
            "(CMAKE_JOB_POOL_LINK), a link needs the whole tree of objects here")
    if cache.kind == "sccache":
        return sccache_dist_distribution(cache, [link], hip=hip, work=work, environ=environ)
    if not hosts and not scheduler:
        raise UsageError("--distribute: no hosts configured",
                         "rocforge config set build.distcc_hosts '[\"host1/8\", \"host2/8\"]' "
                         "(or build.icecc_scheduler HOST)")
    tool = "distcc" if hosts else "icecc"
    exe = which(tool, environ.get("PATH"))
    if exe is None:
        raise UsageError(f"--distribute: {tool} is not installed", f"Debian: apt-get install {tool}")
    local = [link]
    if hip and tool == "distcc":
        local.append("HIP compiles (-x hip with offload): distcc runs them locally (\"gcc's -x "
                     "handling is complex; running locally for hip\", checked with distcc 3.4); "
                     "their number is held by the localhost slots")
    if tool == "icecc":
        local.append(("HIP compiles (-x hip with offload): icecc runs them locally (\"unsupported "
                      "-x option: hip; running locally\", checked with icecc 1.4), and so " if hip
                      else "icecc runs these locally by itself: ")
                     + "assembler sources and CMake's Check* probes")
        dist = icecc_distribution(scheduler, int(cfg.get("distribute_jobs", 0)), local, environ)
    else:
        good, capacity, left_out = [], 0, []
        reference = {c: _compiler_ident(c, None, environ) for c in compilers}
        for spec in hosts:
            why = check_host(spec, compilers, reference, environ)
            if why:
                left_out.append(f"{spec}: {why}")
                continue
            good.append(spec)
            capacity += _slots(spec)
        dist = Distribution("distcc", good, capacity, left_out=left_out, local=local)
        # distcc fills hosts in order: the remote ones first; localhost last, with the local job
        # count, so compiles that stay here (HIP, fallbacks) never exceed what memory allows
        dist.env["DISTCC_HOSTS"] = " ".join([*good, f"localhost/{local_jobs}"])
        dist.reasons["DISTCC_HOSTS"] = ("build.distcc_hosts that answered and compile with this "
                                        "build's compilers, then localhost with the local -j")
        dist.env["DISTCC_FALLBACK"] = "1"
        dist.reasons["DISTCC_FALLBACK"] = "a host that fails a job: the compile runs here"
    prefix_var = "CCACHE_PREFIX" if cache.kind == "ccache" else None
    if prefix_var:
        dist.env[prefix_var] = exe
        dist.reasons[prefix_var] = f"ccache hands the compiles it misses to {tool} (prefix_command)"
    return dist




SCCACHE_PORT = 4226  # sccache's default server port (SCCACHE_SERVER_PORT)
SCCACHE_DIST_HIP = (
    "HIP compiles (-x hip with offload): sccache-dist 0.16 sends them to the build server, whose "
    "toolchain package is the compiler alone, without the ROCm device libraries, and the compile "
    "fails there (\"cannot find ROCm device library\", checked with sccache 0.16 and clang 15); "
    "so they go to a second sccache server here, on port {port}, reading {conf}: your sccache "
    "config without its [dist] table. They are still cached, in the same store")


def _sccache_config(environ: Mapping[str, str]) -> Path:
    """sccache's config file: SCCACHE_CONF, else $XDG_CONFIG_HOME/sccache/config."""
    if environ.get("SCCACHE_CONF"):
        return Path(environ["SCCACHE_CONF"])
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "sccache" / "config"


def _without_dist(config: Path) -> str:
    """The user's sccache config as TOML text, less its [dist] table (cache settings kept)."""
    import tomllib

    import tomlkit

    try:
        doc = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    doc.pop("dist", None)
    return tomlkit.dumps(doc)


def sccache_dist_distribution(cache: CacheSetup, local: list[str], *, hip: bool = False,
                              work: Path | None = None,
                              environ: Mapping[str, str] | None = None) -> Distribution:
    """sccache distributes through its own configuration (sccache-dist: `[dist] scheduler_url`
    and `[dist.auth]` in sccache's config file, SCCACHE_CONF); rocforge asks the sccache server
    what it sees (`--dist-status`) for the capacity.  HIP compiles cannot go out (SCCACHE_DIST_HIP):
    they get a second, local-only sccache server."""
    import json

    environ = dict(os.environ if environ is None else environ)
    dist = Distribution("sccache-dist", [], 0, local=local)
    try:
        status = json.loads(_sccache(cache, "--dist-status"))
    except ValueError:
        status = None
    if isinstance(status, dict) and "SchedulerStatus" in status:
        url, st = status["SchedulerStatus"]
        if hip and work is not None:  # a scheduler answers: sccache would send HIP compiles out
            port = int(environ.get("SCCACHE_SERVER_PORT") or SCCACHE_PORT) + 1
            conf = work / "sccache-hip.conf"
            dist.hip_server = {"SCCACHE_CONF": str(conf), "SCCACHE_SERVER_PORT": str(port)}
            dist.hip_conf = (str(conf), _without_dist(_sccache_config(environ)))
            dist.local.append(SCCACHE_DIST_HIP.format(port=port, conf=conf))
        if st.get("num_servers"):
            dist.hosts.append(f"scheduler {url}: {st['num_servers']} server(s)")
            dist.capacity = int(st.get("num_cpus", 0))
        else:
            dist.left_out.append(f"scheduler {url}: no build server is connected")
    else:
        dist.left_out.append("sccache-dist: not configured or not answering (`sccache "
                             f"--dist-status` says {str(status)[:80]!r}); set [dist] scheduler_url "
                             "and [dist.auth] in sccache's config")
    return dist

# icecream 1.4: the scheduler's default port; its text interface (`listcs`) listens on port + 1
ICECC_SCHEDULER_PORT = 8765
_ICECC_HOST_RE = re.compile(r"^ (\S+) \(([^()]*):(\d+)\) \[([^\]]*)\] speed=\S+ jobs=\d+/(\d+)", re.M)


@dataclass(frozen=True)
class IceHost:
    """One compile server as icecream's scheduler lists it."""

    name: str
    address: str
    port: int  # 0: started with --no-remote, takes no jobs from other machines
    platform: str
    max_jobs: int


def icecc_scheduler_hosts(scheduler: str, timeout: float = PROBE_TIMEOUT) -> list[IceHost]:
    """The daemons connected to the scheduler at `scheduler` (HOST[:PORT]), from its text
    interface on PORT + 1 (`listcs`, icecc-scheduler 1.4); OSError when it does not answer."""
    host, _, port = scheduler.rpartition(":") if scheduler.count(":") == 1 else (scheduler, "", "")
    port = int(port) if port.isdigit() else ICECC_SCHEDULER_PORT
    data = b""
    with socket.create_connection((host, port + 1), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(b"listcs\nquit\n")
        while chunk := s.recv(65536):
            data += chunk
            if b"200 Good Bye" in data:
                break
    text = data.decode(errors="replace")
    if not text.startswith("200"):
        raise OSError(f"{host}:{port + 1} is not an icecream scheduler's text port "
                      f"(it answered {_printable(data)})")
    return [IceHost(m[1], m[2], int(m[3]), m[4], int(m[5])) for m in _ICECC_HOST_RE.finditer(text)]


def icecc_daemon(environ: Mapping[str, str]) -> str | None:
    """Where the local iceccd answers, tried in the icecc client's own order (client/main.cpp,
    icecc 1.4): $ICECC_TEST_SOCKET alone when set, else /var/run/icecc/iceccd.socket,
    /var/run/iceccd.socket, $HOME/.iceccd.socket, 127.0.0.1:10245."""
    if environ.get("ICECC_TEST_SOCKET"):
        sockets = [environ["ICECC_TEST_SOCKET"]]
    else:
        sockets = ["/var/run/icecc/iceccd.socket", "/var/run/iceccd.socket"]
        if environ.get("HOME"):
            sockets.append(f"{environ['HOME']}/.iceccd.socket")
    for path in sockets:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.settimeout(PROBE_TIMEOUT)
            s.connect(path)
            return path
    if not environ.get("ICECC_TEST_SOCKET"):
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", 10245), timeout=PROBE_TIMEOUT).close()
            return "127.0.0.1:10245"
    return None


def _is_this_machine(h: IceHost) -> bool:
    # iceccd's node name defaults to the host name; the scheduler sees a local daemon's loopback
    return h.address.startswith("127.") or h.address == "::1" or h.name == socket.gethostname()


def icecc_distribution(scheduler: str, jobs_override: int, local: list[str],
                       environ: Mapping[str, str]) -> Distribution:
    """icecream: the client hands each compile to the local iceccd, which asks the scheduler for
    a host and ships this machine's compiler there (icecc-create-env: the driver, cc1/cc1plus,
    as and their libraries, run in a chroot), so a host's own compiler is never used.  Capacity
    = the job slots of the other hosts the scheduler lists for this machine's platform."""
    import platform

    dist = Distribution("icecc", [], 0, local=local)
    daemon = icecc_daemon(environ)
    try:
        servers = icecc_scheduler_hosts(scheduler)
    except OSError as exc:
        dist.left_out.append(f"scheduler {scheduler}: does not answer ({exc.strerror or exc})")
        return dist
    if daemon is None:
        dist.left_out.append("local iceccd: not running (no socket answers), icecc compiles "
                             "everything here")
        return dist
    if not any(_is_this_machine(h) for h in servers):
        dist.left_out.append(f"local iceccd: not connected to scheduler {scheduler} (its own "
                             "setting, ICECC_SCHEDULER_HOST in /etc/icecc/icecc.conf), icecc "
                             "compiles everything here")
        return dist
    arch = platform.machine()
    for h in servers:
        if _is_this_machine(h):
            continue
        if h.port == 0 or h.max_jobs == 0:
            dist.left_out.append(f"{h.name} ({h.address}): takes no remote jobs (--no-remote or -m 0)")
        elif h.platform != arch:
            dist.left_out.append(f"{h.name} ({h.address}): {h.platform}, this machine's compiler "
                                 f"is for {arch}")
        else:
            dist.hosts.append(f"{h.name} ({h.address}:{h.port}/{h.max_jobs})")
            dist.capacity += h.max_jobs
    if jobs_override:
        dist.capacity = jobs_override
    dist.daemon = daemon
    return dist

def _slots(spec: str) -> int:
    m = re.search(r"/(\d+)", spec)
    return int(m.group(1)) if m else 2  # distcc's default per host


def _host_addr(spec: str) -> tuple[str, int]:
    hostport = re.split(r"[/,]", spec, maxsplit=1)[0]
    if "@" in hostport:
        raise UsageError(f"build.distcc_hosts {spec!r}: ssh hosts are not supported",
                         "run distccd on the host and name it host[:port][/jobs]")
    host, _, port = hostport.partition(":")
    return host, int(port) if port.isdigit() else 3632


def check_host(spec: str, compilers: list[str], reference: Mapping[str, str | None],
               environ: Mapping[str, str]) -> str | None:
    """None when `spec` answers and compiles like this machine, else why it is left out."""
    host, port = _host_addr(spec)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except TimeoutError:
        return f"did not answer within {PROBE_TIMEOUT:.0f} s"
    except OSError as exc:
        return f"does not answer ({exc.strerror or exc})"
    for compiler in compilers:
        ident = _compiler_ident(compiler, spec, environ)
        if ident is None:
            return f"refused or failed a test compile with {compiler}"
        if reference.get(compiler) and ident != reference[compiler]:
            return (f"compiles {compiler} as {ident!r}, this machine as {reference[compiler]!r}: "
                    "objects of different compilers must not mix, and ccache would store them "
                    "under this machine's compiler")
    return None


def _compiler_ident(compiler: str, host: str | None, environ: Mapping[str, str]) -> str | None:
    """The compiler's own identification (the ELF `.comment` it writes), from a test compile
    here (host None) or on one distcc host: what produced the object, not what its name says."""
    with tempfile.TemporaryDirectory(prefix="rocforge-probe-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int rocforge_probe(int x) { return x + 1; }\n")
        obj = Path(tmp) / "probe.o"
        lang = ["-x", "c++"] if re.search(r"\+\+|xx", Path(compiler).name) else []
        argv = [compiler, *lang, "-c", str(src), "-o", str(obj)]
        env = dict(environ)
        if host is not None:
            argv = [which("distcc", environ.get("PATH")) or "distcc", *argv]
            env.update(DISTCC_HOSTS=host, DISTCC_FALLBACK="0", DISTCC_SKIP_LOCAL_RETRY="1",
                       DISTCC_IO_TIMEOUT=str(int(PROBE_TIMEOUT * 4)), DISTCC_DIR=tmp)
        try:
            res = subprocess.run(argv, env=env, capture_output=True, text=True,
                                 timeout=PROBE_TIMEOUT * 6)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if res.returncode != 0 or not obj.is_file():
            return None
        return _elf_comment(obj)


def _elf_comment(obj: Path) -> str:
    """The `.comment` strings of an ELF object (GCC: (Debian 12.2.0-14) 12.2.0 / clang version ...),
    its sections read by discover.binaries' section-table reader."""
    import struct

    from rocforge_build.discover.binaries import _sections

    try:
        with open(obj, "rb") as fh:
            head = fh.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return ""
            sections, _, _ = _sections(fh, head)
            for name, _typ, off, size, _link in sections:
                if name == ".comment":
                    fh.seek(off)
                    raw = fh.read(min(size, 1 << 20))
                    return "; ".join(s.decode(errors="replace") for s in raw.split(b"\0") if s)
    except (OSError, struct.error):
        return ""
    return ""


# -- parallel jobs --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Jobs:
    jobs: int
    cores: int
    mem_available_mb: int | None
    per_job_mb: int
    reason: str
    tensile_threads: int

    def to_json(self) -> dict:
        return {"jobs": self.jobs, "cores": self.cores, "mem_available_mb": self.mem_available_mb,
                "per_job_mb": self.per_job_mb, "reason": self.reason,
                "tensile_cpu_threads": self.tensile_threads}


def cores(root) -> int:
    """CPUs this build may use: the affinity mask here, `processor` lines of a --root's cpuinfo."""
    if (root is None or root.is_host) and hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    try:
        n = sum(1 for line in root.read_text("/proc/cpuinfo").splitlines()
                if line.startswith("processor"))
    except OSError:
        n = 0
    return n or os.cpu_count() or 1


def mem_available_mb(root) -> int | None:
    from rocforge_build.discover.host import parse_meminfo

    try:
        kib = parse_meminfo(root.read_text("/proc/meminfo"), "MemAvailable")
    except OSError:
        return None
    return kib // 1024 if kib is not None else None


def choose_jobs(root, requested: int | None, per_job_mb: int, per_job_reason: str) -> Jobs:
    n_cores = cores(root)
    avail = mem_available_mb(root)

    def tensile(jobs: int) -> int:  # spack's rocblas package: min(16, make_jobs)
        return min(16, jobs)

    if requested:
        return Jobs(requested, n_cores, avail, per_job_mb, "asked for with --jobs", tensile(requested))
    if avail is None:
        return Jobs(n_cores, n_cores, None, per_job_mb,
                    f"{n_cores} cores; /proc/meminfo has no MemAvailable, memory not counted",
                    tensile(n_cores))
    by_mem = max(1, avail // per_job_mb)
    jobs = min(n_cores, by_mem)
    why = (f"min({n_cores} cores, {avail} MB available / {per_job_mb} MB per job = {by_mem})"
           f" — {per_job_reason}")
    if by_mem < n_cores:
        why += "; memory is the limit: more jobs would risk the OOM killer"
    return Jobs(jobs, n_cores, avail, per_job_mb, why, tensile(jobs))


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


def _sccache(cache: CacheSetup, *args: str, env: Mapping[str, str] | None = None) -> str:
    try:
        return subprocess.run([cache.launcher, *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **cache.env, **cache.secret_env, **(env or {})}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def sccache_stats(cache: CacheSetup, env: Mapping[str, str] | None = None) -> dict[str, int]:
    """This build's counts from the sccache server (zeroed before the build; a server shared
    with other builds at the same time counts theirs too). With a remote store sccache keeps no
    local tier, so its hits are remote hits."""
    import json

    out = {"hits": 0, "misses": 0, "remote_hits": 0, "remote_errors": 0, "uncacheable": 0}
    try:
        doc = json.loads(_sccache(cache, "--show-stats", "--stats-format", "json", env=env))
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


def oom_kills() -> int | None:
    """The OOM-kill count of this process's cgroup (v2 memory.events, v1 memory.oom_control)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            f = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            m = re.search(r"^oom_kill (\d+)", f.read_text(), re.M)
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def explain_oom(output_tail: str, kills_before: int | None, jobs: Jobs) -> str | None:
    """A line naming the OOM killer and the setting to lower, when the failure looks like it."""
    after = oom_kills()
    counted = kills_before is not None and after is not None and after > kills_before
    if not counted and not _OOM_RE.search(output_tail):
        return None
    lower = max(1, jobs.jobs // 2)
    evidence = "the kernel's OOM-kill count went up" if counted else "a compiler was killed (signal 9)"
    return (f"the build ran out of memory ({evidence}) with -j {jobs.jobs} ({jobs.reason}); "
            f"lower it: rocforge build ... --jobs {lower}")


# -- one plan's share: cache, distribution, jobs --------------------------------------------------

@dataclass
class Parallel:
    """What this module decides for one plan."""

    cache: CacheSetup
    jobs: Jobs
    build_jobs: int  # ninja -j: the local jobs, plus the hosts' slots when distributing
    distribution: Distribution | None = None
    options: list[dict] = field(default_factory=list)
    stats: dict[str, int] | None = None  # after the build: read_stats()

    @property
    def launcher(self) -> str | None:
        if self.cache.launcher:
            return self.cache.launcher
        return self.distribution.env.get("DISTCC_LAUNCHER") if self.distribution else None

    @property
    def hip_launcher(self) -> str | None:
        """CMAKE_HIP_COMPILER_LAUNCHER: the launcher, or, when HIP compiles need a server of
        their own (sccache-dist), the launcher run through env with that server's variables."""
        d = self.distribution
        if d is None or not d.hip_server or not self.cache.launcher:
            return self.launcher
        return ";".join(["env", *(f"{k}={v}" for k, v in d.hip_server.items()), self.cache.launcher])

    @property
    def env(self) -> dict[str, str]:
        out = dict(self.cache.env)
        if self.distribution:
            out.update({k: v for k, v in self.distribution.env.items() if k != "DISTCC_LAUNCHER"})
        return out

    @property
    def reasons(self) -> dict[str, str]:
        return {**self.cache.reasons, **(self.distribution.reasons if self.distribution else {})}

    @property
    def notes(self) -> list[str]:
        notes = list(self.cache.notes)
        if self.cache.remote and not self.cache.remote_used:
            notes.append(f"cache server {self.cache.remote} {self.cache.remote_status}: this build "
                         "uses the local cache only")
        if self.distribution:
            what = {"distcc": "distcc host", "icecc": "icecream:"}.get(self.distribution.tool, "sccache-dist:")
            notes += [f"{what} {h} left out: {why}" for h, _, why in
                      (x.partition(": ") for x in self.distribution.left_out)]
            notes += [f"kept local: {what}" for what in self.distribution.local]
        return notes

    def to_json(self) -> dict:
        return {"cache": self.cache.to_json(), "jobs": self.jobs.to_json(),
                "build_jobs": self.build_jobs,
                "distribution": self.distribution.to_json() if self.distribution else None}


def for_plan(rules: list, facts, *, root, requested_jobs: int | None, no_cache: bool,
             distribute: bool, kind: str, work: Path, environ: Mapping[str, str],
             cfg: Mapping | None = None) -> Parallel:
    """The cache, the jobs and the distribution of one build; `rules` are the recipe's `[[jobs]]`."""
    from rocforge_build import config
    from rocforge_build.build import conditions

    cfg = cfg if cfg is not None else config.effective()
    per_job, per_job_reason = DEFAULT_JOB_MB, "no per-job memory figure in the recipe: 1 GB assumed"
    for rule in rules:
        holds, why = conditions.explain(rule.when, facts)
        if holds:
            per_job, per_job_reason = rule.get("memory_mb"), rule.get("reason")
    jobs = choose_jobs(root, requested_jobs, per_job, per_job_reason)
    setup = setup_cache(cfg["cache"], no_cache=no_cache, hip=kind == "hip", work=work, environ=environ)
    if setup.kind == "ccache":
        setup.env["CCACHE_STATSLOG"] = str(stats_log(work))
        setup.reasons["CCACHE_STATSLOG"] = "this build's hits and misses, for the manifest"
    par = Parallel(setup, jobs, jobs.jobs)
    if not distribute:
        return par
    compilers = [environ.get("CC", "cc"), environ.get("CXX", "c++")]
    dist = setup_distribution(cfg["build"], setup, local_jobs=jobs.jobs, hip=kind == "hip",
                              compilers=compilers, environ=environ, work=work)
    if setup.launcher is None:  # --no-cache: distcc itself is the launcher
        dist.env["DISTCC_LAUNCHER"] = which(dist.tool, environ.get("PATH")) or dist.tool
    par.distribution = dist
    par.build_jobs = jobs.jobs + dist.capacity
    pools = {"name": "CMAKE_JOB_POOLS", "value": f"link={jobs.jobs}", "because": "--distribute",
             "reason": "links stay local: at most the local job count at once"}
    par.options = [pools, {"name": "CMAKE_JOB_POOL_LINK", "value": "link", "because": "--distribute",
                           "reason": "every link step in the local pool"}]
    return par


def print_plan(par: Parallel, w) -> None:
    """The plan's cache / distribution / jobs lines, each with its reason."""
    c = par.cache
    if c.kind is None:
        w("cache    none (--no-cache, cache.launcher = none, or no ccache/sccache on PATH)\n")
    else:
        w(f"cache    {c.kind} ({c.launcher}), local"
          + (" + remote" if c.remote_used and not c.remote_only else " (remote only)" if c.remote_used
             else "") + "\n")
        if c.remote:
            w(f"  remote {c.remote}: {c.remote_status}\n")
        if c.hip:
            w(f"  HIP: {c.hip}\n")
    j = par.jobs
    w(f"jobs     {j.jobs} — {j.reason}\n")
    if j.tensile_threads != j.jobs:
        w(f"  Tensile_CPU_THREADS-capable recipes get {j.tensile_threads}: min(16, jobs), as spack's "
          "rocblas package does (Tensile starts a job per core and uses a lot of memory)\n")
    d = par.distribution
    if d:
        w(f"distribute {d.tool}: {', '.join(d.hosts) or 'no host answered'} — {d.capacity} remote "
          f"slots; ninja -j {par.build_jobs}\n")
        if d.daemon:
            w(f"  local iceccd at {d.daemon}; the hosts compile with this machine's compiler, "
              "which icecream ships to them (icecc-create-env)\n")
        for x in d.left_out:
            w(f"  left out {x}\n")
        for x in d.local:
            w(f"  local: {x}\n")


def secret_env(par: Parallel | None) -> dict[str, str]:
    """The launcher's variables with their credentials, for the build's processes only."""
    return dict(par.cache.secret_env) if par else {}


@contextlib.contextmanager
def during_build(plan, say):
    """Around the build step: a fresh stats log before; after, this build's counts (for the
    manifest) and the hit-rate line; a failure the OOM killer caused says so and what to lower."""
    par = plan.parallel
    if par is None:
        yield
        return
    log = stats_log(plan.work)
    log.unlink(missing_ok=True)
    hip_env = par.distribution.hip_server if par.distribution else {}
    if par.distribution and par.distribution.hip_conf:
        path, text = par.distribution.hip_conf
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    if par.cache.kind == "sccache":
        _sccache(par.cache, "--zero-stats")
        if hip_env:
            _sccache(par.cache, "--zero-stats", env=hip_env)
    kills = oom_kills()
    try:
        yield
    except BuildError as exc:
        why = explain_oom(exc.message, kills, par.jobs)
        if why:
            raise BuildError(f"{why}\n{exc.message}", exc.hint) from exc
        raise
    finally:
        if par.cache.kind in ("ccache", "sccache"):
            par.stats = read_stats(log) if par.cache.kind == "ccache" else sccache_stats(par.cache)
            if par.cache.kind == "sccache" and hip_env:  # the HIP compiles' own server
                for k, v in sccache_stats(par.cache, env=hip_env).items():
                    par.stats[k] = par.stats.get(k, 0) + v
            for line in summary(par.cache, par.stats):
                say(f"  {line}")


def doctor_checks(environ: Mapping[str, str] | None = None) -> list[dict]:
    """For `rocforge doctor`: does the configured cache server and does each build host answer
    (and compile like this machine)? Empty when none is configured."""
    from rocforge_build import config

    environ = dict(os.environ if environ is None else environ)
    cfg = config.effective()
    rows = []
    url = cfg["cache"]["remote"]
    if url:
        scheme = urlsplit(url).scheme.lower()
        status = ("not checked: S3 needs the bucket's credentials" if scheme == "s3" else
                  probe(url) if scheme in CCACHE_SCHEMES else f"left out: unknown scheme {scheme!r}")
        rows.append({"what": "cache server", "address": redact(url), "status": status})
    compilers = [environ.get("CC", "cc"), environ.get("CXX", "c++")]
    reference = {c: _compiler_ident(c, None, environ) for c in compilers} if cfg["build"]["distcc_hosts"] else {}
    for spec in cfg["build"]["distcc_hosts"]:
        try:
            why = check_host(spec, compilers, reference, environ)
        except UsageError as exc:
            why = exc.message
        rows.append({"what": "distcc host", "address": spec, "status": why or "answers"})
    sched = cfg["build"]["icecc_scheduler"]
    if sched:
        try:
            servers = icecc_scheduler_hosts(sched)
            status = (f"answers: {len(servers)} host(s), "
                      f"{sum(h.max_jobs for h in servers if h.port)} remote job slots"
                      + "".join(f"; {h.name} ({h.address}) {h.max_jobs} jobs" for h in servers))
        except OSError as exc:
            status = f"does not answer ({exc.strerror or exc})"
        rows.append({"what": "icecream scheduler", "address": sched, "status": status})
        daemon = icecc_daemon(environ)
        rows.append({"what": "icecream daemon", "address": daemon or "this machine",
                     "status": "answers" if daemon else "not running (no iceccd socket answers)"})
    return rows
