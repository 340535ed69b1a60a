"""The `rocforge` command that pip installs is bin/rocforge, not an entry-point wrapper: pip's
wrapper imports `re` before rocforge, 5-6 ms of every shell start-up that runs `rocforge env`
(more than rocforge's own cached answer; docs/measurements/env.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def installed_command() -> Path:
    script = Path(sys.executable).parent / "rocforge"
    if not script.exists():
        pytest.skip(f"no rocforge command beside {sys.executable}: rocforge is not installed here")
    return script


def test_the_installed_command_is_the_lean_launcher():
    script = installed_command()
    text = script.read_text()
    assert text.startswith("#!")  # the installer's interpreter line
    assert text.split("\n", 1)[1] == (REPO / "bin" / "rocforge").read_text().split("\n", 1)[1]
    assert "import re" not in text


def test_the_launcher_imports_nothing_before_rocforge():
    script = installed_command()
    out = subprocess.run([sys.executable, "-X", "importtime", str(script), "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("rocforge ")
    names = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    top = names[names.index("site") + 1:] if "site" in names else names
    # the first module imported after the interpreter's own start-up is rocforge's
    assert top and top[0].startswith("rocforge_build"), top[:5]
