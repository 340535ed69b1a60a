"""forge/backend_choice.py on its own: a recipe parsed from text and facts made by hand (no
source, no toolchain detection), so each answer below follows from the rules as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocforge_build.errors import ToolchainError, UsageError
from rocforge_build.forge import conditions, recipes
from rocforge_build.forge.backend_choice import (
    BackendChoice,
    backend_without_source,
    check_before_fetch,
    choose_backend,
    possible_backends,
)
from rocforge_build.forge.toolchains import Toolchain

RECIPE = """
[recipe]
name = "choice"
[source]
git = "file:///nonexistent/x.git"
ref = "v1"
[backends.fast]
toolchain = "hip"
[backends.plain]
toolchain = "host"
[[default]]
backend = "fast"
when = { target = "gfx1151", cmake_option = "FAST" }
reason = "gfx1151 gets the fast path where the tree has it"
evidence = ["owner/x #1: 2x faster"]
[[default]]
backend = "plain"
reason = "everything else"
[[stop]]
message = "gfx900 is not supported"
when = { target = "gfx900" }
hint = "use a newer GPU than {target}"
"""


def _recipe(tmp_path: Path) -> recipes.Recipe:
    return recipes.parse(RECIPE, tmp_path / "choice.toml")


def _facts(target: str, tree: Path | None):
    """facts_for(backend): the target given; the source read from `tree` (None: not read)."""
    source = conditions.SourceFacts(tree) if tree else None
    return lambda backend: conditions.Facts(target=target, backend=backend, source=source,
                                            host=conditions.HostFacts(), toolchain_found=True)


def _tree(tmp_path: Path, with_fast: bool) -> Path:
    tree = tmp_path / ("fast" if with_fast else "plain")
    tree.mkdir()
    option = 'option(FAST "the fast path" OFF)\n' if with_fast else ""
    (tree / "CMakeLists.txt").write_text(f"cmake_minimum_required(VERSION 3.20)\nproject(x NONE)\n{option}")
    return tree


def test_the_first_default_that_holds_chooses(tmp_path):
    recipe = _recipe(tmp_path)
    assert choose_backend(recipe, None, _facts("gfx1151", _tree(tmp_path, True))) == BackendChoice(
        "fast", "gfx1151 gets the fast path where the tree has it", (), ("owner/x #1: 2x faster",))
    assert choose_backend(recipe, None, _facts("gfx1151", _tree(tmp_path, False))) == \
        BackendChoice("plain", "everything else")  # the tree has no FAST option
    assert choose_backend(recipe, None, _facts("gfx1100", None)) == BackendChoice("plain", "everything else")


def test_backend_asked_for_wins_and_an_unknown_one_is_refused_with_a_suggestion(tmp_path):
    recipe = _recipe(tmp_path)
    assert choose_backend(recipe, "plain", _facts("gfx1151", None)) == \
        BackendChoice("plain", "asked for with --backend")
    with pytest.raises(UsageError) as exc:
        choose_backend(recipe, "fats", _facts("gfx1151", None))
    assert exc.value.hint == "did you mean fast?"


def test_before_the_source_is_read_the_choice_names_what_the_fetch_decides(tmp_path):
    """gfx1151: `fast` if the tree declares FAST (unknown until it is read), else `plain`."""
    recipe = _recipe(tmp_path)
    choice = backend_without_source(recipe, None, _facts("gfx1151", None))
    assert (choice.name, choice.alternatives) == ("fast", ("plain",))
    assert "decided after the fetch" in choice.reason and "the source declares FAST" in choice.reason
    assert choice.evidence == ("owner/x #1: 2x faster",)  # the candidates' it names
    assert possible_backends(recipe, None, _facts("gfx1151", None)) == ["fast", "plain"]
    # another target: the first rule fails whatever the tree says, so nothing is left open
    assert backend_without_source(recipe, None, _facts("gfx1100", None)) == \
        BackendChoice("plain", "everything else")


def test_before_the_fetch_a_stop_or_no_toolchain_at_all_stops_the_build(tmp_path):
    recipe = _recipe(tmp_path)
    found = {"hip": Toolchain("hip", missing="no ROCm", hint="install one"), "host": Toolchain("host")}
    with pytest.raises(ToolchainError) as exc:
        check_before_fetch(recipe, None, _facts("gfx900", None), found.__getitem__)
    assert exc.value.message == "gfx900 is not supported (target gfx900 is gfx900)"
    assert exc.value.hint == "use a newer GPU than gfx900"
    # gfx1151 may still build `plain` without ROCm: no stop before the fetch
    check_before_fetch(recipe, None, _facts("gfx1151", None), found.__getitem__)
    with pytest.raises(ToolchainError, match="no ROCm"):  # asked for the one that lacks it
        check_before_fetch(recipe, "fast", _facts("gfx1151", None), found.__getitem__)
