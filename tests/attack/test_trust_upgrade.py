"""Attack tests for `rocforge upgrade`, `rocforge rollback` and `rocforge bisect` inputs: each bad
value is one `rocforge: error:` line with exit 2, nothing runs, nothing is built or changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from upgrade_history import built, history, tree_hashes


def rocforge(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocforge_build", *args], capture_output=True,
                          text=True, cwd=cwd, env=os.environ.copy(), timeout=120)


def one_error(res: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = [line for line in res.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert res.returncode == code, res.stderr
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture
def build(tmp_path):
    return built(tmp_path)


def test_run_values_that_are_not_a_command_refused_before_any_build(build, tmp_path):
    h, prefix = build
    before = tree_hashes(prefix)
    marker = tmp_path / "pwned"
    text = tmp_path / "not-executable.sh"
    text.write_text(f"#!/bin/sh\ntouch {marker}\n")  # a script without the x bit
    bad = ["", "   ", "'unclosed", f"$(touch {marker})", f"`touch {marker}`; true",
           str(text), "no-such-program-rocforge-test", str(tmp_path)]
    for value in bad:
        res = rocforge("upgrade", str(prefix), "--ref", h.commits["docs1"], "--run", value)
        assert "--run" in one_error(res), value
    assert not marker.exists()  # no shell ever read the value
    assert tree_hashes(prefix) == before
    assert not Path(f"{prefix}.rocforge-new").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "100", "1e400", "five"])
def test_threshold_out_of_range_refused(tmp_path, value):
    res = rocforge("upgrade", str(tmp_path), "--threshold", value)
    assert res.returncode == 2 and "--threshold" in res.stderr and "Traceback" not in res.stderr


def test_ref_that_git_would_read_as_an_option_refused(build, tmp_path):
    h, prefix = build
    marker = tmp_path / "pwned"
    before = tree_hashes(prefix)
    res = rocforge("upgrade", str(prefix), f"--ref=--upload-pack=touch {marker}")
    assert "is not a git ref" in one_error(res)
    assert not marker.exists() and tree_hashes(prefix) == before


def test_prefix_that_is_not_a_rocforge_build_refused_and_left_alone(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    link = tmp_path / "link"
    link.symlink_to(mine)
    for prefix in (mine, link, tmp_path / "absent", mine / "thesis.tex"):
        for command in ("upgrade", "rollback"):
            one_error(rocforge(command, str(prefix)))
    assert (mine / "thesis.tex").read_text() == "years of work\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "mine"]


def test_a_fifo_named_like_the_manifest_is_refused_not_waited_on(tmp_path):
    """A FIFO at PREFIX/rocforge-manifest.toml (nobody writes it) once hung `rocforge upgrade`
    and `rollback` in read_manifest's open(); it is now one line, well inside the timeout."""
    fake = tmp_path / "fake"
    fake.mkdir()
    os.mkfifo(fake / "rocforge-manifest.toml")
    for command in ("upgrade", "rollback"):
        res = subprocess.run([sys.executable, "-m", "rocforge_build", command, str(fake)],
                             capture_output=True, text=True, env=os.environ.copy(), timeout=30)
        assert "is not a rocforge build" in one_error(res)
    assert [p.name for p in fake.iterdir()] == ["rocforge-manifest.toml"]


def test_rollback_and_upgrade_leave_a_foreign_previous_alone(build, tmp_path):
    h, prefix = build
    before = tree_hashes(prefix)
    res = rocforge("rollback", str(prefix))
    assert "no earlier build" in one_error(res)
    foreign = Path(f"{prefix}.rocforge-previous")
    foreign.mkdir()
    (foreign / "data").write_text("not rocforge's\n")
    assert "no earlier build" in one_error(rocforge("rollback", str(prefix)))
    res = rocforge("upgrade", str(prefix), "--ref", h.commits["docs1"])
    assert "in the way" in one_error(res)
    assert (foreign / "data").read_text() == "not rocforge's\n"
    assert tree_hashes(prefix) == before


def test_model_that_is_not_a_file_refused(build, tmp_path):
    h, prefix = build
    res = rocforge("upgrade", str(prefix), "--model", str(tmp_path / "absent.gguf"))
    assert "--model" in one_error(res)


def test_bisect_refs_starting_with_a_dash_refused(tmp_path):
    h = history(tmp_path)
    marker = tmp_path / "pwned"
    for flag in ("--good", "--bad"):
        other = "--bad" if flag == "--good" else "--good"
        res = rocforge("bisect", str(h.recipe), "--target", "gfx1151",
                       f"{flag}=--upload-pack=touch {marker}", other, "v1.2.0", "--run", "true")
        assert "is not a git ref" in one_error(res)
    assert not marker.exists()
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "bisect").exists()


def test_bisect_good_after_bad_refused(tmp_path):
    h = history(tmp_path)
    res = rocforge("bisect", str(h.recipe), "--target", "gfx1151", "--good",
                   h.commits["docs3"], "--bad", h.base, "--run", "true")
    assert "not an ancestor" in one_error(res)


def test_bisect_report_never_written_through_a_link_or_over_a_users_file(tmp_path):
    h = history(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    link = tmp_path / "issue.md"
    link.symlink_to(victim)
    base = ["bisect", str(h.recipe), "--target", "gfx1151", "--good", h.base, "--bad",
            h.commits["docs3"], "--run", "true"]
    assert "symbolic link" in one_error(rocforge(*base, "--report", str(link)))
    assert "rocforge did not make it" in one_error(rocforge(*base, "--report", str(victim)))
    assert victim.read_text() == "mine\n" and link.is_symlink()
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "bisect").exists()  # nothing was built


@pytest.mark.parametrize("extra", [["--run", "true", "--threshold", "nan"],
                                   ["--bench", "m.gguf"], ["--run", "true", "--metric", "pp512"],
                                   ["--run", "$(touch pwned)"],
                                   ["--run", "true", "--reference", "/nonexistent"],
                                   ["--verify", "m.gguf", "--reference", "/nonexistent"],
                                   ["--verify", "m.gguf", "--reference", "/"]])
def test_bisect_flag_combinations_refused(tmp_path, extra):
    res = rocforge("bisect", "fixture", "--target", "gfx1151", "--good", "a", "--bad", "b",
                   *extra, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert not (tmp_path / "pwned").exists()


def test_bisect_source_and_report_directory_refused(tmp_path):
    h = history(tmp_path)
    marker = tmp_path / "pwned"
    base = ["bisect", str(h.recipe), "--target", "gfx1151", "--good", h.base, "--bad",
            h.commits["docs3"], "--run", "true"]
    one_error(rocforge(*base, f"--source=--upload-pack=touch {marker}", cwd=tmp_path))
    res = rocforge(*base, "--report", str(tmp_path / "absent" / "issue.md"))
    assert "does not exist" in one_error(res)
    assert not marker.exists() and not (tmp_path / "absent").exists()


@pytest.mark.parametrize("extra, words", [
    (["--versions", ""], "is not a version"),
    (["--versions", "1.0"], "at least two"),
    (["--versions", "1.0,1.0"], "more than once"),
    (["--versions", "1.0,../../etc"], "is not a version"),
    (["--versions", "1.0,-rf"], "is not a version"),
    (["--versions", "1.0,1 1"], "is not a version"),
    (["--versions", "1.0,1.1", "--good", "2.0"], "is not in --versions"),
    (["--versions", "1.0,1.1", "--good", "1.1", "--bad", "1.0"], "does not come before"),
    (["--versions", "1.0,1.1", "--source", "{tmp}/fixture.tar.gz"], "holding {version}"),
    (["--versions", "1.0,1.1", "--source", "{tmp}/f-{version}-{os}.tar.gz"], "holding {version}"),
    (["--versions", "1.0,1.1", "--source", "{tmp}/absent-{version}.tar.gz"], "is not a file"),
    (["--versions", "1.0,1.1"], "has a git source"),
    (["--versions", "1.0,1.1", "--source", "http://127.0.0.1:9/f-{version}.zip"],
     "not a tarball URL"),
    (["--versions", "1.0,1.1", "--source", "http://127.0.0.1:9/f-{version}.git"],
     "is a git source, not a tarball"),
    (["--nightlies", "7.10.0a20251021,7.10.0a20251101,7.10.0a20251101"], "more than once"),
    (["--nightlies", "7.10.0a20251021,7.10.0a20251101", "--backend", "cpu"], "not a ROCm one"),
    ([], "needs --good REF and --bad REF"),
])
def test_bisect_versions_and_nightlies_bad_inputs_refused(tmp_path, extra, words):
    # the fixture recipe's source is git; nothing is fetched, listed or built for any of these
    from buildfixtures import RECIPE

    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    res = rocforge("bisect", str(RECIPE), "--target", "gfx1151", *extra, "--run", "true")
    assert words in one_error(res)
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "bisect").exists()


def test_bisect_versions_and_nightlies_together_refused(tmp_path):
    res = rocforge("bisect", "fixture", "--target", "gfx1151", "--versions", "1,2",
                   "--nightlies", "1,2", "--run", "true", cwd=tmp_path)
    assert res.returncode == 2 and "not allowed with" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_model_that_is_not_gguf_is_refused_before_anything_is_built(build, tmp_path):
    # upgrade and bisect read the model's header first: a text file named .gguf, and a symbolic
    # link loop, are one line each, and no candidate is built (no staging tree, no bisect step)
    h, prefix = build
    before = tree_hashes(prefix)
    text = tmp_path / "model.gguf"
    text.write_text("not a model\n")
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(tmp_path / "loop2.gguf")
    (tmp_path / "loop2.gguf").symlink_to(loop)
    line = one_error(rocforge("upgrade", str(prefix), "--ref", h.commits["docs1"], "--model", str(text)))
    assert line == f"rocforge: error: --model {text} is not a GGUF model (no GGUF magic at its start)"
    line = one_error(rocforge("upgrade", str(prefix), "--ref", h.commits["docs1"], "--model", str(loop)))
    assert line.startswith(f"rocforge: error: --model model file {loop} cannot be read: Too many levels")
    for option, extra in (("--verify", []), ("--bench", ["--metric", "pp512"])):
        line = one_error(rocforge("bisect", str(h.recipe), "--target", "gfx1151", "--good", h.base,
                                  "--bad", h.commits["docs3"], option, str(text), *extra))
        assert line.startswith(f"rocforge: error: {option} {text} is not a GGUF model")
    assert tree_hashes(prefix) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("prefix")) == ["prefix"]
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "bisect").exists()


def test_bisect_with_a_commit_the_repository_lacks_names_it(tmp_path):
    # a well-formed sha that is in no history: "no such commit in REPO", not "not an ancestor"
    h = history(tmp_path)
    absent = "1234567890" * 4
    for good, bad, option in ((h.base, absent, "--bad"), (absent, h.commits["docs3"], "--good")):
        res = rocforge("bisect", str(h.recipe), "--target", "gfx1151", "--good", good, "--bad", bad,
                       "--run", "true")
        assert f"{option} {absent}: no such commit in {h.repo.as_uri()}" in one_error(res)
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "bisect").exists()


def test_bisect_source_that_is_a_plain_directory_is_a_usage_error_not_a_network_one(tmp_path):
    # exit 2 (docs/reference/exit-codes.md): nothing went over a network, the directory is not a
    # repository; the directory is left as it was
    h = history(tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine\n")
    res = rocforge("bisect", str(h.recipe), "--target", "gfx1151", "--good", h.base, "--bad",
                   h.commits["docs3"], "--run", "true", "--source", str(plain))
    assert f"{plain}: bisect needs a git repository" in one_error(res, 2)
    assert [p.name for p in plain.iterdir()] == ["notes.txt"]
