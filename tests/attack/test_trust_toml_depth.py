"""Attack tests (issue 32): TOML nested thousands of levels deep (`x = [[[[...]]]]`) is refused by
every reader as the TOML error it already reports for a syntax error — one line, the surface's
own exit code — never a RecursionError let through as exit 70 "internal error".  A build's
manifest under the data dir that cannot be read is left out with a warning, as any other
manifest rocforge did not write, so one such file does not break `rocforge env` at every shell
start-up."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from trust_helpers import one_error, rocforge, run

from rocforge_build import toml_subset

# Python's recursion limit is 1000 frames and tomllib spends more than one frame a level
DEEP = "x = " + "[" * 3000 + "]" * 3000 + "\n"


def test_the_subset_reader_refuses_deep_arrays_as_outside_its_subset():
    """Outside the subset means "ask tomllib", whose error the caller words."""
    with pytest.raises(toml_subset.Unsupported):
        toml_subset.loads(DEEP)
    shallow = "x = " + "[" * 3 + "1" + "]" * 3 + "\n"
    assert toml_subset.loads(shallow) == {"x": [[[1]]]}


def test_tomllib_parse_turns_deep_nesting_into_a_toml_error():
    with pytest.raises(tomllib.TOMLDecodeError, match="nested too deeply"):
        toml_subset.tomllib_parse(DEEP)
    assert toml_subset.tomllib_loads(DEEP) is None
    assert toml_subset.tomllib_parse('a = [[1], ["b"]]') == {"a": [[1], ["b"]]}


@pytest.mark.parametrize("argv", [["env"], ["doctor"], ["config", "list"]])
def test_a_deep_config_file_is_one_config_error(argv, capsys):
    config = Path(os.environ["ROCFORGE_CONFIG_DIR"]) / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(DEEP, encoding="utf-8")
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(errors) == 1 and "config.toml" in errors[0] and "nested too deeply" in errors[0]


def test_a_deep_build_manifest_is_left_out_of_env_with_a_warning():
    """`rocforge env` as a shell runs it: a child process, its own fast path."""
    build = Path(os.environ["ROCFORGE_DATA_DIR"]) / "builds" / "deep-cpu"
    build.mkdir(parents=True)
    (build / "rocforge-manifest.toml").write_text(DEEP, encoding="utf-8")
    res = rocforge("env")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    warned = [line for line in res.stderr.splitlines()
              if line.startswith("rocforge: warning:") and "deep-cpu" in line]
    assert len(warned) == 1 and "left out" in warned[0], res.stderr


def test_a_deep_build_manifest_does_not_break_doctor(capsys):
    build = Path(os.environ["ROCFORGE_DATA_DIR"]) / "builds" / "deep-cpu"
    build.mkdir(parents=True)
    (build / "rocforge-manifest.toml").write_text(DEEP, encoding="utf-8")
    code, _, err = run(capsys, "doctor")
    assert code in (0, 1) and "internal error" not in err, err


@pytest.mark.parametrize("argv", [["recipe", "show"], ["build", "--dry-run"]])
def test_a_deep_recipe_is_one_invalid_toml_error(argv, tmp_path):
    recipe = tmp_path / "deep.toml"
    recipe.write_text(DEEP, encoding="utf-8")
    line = one_error(rocforge(*argv, str(recipe)))
    assert "invalid TOML" in line and "nested too deeply" in line
