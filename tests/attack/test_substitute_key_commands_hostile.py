"""Attack tests: what a careless or hostile hand gives `rocforge key rotate|revoke|trust-rotation`
and `substitute.trusted_keys` (commands/key.py, trusted_entry.py): each is one `rocforge: error:`
line, never a traceback, nothing is written or trusted by it, and no key is ever overwritten."""

from __future__ import annotations

import json
import os

import pytest
from trust_helpers import one_error, rocforge, run

from rocforge_build import config
from rocforge_build.substitute import signing


@pytest.fixture
def key(tmp_path, capsys):
    code, out, err = run(capsys, "key", "generate")
    assert code == 0, err
    return out.split()[0]


def refused(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv, why", [
    (["key", "revoke", "--reason", "compromised"], "--to"),
    (["key", "revoke", "--to", "file:///tmp/x", "--reason", "lost"], "invalid choice"),
    (["key", "revoke", "--to", "file:///tmp/x", "--reason", "retired", "--note", "a\nrocforge: ok"], "one printable line"),
    (["key", "revoke", "--to", "file:///tmp/x", "--reason", "retired", "--note", "\x1b[2J"], "one printable line"),
    (["key", "revoke", "--to", "file:///tmp/x", "--reason", "retired", "--note", "n" * 301], "one printable line"),
    (["key", "revoke", "--to", "oci://team:hunter2@registry.example/x", "--reason", "retired"], "credentials"),
    (["key", "revoke", "--to", "ftp://host/x", "--reason", "retired"], "must be a URL"),
    (["key", "rotate"], "--to"),
    (["key", "rotate", "--to", "s3://b/p?X-Amz-Signature=abc"], "--to"),
    (["key", "trust-rotation", "file:///tmp/x", "--from", "nothex"], "not a key id"),
    (["key", "trust-rotation", "file:///tmp/x", "--from", "../../etc/passwd"], "not a key id"),
    (["key", "trust-rotation", "file:///tmp/x\n"], "without spaces"),
])
def test_bad_arguments_are_one_line(key, capsys, tmp_path, argv, why):
    line = refused(capsys, *argv)
    assert why in line, line
    assert "hunter2" not in line and "abc" not in line.split("?")[-1]
    assert not (tmp_path / "x").exists()


def test_a_key_file_that_is_not_the_users_own_is_refused(key, capsys, tmp_path):
    secret = tmp_path / "open.key"
    secret.write_text(signing.generate().secret_text())
    secret.chmod(0o644)
    assert "open to others" in refused(capsys, "key", "revoke", "--to", f"file://{tmp_path / 's'}",
                                       "--reason", "retired", "--key", str(secret))
    link = tmp_path / "link.key"
    link.symlink_to(config.config_file().parent / "keys/rocforge.key")
    assert "symbolic link" in refused(capsys, "key", "rotate", "--to", f"file://{tmp_path / 's'}",
                                      "--key", str(link))
    assert "no secret key" in refused(capsys, "key", "revoke", "--to", f"file://{tmp_path / 's'}",
                                      "--reason", "retired", "--key", str(tmp_path / "none"))
    assert not (tmp_path / "s").exists()


def test_rotate_never_overwrites_a_key(key, capsys, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "rocforge.key").write_text("mine")
    assert "never overwrites a key" in refused(capsys, "key", "rotate", "--to", f"file://{tmp_path / 's'}",
                                               "--out", str(out))
    assert (out / "rocforge.key").read_text() == "mine" and not (tmp_path / "s").exists()
    assert "not both" in refused(capsys, "key", "rotate", "--to", f"file://{tmp_path / 's'}", "--out", str(out),
                                 "--new-key", str(out / "rocforge.key"))


def test_trust_rotation_trusts_nothing_without_a_trusted_key_or_with_a_silent_store(key, capsys, tmp_path):
    store = f"file://{tmp_path / 'store'}"
    assert "substitute.trusted_keys is empty" in refused(capsys, "key", "trust-rotation", store)
    config.set_value("substitute.trusted_keys", [key])
    config.set_value("substitute.stores", ["oci+http://127.0.0.1:9/team/keys"])
    line = refused(capsys, "key", "trust-rotation", store)
    assert "could not be read, so no rotation is trusted" in line
    assert config.get("substitute.trusted_keys") == [key]


@pytest.mark.parametrize("entry, why", [
    ("{key} not-after=2027-13-01", "not-after='2027-13-01' is not a date"),
    ("{key} not-before=2027-01-01T00:00:00+02:00", "is not a UTC time"),
    ("{key} via=0000000000000000", "which is no entry of the list"),
    ("{key} valid-until=2027-01-01", "after the key come only"),
    (7, "must be a list of strings"),
])
def test_a_bad_entry_in_the_file_is_one_line_for_every_command(key, tmp_path, entry, why):
    """A config file edited by hand: each command that reads it stops with one line, a child
    process as a user runs it."""
    value = entry.format(key=key) if isinstance(entry, str) else entry
    path = config.config_file()
    path.write_text("[substitute]\ntrusted_keys = " + json.dumps([value]) + "\n")
    env = {k: os.environ[k] for k in ("ROCFORGE_CONFIG_DIR", "ROCFORGE_CACHE_DIR", "ROCFORGE_DATA_DIR")}
    for argv in (("key", "trust-rotation", f"file://{tmp_path / 'store'}"), ("store", "list", f"file://{tmp_path}")):
        line = one_error(rocforge(*argv, env=env, timeout=60), code=2)
        assert why in line, line
