"""Container images of a recipe build: render the Containerfile, plan the engine commands.

An image is exactly a `rocforge build` run inside a builder stage; nothing about the build is
restated here.  The data lives in `containers/`: `Containerfile.in` (the template),
`variants.toml` (builder bases, packages, how ROCm gets in), `engines.toml` (podman, buildah,
docker, and the GPU run flags), `labels.toml` (OCI labels from the build manifest) and
`closure.toml` (what `ldd` cannot see; used by `closure.py` inside the builder).

A build is three engine builds over one context directory, all files kept there:
  1. `Containerfile` (builder + runtime) -> the stage image: the builder runs `rocforge build`,
     `rocforge env --shell dotenv` and the closure; the runtime stage keeps the prefix, the
     closure and those facts (/opt/rocforge/facts);
  2. `Containerfile.facts` exports the facts to the host (`--output type=local`): a few KB;
  3. `Containerfile.final` is rendered from them: `FROM` the stage image, the env as ENV lines,
     the manifest as OCI labels -> the image.
Only the first one walks the builder (expensive on vfs storage); the other two touch the small
runtime image alone.

This module plans and renders; the build context (rocforge's wheels, the recipe) is
`container_context.py`, the engines and their commands `container_engines.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from rocforge_build import __version__, refs, shellsafe
from rocforge_build.discover import targets
from rocforge_build.discover.resolver import Decision
from rocforge_build.emit import containerfile
from rocforge_build.errors import ConfigError, UsageError, reason
from rocforge_build.resources import containers_dir, load_toml
from rocforge_build.toml_subset import tomllib_parse

# Where rocforge keeps its things inside the builder (ROCFORGE_DATA_DIR there).
DATA_IN_IMAGE = PurePosixPath("/opt/rocforge")
TEMPLATE = "Containerfile.in"
FACTS_TEMPLATE = "Containerfile.facts.in"
FINAL_TEMPLATE = "Containerfile.final.in"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    base: str
    installer: str
    packages: tuple[str, ...]
    rocm: str
    runtime: str


@dataclass(frozen=True)
class RecipeRef:
    """A recipe as the builder sees it: by name (packaged with rocforge) or a copied file."""

    name: str
    path: Path | None  # the host file when RECIPE was a path

    @property
    def patches(self) -> Path | None:
        """A path recipe's patches: `<recipe dir>/../patches/<name>/` (the recipes loader's rule)."""
        if self.path is None:
            return None
        d = self.path.parent.parent / "patches" / self.name
        return d if d.is_dir() else None

    @property
    def arg(self) -> str:
        if self.path is None:
            return self.name
        return str(DATA_IN_IMAGE / "recipe" / "recipes" / self.file_name)

    @property
    def file_name(self) -> str:
        """The recipe file's name in the image: its (plain, validated) recipe name, never the
        host file's name, which may hold spaces, quotes or a newline."""
        return f"{self.name}.toml"


@dataclass(frozen=True, kw_only=True)
class ContainerPlan:
    recipe: RecipeRef
    target: str
    backend: str
    variant: Variant
    builder_base: str
    runtime_base: str
    tag: str
    source: str | None = None  # `rocforge build --source`: a URL as given, or a local host path
    ref: str | None = None
    decisions: tuple[Decision, ...] = ()

    @property
    def local_source(self) -> Path | None:
        """A --source on this machine (tree or tarball): it travels in the build context."""
        if not self.source or self.source.startswith("git+"):
            return None
        if self.source.startswith("file://"):
            from urllib.parse import unquote, urlparse

            return Path(unquote(urlparse(self.source).path)).resolve()
        if "://" in self.source:
            return None
        return Path(self.source).expanduser().resolve()

    @property
    def source_arg(self) -> str | None:
        local = self.local_source
        if local is None:
            return self.source
        where = DATA_IN_IMAGE / "source"
        return str(where / local.name) if local.is_file() else str(where)

    @property
    def prefix(self) -> PurePosixPath:
        """The install prefix inside the builder, given to `rocforge build --prefix` (the same
        `<recipe>-<target>-<backend>` naming as its default)."""
        return DATA_IN_IMAGE / "builds" / f"{self.recipe.name}-{self.target}-{self.backend}"

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe.name,
            "recipe_path": str(self.recipe.path) if self.recipe.path else None,
            "target": self.target,
            "backend": self.backend,
            "variant": self.variant.name,
            "builder_base": self.builder_base,
            "runtime_base": self.runtime_base,
            "tag": self.tag,
            "source": self.source,
            "ref": self.ref,
            "prefix": str(self.prefix),
            "decisions": [d.to_json() for d in self.decisions],
        }


@dataclass(frozen=True)
class Facts:
    """What the builder stage found out: its env (dotenv), manifest and closure report."""

    env: dict[str, str]
    manifest: dict
    closure: dict | None = None


# -- data -------------------------------------------------------------------------------------------
def _load(name: str) -> dict:
    return load_toml(containers_dir() / name, "container data")


@cache
def variants_data() -> dict:
    return _load("variants.toml")


@cache
def engines_data() -> dict:
    return _load("engines.toml")


@cache
def labels_data() -> dict:
    return _load("labels.toml")


def template_text(name: str) -> str:
    path = containers_dir() / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {reason(exc)}", "restore it from the rocforge sources") from exc


def suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def get_variant(name: str) -> Variant:
    table = variants_data().get("variant", {})
    if name not in table:
        raise UsageError(
            f"unknown container variant {name!r}",
            f"{suggest(name, table)}known variants: {', '.join(sorted(table))} (containers/variants.toml)",
        )
    raw = table[name]
    try:
        return Variant(
            name=name, description=raw["description"], base=raw["base"], installer=raw["installer"],
            packages=tuple(raw["packages"]), rocm=raw["rocm"], runtime=raw["runtime"],
        )
    except KeyError as exc:
        raise ConfigError(f"containers/variants.toml: variant {name} lacks key {reason(exc)}") from exc


def toolchain_defaults() -> dict[str, str]:
    return dict(variants_data().get("toolchain_default", {}))


# -- recipes ----------------------------------------------------------------------------------------
def recipe_ref(recipe: str):
    """RECIPE as `rocforge build` takes it (name or .toml path): the loaded recipe and its ref."""
    from rocforge_build.forge import recipes

    loaded = recipes.load(recipe)  # validated: unknown names and keys fail here, with suggestions
    packaged = recipes.available().get(loaded.name)
    is_path = packaged is None or packaged.resolve() != loaded.path.resolve()
    return loaded, RecipeRef(name=loaded.name, path=loaded.path if is_path else None)


# -- plan ---------------------------------------------------------------------------------------------
def default_backend(recipe: str, *, target: str, source: str | None, ref: str | None, root,
                    dry_run: bool = False) -> Decision:
    """The backend `rocforge build` chooses without --backend: the same function on the same facts
    (the recipe's `[[default]]` rules over the source's build files and this machine's toolchains),
    so the same reason is printed.  The source is read only where the rules need it and it is
    not local or cached: a real run then fetches it, as `rocforge build` would; a dry run
    downloads nothing and its reason names the condition the fetch decides."""
    from rocforge_build.forge.context import BuildContext
    from rocforge_build.forge.request import Request

    context = BuildContext.of(Request(recipe=recipe, target=target, source=source, ref=ref), root)
    choice = context.read_cached().backend
    if choice.alternatives and not dry_run:
        sys.stderr.write("rocforge: choosing the default backend as `rocforge build` does: the "
                         "recipe's rules read the source's build files (a cache hit after the "
                         "first fetch)\n")
        choice = context.read().backend
    return Decision("backend", choice.name, choice.reason)


def plan(
    recipe: str, *, target: str, backend: str | None = None, variant: str | None = None,
    base: str | None = None, runtime_base: str | None = None, tag: str | None = None,
    source: str | None = None, ref: str | None = None, root=None, dry_run: bool = False,
) -> ContainerPlan:
    check_flags(base=base, runtime_base=runtime_base, tag=tag, ref=ref, source=source)
    tgt = targets.get_target(target)  # UsageError with a suggestion for unknown names
    loaded, recipe_ref_ = recipe_ref(recipe)
    decisions = []
    if backend is None:
        from rocforge_build.rootfs import Root

        chosen = default_backend(recipe, target=tgt.name, source=source, ref=ref, root=root or Root("/"),
                                 dry_run=dry_run)
        backend = chosen.value
        decisions.append(chosen)
    if backend not in loaded.backends:
        raise UsageError(
            f"recipe {loaded.name} has no backend {backend!r}",
            f"{suggest(backend, loaded.backends)}its backends: {', '.join(loaded.backends)}",
        )
    toolchain = loaded.backends[backend].toolchain
    if variant is None:
        defaults = toolchain_defaults()
        if toolchain not in defaults:
            raise ConfigError(f"containers/variants.toml has no default variant for toolchain {toolchain!r}",
                              "add it to [toolchain_default], or give --variant")
        variant = defaults[toolchain]
        decisions.append(Decision("variant", variant, f"backend {backend} uses the {toolchain} toolchain; "
                                  "its default builder (containers/variants.toml)"))
    else:
        decisions.append(Decision("variant", variant, "given with --variant"))
    var = get_variant(variant)
    rocm_table = variants_data().get("rocm", {})
    if var.rocm not in rocm_table:
        raise ConfigError(f"containers/variants.toml: variant {var.name} names unknown rocm {var.rocm!r}")
    decisions.append(Decision("rocm", var.rocm, rocm_table[var.rocm].get("why", "")))
    if base:
        builder_base = base
        decisions.append(Decision("builder_base", base, "given with --base"))
    elif var.base:
        builder_base = var.base
        decisions.append(Decision("builder_base", base or var.base, f"variant {var.name}'s base image"))
    else:
        raise UsageError(f"variant {var.name} has no base image", "give one with --base IMAGE")
    if runtime_base:
        decisions.append(Decision("runtime_base", runtime_base, "given with --runtime-base"))
    else:
        runtime_base = var.runtime
        why = ("only the prefix and its library closure: the closure must be complete"
               if runtime_base == "scratch" else f"variant {var.name}'s runtime image")
        decisions.append(Decision("runtime_base", runtime_base, why))
    if not tag:
        tag = f"localhost/rocforge/{recipe_ref_.name}:{tgt.name}-{backend}"
        decisions.append(Decision("tag", tag, "rocforge/<recipe>:<target>-<backend>"))
    result = ContainerPlan(
        recipe=recipe_ref_, target=tgt.name, backend=backend, variant=var, builder_base=builder_base,
        runtime_base=runtime_base, tag=tag, source=source, ref=ref, decisions=tuple(decisions),
    )
    local = result.local_source
    if local is not None:
        if not local.exists():
            raise UsageError(f"--source {source}: no such file or directory",
                             "give a local tree or tarball, or a URL")
        decisions.append(Decision("source", str(local), f"copied into the build context as {result.source_arg}"))
        result = dataclasses.replace(result, decisions=tuple(decisions))
    return result


def check_flags(*, base: str | None = None, runtime_base: str | None = None, tag: str | None = None,
                ref: str | None = None, source: str | None = None) -> None:
    """Every user string that reaches a Containerfile, checked before anything is read, fetched
    or written: image references by their grammar, the ref by git's, and `--source` (a word of
    the builder's RUN line) must not hold a line break or control character."""
    for flag, value in (("--base", base), ("--runtime-base", runtime_base)):
        if value is not None:
            refs.check_image_ref(value, flag)
    if tag is not None:
        refs.check_image_ref(tag, "--tag", digest=False)
    if ref is not None:
        refs.check_git_ref(ref)
    if source is not None and any(not c.isprintable() for c in source):
        raise UsageError(f"--source {source!r} contains a line break or control character",
                         "give a path or URL without one (rename or link the directory)")


# -- render -------------------------------------------------------------------------------------------
def _sub(text: str, values: dict[str, str], where: str) -> str:
    return containerfile.fill(text, values, where)


def runtime_env(plan: ContainerPlan, env: dict[str, str], manifest: dict | None = None) -> dict[str, str]:
    """The runtime ENV: the builder's `rocforge env`, the recipe's runtime env (the manifest's
    `runtime_env`, which wins), and the prefix's bin first on PATH.

    Empty values are left out: an image starts without the variable, which is what unset means."""
    result = {k: v for k, v in env.items() if v != ""}
    recipe_env = shellsafe.check_env_table((manifest or {}).get("runtime_env"),
                                           "the build's rocforge-manifest.toml: runtime_env",
                                           ConfigError)
    result.update({k: v for k, v in recipe_env.items() if v != ""})
    for k, v in result.items():
        shellsafe.check_env(k, v, "the builder's env", ConfigError)
    path = result.get("PATH") or DEFAULT_PATH
    bindir = str(plan.prefix / "bin")
    if bindir not in path.split(":"):
        path = f"{bindir}:{path}"
    result["PATH"] = path
    return dict(sorted(result.items()))


def env_lines(plan: ContainerPlan, facts: Facts) -> str:
    env = runtime_env(plan, facts.env, facts.manifest)
    return ("# from the builder's `rocforge env --shell dotenv` and the recipe's runtime env\n"
            + containerfile.env(env))


def _manifest_value(manifest: dict, dotted: str):
    obj = manifest
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    if isinstance(obj, (dict, list)) or str(obj) == "":
        return None
    return str(obj)


def labels(plan: ContainerPlan, manifest: dict | None) -> dict[str, str]:
    """OCI labels from labels.toml; manifest-backed ones only when the manifest is known."""
    fields = {
        "recipe": plan.recipe.name, "target": plan.target, "backend": plan.backend,
        "variant": plan.variant.name, "rocforge_version": __version__, "runtime_base": plan.runtime_base,
    }
    out: dict[str, str] = {}
    for key, spec in labels_data().get("label", {}).items():
        sources = spec.get("from")
        values = dict(fields)
        unless = spec.get("unless", {})
        if unless and manifest is not None and all(
                _manifest_value(manifest, k) == str(v) for k, v in unless.items()):
            continue
        if sources:
            if manifest is None:
                continue
            value = next((v for v in (_manifest_value(manifest, s) for s in sources) if v is not None), None)
            if value is None:
                value = spec.get("default")
            if value is None:
                continue
            values["value"] = value
        out[key] = _sub(spec["template"], values, f"containers/labels.toml label {key}")
    return out


def label_lines(plan: ContainerPlan, facts: Facts) -> str:
    found = labels(plan, facts.manifest)
    return "# from the build manifest (rocforge-manifest.toml)\n" + containerfile.label(found)


CACHE_MOUNT = "--mount=type=cache,id=rocforge-cache,target=/opt/rocforge/cache"


def stage_tag(tag: str) -> str:
    """The name of the first build's image, before the env and labels are added."""
    last = tag.rsplit("/", 1)[-1]
    return f"{tag}-stage" if ":" in last else f"{tag}:stage"


def render(plan: ContainerPlan) -> str:
    """The multi-stage Containerfile: builder and runtime."""
    data = variants_data()
    installer = data.get("installer", {}).get(plan.variant.installer)
    if installer is None:
        raise ConfigError(f"containers/variants.toml: unknown installer {plan.variant.installer!r}")
    pkg_body = _sub(installer.get("run", ""), {"packages": " ".join(plan.variant.packages)}, "installer")
    rocm_body = _sub(data["rocm"][plan.variant.rocm].get("run", ""), {"target": plan.target}, "rocm step")
    values = {
        "rocforge_version": __version__,
        "recipe": plan.recipe.name,
        "recipe_arg": plan.recipe.arg,
        "target": plan.target,
        "backend": plan.backend,
        "variant": plan.variant.name,
        "variant_description": plan.variant.description,
        "builder_base": plan.builder_base,
        "runtime_base": plan.runtime_base,
        "prefix": str(plan.prefix),
        "default_path": DEFAULT_PATH,
        "packages_step": containerfile.run(pkg_body) if pkg_body and plan.variant.packages else
        "# (no packages: the base image carries the build tools)",
        "rocm_step": containerfile.run(rocm_body, CACHE_MOUNT) if rocm_body else
        f"# ROCm: {plan.variant.rocm} (nothing to install)",
        "static_labels": containerfile.label_pairs(labels(plan, None)),
        "source_step": f"COPY source/ {DATA_IN_IMAGE / 'source'}/" if plan.local_source else
        "# (the source is fetched by rocforge build)",
        "build_args": containerfile.shell_words(build_args(plan), "rocforge build's options"),
        "env_command": f"rocforge env --target {plan.target} --shell dotenv"
        if data["rocm"][plan.variant.rocm].get("env", True) else "echo '# no ROCm in this image: no rocforge env'",
    }
    return _sub(template_text(TEMPLATE), values, f"containers/{TEMPLATE}")


def build_args(plan: ContainerPlan) -> list[str]:
    """`rocforge build` options beyond recipe, target and backend (words, quoted by the emitter)."""
    args = ["--prefix", str(plan.prefix)]
    if plan.source_arg:
        args += ["--source", plan.source_arg]
    if plan.ref:
        args += ["--ref", plan.ref]
    return args


def render_facts(plan: ContainerPlan) -> str:
    """The Containerfile that exports /opt/rocforge/facts of the first image to the host."""
    return _sub(template_text(FACTS_TEMPLATE), {"stage_image": stage_tag(plan.tag)}, FACTS_TEMPLATE)


def render_final(plan: ContainerPlan, facts: Facts) -> str:
    """The image itself: the first image plus ENV (from `rocforge env`) and LABEL (manifest)."""
    values = {
        "stage_image": stage_tag(plan.tag), "tag": plan.tag, "rocforge_version": __version__,
        "env_lines": env_lines(plan, facts), "label_lines": label_lines(plan, facts),
    }
    return _sub(template_text(FINAL_TEMPLATE), values, FINAL_TEMPLATE)


def built_summary(plan: ContainerPlan, engine: str, ctx: Path, facts: Facts) -> dict:
    """What `container build` reports of an image it built: the plan, the engine and context, its
    Containerfiles, the labels and env the final stage set from the builder's facts, the closure."""
    return {**plan.to_json(), "engine": engine, "context": str(ctx),
            "containerfiles": [str(ctx / n) for n in ("Containerfile", "Containerfile.facts", "Containerfile.final")],
            "labels": labels(plan, facts.manifest),
            "env": runtime_env(plan, facts.env, facts.manifest),
            "closure": {k: facts.closure[k] for k in ("elf_files", "files", "bytes")} if facts.closure else None}


def read_facts(directory: Path) -> Facts:
    from rocforge_build.ship.closure import parse_dotenv

    env_file, manifest_file = directory / "env", directory / "rocforge-manifest.toml"
    if not env_file.is_file() or not manifest_file.is_file():
        raise ConfigError(
            f"the builder exported no facts to {directory} (env, rocforge-manifest.toml)",
            "look at the first pass's output above; the builder stage must finish",
        )
    try:
        manifest = tomllib_parse(manifest_file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{manifest_file}: not valid TOML: {exc}") from exc
    closure = None
    report = directory / "closure.json"
    if report.is_file():
        closure = json.loads(report.read_text(encoding="utf-8"))
    return Facts(env=parse_dotenv(env_file.read_text(encoding="utf-8")), manifest=manifest, closure=closure)
