"""A substitute is decided before any download: the key comes from what is known without the
source (the recipe's pinned sha256, the recipe, patches, target, backend, toolchain), so a machine
with no route to the source's server and an empty cache installs the build from a store with
`--substitute-only` and leaves no source behind; a miss under `--substitute-only` still downloads
nothing.  Machine A publishes the fixture recipe built from a tarball pinned by its sha256 on a
real HTTP server on 127.0.0.1; machine B asks with that server stopped, and, where this kernel
lets an unprivileged user make one, inside a network namespace that has no network at all."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tomllib
from pathlib import Path

import pytest
from buildfixtures import recipe_copy, tarball
from needs import require
from trust_helpers import machine, one_error, rocforge

GIT_SOURCE = 'git = "file:///nonexistent/fixture.git"\nref = "v1.2.0"\n'


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _no_network() -> tuple[str, ...]:
    """`unshare -rn`: a new user and network namespace (no interface up, no route anywhere), or
    () where this kernel refuses unprivileged namespaces (the stopped server still shows it)."""
    try:
        ok = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ("unshare", "-rn") if ok else ()


@pytest.fixture
def published(tmp_path, http_server):
    require("patchelf")  # publishing packs a bundle, whose RUNPATHs patchelf rewrites
    data = tarball(tmp_path / "fixture-1.2.0.tar.gz").read_bytes()
    url = http_server.add("/src/fixture-1.2.0.tar.gz", data)
    sha = hashlib.sha256(data).hexdigest()
    recipe = recipe_copy(tmp_path / "r", **{GIT_SOURCE: f'url = "{url}"\nsha256 = "{sha}"\n'})
    a = machine(tmp_path / "a")
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    build = ["build", str(recipe), "--target", "gfx1030", "--backend", "cpu", "--no-recheck"]
    prefix = Path(_ok(rocforge(*build, env=a)).stdout.strip().splitlines()[-1])
    store = (tmp_path / "store").as_uri()
    _ok(rocforge("publish", str(prefix), "--to", store, "--unverified", env=a))
    fetches = [r for r in http_server.requests if r[1].endswith(".tar.gz")]
    assert fetches, "machine A downloaded its source from the server"
    http_server.close()  # from here on, a download of the source is refused
    b = machine(tmp_path / "b")
    _ok(rocforge("config", "set", "substitute.stores", json.dumps([store]), env=b))
    _ok(rocforge("config", "set", "substitute.trusted_keys", json.dumps([public]), env=b))
    return {"build": build, "b": b, "recipe": recipe, "url": url, "tmp": tmp_path}


def test_substitute_only_installs_with_no_route_to_the_source_and_leaves_no_source(published):
    b = published["b"]
    res = _ok(rocforge(*published["build"], "--substitute-only", env=b, wrap=_no_network()))
    prefix = Path(res.stdout.strip().splitlines()[-1])
    manifest = tomllib.loads((prefix / "rocforge-manifest.toml").read_text())
    assert manifest["substituted"]["key"] == manifest["substitute_key"]["digest"]
    assert subprocess.run([str(prefix / "bin" / "fixture-hello")], capture_output=True, timeout=30).returncode == 0
    cache = Path(b["ROCFORGE_CACHE_DIR"])
    # no tarball downloaded, no tree unpacked, nothing compiled
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tar.gz")], sorted(cache.rglob("*"))
    assert not (cache / "sources" / "trees").exists() or not any((cache / "sources" / "trees").iterdir())
    assert not list(cache.rglob("CMakeCache.txt"))
    # the same build again is up to date, still without the source
    again = _ok(rocforge(*published["build"], "--substitute-only", env=b, wrap=_no_network()))
    assert "is up to date" in again.stderr


def test_a_miss_under_substitute_only_downloads_nothing_and_says_so_in_one_line(published):
    b = published["b"]
    other = [*published["build"][:2], "--target", "gfx1100", *published["build"][4:]]  # another key
    res = rocforge(*other, "--substitute-only", env=b, wrap=_no_network())
    line = one_error(res, code=9)
    assert "--substitute-only: no usable substitute for fixture" in line and "not in this store" in line
    cache = Path(b["ROCFORGE_CACHE_DIR"])
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tar.gz")]


def test_without_substitute_only_a_miss_compiles_and_only_then_asks_for_the_source(published):
    """The download is the compile's step: with the server gone, a miss fails at the fetch (exit
    6, a network error), after the store was asked, and never before."""
    b = published["b"]
    other = [*published["build"][:2], "--target", "gfx1100", *published["build"][4:]]
    res = rocforge(*other, env=b)
    assert res.returncode == 6, res.stderr
    assert "substitute: none used (" in res.stderr
    assert res.stderr.index("substitute: none used") < res.stderr.index(published["url"].split("/src/")[0])
    # the hint names what a build has, never a listing's --index
    assert "--source PATH" in res.stderr and "--index" not in res.stderr
