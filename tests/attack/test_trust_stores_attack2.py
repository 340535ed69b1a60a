"""Attack tests, second trial of the stores (issue 30): a preset that names no rocforge build, rows
and columns that pass a type check but not the rules code after the boundary relies on, a model
path that is a device or a flag, and stored text printed for people.  Each attack is performed for
real (the store's own writer or sqlite3 into a real database, real scripts, real FIFOs, real
manifests, `rocforge serve` in a subprocess) and asserts the safe outcome: nothing run, one
`rocforge: error:` line with the documented exit code, or a listing that stays one line per entry."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import test_trust_stores as base
from test_commands_env import cli as env_cli
from test_trust_stores import (
    BENCH_ROW,
    SHA,
    R,
    good_preset,
    mutated,
    one_error,
    run,
    store_row,
    store_rows,
    write_manifest_attack,
)

from rocforge_build.measure.store import Store

db, build, root_build = base.db, base.build, base.root_build  # the fixtures, shared

PRINTERS = [("preset", "show", "m"), ("preset", "show", "m", "--shell"),
            ("preset", "export", "m", "--format", "systemd"), ("preset", "export", "m", "--format", "llama-swap"),
            ("preset", "export", "m", "--format", "shell"), ("serve", "m", "--dry-run")]


def add_preset(data: dict) -> None:
    """Through the store's own writer, as a tune (or a program using rocforge's API) would."""
    with Store() as s:
        s.add_preset("m", SHA, None, data)


def serve_for_real(port: int = 9) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocforge_build", "serve", "m", "--port", str(port),
                           "--wait", "3"], capture_output=True, text=True, timeout=60, env=dict(os.environ))


def outsider(tmp_path: Path, marker: Path, name: str = "llama-server") -> Path:
    exe = tmp_path / "x" / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\ntouch {marker}\n")
    exe.chmod(0o755)
    return exe


def not_a_build(tmp_path: Path, build_prefix: Path, marker: Path) -> list[tuple[str, str]]:
    """(prefix, argv[0]) pairs whose program lies "inside" a prefix that is no rocforge build."""
    script = str(outsider(tmp_path, marker))
    in_builds = outsider(build_prefix.parent / "bin", marker).rename(build_prefix.parent / "bin" / "llama-server")
    return [("/", script), (str(tmp_path), script), (str(build_prefix.parent), str(in_builds)),
            ("/usr", "/usr/bin/touch"), (str(tmp_path / "x"), script)]


@pytest.mark.parametrize("which", range(5))
def test_a_prefix_that_is_no_rocforge_build_is_never_printed_or_served(db, build, tmp_path, capsys, which):
    prefix, marker = build
    bad_prefix, program = not_a_build(tmp_path, prefix, marker)[which]
    p = mutated(mutated(good_preset(prefix), R + ("prefix",), bad_prefix), R + ("stamp",), None)
    add_preset(mutated(p, R + ("argv", 0), program))
    for argv in PRINTERS:
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "", (argv, code, out, err)
        assert "range short:" in one_error(err), (argv, err)
    proc = serve_for_real()
    assert proc.returncode == 11 and "range short:" in one_error(proc.stderr), proc.stderr
    assert not marker.exists() and not (Path.cwd() / "PWNED").exists()


@pytest.mark.parametrize("stamp", [None, ""])
def test_a_preset_without_a_stamp_is_never_served_even_when_its_build_has_none(db, build, capsys, stamp):
    """None == None once let a stamp-less build pass the verify gate: no stamp proves nothing."""
    prefix, marker = build
    add_preset(mutated(good_preset(prefix), R + ("stamp",), stamp))
    for argv in PRINTERS:
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "" and "stamp is" in one_error(err), (argv, err)
    assert not marker.exists()


def test_another_program_of_the_build_is_not_its_server(db, build, capsys):
    """argv[0] inside the build but not its bin/llama-server or bin/llama-cli."""
    prefix, marker = build
    for program in (prefix / "bin" / "other", prefix / "llama-server"):
        program.write_text(f"#!/bin/sh\ntouch {marker}\n")
        program.chmod(0o755)
    for program in (prefix / "bin" / "other", prefix / "llama-server"):
        add_preset(mutated(good_preset(prefix), R + ("argv", 0), str(program)))
        for argv in PRINTERS:
            code, out, err = run(capsys, *argv)
            assert code == 11 and out == "" and "is not the build's own" in one_error(err), (argv, err)
        with Store() as s:
            s.db.execute("DELETE FROM presets")
    assert not marker.exists()


# -- rows: every declared field is there after the boundary; a bench row has a status ------------
def test_a_verify_row_with_only_passed_is_shown(db, capsys):
    store_rows(db, "verify", {"passed": True})
    for argv in (("results", "show", "1"), ("results", "show", "1", "--json"), ("results", "export", "--csv")):
        code, out, err = run(capsys, *argv)
        assert code == 0 and out and "error" not in err, (argv, err)


@pytest.mark.parametrize("data", [{"t_s": 1.0}, {k: v for k, v in BENCH_ROW.items() if k != "status"}])
def test_a_bench_row_without_a_status_is_one_line_not_a_regression(db, capsys, data):
    """A row without data.status once read as ok to the schema and as failed to compare."""
    store_rows(db, "bench", data)
    for argv in (("results", "show", "1"), ("results", "compare", "1", "1"), ("results", "export", "--json")):
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "", (argv, code, err)
        assert f"results database {db}: row 2 of run 1 (table rows): field status is missing" in one_error(err)


@pytest.mark.parametrize("value", ["x", None, 0, 1.5])
def test_a_bad_model_version_column_is_one_line(db, build, capsys, value):
    prefix, _ = build
    store_row(db, good_preset(prefix))
    con = sqlite3.connect(db)
    con.execute("UPDATE presets SET model_version = ?", (value,))
    con.commit()
    con.close()
    for argv in (("preset", "history", "m"), ("preset", "history", "m", "--json"), ("preset", "show", "m"),
                 ("preset", "use", "m", "1"), ("serve", "m", "--dry-run")):
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "", (argv, code, out, err)
        assert "preset 1 (table presets): field version" in one_error(err), (argv, err)


@pytest.mark.parametrize("column,value", [("status", "ok\nPASSED"), ("status", ""), ("kind", "a\nb"),
                                          ("finished", b"x"), ("started", b"\x00")])
def test_a_bad_runs_column_is_one_line(db, capsys, column, value):
    store_rows(db, "bench", BENCH_ROW)
    con = sqlite3.connect(db)
    con.execute(f"UPDATE runs SET {column} = ?", (value,))
    con.commit()
    con.close()
    for argv in (("results", "list"), ("results", "show", "1")):
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "" and f"run 1 (table runs): field {column}" in one_error(err), (argv, err)


# -- the model behind a stored path ----------------------------------------------------------------
def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "fifo.gguf")
    return str(tmp_path / "fifo.gguf")


@pytest.mark.parametrize("make", [lambda t: "/dev/zero", _fifo, lambda t: str(t)], ids=["device", "fifo", "directory"])
def test_a_model_that_is_not_a_regular_file_is_never_served(db, build, tmp_path, capsys, make):
    prefix, marker = build
    path = make(tmp_path)
    p = mutated(good_preset(prefix), ("model", "path"), path)
    add_preset(mutated(p, R + ("argv", 2), path))
    code, out, err = run(capsys, "serve", "m", "--dry-run")
    assert code == 2 and out == "" and "model" in one_error(err), err
    proc = serve_for_real()
    assert proc.returncode == 2 and "model" in one_error(proc.stderr)
    assert not marker.exists()


def test_a_model_path_that_is_a_flag_is_refused(db, build, capsys):
    prefix, marker = build
    p = mutated(good_preset(prefix), ("model", "path"), "--rpc=evil:1")
    add_preset(mutated(p, R + ("argv", 2), "--rpc=evil:1"))
    for argv in PRINTERS:
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "" and "starts with '-'" in one_error(err), (argv, err)
    assert not marker.exists()


def test_a_relative_model_path_is_served_absolute(db, build, capsys, monkeypatch):
    prefix, _ = build
    model = Path(good_preset(prefix)["model"]["path"])
    monkeypatch.chdir(model.parent)
    add_preset(mutated(good_preset(prefix), ("model", "path"), model.name))
    code, out, err = run(capsys, "serve", "m", "--dry-run")
    assert code == 0 and f" -m {model} " in out, err


# -- stored text printed for people: one line per entry, no terminal control ---------------------
EVIL = "a\nPASSED\x1b[2J\u2028b"


def _clean(out: str, lines: int) -> None:
    assert "\x1b" not in out and "\u2028" not in out and "\r" not in out, out
    assert len(out.splitlines()) == lines, out


def test_preset_listings_keep_stored_text_on_one_line(db, build, capsys):
    prefix, _ = build
    with Store() as s:
        for i in range(10):
            s.add_preset(f"m{i}{EVIL}", f"{i:02d}" * 32, None, good_preset(prefix))
    code, out, err = run(capsys, "preset", "list")
    assert code == 0
    _clean(out, 10)
    code, out, err = run(capsys, "preset", "show", "nonexistent")
    assert code == 2 and len(err.splitlines()) == 2 and "\x1b" not in err, err  # the error and its hint


def test_results_list_and_show_keep_stored_text_on_one_line(db, capsys):
    store_rows(db, "bench", {**BENCH_ROW, "prefix": f"/p{EVIL}", "env": {"A": EVIL}})
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET argv = ?", (json.dumps(["bench", EVIL]),))  # a status is one line (schema)
    con.commit()
    con.close()
    code, out, err = run(capsys, "results", "list")
    assert code == 0
    _clean(out, 1)
    code, out, err = run(capsys, "results", "show", "1")
    assert code == 0
    _clean(out, 4)  # the run, its argv, its two rows


# -- build manifests -------------------------------------------------------------------------------
@pytest.mark.parametrize("path,value,field", [
    (("export_env", "A"), 5, "export_env.A"), (("recipe", "name"), "../../etc\u2028x", "recipe.name"),
    (("recipe", "name"), "a/b", "recipe.name"), (("recipe", "name"), "-x", "recipe.name")])
def test_a_manifest_field_code_relies_on_is_refused(root_build, path, value, field):
    root, prefix = root_build
    manifest = write_manifest_attack(prefix, path, value)
    out = env_cli(root, "use", str(prefix))
    assert out.returncode == 2 and f"{manifest}: field {field}" in one_error(out.stderr), out.stderr
    assert not (root / "use.toml").exists()


@pytest.mark.parametrize("damage", [lambda b: b.replace(b"built_at = \"", b"built_at = \"\xff\xfe"),
                                    lambda b: b + b"\nnot [toml\n"], ids=["not-utf8", "not-toml"])
def test_an_unreadable_manifest_is_one_warning(root_build, damage):
    """A sound manifest with one byte that is not UTF-8 (or a line that is not TOML) once dropped
    its build from `env` without a word; now it is one warning naming the file, like a bad field."""
    root, prefix = root_build
    manifest = prefix / "rocforge-manifest.toml"
    manifest.write_bytes(damage(manifest.read_bytes()))
    for argv in (("env", "--shell", "bash"), ("env", "--json")):
        out = env_cli(root, *argv)
        warned = [line for line in out.stderr.splitlines() if str(manifest) in line]
        assert out.returncode == 0 and len(warned) == 1, (argv, out.stderr)
        assert warned[0].startswith("rocforge: warning: ") and warned[0].endswith("build left out")
        assert f"/{prefix.name};" not in out.stdout
