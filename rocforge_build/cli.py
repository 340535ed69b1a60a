"""The thin command line: parse, dispatch, turn errors into one clear message and an exit code.

Commands are a table (name -> module, help).  Only the chosen command's module is imported, so
`rocforge env` pays for nothing else at shell start-up.  A command module provides
`add_arguments(parser)` and `run(args) -> int`; `args.rootfs` is the `Root` to inspect.
"""

from __future__ import annotations

import os
import sys

from rocforge_build import __version__
from rocforge_build.errors import RocforgeError

COMMANDS: dict[str, tuple[str, str]] = {
    "targets": ("rocforge_build.commands.targets", "list the GPU targets rocforge knows"),
    "env": ("rocforge_build.commands.env", "print the environment for the resolved ROCm stack"),
    "use": ("rocforge_build.commands.use", "choose the build of a recipe that `rocforge env` puts on PATH"),
    "doctor": ("rocforge_build.commands.doctor", "show GPUs, ROCm installs and every decision"),
    "nightly": ("rocforge_build.commands.nightly", "list, install and switch TheRock nightlies"),
    "config": ("rocforge_build.commands.config", "read and change rocforge's configuration"),
    "recipe": ("rocforge_build.commands.recipe", "list the build recipes; show one"),
    "recipes": ("rocforge_build.commands.recipes", "alias of `rocforge recipe list`"),
    "build": ("rocforge_build.commands.build", "build a recipe for a GPU target"),
    "kernels": ("rocforge_build.commands.kernels", "build and run rocforge's own HIP kernels"),
    "container": ("rocforge_build.commands.container", "render, build and run container images"),
    "host": ("rocforge_build.commands.host", "print the host changes an APU needs (never applies them)"),
    "verify": ("rocforge_build.commands.verify", "check a llama.cpp build's output against a reference build"),
    "bench": ("rocforge_build.commands.bench", "measure llama.cpp builds (gated by verify) into the results store"),
    "results": ("rocforge_build.commands.results", "list, show, export, compare and plot stored results"),
    "tune": ("rocforge_build.commands.tune", "build, gate and measure candidates; store the winner as a preset"),
    "preset": ("rocforge_build.commands.preset", "show, list, pick and export the tuned commands for a model"),
    "serve": ("rocforge_build.commands.serve", "serve a model with its tuned, verified preset (llama-server)"),
    "bundle": ("rocforge_build.commands.bundle", "pack a build into a relocatable archive; check one"),
    "upgrade": ("rocforge_build.commands.upgrade", "rebuild a build with new inputs; swap it in only if every gate passes"),
    "rollback": ("rocforge_build.commands.rollback", "put back the build `rocforge upgrade` replaced"),
    "bisect": ("rocforge_build.commands.bisect", "find the first bad commit, release or nightly between a good and a bad one"),
    "cache": ("rocforge_build.commands.cache", "list and clean rocforge's caches: sources, work dirs, compiler cache, references"),
    "key": ("rocforge_build.commands.key", "make, rotate and revoke the keys that sign the builds you publish"),
    "publish": ("rocforge_build.commands.publish", "push a verified build and its evidence, signed, to a substitute store"),
    "store": ("rocforge_build.commands.store", "list what a substitute store holds; show one build's evidence; gc"),
}

_GLOBAL_WITH_VALUE = {"--root"}


def _selected_command(argv: list[str]) -> str | None:
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in _GLOBAL_WITH_VALUE:
            skip = True
            continue
        if token.startswith("-"):
            continue
        return token if token in COMMANDS else None
    return None


def _available() -> dict[str, tuple[str, str]]:
    """Commands whose module is present (the table may name commands not yet shipped)."""
    from importlib.util import find_spec

    return {name: entry for name, entry in COMMANDS.items() if find_spec(entry[0]) is not None}


def _parser_class(argv: tuple[str, ...]):
    """argparse's parser, plus what Python 3.11's lacks: "did you mean" for a misspelled option
    or command, and the list of actions when a command's action is missing; `argv`, the command
    line being parsed, is what those suggestions are about."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def _options(self) -> list[str]:
            """Long options of this parser and of the subcommand parsers below it (the top
            parser reports the subcommand's unrecognized arguments)."""
            own = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            sub = self._choices()
            below = [o for p in (sub.choices.values() if sub else ()) for o in p._options()]
            return list(dict.fromkeys(own + below))

        def _choices(self):
            return next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)),
                        None)

        def error(self, message: str):
            import difflib
            import re

            hints = []
            bad = re.search(r"invalid choice: '([^']*)'", message)
            sub = self._choices()
            # an unknown command's options are unknown only because the command is: name the
            # command, not each of its options
            options_judged = not (bad and sub is not None)
            known = set(self._options()) | {"--root", "--version", "--help"}
            for token in argv if options_judged else ():
                name = token.split("=", 1)[0]
                if name.startswith("--") and name not in known:
                    close = difflib.get_close_matches(name, self._options(), n=1)
                    hints.append(f"{name}: did you mean {close[0]}?" if close
                                 else f"{name}: no such option (see {self.prog} --help)")
            if bad and sub is not None:
                close = difflib.get_close_matches(bad.group(1), list(sub.choices), n=1)
                if close:
                    hints.append(f"did you mean {close[0]!r}?")
            if "required: ACTION" in message and sub is not None:
                hints.append(f"actions: {', '.join(sub.choices)} "
                             f"(`{self.prog} ACTION --help` for each)")
            # one `rocforge: error:` line like every other error (argparse's own form is the
            # usage block and `rocforge CMD: error:`), naming the command it is about
            where = self.prog.removeprefix("rocforge").strip() or _selected_command(list(argv)) or ""
            report("error", f"{where + ': ' if where else ''}{message}")
            for hint in hints or [f"`rocforge {where + ' ' if where else ''}--help` lists what "
                                  "it takes"]:
                report("hint", hint)
            raise SystemExit(2)

    return Parser


def build_parser(selected: str | None,
                 argv: tuple[str, ...] = ()) -> argparse.ArgumentParser:  # noqa: F821 (lazy import)
    # argparse is imported lazily (in _parser_class): `rocforge env` from its cache never needs it
    parser = _parser_class(tuple(argv))(
        prog="rocforge",
        description="Build orchestration and environment provisioning for AMD GPUs on ROCm.",
    )
    parser.add_argument("--version", action="version", version=f"rocforge {__version__}")
    parser.add_argument(
        "--root", metavar="DIR", default=os.environ.get("ROCFORGE_ROOT", "/"),
        help="inspect DIR as the filesystem root (sysfs, /dev, /opt, /usr, /etc); "
        "every path printed is as seen from inside it",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    table = {selected: COMMANDS[selected]} if selected else _available()
    for name, (module, help_text) in COMMANDS.items():
        if name not in table:
            continue
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            import importlib

            importlib.import_module(module).add_arguments(sp)
            _show_ranges(sp)
    return parser


def _show_ranges(parser) -> None:
    """Append each numeric flag's range (its argtypes type's `range_text`) to its help, so
    --help and the generated command reference cannot disagree with what the parser accepts."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_ranges(child)
            continue
        shown = getattr(action.type, "range_text", None)
        if shown and action.help and action.help is not argparse.SUPPRESS:
            action.help = f"{action.help} [{shown}]"


def _plain_env_args(argv: list[str]):
    """The arguments of a plain `rocforge [--root R] env [--shell S] [--target GFX] [--rocm
    PATH]` read without argparse, whose import and set-up are most of what an uncached `rocforge
    env` pays for itself; None for anything else (--json, --help, an abbreviation, a --shell
    that is not one of its choices, a value that looks like an option), which argparse reads
    and words the errors of, as for every other command."""
    from rocforge_build.discover.envcache import plain_env

    got = plain_env(argv, os.environ)
    if got is None:
        return None
    root, opts = got
    from rocforge_build.discover.envscript import SHELLS

    if opts["--shell"] is not None and opts["--shell"] not in SHELLS:
        return None
    if any(v is not None and v.startswith("-") for v in (root, *opts.values())):
        return None
    from types import SimpleNamespace

    return SimpleNamespace(command="env", root=root, shell=opts["--shell"], json=False,
                           target=opts["--target"], rocm=opts["--rocm"])


def _fail(message: str, hint: str | None, code: int) -> int:
    report("error", message)
    if hint:
        report("hint", hint)
    return code


def report(label: str, text: str) -> None:
    """`rocforge: LABEL: TEXT` on stderr, where text a user, a file or a build gave can neither
    forge a line nor drive the terminal: a message of several lines by design (a failed build's
    log tail, the outputs an install lacks) keeps them, each further one indented (never starting
    `rocforge:`), and every terminal control character is written as its escape (`\\x1b`); a
    credential the text may carry (credentials.py) is blanked."""
    from rocforge_build.credentials import redact

    first, *rest = redact(text).splitlines() or [""]
    lines = [f"rocforge: {label}: {_escaped(first)}"]
    lines += [_escaped(line) if line[:1] in (" ", "\t", "") else "  " + _escaped(line)
              for line in rest]
    sys.stderr.write("\n".join(lines) + "\n")


def _escaped(line: str) -> str:
    from rocforge_build.shellsafe import escaped

    return escaped(line)


def unusable_path(exc: BaseException):
    """The one-line error for a path no command can use — a symbolic link loop or a name too
    long for the file system — wherever a user's path met it (resolve, stat, open); None for
    any other error.  Python 3.11's Path.resolve() reports a loop as RuntimeError("Symlink loop
    from ..."), later versions and the system calls as OSError ELOOP (path_resolution(7))."""
    import errno

    from rocforge_build.errors import UsageError

    if isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):
        name = os.fsdecode(exc.filename) if exc.filename is not None else "a path given"
        if exc.errno == errno.ELOOP:
            return UsageError(f"{name}: a symbolic link loop (too many levels of symbolic links)",
                              "give a path whose links end in a file or directory")
        return UsageError(f"{name[:120]}{'...' if len(name) > 120 else ''}: the name is too long "
                          "for the file system (ENAMETOOLONG)", "give a shorter path")
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if (isinstance(exc, RuntimeError) and str(exc).startswith("Symlink loop from ")
            and tb is not None and tb.tb_frame.f_code.co_filename.endswith("pathlib.py")):
        name = str(exc).removeprefix("Symlink loop from ").strip("'\"")  # a repr()
        return UsageError(f"{name}: a symbolic link loop (too many levels of symbolic links)",
                          "give a path whose links end in a file or directory")
    return None


def main(argv: list[str] | None = None) -> int:
    program = argv is None  # the process's own command line: the process ends when main returns
    if program:  # a path or name the terminal's encoding cannot show is escaped, not a crash
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = _selected_command(argv)
    if selected != "env":
        return _main(argv, selected)
    # `rocforge env` runs at every shell start-up and exits.  The cyclic garbage collector's
    # passes over the objects its imports create, and the full collection at interpreter exit,
    # cost more of its start-up than the few dozen objects in cycles a run leaves are worth
    # (reference counting frees the rest; docs/measurements/env.md has the figures).  So the
    # collector is off for the run; as
    # the program (`python -m rocforge_build`, the console script) it stays off through the exit,
    # and a caller that passed argv (tests, in-process) gets it back when main returns.
    import gc

    if not gc.isenabled():
        return _main(argv, selected)
    gc.disable()
    try:
        return _main(argv, selected)
    finally:
        if not program:
            gc.enable()


def _main(argv: list[str], selected: str | None) -> int:
    if selected == "env":  # shell start-up path: a validated cached answer, before argparse
        from rocforge_build.discover.envcache import lookup

        cached = lookup(argv)
        if cached is not None:
            from rocforge_build import shellsafe
            from rocforge_build.discover import envwarnings

            shellsafe.write_script(cached)
            envwarnings.to_stderr(envwarnings.from_script(cached))
            return 0
    try:
        args = _plain_env_args(argv) if selected == "env" else None
        if args is None:
            parser = build_parser(selected, tuple(argv))
            args = parser.parse_args(argv)
            if not args.command:
                parser.print_help()
                return 2
        from rocforge_build.rootfs import Root

        if not os.path.isdir(args.root):
            return _fail(f"--root {args.root!r} is not a directory", "give an existing directory", 2)
        args.rootfs = Root(args.root)
        from rocforge_build import signals

        signals.install()  # SIGTERM/SIGHUP: the same clean-up as Ctrl-C
        args.argv = argv
        # __import__, not importlib.import_module: importlib (and its `warnings`) would be
        # imported by every `rocforge env` at shell start-up for this one call
        module = __import__(COMMANDS[args.command][0], fromlist=("run",))
        return int(module.run(args) or 0)
    except RocforgeError as exc:
        return _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt as exc:
        from rocforge_build.signals import exit_code

        code, name = exit_code(exc)
        sys.stderr.write(f"rocforge: interrupted ({name})\n")
        return code
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last guard: a bug, reported without a traceback
        from rocforge_build.paths import unwritable

        refused = unwritable(exc) if isinstance(exc, OSError) else None
        refused = refused or unusable_path(exc)
        if refused is not None:  # a read-only HOME/cache/data/config: the user's to fix
            return _fail(refused.message, refused.hint, refused.exit_code)
        if os.environ.get("ROCFORGE_DEBUG"):
            raise
        return _fail(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a rocforge bug; run again with ROCFORGE_DEBUG=1 for the traceback and report it",
            70,
        )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
