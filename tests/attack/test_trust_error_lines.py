"""Attack tests (issue 32): text a user, a file or a build gave never forges a line of rocforge's
output nor drives the terminal.  An error is one `rocforge: error:` line; a message of several
lines by design (a failed build's log tail) keeps them, each indented; escape sequences, CR, C1
and bidi controls are shown as escapes (docs/reference/exit-codes.md).  A build manifest whose
text fields hold a line break or control character is not one rocforge wrote (its recipes refuse
them): left out with a warning; and doctor prints what it reads from a store on one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomlkit
from stackfixtures import make_build
from trust_helpers import one_error, rocforge, run

from rocforge_build import cli
from rocforge_build.commands import doctor
from rocforge_build.errors import ConfigError
from rocforge_build.manifest_schema import checked_manifest

FORGED = "fine\x1b[2J\x1b[31mred\nrocforge: error: forged\u2028second\rthird\x9b1m\u202eevil"
# what a terminal acts on: ESC, CSI (C1), CR, the bidi override; and every line break
CONTROLS = ("\x1b", "\x9b", "\r", "\u202e", "\u2028", "\x0b")


def forged_lines(err: str) -> list[str]:
    """Lines of stderr as a terminal splits them, that claim to be rocforge's own."""
    return [line for line in err.split("\n") if line.startswith("rocforge:")]


def test_a_message_with_line_breaks_and_escapes_is_one_error_line(capsys):
    cli.report("error", FORGED)
    cli.report("hint", FORGED)
    err = capsys.readouterr().err
    assert [line.split(":")[1] for line in forged_lines(err)] == [" error", " hint"], err
    assert not any(c in err for c in CONTROLS), ascii(err)
    assert "\\x1b[2J" in err and "\\u202e" in err  # shown, not acted on


def test_a_message_of_several_lines_by_design_keeps_them_indented(capsys):
    """A failed build's log tail: the build's own lines, under the error, none read as one."""
    cli.report("error", "build failed (exit code 2); full log: /x/build.log\nmake: *** [all] Error 1\n"
                        "rocforge: error: from the build's own output\n  lib/x.so — missing")
    assert capsys.readouterr().err.split("\n") == [
        "rocforge: error: build failed (exit code 2); full log: /x/build.log",
        "  make: *** [all] Error 1",
        "  rocforge: error: from the build's own output",
        "  lib/x.so — missing",
        ""]


def test_a_recipe_file_name_with_a_line_break_and_escape_is_one_error_line(tmp_path):
    odd = tmp_path / "a\nrocforge: error: forged\x1b[31m.toml"
    odd.write_text("x = ?\n", encoding="utf-8")
    res = rocforge("recipe", "show", str(odd))
    assert one_error(res).startswith("rocforge: error: recipe a") and "invalid TOML" in res.stderr
    assert len(forged_lines(res.stderr)) == 1 and "\x1b" not in res.stderr, res.stderr


def test_a_cli_value_with_a_line_break_is_one_error_line(capsys):
    code, _, err = run(capsys, "build", "--dry-run", "llama-cpp", "--cmake-target=a\nrocforge: error: forged")
    assert code == 2 and len([x for x in forged_lines(err) if x.startswith("rocforge: error:")]) == 1, err


@pytest.mark.parametrize("field,value", [
    (("source", "version"), "1.0\r"),
    (("built_at",), "2026\x00"),
    (("outputs",), ["lib/a\nb.so"]),
])
def test_a_manifest_text_field_with_a_control_character_is_refused(field, value):
    data = {"recipe": {"name": "x"}, "target": "", "backend": "cpu"}
    table = data
    for key in field[:-1]:
        table = table.setdefault(key, {})
    table[field[-1]] = value
    with pytest.raises(ConfigError, match=f"field {'.'.join(field)}"):
        checked_manifest(data, "m.toml")
    table[field[-1]] = ["lib/a.so"] if isinstance(value, list) else "plain text, tab\tand all"
    checked_manifest(data, "m.toml")


def test_a_manifest_with_a_forged_export_reason_is_printed_on_one_line(capsys):
    """The exports and their reasons are judged entry by entry (manifest_schema.py): a forged
    reason is printed on one line by doctor and env, and the build keeps its exports."""
    prefix = make_build(Path("/"), "fx", "", "cpu", export_env={"FX_ENV": "1"},
                        export_reasons={"FX_ENV": "fine"})  # in this test's data dir
    assert prefix.is_relative_to(os.environ["ROCFORGE_DATA_DIR"])
    manifest = prefix / "rocforge-manifest.toml"
    doc = tomlkit.parse(manifest.read_text(encoding="utf-8"))
    doc["export_env_reasons"] = {"FX_ENV": FORGED}
    manifest.write_text(tomlkit.dumps(doc), encoding="utf-8")
    for argv in (("doctor",), ("env", "--shell", "bash")):
        code, out, err = run(capsys, *argv)
        assert code in (0, 1) and not any(c in out + err for c in CONTROLS), ascii(out + err)
        errors = [line for line in forged_lines(out + err) if line.startswith("rocforge: error")]
        assert not errors, (argv, out, err)
        assert "FX_ENV" in out, (argv, out)


def test_doctor_prints_stored_text_on_one_line():
    shown = doctor.esc(FORGED)
    assert "\n" not in shown and not any(c in shown for c in CONTROLS)
    assert doctor.esc("[bold]x[/]") == "\\[bold]x\\[/]"  # still markup-escaped


def test_serve_of_a_mistyped_model_path_says_no_such_file(capsys, tmp_path):
    # a path names a file: one that is not there is "does not exist", not "no preset ... tune"
    code, out, err = run(capsys, "serve", tmp_path / "mistyped" / "model.gguf")
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"rocforge: error: model file {tmp_path}/mistyped/model.gguf does not exist"]
    # a model name with no preset keeps the way to one
    code, out, err = run(capsys, "serve", "smollm2")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["rocforge: error: no preset for 'smollm2'",
                                "rocforge: hint: run `rocforge tune` for it first"]


def test_serve_of_a_preset_whose_build_is_gone_names_the_prefix(capsys, tmp_path):
    from test_measure_proof import preset

    from rocforge_build.measure.store import Store

    gone = tmp_path / "builds" / "cpu"  # never made, as after `rm -r` of the build
    p = preset(argv=[str(gone / "bin/llama-server"), "-m", "/m/m.gguf", "-c", "4096"])
    p["ranges"]["short"]["prefix"] = str(gone)
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    for argv in (("serve", "m"), ("serve", "m", "--dry-run")):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), err
        assert err.splitlines() == [
            f"rocforge: error: the short range's build {gone} is gone",
            f"rocforge: hint: build it again (`rocforge build llama-cpp --backend cpu --prefix {gone}`) "
            "and tune again (`rocforge tune`)"]
