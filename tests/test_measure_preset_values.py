"""measure/preset_values.py: the typed values the results store hands out for a preset, built once
from the record the preset schema checked where the store read it.  A preset as tune writes it
(measure/tune_choice.py `choose`) reads back as values and gives back, through `to_json`, exactly the
JSON `preset show --json` and `preset history --json` printed from the checked record; an old preset
(no verified shape, none of the serving dimensions) still reads and serves; a hand-edited row is
still one line naming the field."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
from stackfixtures import make_build
from test_measure_proof import preset as old_preset
from test_measure_tune_choice import DEFAULT, WIDE, Heard, candidate, check_failing, rows, session
from trust_helpers import one_error_line

from rocforge_build import cli, schema
from rocforge_build.errors import StoreError
from rocforge_build.measure import tune_choice
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.preset import PRESET, checked
from rocforge_build.measure.preset_values import Figure, Preset, PresetModel, VerifiedShape
from rocforge_build.measure.store import Store
from rocforge_build.serve.server import verified_shape

SHA = "ab" * 32


@pytest.fixture
def tuned(tmp_path) -> dict:
    """A preset exactly as tune builds it: a HIP build's variant chosen for the short range (the
    faster CPU one refused at the range's shape), its figures pooled, its check's shape stored."""
    builds = {}
    for backend in ("cpu", "hip"):
        prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", backend, files=("bin/llama-bench",))
        (prefix / "bin" / "llama-server").write_text("#!/bin/sh\nexit 0\n")
        (prefix / "bin" / "llama-server").chmod(0o755)
        builds[backend] = LlamaBuild.open(prefix)
    slow = candidate(builds["hip"], {DEFAULT: rows(90)})
    slow.samples[DEFAULT] = [rows(90), rows(110)]
    settled = {"short": {"ranked": [(200.0, candidate(builds["cpu"], {WIDE: rows(200)}), WIDE),
                                    (100.0, slow, DEFAULT)], "note": "as measured"}}
    check_at, _ = check_failing({"cpu": "kld_mean 0.3 > 0.005"})
    preset, _ = tune_choice.choose(settled, {"short": 0}, {"short": 4096}, session(tmp_path), check_at, Heard(),
                                   exhaustive=False)
    return json.loads(json.dumps(preset))  # as the store keeps it: JSON


def shown_before(data: dict, **store: object) -> str:
    """What `preset show --json` printed from the checked record itself: the record as the schema
    returned it (every declared field present), then the store's version and in_use."""
    return json.dumps({**schema.check(data, PRESET, "test", StoreError), **store}, indent=2)


def test_a_tuned_preset_reads_back_as_values(tuned):
    with Store() as s:
        assert s.add_preset("m", SHA, 7, tuned) == 1
        got = s.preset(SHA)
    assert isinstance(got, Preset) and (got.version, got.in_use, got.exhaustive) == (1, "newest", False)
    assert got.model == PresetModel(name=tuned["model"]["name"], sha256=SHA, path=tuned["model"]["path"],
                                    key_order=("name", "sha256", "path"))
    r = got.ranges["short"]
    assert (r.backend, r.stamp, r.depth, r.ctx, r.variant_label, r.score) == (
        "hip", tuned["ranges"]["short"]["stamp"], 0, 4096, "ub=512 fa=1", 100.0)
    assert (r.variant.ubatch, r.variant.fa, dict(r.variant.env), r.variant.kv, r.variant.parallel) == (
        512, True, {}, None, None)  # bench.Variant stores no kv at f16 and no parallel: not stored, None
    assert [(f.test, f.n, f.t_s) for f in r.figures] == [("pp", 512, 100.0), ("tg", 128, 100.0)]
    assert all(isinstance(f, Figure) for f in r.figures)
    # the shape tune verified, every serving dimension named
    assert r.verified_shape == VerifiedShape(ctx=4096, ubatch=512, fa=True, ngl=99, kv="f16", load="mmap",
                                             parallel=1, key_order=VerifiedShape.FIELDS)
    assert r.verified_shape.serving_known
    assert r.argv == tuple(tuned["ranges"]["short"]["argv"]) and r.argv[0].endswith("/bin/llama-server")
    # what this rocforge does not read is kept, unread and read-only
    assert r.extra["repetitions"] == 2 and r.extra["settled"] == "as measured"
    assert got.extra["reason"] == tuned["reason"]
    assert isinstance(r.extra["rejected"], tuple)


def test_to_json_is_what_preset_show_and_history_printed(tuned, capsys):
    tuned["future"] = {"a newer rocforge's key": [1, {"x": None}]}  # kept, in its place
    tuned["ranges"]["short"]["figures"][0]["future"] = True
    with Store() as s:
        s.add_preset("m", SHA, 7, tuned)
        got, history = s.preset(SHA), s.preset_history(SHA)
    assert json.dumps(got.to_json(), indent=2) == shown_before(tuned, version=1, in_use="newest")
    # the keys in the order tune wrote them (repetitions after score, settled and rejected last)
    assert list(got.to_json()["ranges"]["short"]) == list(tuned["ranges"]["short"])
    assert cli.main(["preset", "show", SHA, "--json"]) == 0
    assert capsys.readouterr().out == shown_before(tuned, version=1, in_use="newest") + "\n"
    entry = history[0].to_json()
    assert list(entry) == ["version", "model", "model_sha256", "run_id", "created", "data"]
    assert (entry["version"], entry["model"], entry["model_sha256"], entry["run_id"]) == (1, "m", SHA, 7)
    assert json.dumps(entry["data"], indent=2) == shown_before(tuned)
    assert cli.main(["preset", "show", SHA, "--version", "1", "--json"]) == 0  # no in_use: not asked
    assert capsys.readouterr().out == shown_before(tuned, version=1) + "\n"
    # a round trip loses nothing: stored again, the values read back are the same
    with Store() as s:
        s.add_preset("m", SHA, 8, got.stored_json())
        again = s.preset(SHA)
    assert dataclasses.replace(again, version=1) == got


def test_values_are_read_only(tuned):
    got = checked(tuned, "test")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.created = "later"  # type: ignore[misc]
    with pytest.raises(TypeError):
        got.ranges["long"] = got.ranges["short"]  # type: ignore[index]
    with pytest.raises(TypeError):
        got.ranges["short"].env["LD_PRELOAD"] = "/x.so"  # type: ignore[index]


def test_an_old_preset_without_a_verified_shape_reads_and_is_served_at_its_commands_shape():
    # stored before tune kept the shape it verified and before verify knew kv, loading and slots
    data = old_preset(argv=["/p/bin/llama-server", "-m", "/m/m.gguf", "-c", "4096", "-ctk", "q8_0",
                            "--no-mmap", "-np", "2"])
    del data["ranges"]["short"]["verified"], data["ranges"]["short"]["variant"]
    got = checked(data, "test")
    r = got.ranges["short"]
    assert r.verified is None and r.verified_shape is None and got.exhaustive is None
    assert (r.variant.ubatch, r.variant.fa, dict(r.variant.env), r.variant.kv) == (None, None, {}, None)
    assert got.to_json()["ranges"]["short"]["variant"] == {}  # as the schema read a missing variant
    assert "exhaustive" not in got.to_json()  # not stored: not shown
    cpu = SimpleNamespace(gpu=False)
    shape, env = verified_shape(r, cpu)
    # the shape tune would have checked (llama.cpp's micro-batch, flash attention off), and what
    # its command serves: -ctk, --no-mmap, -np
    assert (shape.ctx, shape.ubatch, shape.fa, shape.ngl, shape.kv, shape.load, shape.parallel, env) == (
        4096, 512, False, None, "q8_0", "read", 2, {})
    # verified at ctx/ub/fa/ngl only: the stored shape, its serving dimensions from the command
    data["ranges"]["short"]["verified"] = {"shape": {"ctx": 4096, "ubatch": 256, "fa": True, "ngl": 99}}
    r = checked(data, "test").ranges["short"]
    assert not r.verified_shape.serving_known and r.verified_shape.kv is None
    shape, _ = verified_shape(r, cpu)
    assert shape.to_json() == {"ctx": 4096, "ubatch": 256, "fa": True, "ngl": 99, "kv": "q8_0", "load": "read",
                               "parallel": 2}


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d.update(exhaustive="yes"), "field exhaustive: 'yes' is not true or false"),
    (lambda d: d["ranges"]["short"]["variant"].update(fa="on"), "field ranges.short.variant.fa: 'on' is not"),
    (lambda d: d["ranges"]["short"]["figures"][0].update(n=-1), "field ranges.short.figures[0].n: -1 is not"),
    (lambda d: d["ranges"]["short"]["verified"].update(shape={"ubatch": 512}), "ranges.short.verified.shape.ctx is missing"),
])
def test_a_hand_edited_row_is_still_one_line_naming_the_field(tuned, capsys, edit, field):
    edit(tuned)
    with Store() as s:
        s.add_preset("m", SHA, 7, tuned)
    for argv in (["preset", "show", SHA, "--json"], ["preset", "history", SHA, "--json"], ["serve", SHA, "--dry-run"]):
        assert cli.main(argv) == 11, argv
        line = one_error_line(capsys)
        assert "preset 1 (table presets: m version 1)" in line and field in line, (argv, line)


def test_a_value_made_in_code_says_its_fields_then_what_it_keeps():
    model = PresetModel(name="m", sha256=SHA, path="m.gguf", extra={"alias": "x"})
    assert list(model.to_json().items()) == [("name", "m"), ("sha256", SHA), ("path", "m.gguf"), ("alias", "x")]
