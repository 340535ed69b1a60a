"""A pulled build's llama-perplexity is asked for its --help (the batch defaults its own figures
record, substitute/evidence.own_serving) before the pull is verified here: its answer is a store's
bytes.  Whatever it prints — a default of thousands of digits (Python's int() refuses past 4,300),
a negative or non-numeric one, a line of megabytes, control characters, nothing — gives a count or
None, quickly, and never an exception."""

from __future__ import annotations

import time

import pytest

from rocforge_build.substitute import evidence


@pytest.mark.parametrize("text", [
    "-b,    --batch-size N                   logical maximum batch size (default: " + "9" * 5000 + ")\n",
    "-b,    --batch-size N                   logical maximum batch size (default: -1)\n",
    "-b,    --batch-size N                   logical maximum batch size (default: \x1b[2Jowned)\n",
    "-b,    --batch-size N    " + "(default: 1" * 200000 + ")\n",
    "-b, --batch-size" + " " * 3_000_000 + "x (default: 5)\n",
    "\x00\xff" * 100000,
    "",
])
def test_hostile_help_gives_a_count_or_none(text):
    t0 = time.monotonic()
    got = evidence.own_serving(text)
    assert got["batch"] is None or (isinstance(got["batch"], int) and 0 <= got["batch"] < 10**9)
    assert got["ubatch"] is None
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("text", [
    "-b, --batch-size" + " " * 1_000_000 + "-",
    "-b " + " -" * 500_000,
    " \t" * 500_000 + "--batch-size x",
    ("-b,    --batch-size N" + "  -x" * 300 + "  (default: 3)\n") * 2000,
])
def test_help_made_to_backtrack_is_read_in_linear_time(text):
    t0 = time.monotonic()
    evidence.help_default(text, "--batch-size")
    assert time.monotonic() - t0 < 2.0
