"""The one subprocess wrapper: argv lists, shell-quoted logging, a missing program as a
ToolchainError rather than a traceback, and `None` env values meaning "unset".

Every `run` has a deadline: a short one (`PROBE`) unless the caller names another, or `None`
with its reason where the length is the work itself (a build, a download); a tool that overruns
it is stopped with its descendants and reported in one line (`ToolTimedOut`), so a hung `git`
or `cmake` on PATH can never hang rocforge.

Build steps (`spawn` + `reaped`) run in a process group of their own: when rocforge ends early
(Ctrl-C, SIGTERM, an error) the group gets SIGTERM (ninja passes it on to its jobs), and whatever
of it and its descendants is still alive after a grace period gets SIGKILL, so no compiler keeps
running in a build dir nobody owns any more.

A child that leaves its group and its parent (a server that daemonizes: fork, setsid, fork again)
is found all the same: every `spawn` marks its child's environment with a token of its own
(`MARK_ENV`), which every descendant inherits whatever group, session or parent it ends up in
(environ(7)), and `stop_group` stops every process of this user whose environment carries it
(/proc/PID/environ, readable for one's own processes without privileges)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from rocforge_build.errors import RocforgeError, ToolchainError, UsageError
from rocforge_build.shellsafe import one_line


class CommandFailed(RocforgeError):
    """A tool that failed: its command and the last lines of its output, each line escaped
    (`shellsafe.one_line`) so no control byte of a tool's output (ESC, CR, NUL) reaches the terminal."""

    def __init__(self, argv: Sequence[str], returncode: int, output: str = "", log: Path | None = None):
        where = f" (log: {one_line(log)})" if log else ""
        tail = "\n".join(one_line(line) for line in output.strip().splitlines()[-15:])
        super().__init__(
            f"command failed with exit code {returncode}: {one_line(quote(argv))}{where}"
            + (f"\n{tail}" if tail else ""),
        )
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        self.log = log


class ToolTimedOut(ToolchainError):
    """A tool that did not end within its deadline: hung, or waiting for input that never comes."""

    def __init__(self, argv: Sequence[str], seconds: float):
        name = one_line(os.path.basename(str(argv[0])))
        super().__init__(
            one_line(f"{name} did not finish within {seconds:g} s and was stopped: {quote(argv)}"),
            f"check that {name} answers on its own (run the command above); a {name} that "
                    f"waits on a network, a lock or a prompt hangs like this. {PROBE_ENV} sets the "
                    f"deadline of rocforge's short questions to tools (default {PROBE_DEFAULT_S:g} s)")
        self.argv = list(argv)
        self.seconds = seconds


# The deadline of a question to a tool (`--version`, `rev-parse`, `pkg-config --exists`): seconds
# on any machine, so a tool that takes longer is hung; a slow file system may need more.
PROBE_ENV = "ROCFORGE_PROBE_TIMEOUT"
PROBE_DEFAULT_S = 20.0


class _Probe:
    """`run`'s default deadline: `probe_seconds()` at the time of the call."""

    def __repr__(self) -> str:
        return "PROBE"


PROBE = _Probe()


def probe_seconds() -> float:
    """The probe deadline: ROCFORGE_PROBE_TIMEOUT when set, else PROBE_DEFAULT_S."""
    raw = os.environ.get(PROBE_ENV)
    if raw is None or raw == "":
        return PROBE_DEFAULT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= 86400:  # NaN fails too
        raise UsageError(f"{PROBE_ENV}={raw!r} is not a number of seconds above 0 up to 86400",
                         f"unset it or give seconds, e.g. {PROBE_ENV}=60")
    return seconds


def quote(argv: Sequence[str]) -> str:
    return shlex.join(str(a) for a in argv)


def merged_env(env: Mapping[str, str | None] | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    result = dict(os.environ if base is None else base)
    for key, value in (env or {}).items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


# The transports every git rocforge runs may use (git(1), GIT_ALLOW_PROTOCOL: the listed ones
# are allowed, every other one refused, whatever the user's git config says).  Others hand the URL
# to a helper program: `ext::CMD` runs CMD, so a config with protocol.ext.allow=always would let
# a recipe's or a submodule's URL run a command.
GIT_ALLOW_PROTOCOL = "https:http:ssh:git:file"


def git_env(env: Mapping[str, str | None] | None) -> dict[str, str | None]:
    """`env` for a git command: GIT_ALLOW_PROTOCOL set, unless the caller narrows it itself."""
    return {"GIT_ALLOW_PROTOCOL": GIT_ALLOW_PROTOCOL, **(env or {})}


def which(program: str, path: str | None = None) -> str | None:
    """The program's absolute path: one found through a relative PATH entry (`.venv/bin`) names
    it from this directory only, and builds run their launchers and compilers from others."""
    found = shutil.which(program, path=path)
    return os.path.abspath(found) if found else None


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    capture: bool = True,
    input: str | None = None,
    timeout: float | None | _Probe = PROBE,
    hint: str | None = None,
    group: bool = False,
    stdout: int | None = None,
    stderr: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a program; raise ToolchainError if it is missing, CommandFailed if it fails,
    ToolTimedOut (after stopping it and its descendants) if it overruns `timeout` seconds:
    `PROBE` unless given, `None` only where the run's length is the work itself.
    `group`: a build step (compiler driver): its own process group, stopped whole when
    rocforge is interrupted (see `reaped`); it gets no terminal input.  `stdout`: where an
    uncaptured run's output goes (a file descriptor), else rocforge's own.  `stderr`: None for
    the captured output (or rocforge's own stderr when not captured), `subprocess.PIPE` to
    capture it apart (`.stderr`), or a file descriptor."""
    args = [os.fspath(a) for a in argv]
    limit = probe_seconds() if isinstance(timeout, _Probe) else timeout
    full_env = merged_env(git_env(env) if os.path.basename(args[0]) == "git" else env)
    if os.path.sep not in args[0] and which(args[0], full_env.get("PATH")) is None:
        raise ToolchainError(f"required program {args[0]!r} was not found on PATH", hint)
    try:
        child = subprocess.Popen(
            args, env=full_env, cwd=cwd, text=True, errors="replace",
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL if group else None,
            stdout=subprocess.PIPE if capture else stdout,
            stderr=stderr if stderr is not None else subprocess.STDOUT if capture else None,
            process_group=0 if group else None)
    except FileNotFoundError as exc:
        raise ToolchainError(f"required program {args[0]!r} was not found", hint) from exc
    pipe = _fd_target(child.stdout)
    try:
        with reaped(child, grace=2.0):
            out, err = child.communicate(input, limit)
    except subprocess.TimeoutExpired:
        if pipe:
            _kill_holders(pipe)  # a child's orphan (reparented, not a descendant) holding its output
        raise ToolTimedOut(args, limit or 0.0) from None
    proc = subprocess.CompletedProcess(args, child.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandFailed(args, proc.returncode, proc.stdout or "")
    return proc


# -- build steps: a process group each, stopped whole --------------------------------------------

MARK_ENV = "ROCFORGE_SPAWN_MARK"  # a spawned child's own token, inherited by all it starts


def spawn(argv: Sequence[str], *, stdin=None, die_with_parent: bool = False, **kwargs) -> subprocess.Popen:
    """Start a build step in a new process group, its environment marked (`MARK_ENV`) so that
    `stop_group` finds even a descendant that left the group; its stdin is /dev/null unless given.
    `die_with_parent`: the child gets SIGTERM when rocforge dies, even by SIGKILL (Linux
    prctl(2) PR_SET_PDEATHSIG), so a server never outlives the `rocforge serve` that owns it."""
    import secrets

    if die_with_parent and sys.platform.startswith("linux"):
        kwargs["preexec_fn"] = _pdeathsig(os.getpid())
    mark = f"{os.getpid()}-{secrets.token_hex(12)}"
    env = kwargs.pop("env", None)
    kwargs["env"] = {**(os.environ if env is None else env), MARK_ENV: mark}
    child = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL if stdin is None else stdin,
                             process_group=0, **kwargs)
    child.rocforge_mark = mark  # type: ignore[attr-defined]
    return child


def _pdeathsig(parent: int):
    """A preexec function: SIGTERM to this child when its parent ends (prctl(2)), and ended at
    once if the parent is already gone (it died between fork and prctl)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm():
        prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


@contextlib.contextmanager
def reaped(child: subprocess.Popen, grace: float = 5.0) -> Iterator[subprocess.Popen]:
    """Whatever ends the block early (Ctrl-C, SIGTERM, an error) stops the child's whole
    process tree before it propagates."""
    try:
        yield child
    except BaseException:
        from rocforge_build import signals

        with signals.deferred():  # a second Ctrl-C must not cut the clean-up short
            stop_group(child, grace)
        raise


def stop_group(child: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM to the child's group and to every descendant (ninja puts each job in a group of
    its own) or process carrying its spawn mark (a daemon that left group and parent), then
    SIGKILL to those still alive after `grace` seconds.  Also after the child itself ended: what
    it left running is stopped."""
    family = [(child.pid, _start_time(child.pid)), *_descendants(child.pid)]
    known = {pid for pid, _ in family}
    family += [kid for kid in _marked(getattr(child, "rocforge_mark", None)) if kid[0] not in known]
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGTERM)
    for pid, start in family[1:]:
        _signal(pid, start, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(0.05)
        if not any(_alive(pid, start) for pid, start in family[1:]) and child.poll() is not None:
            break
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    for pid, start in family:
        _signal(pid, start, signal.SIGKILL)
    child.wait()
    _wait_gone(family[1:], grace)  # kill() only queues SIGKILL: "stopped" means gone
    for stream in (child.stdout, child.stderr, child.stdin):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state is [0], ppid [1], start time [19])."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def _start_time(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _alive(pid: int, start: str | None) -> bool:
    fields = _proc_stat(pid)
    return bool(fields) and fields[0] != "Z" and (start is None or fields[19] == start)


def _signal(pid: int, start: str | None, signum: int) -> None:
    """Signal `pid` only while it is still the process first seen (not a reused pid)."""
    if _alive(pid, start):
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _marked(mark: str | None) -> list[tuple[int, str | None]]:
    """Every live process but this one whose environment carries `MARK_ENV=mark`, as (pid, start
    time); another user's processes cannot be read, and cannot be ours."""
    if not mark:
        return []
    needle, me, out = f"{MARK_ENV}={mark}".encode(), os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                found = needle in fh.read().split(b"\0")
        except OSError:
            continue
        if found and _alive(int(name), None):
            out.append((int(name), _start_time(int(name))))
    return out


def _descendants(pid: int) -> list[tuple[int, str | None]]:
    """Every live descendant of `pid` as (pid, start time), read from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        fields = _proc_stat(int(name))
        if fields and len(fields) > 19:
            children.setdefault(int(fields[1]), []).append((int(name), fields[19]))
    out, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid[0])
    return out


# -- who listens on a port: /proc/net/tcp{,6} against a process tree's sockets --------------------

def _proc_net_address(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """(address, port) of a /proc/net/tcp{,6} `local_address` field: the address as the kernel's
    32-bit words in host byte order, hex (proc(5)); an IPv4-mapped IPv6 address as IPv4."""
    try:
        hexaddr, hexport = field.split(":")
        raw = b"".join(int(hexaddr[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hexaddr), 8))
        addr = ipaddress.ip_address(raw)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
            addr = addr.ipv4_mapped
        return addr, int(hexport, 16)
    except ValueError:
        return None


def _listeners(port: int) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] | None:
    """(address, inode) of every TCP socket listening on `port`, or None where /proc/net is
    unreadable (proc(5): /proc/net/tcp, state 0A is LISTEN, the inode is the 10th field)."""
    found = []
    read_any = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            local = _proc_net_address(fields[1]) if len(fields) >= 10 and fields[3] == "0A" else None
            if local and local[1] == port and fields[9].isdigit():
                found.append((local[0], int(fields[9])))
    return found if read_any else None


def _fd_target(stream) -> str | None:
    """What one of rocforge's own file descriptors is, as /proc shows it (`pipe:[INODE]`)."""
    try:
        return os.readlink(f"/proc/self/fd/{stream.fileno()}") if stream is not None else None
    except (OSError, ValueError):
        return None


def _kill_holders(target: str, grace: float = 2.0) -> None:
    """SIGKILL every other process with a file descriptor on `target` (a pipe rocforge made for
    one child, which only that child's tree can have inherited), and wait until they are gone:
    kill() only queues the signal, and a loaded machine may run the process again much later."""
    me, killed = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{name}/fd/{fd}") == target:
                        killed.append((int(name), _start_time(int(name))))
                        os.kill(int(name), signal.SIGKILL)
                        break
    _wait_gone(killed, grace)


def _wait_gone(family: list[tuple[int, str | None]], seconds: float) -> None:
    """Until every process of `family` has ended (a zombie counts as ended), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while any(_alive(pid, start) for pid, start in family) and time.monotonic() < deadline:
        time.sleep(0.01)


def _socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets open in `pid` (its /proc/PID/fd links read `socket:[INODE]`)."""
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and target.endswith("]"):
                out.add(int(target[8:-1]))
    return out


def free_loopback_port(avoid: frozenset[int] = frozenset()) -> int:
    """A loopback port the kernel has free now (for a server rocforge starts: llama-server, the
    canary's reference, the front), none of `avoid`: a port that is free but not yet
    bound (the front's own, taken only once llama-server is warm) can be drawn again."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            break
    return port


def port_holder(pid: int, address: str, port: int) -> str:
    """Who takes a connection to `address` (an IP literal) port `port`: "ours" (`pid` or one of
    its descendants), "other" (another program), "nobody", or "unknown" where /proc cannot tell.
    The kernel gives it to a socket bound to that very address if there is one, else to a
    wildcard one (0.0.0.0, or :: for either family): a socket of ours on another address of the
    same port (::1 beside 127.0.0.1) does not count."""
    listening = _listeners(port)
    if listening is None:
        return "unknown"
    want = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(want, ipaddress.IPv6Address) and want.ipv4_mapped:
        want = want.ipv4_mapped
    exact = {inode for addr, inode in listening if addr == want}
    wild = {inode for addr, inode in listening if addr.is_unspecified
            and (addr.version == want.version or addr.version == 6)}
    takers = exact or wild
    if not takers:
        return "nobody"
    ours: set[int] = set()
    for member in [pid, *(p for p, _ in _descendants(pid))]:
        ours |= _socket_inodes(member)
    return "ours" if takers <= ours else "other"
