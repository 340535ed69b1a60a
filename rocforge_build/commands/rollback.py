"""`rocforge rollback PREFIX [--json]`: put back the build `rocforge upgrade` replaced (atomically,
under the build lock); the build it replaces is kept in turn, so a second rollback goes forward."""

from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("prefix", metavar="PREFIX", help="a build `rocforge upgrade` replaced")
    parser.add_argument("--json", action="store_true", help="what was swapped, as JSON")


def run(args) -> int:
    from rocforge_build.workflows import upgrade

    prefix, _ = upgrade.existing_build(args.prefix)
    was, now = upgrade.rollback(prefix)
    keep = f"{prefix}{upgrade.PREVIOUS}"
    if args.json:
        print(json.dumps({"prefix": str(prefix), "now": now, "replaced": was, "kept": keep},
                         indent=2))
        return 0
    print(f"rolled back {prefix} to {_what(now)} (was {_what(was)}, kept at {keep}; "
          f"`rocforge rollback {prefix}` again goes forward)")
    return 0


def _what(s: dict) -> str:
    return " ".join(x for x in (s.get("version"), (s.get("commit") or "")[:12] or None,
                                f"built {s['built_at']}" if s.get("built_at") else None) if x) \
        or "the previous build"
