"""`rocforge recipe list|show` and the older spelling `rocforge recipes`: the alias answers exactly
as `recipe list` does (stdout, stderr, exit code), and `--help` shows both spellings."""

from __future__ import annotations

import json

import pytest
from test_commands_env import cli

# the packaged recipes and their backends, as recipes/*.toml declare them
KNOWN = {"llama-cpp": ["hip", "rocwmma", "vulkan", "cpu"], "hipblaslt": ["hip"],
         "rocblas": ["hip"], "aotriton": ["hip"]}


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_recipes_is_recipe_list(tmp_path, extra):
    new = cli(tmp_path, "recipe", "list", *extra)
    old = cli(tmp_path, "recipes", *extra)
    assert (new.returncode, new.stdout, new.stderr) == (0, old.stdout, old.stderr)
    assert old.returncode == 0 and old.stderr == ""
    if extra:
        listed = {r["name"]: r["backends"] for r in json.loads(new.stdout)}
        assert {name: listed.get(name) for name in KNOWN} == KNOWN
    else:
        line = next(ln for ln in new.stdout.splitlines() if ln.startswith("llama-cpp "))
        assert "hip, rocwmma, vulkan, cpu" in line


def test_a_bad_argument_is_one_error_line_either_way(tmp_path):
    new = cli(tmp_path, "recipe", "list", "--jsno")
    old = cli(tmp_path, "recipes", "--jsno")
    assert new.returncode == old.returncode == 2
    for out in (new, old):
        assert out.stdout == "" and "--jsno: did you mean --json?" in out.stderr
        assert [ln for ln in out.stderr.splitlines() if ln.startswith("rocforge: error:")] \
            == out.stderr.splitlines()[:1]


def test_recipe_show_prints_one_recipe(tmp_path):
    out = cli(tmp_path, "recipe", "show", "llama-cpp")
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.startswith("llama-cpp: ") and "GGML_HIP_ROCWMMA_FATTN = ON" in out.stdout
    shown = json.loads(cli(tmp_path, "recipe", "show", "llama-cpp", "--json").stdout)
    listed = json.loads(cli(tmp_path, "recipes", "--json").stdout)
    assert {r["name"]: r["path"] for r in listed}["llama-cpp"] == shown["path"]


def test_an_unknown_recipe_is_one_error_line_naming_the_list(tmp_path):
    out = cli(tmp_path, "recipe", "show", "no-such-recipe")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["rocforge: error: unknown recipe 'no-such-recipe'",
                                       "rocforge: hint: see `rocforge recipe list`"]


def test_help_lists_both_spellings(tmp_path):
    top = cli(tmp_path, "--help")
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in top.stdout.splitlines()
            if ln.startswith("    ") and len(ln.split()) > 1}
    assert rows["recipe"] == "list the build recipes; show one"
    assert rows["recipes"] == "alias of `rocforge recipe list`"
    recipe = cli(tmp_path, "recipe", "--help")
    assert recipe.returncode == 0
    assert "list      list the build recipes (also spelled `rocforge recipes`)" in recipe.stdout
    assert "show      show a recipe" in recipe.stdout
