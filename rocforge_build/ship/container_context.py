"""The build context of `rocforge container build`: one directory holding rocforge's own wheels
(built from this checkout, or rebuilt from the installed files), the recipe and its patches, a
local source, and the first-pass Containerfile (`containers.py` renders it).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rocforge_build import ownership, paths, proc
from rocforge_build.errors import ToolchainError
from rocforge_build.resources import package_dir
from rocforge_build.ship.container_engines import BuildSteps, run_step
from rocforge_build.ship.containers import (
    ContainerPlan,
    Facts,
    read_facts,
    render,
    render_facts,
    render_final,
)


# -- context --------------------------------------------------------------------------------------
def source_tree() -> Path | None:
    """The rocforge source checkout this rocforge runs from (also an editable install), or None
    for an installed rocforge (its wheel is then rebuilt from the installed files)."""
    top = package_dir().parent
    return top if (top / "pyproject.toml").is_file() else None


def context_dir(plan: ContainerPlan) -> Path:
    return paths.cache_dir() / "containers" / f"{plan.recipe.name}-{plan.target}-{plan.backend}"


def prepare_context(plan: ContainerPlan, ctx: Path) -> None:
    """Fill the build context: rocforge's wheels, the recipe file, the first-pass Containerfile."""
    ownership.remove_owned(ctx, "an earlier container build context",  # refused unless marked
                           marks=(ownership.MARK, "Containerfile.facts"))  # (or written last)
    ctx.mkdir(parents=True)
    ownership.write_mark(ctx, "a container build context")
    wheels = ctx / "wheels"
    wheels.mkdir()
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


# What a rocforge wheel is built from (pyproject's packages, shared scripts and force-include folders).
_WHEEL_SOURCES = ("pyproject.toml", "README.md", "rocforge_build", "bin")
_DATA_FOLDERS = ("recipes", "patches", "containers")


def build_wheels(dest: Path) -> None:
    """Wheels of this rocforge and its dependencies into `dest` (pip; the builder installs offline).

    From a source checkout the wheel is built from a clean copy of the sources: no caches, no local
    clutter, and a data folder that does not exist yet is packaged empty rather than failing the
    build.  An installed rocforge (`pip install .`, a wheel) has no sources: its wheel is made
    again from the installed files its RECORD lists (`wheel_from_installed`)."""
    top = source_tree()
    with ownership.scratch_dir(None, "rocforge-src-") as tmp:
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
            timeout=None,  # a build and downloads: their length is the work
        )


def _shipped_scripts(dist) -> set:
    """The RECORD entries that are scripts the wheel shipped (bin/rocforge, pyproject.toml's
    shared-scripts): files in the environment's scripts directory that no entry point made."""
    import sysconfig

    scripts_dir = Path(sysconfig.get_path("scripts")).resolve()
    made = {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}
    return {f for f in dist.files or () if f.as_posix().startswith("..") and f.name not in made
            and Path(dist.locate_file(f)).resolve().parent == scripts_dir}


def _unpin_shebang(data: bytes) -> bytes:
    """A script's `#!/path/to/python3` back to the wheel's `#!python`, which the installer
    rewrites for the environment it installs into (the wheel format's rule for scripts)."""
    first, sep, rest = data.partition(b"\n")
    if first.startswith(b"#!") and b"python" in first.rsplit(b"/", 1)[-1]:
        return b"#!python" + sep + rest
    return data


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
    if not files or pkg != package_dir():
        raise ToolchainError(f"the installed rocforge distribution ({pkg}) is not the one running "
                             f"({package_dir()}), or has no RECORD",
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

    scripts = _shipped_scripts(dist)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(files, key=str):
            rel = f.as_posix()
            if rel.startswith("..") and f not in scripts or "__pycache__" in f.parts or rel.endswith(".pyc"):
                continue  # entry-point wrappers (the installer writes them again) and byte code
            if f.parts[0] == info_dir and f.name in _INSTALLER_FILES:
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            if f.hash is not None and digest(data) != f"{f.hash.mode}={f.hash.value}":
                raise ToolchainError(f"the installed rocforge file {rel} differs from its RECORD entry",
                                     "reinstall rocforge (pip install --force-reinstall .)")
            if f in scripts:  # back where the wheel had it, with the interpreter line it had,
                rel, data = f"{name}.data/scripts/{f.name}", _unpin_shebang(data)
                entry = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                entry.external_attr = 0o100755 << 16  # executable: pip installs it so
                entry.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(entry, data)
            else:
                zf.writestr(rel, data)
            record.append(f"{rel},{digest(data)},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return out


def build_image(plan: ContainerPlan, ctx: Path, steps: BuildSteps, *, quiet_stdout: bool = False) -> Facts:
    """The image of `plan` built in `ctx`: the builder and runtime stages, the builder's facts
    exported, the final stage's env and labels from those facts, the stage tag removed."""
    prepare_context(plan, ctx)
    run_step(steps.stage, "image build (builder and runtime stages)", ctx / "Containerfile", quiet_stdout=quiet_stdout)
    run_step(steps.facts, "export of the builder's facts", ctx / "Containerfile.facts", quiet_stdout=quiet_stdout)
    facts = read_facts(ctx / "facts")
    paths.write_whole(ctx / "Containerfile.final", render_final(plan, facts))
    run_step(steps.final, "env and labels", ctx / "Containerfile.final", quiet_stdout=quiet_stdout)
    run_step(steps.cleanup, "removal of the stage tag", None, quiet_stdout=quiet_stdout)
    return facts
