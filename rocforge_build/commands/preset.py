"""`rocforge preset show|history|use|export|list`: the commands `rocforge tune` chose for a model,
with the figures that chose them.  A preset history is one model file's (its sha256): every tune
of it adds a version, numbered 1, 2, 3... for that model; the newest is in use unless `preset use`
chose another.  A name two models share (two quantizations) is refused: the GGUF path or the sha256
picks one."""

from __future__ import annotations

import json
import sys

from rocforge_build import argtypes, shellsafe
from rocforge_build.errors import UsageError
from rocforge_build.measure.preset import export, model_key, pick_range, render, runnable
from rocforge_build.measure.preset_values import Preset
from rocforge_build.measure.store import Store
from rocforge_build.shellsafe import one_line


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the preset in use for a model",
                          description="print the preset in use for a model")
    show.add_argument("model", metavar="MODEL", help="GGUF path, sha256 (its first 12 hex digits do) or model name")
    show.add_argument("--shell", action="store_true", help="as a shell script")
    show.add_argument("--range", metavar="RANGE", help="only this context range (short, long)")
    show.add_argument("--version", type=argtypes.run_id, metavar="VERSION",
                      help="this version instead of the one in use")
    show.add_argument("--json", action="store_true", help="the preset as JSON")
    hist = sub.add_parser("history", help="every version of a model's preset",
                          description="every version of a model's preset, oldest first")
    hist.add_argument("model", metavar="MODEL", help="GGUF path, sha256 (its first 12 hex digits do) or model name")
    hist.add_argument("--json", action="store_true", help="as JSON")
    use = sub.add_parser("use", help="use an earlier (or later) version of a model's preset",
                         description="use an earlier (or later) version of a model's preset")
    use.add_argument("model", metavar="MODEL", help="GGUF path, sha256 (its first 12 hex digits do) or model name")
    use.add_argument("version", type=argtypes.run_id, metavar="VERSION",
                     help="a version from `preset history`")
    exp = sub.add_parser("export", help="the preset's command for llama-swap, systemd or a shell",
                         description="the preset's command for llama-swap, systemd or a shell")
    exp.add_argument("model", metavar="MODEL", help="GGUF path, sha256 (its first 12 hex digits do) or model name")
    exp.add_argument("--format", required=True, choices=("llama-swap", "systemd", "shell"),
                     help="llama-swap: a models: entry; systemd: a service unit; shell: a script")
    exp.add_argument("--range", default="auto", choices=("short", "long", "auto"),
                     help="which range (auto: the longest context)")
    exp.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="listen address (systemd)")
    exp.add_argument("--port", type=argtypes.port, default=8080, metavar="N",
                     help="port (systemd; llama-swap uses ${PORT})")
    sub.add_parser("list", help="models with a preset", description="models with a preset")


def _missing(store: Store, key: str) -> UsageError:
    known = [f"{one_line(m['name'])} ({one_line(m['sha256'] or '')[:12]})" for m in store.preset_models()]
    return UsageError(f"no preset for {key!r}", "run `rocforge tune` for it first"
                      + (f"; presets exist for: {', '.join(known)}" if known else ""))


def _printable(store: Store, preset: Preset, args) -> None:
    """The ranges a command is printed for run their own rocforge build's program
    (preset.runnable), and a build rebuilt since tune is printed only once verify proved it, as
    serve requires (serve.still_proven): a printed script or unit is serve by other means."""
    from rocforge_build.serve import server as serve

    if args.action == "export":
        names = [pick_range(preset, args.range)[0]]
    else:
        names = [args.range] if args.range in preset.ranges else list(preset.ranges)
    runnable(preset, names, f"results database {store.path}: preset for "
             f"{one_line(preset.model.name)} version {preset.version}")
    for name in names:
        problem = serve.still_proven(preset.ranges[name], store, preset.model.sha256, preset.model.path)
        if problem:
            raise UsageError(*problem)


def run(args) -> int:
    with Store() as store:
        if args.action == "list":
            if not store.preset_models():  # said on stderr: a script reading the list gets no line
                sys.stderr.write(f"rocforge: preset: no presets in {store.path} yet; "
                                 "`rocforge tune MODEL` stores one\n")
            for m in store.preset_models():
                print(f"{one_line(m['name'])}  sha256 {one_line(m['sha256'] or '-')[:12]}  {m['versions']} "
                      f"version(s)  {one_line(m['path'] or '')}".rstrip())
            return 0
        key = model_key(args.model)
        if args.action == "history":
            history = store.preset_history(key)
            if not history:
                raise _missing(store, args.model)
            in_use = store.preset(key).version
            if args.json:
                print(json.dumps([{**h.to_json(), "in_use": h.version == in_use} for h in history], indent=2))
                return 0
            for h in history:
                picks = "; ".join(f"{n}: {r.backend} {r.variant_label} ({r.score:.1f})"
                                  for n, r in h.preset.ranges.items())
                mark = "*" if h.version == in_use else " "
                how = "exhaustive" if h.preset.exhaustive else "search"
                print(f"{mark} version {h.version}  {one_line(h.created)}  run {h.run_id}  {how}  "
                      f"{one_line(picks)}")
            return 0
        if args.action == "use":
            pick = store.use_preset(key, args.version)
            print(f"{one_line(pick.model)} (sha256 {one_line(pick.model_sha256 or '-')[:12]}): preset "
                  f"version {pick.version} (tuned {one_line(pick.created)}) is in use")
            return 0
        if getattr(args, "version", None) is not None and args.action == "show":
            preset = next((h.preset for h in store.preset_history(key) if h.version == args.version), None)
        else:
            preset = store.preset(key)
        if preset is None:
            raise _missing(store, args.model)
        if args.action == "export" or not args.json:  # what prints a command: its build checked
            _printable(store, preset, args)
    if args.action == "export":
        shellsafe.write_script(export(preset, args.format, args.range, args.host, args.port))
    elif args.json:
        print(json.dumps(preset.to_json(), indent=2))
    else:
        shellsafe.write_script(render(preset, shell=args.shell, only=args.range))
    return 0
