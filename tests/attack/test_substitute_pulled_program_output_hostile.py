"""What a pulled build's own programs print is a store's bytes, read before the pull is verified
here: llama-perplexity's --help (the batch defaults its own figures record,
substitute/evidence.own_serving) and a Vulkan build's ggml-vulkan device lines (the verified-here
fingerprint, measure/provenance.vulkan_devices).  Whatever they print — a default of thousands of
digits (Python's int() refuses past 4,300), a negative or non-numeric one, lines of megabytes,
control characters, backtracking bait, nothing — gives a bounded value or None, in linear time,
and never an exception."""

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


@pytest.mark.parametrize("text", [
    "ggml_vulkan: 0 = " + "(" * 1_000_000,
    ("ggml_vulkan: 0 = " + "a (b) " * 300 + "\n") * 3000,
    "ggml_vulkan: 0 = x (y) | uma: 0\n" * 100_000,
    "ggml_vulkan: " + "9" * 5000 + " = x (y) | uma: 0\n",
])
def test_a_pulled_builds_vulkan_lines_are_read_bounded_and_in_linear_time(text):
    """provenance.vulkan reads what a pulled Vulkan build's program prints (the verified-here
    evidence): at most 16 devices, short lines, no backtracking."""
    from rocforge_build.measure import provenance

    t0 = time.monotonic()
    got = provenance.vulkan_devices(text)
    assert len(got) <= 16 and time.monotonic() - t0 < 2.0
