"""The one subprocess wrapper: argv lists, shell-quoted logging, a missing program as a
ToolchainError rather than a traceback, and `None` env values meaning "unset".

Build steps (`spawn` + `reaped`) run in a process group of their own: when rocforge ends early
(Ctrl-C, SIGTERM, an error) the group gets SIGTERM (ninja passes it on to its jobs), and whatever
of it and its descendants is still alive after a grace period gets SIGKILL, so no compiler keeps
running in a build dir nobody owns any more."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from rocforge_build.errors import RocforgeError, ToolchainError


class CommandFailed(RocforgeError):
    def __init__(self, argv: Sequence[str], returncode: int, output: str = "", log: Path | None = None):
        where = f" (log: {log})" if log else ""
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(
            f"command failed with exit code {returncode}: {quote(argv)}{where}"
            + (f"\n{tail}" if tail else ""),
        )
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        self.log = log


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
    return shutil.which(program, path=path)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    capture: bool = True,
    input: str | None = None,
    timeout: float | None = None,
    hint: str | None = None,
    group: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a program; raise ToolchainError if it is missing, CommandFailed if it fails.
    `group`: a build step (compiler driver): its own process group, stopped whole when
    rocforge is interrupted (see `reaped`); it gets no terminal input."""
    args = [os.fspath(a) for a in argv]
    full_env = merged_env(git_env(env) if os.path.basename(args[0]) == "git" else env)
    if os.path.sep not in args[0] and which(args[0], full_env.get("PATH")) is None:
        raise ToolchainError(f"required program {args[0]!r} was not found on PATH", hint)
    if group:
        try:
            child = spawn(args, env=full_env, cwd=cwd, stdin=subprocess.PIPE if input else None,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None,
                          text=True, errors="replace")
        except FileNotFoundError as exc:
            raise ToolchainError(f"required program {args[0]!r} was not found", hint) from exc
        with reaped(child):
            out, _ = child.communicate(input, timeout)
        proc = subprocess.CompletedProcess(args, child.returncode, out, None)
        if check and proc.returncode != 0:
            raise CommandFailed(args, proc.returncode, proc.stdout or "")
        return proc
    try:
        proc = subprocess.run(
            args, env=full_env, cwd=cwd, text=True, input=input, timeout=timeout,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            errors="replace",
        )
    except FileNotFoundError as exc:
        raise ToolchainError(f"required program {args[0]!r} was not found", hint) from exc
    if check and proc.returncode != 0:
        raise CommandFailed(args, proc.returncode, proc.stdout or "")
    return proc


# -- build steps: a process group each, stopped whole --------------------------------------------

def spawn(argv: Sequence[str], *, stdin=None, **kwargs) -> subprocess.Popen:
    """Start a build step in a new process group; its stdin is /dev/null unless given."""
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL if stdin is None else stdin,
                            process_group=0, **kwargs)


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
    its own), then SIGKILL to those still alive after `grace` seconds."""
    family = [(child.pid, _start_time(child.pid)), *_descendants(child.pid)]
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
