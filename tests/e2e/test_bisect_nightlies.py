"""`rocforge bisect --nightlies` and `nightly install --gate` against a real HTTP server on
127.0.0.1 serving a TheRock listing and tarballs whose compiler really compiles
(tests/nightly_toolchains.py): two nightlies compile the fixture project right, two drop its
loud-greeting define; the first of those is the toolchain regression to find, and a build
upgraded onto one must be refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from buildfixtures import git_repo
from needs import needs
from nightly_toolchains import compiling_tarball, rocm_recipe
from therock_tarballs import Mirror
from upgrade_history import output_checker, tree_hashes

from rocforge_build import cli, config, download_policy, paths
from rocforge_build.discover.builds import read_manifest

# oldest first; the two later ones miscompile (their clang drops -DFIXTURE_LOUD)
GOOD1, GOOD2, WRONG1, WRONG2 = NIGHTLIES = ("7.10.0a20251021", "7.10.0a20251101",
                                            "7.10.0a20251108", "7.10.0a20251115")
MTIME = dict(zip(NIGHTLIES, (1761030000.0, 1761980000.0, 1762590000.0, 1763190000.0),
                 strict=True))


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(download_policy, "_sleep", lambda s: None)


@pytest.fixture(scope="module")
def tarballs(tmp_path_factory):
    work = tmp_path_factory.mktemp("compiling-nightlies")
    return {v: compiling_tarball(work, v, wrong=v in (WRONG1, WRONG2)) for v in NIGHTLIES}


@pytest.fixture
def site(http_server, tarballs, tmp_path, capsys):
    """The CDN folder serving the four nightlies; config's nightly source points at it; the
    fixture recipe (hip backend compiled by the ROCm's clang) on a local git repository."""
    mirror = Mirror(http_server, "/tarball/")
    for v, arch in tarballs.items():
        mirror.add_file(arch, MTIME[v])
    assert cli.main(["config", "set", "nightly.sources.cdn.url", mirror.url]) == 0
    assert cli.main(["config", "set", "nightly.use", '["cdn"]']) == 0
    repo = git_repo(tmp_path / "repo")
    recipe = rocm_recipe(tmp_path / "r", repo.as_uri())
    capsys.readouterr()
    return http_server, recipe


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def hello(prefix) -> list[str]:
    return subprocess.run([f"{prefix}/bin/fixture-hello"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def fetched(server, version, since: int = 0) -> bool:
    return any(p.endswith(f"-{version}.tar.gz") for m, p, _h in server.requests[since:]
               if m == "GET")


@needs("clang-15")  # the nightlies' clang is a script that runs Debian's (tests/nightly_toolchains.py)
def test_bisect_nightlies_finds_the_first_miscompiling_nightly(site, tmp_path, capsys):
    server, recipe = site
    prefix = config.nightly_prefix()
    rc, _out, err = run(capsys, "nightly", "install", "--target", "gfx1151", "--version", GOOD1,
                        "--no-progress")
    assert rc == 0, err
    n = len(server.requests)
    report = tmp_path / "issue.md"
    rc, out, err = run(capsys, "bisect", str(recipe), "--target", "gfx1151", "--backend", "hip",
                       "--nightlies", ",".join(NIGHTLIES), "--run", str(output_checker(tmp_path)),
                       "--json", "--report", str(report))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["axis"] == "nightlies" and doc["first_bad"] == WRONG1 and doc["candidates"] == 3
    assert [(s["ref"], s["verdict"]) for s in doc["steps"]] == [
        (WRONG2, "bad"), (GOOD2, "good"), (WRONG1, "bad")]
    assert doc["builds"] == 3  # ceil(log2 3) + 1
    # each step was built by its own nightly's compiler, and the bad ones really are wrong
    for s in doc["steps"]:
        m = read_manifest(Path(s["prefix"]))
        assert os.path.realpath(m["toolchain"]["rocm_path"]) == str(
            (prefix / f"therock-{s['ref']}-gfx1151").resolve())
        assert ("HELLO" in hello(s["prefix"])) == (s["verdict"] == "good")
    # the good nightly was installed already: used, not fetched; `current` never moved
    assert not fetched(server, GOOD1, n)
    assert all(fetched(server, v, n) for v in (GOOD2, WRONG1, WRONG2))
    assert os.readlink(prefix / "current") == f"therock-{GOOD1}-gfx1151"
    text = report.read_text()
    assert f"First bad nightly: `{WRONG1}`" in text and "rocm_version: 7.10.0a" in text
    # a rerun builds nothing and downloads nothing
    n = len(server.requests)
    rc, out, err = run(capsys, "bisect", str(recipe), "--target", "gfx1151", "--backend", "hip",
                       "--nightlies", ",".join(NIGHTLIES), "--good", GOOD2, "--run",
                       str(output_checker(tmp_path)), "--json")
    again = json.loads(out)
    assert rc == 0 and again["first_bad"] == WRONG1 and again["builds"] == 0
    assert [r for r in server.requests[n:] if r[0] == "GET" and r[1].endswith(".tar.gz")] == []


def test_bisect_nightlies_refuses_a_version_no_source_serves(site, tmp_path, capsys):
    server, recipe = site
    rc, _out, err = run(capsys, "bisect", str(recipe), "--target", "gfx1151", "--backend", "hip",
                        "--nightlies", f"{GOOD1},7.10.0a20991231", "--run", "true")
    assert rc == 2 and err.count("rocforge: error:") == 1 and "7.10.0a20991231" in err
    assert not fetched(server, GOOD1) and not config.nightly_prefix().exists()
    assert not (paths.cache_dir() / "bisect").exists()


@needs("clang-15")
def test_gate_regates_builds_refuses_a_miscompiling_nightly_and_switches_on_a_good_one(
        site, tmp_path, capsys):
    # a build in the builds directory made against `current` (GOOD1); `nightly install --gate`
    # upgrades it onto the new nightly and runs the output checker on the candidate
    _server, recipe = site
    prefix = config.nightly_prefix()
    install = ("nightly", "install", "--target", "gfx1151", "--no-progress")
    rc, _out, err = run(capsys, *install, "--version", GOOD1)
    assert rc == 0, err
    assert cli.main(["build", str(recipe), "--target", "gfx1151", "--backend", "hip", "--rocm",
                     str(prefix / "current"), "--no-recheck"]) == 0
    capsys.readouterr()
    build = next(p for p in paths.builds_prefix().iterdir())
    assert "HELLO" in hello(build)
    before = tree_hashes(build)
    check = str(output_checker(tmp_path))
    # the miscompiling nightly: the run gate fails, the build and `current` stay as they were
    rc, out, err = run(capsys, *install, "--version", WRONG1, "--gate", "--run", check, "--json")
    doc = json.loads(out)
    assert rc == 1 and not doc["switched"] and doc["previous"] == f"therock-{GOOD1}-gfx1151"
    assert doc["failed_build"] == str(build) and doc["failed_gate"] == "run"
    assert [(g["gate"], g["verdict"]) for g in doc["builds"][0]["gates"]] == [
        ("build", "pass"), ("smoke", "pass"), ("run", "fail")]
    assert os.readlink(prefix / "current") == f"therock-{GOOD1}-gfx1151"
    assert (prefix / f"therock-{WRONG1}-gfx1151").is_dir()  # installed beside, not current
    assert tree_hashes(build) == before
    # the same refusal in words: the build and the gate are named, and how to switch anyway
    rc, out, _err = run(capsys, *install, "--version", WRONG1, "--gate", "--run", check)
    assert rc == 1 and f"{build}: refused (gate run: fail" in out
    assert f"current stays therock-{GOOD1}-gfx1151" in out and tree_hashes(build) == before
    # a nightly that compiles right passes every gate: the build is upgraded onto it (built by
    # its compiler), the old build kept for rollback, and `current` switches
    rc, out, err = run(capsys, *install, "--version", GOOD2, "--gate", "--run", check, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["switched"] and doc["failed_build"] is None, err
    assert [o["status"] for o in doc["builds"]] == ["upgraded"]
    assert os.readlink(prefix / "current") == f"therock-{GOOD2}-gfx1151"
    m = read_manifest(build)
    assert os.path.realpath(m["toolchain"]["rocm_path"]) == str(
        (prefix / f"therock-{GOOD2}-gfx1151").resolve())
    assert "HELLO" in hello(build) and tree_hashes(build) != before
    assert tree_hashes(build.with_name(build.name + ".rocforge-previous")) == before
