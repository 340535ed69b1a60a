"""The one subprocess wrapper: argv lists, shell-quoted logging, a missing program as a
ToolchainError rather than a traceback, and `None` env values meaning "unset"."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
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
) -> subprocess.CompletedProcess[str]:
    """Run a program; raise ToolchainError if it is missing, CommandFailed if it fails."""
    args = [os.fspath(a) for a in argv]
    full_env = merged_env(env)
    if os.path.sep not in args[0] and which(args[0], full_env.get("PATH")) is None:
        raise ToolchainError(f"required program {args[0]!r} was not found on PATH", hint)
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
