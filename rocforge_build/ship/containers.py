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
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shutil
import string
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from rocforge_build import __version__, paths, proc, refs, shellsafe
from rocforge_build.discover import targets
from rocforge_build.discover.resolver import Decision
from rocforge_build.errors import ConfigError, ToolchainError, UsageError, reason
from rocforge_build.resources import PACKAGE_DIR, containers_dir, load_toml

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


@dataclass(frozen=True)
class Engine:
    name: str
    build: tuple[str, ...]
    run_style: str
    run: tuple[str, ...]
    rmi: tuple[str, ...] = ()
    from_: tuple[str, ...] = ()
    rm: tuple[str, ...] = ()
    groups: str = "numeric"
    rootless_groups: str = "numeric"


@dataclass(frozen=True)
class RunPlan:
    engine: str
    commands: tuple[tuple[str, ...], ...]  # for "from" engines: from, run (CTR placeholder), rm
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "commands": [list(c) for c in self.commands],
            "decisions": [d.to_json() for d in self.decisions],
            "warnings": list(self.warnings),
        }


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


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def get_variant(name: str) -> Variant:
    table = variants_data().get("variant", {})
    if name not in table:
        raise UsageError(
            f"unknown container variant {name!r}",
            f"{_suggest(name, table)}known variants: {', '.join(sorted(table))} (containers/variants.toml)",
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
    from rocforge_build.build import recipes

    loaded = recipes.load(recipe)  # validated: unknown names and keys fail here, with suggestions
    packaged = recipes.available().get(loaded.name)
    is_path = packaged is None or packaged.resolve() != loaded.path.resolve()
    return loaded, RecipeRef(name=loaded.name, path=loaded.path if is_path else None)


# -- plan ---------------------------------------------------------------------------------------------
def default_backend(recipe: str, *, target: str, source: str | None, ref: str | None, root) -> Decision:
    """The backend `rocforge build` chooses without --backend: the same function on the same facts
    (the recipe's `[[default]]` rules over the source's build files and this machine's toolchains),
    so the same reason is printed.  It reads the source, as `rocforge build --dry-run` does."""
    from rocforge_build.build import plan as build_plan

    sys.stderr.write("rocforge: choosing the default backend as `rocforge build` does (it reads the "
                     "source's build files; a cache hit after the first fetch)\n")
    req = build_plan.Request(recipe=recipe, target=target, source=source, ref=ref)
    backend, reason = build_plan._prepare(req, root)[4:6]
    return Decision("backend", backend, reason)


def plan(
    recipe: str, *, target: str, backend: str | None = None, variant: str | None = None,
    base: str | None = None, runtime_base: str | None = None, tag: str | None = None,
    source: str | None = None, ref: str | None = None, root=None,
) -> ContainerPlan:
    check_flags(base=base, runtime_base=runtime_base, tag=tag, ref=ref, source=source)
    tgt = targets.get_target(target)  # UsageError with a suggestion for unknown names
    loaded, recipe_ref_ = recipe_ref(recipe)
    decisions = []
    if backend is None:
        from rocforge_build.rootfs import Root

        chosen = default_backend(recipe, target=tgt.name, source=source, ref=ref, root=root or Root("/"))
        backend = chosen.value
        decisions.append(chosen)
    if backend not in loaded.backends:
        raise UsageError(
            f"recipe {loaded.name} has no backend {backend!r}",
            f"{_suggest(backend, loaded.backends)}its backends: {', '.join(loaded.backends)}",
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
    try:
        return string.Template(text).substitute(values)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{where}: bad template field {reason(exc)}", "fields are ${name}; write $$ for a literal $") from exc


def _env_quote(value: str, where: str = "Containerfile value") -> str:
    """A double-quoted ENV/LABEL value: `\\`, `"` and `$` escaped; a line break would end the
    instruction and start another (Containerfile lines have no quoting across lines): refused."""
    problem = shellsafe.env_value_problem(value)
    if problem:
        raise ConfigError(f"{where}: {problem}", "a Containerfile value must be one line")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


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
    body = " \\\n    ".join(f"{k}={_env_quote(v, f'ENV {k}')}" for k, v in env.items())
    return ("# from the builder's `rocforge env --shell dotenv` and the recipe's runtime env\nENV " + body)


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


def _label_body(found: dict[str, str]) -> str:
    return " \\\n      ".join(f"{k}={_env_quote(v, f'LABEL {k}')}" for k, v in found.items())


def label_lines(plan: ContainerPlan, facts: Facts) -> str:
    found = labels(plan, facts.manifest)
    return "# from the build manifest (rocforge-manifest.toml)\nLABEL " + _label_body(found)


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
        "packages_step": f"RUN {pkg_body}" if pkg_body and plan.variant.packages else
        "# (no packages: the base image carries the build tools)",
        "rocm_step": f"RUN {CACHE_MOUNT} \\\n    {rocm_body}" if rocm_body else
        f"# ROCm: {plan.variant.rocm} (nothing to install)",
        "static_labels": _label_body(labels(plan, None)),
        "source_step": f"COPY source/ {DATA_IN_IMAGE / 'source'}/" if plan.local_source else
        "# (the source is fetched by rocforge build)",
        "build_args": "".join(f"{a} " for a in build_args(plan)),
        "env_command": f"rocforge env --target {plan.target} --shell dotenv"
        if data["rocm"][plan.variant.rocm].get("env", True) else "echo '# no ROCm in this image: no rocforge env'",
    }
    return _sub(template_text(TEMPLATE), values, f"containers/{TEMPLATE}")


def build_args(plan: ContainerPlan) -> list[str]:
    """`rocforge build` options beyond recipe, target and backend (shell-quoted)."""
    import shlex

    args = ["--prefix", str(plan.prefix)]
    if plan.source_arg:
        args += ["--source", plan.source_arg]
    if plan.ref:
        args += ["--ref", plan.ref]
    return [shlex.quote(a) for a in args]


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


def read_facts(directory: Path) -> Facts:
    from rocforge_build.ship.closure import parse_dotenv

    env_file, manifest_file = directory / "env", directory / "rocforge-manifest.toml"
    if not env_file.is_file() or not manifest_file.is_file():
        raise ConfigError(
            f"the builder exported no facts to {directory} (env, rocforge-manifest.toml)",
            "look at the first pass's output above; the builder stage must finish",
        )
    try:
        manifest = tomllib.loads(manifest_file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{manifest_file}: not valid TOML: {exc}") from exc
    closure = None
    report = directory / "closure.json"
    if report.is_file():
        closure = json.loads(report.read_text(encoding="utf-8"))
    return Facts(env=parse_dotenv(env_file.read_text(encoding="utf-8")), manifest=manifest, closure=closure)


# -- context --------------------------------------------------------------------------------------
def source_tree() -> Path | None:
    """The rocforge source checkout this rocforge runs from (also an editable install), or None
    for an installed rocforge (its wheel is then rebuilt from the installed files)."""
    top = PACKAGE_DIR.parent
    return top if (top / "pyproject.toml").is_file() else None


def context_dir(plan: ContainerPlan) -> Path:
    return paths.cache_dir() / "containers" / f"{plan.recipe.name}-{plan.target}-{plan.backend}"


def prepare_context(plan: ContainerPlan, ctx: Path) -> None:
    """Fill the build context: rocforge's wheels, the recipe file, the first-pass Containerfile."""
    if ctx.exists():
        shutil.rmtree(ctx)
    wheels = ctx / "wheels"
    wheels.mkdir(parents=True)
    build_wheels(wheels)
    recipe_dir = ctx / "recipe"
    (recipe_dir / "recipes").mkdir(parents=True)
    if plan.recipe.path is not None:  # the recipes loader's layout: recipes/X.toml, patches/NAME/
        shutil.copy2(plan.recipe.path, recipe_dir / "recipes" / plan.recipe.file_name)
        if plan.recipe.patches is not None:
            shutil.copytree(plan.recipe.patches, recipe_dir / "patches" / plan.recipe.name, symlinks=True)
    else:
        (recipe_dir / "README").write_text(f"recipe {plan.recipe.name} ships with rocforge\n", encoding="utf-8")
    local = plan.local_source
    if local is not None:
        if local.is_file():
            (ctx / "source").mkdir()
            shutil.copy2(local, ctx / "source" / local.name)
        else:
            shutil.copytree(local, ctx / "source", symlinks=True)
    (ctx / "empty").mkdir()
    paths.write_whole(ctx / "Containerfile", render(plan))
    paths.write_whole(ctx / "Containerfile.facts", render_facts(plan))


# What a rocforge wheel is built from (pyproject's packages and force-include folders).
_WHEEL_SOURCES = ("pyproject.toml", "README.md", "rocforge_build")
_DATA_FOLDERS = ("recipes", "patches", "containers")


def build_wheels(dest: Path) -> None:
    """Wheels of this rocforge and its dependencies into `dest` (pip; the builder installs offline).

    From a source checkout the wheel is built from a clean copy of the sources: no caches, no local
    clutter, and a data folder that does not exist yet is packaged empty rather than failing the
    build.  An installed rocforge (`pip install .`, a wheel) has no sources: its wheel is made
    again from the installed files its RECORD lists (`wheel_from_installed`)."""
    import tempfile

    top = source_tree()
    with tempfile.TemporaryDirectory(prefix="rocforge-src-") as tmp:
        if top is None:
            what = str(wheel_from_installed(Path(tmp)))
        else:
            src = Path(tmp) / "rocforge"
            src.mkdir()
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
            for name in (*_WHEEL_SOURCES, *_DATA_FOLDERS):
                path = top / name
                if path.is_dir():
                    shutil.copytree(path, src / name, ignore=ignore)
                elif path.is_file():
                    shutil.copy2(path, src / name)
                elif name in _DATA_FOLDERS:
                    (src / name).mkdir()
                    (src / name / "README").write_text("empty in this rocforge\n", encoding="utf-8")
            what = str(src)
        proc.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(dest), what],
            hint="pip must be able to build rocforge and fetch its dependencies on this machine",
        )


# Files of an installed distribution that are the installer's, not the wheel's (PEP 376/610/627).
_INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def wheel_from_installed(dest_dir: Path) -> Path:
    """The wheel of the installed rocforge this code runs from, rebuilt from the files its RECORD
    lists (each checked against the recorded sha256: a changed install is refused)."""
    import base64
    import hashlib
    import zipfile
    from importlib import metadata

    try:
        dist = metadata.distribution("rocforge")
    except metadata.PackageNotFoundError as exc:
        raise ToolchainError("rocforge runs neither from a source checkout nor from an installed "
                             "distribution, so it cannot put itself into the image",
                             "install it (pip install .) or run from a git checkout") from exc
    files = dist.files
    pkg = Path(dist.locate_file("rocforge_build")).resolve()
    if not files or pkg != PACKAGE_DIR:
        raise ToolchainError(f"the installed rocforge distribution ({pkg}) is not the one running "
                             f"({PACKAGE_DIR}), or has no RECORD",
                             "reinstall rocforge (pip install --force-reinstall .)")
    info_dir = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel_meta = Path(dist.locate_file(f"{info_dir}/WHEEL")).read_text(encoding="utf-8")
    tag = next((ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")),
               "py3-none-any")
    name = info_dir[: -len(".dist-info")]  # <name>-<version>
    out = dest_dir / f"{name}-{tag}.whl"
    record = []

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(files, key=str):
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in f.parts or rel.endswith(".pyc"):
                continue  # console scripts (the installer writes them again) and byte code
            if f.parts[0] == info_dir and f.name in _INSTALLER_FILES:
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            if f.hash is not None and digest(data) != f"{f.hash.mode}={f.hash.value}":
                raise ToolchainError(f"the installed rocforge file {rel} differs from its RECORD entry",
                                     "reinstall rocforge (pip install --force-reinstall .)")
            zf.writestr(rel, data)
            record.append(f"{rel},{digest(data)},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return out


# -- engines ----------------------------------------------------------------------------------------
def get_engine(name: str) -> Engine:
    table = engines_data().get("engine", {})
    if name not in table:
        raise UsageError(f"unknown container engine {name!r}", f"{_suggest(name, table)}use one of: {', '.join(table)}")
    raw = table[name]
    return Engine(
        name=name, build=tuple(raw["build"]), run_style=raw["run_style"], run=tuple(raw["run"]),
        rmi=tuple(raw["rmi"]), from_=tuple(raw.get("from", ())), rm=tuple(raw.get("rm", ())),
        groups=raw.get("groups", "numeric"), rootless_groups=raw.get("rootless_groups", "numeric"),
    )


def detect_engine(name: str | None = None) -> tuple[Engine, Decision]:
    if name:
        return get_engine(name), Decision("engine", name, "given with --engine")
    order = engines_data().get("order", [])
    for candidate in order:
        if proc.which(candidate):
            return get_engine(candidate), Decision("engine", candidate, f"first of {', '.join(order)} found on PATH")
    raise ToolchainError(
        f"no container engine found (looked for {', '.join(order)} on PATH)",
        "install podman (apt-get install podman) or buildah, or pass --engine",
    )


def engine_problems(engine: Engine, *, building: bool) -> list[str]:
    """What keeps `engine` from running rocforge's Containerfiles here, one line each (empty: none).

    Docker builds them only with BuildKit (the buildx plugin): the legacy builder knows neither
    `RUN --mount=type=cache` nor `--output type=local` (docs.docker.com, "BuildKit"; Docker 23+
    `docker build` is buildx).  A docker client also needs a reachable daemon."""
    if engine.name != "docker":
        return []
    import subprocess

    def ask(argv: list[str]):
        try:
            return proc.run(argv, check=False, timeout=30)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "no answer in 30 s")

    problems = []
    if building and ask(["docker", "buildx", "version"]).returncode != 0:
        problems.append("docker has no buildx (BuildKit), which the Containerfile needs for "
                        "`RUN --mount=type=cache` and `--output type=local`")
    res = ask(["docker", "version", "--format", "{{.Server.Version}}"])
    if res.returncode != 0:
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        first = next((ln.strip() for ln in (res.stdout or "").splitlines() if ln.strip()), "")
        problems.append(f"docker cannot reach its daemon at {host}" + (f" ({first[:160]})" if first else ""))
    return problems


def check_engine(engine: Engine, *, building: bool) -> None:
    """One clear line before anything is built, naming the fix."""
    problems = engine_problems(engine, building=building)
    if problems:
        others = [n for n in engines_data().get("order", []) if n != engine.name and proc.which(n)]
        use = (f"or use {' or '.join(others)} (found here: --engine {others[0]})" if others
               else "or install podman or buildah (apt-get install podman buildah), which need no daemon")
        fixes = []
        if any("buildx" in p for p in problems):
            fixes.append("install the buildx plugin (Debian 13+: docker-buildx; Docker's apt repository: "
                         "docker-buildx-plugin)")
        if any("daemon" in p for p in problems):
            fixes.append("start the daemon (systemctl start docker) or point DOCKER_HOST at a running one")
        raise ToolchainError("; ".join(problems), f"{'; '.join(fixes)}; {use}")


@dataclass(frozen=True)
class BuildSteps:
    """The engine commands of `rocforge container build`, in order."""

    stage: list[str]  # the multi-stage build, tagged as the stage image
    facts: list[str]  # export /opt/rocforge/facts of the stage image to ctx/facts
    final: list[str]  # the stage image + ENV + LABEL, tagged as the image
    cleanup: list[str]  # untag the stage image (its layers stay shared with the image)

    def all(self) -> list[list[str]]:
        return [self.stage, self.facts, self.final, self.cleanup]


def build_commands(engine: Engine, ctx: Path, tag: str) -> BuildSteps:
    small = str(ctx / "empty")  # the context of the two small builds: they copy nothing from it
    return BuildSteps(
        stage=[*engine.build, "-f", str(ctx / "Containerfile"), "--target", "runtime",
               "-t", stage_tag(tag), str(ctx)],
        facts=[*engine.build, "-f", str(ctx / "Containerfile.facts"),
               "--output", f"type=local,dest={ctx / 'facts'}", small],
        final=[*engine.build, "-f", str(ctx / "Containerfile.final"), "-t", tag, small],
        cleanup=[*engine.rmi, stage_tag(tag)],
    )


def group_ids(rootfs, names) -> dict[str, int | None]:
    """Numeric GIDs of groups from the root's /etc/group (None when the group is not there)."""
    found: dict[str, int | None] = dict.fromkeys(names)
    try:
        text = rootfs.read_text("/etc/group")
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] in found and parts[2].isdigit():
            found[parts[0]] = int(parts[2])
    return found


def run_plan(
    engine: Engine, image: str, command: list[str], *, rootfs, rootless: bool | None = None,
    interactive: bool = False,
) -> RunPlan:
    gpu = engines_data().get("gpu", {})
    decisions: list[Decision] = []
    warnings: list[str] = []
    if rootless is None:
        rootless = os.geteuid() != 0
    style = engine.rootless_groups if rootless else engine.groups
    flags: list[str] = []
    missing = []
    for dev in gpu.get("devices", []):
        if rootfs.exists(dev):
            flags += ["--device", dev]
        else:
            missing.append(dev)
    if missing:
        warnings.append(f"{', '.join(missing)} not found here: left out, the container will not see a GPU")
        decisions.append(Decision("devices", "without " + ", ".join(missing),
                                  "an engine refuses a --device that does not exist; CPU work still runs"))
    mode = "rootless" if rootless else "rootful"
    if style == "keep-groups":
        flags += ["--group-add", "keep-groups"]
        decisions.append(Decision(
            "groups", "keep-groups",
            f"{engine.name} is {mode}: host GIDs cannot be mapped into its user namespace, so the "
            "caller's own supplementary groups (video, render) are kept",
        ))
    elif style == "numeric":
        gids = group_ids(rootfs, gpu.get("groups", []))
        for name, gid in gids.items():
            if gid is None:
                flags += ["--group-add", name]
                warnings.append(f"group {name} is not in /etc/group: passing the name, which the image must know")
            else:
                flags += ["--group-add", str(gid)]
        decisions.append(Decision(
            "groups", ",".join(n if g is None else f"{n}={g}" for n, g in gids.items()),
            f"numeric GIDs from /etc/group ({mode} {engine.name}): the device nodes belong to the host's "
            "groups, and a slim image has no /etc/group to resolve names",
        ))
    else:
        decisions.append(Decision("groups", "none", f"{engine.name} runs the command as root in the container"))
    for opt in gpu.get("security_opt", []):
        flags += ["--security-opt", opt]
    if engine.run_style == "from":
        cmds = (
            (*engine.from_, *flags, image),
            (*engine.run, "$CTR", "--", *command),
            (*engine.rm, "$CTR"),
        )
    else:
        tty = ["-it"] if interactive else []
        cmds = ((*engine.run, *tty, *flags, image, *command),)
    return RunPlan(engine=engine.name, commands=cmds, decisions=tuple(decisions), warnings=tuple(warnings))


def execute_run(run: RunPlan) -> int:
    """Run the planned command, streaming its output; returns its exit code."""
    if len(run.commands) == 1:
        return proc.run(list(run.commands[0]), capture=False, check=False).returncode
    created = proc.run(list(run.commands[0])).stdout.strip().splitlines()
    ctr = created[-1].strip() if created else ""
    try:
        argv = [ctr if a == "$CTR" else a for a in run.commands[1]]
        return proc.run(argv, capture=False, check=False).returncode
    finally:
        proc.run([ctr if a == "$CTR" else a for a in run.commands[2]], check=False)
