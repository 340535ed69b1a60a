"""`rocforge config get|set|unset|list|path`: the configuration file (comments preserved)."""

from __future__ import annotations

import json

from rocforge_build import config


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("get", help="print one key's effective value")
    p.add_argument("key", metavar="KEY", help="a dotted key, e.g. nightly.keep (`rocforge config list` shows them)")
    p.add_argument("--json", action="store_true", help="print the value as JSON")
    p = sub.add_parser("set", help="write a key into your config file")
    p.add_argument("key", metavar="KEY", help="a dotted key, e.g. nightly.keep")
    p.add_argument("value", metavar="VALUE", help="a TOML literal (3, true, '[\"a\", \"b\"]') or a plain string")
    p = sub.add_parser("unset", help="remove a key from your config file (its default applies)")
    p.add_argument("key", metavar="KEY", help="a dotted key, e.g. nightly.keep")
    p = sub.add_parser("list", help="every key with its value and where it comes from")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("path", help="print the config file's path")


def run(args) -> int:
    if args.action == "path":
        print(config.config_file())
        return 0
    if args.action == "get":
        value = config.get(args.key)
        if args.json:
            print(json.dumps(_secret(args.key, value)))
        elif isinstance(value, dict):
            for k, v, _where in config.items():
                if k.startswith(args.key + "."):
                    print(f"{k} = {_show(v, k)}")
        else:
            print(_secret(args.key, value) if isinstance(value, str) else _show(value))
        return 0
    if args.action == "set":
        value = config.parse_value(args.value)
        config.set_value(args.key, value)
        print(f"{args.key} = {_show(value, args.key)}  ({config.config_file()})")
        return 0
    if args.action == "unset":
        if config.unset(args.key):
            print(f"{args.key} unset; default: {_show(config.get(args.key))}"
                  if _has_default(args.key) else f"{args.key} removed")
        else:
            print(f"{args.key} was not set in {config.config_file()}")
        return 0
    rows = config.items()
    if args.json:
        print(json.dumps([{"key": k, "value": _secret(k, v), "origin": o} for k, v, o in rows],
                         indent=2))
        return 0
    width = max(len(k) for k, _, _ in rows)
    for k, v, o in rows:
        mark = "  # set in your config" if o == "user" else ""
        print(f"{k.ljust(width)} = {_show(v, k)}{mark}")
    return 0


def _show(value, key: str = "") -> str:
    return json.dumps(_secret(key, value))


def _secret(key: str, value):
    """A credential a value may carry (cache.remote's password, which forge/cache.py reads from
    the file) is never printed: rocforge's one redaction (credentials.py) on every value shown."""
    from rocforge_build.credentials import redact_data

    return redact_data(value)


def _has_default(key: str) -> bool:
    try:
        config.get(key)
        return True
    except Exception:
        return False
