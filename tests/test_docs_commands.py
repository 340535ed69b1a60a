"""The command reference of the documentation site is generated from the CLI's own parser
(docs/hooks/commands.py). These tests run the generator without MkDocs (the strict site build is
`nox -s docs`, which CI runs): every command, subcommand and option of the real parser is on its
page with its help, and help text cannot break the Markdown around it."""

from __future__ import annotations

import argparse
import html
import importlib.util
import re
from pathlib import Path

import pytest
from docs_hooks import load_hook

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gen():
    return load_hook("commands")


@pytest.fixture(scope="module")
def pages(gen):
    return gen.pages()


def test_one_page_per_shipped_command(pages):
    from rocforge_build import cli

    shipped = {name for name in cli.COMMANDS
               if importlib.util.find_spec(cli.COMMANDS[name][0]) is not None}
    assert {p for p in pages if not p.endswith("index.md")} == {
        f"reference/commands/{name}.md" for name in shipped}
    # the commands every guide relies on (README's main path) are among them
    for name in ("doctor", "nightly", "env", "build", "verify", "tune", "serve"):
        assert f"reference/commands/{name}.md" in pages
        assert f"[`rocforge {name}`]({name}.md)" in pages["reference/commands/index.md"]


def _walk(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, (*path, name))


def test_every_subcommand_and_option_is_documented(gen, pages):
    for name, parser in gen._parsers().items():
        page = pages[f"reference/commands/{name}.md"]
        for path, sub in _walk(parser):
            if path:
                assert f"`rocforge {name} {' '.join(path)}`" in page, (name, path)
            for action in sub._actions:
                if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                    continue
                for option in action.option_strings:
                    assert re.search(rf"(?:`|, ){re.escape(option)}[ ,`]", page), (name, path, option)
                if action.help and action.help is not argparse.SUPPRESS:
                    words = re.sub(r"%\([a-z_]+\)s", "", action.help).split()[:4]
                    plain = " ".join(words).replace("`", "")
                    assert plain[:20] in html.unescape(re.sub(r"[`\\]", "", page)), (
                        name, path, action.dest)


def test_known_options_with_their_help(pages):
    """Facts of the CLI that the guides depend on, stated here, not read from the parser."""
    build = pages["reference/commands/build.md"]
    assert "- `--dry-run`" in build and "- `--target GFX`" in build
    nightly = pages["reference/commands/nightly.md"]
    for action in ("list", "install", "installed", "use", "prune", "pip"):
        assert f"## `rocforge nightly {action}`" in nightly
    assert "- `--gate`: install beside the others" in nightly
    assert "- `--keep N`: installs to keep (default nightly.keep)" in nightly
    # the global option is explained once, on the index
    assert "--root DIR" in pages["reference/commands/index.md"]


def test_help_text_is_escaped_not_interpreted(gen):
    parser = argparse.ArgumentParser(prog="rocforge demo", description="a *demo* for <gfx>")
    parser.add_argument("--out", metavar="FILE", default="x.tar",
                        help="writes <prefix>/a_b_c | [link](x) *not bold*, `code *kept*` (default %(default)s)")
    text = "\n".join(gen._section(parser, 1))
    assert "writes &lt;prefix&gt;/a\\_b\\_c \\| \\[link\\](x) \\*not bold\\*, `code *kept*` (default x.tar)" in text
    assert "a \\*demo\\* for &lt;gfx&gt;" in text
    assert "```text\nrocforge demo [-h] [--out FILE]\n```" in text


def test_mkdocs_nav_names_the_generated_reference():
    """mkdocs.yml's `Commands` entry is the one the hook fills (a renamed entry would leave the
    generated pages out of the navigation)."""
    text = (ROOT / "mkdocs.yml").read_text()
    assert "- Commands: reference/commands/index.md" in text
    assert "- docs/hooks/commands.py" in text
