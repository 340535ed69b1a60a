"""`rocforge publish PREFIX --to STORE [--unverified]`: push a build, its evidence and their
signatures to a substitute store (see substitute/publish.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("prefix", metavar="PREFIX", help="the build to publish (its install prefix)")
    parser.add_argument("--to", required=True, metavar="STORE",
                        help="oci://HOST[:PORT]/REPO, oci+http://HOST:PORT/REPO, file:///DIR or "
                        "s3://BUCKET/PREFIX")
    parser.add_argument("--unverified", action="store_true",
                        help="publish a build with no passing verify on record, marked unverified")
    parser.add_argument("--model", metavar="GGUF",
                        help="measure the build's own figures with this model for the evidence "
                        "(default: substitute.verify_model)")
    parser.add_argument("--key", metavar="FILE", type=Path,
                        help="the secret key to sign with (default: substitute.signing_key, else the "
                        "one `rocforge key generate` wrote)")
    parser.add_argument("--json", action="store_true", help="the result as JSON")


def run(args) -> int:
    from rocforge_build import config
    from rocforge_build.shellsafe import one_line
    from rocforge_build.substitute import publish, stores

    stores.parse(args.to)
    cfg = config.effective()["substitute"]
    say = None if args.json else (lambda text: sys.stderr.write(f"rocforge: publish: {one_line(text)}\n"))
    out = publish.publish(Path(args.prefix), args.to, unverified=args.unverified,
                          model=args.model or cfg["verify_model"] or None,
                          key_file=args.key or publish.signing_key_path(cfg["signing_key"]),
                          root=args.rootfs, timeout=float(cfg["timeout"]), progress=say)
    if args.json:
        print(json.dumps(out.to_json(), indent=2))
        return 0
    print(out.tag)
    sys.stderr.write(f"rocforge: published {one_line(args.prefix)} to {one_line(out.store)} as {out.kind} "
                     f"({out.bundle_bytes / 1e6:.1f} MB; manifest {out.manifest[:19]}, evidence "
                     f"{out.evidence[:19]}; listed in {out.index_tag[:25]}...{out.index_tag[-17:]})\n")
    return 0
