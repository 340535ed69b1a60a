"""Attack tests: what the substitute surfaces could leak or ship.  A store URL holding credentials
(user:password@, a ?token= or pre-signed query) is refused by the one parse (substitute/stores.py)
at `config set`, at every read of the config, and on the command line, in one line that never
repeats it; a credential in any text rocforge stores is blanked (credentials.py); and `publish` ships
exactly the files the build's manifest lists as installed, refusing (naming them) anything else
in the prefix and any link that leaves it."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from buildfixtures import recipe_copy
from trust_helpers import run

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
