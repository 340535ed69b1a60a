"""Developer sessions: tests, lint, benchmarks (see README.md)."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """pytest; fast by default, `-- --run-slow` adds the real builds (what CI runs)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, tests, benchmarks and this file."""
    session.install("ruff")
    session.run("ruff", "check", "rocforge_build", "tests", "benchmarks", "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each script in benchmarks/ prints ratios measured side by side in one run."""
    session.install("-e", ".[test]")
    import pathlib

    for script in sorted(pathlib.Path("benchmarks").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
