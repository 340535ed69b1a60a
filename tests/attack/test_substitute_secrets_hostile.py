"""Attack tests: what the substitute surfaces could leak or ship.  A store URL holding credentials
(user:password@, a ?token= or pre-signed query) is refused by the one parse (substitute/stores.py)
at `config set`, at every read of the config, and on the command line, in one line that never
repeats it; a credential in any text rocforge stores is blanked (credentials.py); and `publish` ships
exactly the files the build's manifest lists as installed, refusing (naming them) anything else
in the prefix and any link that leaves it."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from trust_helpers import one_error, rocforge, run

from rocforge_build.manifest_schema import MANIFEST

PASSWORD = "Hunter2-pw-9f3c"
# every kind of store URL, each carrying PASSWORD where a credential would ride, and where the
# hint sends the credentials instead
CREDENTIAL_URLS = [
    (f"https://alice:{PASSWORD}@store.example/builds", ".netrc"),
    (f"oci://alice:{PASSWORD}@ghcr.io/org/cache", "ROCFORGE_STORE_USERNAME"),
    (f"oci+http://alice:{PASSWORD}@127.0.0.1:5000/team/cache", "ROCFORGE_STORE_PASSWORD"),
    (f"s3://AKIAEXAMPLE:{PASSWORD}@bucket/prefix", "AWS_SECRET_ACCESS_KEY"),
    (f"file://alice:{PASSWORD}@localhost/srv/store", "file:///DIR"),
    (f"https://store.example/builds?token={PASSWORD}", ".netrc"),
    (f"s3://bucket/prefix?X-Amz-Signature={PASSWORD}", "AWS_SECRET_ACCESS_KEY"),
]


@pytest.fixture
def dirs(tmp_path, monkeypatch) -> Path:
    """This process's config, data and cache dirs under tmp_path (in-process runs)."""
    for name, sub in (("ROCFORGE_CONFIG_DIR", "config"), ("ROCFORGE_DATA_DIR", "data"),
                      ("ROCFORGE_CACHE_DIR", "cache")):
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("ROCFORGE_STORE_PASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _nowhere(top: Path, secret: str, *, but: tuple[Path, ...] = ()) -> None:
    """`secret` is in no file below `top` (links not followed), `but` those named."""
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            path = Path(dirpath, name)
            if path in but or path.is_symlink():
                continue
            assert secret.encode() not in path.read_bytes(), path


def _one_line(code, out: str, err: str, expected: int = 2) -> str:
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert code == expected and len(lines) == 1 and "Traceback" not in err, err
    assert PASSWORD not in out + err, out + err
    return lines[0]


# -- credentials never in a store URL --------------------------------------------------------------

@pytest.mark.parametrize(("url", "hint"), CREDENTIAL_URLS)
def test_config_set_refuses_a_store_url_with_credentials(dirs, capsys, url, hint):
    """`config set substitute.stores` took https://user:password@ and echoed it back; it is refused
    in one line naming the entry, never the URL, with where the credentials go, nothing written."""
    code, out, err = run(capsys, "config", "set", "substitute.stores", json.dumps([url]))
    line = _one_line(code, out, err)
    assert "substitute.stores [0]" in line and hint in err, err
    assert not (dirs / "config" / "config.toml").exists()
    _nowhere(dirs, PASSWORD)


@pytest.mark.parametrize(("url", "hint"), CREDENTIAL_URLS)
def test_the_command_line_refuses_a_store_url_with_credentials(dirs, capsys, url, hint):
    """publish --to and `store list URL` parse the URL with the same one rule, before anything
    is read or sent."""
    for argv in (("publish", str(dirs / "no-build"), "--to", url, "--unverified"), ("store", "list", url)):
        code, out, err = run(capsys, *argv)
        assert "credentials" in _one_line(code, out, err) or "?query" in err, err
        assert hint in err, err
    _nowhere(dirs, PASSWORD)


def test_a_hand_written_store_url_with_credentials_stops_build_pull_and_publish(dirs, capsys):
    """A config file edited by hand to hold https://alice:PASSWORD@... is refused at use: a build
    that would pull, a publish and `config list` each stop with one line; the password is in no
    output and no file under the data and cache dirs."""
    config = dirs / "config" / "config.toml"
    config.parent.mkdir()
    config.write_text(f'[substitute]\nstores = ["{CREDENTIAL_URLS[0][0]}"]\n')
    recipe = recipe_copy(dirs / "r", **{"file:///nonexistent/fixture.git": f"file://{dirs / 'nope'}"})
    for argv in (("build", str(recipe), "--backend", "cpu", "--substitute-only", "--prefix", str(dirs / "p")),
                 ("publish", str(dirs / "p"), "--to", f"file://{dirs / 'store'}", "--unverified"),
                 ("config", "list")):
        code, out, err = run(capsys, *argv)
        assert "substitute.stores [0] holds credentials" in _one_line(code, out, err), err
    assert not (dirs / "p").exists() and not (dirs / "store").exists()
    _nowhere(dirs, PASSWORD, but=(config,))


def test_config_never_prints_cache_remotes_password(dirs, capsys):
    """cache.remote keeps its password in the URL (ccache's redis:// has no other place for it),
    so it is not refused; every way config prints it goes through the one redaction (`get
    --json` printed it whole)."""
    url = f"redis://:{PASSWORD}@cache.lan:6379"
    assert run(capsys, "config", "set", "cache.remote", url)[0] == 0
    for argv in (("config", "get", "cache.remote"), ("config", "get", "cache.remote", "--json"),
                 ("config", "get", "cache", "--json"), ("config", "list"), ("config", "list", "--json")):
        code, out, err = run(capsys, *argv)
        assert code == 0 and "redis://cache.lan:6379" in out and PASSWORD not in out + err, argv


def test_a_result_row_never_stores_a_credential(dirs):
    """The results store's rows and runs go through the one redaction: a URL's password or an
    echoed Authorization header written into a row is blanked on disk."""
    from rocforge_build import paths
    from rocforge_build.measure.store import Store

    with Store() as db:
        run_id = db.start_run("verify", ["rocforge", "x", f"https://alice:{PASSWORD}@h/x"])
        db.add_row(run_id, "verify", {"prefix": "/p", "store": f"oci://alice:{PASSWORD}@h/r",
                                      "note": "Authorization: Basic YWxpY2U6SHVudGVyMi1wdy05ZjNj"})
    raw = sqlite3.connect(paths.results_db()).execute("SELECT data FROM rows").fetchone()[0]
    assert json.loads(raw)["store"] == "oci://h/r" and "YWxpY2U6" not in raw
    _nowhere(dirs, PASSWORD)


# -- publish ships what the manifest lists -----------------------------------------------------------

class Machine:
    """One machine's own config, cache and data dirs, rocforge run in a child process."""

    def __init__(self, root: Path):
        self.root = root
        self.env = {"ROCFORGE_CONFIG_DIR": str(root / "config"), "ROCFORGE_CACHE_DIR": str(root / "cache"),
                    "ROCFORGE_DATA_DIR": str(root / "data"), "HOME": str(root)}

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return rocforge(*args, env=self.env, timeout=60)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture recipe built (CPU) and a key generated on one machine: (machine, prefix, recipe)."""
    require("patchelf")  # publishing packs a bundle, whose RUNPATHs patchelf rewrites
    top = tmp_path_factory.mktemp("publisher")
    repo = git_repo(top / "repo")
    recipe = recipe_copy(top / "r", **{"file:///nonexistent/fixture.git": f"file://{repo}"})
    machine = Machine(top / "m")
    done = machine("build", str(recipe), "--backend", "cpu", "--no-substitutes", "--prefix", str(top / "pfx"))
    assert done.returncode == 0, done.stderr
    assert machine("key", "generate").returncode == 0
    return machine, top / "pfx", recipe


@pytest.fixture
def prefix(built, tmp_path) -> Path:
    """A copy of the built prefix for one test to add to."""
    copy = tmp_path / "pfx"
    shutil.copytree(built[1], copy, symlinks=True)
    return copy


def _publish(built, prefix: Path, store: Path) -> subprocess.CompletedProcess:
    return built[0]("publish", str(prefix), "--to", f"file://{store}", "--unverified")


def test_a_file_the_manifest_does_not_list_is_never_published(built, prefix, tmp_path):
    """A secrets/id_rsa left in the prefix went to the store; publish now refuses in one line
    naming it and how to remove it, and sends nothing."""
    (prefix / "secrets").mkdir()
    (prefix / "secrets" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY----- ssh-secret-bytes\n")
    res = _publish(built, prefix, tmp_path / "store")
    line = one_error(res, 2)
    assert "1 file(s) its manifest does not list" in line and "secrets/id_rsa" in line, line
    assert "move them out of the prefix" in res.stderr
    assert not (tmp_path / "store").exists()


def test_many_unlisted_files_are_named_first_few_with_a_count(built, prefix, tmp_path):
    for n in range(7):
        (prefix / f"note-{n}.txt").write_text("mine\n")
    line = one_error(_publish(built, prefix, tmp_path / "store"), 2)
    assert "7 file(s)" in line and "note-0.txt, note-1.txt, note-2.txt, note-3.txt, note-4.txt and 2 more" in line
    assert "note-5.txt" not in line and not (tmp_path / "store").exists()


def test_a_listed_link_that_leaves_the_prefix_is_refused(built, prefix, tmp_path):
    """lib/libgreet.so is listed as installed; made a link to a file outside, it would ship
    that file: refused, nothing sent."""
    outside = tmp_path / "outside-secret"
    outside.write_text("not the build's\n")
    (prefix / "lib" / "libgreet.so").unlink()
    (prefix / "lib" / "libgreet.so").symlink_to(outside)
    line = one_error(_publish(built, prefix, tmp_path / "store"), 2)
    assert "lib/libgreet.so is a link that leaves the prefix" in line, line
    assert not (tmp_path / "store").exists()


def _layer_names(store: Path) -> set[str]:
    """The prefix's own paths in the one published bundle layer (bundle.toml's `from = prefix`)."""
    import tomllib

    layers = [p for p in (store / "blobs" / "sha256").iterdir() if tarfile.is_tarfile(p)]
    assert len(layers) == 1
    with tarfile.open(layers[0]) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/bundle.toml"))
        doc = tomllib.loads(tf.extractfile(member).read().decode())
    return {f["path"] for f in doc["file"] if f.get("from", "prefix") == "prefix"}


def test_a_clean_build_publishes_exactly_its_listed_files_and_a_pulled_one_again(built, prefix, tmp_path):
    """What is published from the prefix is the manifest's list (and the manifest, the bundle's
    launcher); a machine that pulled it can publish its copy again, since the
    pulled manifest lists what the bundle put there."""
    import tomllib

    res = _publish(built, prefix, tmp_path / "store")
    assert res.returncode == 0, res.stderr
    listed = set(tomllib.loads((prefix / MANIFEST).read_text())["installed"]) - {".rocforge-scratch"}
    assert _layer_names(tmp_path / "store") == listed | {MANIFEST, "run"}  # bundle.toml lists all but itself
    second = Machine(tmp_path / "second")
    (tmp_path / "second" / "config").mkdir(parents=True)
    pub_line = (built[0].root / "config" / "keys" / "rocforge.pub").read_text().splitlines()[1]
    (tmp_path / "second" / "config" / "config.toml").write_text(
        f'[substitute]\nstores = ["file://{tmp_path / "store"}"]\ntrusted_keys = ["{pub_line}"]\n')
    pulled = second("build", str(built[2]), "--backend", "cpu", "--substitute-only",
                    "--prefix", str(tmp_path / "second" / "pfx"))
    assert pulled.returncode == 0 and "installed" in pulled.stderr, pulled.stderr
    assert second("key", "generate").returncode == 0
    again = second("publish", str(tmp_path / "second" / "pfx"), "--to", f"file://{tmp_path / 'store2'}",
                   "--unverified")
    assert again.returncode == 0, again.stderr


def test_the_configured_password_is_blanked_in_progress_lines_and_the_pulled_manifest(built, prefix, tmp_path):
    """Whatever echoes the configured password (here a store whose path happens to hold it) is
    blanked in a pull's progress lines, its notes and the manifest it writes: they go through the
    one redaction, not each its own."""
    store = tmp_path / PASSWORD / "store"
    store.parent.mkdir()
    assert _publish(built, prefix, store).returncode == 0
    second = Machine(tmp_path / "second")
    second.env["ROCFORGE_STORE_PASSWORD"] = PASSWORD
    (tmp_path / "second" / "config").mkdir(parents=True)
    pub_line = (built[0].root / "config" / "keys" / "rocforge.pub").read_text().splitlines()[1]
    (tmp_path / "second" / "config" / "config.toml").write_text(
        f'[substitute]\nstores = ["file://{store}"]\ntrusted_keys = ["{pub_line}"]\n')
    pulled = second("build", str(built[2]), "--backend", "cpu", "--substitute-only",
                    "--prefix", str(tmp_path / "second" / "pfx"))
    assert pulled.returncode == 0 and "substitute: file://" in pulled.stderr, pulled.stderr
    assert "[redacted]" in pulled.stderr and PASSWORD not in pulled.stdout + pulled.stderr
    manifest = (tmp_path / "second" / "pfx" / MANIFEST).read_text()
    assert "[redacted]" in manifest and PASSWORD not in manifest
    _nowhere(tmp_path / "second" / "data", PASSWORD)
