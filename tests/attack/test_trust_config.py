"""Attack tests (issue 25, config): every numeric key refuses values outside its range, both
through `rocforge config set` and from a hand-edited config.toml: one error line naming the key
and the range, exit 2, the file left as it was.  Booleans, strings and lists are typed.

The ranges below are the evidence, written here from what each key means (the reliability
promises in docs/concepts/reliability.md and the comments of data/defaults.toml), not read from
config.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from rocforge_build import cli, config
from rocforge_build.resources import package_data

# key: (range words the error must show, values inside, values outside)
NUMERIC = {
    # free space asked for is archive x (1 + ratio): 0 = no room for unpacking, negative nonsense
    "nightly.extract_ratio": (["at least 0"], ["0", "3.5"], ["-1", "-0.5", "nan", "inf"]),
    # how many versions `prune` keeps: a count
    "nightly.keep": (["integer", "at least 0"], ["0", "7"], ["-1", "2.5", "nan", str(2 ** 63)]),
    # tries per file: at least the first one
    "download.attempts": (["integer", "at least 1"], ["1", "9"], ["0", "-3", "1.5", "inf"]),
    # seconds; 0 would fail every connection at once; a socket timeout past a day is no timeout
    "download.connect_timeout": (["more than 0", "at most 86400"], ["0.5", "86400"],
                                 ["0", "-1", "nan", "inf", "86401"]),
    "download.read_timeout": (["more than 0", "at most 86400"], ["1", "60.0"],
                              ["0", "-5", "nan", "-inf", "1e9"]),
    # bytes/s; 0 turns the rate check off (docs/concepts/reliability.md)
    "download.min_rate": (["at least 0"], ["0", "1", "1e6"],
                          ["-1", "-0.001", "nan", "inf", str(10 ** 30)]),
    # seconds the rate is averaged over: 0 would divide by zero
    "download.rate_window": (["more than 0", "at most 86400"], ["0.5", "30"], ["0", "-30", "nan", "inf"]),
    # seconds for a whole download: 0 ends every fetch at once; at most a week
    "download.deadline": (["more than 0", "at most 604800"], ["2", "604800"],
                          ["0", "-1", "nan", "inf", "604801"]),
    "download.listing_deadline": (["more than 0", "at most 86400"], ["2", "300"],
                                  ["0", "-1", "nan", "inf", "86401"]),
    # byte counts: a cap of 0 bytes refuses every file
    # and TOML integers are signed 64-bit (toml.io/en/v1.0.0#integer): no more than 2**63 - 1
    "download.max_listing_bytes": (["integer", "at least 1", "at most 9223372036854775807"],
                                   ["1", "1048576", "9223372036854775807"],
                                   ["0", "-1", "1.5", "9223372036854775808",
                                    "99999999999999999999999999"]),
    "download.max_unsized_bytes": (["integer", "at least 1", "at most 9223372036854775807"],
                                   ["1", "68719476736"], ["0", "-1", "2e9", str(2 ** 64)]),
    # remote job slots added to -j; 0 = the scheduler's count
    "build.distribute_jobs": (["integer", "at least 0"], ["0", "16"],
                              ["-1", "0.5", "nan", str(10 ** 30)]),
    # a substitute's layer cap: 0 bytes would refuse every build
    "substitute.max_layer_bytes": (["integer", "at least 1", "at most 9223372036854775807"],
                                   ["1", "68719476736"], ["0", "-1", "2.5", str(2 ** 64)]),
    # seconds a store may take to answer: 0 fails every request, past a day is no deadline
    "substitute.timeout": (["more than 0", "at most 86400"], ["0.5", "30"], ["0", "-1", "nan", "inf", "86401"]),
}

# (key, value) of the wrong type for booleans, strings and lists
WRONG_TYPE = [
    ("nightly.keep_archives", "1", "a boolean"),
    ("nightly.keep_archives", "yes", "a boolean"),
    ("cache.remote_only", "0", "a boolean"),
    ("nightly.platform", "3", "a string"),
    ("nightly.pip.route", "true", "a string"),
    ("nightly.use", "[1, 2]", "a list of strings"),
    ("nightly.keep", "true", "an integer"),
    ("download.min_rate", '"fast"', "a number"),
]


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def _numeric_defaults() -> set[str]:
    """Every numeric leaf of data/defaults.toml (the data, read as TOML)."""
    data = tomllib.loads(Path(package_data("defaults.toml")).read_text())
    out = set()

    def walk(table, prefix):
        for k, v in table.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out.add(prefix + k)

    walk(data, "")
    return out


def test_every_numeric_key_has_a_stated_range_here():
    """A numeric key added to defaults.toml without a row here fails: its range is untested."""
    assert _numeric_defaults() == set(NUMERIC)


def _cases(inside: bool):
    return [(key, value) for key, (_w, good, bad) in NUMERIC.items()
            for value in (good if inside else bad)]


@pytest.mark.parametrize("key,value", _cases(inside=False))
def test_config_set_refuses_out_of_range(capsys, key, value):
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# mine\n")
    # `--`: a value such as -inf is not an option (a user types the same)
    rc, _out, err = _cli(capsys, "config", "set", "--", key, value)
    line = _error_line(err)
    assert rc == 2 and key in line, err
    for words in NUMERIC[key][0]:
        assert words in line or "must be an integer" in line, (words, line)
    assert path.read_text() == "# mine\n"  # nothing written


@pytest.mark.parametrize("key,value", _cases(inside=False))
def test_hand_edited_file_out_of_range_is_refused(capsys, key, value):
    table, leaf = key.rsplit(".", 1)
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"[{table}]\n{leaf} = {value}\n")
    for argv in (("config", "get", key), ("config", "list"), ("nightly", "list")):
        rc, _out, err = _cli(capsys, *argv)
        line = _error_line(err)
        assert rc == 2 and key in line and str(path) in line, (argv, err)
        for words in NUMERIC[key][0]:
            assert words in line or "must be an integer" in line, (words, line)


@pytest.mark.parametrize("key,value", _cases(inside=True))
def test_values_in_range_are_accepted_both_ways(capsys, key, value):
    rc, _out, err = _cli(capsys, "config", "set", key, value)
    assert rc == 0, err
    want = tomllib.loads(f"v = {value}")["v"]
    assert config.get(key) == want
    table, leaf = key.rsplit(".", 1)
    config.config_file().write_text(f"[{table}]\n{leaf} = {value}\n")
    rc, out, err = _cli(capsys, "config", "get", key, "--json")
    assert rc == 0 and float(out) == float(want), err


@pytest.mark.parametrize("key,value,kind", WRONG_TYPE)
def test_wrong_types_are_refused_both_ways(capsys, key, value, kind):
    rc, _out, err = _cli(capsys, "config", "set", key, value)
    line = _error_line(err)
    assert rc == 2 and key in line and f"must be {kind}" in line
    table, leaf = key.rsplit(".", 1)
    literal = value if value not in ("yes",) else '"yes"'
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"[{table}]\n{leaf} = {literal}\n")
    rc, _out, err = _cli(capsys, "config", "get", key)
    line = _error_line(err)
    assert rc == 2 and key in line and f"must be {kind}" in line


def test_the_issue_case_min_rate_minus_one(capsys):
    """`download.min_rate -1` was accepted: a negative rate means nothing (0 turns it off)."""
    rc, _out, err = _cli(capsys, "config", "set", "download.min_rate", "-1")
    line = _error_line(err)
    assert rc == 2 and "download.min_rate must be a finite number at least 0, got -1" in line


# -- a config.toml that is not a regular file -------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("args", [("env",), ("env", "--shell", "bash"), ("config", "list")])
def test_a_fifo_config_file_is_refused_not_waited_on(tmp_path, args, kind):
    """config.toml is a FIFO (nobody writes to it): every command used to wait on it forever,
    `rocforge env` in each new shell too.  In a real process: one line naming the file, exit 2,
    within seconds, and the FIFO (or socket) is left as it was."""
    import os
    import socket
    import stat
    import subprocess
    import sys
    from pathlib import Path

    fifo = config.config_file()
    fifo.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(fifo)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(fifo))
    root = tmp_path / "root"
    root.mkdir()
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "--root", str(root), *args],
                         cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "ROCFORGE_NO_CACHE": "1"})
    assert out.returncode == 2, out.stderr
    line = _error_line(out.stderr)
    assert f"config file {fifo} is not a regular file" in line
    assert out.stdout == "" and stat.S_IFMT(os.lstat(fifo).st_mode) == (
        stat.S_IFIFO if kind == "fifo" else stat.S_IFSOCK)
    if kind == "socket":
        sock.close()


def test_a_linked_config_file_is_still_read(capsys, tmp_path):
    """A dotfile manager's link to a regular file is followed (only what it points to matters)."""
    real = tmp_path / "dotfiles-config.toml"
    real.write_text("[nightly]\nkeep = 5\n")
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(real)
    rc, out, _ = _cli(capsys, "config", "get", "nightly.keep")
    assert rc == 0 and out.strip() == "5"


def test_config_set_through_a_dotfile_link_keeps_the_link(capsys, tmp_path):
    """`config set` changes the file a dotfile manager's link points to; the link stays a link
    (replacing it with a plain file would cut the user's config off their dotfiles)."""
    real = tmp_path / "dotfiles" / "config.toml"
    real.parent.mkdir()
    real.write_text("# mine\n[nightly]\nkeep = 5\n")
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(real)
    rc, _, _ = _cli(capsys, "config", "set", "nightly.keep", "7")
    assert rc == 0
    assert path.is_symlink() and path.resolve() == real.resolve()
    assert real.read_text() == "# mine\n[nightly]\nkeep = 7\n"
    assert sorted(p.name for p in real.parent.iterdir()) == ["config.toml"]  # no temporary left


def test_defaults_are_a_fresh_deep_copy_each_time():
    """config.defaults() is the defaults file's data, equal to a deepcopy of it and sharing no
    table or array with the cached one (effective() lays the user's values over it)."""
    import copy

    first = config.defaults()
    assert first == copy.deepcopy(config._defaults_cached())
    first["nightly"]["use"].append("mine")
    first["nightly"]["sources"]["cdn"]["url"] = "changed"
    second = config.defaults()
    assert "mine" not in second["nightly"]["use"] and second["nightly"]["sources"]["cdn"]["url"] != "changed"
    assert second == config._defaults_cached() and second is not config._defaults_cached()
