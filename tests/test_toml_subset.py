"""`toml_subset` reads rocforge's data files as tomllib does, and leaves everything else to it:
for any text, its answer is tomllib's or `Unsupported` (never another value, never a value
where tomllib finds an error)."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from rocforge_build import resources, toml_subset
from rocforge_build.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
DATA = sorted((REPO / "rocforge_build" / "data").glob("*.toml"))
OTHER = sorted([*(REPO / "containers").rglob("*.toml"), *(REPO / "recipes").rglob("*.toml")])
# read at every uncached `rocforge env`: the subset must cover them, or tomllib is back
ENV_PATH = ("targets.toml", "layouts.toml", "defaults.toml", "host.toml")


def agrees(text: str) -> bool:
    """True when the subset reads `text`, False when it leaves it to tomllib; fails the test
    when it reads something else than tomllib, or reads what tomllib refuses."""
    try:
        want = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        want = None
    try:
        got = toml_subset.loads(text)
    except toml_subset.Unsupported:
        return False
    assert want is not None, f"tomllib refuses, the subset read {got!r}:\n{text}"
    assert got == want and _types(got) == _types(want), text
    return True


def _types(value):
    """The value with every leaf's type: 1 == 1.0 == True in Python, not in TOML."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return (type(value), value)


def test_the_env_paths_data_files_are_inside_the_subset():
    names = {p.name for p in DATA}
    assert set(ENV_PATH) <= names
    for path in DATA:
        read = agrees(path.read_text(encoding="utf-8"))
        assert read or path.name not in ENV_PATH, f"{path.name} needs tomllib again"


@pytest.mark.parametrize("path", OTHER, ids=lambda p: str(p.relative_to(REPO)))
def test_other_toml_files_of_the_repository(path):
    agrees(path.read_text(encoding="utf-8"))


INSIDE = [
    "", "# only a comment\n", "a = 1", "a = -0\nb = +7\nc = 0\n", "a = 0x83\nb = 0xDEADbeef",
    "a = 4.0\nb = -0.0\nc = 1228.8\nd = +0.5", "a = true\nb = false", 'a = "x # y" # c',
    "a = 'C:\\path\\n \"q\"'", 'a = "tab\there, unicode é €"', "a = []\nb = [ ]",
    "a = [1, 2,]\nb = [\n  'x',  # one\n  # a comment line\n  'y'\n]\n", "a = [[1, 2], ['x']]",
    "[t]\nk = 1\n[t.u]\nk = 2\n[ v . w ]\n", "[a.b]\nx = 1\n[a]\ny = 2\n", "[a-b.c_d.9]\nk=1",
    "x=1#c\n[t]#c\ny = 'v'#c", "k = \"\u0085 C1 control is allowed\"",
]

OUTSIDE_VALID = [  # valid TOML the subset leaves to tomllib
    'a = "esc\\"aped"', 'a = """multi\nline"""', "a = '''lit'''", "a.b = 1", '"q" = 1',
    "a = {x = 1}", "[[t]]\nx = 1", "a = 1979-05-27", "a = 1e5", "a = 1_000", "a = inf",
    "a = nan", "a = 0o17", "a = 0b1", "a = 1\r\nb = 2", "[\"q\"]\nx = 1", "a = 'x' \r\n",
]

INVALID = [  # invalid TOML: the subset must never give a value
    "a = 1\na = 2", "[t]\n[t]", "a = 1\n[a]", "[a]\nb = 1\n[a.b]", "[a.b.c]\n[a]\nb = 1",
    "a = ", "= 1", "a", "a = 01", "a = 1.", "a = .5", "a = +0x1", "a = 0X1", "a = 0x",
    "a = [1 2]", "a = [1,,2]", "a = [,]", "a = [1", "a = 'x", 'a = "x', "a = 1 2", "a = x",
    "a = True", "[a", "[a] b", "[]", "[a..b]", "[a b]", "a b = 1", "a = 'x' 'y'",
    "a = 'nul \x00'", "# comment with \x01", "a = \"\x7f\"", "a = 1 # \x1f", "é = 1",
]


@pytest.mark.parametrize("text", INSIDE)
def test_inside_the_subset_as_tomllib(text):
    assert agrees(text), text


@pytest.mark.parametrize("text", OUTSIDE_VALID + INVALID)
def test_outside_the_subset_is_left_to_tomllib(text):
    assert not agrees(text), text


def test_mutated_data_files_never_disagree_with_tomllib():
    """Seeded random edits of excerpts of the data files: whatever the subset reads, tomllib
    reads the same; whatever tomllib refuses, the subset leaves alone."""
    rng = random.Random(24)
    alphabet = list("\"'[]{}=#,.\\\n\t -+_x0159eE:aTZ\r\x00\x7f\u2028é")
    read = left = 0
    for path in DATA:
        lines = path.read_text(encoding="utf-8").split("\n")
        for _ in range(300):
            start = rng.randrange(len(lines))
            text = "\n".join(lines[start:start + rng.randint(1, 15)])
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(len(text) + 1)
                edit = rng.random()
                if edit < 0.4:
                    text = text[:pos] + rng.choice(alphabet) + text[pos:]
                elif edit < 0.8:
                    text = text[:pos] + text[pos + 1:]
                else:
                    text = text[:pos] + "\n" + text[pos:]
            if agrees(text):
                read += 1
            else:
                left += 1
    assert read > 300 and left > 300  # both sides of the line were exercised


def test_load_toml_falls_back_to_tomllib_and_its_errors(tmp_path):
    doctor = REPO / "rocforge_build" / "data" / "doctor.toml"  # inline tables: tomllib's
    assert resources.load_toml(doctor, "doctor") == tomllib.loads(doctor.read_text())
    bad = tmp_path / "bad.toml"
    bad.write_text("a = 1\na = 2\n")
    with pytest.raises(ConfigError, match="bad.toml is unreadable: Cannot overwrite a value"):
        resources.load_toml(bad, "test data")
    with pytest.raises(ConfigError, match="missing.toml is unreadable"):
        resources.load_toml(tmp_path / "missing.toml", "test data")
