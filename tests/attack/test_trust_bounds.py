"""Issue 30, "values without bounds": every numeric flag has a lowest and highest value enforced
while parsing; a path no command can use (a symbolic link loop, a name too long) is one line;
output the terminal's encoding cannot show is escaped; every flag value of `tune` is checked
before anything is downloaded; `config set` never rewrites a TOML file that is not rocforge's;
argparse's errors are one `rocforge: error:` line; a --cmake-target the configure does not make
is refused before building; a stddev llama-bench could not measure is unknown, not 0.0.

Each attack is performed for real: the real parser, real subprocesses, real symbolic links, a
real HTTP server on 127.0.0.1, a real CMake configure."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from buildfixtures import RECIPE, project_copy
from needs import needs
from tiny_gguf import write as write_gguf
from trust_helpers import never_run_prefix

from rocforge_build import cli, paths
from rocforge_build.commands import bundle
from rocforge_build.measure import bench
from rocforge_build.measure.session import describe

HOSTILE = [str(2 ** 63), "-1", "nan", "inf", "1e300", "-inf", str(10 ** 400)]


def _parsers():
    """Every parser of the CLI: each command's (built as when it is chosen), every subcommand
    below it, and bundle's `check` and `unpack` parsers."""
    for name in cli.COMMANDS:
        sub = cli.build_parser(name)._subparsers._group_actions[0].choices[name]
        todo = [((name,), sub)]
        while todo:
            path, parser = todo.pop()
            yield path, parser
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    todo += [((*path, n), p) for n, p in action.choices.items()]
        if name == "bundle":
            for action in ("check", "unpack"):
                yield (name, action), bundle.action_parser(sub, action)
    yield (), cli.build_parser(None)


def _value_actions():
    for path, parser in _parsers():
        for action in parser._actions:
            if action.nargs != 0 and not isinstance(action, (argparse._SubParsersAction,
                                                             argparse._HelpAction)):
                yield " ".join(("rocforge", *path, max(action.option_strings or [action.dest],
                                                       key=len))), action


ACTIONS = list(_value_actions())
BOUNDED = [(label, a) for label, a in ACTIONS if hasattr(a.type, "bounds")]
NOT_NUMERIC = (None, str, Path)  # types of options that take text or a path


def _text_type(parse) -> bool:
    """A type function that checks a text and answers one, or a list of words chosen from a fixed
    set (`def host(text: str) -> str`, `def kv_list(text: str) -> list[str]`)."""
    return getattr(parse, "__annotations__", {}).get("return") in (
        "str", str, "Path", Path, "list[str]", "tuple[str, ...]")


def _numeric_default(action) -> bool:
    values = action.default if isinstance(action.default, list) else [action.default]
    return any(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


# -- 1. every numeric flag is bounded, and says its range --------------------------------------------

def test_the_walk_reaches_every_numeric_flag_of_the_trial():
    labels = {label for label, _ in BOUNDED}
    trial = {f"rocforge bench --{f}" for f in ("depth", "n-prompt", "ubatch", "reps", "threads",
                                               "timeout")}
    assert trial | {"rocforge nightly prune --keep", "rocforge host plan --reserve",
                    "rocforge cache clean --older-than", "rocforge serve --wait"} <= labels
    assert len(BOUNDED) >= 35 and len(ACTIONS) > 150


def test_every_numeric_option_has_a_bounded_type():
    """An int/float type, or a numeric default, without argtypes' bounds fails here: the next
    numeric flag added cannot be unbounded."""
    unbounded = [label for label, a in ACTIONS
                 if not hasattr(a.type, "bounds")
                 and (a.type not in NOT_NUMERIC and not _text_type(a.type) or _numeric_default(a))]
    assert unbounded == []
    for label, a in BOUNDED:
        low, high = a.type.bounds
        assert math.isfinite(low) and math.isfinite(high) and low <= high, label


def test_every_range_is_in_the_help():
    """--help (and the command reference generated from the same parser) shows the range."""
    missing = [label for label, a in BOUNDED if f"[{a.type.range_text}]" not in (a.help or "")]
    assert missing == []
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "bench", "--help"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "[1 to 1000]" in " ".join(out.split())  # --reps


def options_accepting(value: str) -> list[str]:
    """The bounded options whose type takes `value`; a list is not asked about a value with spaces
    around it (its items may have them)."""
    accepted = []
    for label, a in BOUNDED:
        if value.strip() != value and a.type.__name__.startswith("list"):
            continue
        try:
            a.type(value)
        except argparse.ArgumentTypeError:
            continue
        accepted.append(label)
    return accepted


@pytest.mark.parametrize("value", HOSTILE)
def test_every_numeric_option_refuses_hostile_values(value):
    assert options_accepting(value) == []


# Python's int()/float() forms no flag takes: digit groups, spaces, a plus sign, Arabic-Indic and
# full-width digits, a subnormal; a list's items may have spaces around them ("512, 1024")
UNUSUAL = ["1_000", " 5", "5 ", "+5", "\u0663", "\uff11\uff12", "1e-320", "0x10", "1e-9"]


@pytest.mark.parametrize("value", UNUSUAL)
def test_every_numeric_option_refuses_unusual_forms(value):
    assert options_accepting(value) == []


@pytest.mark.parametrize("flag,value", [("--timeout", "1e-320"), ("--timeout", "0.0005"),
                                        ("--reps", "1_000"), ("--reps", "\uff12"),
                                        ("--reps", "+5")])
def test_bench_refuses_unusual_forms_through_the_cli(capsys, flag, value):
    code, _, err = run_cli(capsys, "bench", "PREFIX", "--model", "m.gguf", f"{flag}={value}")
    assert code == 2 and flag in one_error(err)


def test_plain_forms_are_still_numbers():
    from rocforge_build import argtypes

    assert argtypes.reps("12") == 12 and argtypes.positive_seconds("1e3") == 1000.0
    assert argtypes.positive_seconds(".5") == 0.5 and argtypes.percent("0") == 0.0
    assert argtypes.int_list(1)("512, 1024") == [512, 1024]


# -- 2. the trial's examples, through the CLI ----------------------------------------------------------

def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(err: str) -> str:
    """Exactly one `rocforge: error:` line, every line rocforge's, no usage block or traceback."""
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("rocforge: error: ")]
    assert len(errors) == 1, err
    assert all(line.startswith("rocforge: ") for line in lines), err
    assert "internal error" not in err and "Traceback" not in err
    return errors[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", byte_tokens=True)


@pytest.mark.parametrize("flag,value", [
    ("--depth", str(2 ** 63)), ("--n-prompt", str(2 ** 63)), ("--ubatch", str(2 ** 63)),
    ("--reps", str(2 ** 63)), ("--threads", str(2 ** 63)), ("--timeout", "1e300"),
    ("--depth", f"0,{2 ** 27 + 1}"), ("--reps", "1001"), ("--timeout", "604801"),
])
def test_bench_trial_values_are_refused_before_anything_runs(tmp_path, model, capsys,
                                                             monkeypatch, flag, value):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "results.sqlite3"))
    prefix, marker = never_run_prefix(tmp_path)
    started = time.monotonic()
    code, out, err = run_cli(capsys, "bench", prefix, "--model", model, "--no-gate", flag, value)
    assert code == 2 and out == ""
    line = one_error(err)
    assert line.startswith("rocforge: error: bench: argument ") and flag in line, line
    assert not marker.exists() and not (tmp_path / "results.sqlite3").exists()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("argv", [["build", "--bogus"], ["nightly", "install", "--limit", "x"],
                                  ["results"], ["preset", "show"], ["--root"], ["bundle"],
                                  ["container", "closure"]])
def test_argparse_errors_are_one_rocforge_line(argv, capsys):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert not any(line.startswith("usage:") for line in err.splitlines())
    line = one_error(err)
    assert argv[0] == "--root" or line.startswith(f"rocforge: error: {argv[0]}"), line


def test_every_command_words_a_parse_error_alike(capsys):
    for name in cli.COMMANDS:
        code, _, err = run_cli(capsys, name, "--no-such-option")
        assert code == 2, name
        one_error(err)
        assert "rocforge: hint: --no-such-option: no such option" in err, (name, err)


# -- 3. paths no command can use --------------------------------------------------------------------

@pytest.mark.parametrize("how", ["bench", "verify", "build"])
def test_a_symlink_loop_as_a_prefix_is_one_line(tmp_path, model, capsys, monkeypatch, how):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "results.sqlite3"))
    loop = tmp_path / "loop"
    loop.symlink_to("loop")  # `ln -s loop loop`
    argv = {"bench": ["bench", loop, "--model", model, "--no-gate"],
            "verify": ["verify", loop, "--model", model],
            "build": ["build", "llama-cpp", "--target", "gfx1100", "--prefix", loop, "--dry-run"]}
    code, _, err = run_cli(capsys, *argv[how])
    assert code == 2
    assert f"{loop}: a symbolic link loop" in one_error(err)
    assert loop.is_symlink() and os.readlink(loop) == "loop"


def test_a_name_too_long_is_one_line(tmp_path, model, capsys, monkeypatch):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "results.sqlite3"))
    code, _, err = run_cli(capsys, "bench", tmp_path / ("a" * 3000), "--model", model, "--no-gate")
    assert code == 2 and "the name is too long" in one_error(err)


# -- 4. output the terminal's encoding cannot show ----------------------------------------------------

@pytest.mark.parametrize("name,encoding,shown", [
    ("préfix", "ascii", b"pr\\xe9fix"),  # a character the terminal's encoding lacks
    (os.fsdecode(b"pr\xff"), "utf-8", b"pr\\udcff"),  # a file name that is not UTF-8 at all
])
def test_a_terminal_that_cannot_show_a_prefix(tmp_path, name, encoding, shown):
    prefix = tmp_path / name
    prefix.mkdir()
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "nightly", "installed",
                          "--prefix", str(prefix)], capture_output=True, timeout=60,
                         env={**os.environ, "PYTHONIOENCODING": encoding})
    assert out.returncode == 0, out.stderr
    assert shown in out.stdout  # escaped, the rest of the line as it was
    assert b"internal error" not in out.stderr and b"Traceback" not in out.stderr


def test_env_writes_a_non_ascii_prefix_as_its_bytes_on_an_ascii_terminal(tmp_path, monkeypatch):
    """`rocforge env` is a script, not a message: a CPU build under a non-ASCII data directory
    reaches the shell as the path's own bytes (escaping it would put a PATH entry that does not
    exist), on the first run and on the cached one."""
    from stackfixtures import make_build

    from rocforge_build import paths

    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / "données"))
    root = tmp_path / "root"
    root.mkdir()  # no ROCm, no GPU: the CPU build is what env serves
    prefix = make_build(root, "llama-cpp", "gfx1151", "cpu")
    (prefix / "bin").mkdir()
    want = f"{paths.builds_prefix()}/{prefix.name}/bin".encode()
    assert b"donn\xc3\xa9es" in want  # the case: a name the terminal's encoding cannot show
    chose = subprocess.run([sys.executable, "-m", "rocforge_build", "--root", str(root), "use",
                            str(prefix)], capture_output=True, timeout=60)
    assert chose.returncode == 0, chose.stderr
    for run in ("first", "cached"):
        out = subprocess.run([sys.executable, "-m", "rocforge_build", "--root", str(root), "env",
                              "--shell", "bash"], capture_output=True, timeout=60,
                             env={**os.environ, "PYTHONIOENCODING": "ascii"})
        assert out.returncode == 0, (run, out.stderr)
        assert b"\\x" not in out.stdout, run
        script = tmp_path / f"env-{run}.sh"
        script.write_bytes(out.stdout)
        shell = subprocess.run(["bash", "-c", f'. "{script}"; printf %s "$PATH"'], timeout=20,
                               capture_output=True, env={"PATH": "/usr/bin:/bin"})
        assert shell.stdout.split(b":")[0] == want, (run, shell.stdout)


# -- 5. tune checks every value before any download or build ------------------------------------------

@pytest.mark.parametrize("extra,needle", [
    (["--fa", "maybe"], "--fa"), (["--env", "no equals sign"], "--env"),
    (["--build", "{absent}"], "does not exist"), (["--build", "{empty}"], "no bin/llama-bench"),
    (["--contexts", "medium"], "--contexts"),
])
def test_tune_values_are_checked_before_any_download(tmp_path, model, http_server, extra, needle):
    (tmp_path / "empty").mkdir()
    url = http_server.add("/llama.cpp-b9999.tar.gz", b"not reached")
    extra = [e.format(absent=tmp_path / "absent", empty=tmp_path / "empty") for e in extra]
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "tune", "llama-cpp", "--target",
                          "gfx1100", "--model", str(model), "--source", url, *extra],
                         capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 5
    assert out.returncode == 2 and needle in one_error(out.stderr)
    assert http_server.requests == []  # nothing was fetched


# -- 6. config set never rewrites someone else's TOML ----------------------------------------------------

@pytest.mark.parametrize("argv", [["config", "set", "nightly.keep", "2"],
                                  ["config", "unset", "nightly.keep"]])
def test_config_set_through_a_link_to_a_pyproject_leaves_it_alone(tmp_path, capsys, argv):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "mine"  # my comment\n\n[tool.ruff]\nline-length = 99\n')
    before = pyproject.read_bytes()
    link = paths.config_file()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(pyproject)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    line = one_error(err)
    assert "is not rocforge's config file" in line and "project, tool" in line
    assert pyproject.read_bytes() == before and link.is_symlink()


def test_config_set_still_writes_rocforge_own_file_through_a_link(tmp_path, capsys):
    own = tmp_path / "dotfiles" / "rocforge.toml"
    own.parent.mkdir()
    own.write_text("# mine\n[nightly]\nkeep = 3\n")
    paths.config_file().parent.mkdir(parents=True, exist_ok=True)
    paths.config_file().symlink_to(own)
    code, _, err = run_cli(capsys, "config", "set", "nightly.keep", "2")
    assert code == 0, err
    assert own.read_text() == "# mine\n[nightly]\nkeep = 2\n" and paths.config_file().is_symlink()


# -- 7. item 12: a stddev llama-bench could not measure; a --cmake-target the configure lacks ----------

def test_a_single_repetition_has_no_stddev():
    """llama-bench's stdev() answers 0 below two samples (ggml-org/llama.cpp,
    tools/llama-bench/llama-bench.cpp): 0.0 there is "not measured", stored as None."""
    one = {"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0, "stddev_ts": 0.0, "samples_ts": [900.0]}
    two = {**one, "avg_ts": 901.0, "stddev_ts": 1.41, "samples_ts": [900.0, 902.0]}
    assert bench.row_from(one, {})["stddev"] is None
    assert bench.row_from(two, {})["stddev"] == 1.41
    assert "±" not in describe({**bench.row_from(one, {}), "status": "ok"})


@needs("cmake", "ninja", "cc")
def test_a_build_target_the_configure_does_not_make_is_refused_before_building(tmp_path, capsys):
    """The fixture's greet-hip exists only with FIXTURE_HIP (the hip backend), as llama.cpp's
    test-backend-ops only with LLAMA_BUILD_TESTS."""
    src = project_copy(tmp_path / "src")
    prefix = tmp_path / "prefix"
    code, _, err = run_cli(capsys, "build", RECIPE, "--source", src, "--target", "gfx1151",
                           "--backend", "cpu", "--prefix", prefix, "--cmake-target", "greet-hip")
    assert code == 2  # the build's progress precedes it on stderr
    line, = [line for line in err.splitlines() if line.startswith("rocforge: error: ")]
    assert "--cmake-target greet-hip" in line and "nothing was built" in line
    assert "did you mean greet?" in err
    assert not prefix.exists()
    built = [p.name for p in paths.cache_dir().rglob("*") if p.suffix in (".o", ".so")
             or p.name.startswith("libgreet")]
    assert built == []  # ninja never ran
    # the older spelling of the flag builds the target as --cmake-target does
    code, _, err = run_cli(capsys, "build", RECIPE, "--source", src, "--target", "gfx1151",
                           "--backend", "cpu", "--prefix", prefix, "--build-target", "fixture-hello")
    assert code == 0, err
    assert (prefix / "bin" / "fixture-hello").is_file()


def test_a_build_given_twice_is_one_tune_candidate(tmp_path):
    """`tune --build P` where P is already a candidate (the build a backend makes, or P again
    through a link) is measured once: candidates are told apart by their resolved prefix."""
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.rootfs import Root
    from rocforge_build.workflows import tune as tune_workflow

    prefix, _ = never_run_prefix(tmp_path)
    (tmp_path / "link").symlink_to(prefix)
    said = []
    asked = tune_workflow.Candidates(recipe=str(RECIPE), backends=("cpu",), target="gfx1151",
                                     source=str(tmp_path / "no-such-source"), rootfs=Root("/"),
                                     given=(LlamaBuild.open(prefix), LlamaBuild.open(tmp_path / "link")))
    builds, skipped = tune_workflow.candidates(asked, said.append, quiet=True)
    assert [b.prefix for b in builds] == [prefix]
    assert [s["backend"] for s in skipped] == ["cpu"]  # its source is absent: nothing was built
    assert f"--build {prefix} is already a candidate: measured once" in said


@pytest.mark.parametrize("value", ["1X=a", "É=1", "X=a\nb", "X=a\x1b[2J", "=1", "X"])
def test_bench_env_values_are_names_and_one_line(tmp_path, model, capsys, monkeypatch, value):
    """--env lands in stored rows and presets, and from there in scripts: a name that is not an
    environment name (POSIX XBD 8.1) or a value with a line break is refused before anything runs."""
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "results.sqlite3"))
    prefix, marker = never_run_prefix(tmp_path)
    code, _, err = run_cli(capsys, "bench", prefix, "--model", model, "--no-gate", "--env", value)
    assert code == 2 and "--env" in one_error(err)
    assert not marker.exists() and not (tmp_path / "results.sqlite3").exists()


# -- 9. `config set` checks a value by the rule the loader reads it with ---------------------------------

def _defaults_leaves():
    import tomllib

    from rocforge_build import config

    def walk(data, prefix=""):
        for k, v in data.items():
            if isinstance(v, dict):
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    with open(config.DEFAULTS_FILE, "rb") as fh:
        return list(walk(tomllib.load(fh)))


def _bad_value(default) -> str:
    """A value of the key's own type that no command can use: a text with a newline and a shell
    substitution, a negative number, a boolean given as a word."""
    if isinstance(default, bool):
        return "yes"
    if isinstance(default, int | float):
        return "-1"
    if isinstance(default, list):
        return '["$(touch ran)\\n"]'
    return "$(touch ran)\n"


LEAVES = _defaults_leaves()


def test_the_leaves_are_every_key_of_the_defaults():
    keys = {k for k, _ in LEAVES}
    assert {"cache.launcher", "nightly.use", "build.distcc_hosts", "nightly.pip.route",
            "nightly.sources.cdn.kind", "download.deadline"} <= keys and len(keys) > 40


@pytest.mark.parametrize("key,default", LEAVES, ids=[k for k, _ in LEAVES])
def test_config_set_refuses_a_bad_value_of_every_key(tmp_path, capsys, key, default):
    """The user's file holds a good value first: a refused `set` leaves it byte for byte; the
    same bad value written into the file by hand is refused by every read, with the same rule."""
    from rocforge_build import config

    cfg = paths.config_file()
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("# mine\n[nightly]\nkeep = 2\n")
    before = cfg.read_bytes()
    code, out, err = run_cli(capsys, "config", "set", key, _bad_value(default))
    assert code == 2 and out == "", err
    assert key in one_error(err)
    assert cfg.read_bytes() == before and not (tmp_path / "ran").exists()
    # the loader: the same value in the file is refused on reading, naming the key
    bad = config.parse_value(_bad_value(default))
    cfg.write_text(f"{key.rsplit('.', 1)[0] and '[' + key.rsplit('.', 1)[0] + ']'}\n"
                   f"{key.rsplit('.', 1)[1]} = {_toml(bad)}\n")
    with pytest.raises(config.ConfigError, match=key.replace(".", r"\.")):
        config.effective()
    # and the default itself is a value `config set` takes
    cfg.write_text("")
    code, _, err = run_cli(capsys, "config", "set", key, _toml(default))
    assert code == 0, err


def _toml(value) -> str:
    import json

    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


@pytest.mark.parametrize("key,value", [("cache.launcher", "$(touch ran)"),
                                       ("nightly.use", '["not-a-source"]'),
                                       ("nightly.pip.family_index", "https://h/{famly}/"),
                                       ("build.distcc_hosts", '["h1;touch ran"]'),
                                       ("nightly.sources.cdn.kind", "ftp")])
def test_the_trial_config_values_are_refused_when_set(tmp_path, capsys, key, value):
    code, _, err = run_cli(capsys, "config", "set", key, value)
    assert code == 2 and key in one_error(err)
    assert not paths.config_file().exists()


# The child's own peak resident memory in KiB. Not getrusage's ru_maxrss: Linux carries the
# parent's peak across vfork+exec into it (seen in CI, where pytest itself held 2 GB), while
# VmHWM belongs to the child's fresh address space (proc(5)).
_OWN_PEAK_KIB = ("int(next(line.split()[1] for line in open('/proc/self/status') "
                 "if line.startswith('VmHWM:')))")


# -- 10. verify --text reads only the start it needs ----------------------------------------------------

_READ_START = f"""
import sys
from pathlib import Path
from rocforge_build.measure.verify import text_start
out = text_start(Path(sys.argv[1]), int(sys.argv[2]))
print(out.stat().st_size, {_OWN_PEAK_KIB})
"""


@pytest.mark.parametrize("fill", ["sparse", "utf8"])
def test_verify_text_of_a_gibibyte_is_read_in_bounded_memory(tmp_path, fill):
    """A 1 GiB --text (sparse: no disk needed) in a child process: its peak resident memory stays
    under 200 MB (the whole file read at once is 2.1 GB); a multi-byte character split across
    two read blocks is decoded, not replaced."""
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:
        if fill == "utf8":
            # 'é' is 2 bytes from an odd offset: the 1 MiB read blocks split one
            fh.write(b"a" + ("é" * 700_000 + "\n").encode() * 20)
        fh.truncate(1 << 30)
    env = {**os.environ, "ROCFORGE_CACHE_DIR": str(tmp_path / "cache")}
    ctx = "512" if fill == "sparse" else "16384"  # 16384: the start is 2 MiB, two read blocks
    proc = subprocess.run([sys.executable, "-c", _READ_START, str(big), ctx], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    size, peak_kib = map(int, proc.stdout.split())  # the child's own peak: no other child's
    assert peak_kib < 200 * 1024, f"peak RSS {peak_kib} KiB"
    assert 0 < size < 1 << 24
    start = next((tmp_path / "cache" / "verify").glob("text-start-*.txt")).read_text()
    if fill == "utf8":
        assert "\ufffd" not in start and set(start) <= {"a", "é", "\n"}


# -- 11. a user's path that cannot be opened is said for what it is (rocforge_build/userpath.py) --------

def _odd_path(tmp_path: Path, kind: str) -> Path:
    """A real symbolic link loop, a dangling link, a FIFO, a directory or /dev/zero."""
    if kind == "device":
        return Path("/dev/zero")
    p = tmp_path / f"odd-{kind}.toml"
    if kind == "loop":
        p.symlink_to(p.name)  # a link to itself: ELOOP
    elif kind == "dangling":
        p.symlink_to("nowhere")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    return p


_SAYS = {"loop": "symbolic link loop", "dangling": "symbolic link to nothing", "fifo": "is a FIFO",
         "directory": "is a directory", "device": "is a character device", "missing": "does not exist"}


_PATH_TAKERS = [["build", "{p}", "--dry-run"],
                ["build", "llama-cpp", "--backend", "cpu", "--source", "{p}", "--dry-run"],
                ["bundle", "check", "{p}"], ["bundle", "unpack", "{p}", "--into", "{d}"]]


# A directory is what `--source` (a source tree) and `bundle check` (an unpacked bundle) may be given.
@pytest.mark.parametrize("kind,argv", [(kind, argv) for kind in _SAYS for argv in _PATH_TAKERS
                                       if not (kind == "directory"
                                               and ("check" in argv or "--source" in argv))])
def test_a_user_path_that_cannot_be_opened_is_named_for_what_it_is(tmp_path, capsys, kind, argv):
    p = _odd_path(tmp_path, kind)
    start = time.monotonic()
    code, _, err = run_cli(capsys, *[a.format(p=p, d=tmp_path / "into") for a in argv])
    assert time.monotonic() - start < 30  # a FIFO is never waited on
    line = one_error(err)
    assert code == 2 and _SAYS[kind] in line, line
    assert "no such file or directory" not in line.lower() or kind == "missing"


@pytest.mark.parametrize("kind", ["loop", "fifo", "directory"])
def test_a_results_database_path_that_cannot_be_used_is_said_so(tmp_path, kind):
    db = _odd_path(tmp_path, kind)
    proc = subprocess.run([sys.executable, "-m", "rocforge_build", "results", "list"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ROCFORGE_RESULTS_DB": str(db)})
    line = one_error(proc.stderr)
    assert _SAYS[kind] in line and "unable to open database file" not in line
    assert proc.returncode == (2 if kind == "loop" else 11)


@pytest.mark.parametrize("kind", ["loop", "fifo", "dangling"])
def test_verify_text_that_cannot_be_read_is_one_line(tmp_path, kind):
    from rocforge_build.errors import UsageError
    from rocforge_build.measure.verify import text_start

    with pytest.raises(UsageError, match=_SAYS[kind]):
        text_start(_odd_path(tmp_path, kind), 512)


def test_a_recipe_of_a_gibibyte_is_refused_after_4_mib(tmp_path, capsys):
    big = tmp_path / "big.toml"
    with open(big, "wb") as fh:
        fh.truncate(1 << 30)
    code, _, err = run_cli(capsys, "build", str(big), "--dry-run")
    assert code == 2 and "larger than 4 MiB" in one_error(err)


def test_a_config_file_of_a_gibibyte_is_refused_without_reading_it_all(tmp_path):
    cfg = paths.config_file()
    cfg.parent.mkdir(parents=True, exist_ok=True)
    with open(cfg, "wb") as fh:
        fh.truncate(1 << 30)
    proc = subprocess.run([sys.executable, "-c", "from rocforge_build import cli\n"
                           "code = cli.main(['config', 'list'])\n"
                           f"print(code, {_OWN_PEAK_KIB})"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ROCFORGE_CONFIG_DIR": str(cfg.parent)})
    code, peak_kib = map(int, proc.stdout.split())
    assert code == 2 and "longer than 4 Mi characters" in one_error(proc.stderr)
    assert peak_kib < 200 * 1024


# -- 12. results export of a run that does not exist ------------------------------------------------

@pytest.mark.parametrize("fmt", [["--csv"], ["--json"]])
def test_results_export_of_a_missing_run_is_one_line(tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.setenv("ROCFORGE_RESULTS_DB", str(tmp_path / "results.db"))
    code, out, err = run_cli(capsys, "results", "export", "--run", "1000", *fmt)
    assert code == 2 and out == "" and "there is no run 1000" in one_error(err)


def test_a_manifest_of_a_gibibyte_is_refused_without_reading_it_all(tmp_path):
    """A prefix whose manifest is 1 GiB (sparse): `bundle` refuses it in one line, and discovery's
    read_manifest counts it as no manifest rocforge wrote; peak memory small."""
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    with open(prefix / "rocforge-manifest.toml", "wb") as fh:
        fh.truncate(1 << 30)
    script = ("import sys\nfrom rocforge_build import cli\n"
              "from rocforge_build.discover import builds\n"
              "assert builds.read_manifest(sys.argv[1]) is None\n"
              "code = cli.main(['bundle', sys.argv[1], '--out', sys.argv[2]])\n"
              f"print(code, {_OWN_PEAK_KIB})")
    proc = subprocess.run([sys.executable, "-c", script, str(prefix), str(tmp_path / "b.tar.gz")],
                          capture_output=True, text=True, timeout=120)
    code, peak_kib = map(int, proc.stdout.split())
    assert code == 2 and "larger than 4 MiB" in one_error(proc.stderr)
    assert peak_kib < 200 * 1024 and not (tmp_path / "b.tar.gz").exists()
