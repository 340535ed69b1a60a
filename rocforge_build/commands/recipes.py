"""`rocforge recipes [--json]`: the packaged build recipes."""

from __future__ import annotations

import json

from rocforge_build.forge import recipes


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    loaded = [recipes.load_file(p) for p in recipes.available().values()]
    if args.json:
        print(json.dumps([{"name": r.name, "description": r.description,
                           "backends": list(r.backends), "path": str(r.path)} for r in loaded],
                         indent=2))
        return 0
    for r in loaded:
        print(f"{r.name:16} {', '.join(r.backends):28} {r.description}")
    return 0
