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
