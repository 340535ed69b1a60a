"""The whole pipeline on the fixture CMake project: real git, tar, cmake, ninja and the C compiler."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from buildfixtures import RECIPE, git, git_repo, project_copy, recipe_copy, tarball

from rocforge_build import cli
from rocforge_build.errors import (
    BuildError,
    ConfigError,
    NoRocmError,
    PatchError,
    ToolchainError,
    UsageError,
)
from rocforge_build.forge import pipeline
from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.rootfs import Root

ROOT = Root("/")


def build(recipe, source=None, **kw) -> pipeline.BuildResult:
    req = Request(recipe=str(recipe), target=kw.pop("target", "gfx1151"), source=source,
                           jobs=2, **kw)
    return pipeline.build(req, ROOT, quiet=True)


def run_hello(prefix: Path) -> str:
    return subprocess.run([prefix / "bin" / "fixture-hello"], capture_output=True, text=True,
                          check=True).stdout


def manifest(prefix: Path) -> dict:
    return tomllib.loads((prefix / "rocforge-manifest.toml").read_text())


def test_git_source_full_pipeline_and_manifest(tmp_path):
    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    out = build(recipe, prefix=str(tmp_path / "prefix"))
    assert out.status == "built"
    text = run_hello(out.prefix)
    # greeting.patch applied, FIXTURE_LOUD (gfx11* and version >= 1.0), accel backend chosen
    assert text.splitlines() == ["patched by rocforge", "HELLO", "accel: on", "fixture 1.2.0"]
    m = manifest(out.prefix)
    assert m["recipe"]["name"] == "fixture"
    assert m["target"] == "gfx1151" and m["backend"] == "accel"
    assert m["source"]["kind"] == "git"
    assert m["source"]["commit"] == git("rev-parse", "v1.2.0", cwd=repo)
    assert m["source"]["version"] == "1.2.0"
    statuses = {p["name"]: p["status"] for p in m["patches"]}
    assert statuses == {"greeting.patch": "applied", "upstreamed.patch": "already upstream",
                        "gfx1100-only.patch": "not needed"}
    options = {o["name"]: o["value"] for o in m["flags"]["options"]}
    assert options["FIXTURE_ACCEL"] == "ON" and options["FIXTURE_LOUD"] == "ON"
    assert "FIXTURE_OLDACCEL" not in options
    assert "-DFIXTURE_ACCEL=ON" in m["flags"]["configure"]
    assert m["env"]["FIXTURE_BUILD_NOTE"] == "built for gfx1151"
    assert m["runtime_env"] == {"FIXTURE_RUNTIME": "1"}
    assert set(m["timings"]) >= {"configure", "build", "install", "smoke", "total"}
    assert "cmake" in m["toolchain"] and "ninja" in m["toolchain"]
    assert not Path(f"{out.prefix}.rocforge-new").exists()


def test_tarball_source(tmp_path):
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    out = build(RECIPE, source=str(tb), prefix=str(tmp_path / "p"), target="gfx1030")
    m = manifest(out.prefix)
    assert m["source"]["kind"] == "tarball"
    import hashlib

    assert m["source"]["identity"] == hashlib.sha256(tb.read_bytes()).hexdigest()
    assert m["backend"] == "cpu"  # the gfx1151 default does not apply to gfx1030
    assert run_hello(out.prefix).splitlines() == ["patched by rocforge", "hello", "fixture 1.2.0"]


def test_noop_then_changes_rebuild(tmp_path, monkeypatch):
    src = project_copy(tmp_path / "src")
    prefix = tmp_path / "p"
    first = build(RECIPE, source=str(src), prefix=str(prefix))
    assert first.status == "built"
    log = first.plan.log
    log_mtime = log.stat().st_mtime_ns

    again = build(RECIPE, source=str(src), prefix=str(prefix))
    assert again.status == "up to date"
    # nothing ran: no cmake, no ninja (how fast the no-op is: benchmarks/bench_build.py)
    assert log.stat().st_mtime_ns == log_mtime

    # a changed source file rebuilds (and only what changed)
    hello = src / "greet.c"
    hello.write_text(hello.read_text().replace('puts("fixture 1.2.0");', 'puts("fixture 1.2.1");'))
    changed = build(RECIPE, source=str(src), prefix=str(prefix))
    assert changed.status == "built"
    assert run_hello(prefix).splitlines()[-1] == "fixture 1.2.1"
    # the user's compiler flags are an input too (CMake reads CFLAGS only at a fresh configure)
    other = tmp_path / "p1030"
    assert build(RECIPE, source=str(src), prefix=str(other), target="gfx1030").status == "built"
    assert run_hello(other).splitlines()[1] == "hello"
    monkeypatch.setenv("CFLAGS", "-DFIXTURE_LOUD")
    assert build(RECIPE, source=str(src), prefix=str(other), target="gfx1030").status == "built"
    assert run_hello(other).splitlines()[1] == "HELLO"  # from CFLAGS, not the recipe
    monkeypatch.delenv("CFLAGS")
    # --force rebuilds with identical inputs
    assert build(RECIPE, source=str(src), prefix=str(prefix), force=True).status == "built"
    # a changed recipe rebuilds
    recipe = recipe_copy(tmp_path / "r", **{'value = "Release"': 'value = "RelWithDebInfo"'})
    out = build(recipe, source=str(src), prefix=str(prefix))
    assert out.status == "built"
    assert "-DCMAKE_BUILD_TYPE=RelWithDebInfo" in manifest(prefix)["flags"]["configure"]
    # a changed patch rebuilds
    patch = tmp_path / "r" / "patches" / "fixture" / "greeting.patch"
    patch.write_text(patch.read_text().replace("patched by rocforge", "patched again"))
    assert build(recipe, source=str(src), prefix=str(prefix)).status == "built"
    assert run_hello(prefix).splitlines()[0] == "patched again"


def test_failed_build_keeps_previous_install(tmp_path):
    src = project_copy(tmp_path / "src")
    prefix = tmp_path / "p"
    build(RECIPE, source=str(src), prefix=str(prefix))
    before = (prefix / "rocforge-manifest.toml").read_text()
    greet = src / "greet.c"
    greet.write_text(greet.read_text() + "\nthis is not C;\n")
    with pytest.raises(BuildError) as exc:
        build(RECIPE, source=str(src), prefix=str(prefix))
    assert "build failed" in exc.value.message
    log = exc.value.message.split("full log: ")[1].split("\n")[0]
    assert Path(log).is_file() and "this is not C" in Path(log).read_text()
    assert (prefix / "rocforge-manifest.toml").read_text() == before
    assert run_hello(prefix).splitlines()[0] == "patched by rocforge"
    assert not Path(f"{prefix}.rocforge-new").exists()


def test_failed_patch_stops_with_hunk_and_leaves_tree_clean(tmp_path):
    src = project_copy(tmp_path / "src")
    prefix = tmp_path / "p"
    build(RECIPE, source=str(src), prefix=str(prefix))
    hello = src / "hello.c"
    hello.write_text("int greet_twice(void);\n" + hello.read_text().replace("    greet();", "    greet(); greet();"))
    with pytest.raises(PatchError) as exc:
        build(RECIPE, source=str(src), prefix=str(prefix))
    msg = exc.value.message
    assert "greeting.patch" in msg and "rejected hunk (hello.c)" in msg
    assert '+    puts("patched by rocforge");' in msg
    work_src = plan_for(Request(recipe=str(RECIPE), target="gfx1151", source=str(src),
                                                   prefix=str(prefix)), ROOT).src_dir
    assert (work_src / "hello.c").read_text() == hello.read_text()  # nothing half-patched
    assert run_hello(prefix).splitlines()[0] == "patched by rocforge"  # old install intact


def test_build_target_installs_only_that_target_and_its_libraries(tmp_path):
    src = project_copy(tmp_path / "src")
    out = build(RECIPE, source=str(src), prefix=str(tmp_path / "p"), build_targets=("fixture-hello",))
    assert (out.prefix / "bin" / "fixture-hello").is_file()
    lib = out.prefix / "lib"
    assert (lib / "libgreet.so.1.2.0").is_file() and not (lib / "libgreet.so.1.2.0").is_symlink()
    assert os.readlink(lib / "libgreet.so.1") == "libgreet.so.1.2.0"  # the SONAME the program needs
    assert os.readlink(lib / "libgreet.so") == "libgreet.so.1"
    assert not (out.prefix / "bin" / "fixture-extra").exists()
    assert run_hello(out.prefix).splitlines()[1] == "HELLO"


def test_compiler_cache_launcher(tmp_path):
    src = project_copy(tmp_path / "src")
    plan = plan_for(Request(recipe=str(RECIPE), target="gfx1151", source=str(src)), ROOT)
    import shutil

    if shutil.which("ccache") or shutil.which("sccache"):
        assert any(a.startswith("-DCMAKE_C_COMPILER_LAUNCHER=") for a in plan.configure)
        assert not any("HIP_COMPILER_LAUNCHER" in a for a in plan.configure)  # host toolchain
    plan = plan_for(Request(recipe=str(RECIPE), target="gfx1151", source=str(src), no_cache=True), ROOT)
    assert not any("LAUNCHER" in a for a in plan.configure)


def test_ignored_option_is_an_error(tmp_path):
    src = project_copy(tmp_path / "src")
    recipe = recipe_copy(tmp_path / "r", **{
        '[[option]]\nname = "CMAKE_INSTALL_LIBDIR"':
        '[[option]]\nname = "FIXTURE_NOT_A_THING"\nvalue = true\ndeclared = false\nreason = "x"\n\n'
        '[[option]]\nname = "CMAKE_INSTALL_LIBDIR"'})
    with pytest.raises(BuildError) as exc:
        build(recipe, source=str(src), prefix=str(tmp_path / "p"))
    assert "CMake ignored option(s) FIXTURE_NOT_A_THING" in exc.value.message
    assert not (tmp_path / "p").exists()


def test_undeclared_option_is_refused_before_building(tmp_path):
    src = project_copy(tmp_path / "src")
    recipe = recipe_copy(tmp_path / "r", **{
        'name = "FIXTURE_LOUD"\nvalue = true\nwhen = { target = "gfx11*", source_version = ">=1.0" }':
        'name = "FIXTURE_QUIET"\nvalue = true'})
    with pytest.raises(ConfigError) as exc:
        plan_for(Request(recipe=str(recipe), target="gfx1151", source=str(src)), ROOT)
    assert "FIXTURE_QUIET is not declared by the source" in exc.value.message


def test_era_option_names_follow_the_source(tmp_path):
    src = project_copy(tmp_path / "src")
    cm = src / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace("option(FIXTURE_ACCEL", "option(FIXTURE_OLDACCEL"))
    plan = plan_for(Request(recipe=str(RECIPE), target="gfx1151", backend="accel", source=str(src)), ROOT)
    assert "-DFIXTURE_OLDACCEL=ON" in plan.configure
    assert not any(a.startswith("-DFIXTURE_ACCEL=") for a in plan.configure)


def test_unavailable_backend_and_stop(tmp_path):
    src = project_copy(tmp_path / "src")
    cm = src / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace('option(FIXTURE_ACCEL "the backend switch of this era (older trees call it FIXTURE_OLDACCEL)" OFF)\n', ""))
    with pytest.raises(UsageError) as exc:
        plan_for(Request(recipe=str(RECIPE), target="gfx1151", backend="accel", source=str(src)), ROOT)
    assert "predates the accel switch" in exc.value.message and exc.value.hint == "use --backend cpu"
    (src / "STOP-ME").write_text("")
    with pytest.raises(ToolchainError) as exc:
        plan_for(Request(recipe=str(RECIPE), target="gfx1100", source=str(src)), ROOT)
    assert "marked unbuildable" in exc.value.message


def test_missing_hip_toolchain_says_how_to_get_one(tmp_path, monkeypatch):
    src = project_copy(tmp_path / "src")
    empty = tmp_path / "root"
    empty.mkdir()
    with pytest.raises(NoRocmError) as exc:  # exit 4, as `rocforge env` without ROCm
        pipeline.build(Request(recipe=str(RECIPE), target="gfx1151", backend="hip", source=str(src),
                                          prefix=str(tmp_path / "p")), Root(empty), quiet=True)
    assert "rocforge nightly install --target gfx1151" in exc.value.hint


def test_cli_dry_run_json_without_toolchain(tmp_path, capsys):
    src = project_copy(tmp_path / "src")
    empty = tmp_path / "root"
    empty.mkdir()
    rc = cli.main(["--root", str(empty), "build", str(RECIPE), "--target", "gfx1151", "--backend", "hip",
                   "--source", str(src), "--dry-run", "--json"])
    assert rc == 4  # the plan is printed, and the dry run exits as the build would: no ROCm
    plan = json.loads(capsys.readouterr().out)
    for key in ("recipe", "target", "backend", "source", "patches", "configure", "build", "env", "prefix"):
        assert key in plan
    assert plan["recipe"] == "fixture" and plan["backend"] == "hip"
    assert plan["configure"][0] == "cmake" and plan["build"][0] == "ninja"
    assert {"name": "greeting.patch", "status": "would apply"}.items() <= plan["patches"][0].items()
    assert plan["toolchain"]["missing"]
    assert plan["prefix"].endswith("builds/fixture-gfx1151-hip")


def test_cli_errors_are_one_line_with_hint(tmp_path, capsys):
    rc = cli.main(["build", "no-such-recipe", "--target", "gfx1151", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown recipe 'no-such-recipe'" in err and "Traceback" not in err
    rc = cli.main(["build", str(RECIPE), "--target", "gfx9999", "--dry-run"])
    assert rc == 2 and "unknown GPU target" in capsys.readouterr().err


def test_build_target_that_installs_nothing_says_so(tmp_path):
    """A static library target (also an object library, e.g. llama.cpp's build_info) has no
    program or shared library to copy: one clear error, not a missing-manifest traceback."""
    src = project_copy(tmp_path / "src")
    cml = src / "CMakeLists.txt"
    cml.write_text(cml.read_text() + "\nadd_library(greet-static STATIC greet.c)\n"
                   'target_compile_definitions(greet-static PRIVATE FIXTURE_GREETING="hi")\n')
    prefix = tmp_path / "p"
    with pytest.raises(BuildError) as exc:
        build(RECIPE, source=str(src), prefix=str(prefix), build_targets=("greet-static",))
    assert "greet-static (static library): nothing to install" in exc.value.message
    assert not prefix.exists() and not Path(f"{prefix}.rocforge-new").exists()


def test_progress_lines_when_stderr_is_a_pipe_and_long_lines_stay_whole(tmp_path):
    """A real fixture build with stderr to a pipe (no terminal: no rich bar) and
    ROCFORGE_PROGRESS_INTERVAL=0.1: plain `rocforge: STEP [n/N] Ns elapsed` lines appear, the
    build's with ninja's counts.  Each compile of the project is slowed by 0.3 s (a CC wrapper;
    CMake's own probe compiles are not) so the build step outlives a few intervals.  The final
    `installed ...` line, longer than 80 columns through its long prefix, stays one line."""
    import re
    import sys

    from test_commands_env import REPO, _base_env

    slow_cc = tmp_path / "bin" / "slow-cc"
    slow_cc.parent.mkdir()
    slow_cc.write_text('#!/bin/sh\ncase "$*" in *CMakeScratch*|*CMakeTmp*|*CompilerId*) ;; '
                       '*" -c "*) sleep 0.3 ;; esac\nexec cc "$@"\n')
    slow_cc.chmod(0o755)
    prefix = tmp_path / ("a-prefix-whose-path-is-long-" * 4 + "end")
    env = {**_base_env(), "ROCFORGE_PROGRESS_INTERVAL": "0.1", "CC": str(slow_cc)}
    env.pop("COLUMNS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rocforge_build", "build", str(RECIPE), "--target", "gfx1151",
         "--source", str(tarball(tmp_path / "fx.tar.gz")), "--prefix", str(prefix), "--jobs", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    beats = [m for line in lines if (m := re.fullmatch(
        r"rocforge: (\w[\w ]*?)(?: \[(\d+)/(\d+)\])? (\d+)s elapsed(?:: .*)?", line))]
    assert {m.group(1) for m in beats} >= {"configure", "build"}, proc.stderr
    counted = [m for m in beats if m.group(1) == "build" and m.group(2)]
    assert counted and all(1 <= int(m.group(2)) <= int(m.group(3)) for m in counted), proc.stderr
    installed = [line for line in lines if line.startswith("installed ")]
    assert installed and len(installed[0]) > 80
    assert installed[0] == (f"installed {prefix} in " + installed[0].split(" in ", 1)[1])
    assert installed[0].endswith(f"(manifest {prefix}/rocforge-manifest.toml)")


def test_progress_interval_that_is_not_a_number_is_one_line(tmp_path):
    import sys

    from test_commands_env import REPO, _base_env

    env = {**_base_env(), "ROCFORGE_PROGRESS_INTERVAL": "nan"}
    proc = subprocess.run(
        [sys.executable, "-m", "rocforge_build", "build", str(RECIPE), "--target", "gfx1151",
         "--source", str(tarball(tmp_path / "fx.tar.gz")), "--prefix", str(tmp_path / "p")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [x for x in proc.stderr.splitlines() if x.startswith("rocforge: error:")] == [
        "rocforge: error: ROCFORGE_PROGRESS_INTERVAL='nan' is not a number of seconds > 0"]
    assert not (tmp_path / "p").exists()
