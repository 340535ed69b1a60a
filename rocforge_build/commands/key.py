"""`rocforge key generate [--out DIR]`: the key pair that signs the builds and evidence you
publish (minisign's format: `minisign -V -P KEY` checks what it signs).  The secret key is
written unencrypted with mode 0600, since `rocforge publish` signs without asking for a password;
an existing key is never overwritten.

`rocforge key rotate --to URL`: a new key pair, and a rotation statement signed by the old key and
the new one, published to each store named; `rocforge key trust-rotation URL`: a consumer's
explicit step that trusts a rotated key through the old one; `rocforge key revoke --reason
compromised|retired --to URL`: the key's own signed revocation (substitute/keys.py)."""

from __future__ import annotations

import json
from pathlib import Path

SECRET_NAME = "rocforge.key"
PUBLIC_NAME = "rocforge.pub"


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    gen = sub.add_parser("generate", help="write a new key pair and print its public key",
                         description="write DIR/rocforge.key (the secret key, mode 0600) and "
                         "DIR/rocforge.pub, and print the public key (RW...) that others trust "
                         "with substitute.trusted_keys; an existing key is never overwritten")
    gen.add_argument("--out", metavar="DIR", type=Path,
                     help="where to write the pair (default: keys/ beside rocforge's config file, "
                     "where `rocforge publish` looks when substitute.signing_key is unset)")
    gen.add_argument("--json", action="store_true", help="machine-readable output")

    rot = sub.add_parser("rotate", help="make a new key signed by the old one and publish the rotation",
                         description="write a new key pair (never over an existing one) and publish "
                         "a rotation statement, signed by the old key and the new, to each --to store; "
                         "consumers who trust the old key trust the new one with "
                         "`rocforge key trust-rotation URL`")
    rot.add_argument("--to", metavar="STORE", action="append", required=True,
                     help="a store to publish the rotation to (repeat for more)")
    rot.add_argument("--key", metavar="FILE", type=Path,
                     help="the old secret key (default: substitute.signing_key, or keys/rocforge.key)")
    rot.add_argument("--out", metavar="DIR", type=Path,
                     help="where to write the new pair (default: keys/NEWID/ beside rocforge's config file)")
    rot.add_argument("--new-key", metavar="FILE", type=Path,
                     help="publish the rotation to an existing new secret key instead of making one "
                     "(to publish it to more stores later)")
    rot.add_argument("--json", action="store_true", help="machine-readable output")

    rev = sub.add_parser("revoke", help="publish this key's own signed revocation",
                         description="sign a revocation of the key with the key itself and publish "
                         "it to each --to store; consumers read revocations from every configured "
                         "store before they trust a pull.  compromised: nothing the key ever signed "
                         "is trusted; retired: only what it signed before now.  A revocation is "
                         "never taken back")
    rev.add_argument("--to", metavar="STORE", action="append", required=True,
                     help="a store to publish the revocation to (repeat for more)")
    rev.add_argument("--reason", required=True, choices=("compromised", "retired"),
                     help="compromised: the secret may be known to others; retired: no longer used")
    rev.add_argument("--note", metavar="TEXT", default="", help="one line for whoever reads it")
    rev.add_argument("--key", metavar="FILE", type=Path,
                     help="the secret key to revoke (default: substitute.signing_key, or keys/rocforge.key)")
    rev.add_argument("--json", action="store_true", help="machine-readable output")

    trust = sub.add_parser("trust-rotation", help="trust the keys that trusted keys rotated to in a store",
                           description="read the rotation statements in URL from keys in "
                           "substitute.trusted_keys (not revoked, in their window, per the revocations "
                           "of every configured store and URL) and add each new key, trusted via the "
                           "old one: never past the old key's window, never once it is revoked as "
                           "compromised")
    trust.add_argument("url", metavar="URL", help="the store holding the rotation statements")
    trust.add_argument("--from", dest="from_key", metavar="KEYID",
                       help="follow only the rotation of this trusted key (16 hex digits)")
    trust.add_argument("--dry-run", action="store_true", help="say what would be trusted; change nothing")
    trust.add_argument("--json", action="store_true", help="machine-readable output")


def default_dir() -> Path:
    from rocforge_build import paths

    return paths.config_file().parent / "keys"


def run(args) -> int:
    if args.action == "rotate":
        return _rotate(args)
    if args.action == "revoke":
        return _revoke(args)
    if args.action == "trust-rotation":
        return _trust_rotation(args)
    from rocforge_build.cli import report
    from rocforge_build.substitute import signing

    where = (args.out.expanduser() if args.out else default_dir()).absolute()
    secret_path, public_path = where / SECRET_NAME, where / PUBLIC_NAME
    pair = signing.generate()
    signing.write_key_pair(secret_path, public_path, pair)
    if args.json:
        print(json.dumps({"key_id": pair.key_id, "public_key": pair.public.text,
                          "secret_key_path": str(secret_path),
                          "public_key_path": str(public_path)}, indent=2))
    else:
        print(pair.public.text)
    trust = f"`rocforge config set substitute.trusted_keys '[\"{pair.public.text}\"]'`"
    use = (f"publish with it: `rocforge config set substitute.signing_key {secret_path}`"
           if args.out else f"`rocforge publish` signs with {secret_path} while "
           "substitute.signing_key is unset")
    report("hint", f"trust key {pair.key_id} with {trust}; {use}")
    return 0


def _urls(urls: list[str], label: str = "--to") -> list[str]:
    """The --to stores, each checked as a store URL is (no credentials, a known scheme)."""
    from rocforge_build.config_values import problem
    from rocforge_build.errors import UsageError

    wrong = problem("substitute.stores", list(urls))
    if wrong:
        raise UsageError(f"{label} {wrong}", "give oci://, oci+http://, file://, s3:// or https:// URLs")
    return list(dict.fromkeys(urls))


def _secret(args, cfg):
    from rocforge_build.substitute import signing
    from rocforge_build.substitute.publish import signing_key_path

    return signing.read_secret_key(args.key.expanduser() if args.key else signing_key_path(cfg["signing_key"]))


def _rotate(args) -> int:
    from rocforge_build import __version__, config
    from rocforge_build.cli import report
    from rocforge_build.errors import UsageError
    from rocforge_build.substitute import keys, signing

    cfg = config.effective()["substitute"]
    urls = _urls(args.to)
    old = _secret(args, cfg)
    if args.new_key is not None:
        if args.out is not None:
            raise UsageError("key rotate takes --out (a new pair) or --new-key (an existing one), not both")
        new = signing.read_secret_key(args.new_key.expanduser())
        where = args.new_key.expanduser().absolute().parent
    else:
        new = signing.generate()
        where = (args.out.expanduser() if args.out else default_dir() / new.key_id).absolute()
    if new.public.keynum == old.public.keynum or new.public.raw == old.public.raw:
        raise UsageError("key rotate: the new key is the old key (the same key number or key)",
                         "rotate to a new key: leave --new-key out")
    keys.refuse_fork(urls, old, new, float(cfg["timeout"]))
    if args.new_key is None:
        signing.write_key_pair(where / SECRET_NAME, where / PUBLIC_NAME, new)
    doc = keys.make_rotation(old, new, __version__)
    done, failed = keys.publish_each(urls, float(cfg["timeout"]), lambda store: keys.publish_rotation(store, doc, old, new),
                                     lambda line: report("error", line))
    if args.json:
        print(json.dumps({"old_key_id": old.key_id, "new_key_id": new.key_id,
                          "new_public_key": new.public.text, "secret_key_path": str(where / SECRET_NAME),
                          "made_at": doc["made_at"], "published": done}, indent=2))
    else:
        print(new.public.text)
    report("hint", f"key {old.key_id} rotated to {new.key_id} ({where / SECRET_NAME}), published to "
           f"{len(done)} of {len(urls)} store(s); sign with it: `rocforge config set substitute.signing_key "
           f"{where / SECRET_NAME}`; consumers trust it with `rocforge key trust-rotation URL`")
    return 1 if failed else 0


def _revoke(args) -> int:
    from rocforge_build import __version__, config
    from rocforge_build.cli import report
    from rocforge_build.errors import UsageError
    from rocforge_build.substitute import keys, oci

    cfg = config.effective()["substitute"]
    urls = _urls(args.to)
    if len(args.note) > keys.MAX_NOTE or not args.note.isprintable():
        raise UsageError(f"--note must be one printable line of at most {keys.MAX_NOTE} characters")
    pair = _secret(args, cfg)
    try:
        doc = keys.make_revocation(pair, args.reason, args.note, __version__)
    except oci.StoreError as exc:
        raise UsageError(f"key revoke: {exc.message}") from None
    done, failed = keys.publish_each(urls, float(cfg["timeout"]), lambda store: keys.publish_revocation(store, doc, pair),
                                     lambda line: report("error", line))
    if args.json:
        print(json.dumps({"key_id": pair.key_id, "reason": args.reason, "revoked_at": doc["revoked_at"],
                          "published": done}, indent=2))
    report("hint" if not failed else "error",
           f"key {pair.key_id} revoked ({args.reason}, {doc['revoked_at']}) in {len(done)} of "
           f"{len(urls)} store(s); a revocation is never taken back")
    return 1 if failed else 0


def _trust_rotation(args) -> int:
    import re

    from rocforge_build import config
    from rocforge_build.cli import report
    from rocforge_build.errors import UsageError
    from rocforge_build.substitute import keys, signing

    if args.from_key is not None and not re.fullmatch(r"[0-9A-F]{16}", args.from_key):
        raise UsageError(f"--from {args.from_key[:40]!r} is not a key id (16 uppercase hex digits)")
    url = _urls([args.url], "URL")[0]
    cfg = config.effective()["substitute"]
    configured = signing.trusted_keys_from_config(list(cfg["trusted_keys"]))
    if not configured:
        raise UsageError("substitute.trusted_keys is empty: no rotation can be trusted",
                         "trust the old key first (`rocforge config set substitute.trusted_keys ...`)")
    rotations = keys.followable_rotations(url, list(dict.fromkeys([*cfg["stores"], url])), configured,
                                          float(cfg["timeout"]), lambda line: report("warning", line))
    added, said = keys.new_entries(rotations, configured, args.from_key)
    if not added and not said:
        said = [f"no rotation of a trusted key{' ' + args.from_key if args.from_key else ''} in {url}"]
    if added and not args.dry_run:
        config.set_value("substitute.trusted_keys", [*cfg["trusted_keys"], *added])
    if args.json:
        print(json.dumps({"added": [] if args.dry_run else added, "would_add": added if args.dry_run else [],
                          "lines": said}, indent=2))
    for line in said:
        report("note", ("(dry run) " if args.dry_run and line.startswith("trusting") else "") + line)
    return 0
