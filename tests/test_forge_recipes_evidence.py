"""A rule's `reason` is one sentence saying why; its `evidence` (upstream issues, figures, other
projects' practice) is a list of one-line strings beside it, refused in one line when it is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_forge_recipes import MINIMAL

from rocforge_build.errors import ConfigError
from rocforge_build.forge import recipes

# an option with its evidence (the plan's tests use it too)
RELEASE_OPTION = """
[[option]]
name = "CMAKE_BUILD_TYPE"
value = "Release"
declared = false
reason = "debug builds are unusably slow"
evidence = ["owner/demo #12: a debug build 10x slower", "owner/other docs/build.md builds Release"]
"""

# the kinds of rule that carry a reason, and so may carry evidence beside it
_REASON_KINDS = ("default", "option", "env", "patch", "depends", "output", "jobs")

# what makes a reason more than one sentence saying why (the check is narrow on purpose: each
# pattern is evidence written into the sentence, never a word a reason needs):
#   an issue or PR reference        "#123"
#   a figure with its unit          "41 %", "384 t/s", "473 MB", "1.25 GB", "28.7 TFLOPS", "8 minutes"
#   a year                          "2025" (a date: when something was seen belongs to its source)
#   a second sentence               ". " then a capital letter
_EVIDENCE_IN_REASON = {
    "an issue reference": re.compile(r"#\d+"),
    "a figure": re.compile(r"\d[\d,.]*\s*(%|t/s|[KMG]i?B\b|TFLOPS|minutes?\b|hours?\b|x\b)"),
    "a year": re.compile(r"\b(19|20)\d\d\b"),
    "a second sentence": re.compile(r"[.!?]\s+[A-Z]"),
}


def evidence_in(reason: str) -> list[str]:
    """What in `reason` is evidence rather than the one sentence saying why."""
    return [what for what, pattern in _EVIDENCE_IN_REASON.items() if pattern.search(reason)]


def load(tmp_path: Path, text: str) -> recipes.Recipe:
    (tmp_path / "recipes").mkdir(exist_ok=True)
    path = tmp_path / "recipes" / "demo.toml"
    path.write_text(MINIMAL + text)
    return recipes.load(str(path))


def refusal(tmp_path: Path, text: str) -> str:
    """The one-line refusal, without the recipe file's path that a text's refusal names."""
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    return exc.value.message.replace(f" ({tmp_path / 'recipes' / 'demo.toml'})", "")


def test_a_rule_with_evidence_loads_and_keeps_it(tmp_path):
    recipe = load(tmp_path, RELEASE_OPTION + '''
[venv]
reason = "the generator runs in Python"
evidence = ["owner/project README: pip install -r requirements.txt"]
''')
    (option,) = recipe.of("option")
    assert option.get("reason") == "debug builds are unusably slow"
    assert option.get("evidence") == ["owner/demo #12: a debug build 10x slower",
                                      "owner/other docs/build.md builds Release"]
    assert recipe.venv["evidence"] == ["owner/project README: pip install -r requirements.txt"]


@pytest.mark.parametrize(("evidence", "problem"), [
    ('"owner/project #12"', "option[0] (CMAKE_BUILD_TYPE).evidence: must be list, got str"),
    ("12", "option[0] (CMAKE_BUILD_TYPE).evidence: must be list, got int"),
    ('["fine", 12]', "option[0] (CMAKE_BUILD_TYPE).evidence[1]: must be a one-line string "
                     "(one source or figure), got int"),
    ('["first line\\nsecond line"]', "option[0].evidence[0]: holds U+000A, a line break or "
                                     "terminal control character"),
    ('["""first\nsecond"""]', "option[0].evidence[0]: holds U+000A, a line break or terminal "
                              "control character"),
    ('["  "]', "option[0] (CMAKE_BUILD_TYPE).evidence[0]: must be a one-line string (one source "
               "or figure), got an empty string"),
])
def test_bad_evidence_is_refused_in_one_line_naming_the_rule(tmp_path, evidence, problem):
    message = refusal(tmp_path, f'''
[[option]]
name = "CMAKE_BUILD_TYPE"
value = "Release"
declared = false
reason = "debug kernels are unusably slow"
evidence = {evidence}
''')
    assert message == f"recipe demo: {problem}"
    assert "\n" not in message


def test_evidence_is_refused_where_no_reason_stands(tmp_path):
    """A stop says its own message; evidence there is an unknown key, as any other would be."""
    message = refusal(tmp_path, '''
[[stop]]
when = { target = "gfx900" }
message = "too old"
evidence = ["owner/project #1"]
''')
    assert message == "recipe demo: stop[0]: unknown key 'evidence'"


@pytest.mark.parametrize(("reason", "found"), [
    ("HIP is the known-good backend: rocWMMA cut prefill by 41 % (llama.cpp #24437)",
     ["an issue reference", "a figure"]),
    ("lhl/strix-halo-testing: pp512 on gfx1151 rose from 332 to 766 t/s with hipBLASLt",
     ["a figure"]),
    ("heaviest CPU translation unit: src/llama-model.cpp, 473 MB peak RSS", ["a figure"]),
    ("1.25 GB leaves room", ["a figure"]), ("the default limit (8 minutes)", ["a figure"]),
    ("the HIP backend switch since Dec 2024", ["a year"]),
    ("examples only cost build time. Older trees keep llama-bench there", ["a second sentence"]),
    ("exactly the requested target, since one arch builds fast and small", []),
    ("min(16, jobs), since Tensile otherwise starts a job per core", []),
    ("works around a ROCm 7 unrolling regression, only for gfx1151 trees", []),
])
def test_the_check_tells_evidence_from_a_reason(reason, found):
    assert evidence_in(reason) == found


def _reasons(recipe: recipes.Recipe):
    for kind in _REASON_KINDS:
        for i, rule in enumerate(recipe.of(kind)):
            yield f"{kind}[{i}]", rule.get("reason")
    if recipe.venv is not None:
        yield "venv", recipe.venv["reason"]


@pytest.mark.parametrize("name", sorted(recipes.available()))
def test_every_packaged_reason_is_one_sentence_without_evidence(name):
    recipe = recipes.load(name)
    inline = {where: evidence_in(reason) for where, reason in _reasons(recipe) if evidence_in(reason)}
    assert inline == {}, f"move these into the rule's `evidence` list: {inline}"


@pytest.mark.parametrize("name", sorted(recipes.available()))
def test_every_packaged_citation_names_its_repository(name):
    """An issue or PR number in evidence says whose: `owner/repo` before its first `#N`."""
    recipe = recipes.load(name)
    rules = [r for kind in _REASON_KINDS for r in recipe.of(kind)]
    items = [e for r in rules for e in r.get("evidence", [])] + (recipe.venv or {}).get("evidence", [])
    bare = [e for e in items if "#" in e and re.search(r"#\d", e)
            and not re.search(r"[\w.-]+/[\w.-]+", e.split("#", 1)[0])]
    assert bare == []
