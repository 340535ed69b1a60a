"""The whole argparse tree of `rocforge`: every command, subcommand, option and positional says
what it is for, and the same kind of value has the same name (metavar) everywhere (issue 24)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from rocforge_build.cli import COMMANDS, build_parser, main
from rocforge_build.commands import bundle

# The metavar convention: a value of one kind has one name in every command's help, and that
# name means only that kind (",..." marks a comma-separated list of them).  Each kind lists the
# options (longest spelling) and positionals (dest) that take it.
KINDS = {
    "GGUF": {"--model", "--verify", "--bench"},  # a model file
    "PREFIX": {"--prefix", "--reference", "--build", "prefix", "prefixes"},  # an install prefix
    "GFX": {"--target", "--targets", "names"},  # a GPU target (gfx1151, ...)
    "B": {"--backend", "--backends"},  # a backend of a recipe
    "RECIPE": {"recipe", "name", "--clear"},  # a recipe name or .toml file
    "REF": {"--ref", "--good", "--bad"},  # a git tag, branch or commit
    "N": {"--jobs", "--reps", "--threads", "--iters", "--limit", "--keep", "--n-prompt",
          "--n-gen", "--max-ctx", "--port", "--depth", "--ubatch", "--ctx"},  # a whole number
    "S": {"--timeout", "--wait", "--request-timeout"},  # seconds
    "PCT": {"--threshold"},  # a percentage
    "VERSION": {"--version", "--nightly", "version", "--versions", "--nightlies"},  # a version (nightly, preset, release)
}
# one option spelling, several kinds of value (each use is still one of the names above or
# says its format): --out is a directory or an archive, --run a command or a run number, ...
SPELLED_ALIKE = {"--out", "--run", "--source", "--env", "--fa"}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    """(path, action) for every argument below parser; ("sub", path, name, help) per subcommand."""
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield ("sub", path, name, helps.get(name))
                yield from _walk(sub, (*path, name))
            continue
        yield ("arg", path, action)


def _parsers():
    """Every command's parser (each built as when it is the one chosen), and the parsers of the
    bundle actions `check` and `unpack`, which are words of bundle's positional."""
    top = build_parser(None)
    yield (), top
    for name in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]
        yield (name,), sub
        if name == "bundle":
            for action in ("check", "unpack"):
                yield (name, action), bundle.action_parser(sub, action)


def _key(action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


PARSERS = dict(_parsers())  # built once: each command module is imported once


def _with_subcommands(parsers: dict) -> dict:
    """The parsers and every subcommand parser below them (`nightly install`, ...)."""
    out = {}
    for path, parser in parsers.items():
        out[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and path:
                out.update(_with_subcommands({(*path, n): p for n, p in action.choices.items()}))
    return out


def _arguments():
    seen = []
    for path, parser in PARSERS.items():
        for item in _walk(parser, path):
            if item[0] == "arg" and path == () and item[2].dest == "command":
                continue
            if path == () and item[0] == "sub":
                continue  # the top parser's table is checked below, each command on its own
            seen.append(item)
    return seen


ITEMS = _arguments()
ARGS = [(item[1], item[2]) for item in ITEMS if item[0] == "arg"]


def _label(path, action) -> str:
    return f"rocforge {' '.join(path)} {_key(action)}".replace("  ", " ")


def test_the_walk_sees_the_whole_tree():
    """The walk is not vacuous: it reaches options several levels down and the bundle actions."""
    labels = {_label(p, a) for p, a in ARGS}
    assert {"rocforge nightly install --layer", "rocforge results compare --threshold",
            "rocforge bundle unpack --into", "rocforge config set value", "rocforge --root",
            "rocforge preset export --format"} <= labels
    assert len(ARGS) > 200


def test_every_command_and_subcommand_has_help():
    top = build_parser(None)._subparsers._group_actions[0]
    top_help = {a.dest: a.help for a in top._choices_actions}
    missing = [name for name in COMMANDS if not top_help.get(name)]
    missing += [" ".join((*item[1], item[2])) for item in ITEMS if item[0] == "sub" and not item[3]]
    assert missing == []


def test_every_option_and_positional_has_help():
    missing = [_label(p, a) for p, a in ARGS if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_every_value_is_named():
    """An option that takes a value names it (or lists its choices): no argparse default such
    as PLATFORM from the dest, or a lower-case positional name."""
    unnamed = [_label(p, a) for p, a in ARGS if a.nargs != 0 and not a.metavar and not a.choices]
    assert unnamed == []


def test_one_kind_of_value_one_name():
    wrong = []
    for path, action in ARGS:
        key, name = _key(action), (action.metavar or "")
        base = name.removesuffix(",...")
        for metavar, keys in KINDS.items():
            if key in keys and not action.choices and action.nargs != 0 and base != metavar:
                wrong.append(f"{_label(path, action)}: {name or None}, the convention is {metavar}")
            if base == metavar and key not in keys:
                wrong.append(f"{_label(path, action)}: {metavar} is the name of another kind of value")
    assert wrong == []


def test_one_option_spelling_one_metavar():
    """The same option in two commands shows the same metavar (FILE.md and FILE are both a
    file; a list of choices names itself), unless it is one of the few spellings whose value
    differs by command (SPELLED_ALIKE)."""
    names: dict[str, set[str]] = {}
    for _path, action in ARGS:
        if action.option_strings and action.metavar:
            names.setdefault(_key(action), set()).add(action.metavar.split(".")[0])
    mixed = {k: v for k, v in names.items() if len(v) > 1 and k not in SPELLED_ALIKE}
    assert mixed == {}


ALL_PARSERS = _with_subcommands(PARSERS)


@pytest.mark.parametrize("path", list(ALL_PARSERS), ids=lambda p: " ".join(p) or "top")
def test_every_help_renders(path):
    """argparse formats help lazily: a stray % in a help string only fails when a person asks."""
    parser = ALL_PARSERS[path]
    text = parser.format_help()
    assert text.startswith(f"usage: rocforge{' ' if path else ''}{' '.join(path)}")


def _help(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 0
    return out.getvalue()


@pytest.mark.parametrize("action", ["check", "unpack"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bundle_actions_show_their_own_help(action, flag):
    """`bundle check --help` used to print the pack form's help (check and unpack are words of
    bundle's positional, so argparse's --help belonged to the parent)."""
    for argv in (["bundle", action, flag], ["bundle", action, "some.tar.gz", flag]):
        text = _help(*argv)
        assert text.startswith(f"usage: rocforge bundle {action} ")
        assert "--target" not in text and "--out" not in text and "PREFIX|RECIPE" not in text
    assert ("--into DIR" in text) == (action == "unpack")


def test_bundle_help_is_still_the_pack_form():
    text = _help("bundle", "--help")
    assert text.startswith("usage: rocforge bundle PREFIX|RECIPE [--target GFX]")
    assert "--out FILE" in text and "rocforge bundle check FILE|DIR" in text
    assert _help("bundle", "/opt/some/prefix", "--help") == text  # a prefix is not an action
