"""The stack recipes (rocwmma, hipblaslt, rocblas, aotriton) on stand-ins of their upstream
repositories: real git (shallow, blob-less, sparse checkouts over file://), real cmake and ninja,
a fake TheRock tree as the toolchain (the stand-in projects compile nothing)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import fixtures_roots as fr
import pytest
from buildfixtures import git
from needs import needs_pkg_config
from stackfixtures import REPO, allow_file_submodules, aotriton_repo, monorepo, stack_recipes

from rocforge_build import cli, paths
from rocforge_build.errors import BuildError, NetworkError, NoRocmError, ToolchainError
from rocforge_build.forge import pipeline
from rocforge_build.forge.plan import Request, make_plan, plan_for
from rocforge_build.forge.plan_text import print_plan
from rocforge_build.rootfs import Root

GFX = re.compile(r"gfx[0-9][0-9a-zA-Z]*")
# AOTriton's recipe stops its plan where pkg-config cannot find liblzma (its CMake needs it)
AOTRITON_PREFLIGHT = needs_pkg_config("liblzma")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    base = tmp_path_factory.mktemp("upstream")
    return {"mono": monorepo(base / "rocm-libraries"), "aot": aotriton_repo(base / "aotriton")}


@pytest.fixture
def recipes_dir(tmp_path, upstream, monkeypatch):
    allow_file_submodules(monkeypatch)
    return stack_recipes(tmp_path, upstream["mono"], upstream["aot"])


def dry_run(root: Path, recipe: Path, target: str, capsys) -> dict:
    """The plan as `build --dry-run --json` prints it, made by the library: without a toolchain
    the CLI's dry run stops (exit 5, as the build would) before the plan."""
    from rocforge_build.forge.plan import Request, plan_for

    plan = plan_for(Request(recipe=str(recipe), target=target), Root(root))
    return json.loads(json.dumps(plan.to_json(), indent=2, default=str))


def _strings(plan: dict) -> list[str]:
    """Every argument and environment value a plan (and its dependencies' plans) would use."""
    out = [*plan["configure"], *plan["build"], *plan["install"]]
    out += [f"{k}={v}" for part in ("env", "runtime_env", "export_env") for k, v in plan[part].items()]
    out += [f"-D{o['name']}={o['value']}" for o in plan["options"]]
    out += [o["path"] for o in plan["outputs"]]
    if plan["venv"]:
        out += [a for argv in plan["venv"]["commands"] for a in argv]
    for dep in plan["dependencies"]:
        out += _strings(dep["plan"]) if dep["plan"] else [dep["prefix"]]
    return out


@pytest.mark.parametrize("target", ["gfx1151", "gfx90a"], ids=["strix-halo", "mi210"])
@pytest.mark.parametrize("name", ["rocblas", "hipblaslt",
                                  pytest.param("aotriton", marks=AOTRITON_PREFLIGHT)])
def test_plans_name_the_requested_target_alone(tmp_path, recipes_dir, capsys, name, target):
    empty = tmp_path / "empty-root"  # no ROCm: the plan is made without a toolchain
    empty.mkdir()
    plan = dry_run(empty, recipes_dir / f"{name}.toml", target, capsys)
    assert plan["toolchain"]["missing"]
    strings = _strings(plan)
    named = {m for s in strings for m in GFX.findall(s)}
    assert named == {target}, [s for s in strings if set(GFX.findall(s)) - {target}]
    defines = {o["name"]: o["value"] for o in plan["options"]}
    if name == "aotriton":
        assert defines["AOTRITON_TARGET_ARCH"] == target
        assert defines["AOTRITON_GPU_BUILD_TIMEOUT"] == "0"
        assert plan["build"][-1] == "install"  # `ninja install`, not plain ninja first
        assert plan["venv"]["requirements"][0].endswith("/src/requirements.txt")
        assert len(plan["source"]["commit"]) == 40
    else:
        assert defines["GPU_TARGETS"] == target
        assert plan["outputs"][0]["path"] == f"lib/{name}/library/TensileLibrary_lazy_{target}.dat"
        assert plan["source"]["sparse"][0] == f"projects/{name}"
    if name == "rocblas":
        assert defines["BUILD_WITH_HIPBLASLT"] == "ON"
        assert defines["Tensile_TEST_LOCAL_PATH"].endswith("/src/shared/tensile")
        # no ROCm, so no hipBLASLt with kernels for the target: the chain starts with hipblaslt
        (dep,) = plan["dependencies"]
        assert dep["recipe"] == "hipblaslt" and dep["target"] == target
        assert plan["env"]["CMAKE_PREFIX_PATH"].split(":")[0] == dep["prefix"]
        assert dep["prefix"].endswith(f"builds/hipblaslt-{target}-hip")


def test_rocblas_builds_hipblaslt_only_when_the_rocm_lacks_its_kernels(tmp_path, recipes_dir):
    with_lt, without_lt = tmp_path / "with", tmp_path / "without"
    fr.make_therock_tree(with_lt, "7.10.0a20251021", ("gfx1151",))
    fr.make_therock_tree(without_lt, "7.10.0a20251021", ("gfx1151",), hipblaslt=())
    req = Request(recipe=str(recipes_dir / "rocblas.toml"), target="gfx1151")
    assert plan_for(req, Root(with_lt)).dependencies == []
    (dep,) = plan_for(req, Root(without_lt)).dependencies
    assert dep.plan.recipe.name == "hipblaslt"
    assert "lib/hipblaslt/library/TensileLibrary_lazy_gfx1151.dat" in dep.because


def _manifest(prefix: Path) -> dict:
    return tomllib.loads((prefix / "rocforge-manifest.toml").read_text())


@pytest.mark.slow  # real git, cmake, ninja and a venv: ~20 s
def test_rocblas_and_hipblaslt_really_build_in_order(tmp_path, recipes_dir, upstream):
    root = tmp_path / "root"
    fr.make_therock_tree(root, "7.10.0a20251021", ("gfx1151",), hipblaslt=())
    req = Request(recipe=str(recipes_dir / "rocblas.toml"), target="gfx1151", jobs=2)
    out = pipeline.build(req, Root(root), quiet=True)
    lt = paths.builds_prefix() / "hipblaslt-gfx1151-hip"
    blas = out.prefix
    assert blas == paths.builds_prefix() / "rocblas-gfx1151-hip"
    assert (blas / "lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat").is_file()
    assert (lt / "lib/hipblaslt/library/TensileLibrary_lazy_gfx1151.dat").is_file()
    assert not list(blas.glob("lib/rocblas/library/*gfx90a*"))  # one target only
    # rocBLAS found the hipBLASLt built just before it (CMAKE_PREFIX_PATH from the dependency)
    log = out.plan.log.read_text()
    assert f"FOUND hipBLASLt in {lt}/lib/cmake/hipblaslt" in log
    m, m_lt = _manifest(blas), _manifest(lt)
    assert m["dependencies"][0]["recipe"] == "hipblaslt" and m["dependencies"][0]["stamp"] == m_lt["stamp"]
    assert m["outputs"] == ["lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat"]
    assert m["export_env"] == {"ROCBLAS_TENSILE_LIBPATH": f"{blas}/lib/rocblas/library"}
    assert m_lt["source"]["version"] == "1.1.0" and m["source"]["version"] == "5.1.0"
    # TensileLite ran with the private venv's Python (in the build dir, not the user's)
    info = (lt / "share/hipblaslt/build-info.txt").read_text()
    assert "venv" in info.split()[1] and "rocroller 2.0.0" in info
    # the source: one shallow, blob-less clone, sparse (the project and its shared dirs only)
    tree = Path(_manifest(lt)["source"]["tree"]).parents[1]
    assert (tree / "shared/origami").is_dir() and (tree / "shared/rocroller").is_dir()
    assert not (tree / "projects/unrelated").exists() and not (tree / "shared/unrelated").exists()
    assert not (tree / "projects/rocblas").exists()
    assert git("rev-parse", "--is-shallow-repository", cwd=tree) == "true"
    assert git("config", "remote.origin.partialclonefilter", cwd=tree) == "blob:none"
    # nothing changed: both up to date, nothing runs
    assert pipeline.build(req, Root(root), quiet=True).status == "up to date"

    # upstream Tensile drops gfx1151: the build "succeeds" but has no kernels for the target.
    # The output check fails it, names the file, and the previous install stays.
    mono = upstream["mono"]
    sup = mono / "shared/tensile/supported.txt"
    sup.write_text("gfx90a\ngfx942\n")
    git("commit", "-qam", "tensile without gfx1151", cwd=mono)
    try:
        with pytest.raises(BuildError) as exc:
            pipeline.build(Request(recipe=str(recipes_dir / "rocblas.toml"), target="gfx1151", jobs=2,
                                              ref="develop"), Root(root), quiet=True)
    finally:
        git("reset", "-q", "--hard", "HEAD~1", cwd=mono)
    msg = exc.value.message
    assert "lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat" in msg and "lacks expected output" in msg
    assert "README" not in msg and "(lib/rocblas/library/ is missing or empty)" in msg
    assert "previous install" in exc.value.hint
    assert (blas / "lib/rocblas/library/TensileLibrary_lazy_gfx1151.dat").is_file()
    assert _manifest(blas)["stamp"] == m["stamp"]
    assert not Path(f"{blas}.rocforge-new").exists()


@pytest.mark.slow  # real git, cmake, ninja and a venv: ~20 s
def test_aotriton_venv_submodules_ninja_install_and_version_table(tmp_path, recipes_dir, upstream,
                                                                  monkeypatch, capsys):
    root = tmp_path / "root"
    fr.make_strix_halo(root, version="7.10.0a20251021")
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(root / "home/u/.local/share/rocforge"))
    out = pipeline.build(Request(recipe=str(recipes_dir / "aotriton.toml"), target="gfx1151", jobs=2),
                           Root(root), quiet=True)
    prefix = out.prefix
    commit = git("rev-parse", "0.13b", cwd=upstream["aot"])
    tree = git("rev-parse", "0.13b^{tree}", cwd=upstream["aot"])
    config = (prefix / "include/aotriton/config.h").read_text()
    assert f'"{commit}"' in config and f'"{tree}"' in config and '"gfx1151"' in config
    assert (prefix / "lib/libaotriton_v2.so.0.11.1").read_text().strip() == "kernels for gfx1151 timeout 0"
    assert not Path(f"{prefix}.rocforge-destdir").exists()
    m = _manifest(prefix)
    assert m["source"]["version"] == "0.11.1"
    assert m["export_env"] == {"AOTRITON_INSTALLED_PREFIX": str(prefix),
                               "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"}
    assert "experimental AOTriton target" in m["export_env_reasons"]["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"]
    assert "AOTriton 0.10b-0.11.x: gfx1151 is experimental" in \
        out.plan.env_evidence["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"]
    assert Path(out.plan.venv.path, "bin", "python").exists()
    # `rocforge env` on that machine: the build's prefix, as seen inside the root
    assert cli.main(["--root", str(root), "env", "--shell", "json"]) == 0
    env = json.loads(capsys.readouterr().out)
    inner = "/home/u/.local/share/rocforge/builds/aotriton-gfx1151-hip"
    assert env["AOTRITON_INSTALLED_PREFIX"] == inner
    assert env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    assert inner not in env["LD_LIBRARY_PATH"]  # builds run from their RUNPATH
    assert env["CMAKE_PREFIX_PATH"].split(":")[0] == inner


@AOTRITON_PREFLIGHT
@pytest.mark.parametrize(("minor", "target", "experimental"), [
    (11, "gfx1151", True), (10, "gfx1151", True), (9, "gfx1151", False), (12, "gfx1151", False),
    (11, "gfx1100", False),
])
def test_aotriton_experimental_flag_follows_the_version_table(tmp_path, recipes_dir, upstream,
                                                              minor, target, experimental):
    src = tmp_path / "aotriton"
    subprocess.run(["cp", "-a", str(upstream["aot"]), str(src)], check=True)
    cm = src / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace("MINOR_INT 11)", f"MINOR_INT {minor})"))
    plan = plan_for(Request(recipe=str(recipes_dir / "aotriton.toml"), target=target,
                                               source=str(src)), Root(tmp_path / "none"))
    assert ("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" in plan.export_env) == experimental
    assert plan.export_env["AOTRITON_INSTALLED_PREFIX"] == str(plan.prefix)


@AOTRITON_PREFLIGHT
def test_aotriton_preflight_pkg_config_and_liblzma(tmp_path, recipes_dir, monkeypatch):
    bindir = tmp_path / "bin"  # git and cmake, no pkg-config
    bindir.mkdir()
    for tool in ("git", "cmake", "ninja"):
        (bindir / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True,
                                                  check=True).stdout.strip())
    req = Request(recipe=str(recipes_dir / "aotriton.toml"), target="gfx1151", prefix=str(tmp_path / "p"))
    plan_for(req, Root(tmp_path / "none"))  # the source in the cache (submodules need sh)
    with monkeypatch.context() as m:
        m.setenv("PATH", str(bindir))
        with pytest.raises(ToolchainError) as exc:
            pipeline.build(req, Root(tmp_path / "none"), quiet=True)
    assert "pkg-config is not installed" in exc.value.message
    assert "apt-get install pkg-config liblzma-dev" in exc.value.hint and "xz-devel" in exc.value.hint
    empty = tmp_path / "no-pc"
    empty.mkdir()
    monkeypatch.setenv("PKG_CONFIG_LIBDIR", str(empty))
    monkeypatch.setenv("PKG_CONFIG_PATH", str(empty))
    with pytest.raises(ToolchainError) as exc:
        pipeline.build(req, Root(tmp_path / "none"), quiet=True)
    assert "needs liblzma" in exc.value.message and "pkg-config does not find liblzma" in exc.value.message
    assert "apt-get install liblzma-dev" in exc.value.hint and "dnf install xz-devel" in exc.value.hint
    assert not (tmp_path / "p").exists() and not list((paths.cache_dir() / "work").glob("*/build"))


def test_a_build_that_cannot_run_here_stops_before_anything(tmp_path, recipes_dir):
    # no ROCm at all: neither rocBLAS nor the hipBLASLt it depends on starts (exit 4: no ROCm)
    with pytest.raises(NoRocmError) as exc:
        pipeline.build(Request(recipe=str(recipes_dir / "rocblas.toml"), target="gfx1151"),
                         Root(tmp_path / "none"), quiet=True)
    assert "no ROCm toolchain found for gfx1151" in exc.value.message
    assert "rocforge nightly install --target gfx1151" in exc.value.hint
    assert not paths.builds_prefix().exists()
    # a ROCm whose device libraries predate the target (ROCm 6.2: no gfx1151)
    old = tmp_path / "old"
    fr.make_classic_rocm(old, "6.2.0", isas=fr.OLD_DEVICE_LIB_ISAS)
    with pytest.raises(ToolchainError) as exc:
        pipeline.build(Request(recipe=str(recipes_dir / "rocwmma.toml"), target="gfx1151"),
                         Root(old), quiet=True)
    assert "cannot compile for gfx1151" in exc.value.message
    assert "oclc_isa_version_1151.bc" in exc.value.message
    assert not paths.builds_prefix().exists()


def test_no_network_to_the_source_is_a_clear_error(tmp_path):
    recipes = stack_recipes(tmp_path, monorepo_path=tmp_path / "unreachable")
    with pytest.raises(NetworkError) as exc:
        plan_for(Request(recipe=str(recipes / "rocwmma.toml"), target="gfx1151"), Root(tmp_path))
    assert "git ls-remote" in exc.value.message and "unreachable" in exc.value.message


def test_rocwmma_headers_for_a_target_it_knows(tmp_path, recipes_dir):
    root = tmp_path / "root"
    fr.make_therock_tree(root, "7.10.0a20251021", ("gfx1151",))
    out = pipeline.build(Request(recipe=str(recipes_dir / "rocwmma.toml"), target="gfx1151", jobs=2),
                           Root(root), quiet=True)
    assert "ROCWMMA_ARCH_GFX1151" in (out.prefix / "include/rocwmma/internal/config.hpp").read_text()
    assert {o.name: o.value for o in out.plan.options}["GPU_TARGETS"] == "gfx1151"
    # a target this rocWMMA does not know: allowed (header-only), with a loud note
    plan = plan_for(Request(recipe=str(recipes_dir / "rocwmma.toml"), target="gfx1030"), Root(root))
    assert [n.split(":")[0] for n in plan.notes] == ["THIS rocWMMA DOES NOT KNOW THE TARGET"]


def _rocm_with_rocwmma(root: Path, arches: tuple[str, ...]) -> None:
    """A TheRock tree with HIP headers and a rocWMMA whose config.hpp knows `arches`."""
    d = fr.make_therock_tree(root, "7.10.0a20251021", ("gfx1151",))
    (d / "include/hip").mkdir(parents=True, exist_ok=True)
    (d / "include/hip/hip_runtime.h").write_text("// hip runtime\n")
    cfg = d / "include/rocwmma/internal/config.hpp"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("".join(f"#define ROCWMMA_ARCH_{a.upper()} 1\n" for a in arches))
    (d / "include/rocwmma/rocwmma.hpp").write_text('#include "internal/config.hpp" // rocwmma\n')


def test_llama_rocwmma_builds_a_target_aware_rocwmma_first(tmp_path, recipes_dir):
    from llama_trees import tree

    llama = tree("0.3.9", tmp_path / "llama")  # May 2025: GGML_HIP_ROCWMMA_FATTN
    shutil.copy(REPO / "recipes" / "llama-cpp.toml", recipes_dir / "llama-cpp.toml")
    shutil.copytree(REPO / "patches", recipes_dir.parent / "patches", dirs_exist_ok=True)
    req = Request(recipe=str(recipes_dir / "llama-cpp.toml"), target="gfx1151", backend="rocwmma",
                           source=str(llama))
    old = tmp_path / "rocm-old"  # rocWMMA 6.4.0: no gfx1151
    _rocm_with_rocwmma(old, ("gfx908", "gfx90a", "gfx942", "gfx1100"))
    plan = plan_for(req, Root(old))
    (dep,) = plan.dependencies
    assert dep.plan.recipe.name == "rocwmma" and dep.plan.target == "gfx1151"
    assert plan.env["CPATH"].split(":")[0] == f"{dep.plan.prefix}/include"
    assert plan.env["CMAKE_PREFIX_PATH"].split(":")[0] == str(dep.plan.prefix)
    # with the new rocWMMA's headers the gfx1151 stub is not needed
    status = {r.name: r for r in plan.patch_status}["gfx1151-fattn-wmma-stub.patch"]
    assert status.status == "not needed"
    # a ROCm whose rocWMMA knows gfx1151: nothing to build first
    new = tmp_path / "rocm-new"
    _rocm_with_rocwmma(new, ("gfx1100", "gfx1151"))
    assert plan_for(req, Root(new)).dependencies == []


def _old_rocwmma_source(dest: Path) -> Path:
    """The rocWMMA stand-in with gfx1151 taken out of its architecture table: what a rocWMMA from
    before gfx1151 (ROCm/rocWMMA, Oct 2024; rocWMMA 6.4.0) declares."""
    shutil.copytree(REPO / "tests/data/monorepo/projects/rocwmma", dest)
    cfg = dest / "library/include/rocwmma/internal/config.hpp"
    cfg.write_text("".join(line for line in cfg.read_text().splitlines(keepends=True)
                           if "GFX1151" not in line))
    return dest


def test_rocwmma_for_a_target_its_source_lacks_installs_with_a_loud_note(tmp_path, recipes_dir):
    root = tmp_path / "root"
    fr.make_therock_tree(root, "7.10.0a20251021", ("gfx1151",))
    old = _old_rocwmma_source(tmp_path / "old-rocwmma")
    out = pipeline.build(Request(recipe=str(recipes_dir / "rocwmma.toml"), target="gfx1151", jobs=2,
                                   source=str(old)), Root(root), quiet=True)
    assert out.prefix == paths.builds_prefix() / "rocwmma-gfx1151-hip"
    cfg = (out.prefix / "include/rocwmma/internal/config.hpp").read_text()
    assert "ROCWMMA_ARCH_GFX1100" in cfg and "ROCWMMA_ARCH_GFX1151" not in cfg
    (note,) = out.plan.notes
    assert note.startswith("THIS rocWMMA DOES NOT KNOW THE TARGET")
    assert "rocforge build rocwmma --target gfx1151 (without --source)" in note
    assert _manifest(out.prefix)["notes"] == [note]


def test_llama_rocwmma_uses_the_existing_rocwmma_build_and_the_stub(tmp_path, recipes_dir):
    """The user built rocWMMA for gfx1151 from a tree without it: llama.cpp's rocwmma backend
    uses that build (found by its manifest), fetches nothing, and applies the gfx1151 stub
    because those headers lack ROCWMMA_ARCH_GFX1151."""
    from llama_trees import tree

    from rocforge_build.forge.context import BuildContext

    llama = tree("0.3.9", tmp_path / "llama")
    shutil.copy(REPO / "recipes" / "llama-cpp.toml", recipes_dir / "llama-cpp.toml")
    shutil.copytree(REPO / "patches", recipes_dir.parent / "patches", dirs_exist_ok=True)
    rocm = tmp_path / "rocm-old"  # its own rocWMMA (6.4.0) lacks gfx1151 too
    _rocm_with_rocwmma(rocm, ("gfx908", "gfx90a", "gfx942", "gfx1100"))
    req = Request(recipe=str(recipes_dir / "llama-cpp.toml"), target="gfx1151", backend="rocwmma",
                  source=str(llama))
    # no rocforge rocWMMA yet: the default stays a build of rocm-libraries, which knows gfx1151
    (dep,) = plan_for(req, Root(rocm)).dependencies
    assert dep.built is None and dep.plan.source.spec.kind == "git"
    assert "no rocforge rocwmma build for gfx1151" in dep.because
    # the user builds rocWMMA from the old tree; the network to rocm-libraries is gone after
    built = pipeline.build(Request(recipe=str(recipes_dir / "rocwmma.toml"), target="gfx1151", jobs=2,
                                     source=str(_old_rocwmma_source(tmp_path / "old"))),
                             Root(rocm), quiet=True).prefix
    offline = stack_recipes(tmp_path / "offline", monorepo_path=tmp_path / "unreachable")
    shutil.copy(REPO / "recipes" / "llama-cpp.toml", offline / "llama-cpp.toml")
    shutil.copytree(REPO / "patches", offline.parent / "patches", dirs_exist_ok=True)
    req = Request(recipe=str(offline / "llama-cpp.toml"), target="gfx1151", backend="rocwmma", source=str(llama))
    plan = plan_for(req, Root(rocm))
    (dep,) = plan.dependencies
    assert dep.plan is None and dep.prefix == built and dep.recipe == "rocwmma"
    assert f"the existing rocforge rocwmma build for gfx1151 at {built}" in dep.because
    assert dep.stamp == _manifest(built)["stamp"]
    assert plan.env["CPATH"].split(":")[0] == f"{built}/include"
    assert plan.env["CMAKE_PREFIX_PATH"].split(":")[0] == str(built)
    stub = {r.name: r for r in plan.patch_status}["gfx1151-fattn-wmma-stub.patch"]
    assert stub.status == "would apply", stub
    assert any("stubbed for gfx1151" in n for n in plan.notes)
    doc = plan.to_json()["dependencies"][0]
    assert doc["plan"] is None and doc["built"]["prefix"] == str(built)
    out = io.StringIO()
    print_plan(plan, out)
    assert f"depends  rocwmma (hip) -> {built} (existing build, used as it is)" in out.getvalue()
    # the up-to-date check needs no network either, and folds in the existing build's stamp
    pipeline.up_to_date(make_plan(BuildContext.of(req, Root(rocm)).read()))
    # an existing build whose headers are gone is not used
    (built / "include/rocwmma/rocwmma.hpp").unlink()
    with pytest.raises(NetworkError):
        plan_for(req, Root(rocm))


def test_an_existing_rocwmma_that_knows_the_target_removes_the_stub(tmp_path, recipes_dir):
    from llama_trees import tree

    llama = tree("0.3.9", tmp_path / "llama")
    shutil.copy(REPO / "recipes" / "llama-cpp.toml", recipes_dir / "llama-cpp.toml")
    shutil.copytree(REPO / "patches", recipes_dir.parent / "patches", dirs_exist_ok=True)
    rocm = tmp_path / "rocm-old"
    _rocm_with_rocwmma(rocm, ("gfx1100",))
    built = pipeline.build(Request(recipe=str(recipes_dir / "rocwmma.toml"), target="gfx1151", jobs=2),
                             Root(rocm), quiet=True).prefix
    plan = plan_for(Request(recipe=str(recipes_dir / "llama-cpp.toml"), target="gfx1151", backend="rocwmma",
                             source=str(llama)), Root(rocm))
    (dep,) = plan.dependencies
    assert dep.built is not None and dep.prefix == built
    stub = {r.name: r for r in plan.patch_status}["gfx1151-fattn-wmma-stub.patch"]
    assert stub.status == "not needed"
