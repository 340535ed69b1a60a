"""`rocforge serve MODEL`: run the tuned, verified preset's llama-server (see measure/serve.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from rocforge_build import argtypes, shellsafe
from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.measure import serve


def add_arguments(parser) -> None:
    parser.add_argument("model", metavar="MODEL", help="GGUF path, sha256 (its first 12 hex digits do) or model name with a preset")
    parser.add_argument("--range", default="auto", choices=("short", "long", "auto"),
                        help="which context range's preset to serve (auto: the longest context)")
    parser.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=argtypes.port, default=8080, metavar="N", help="port (default 8080)")
    parser.add_argument("--wait", type=argtypes.positive_seconds, default=600.0, metavar="S",
                        help="how long to wait for the model to load (default 600)")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")


def run(args) -> int:
    from rocforge_build.measure.preset import model_key
    from rocforge_build.measure.store import Store

    with Store() as store:
        model_path = args.model if Path(args.model).is_file() else None
        preset = store.preset(model_key(args.model))
        if preset is None:
            raise UsageError(f"no preset for {args.model!r}", "run `rocforge tune` for it first")
        name, _ = serve.pick_range(preset, args.range)
        problem = serve.still_proven(preset["ranges"][name], store, preset["model"]["sha256"],
                                     model_path or preset["model"]["path"])
    if problem:
        raise UsageError(*problem)
    p = serve.plan(preset, model_path or preset["model"]["path"], args.range, args.host, args.port)
    line = shellsafe.sh_command(p.argv, {k: str(v) for k, v in p.env.items()},
                                "the preset's command (results store)", ConfigError)
    if args.dry_run:
        head = [f"rocforge serve: preset version {preset.get('version')}, range {p.range} ({p.why})",
                *p.notes]
        shellsafe.write_script("".join(shellsafe.comment(h) + "\n" for h in head) + line + "\n")
        return 0
    from rocforge_build.measure import provenance
    from rocforge_build.nightly import known_bad

    known_bad.warn_before_measuring(provenance.host(args.rootfs))  # a known-bad host, said first
    serve.check_port(args.host, args.port)  # before anything starts: one line, exit 2
    sys.stderr.write(f"rocforge: serve: starting {p.range} preset (version {preset.get('version')}): {line}\n")

    def ready(warm_s: float):
        print(f"serving {shellsafe.one_line(preset['model']['name'])} at {p.url} (first request "
              f"warmed up in {warm_s:.1f} s; Ctrl-C stops it)", flush=True)

    code = serve.run(p, wait_s=args.wait, on_ready=ready)
    return 0 if code in (0, -15) else 9
