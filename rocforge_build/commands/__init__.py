"""One module per CLI command: `add_arguments(parser)` and `run(args) -> int`."""

from __future__ import annotations


def target_or_detected(args, rocm: str | None = None) -> str:
    """`--target`, else the detected GPU (as kernels and nightly do); when none is detected the
    error lists the targets rocforge knows."""
    if args.target:
        return args.target
    from rocforge_build.discover import resolver, targets
    from rocforge_build.errors import UsageError

    found = resolver.resolve(args.rootfs, rocm=rocm).target
    if found:
        return found
    raise UsageError("no GPU target was given and none was detected", targets.choices_hint())
