"""A CPU build's own figures (what a reference-kind evidence document carries, and what a machine
that pulls it measures again) record how llama-perplexity held the model: its batch defaults read
from its own --help, the KV cache type, the loading and the sequences; `store show` lists them.

tests/data/llama-perplexity-help-0.3.9.txt: lines 20-35 of `bin/llama-perplexity --help` of a
rocforge CPU build of llama.cpp from llama-cpp-python 0.3.9's PyPI sdist (commit b1d23df0bbd3),
captured as printed, 2026-11-29."""

from __future__ import annotations

from pathlib import Path

from rocforge_build.substitute import catalog, evidence

HELP = (Path(__file__).resolve().parent / "data" / "llama-perplexity-help-0.3.9.txt").read_text()


def test_the_batch_defaults_are_read_from_the_programs_own_help():
    assert evidence.help_default(HELP, "--batch-size") == 2048
    assert evidence.help_default(HELP, "--ubatch-size") == 512
    assert evidence.help_default(HELP, "--ctx-size") == 512


def test_an_option_without_a_default_or_absent_is_none():
    assert evidence.help_default(HELP, "--no-such-option") is None
    assert evidence.help_default("-b N, --batch-size N  batch size for prompt processing\n", "--batch-size") is None
    # --batch-size is not --batch-size-max, nor a word of another option's description
    assert evidence.help_default("--batch-size-max N     at most (default: 7)\n"
                                 "-x, --x N              as --batch-size does (default: 9)\n", "--batch-size") is None


def test_an_own_figure_carries_its_serving_and_store_show_lists_it():
    figure = evidence.OwnFigure(512, 1, True, 15.43, **evidence.own_serving(HELP))
    doc = figure.to_json()
    assert doc == {"ctx": 512, "chunks": 1, "fa": True, "ppl": 15.43, "batch": 2048, "ubatch": 512,
                   "kv": "f16", "load": "mmap", "parallel": 1}
    shown = {"own_figures": [doc]}
    assert catalog._own_serving(shown["own_figures"][0]) == "b 2048 ub 512, kv f16 load mmap slots 1"
    # a figure published before they were recorded says so, and compares as before
    old = {"ctx": 512, "chunks": 1, "fa": True, "ppl": 15.43}
    assert catalog._own_serving(old) == "serving not recorded"
    assert evidence.compare_own([figure], [old], "Q4_1") is not None
