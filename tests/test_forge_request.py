"""forge/request.py: a request carries the configuration as it was when the request was made, beside
its environment, so planning reads no global: a plan made after the user's file changed (another
`rocforge config set` while a long command runs) is the plan of the request, and making it never
reads the file again."""

from __future__ import annotations

import pytest
from buildfixtures import git_repo, recipe_copy

from rocforge_build import config
from rocforge_build.forge.plan import plan_for
from rocforge_build.forge.request import Request
from rocforge_build.rootfs import Root


@pytest.fixture
def recipe(tmp_path):
    repo = git_repo(tmp_path / "repo")
    return recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})


def test_planning_reads_the_requests_settings_and_never_the_file(recipe, tmp_path, monkeypatch):
    store = (tmp_path / "store").as_uri()
    config.set_value("substitute.stores", [store])
    req = Request(recipe=str(recipe), target="gfx1030", backend="cpu")
    assert list(req.settings["substitute"]["stores"]) == [store]

    def no_global_read():
        raise AssertionError("planning read the configuration file again")

    monkeypatch.setattr(config, "effective", no_global_read)
    plan = plan_for(req, Root("/"), check_patches=False)
    assert plan.substitutes.stores == (store,)
    assert plan.parallel is not None  # the compiler cache and jobs came from the snapshot too


def test_a_dependency_request_carries_the_same_settings(recipe):
    req = Request(recipe=str(recipe), target="gfx1030", backend="cpu",
                  settings={**config.effective(), "substitute": {**config.effective()["substitute"],
                                                                  "verify": "none"}})
    dep = req.for_dependency("other", None)
    assert dep.settings is req.settings and dep.settings["substitute"]["verify"] == "none"
