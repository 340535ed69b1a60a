"""The command reference, generated from rocforge's own argparse parser at every docs build.

Nothing generated is committed, so the pages cannot drift from the code: `mkdocs build` (and
`mkdocs serve`) call `on_config` and `on_files` below, which write one page per command
(`reference/commands/<name>.md`) from `rocforge_build.cli.build_parser`, every subcommand and
option with its help. `pages()` needs no MkDocs, so tests/test_docs_commands.py checks it alone.
"""

from __future__ import annotations

import argparse
import re

PREFIX = "reference/commands"
_NAV_TITLE = "Commands"  # the nav entry in mkdocs.yml that this hook fills with the pages
_WIDTH = 100  # usage lines wrap here, whatever terminal the build runs in


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Each shipped command's own parser, complete (the CLI adds a command's arguments only when
    that command is chosen, so each is built on its own)."""
    from rocforge_build import cli

    found = {}
    for name in cli._available():
        top = cli.build_parser(name)
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        found[name] = sub.choices[name]
    return found


def _subcommands(parser: argparse.ArgumentParser):
    """(name, help, parser) of each subcommand, in the order the command declares them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, child in action.choices.items():
                yield name, helps.get(name) or child.description or "", child


_SPECIAL = re.compile(r"([\\*_\[\]|#])")  # backslash-escapable; < and > become entities


def _text(s: str) -> str:
    """Help text as Markdown: `code spans` kept, every other character that Markdown would read
    (emphasis, HTML, links, table bars) escaped, so help is shown exactly as --help prints it."""
    parts = re.split(r"(`[^`]*`)", s)
    return "".join(p if p.startswith("`") and p.endswith("`") and len(p) > 1
                   else _SPECIAL.sub(r"\\\1", p).replace("<", "&lt;").replace(">", "&gt;")
                   for p in parts)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _invocation(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=_WIDTH)
    return formatter._format_action_invocation(action)


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    if not action.help:
        return ""
    formatter = argparse.HelpFormatter(parser.prog, width=_WIDTH)
    return " ".join(formatter._expand_help(action).split())


def _section(parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = ["```text", _usage(parser), "```", ""]
    if parser.description:
        out += [_text(" ".join(parser.description.split())), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS
                   and not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)]
        if not actions:
            continue
        out += [f"{'#' * (level + 1)} {group.title.capitalize()}", ""]
        for action in actions:
            help_text = _help(action, parser)
            line = f"- `{_invocation(action, parser)}`"
            out.append(f"{line}: {_text(help_text)}" if help_text else line)
        out.append("")
    if parser.epilog:
        out += [_text(" ".join(parser.epilog.split())), ""]
    for _name, help_text, child in _subcommands(parser):
        out += [f"{'#' * (level + 1)} `{child.prog}`", ""]
        if help_text and help_text != child.description:
            out += [_text(help_text), ""]
        out += _section(child, level + 1)
    return out


def pages() -> dict[str, str]:
    """{path under docs/: Markdown} for the index and one page per command."""
    from rocforge_build import cli

    parsers = _parsers()
    result = {}
    index = ["# Commands", "",
             "Generated from rocforge's own parser (`rocforge COMMAND --help` prints the same).", "",
             "Every command takes the global option `--root DIR`: "
             + _text(next(a.help for a in cli.build_parser(None)._actions if "--root" in a.option_strings))
             + ".", "",
             "| command | what it does |", "| --- | --- |"]
    for name, parser in parsers.items():
        summary = cli.COMMANDS[name][1]
        index.append(f"| [`rocforge {name}`]({name}.md) | {_text(summary)} |")
        lead = [] if parser.description else [_text(summary), ""]  # else the description says it
        body = [f"# rocforge {name}", ""] + lead + _section(parser, 1)
        result[f"{PREFIX}/{name}.md"] = "\n".join(body).rstrip() + "\n"
    index += ["", "Exit codes, for every command: see [Exit codes](../exit-codes.md)."]
    result[f"{PREFIX}/index.md"] = "\n".join(index) + "\n"
    return result


# ---- MkDocs glue -------------------------------------------------------------------------------

_GENERATED: dict[str, str] = {}


def on_config(config):
    """Fill the nav entry `Commands` (mkdocs.yml) with the generated pages, in the CLI's order."""
    _GENERATED.clear()
    _GENERATED.update(pages())
    entries = [f"{PREFIX}/index.md"] + [
        {f"rocforge {path.rsplit('/', 1)[1][:-3]}": path}
        for path in _GENERATED if not path.endswith("/index.md")]

    def fill(items):
        for i, item in enumerate(items or []):
            if isinstance(item, dict):
                (title, value), = item.items()
                if title == _NAV_TITLE:
                    items[i] = {title: entries}
                elif isinstance(value, list):
                    fill(value)

    fill(config["nav"])
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, text in _GENERATED.items():
        files.append(File.generated(config, path, content=text))
    return files
