"""substitute/publish.py: a GPU build's CPU reference travels with it.  The reference of its latest
passing verify is named in the evidence by key and stamp (never by this machine's path) and
published beside it, unless it was rebuilt since, has no key, is in the store already or there is
no model to measure its own figures with — each said in one line, none failing the publish.

The reference here is a real fixture build (the fixture recipe from a git repository, CPU backend);
the verify rows are what `rocforge verify` records: the reference's prefix and stamp."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from trust_helpers import rocforge

from rocforge_build.discover.builds import read_manifest
from rocforge_build.substitute import publish


@pytest.fixture
def reference(tmp_path) -> Path:
    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    prefix = tmp_path / "reference"
    out = rocforge("build", str(recipe), "--target", "gfx1030", "--backend", "cpu", "--prefix", str(prefix))
    assert out.returncode == 0, out.stderr
    return prefix


def test_the_latest_passing_verifys_reference_is_named_by_key_and_stamp(reference):
    stamp = read_manifest(reference)["stamp"]
    found = publish.verified_against([{"reference": "/elsewhere", "reference_stamp": "x"},
                                      {"reference": str(reference), "reference_stamp": stamp}])
    assert isinstance(found, publish.Reference) and found.prefix == reference
    recorded = read_manifest(reference)["substitute_key"]["digest"]
    assert found.pointer == {"key": recorded, "stamp": stamp}
    assert str(reference) not in repr(found.pointer)  # no path of this machine travels


def test_a_reference_rebuilt_gone_or_unnamed_is_said_not_sent(reference, tmp_path):
    assert "rebuilt after the verify" in publish.verified_against(
        [{"reference": str(reference), "reference_stamp": "another"}])
    assert "is not a rocforge build" in publish.verified_against(
        [{"reference": str(tmp_path / "gone"), "reference_stamp": "x"}])
    assert publish.verified_against([{"passed": True}]) == "the verify on record names none"
    assert publish.verified_against([]) == "no passing verify on record names one"


def test_the_reference_goes_to_the_store_once_and_needs_a_model(reference, tmp_path):
    require("patchelf")
    stamp = read_manifest(reference)["stamp"]
    found = publish.verified_against([{"reference": str(reference), "reference_stamp": stamp}])
    store = (tmp_path / "store").as_uri()
    key = rocforge("key", "generate")
    assert key.returncode == 0, key.stderr
    key_file = publish.signing_key_path("")
    said: list[str] = []
    kw = {"key_file": key_file, "root": "/", "timeout": 30.0, "progress": said.append}
    assert publish._publish_reference(found, store, model=None, **kw) == \
        "not published: no model (--model) to measure its own figures with"
    assert said[-1].startswith("its reference is not published: no model")
    # once in the store (here published by hand, unverified), it is not measured and sent again
    out = rocforge("publish", str(reference), "--to", store, "--unverified")
    assert out.returncode == 0, out.stderr
    assert publish._publish_reference(found, store, model="/no/model.gguf", **kw) == "in the store already"
    assert publish._publish_reference("it has no key", store, model=None, **kw) == "not published: it has no key"
