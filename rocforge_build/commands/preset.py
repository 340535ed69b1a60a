"""`rocforge preset show MODEL [--shell]`: the command `rocforge tune` chose for a model, with the
figures that chose it."""

from __future__ import annotations

import json
from pathlib import Path

from rocforge_build.errors import UsageError
from rocforge_build.measure.preset import render
from rocforge_build.measure.store import Store


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print a model's preset")
    show.add_argument("model", metavar="MODEL", help="model name, GGUF path or sha256")
    show.add_argument("--shell", action="store_true", help="as a shell script")
    show.add_argument("--range", metavar="NAME", help="only this context range (short, long)")
    show.add_argument("--json", action="store_true")
    sub.add_parser("list", help="models with a preset")


def run(args) -> int:
    with Store() as store:
        if args.action == "list":
            for m in store.preset_models():
                print(m)
            return 0
        key = args.model
        preset = store.preset(key)
        if preset is None and Path(key).is_file():
            from rocforge_build.measure import gguf, provenance

            preset = store.preset(provenance.model_sha256(gguf.check(key).path))
        if preset is None:
            known = store.preset_models()
            raise UsageError(f"no preset for {key!r}", "run `rocforge tune` for it first"
                             + (f"; presets exist for: {', '.join(known)}" if known else ""))
    if args.json:
        print(json.dumps(preset, indent=2))
    else:
        print(render(preset, shell=args.shell, only=args.range), end="")
    return 0
