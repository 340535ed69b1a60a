"""Hand-edited preset rows of the results store, as a careless or hostile user leaves them: JSON
that is not JSON (NaN, Infinity, a key twice), keys the store prints beside the record (`version`,
`in_use`), and a command that names its model more than once, JSON nested past what the readers walk.  Each bad row is one error
line naming the row and the field, with nothing printed or run from it."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from trust_helpers import run

from rocforge_build.measure.store import Store

MANIFEST = 'target = "gfx1151"\nbackend = "hip"\nstamp = "s1"\n[recipe]\nname = "llama-cpp"\n'


@pytest.fixture
def room(tmp_path, monkeypatch):
    """A fake rocforge build (its manifest and bin/llama-server), a model file and a sound preset
    of the build for that model, tuned before verify knew the serving dimensions (its variant
    names none of them); `room["store"](data)` stores another version, `room["raw"](text)` puts
    `text` as the newest row's data."""
    db = tmp_path / "results.sqlite3"
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(db))
    prefix = tmp_path / "build"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "rocforge-manifest.toml").write_text(MANIFEST)
    server = prefix / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho '-m, --model FNAME'\n")
    server.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    shape = {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": 99, "kv": "f16", "load": "mmap", "parallel": 1}
    rng = {"prefix": str(prefix), "backend": "hip", "stamp": "s1", "depth": 0, "ctx": 4096,
           "variant": {"ubatch": 512, "fa": True, "env": {}}, "variant_label": "ub512 fa", "score": 1.5,
           "figures": [{"test": "tg", "n": 128, "depth": 0, "t_s": 50.0, "stddev": 1.0}],
           "runner_up": None, "verified": {"shape": shape}, "env": {},
           "argv": [str(server), "-m", str(model), "-c", "4096"], "notes": []}
    data = {"model": {"name": "m", "sha256": sha, "path": str(model)}, "created": "t",
            "ranges": {"short": rng}}

    def store(d):
        with Store() as s:
            s.add_preset("m", sha, None, d)

    def raw(text):
        con = sqlite3.connect(db)
        con.execute("UPDATE presets SET data = ? WHERE id = (SELECT MAX(id) FROM presets)", (text,))
        con.commit()
        con.close()

    store(data)
    return {"data": data, "store": store, "raw": raw, "db": db}


PRINTERS = [("preset", "show", "m"), ("preset", "show", "m", "--json"), ("preset", "history", "m", "--json"),
            ("preset", "export", "m", "--format", "systemd"), ("serve", "m", "--dry-run")]


def refused(capsys, argv, *named):
    code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert code not in (0, 70) and len(lines) == 1 and "Traceback" not in err, (argv, code, err)
    assert out == "", (argv, out)
    assert "preset 2 (table presets" in lines[0] and all(n in lines[0] for n in named), lines[0]


@pytest.mark.parametrize("text,named", [
    ('{"note": NaN}', "field note: NaN"),
    ('{"note": [1, -Infinity]}', "field note[1]: -Infinity"),
    ('{"ranges": {}, "ranges": {}}', "'ranges'"),
    ('{"model": {"name": "a", "name": "b"}}', "'name'"),
])
def test_json_that_is_not_json_is_one_line(room, capsys, text, named):
    """NaN, Infinity and a key given twice are no JSON (RFC 8259): which value a key twice holds,
    or what NaN means, is not rocforge's to guess, and a printer of the row would write invalid
    JSON (`preset show --json`) or a value the user never saw."""
    room["store"](room["data"])
    whole = json.dumps(room["data"])
    room["raw"](whole[:-1] + ", " + text[1:])
    for argv in PRINTERS:
        refused(capsys, argv, named)


@pytest.mark.parametrize("key", ["version", "in_use"])
def test_the_keys_the_store_prints_beside_the_record_are_refused_in_it(room, capsys, key):
    """`preset show --json` puts the store's version and in_use beside the record: a record that
    holds either key is refused, never shown with its value replaced."""
    room["store"]({**room["data"], key: 99})
    for argv in PRINTERS:
        refused(capsys, argv, "field " + key)


def test_json_nested_past_any_preset_is_one_line(room, capsys):
    """Nesting that json reads but the readers and printers cannot walk (they recurse) is one
    line, not an internal error."""
    deep: list = []
    for _ in range(900):
        deep = [deep]
    room["store"]({**room["data"], "deep": deep})
    for argv in PRINTERS:
        refused(capsys, argv, "field deep", "nested more than")


@pytest.mark.parametrize("tail", [["-m", "--rpc=evil:1"], ["--model", "/other.gguf"], ["--model", "-x"]])
def test_a_command_names_its_model_once(room, capsys, tail):
    """serve swaps the word after the model flag for the model it checked; a second -m or
    --model would still choose what llama-server loads (the last one wins), unchecked."""
    bad = json.loads(json.dumps(room["data"]))
    bad["ranges"]["short"]["argv"] += tail
    room["store"](bad)
    for argv in PRINTERS:
        refused(capsys, argv, "ranges.short.argv")


def test_serve_swaps_the_long_model_flag_too(room, capsys):
    """A command that names its model with --model is served with the model serve checked."""
    good = json.loads(json.dumps(room["data"]))
    argv = good["ranges"]["short"]["argv"]
    argv[1] = "--model"
    room["store"](good)
    code, out, err = run(capsys, "serve", "m", "--dry-run")
    assert code == 0, err
    assert f"--model {room['data']['model']['path']} -c 4096" in out
