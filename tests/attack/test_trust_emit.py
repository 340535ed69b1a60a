"""Attack tests: recipe, manifest, preset and flag data never becomes code in a script rocforge
writes.  Every test performs the attack for real (bash, zsh, fish and sh source or run the
output; the bundle launcher runs; Containerfiles are parsed as an engine reads them) and
asserts the safe outcome: a marker file the payload would create does not exist, legal values
round-trip byte for byte, bad input is one error line with exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fixtures_roots as fr
import host_roots as hr
import pytest
from needs import needs
from stackfixtures import make_build
from test_commands_env import cli, cli_subprocess, sourced_once
from test_ship_containers import check_wellformed, parse_containerfile

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


# -- recipe source.git: never a transport that runs a program (ext::) ------------------------------
def _ext_allowing_git(tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose git config allows every transport, ext:: included."""
    config = tmp_path / "gitconfig"
    config.write_text('[protocol]\n\tallow = always\n[protocol "ext"]\n\tallow = always\n'
                      '[protocol "file"]\n\tallow = always\n')
    return {"GIT_CONFIG_GLOBAL": str(config), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}


def test_the_users_git_config_really_runs_ext_urls(tmp_path):
    """The premise of the attacks below: with this config, git itself runs an ext:: command."""
    mark = tmp_path / "MARK"
    subprocess.run(["git", "ls-remote", f"ext::sh -c touch% {mark}"], capture_output=True,
                   env={**os.environ, **_ext_allowing_git(tmp_path)}, timeout=60)
    assert mark.exists()


@pytest.mark.parametrize("url", ["ext::sh -c touch% {m}", "EXT::sh -c touch% {m}", "fd::17",
                                 "--upload-pack=touch {m}", "foo://x/y", "ftp://h/x.git",
                                 "ssh://-oProxyCommand=touch% {m}/x", "-oProxyCommand=touch:x"])
def test_recipe_git_url_that_runs_a_helper_is_refused_at_load(tmp_path, url):
    mark = tmp_path / "MARK"
    recipe = tmp_path / "bad.toml"
    recipe.write_text(RECIPE.replace('git = "file:///x.git"',
                                     f"git = '{url.format(m=mark)}'"))
    out = cli_subprocess(tmp_path, "build", str(recipe), "--target", "gfx1151", "--dry-run",
                         env=_ext_allowing_git(tmp_path))
    assert out.returncode == 2 and out.stdout == "", out.stderr
    line = one_error_line(out.stderr)
    assert f"recipe hello ({recipe}): source.git" in line and "not a git URL" in line, line
    assert not mark.exists()


@pytest.mark.parametrize("url", ["https://github.com/ggml-org/llama.cpp.git", "HTTP://h/x",
                                 "ssh://git@h/x.git", "git+ssh://h/x", "git://h/x",
                                 "file:///srv/x.git", "git@github.com:o/r.git", "h:o/r",
                                 "/srv/x.git", "./x", "../x:y"])
def test_recipe_git_urls_git_fetches_from_are_accepted(tmp_path, url):
    recipe = tmp_path / "ok.toml"
    recipe.write_text(RECIPE.replace('git = "file:///x.git"', f"git = '{url}'"))
    out = cli(tmp_path, "recipe", "show", str(recipe))
    assert out.returncode == 0, out.stderr


def test_every_git_rocforge_runs_refuses_ext_whatever_the_config(tmp_path, monkeypatch):
    """GIT_ALLOW_PROTOCOL reaches git through proc.run: an ext:: URL from anywhere (a manifest, a
    submodule) is refused by git itself, the command never runs."""
    from rocforge_build import proc

    mark = tmp_path / "MARK"
    for k, v in _ext_allowing_git(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "ext:https")  # the user's own is replaced too
    got = proc.run(["git", "ls-remote", f"ext::sh -c touch% {mark}"], check=False, timeout=60)
    assert got.returncode != 0 and "transport 'ext' not allowed" in got.stdout
    assert not mark.exists()
    env = proc.run(["git", "var", "GIT_EDITOR"], env={"GIT_EDITOR": "true"}).stdout  # any git
    assert env.strip() == "true"


def test_a_submodule_with_an_ext_url_never_runs(tmp_path):
    """A recipe's git source (a real repository, fetched by file://) whose .gitmodules names an
    ext:: URL; the user's git config allows ext.  `build --dry-run` fetches the source and checks
    out its submodules: git refuses the transport, the command never runs, one line, exit 6."""
    mark = tmp_path / "MARK"
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "CMakeLists.txt").write_text("project(hello C)\n")
    (repo / ".gitmodules").write_text(
        f'[submodule "evil"]\n\tpath = evil\n\turl = ext::sh -c touch% {mark}\n')
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "update-index", "--add", "--cacheinfo",
                    f"160000,{'1' * 40},evil"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    recipe = tmp_path / "sub.toml"
    recipe.write_text(RECIPE.replace('git = "file:///x.git"', f'git = "{repo.as_uri()}"')
                      .replace('ref = "main"', 'ref = "main"\nsubmodules = true'))
    out = cli_subprocess(tmp_path, "build", str(recipe), "--target", "gfx1151", "--dry-run",
                         env=_ext_allowing_git(tmp_path))
    assert out.returncode == 6, out.stderr
    assert "git checkout of" in one_error_line(out.stderr)
    assert "transport 'ext' not allowed" in out.stderr
    assert not mark.exists()


@pytest.mark.parametrize("source", ["git+ext::sh -c touch% {m}", "git+fd::17",
                                    "git+--upload-pack=touch% {m}"])
def test_build_source_never_names_a_helper_transport(tmp_path, source):
    mark = tmp_path / "MARK"
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    out = cli_subprocess(tmp_path, "build", str(recipe), "--target", "gfx1151", "--source",
                         source.format(m=mark), "--dry-run", env=_ext_allowing_git(tmp_path))
    assert out.returncode == 2, out.stderr
    assert "--source" in one_error_line(out.stderr) and "not a git URL" in out.stderr
    assert not mark.exists()


@pytest.mark.parametrize("file_allowed", [True, False])
def test_file_submodules_follow_the_users_git_config(tmp_path, monkeypatch, file_allowed):
    """GIT_ALLOW_PROTOCOL lists file for the top-level fetch, but a submodule's file:// URL comes
    from the fetched repository: it is checked out only where the user's config says
    protocol.file.allow = always, as git itself decides (its default refuses it, CVE-2022-39253)."""
    from rocforge_build.errors import NetworkError
    from rocforge_build.forge import sources

    def make(repo: Path, files: dict[str, str], sub: Path | None = None) -> str:
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
               "-c", "protocol.file.allow=always"]
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
        for name, text in files.items():
            (repo / name).write_text(text)
        if sub is not None:
            subprocess.run([*git, "submodule", "add", "-q", sub.as_uri(), "lib"], check=True,
                           capture_output=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()

    sub = tmp_path / "sub"
    make(sub, {"secret.txt": "local data\n"})
    top = tmp_path / "top"
    commit = make(top, {"CMakeLists.txt": "project(x C)\n"}, sub)
    config = tmp_path / "gitconfig"
    config.write_text('[protocol "file"]\n\tallow = always\n' if file_allowed else "")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    spec = sources.GitSource(top.as_uri(), ref="main", submodules=True)
    dest = tmp_path / "tree"
    if file_allowed:
        spec._checkout(commit, dest, progress=True)
        assert (dest / "lib" / "secret.txt").read_text() == "local data\n"
    else:
        with pytest.raises(NetworkError, match="git checkout of") as err:
            spec._checkout(commit, dest, progress=True)
        assert "transport 'file' not allowed" in str(err.value.hint)
        assert not dest.exists()


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


@needs("patchelf")  # bundle.make rewrites RUNPATHs with it
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
@needs("patchelf")
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


# -- container closure --report / --env-file: the user's files are never replaced or waited on ------
def _closure_prefix(tmp_path: Path) -> Path:
    import shutil

    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("ls"), prefix / "bin/ls")
    return prefix


@pytest.mark.parametrize("kind", ["user-file", "user-json", "link-to-user-file", "dangling-link",
                                  "fifo"])
def test_closure_report_never_replaces_what_it_did_not_write(tmp_path, kind):
    """--report at the user's own file (JSON too), a link (to the user's file, or dangling) or a
    FIFO: refused before any work in a real process (no hang), one line, exit 2, the name left as
    it was, nothing staged at --out."""
    prefix, report, mine = _closure_prefix(tmp_path), tmp_path / "closure.json", tmp_path / "mine"
    mine.write_text("my notes\n")
    if kind == "user-file":
        report.write_text("my notes\n")
    elif kind == "user-json":
        report.write_text(json.dumps({"roots": ["mine"]}))
    elif kind == "link-to-user-file":
        report.symlink_to(mine)
    elif kind == "dangling-link":
        report.symlink_to(tmp_path / "nowhere.json")
    else:
        os.mkfifo(report)
    before = os.lstat(report)
    out = cli_subprocess("/", "container", "closure", str(prefix), "--out",
                         str(tmp_path / "stage"), "--report", str(report))
    assert out.returncode == 2, out.stderr
    assert f"--report {report}" in one_error_line(out.stderr)
    after = os.lstat(report)
    assert (after.st_mode, after.st_ino, after.st_mtime_ns) == (
        before.st_mode, before.st_ino, before.st_mtime_ns)
    assert mine.read_text() == "my notes\n" and not (tmp_path / "nowhere.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["closure.json", "mine", "prefix"]


def test_closure_report_replaces_its_own_report(tmp_path):
    """Its own report is replaced: one written before the `written_by` key (json.dumps of the
    closure, indent 2, as earlier versions wrote it), then the one it just wrote."""
    prefix, report = _closure_prefix(tmp_path), tmp_path / "closure.json"
    report.write_text(json.dumps({"roots": [str(prefix)], "elf_files": 1, "entries": []},
                                 indent=2) + "\n")
    for _ in range(2):
        out = cli("/", "container", "closure", str(prefix), "--out", str(tmp_path / "stage"),
                  "--report", str(report))
        assert out.returncode == 0, out.stderr
        data = json.loads(report.read_text())
        assert data["written_by"] == "rocforge container closure" and data["elf_files"] == 1


def test_closure_env_file_that_is_a_fifo_is_not_waited_on(tmp_path):
    prefix, env_file = _closure_prefix(tmp_path), tmp_path / "build.env"
    os.mkfifo(env_file)
    out = cli_subprocess("/", "container", "closure", str(prefix), "--out",
                         str(tmp_path / "stage"), "--env-file", str(env_file))
    assert out.returncode == 2, out.stderr
    assert f"--env-file {env_file} is a FIFO, not a regular file" in one_error_line(out.stderr)
    assert not (tmp_path / "stage").exists()


# -- preset show --shell: a preset read back from the results store ---------------------------------
def _preset(env: dict, notes: list[str], range_name: str = "short",
            prefix: str = "/p") -> dict:
    return {"model": {"name": "m", "sha256": "0" * 64, "path": "/m.gguf"}, "created": "2026",
            "ranges": {range_name: {
                "env": env, "argv": [f"{prefix}/bin/llama-server", *env], "notes": notes, "ctx": 4096,
                "prefix": prefix, "backend": "hip", "depth": 0, "stamp": "s1",
                "variant_label": "v", "score": 1.0, "runner_up": None, "verified": {"shape": {"ctx": 4096, "ubatch": 512, "fa": False, "ngl": None, "kv": "f16", "load": "mmap", "parallel": 1}},
                "figures": [{"test": "tg", "n": 128, "depth": 0, "t_s": 1.0}]}}}


def _store_preset(preset: dict) -> None:
    from rocforge_build.measure.store import Store

    with Store() as store:
        store.add_preset("m", "0" * 64, None, preset)


def test_preset_script_runs_the_command_and_nothing_else(tmp_path, capsys):
    mark = tmp_path / "MARK"
    good = hostile_values(mark)
    prefix = tmp_path / "prefix"  # a build whose llama-server (printenv) prints the env it was given
    (prefix / "bin").mkdir(parents=True)
    shutil.copy("/usr/bin/printenv", prefix / "bin" / "llama-server")
    (prefix / "rocforge-manifest.toml").write_text(
        'stamp = "s1"\ntarget = ""\nbackend = "hip"\n[recipe]\nname = "llama-cpp"\n')
    _store_preset(_preset(good, [f"note\ntouch {mark}", f"n\r\ntouch {mark}"], prefix=str(prefix)))
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
    """The store's schema refuses the row (exit 11, a bad results database) before any emitter
    sees it; the emitters refuse the same values on their own (tests/test_emit.py)."""
    _store_preset(_preset(env, [], range_name))
    assert main(["preset", "show", "m", "--shell"]) == 11
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


@pytest.mark.parametrize("kind", ["fifo", "dangling-link", "link-to-user-file", "user-file"])
def test_host_plan_write_never_opens_or_replaces_what_it_did_not_write(tmp_path, kind):
    """`--write` at a FIFO (which a read would wait on forever), a link (dangling, or to the
    user's own file) or the user's own file: refused in a real process within seconds, one line,
    exit 2, and the name is left exactly as it was."""
    root = tmp_path / "root"
    hr.strix_defaults(root)
    target, mine = tmp_path / "plan.sh", tmp_path / "mine.sh"
    mine.write_text("my own script\n")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dangling-link":
        target.symlink_to(tmp_path / "nowhere.sh")
    elif kind == "link-to-user-file":
        target.symlink_to(mine)
    else:
        target.write_text("#!/bin/sh\n# my plan, not rocforge's\necho hi\n")
    before = os.lstat(target)
    out = cli_subprocess(root, "host", "plan", "--write", str(target))  # 60 s timeout: no hang
    assert out.returncode == 2, out.stderr
    assert f"--write {target}" in one_error_line(out.stderr)
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_mtime_ns) == (
        before.st_mode, before.st_ino, before.st_mtime_ns)
    assert mine.read_text() == "my own script\n" and not (tmp_path / "nowhere.sh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.sh", "plan.sh", "root"]


def test_host_plan_write_replaces_its_own_script_as_0755(tmp_path):
    root = tmp_path / "root"
    hr.strix_defaults(root)
    script = tmp_path / "plan.sh"
    for _ in range(2):  # new, then its own file replaced
        out = cli(root, "host", "plan", "--write", str(script))
        assert out.returncode == 0, out.stderr
        assert script.stat().st_mode & 0o777 == 0o755


def test_nightly_pip_reason_stays_one_comment(tmp_path, capsys, monkeypatch):
    """`nightly pip` prints the reason for its choice (text from the config and the target table)
    as a comment above the command: a reason with a line break cannot add a line sh would run."""
    from rocforge_build.nightly import listing

    mark = tmp_path / "MARK"
    monkeypatch.setattr(listing, "pip_plan", lambda *a, **k: (
        "https://example.invalid/v2/x/", "rocm[libraries]", f"why\ntouch {mark}\r\n# x"))
    assert main(["nightly", "pip", "--target", "gfx1151", "--no-probe"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0] == f"# why touch {mark} # x", lines
    run = subprocess.run(["sh", "-c", lines[0]], capture_output=True, timeout=30)
    assert run.returncode == 0 and not mark.exists()


def test_env_is_still_importable_cheaply():
    """shellsafe sits on `rocforge env`'s start-up path: stdlib only."""
    code = ("import sys, rocforge_build.shellsafe; "
            "sys.exit(any(m in sys.modules for m in ('rich', 'requests', 'tomlkit')))")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
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
