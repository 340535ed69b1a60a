"""`rocforge serve MODEL`: run the tuned, verified preset's llama-server.  Its arguments and its
lines only: what it serves with is serve/session.py's `ServeSession`, made here once."""

from __future__ import annotations

import contextlib
import re
from argparse import ArgumentTypeError

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
    from rocforge_build.measure.store import Store
    from rocforge_build.serve import session as serving
    from rocforge_build.serve.front import say_to_stderr

    if args.request_timeout and not args.canary_every:
        raise UsageError("--request-timeout bounds requests through the canary front, which only "
                         "--canary-every puts before llama-server", "add --canary-every DURATION, or drop it")
    with Store(threads=True) as store:  # the one results store of this serve (the front records from its threads)
        choice = serving.find(store, args.model, args.range)
        address = args.host if args.dry_run else serve.resolve_host(args.host, args.port)
        p = serve.plan(choice.preset, choice.model.path, args.range, address, args.port)
        line = shellsafe.sh_command(p.argv, {k: str(v) for k, v in p.env.items()},
                                    "the preset's command (results store)", ConfigError)
        if args.dry_run:
            head = [f"rocforge serve: preset version {choice.version}, range {p.range} ({p.why})", *p.notes]
            shellsafe.write_script("".join(shellsafe.comment(h) + "\n" for h in head) + line + "\n")
            return 0
        host = serving.this_host(args.rootfs)  # a known-bad host, said first
        serve.check_port(address, args.port)  # before anything starts: one line, exit 2
        say_to_stderr(f"starting {p.range} preset (version {choice.version}): {line}")
        if args.no_canary:
            say_to_stderr("--no-canary: the server's numerics are not checked")
        session = serving.ServeSession.open(choice, store, host=host, canary=not args.no_canary or bool(args.canary_every),
                                            reference=args.reference)
        name = shellsafe.one_line(choice.preset.model.name)

        def ready(warm_s: float):
            everywhere = " (listening on all addresses)" if serve.dial_address(address) != address else ""
            print(f"serving {name} at {p.url}{everywhere} (first request "
                  f"warmed up in {warm_s:.1f} s; Ctrl-C stops it)", flush=True)

        code = serving.run(session, p, every=args.canary_every, wait_s=args.wait, request_s=args.request_timeout,
                           argv=args.argv, on_ready=ready, canary_at_start=not args.no_canary)
    return 0 if code in (0, -15) else 9
