"""Recipe loading and validation: every error names the recipe and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildfixtures import RECIPE

from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.forge import recipes

MINIMAL = """
[recipe]
name = "demo"
[source]
git = "https://example.invalid/demo.git"
ref = "v1"
[backends.cpu]
toolchain = "host"
"""


def load(tmp_path: Path, text: str) -> recipes.Recipe:
    (tmp_path / "recipes").mkdir(exist_ok=True)
    p = tmp_path / "recipes" / "demo.toml"
    p.write_text(text)
    return recipes.load(str(p))


def error(tmp_path, text) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    return exc.value


def test_packaged_recipes_load():
    assert "llama-cpp" in recipes.available()
    r = recipes.load("llama-cpp")
    assert list(r.backends) == ["hip", "rocwmma", "vulkan", "cpu"]
    assert r.source.subdir == "vendor/llama.cpp" and len(r.source.sha256) == 64
    assert all(rule.get("reason") for rule in r.of("option"))  # every choice says why
    assert r.patches_dir.name == "llama-cpp" and (r.patches_dir / "gfx1151-fattn-wmma-stub.patch").is_file()


def test_recipe_by_path():
    assert recipes.load(str(RECIPE)).name == "fixture"


def test_minimal_recipe(tmp_path):
    r = load(tmp_path, MINIMAL)
    assert r.name == "demo" and r.backends["cpu"].toolchain == "host"


def test_unknown_key_with_suggestion(tmp_path):
    e = error(tmp_path, MINIMAL + '[[option]]\nname = "X"\nvalue = true\nreasn = "typo"\n')
    assert e.message == "recipe demo: option[0] (X): unknown key 'reasn'"
    assert e.hint == "did you mean 'reason'?"
    e = error(tmp_path, MINIMAL.replace('ref = "v1"', 'ref = "v1"\nsubdri = "x"'))
    assert "recipe demo: source: unknown key 'subdri'" in e.message and "'subdir'" in e.hint


def test_unknown_condition_key(tmp_path):
    e = error(tmp_path, MINIMAL + '[[option]]\nname = "X"\nvalue = true\nreason = "r"\nwhen = { targte = "gfx1151" }\n')
    assert e.message == "recipe demo: option[0] (X).when: unknown condition key 'targte'"
    assert e.hint == "did you mean 'target'?"


def test_bad_values(tmp_path):
    e = error(tmp_path, MINIMAL + '[[option]]\nname = "X"\nvalue = true\nreason = "r"\nwhen = { rocm = "seven" }\n')
    assert "recipe demo: option[0] (X).when.rocm" in e.message and "version range" in e.message
    e = error(tmp_path, MINIMAL.replace('toolchain = "host"', 'toolchain = "cuda"'))
    assert "recipe demo: backends.cpu.toolchain" in e.message
    e = error(tmp_path, MINIMAL + '[[default]]\nbackend = "gpu"\nreason = "r"\n')
    assert "recipe demo: default[0] (gpu).backend" in e.message
    e = error(tmp_path, MINIMAL + '[[option]]\nname = "X"\nreason = "r"\n')
    assert e.message == "recipe demo: option[0] (X): missing required key 'value'"
    e = error(tmp_path, MINIMAL + '[[option]]\nname = 5\nvalue = true\nreason = "r"\n')
    assert "option[0]" in e.message and ".name: must be str" in e.message
    e = error(tmp_path, MINIMAL + '[[patch]]\nfile = "nope.patch"\nreason = "r"\n')
    assert "recipe demo: patch[0] (nope.patch).file: nope.patch not found" in e.message


def test_source_rules(tmp_path):
    e = error(tmp_path, MINIMAL.replace('git = "https://example.invalid/demo.git"\nref = "v1"',
                                        'url = "https://example.invalid/demo.tar.gz"'))
    assert "source.sha256: required" in e.message
    e = error(tmp_path, MINIMAL.replace('ref = "v1"\n', ""))
    assert "source.ref: required" in e.message
    e = error(tmp_path, "[recipe]\nname = 'demo'\n[source]\nsubdir = 'x'\n[backends.cpu]\ntoolchain = 'host'\n")
    assert "needs `git`" in e.message


def test_invalid_toml_names_the_file(tmp_path):
    e = error(tmp_path, "[recipe\n")
    assert "recipe demo" in e.message and "invalid TOML" in e.message


def test_unknown_recipe_name_suggests():
    with pytest.raises(UsageError) as exc:
        recipes.load("llama-ccp")
    assert exc.value.hint == "did you mean llama-cpp?"
