"""Hostile git sources that vendor the project (forge/sources.py `GitSource.vendored`: llama-cpp's
`--source REPO --ref X` of a llama-cpp-python checkout builds its vendor/llama.cpp): nothing is
read or built from outside the fetched tree, and a vendored directory without the project is said,
not replaced by the packaging's own CMakeLists.txt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from buildfixtures import git, project_copy, recipe_copy

from rocforge_build.errors import IntegrityError, UsageError
from rocforge_build.forge import recipes
from rocforge_build.forge.sources import source_for

URL = "https://example.invalid/dl/fixture-1.2.0.tar.gz"


def _recipe(tmp_path: Path, extra: str = "") -> recipes.Recipe:
    """The fixture recipe as llama-cpp is: a pinned tarball whose project is vendor/fixture, a git
    source for --ref (`extra`: more [source] keys)."""
    lines = f'ref = "v1.2.0"\nurl = "{URL}"\nsha256 = "{"5" * 64}"\nsubdir = "vendor/fixture"\n{extra}'
    return recipes.load(str(recipe_copy(tmp_path / "r", **{'ref = "v1.2.0"\n': lines})))


def _packaging(tmp_path: Path, make) -> tuple[Path, str]:
    """A repository whose own CMakeLists.txt is the packaging (configuring it fails loudly) and
    whose vendor/ is what `make` puts there; (repo, its commit)."""
    repo = tmp_path / "packaging"
    repo.mkdir()
    (repo / "CMakeLists.txt").write_text('message(FATAL_ERROR "the packaging, not the project")\n')
    make(repo)
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-qm", "p")):
        git(*args, cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def outside(tmp_path) -> Path:
    """A complete project outside any repository: what a hostile link points the build at."""
    return project_copy(tmp_path / "outside" / "fixture")


def _vendor_link(target: Path):
    return lambda repo: os.symlink(target, repo / "vendor")


def _project_link(target: Path):
    def make(repo):
        (repo / "vendor").mkdir()
        os.symlink(target, repo / "vendor" / "fixture")
    return make


def _cmakelists_link(target: Path):
    def make(repo):
        (repo / "vendor" / "fixture").mkdir(parents=True)
        os.symlink(target / "CMakeLists.txt", repo / "vendor" / "fixture" / "CMakeLists.txt")
    return make


@pytest.mark.parametrize("extra", ["", "submodules = true\n"], ids=["export", "checkout"])
@pytest.mark.parametrize("link", [_vendor_link, _project_link, _cmakelists_link])
def test_a_vendored_project_linked_outside_the_repository_is_never_read(tmp_path, outside, extra, link):
    """vendor, vendor/fixture or its CMakeLists.txt a link to a project outside the repository: an
    exported commit is refused while it is unpacked (extract.py); a checkout (a recipe with
    `submodules`: git writes links as they are) built the outside project as the vendored one."""
    repo, commit = _packaging(tmp_path, link(outside))
    with pytest.raises(IntegrityError) as err:
        source_for(_recipe(tmp_path, extra), source=str(repo), ref=commit).fetch(progress=False)
    assert "outside" in err.value.message


def test_a_relative_link_that_climbs_out_of_a_checkout_is_refused(tmp_path, outside):
    """`../../..` far enough to reach the project outside, from the source cache's trees."""
    def make(repo):
        os.symlink("../" * 12 + str(outside.parent).lstrip("/"), repo / "vendor")
    repo, commit = _packaging(tmp_path, make)
    with pytest.raises(IntegrityError, match="leads outside the fetched tree"):
        source_for(_recipe(tmp_path, "submodules = true\n"), source=str(repo), ref=commit).fetch(progress=False)


@pytest.mark.parametrize("what", ["empty", "file"])
def test_a_vendored_directory_without_the_project_is_said_not_the_packaging_built(tmp_path, what):
    """vendor/fixture a git submodule (its directory is empty in the commit's own files) or a
    file: the packaging's CMakeLists.txt at the top was configured instead, and failed as CMake's."""
    def make(repo):
        (repo / "vendor").mkdir()
        if what == "file":
            (repo / "vendor" / "fixture").write_text("not a directory\n")
        else:
            (repo / "vendor" / "fixture").mkdir()
            (repo / "vendor" / "fixture" / ".keep").write_text("")  # as an unfetched submodule's dir
    repo, commit = _packaging(tmp_path, make)
    with pytest.raises(UsageError, match="vendor/fixture holds no CMakeLists.txt"):
        source_for(_recipe(tmp_path), source=str(repo), ref=commit).fetch(progress=False)


def test_a_vendoring_checkout_with_links_inside_it_still_builds_from_the_vendored_project(tmp_path):
    """Links that stay inside the repository are the repository's own: vendor/fixture a relative
    link to a project elsewhere in the same commit is the project."""
    def make(repo):
        project_copy(repo / "third_party" / "fixture")
        (repo / "vendor").mkdir()
        os.symlink("../third_party/fixture", repo / "vendor" / "fixture")
    repo, commit = _packaging(tmp_path, make)
    for extra in ("", "submodules = true\n"):
        fetched = source_for(_recipe(tmp_path / extra.strip(), extra), source=str(repo), ref=commit).fetch(progress=False)
        assert fetched.tree == fetched.root / "vendor" / "fixture"
        assert Path(os.path.realpath(fetched.tree)).is_relative_to(os.path.realpath(fetched.root))
