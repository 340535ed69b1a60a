"""A preset: the exact command that runs a model with the build and runtime settings tune chose,
per context range, with the measured figures that chose them."""

from __future__ import annotations

from collections.abc import Mapping

from rocforge_build import schema, shellsafe
from rocforge_build.errors import ConfigError, StoreError, UsageError
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.preset_values import STORE_KEYS, Preset, PresetRange
from rocforge_build.measure.serving import load_args
from rocforge_build.measure.verify import Shape


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


def serving_shape(build: LlamaBuild, variant: dict, ctx: int, igpu: bool) -> Shape:
    """The shape a preset of `variant` serves at, which tune verifies before storing it and `command`
    spells exactly: the range's context per slot, the variant's micro-batch (llama.cpp's 512 when
    it sets none), flash attention, KV cache type and parallel slots, every layer offloaded on a GPU
    build, and the weights read rather than mapped on an iGPU where the server can (direct I/O
    where it has it): on an iGPU the weights live in the same RAM, and mmap'd files load slowly
    into GPU-visible memory."""
    program = "llama-server" if build.has("llama-server") else "llama-cli"
    load = "mmap"
    if igpu and build.gpu:
        load = next((x for x in ("dio", "read") if load_args(build, program, x) is not None), "mmap")
    return Shape(ctx, int(variant.get("ubatch") or 512), bool(variant.get("fa")), 99 if build.gpu else None,
                 str(variant.get("kv") or "f16"), load, int(variant.get("parallel") or 1))


_LOAD_NOTES = {
    "--no-mmap": "--no-mmap: on an iGPU the weights live in the same RAM; mmap'd files load slowly into GPU-visible memory",
    "-dio": "-dio: direct I/O model loading on an iGPU (the tree has it)",
    "--direct-io": "--direct-io: direct I/O model loading on an iGPU (the tree has it)",
    "-lm": "-lm: the tree's --load-mode: the weights read, not mapped, on an iGPU",
}


def command(build: LlamaBuild, model_path: str, variant: dict, ctx: int, igpu: bool) -> tuple[dict, list[str], list[str]]:
    """(env, argv, notes) for llama-server (or llama-cli when the build has no server): exactly
    `serving_shape`, spelled as the program's own --help spells it.  A server is told its slots
    (-np) where it has the option: a tree whose default is "auto" (4 slots in one unified KV cache)
    would otherwise serve a shape nobody verified; with P slots its -c is P times the verified
    context, each slot's share."""
    program = "llama-server" if build.has("llama-server") else "llama-cli"
    opts = build.options(program)
    shape = serving_shape(build, variant, ctx, igpu)
    notes = []
    slots = program == "llama-server" and "-np" in opts
    argv = [str(build.program(program)), "-m", model_path, "-c", str(ctx * shape.parallel if slots else ctx)]
    if build.gpu:
        argv += ["-ngl", "99"]
    fa = variant.get("fa")
    if fa is not None:
        argv += build.fa_args(program, fa)
    ub = variant.get("ubatch")
    if ub:
        argv += ["-ub", str(ub), "-b", str(max(ub, 2048))]
    if shape.kv != "f16":
        argv += ["-ctk", shape.kv, "-ctv", shape.kv]
    if slots:
        argv += ["-np", str(shape.parallel)] + (["-kvu"] if shape.parallel > 1 and "-kvu" in opts else [])
    for word in load_args(build, program, shape.load) or []:
        argv.append(word)
        if word in _LOAD_NOTES:
            notes.append(_LOAD_NOTES[word])
    env = {**build.runtime_env, **(variant.get("env") or {})}
    return env, argv, notes


# What `rocforge tune` stores for a model (measure/tune_choice.py `choose` and `entry`), held at the store's
# boundary (`checked`, which makes it measure/preset_values.py's values): range names become shell
# function names, env names `env NAME=value` words, argv the command serve starts, so each is checked
# before any of it is printed or run.
_COUNT = 1 << 30  # contexts, depths and batch sizes: far above any model's, far below overflow
_SERVING = {"kv": schema.Optional(schema.Str(one_line=True)), "load": schema.Optional(schema.Str(one_line=True)),
            "parallel": schema.Optional(schema.Int(1, _COUNT))}  # absent in a preset stored before verify knew them
_SHAPE = schema.Record({"ctx": schema.Int(1, _COUNT), "ubatch": schema.Optional(schema.Int(1, _COUNT)),
                        "fa": schema.Optional(schema.Bool()), "ngl": schema.Optional(schema.Int(0, _COUNT)),
                        **_SERVING})
_RANGE = schema.Record({
    "prefix": schema.AbsPath(),
    "backend": schema.Str(one_line=True),
    "stamp": schema.Optional(schema.Str()),
    "depth": schema.Int(0, _COUNT),
    "ctx": schema.Int(1, _COUNT),
    "variant": schema.Optional(schema.Record({
        "ubatch": schema.Optional(schema.Int(1, _COUNT)), "fa": schema.Optional(schema.Bool()),
        "env": schema.Optional(schema.EnvTable(), {}), **_SERVING}), {}),
    "variant_label": schema.Str(empty=True),
    "score": schema.Num(),
    "figures": schema.ListOf(schema.Record({
        "test": schema.Str(one_line=True), "n": schema.Int(0, _COUNT), "depth": schema.Int(0, _COUNT),
        "t_s": schema.Num(0), "stddev": schema.Optional(schema.Num(0))})),
    "runner_up": schema.Optional(schema.Str()),
    "verified": schema.Optional(schema.Record({"shape": schema.Optional(_SHAPE)})),
    "env": schema.EnvTable(),
    "argv": schema.ListOf(schema.Str(empty=True, one_line=True), nonempty=True),
    "notes": schema.ListOf(schema.Str(empty=True)),
}, rules=(schema.inside(lambda r: ("argv[0]", r["argv"][0]), "prefix", "the program"),
          lambda r, path: _one_model(r["argv"], path + ".argv")))

MODEL_FLAGS = ("-m", "--model")  # llama-server's and llama-cli's spellings of the model option


def model_at(argv) -> int | None:
    """The index of the word after the model option in a stored command (`_one_model` holds it
    to one), None when it names no model: the word serve swaps for the model file it checked."""
    return next((i + 1 for i, w in enumerate(argv[:-1]) if w in MODEL_FLAGS), None)


def _one_model(argv: list, path: str) -> None:
    """A command names its model once, with a path: llama-server takes the last -m/--model, so a
    second one would choose the model serve loads past the one it checked, and a path that
    starts with '-' (`--rpc=host:port`) is read as an option."""
    flags = [i for i, w in enumerate(argv) if w in MODEL_FLAGS or any(w.startswith(f + "=") for f in MODEL_FLAGS)]
    if len(flags) > 1:
        raise schema.Bad(path, f"names the model {len(flags)} times ({', '.join(argv[i] for i in flags)}): "
                         "a command names its model once")
    if flags and (flags[0] == len(argv) - 1 or argv[flags[0]] not in MODEL_FLAGS):
        raise schema.Bad(path, f"{argv[flags[0]][:60]!r} is not followed by the model's path")
    if flags:
        _no_flag(argv[flags[0] + 1], f"{path} (after {argv[flags[0]]})")


def _no_flag(text: str, path: str) -> None:
    """A model path that llama-server would read as an option (`--rpc=host:port`) is refused."""
    if text.startswith("-"):
        raise schema.Bad(path, f"{text[:60]!r} starts with '-': a model path, not an option")


def _no_store_key(record: dict, path: str) -> None:
    """The keys `preset show --json` prints beside the record (the store's version of it and why
    it is in use: preset_values.STORE_KEYS) are never the record's own: the one shown would not
    be the one stored."""
    for key in STORE_KEYS:
        if key in record:
            raise schema.Bad(f"{path}.{key}" if path else key, "is the store's own key, printed beside the "
                             "record; a stored preset never holds it")


PRESET = schema.JSONTree(schema.Record({
    "model": schema.Record({"name": schema.Str(), "sha256": schema.Str(one_line=True),
                            "path": schema.Str(one_line=True)},  # as tune was given it: may be relative
                           rules=(lambda m, path: _no_flag(m["path"], f"{path}.path"),)),
    "created": schema.Str(one_line=True),
    "ranges": schema.TableOf(_RANGE, key=schema.Name(), nonempty=True),
    "exhaustive": schema.Optional(schema.Bool(), fill=False),  # absent in a preset stored before tune said it
}, rules=(_no_store_key,)))


def checked(preset: object, where: str, *, version: int | None = None, in_use: str | None = None) -> Preset:
    """A preset read back from the results store (a file a user can edit or be handed), held to
    PRESET: one StoreError naming `where` (the store and the model's version) and the field; else
    its values, with the store's `version` and `in_use`."""
    return Preset.of_checked(schema.check(preset, PRESET, where, StoreError,
                                          "tune the model again (`rocforge tune`), or pick a good version "
                                          "with `rocforge preset use`"), version=version, in_use=in_use)


PROGRAMS = ("llama-server", "llama-cli")  # what `command` puts first: the build's own bin/ program


def _build_problem(r: PresetRange, manifest: dict | None = None) -> str | None:
    """Why range `r` does not run its own rocforge build's program, or None: the prefix holds a
    sound manifest (a bare directory such as / or /usr is no build, so "inside the prefix" would
    mean nothing), both stamps are non-empty (None never matches None), and argv[0] is that build's
    bin/llama-server or bin/llama-cli, a regular file whose links stay inside the prefix.
    `manifest`: the prefix's, already read by the caller (serve opens the build once)."""
    import os
    import stat

    from rocforge_build.discover.builds import MANIFEST, read_manifest

    prefix = os.path.normpath(r.prefix)
    if manifest is None:
        manifest = read_manifest(prefix)  # a manifest that breaks its schema is one ConfigError line
    if manifest is None:
        return f"prefix {prefix!r} is not a rocforge build (it holds no readable {MANIFEST})"
    if not manifest["stamp"]:
        return f"the build at {prefix!r} has no stamp in its {MANIFEST}"
    if not r.stamp:
        return "stamp is missing: a preset names the build stamp tune measured"
    program = r.argv[0]
    name = os.path.basename(program)
    if name not in PROGRAMS or os.path.normpath(program) != os.path.join(prefix, "bin", name):
        return f"program {program!r} is not the build's own bin/llama-server or bin/llama-cli"
    real, base = os.path.realpath(program), os.path.realpath(os.path.join(prefix, "bin"))
    try:
        regular = stat.S_ISREG(os.stat(real).st_mode)
    except OSError:
        regular = False
    if os.path.commonpath([base, real]) != base or not regular:
        return f"program {program!r} is not a file in the build's bin/ (-> {real!r})"
    return None


def runnable(preset: Preset, names, where: str, *, manifests: dict | None = None) -> None:
    """Each range in `names` runs its own rocforge build's program (`_build_problem`), checked by
    every command that prints or starts a preset's command (serve and its --dry-run, preset show,
    preset export): a StoreError naming `where` and the range, else nothing is printed or run.
    `manifests`: range name -> its build's manifest, already read by the caller."""
    for name in names:
        problem = _build_problem(preset.ranges[name], (manifests or {}).get(name))
        if problem:
            raise StoreError(f"{where}: range {name}: {shellsafe.one_line(problem)}",
                             "tune the model again with a rocforge build (`rocforge tune`), or pick "
                             "another version with `rocforge preset use`")


def render(preset: Preset, *, shell: bool, only: str | None = None) -> str:
    ranges = preset.ranges
    if only and only not in ranges:
        raise UsageError(f"the preset has no range {only!r}", f"ranges: {', '.join(ranges)}")
    out, lines = [], {}
    if shell:
        out += [shellsafe.SHEBANG, shellsafe.comment(
            f"rocforge preset for {preset.model.name} (sha256 "
            f"{preset.model.sha256[:12]}), tuned {preset.created}")]
    for name, r in ranges.items():
        if only and name != only:
            continue
        cmd = shellsafe.sh_command(list(r.argv), dict(r.env), f"the preset's {name} command", ConfigError)
        figs = ", ".join(f"{f.test}{f.n} @ d{f.depth}: {f.t_s:.1f} t/s" for f in r.figures)
        why = (f"{name} context (depth {r.depth}): {r.backend} build {r.prefix}, "
               f"{r.variant_label}; measured {figs}; score {r.score:.1f} (next best: {r.runner_up or 'none'})")
        if shell:
            out += [shellsafe.comment(why)] + [shellsafe.comment(n) for n in r.notes]
            lines[name] = cmd
        else:
            out += [shellsafe.one_line(f"[{name}] {why}")] + [f"  note: {shellsafe.one_line(n)}" for n in r.notes]
            out += [f"  {cmd}", ""]
    if len(lines) == 1:  # `exec`: the first word, never a name a range could define
        out.append(f'exec {next(iter(lines.values()))} "$@"')
    elif lines:

        out += shellsafe.sh_dispatch("ROCFORGE_RANGE", lines, default_range(ranges))
    return "\n".join(out).rstrip() + "\n"


def export(preset: Preset, fmt: str, wanted: str, host: str, port: int) -> str:
    """The preset's llama-server command for another tool: a llama-swap `models:` entry, a systemd
    service unit, or the shell script `preset show --shell` prints, each from its emitter."""
    from rocforge_build.emit import systemd, yaml_swap

    name, why = pick_range(preset, wanted)
    r = preset.ranges[name]
    if fmt == "shell":
        return render(preset, shell=True, only=name)
    env = dict(r.env)  # checked where the store read it
    model = preset.model.name
    argv = list(r.argv)
    head = (f"rocforge preset for {model} (version {preset.version}, range {name}: "
            f"{why}): {r.backend} {r.variant_label}")
    if fmt == "llama-swap":
        return yaml_swap.models_entry(comment=head, model=model, argv=argv, env=env)
    return systemd.service(comment=head, description=f"llama-server {model}", env=env,
                           argv=[*argv, "--host", host, "--port", str(port)])


def default_range(ranges: Mapping[str, PresetRange]) -> str:
    """The range used when none is named (`serve`, `preset show --shell`): the longest context,
    since a server must hold the longest prompt its clients send."""
    return max(ranges, key=lambda n: ranges[n].ctx)


def pick_range(preset: Preset, wanted: str) -> tuple[str, str]:
    """(range, why): `auto` is `default_range`."""
    ranges = preset.ranges
    if wanted != "auto":
        if wanted not in ranges:
            raise UsageError(f"the preset has no range {wanted!r}", f"ranges: {', '.join(ranges)}")
        return wanted, f"--range {wanted}"
    name = default_range(ranges)
    return name, f"auto: the range with the longest context ({ranges[name].ctx} tokens)"
