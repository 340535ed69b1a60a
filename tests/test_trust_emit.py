"""Attack tests: recipe, manifest, preset and flag data never becomes code in a script rocforge
writes.  Every test performs the attack for real (bash, zsh, fish and sh source or run the
output; the bundle launcher runs; Containerfiles are parsed as an engine reads them) and
asserts the safe outcome: a marker file the payload would create does not exist, legal values
round-trip byte for byte, bad input is one error line with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fixtures_roots as fr
import host_roots as hr
import pytest
from stackfixtures import make_build
from test_containers import check_wellformed, parse_containerfile
from test_env import cli, cli_subprocess, sourced_once

from rocforge_build import paths, shellsafe
from rocforge_build.cli import main
from rocforge_build.errors import ConfigError
from rocforge_build.rootfs import Root
from rocforge_build.ship import bundle, bundle_unpack, containers
from rocforge_build.ship.closure import parse_dotenv

SHELLS = ("bash", "zsh", "fish")


def hostile_values(mark: Path) -> dict[str, str]:
    """Legal values that each run `touch MARK` if a shell evaluates them instead of storing them."""
    return {
        "T_DOLLAR": f"$(touch {mark})",
        "T_BACKTICK": f"`touch {mark}`",
        "T_QUOTES": f"it's \"q\" \\' ; touch {mark} #",
        "T_BACKSLASH": f"a\\\\b\\'$HOME\\ ;touch {mark}",
        "T_FISH": f"(touch {mark}) $HOME %s % ;touch {mark}",
        "T_GLOB": "* ? [a] ~ ${HOME} !! &",
    }


def one_error_line(stderr: str) -> str:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("rocforge: error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return errors[0]


# -- rocforge env: a build manifest on disk exports hostile names and values ---------------------
@pytest.fixture
def hostile_build(tmp_path):
    mark = tmp_path / "MARK"
    fr.make_strix_halo(tmp_path / "root")
    good = hostile_values(mark)
    literal = {k: v.replace("{", "{{").replace("}", "}}") for k, v in good.items()}  # str.format
    make_build(tmp_path / "root", "odd", "gfx1151", export_env={
        **literal, f"X;touch {mark}": "1", "BAD_NEWLINE": f"a\ntouch {mark}", "1LEADING": "x"},
        export_reasons={"T_DOLLAR": f"why\ntouch {mark}\n# ", "T_FISH": f"r\r\ntouch {mark}"})
    return tmp_path / "root", mark, good


@pytest.mark.parametrize("shell", SHELLS)
def test_env_scripts_never_run_a_builds_exports(hostile_build, tmp_path, shell):
    root, mark, good = hostile_build
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LC_ALL": "C.UTF-8"}
    out = cli(root, "env", "--shell", shell, env=start)
    assert out.returncode == 0, out.stderr
    got = sourced_once(shell, out.stdout, start, tmp_path)
    assert not mark.exists(), f"{shell} ran a payload:\n{out.stdout}"
    for key, value in good.items():
        assert got[key] == value, key  # round-trips byte for byte
    assert "BAD_NEWLINE" not in got and "1LEADING" not in got
    assert not any(k.startswith("X;") for k in got)
    # refused with a warning saying what and why, never printed as code
    assert f"exports 'X;touch {mark}' is not an environment variable name" in out.stderr
    assert "BAD_NEWLINE" not in out.stdout.replace("# warning:", "")
    for line in out.stdout.splitlines():  # the payload of a reason stays inside its comment
        if "touch" in line and "T_" not in line.split("=")[0]:
            assert line.startswith("#"), line


def test_env_dotenv_and_json_are_literal(hostile_build, tmp_path):
    root, mark, good = hostile_build
    dotenv = cli(root, "env", "--shell", "dotenv")
    assert dotenv.returncode == 0, dotenv.stderr
    parsed = parse_dotenv(dotenv.stdout)  # what the container builder reads back
    data = json.loads(cli(root, "env", "--shell", "json").stdout)
    for key, value in good.items():
        assert parsed[key] == value and data[key] == value, key
    assert "BAD_NEWLINE" not in parsed and "BAD_NEWLINE" not in data
    assert [k for k in data if not shellsafe.is_env_name(k)] == []
    assert not mark.exists()


@pytest.mark.parametrize("text", ["x\ntouch {m}", "x\r\ntouch {m}", "x\x0btouch {m}\x0c",
                                  "x\u2028touch {m}", "x\x85touch {m}", "x\x1b[2K\rtouch {m}"])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_comment_cannot_end_early(tmp_path, shell, text):
    """Reasons, notes and warnings go through shellsafe.comment in every emitter."""
    mark = tmp_path / "MARK"
    script = shellsafe.comment(text.format(m=mark)) + "\nexport DONE=1\n"
    got = sourced_once(shell, script, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, tmp_path)
    assert got.get("DONE") == "1" and not mark.exists()


# -- recipes: [[env]] names are POSIX names, values one line, checked at load ------------------------
RECIPE = ('[recipe]\nname = "hello"\n[source]\ngit = "file:///x.git"\nref = "main"\n'
          '[backends.cpu]\ntoolchain = "host"\n')


@pytest.mark.parametrize("name,value,key", [
    ("X;touch $MARK", "1", "env[0].name"),
    ("1LEADING", "1", "env[0].name"),
    ("A-B", "1", "env[0].name"),
    ("X\\nY", "1", "env[0].name"),
    ("", "1", "env[0].name"),
    ("GOOD", "a\\ntouch $MARK", "env[0].value"),
])
@pytest.mark.parametrize("stage", ["configure", "build", "runtime", "export"])
def test_recipe_with_a_bad_env_entry_is_refused_at_load(tmp_path, name, value, key, stage):
    recipe = tmp_path / "recipes" / "bad.toml"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE + f'[[env]]\nname = "{name}"\nvalue = "{value}"\nreason = "r"\n'
                      f'stage = "{stage}"\n')
    out = cli(tmp_path, "build", str(recipe), "--target", "gfx1151", "--dry-run")
    assert out.returncode == 2 and out.stdout == ""
    line = one_error_line(out.stderr)
    assert str(recipe) in line and key in line, line


def test_recipe_refusal_in_a_real_process(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text(RECIPE + '[[env]]\nname = "X;touch /tmp/x"\nvalue = "1"\nreason = "r"\n')
    out = cli_subprocess(tmp_path, "recipe", "show", str(recipe))
    assert out.returncode == 2 and out.stdout == ""
    assert "env[0].name" in one_error_line(out.stderr)


def test_recipe_source_ref_never_becomes_a_git_option(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text(RECIPE.replace('ref = "main"', 'ref = "--upload-pack=touch /tmp/x"'))
    out = cli(tmp_path, "build", str(recipe), "--target", "gfx1151", "--dry-run")
    assert out.returncode == 2 and "source.ref" in one_error_line(out.stderr)


# -- the bundle `run` launcher: a manifest's runtime_env --------------------------------------------
def _script_prefix(tmp_path: Path, runtime_env: dict[str, str]) -> Path:
    """A prefix whose program prints one variable (no ELF: no closure to copy), with a manifest
    as the pipeline writes it."""
    import tomlkit

    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    show = prefix / "bin" / "show"
    show.write_text('#!/bin/sh\nfor v in "$@"; do printenv "$v"; done\n')
    show.chmod(0o755)
    doc = {"prefix": str(prefix), "target": "gfx1100", "backend": "cpu",
           "recipe": {"name": "show"}, "runtime_env": runtime_env}
    (prefix / "rocforge-manifest.toml").write_text(tomlkit.dumps(doc))
    return prefix


@pytest.mark.parametrize("sh", ["sh", "bash"])
def test_bundle_launcher_keeps_hostile_values_as_data(tmp_path, sh):
    mark = tmp_path / "MARK"
    good = hostile_values(mark)
    prefix = _script_prefix(tmp_path, good)
    out = tmp_path / "b.tar.gz"
    bundle.make(str(prefix), target="gfx1100", backend=None, out=out, root=Root("/"))
    dest = bundle_unpack.unpack(out, tmp_path / "u")
    run = subprocess.run([sh, str(dest / "run"), "show", *good], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "".join(v + "\n" for v in good.values())
    assert not mark.exists()


@pytest.mark.parametrize("runtime_env,key", [
    ({"X;touch {m}": "1"}, "runtime_env"),
    ({"$(touch {m})": "1"}, "runtime_env"),
    ({"GOOD": "a\ntouch {m}"}, "runtime_env.GOOD"),
])
def test_bundle_refuses_a_manifest_with_a_hostile_env(tmp_path, capsys, runtime_env, key):
    mark = tmp_path / "MARK"
    prefix = _script_prefix(tmp_path, {k.format(m=mark): v.format(m=mark)
                                       for k, v in runtime_env.items()})
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(prefix), "--target", "gfx1100", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "rocforge-manifest.toml" in line and key in line, line
    assert not out.exists() and not mark.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- Containerfiles: ENV and LABEL lines, and the flags ---------------------------------------------
def _facts(env=None, runtime_env=None, source=None) -> containers.Facts:
    return containers.Facts(env=env or {"ROCM_PATH": "/opt/rocm"}, manifest={
        "recipe": {"name": "llama-cpp"}, "target": "gfx1151", "backend": "hip",
        "runtime_env": runtime_env or {}, "source": source or {"commit": "abc"}})


def test_container_env_values_stay_one_instruction(tmp_path):
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip")
    good = hostile_values(tmp_path / "MARK")
    text = containers.render_final(plan, _facts(runtime_env=good))
    instrs = parse_containerfile(text)  # continuation lines joined, as an engine reads them
    assert [w for w, _ in instrs] == ["FROM", "ENV", "LABEL"]
    env = instrs[1][1]
    for key, value in good.items():  # each value escaped inside its double quotes
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
        assert f'{key}="{escaped}"' in env, key


@pytest.mark.parametrize("facts", [
    _facts(runtime_env={"GOOD": "x\nRUN touch /nonexistent/MARK"}),
    _facts(runtime_env={"X Y": "1"}),
    _facts(runtime_env={"X\nRUN touch /nonexistent/MARK": "1"}),
    _facts(env={"GOOD": "x\rRUN touch /nonexistent/MARK"}),
    _facts(source={"commit": "abc\nRUN touch /nonexistent/MARK"}),
])
def test_container_refuses_what_would_add_a_line(facts):
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip")
    with pytest.raises(ConfigError):
        containers.render_final(plan, facts)


SHA = "sha256:" + "0123456789abcdef" * 4


FLAGS = [
    ("--base", "debian:12\nRUN touch /nonexistent/MARK"),
    ("--base", "debian:12 AS builder"),
    ("--base", "-debian"),
    ("--base", "Debian:12"),
    ("--runtime-base", "scratch\nRUN touch /nonexistent/MARK"),
    ("--tag", "me/x:1\nRUN touch /nonexistent/MARK"),
    ("--tag", f"me/x@{SHA}"),
    ("--tag", "me/x:" + "a" * 129),
    ("--ref", "v1\nRUN touch /nonexistent/MARK"),
    ("--ref", "--upload-pack=touch /nonexistent/MARK"),
    ("--ref", "a..b"),
    ("--ref", "v1 --x"),
    ("--ref", "x.lock"),
    ("--ref", "x@{1}"),
    ("--source", "/tmp\nRUN touch /nonexistent/MARK"),
]


@pytest.mark.parametrize("action,flag,value", [("build", f, v) for f, v in FLAGS] + [
    ("run", f, v) for f, v in FLAGS if f not in ("--base", "--runtime-base")])  # run has neither
def test_container_flags_are_checked_before_anything(capsys, flag, value, action):
    argv = ["container", action, "llama-cpp", "--target", "gfx1151", "--backend", "hip",
            "--engine", "podman", "--dry-run", f"{flag}={value}"]
    assert main([*argv, *(["--", "true"] if action == "run" else [])]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert flag in one_error_line(captured.err)
    assert not (paths.cache_dir() / "containers").exists()


@pytest.mark.parametrize("image", ["docker.io/library/debian:12", f"localhost:5000/x/y@{SHA}",
                                   "rocm/dev-ubuntu-24.04:6.4", "[::1]:5000/a__b/c-d.e:T_1"])
def test_container_accepts_real_image_references(capsys, image):
    assert main(["container", "build", "llama-cpp", "--target", "gfx1151", "--backend", "hip",
                 "--engine", "podman", "--dry-run", "--json", "--base", image,
                 "--runtime-base", image, "--ref", "release/b6123"]) == 0
    st = check_wellformed(json.loads(capsys.readouterr().out)["containerfile"])
    assert st["builder"][0] == ("FROM", f"{image} AS builder")
    assert st["runtime"][0] == ("FROM", f"{image} AS runtime")


def test_recipe_file_name_never_reaches_the_containerfile(tmp_path):
    odd = tmp_path / "recipes" / "x'; touch MARK\nRUN touch MARK;.toml"
    odd.parent.mkdir()
    odd.write_text(RECIPE)
    text = containers.render(containers.plan(str(odd), target="gfx1151", backend="cpu",
                                             variant="preinstalled", base="debian:12"))
    assert "MARK" not in text
    runs = [r for w, r in parse_containerfile(text) if w == "RUN"]
    assert any("rocforge build /opt/rocforge/recipe/recipes/hello.toml " in r for r in runs)


# -- rocforge build --ref: never a git option ------------------------------------------------------
def test_build_ref_never_becomes_a_git_option(tmp_path):
    mark = tmp_path / "MARK"
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    for ref in (f"--upload-pack=touch {mark};", f"-c core.sshCommand=touch {mark}"):
        out = cli(tmp_path, "build", str(recipe), "--target", "gfx1151", "--source", str(repo),
                  "--ref", ref, "--dry-run")
        assert out.returncode == 2 and "--ref" in one_error_line(out.stderr)
    assert not mark.exists()


# -- preset show --shell: a preset read back from the results store ---------------------------------
def _preset(env: dict, notes: list[str], range_name: str = "short",
            prefix: str = "/p") -> dict:
    return {"model": {"name": "m", "sha256": "0" * 64, "path": "/m.gguf"}, "created": "2026",
            "ranges": {range_name: {
                "env": env, "argv": ["/usr/bin/printenv", *env], "notes": notes,
                "prefix": prefix, "backend": "hip", "depth": 0,
                "variant_label": "v", "score": 1.0, "runner_up": None,
                "figures": [{"test": "tg", "n": 128, "depth": 0, "t_s": 1.0}]}}}


def _store_preset(preset: dict) -> None:
    from rocforge_build.measure.store import Store

    with Store() as store:
        store.add_preset("m", "0" * 64, None, preset)


def test_preset_script_runs_the_command_and_nothing_else(tmp_path, capsys):
    mark = tmp_path / "MARK"
    good = hostile_values(mark)
    _store_preset(_preset(good, [f"note\ntouch {mark}", f"n\r\ntouch {mark}"],
                          prefix=f"/p\ntouch {mark}"))
    assert main(["preset", "show", "m", "--shell"]) == 0
    script = tmp_path / "preset.sh"
    script.write_text(capsys.readouterr().out)
    run = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "".join(v + "\n" for v in good.values())
    assert not mark.exists()


@pytest.mark.parametrize("env,range_name", [({"X;touch /nonexistent/MARK": "1"}, "short"),
                                            ({"GOOD": "a\ntouch /nonexistent/MARK"}, "short"),
                                            ({"GOOD": "1"}, "x(){ touch /nonexistent/MARK;}; y")])
def test_preset_with_a_hostile_name_is_refused(capsys, env, range_name):
    _store_preset(_preset(env, [], range_name))
    assert main(["preset", "show", "m", "--shell"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "preset" in one_error_line(captured.err)


# -- host plan: words read from the system's files -------------------------------------------------
def test_host_plan_script_runs_no_word_of_the_command_line(tmp_path):
    """/proc/cmdline with a quoted word holding a newline (`amdgpu.gttsize="1<NL>touch MARK"`):
    the plan removes it; the script, run for real with a logging `sudo`, must not run it."""
    mark = tmp_path / "MARK"
    root = tmp_path / "root"
    hr.make_host(root, kernel="6.14.0-1018-oem", modules=("amdttm", "ttm"),
                 cmdline=f'BOOT_IMAGE=/boot/vmlinuz ro quiet amdgpu.gttsize="1\ntouch {mark}" x',
                 gtt=126976 * hr.MIB)
    script = tmp_path / "plan.sh"
    out = cli(root, "host", "plan", "--write", str(script))
    assert out.returncode == 0, out.stderr
    assert "amdgpu.gttsize=1 touch" in script.read_text()  # named, on one comment line
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sudo").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "sudo.log"}\n')
    (fake / "sudo").chmod(0o755)
    run = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert not mark.exists()
    assert "apt install tuned" in (tmp_path / "sudo.log").read_text()  # the live steps did run


def test_env_is_still_importable_cheaply():
    """shellsafe sits on `rocforge env`'s start-up path: stdlib only."""
    code = ("import sys, rocforge_build.shellsafe; "
            "sys.exit(any(m in sys.modules for m in ('rich', 'requests', 'tomlkit')))")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1],
                          env={**os.environ}).returncode == 0


def test_env_names_are_exactly_the_posix_pattern():
    """shellsafe checks names without `re` (start-up cost): the same answers as
    [A-Za-z_][A-Za-z0-9_]* in ASCII, for the inputs a regex gets wrong most easily."""
    import re

    pattern = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
    names = ["A", "_", "a1", "ROCM_PATH", "", "1A", "A-B", "A B", "A\n", "\nA", "Ä", "A\u0660",
             "ＡＢ", "A;touch x", "A=B", "a.b", "_9", "9", "A\0", "ǅ", "x" * 300]
    for name in names:
        assert shellsafe.is_env_name(name) == bool(pattern.fullmatch(name)), repr(name)
        assert (shellsafe.env_name_problem(name) is None) == bool(pattern.fullmatch(name))
    for other in (None, 1, b"A", ["A"]):
        assert not shellsafe.is_env_name(other) and shellsafe.env_name_problem(other)
