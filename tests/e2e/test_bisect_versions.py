"""`rocforge bisect --versions` on released tarballs of the fixture project, served by a real
HTTP server on 127.0.0.1: each version is one commit of tests/upgrade_history.py exported the way
a release tarball is (`git archive --prefix fixture-V/`), so the version that breaks the output
is known from the history, not from rocforge."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from buildfixtures import git, recipe_copy
from upgrade_history import history, output_checker

from rocforge_build import cli
from rocforge_build.workflows.bisect import max_builds, version_template

# version -> the history's commit it releases (oldest first); 1.4 is "break", the first bad one
RELEASES = {"1.0": "base", "1.1": "docs1", "1.2": "slow", "1.3": "docs2", "1.4": "break",
            "1.5": "docs3"}


@pytest.fixture
def releases(tmp_path, http_server):
    """The recipe (a tarball source at the HTTP server, version 1.5) and the served tarballs."""
    h = history(tmp_path)
    shas = {"base": h.base, **h.commits}
    for version, name in RELEASES.items():
        out = tmp_path / f"fixture-{version}.tar.gz"
        git("archive", "--format=tar.gz", f"--prefix=fixture-{version}/", "-o", str(out),
            shas[name], cwd=h.repo)
        http_server.add(f"/releases/fixture-{version}.tar.gz", out.read_bytes())
    url = http_server.url("/releases/fixture-1.5.tar.gz")
    pin = hashlib.sha256((tmp_path / "fixture-1.5.tar.gz").read_bytes()).hexdigest()
    recipe = recipe_copy(tmp_path / "r", **{
        'git = "file:///nonexistent/fixture.git"\nref = "v1.2.0"':
            f'url = "{url}"\nsha256 = "{pin}"'})
    return recipe, http_server


def bisect(capsys, recipe, *extra):
    rc = cli.main(["bisect", str(recipe), "--target", "gfx1151", "--json", *extra])
    out, err = capsys.readouterr()
    assert out, err
    return rc, json.loads(out)


def test_bisect_versions_finds_the_release_that_breaks_the_output(releases, tmp_path, capsys):
    recipe, server = releases
    check = output_checker(tmp_path)
    listed = ",".join(RELEASES)
    # no --source: the recipe's tarball URL with its version replaced; good 1.0, bad 1.5
    rc, doc = bisect(capsys, recipe, "--versions", listed, "--run", str(check))
    assert rc == 0 and doc["axis"] == "versions" and doc["first_bad"] == "1.4"
    assert doc["good"] == "1.0" and doc["bad"] == "1.5" and doc["candidates"] == 5
    assert doc["source"] == server.url("/releases/fixture-{version}.tar.gz")
    # 5 candidates: 1.5 first (must be bad), then the middles 1.2, 1.3, 1.4
    assert [(s["ref"], s["verdict"]) for s in doc["steps"]] == [
        ("1.5", "bad"), ("1.2", "good"), ("1.3", "good"), ("1.4", "bad")]
    assert doc["builds"] == 4 <= max_builds(5) == 4
    assert all(s["figures"] == {"exit_code": 0 if s["verdict"] == "good" else 1}
               for s in doc["steps"])
    bad = subprocess.run([f"{doc['steps'][-1]['prefix']}/bin/fixture-hello"], capture_output=True,
                         text=True, check=True).stdout
    assert "hello" in bad.splitlines() and "HELLO" not in bad  # 1.4 really is the broken one
    assert not any("fixture-1.0.tar.gz" in p for _m, p, _h in server.requests)  # good: not built
    # --good/--bad name versions in the list; a step whose test exits 125 is skipped, and two
    # untested neighbours are left as suspects; every build is the cached one from above
    skip = tmp_path / "skip-1.3.sh"
    skip.write_text('#!/bin/sh\ncase "$ROCFORGE_PREFIX" in */v-1.3) exit 125;; esac\n'
                    f'exec {check}\n')
    skip.chmod(0o755)
    report = tmp_path / "issue.md"
    rc, doc = bisect(capsys, recipe, "--versions", listed, "--good", "1.2", "--bad", "1.5",
                     "--run", str(skip), "--report", str(report))
    assert rc == 1 and doc["first_bad"] is None and doc["suspects"] == ["1.3", "1.4"]
    assert [(s["ref"], s["verdict"]) for s in doc["steps"]] == [
        ("1.5", "bad"), ("1.3", "skip"), ("1.4", "bad")]
    assert doc["builds"] == 0
    text = report.read_text()
    assert "First bad version: `one of 1.3, 1.4`" in text and "| `1.3` | skip |" in text
    assert f"--versions {listed} --good 1.2 --bad 1.5" in text


def test_bisect_versions_source_template_of_local_files(tmp_path, capsys):
    # --source names the tarballs by a template; the recipe's own source is git
    h = history(tmp_path)
    for version, commit in (("2.0", h.commits["docs2"]), ("2.1", h.commits["break"])):
        git("archive", "--format=tar.gz", f"--prefix=fixture-{version}/", "-o",
            str(tmp_path / f"fixture-{version}.tar.gz"), commit, cwd=h.repo)
    rc, doc = bisect(capsys, h.recipe, "--versions", "2.0,2.1", "--source",
                     str(tmp_path / "fixture-{version}.tar.gz"), "--run",
                     str(output_checker(tmp_path)))
    assert rc == 0 and doc["first_bad"] == "2.1" and doc["builds"] == 1


def test_version_template_from_the_recipes_url():
    class Src:
        def __init__(self, url):
            self.url = url

    class Recipe:
        name = "r"

        def __init__(self, url):
            self.source = Src(url)

    # PyPI's file URL is a hash path: the predictable source URL instead (docs.pypi.org/api)
    pypi = ("https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f"
            "6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz")
    assert version_template(Recipe(pypi), None) == (
        "https://files.pythonhosted.org/packages/source/l/llama_cpp_python/"
        "llama_cpp_python-{version}.tar.gz")
    assert version_template(Recipe("https://example.org/dl/proj-1.2.3.tar.xz"), None) == \
        "https://example.org/dl/proj-{version}.tar.xz"
