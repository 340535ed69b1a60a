"""A pull through the real CLI when the publisher's key has changed: a first machine builds the
fixture recipe and publishes it signed; a second machine, which trusts that key, reads the key
revocations of every configured store before it trusts the signature (here the revocation lies in
another store than the build), and refuses in one line that names the revocation; a key outside
its window is refused the same way; a retired key's earlier build is still pulled; a store that
does not answer costs a line and is not pulled from."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from trust_helpers import one_error, rocforge

from rocforge_build.trusted_entry import format_time


def _machine(root: Path) -> dict:
    (root / "config").mkdir(parents=True, exist_ok=True)
    return {"ROCFORGE_CONFIG_DIR": str(root / "config"), "ROCFORGE_CACHE_DIR": str(root / "cache"),
            "ROCFORGE_DATA_DIR": str(root / "data"), "HOME": str(root)}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(the store URL, the recipe, the publisher's env, its public key line)."""
    require("patchelf")
    top = tmp_path_factory.mktemp("revoked")
    repo = git_repo(top / "repo")
    recipe = recipe_copy(top / "r", **{"file:///nonexistent/fixture.git": f"file://{repo}"})
    a = _machine(top / "a")
    built = rocforge("build", str(recipe), "--backend", "cpu", "--no-substitutes", "--prefix",
                     str(top / "a" / "pfx"), env=a, timeout=120)
    assert built.returncode == 0, built.stderr
    generated = rocforge("key", "generate", env=a)
    assert generated.returncode == 0, generated.stderr
    url = f"file://{top / 'store'}"
    done = rocforge("publish", str(top / "a" / "pfx"), "--to", url, "--unverified", env=a, timeout=120)
    assert done.returncode == 0, done.stderr
    return url, recipe, a, generated.stdout.split()[0]


def _pull(tmp_path: Path, recipe, stores: list[str], trusted: list[str]):
    b = _machine(tmp_path / "b")
    (tmp_path / "b" / "config" / "config.toml").write_text(
        f"[substitute]\nstores = {json.dumps(stores)}\ntrusted_keys = {json.dumps(trusted)}\ntimeout = 3\n")
    return rocforge("build", str(recipe), "--backend", "cpu", "--substitute-only", "--force", "--prefix",
                    str(tmp_path / "b" / "pfx"), env=b, timeout=120)


def test_a_revocation_in_any_configured_store_refuses_the_pull(published, tmp_path):
    url, recipe, a, public = published
    elsewhere = f"file://{tmp_path / 'elsewhere'}"
    time.sleep(1.01 - time.time() % 1)  # times are whole seconds: the retirement comes after the build
    retired = rocforge("key", "revoke", "--reason", "retired", "--to", elsewhere, "--json", env=a)
    assert retired.returncode == 0, retired.stderr
    pulled = _pull(tmp_path, recipe, [url, elsewhere], [public])  # published before it retired
    assert pulled.returncode == 0, pulled.stderr
    revoked = rocforge("key", "revoke", "--reason", "compromised", "--to", elsewhere, "--json", env=a)
    assert revoked.returncode == 0, revoked.stderr
    line = one_error(_pull(tmp_path / "again", recipe, [url, elsewhere], [public]), 9)
    assert "revoked as compromised by its revocation sha256:" in line and elsewhere in line, line


def test_a_key_past_its_window_is_refused_in_one_line(published, tmp_path):
    url, recipe, _, public = published
    line = one_error(_pull(tmp_path, recipe, [url], [f"{public} not-after={format_time(int(time.time()) - 60)}"]), 9)
    assert "now is outside" in line and "until" in line, line


def test_a_store_whose_revocations_cannot_be_read_is_skipped_with_a_line(published, tmp_path):
    url, recipe, _, public = published
    dead = "oci+http://127.0.0.1:9/team/rocforge"
    pulled = _pull(tmp_path, recipe, [dead, url], [public])
    assert pulled.returncode == 0, pulled.stderr
    assert "its key revocations could not be read" in pulled.stderr and "Traceback" not in pulled.stderr
