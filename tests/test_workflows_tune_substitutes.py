"""tune asks the configured substitute stores for each candidate before it compiles one (issue 39
item 7e): the same path `rocforge build` takes (`pipeline.execute(..., substitute=)`), so a
candidate a trusted store holds is pulled, its signature and bytes checked, instead of compiled.

Machine A builds the fixture project's CPU build with tune's measuring targets (here the fixture's
fixture-hello stands for llama-bench and llama-perplexity, as in test_workflows_tune.py) and
publishes it to a file:// store; this test's machine lists the store and A's key and asks tune for
its candidates: the candidate is A's build, pulled, and nothing was configured or compiled here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from test_workflows_tune import tune_args
from trust_helpers import rocforge

from rocforge_build import paths
from rocforge_build.discover.builds import read_manifest
from rocforge_build.workflows import tune as tune_workflow

TARGETS = ("fixture-hello",)


def _ok(res):
    assert res.returncode == 0, res.stderr
    return res


@pytest.mark.parametrize("no_substitutes", [False, True])
def test_a_candidate_in_a_trusted_store_is_pulled_not_compiled(tmp_path, monkeypatch, no_substitutes):
    """... and with --no-substitutes it is compiled here, the store not asked."""
    require("patchelf")
    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    a = {"ROCFORGE_CONFIG_DIR": str(tmp_path / "a" / "config"), "ROCFORGE_CACHE_DIR": str(tmp_path / "a" / "cache"),
         "ROCFORGE_DATA_DIR": str(tmp_path / "a" / "data")}
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    built = _ok(rocforge("build", str(recipe), "--target", "gfx1151", "--backend", "cpu",
                         *[x for t in TARGETS for x in ("--cmake-target", t)], "--no-recheck", env=a))
    prefix = built.stdout.strip().splitlines()[-1]
    store = (tmp_path / "store").as_uri()
    _ok(rocforge("publish", prefix, "--to", store, "--unverified", env=a))

    # this machine (the test's own ROCFORGE_* dirs): the store and A's key, no verify model
    _ok(rocforge("config", "set", "substitute.stores", json.dumps([store])))
    _ok(rocforge("config", "set", "substitute.trusted_keys", json.dumps([public])))
    monkeypatch.setattr(tune_workflow, "MEASURE_TARGETS", TARGETS)
    monkeypatch.setattr(tune_workflow, "TUNE_NEEDS", TARGETS)
    said: list[str] = []
    asked = tune_args(recipe, "cpu", substitutes="off" if no_substitutes else "auto")
    builds, skipped = tune_workflow.candidates(asked, said.append, quiet=True)
    assert skipped == [] and len(builds) == 1, (skipped, said)
    got = builds[0].prefix
    manifest = read_manifest(got)
    if no_substitutes:
        assert manifest.get("substituted") is None and list(paths.cache_dir().rglob("CMakeCache.txt"))
        assert not any("substitute" in line for line in said), said
        return
    assert manifest["substituted"]["store"] == store, manifest.get("substituted")
    assert (got / "bin" / "fixture-hello").is_file()
    assert any("came from a substitute store" in line for line in said), said
    # nothing was configured or compiled here: no CMake cache in this machine's work dirs
    assert not list(paths.cache_dir().rglob("CMakeCache.txt"))
    assert Path(prefix).resolve() != got.resolve()  # A's prefix is A's; tune's is this machine's
