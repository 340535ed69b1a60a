"""`rocforge store list URL`, `store show URL KEY`, `store advise URL KEY --reason TEXT` (and
`--withdraw ADVISORY` to take one's own back), and
`store advise URL --nightly FIRST[..LAST] --reason TEXT`: what a substitute store holds, every
attestation per build, and known-bad advisories about a build or TheRock nightlies (see
substitute/catalog.py and substitute/advisories.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.usage = ("rocforge store list URL [--json]\n"
                    "       rocforge store gc URL --keep N [--dry-run] [--all-publishers] [--key FILE]\n"
                    "       rocforge store show URL KEY [--json]\n"
                    "       rocforge store advise URL KEY --reason TEXT [--key FILE]\n"
                    "       rocforge store advise URL KEY --withdraw ADVISORY --reason TEXT [--key FILE]\n"
                    "       rocforge store advise URL --nightly VERSION[..LAST] [--targets gfx1151,...] "
                    "--reason TEXT [--key FILE]")
    from rocforge_build.argtypes import whole

    parser.add_argument("action", choices=("list", "show", "advise", "gc"),
                        help="list: the builds a store holds; show: one build's key, signer and "
                        "attestations; advise: attach a signed known-bad advisory; gc: remove what "
                        "no kept build needs")
    parser.add_argument("url", metavar="URL", help="the store (oci://, oci+http://, file://, s3://, https://)")
    parser.add_argument("build_key", nargs="?", metavar="KEY",
                        help="a build's key: its digest, tag or the first 12+ hex digits")
    parser.add_argument("--reason", metavar="TEXT", help="advise: why the build is bad (one line)")
    parser.add_argument("--nightly", metavar="VERSION",
                        help="advise: TheRock nightlies instead of a build: a version, or FIRST..LAST "
                        "(an inclusive range)")
    parser.add_argument("--targets", metavar="GFX,...", default="",
                        help="advise --nightly: the GPUs it breaks (default: every GPU)")
    parser.add_argument("--withdraw", metavar="ADVISORY",
                        help="advise: take back this key's advisory (its digest, as `store show` lists it)")
    parser.add_argument("--key", metavar="FILE", type=Path,
                        help="advise, gc: the secret key to sign with (gc: whose builds are yours)")
    parser.add_argument("--keep", metavar="N", type=whole(0, 10_000),
                        help="gc: the newest builds of each key kept (yours; every publisher's with "
                        "--all-publishers)")
    parser.add_argument("--dry-run", action="store_true", help="gc: print what would be removed, remove nothing")
    parser.add_argument("--all-publishers", action="store_true",
                        help="gc: keep the N newest builds of each key whoever published them, "
                        "removing other publishers' older builds too")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    from rocforge_build import config
    from rocforge_build.errors import UsageError
    from rocforge_build.shellsafe import one_line
    from rocforge_build.substitute import catalog, signing
    from rocforge_build.substitute.publish import signing_key_path

    cfg = config.effective()["substitute"]
    trusted = signing.trusted_keys_from_config(list(cfg["trusted_keys"]))
    timeout = float(cfg["timeout"])
    if args.action in ("list", "show"):  # a signer is shown as trusted only once its revocations are read
        from rocforge_build.cli import report
        from rocforge_build.substitute import keys

        trusted, lines, _ = keys.with_revocations(trusted, list(dict.fromkeys([*cfg["stores"], args.url])),
                                                  timeout)
        for line in lines:
            report("warning", line)
    if args.action == "list":
        builds = catalog.list_builds(args.url, trusted, timeout=timeout)
        if args.json:
            print(json.dumps([b.to_json() for b in builds], indent=2))
        else:
            for line in catalog.describe_list(builds):
                print(line)
        return 0
    if args.action == "gc":
        return _gc(args, cfg, trusted, timeout, signing_key_path)
    if args.keep is not None or args.dry_run or args.all_publishers:
        raise UsageError(f"--keep, --dry-run and --all-publishers are for store gc, not store {args.action}")
    if args.action == "advise" and args.nightly is not None:
        return _advise_nightly(args, cfg, timeout, signing_key_path)
    if not args.build_key:
        raise UsageError(f"store {args.action} needs a KEY", "`rocforge store list URL` lists them")
    if args.action == "show":
        shown = catalog.show(args.url, args.build_key, trusted, timeout=timeout)
        if args.json:
            print(json.dumps(shown, indent=2))
        else:
            for line in catalog.describe_show(shown):
                print(line)
        return 0
    if args.withdraw is not None:
        if not args.reason:
            raise UsageError("store advise --withdraw needs --reason TEXT", "say in one line why it is taken back")
        digest = catalog.withdraw(args.url, args.build_key, args.withdraw, args.reason,
                                  args.key or signing_key_path(cfg["signing_key"]), trusted, timeout=timeout)
        sys.stderr.write(f"rocforge: withdrawal {digest[:19]} of advisory {one_line(args.withdraw)[:19]} "
                         f"attached to {one_line(args.build_key)[:24]}\n")
        return 0
    if not args.reason:
        raise UsageError("store advise needs --reason TEXT", "say in one line why the build is bad")
    digest = catalog.advise(args.url, args.build_key, args.reason,
                            args.key or signing_key_path(cfg["signing_key"]), trusted, timeout=timeout)
    sys.stderr.write(f"rocforge: advisory {digest[:19]} attached to {args.build_key[:24]}\n")
    return 0


def _advise_nightly(args, cfg, timeout: float, signing_key_path) -> int:
    """Publish a signed advisory naming TheRock nightlies known-bad (read by `nightly install`)."""
    from rocforge_build import __version__
    from rocforge_build.errors import UsageError
    from rocforge_build.shellsafe import one_line
    from rocforge_build.substitute import advisories, signing
    from rocforge_build.substitute.oci import StoreError
    from rocforge_build.substitute.stores import open_store

    if args.build_key:
        raise UsageError("store advise takes a KEY or --nightly, not both")
    if args.withdraw is not None:
        raise UsageError("--withdraw takes back an advisory on a build, not on nightlies",
                         "a nightly advisory is taken back by deleting its rocforge-nightly-advisory-... tag")
    if not args.reason:
        raise UsageError("store advise needs --reason TEXT", "say in one line why the nightlies are bad")
    first, _, last = args.nightly.partition("..")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    try:
        document = advisories.make_document(first.strip(), (last or first).strip(), targets,
                                            args.reason, __version__)
    except StoreError as exc:
        raise UsageError(f"store advise --nightly: {one_line(exc.message)}",
                         "a version looks like 7.14.0a20260612; targets like gfx1151,gfx1100") from None
    pair = signing.read_secret_key(args.key or signing_key_path(cfg["signing_key"]))
    with open_store(args.url, timeout=timeout) as store:
        tag = advisories.publish(store, document, pair)
    sys.stderr.write(f"rocforge: nightly advisory {tag} published (signed by {pair.key_id})\n")
    return 0


def _gc(args, cfg, trusted, timeout: float, signing_key_path) -> int:
    """Remove from a store what no kept build needs (substitute/gc.py)."""
    from rocforge_build.errors import UsageError
    from rocforge_build.shellsafe import one_line
    from rocforge_build.substitute import gc, signing
    from rocforge_build.substitute.stores import open_store, parse

    if args.keep is None:
        raise UsageError("store gc needs --keep N", "the newest N builds of each key are kept, e.g. --keep 3")
    if args.build_key or args.reason or args.nightly or args.withdraw or args.targets:
        raise UsageError("store gc takes a URL, --keep N, --dry-run, --all-publishers and --key only")
    parse(args.url)
    pair = signing.read_secret_key(args.key or signing_key_path(cfg["signing_key"]))

    def say(text: str) -> None:
        print(one_line(text))

    with open_store(args.url, timeout=timeout) as store:
        gc.run(store, args.keep, pair, pair.public, trusted, all_publishers=args.all_publishers,
               dry_run=args.dry_run, say=say)
    return 0
