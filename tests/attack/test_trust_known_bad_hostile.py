"""Hostile `[[known_bad]]` tables in a user's recipe file (forge/recipes.py `_parse_known_bad`,
measure/known_bad.py): every wrong type, bound, unknown key or condition is one ConfigError naming
the entry; and a build's faults are named only from the packaged recipe of its name, never from a
recipe file that calls itself llama-cpp (held: these attacks found nothing)."""

from __future__ import annotations

import pytest
from buildfixtures import recipe_copy

from rocforge_build.errors import ConfigError
from rocforge_build.forge import recipes
from rocforge_build.measure import known_bad

GOOD = 'when = {backend = "cpu"}\nfa = true\nsymptom = "s"\nseen = "s"\nevidence = ["e"]\n'


@pytest.mark.parametrize("entry, field", [
    ('when = "rm -rf ~"\nfa = true\nsymptom = "s"\nseen = "s"\nevidence = ["e"]\n', "when"),
    (GOOD.replace("fa = true", 'fa = "yes"'), "fa"),
    (GOOD + "parallel_min = 1e400\n", "parallel_min"),
    (GOOD + "parallel_min = 99999999999999999999\n", "parallel_min"),
    (GOOD + "cells_over = -1\n", "cells_over"),
    (GOOD + "cells_over = true\n", "cells_over"),
    (GOOD.replace('symptom = "s"', 'symptom = "s\\nrocforge: PASSED"'), "symptom"),
    (GOOD.replace('evidence = ["e"]', "evidence = [1]"), "evidence"),
    (GOOD + 'run = "rm -rf ~"\n', "run"),
    (GOOD.replace('{backend = "cpu"}', '{source_version = ".*(a+)+$"}'), "source_version"),
    (GOOD.replace('{backend = "cpu"}', '{any = [{backend = "cpu"}]}'), "any"),
    (GOOD.replace('{backend = "cpu"}', '{file = "/etc/passwd"}'), "file"),
    ('when = {backend = "cpu"}\nsymptom = "s"\nseen = "s"\nevidence = ["e"]\n', "names no shape"),
    (GOOD.replace('symptom = "s"', 'symptom = "' + "x" * 100_000 + '"'), "symptom"),
])
def test_a_hostile_known_bad_entry_is_one_config_error(tmp_path, entry, field):
    path = recipe_copy(tmp_path / "r")
    path.write_text(path.read_text() + "\n[[known_bad]]\n" + entry)
    with pytest.raises(ConfigError) as err:
        recipes.load(str(path))
    assert "known_bad[0]" in err.value.message and field in err.value.message
    assert len(err.value.message) < 400 and "\n" not in err.value.message


def test_a_recipe_file_calling_itself_llama_cpp_names_no_fault_of_a_build(tmp_path):
    """A build made from ./llama-cpp.toml records the name llama-cpp: its faults come from the
    packaged recipe alone, so a user's file cannot make verify or serve call a shape condemned."""
    manifest = {"recipe": {"name": "llama-cpp", "file": str(tmp_path / "llama-cpp.toml")},
                "backend": "cpu", "target": "", "source": {"version": "0.3.36"}}
    assert known_bad.find(manifest, True, 1, 10) is None  # the packaged entries: vulkan only
    manifest["recipe"]["name"] = "mine"
    assert known_bad.find(manifest, False, 8, 10 ** 9) is None
