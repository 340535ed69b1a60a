"""Stand-ins for the stack's upstream repositories, as real local git repositories (file:// URLs
work offline): a rocm-libraries-shaped monorepo and an AOTriton-shaped repo with a submodule; and
the packaged stack recipes copied to point at them."""

from __future__ import annotations

import shutil
from pathlib import Path

from buildfixtures import git

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[1]
MONOREPO_URL = "https://github.com/ROCm/rocm-libraries.git"
AOTRITON_URL = "https://github.com/ROCm/aotriton.git"
STACK = ("rocwmma", "hipblaslt", "rocblas", "aotriton")


def _serve(repo: Path) -> None:
    """Let clients fetch as from GitHub: partial clones (--filter) and commits by sha."""
    git("config", "uploadpack.allowFilter", "true", cwd=repo)
    git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=repo)


def _commit_tree(src: Path, dest: Path, tag: str) -> Path:
    shutil.copytree(src, dest)
    git("init", "-q", "-b", "develop", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "fixture", cwd=dest)
    git("tag", tag, cwd=dest)
    _serve(dest)
    return dest


def monorepo(dest: Path) -> Path:
    return _commit_tree(DATA / "monorepo", dest, "rocm-7.1.0")


def aotriton_repo(dest: Path) -> Path:
    """AOTriton stand-in with third_party/triton as a submodule (another local repository)."""
    triton = _commit_tree(DATA / "aotriton-triton", dest.parent / f"{dest.name}-triton", "v3.4")
    shutil.copytree(DATA / "aotriton", dest)
    git("init", "-q", "-b", "main", cwd=dest)
    git("-c", "protocol.file.allow=always", "submodule", "add", "-q", triton.as_uri(),
        "third_party/triton", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "fixture", cwd=dest)
    git("tag", "0.13b", cwd=dest)
    _serve(dest)
    return dest


def allow_file_submodules(monkeypatch) -> None:
    """git refuses file:// submodules by default (CVE-2022-39253); tests use local ones."""
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.file.allow")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "always")


def stack_recipes(dest: Path, monorepo_path: Path | None = None, aotriton_path: Path | None = None,
                  **replace: str) -> Path:
    """The packaged stack recipes copied to dest/recipes, their git URLs pointing at the
    stand-ins; returns the recipes directory (dependencies resolve beside each other)."""
    out = dest / "recipes"
    out.mkdir(parents=True, exist_ok=True)
    for name in STACK:
        text = (REPO / "recipes" / f"{name}.toml").read_text()
        if monorepo_path is not None:
            text = text.replace(MONOREPO_URL, monorepo_path.as_uri())
        if aotriton_path is not None:
            text = text.replace(AOTRITON_URL, aotriton_path.as_uri())
        for old, new in replace.items():
            text = text.replace(old, new)
        (out / f"{name}.toml").write_text(text)
        if (REPO / "patches" / name).is_dir():  # patches resolve beside the recipes dir
            shutil.copytree(REPO / "patches" / name, dest / "patches" / name, dirs_exist_ok=True)
    return out


def make_build(root: Path, recipe: str, target: str, backend: str = "hip", *,
               version: str | None = None, export_env: dict[str, str] | None = None,
               export_reasons: dict[str, str] | None = None, outputs: tuple[str, ...] = (),
               files: tuple[str, ...] = (), recorded_prefix: str | None = None,
               built_at: str = "2026-11-20T23:00:00Z") -> Path:
    """A build prefix as `rocforge build` leaves it, at the builds directory's path inside `root`:
    the files, and `rocforge-manifest.toml` with the keys pipeline.write_manifest writes.
    `recorded_prefix` is where the build ran (values under it are re-based by the resolver);
    export values may use `{prefix}` for it."""
    import hashlib

    import tomlkit

    from rocforge_build import paths

    name = f"{recipe}-{target}-{backend}"
    prefix = root / str(paths.builds_prefix()).lstrip("/") / name
    recorded = recorded_prefix or str(paths.builds_prefix() / name)
    for rel in (*files, *(o for o in outputs if not any(c in o for c in "*?["))):
        f = prefix / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    (prefix / "lib").mkdir(parents=True, exist_ok=True)
    exported = {k: v.format(prefix=recorded) for k, v in (export_env or {}).items()}
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by rocforge: exactly what was built. Do not edit."))
    doc["rocforge"] = "0.1.0"
    doc["stamp"] = hashlib.sha256(f"{name}{version}".encode()).hexdigest()
    doc["recipe"] = {"name": recipe, "file": f"/usr/lib/python3/rocforge/recipes/{recipe}.toml",
                     "sha256": "0" * 64}
    doc["source"] = {"kind": "git", "location": "https://github.com/ROCm/rocm-libraries.git",
                     "ref": "develop", "identity": "1" * 40, "commit": "1" * 40,
                     "version": version or ""}
    doc["target"] = target
    doc["backend"] = backend
    doc["backend_reason"] = "the recipe's first backend"
    doc["flags"] = {"configure": ["cmake", f"-DCMAKE_INSTALL_PREFIX={recorded}"], "build": ["ninja"],
                    "options": [{"name": "GPU_TARGETS", "value": target, "reason": "x", "because": "y"}]}
    doc["env"] = {}
    doc["runtime_env"] = {}
    doc["patches"] = []
    # the toolchain kind the recipes give each backend (llama-cpp.toml: cpu -> host, vulkan -> vulkan)
    doc["toolchain"] = {"kind": {"cpu": "host", "vulkan": "vulkan"}.get(backend, "hip"),
                        "compiler_launcher": "none"}
    doc["notes"] = []
    doc["prefix"] = recorded
    doc["outputs"] = list(outputs)
    doc["export_env"] = exported
    doc["export_env_reasons"] = export_reasons or {k: f"{recipe} exports {k}" for k in exported}
    doc["dependencies"] = []
    doc["timings"] = {"total": 1.0}
    doc["built_at"] = built_at
    (prefix / "rocforge-manifest.toml").write_text(tomlkit.dumps(doc))
    return prefix


def program(prefix: Path, name: str, text: str) -> Path:
    """prefix/bin/NAME, an executable holding `text` (a script with its #! line)."""
    exe = prefix / "bin" / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(text)
    exe.chmod(0o755)
    return exe


def make_stack_builds(root: Path, target: str = "gfx1151", aotriton: str = "0.11.1") -> dict[str, Path]:
    """rocBLAS, hipBLASLt and AOTriton built for `target`, as their recipes record them."""
    lib = "lib/{}/library/TensileLibrary_lazy_" + target + ".dat"
    # what the aotriton recipe's version table records (test_stack_recipes checks the table)
    experimental = target == "gfx1151" and aotriton.startswith(("0.10", "0.11"))
    exp = {"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"} if experimental else {}
    return {
        "rocblas": make_build(root, "rocblas", target, version="5.1.0",
                              outputs=(lib.format("rocblas"),), files=("lib/librocblas.so.5",),
                              export_env={"ROCBLAS_TENSILE_LIBPATH": "{prefix}/lib/rocblas/library"}),
        "hipblaslt": make_build(root, "hipblaslt", target, version="1.1.0",
                                outputs=(lib.format("hipblaslt"),),
                                export_env={"HIPBLASLT_TENSILE_LIBPATH": "{prefix}/lib/hipblaslt/library"}),
        "aotriton": make_build(root, "aotriton", target, version=aotriton,
                               outputs=("lib/libaotriton_v2.so*", "include/aotriton/config.h"),
                               files=(f"lib/libaotriton_v2.so.{aotriton}",),
                               export_env={"AOTRITON_INSTALLED_PREFIX": "{prefix}", **exp}),
    }
