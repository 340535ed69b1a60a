"""argparse `type=` functions for numeric flags: each has a lowest AND a highest value, so a value
out of range is refused while the command line is parsed (exit 2, one line naming the flag),
before any model is read or any program runs.

`float()` accepts "inf", "nan" and 1e300, and `int()` any size: a --reps of 2**63 would run for
ever, a timeout of 1e300 overflows the timer thread, a depth past a C int wraps inside llama.cpp.
Every type here carries its `bounds`; cli.py shows them in each flag's --help, and
tests/attack/test_trust_bounds.py fails if a numeric flag is added without one.  A CMake target
name (`cmake_target`) is checked here too, since it reaches ninja's command line.  Only stdlib: the
parser of every command imports this."""

from __future__ import annotations

import math
import re
from argparse import ArgumentTypeError

SQLITE_MAX_INT = 2 ** 63 - 1  # SQLite INTEGER is a signed 64-bit value (sqlite.org/datatype3.html)
# Token counts (prompt, generation, KV depth, context, micro-batch): llama.cpp reads them into C
# `int32_t`s; 2**27 (128 Mi tokens) is past the longest context any model is trained for and
# leaves room for a deliberately impossible KV depth (a test of running out of memory).
TOKENS_MAX = 2 ** 27
# Parallel build jobs and CPU threads: 4096 is past the hardware threads of any one machine with
# the remote slots of a distributed build added; more only fills the process table.
JOBS_MAX = 4096
REPS_MAX = 1000  # repetitions of one llama-bench test: 1000 x a 10 s test is a day already
COUNT_MAX = 10_000  # entries listed or kept (nightlies, installs)
SECONDS_MAX = 7 * 24 * 3600.0  # a timeout or a wait: a week, well past any build or benchmark
DAYS_MAX = 36_500.0  # an age in days: a century (datetime cannot hold 1e300 days)
PERCENT_MAX = 100.0  # a regression threshold: a throughput cannot fall by more than 100 %
GIB_MAX = 1024.0 ** 2  # memory in GiB: a PiB, past the RAM of any one host


# Python's int() and float() also take "1_000", " 5", "+5", Arabic-Indic and full-width digits,
# and float() "1e-320" (a subnormal): a flag takes ASCII digits only, an optional "-" first (the
# range refuses it where negatives make no sense), and a number a plain decimal with an optional
# exponent.  re.ASCII: \d is 0-9 only.
_WHOLE = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _int(text: str) -> int:
    if not _WHOLE.fullmatch(text) or len(text) > 40:  # 40 digits: past any bound here
        raise ArgumentTypeError(f"{text!r} is not a whole number (ASCII digits, e.g. 12)")
    return int(text, 10)


def _float(text: str) -> float:
    if not _DECIMAL.fullmatch(text) or len(text) > 40:
        raise ArgumentTypeError(f"{text!r} is not a number (ASCII digits, e.g. 2.5 or 1e3)")
    value = float(text)
    if not math.isfinite(value):
        raise ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _bounded(parse, name: str, minimum, maximum, range_text: str):
    parse.__name__ = name  # argparse names the type in its messages
    parse.bounds = (minimum, maximum)
    parse.range_text = range_text
    return parse


def whole(minimum: int, maximum: int):
    """A whole number in [minimum, maximum]: counts, sizes, threads, jobs, ports, run numbers."""
    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise ArgumentTypeError(f"{value} is below {minimum} (give {minimum} to {maximum})")
        if value > maximum:
            raise ArgumentTypeError(f"{value} is above {maximum} (give {minimum} to {maximum})")
        return value
    return _bounded(parse, "whole number", minimum, maximum, f"{minimum} to {maximum}")


def number(minimum: float, maximum: float, *, above: bool = False, least: float = 0.0):
    """A finite number in [minimum, maximum] (in (minimum, maximum] when `above`); a value above 0
    is at least `least` (0.001 % or 1e-320 s is no setting anyone means: a typo, or an attack)."""
    def show(x: float) -> str:
        return f"{int(x)}" if float(x).is_integer() else f"{x:g}"
    low, high = show(minimum), show(maximum)
    span = f"over {low}, at most {high}" if above else f"{low} to {high}"
    if least > max(minimum, 0.0):
        span = f"{low}, or {show(least)} to {high}" if minimum == 0 and not above else (
            f"{show(least)} to {high}")

    def parse(text: str) -> float:
        value = _float(text)
        if (value < minimum or (above and value == minimum) or value > maximum
                or 0 < value < least):
            raise ArgumentTypeError(f"{text!r} is out of range (give {span})")
        return value
    return _bounded(parse, "number", minimum, maximum, span)


def int_list(minimum: int, maximum: int = TOKENS_MAX):
    """`N,N,...`: whole numbers, each in [minimum, maximum] (depths may be 0, micro-batches and
    contexts may not)."""
    item = whole(minimum, maximum)

    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise ArgumentTypeError(f"{text!r} holds no number")
        return [item(x) for x in items]
    return _bounded(parse, "list of whole numbers", minimum, maximum, f"each {minimum} to {maximum}")


def at_least(minimum: int, maximum: int = 2 ** 31 - 1):
    """A whole number >= `minimum`, at most `maximum` (a C int, what the programs given it read)."""
    return whole(minimum, maximum)


tokens = whole(0, TOKENS_MAX)  # prompt and generated tokens (0: that test is skipped)
context = whole(1, TOKENS_MAX)  # a context size or micro-batch
reps = whole(1, REPS_MAX)
threads = whole(1, JOBS_MAX)
jobs = whole(1, JOBS_MAX)
count = whole(0, COUNT_MAX)
positive_int = at_least(1)
non_negative_int = at_least(0)
# a run number (or a preset's version) of the results store: 1 .. SQLite's largest INTEGER
run_id = whole(1, SQLITE_MAX_INT)
# a TCP port: 16 bits, 0 is "any free port", not one a server can be reached at (RFC 9293 3.1)
port = whole(1, 65535)
# a duration above 0: inf would overflow the timer thread, 0/-5/nan would kill every run
# (a millisecond at least: the clocks that time a run tick no finer that matters)
positive_seconds = number(0.0, SECONDS_MAX, above=True, least=0.001)
positive_seconds.__name__ = "duration"
_DURATION = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([smh]?)", re.ASCII)
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(minimum: float, maximum: float):
    """A duration such as 30s, 5m, 1h or 90 (seconds) in [minimum, maximum] seconds, as seconds."""
    span = f"{minimum:g} s to {maximum / 3600:g} h"

    def parse(text: str) -> float:
        from rocforge_build import shellsafe

        m = _DURATION.fullmatch(text)
        shown = shellsafe.one_line(text)  # what the error quotes: one line, at most 40 characters
        shown = repr(shown if len(shown) <= 40 else shown[:40] + "...")
        if not m:
            raise ArgumentTypeError(f"{shown} is not a duration (a number and s, m or h: e.g. 30s, 5m, 1h)")
        value = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        if not minimum <= value <= maximum:
            raise ArgumentTypeError(f"{shown} is out of range (give {span})")
        return value
    return _bounded(parse, "duration", minimum, maximum, span)


# how often serve's canary runs: 5 s at least (the short canary itself takes a fraction of a
# second on a GPU, a second or two on a CPU; more often would be load, not vigilance)
canary_every = duration(5.0, SECONDS_MAX)
percent = number(0.0, PERCENT_MAX, least=0.001)  # 0, or a thousandth of a percent at least
days = number(0.0, DAYS_MAX, least=1e-5)  # 0, or about a second (0.864 s) at least
gib = number(0.0, GIB_MAX, least=1e-6)  # 0, or a KiB at least


# A CMake target name as ninja is given it (cmake-policies(7) CMP0037): letters, digits and
# `_.+-`, never a leading `-` (ninja would read `-C/` or `-tclean` as its own option), and none of
# the names CMake itself reserves (cmake-commands(7) add_custom_target; CMP0037): those are the
# generator's own targets (`clean` deletes the build, `install` installs everything).
_CMAKE_TARGET = re.compile(r"[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,254}", re.ASCII)
CMAKE_RESERVED_TARGETS = frozenset({
    "all", "clean", "help", "install", "preinstall", "package",
    "package_source", "test", "edit_cache", "rebuild_cache", "list_install_components", "depend",
    "ALL_BUILD", "ZERO_CHECK", "INSTALL", "PACKAGE", "RUN_TESTS", "NIGHTLY_MEMORY_CHECK",
})
CMAKE_TARGETS_MAX = 256  # targets of one build: past any recipe's, and a bounded ninja line


def cmake_target_problem(name: object) -> str | None:
    """Why `name` cannot be one CMake target of a build (--cmake-target, `[build] targets`), or
    None when it can."""
    if not isinstance(name, str) or not _CMAKE_TARGET.fullmatch(name):
        return (f"{name!r} is not a CMake target name (letters, digits and _.+-, not starting "
                "with -, at most 255 characters)")
    if name in CMAKE_RESERVED_TARGETS:
        return f"{name!r} is a target CMake reserves for itself, not one a recipe builds"
    return None


def cmake_target(text: str) -> str:
    """--cmake-target NAME: refused while the command line is parsed, before any plan is made."""
    problem = cmake_target_problem(text)
    if problem:
        raise ArgumentTypeError(problem)
    return text


cmake_target.__name__ = "CMake target name"
