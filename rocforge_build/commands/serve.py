"""`rocforge serve MODEL`: run the tuned, verified preset's llama-server (see serve/server.py)."""

from __future__ import annotations

import contextlib
import re
from argparse import ArgumentTypeError
from pathlib import Path

from rocforge_build import argtypes, shellsafe
from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.serve import server as serve

# A host name (RFC 1123: dot-separated labels of letters, digits and inner hyphens, 253
# characters at most) or an IP literal: anything else (a newline, a space, a URL) is refused
# while the command line is parsed, naming --host.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)", re.ASCII)


def host(text: str) -> str:
    """--host's type: an IPv4/IPv6 literal or a host name."""
    import ipaddress

    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(text))
    name = text[:-1] if text.endswith(".") else text
    if 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split(".")):
        return text
    raise ArgumentTypeError(f"{shellsafe.one_line(text)!r} is not a host name or IP address "
                            "(e.g. 127.0.0.1, ::1, 0.0.0.0 or localhost)")


def add_arguments(parser) -> None:
    parser.add_argument("model", metavar="MODEL", help="GGUF path, sha256 (its first 12 hex digits do) or model name with a preset")
    parser.add_argument("--range", default="auto", choices=("short", "long", "auto"),
                        help="which context range's preset to serve (auto: the longest context)")
    parser.add_argument("--host", type=host, default="127.0.0.1", metavar="ADDR",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 listens on all)")
    parser.add_argument("--port", type=argtypes.port, default=8080, metavar="N", help="port (default 8080)")
    parser.add_argument("--wait", type=argtypes.positive_seconds, default=600.0, metavar="S",
                        help="how long to wait for the model to load and answer its first "
                             "one-token request (default 600)")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("--no-canary", action="store_true",
                        help="skip the numerics canary (the live server's log-probabilities against the "
                             "reference build's) before serving")
    parser.add_argument("--reference", metavar="PREFIX",
                        help="the canary's reference build (default: verify's, a cpu build of the same source)")
    parser.add_argument("--canary-every", type=argtypes.canary_every, metavar="DURATION",
                        help="while serving, repeat a short canary between requests, at most this often "
                             "(e.g. 60s, 5m, 1h; 5 s at least): llama-server listens on a private loopback "
                             "port behind a thin front on --host/--port, which answers 503 once it fails")
    parser.add_argument("--request-timeout", type=argtypes.positive_seconds, metavar="S",
                        help="with --canary-every: a client's request that llama-server says nothing on "
                             "for S seconds gets HTTP 504, and 3 such in a row, /health silent too, make the front "
                             "answer 503 (default: --wait; a streamed answer is never cut while tokens come)")


def run(args) -> int:
    from rocforge_build.measure import known_bad as known_bad_shape
    from rocforge_build.measure.preset import model_key, pick_range, runnable
    from rocforge_build.measure.store import Store

    if args.request_timeout and not args.canary_every:
        raise UsageError("--request-timeout bounds requests through the canary front, which only "
                         "--canary-every puts before llama-server", "add --canary-every DURATION, or drop it")
    model_path = args.model if Path(args.model).is_file() else None
    if model_path is None and ("/" in args.model or args.model.endswith(".gguf")):
        from rocforge_build.measure import gguf

        gguf.check(args.model)  # a path that names no file says so, not "no preset"
    with Store() as store:
        preset = store.preset(model_key(args.model))
        if preset is None:
            raise UsageError(f"no preset for {args.model!r}", "run `rocforge tune` for it first")
        name, _ = pick_range(preset, args.range)
        _build_is_there(preset, name)
        runnable(preset, [name], f"results database {store.path}: preset for "
                 f"{shellsafe.one_line(preset['model']['name'])} version {preset['version']}")
        stored = None if model_path else preset["model"]["sha256"]  # a given path picked it by its sha256
        model_path = serve.model_file(model_path or preset["model"]["path"], stored)
        problem = serve.still_proven(preset["ranges"][name], store, preset["model"]["sha256"], model_path)
        problem = problem or known_bad_shape.preset_problem(preset["ranges"][name])
    if problem:
        raise UsageError(*problem)
    address = args.host if args.dry_run else serve.resolve_host(args.host, args.port)
    p = serve.plan(preset, model_path, args.range, address, args.port)
    line = shellsafe.sh_command(p.argv, {k: str(v) for k, v in p.env.items()},
                                "the preset's command (results store)", ConfigError)
    if args.dry_run:
        head = [f"rocforge serve: preset version {preset.get('version')}, range {p.range} ({p.why})",
                *p.notes]
        shellsafe.write_script("".join(shellsafe.comment(h) + "\n" for h in head) + line + "\n")
        return 0
    from rocforge_build.discover import known_bad
    from rocforge_build.measure import provenance

    known_bad.warn_before_measuring(provenance.host(args.rootfs))  # a known-bad host, said first
    serve.check_port(address, args.port)  # before anything starts: one line, exit 2
    from rocforge_build.serve.front import say_to_stderr

    say_to_stderr(f"starting {p.range} preset (version {preset.get('version')}): {line}")

    def ready(warm_s: float):
        everywhere = " (listening on all addresses)" if serve.dial_address(address) != address else ""
        print(f"serving {shellsafe.one_line(preset['model']['name'])} at {p.url}{everywhere} (first request "
              f"warmed up in {warm_s:.1f} s; Ctrl-C stops it)", flush=True)

    if args.canary_every:  # llama-server behind the front (serve/front.py)
        from rocforge_build.serve import front as serve_front

        code = serve_front.run(p, every=args.canary_every, build_prefix=preset["ranges"][p.range]["prefix"],
                               model_path=model_path, model_sha256=preset["model"]["sha256"],
                               reference=args.reference, wait_s=args.wait, on_ready=ready,
                               before_ready=_canary(args, preset, p, model_path), argv=args.argv,
                               request_s=args.request_timeout)
    else:
        code = serve.run(p, wait_s=args.wait, on_ready=ready, before_ready=_canary(args, preset, p, model_path))
    return 0 if code in (0, -15) else 9


def _build_is_there(preset: dict, name: str) -> None:
    """A preset whose build directory is gone is a usage error naming that prefix and the way
    back, not a damaged results store: the record is sound, the build was removed."""
    r = preset["ranges"][name]
    if not Path(r["prefix"]).exists():
        raise UsageError(f"the {name} range's build {shellsafe.one_line(r['prefix'])} is gone",
                         f"build it again (`rocforge build llama-cpp --backend {r.get('backend')} "
                         f"--prefix {shellsafe.one_line(r['prefix'])}`) and tune again (`rocforge tune`)")


def _canary(args, preset: dict, p, model_path: str):
    """What serve runs against the live server before it prints its URL (serve/canary.py), or
    None with --no-canary (said on stderr)."""
    from rocforge_build.serve.front import say_to_stderr

    if args.no_canary:
        say_to_stderr("--no-canary: the server's numerics are not checked")
        return None

    def gate(plan) -> None:
        from rocforge_build.measure import gguf, provenance
        from rocforge_build.measure.llama_tools import LlamaBuild
        from rocforge_build.measure.store import Store
        from rocforge_build.serve import canary

        build = LlamaBuild.open(preset["ranges"][plan.range]["prefix"])
        target = canary.target_of(plan.url, plan.argv)
        say = say_to_stderr  # one line each, terminal controls escaped: it quotes servers' replies
        record = {"model_sha256": preset["model"]["sha256"], "model": preset["model"].get("name"),
                  "range": plan.range, "host": provenance.host(args.rootfs)}
        with Store() as store:
            verdict = canary.at_serve_start(build, gguf.check(Path(model_path)), target,
                                            reference_prefix=args.reference,
                                            store=store, record=record, progress=say, timeout=args.wait)
        say(f"canary passed in {verdict.seconds:.1f} s: " + ", ".join(
            f"{r.label} top-1 {r.comparison.top1:.3f} KLD {r.comparison.kld_mean:.2g}"
            for r in verdict.rows if r.comparison))

    return gate
