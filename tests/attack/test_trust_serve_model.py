"""Hostile tests of serve's model lookup (commands/serve.py, measure/serve.model_file): a model
named by its preset (a name or sha256) is served only from the file the preset was tuned for; the
stored path replaced by another model, or by a link to one, is refused in one line; what is not a
regular file is never opened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_measure_proof import as_build, preset
from tiny_gguf import write as write_gguf
from trust_helpers import run

from rocforge_build.measure import provenance
from rocforge_build.measure.store import Store


def _stored_preset(tmp_path: Path) -> tuple[Path, Path]:
    """A preset of tmp/good.gguf, stored at tmp/models/m.gguf (a hard link, as a copy would be), for
    a build at tmp/p; (the stored path, another model)."""
    server = as_build(tmp_path / "p")
    good = write_gguf(tmp_path / "good.gguf", seed=0)
    other = write_gguf(tmp_path / "other.gguf", seed=1)
    sha = provenance.model_sha256(good)  # as tune hashed it
    stored = tmp_path / "models" / "m.gguf"
    stored.parent.mkdir()
    os.link(good, stored)
    p = preset(argv=[str(server), "-m", str(stored), "-c", "4096"])
    p["ranges"]["short"]["prefix"] = str(tmp_path / "p")
    p["model"].update(sha256=sha, path=str(stored))
    with Store() as s:
        s.add_preset("m", sha, None, p)
    return stored, other


@pytest.mark.parametrize("swap", ["link", "copy", "rename"])
def test_serve_by_name_refuses_a_stored_model_replaced_by_another(tmp_path, capsys, swap):
    """The preset's stored path now a link to another model, another model copied over it, or one
    renamed onto it: serve printed (and would have run) the preset's command on that file, naming
    the preset's model."""
    stored, other = _stored_preset(tmp_path)
    code, out, err = run(capsys, "serve", "m", "--dry-run")
    assert code == 0 and str(stored) in out, err  # the file tune measured: served, not hashed again
    stored.unlink()
    if swap == "link":
        os.symlink(other, stored)
    elif swap == "copy":
        stored.write_bytes(other.read_bytes())
    else:
        os.rename(other, stored)
    code, out, err = run(capsys, "serve", "m", "--dry-run")
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 2, err
    assert lines[0].startswith(f"rocforge: error: the preset's model '{stored}' is not the model the preset was tuned for")


def test_serve_by_path_of_the_tuned_model_through_a_link_is_served(tmp_path, capsys):
    """A link to the very file tune measured is that model: the preset's sha256 matches."""
    stored, _ = _stored_preset(tmp_path)
    link = tmp_path / "alias.gguf"
    os.symlink(stored, link)
    code, out, err = run(capsys, "serve", str(link), "--dry-run")
    assert code == 0 and str(link) in out, err


@pytest.mark.parametrize("what", ["fifo", "dir", "dev"])
def test_a_stored_model_path_replaced_by_a_fifo_a_directory_or_a_device_is_never_opened(tmp_path, capsys, what):
    stored, _ = _stored_preset(tmp_path)
    stored.unlink()
    if what == "fifo":
        os.mkfifo(stored)
    elif what == "dir":
        stored.mkdir()
    else:
        os.symlink("/dev/zero", stored)
    code, _, err = run(capsys, "serve", "m", "--dry-run")
    assert code == 2 and "is not a regular file" in err and len(err.splitlines()) == 2, err


@pytest.mark.parametrize("word", ["²", "٣", "①"])
def test_a_preset_command_with_a_digit_python_cannot_read_as_a_number_is_no_traceback(tmp_path, capsys, word):
    """`-c ²` in a stored preset's command (the results store is a file a user can edit): str.isdigit
    says yes to '²', int() then raised, and serve ended in `internal error: ValueError` (exit 70)."""
    server = as_build(tmp_path / "p")
    p = preset(argv=[str(server), "-m", "/m/m.gguf", "-c", word, "-np", word, "-kvu"])
    p["ranges"]["short"]["prefix"] = str(tmp_path / "p")
    with Store() as s:
        s.add_preset("m", "ab" * 32, None, p)
    code, _, err = run(capsys, "serve", "m", "--dry-run")
    assert code in (0, 2) and "internal error" not in err, err


def test_numbers_read_from_text_others_wrote_are_ascii_digits_only():
    """The same mechanism where a server, a listing or a command line gives the digits: a
    Content-Length or Content-Range of '²', a compare spec of '²' are no number, not a ValueError."""
    from types import SimpleNamespace

    from rocforge_build import download
    from rocforge_build.measure import known_bad

    assert download._declared_length(SimpleNamespace(headers={"Content-Length": "²"})) is None
    assert download._content_range_total("bytes */²") is None
    assert download._declared_length(SimpleNamespace(headers={"Content-Length": "12"})) == 12
    assert known_bad.served_shape(["llama-server", "-c", "²", "-np", "²", "-kvu"]) == (False, 1, 4096)
