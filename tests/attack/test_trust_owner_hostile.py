"""Hostile tests of whose build a prefix holds (forge/pipeline.owner_problem): tune, verify's
reference and bisect never replace a build the user asked for, whatever the user's directories
look like; what a manifest records (`asked_targets`, `made_for`) is data an upgrade checks, not
words handed to CMake or ninja unchecked.  Real builds of the fixture project (about a second)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from buildfixtures import RECIPE, git_repo
from upgrade_history import built, history, rocforge, tree_hashes

from rocforge_build import paths
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import UsageError
from rocforge_build.forge import pipeline
from rocforge_build.forge.locations import own_builds_dir
from rocforge_build.forge.request import Request
from rocforge_build.rootfs import Root
from rocforge_build.workflows import tune as tune_workflow


def _manifest_with(prefix: Path, key: str, value: str) -> None:
    path = prefix / "rocforge-manifest.toml"
    text = path.read_text()
    text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    path.write_text(text if n else f"{key} = {value}\n" + text)


def test_tune_never_replaces_the_users_build_when_the_data_dir_is_inside_the_cache_dir(tmp_path, monkeypatch):
    """ROCFORGE_DATA_DIR below ROCFORGE_CACHE_DIR (one rocforge directory on a shared disk): the
    user's default-prefix build has no `made_for`, and the cache once counted as rocforge's own, so
    tune rebuilt the user's build with its plan (fixture-extra gone, the manifest now tune's)."""
    cache = Path(os.environ["ROCFORGE_CACHE_DIR"])
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(cache / "data"))
    h = history(tmp_path)
    res = rocforge("build", str(h.recipe), "--target", "gfx1151", "--no-recheck")
    assert res.returncode == 0, res.stderr
    (prefix,) = [p for p in paths.builds_prefix().iterdir() if p.name != "tune"]
    before = tree_hashes(prefix)
    monkeypatch.setattr(tune_workflow, "MEASURE_TARGETS", ("fixture-hello",))
    monkeypatch.setattr(tune_workflow, "TUNE_NEEDS", ("llama-bench",))  # the user's build lacks one
    asked = tune_workflow.Candidates(recipe=str(h.recipe), backends=(read_manifest(prefix)["backend"],),
                                     target="gfx1151", rootfs=Root("/"))
    builds, _ = tune_workflow.candidates(asked, lambda text: None, quiet=True)
    assert tree_hashes(prefix) == before
    own = paths.builds_prefix() / "tune" / prefix.name
    assert [b.prefix for b in builds] == [own.resolve()]


@pytest.mark.parametrize("made_for", ["tune", "reference", "bisect"])
def test_no_command_replaces_a_users_build_in_the_cache_dir(tmp_path, monkeypatch, made_for):
    """A user's build (no `made_for`) that happens to lie below the cache directory -- even in
    bisect's own directory there -- is still the user's: only a step bisect cached before builds
    were marked (its manifest has no `asked_targets`) counts as rocforge's."""
    repo = git_repo(tmp_path / "repo")
    prefix = paths.cache_dir() / "bisect" / "fixture-gfx1030-default" / "mine"
    req = Request(recipe=str(RECIPE), target="gfx1030", source=str(repo), ref="v1.2.0", prefix=str(prefix))
    pipeline.build(req, Root("/"), quiet=True)
    before = tree_hashes(prefix)
    with pytest.raises(UsageError, match="holds your build"):
        pipeline.build(Request(**{**req.__dict__, "made_for": made_for, "build_targets": ("fixture-hello",)}),
                       Root("/"), quiet=True)
    assert tree_hashes(prefix) == before
    old = {**read_manifest(prefix), "asked_targets": None}  # as bisect wrote it before the marks
    allowed = pipeline.replacing_problem(prefix, old, made_for, "a step") is None
    assert allowed == (made_for == "bisect")


@pytest.mark.parametrize("value", ['["--version"]', '["clean"]', '["a;rm -rf ~"]', '["../../bin/sh"]',
                                   '"fixture-hello"', "[1]"])
def test_an_upgrade_never_asks_cmake_for_a_target_its_manifest_was_edited_to_hold(tmp_path, value):
    """`asked_targets` goes onto ninja's command line at an upgrade, as --cmake-target does: a
    value --cmake-target refuses is a manifest error naming the field, before anything is fetched
    or configured (it read `--cmake-target --version: the configured fixture build has no such
    target` after configuring the new tree)."""
    h, prefix = built(tmp_path)
    _manifest_with(prefix, "asked_targets", value)
    before = tree_hashes(prefix)
    res = rocforge("upgrade", str(prefix), "--ref", h.commits["docs1"])
    lines = [line for line in res.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "asked_targets" in lines[0] and "rocforge-manifest.toml" in lines[0], lines[0]
    assert "fetching" not in res.stderr and "configure" not in res.stderr
    assert tree_hashes(prefix) == before


@pytest.mark.parametrize("value", ['"Tune"', '"tune "', '"x"', '"' + "r" * 5000 + '"'])
def test_a_users_build_marked_for_an_unknown_owner_is_never_replaced_and_said_in_one_short_line(tmp_path, value):
    """`made_for` edited to a near miss of an owner's name (or a huge one): tune, the reference and
    bisect refuse it as another owner's; the line names it briefly."""
    h, prefix = built(tmp_path)
    _manifest_with(prefix, "made_for", value)
    old = read_manifest(prefix)
    for made_for in ("tune", "reference", "bisect"):
        problem = pipeline.replacing_problem(prefix, old, made_for, "a test")
        assert problem is not None and len(problem) < 600, problem


def test_a_manifest_asking_for_more_targets_than_the_flag_allows_is_refused(tmp_path):
    from rocforge_build.argtypes import CMAKE_TARGETS_MAX
    from rocforge_build.errors import ConfigError
    from rocforge_build.manifest_schema import checked_manifest

    base = {"recipe": {"name": "fixture"}, "target": "", "backend": "cpu"}
    names = [f"t{i}" for i in range(CMAKE_TARGETS_MAX)]
    assert checked_manifest({**base, "asked_targets": names}, "m")["asked_targets"] == names
    with pytest.raises(ConfigError, match="asked_targets"):
        checked_manifest({**base, "asked_targets": [*names, "one-more"]}, "m")


def test_each_commands_own_directory_is_where_it_builds(tmp_path):
    """tune's candidates live below <builds>/tune, bisect's steps below <cache>/bisect; verify's
    references were always marked, so no directory stands in for their mark."""
    from rocforge_build import paths
    from rocforge_build.workflows import bisect

    assert tune_workflow.tune_prefix("/x/llama-cpp-gfx1151-hip") == paths.builds_prefix() / "tune" / "llama-cpp-gfx1151-hip"
    assert bisect.step_prefix("r", "t", None, "abc") == paths.cache_dir() / "bisect" / "r-t-default" / "abc"
    assert own_builds_dir("tune") == paths.builds_prefix() / "tune"
    assert own_builds_dir("bisect") == paths.cache_dir() / "bisect" and own_builds_dir("reference") is None


@pytest.mark.parametrize("made_for", ["tune", "bisect"])
def test_a_build_a_command_made_in_its_own_directory_before_the_marks_is_its_own(tmp_path, made_for):
    """A candidate tune built before builds were marked (no made_for, no asked_targets) in tune's
    own directory is tune's to rebuild (else every later tune stopped on it, told to give a prefix
    tune has no flag for); the same manifest elsewhere, or naming its targets, is the user's."""
    own = own_builds_dir(made_for) / "fixture-cpu"
    old = {"recipe": {"name": "fixture"}, "stamp": "s", "asked_targets": None}
    assert pipeline.replacing_problem(own, old, made_for, "another plan") is None
    others = [o for o in ("tune", "reference", "bisect") if o != made_for]
    assert all(pipeline.replacing_problem(own, old, o, "another plan") for o in others)
    assert pipeline.replacing_problem(own, {**old, "asked_targets": []}, made_for, "another plan")
    assert pipeline.replacing_problem(tmp_path / "fixture-cpu", old, made_for, "another plan")


def test_tune_skips_a_backend_whose_own_prefix_holds_the_users_build(tmp_path, monkeypatch):
    """The user built (or upgraded) into tune's own directory: tune leaves that build byte for byte
    and skips the backend in one line, instead of stopping on a hint to give a --prefix it has no
    flag for."""
    h = history(tmp_path)
    res = rocforge("build", str(h.recipe), "--target", "gfx1151", "--no-recheck")
    assert res.returncode == 0, res.stderr
    (prefix,) = [p for p in paths.builds_prefix().iterdir()]
    own = tune_workflow.tune_prefix(prefix)
    res = rocforge("build", str(h.recipe), "--target", "gfx1151", "--no-recheck", "--prefix", str(own))
    assert res.returncode == 0, res.stderr
    before = tree_hashes(own)
    monkeypatch.setattr(tune_workflow, "MEASURE_TARGETS", ("fixture-hello",))
    monkeypatch.setattr(tune_workflow, "TUNE_NEEDS", ("llama-bench",))
    asked = tune_workflow.Candidates(recipe=str(h.recipe), backends=(read_manifest(prefix)["backend"],),
                                     target="gfx1151", rootfs=Root("/"))
    with pytest.raises(UsageError, match="no candidate build") as err:
        tune_workflow.candidates(asked, lambda text: None, quiet=True)
    assert f"{own} holds your build" in err.value.hint
    assert tree_hashes(own) == before


def test_bisects_refusal_names_no_prefix_flag_it_does_not_have(tmp_path):
    """The user's build at a bisect step's place: refused, and the hint does not send the user to a
    --prefix that bisect (like tune and verify) does not take."""
    repo = git_repo(tmp_path / "repo")
    prefix = own_builds_dir("bisect") / "fixture-gfx1030-default" / "abc"
    req = Request(recipe=str(RECIPE), target="gfx1030", source=str(repo), ref="v1.2.0", prefix=str(prefix))
    pipeline.build(req, Root("/"), quiet=True)
    with pytest.raises(UsageError) as err:
        pipeline.build(Request(**{**req.__dict__, "made_for": "bisect", "build_targets": ("fixture-hello",)}),
                       Root("/"), quiet=True)
    assert "prefix" not in err.value.hint and "move it away" in err.value.hint
