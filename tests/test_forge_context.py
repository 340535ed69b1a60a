"""forge/context.py and the pipeline around it: one command finds each fact once (the recipe
read, the source resolved, configure run, each dependency planned), watched from outside through
Python's audit hooks (sys.addaudithook: `open` and `subprocess.Popen` events) in a child process;
the dry run's commands are the ones the build runs; the request's environment is the build's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

from buildfixtures import RECIPE, git, git_repo, recipe_copy

from rocforge_build.forge import pipeline
from rocforge_build.forge.context import BuildContext
from rocforge_build.forge.request import Request
from rocforge_build.rootfs import Root
from rocforge_build.workflows.upgrade import request_for

# Runs rocforge's CLI with an audit hook and a counter around make_plan; prints what it counted.
_WATCH = textwrap.dedent("""
    import collections, json, os, sys
    from rocforge_build import cli
    from rocforge_build.forge import pipeline, plan

    watched = {os.path.realpath(p): os.path.basename(p) for p in sys.argv[1].split(os.pathsep)}
    seen = collections.Counter()

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            name = watched.get(os.path.realpath(os.fsdecode(args[0])))
            if name:
                seen["read " + name] += 1
        elif event == "subprocess.Popen":
            argv = [os.fsdecode(a) for a in (args[1] or [])]
            if "ls-remote" in argv:
                seen["git ls-remote"] += 1
            elif argv and os.path.basename(argv[0]) == "cmake" and "-S" in argv:
                seen["configure"] += 1

    real = plan.make_plan

    def counted(context, **kw):
        seen["plan " + context.recipe.name] += 1
        return real(context, **kw)

    for module in (plan, pipeline):
        module.make_plan = counted
    sys.addaudithook(hook)
    code = cli.main(sys.argv[2:])
    sys.stdout.flush()
    print(json.dumps({"code": code, **seen}))
""")


def _watched(files: list[Path], *argv: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _WATCH, os.pathsep.join(map(str, files)), *argv],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout.splitlines()[-1])
    assert counts.pop("code") == 0, proc.stderr
    return counts


def test_one_build_reads_its_recipe_once_resolves_its_source_once_and_configures_once(tmp_path):
    """The fixture recipe from a git source by tag: `git ls-remote` asked once, the recipe file
    opened once, one plan, one configure."""
    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    counts = _watched([recipe], "build", str(recipe), "--target", "gfx1151",
                      "--prefix", str(tmp_path / "p"), "--no-recheck")
    assert counts == {"read fixture.toml": 1, "git ls-remote": 1, "plan fixture": 1,
                      "configure": 1}, counts


def test_a_dry_run_reads_its_recipe_once(tmp_path):
    recipe = recipe_copy(tmp_path / "r")
    src = git_repo(tmp_path / "repo")
    counts = _watched([recipe], "build", str(recipe), "--target", "gfx1030", "--source", str(src),
                      "--dry-run", "--json")
    assert counts == {"read fixture.toml": 1, "plan fixture": 1}, counts


_TWO = """
[recipe]
name = "{name}"
[source]
git = "{url}"
ref = "v1"
[backends.cpu]
toolchain = "host"
"""


def _two_recipes(tmp_path: Path) -> tuple[Path, Path]:
    """`top` depends on `base`; each a CMake project of no language from its own git repo."""
    paths = []
    for name, extra in (("base", ""), ("top", '[[depends]]\nrecipe = "base"\nreason = "its headers"\n')):
        src = tmp_path / f"{name}-src"
        src.mkdir()
        (src / "CMakeLists.txt").write_text(f"cmake_minimum_required(VERSION 3.20)\nproject({name} NONE)\n")
        for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", name), ("tag", "v1")):
            git(*args, cwd=src)
        path = tmp_path / "recipes" / f"{name}.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_TWO.format(name=name, url=src.as_uri()) + extra)
        paths.append(path)
    return paths[0], paths[1]


def test_a_dependency_is_planned_once_per_command(tmp_path):
    """A dry run and a build of `top`: each recipe is read, resolved and planned once, and the
    build configures each project once; a second build plans once more and finds both up to date
    under the lock (`pipeline.up_to_date`, the one check), configuring nothing."""
    base, top = _two_recipes(tmp_path)
    dry = _watched([base, top], "build", str(top), "--target", "gfx1030", "--dry-run", "--json")
    assert dry == {"read base.toml": 1, "read top.toml": 1, "git ls-remote": 2, "plan base": 1,
                   "plan top": 1}, dry  # local repositories: read in place, as a build does
    argv = ["build", str(top), "--target", "gfx1030", "--no-recheck"]
    built = _watched([base, top], *argv)
    assert built == {"read base.toml": 1, "read top.toml": 1, "git ls-remote": 2, "plan base": 1,
                     "plan top": 1, "configure": 2}, built
    again = _watched([base, top], *argv)  # planned once, found up to date by the plan's one check
    assert again == {"read base.toml": 1, "read top.toml": 1, "git ls-remote": 2, "plan base": 1,
                     "plan top": 1}, again


def test_the_dry_runs_commands_are_the_ones_the_build_ran(tmp_path, capsys):
    """configure, build and install of `--dry-run --json` equal what the manifest records the
    build ran, for each install kind: `cmake --install` and the copied artifacts of
    --cmake-target."""
    from rocforge_build.cli import main

    repo = git_repo(tmp_path / "repo")
    for extra in ([], ["--cmake-target", "fixture-hello"]):
        prefix = tmp_path / f"p{len(extra)}"
        argv = ["build", str(RECIPE), "--target", "gfx1030", "--source", str(repo), "--ref", "v1.2.0",
                "--prefix", str(prefix), "--no-recheck", *extra]
        assert main([*argv, "--dry-run", "--json"]) == 0
        planned = json.loads(capsys.readouterr().out)
        code, err = main(argv), capsys.readouterr().err
        assert code == 0, err
        flags = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())["flags"]
        assert {k: flags[k] for k in ("configure", "build", "install")} == \
            {k: planned[k] for k in ("configure", "build", "install")}
        assert flags["install"][0] == ("cmake" if not extra else "(copy artifacts of)")


def _wrapper(tmp_path: Path, name: str) -> Path:
    """A compiler wrapper that notes each call in `<name>.calls` and runs the real compiler."""
    log = tmp_path / f"{name}.calls"
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec cc "$@"\n')
    script.chmod(0o755)
    return script


def test_a_requests_cc_is_the_compiler_the_build_uses(tmp_path, monkeypatch):
    """Request.environ names CC=a wrapper; this process names another: CMake compiles with the
    request's (the stamp already covered it, the build did not)."""
    ours, other = _wrapper(tmp_path, "request-cc"), _wrapper(tmp_path, "process-cc")
    monkeypatch.setenv("CC", str(other))
    repo = git_repo(tmp_path / "repo")
    req = Request(recipe=str(RECIPE), target="gfx1030", source=str(repo), ref="v1.2.0",
                  prefix=str(tmp_path / "p"), environ={**os.environ, "CC": str(ours)})
    monkeypatch.setenv("CC", str(other))
    out = pipeline.build(req, Root("/"), quiet=True)
    assert out.status == pipeline.Status.BUILT
    assert "hello.c" in (tmp_path / "request-cc.calls").read_text()
    assert not (tmp_path / "process-cc.calls").exists()


_SHOWS_ROCM = """
[recipe]
name = "shows-rocm"
[source]
git = "{url}"
ref = "v1"
[backends.cpu]
toolchain = "host"
[[smoke]]
run = ["bin/show-rocm"]
"""


def test_an_upgrade_request_that_names_a_rocm_builds_and_tests_under_it(tmp_path, monkeypatch):
    """`nightly install --gate` (workflows/nightly_gate.py) and `bisect --nightlies` build through a
    request whose environment names the new ROCm (ROCM_PATH); every step of the build, the smoke
    test included, runs under it, not under the ROCM_PATH of the process that asked."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "show-rocm").write_text(f'#!/bin/sh\necho "$ROCM_PATH" > "{tmp_path}/seen"\n')
    (src / "show-rocm").chmod(0o755)
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.20)\nproject(s NONE)\n"
                                        "install(PROGRAMS show-rocm DESTINATION bin)\n")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "s"), ("tag", "v1")):
        git(*args, cwd=src)
    recipe = tmp_path / "shows-rocm.toml"
    recipe.write_text(_SHOWS_ROCM.format(url=src.as_uri()))
    monkeypatch.setenv("ROCM_PATH", "/opt/rocm-the-user-had")
    first = pipeline.build(Request(recipe=str(recipe), target="gfx1030", prefix=str(tmp_path / "p")),
                           Root("/"), quiet=True)
    assert (tmp_path / "seen").read_text().strip() == "/opt/rocm-the-user-had"
    manifest = tomllib.loads(first.manifest.read_text())
    req = request_for(first.prefix, manifest,
                      environ={**os.environ, "ROCM_PATH": "/opt/rocm-the-nightly-named"})
    req = replace(req, force=True)  # a host build: ROCm is no input of it, so it would be current
    assert pipeline.build(req, Root("/"), quiet=True).status == pipeline.Status.BUILT
    assert (tmp_path / "seen").read_text().strip() == "/opt/rocm-the-nightly-named"


def test_a_context_detects_each_toolchain_once_and_is_read_once(tmp_path, monkeypatch):
    """Choosing the backend, the facts of every rule, the prefix and the stamp: one detection of
    the host toolchain; reading a read context again fetches nothing."""
    from rocforge_build.forge import context as context_module

    calls = []
    real = context_module.detect
    monkeypatch.setattr(context_module, "detect", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    repo = git_repo(tmp_path / "repo")
    ctx = BuildContext.of(Request(recipe=str(RECIPE), target="gfx1030", source=str(repo),
                                  ref="v1.2.0"), Root("/")).read()
    assert ctx.backend.name == "cpu" and ctx.stamp and ctx.prefix.name == "fixture-cpu"
    assert ctx.read() is ctx and ctx.source_version == "1.2.0"
    assert calls == ["host"]
