"""A recipe's values are trusted by nothing that prints or runs them: every text of it is one plain
line of bounded length, every list holds items of its declared type, every integer is in its range,
and a CMake target name (a recipe's `[build] targets`, `--cmake-target`) is a name, never an
option of ninja's; each refused at load or parse time in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from buildfixtures import RECIPE, project_copy

from rocforge_build import argtypes, cli
from rocforge_build.errors import BuildError, ConfigError
from rocforge_build.forge import pipeline, recipes

HEAD = """
[recipe]
name = "demo"
description = "{description}"
[source]
git = "https://example.invalid/demo.git"
ref = "v1"
[backends.cpu]
toolchain = "host"
"""

# every rule kind with its texts, each `{text}` where the attacker's string goes
RULES = {
    "default[0].reason": '[[default]]\nbackend = "cpu"\nreason = "{text}"\n',
    "option[0].reason": '[[option]]\nname = "A"\nvalue = "1"\nreason = "{text}"\n',
    "option[0].name": '[[option]]\nname = "{text}"\nvalue = "1"\nreason = "r"\n',
    "option[0].value": '[[option]]\nname = "A"\nvalue = "{text}"\nreason = "r"\n',
    "option[0].value[1]": '[[option]]\nname = "A"\nvalue = ["x", "{text}"]\nreason = "r"\n',
    "option[0].evidence[0]": '[[option]]\nname = "A"\nvalue = "1"\nreason = "r"\n'
                             'evidence = ["{text}"]\n',
    "env[0].reason": '[[env]]\nname = "A"\nvalue = "1"\nreason = "{text}"\n',
    "output[0].path": '[[output]]\npath = "{text}"\nreason = "r"\n',
    "jobs[0].reason": '[[jobs]]\nmemory_mb = 100\nreason = "{text}"\n',
    "note[0].message": '[[note]]\nmessage = "{text}"\n',
    "stop[0].message": '[[stop]]\nwhen = { target = "gfx900" }\nmessage = "{text}"\n',
    "stop[0].when.target": '[[stop]]\nwhen = { target = "{text}" }\nmessage = "m"\n',
    "recipe.description": "",
}

# what a terminal or a line reader takes as a line's end or a control: splitlines' breaks, C0
# controls, DEL, C1 controls (U+009B is a one-byte CSI), the bidi controls that reorder a line
CONTROLS = ["\n", "\r", "\0", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1b", "\x08", "\x7f",
            "\x85", "\x80", "\x9b", "\x9f", "\u2028", "\u2029", "\u202a", "\u202e", "\u2066",
            "\u2069"]


def toml_string(text: str) -> str:
    """`text` inside a TOML basic string, every character below U+0020 or in CONTROLS escaped."""
    return "".join(f"\\u{ord(c):04X}" if c in CONTROLS or ord(c) < 0x20 else c for c in text)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "recipes").mkdir(exist_ok=True)
    path = tmp_path / "recipes" / "demo.toml"
    path.write_text(text)
    return path


def recipe_with(key_path: str, text: str) -> str:
    escaped = toml_string(text)
    head = HEAD.replace("{description}", escaped if key_path == "recipe.description" else "d")
    return head + RULES[key_path].replace("{text}", escaped)


def refusal(tmp_path: Path, text: str) -> str:
    """The one-line refusal, without the recipe file's path that a text's refusal names."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        recipes.load(str(path))
    assert "\n" not in exc.value.message
    return exc.value.message.replace(f" ({path})", "")


# -- 1. every text is one plain line ---------------------------------------------------------------

@pytest.mark.parametrize("key_path", sorted(RULES))
@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_control_character_in_any_text_is_refused_naming_its_key(tmp_path, key_path, control):
    message = refusal(tmp_path, recipe_with(key_path, f"ok{control}rocforge: error: forged"))
    assert message == (f"recipe demo: {key_path}: holds U+{ord(control):04X}, a line break or "
                       "terminal control character")


def test_a_control_character_in_a_key_is_refused(tmp_path):
    message = refusal(tmp_path, HEAD.replace("{description}", "d")
                      + '[[note]]\n"a\\u001Bb" = "x"\nmessage = "m"\n')
    assert message == ("recipe demo: note[0]: a key: holds U+001B, a line break or terminal "
                       "control character")


def test_a_forged_reason_is_one_error_line_through_the_cli(tmp_path, capsys):
    path = write(tmp_path, recipe_with("option[0].reason", "\r\x1b[2Krocforge: error: forged"))
    code = cli.main(["recipe", "show", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[1:] == ["rocforge: hint: a recipe's texts are one plain line each"]
    assert err.startswith(f"rocforge: error: recipe demo ({path}): option[0].reason: holds U+000D")
    assert "forged" not in err.replace(str(path), "") and "\x1b" not in err


def test_the_code_a_condition_looks_for_may_span_lines_but_holds_no_control(tmp_path):
    when = 'when = {{ source_contains = {{ file = "f.c", text = "{text}" }} }}\n'
    rule = '[[note]]\nmessage = "m"\n' + when
    head = HEAD.replace("{description}", "d")
    recipe = recipes.load(str(write(tmp_path, head + rule.format(text="a;\\n  b;"))))
    assert recipe.of("note")[0].when["source_contains"]["text"] == "a;\n  b;"
    message = refusal(tmp_path, head + rule.format(text="a\\u001B[2Kb"))
    assert message == ("recipe demo: note[0].when.source_contains.text: holds U+001B, a line "
                       "break or terminal control character")


def test_the_packaged_recipes_hold_no_control_character():
    names = sorted(recipes.available())
    assert names  # the packaged recipes are there to be checked
    for name in names:
        assert recipes.load(name).name == name


# -- 4. every text and evidence list is bounded ----------------------------------------------------

def test_a_text_is_at_most_2000_characters(tmp_path):
    assert recipes.load(str(write(tmp_path, recipe_with("jobs[0].reason", "r" * 2000))))
    message = refusal(tmp_path, recipe_with("jobs[0].reason", "\\\\" * 2001))
    assert message == "recipe demo: jobs[0].reason: 2001 characters, at most 2000"


def test_evidence_holds_at_most_32_items(tmp_path):
    rule = '[[jobs]]\nmemory_mb = 100\nreason = "r"\nevidence = [{items}]\n'
    head = HEAD.replace("{description}", "d")
    items = ", ".join(['"a source"'] * 32)
    assert recipes.load(str(write(tmp_path, head + rule.format(items=items))))
    message = refusal(tmp_path, head + rule.format(items=items + ', "one more"'))
    assert message == "recipe demo: jobs[0].evidence: 33 items, at most 32"


# -- 2. list items have their declared type --------------------------------------------------------

@pytest.mark.parametrize(("table", "key", "value", "problem"), [
    ("build", "targets", "[1]", "build.targets[0]: must be str, got int"),
    ("build", "targets", '["hello", { a = 1 }]', "build.targets[1]: must be str, got dict"),
    ("venv", "packages", '[["numpy"]]', "venv.packages[0]: must be str, got list"),
    ("source", "sparse", "[true]", "source.sparse[0]: must be str, got bool"),
    ("source", "version", '["VERSION"]', "source.version[0]: must be dict, got str"),
])
def test_a_list_item_of_the_wrong_type_is_refused(tmp_path, table, key, value, problem):
    head = HEAD.replace("{description}", "d")
    if table == "source":
        text = head.replace('ref = "v1"', f'ref = "v1"\n{key} = {value}')
    else:
        text = head + f"[{table}]\n{key} = {value}\n" + ('reason = "r"\n' if table == "venv" else "")
    assert refusal(tmp_path, text) == f"recipe demo: {problem}"


def test_a_smoke_command_and_an_option_list_hold_their_types(tmp_path):
    head = HEAD.replace("{description}", "d")
    assert refusal(tmp_path, head + '[[smoke]]\nrun = ["bin/x", 1]\n') == (
        "recipe demo: smoke[0].run[1]: must be str, got int")
    assert refusal(tmp_path, head + '[[option]]\nname = "A"\nvalue = [1.5]\nreason = "r"\n') == (
        "recipe demo: option[0] (A).value[0]: must be str or bool or int, got float")


# -- 3. every integer is in its range --------------------------------------------------------------

@pytest.mark.parametrize("memory_mb", ["0", "-5", "99999999999999999999", "16777217"])
def test_a_jobs_memory_out_of_range_is_refused(tmp_path, memory_mb):
    head = HEAD.replace("{description}", "d")
    message = refusal(tmp_path, head + f'[[jobs]]\nmemory_mb = {memory_mb}\nreason = "r"\n')
    assert message == (f"recipe demo: jobs[0].memory_mb: {int(memory_mb)} is out of range "
                       "(give 1 to 16777216)")


def test_a_jobs_memory_in_range_loads(tmp_path):
    head = HEAD.replace("{description}", "d")
    recipe = recipes.load(str(write(tmp_path, head + '[[jobs]]\nmemory_mb = 16777216\nreason = "r"\n')))
    assert recipe.of("jobs")[0].get("memory_mb") == 2 ** 24


def test_an_option_integer_past_64_bits_is_refused(tmp_path):
    head = HEAD.replace("{description}", "d")
    message = refusal(tmp_path, head + f'[[option]]\nname = "A"\nvalue = {2 ** 63}\nreason = "r"\n')
    assert message == (f"recipe demo: option[0] (A).value: {2 ** 63} is out of range "
                       f"(give {-2 ** 63} to {2 ** 63 - 1})")


# -- 5. a CMake target is a name, never an option of ninja's -----------------------------------------

BAD_TARGETS = ["-C/", "-tclean", "--version", "", " ", "a b", "a\nb", "a;b", "clean", "all",
               "install", "help", "test", "package", "x" * 256, "../x"]


@pytest.mark.parametrize("name", [n for n in BAD_TARGETS if "\n" not in n])  # a break: see 1.
def test_a_recipe_build_target_that_is_no_cmake_name_is_refused(tmp_path, name):
    head = HEAD.replace("{description}", "d")
    message = refusal(tmp_path, head + f'[build]\ntargets = ["ok", {json.dumps(name)}]\n')
    assert message.startswith(f"recipe demo: build.targets[1]: {name!r} ")


@pytest.mark.parametrize("flag", ["--cmake-target", "--build-target"])
@pytest.mark.parametrize("name", BAD_TARGETS)
def test_a_flag_target_that_is_no_cmake_name_is_refused_before_any_plan(tmp_path, capsys, flag,
                                                                         name):
    with pytest.raises(SystemExit) as exc:
        cli.main(["build", str(RECIPE), "--source", str(tmp_path / "none"), "--dry-run",
                  f"{flag}={name}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("rocforge: error: build: argument --cmake-target/--build-target: "
                          f"{name!r} ")
    assert [line for line in err.splitlines() if line.startswith("rocforge: error:")] == [
        err.splitlines()[0]]


def test_a_repeated_target_is_built_once_in_the_order_given(tmp_path, capsys):
    src = project_copy(tmp_path / "src")
    repeats = ["--cmake-target", "greet", "--cmake-target", "fixture-hello"] * 500
    code = cli.main(["build", str(RECIPE), "--source", str(src), "--target", "gfx1100",
                     "--backend", "cpu", "--dry-run", "--json", *repeats])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out)["build"][-2:] == ["greet", "fixture-hello"]
    assert json.loads(out)["build"].count("greet") == 1


def test_more_targets_than_a_build_takes_are_one_line(tmp_path, capsys):
    flags = [f"--cmake-target=t{i}" for i in range(argtypes.CMAKE_TARGETS_MAX + 1)]
    code = cli.main(["build", str(RECIPE), "--source", str(tmp_path / "none"), "--dry-run",
                     *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[0] == "rocforge: error: --cmake-target: 257 targets, at most 256"


def test_targets_asked_for_without_a_file_api_reply_are_refused(tmp_path):
    """ninja is never given a target that was not checked: no reply, no build."""
    plan = SimpleNamespace(build_dir=tmp_path / "build", build_targets=("hello",),
                           recipe=SimpleNamespace(name="demo"))
    with pytest.raises(BuildError) as exc:
        pipeline.check_build_targets(plan)
    assert exc.value.message.startswith("--cmake-target hello: CMake's file API reply is missing")
    no_targets = SimpleNamespace(build_dir=tmp_path / "build", build_targets=(),
                                 recipe=SimpleNamespace(name="demo"))
    assert pipeline.check_build_targets(no_targets) is None  # all targets: nothing to check
