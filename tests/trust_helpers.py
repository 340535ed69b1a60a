"""What the attack tests (tests/test_trust_*.py) share: rocforge run as a user runs it (a child
process, or `cli.main` in this one), its one error line, a tree's whole state to compare before
and after, a private mount namespace, a process holding a build's lock, and a build whose
programs tell whether they were started."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from stackfixtures import program

from rocforge_build import cli

REPO = Path(__file__).resolve().parent.parent


def rocforge(*args: str, env: dict | None = None, wrap: tuple[str, ...] = (),
             timeout: int = 300) -> subprocess.CompletedProcess:
    """`rocforge ARGS` in a child process (under the `wrap` command, if any), `env` added to this
    process's environment."""
    return subprocess.run([*wrap, sys.executable, "-m", "rocforge_build", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def python(code: str, *args: str, env: dict | None = None, wrap: tuple[str, ...] = ()
           ) -> subprocess.CompletedProcess:
    """`code` run by this Python in a child process that imports this checkout's rocforge."""
    return subprocess.run([*wrap, sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def run(capsys, *argv) -> tuple[int, str, str]:
    """rocforge's exit code, stdout, stderr run in this process; a parse error (argparse's
    SystemExit) included."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def machine(base: Path, **extra: str) -> dict:
    """Another machine's rocforge, as `rocforge(..., env=)` takes it: its own config, cache and
    data directories below `base` (and `extra` variables)."""
    return {"ROCFORGE_CONFIG_DIR": str(base / "config"), "ROCFORGE_CACHE_DIR": str(base / "cache"),
            "ROCFORGE_DATA_DIR": str(base / "data"), **extra}


def one_error_line(capsys) -> str:
    """The one `rocforge: error:` line an in-process command wrote (pytest's capsys), no traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("rocforge: error:")]) == 1, err
    assert "Traceback" not in "\n".join(err)
    return next(line for line in err if line.startswith("rocforge: error:"))


def one_error(res: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one `rocforge: error:` line of a child run that exited `code` without a traceback."""
    lines = [line for line in res.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert res.returncode == code, res.stderr
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def entries(top: Path) -> Iterator[tuple[str, Path]]:
    """Every path below `top` (links not followed), with its name relative to `top`."""
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            yield str(p.relative_to(top)), p


def snapshot(top: Path) -> dict[str, str]:
    """Every path below `top` with its kind and content (files) or target (links)."""
    return {rel: ("link:" + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir()
                  else "file:" + p.read_text(errors="replace")) for rel, p in entries(top)}


def mount_namespace() -> tuple[str, ...]:
    """The command that runs a program in a private mount namespace (a user namespace too when
    not root); the test is skipped, loudly, where the machine has none."""
    wrap = ("unshare", "--mount", "--propagation", "private") if os.geteuid() == 0 else (
        "unshare", "-rm", "--propagation", "private")
    probe = subprocess.run([*wrap, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"LOUD SKIP: no mount namespace here ({probe.stderr.decode().strip()})")
    return wrap


@contextlib.contextmanager
def build_lock_held(work: Path, ready: Path) -> Iterator[subprocess.Popen]:
    """A real process holding `work`'s build lock, as a running build does (forge/lock.py), from
    the moment it touched `ready` to the end of the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, pathlib; from rocforge_build.forge import lock; "
         "h = lock.acquire(pathlib.Path('/p'), pathlib.Path(sys.argv[1])); "
         "pathlib.Path(sys.argv[2]).touch(); time.sleep(60)", str(work), str(ready)],
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for _ in range(400):
            if ready.exists():
                break
            subprocess.run(["sleep", "0.05"])
        assert ready.exists()
        yield holder
    finally:
        holder.kill()
        holder.wait()


def never_run_prefix(tmp_path: Path) -> tuple[Path, Path]:
    """A build prefix whose programs, if ever started, create a marker file: (prefix, marker)."""
    prefix, marker = tmp_path / "build", tmp_path / "ran"
    for name in ("llama-bench", "llama-perplexity"):
        program(prefix, name, f"#!/bin/sh\ntouch {marker}\n")
    return prefix, marker
