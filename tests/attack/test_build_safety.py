"""Attacks on `rocforge build` and the other commands that replace a directory, performed for real:
user files in the prefix, a prefix that is a file, two builds of one prefix at once, signals
between the two renames of the swap, and SIGINT/SIGTERM to rocforge alone while ninja runs.

The right answers: rocforge replaces only what it made (issue: `--prefix ~/.local` wiped the
user's files with exit 0); a second build waits for the first; an install is never lost to a
signal; no compiler or ninja outlives an interrupted rocforge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from buildfixtures import RECIPE, project_copy, tarball

from rocforge_build import cli
from rocforge_build.forge import pipeline
from rocforge_build.forge.plan import Request
from rocforge_build.rootfs import Root

REPO = Path(__file__).resolve().parents[2]


def snapshot(tree: Path) -> dict[str, bytes | str]:
    """Every entry below `tree`: file contents, link targets, directories."""
    out: dict[str, bytes | str] = {}
    for p in sorted(tree.rglob("*")):
        rel = p.relative_to(tree).as_posix()
        out[rel] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
                    else p.read_bytes())
    return out


def user_tree(where: Path) -> Path:
    """What `--prefix ~/.local` holds: the user's own programs and files."""
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "mytool").write_text("#!/bin/sh\necho mine\n")
    (where / "share" / "notes").mkdir(parents=True)
    (where / "share" / "notes" / "todo.txt").write_text("do not lose me\n")
    os.symlink("share/notes", where / "notes")
    return where


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rocforge: error:")]


def build_args(source: Path, prefix: Path, *extra: str) -> list[str]:
    return ["build", str(RECIPE), "--target", "gfx1030", "--source", str(source),
            "--prefix", str(prefix), "-j", "2", *extra]


def env_for_child() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")


# -- 1. replace only what rocforge made -----------------------------------------------------------

def test_prefix_with_user_files_is_refused_and_left_intact(tmp_path, capsys):
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    prefix = user_tree(tmp_path / "dot-local")
    before = snapshot(prefix)
    code = cli.main(build_args(tb, prefix))
    err = capsys.readouterr().err
    assert code == 2, err
    assert snapshot(prefix) == before
    (line,) = error_lines(err)
    assert f"holds {prefix / 'bin'}" in line and "rocforge-manifest.toml" in line
    assert "choose a new or empty directory" in err
    assert not [p.name for p in tmp_path.iterdir() if ".rocforge-" in p.name]

    # an empty directory is fine, and so is replacing that build (it has a manifest) later
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(build_args(tb, empty)) == 0
    assert (empty / "rocforge-manifest.toml").is_file()
    (empty / "added-after").write_text("inside a rocforge prefix: replaced with it")
    assert cli.main(build_args(tb, empty, "--force")) == 0
    assert not (empty / "added-after").exists() and (empty / "bin" / "fixture-hello").is_file()


@pytest.mark.parametrize("case", ["file", "below-a-file", "symlink"])
def test_prefix_that_is_a_file_or_below_one_is_one_line(tmp_path, capsys, case):
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    thing = tmp_path / "thing"
    thing.write_text("a user's file\n")
    if case == "symlink":
        (tmp_path / "real").mkdir()
        os.symlink(tmp_path / "real", tmp_path / "link")
    prefix = {"file": thing, "below-a-file": thing / "sub" / "prefix",
              "symlink": tmp_path / "link"}[case]
    code = cli.main(["build", str(RECIPE), "--target", "gfx1030", "--source", str(tb),
                     "--prefix", str(prefix) if case != "symlink" else str(prefix) + "/"])
    err = capsys.readouterr().err
    if case == "symlink":  # the build resolves --prefix: the directory it names is used
        assert code == 0, err
        assert (tmp_path / "real" / "rocforge-manifest.toml").is_file()
        assert os.path.islink(tmp_path / "link")
        return
    assert code == 2, err
    (line,) = error_lines(err)
    assert ("is a file, not a directory" in line if case == "file"
            else f"is below {thing}, which is a file" in line)
    assert thing.read_text() == "a user's file\n"
    assert "Traceback" not in err


def test_prefix_with_a_colon_is_refused(tmp_path, capsys):
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    code = cli.main(build_args(tb, tmp_path / "a:b"))
    err = capsys.readouterr().err
    assert code == 2
    (line,) = error_lines(err)
    assert "contains ':'" in line and not (tmp_path / "a:b").exists()


def test_kernels_build_out_with_user_files_is_refused(tmp_path, capsys):
    out = user_tree(tmp_path / "kout")
    before = snapshot(out)
    code = cli.main(["kernels", "build", "--target", "gfx1100", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = error_lines(err)
    assert "--out" in line and "rocforge-kernels.json" in line
    assert snapshot(out) == before


def test_closure_out_with_user_files_is_refused(tmp_path, capsys):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    out = user_tree(tmp_path / "cout")
    before = snapshot(out)
    code = cli.main(["container", "closure", str(prefix), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = error_lines(err)
    assert "--out" in line and ".rocforge-closure" in line
    assert snapshot(out) == before
    # the staging dir beside --out is rocforge's own name: a user's `cout.partial` is not touched
    (tmp_path / "cout.partial").mkdir()
    (tmp_path / "cout.partial" / "mine").write_text("mine")
    empty = tmp_path / "empty-out"
    assert cli.main(["container", "closure", str(prefix), "--out", str(empty)]) == 0
    assert (empty / ".rocforge-closure").is_file()
    assert (tmp_path / "cout.partial" / "mine").read_text() == "mine"
    capsys.readouterr()
    # below a file: one line too
    code = cli.main(["container", "closure", str(prefix), "--out", str(out / "bin" / "mytool" / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "which is a file" in error_lines(err)[0]


# -- 5. the swap survives signals between its renames ---------------------------------------------

_SWAP_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from rocforge_build import cli, replace as swapper

    swapper.exchange = lambda a, b: False  # no RENAME_EXCHANGE: the fallback's two renames
    real = os.rename
    def replace(src, dst):
        real(src, dst)
        first = str(dst).endswith(".rocforge-old")  # the swap's first rename (prefix aside)
        second = str(src).endswith(".rocforge-new")  # its second (the new tree in place)
        if first if sys.argv[2] == "first" else second:  # signal right after it
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
            time.sleep(0.5)  # a SIGINT/SIGTERM not held back would land here
    os.rename = replace
    sys.exit(cli.main(sys.argv[3:]))
""")


def _first_install(tmp_path) -> tuple[Path, Path]:
    tb = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    prefix = tmp_path / "prefix"
    out = pipeline.build(Request(recipe=str(RECIPE), target="gfx1030", source=str(tb),
                                   prefix=str(prefix), jobs=2), Root("/"), quiet=True)
    assert out.status == "built"
    (prefix / "token-of-the-old-install").write_text("old")
    return tb, prefix


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_between_the_renames_is_held_until_the_new_install_is_in(tmp_path, sig):
    tb, prefix = _first_install(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _SWAP_CHILD, sig, "first",
                           *build_args(tb, prefix, "--force")],
                          env=env_for_child(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"rocforge: interrupted ({sig})"
    assert (prefix / "rocforge-manifest.toml").is_file()
    assert not (prefix / "token-of-the-old-install").exists()  # the new install is in place
    assert subprocess.run([prefix / "bin" / "fixture-hello"], capture_output=True).returncode == 0
    # the token is a file rocforge did not install: kept aside beside the prefix, never deleted
    (kept,) = [p for p in tmp_path.iterdir() if ".rocforge-kept-" in p.name]
    assert (kept / "token-of-the-old-install").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if ".rocforge-" in p.name] == [kept.name]


@pytest.mark.slow
def test_sigkill_between_the_renames_then_the_next_build_restores_the_old_install(tmp_path, capsys):
    tb, prefix = _first_install(tmp_path)
    built_at = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())["built_at"]
    proc = subprocess.run([sys.executable, "-c", _SWAP_CHILD, "SIGKILL", "first",
                           *build_args(tb, prefix, "--force")],
                          env=env_for_child(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    old = Path(f"{prefix}.rocforge-old")
    assert not prefix.exists() and (old / "token-of-the-old-install").is_file()
    # the next build must not delete the old install: it is put back, and it is current
    assert cli.main(build_args(tb, prefix)) == 0
    assert "is up to date" in capsys.readouterr().err
    assert (prefix / "token-of-the-old-install").read_text() == "old"
    assert tomllib.loads((prefix / "rocforge-manifest.toml").read_text())["built_at"] == built_at
    assert not old.exists()


@pytest.mark.slow
def test_sigkill_after_the_second_rename_then_the_next_build_removes_the_old_install(tmp_path,
                                                                                    capsys):
    tb, prefix = _first_install(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _SWAP_CHILD, "SIGKILL", "second",
                           *build_args(tb, prefix, "--force")],
                          env=env_for_child(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    old = Path(f"{prefix}.rocforge-old")
    assert (old / "token-of-the-old-install").is_file()  # the old install, not yet removed
    assert not (prefix / "token-of-the-old-install").exists()  # the new one is in place
    assert cli.main(build_args(tb, prefix)) == 0  # same inputs as the new one: nothing to build
    assert "is up to date" in capsys.readouterr().err
    assert not old.exists() and (prefix / "rocforge-manifest.toml").is_file()
    assert not [p.name for p in tmp_path.iterdir() if ".rocforge-" in p.name]


# -- 5. two builds of one prefix at once; 8. signals reach ninja and its jobs ---------------------

def gated_project(dest: Path, gate: Path) -> str:
    """The fixture project with a build step that waits until `gate` exists (a compile that takes
    as long as the test wants); returns the text that finds its process."""
    project_copy(dest)
    with open(dest / "CMakeLists.txt", "a") as fh:
        fh.write(f'add_custom_target(rocforge_test_gate ALL COMMAND sh -c '
                 f'"until [ -e {gate} ]; do sleep 0.1; done" VERBATIM)\n')
    return str(gate)


def pids_running(token: str) -> list[int]:
    """Live processes (not zombies) whose command line carries `token`."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmdline and state != "Z":
            out.append(int(name))
    return out


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_build(source: Path, prefix: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rocforge_build", *build_args(source, prefix, *extra)],
                            env=env_for_child(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.mark.slow
def test_a_second_build_of_the_same_prefix_waits_for_the_first(tmp_path):
    src, gate = tmp_path / "src", tmp_path / "gate"
    token = gated_project(src, gate)
    prefix = tmp_path / "prefix"
    first = start_build(src, prefix)
    second = None
    try:
        wait_for(lambda: pids_running(token), 90, "the first build's long step")
        second = start_build(src, prefix)
        waiting = second.stderr.readline()  # its first line; the first build is still running
        assert pids_running(token)
        gate.touch()  # now let the first build finish
        out1, err1 = first.communicate(timeout=60)
        out2, err2 = second.communicate(timeout=60)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    assert waiting.startswith("rocforge: waiting:") and f"is building {prefix}" in waiting
    assert "rocforge: waiting" not in err2  # said once
    assert "is up to date" in err2  # the first built exactly this: nothing left to do
    assert out1.strip() == out2.strip() == str(prefix)
    assert subprocess.run([prefix / "bin" / "fixture-hello"], capture_output=True).returncode == 0
    assert not [p.name for p in tmp_path.iterdir() if ".rocforge-" in p.name]


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_rocforge_alone_stops_ninja_and_its_jobs(tmp_path, sig):
    tb, prefix = _first_install(tmp_path)
    before = snapshot(prefix)
    src = tmp_path / "src"
    token = gated_project(src, tmp_path / "gate-never-opened")
    build = start_build(src, prefix)
    try:
        jobs = wait_for(lambda: pids_running(token), 90, "ninja's slow job")
        assert pids_running("ninja")  # ninja itself is running the job
        os.kill(build.pid, getattr(signal, sig))  # rocforge alone, not its process group
        _out, err = build.communicate(timeout=60)
    finally:
        if build.poll() is None:
            build.kill()
    assert build.returncode == 130, err
    assert err.strip().splitlines()[-1] == f"rocforge: interrupted ({sig})"
    assert jobs and pids_running(token) == []  # no job of that build survives rocforge
    assert snapshot(prefix) == before  # the previous install is untouched
    assert not [p.name for p in tmp_path.iterdir() if ".rocforge-" in p.name]


def test_the_child_group_is_stopped_when_the_step_is_interrupted(tmp_path):
    """The same without a build: a shell that starts a grandchild in its own process group (as
    ninja does for its jobs) is stopped, grandchild included, when the block is left early."""
    from rocforge_build import proc

    token = f"{100 + os.getpid() % 1000 / 1000:.3f}"
    child = proc.spawn(["sh", "-c", f"setsid sleep {token} & wait"], stdout=subprocess.DEVNULL)
    with pytest.raises(KeyboardInterrupt), proc.reaped(child, grace=2):
        wait_for(lambda: pids_running(f"sleep {token}"), 10, "the grandchild")
        raise KeyboardInterrupt
    assert child.returncode is not None and pids_running(f"sleep {token}") == []



def test_build_lock_never_writes_through_a_link(tmp_path):
    """The lock file is truncated and written: a link put at its name is refused, its target kept."""
    from rocforge_build.errors import UsageError
    from rocforge_build.forge import lock

    work = tmp_path / "work"
    victim = tmp_path / "victim"
    victim.write_text("not rocforge's\n")
    (tmp_path / "work.lock").symlink_to(victim)
    with pytest.raises(UsageError, match="build lock"):
        lock.acquire(tmp_path / "prefix", work)
    assert victim.read_text() == "not rocforge's\n"
    (tmp_path / "work.lock").unlink()
    held = lock.acquire(tmp_path / "prefix", work)  # a plain file: taken, holder written
    assert "rocforge build" in (tmp_path / "work.lock").read_text()
    held.release()
