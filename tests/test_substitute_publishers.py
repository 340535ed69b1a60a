"""Many publishers of one build key in one store (substitute/publishers.py), through the real CLI:
each signing key keeps its own signed index of what it published for a key, so a second
publisher of the same build hides nothing of the first's; a build pulled from a store can be
published again under another key and pulled from there; and two publishers racing on an OCI
image layout on disk, a real registry (Debian's docker-registry) and S3 (moto's server) both
stay reachable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from registry_server import clear_store_environment, start_registry
from test_substitute_layout_store import s3_endpoint  # noqa: F401 - moto's server on 127.0.0.1, a fixture
from trust_helpers import REPO, machine, rocforge

from rocforge_build.substitute import artifact, publishers, signing
from rocforge_build.substitute.stores import open_store


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Machine a's build of the fixture recipe, and two publishers' keys (a's and b's)."""
    require("patchelf")  # publishing packs a bundle, whose RUNPATHs patchelf rewrites
    base = tmp_path_factory.mktemp("publishers")
    repo = git_repo(base / "repo")
    recipe = recipe_copy(base / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    a, b = machine(base / "a"), machine(base / "b")
    keys = {}
    for name, env in (("a", a), ("b", b)):
        public = _ok(rocforge("key", "generate", env=env)).stdout.strip()
        keys[name] = (public, Path(env["ROCFORGE_CONFIG_DIR"]) / "keys" / "rocforge.key")
    build = ["build", str(recipe), "--target", "gfx1030", "--backend", "cpu", "--no-recheck"]
    prefix = Path(_ok(rocforge(*build, env=a)).stdout.strip().splitlines()[-1])
    return {"base": base, "a": a, "b": b, "keys": keys, "build": build, "prefix": prefix}


def _consumer(base: Path, store: str, *publics: str) -> dict:
    """A machine whose configuration lists `store` and trusts `publics` (written as `rocforge
    config set` writes it, without two more processes)."""
    env = machine(base)
    (base / "config").mkdir(parents=True)
    (base / "config" / "config.toml").write_text(
        f"[substitute]\nstores = {json.dumps([store])}\ntrusted_keys = {json.dumps(list(publics))}\n")
    return env


def _pulled(res: subprocess.CompletedProcess) -> dict:
    import tomllib

    prefix = Path(_ok(res).stdout.strip().splitlines()[-1])
    return tomllib.loads((prefix / "rocforge-manifest.toml").read_text())["substituted"]


def test_a_pulled_build_published_again_under_another_key_is_pulled_by_who_trusts_only_that_key(built, tmp_path):
    """a publishes; b pulls it and publishes what it pulled under its own key; a machine trusting
    only b pulls b's artifact (it once failed every pull: "missing: bundle.toml"), and a machine
    trusting only a still pulls a's: b's publish moved nothing of a's."""
    store = (tmp_path / "store").as_uri()
    (pa, ka), (pb, kb) = built["keys"]["a"], built["keys"]["b"]
    _ok(rocforge("publish", str(built["prefix"]), "--to", store, "--unverified", "--key", str(ka), env=built["a"]))
    b = _consumer(tmp_path / "b", store, pa)
    b_prefix = Path(_ok(rocforge(*built["build"], "--substitute-only", env=b)).stdout.strip().splitlines()[-1])
    again = json.loads(_ok(rocforge("publish", str(b_prefix), "--to", store, "--unverified", "--key", str(kb),
                                    "--json", env=b)).stdout)
    assert again["index_tag"].endswith("-" + signing.PublicKey.parse(pb).key_id)

    only_b = _pulled(rocforge(*built["build"], "--substitute-only", env=_consumer(tmp_path / "c", store, pb)))
    assert only_b["signed_by"] == signing.PublicKey.parse(pb).key_id and only_b["manifest"] == again["manifest"]
    only_a = _pulled(rocforge(*built["build"], "--substitute-only", env=_consumer(tmp_path / "d", store, pa)))
    assert only_a["signed_by"] == signing.PublicKey.parse(pa).key_id

    # store list, as one trusting only b: b's build signed, a's index named and ignored in one row
    listed = json.loads(_ok(rocforge("store", "list", store, "--json", env=_consumer(tmp_path / "e", store, pb))).stdout)
    signed = [row for row in listed if row["signed_by"] == signing.PublicKey.parse(pb).key_id]
    ignored = [row for row in listed if row["signed_by"].startswith("ignored: ")]
    assert [row["manifest"] for row in signed] == [again["manifest"]]
    assert len(ignored) == 1 and "not trusted" in ignored[0]["signed_by"]
    # store show, as one trusting only b, shows b's build, not the one the single tag names
    shown = json.loads(_ok(rocforge("store", "show", store, again["key"], "--json",
                                    env=_consumer(tmp_path / "f", store, pb))).stdout)
    assert shown["manifest"] == again["manifest"] and shown["signed_by"] == signing.PublicKey.parse(pb).key_id


RACE = ("import subprocess, sys\n"
        "procs = [subprocess.Popen([sys.executable, '-m', 'rocforge_build', 'publish', sys.argv[1], '--to', sys.argv[2],\n"
        "                           '--unverified', '--json', '--key', key], stdout=subprocess.PIPE,\n"
        "                          stderr=subprocess.PIPE, text=True) for key in sys.argv[3:]]\n"
        "outs = [p.communicate(timeout=120) for p in procs]\n"
        "for p, (out, err) in zip(procs, outs):\n"
        "    print(p.returncode, out.replace(chr(10), ' '), err.replace(chr(10), ' '))\n")


@pytest.mark.parametrize("kind", ["file", "registry", "s3"])
def test_two_publishers_of_one_key_at_once_both_stay_reachable(built, tmp_path, kind, request, monkeypatch):
    """Two machines publish the same build, each under its own key, at the same moment: each
    one's signed index lists its artifact, and a consumer trusting either key gets that key's."""
    clear_store_environment(monkeypatch)
    if kind == "registry":
        require("docker-registry")
        registry = start_registry(tmp_path / "registry")
        url = registry.__enter__().store_url("team/race")
        request.addfinalizer(lambda: registry.__exit__(None, None, None))
    elif kind == "s3":
        request.getfixturevalue("s3_endpoint")
        url = "s3://builds/race"
    else:
        url = (tmp_path / "store").as_uri()
    (pa, ka), (pb, kb) = built["keys"]["a"], built["keys"]["b"]
    env = {**built["a"], "PYTHONPATH": str(REPO)}
    import os

    res = subprocess.run([sys.executable, "-c", RACE, str(built["prefix"]), url, str(ka), str(kb)],
                         capture_output=True, text=True, timeout=240, env={**os.environ, **env})
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and [line.split()[0] for line in lines] == ["0", "0"], res.stdout + res.stderr
    published = [json.loads(line.split(" ", 1)[1].rsplit("}", 1)[0] + "}") for line in lines]
    key = published[0]["key"]
    with open_store(url) as store:
        for public, out in zip((pa, pb), published, strict=True):
            pk = signing.PublicKey.parse(public)
            entries = publishers.read_index(store, key, pk)
            assert [e.digest for e in entries] == [out["manifest"]]
            found = {m.digest: m for m in publishers.candidates(store, key, [pk], [])}
            assert artifact.signed_by(store, found[out["manifest"]], [pk]) == pk.key_id
        assert store.manifest(publishers.legacy_tag(key)).digest in {p["manifest"] for p in published}
