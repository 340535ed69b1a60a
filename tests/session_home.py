"""The test session's own HOME: every program a test starts (git, sccache, ccache, rocforge)
finds its per-user files inside the session's temporary directory, so a run writes nothing into
the contributor's real HOME and reads none of their settings (a ~/.gitconfig, an sccache config
with a remote cache); tests/conftest.py calls these at the start and the end of the session.

Kept between runs, fixed here before HOME moves: the slow tests' downloads in
~/.cache/rocforge-test (sdists, the sid chroot, the trained model: ROCFORGE_TEST_SDISTS,
ROCFORGE_TEST_CHROOTS, ROCFORGE_TEST_MODELS) and the llama builds' compiler cache, ccache's own
~/.cache/ccache (ROCFORGE_TEST_CCACHE; content-addressed, so sharing it changes no result).  Left
below the session's HOME, each run would download the model and compile llama.cpp cold.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

MARK = "ROCFORGE_TEST_SESSION"  # inherited by every process the session starts: its ownership mark
_XDG = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_DIRS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_outside_the_ephemeral_range() -> int:
    """A loopback port free now that the kernel never hands out for bind(0) or an outgoing
    connection (it lies below ip_local_port_range): the session's sccache port is chosen at the
    start and bound only when a test first starts sccache, so a port from that range could be
    taken by then.  Drawn at random below it, so two sessions at once take different ports."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    below = list(range(max(low - 8192, 1024), low))
    random.shuffle(below)
    for port in below[:256]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return _free_port()


def isolate(base: str) -> str:
    """Point HOME (and sccache's directory and server port) into `base`; returns the new HOME."""
    real_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    kept = os.path.join(real_cache, "rocforge-test")
    os.environ.setdefault("ROCFORGE_TEST_SDISTS", os.path.join(kept, "sdists"))
    os.environ.setdefault("ROCFORGE_TEST_CHROOTS", os.path.join(kept, "chroots"))
    os.environ.setdefault("ROCFORGE_TEST_MODELS", os.path.join(kept, "models"))
    os.environ.setdefault("ROCFORGE_TEST_CCACHE", os.path.join(real_cache, "ccache"))
    home = os.path.join(base, "home")
    os.makedirs(home, exist_ok=True)
    os.environ["HOME"] = home
    for var in _XDG:  # each program's default then lies below the session's HOME
        os.environ.pop(var, None)
    # a test that starts sccache without choosing a port talks to the session's own server, never
    # to one the contributor runs on sccache's default port 4226
    os.environ["SCCACHE_DIR"] = os.path.join(base, "sccache")
    os.environ["SCCACHE_SERVER_PORT"] = str(_port_outside_the_ephemeral_range())
    os.environ[MARK] = base
    return home


def _environ(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def session_sccache_servers(base: str) -> list[tuple[int, str, dict[str, str]]]:
    """(pid, executable, environment) of each running sccache that carries this session's mark."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if os.path.basename(exe).startswith("sccache") and (env := _environ(pid)).get(MARK) == base:
            found.append((int(pid), exe, env))
    return found


def stop_sccache_servers(base: str, wait: float = 5.0) -> list[int]:
    """Stop every sccache server the session started (`sccache --stop-server` with its own
    environment, then SIGTERM to one that stays); returns the pids that were running."""
    servers = session_sccache_servers(base)
    for _pid, exe, env in servers:
        if os.path.exists(exe):
            subprocess.run([exe, "--stop-server"], env=env, capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + wait
    left = servers
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [s for s in left if os.path.exists(f"/proc/{s[0]}")]
    for pid, _exe, _env in left:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return [pid for pid, _exe, _env in servers]
