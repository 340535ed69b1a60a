"""Hostile tests of whose build a prefix holds (forge/pipeline.owner_problem): tune, verify's
reference and bisect never replace a build the user asked for, whatever the user's directories
look like; what a manifest records (`asked_targets`, `made_for`) is data an upgrade checks, not
words handed to CMake or ninja unchecked.  Real builds of the fixture project (about a second)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from buildfixtures import RECIPE, git_repo
from upgrade_history import history, rocforge, tree_hashes

from rocforge_build import paths
from rocforge_build.commands import tune as tune_cmd
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import UsageError
from rocforge_build.forge import pipeline
from rocforge_build.forge.request import Request
from rocforge_build.rootfs import Root


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
    monkeypatch.setattr(tune_cmd, "MEASURE_TARGETS", ("fixture-hello",))
    monkeypatch.setattr(tune_cmd, "TUNE_NEEDS", ("llama-bench",))  # the user's build lacks one
    args = SimpleNamespace(recipe=str(h.recipe), backends=read_manifest(prefix)["backend"], target="gfx1151",
                           source=None, ref=None, jobs=None, rootfs=Root("/"), json=True)
    builds, _ = tune_cmd.candidates(args, lambda text: None, [])
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
