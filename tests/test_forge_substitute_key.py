"""forge/substitute_key.py: a build's substitute key covers exactly the inputs that decide its
bytes — the same plan with another prefix, -j, compiler cache or host name has the same key; a
change of recipe text, patch, source commit, target, backend, build targets or CFLAGS gives
another — and `build --dry-run --json` shows it with its fields."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from buildfixtures import git, git_repo, project_copy, recipe_copy

from rocforge_build.forge.plan import plan_for
from rocforge_build.forge.request import Request
from rocforge_build.forge.substitute_key import SubstituteKey, canonical_json
from rocforge_build.rootfs import Root


@pytest.fixture
def fixture_source(tmp_path):
    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    return recipe, repo


def _key(recipe, **kw) -> SubstituteKey:
    args = {"recipe": str(recipe), "target": "gfx1030", "backend": "cpu",
            "environ": {"PATH": "/usr/bin:/bin"}, **kw}
    plan = plan_for(Request(**args), Root("/"), check_patches=False)
    assert plan.substitute_key is not None, plan.no_substitute_key
    return plan.substitute_key


def test_what_does_not_decide_the_bytes_leaves_the_key_alone(fixture_source, tmp_path):
    recipe, _ = fixture_source
    base = _key(recipe, prefix=str(tmp_path / "a"))
    same = [
        _key(recipe, prefix=str(tmp_path / "elsewhere" / "b")),  # prefix and so work dir
        _key(recipe, prefix=str(tmp_path / "a"), jobs=1),  # -j
        _key(recipe, prefix=str(tmp_path / "a"), no_cache=True),  # compiler cache
        _key(recipe, prefix=str(tmp_path / "a"),  # the host name, the user's other variables
             environ={"PATH": "/usr/bin:/bin", "HOSTNAME": "other-box", "HOME": "/elsewhere"}),
    ]
    assert {k.digest for k in same} == {base.digest}
    # while the stamp (does this prefix hold this build?) does see the prefix
    a = plan_for(Request(recipe=str(recipe), target="gfx1030", backend="cpu", prefix=str(tmp_path / "a")),
                 Root("/"), check_patches=False)
    b = plan_for(Request(recipe=str(recipe), target="gfx1030", backend="cpu", prefix=str(tmp_path / "b")),
                 Root("/"), check_patches=False)
    assert a.stamp != b.stamp and a.substitute_key.digest == b.substitute_key.digest


def test_each_input_that_decides_the_bytes_changes_the_key(fixture_source, tmp_path):
    recipe, repo = fixture_source
    base = _key(recipe)
    other_recipe = recipe_copy(tmp_path / "r2", **{"file:///nonexistent/fixture.git": repo.as_uri(),
                                                   'value = "Release"': 'value = "RelWithDebInfo"'})
    (repo / "extra.txt").write_text("a new commit\n")
    changed = {
        "recipe text": _key(other_recipe),
        "target": _key(recipe, target="gfx1100"),
        "build targets": _key(recipe, build_targets=("fixture",)),
        "CFLAGS": _key(recipe, environ={"PATH": "/usr/bin:/bin", "CFLAGS": "-O1"}),
    }
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "more", cwd=repo)
    git("tag", "-f", "v1.2.0", cwd=repo)
    changed["source commit"] = _key(recipe)
    for what, key in changed.items():
        assert key.digest != base.digest, what
    assert changed["target"].mismatch(base.fields) == "target gfx1100 here, gfx1030 in the store"


def test_the_key_is_the_sha256_of_its_canonical_document(fixture_source):
    recipe, _ = fixture_source
    key = _key(recipe)
    assert key.digest == "sha256:" + hashlib.sha256(key.document).hexdigest()
    assert key.document == json.dumps(key.fields, sort_keys=True, separators=(",", ":")).encode()
    assert key.tag == "rocforge-" + key.digest[7:] and len(key.tag) <= 128
    assert canonical_json({"b": 1, "a": [2]}) == b'{"a":[2],"b":1}'
    # the fields a user needs to tell two keys apart, and none that are this machine's paths
    assert {"recipe", "patches", "source", "target", "backend", "build_targets", "toolchain", "glibc",
            "cpu_flags_sha256", "environ", "dependencies", "schema"} <= set(key.fields)
    assert "/" not in json.dumps(key.fields["toolchain"]).replace("\\/", "")


def _local_key(recipe, tree) -> SubstituteKey:
    return plan_for(Request(recipe=str(recipe), target="gfx1030", backend="cpu", source=str(tree)),
                    Root("/"), check_patches=False).substitute_key


def test_a_local_tree_is_keyed_by_its_contents_never_by_its_file_times(tmp_path):
    """Two copies of one tree (other paths, other mtimes: what the stamp's stat hash sees) have one
    key, so a machine that builds from its own copy can take another's build; one changed byte, or
    a file made executable, gives another key."""
    recipe = recipe_copy(tmp_path / "r")
    first = project_copy(tmp_path / "one")
    second = project_copy(tmp_path / "two")
    for f in second.rglob("*"):
        os.utime(f, (1_000_000, 1_000_000))
    key = _local_key(recipe, first)
    assert key is not None and key.fields["source"]["kind"] == "tree"
    assert key.fields["source"]["identity"].startswith("content:")
    assert _local_key(recipe, second).digest == key.digest
    (second / "CMakeLists.txt").write_text((second / "CMakeLists.txt").read_text() + "\n")
    changed = _local_key(recipe, second)
    assert changed.digest != key.digest
    assert key.mismatch(changed.fields).startswith("source ")
    third = project_copy(tmp_path / "three")
    some_file = next(f for f in sorted(third.rglob("*")) if f.is_file())
    some_file.chmod(some_file.stat().st_mode | 0o111)
    assert _local_key(recipe, third).digest != key.digest


def test_a_clean_git_checkout_is_keyed_by_its_commit_and_a_changed_one_by_its_contents(tmp_path):
    recipe = recipe_copy(tmp_path / "r")
    repo = git_repo(tmp_path / "repo")
    commit = git("rev-parse", "HEAD", cwd=repo)
    key = _local_key(recipe, repo)
    assert key.fields["source"] == {"kind": "git-checkout", "identity": commit}
    (repo / "untracked.txt").write_text("a file the commit does not hold\n")
    dirty = _local_key(recipe, repo)
    assert dirty.fields["source"]["kind"] == "tree" and dirty.digest != key.digest


def test_dry_run_json_shows_the_key_with_its_fields(fixture_source, tmp_path):
    recipe, _ = fixture_source
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "build", str(recipe), "--target",
                          "gfx1030", "--backend", "cpu", "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    key = plan["substitute_key"]
    assert key["digest"] == "sha256:" + hashlib.sha256(canonical_json(key["fields"])).hexdigest()
    assert key["fields"]["target"] == "gfx1030" and key["fields"]["backend"] == "cpu"
    assert plan["substitutes"] == {"mode": "auto", "stores": [], "verify": "quick", "verify_model": "",
                                   "trusted_keys": 0}
