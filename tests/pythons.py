"""The Pythons rocforge's extraction and install are tested on: the one running the tests and
Debian 12's own /usr/bin/python3.11 (3.11.2, whose tarfile has no `data` filter), each running
the real CLI in a subprocess.  The Debian runs are marked slow: CI (`--run-slow`) has them.

Debian's interpreter gets the checkout and this environment's site-packages on PYTHONPATH
(the same 3.11 ABI), so it needs no venv and no network."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
DEBIAN_PYTHON = "/usr/bin/python3.11"


def _pythons() -> list:
    out = [pytest.param(sys.executable, id="default-python")]
    if not os.path.exists(DEBIAN_PYTHON):  # CI (Debian 12) always has it: say so loudly
        why = f"{DEBIAN_PYTHON} (Debian 12's python3) is not installed here"
    elif os.path.realpath(DEBIAN_PYTHON) == os.path.realpath(sys.executable):
        why = f"[optional] the tests run on {DEBIAN_PYTHON} already (default-python)"
    else:
        why = None
    # the second interpreter runs with --run-slow (CI): the fast loop stays on one Python
    marks = [pytest.mark.skip(reason=why)] if why else [pytest.mark.slow]
    out.append(pytest.param(DEBIAN_PYTHON, id="debian-python3.11", marks=marks))
    return out


PYTHONS = _pythons()


def env_for(python: str, **extra: str) -> dict[str, str]:
    """The checkout first, then whatever gave this test run its packages (a PYTHONPATH already
    set, this environment's site-packages)."""
    paths = [str(CHECKOUT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    paths += sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            "PYTHONDONTWRITEBYTECODE": "1", **extra}


def rocforge(python: str, *argv: str, umask: int | None = None, wrap: list[str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m rocforge_build ARGV` (inside `wrap`, e.g. an unshare command, when given)."""
    cmd = [*(wrap or []), python, "-m", "rocforge_build", *argv]
    return subprocess.run(cmd, env=env_for(python), capture_output=True, text=True,
                          timeout=timeout,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
