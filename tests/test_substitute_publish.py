"""substitute/publish.py, before anything is measured, packed or sent: the key a build is
published under is the one its manifest recorded (its digest the sha256 of its canonical JSON,
recomputed here), a prefix ships only what its manifest lists (links that stay inside it; one that
leaves is refused), the tools packing needs are named at once, and a build with no evidence is
refused unless published marked unverified.  A whole publish and pull through the CLI is
tests/e2e/test_substitute_fixture.py's; hostile prefixes and secrets are
tests/attack/test_substitute_secrets_hostile.py's; the CPU reference a GPU build names is
tests/test_substitute_publish_reference.py's."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from rocforge_build.errors import ToolchainError, UsageError
from rocforge_build.substitute import publish, signing

FIELDS = {"recipe": "fixture", "recipe_sha256": "ab" * 32, "target": "", "backend": "cpu",
          "source": {"kind": "git", "commit": "c" * 40}}


def manifest(prefix: Path, *, key: dict | None = None, installed: list[str] | None = None) -> Path:
    """`prefix` as a CPU build's: a manifest that passes its schema, `installed` its file list."""
    prefix.mkdir(parents=True, exist_ok=True)
    doc = json.dumps(FIELDS, sort_keys=True, separators=(",", ":"))
    key = key if key is not None else {"document": doc,
                                       "digest": "sha256:" + hashlib.sha256(doc.encode()).hexdigest()}
    lines = ['stamp = "s1"', 'target = ""', 'backend = "cpu"', f"installed = {json.dumps(installed or [])}",
             "[recipe]", 'name = "fixture"']
    if key:
        lines += ["[substitute_key]", *(f"{k} = {json.dumps(v)}" for k, v in key.items())]
    (prefix / "rocforge-manifest.toml").write_text("\n".join(lines) + "\n")
    return prefix


def refusal(call, *args) -> str:
    with pytest.raises(UsageError) as exc:
        call(*args)
    return exc.value.message


def test_a_build_is_published_under_the_key_its_manifest_recorded(tmp_path):
    prefix = manifest(tmp_path / "p")
    _, key = publish.key_of_build(prefix)
    hexdigest = hashlib.sha256(json.dumps(FIELDS, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert key.digest == f"sha256:{hexdigest}" and key.fields == FIELDS
    assert key.tag == f"rocforge-{hexdigest}"  # an OCI tag: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}
    assert len(key.tag) <= 128


def test_a_prefix_without_a_whole_key_is_refused_in_one_line(tmp_path):
    assert refusal(publish.key_of_build, tmp_path / "none") == (
        f"{tmp_path / 'none'} is not a rocforge build (no readable rocforge-manifest.toml)")
    assert refusal(publish.key_of_build, manifest(tmp_path / "local", key={})).startswith(
        f"{tmp_path / 'local'} has no substitute key in its manifest")
    # the document edited by hand, the digest left: the key would name another build's bytes
    other = json.dumps({**FIELDS, "backend": "hip"}, sort_keys=True, separators=(",", ":"))
    edited = {"document": other, "digest": "sha256:" + hashlib.sha256(
        json.dumps(FIELDS, sort_keys=True, separators=(",", ":")).encode()).hexdigest()}
    assert refusal(publish.key_of_build, manifest(tmp_path / "edited", key=edited)) == (
        f"{tmp_path / 'edited'}/rocforge-manifest.toml: its substitute_key does not match its digest")


def test_a_prefix_ships_only_its_listed_files_and_links_that_stay_inside(tmp_path):
    prefix = tmp_path / "p"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "libx.so.1").write_text("")
    os.symlink("libx.so.1", prefix / "lib" / "libx.so")  # inside: fine
    listed = ["lib/libx.so.1", "lib/libx.so"]
    publish.check_contents(prefix, {"installed": listed})
    os.symlink("../../outside", prefix / "lib" / "escape")
    assert refusal(publish.check_contents, prefix, {"installed": [*listed, "lib/escape"]}).startswith(
        f"{prefix}/lib/escape is a link that leaves the prefix")
    os.unlink(prefix / "lib" / "escape")
    (prefix / "key\nfile").write_text("a secret")  # a name a terminal would break a line on
    assert refusal(publish.check_contents, prefix, {"installed": listed}) == (
        f"{prefix} holds 1 file(s) its manifest does not list as installed by rocforge: 'key\\nfile'; "
        "publish ships only what rocforge installed, and nothing was sent")
    assert "has no list of the files rocforge installed" in refusal(publish.check_contents, prefix, {})


def test_the_tools_packing_needs_are_named_before_anything_is_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither patchelf nor ldd
    with pytest.raises(ToolchainError) as exc:
        publish.require_tools()
    assert exc.value.message == ("publish needs patchelf (it rewrites the bundle's RUNPATHs to $ORIGIN), "
                                 "ldd (it lists the libraries the bundle must carry): not found on PATH")
    assert "apt-get install patchelf" in exc.value.hint


def test_a_build_without_evidence_is_refused_unless_marked_unverified_and_nothing_is_sent(tmp_path,
                                                                                        monkeypatch):
    for tool in ("patchelf", "ldd"):  # require_tools comes first: stand-ins, never run
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "bin" / tool).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / "bin" / tool).chmod(0o755)
    prefix = manifest(tmp_path / "p", installed=["bin/x"])
    (prefix / "bin").mkdir()
    (prefix / "bin" / "x").write_text("")
    key_file = tmp_path / "k" / "rocforge.key"
    key_file.parent.mkdir()
    signing.write_key_pair(key_file, tmp_path / "k" / "rocforge.pub", signing.generate())
    store = tmp_path / "store"
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with pytest.raises(UsageError) as exc:
        publish.publish(prefix, store.as_uri(), unverified=False, model=None, key_file=key_file,
                        root="/", timeout=5.0)
    assert exc.value.message == (f"{prefix} has no passing verify on record for this build and no "
                                 "model to measure its own figures with")
    assert "--unverified" in exc.value.hint
    assert not store.exists()


def test_the_signing_key_is_the_configured_one_or_rocforges_own(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(tmp_path / "config"))
    assert publish.signing_key_path("") == tmp_path / "config" / "keys" / "rocforge.key"
    assert publish.signing_key_path("~/team.key") == Path.home() / "team.key"
