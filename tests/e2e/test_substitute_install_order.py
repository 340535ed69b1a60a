"""A non-CPU build pulled from a store is installed first and recorded after: what records the
verify here (the results row, the verdict `rocforge env` reads, the build's provenance) opens
the prefix, so it must run once the staged tree is swapped in — before, a GPU build's pull
stopped with "build prefix … does not exist" on a fresh prefix, would have recorded the old
build on an upgrade, and left the staging tree behind.

The build is the fixture recipe's `accel` backend (a non-CPU backend, built from git in a few
seconds), published by machine A to a file store and pulled here through the pipeline with the
substituter every command hands it (`substitute.from_stores`); what the pulled build's
`installed` step sees in the prefix when it runs is the evidence.  A real GPU build (Vulkan on lavapipe) verified
here takes the same pipeline steps with a passing verify; its cost (a Vulkan llama.cpp build
with llama-perplexity and a CPU reference) is left to the slow suite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace as with_fields
from pathlib import Path

import pytest
from buildfixtures import git_repo, project_copy, recipe_copy
from needs import require
from trust_helpers import rocforge

from rocforge_build.discover.builds import read_manifest
from rocforge_build.forge import pipeline
from rocforge_build.forge.locations import staging_dir
from rocforge_build.forge.request import Request
from rocforge_build.rootfs import Root
from rocforge_build.substitute import from_stores


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Machine A's accel build of the fixture at v1.2.0, published (unverified) to a file store."""
    require("patchelf")
    base = tmp_path_factory.mktemp("gpu-install")
    repo = git_repo(base / "repo")
    recipe = recipe_copy(base / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    a = {"ROCFORGE_CONFIG_DIR": str(base / "a" / "config"), "ROCFORGE_CACHE_DIR": str(base / "a" / "cache"),
         "ROCFORGE_DATA_DIR": str(base / "a" / "data")}
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    built = _ok(rocforge("build", str(recipe), "--target", "gfx1151", "--backend", "accel", env=a))
    prefix = built.stdout.strip().splitlines()[-1]
    assert read_manifest(Path(prefix))["backend"] == "accel"
    url = (base / "store").as_uri()
    tag = _ok(rocforge("publish", prefix, "--to", url, "--unverified", env=a)).stdout.strip()
    return {"base": base, "recipe": recipe, "public": public, "url": url,
            "key": "sha256:" + tag.removeprefix("rocforge-")}


@pytest.fixture
def here(store, _isolated):
    """This machine (conftest's isolated dirs): trusting A's key, asking A's store."""
    for key, value in (("substitute.stores", [store["url"]]), ("substitute.trusted_keys", [store["public"]])):
        _ok(rocforge("config", "set", key, json.dumps(value)))
    return store


def _request(store, prefix: Path) -> Request:
    return Request(recipe=str(store["recipe"]), target="gfx1151", backend="accel", prefix=str(prefix),
                   substitutes="only")


def _watching(seen: list[dict]):
    """The commands' substituter (`substitute.from_stores`), its `installed` step wrapped to note
    what the prefix holds at the moment it runs (then run as it is)."""
    def substitute(plan, staging, say):
        outcome = from_stores(plan, staging, say)
        if not outcome.staged:
            return outcome
        real = outcome.installed

        def installed():
            seen.append({"manifest": read_manifest(plan.prefix), "staging": staging.exists()})
            if real is not None:
                real()
        return with_fields(outcome, installed=installed)
    return substitute


def _older_build_at(store, prefix: Path) -> str:
    """A compile of an older fixture tree (VERSION 1.1.0) at `prefix`; its stamp."""
    old = project_copy(store["base"] / f"old-{os.getpid()}-{prefix.name}")
    (old / "VERSION").write_text("1.1.0\n")
    _ok(rocforge("build", str(store["recipe"]), "--target", "gfx1151", "--backend", "accel",
                 "--source", str(old), "--prefix", str(prefix), "--no-substitutes"))
    shutil.rmtree(old)
    return read_manifest(prefix)["stamp"]


@pytest.mark.parametrize("existing", [False, True], ids=["fresh-prefix", "over-an-older-build"])
def test_a_pulled_accel_build_is_recorded_after_the_swap_as_the_new_build(here, tmp_path, existing):
    prefix = tmp_path / "builds" / "fixture-accel"
    old_stamp = _older_build_at(here, prefix) if existing else None
    seen: list[dict] = []
    result = pipeline.build(_request(here, prefix), Root("/"), quiet=True, substitute=_watching(seen))
    assert result.status == pipeline.Status.SUBSTITUTED
    installed = read_manifest(prefix)
    assert installed["substituted"]["key"] == here["key"] and installed["backend"] == "accel"
    assert installed["stamp"] != old_stamp
    # the recording step ran once, after the swap: the prefix held the pulled build, staging was gone
    [at_record] = seen
    assert at_record["staging"] is False
    assert at_record["manifest"]["substituted"]["key"] == here["key"]
    assert at_record["manifest"]["stamp"] == installed["stamp"]
    assert not staging_dir(prefix).exists()
    out = subprocess.run([str(prefix / "bin" / "fixture-hello")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0


def test_a_failure_between_the_pull_and_the_swap_leaves_no_staging_and_the_old_build(here, tmp_path):
    """Ctrl-C after the build is staged (verified, its manifest written) and before the swap."""
    prefix = tmp_path / "builds" / "fixture-accel"
    old_stamp = _older_build_at(here, prefix)

    def interrupted(plan, staging, say):
        outcome = from_stores(plan, staging, say)
        assert outcome.staged and staging.is_dir()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pipeline.build(_request(here, prefix), Root("/"), quiet=True, substitute=interrupted)
    assert not staging_dir(prefix).exists()
    kept = read_manifest(prefix)
    assert kept["stamp"] == old_stamp and not kept.get("substituted")
