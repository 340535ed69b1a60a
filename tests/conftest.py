"""Shared test set-up: slow tests behind --run-slow, and no test touches the user's own
HOME, config, cache, data or ROCm environment, or leaves an sccache server running."""

from __future__ import annotations

import os
import signal

import pytest
import session_home

# a real HTTP server on 127.0.0.1 (`http_server` fixture): see tests/http_fixture.py
pytest_plugins = ["http_fixture", "llama_builds", "fake_engines"]  # llama_builds: the shared
# llama.cpp CPU build; fake_engines: a docker client that answers the engine check


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run slow real builds")


# A test run started in the background by a non-interactive shell inherits SIGINT *ignored*, and
# so would every rocforge the tests start: the real-Ctrl-C tests would then test nothing.  An
# interactive terminal's Ctrl-C is what they stand for, so the test process takes SIGINT back
# (its children then start with the default disposition).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Skips that are a choice, not a missing tool: the fast loop's slow tests, a re-recording, and
# tests marked "[optional]" (hardware or tools CI is not promised: nvcc, a GPU).
SLOW_REASON = "slow real build: run with --run-slow (CI does)"
_CHOSEN_PREFIXES = (SLOW_REASON, "recorded ")  # "recorded ": tests/test_plans_unchanged.py


def _lacking(report) -> str | None:
    """The reason of a skip that means "this machine lacks something", else None."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    chosen = reason.startswith(_CHOSEN_PREFIXES) or "[optional]" in reason
    return None if chosen else reason


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (`CI=true`, set by .ci/run) a test skipped for a missing tool fails: CI installs
    everything the suite needs, so a silent skip there would hide an untested feature."""
    outcome = yield
    report = outcome.get_result()
    reason = _lacking(report)
    if reason and _ci_runs_everything():
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run it: {reason}"


def _ci_runs_everything() -> bool:
    """CI=true, except in CI's run with README's tools only (ROCFORGE_TEST_README_PATH=1, see
    .ci/run): there the tests that need more are meant to show as NOT RUN."""
    return os.environ.get("CI") == "true" and os.environ.get("ROCFORGE_TEST_README_PATH") != "1"


def _slow_not_run(skipped) -> int:
    return sum(1 for r in skipped if isinstance(r.longrepr, tuple)
               and str(r.longrepr[2]).removeprefix("Skipped: ") == SLOW_REASON)


def pytest_terminal_summary(terminalreporter):
    """Say loudly, at the end, which tests did not run for lack of a tool (a developer machine
    without Debian's hipcc, say), and how many `slow` ones were left out, so a green run is not
    mistaken for a full one."""
    skipped = terminalreporter.stats.get("skipped", [])
    if slow := _slow_not_run(skipped):
        terminalreporter.section("NOT RUN: slow", sep="-", yellow=True)
        were = "test marked slow was" if slow == 1 else "tests marked slow were"
        terminalreporter.line(f"{slow} {were} not run (real builds: add --run-slow, as CI does)",
                              yellow=True)
    lacking = [(r.nodeid, reason) for r in skipped if (reason := _lacking(r))]
    if not lacking:
        return
    terminalreporter.section("NOT RUN: this machine lacks what these tests need (CI runs them)",
                             sep="!", red=True, bold=True)
    for nodeid, reason in lacking:
        terminalreporter.line(f"{nodeid}: {reason}", red=True)


_SESSION_DIRS: list[str] = []


def pytest_configure(config):
    """Session and module fixtures (the shared llama.cpp builds, say) run before the per-test
    isolation below: rocforge's directories point into one temporary directory for the whole run
    from the start, so no fixture ever writes to the user's own cache, data or config."""
    import tempfile

    base = tempfile.mkdtemp(prefix="rocforge-test-session-")
    _SESSION_DIRS.append(base)
    for var in ("CONFIG", "CACHE", "DATA"):
        os.environ[f"ROCFORGE_{var}_DIR"] = os.path.join(base, var.lower())
    session_home.isolate(base)


def pytest_unconfigure(config):
    import shutil

    for base in _SESSION_DIRS:
        session_home.stop_sccache_servers(base)
        shutil.rmtree(base, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    # a skipif put first: pytest takes the first skipif that holds, so a slow test that also lacks
    # a tool is counted as slow (chosen), not as missing something
    skip = pytest.mark.skipif(True, reason=SLOW_REASON)
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip, append=False)


_LEAKY_VARS = (
    "ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH", "HIP_DEVICE_LIB_PATH",
    "HSA_OVERRIDE_GFX_VERSION", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCBLAS_USE_HIPBLASLT", "ROCFORGE_ROOT",
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("rocforge-home")
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(home / "data"))
    for var in _LEAKY_VARS:
        monkeypatch.delenv(var, raising=False)
    for key in list(os.environ):
        if key.startswith("HSA_OVERRIDE_GFX_VERSION_"):
            monkeypatch.delenv(key, raising=False)
    yield home
    # the credentials one command read are that process's to hide (credentials.remember): a test's
    # password ("wrong") must not blank the word in a later test's paths
    from rocforge_build import credentials

    credentials._known.clear()
