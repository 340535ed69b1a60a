"""`rocforge env [--shell bash|zsh|fish|json|dotenv | --json] [--target GFX] [--rocm PATH]`.

Prints the environment for the resolved ROCm stack; `eval "$(rocforge env)"` in a shell
start-up file, or `rocforge env > rocm.sh`.  Without a ROCm, the PATH of the CPU or Vulkan build
chosen (`rocforge use`, or the newest verified) with a comment saying no ROCm was found, exit 0.  Kept import-light: no rich, no requests.
"""

from __future__ import annotations

from rocforge_build.discover.envscript import SHELLS
from rocforge_build.discover.shell import calling_shell


def add_arguments(parser) -> None:
    parser.add_argument("--shell", choices=SHELLS, default=None,
                        help="output format (default: the shell that runs rocforge - its parent "
                        "process - if bash, zsh or fish; else $SHELL; else bash)")
    parser.add_argument("--json", action="store_true", help="the same as --shell json")
    parser.add_argument("--target", metavar="GFX", help="resolve for this gfx target")
    parser.add_argument("--rocm", metavar="PATH", help="use this ROCm install (inside --root)")


def run(args) -> int:
    from rocforge_build import shellsafe
    from rocforge_build.discover import envcache, envscript, envwarnings, resolver
    from rocforge_build.errors import NoRocmError, UsageError

    if args.json:
        if args.shell not in (None, "json"):
            raise UsageError(f"--json and --shell {args.shell} ask for two formats", "give one of them")
        args.shell = "json"
    envcache.start_recording()
    try:
        res = resolver.resolve(args.rootfs, target=args.target, rocm=args.rocm)
    finally:
        recorded = envcache.stop_recording()
    if res.rocm is None and not res.prepend.get("PATH"):  # a CPU or Vulkan build is still served
        raise NoRocmError("no ROCm installation found "
                          "(looked at $ROCM_PATH, rocforge nightlies, /opt/rocm, /opt/rocm-*, "
                          "/usr, pip rocm-sdk)", resolver.install_hint(res.target))
    shell = args.shell or calling_shell()
    output = envscript.render(res, shell)
    if shell != "json":
        from rocforge_build.discover import host

        envcache.start_recording()  # the GTT file joins the stamps the cache is checked against
        note = host.env_note(args.rootfs, res.gpus)
        recorded = {**recorded, **envcache.stop_recording()}
        from rocforge_build.shellsafe import comment

        output += comment(note) + "\n" if note else ""
    if getattr(args, "argv", None) is not None:
        envcache.store(args.argv, output, recorded)
    shellsafe.write_script(output)
    envwarnings.to_stderr(res.warnings)
    return 0
