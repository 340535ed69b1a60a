"""A build shared between two machines through a store, end to end with the real CLI: machine A
builds the fixture recipe from git, makes a key pair and publishes; machine B (its own config,
cache and data dirs) trusts A's key and gets the build from the store instead of compiling it —
checked, unpacked as its prefix, its programs running from there — and is refused it when the
key is not trusted or an advisory names it bad.  The store is an OCI image layout on disk, and a
real registry (Debian's docker-registry, distribution 2.8: no referrers API) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from registry_server import start_registry
from trust_helpers import machine, one_error, rocforge


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module", params=["file", "registry"])
def published(request, tmp_path_factory):
    """Machine A's build of the fixture recipe, published unverified to a store of each kind."""
    require("patchelf")  # publishing packs a bundle, whose RUNPATHs patchelf rewrites
    base = tmp_path_factory.mktemp("substitute")
    with contextlib.ExitStack() as stack:
        if request.param == "registry":
            require("docker-registry")
            store = stack.enter_context(start_registry(base / "registry")).store_url("team/builds")
        else:
            store = (base / "store").as_uri()
        yield _publish(base, store)


def _publish(base: Path, store: str) -> dict:
    repo = git_repo(base / "repo")
    recipe = recipe_copy(base / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    a = machine(base / "a")
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    build = ["build", str(recipe), "--target", "gfx1030", "--backend", "cpu", "--no-recheck"]
    prefix = Path(_ok(rocforge(*build, env=a)).stdout.strip().splitlines()[-1])
    refused = rocforge("publish", str(prefix), "--to", store, env=a)
    tag = _ok(rocforge("publish", str(prefix), "--to", store, "--unverified", env=a)).stdout.strip()
    return {"base": base, "recipe": recipe, "a": a, "public": public, "build": build,
            "prefix": prefix, "store": store, "refused": refused, "tag": tag}


def _machine_b(published, name: str, *, trusted: bool = True) -> dict:
    b = machine(published["base"] / name)
    _ok(rocforge("config", "set", "substitute.stores", json.dumps([published["store"]]), env=b))
    if trusted:
        _ok(rocforge("config", "set", "substitute.trusted_keys", json.dumps([published["public"]]), env=b))
    return b


def test_a_build_without_a_passing_verify_is_published_only_marked_unverified(published):
    line = one_error(published["refused"])
    assert "no passing verify on record" in line
    assert published["tag"].startswith("rocforge-")
    if not published["store"].startswith("file://"):
        return
    layout = Path(published["store"].removeprefix("file://"))
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    tags = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
    assert published["tag"] in tags


def test_a_second_machine_gets_the_build_from_the_store_and_compiles_nothing(published):
    b = _machine_b(published, "b")
    res = _ok(rocforge(*published["build"], "--substitute-only", env=b))
    prefix = Path(res.stdout.strip().splitlines()[-1])
    assert prefix != published["prefix"] and prefix.is_dir()
    manifest = (prefix / "rocforge-manifest.toml").read_text()
    import tomllib

    m = tomllib.loads(manifest)
    assert m["substituted"]["store"] == published["store"]
    assert m["substituted"]["key"] == "sha256:" + published["tag"].removeprefix("rocforge-")
    assert m["substituted"]["verified_here"] == "not verified here"
    assert m["prefix"] == str(prefix)
    # its program runs from its new place (RUNPATHs are $ORIGIN-relative in a bundle)
    out = subprocess.run([str(prefix / "bin" / "fixture-hello")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    # and nothing was compiled: no work dir holds a CMake build
    work = Path(b["ROCFORGE_CACHE_DIR"])
    assert not list(work.rglob("CMakeCache.txt"))
    # a second build is up to date: the manifest holds this machine's stamp
    again = _ok(rocforge(*published["build"], "--substitute-only", env=b))
    assert "is up to date" in again.stderr


def test_an_untrusted_key_is_refused_with_one_line_and_nothing_is_installed(published):
    b = _machine_b(published, "b-untrusted", trusted=False)
    res = rocforge(*published["build"], "--substitute-only", env=b)
    line = one_error(res, code=9)
    assert "--substitute-only" in line and "untrusted" in line
    assert not list(Path(b["ROCFORGE_DATA_DIR"]).rglob("rocforge-manifest.toml"))


def test_store_list_and_show_say_what_the_store_holds(published):
    b = _machine_b(published, "b-list")
    listed = json.loads(_ok(rocforge("store", "list", published["store"], "--json", env=b)).stdout)
    assert len(listed) == 1 and listed[0]["recipe"] == "fixture" and listed[0]["verified"] == "false"
    key = listed[0]["key"]
    shown = json.loads(_ok(rocforge("store", "show", published["store"], key[7:19], "--json", env=b)).stdout)
    assert shown["key"] == key and shown["key_fields"]["recipe"]["name"] == "fixture"
    assert [a["kind"] for a in shown["attestations"]] == ["unverified"]
    assert shown["attestations"][0]["host"]["kernel"] == os.uname().release


def test_an_advisory_stops_the_substitute_and_the_compile(published):
    advise = rocforge("store", "advise", published["store"], published["tag"], "--reason",
                      "wrong output past 5K tokens on this ROCm", env=published["a"])
    _ok(advise)
    b = _machine_b(published, "b-advised")
    res = rocforge(*published["build"], env=b)
    line = one_error(res, code=9)
    assert "known bad" in line and "wrong output past 5K tokens" in line
    assert not list(Path(b["ROCFORGE_DATA_DIR"]).rglob("rocforge-manifest.toml"))



def test_an_advisory_withdrawn_by_its_signer_lets_the_build_through_and_no_other_key_can(tmp_path):
    """A mistaken advisory would stop every pull and compile of the key for good: its signer takes
    it back with a signed withdrawal.  Another trusted key cannot: a withdrawal it signs (made
    through the library, as a hostile publisher would, since the CLI refuses it) changes nothing."""
    require("patchelf")
    pub = _publish(tmp_path, (tmp_path / "store").as_uri())
    _ok(rocforge("store", "advise", pub["store"], pub["tag"], "--reason", "bad on ROCm 7.13", env=pub["a"]))
    c = machine(tmp_path / "c")
    c_public = _ok(rocforge("key", "generate", env=c)).stdout.strip()
    b = _machine_b(pub, "b")
    _ok(rocforge("config", "set", "substitute.trusted_keys", json.dumps([pub["public"], c_public]), env=b))
    shown = json.loads(_ok(rocforge("store", "show", pub["store"], pub["tag"], "--json", env=b)).stdout)
    [advisory] = shown["advisories"]
    assert advisory["withdrawn"] is None and advisory["reason"] == "bad on ROCm 7.13"

    by_c = rocforge("store", "advise", pub["store"], pub["tag"], "--withdraw", advisory["digest"][7:19],
                    "--reason", "not c's to take back", env=c)
    assert "only that key can withdraw it" in one_error(by_c, code=2)
    from rocforge_build.substitute import artifact, catalog, oci, signing
    from rocforge_build.substitute.stores import open_store

    with open_store(pub["store"]) as store:  # c's withdrawal made by hand: the reader ignores it
        man = catalog.resolve(store, pub["tag"])
        c_pair = signing.read_secret_key(next(Path(c["ROCFORGE_CONFIG_DIR"]).rglob("*.key")))
        artifact.attach(store, man, oci.WITHDRAWAL_TYPE,
                        {"key": man.config.digest, "withdraws": advisory["digest"], "reason": "x"}, c_pair)
    assert "known bad" in one_error(rocforge(*pub["build"], "--substitute-only", env=b), code=9)

    _ok(rocforge("store", "advise", pub["store"], pub["tag"], "--withdraw", advisory["digest"].upper(),
                 "--reason", "the ROCm 7.13 report was another build", env=pub["a"]))
    with open_store(pub["store"]) as store:  # c's later withdrawal does not replace a's reason either
        artifact.attach(store, man, oci.WITHDRAWAL_TYPE,
                        {"key": man.config.digest, "withdraws": advisory["digest"], "reason": "forged"}, c_pair)
    shown = json.loads(_ok(rocforge("store", "show", pub["store"], pub["tag"], "--json", env=b)).stdout)
    assert shown["advisories"][0]["withdrawn"]["reason"] == "the ROCm 7.13 report was another build"
    text = _ok(rocforge("store", "show", pub["store"], pub["tag"], env=b)).stdout
    assert "withdrawn advisory" in text and "ADVISORY" not in text
    res = _ok(rocforge(*pub["build"], "--substitute-only", env=b))
    assert (Path(res.stdout.strip().splitlines()[-1]) / "rocforge-manifest.toml").is_file()

def test_substitute_only_without_a_store_compiles_nothing(published):
    b = machine(published["base"] / "b-no-store")
    res = rocforge(*published["build"], "--substitute-only", env=b)
    line = one_error(res, code=9)
    assert "substitute.stores is empty" in line
    assert not list(Path(b["ROCFORGE_CACHE_DIR"]).rglob("CMakeCache.txt"))
