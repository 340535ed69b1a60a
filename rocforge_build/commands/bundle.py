"""`rocforge bundle PREFIX|RECIPE --target GFX --out FILE`, `bundle check FILE`,
`bundle unpack FILE [--into DIR]`: relocatable archives of a build (see ship/bundle.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rocforge_build.errors import IntegrityError, UsageError
from rocforge_build.shellsafe import one_line

_ACTIONS = ("check", "unpack")


_ACTION_HELP = {
    "check": ("verify a bundle's files against bundle.toml and say on which GPUs here it runs",
              "FILE|DIR", "a bundle archive, or the folder `bundle unpack` made"),
    "unpack": ("unpack a bundle safely (no links or paths out of DIR) and verify it",
               "FILE", "a bundle archive (.tar.gz, .tar.zst or .zip)"),
}


def action_parser(parent, action: str):
    """The parser `rocforge bundle ACTION --help` prints: `check` and `unpack` arrive as the
    first word of PREFIX|RECIPE (a bundle is made from any prefix, so they cannot be argparse
    subcommands beside it); their help lists only what they take."""
    summary, metavar, file_help = _ACTION_HELP[action]
    p = type(parent)(prog=f"{parent.prog} {action}", description=summary)
    p.add_argument("file", metavar=metavar, help=file_help)
    if action == "unpack":
        p.add_argument("--into", metavar="DIR", default=".",
                       help="the directory that gets the bundle's folder (default: .)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _own_help(parser) -> None:
    """`-h/--help` after `check` or `unpack` prints that action's help, not the pack form's."""
    import argparse

    class ActionHelp(argparse._HelpAction):
        def __call__(self, parser, namespace, values, option_string=None):
            what = getattr(namespace, "what", None) or []
            if what and what[0] in _ACTIONS:
                action_parser(parser, what[0]).print_help()
                parser.exit()
            super().__call__(parser, namespace, values, option_string)

    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            action.__class__ = ActionHelp


def add_arguments(parser) -> None:
    parser.usage = ("rocforge bundle PREFIX|RECIPE [--target GFX] [--backend B] --out FILE.tar.gz|.tar.zst|.zip\n"
                    "       rocforge bundle check FILE|DIR [--json]\n"
                    "       rocforge bundle unpack FILE [--into DIR] [--json]")
    parser.description = (
        "Pack a build into one archive that runs from any directory on a machine with only the "
        "kernel driver: the prefix, its library closure (without glibc and the GPU drivers), RUNPATHs "
        "rewritten to $ORIGIN, rocBLAS/hipBLASLt/kpack kernel files trimmed to the target, a `run` "
        "launcher with the build's run-time env, the manifest, and bundle.toml (every file's sha256). "
        "`check` verifies the hashes and says on which GPUs here it runs; `unpack` unpacks safely "
        "(`rocforge bundle check --help`, `rocforge bundle unpack --help`).")
    parser.add_argument("what", nargs="+", metavar="PREFIX|RECIPE",
                        help="an install prefix or a recipe (the build rocforge made); or `check FILE`, "
                        "`unpack FILE`")
    parser.add_argument("--target", metavar="GFX", help="the GPU target of the build (a CPU or Vulkan "
                        "build, made for no GPU target, needs none)")
    parser.add_argument("--backend", metavar="B", help="the backend of the build (a recipe built with several)")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="the archive: .tar.gz, .tar.zst (needs the zstd program) or .zip; replaces "
                        "only a bundle rocforge made")
    parser.add_argument("--into", type=Path, metavar="DIR", default=Path("."),
                        help="unpack: the directory that gets the bundle's folder (default: .)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    _own_help(parser)


def run(args) -> int:
    from rocforge_build.ship import bundle

    what = list(args.what)
    if what[0] in _ACTIONS:
        if len(what) != 2:
            raise UsageError(f"bundle {what[0]} takes one FILE", f"rocforge bundle {what[0]} FILE")
        from rocforge_build import userpath  # a loop, FIFO or device: said so, exit 2

        userpath.require(what[1], "bundle", ("file", "directory") if what[0] == "check" else ("file",),
                         hint="give the bundle file (.tar.gz, .tar.zst, .zip) or its unpacked folder",
                         instead="a bundle archive")
        return _check(args, Path(what[1])) if what[0] == "check" else _unpack(args, Path(what[1]))
    if len(what) != 1:
        raise UsageError(f"one PREFIX or RECIPE, not {len(what)}: {' '.join(what)}")
    if not args.out:
        raise UsageError("bundle needs --out",
                         f"rocforge bundle {what[0]} --target gfx1151 --out build.tar.gz (--target: "
                         "a GPU build's target; a CPU or Vulkan build needs none)")
    result = bundle.make(what[0], target=args.target, backend=args.backend, out=args.out, root=args.rootfs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(bundle.describe_make(result)))
    return 0


def _check(args, path: Path) -> int:
    from rocforge_build.ship import bundle_check

    result = bundle_check.check(path, args.rootfs)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0 if not result.bad else IntegrityError.exit_code
    meta = result.info.get("bundle", {})
    files = len(result.info.get("file", []))
    shown = one_line(path)  # every line printed from a bundle goes through one_line
    if result.bad:
        for line in result.bad[:20]:
            print(f"  {one_line(line)}")
        more = f" (and {len(result.bad) - 20} more)" if len(result.bad) > 20 else ""
        raise IntegrityError(f"{shown}: {len(result.bad)} of {files} files do not match bundle.toml{more}",
                             "the bundle is damaged or was changed after it was made")
    named = meta.get("name")
    name = result.name if named in (None, result.name) else f"{named} (in the folder {result.name})"
    print(one_line(f"{shown}: {name}, {files} files, every sha256 matches"))
    said = {k: meta.get(k) or "unknown" for k in ("recipe", "backend", "rocforge", "made_at")}
    said["target"] = meta.get("target") or ("no GPU target" if "target" in meta else "unknown")
    print(one_line(f"  {said['recipe']} ({said['backend']}) for {said['target']}; "
                   f"made by rocforge {said['rocforge']} at {said['made_at']}"))
    for line in result.runs:
        print(f"  {one_line(line)}")
    sys.stdout.flush()
    return 0


def _unpack(args, path: Path) -> int:
    from rocforge_build.ship import bundle, bundle_unpack

    dest = bundle_unpack.unpack(path, args.into)
    if args.json:
        print(json.dumps({"unpacked": str(dest)}))
    else:
        print(one_line(f"rocforge: unpacked and verified {dest}; run {dest / bundle.LAUNCHER} PROGRAM [ARGS]"))
    return 0
