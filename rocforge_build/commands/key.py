"""`rocforge key generate [--out DIR]`: the key pair that signs the builds and evidence you
publish (minisign's format: `minisign -V -P KEY` checks what it signs).  The secret key is
written unencrypted with mode 0600, since `rocforge publish` signs without asking for a password;
an existing key is never overwritten."""

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


def default_dir() -> Path:
    from rocforge_build import paths

    return paths.config_file().parent / "keys"


def run(args) -> int:
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
