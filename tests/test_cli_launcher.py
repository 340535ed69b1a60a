"""The `rocforge` command is bin/rocforge (pyproject.toml installs it as a script), not an
entry-point wrapper: pip's wrapper imports `re` before rocforge, 5-6 ms of every shell start-up
that runs `rocforge env` (more than rocforge's own cached answer; docs/measurements/env.md).
That `pip install` puts this file in place is checked by test_ship_containers.py's slow
test_installed_rocforge_ships_its_own_wheel, which installs rocforge into a new venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parent.parent / "bin" / "rocforge"


def test_the_launcher_imports_nothing_before_rocforge():
    out = subprocess.run([sys.executable, "-X", "importtime", str(LAUNCHER), "--version"],
                         capture_output=True, text=True, check=True, cwd=LAUNCHER.parent.parent)
    assert out.stdout.startswith("rocforge ")
    names = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    after_site = names[names.index("site") + 1:]
    # the first module imported after the interpreter's own start-up is rocforge's (pip's
    # wrapper would put `re`, `enum`, ... here)
    assert after_site and after_site[0].startswith("rocforge_build"), after_site[:5]
    assert "import re" not in LAUNCHER.read_text()
