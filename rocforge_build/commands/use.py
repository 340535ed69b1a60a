"""`rocforge use [PREFIX]`, `rocforge use --clear RECIPE`: choose the build of a recipe whose
programs `rocforge env` puts on PATH (at most one per recipe; without a choice, the newest that
passed `rocforge verify`).  The choice lives in rocforge's data dir (`discover/choices.py`)."""

from __future__ import annotations

from pathlib import Path

from rocforge_build.errors import ConfigError, UsageError


def add_arguments(parser) -> None:
    parser.add_argument("prefix", nargs="?", metavar="PREFIX",
                        help="a build's install prefix (as `rocforge build` printed it); "
                        "none: list the choices")
    parser.add_argument("--clear", metavar="RECIPE",
                        help="forget the choice for RECIPE (the newest verified build is used again)")


def _build_name(prefix: str, rootfs) -> tuple[str, str]:
    """(recipe, prefix name) of a rocforge build in the builds directory, or a usage error."""
    from rocforge_build.discover import builds

    path = Path(prefix).expanduser()
    manifest = builds.read_manifest(path) if path.is_dir() else None
    recipe = (manifest or {}).get("recipe")
    if not isinstance(recipe, dict) or not isinstance(recipe.get("name"), str):
        raise UsageError(f"{path} is not a rocforge build (no readable {builds.MANIFEST})",
                         "give the prefix `rocforge build` printed (see `rocforge doctor`, "
                         "decision 'builds')")
    home = rootfs.host(builds.builds_dir(rootfs))
    if path.resolve().parent != Path(home).resolve():
        raise UsageError(f"{path} is a rocforge build outside the builds directory {home}",
                         "`rocforge env` only considers builds there; build without --prefix")
    return recipe["name"], path.resolve().name


def _write(current: dict, rootfs) -> Path:
    """Record the choices; a data dir that cannot be written is one line naming it."""
    from rocforge_build.discover import choices

    try:
        return choices.write_chosen(current, rootfs)
    except OSError as exc:
        where = exc.filename or rootfs.host(choices.data_dir(rootfs))
        raise ConfigError(f"cannot record the choice in {where}: {exc.strerror or exc}",
                          "make rocforge's data dir writable, or move it with "
                          "ROCFORGE_DATA_DIR") from None


def run(args) -> int:
    from rocforge_build.discover import choices

    if args.prefix and args.clear:
        raise UsageError("give PREFIX or --clear RECIPE, not both", "rocforge use --help")
    current = choices.chosen(args.rootfs)
    if args.clear:
        if current.pop(args.clear, None) is None:
            print(f"no build of {args.clear} was chosen; nothing to forget")
            return 0
        _write(current, args.rootfs)
        print(f"forgot the choice for {args.clear}: `rocforge env` puts its newest verified "
              "build on PATH")
        return 0
    if not args.prefix:
        if not current:
            print("no build chosen: `rocforge env` puts the newest build of each recipe that "
                  "passed `rocforge verify` on PATH")
        for recipe, (name, at) in sorted(current.items()):
            print(f"{recipe}  {name}  (chosen {at[:10]})")
        return 0
    recipe, name = _build_name(args.prefix, args.rootfs)
    current[recipe] = (name, choices.now())
    path = _write(current, args.rootfs)
    print(f"{recipe}: `rocforge env` now puts {name}/bin on PATH (recorded in {path})")
    return 0
