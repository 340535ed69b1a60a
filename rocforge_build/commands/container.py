"""`rocforge container build|run|closure`: images of a recipe build, run with the GPU passed in."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
from pathlib import Path

from rocforge_build import shellsafe
from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.ship import container_context, container_engines, containers


def _common(p) -> None:
    p.add_argument("recipe", metavar="RECIPE", help="recipe name, or path to a recipe .toml file")
    p.add_argument("--target", metavar="GFX", help="GPU target, e.g. gfx1151 (default: the detected GPU)")
    p.add_argument("--backend", metavar="B",
                   help="a backend of the recipe (rocforge recipe show RECIPE); its toolchain picks the builder "
                   "variant (default: the recipe's choice for the target, as `rocforge build` makes it)")
    p.add_argument("--variant", metavar="NAME", help="builder variant from containers/variants.toml")
    p.add_argument("--engine", choices=sorted(containers.engines_data().get("engine", {})),
                   help="container engine (default: the first of podman, buildah, docker on PATH)")
    p.add_argument("--tag", metavar="IMAGE", help="image name (default localhost/rocforge/RECIPE:TARGET-BACKEND)")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--source", metavar="PATH|URL",
                   help="passed to `rocforge build --source`; a local tree or tarball is copied into the image")
    p.add_argument("--ref", metavar="REF", help="passed to `rocforge build --ref`")


def _dash_dash(base: type[argparse.ArgumentParser]) -> type[argparse.ArgumentParser]:
    """The CLI's parser class (its error wording and hints), where everything after the first
    `--` is the command to run (argparse alone mixes it up with the RECIPE positional); it lands
    in `args.cmd`."""

    class DashDashParser(base):
        def parse_known_args(self, args=None, namespace=None):
            args = list(sys.argv[1:] if args is None else args)
            tail: list[str] = []
            if "--" in args:
                at = args.index("--")
                args, tail = args[:at], args[at + 1:]
            namespace, extra = super().parse_known_args(args, namespace)
            if tail or not getattr(namespace, "cmd", None):
                namespace.cmd = tail
            return namespace, extra

    return DashDashParser


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=_dash_dash(type(parser)))
    b = sub.add_parser("build", help="render the Containerfile and build the image",
                       description="Render the multi-stage Containerfile for a recipe, target and backend, "
                       "and build it: the builder runs `rocforge build`, the runtime stage keeps only the "
                       "prefix and its library closure.")
    _common(b)
    b.add_argument("--base", metavar="IMAGE", help="builder base image (replaces the variant's)")
    b.add_argument("--runtime-base", metavar="IMAGE", help="runtime base image (default: the variant's, scratch)")
    r = sub.add_parser("run", help="run a built image with the GPU devices and groups passed in",
                       description="Run the image of a recipe build with /dev/kfd, /dev/dri, the GPU groups "
                       "and seccomp=unconfined.")
    _common(r)
    r.add_argument("cmd", nargs="*", metavar="CMD", help="command to run in the container (after --)")
    r.epilog = "example: rocforge container run llama-cpp --target gfx1151 --backend hip -- llama-cli --version"
    c = sub.add_parser("closure", help="stage the shared-library closure of a prefix (builder stage)",
                       description="Copy the shared-library closure of every ELF file below PREFIX into DIR, "
                       "preserving paths and links (ldd, plus the rules in containers/closure.toml).")
    c.add_argument("prefix", metavar="PREFIX", type=Path, help="the install prefix whose ELF files are followed")
    c.add_argument("--out", required=True, type=Path, metavar="DIR", help="staging directory (replaced)")
    c.add_argument("--env-file", type=Path, metavar="FILE", help="dotenv file whose variables ldd runs with")
    c.add_argument("--report", type=Path, metavar="FILE", help="also write the report as JSON to FILE")
    c.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    if args.action != "closure":
        from rocforge_build.commands import target_or_detected

        args.target = target_or_detected(args)
    return {"build": _build, "run": _run, "closure": _closure}[args.action](args)


def _print_decisions(decisions, out=None) -> None:
    out = out or sys.stdout
    for d in decisions:
        out.write(f"  {d.key:<13} {d.text()}\n  {'':<13} ({d.reason})\n")


@contextlib.contextmanager
def _engine_first(refused):
    """The real run checks the engine before it plans: when the engine cannot run here, that is
    its error, whatever planning would have said — so a dry run's planning error gives way to it."""
    try:
        yield
    except RocforgeError:
        if refused is not None:
            raise refused from None
        raise


def _build(args) -> int:
    engine, why = container_engines.detect_engine(args.engine)  # before the source is read
    # before anything is fetched or built; a dry run makes the same check at the same point and
    # raises it once its plan is printed, so it exits with the build's code
    refused = container_engines.engine_error(engine, building=True)
    if refused is not None and not args.dry_run:
        raise refused
    with _engine_first(refused):
        plan = containers.plan(
            args.recipe, target=args.target, backend=args.backend, variant=args.variant,
            base=args.base, runtime_base=args.runtime_base, tag=args.tag, source=args.source,
            ref=args.ref, root=args.rootfs, dry_run=args.dry_run,
        )
    ctx = container_context.context_dir(plan)
    steps = container_engines.build_commands(engine, ctx, plan.tag)
    decisions = (*plan.decisions, why)
    if args.dry_run:
        _print_build_plan(args, plan, engine, ctx, steps, decisions, refused)
        if refused is not None:
            raise refused
        return 0
    out = sys.stderr if args.json else sys.stdout
    out.write(f"rocforge: building {plan.tag} with {engine.name} in {ctx}\n")
    _print_decisions(decisions, out)
    out.flush()
    facts = container_context.build_image(plan, ctx, steps, quiet_stdout=args.json)
    summary = containers.built_summary(plan, engine.name, ctx, facts)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        clos = summary["closure"]
        extra = (f"; library closure of {clos['elf_files']} ELF files: {clos['files']} files, "
                 f"{clos['bytes'] / 1e6:.1f} MB") if clos else ""
        print(f"rocforge: built {plan.tag}{extra}")
        print(f"rocforge: Containerfiles kept in {ctx}")
        print(f"rocforge: run it with `rocforge container run {args.recipe} --target {plan.target} "
              f"--backend {plan.backend} -- CMD`")
    return 0


def _print_build_plan(args, plan, engine, ctx, steps, decisions, refused) -> None:
    """`container build --dry-run`: the Containerfile, the decisions and the engine commands."""
    text = containers.render(plan)
    problems = refused.problems if refused is not None else []
    if args.json:
        print(json.dumps({**plan.to_json(), "engine": engine.name, "context": str(ctx),
                          "engine_problems": problems,
                          "decisions": [d.to_json() for d in decisions],
                          "commands": steps.all(), "containerfile": text,
                          "containerfile_facts": containers.render_facts(plan)}, indent=2))
        sys.stdout.flush()
        return
    out = io.StringIO()  # printed as one text by the one writer (shellsafe.write_script)
    print(f"# {ctx / 'Containerfile'}", file=out)
    print(text, file=out)
    for problem in problems:
        print(f"# {engine.name} cannot build here: {problem}", file=out)
    print("# decisions", file=out)
    _print_decisions(decisions, out)
    print("# commands (the context also gets rocforge's wheels and the recipe file)", file=out)
    print(shlex.join(steps.stage), file=out)
    print(f"# {ctx / 'Containerfile.facts'}: export the builder's env and manifest to {ctx / 'facts'}", file=out)
    print(shlex.join(steps.facts), file=out)
    print(f"# {ctx / 'Containerfile.final'}: FROM {containers.stage_tag(plan.tag)}, "
          "ENV from the env, LABEL from the manifest", file=out)
    print(shlex.join(steps.final), file=out)
    print(shlex.join(steps.cleanup), file=out)
    shellsafe.write_script(out.getvalue())


def _run(args) -> int:
    if not args.cmd:
        raise UsageError("no command given", "put the command after --, e.g. -- llama-cli --version")
    plan = containers.plan(args.recipe, target=args.target, backend=args.backend, variant=args.variant,
                           tag=args.tag, source=args.source, ref=args.ref, root=args.rootfs,
                           dry_run=args.dry_run)
    engine, why = container_engines.detect_engine(args.engine)
    # the real run's check; a dry run raises it once its plan is printed (the same exit code)
    refused = container_engines.engine_error(engine, building=False)
    if refused is not None and not args.dry_run:
        raise refused
    rp = container_engines.run_plan(engine, plan.tag, list(args.cmd), rootfs=args.rootfs,
                             interactive=sys.stdin.isatty() and sys.stdout.isatty())
    why = (why, *_gpu_memory(args.rootfs))
    if not args.dry_run:
        for w in rp.warnings:
            sys.stderr.write(f"rocforge: warning: {w}\n")
        return container_engines.execute_run(rp)
    decisions = (*(d for d in plan.decisions if d.key == "backend"), *why, *rp.decisions)
    if args.json:
        print(json.dumps({**rp.to_json(), "image": plan.tag, "backend": plan.backend,
                          "engine_problems": refused.problems if refused is not None else [],
                          "decisions": [d.to_json() for d in decisions]}, indent=2))
    else:
        out = io.StringIO()  # printed as one text by the one writer (shellsafe.write_script)
        for w in rp.warnings:
            print(f"# warning: {w}", file=out)
        for problem in refused.problems if refused is not None else []:
            print(f"# {engine.name} cannot run here: {problem}", file=out)
        if len(rp.commands) == 1:
            print(shlex.join(rp.commands[0]), file=out)
        else:
            print(f"CTR=$({shlex.join(rp.commands[0])})", file=out)
            for c in rp.commands[1:]:
                print(" ".join('"$CTR"' if a == "$CTR" else shlex.quote(a) for a in c), file=out)
        print("# decisions", file=out)
        _print_decisions(decisions, out)
        shellsafe.write_script(out.getvalue())
    sys.stdout.flush()
    if refused is not None:
        raise refused
    return 0


def _gpu_memory(rootfs) -> tuple:
    """On an APU, the GPU memory the container will see: the host's GTT (same kernel)."""
    from rocforge_build.discover import gpus, host_checks
    from rocforge_build.discover.resolver import Decision

    note = host_checks.gpu_memory_note(rootfs, gpus.discover(rootfs).gpus)
    return (Decision("gpu_memory", note, "a container shares the host's kernel, so its GPU memory "
                     "is the host's GTT; `rocforge host plan` prints the change that raises it"),) if note else ()


def _closure(args) -> int:
    from rocforge_build.ship import closure

    if not args.rootfs.is_host:
        raise UsageError("closure inspects the live system (ldd runs the dynamic loader)", "drop --root")
    report = closure.main_closure(args.prefix, args.out, env_file=args.env_file, report=args.report)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    kinds: dict[str, int] = {}
    for e in report["entries"]:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    print(f"closure of {args.prefix}: {report['elf_files']} ELF files -> "
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
          + f"; staged {report['files']} files ({report['bytes'] / 1e6:.1f} MB) in {args.out}")
    for e in report["entries"]:
        if e["kind"] != "library":
            print(f"  {e['path']}: {e['reason']}")
    return 0
