"""Fetching sources: local git repositories, tarballs (file and HTTP), local trees; work copies."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from buildfixtures import PROJECT, RECIPE, git, git_repo, recipe_copy, tarball

from rocforge_build.errors import IntegrityError, UsageError
from rocforge_build.forge import pipeline, recipes, source_fetch, sources
from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.rootfs import Root


def test_source_for_precedence(tmp_path):
    r = recipes.load(str(RECIPE))
    assert sources.source_for(r).kind == "git" and sources.source_for(r).ref == "v1.2.0"
    assert sources.source_for(r, ref="main").ref == "main"
    assert sources.source_for(r, source=str(PROJECT)).kind == "local"
    tb = tarball(tmp_path / "f.tar.gz")
    assert sources.source_for(r, source=str(tb)).kind == "tarball"
    assert sources.source_for(r, source="https://example.invalid/x.git").kind == "git"
    assert sources.source_for(r, source="https://example.invalid/x.tar.xz").kind == "tarball"
    with pytest.raises(UsageError):
        sources.source_for(r, source=str(tmp_path / "missing"))
    with pytest.raises(UsageError):
        sources.source_for(r, source="https://example.invalid/page.html")
    repo = git_repo(tmp_path / "repo")
    s = sources.source_for(r, source=str(repo), ref="v1.2.0")  # a local repo at a ref
    assert s.kind == "git" and s.location == str(repo)


def test_git_fetch_by_tag_and_branch(tmp_path):
    repo = git_repo(tmp_path / "repo")
    (repo / "NEW").write_text("x")
    git("add", "NEW", cwd=repo)
    git("commit", "-q", "-m", "new", cwd=repo)
    head = git("rev-parse", "HEAD", cwd=repo)
    tag = git("rev-parse", "v1.2.0", cwd=repo)
    spec = sources.GitSource(repo.as_uri(), ref="v1.2.0")
    assert spec.identify() == tag
    f = spec.fetch()
    assert f.commit == tag and (f.tree / "CMakeLists.txt").is_file() and not (f.tree / "NEW").exists()
    assert not (f.tree / ".git").exists()
    f2 = sources.GitSource(repo.as_uri(), ref="main").fetch()
    assert f2.identity == head and (f2.tree / "NEW").is_file()
    with pytest.raises(UsageError):
        sources.GitSource(repo.as_uri(), ref="no-such-ref").identify()


def test_local_tree_identity_tracks_changes(tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(PROJECT, src)
    a = sources.tree_hash(src)
    assert sources.tree_hash(src) == a
    (src / "hello.c").write_text("int main(void){return 0;}\n")
    assert sources.tree_hash(src) != a


def test_tarball_over_http_with_pinned_sha(tmp_path, http_server):
    data = tarball(tmp_path / "fixture-1.2.0.tar.gz").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    url = http_server.add("/dl/fixture-1.2.0.tar.gz", data)
    recipe = recipe_copy(tmp_path / "r", **{
        'git = "file:///nonexistent/fixture.git"\nref = "v1.2.0"': f'url = "{url}"\nsha256 = "{sha}"'})
    req = Request(recipe=str(recipe), target="gfx1030", prefix=str(tmp_path / "p"), jobs=2)
    out = pipeline.build(req, Root("/"), quiet=True)
    assert out.status == "built"
    gets = [r for r in http_server.requests if r[0] == "GET"]
    assert len(gets) == 1
    # the second identical build needs neither the network nor CMake
    assert pipeline.build(req, Root("/"), quiet=True).status == "up to date"
    assert len([r for r in http_server.requests if r[0] == "GET"]) == 1


def test_tarball_sha_mismatch(tmp_path, http_server):
    data = tarball(tmp_path / "f.tar.gz").read_bytes()
    url = http_server.add("/dl/f.tar.gz", data)
    recipe = recipe_copy(tmp_path / "r", **{
        'git = "file:///nonexistent/fixture.git"\nref = "v1.2.0"': f'url = "{url}"\nsha256 = "{"0" * 64}"'})
    with pytest.raises(IntegrityError):
        plan_for(Request(recipe=str(recipe), target="gfx1030"), Root("/"))


def test_sync_tree_copies_only_changes(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x").write_text("1")
    (src / "y").write_text("2")
    os.symlink("y", src / "link")
    assert sources.sync_tree(src, dst) == 3
    assert sources.sync_tree(src, dst) == 0
    (src / "y").write_text("22")
    (dst / "stray").write_text("s")
    (src / "d" / "x").unlink()
    assert sources.sync_tree(src, dst) == 1
    assert sorted(p.name for p in dst.rglob("*")) == ["d", "link", "y"]
    assert (dst / "y").read_text() == "22" and os.readlink(dst / "link") == "y"


def test_a_replaced_file_is_newer_than_objects_built_before_it_even_with_an_older_commit_time(tmp_path):
    # git archive stamps files with their commit's time, in whole seconds: a commit made a second
    # before the last build gives its files an mtime older than that build's objects, though newer
    # than the files they replace.  ninja (mtime order) would keep the stale object: the flake in
    # tests/e2e/test_upgrade.py where a broken commit passed the upgrade's gate.
    src, dst = tmp_path / "a", tmp_path / "b"
    src.mkdir()
    (src / "greet.c").write_text("toupper")
    os.utime(src / "greet.c", (1_000_000_000, 1_000_000_000))
    sources.sync_tree(src, dst)
    obj = tmp_path / "greet.o"
    obj.write_text("object")
    os.utime(obj, (1_000_000_002, 1_000_000_002))  # built two seconds after the first commit
    (src / "greet.c").write_text("tolower")
    os.utime(src / "greet.c", (1_000_000_001, 1_000_000_001))  # committed before that build
    assert sources.sync_tree(src, dst) == 1
    assert (dst / "greet.c").read_text() == "tolower"
    assert (dst / "greet.c").stat().st_mtime_ns > obj.stat().st_mtime_ns


def test_first_copy_leaves_out_what_a_work_copy_must_not_have(tmp_path):
    """The first copy is one `cp -a`; a submodule's .git, __pycache__ and the fetch marker are
    then dropped at any depth, and the count is of the files the work copy holds."""
    src, dst = tmp_path / "a", tmp_path / "b"
    for d in ("sub/.git/objects", "pkg/__pycache__", "keep"):
        (src / d).mkdir(parents=True)
    (src / "sub" / ".git" / "objects" / "o").write_text("x")
    (src / "pkg" / "__pycache__" / "m.pyc").write_text("x")
    (src / "pkg" / "m.py").write_text("x")
    (src / "keep" / ".git").write_text("gitdir: ../../.git/modules/keep\n")  # a submodule's gitlink
    (src / ".rocforge-complete").write_text("")
    (src / "top.c").write_text("x")
    os.symlink("keep", src / "keep-link")  # a link to a directory is copied as a link
    assert sources.sync_tree(src, dst) == 2  # pkg/m.py, top.c
    got = sorted(str(p.relative_to(dst)) for p in dst.rglob("*"))
    assert got == ["keep", "keep-link", "pkg", "pkg/m.py", "sub", "top.c"]
    assert os.readlink(dst / "keep-link") == "keep"
    assert sources.sync_tree(src, dst) == 0  # the next sync finds nothing to copy


def test_a_fetch_is_announced_once_and_later_plans_work_offline(tmp_path, capsys):
    """The newcomer trial: `--dry-run` silently downloaded 300 MB.  A plan reads the source's
    build files, so the first one fetches - and says so on stderr; the second finds the cached
    copy, says nothing, and still works once the upstream is gone (offline)."""
    import shutil

    from rocforge_build.cli import main

    repo = git_repo(tmp_path / "repo")
    recipe = recipe_copy(tmp_path, **{'git = "file:///nonexistent/fixture.git"':
                                      f'git = "file://{repo}"'})
    argv = ["build", str(recipe), "--target", "gfx1100", "--dry-run"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert first.err.count("rocforge: fetching file://") == 1 and "@ v1.2.0" in first.err
    shutil.rmtree(repo)                       # the upstream is unreachable from now on
    assert main(argv) == 0
    second = capsys.readouterr()
    assert "fetching" not in second.err and "unreachable; using v1.2.0 = " in second.err
    import re

    def plan(text: str) -> str:  # the free memory behind the -j figure moves between two runs
        return re.sub(r"\d+ MB avail", "N MB avail", text)

    assert plan(second.out) == plan(first.out)  # the same plan, offline


def test_the_stub_patch_applies_to_a_work_copy_of_the_may_2025_sdist_tree(tmp_path):
    """The llama-cpp-python 0.3.9 sdist ships vendor/llama.cpp/.git as a submodule gitlink
    ("gitdir: ../../.git/modules/vendor/llama.cpp"); a work copy of vendor/llama.cpp alone must
    not carry it, or `git apply` there stops with "fatal: not a git repository"."""
    from llama_trees import tree

    from rocforge_build.forge import patches

    src = tree("0.3.9", tmp_path / "trees", full=True) / "vendor" / "llama.cpp"
    assert (src / ".git").read_text().startswith("gitdir: ../../.git/modules/")
    work = tmp_path / "work" / "src"
    sources.sync_tree(src, work)
    assert not (work / ".git").exists()
    stub = Path(__file__).resolve().parent.parent / "patches/llama-cpp/gfx1151-fattn-wmma-stub.patch"
    (res,) = patches.apply([patches.PatchPlan(stub.name, stub, True, "test")], work)
    assert res.status == patches.APPLIED
    assert "stubbed for gfx1151" in (work / "ggml/src/ggml-cuda/fattn-wmma-f16.cu").read_text()


def test_a_patch_whose_second_file_fails_leaves_the_first_untouched(tmp_path):
    """`patches.apply` runs `git apply` without a separate `--check` first: git applies a patch
    atomically (git-apply(1), --reject: "by default fails the whole patch and does not touch the
    working tree when some of the hunks do not apply"), so a half-applicable patch changes nothing."""
    from rocforge_build.errors import PatchError
    from rocforge_build.forge import patches

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("one\ntwo\n")
    (tree / "b.txt").write_text("three\nfour\n")
    patch = tmp_path / "two-files.patch"
    patch.write_text("--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
                     "--- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n three\n-FOUR\n+five\n")
    with pytest.raises(PatchError) as exc:
        patches.apply([patches.PatchPlan(patch.name, patch, True, "test")], tree)
    assert "b.txt" in exc.value.message
    assert (tree / "a.txt").read_text() == "one\ntwo\n"  # the applicable hunk was not applied
    good = tmp_path / "good.patch"
    good.write_text("--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n")
    plans = [patches.PatchPlan(good.name, good, True, "test")]
    assert patches.apply(plans, tree)[0].status == patches.APPLIED
    assert (tree / "a.txt").read_text() == "one\nTWO\n"
    assert patches.apply(plans, tree)[0].status == patches.UPSTREAM  # idempotent


def test_a_git_source_of_a_recipe_with_a_tarball_is_the_project_itself(tmp_path):
    # llama-cpp's subdir (vendor/llama.cpp) is the llama-cpp-python sdist's layout; a git source is
    # llama.cpp's own repository (as the recipe's `git` with --ref is), the project at its top.
    # A monorepo recipe (rocwmma: git only, sparse) keeps its subdir.
    llama = recipes.load("llama-cpp")
    repo = git_repo(tmp_path / "llama.cpp")
    for source in (str(repo), "https://example.org/llama.cpp.git", "git+ssh://example.org/llama.cpp"):
        assert sources.source_for(llama, ref="HEAD", source=source).subdir is None
    assert sources.source_for(llama).subdir == "vendor/llama.cpp"  # the sdist
    rocwmma = recipes.load("rocwmma")
    assert sources.source_for(rocwmma, ref="develop", source=str(repo)).subdir == "projects/rocwmma"


# -- a dry run never downloads: a remote git source --------------------------------------------------

def test_dry_run_of_a_remote_git_source_asks_no_server(http_server, tmp_path, capsys):
    """A git URL on 127.0.0.1 (the server would log `GET /repo.git/info/refs`): not in the cache,
    the dry run asks nothing, not even `git ls-remote`, and plans without it.  Once the cache has
    the commit a ref last resolved to (a bare mirror, as a build's fetch leaves it), the dry run
    plans from it in full, says which commit the ref was taken as, and still asks nothing."""
    import json
    import subprocess

    from rocforge_build.cli import main

    url = http_server.url("/repo.git")
    argv = ["build", str(RECIPE), "--target", "gfx1030", "--source", url, "--ref", "v1.2.0",
            "--dry-run", "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["source"]["fetched"] is False and plan["source"]["kind"] == "git"
    assert http_server.requests == []
    # what a build's fetch leaves: the mirror with the commit, and the ref it resolved to
    repo = git_repo(tmp_path / "repo")
    commit = git("rev-parse", "v1.2.0^{commit}", cwd=repo)
    mirror = source_fetch.git_mirror(url)
    mirror.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(mirror)], check=True)
    source_fetch._remember_ref(url, "v1.2.0", commit)
    assert main(argv) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert "fetched" not in plan["source"] and plan["source"]["identity"] == commit
    assert "after_fetch" not in plan and plan["patches"][0]["status"] == "would apply"
    assert f"v1.2.0 = {commit[:12]}, as the last fetch found it" in err
    assert http_server.requests == []
