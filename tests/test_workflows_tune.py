"""tune's session (workflows/tune.py): which candidate builds it measures, and what it answers.

tune never rebuilds the user's build at the default prefix with its own plan (issue 38 item 4):
a build of another plan there is left byte for byte, and tune's own candidate goes under
`<builds>/tune/`.  A backend the recipe lacks, a range data/tune.toml does not know and a tune
that stored nothing are each one line, before anything is built where they can be."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from upgrade_history import history, rocforge

from rocforge_build import paths
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import UsageError
from rocforge_build.rootfs import Root
from rocforge_build.workflows import tune as tune_workflow


def hashes(top: Path) -> dict[str, str]:
    """Every file below `top` (links by their target) with its sha256: the bytes, not the names."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def users_build(tmp_path):
    """The fixture project built by `rocforge build` at its default prefix (all its programs):
    (the recipe, the prefix, the backend build chose)."""
    h = history(tmp_path)
    res = rocforge("build", str(h.recipe), "--target", "gfx1151", "--no-recheck")
    assert res.returncode == 0, res.stderr
    users = [p for p in paths.builds_prefix().iterdir() if p.name != "tune"]
    assert len(users) == 1, users
    return h.recipe, users[0], read_manifest(users[0])["backend"]


def tune_args(recipe, backend, **asked) -> tune_workflow.Candidates:
    """The candidates of `backend`'s build of `recipe` for gfx1151, as `rocforge tune` asks."""
    return tune_workflow.Candidates(recipe=str(recipe), target="gfx1151", rootfs=Root("/"),
                                    backends=(backend,), **asked)


@pytest.mark.parametrize("has_them", [True, False])
def test_tune_never_rebuilds_the_users_build(tmp_path, monkeypatch, has_them):
    """tune's plan builds only the measuring programs (here the fixture's fixture-hello, standing
    for llama-bench and llama-perplexity).  When the user's build has every program tune runs it is
    the candidate as it is; when it lacks one, tune builds its own at `<builds>/tune/<name>`.
    Either way every byte of the user's prefix is as it was (tune once rebuilt it with its plan)."""
    recipe, prefix, backend = users_build(tmp_path)
    before = hashes(prefix)
    monkeypatch.setattr(tune_workflow, "MEASURE_TARGETS", ("fixture-hello",))
    monkeypatch.setattr(tune_workflow, "TUNE_NEEDS", ("fixture-hello",) if has_them else ("llama-bench",))
    said = []
    builds, skipped = tune_workflow.candidates(tune_args(recipe, backend), said.append, quiet=True)
    assert skipped == [] and len(builds) == 1
    assert hashes(prefix) == before
    own = paths.builds_prefix() / "tune" / prefix.name
    if has_them:
        assert builds[0].prefix == prefix.resolve() and not own.exists()
    else:
        assert builds[0].prefix == own.resolve()
        assert (own / "bin" / "fixture-hello").is_file() and not (own / "bin" / "fixture-extra").exists()
        assert any(str(own) in line for line in said), said


def test_a_backend_the_recipe_lacks_is_one_line_before_anything_is_planned(tmp_path):
    """`--backends hip,cuda`: the recipe's backends are named, and no backend was planned or
    built (the refusal comes before the first plan: nothing under the builds directory)."""
    said = []
    asked = tune_workflow.Candidates(recipe="llama-cpp", target="gfx1151", rootfs=Root(tmp_path),
                                     backends=("hip", "cuda"))
    with pytest.raises(UsageError) as err:
        tune_workflow.candidates(asked, said.append, quiet=True)
    assert err.value.message == "recipe llama-cpp has no backend cuda"
    assert err.value.hint == "backends: hip, rocwmma, vulkan, cpu"
    assert said == [] and not paths.builds_prefix().exists()


@pytest.mark.parametrize("contexts", ["short,lnog", ",", ""])
def test_an_unknown_or_empty_range_is_refused_with_the_known_ones(contexts):
    with pytest.raises(UsageError) as err:
        tune_workflow.wanted_ranges(contexts, 512, 128)
    assert err.value.message == f"--contexts {contexts!r}: known ranges are short, long"


def test_the_ranges_are_kept_in_the_order_asked():
    # data/tune.toml: short at depth 0 in a 4096 context, long at depth 16384 in 32768
    assert tune_workflow.wanted_ranges(" long, short ,", 0, 128) == (
        tune_workflow.ContextRange("long", 16384, 32768), tune_workflow.ContextRange("short", 0, 4096))
    with pytest.raises(UsageError, match="both 0: there is nothing to measure"):
        tune_workflow.wanted_ranges("short", 0, 0)


def _outcome(**changed) -> tune_workflow.Outcome:
    fields = {"run": 7, "skipped": [], "candidates": [], "rejected": [], "preset": None,
              "ranges": {"short": 0, "long": 32768}, "model_path": Path("/m.gguf"), "gated_in": 1}
    return tune_workflow.Outcome(**{**fields, **changed})


def test_the_json_document_is_the_summary_in_its_order():
    """`rocforge tune --json` prints exactly these keys in this order (scripts read them)."""
    assert list(_outcome().to_json()) == ["run", "skipped", "candidates", "rejected", "preset"]


def test_why_nothing_was_stored():
    """No candidate through the gate; gated in but nothing finished; every ranked variant of a
    range refused at its shape (with the first refusal's verify command line in full)."""
    assert _outcome(gated_in=0).nothing_stored().message == (
        "no candidate passed the verify gate; no preset was made")
    unfinished = _outcome().nothing_stored()
    assert unfinished.message.startswith("no variant finished its runs")
    assert unfinished.hint == "see `rocforge results show 7` for the failed runs"
    shape = {"ctx": 4096, "ubatch": 512, "fa": True}
    refused = {"range": "long", "variant_label": "ub512 fa1", "prefix": "/b", "shape": shape, "env": {}}
    err = _outcome(rejected=[refused]).nothing_stored()
    assert err.message.startswith("no preset was made: short: no variant finished its runs")
    assert "long: every ranked variant failed verify at the range's own shape (long: ub512 fa1 of /b at" in err.message
    assert "/m.gguf" in err.hint
