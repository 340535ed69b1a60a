"""argparse `type=` functions for numeric flags: a value out of range is refused while the command
line is parsed (exit 2, one line naming the flag), before any model is read or any program runs.

`float()` accepts "inf" and "nan", and `int()` any size; a timeout of inf, -5 or nan, a run number
past SQLite's 64-bit integers, or zero repetitions would otherwise fail later, inside the run.
Only stdlib: the parser of every command imports this."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError

SQLITE_MAX_INT = 2 ** 63 - 1  # SQLite INTEGER is a signed 64-bit value (sqlite.org/datatype3.html)


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def at_least(minimum: int, maximum: int | None = None):
    """A whole number >= `minimum` (and <= `maximum`): counts, sizes, threads, jobs."""
    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise ArgumentTypeError(f"{value} is below {minimum} (give {minimum} or more)")
        if maximum is not None and value > maximum:
            raise ArgumentTypeError(f"{value} is above {maximum}")
        return value
    parse.__name__ = "whole number"  # argparse names the type in its messages
    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)
# a run number (or a preset's version) of the results store: 1 .. SQLite's largest INTEGER
run_id = at_least(1, SQLITE_MAX_INT)
# a TCP port: 16 bits, 0 is "any free port", not one a server can be reached at (RFC 9293 3.1)
port = at_least(1, 65535)
# parallel build jobs: 4096 is past the hardware threads of any one machine with the remote slots
# of a distributed build added; a larger -j only fills the process table
JOBS_MAX = 4096
jobs = at_least(1, JOBS_MAX)


def positive_seconds(text: str) -> float:
    """A finite duration > 0: inf would overflow the timer thread, 0/-5/nan would kill every run."""
    value = _float(text)
    if value <= 0:
        raise ArgumentTypeError(f"{text!r} is not a duration above 0 seconds")
    return value


def non_negative_number(text: str) -> float:
    """A finite number >= 0: thresholds and percentages."""
    value = _float(text)
    if value < 0:
        raise ArgumentTypeError(f"{text!r} is negative")
    return value


def int_list(minimum: int):
    """`N,N,...`: whole numbers, each >= `minimum` (depths may be 0, micro-batches and contexts
    may not)."""
    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise ArgumentTypeError(f"{text!r} holds no number")
        return [at_least(minimum)(x) for x in items]
    parse.__name__ = "list of whole numbers"
    return parse


positive_seconds.__name__ = "duration"
non_negative_number.__name__ = "number"
