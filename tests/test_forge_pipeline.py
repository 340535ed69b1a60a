"""forge/pipeline.py: whose build a prefix holds decides who may replace it (`owner_problem`).

A build is replaced only by a build made for the same owner (`Request.made_for`: None for the
user's `build` and `upgrade`; "tune", "reference", "bisect" for what rocforge builds for itself),
or by the user's own `build`, which may replace what rocforge made.  Real builds of the fixture
project (CMake, the host C compiler): the user's prefix is byte-identical after a refusal.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from buildfixtures import RECIPE, git_repo
from upgrade_history import tree_hashes

from rocforge_build.errors import UsageError
from rocforge_build.forge import pipeline
from rocforge_build.forge.request import Request
from rocforge_build.rootfs import Root
from rocforge_build.workflows.upgrade import request_for


@pytest.fixture
def repo(tmp_path) -> Path:
    return git_repo(tmp_path / "repo")


def built(repo: Path, prefix: Path, *, made_for: str | None = None, targets: tuple[str, ...] = ()):
    req = Request(recipe=str(RECIPE), target="gfx1030", source=str(repo), ref="v1.2.0", prefix=str(prefix),
                  made_for=made_for, build_targets=targets)
    return pipeline.build(req, Root("/"), quiet=True)


def manifest(prefix: Path) -> dict:
    return tomllib.loads((prefix / "rocforge-manifest.toml").read_text())


@pytest.mark.parametrize("command", ["tune", "reference", "bisect"])
def test_a_command_never_replaces_the_users_build_with_its_own_plan(tmp_path, repo, command):
    """The user built all programs at P; tune (or verify's reference, or bisect) planning only
    fixture-hello at P is refused in one line naming the prefix and the difference, nothing built."""
    prefix = tmp_path / "p"
    assert built(repo, prefix).status == pipeline.Status.BUILT
    before = tree_hashes(prefix)
    with pytest.raises(UsageError) as err:
        built(repo, prefix, made_for=command, targets=("fixture-hello",))
    assert err.value.message.startswith(f"{prefix} holds your build (programs all -> fixture-hello); ")
    assert "does not replace it with its own plan" in err.value.message
    assert tree_hashes(prefix) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "repo"]  # no staging left beside it


def test_the_same_plan_at_the_users_prefix_is_reused_not_refused(tmp_path, repo):
    prefix = tmp_path / "p"
    built(repo, prefix)
    before = tree_hashes(prefix)
    assert built(repo, prefix, made_for="tune").status == pipeline.Status.UP_TO_DATE
    assert tree_hashes(prefix) == before


def test_rocforges_own_build_is_replaced_by_its_owner_and_by_the_user(tmp_path, repo):
    """tune's build at its own prefix: a later tune plan replaces it; verify's reference may not
    (another owner); the user's `build` may (what rocforge made for itself is not the user's)."""
    prefix = tmp_path / "own"
    built(repo, prefix, made_for="tune", targets=("fixture-hello",))
    assert manifest(prefix)["made_for"] == "tune" and manifest(prefix)["asked_targets"] == ["fixture-hello"]
    assert built(repo, prefix, made_for="tune").status == pipeline.Status.BUILT
    with pytest.raises(UsageError, match="holds a build made for `rocforge tune`"):
        built(repo, prefix, made_for="reference", targets=("fixture-hello",))
    assert built(repo, prefix, targets=("fixture-hello",)).status == pipeline.Status.BUILT
    assert "made_for" not in manifest(prefix)  # now the user's


def test_an_upgrade_asks_again_for_the_programs_the_user_asked_for(tmp_path, repo):
    """`build --cmake-target fixture-hello`: the manifest keeps the list as asked, and the upgrade's
    request (forge/upgrade.request_for) asks for it again instead of every program of the tree."""
    prefix = tmp_path / "p"
    built(repo, prefix, targets=("fixture-hello",))
    req = request_for(prefix, manifest(prefix))
    assert req.build_targets == ("fixture-hello",) and req.made_for is None
    assert pipeline.build(req, Root("/"), quiet=True).status == pipeline.Status.UP_TO_DATE


def test_a_manifest_edited_to_say_made_for_tune_is_still_bound_to_its_prefix(tmp_path, repo):
    """`made_for` is read from a manifest only where the manifest marks its own prefix: a copy of
    tune's manifest put into a user's directory with other files makes nothing there replaceable."""
    own = tmp_path / "own"
    built(repo, own, made_for="tune")
    user = tmp_path / "thesis"
    user.mkdir()
    (user / "chapter1.tex").write_text("my work")
    (user / "rocforge-manifest.toml").write_text((own / "rocforge-manifest.toml").read_text())
    before = tree_hashes(user)
    with pytest.raises(UsageError):
        built(repo, user, made_for="tune", targets=("fixture-hello",))
    assert tree_hashes(user) == before
