"""`rocforge nightly list|install|installed|use|prune|pip`: TheRock nightlies, safely."""

from __future__ import annotations

import json
import re
import sys

from rocforge_build import argtypes, config
from rocforge_build.errors import NetworkError, UsageError
from rocforge_build.nightly import listing, selection

_PREFIX_HELP = "where the nightlies are installed (default: nightly.prefix or the data dir)"


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def selection(p, *, family=True):
        p.add_argument("--target", metavar="GFX", help="GPU target (default: the detected GPU)")
        if family:
            p.add_argument("--family", metavar="GROUP",
                           help="a TheRock group instead of a target (gfx110X-all, multiarch, ...)")
        p.add_argument("--platform", metavar="PLATFORM", help="tarball platform (default: nightly.platform, linux)")
        p.add_argument("--index", metavar="URL", action="append", default=[],
                       help="read this listing instead of the configured sources (repeatable): "
                       "a CDN index page, an S3 bucket URL or a file:// mirror")

    p = sub.add_parser("list", help="nightlies serving a target, newest first")
    selection(p)
    p.add_argument("--limit", type=argtypes.count, default=None, metavar="N",
                   help="show at most N (default 30; 0 or --json: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("install", help="download, verify and unpack a nightly; point current at it")
    selection(p)
    p.add_argument("--version", default="latest", metavar="VERSION", help="a version from `nightly list` (default latest)")
    p.add_argument("--prefix", metavar="PREFIX", help=_PREFIX_HELP)
    p.add_argument("--layer", nargs="?", const="auto", metavar="BASE",
                   help="install BASE first and the target's package on top, same version "
                   "(no value: the target's fallback target, e.g. gfx110X for gfx1151)")
    p.add_argument("--sha256", metavar="SHA256", help="expected sha256 of the (top) tarball")
    p.add_argument("--force", action="store_true", help="reinstall even if the version is there")
    p.add_argument("--dry-run", action="store_true", help="show the choice, download nothing")
    p.add_argument("--json", action="store_true", help="print the install record as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--gate", action="store_true",
                   help="install beside the others; switch `current` only if every rocforge build "
                   "made against the current nightly passes `rocforge upgrade` onto the new one")
    p.add_argument("--model", metavar="GGUF", help="with --gate: verify and bench each build "
                   "(see `rocforge upgrade --model`)")
    p.add_argument("--run", metavar="CMD", help="with --gate: a gate command for each build "
                   "(see `rocforge upgrade --run`)")
    p.add_argument("--threshold", type=argtypes.percent, metavar="PCT",
                   help="with --gate --model: a figure this many percent slower fails (default 5)")

    p = sub.add_parser("installed", help="installed nightlies; * marks current")
    p.add_argument("--prefix", metavar="PREFIX", help=_PREFIX_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("use", help="point current at an installed version (roll back / forward)")
    p.add_argument("version", metavar="VERSION", help="a version or version directory from `nightly installed`")
    p.add_argument("--prefix", metavar="PREFIX", help=_PREFIX_HELP)

    p = sub.add_parser("prune", help="remove old installs and leftovers of interrupted runs")
    p.add_argument("--keep", type=argtypes.count, default=None, metavar="N", help="installs to keep (default nightly.keep)")
    p.add_argument("--prefix", metavar="PREFIX", help=_PREFIX_HELP)

    p = sub.add_parser("pip", help="the Python wheel route: print (or run) the pip command")
    p.add_argument("--target", metavar="GFX", help="GPU target (default: the detected GPU)")
    p.add_argument("--route", choices=("family", "multiarch"), default=None,
                   help="per-family index or the multi-arch index (default nightly.pip.route)")
    p.add_argument("--no-probe", action="store_true",
                   help="do not check which per-family index exists")
    p.add_argument("--install", action="store_true", help="run it with this Python")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    cfg = config.effective()
    return {
        "list": _list, "install": _install, "installed": _installed, "use": _use,
        "prune": _prune, "pip": _pip,
    }[args.action](args, cfg)


# -- helpers -------------------------------------------------------------------------------------

def _detected_target(args) -> str | None:
    try:
        from rocforge_build.discover import resolver
    except ImportError:
        return None
    try:
        return resolver.resolve(args.rootfs).target
    except Exception:  # detection trouble is not a reason to refuse a listing
        return None


def _groups(args, *, need: bool) -> tuple[list[str], str | None]:
    if getattr(args, "family", None):
        if args.target:
            raise UsageError("give --target or --family, not both")
        return listing.groups_for(family=args.family), None
    target = args.target or _detected_target(args)
    if target is None:
        if need:
            raise UsageError("no GPU target given and none detected",
                             "give --target GFX (see `rocforge targets`) or --family GROUP")
        return [], None
    return listing.groups_for(target=target), target


def _listings(args) -> selection.Listings:
    return selection.Listings(index=tuple(args.index), platform=args.platform)


def _warn(line: str) -> None:
    print(f"rocforge: warning: {line}", file=sys.stderr)


def _prefix(args, cfg):
    from rocforge_build.nightly import install

    return install.prefix_in_root(args.prefix, cfg, getattr(args, "rootfs", None))


def _shown(args, path) -> str:
    """A path as printed: inner to --root."""
    root = getattr(args, "rootfs", None)
    if root is None or root.is_host:
        return str(path)
    try:
        return str(root.inner(path))
    except ValueError:
        return str(path)


def _mb(size) -> str:
    from rocforge_build.progress import human_size

    return human_size(size)


# -- actions -------------------------------------------------------------------------------------

def _list(args, cfg) -> int:
    groups, target = _groups(args, need=False)
    entries = listing.for_groups(selection.read(_listings(args), cfg, _warn), groups)
    limit = args.limit if args.limit is not None else (None if args.json else 30)
    shown = entries[:limit] if limit else entries
    if args.json:
        print(json.dumps([e.to_json() for e in shown], indent=2))
        return 0
    what = (f"for {target} " if target else f"for {args.family} " if args.family else "")
    print(f"{len(entries)} nightlies {what}".rstrip()
          + (f" (groups in order of preference: {', '.join(groups)})" if groups else "")
          + (f"; newest {len(shown)} shown" if len(shown) < len(entries) else ""))
    if not shown:
        return 0
    width = max(len(e.version) for e in shown)
    fam = max(len(e.family) for e in shown)
    for e in shown:
        d = e.date.isoformat() if e.date else "-"
        print(f"  {e.version.ljust(width)}  {d:10}  {e.family.ljust(fam)}  {e.kind:10}  "
              f"{_mb(e.size):>9}  {e.source}")
    return 0


def _install(args, cfg) -> int:
    from rocforge_build.nightly import install
    from rocforge_build.workflows import nightly_install

    if args.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256.strip()):
        raise UsageError(f"--sha256 {args.sha256!r} is not a sha256 (64 hexadecimal digits)",
                         "copy the whole digest, e.g. from `sha256sum FILE`")
    gate = _gate_asked(args)  # checked before anything is listed or downloaded
    groups, target = _groups(args, need=True)
    asked = nightly_install.InstallAsked(
        listings=_listings(args),
        wanted=selection.Wanted(groups=tuple(groups), target=target, version=args.version,
                                layer=args.layer),
        sha256=args.sha256, force=args.force, progress=not args.no_progress and not args.json,
        gate=gate)
    chosen = nightly_install.choose(asked, cfg, _warn)
    layers = list(chosen.layers)
    if chosen.pinned_known_bad is not None:
        _warn(f"{chosen.pinned_known_bad}; installing it because --version pins it")
    prefix = _prefix(args, cfg)
    name = install.version_dir_name(layers)
    if args.dry_run:
        plan = {"prefix": _shown(args, prefix), "version_dir": name, "reason": chosen.reason,
                "skipped_known_bad": list(chosen.skipped_known_bad),
                "layers": [e.to_json() for e in layers]}
        if args.json:
            print(json.dumps(plan, indent=2))
        else:
            print(f"would install {name} into {_shown(args, prefix)}\n  because: {chosen.reason}")
            for e in layers:
                print(f"  {e.url}  ({_mb(e.size)})")
        return 0
    print(f"installing {name}: {chosen.reason}", file=sys.stderr)
    # SIGTERM cleans up like Ctrl-C: the CLI's handler (rocforge_build.signals) covers it
    done = nightly_install.install_chosen(asked, chosen, prefix, cfg,
                                          lambda line: print(line, file=sys.stderr))
    result = done.result
    if done.round is not None:
        return _gated(args, result, done.round)
    if args.json:
        print(json.dumps({"path": _shown(args, result.path), "previous": result.previous,
                          "reused": result.reused, "record": result.record}, indent=2))
        return 0
    if prefix != config.nightly_prefix() and (args.rootfs is None or args.rootfs.is_host):
        print(f"note: rocforge env looks for nightlies in {config.nightly_prefix()} (config "
              f"`nightly.prefix`); for this "
              f"prefix use `rocforge env --rocm {prefix / 'current'}` or set ROCM_PATH",
              file=sys.stderr)
    r = result.record
    how = (r.get("layers") or [{}])[-1].get("checksum", "")
    checked = ("not verified: none published; recorded" if not r.get("verified") else
               "verified against the sha256 you gave" if how.startswith("given") else
               "verified against published checksum")
    print(f"installed {_shown(args, result.path)}\n  sha256 {r.get('sha256')} ({checked})\n"
          f"  current -> {result.path.name}"
          + (f" (was {result.previous}; roll back: rocforge nightly use {result.previous})"
             if result.previous and result.previous != result.path.name else ""))
    return 0


def _gate_asked(args):
    """--gate's own flags, checked (one line each) before the listing is read; None without
    --gate."""
    if not args.gate:
        if args.model or args.run or args.threshold is not None:
            raise UsageError("--model, --run and --threshold go with --gate")
        return None
    from pathlib import Path

    from rocforge_build.workflows import upgrade
    from rocforge_build.workflows.nightly_install import GateAsked

    if args.dry_run:
        raise UsageError("--gate builds and tests; --dry-run shows the choice only",
                         "drop one of them")
    pct = upgrade.threshold(args.threshold)
    argv = upgrade.run_argv(args.run) if args.run is not None else None
    model = None
    if args.model is not None:
        if not Path(args.model).is_file():
            raise UsageError(f"--model {args.model}: no such file", "give a GGUF model file")
        model = str(Path(args.model).resolve())
    return GateAsked(run=tuple(argv) if argv is not None else None, model=model, pct=pct,
                     rootfs=args.rootfs, root_arg=None if args.rootfs.is_host else args.root,
                     quiet=args.json)


def _gated(args, result, rnd) -> int:
    """The gate round as printed: each build's outcome, and whether `current` was switched."""
    previous = result.previous
    if args.json:
        print(json.dumps({"path": _shown(args, result.path), **rnd.to_json()}, indent=2))
        return 0 if rnd.switched else 1
    print(f"installed {_shown(args, result.path)} beside {previous or 'nothing'}")
    for out in rnd.outcomes:
        bad = [g for g in out.gates if g.verdict != "pass"]
        print(f"  {out.prefix}: {out.status}" + (f" (gate {bad[0].name}: {bad[0].verdict}, "
                                                  f"{bad[0].detail})" if bad else ""))
    if not rnd.outcomes:
        print(f"  no rocforge build was made against {previous or 'a current nightly'}: "
              "nothing to gate")
    for p in rnd.rolled_back:
        print(f"  rolled back {p} (upgraded in this round before the failure)")
    if rnd.switched:
        print(f"  current -> {result.path.name}"
              + (f" (roll back: rocforge nightly use {previous})" if previous else ""))
        return 0
    print(f"  current stays {previous}: `rocforge nightly use {result.path.name}` switches "
          "anyway")
    return 1


def _installed(args, cfg) -> int:
    from rocforge_build.nightly import install

    prefix = _prefix(args, cfg)
    items = install.installed(prefix)
    if args.json:
        print(json.dumps([i.to_json() for i in items], indent=2))
        return 0
    if not items:
        print(f"no nightlies installed in {_shown(args, prefix)}")
        return 0
    print(f"{_shown(args, prefix)}:")
    for i in items:
        mark = "*" if i.current else " "
        print(f"{mark} {i.name}  (installed {i.record.get('date', '?')})"
              + (f"  [{i.problem}]" if i.problem else ""))
    return 0


def _use(args, cfg) -> int:
    from rocforge_build.nightly import install

    prefix = _prefix(args, cfg)
    item, previous = install.use(prefix, args.version)
    print(f"current -> {item.name}" + (f" (was {previous})" if previous else ""))
    return 0


def _prune(args, cfg) -> int:
    from rocforge_build.nightly import install

    if args.keep is not None and args.keep < 0:
        raise UsageError(f"--keep must be at least 0, got {args.keep}")
    keep = args.keep if args.keep is not None else int(cfg["nightly"]["keep"])
    removed = install.prune(_prefix(args, cfg), keep)
    from rocforge_build.shellsafe import one_line  # a file name never forges an output line

    print("\n".join(f"removed {one_line(r)}" for r in removed) if removed else "nothing to remove")
    return 0


def _pip(args, cfg) -> int:
    from rocforge_build import download, proc, shellsafe
    from rocforge_build.discover import targets

    target = args.target or _detected_target(args)
    if not target:
        raise UsageError("no GPU target was given and none was detected", targets.choices_hint())
    target = targets.get_target(target).name
    pip_cfg = cfg["nightly"]["pip"]
    route = args.route or pip_cfg["route"]
    exists = None if args.no_probe else (
        lambda url: download.get_text(url, missing_ok=True) is not None)
    try:
        index, req, reason = listing.pip_plan(target, route, pip_cfg, exists)
    except NetworkError as exc:  # the download hint names --index, which `nightly pip` lacks
        raise NetworkError(exc.message, "check your network connection or proxy; --no-probe "
                           "prints the command without asking the index, or set "
                           "nightly.pip.family_index with `rocforge config set`") from exc
    argv = [sys.executable, "-m", "pip", "install", "--pre", "--index-url", index, req]
    if args.json:
        print(json.dumps({"target": target, "route": route, "index": index, "requirement": req,
                          "reason": reason, "argv": argv}, indent=2))
    else:
        # the reason is from the config: one comment line, never a command
        shellsafe.write_script(shellsafe.comment(reason) + "\n" + proc.quote(argv) + "\n")
    if args.install:
        proc.run(argv, capture=False, timeout=None)  # pip's downloads: their length is the work
    return 0
