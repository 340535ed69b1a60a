"""Distributed compiles for `rocforge build --distribute`: distcc hosts (behind ccache's
`prefix_command`), icecream's scheduler, or sccache-dist through sccache's own configuration.

`setup_distribution()` keeps the hosts that answer *and* compile with this build's compiler (a
host with another compiler version would give mixed objects and, behind ccache, cache entries
stored under the local compiler's hash), counts their job slots, and keeps links and HIP
compiles local, each with the reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import ownership, proc
from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.forge.cache import PROBE_TIMEOUT, CacheSetup, printable, run_sccache
from rocforge_build.proc import which
from rocforge_build.toml_subset import tomllib_parse


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
        reference = {c: compiler_ident(c, None, environ) for c in compilers}
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
    import tomlkit

    try:
        doc = tomllib_parse(config.read_text(encoding="utf-8"))
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
        status = json.loads(run_sccache(cache, "--dist-status"))
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
    port = int(port) if port.isascii() and port.isdigit() else ICECC_SCHEDULER_PORT
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
                      f"(it answered {printable(data)})")
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
    return host, int(port) if port.isascii() and port.isdigit() else 3632


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
        ident = compiler_ident(compiler, spec, environ)
        if ident is None:
            return f"refused or failed a test compile with {compiler}"
        if reference.get(compiler) and ident != reference[compiler]:
            return (f"compiles {compiler} as {ident!r}, this machine as {reference[compiler]!r}: "
                    "objects of different compilers must not mix, and ccache would store them "
                    "under this machine's compiler")
    return None


def compiler_ident(compiler: str, host: str | None, environ: Mapping[str, str]) -> str | None:
    """The compiler's own identification (the ELF `.comment` it writes), from a test compile
    here (host None) or on one distcc host: what produced the object, not what its name says."""
    with ownership.scratch_dir(None, "rocforge-probe-") as tmp:
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
            res = proc.run(argv, env=env, check=False, stderr=subprocess.PIPE,
                           timeout=PROBE_TIMEOUT * 6)
        except (RocforgeError, OSError):
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
