"""forge/sources.py, one class at a time: GitSource, TarballSource and LocalSource — their
identity, where they count as remote, the pinned version of a recipe's own tarball, and the JSON
that manifests and recorded plans hold.  Real trees, tarballs and git repositories; no network."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from buildfixtures import git, git_repo, project_copy, recipe_copy, tarball

from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.forge import recipes
from rocforge_build.forge.sources import GitSource, LocalSource, TarballSource, source_for

URL = "https://example.invalid/dl/fixture-1.2.0.tar.gz"
SHA = "5" * 64


def _recipe_with_tarball(tmp_path: Path, *, pinned: str | None) -> recipes.Recipe:
    """The fixture recipe whose default source is URL pinned by SHA (and a git source for --ref)."""
    lines = f'url = "{URL}"\nsha256 = "{SHA}"\n' + (f'pinned_version = "{pinned}"\n' if pinned else "")
    path = recipe_copy(tmp_path / "r", **{'ref = "v1.2.0"\n': 'ref = "v1.2.0"\n' + lines})
    return recipes.load(str(path))


# -- LocalSource ----------------------------------------------------------------------------------

def test_a_local_trees_identity_changes_with_its_content_and_only_then(tmp_path):
    tree = project_copy(tmp_path / "tree")
    source = LocalSource(str(tree))
    first = source.identify()
    assert first.startswith("tree:") and source.identify() == first  # stats alone: stable
    (tree / "hello.c").write_text("int main(void) { return 1; }\n")
    changed = source.identify()
    assert changed != first
    (tree / "new.h").write_text("")
    assert source.identify() not in (first, changed)


def test_a_local_subdir_tracks_the_project_and_the_top_files_not_the_sibling_directories(tmp_path):
    top = tmp_path / "top"
    project_copy(top / "project")
    (top / "VERSION").write_text("1\n")
    (top / "other").mkdir()
    source = LocalSource(str(top), subdir="project")
    first = source.identify()
    (top / "other" / "notes.txt").write_text("not the project's\n")
    assert source.identify() == first
    (top / "VERSION").write_text("2\n")  # a version file beside the project
    assert source.identify() != first


def test_a_local_tree_is_read_in_place_with_its_checkouts_commit(tmp_path):
    repo = git_repo(tmp_path / "repo")
    fetched = LocalSource(str(repo)).fetch()
    assert fetched.root == repo and fetched.tree == repo and fetched.read
    assert fetched.commit == git("rev-parse", "HEAD", cwd=repo)
    assert LocalSource(str(repo)).without_download() == fetched  # nothing to download: read
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="holds no CMakeLists.txt"):
        LocalSource(str(empty)).fetch()


# -- TarballSource --------------------------------------------------------------------------------

def test_the_recipes_own_tarball_alone_carries_its_pinned_version(tmp_path):
    recipe = _recipe_with_tarball(tmp_path, pinned="1.2.0")
    own = source_for(recipe)
    assert isinstance(own, TarballSource) and own.sha256 == SHA
    assert own.pinned_version == "1.2.0"
    assert source_for(recipe, source=URL).pinned_version == "1.2.0"  # the same URL, given
    other = source_for(recipe, source="https://example.invalid/dl/fixture-1.3.0.tar.gz")
    assert other.sha256 is None and other.pinned_version is None  # another tarball: unknown
    local = source_for(recipe, source=str(tarball(tmp_path / "fixture-1.2.0.tar.gz")))
    assert isinstance(local, TarballSource) and local.pinned_version is None
    git_source = source_for(recipe, ref="v1.2.0")
    assert isinstance(git_source, GitSource) and git_source.pinned_version is None
    assert source_for(_recipe_with_tarball(tmp_path / "b", pinned=None)).pinned_version is None


def test_a_tarball_that_contradicts_its_pinned_version_is_a_recipe_error(tmp_path):
    own = source_for(_recipe_with_tarball(tmp_path, pinned="1.2.0"))
    own.check_version("fixture", "1.2.0")
    with pytest.raises(ConfigError, match="pinned_version is 1.2.0, but the pinned tarball"):
        own.check_version("fixture", "1.3.0")
    TarballSource(URL).check_version("fixture", "9.9")  # nothing declared, nothing to contradict


def test_a_tarball_is_remote_only_by_url():
    assert TarballSource(URL).remote
    assert not TarballSource("/srv/fixture-1.2.0.tar.gz").remote
    assert not TarballSource("file:///srv/fixture-1.2.0.tar.gz").remote


def test_a_local_tarball_is_named_by_its_bytes_and_unpacked_once(tmp_path):
    archive = tarball(tmp_path / "fixture-1.2.0.tar.gz")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    source = TarballSource(str(archive))
    assert source.identify() == sha
    fetched = source.fetch()
    assert fetched.identity == sha and (fetched.tree / "CMakeLists.txt").is_file()
    assert fetched.root.name == sha[:20] and fetched.commit is None
    assert source.without_download().root == fetched.root  # local: read, from the cache


def test_a_pinned_remote_tarball_not_in_the_cache_is_a_stand_in_for_a_dry_run(tmp_path):
    stand_in = TarballSource(URL, sha256=SHA).without_download()  # example.invalid: no server
    assert not stand_in.read and stand_in.identity == SHA and stand_in.root.name == SHA[:20]
    assert TarballSource(URL).identify() == ""  # unpinned and remote: only the download tells


# -- GitSource ------------------------------------------------------------------------------------

def test_a_git_source_is_remote_unless_it_is_on_this_host(tmp_path):
    repo = git_repo(tmp_path / "repo")
    assert not GitSource(str(repo)).remote
    assert not GitSource(repo.as_uri()).remote
    assert GitSource("https://example.invalid/fixture.git").remote
    assert GitSource("ssh://git@example.invalid/fixture.git").remote
    assert GitSource(str(tmp_path / "missing")).remote  # no such path: taken as a remote name
    assert not LocalSource(str(repo)).remote


def test_a_git_source_is_named_by_the_commit_its_ref_resolves_to(tmp_path):
    repo = git_repo(tmp_path / "repo")
    tag = git("rev-parse", "v1.2.0^{commit}", cwd=repo)
    assert GitSource(repo.as_uri(), ref="v1.2.0").identify() == tag
    (repo / "NEW").write_text("x")
    git("add", "NEW", cwd=repo)
    git("commit", "-q", "-m", "new", cwd=repo)
    head = GitSource(repo.as_uri()).identify()  # no ref: HEAD
    assert head == git("rev-parse", "HEAD", cwd=repo) != tag
    sha = "0123456789abcdef" * 2 + "01234567"
    assert GitSource("https://example.invalid/x.git", ref=sha).identify() == sha  # asks nothing
    fetched = GitSource(repo.as_uri(), ref="v1.2.0").fetch(progress=False)
    assert fetched.commit == fetched.identity == tag and not (fetched.tree / "NEW").exists()


def test_a_sparse_or_submodule_git_source_is_a_checkout_cached_apart_from_the_export(tmp_path):
    repo = tmp_path / "monorepo"
    project_copy(repo / "project")
    (repo / "other").mkdir()
    (repo / "other" / "big.bin").write_text("another project's\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "two projects", cwd=repo)
    exported = GitSource(repo.as_uri(), subdir="project")
    sparse = GitSource(repo.as_uri(), subdir="project", sparse=("project",))
    assert not exported.checkout and sparse.checkout
    assert GitSource(repo.as_uri(), submodules=True).checkout
    a, b = exported.fetch(progress=False), sparse.fetch(progress=False)
    assert a.commit == b.commit and a.root != b.root
    assert (a.root / "other" / "big.bin").is_file() and not (b.root / "other").exists()
    assert b.tree == b.root / "project" and (b.tree / "CMakeLists.txt").is_file()


def test_a_remote_git_source_never_read_is_a_stand_in_without_a_commit(tmp_path):
    stand_in = GitSource("https://example.invalid/fixture.git", ref="v1.2.0").without_download()
    assert not stand_in.read and stand_in.identity == "" and stand_in.commit is None


# -- what manifests and plans record --------------------------------------------------------------

def test_to_json_records_the_kind_and_the_fields_that_are_set_in_order(tmp_path):
    git_json = GitSource("https://example.invalid/r.git", ref="v1", subdir="projects/p",
                         sparse=("projects/p", "shared"), submodules=True).to_json()
    assert list(git_json.items()) == [
        ("kind", "git"), ("location", "https://example.invalid/r.git"), ("ref", "v1"),
        ("subdir", "projects/p"), ("sparse", ["projects/p", "shared"]), ("submodules", True)]
    assert GitSource("/srv/r").to_json() == {"kind": "git", "location": "/srv/r"}
    pinned = TarballSource(URL, sha256=SHA, subdir="vendor/x", pinned_version="1.2.0")
    assert list(pinned.to_json().items()) == [
        ("kind", "tarball"), ("location", URL), ("sha256", SHA), ("subdir", "vendor/x")]
    assert LocalSource("/srv/tree").to_json() == {"kind": "local", "location": "/srv/tree"}
    tree = project_copy(tmp_path / "tree")
    fetched = LocalSource(str(tree)).fetch().to_json()
    assert fetched == {"kind": "local", "location": str(tree),
                       "identity": LocalSource(str(tree)).identify(), "tree": str(tree)}
    assert os.path.isdir(fetched["tree"])


def test_a_git_repository_that_vendors_the_project_is_built_from_its_vendored_directory(tmp_path):
    """llama-cpp-python's own repository keeps llama.cpp under vendor/llama.cpp, as its sdists do:
    a local clone of it at a ref (`upgrade --ref` of a build from such a checkout) is the project in
    the recipe's subdir, not the packaging's top CMakeLists.txt (found building the upgrade journey:
    CMake configured llama-cpp-python's project and a rebuild failed); a repository that is the
    project itself is still read at its top."""
    recipe = recipes.load(str(recipe_copy(tmp_path / "r", **{'ref = "v1.2.0"\n': f'ref = "v1.2.0"\nurl = "{URL}"\nsha256 = "{SHA}"\n'
                                                                                 'subdir = "vendor/fixture"\n'})))
    packaging = tmp_path / "packaging"
    project_copy(packaging / "vendor" / "fixture")
    (packaging / "CMakeLists.txt").write_text('message(FATAL_ERROR "the packaging, not the project")\n')
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-qm", "p")):
        git(*args, cwd=packaging)
    commit = git("rev-parse", "HEAD", cwd=packaging)
    fetched = source_for(recipe, source=str(packaging), ref=commit).fetch()
    assert fetched.tree == fetched.root / "vendor" / "fixture"
    assert fetched.spec.to_json() == {"kind": "git", "location": str(packaging), "ref": commit,
                                      "subdir": "vendor/fixture"}
    plain = git_repo(tmp_path / "plain")
    fetched = source_for(recipe, source=str(plain), ref="v1.2.0").fetch()
    assert fetched.tree == fetched.root and "subdir" not in fetched.spec.to_json()
