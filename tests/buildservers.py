"""Real build servers for the cache/distribution tests: Debian's redis-server and distccd on
loopback, and a second network namespace (ip netns + veth) standing in for another host.

Each helper is a context manager that starts the daemon, waits until it answers, and stops it
(by its own pid) on exit."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

_NS_COUNTER = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(*programs: str, root: bool = False) -> None:
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian packages in .ci/apt-packages.txt)")
    if root and os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, distccd --user)")


HIP_BITCODE = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")  # Debian's rocm-device-libs (hipcc's)


def hip_compile(tmp: Path, obj: Path) -> list[str]:
    """A real HIP compile with offload: Debian's clang 15, HIP headers and device libraries, one
    small kernel written into `tmp`; the argv (no launcher) that compiles it to `obj`."""
    need("clang++-15")
    if not (HIP_BITCODE / "ocml.bc").is_file() or not Path("/usr/include/hip/hip_runtime.h").is_file():
        pytest.skip("needs Debian's HIP headers and device libraries (apt-get install hipcc)")
    kernel = tmp / "k.hip"
    kernel.write_text("#include <hip/hip_runtime.h>\n__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    return ["clang++-15", "-x", "hip", "--offload-arch=gfx1030", "--rocm-path=/usr",
            f"--hip-device-lib-path={HIP_BITCODE}", "-O2", "-c", str(kernel), "-o", str(obj)]


def _wait(host: str, port: int, proc: subprocess.Popen, what: str, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {host}:{port}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def redis_server(tmp: Path, password: str | None = None):
    """redis-server on 127.0.0.1, no persistence; yields (port, Popen)."""
    need("redis-server")
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp)]
    if password:
        argv += ["--requirepass", password]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait("127.0.0.1", port, proc, "redis-server")
        yield port, proc
    finally:
        _stop(proc)


def redis_keys(port: int, password: str | None = None) -> int:
    argv = ["redis-cli", "-p", str(port)] + (["--no-auth-warning", "-a", password] if password else [])
    return int(subprocess.run([*argv, "dbsize"], capture_output=True, text=True, check=True).stdout)


@contextlib.contextmanager
def distccd(tmp: Path, *, listen: str = "127.0.0.1", allow: str = "127.0.0.1", netns: str | None = None,
            other_compiler: bool = False, jobs: int = 2):
    """distccd (foreground, as nobody) on listen:port; yields (port, log file).  `other_compiler`:
    in its own mount namespace GCC's binaries are clang 15, a host whose `cc` is another compiler."""
    need("distccd", root=True)
    port = free_port()
    # distccd writes its log as nobody: a directory nobody can reach (pytest's tmp dirs are 0700)
    logdir = Path(tempfile.mkdtemp(prefix=f"rocforge-distccd-{port}-"))
    logdir.chmod(0o777)
    log = logdir / "distccd.log"
    argv = ["distccd", "--no-detach", "--daemon", "--listen", listen, "--allow", allow,
            "--port", str(port), "--user", "nobody", "--jobs", str(jobs), "--log-file", str(log),
            "--log-level", "info"]
    if other_compiler:
        need("clang-15", "unshare")  # Debian's clang 15 comes with hipcc (.ci/apt-packages.txt)
        swap = " && ".join(f"mount --bind /usr/bin/clang-15 /usr/bin/{g}"
                           for g in ("x86_64-linux-gnu-gcc-12", "x86_64-linux-gnu-g++-12"))
        argv = ["unshare", "-m", "sh", "-c",
                f"mount --make-rprivate / && {swap} && exec {' '.join(argv)}"]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(listen, port, proc, "distccd")
        yield port, log
    finally:
        _stop(proc)
        shutil.rmtree(logdir, ignore_errors=True)


def remote_jobs(log: Path, sources: tuple[str, ...] = ()) -> int:
    """Compiles a distccd finished, from its own log (`COMPILE_OK ... <compiler> <source>`),
    only those of `sources` when given."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if "COMPILE_OK" in ln]
    except OSError:
        return 0
    return sum(1 for ln in lines if not sources or Path(ln.rsplit(" ", 1)[-1]).name in sources)


@contextlib.contextmanager
def other_host():
    """A network namespace joined to this one by a veth pair: yields (netns, our address, its
    address), removed on exit."""
    need("ip", root=True)
    n = (os.getpid() % 200) * 10 + next(_NS_COUNTER) % 10
    ns, a, b = f"rf14-{n}", f"rf14h{n}", f"rf14p{n}"
    net = f"10.{214 + n // 250}.{n % 250}"
    mine, theirs = f"{net}.1", f"{net}.2"
    steps = [["ip", "netns", "add", ns],
             ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
             ["ip", "link", "set", b, "netns", ns],
             ["ip", "addr", "add", f"{mine}/24", "dev", a], ["ip", "link", "set", a, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{theirs}/24", "dev", b],
             ["ip", "netns", "exec", ns, "ip", "link", "set", b, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    try:
        for argv in steps:
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot make a network namespace here: {' '.join(argv)}: {r.stderr.strip()}")
        yield ns, mine, theirs
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# -- icecream -------------------------------------------------------------------------------------

class Icecream:
    """An icecc-scheduler and its daemons; `base` is a directory the icecc user owns: iceccd 1.4
    drops to that user (keeping only CAP_SYS_CHROOT) *before* it creates its env dir (-b) and
    opens its log, so both must be where that user can write — a root-owned or 0700 parent fails
    with "mkdir in cleanup_cache() failed" (or chown/chmod when the dir already exists)."""

    def __init__(self, base: Path, port: int, netname: str):
        self.base, self.port, self.netname = base, port, netname
        self.procs: list[subprocess.Popen] = []

    def log(self, name: str) -> Path:
        return self.base / f"{name}.log"

    def socket(self, name: str) -> str:
        return str(self.base / f"{name}.sock")

    def hosts(self) -> str:
        """The scheduler's `listcs` answer (its text interface, port + 1)."""
        with socket.create_connection(("127.0.0.1", self.port + 1), timeout=5) as s:
            s.sendall(b"listcs\nquit\n")
            data = b""
            while b"200 Good Bye" not in data and (chunk := s.recv(65536)):
                data += chunk
        return data.decode(errors="replace")

    def daemon(self, name: str | None, scheduler_addr: str, *, netns: str | None = None,
               no_remote: bool = False, jobs: int = 2, other_compiler: bool = False) -> str:
        """Start an iceccd (node name `name`, default: the host name) that talks to the
        scheduler at scheduler_addr, and wait until the scheduler lists it; yields its log
        name.  The client finds it at socket(label) (ICECC_TEST_SOCKET, icecc's own way to
        name a daemon's socket; the default /var/run/icecc one may belong to a system iceccd)."""
        label = name or "local"
        argv = ["iceccd", "-s", f"{scheduler_addr}:{self.port}", "-n", self.netname,
                "-b", str(self.base / f"envs-{label}"), "-l", str(self.log(label)), "-vvv",
                "-m", str(jobs)]
        argv += ["-N", name] if name else []
        argv += ["--no-remote"] if no_remote else ["-p", str(free_port())]
        if other_compiler:  # this host's own gcc is clang 15 (its mount namespace only)
            need("clang-15", "unshare")
            swap = " && ".join(f"mount --bind /usr/bin/clang-15 /usr/bin/{g}"
                               for g in ("x86_64-linux-gnu-gcc-12", "x86_64-linux-gnu-g++-12"))
            argv = ["unshare", "-m", "sh", "-c",
                    f"mount --make-rprivate / && {swap} && "
                    f"gcc --version > {self.base / (label + '.cc')} && exec {' '.join(argv)}"]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        env = {**os.environ, "ICECC_TEST_SOCKET": self.socket(label)}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        shown = f" {name} (" if name else f" {socket.gethostname()} ("
        end = time.monotonic() + 20  # a daemon retries the scheduler every 3 s
        while shown not in self.hosts():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"iceccd {label} did not reach the scheduler: "
                                   + self.log(label).read_text(errors="replace")[-2000:])
            time.sleep(0.3)
        return label

    def remote_compiles(self, label: str) -> list[str]:
        """The files daemon `label` compiled for other machines (its log, -vvv)."""
        try:
            text = self.log(label).read_text(errors="replace")
        except OSError:
            return []
        return [Path(ln.rsplit(" ", 1)[-1]).name for ln in text.splitlines() if "remote compile for file" in ln]


@contextlib.contextmanager
def icecream():
    """icecc-scheduler (Debian's icecc 1.4) on all addresses, its own network name and port."""
    need("icecc-scheduler", "iceccd", "icecc", root=True)
    try:
        import pwd

        icecc_user = pwd.getpwnam("icecc")
    except KeyError:
        pytest.skip("needs the icecc user (Debian package icecc)")
    base = Path(tempfile.mkdtemp(prefix="rocforge-icecc-"))
    os.chown(base, icecc_user.pw_uid, icecc_user.pw_gid)
    while True:  # the scheduler takes port and port + 1 (its text interface)
        port = free_port()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port + 1)) != 0:
                break
    ice = Icecream(base, port, f"rf14-{os.getpid()}")
    sched = subprocess.Popen(["icecc-scheduler", "-p", str(port), "-n", ice.netname,
                              "-l", str(ice.log("scheduler")), "-vvv"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ice.procs.append(sched)
    try:
        _wait("127.0.0.1", port + 1, sched, "icecc-scheduler")
        yield ice
    finally:
        for proc in reversed(ice.procs):
            _stop(proc)
        shutil.rmtree(base, ignore_errors=True)


# -- sccache-dist ---------------------------------------------------------------------------------

def sccache_dist_server_token(dist_exe: Path, key: str, server: str) -> str:
    """The build server's JWT for `key`; the key is URL-safe base64 and one in 64 starts with '-',
    which clap reads as a flag after a separate `--secret-key`, so it goes in the same word."""
    return subprocess.run([dist_exe, "auth", "generate-jwt-hs256-server-token", f"--secret-key={key}",
                           "--server", server], capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def sccache_dist(tmp: Path, dist_exe: Path, *, scheduler_addr: str = "127.0.0.1",
                 server_addr: str = "127.0.0.1", netns: str | None = None):
    """sccache-dist's scheduler on scheduler_addr and one build server (the overlay builder:
    bubblewrap, as root) on server_addr, in `netns` when given; yields the client's sccache
    config file ([dist] scheduler_url + token) and the server's address."""
    need("bwrap", root=True)
    key = subprocess.run([dist_exe, "auth", "generate-jwt-hs256-key"], capture_output=True,
                         text=True, check=True).stdout.strip()
    sport, port = free_port(), free_port()
    server = f"{server_addr}:{port}"
    token = sccache_dist_server_token(dist_exe, key, server)
    (tmp / "scheduler.toml").write_text(
        f'public_addr = "{scheduler_addr}:{sport}"\n[client_auth]\ntype = "token"\ntoken = "client-tok"\n'
        f'[server_auth]\ntype = "jwt_hs256"\nsecret_key = "{key}"\n')
    (tmp / "server.toml").write_text(
        f'cache_dir = "{tmp / "toolchains"}"\npublic_addr = "{server}"\n'
        f'scheduler_url = "http://{scheduler_addr}:{sport}"\n'
        f'[builder]\ntype = "overlay"\nbuild_dir = "{tmp / "build"}"\nbwrap_path = "{shutil.which("bwrap")}"\n'
        f'[scheduler_auth]\ntype = "jwt_token"\ntoken = "{token}"\n')
    client = tmp / "client.toml"
    client.write_text(f'[dist]\nscheduler_url = "http://{scheduler_addr}:{sport}"\ntoolchains = []\n'
                      f'cache_dir = "{tmp / "client-toolchains"}"\n'
                      '[dist.auth]\ntype = "token"\ntoken = "client-tok"\n')
    env = {**os.environ, "RUST_LOG": "info", "SCCACHE_NO_DAEMON": "1"}  # else both fork away
    with open(tmp / "scheduler.log", "wb") as slog, open(tmp / "server.log", "wb") as vlog:
        sched = subprocess.Popen([dist_exe, "scheduler", "--config", tmp / "scheduler.toml"],
                                 env=env, stdout=slog, stderr=subprocess.STDOUT)
        argv = [str(dist_exe), "server", "--config", str(tmp / "server.toml")]
        srv = subprocess.Popen(["ip", "netns", "exec", netns, *argv] if netns else argv,
                               env=env, stdout=vlog, stderr=subprocess.STDOUT)
        try:
            _wait(scheduler_addr, sport, sched, "sccache-dist scheduler")
            end = time.monotonic() + 20  # the server registers with the scheduler
            while sccache_dist_servers(f"{scheduler_addr}:{sport}") < 1:
                if srv.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("sccache-dist server did not register: "
                                       + (tmp / "server.log").read_text(errors="replace")[-2000:])
                time.sleep(0.2)
            yield client, server
        finally:
            _stop(srv)
            _stop(sched)


def sccache_dist_servers(scheduler: str) -> int:
    """Build servers the scheduler knows: its status API (bincode: num_servers as u64 first)."""
    import urllib.request

    req = urllib.request.Request(f"http://{scheduler}/api/v1/scheduler/status",
                                 headers={"Authorization": "Bearer client-tok"})
    try:
        return int.from_bytes(urllib.request.urlopen(req, timeout=2).read()[:8], "little")
    except OSError:
        return 0
