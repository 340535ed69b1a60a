"""A preset: the exact command that runs a model with the build and runtime settings tune chose,
per context range, with the measured figures that chose them."""

from __future__ import annotations

import re

from rocforge_build import shellsafe
from rocforge_build.errors import ConfigError, UsageError
from rocforge_build.measure.llama_tools import LlamaBuild


def model_key(text: str) -> str:
    """What a MODEL argument names a preset history by: a GGUF file's sha256 (the file is the model,
    whatever its name says), else the text as given (a sha256, 12 or more of its first hex digits,
    or a model name: the store's `resolve`)."""
    from pathlib import Path

    if not Path(text).is_file():
        return text
    from rocforge_build.measure import gguf, provenance

    return provenance.model_sha256(gguf.check(text).path)


def is_igpu(build: LlamaBuild, host: dict) -> bool:
    kinds = {g.get("kind") for g in host.get("gpus", [])}
    if kinds:
        return kinds == {"igpu"}
    try:
        from rocforge_build.discover import targets

        target = build.manifest.get("target")
        return bool(target) and targets.known(target) and targets.get_target(target).kind == "igpu"
    except Exception:
        return False


def command(build: LlamaBuild, model_path: str, variant: dict, ctx: int, igpu: bool) -> tuple[dict, list[str], list[str]]:
    """(env, argv, notes) for llama-server (or llama-cli when the build has no server)."""
    program = "llama-server" if build.has("llama-server") else "llama-cli"
    opts = build.options(program)
    notes = []
    argv = [str(build.program(program)), "-m", model_path, "-c", str(ctx)]
    if build.gpu:
        argv += ["-ngl", "99"]
    fa = variant.get("fa")
    if fa is not None:
        argv += build.fa_args(program, fa)
    ub = variant.get("ubatch")
    if ub:
        argv += ["-ub", str(ub), "-b", str(max(ub, 2048))]
    if igpu and build.gpu:
        if "--no-mmap" in opts:
            argv.append("--no-mmap")
            notes.append("--no-mmap: on an iGPU the weights live in the same RAM; mmap'd files load slowly into GPU-visible memory")
        if "-dio" in opts:
            argv.append("-dio")
            notes.append("-dio: direct I/O model loading on an iGPU (the tree has it)")
    env = {**build.runtime_env, **(variant.get("env") or {})}
    return env, argv, notes


def _checked(preset: dict) -> None:
    """A preset is read back from the results store (a file a user can edit or be handed): its
    range names become shell function names and its env names `env NAME=value` words, so both
    must be plain names and every value one line before a script is printed."""
    where = f"the preset for {preset['model']['name']!r} (results store)"
    for name, r in preset["ranges"].items():
        if shellsafe.env_name_problem(name):
            raise ConfigError(f"{where}: range {name!r} is not a plain name",
                              "range names are letters, digits and '_' (short, long)")
        for k, v in r["env"].items():
            shellsafe.check_env(k, str(v), f"{where}: range {name}: env", ConfigError)


def render(preset: dict, *, shell: bool, only: str | None = None) -> str:
    ranges = preset["ranges"]
    if only and only not in ranges:
        raise UsageError(f"the preset has no range {only!r}", f"ranges: {', '.join(ranges)}")
    _checked(preset)
    out = []
    if shell:
        out += ["#!/bin/sh", shellsafe.comment(
            f"rocforge preset for {preset['model']['name']} (sha256 "
            f"{preset['model']['sha256'][:12]}), tuned {preset['created']}")]
    for name, r in ranges.items():
        if only and name != only:
            continue
        cmd = shellsafe.sh_command([str(w) for w in r["argv"]], {k: str(v) for k, v in r["env"].items()},
                                   f"the preset's {name} command", ConfigError)
        figs = ", ".join(f"{f['test']}{f['n']} @ d{f['depth']}: {f['t_s']:.1f} t/s" for f in r["figures"])
        why = (f"{name} context (depth {r['depth']}): {r['backend']} build {r['prefix']}, "
               f"{r['variant_label']}; measured {figs}; score {r['score']:.1f} (next best: {r.get('runner_up') or 'none'})")
        if shell:
            out += [shellsafe.comment(why)] + [shellsafe.comment(n) for n in r["notes"]]
            if only or len(ranges) == 1:
                out.append(f'exec {cmd} "$@"')
            else:
                out.append(shellsafe.sh_function(name, cmd))
        else:
            out += [shellsafe.one_line(f"[{name}] {why}")] + [f"  note: {shellsafe.one_line(n)}" for n in r["notes"]]
            out += [f"  {cmd}", ""]
    if shell and not only and len(ranges) > 1:
        out += shellsafe.sh_dispatch("ROCFORGE_RANGE", list(ranges), next(iter(ranges)))
    return "\n".join(out).rstrip() + "\n"


_POSIX_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _checked_env(env: dict) -> dict:
    """Preset env names come from recipes, the store and --env: a name that is not a POSIX name
    could be read as code by whatever consumes the export."""
    bad = [k for k in env if not _POSIX_NAME.match(str(k))]
    if bad:
        raise UsageError(f"the preset's environment has a name that is not a variable name: {bad[0]!r}",
                         "tune again; names are letters, digits and _ and do not start with a digit")
    return {str(k): str(v) for k, v in env.items()}


def export(preset: dict, fmt: str, wanted: str, host: str, port: int) -> str:
    """The preset's llama-server command for another tool: a llama-swap `models:` entry, a systemd
    service unit, or the shell script `preset show --shell` prints, each from its emitter."""
    from rocforge_build.emit import systemd, yaml_swap
    from rocforge_build.measure.serve import pick_range

    name, why = pick_range(preset, wanted)
    r = preset["ranges"][name]
    if fmt == "shell":
        return render(preset, shell=True, only=name)
    env = _checked_env(r["env"])
    model = preset["model"]["name"]
    argv = [str(w) for w in r["argv"]]
    head = (f"rocforge preset for {model} (version {preset.get('version')}, range {name}: "
            f"{why}): {r['backend']} {r['variant_label']}")
    if fmt == "llama-swap":
        return yaml_swap.models_entry(comment=head, model=str(model), argv=argv, env=env)
    return systemd.service(comment=head, description=f"llama-server {model}", env=env,
                           argv=[*argv, "--host", host, "--port", str(port)])
