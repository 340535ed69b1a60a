"""The command line's own manners: a misspelling gets a suggestion, a command missing its action
lists the actions (the newcomer trial typed `--traget` and a bare `rocforge nightly`)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def rocforge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocforge_build", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("argv,hint", [
    (["build", "llama-cpp", "--traget", "gfx1151"], "rocforge: hint: --traget: did you mean --target?"),
    (["doctor", "--jsno"], "rocforge: hint: --jsno: did you mean --json?"),
    (["buidl"], "rocforge: hint: did you mean 'build'?"),
    (["nightly", "instal"], "rocforge: hint: did you mean 'install'?"),
    (["nightly"], "rocforge: hint: actions: list, install, installed, use, prune, pip"),
    (["doctor", "--frobnicate"], "rocforge: hint: --frobnicate: no such option"),
])
def test_usage_errors_carry_a_hint(argv, hint):
    out = rocforge(*argv)
    assert out.returncode == 2
    assert hint in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_correct_command_line_prints_no_hint():
    out = rocforge("targets", "gfx1151")
    assert out.returncode == 0 and "hint" not in out.stderr


def test_a_mistyped_command_names_the_command_not_its_options():
    # `--backend` is build's option: judged against no command it is not "no such option"
    out = rocforge("biuld", "llama-cpp", "--backend", "cpu")
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert lines[0].startswith("rocforge: error: argument COMMAND: invalid choice: 'biuld'")
    assert lines[1:] == ["rocforge: hint: did you mean 'build'?"]
