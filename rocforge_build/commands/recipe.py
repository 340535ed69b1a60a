"""`rocforge recipe list [--json]`: the packaged build recipes; `rocforge recipe show NAME|FILE
[--json]`: one recipe, every rule with its condition and reason."""

from __future__ import annotations

import json

from rocforge_build.forge import recipes


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add_list_arguments(sub.add_parser("list", help="list the build recipes (also spelled "
                                      "`rocforge recipes`)"))
    show = sub.add_parser("show", help="show a recipe: source, backends, options, patches")
    show.add_argument("name", metavar="RECIPE", help="a recipe name or a path to a .toml file")
    show.add_argument("--json", action="store_true", help="machine-readable output")


def add_list_arguments(parser) -> None:
    """`recipe list`'s arguments, which its alias `rocforge recipes` takes too."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run_list(args) -> int:
    """Every packaged recipe, one line each (or JSON): `recipe list` and `recipes` alike."""
    loaded = [recipes.load_file(p) for p in recipes.available().values()]
    if args.json:
        print(json.dumps([{"name": r.name, "description": r.description,
                           "backends": list(r.backends), "path": str(r.path)} for r in loaded],
                         indent=2))
        return 0
    for r in loaded:
        print(f"{r.name:16} {', '.join(r.backends):28} {r.description}")
    return 0


def _when(cond) -> str:
    return "always" if not cond else json.dumps(cond, separators=(", ", " = "))


def _head(kind: str, d: dict) -> str:
    if kind in ("option", "env"):
        v = d["value"]
        return f"{d['name']} = {('ON' if v else 'OFF') if isinstance(v, bool) else v}"
    if kind == "smoke":
        return " ".join(d["run"])
    return str(d.get({"default": "backend", "patch": "file", "depends": "recipe",
                      "output": "path"}.get(kind, "message")))


def run(args) -> int:
    if args.action == "list":
        return run_list(args)
    r = recipes.load(args.name)
    if args.json:
        print(json.dumps(r.to_json(), indent=2))
        return 0
    print(f"{r.name}: {r.description}\nfile: {r.path}")
    s = r.source
    if s.url:
        print(f"source: {s.url} (sha256 {s.sha256}){f', subdir {s.subdir}' if s.subdir else ''}"
              + (f"; version {s.pinned_version}, known before the download" if s.pinned_version else ""))
    if s.git:
        print(f"git: {s.git} @ {s.ref}")
    print("backends:")
    for b in r.backends.values():
        print(f"  {b.name} ({b.toolchain}): {b.description}" + (f"  when {_when(b.when)}" if b.when else ""))
    sections = (("default", "default backend"), ("option", "options"), ("env", "environment"),
                ("patch", "patches"), ("stop", "stops"), ("note", "notes"), ("smoke", "smoke tests"),
                ("depends", "built first"), ("output", "expected outputs"))
    for kind, title in sections:
        rules = r.of(kind)
        if not rules:
            continue
        print(f"{title}:")
        for rule in rules:
            d = rule.data
            head = _head(kind, d)
            print(f"  {head}\n      when {_when(rule.when)}")
            if d.get("reason"):
                print(f"      why: {d['reason']}")
            for line in recipes.evidence_lines(d.get("evidence"), "      "):
                print(line)
    if r.known_bad:
        print("known faults (serve refuses these shapes; verify names them):")
    for d in r.known_bad:
        print(f"  {d['symptom']}\n      when {_when(d['when'])}, shape {_known_bad_shape(d)}"
              f"\n      seen: {d['seen']}")
        for line in recipes.evidence_lines(d["evidence"], "      "):
            print(line)
    return 0


def _known_bad_shape(d: dict) -> str:
    parts = [f"fa {'on' if d['fa'] else 'off'}"] if "fa" in d else []
    if "parallel_min" in d:
        parts.append(f"{d['parallel_min']}+ sequences in one unified KV cache")
    if "cells_over" in d:
        parts.append(f"more than {d['cells_over']} cells")
    return ", ".join(parts)
