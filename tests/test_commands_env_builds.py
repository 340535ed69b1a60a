"""`rocforge env` for what rocforge built: build prefixes (manifests under the builds directory)
for the effective target go in front of the library paths and set the variables their recipes
export; builds for other targets or with missing outputs are left out, with reasons."""

from __future__ import annotations

import json
import os
import shutil

import fixtures_roots as fr
from stackfixtures import make_build, make_stack_builds
from test_commands_env import cli, sourced_once

from rocforge_build import paths


def builds_inner(name: str) -> str:
    return f"{paths.builds_prefix()}/{name}"


def env_json(root, *args, env=None) -> dict:
    out = cli(root, "env", "--shell", "json", *args, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_strix_halo_with_stack_builds(tmp_path):
    root = tmp_path / "root"
    fr.make_strix_halo(root)
    make_stack_builds(root)
    make_build(root, "llama-cpp", "gfx1100", files=("bin/llama-cli",))  # another GPU's build
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = cli(root, "env", "--shell", "bash", env=start)
    assert out.returncode == 0, out.stderr
    data = env_json(root, env=start)
    # the bash script, sourced by bash, sets exactly what the JSON (checked below) says
    sourced = sourced_once("bash", out.stdout, start, tmp_path)
    assert {k: sourced.get(k) for k in data} == data
    blas, lt, aot = (builds_inner(f"{n}-gfx1151-hip") for n in ("rocblas", "hipblaslt", "aotriton"))
    assert data["ROCBLAS_TENSILE_LIBPATH"] == f"{blas}/lib/rocblas/library"
    assert data["HIPBLASLT_TENSILE_LIBPATH"] == f"{lt}/lib/hipblaslt/library"
    assert data["AOTRITON_INSTALLED_PREFIX"] == aot
    assert data["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    # no build on LD_LIBRARY_PATH (each runs from its RUNPATH): the ROCm's libraries only
    assert data["LD_LIBRARY_PATH"].split(":")[0] == "/opt/rocm/lib"
    assert "/builds/" not in data["LD_LIBRARY_PATH"]
    assert data["CMAKE_PREFIX_PATH"].split(":")[:3] == [aot, lt, blas]
    assert "llama-cpp-gfx1100" not in out.stdout.split("# builds:")[1].split("used for gfx1151:")[1].split(";")[0]
    assert "not for this target: llama-cpp" in out.stdout


def test_aotriton_without_experimental_status_sets_no_flag(tmp_path):
    fr.make_strix_halo(tmp_path)
    make_stack_builds(tmp_path, aotriton="0.13.0")
    data = env_json(tmp_path)
    assert "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" not in data
    assert data["AOTRITON_INSTALLED_PREFIX"].endswith("aotriton-gfx1151-hip")


def test_target_picks_the_builds(tmp_path):
    fr.make_strix_halo(tmp_path)
    make_stack_builds(tmp_path, "gfx1151")
    make_stack_builds(tmp_path, "gfx1100", aotriton="0.11.1")
    for target in ("gfx1151", "gfx1100"):
        data = env_json(tmp_path, "--target", target)
        assert data["ROCBLAS_TENSILE_LIBPATH"] == f"{builds_inner(f'rocblas-{target}-hip')}/lib/rocblas/library"
        other = "gfx1100" if target == "gfx1151" else "gfx1151"
        assert "/builds/" not in data["LD_LIBRARY_PATH"] and other not in data["CMAKE_PREFIX_PATH"]
    # gfx1100 is not experimental in the recipe's table: its build recorded no flag
    assert "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" not in env_json(tmp_path, "--target", "gfx1100")


def test_built_hipblaslt_enables_rocblas_use_hipblaslt(tmp_path):
    fr.make_strix_halo(tmp_path, hipblaslt=())  # TheRock tree whose hipBLASLt lacks gfx1151
    out = cli(tmp_path, "env", "--shell", "bash")
    assert "unset ROCBLAS_USE_HIPBLASLT" in out.stdout
    make_stack_builds(tmp_path)
    out = cli(tmp_path, "env", "--shell", "bash")
    assert "export ROCBLAS_USE_HIPBLASLT='1'" in out.stdout
    assert "the hipBLASLt rocforge built at" in out.stdout


def test_a_build_missing_its_kernels_is_not_used(tmp_path):
    fr.make_strix_halo(tmp_path)
    built = make_stack_builds(tmp_path)
    (built["rocblas"] / "lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat").unlink()
    out = cli(tmp_path, "env", "--shell", "bash")
    assert "ROCBLAS_TENSILE_LIBPATH" not in out.stdout.replace("# warning", "")
    assert "lacks lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat" in out.stdout
    assert "rocforge build rocblas --target gfx1151 --force" in out.stdout
    assert "HIPBLASLT_TENSILE_LIBPATH" in out.stdout


def test_a_recipe_cannot_export_what_the_resolver_decides(tmp_path):
    fr.make_strix_halo(tmp_path)
    make_build(tmp_path, "odd", "gfx1151", export_env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0",
                                                        "ODD_HOME": "{prefix}"})
    data = env_json(tmp_path)
    assert data["HSA_OVERRIDE_GFX_VERSION"] is None and data["ODD_HOME"] == builds_inner("odd-gfx1151-hip")
    assert "exports HSA_OVERRIDE_GFX_VERSION, which the resolver decides: ignored" in cli(
        tmp_path, "env", "--shell", "bash").stdout


def test_values_follow_a_moved_data_dir(tmp_path):
    fr.make_strix_halo(tmp_path)
    make_build(tmp_path, "aotriton", "gfx1151", version="0.11.1",
               recorded_prefix="/home/old/.local/share/rocforge/builds/aotriton-gfx1151-hip",
               export_env={"AOTRITON_INSTALLED_PREFIX": "{prefix}", "AOTRITON_LIB": "{prefix}/lib"})
    data = env_json(tmp_path)
    assert data["AOTRITON_INSTALLED_PREFIX"] == builds_inner("aotriton-gfx1151-hip")
    assert data["AOTRITON_LIB"] == builds_inner("aotriton-gfx1151-hip") + "/lib"


MARK = "# served from the cache\n"


def _cached_run(root) -> str:
    out = cli(root, "env", "--shell", "bash")
    assert out.returncode == 0, out.stderr
    return out.stdout


def _tamper() -> None:
    from test_discover_envcache import (
        tamper,  # appends MARK as a whole entry (length and CRC updated)
    )

    tamper()


def test_cache_notices_new_changed_and_broken_builds(tmp_path):
    def run() -> str:  # the CLI serves from the validated cache when every input is unchanged
        return _cached_run(tmp_path)

    fr.make_strix_halo(tmp_path)
    first = run()
    assert "ROCBLAS_TENSILE_LIBPATH" not in first
    _tamper()
    assert run().endswith(MARK)  # unchanged: served from the cache
    # a new build
    built = make_stack_builds(tmp_path)
    second = run()
    assert MARK not in second and "ROCBLAS_TENSILE_LIBPATH" in second
    _tamper()
    assert run().endswith(MARK)
    # a rebuild replaces the prefix (pipeline swaps directories): a new manifest
    shutil.rmtree(built["rocblas"])
    make_build(tmp_path, "rocblas", "gfx1151", version="5.2.0",
               outputs=("lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat",),
               export_env={"ROCBLAS_TENSILE_LIBPATH": "{prefix}/lib/rocblas/library"})
    third = run()
    assert MARK not in third and "rocblas 5.2.0" in third
    _tamper()
    # a kernel file deleted from a build
    os.unlink(built["hipblaslt"] / "lib/hipblaslt/library/TensileLibrary_lazy_gfx1151.dat")
    fourth = run()
    assert MARK not in fourth and "export HIPBLASLT_TENSILE_LIBPATH" not in fourth
    assert "hipblaslt 1.1.0 (hip) built for gfx1151" in fourth and "lacks" in fourth


def test_a_manifest_cannot_point_its_outputs_outside_its_prefix(tmp_path):
    """A manifest's `outputs` are data about the prefix: an absolute one (`/etc/hostname`, which
    this root has) or one climbing out with `..` and a wildcard is looked for below the prefix
    only, so the build counts as missing them and is left out; nothing fails."""
    import tomllib

    import tomlkit

    from rocforge_build.discover import builds
    from rocforge_build.rootfs import Root

    fr.make_strix_halo(tmp_path)
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc/hostname").write_text("strix\n")
    prefix = make_build(tmp_path, "llama-cpp", "gfx1151", "cpu", files=("lib/libggml.so",))
    manifest = prefix / "rocforge-manifest.toml"
    doc = tomlkit.parse(manifest.read_text())
    doc["outputs"] = ["lib/*.so", "/etc/hostname", "/opt/*", "../../../../../opt/*"]
    manifest.write_text(tomlkit.dumps(doc))
    assert tomllib.loads(manifest.read_text())["outputs"][1] == "/etc/hostname"
    found = builds.read(Root(tmp_path), builds_inner("llama-cpp-gfx1151-cpu"))
    assert found.missing == ("/etc/hostname", "/opt/*", "../../../../../opt/*")
    out = cli(tmp_path, "env", "--shell", "bash")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "lacks /etc/hostname" in out.stdout
