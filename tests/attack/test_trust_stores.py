"""Attack tests: records rocforge reads back from its stores pass a schema where they are read
(rocforge_build/schema.py).  Each test writes a real bad record — a preset row through sqlite3
into a real results database, a real rocforge-manifest.toml, a FIFO at the database's path — and
runs the real command that reads it, asserting the safe outcome: one `rocforge: error:` line
naming the store or file and the FIELD, the documented exit code (11 for the results store, 2 for
a manifest), never an internal error (70), and nothing run: serve never starts a program that lies
outside its build's prefix."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import fixtures_roots as fr
import pytest
import tomlkit
from stackfixtures import make_build
from test_commands_env import cli as env_cli
from trust_helpers import run

from rocforge_build.measure.store import Store

MODEL_BYTES = b"GGUF a model's bytes"
SHA = hashlib.sha256(MODEL_BYTES).hexdigest()
DEL = object()  # the mutation removes the field
R = ("ranges", "short")


@pytest.fixture
def db(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "results.sqlite3"
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(path))
    return path


@pytest.fixture
def build(tmp_path) -> tuple[Path, Path]:
    """A CPU build prefix as `rocforge build` leaves it, whose llama-server creates a marker file
    if it is ever started; (prefix, marker).  Beside it, outside the prefix, a program that
    creates the marker too: what a hostile preset points at."""
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    marker = tmp_path / "ran"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    for exe in (prefix / "bin" / "llama-server", tmp_path / "outside" / "bin" / "sh"):
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text(f"#!/bin/sh\ntouch {marker}\n")
        exe.chmod(0o755)
    (prefix / "bin" / "link-out").symlink_to(tmp_path / "outside" / "bin" / "sh")
    return prefix, marker


def good_preset(prefix: Path) -> dict:
    """A preset as `rocforge tune` stores it (measure/tune_choice.py `choose` and `entry`), its model
    file written beside the build (serve checks the file is the one the preset names)."""
    from rocforge_build.discover.builds import read_manifest

    model = prefix.parent / "m.gguf"
    model.write_bytes(MODEL_BYTES)
    return {"model": {"name": "m", "sha256": SHA, "path": str(model)}, "created": "2026-11-26T00:00:00Z",
            "ranges": {"short": {
                "prefix": str(prefix), "backend": "cpu", "stamp": read_manifest(prefix)["stamp"],
                "depth": 0, "ctx": 4096, "variant": {"ubatch": 512, "fa": True, "env": {}},
                "variant_label": "ub=512 fa=on", "score": 10.0,
                "figures": [{"test": "tg", "n": 128, "depth": 0, "t_s": 10.0, "stddev": 0.1}],
                "runner_up": None, "verified": {"shape": {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None,
                                                       "kv": "f16", "load": "mmap", "parallel": 1}},
                "env": {"GGML_X": "1"}, "argv": [str(prefix / "bin" / "llama-server"), "-m", str(model),
                                                 "-c", "4096"], "notes": ["a note"]}}}


def set_at(doc, path: tuple, value) -> None:
    """`value` written at `path` in the nested tables of `doc` (DEL: the field removed)."""
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is DEL:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def mutated(preset: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(preset)
    set_at(out, path, value)
    return out


def store_row(db: Path, data, version: int = 1) -> None:
    """The row written straight into the database with sqlite3, as a hand edit or another program
    would: the store's own writer is not asked."""
    Store().close()  # a database rocforge made: its tables and its mark
    con = sqlite3.connect(db)
    con.execute("INSERT INTO presets (model, model_sha256, run_id, created, data, model_version) "
                "VALUES ('m', ?, NULL, 't', ?, ?)", (SHA, json.dumps(data), version))
    con.commit()
    con.close()


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


READERS = [("preset", "show", "m"), ("preset", "show", "m", "--shell"), ("preset", "show", "m", "--json"),
           ("preset", "export", "m", "--format", "systemd"), ("preset", "export", "m", "--format", "llama-swap"),
           ("preset", "history", "m"), ("serve", "m", "--dry-run")]

# (where in the preset, the value written there (DEL: removed), the field the error names)
PRESET_ATTACKS = [
    (("model",), DEL, "model"), (("model",), "m", "model"), (("model", "name"), DEL, "model.name"),
    (("model", "name"), 5, "model.name"), (("model", "sha256"), None, "model.sha256"),
    (("model", "path"), None, "model.path"), (("model", "path"), 5, "model.path"),
    (("created",), DEL, "created"), (("created",), ["t"], "created"),
    (("ranges",), DEL, "ranges"), (("ranges",), {}, "ranges"), (("ranges",), [], "ranges"),
    (("ranges",), "short", "ranges"), (R, "x", "ranges.short"), (R, None, "ranges.short"),
    (R + ("prefix",), DEL, "ranges.short.prefix"), (R + ("prefix",), None, "ranges.short.prefix"),
    (R + ("prefix",), "", "ranges.short.prefix"), (R + ("prefix",), "builds/p", "ranges.short.prefix"),
    (R + ("prefix",), 5, "ranges.short.prefix"),
    (R + ("backend",), DEL, "ranges.short.backend"), (R + ("backend",), 5, "ranges.short.backend"),
    (R + ("backend",), "cpu\n[Service]\nExecStartPre=/bin/touch /tmp/x", "ranges.short.backend"),
    (R + ("stamp",), 5, "ranges.short.stamp"),
    (R + ("depth",), DEL, "ranges.short.depth"), (R + ("depth",), -1, "ranges.short.depth"),
    (R + ("depth",), "0", "ranges.short.depth"), (R + ("depth",), True, "ranges.short.depth"),
    (R + ("depth",), 2 ** 64, "ranges.short.depth"), (R + ("depth",), 1.5, "ranges.short.depth"),
    (R + ("ctx",), DEL, "ranges.short.ctx"), (R + ("ctx",), "4096", "ranges.short.ctx"),
    (R + ("ctx",), 0, "ranges.short.ctx"), (R + ("ctx",), None, "ranges.short.ctx"),
    (R + ("ctx",), 2 ** 40, "ranges.short.ctx"), (R + ("ctx",), [4096], "ranges.short.ctx"),
    (R + ("variant",), "ub=512", "ranges.short.variant"),
    (R + ("variant", "ubatch"), 0, "ranges.short.variant.ubatch"),
    (R + ("variant", "fa"), "on", "ranges.short.variant.fa"),
    (R + ("variant", "env"), {"A=B": "1"}, "ranges.short.variant.env"),
    (R + ("variant_label",), DEL, "ranges.short.variant_label"),
    (R + ("variant_label",), 5, "ranges.short.variant_label"),
    (R + ("score",), DEL, "ranges.short.score"), (R + ("score",), "1", "ranges.short.score"),
    (R + ("score",), float("nan"), "ranges.short.score"), (R + ("score",), None, "ranges.short.score"),
    (R + ("figures",), DEL, "ranges.short.figures"), (R + ("figures",), "x", "ranges.short.figures"),
    (R + ("figures",), [5], "ranges.short.figures[0]"),
    (R + ("figures", 0, "t_s"), "fast", "ranges.short.figures[0].t_s"),
    (R + ("figures", 0, "t_s"), -1, "ranges.short.figures[0].t_s"),
    (R + ("figures", 0, "n"), DEL, "ranges.short.figures[0].n"),
    (R + ("figures", 0, "stddev"), "0.1", "ranges.short.figures[0].stddev"),
    (R + ("runner_up",), 5, "ranges.short.runner_up"),
    (R + ("verified",), "yes", "ranges.short.verified"),
    (R + ("verified", "shape", "ctx"), "x", "ranges.short.verified.shape.ctx"),
    (R + ("env",), DEL, "ranges.short.env"), (R + ("env",), [], "ranges.short.env"),
    (R + ("env",), "GGML_X=1", "ranges.short.env"),
    (R + ("env",), {"A=B": "1"}, "ranges.short.env"), (R + ("env",), {"A;touch x": "1"}, "ranges.short.env"),
    (R + ("env",), {"A\nB": "1"}, "ranges.short.env"), (R + ("env",), {"": "1"}, "ranges.short.env"),
    (R + ("env",), {"1A": "1"}, "ranges.short.env"),
    (R + ("env",), {"A": "x\ntouch y"}, "ranges.short.env.A"), (R + ("env",), {"A": None}, "ranges.short.env.A"),
    (R + ("env",), {"A": [1]}, "ranges.short.env.A"),
    (R + ("argv",), DEL, "ranges.short.argv"), (R + ("argv",), [], "ranges.short.argv"),
    (R + ("argv",), None, "ranges.short.argv"), (R + ("argv",), "llama-server", "ranges.short.argv"),
    (R + ("argv",), [5], "ranges.short.argv[0]"),
    (R + ("argv", 2), "/m/m.gguf\ntouch /tmp/x", "ranges.short.argv[2]"),
    (R + ("notes",), DEL, "ranges.short.notes"), (R + ("notes",), [5], "ranges.short.notes[0]"),
]


def attack_id(attack) -> str:
    path, value, _ = attack
    return ".".join(map(str, path)) + "=" + ("DEL" if value is DEL else repr(value)[:20])


def test_a_good_preset_passes_every_reader(db, build, capsys):
    """The control: the record every attack below starts from is read by each command."""
    prefix, marker = build
    store_row(db, good_preset(prefix))
    for argv in READERS:
        code, out, err = run(capsys, *argv)
        assert code == 0 and out and "error" not in err, (argv, err)
    assert not marker.exists()


def test_a_relative_model_path_is_what_tune_stores(db, build, capsys):
    """`rocforge tune models/m.gguf` stores the path as given: the schema takes it."""
    prefix, _ = build
    store_row(db, mutated(good_preset(prefix), ("model", "path"), "models/m.gguf"))
    code, out, err = run(capsys, "preset", "show", "m", "--json")
    assert code == 0 and json.loads(out)["model"]["path"] == "models/m.gguf", err


@pytest.mark.parametrize("attack", PRESET_ATTACKS, ids=attack_id)
def test_a_bad_preset_row_is_one_line_naming_its_field(db, build, capsys, attack):
    path, value, field = attack
    prefix, marker = build
    store_row(db, mutated(good_preset(prefix), path, value))
    for argv in READERS:
        code, out, err = run(capsys, *argv)
        line = one_error(err)
        assert code == 11 and out == "", (argv, code, err)
        assert f"results database {db}: preset 1 (table presets: m version 1): field {field}" in line, (argv, line)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["x;touch /tmp/y", "a\nb", "1x", "a-b", ""])
def test_a_range_name_that_is_not_a_plain_name_is_refused(db, build, capsys, name):
    prefix, _ = build
    p = good_preset(prefix)
    p["ranges"] = {name: p["ranges"]["short"]}
    store_row(db, p)
    for argv in READERS:
        code, out, err = run(capsys, *argv)
        assert code == 11 and out == "" and "field ranges key:" in one_error(err), (argv, err)


def outside_programs(prefix: Path, tmp_path: Path) -> list[str]:
    """argv[0] values that name a program outside the build prefix: climbing out, absolute
    elsewhere, relative, and a link inside the prefix that points out."""
    return [f"{prefix}/../../outside/bin/sh", f"{prefix}/bin/../../../../outside/bin/sh",
            str(tmp_path / "outside" / "bin" / "sh"), "/bin/sh", "../../bin/sh", "sh",
            str(prefix / "bin" / "link-out")]


@pytest.mark.parametrize("which", range(7))
def test_a_program_outside_the_prefix_is_never_served(db, build, tmp_path, capsys, which):
    prefix, marker = build
    program = outside_programs(prefix, tmp_path)[which]
    store_row(db, mutated(good_preset(prefix), R + ("argv", 0), program))
    for argv in READERS:
        code, out, err = run(capsys, *argv)
        line = one_error(err)
        assert code == 11 and out == "" and "field ranges.short.argv[0]" in line, (argv, line)
        assert "outside the build prefix" in line or "an absolute path" in line, line
    # served for real: refused before anything starts, the outside program never runs
    proc = subprocess.run([sys.executable, "-m", "rocforge_build", "serve", "m", "--port", "9", "--wait", "5"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 11, proc.stderr
    assert "field ranges.short.argv[0]" in one_error(proc.stderr)
    assert not marker.exists()


def test_a_bad_version_is_never_put_in_use(db, build, capsys):
    prefix, _ = build
    store_row(db, good_preset(prefix), version=1)
    store_row(db, mutated(good_preset(prefix), R + ("ctx",), "long"), version=2)
    code, _, err = run(capsys, "preset", "use", "m", "2")
    assert code == 11 and "version 2): field ranges.short.ctx" in one_error(err)
    code, _, err = run(capsys, "preset", "use", "m", "1")  # the good version still can be
    assert code == 0, err
    code, out, _ = run(capsys, "preset", "show", "m", "--json")
    assert code == 0 and json.loads(out)["version"] == 1


def test_preset_list_says_when_it_is_empty(db, capsys):
    code, out, err = run(capsys, "preset", "list")
    assert code == 0 and out == ""
    assert err == f"rocforge: preset: no presets in {db} yet; `rocforge tune MODEL` stores one\n"


# -- the results database's path holds something that is not a file -------------------------------
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _socket(path: Path) -> None:
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # left bound for the test's life: a socket file at the path


@pytest.mark.parametrize("kind,make,suffix", [
    ("a FIFO", _fifo, ""), ("a FIFO", _fifo, "-wal"), ("a FIFO", _fifo, "-journal"),
    ("a directory", _directory, ""), ("a socket", _socket, ""),
])
@pytest.mark.parametrize("argv", [("results", "list"), ("preset", "list"), ("preset", "show", "m")])
def test_something_not_a_file_at_the_database_path_is_named(tmp_path, kind, make, suffix, argv):
    """SQLite opens a FIFO there and fails with "disk I/O error", which rocforge once reported
    as a full disk; now one line says what is at the path, exit 11, well within the timeout."""
    db = tmp_path / "results.sqlite3"
    make(Path(f"{db}{suffix}"))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rocforge_build", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ROCFORGE_RESULTS_DB": str(db)})
    assert time.monotonic() - started < 30
    line = one_error(proc.stderr)
    assert proc.returncode == 11 and proc.stdout == ""
    assert line == f"rocforge: error: results database {db}{suffix} is {kind}, not a regular file; rocforge leaves it untouched"
    assert "disk" not in proc.stderr


# -- build manifests -----------------------------------------------------------------------------
# (the manifest key, the value written there (DEL: removed), the field the error names)
MANIFEST_ATTACKS = [
    (("recipe",), DEL, "recipe"), (("recipe",), "odd", "recipe"), (("recipe", "name"), DEL, "recipe.name"),
    (("recipe", "name"), 5, "recipe.name"), (("recipe", "name"), "a\nb", "recipe.name"),
    (("target",), DEL, "target"), (("target",), 5, "target"), (("target",), ["gfx1151"], "target"),
    (("backend",), DEL, "backend"), (("backend",), {"a": 1}, "backend"),
    (("stamp",), 5, "stamp"), (("prefix",), "relative/p", "prefix"), (("prefix",), 5, "prefix"),
    (("outputs",), "lib/x.so", "outputs"), (("outputs",), [5], "outputs[0]"),
    (("export_env",), "A=1", "export_env"), (("export_env",), {"A": [1]}, "export_env.A"),
    (("export_env_reasons",), {"A": 1}, "export_env_reasons.A"),
    (("runtime_env",), {"A=B": "1"}, "runtime_env"), (("runtime_env",), {"A;touch x": "1"}, "runtime_env"),
    (("runtime_env",), {"A": "x\ntouch y"}, "runtime_env.A"),
    (("source",), "git", "source"), (("source", "version"), 5, "source.version"),
    (("toolchain",), 5, "toolchain"), (("toolchain", "kind"), 5, "toolchain.kind"),
    (("built_at",), 5, "built_at"),
]


def write_manifest_attack(prefix: Path, path: tuple, value) -> Path:
    manifest = prefix / "rocforge-manifest.toml"
    doc = tomlkit.parse(manifest.read_text())
    set_at(doc, path, value)
    manifest.write_text(tomlkit.dumps(doc))
    return manifest


@pytest.fixture
def root_build(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    fr.make_strix_halo(root)
    return root, make_build(root, "odd", "gfx1151", "hip")


def test_a_good_manifest_is_read(root_build):
    root, prefix = root_build
    out = env_cli(root, "env", "--shell", "bash")
    assert out.returncode == 0 and "error" not in out.stderr, out.stderr
    assert f"/{prefix.name};" in out.stdout  # the build is used: what a refused manifest takes away


@pytest.mark.parametrize("attack", MANIFEST_ATTACKS, ids=attack_id)
def test_a_bad_manifest_is_one_line_naming_its_field(root_build, attack):
    root, prefix = root_build
    path, value, field = attack
    manifest = write_manifest_attack(prefix, path, value)
    out = env_cli(root, "use", str(prefix))  # the build named: refused
    assert out.returncode == 2 and out.stdout == "", out
    assert f"{manifest}: field {field}" in one_error(out.stderr)
    # every build discovered: this one is left out with one warning, the environment still made
    # (one damaged prefix must not break every shell that evaluates `rocforge env`)
    for argv in (("env", "--shell", "bash"), ("env", "--json")):
        out = env_cli(root, *argv)
        warned = [line for line in out.stderr.splitlines() if f"{manifest}: field {field}" in line]
        assert out.returncode == 0 and len(warned) == 1, (argv, out)
        assert warned[0].startswith("rocforge: warning: ") and warned[0].endswith("build left out")
        assert f"/{prefix.name};" not in out.stdout and "rocforge: error" not in out.stderr


@pytest.mark.parametrize("attack", MANIFEST_ATTACKS, ids=attack_id)
def test_a_bad_manifest_read_by_rollback_and_bundle_is_one_line(tmp_path, attack, capsys):
    """upgrade, rollback and bundle read a manifest through the same schema (discover/builds.py)."""
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    path, value, field = attack
    manifest = write_manifest_attack(prefix, path, value)
    code, out, err = run(capsys, "rollback", str(prefix))
    assert code == 2 and f"{manifest}: field {field}" in one_error(err), err
    code, out, err = run(capsys, "bundle", str(prefix), "--target", "gfx1151", "--out", tmp_path / "b.tar.gz")
    assert code == 2 and f"{manifest}: field {field}" in one_error(err), err
    assert not (tmp_path / "b.tar.gz").exists()


# -- bundle metadata ------------------------------------------------------------------------------
def bundle_folder(tmp_path: Path) -> tuple[Path, dict]:
    """An unpacked bundle as `rocforge bundle` makes it: its files and the bundle.toml listing them."""
    import hashlib

    folder = tmp_path / "b"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "prog").write_bytes(b"program bytes")
    (folder / "lib").mkdir()
    (folder / "lib" / "libx.so.1").symlink_to("libx.so.1.0")
    (folder / "lib" / "libx.so.1.0").write_bytes(b"library bytes")
    info = {"bundle": {"made_by": "rocforge", "name": "b", "gpu": "none", "target": "gfx1151",
                       "kernel_targets": ["gfx1151"]},
            "file": [{"path": "bin/prog", "sha256": hashlib.sha256(b"program bytes").hexdigest()},
                     {"path": "lib/libx.so.1.0", "sha256": hashlib.sha256(b"library bytes").hexdigest()},
                     {"path": "lib/libx.so.1", "link": "libx.so.1.0"}]}
    return folder, info


BUNDLE_ATTACKS = [
    (("bundle", "name"), 5, "bundle.name"), (("bundle", "kernel_targets"), "gfx1151", "bundle.kernel_targets"),
    (("bundle", "kernel_targets"), [5], "bundle.kernel_targets[0]"), (("bundle", "gpu"), 5, "bundle.gpu"),
    (("bundle", "target"), ["gfx1151"], "bundle.target"), (("bundle", "launcher"), {"a": 1}, "bundle.launcher"),
    (("file",), "bin/prog", "file"), (("file",), [5], "file[0]"), (("file", 0, "path"), DEL, "file[0].path"),
    (("file", 0, "path"), 5, "file[0].path"), (("file", 0, "sha256"), 5, "file[0].sha256"),
    (("file", 0, "sha256"), DEL, "file[0]"), (("file", 2, "sha256"), "00", "file[2]"),
    (("file", 1, "path"), "bin/prog", "file[1].path"),
]


def test_a_good_bundle_toml_checks(tmp_path, capsys):
    folder, info = bundle_folder(tmp_path)
    (folder / "bundle.toml").write_text(tomlkit.dumps(info))
    code, out, err = run(capsys, "bundle", "check", folder)
    assert code == 0 and "error" not in err, err


@pytest.mark.parametrize("attack", BUNDLE_ATTACKS, ids=attack_id)
def test_a_bad_bundle_toml_is_one_line_naming_its_field(tmp_path, capsys, attack):
    path, value, field = attack
    folder, info = bundle_folder(tmp_path)
    (folder / "bundle.toml").write_text(tomlkit.dumps(mutated(info, path, value)))
    code, out, err = run(capsys, "bundle", "check", folder)
    assert code == 7 and f"bundle.toml: field {field}" in one_error(err), err


# -- rows of the results store ----------------------------------------------------------------------
BENCH_ROW = {"prefix": "/p", "test": "tg", "n_prompt": 0, "n_gen": 128, "depth": 0, "ubatch": 512, "fa": True,
             "env": {}, "t_s": 50.0, "stddev": 0.5, "status": "ok"}
VERIFY_ROW = {"prefix": "/p", "passed": True, "stamp": "s", "env": {},
              "checks": [{"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None, "kld_mean": 0.001, "top1": 0.99,
                          "passed": True}]}
# (the row's kind, where in its data, the value written there (DEL: removed), the field named)
ROW_ATTACKS = [
    ("bench", ("t_s",), "fast", "t_s"), ("bench", ("t_s",), None, "t_s"), ("bench", ("t_s",), -1, "t_s"),
    ("bench", ("t_s",), float("inf"), "t_s"), ("bench", ("t_s",), DEL, "t_s"), ("bench", ("stddev",), "x", "stddev"),
    ("bench", ("depth",), "0", "depth"), ("bench", ("n_gen",), -5, "n_gen"), ("bench", ("fa",), "on", "fa"),
    ("bench", ("env",), "A=1", "env"), ("bench", ("env",), {"A": [1]}, "env.A"), ("bench", ("test",), 5, "test"),
    ("bench", ("ceiling",), "x", "ceiling"), ("bench", ("ceiling",), {"tg_pct_of_bandwidth": 5, "bandwidth_gbs": "x"},
                                                 "ceiling.bandwidth_gbs"), ("bench", ("error",), 5, "error"),
    ("verify", ("passed",), "yes", "passed"), ("verify", ("passed",), DEL, "passed"),
    ("verify", ("checks",), "x", "checks"), ("verify", ("checks",), [5], "checks[0]"),
    ("verify", ("checks", 0, "ctx"), "x", "checks[0].ctx"), ("verify", ("checks", 0, "ctx"), DEL, "checks[0].ctx"),
    ("verify", ("checks", 0, "kld_mean"), "small", "checks[0].kld_mean"),
    ("verify", ("env",), ["A"], "env"),
]


def store_rows(db: Path, kind: str, data: dict) -> None:
    """A finished run with one good row and one row written straight into the database."""
    with Store() as s:
        rid = s.start_run(kind, [kind])
        s.add_row(rid, kind, BENCH_ROW if kind == "bench" else VERIFY_ROW)
        s.finish_run(rid, "done")
    con = sqlite3.connect(db)
    con.execute("INSERT INTO rows (run_id, kind, prefix, status, created, data) VALUES (1, ?, '/p', 'ok', 't', ?)",
                (kind, json.dumps(data)))
    con.commit()
    con.close()


@pytest.mark.parametrize("kind", ["bench", "verify"])
def test_good_rows_are_read(db, capsys, kind):
    store_rows(db, kind, BENCH_ROW if kind == "bench" else VERIFY_ROW)
    readers = [("results", "show", "1"), ("results", "export", "--json"), ("results", "export", "--csv")]
    for argv in readers + ([("results", "compare", "1", "1")] if kind == "bench" else []):
        code, out, err = run(capsys, *argv)
        assert code == 0 and out and "error" not in err, (argv, err)


@pytest.mark.parametrize("attack", ROW_ATTACKS, ids=lambda a: a[0] + ":" + attack_id(a[1:]))
def test_a_bad_row_is_one_line_naming_its_field(db, capsys, attack):
    kind, path, value, field = attack
    store_rows(db, kind, mutated(BENCH_ROW if kind == "bench" else VERIFY_ROW, path, value))
    readers = [("results", "show", "1"), ("results", "show", "1", "--json"), ("results", "export", "--json"),
               ("results", "export", "--csv")] + ([("results", "compare", "1", "1")] if kind == "bench" else [])
    for argv in readers:
        code, out, err = run(capsys, *argv)
        line = one_error(err)
        assert code == 11 and out == "", (argv, code, err)
        assert f"results database {db}: row 2 of run 1 (table rows): field {field}" in line, (argv, line)
