"""The library closure: real ELF files (built here with gcc), the real loader (ldd), staging that
keeps links, and a staged tree that really runs a program with nothing else in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rocforge_build.cli import main
from rocforge_build.errors import BuildError, ConfigError
from rocforge_build.ship import closure

GCC = shutil.which("gcc") or "gcc"  # in .ci/apt-packages.txt


def _lib(path: Path, soname: str, body: str = "int f(void) { return 1; }", libs: tuple[str, ...] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(body + "\n")
    subprocess.run([GCC, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src),
                    "-Wl,--no-as-needed", *libs],
                   check=True)
    src.unlink()
    return path


def _exe(path: Path, libs: list[str], body: str = "int main(void) { return 0; }") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(body + "\n")
    # --no-as-needed: a DT_NEEDED entry per library even though main() calls nothing in them
    subprocess.run([GCC, "-o", str(path), str(src), "-Wl,--no-as-needed", *libs], check=True)
    src.unlink()
    return path


def _paths(c: closure.Closure, kind: str | None = None) -> set[str]:
    return {p for p, e in c.entries.items() if kind is None or e.kind == kind}


def test_elf_type_only_host_executables_and_libraries(tmp_path):
    ls = Path(shutil.which("ls"))
    assert closure.elf_type(ls) in (2, 3)
    (tmp_path / "script.sh").write_text("#!/bin/sh\n")
    assert closure.elf_type(tmp_path / "script.sh") is None
    # an AMDGPU code object is ELF too (e_machine 224): never fed to ldd
    head = bytearray(open(ls, "rb").read(64))
    head[18:20] = (224).to_bytes(2, "little")
    (tmp_path / "kernel.co").write_bytes(bytes(head))
    assert closure.elf_type(tmp_path / "kernel.co") is None


def test_parse_ldd_single_and_many():
    out = (
        "\tlinux-vdso.so.1 (0x00007ffd5b1f0000)\n"
        "\tlibgreet.so.1 => /p/bin/../lib/libgreet.so.1 (0x00007f63e0872000)\n"
        "\tlibfoo.so.2 => not found\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f63e041e000)\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f63e0887000)\n"
    )
    res = closure.parse_ldd(out, ["/p/bin/x"])
    assert res["/p/bin/x"] == (
        ["/p/bin/../lib/libgreet.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"],
        ["libfoo.so.2"],
    )
    many = closure.parse_ldd("/a:\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n/b:\n\tstatically linked\n", ["/a", "/b"])
    assert many["/a"] == (["/lib/libc.so.6"], [])
    assert "/b" not in many or many["/b"] == ([], [])


def test_ls_closure_runs_alone_in_a_chroot(tmp_path):
    """The staged closure of a copied `ls` is all it needs: run it in a root holding nothing else."""
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("ls"), prefix / "bin/ls")
    c = closure.compute([prefix])
    names = {os.path.basename(p) for p in c.libraries}
    assert "libc.so.6" in names
    assert any(n.startswith("ld-linux") for n in names)
    out = tmp_path / "stage"
    summary = closure.stage(c, out)
    assert summary["files"] >= len(c.libraries)
    for lib in c.libraries:  # every path as ldd printed it resolves inside the staged tree
        assert (out / lib.lstrip("/")).exists(), lib
    if os.path.islink("/lib"):  # merged /usr: the link itself is staged, not a copied directory
        assert os.readlink(out / "lib") == os.readlink("/lib")
    assert oct((out / "tmp").stat().st_mode & 0o7777) == "0o1777"
    shutil.copytree(prefix, out / str(prefix).lstrip("/"), symlinks=True)
    argv = [str(prefix / "bin/ls"), "/"]
    cmd = ["chroot", str(out), *argv] if os.geteuid() == 0 else ["unshare", "-r", "chroot", str(out), *argv]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert set(res.stdout.split()) >= {"tmp", "usr"}


def test_rules_add_dlopened_libraries_data_and_icd_plugins(tmp_path):
    rocm = tmp_path / "opt/rocm/lib"
    _lib(rocm / "libamdhip64.so.7", "libamdhip64.so.7")
    _lib(rocm / "libamd_comgr.so.3", "libamd_comgr.so.3", "double g(double x);", ("-lm",))
    os.symlink("libamd_comgr.so.3", rocm / "libamd_comgr.so")
    _lib(rocm / "librocblas.so.5", "librocblas.so.5")
    kernels = rocm / "rocblas/library"
    kernels.mkdir(parents=True)
    (kernels / "TensileLibrary_lazy_gfx1151.dat").write_bytes(b"\x00tensile")
    vk = tmp_path / "usr/lib/libvulkan.so.1"
    _lib(vk, "libvulkan.so.1")
    radv = _lib(tmp_path / "usr/lib/drivers/libvulkan_radeon.so", "libvulkan_radeon.so")
    icd = tmp_path / "sys/usr/share/vulkan/icd.d/radeon_icd.x86_64.json"
    icd.parent.mkdir(parents=True)
    icd.write_text(json.dumps({"file_format_version": "1.0.0",
                               "ICD": {"library_path": str(radv), "api_version": "1.3.230"}}))
    prefix = tmp_path / "prefix"
    _exe(prefix / "bin/app", [f"-L{rocm}", f"-Wl,-rpath,{rocm}", "-l:libamdhip64.so.7", "-l:librocblas.so.5",
                             f"-L{vk.parent}", f"-Wl,-rpath,{vk.parent}", "-l:libvulkan.so.1"])
    c = closure.compute([prefix], manifest_root=tmp_path / "sys")
    comp = _paths(c, "companion")
    assert {str(rocm / "libamd_comgr.so.3"), str(rocm / "libamd_comgr.so"), str(radv)} <= comp
    assert "hip-comgr" in c.entries[str(rocm / "libamd_comgr.so.3")].reason
    assert _paths(c, "data") == {str(kernels)}
    assert _paths(c, "manifest") == {str(icd)}
    # the dlopen()ed comgr's own closure (libm) is in too
    assert any(os.path.basename(p) == "libm.so.6" for p in _paths(c, "library"))
    out = tmp_path / "stage"
    closure.stage(c, out)
    assert (out / str(kernels).lstrip("/") / "TensileLibrary_lazy_gfx1151.dat").read_bytes() == b"\x00tensile"
    assert os.readlink(out / str(rocm / "libamd_comgr.so").lstrip("/")) == "libamd_comgr.so.3"


def test_prefix_libraries_are_not_copied_twice_and_missing_ones_fail(tmp_path):
    prefix = tmp_path / "prefix"
    _lib(prefix / "lib/libgreet.so.1", "libgreet.so.1")
    _exe(prefix / "bin/hi", [f"-L{prefix / 'lib'}", "-Wl,-rpath,$ORIGIN/../lib", "-l:libgreet.so.1"])
    c = closure.compute([prefix])
    assert not any(p.startswith(str(prefix)) for p in c.entries)
    assert len(c.elf_files) == 2
    (prefix / "lib/libgreet.so.1").unlink()
    with pytest.raises(BuildError) as err:
        closure.compute([prefix])
    assert "libgreet.so.1" in err.value.message and "bin/hi" in err.value.message


def _entries(*paths) -> closure.Closure:
    return closure.Closure(roots=[], elf_files=[], entries={
        str(p): closure.Entry(str(p), "test", "library") for p in paths})


def test_staging_keeps_links_replaces_atomically_and_refuses_conflicts(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("x")
    os.symlink("real", tmp_path / "link")
    out = tmp_path / "stage"
    out.mkdir()
    (out / closure.MARKER).write_text(  # rocforge replaces only its own (its marker's text)
        "staged by `rocforge container closure`: an earlier closure\n")
    (out / "old").write_text("stale")
    closure.stage(_entries(tmp_path / "link/f"), out)
    assert not (out / "old").exists()
    assert os.readlink(out / str(tmp_path / "link").lstrip("/")) == "real"
    assert (out / str(real / "f").lstrip("/")).read_text() == "x"
    # a failing run leaves the previous tree and no partial one
    with pytest.raises(FileNotFoundError):
        closure.stage(_entries(tmp_path / "link/f", tmp_path / "gone.so"), out)
    assert (out / str(real / "f").lstrip("/")).is_file()
    assert not (tmp_path / "stage.rocforge-partial").exists()
    # a link in the builder where the staged tree already has a directory: refused
    out2 = tmp_path / "stage2"
    (out2 / str(tmp_path / "link2").lstrip("/")).mkdir(parents=True)
    os.symlink("real", tmp_path / "link2")
    with pytest.raises(BuildError, match="staging conflict"):
        closure._stage_path(str(tmp_path / "link2/f"), out2)


def test_dotenv_is_literal_like_env_files():
    text = ("# rocforge env --shell dotenv\nROCM_PATH=/opt/rocm\nPATH=/opt/rocm/bin:/usr/bin\n"
            "# unset HSA_OVERRIDE_GFX_VERSION: native\nODD=it's \"quoted\" $HOME # kept\n")
    assert closure.parse_dotenv(text) == {
        "ROCM_PATH": "/opt/rocm", "PATH": "/opt/rocm/bin:/usr/bin", "ODD": "it's \"quoted\" $HOME # kept"}
    with pytest.raises(ConfigError):
        closure.parse_dotenv("not a line\n")


def test_rules_file_is_validated(tmp_path):
    bad = tmp_path / "closure.toml"
    bad.write_text('[[rule]]\nname = "x"\nlibrary = "libx.so*"\nwhy = "w"\nsiblngs = ["a"]\n')
    with pytest.raises(ConfigError, match="unknown keys"):
        closure.load_rules(bad)
    rules = closure.load_rules()
    assert {r.name for r in rules.rules} >= {"hip-comgr", "rocblas-kernels", "vulkan-radv"}


def test_closure_command(tmp_path, capsys):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("ls"), prefix / "bin/ls")
    env = tmp_path / "env"
    env.write_text("LD_LIBRARY_PATH=/nonexistent\n")
    report = tmp_path / "out/closure.json"
    rc = main(["container", "closure", str(prefix), "--out", str(tmp_path / "stage"),
               "--env-file", str(env), "--report", str(report)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "1 ELF files" in text and "library" in text
    data = json.loads(report.read_text())
    assert data["elf_files"] == 1 and data["files"] > 0
    assert main(["--root", str(tmp_path), "container", "closure", str(prefix), "--out", str(tmp_path / "s")]) == 2


def test_env_file_lets_ldd_find_rocm_libraries(tmp_path):
    """A program linked to a ROCm library without RUNPATH: found only under the build's env
    (what `rocforge env --shell dotenv` gives the builder), exactly as at run time."""
    rocm = tmp_path / "opt/rocforge/rocm/current/lib"
    _lib(rocm / "libamdhip64.so.7", "libamdhip64.so.7")
    prefix = tmp_path / "prefix"
    _exe(prefix / "bin/llama-cli", [f"-L{rocm}", "-l:libamdhip64.so.7"])
    with pytest.raises(BuildError, match="libamdhip64.so.7"):
        closure.compute([prefix])
    env = tmp_path / "env"
    env.write_text(f"# rocforge env --shell dotenv\nLD_LIBRARY_PATH={rocm}\n")
    report = closure.main_closure(prefix, tmp_path / "stage", env_file=env, report=None)
    paths = {e["path"] for e in report["entries"]}
    assert str(rocm / "libamdhip64.so.7") in paths
    assert (tmp_path / "stage" / str(rocm / "libamdhip64.so.7").lstrip("/")).is_file()
