"""Developer sessions: tests, lint, docs, benchmarks (see README.md)."""

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
    session.run("ruff", "check", "rocforge_build", "tests", "benchmarks", "docs/hooks", "noxfile.py")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site into site/: `mkdocs build --strict` (a warning fails it); the command
    reference is generated from the CLI's parser during the build (docs/hooks/commands.py)."""
    session.install("-e", ".[docs]")
    # NO_MKDOCS_2_WARNING: Material 9.7+ prints a notice about MkDocs 2.0 at every build
    session.run("mkdocs", "build", "--strict", "--clean", *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each script in benchmarks/ prints ratios measured side by side in one run."""
    session.install("-e", ".[test]")
    import pathlib
    import time

    took = []
    for script in sorted(pathlib.Path("benchmarks").glob("bench_*.py")):
        start = time.monotonic()
        session.run("python", str(script), *session.posargs)
        took.append(f"{script.name} {time.monotonic() - start:.0f} s")
    session.log("bench times: " + ", ".join(took))


@nox.session
def kernels(session: nox.Session) -> None:
    """Build rocforge's HIP kernels per target: `nox -s kernels -- --target gfx1151 [--target
    gfx1030 ...] [--rocm PATH]`; add `--bench` to run them on this machine's GPU as well."""
    session.install("-e", ".[test]")
    args = list(session.posargs)
    bench = "--bench" in args
    args = [a for a in args if a != "--bench"]
    chosen, rest, i = [], [], 0
    while i < len(args):
        if args[i] == "--target" and i + 1 < len(args):
            chosen.append(args[i + 1])
            i += 2
            continue
        rest.append(args[i])
        i += 1
    for target in chosen or [None]:
        flag = ["--target", target] if target else []
        session.run("rocforge", "kernels", "build", *flag, *rest)
        if bench:
            session.run("rocforge", "kernels", "bench", *flag)


@nox.session
def integration(session: nox.Session) -> None:
    """Real llama.cpp builds through rocforge, every program: CPU and Vulkan of the May 2025 tree,
    CPU of the Oct 2026 tree (its Vulkan backend must stop early on Debian 12's headers).
    ~40 min on 2 cores; CI runs only the llama-bench subset of the May 2025 tree (docs/developing.md,
    "Slow tests and their CI budget")."""
    session.install("-e", ".[test]")
    for version in ("0.3.9", "0.3.36"):
        session.run("pytest", "tests/e2e/test_llama_build.py", "--run-slow", "-v", *session.posargs,
                    env={"ROCFORGE_INTEGRATION_FULL": "1", "ROCFORGE_LLAMA_VERSION": version})
    # dry-run plans of the stack recipes against real upstream trees: set ROCFORGE_TEST_GIT_ROCWMMA,
    # _AOTRITON, _ROCBLAS, _HIPBLASLT to git directories of them (tests/upstream_trees.py)
    session.run("pytest", "tests/e2e/test_upstream_trees.py", "--run-slow", "-v", *session.posargs)
    # `rocforge build rocwmma` from that ROCm/rocWMMA (no gfx1151), then llama.cpp's rocwmma backend
    # for gfx1151 with the stub patch, compiled in the sid chroot (14 min cold on 2 cores, 30 s warm)
    session.run("pytest", "tests/e2e/test_rocwmma_stub_build.py", "--run-slow", "-v", *session.posargs)
