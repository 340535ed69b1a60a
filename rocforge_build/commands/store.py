"""`rocforge store list URL`, `store show URL KEY`, `store advise URL KEY --reason TEXT`: what a
substitute store holds, every attestation per build, and known-bad advisories (see
substitute/catalog.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.usage = ("rocforge store list URL [--json]\n"
                    "       rocforge store show URL KEY [--json]\n"
                    "       rocforge store advise URL KEY --reason TEXT [--key FILE]")
    parser.add_argument("action", choices=("list", "show", "advise"),
                        help="list: the builds a store holds; show: one build's key, signer and "
                        "attestations; advise: attach a signed known-bad advisory")
    parser.add_argument("url", metavar="URL", help="the store (oci://, oci+http://, file://, s3://, https://)")
    parser.add_argument("build_key", nargs="?", metavar="KEY",
                        help="a build's key: its digest, tag or the first 12+ hex digits")
    parser.add_argument("--reason", metavar="TEXT", help="advise: why the build is bad (one line)")
    parser.add_argument("--key", metavar="FILE", type=Path, help="advise: the secret key to sign with")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    from rocforge_build import config
    from rocforge_build.errors import UsageError
    from rocforge_build.substitute import catalog, signing
    from rocforge_build.substitute.publish import signing_key_path

    cfg = config.effective()["substitute"]
    trusted = signing.trusted_keys_from_config(list(cfg["trusted_keys"]))
    timeout = float(cfg["timeout"])
    if args.action == "list":
        builds = catalog.list_builds(args.url, trusted, timeout=timeout)
        if args.json:
            print(json.dumps([b.to_json() for b in builds], indent=2))
        else:
            for line in catalog.describe_list(builds):
                print(line)
        return 0
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
    if not args.reason:
        raise UsageError("store advise needs --reason TEXT", "say in one line why the build is bad")
    digest = catalog.advise(args.url, args.build_key, args.reason,
                            args.key or signing_key_path(cfg["signing_key"]), trusted, timeout=timeout)
    sys.stderr.write(f"rocforge: advisory {digest[:19]} attached to {args.build_key[:24]}\n")
    return 0
