"""`rocforge bundle`: relocatable archives of a build.

Real parts only: the fixture CMake project built by the pipeline, ELF libraries made here with
gcc and found by the real loader (ldd), RUNPATHs rewritten by the real patchelf, the real `tar`,
`unzip` and `zstd` programs unpacking what rocforge wrote, and the kernel file names (and sizes)
of Debian sid's real librocblas4 / libhipblaslt1 packages (tests/data/kernel-dirs, made by
fetch.sh there with apt-get download + dpkg-deb -c).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tomllib
from pathlib import Path

import needs
import pytest
from buildfixtures import recipe_copy, tarball
from fixtures_roots import RX7900XTX, STRIX_HALO, make_gpus
from test_ship_closure import _exe, _lib

from rocforge_build.cli import main
from rocforge_build.errors import IntegrityError, UsageError
from rocforge_build.forge import pipeline
from rocforge_build.forge.plan import Request
from rocforge_build.rootfs import Root
from rocforge_build.ship import bundle, bundle_archive, bundle_check, bundle_rules, bundle_unpack

LISTS = Path(__file__).resolve().parents[1] / "data" / "kernel-dirs"


def kernel_list(package: str) -> dict[str, int]:
    """{file name in the kernel library directory: size} from a dpkg-deb -c list."""
    out = {}
    for line in (LISTS / f"{package}.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        size, path = line.split(" ", 1)
        if "/library/" in path:
            out[path.rsplit("/", 1)[1]] = int(size)
    return out


# -- kernel directories: the real Debian sid file names -------------------------------------------
def test_gfx_tokens_in_real_kernel_file_names():
    assert bundle_rules.gfx_tokens("Kernels.so-000-gfx1100.hsaco") == ["gfx1100"]
    # the xnack feature suffix belongs to gfx90a (librocblas4 ships both variants)
    assert bundle_rules.gfx_tokens("TensileLibrary_Type_HH_Contraction_l_Ailk_Bjlk_Cijk_Dijk_fallback_gfx90a-xnack+.hsaco") == ["gfx90a"]
    assert bundle_rules.gfx_tokens("TensileLibrary_lazy_gfx1151.dat") == ["gfx1151"]
    assert bundle_rules.gfx_tokens("hipblasltExtOpLibrary.dat") == []
    # TheRock kernel packs: per architecture or per family (ROCm/rocm-kpack)
    assert bundle_rules.gfx_tokens("blas_lib_gfx110X.kpack") == ["gfx110X"]
    assert bundle_rules.token_serves("gfx110X", "gfx1100") and not bundle_rules.token_serves("gfx110X", "gfx1151")
    assert bundle_rules.token_serves("gfx115X", "gfx1151") and not bundle_rules.token_serves("gfx1100", "gfx1101")
    assert bundle_rules.token_serves("gfx11-generic", "gfx1151")  # the target table's `generic`


def test_trimming_debian_sid_rocblas_and_hipblaslt_for_gfx1151():
    rocblas, hipblaslt = kernel_list("librocblas4"), kernel_list("libhipblaslt1")
    # Counted by hand in the lists (grep -c): librocblas4 6.4.4 has 1349 library files, 50 naming no
    # target, 92 naming gfx1100 and none naming gfx1151; libhipblaslt1 7.1.1 has 1467, 3 naming no
    # target, 95 naming gfx1100 and 95 naming gfx1151.
    assert (len(rocblas), len(hipblaslt)) == (1349, 1467)
    dirs = {"lib/rocblas/4.4.1/library": list(rocblas), "lib/hipblaslt/library": list(hipblaslt)}
    keep_targets, decision = bundle_rules.kernel_targets("gfx1151", dirs)
    # rocBLAS has no gfx1151 kernels: gfx1151's override target (gfx1100, target table) is kept too
    assert keep_targets == ("gfx1151", "gfx1100")
    assert decision.key == "HSA_OVERRIDE_GFX_VERSION" and decision.value == "11.0.0"
    assert "lib/rocblas/4.4.1/library" in decision.reason
    keep, drop = bundle_rules.trim_names(list(rocblas), keep_targets)
    assert len(keep) == 50 + 92 and len(drop) == 1349 - 142
    assert "TensileLibrary_lazy_gfx1100.dat" in keep and "Kernels.so-000-gfx1100.hsaco" in keep
    assert "TensileLibrary_Type_BB_HPA_Contraction_l_Ailk_Bjlk_Cijk_Dijk_fallback.dat" in keep
    assert not any("gfx1101" in n or "gfx90a" in n for n in keep)
    keep, drop = bundle_rules.trim_names(list(hipblaslt), keep_targets)
    assert len(keep) == 3 + 95 + 95
    assert {"TensileLibrary_lazy_gfx1151.dat", "extop_gfx1151.co", "hipblasltExtOpLibrary.dat"} <= set(keep)
    # a GPU whose own files are everywhere: nothing else kept, no override
    assert bundle_rules.kernel_targets("gfx1100", dirs) == (("gfx1100",), None)
    assert len(bundle_rules.trim_names(list(hipblaslt), ("gfx1100",))[0]) == 3 + 95


# -- a ROCm-like closure, made with gcc: libraries outside the prefix, kernel dirs beside them ----
def _rocm_like(tmp_path: Path) -> tuple[Path, Path]:
    """A prefix whose program needs librocblas, libhipblaslt and libamdhip64 from a ROCm lib dir
    (found through LD_LIBRARY_PATH, as the build's env gives it); the kernel directories hold
    empty files under the real Debian names."""
    needs.require("patchelf")  # every test that uses it bundles: patchelf rewrites RUNPATHs
    rocm = tmp_path / "rocm" / "lib"
    _lib(rocm / "libamd_comgr.so.3", "libamd_comgr.so.3")  # dlopen()ed by HIP: the hip-comgr rule
    _lib(rocm / "libamdhip64.so.7.1.0", "libamdhip64.so.7")  # as packaged: soname link -> versioned file
    (rocm / "libamdhip64.so.7").symlink_to("libamdhip64.so.7.1.0")
    _lib(rocm / "librocblas.so.4", "librocblas.so.4", "int rb(void) { return 4; }")
    _lib(rocm / "libhipblaslt.so.1", "libhipblaslt.so.1")
    for pkg, where in (("librocblas4", "rocblas/4.4.1/library"), ("libhipblaslt1", "hipblaslt/library")):
        (rocm / where).mkdir(parents=True)
        for name in kernel_list(pkg):
            (rocm / where / name).touch()
    prefix = tmp_path / "prefix"
    _exe(prefix / "bin" / "gemm", [f"-L{rocm}", "-l:librocblas.so.4", "-l:libhipblaslt.so.1", "-l:libamdhip64.so.7"],
         '#include <stdio.h>\nint rb(void);\nint main(void) { printf("rocblas %d\\n", rb()); return 0; }')
    (prefix / "rocforge-manifest.toml").write_text(
        '# a manifest as the pipeline writes it (the keys bundle reads)\n'
        f'prefix = "{prefix}"\ntarget = "gfx1151"\nbackend = "hip"\n'
        '[recipe]\nname = "gemm"\n'
        f'[runtime_env]\nLD_LIBRARY_PATH = "{rocm}:{prefix}/lib"\nROCBLAS_USE_HIPBLASLT = "1"\n'
        f'[export_env]\nROCM_PATH = "{tmp_path / "rocm"}"\n')
    return prefix, rocm


def test_rocm_like_bundle_trims_kernels_keeps_dlopened_and_runs_elsewhere(tmp_path):
    prefix, rocm = _rocm_like(tmp_path)
    out = tmp_path / "gemm.tar.gz"
    result = bundle.make(str(prefix), target="gfx1151", backend=None, out=out, root=Root("/"))
    assert result["gpu"] == "gfx1151"
    dest = bundle_unpack.unpack(out, tmp_path / "elsewhere")
    shutil.rmtree(rocm)  # the build machine's ROCm is gone: the bundle must carry what it needs
    lib = dest / "lib"
    assert (lib / "libamd_comgr.so.3").is_file()  # not in any DT_NEEDED: came by the closure rule
    assert os.readlink(lib / "libamdhip64.so.7") == "libamdhip64.so.7.1.0" and (lib / "libamdhip64.so.7.1.0").is_file()
    rb = sorted(os.listdir(lib / "rocblas/4.4.1/library"))
    assert len(rb) == 50 + 92 and not any("gfx90a" in n for n in rb)
    assert len(os.listdir(lib / "hipblaslt/library")) == 3 + 95 + 95
    runpath = subprocess.run(["patchelf", "--print-rpath", str(dest / "bin/gemm")], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert runpath == "$ORIGIN/../lib"
    launcher = (dest / "run").read_text()
    # LD_LIBRARY_PATH's build-machine entry is dropped (it would win over RUNPATH); the prefix's
    # own entry is re-based onto the bundle; ROCM_PATH (build machine only) is left out
    assert """export LD_LIBRARY_PATH="${here}"'/lib'""" in launcher
    assert "# left out: ROCM_PATH=" in launcher and "export ROCBLAS_USE_HIPBLASLT='1'" in launcher
    assert "HSA_OVERRIDE_GFX_VERSION='11.0.0'; export HSA_OVERRIDE_GFX_VERSION" in launcher
    run = subprocess.run([str(dest / "run"), "gemm"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0 and run.stdout == "rocblas 4\n", run.stderr
    meta = tomllib.loads((dest / "bundle.toml").read_text())
    assert meta["bundle"]["kernel_targets"] == ["gfx1100", "gfx1151"]
    excluded = {os.path.basename(e["library"]) for e in meta["excluded"]}
    assert "libc.so.6" in excluded and not any(n.startswith("librocblas") for n in excluded)


def test_check_says_which_gpus_run_it(tmp_path, capsys):
    prefix, _ = _rocm_like(tmp_path)
    out = tmp_path / "gemm.zip"
    assert main(["bundle", str(prefix), "--target", "gfx1151", "--out", str(out)]) == 0
    strix = tmp_path / "strix"
    make_gpus(strix, STRIX_HALO, RX7900XTX)
    capsys.readouterr()
    assert main(["--root", str(strix), "bundle", "check", str(out)]) == 0
    text = capsys.readouterr().out
    assert "every sha256 matches" in text
    assert "GPU 0 (gfx1151" in text and "runs (the bundle's target)" in text
    assert "GPU 1 (gfx1100" in text and "does not run" in text
    empty = tmp_path / "nogpu"
    empty.mkdir()
    assert main(["--root", str(empty), "bundle", "check", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and not data["runs_here"]


# -- the fixture project, built by the pipeline ---------------------------------------------------
@pytest.fixture(scope="module")
def fixture_build(tmp_path_factory):
    needs.require("patchelf")  # the tests that use it bundle it
    t = tmp_path_factory.mktemp("fixture-bundle")
    req = Request(recipe=str(recipe_copy(t / "r")), target="gfx1151", source=str(tarball(t / "fx.tar.gz")),
                  jobs=2, prefix=str(t / "prefix"))
    return pipeline.build(req, Root("/"), quiet=True).prefix


def _hello(dest: Path) -> list[str]:
    out = subprocess.run([str(dest / "run"), "fixture-hello"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.zst", ".zip"])
def test_fixture_bundle_unpacked_by_the_system_tools_runs_anywhere(fixture_build, tmp_path, suffix):
    needs.require(*{".tar.zst": ["zstd"], ".zip": ["unzip"]}.get(suffix, []))
    out = tmp_path / f"fixture{suffix}"
    old_umask = os.umask(0o022)
    try:
        bundle.make(str(fixture_build), target="gfx1151", backend=None, out=out, root=Root("/"))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # readable by others, as `tar -czf` makes it
    where = tmp_path / "unpacked"
    where.mkdir()
    tool = {".tar.gz": ["tar", "xzf", str(out)], ".zip": ["unzip", "-q", str(out)],
            ".tar.zst": ["tar", "--zstd", "-xf", str(out)]}[suffix]
    subprocess.run(tool, cwd=where, check=True)
    dest = where / "fixture-gfx1151-accel"
    moved = tmp_path / "moved" / "again"
    moved.parent.mkdir()
    dest.rename(moved)  # any directory name, anywhere
    assert _hello(moved) == ["patched by rocforge", "HELLO", "accel: on", "fixture 1.2.0"]
    assert (moved / "lib" / "libgreet.so.1").is_symlink()
    name, info, bad = bundle_check.verify(moved)
    assert bad == [] and info["bundle"]["gpu"] == "none"
    assert {f["path"] for f in info["file"]} >= {"bin/fixture-hello", "lib/libgreet.so.1.2.0", "run",
                                                  "rocforge-manifest.toml"}


def test_check_finds_changed_missing_and_extra_files(fixture_build, tmp_path, capsys):
    out = tmp_path / "f.tar.gz"
    bundle.make(str(fixture_build), target="gfx1151", backend=None, out=out, root=Root("/"))
    dest = bundle_unpack.unpack(out, tmp_path / "u")
    (dest / "bin" / "fixture-extra").write_bytes(b"changed")
    (dest / "lib" / "libgreet.so.1.2.0").unlink()
    (dest / "stray").write_text("x")
    _, _, bad = bundle_check.verify(dest)
    assert bad == ["sha256 mismatch: bin/fixture-extra", "missing: lib/libgreet.so.1.2.0",
                   "not listed in bundle.toml: stray"]
    assert main(["bundle", "check", str(dest)]) == IntegrityError.exit_code
    err = capsys.readouterr().err
    assert "3 of" in err and "do not match bundle.toml" in err and "Traceback" not in err


def test_out_never_replaces_a_file_rocforge_did_not_make(fixture_build, tmp_path, capsys):
    precious = tmp_path / "notes.tar.gz"
    precious.write_text("my notes")
    assert main(["bundle", str(fixture_build), "--target", "gfx1151", "--out", str(precious)]) == 2
    assert precious.read_text() == "my notes"
    assert "not a bundle rocforge made" in capsys.readouterr().err
    ours = tmp_path / "ours.tar.gz"
    for _ in range(2):  # its own bundle is replaced
        assert main(["bundle", str(fixture_build), "--target", "gfx1151", "--out", str(ours)]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial left
    assert main(["bundle", str(fixture_build), "--target", "gfx1100", "--out", str(ours)]) == 2
    assert "built for gfx1151, not gfx1100" in capsys.readouterr().err


@needs.needs("patchelf")
def test_recipe_names_the_build_rocforge_made(tmp_path, capsys):
    t = tmp_path
    recipe = recipe_copy(t / "r")
    # the default prefix (data dir builds/) and the recipe's default backend for gfx1151 (accel)
    pipeline.build(Request(recipe=str(recipe), target="gfx1151", source=str(tarball(t / "fx.tar.gz")), jobs=2),
                     Root("/"), quiet=True)
    out = t / "by-recipe.zip"
    assert main(["bundle", str(recipe), "--target", "gfx1151", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    backend = next(d for d in data["decisions"] if d["key"] == "backend")
    assert backend["value"] == "accel" and "gfx1151 gets the accelerated mode" in backend["reason"]
    assert main(["bundle", str(recipe), "--target", "gfx1100", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no build of fixture --target gfx1100 here" in err and "rocforge build" in err


def _hostile(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        toml = b'[bundle]\nmade_by = "rocforge"\nname = "b"\n'
        info = tarfile.TarInfo("b/bundle.toml")
        info.size = len(toml)
        tf.addfile(info, io.BytesIO(toml))
        member.size = len(data)
        tf.addfile(member, io.BytesIO(data) if data else None)
    return path


@pytest.mark.parametrize("member", [
    tarfile.TarInfo("b/../../escaped"),
    tarfile.TarInfo("other/file"),
])
def test_unpack_lands_nothing_outside(tmp_path, member):
    archive = _hostile(tmp_path / "h.tar.gz", member, b"boom")
    into = tmp_path / "into"
    with pytest.raises(IntegrityError):
        bundle_unpack.unpack(archive, into)
    assert not (tmp_path / "escaped").exists() and not (into / "other").exists()
    assert not (into / "b").exists() and os.listdir(into) == []


def test_unpack_refuses_a_link_that_leaves(tmp_path):
    link = tarfile.TarInfo("b/lib/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../etc"
    with pytest.raises(IntegrityError, match="resolves outside the bundle.s folder"):
        bundle_unpack.unpack(_hostile(tmp_path / "l.tar.gz", link), tmp_path / "into")


def test_unpack_refuses_links_that_leave_only_together(tmp_path):
    """`b/q -> .` makes `b/p -> q/q/q/../../../../x` (inside by its text) resolve outside."""
    with tarfile.open(tmp_path / "c.tar.gz", "w:gz") as tf:
        toml = b'[bundle]\nmade_by = "rocforge"\nname = "b"\n'
        info = tarfile.TarInfo("b/bundle.toml")
        info.size = len(toml)
        tf.addfile(info, io.BytesIO(toml))
        for name, target in (("b/q", "."), ("b/p", "q/q/q/../../../../x")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tf.addfile(link)
    into = tmp_path / "into"
    with pytest.raises(IntegrityError, match="resolves outside the bundle.s folder"):
        bundle_unpack.unpack(tmp_path / "c.tar.gz", into)
    assert os.listdir(into) == []


def test_zst_without_zstd_is_one_clear_line(fixture_build, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no zstd on PATH (patchelf neither)
    assert main(["bundle", str(fixture_build), "--target", "gfx1151", "--out", str(tmp_path / "b.tar.zst")]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "rocforge: error: a .tar.zst bundle needs the zstd program, which was not found"
    assert not (tmp_path / "b.tar.zst").exists()


def test_usage_errors(tmp_path, capsys):
    assert main(["bundle", "check"]) == 2
    assert main(["bundle", str(tmp_path), "--target", "gfx1151"]) == 2
    assert "bundle needs --out" in capsys.readouterr().err
    with pytest.raises(UsageError, match="unknown bundle format"):
        bundle_archive.archive_format(tmp_path / "x.rar")


# -- slow: llama.cpp's CPU build bundled, run from elsewhere and in a clean Debian chroot ---------
MINBASE = ("bookworm", "minbase", "http://deb.debian.org/debian")


def minbase_chroot() -> Path:
    """A Debian 12 minbase root made with mmdebstrap, cached under ~/.cache keyed by what makes it
    (suite, variant, mirror: no extra packages, so none of the build's libraries)."""
    import hashlib

    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        # not [optional]: under CI=true conftest.py turns this skip into a failure
        pytest.skip("SKIPPED LOUDLY: the clean-chroot run of the bundle needs root and mmdebstrap "
                    "(.ci/apt-packages.txt) to make and enter a chroot")
    key = hashlib.sha256(" ".join(MINBASE).encode()).hexdigest()[:12]
    base = Path(os.environ.get("ROCFORGE_TEST_CHROOTS", Path.home() / ".cache" / "rocforge-test" / "chroots"))
    root = base / f"{MINBASE[0]}-{MINBASE[1]}-{key}"
    if not (root / ".complete").is_file():
        part = root.with_name(root.name + ".partial")
        shutil.rmtree(part, ignore_errors=True)
        part.parent.mkdir(parents=True, exist_ok=True)
        suite, variant, mirror = MINBASE
        subprocess.run(["mmdebstrap", "--quiet", f"--variant={variant}", suite, str(part), mirror], check=True)
        (part / ".complete").write_text(" ".join(MINBASE) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        part.rename(root)
    return root


def _bench_json(argv: list[str], **kw) -> list[dict]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.slow
def test_llama_cpu_bundle_runs_llama_bench_elsewhere_and_in_a_clean_chroot(llama_cpu_build, tiny_model, tmp_path,
                                                                             fixture_build):
    out = tmp_path / "llama.tar.zst"
    result = bundle.make(str(llama_cpu_build.prefix), target="gfx1151", backend=None, out=out, root=Root("/"))
    assert result["gpu"] == "none"
    bundled = {os.path.basename(f) for f in os.listdir(tmp_path)}
    assert bundled == {"llama.tar.zst"}
    dest = bundle_unpack.unpack(out, tmp_path / "elsewhere")
    libs = set(os.listdir(dest / "lib"))
    # the C++ and OpenMP run-times come along (ldd found them); glibc stays the system's
    assert {"libstdc++.so.6", "libgomp.so.1", "libgcc_s.so.1"} <= libs and "libc.so.6" not in libs
    args = ["-m", "/model.gguf", "-p", "16", "-n", "4", "-r", "1", "-t", "2", "-o", "json"]
    shutil.copy(tiny_model, tmp_path / "model.gguf")
    here = _bench_json([str(dest / "run"), "llama-bench", *[a.replace("/model.gguf", str(tmp_path / "model.gguf")) for a in args]],
                       env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert all(r["avg_ts"] > 0 for r in here)
    # a clean Debian 12 minbase: no libgomp1, nothing of the build; the bundle copied in, run by chroot
    base = minbase_chroot()
    assert not list((base / "usr/lib/x86_64-linux-gnu").glob("libgomp.so*"))
    root = tmp_path / "chroot"
    subprocess.run(["cp", "-a", str(base), str(root)], check=True)
    shutil.copytree(dest, root / "opt" / "bundle", symlinks=True)
    shutil.copy(tiny_model, root / "model.gguf")
    # /proc mounted as on any running system (the loader reads a program's $ORIGIN from
    # /proc/self/exe), in a private mount namespace so nothing outlives the run
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    inside = _bench_json(["unshare", "--mount", "--fork", "sh", "-c",
                          f'mount -t proc proc "$1/proc" && exec {chroot} "$@"', "sh",
                          str(root), "/opt/bundle/run", "llama-bench", *args],
                         env={"PATH": "/usr/bin:/bin"})
    assert {(r["n_prompt"], r["n_gen"]) for r in inside} == {(16, 0), (0, 4)}
    assert all(r["avg_ts"] > 0 for r in inside)
    # the fixture project's bundle too (its own libgreet through the soname links)
    fixture = bundle_unpack.unpack(bundle.make(str(fixture_build), target="gfx1151", backend=None,
                                        out=tmp_path / "fixture.zip", root=Root("/"))["out"], root / "srv")
    hello = subprocess.run(["unshare", "--mount", "--fork", "sh", "-c",
                            f'mount -t proc proc "$1/proc" && exec {chroot} "$@"', "sh",
                            str(root), f"/srv/{fixture.name}/run", "fixture-hello"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert hello.stdout.splitlines() == ["patched by rocforge", "HELLO", "accel: on", "fixture 1.2.0"], hello.stderr


@needs.needs("patchelf")
def test_rocm_found_as_rocforge_env_finds_it(tmp_path, monkeypatch):
    """A HIP program finds ROCm through `rocforge env`'s LD_LIBRARY_PATH, not its manifest: the
    bundle's ldd runs with the same env, so ROCm's libraries come along."""
    from fixtures_roots import make_therock_tree

    rocm = make_therock_tree(tmp_path / "host")  # TheRock layout; its libraries made real below
    (rocm / "lib/libamdhip64.so.7").unlink()
    _lib(rocm / "lib/libamdhip64.so.7", "libamdhip64.so.7", "int hip(void) { return 7; }")
    prefix = tmp_path / "prefix"
    _exe(prefix / "bin/hipinfo", [f"-L{rocm / 'lib'}", "-l:libamdhip64.so.7"],
         '#include <stdio.h>\nint hip(void);\nint main(void) { printf("hip %d\\n", hip()); return 0; }')
    (prefix / "rocforge-manifest.toml").write_text(
        f'prefix = "{prefix}"\ntarget = "gfx1151"\nbackend = "hip"\n[recipe]\nname = "hipinfo"\n')
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    result = bundle.make(str(prefix), target="gfx1151", backend=None, out=tmp_path / "h.tar.gz", root=Root("/"))
    ldd_env = next(d for d in result["decisions"] if d["key"] == "ldd_env")
    assert str(rocm / "lib") in ldd_env["value"]
    dest = bundle_unpack.unpack(tmp_path / "h.tar.gz", tmp_path / "u")
    monkeypatch.delenv("ROCM_PATH")
    run = subprocess.run([str(dest / "run"), "hipinfo"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.stdout == "hip 7\n", run.stderr
    assert result["gpu"] == "gfx1151"
