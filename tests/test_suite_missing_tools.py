"""The suite's own promise about missing tools (README, "Developing"): on a machine without a tool a
test needs, `nox -s tests` stays green and lists that test under NOT RUN with the tool it lacks;
under CI=true the same skip fails the run, while chosen skips ([optional], slow) never do.

A probe test file is run by a real pytest with this suite's conftest.py as a plugin, once as a
developer would and once as .ci/run does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

PROBE = '''
import pytest
from needs import needs

@needs("rocforge-no-such-tool")
def test_needs_a_tool_this_machine_lacks():
    pass

def test_optional_hardware():
    pytest.skip("[optional] an AMD GPU")

def test_plain():
    pass
'''


def _pytest(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "ROCFORGE_TEST_README_PATH")}
    env["PYTHONPATH"] = str(TESTS)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
                           "-q", "test_probe.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_missing_tool_is_listed_as_not_run_and_the_run_stays_green(tmp_path):
    r = _pytest(tmp_path, ci=False)
    assert r.returncode == 0, r.stdout + r.stderr
    section = r.stdout.split("NOT RUN: this machine lacks what these tests need", 1)
    assert len(section) == 2, r.stdout
    listed = [line for line in section[1].splitlines() if "test_probe.py::" in line]
    # exactly the test whose tool is missing, with the tool's name; the chosen skip is not listed
    assert listed == ["test_probe.py::test_needs_a_tool_this_machine_lacks: lacks rocforge-no-such-tool "
                      "(Debian packages in .ci/apt-packages.txt)"], r.stdout
    assert "1 passed, 2 skipped" in r.stdout


def test_under_ci_a_missing_tool_fails_the_run_and_a_chosen_skip_does_not(tmp_path):
    r = _pytest(tmp_path, ci=True)
    assert r.returncode == 1, r.stdout + r.stderr
    # a mark's skip happens at set-up, so pytest counts the failure as an error there
    assert "test_probe.py::test_needs_a_tool_this_machine_lacks" in r.stdout
    assert "skipped under CI=true, which must run it: lacks rocforge-no-such-tool" in r.stdout
    assert "1 passed, 1 skipped, 1 error" in r.stdout
