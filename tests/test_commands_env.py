"""`rocforge env` end to end: the CLI in a subprocess, scripts sourced by real bash, zsh, fish."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fixtures_roots as fr
import pytest

from rocforge_build.cli import main

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "data" / "env"
ODD = "/opt/it's \"odd\" $HOME \\dir *"  # quote, double quotes, $, backslash, glob star


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _base_env() -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8",
            "ROCFORGE_DATA_DIR": os.environ["ROCFORGE_DATA_DIR"],
            "ROCFORGE_CONFIG_DIR": os.environ["ROCFORGE_CONFIG_DIR"],
            "ROCFORGE_CACHE_DIR": os.environ["ROCFORGE_CACHE_DIR"]}


def cli(root, *args, env=None) -> Result:
    """`rocforge --root ROOT ARGS...` in this process, in a clean environment."""
    saved = dict(os.environ)
    wanted = {**_base_env(), **(env or {})}
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(wanted)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["--root", str(root), *args])
            except SystemExit as exc:  # argparse usage errors
                code = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Result(code, out.getvalue(), err.getvalue())


def cli_subprocess(root, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocforge_build", "--root", str(root), *args],
                          cwd=REPO, env={**_base_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=60)


def sourced_once(shell: str, text: str, start: dict, tmp_path: Path) -> dict:
    """The environment after a real `shell` sources `text` (a script rocforge printed)."""
    script = tmp_path / f"env.{shell}"
    script.write_text(text)
    return sourced_env(shell, script, start)


def test_strix_halo_bash_values(tmp_path):
    """TheRock tree at /opt/rocm (the fixture: gfx1151 rocBLAS + hipBLASLt kernels, compiler in
    lib/llvm/bin, bitcode in lib/llvm/amdgcn/bitcode, the broken bin/amdclang++ link of trees
    before Mar 2026) on a Strix Halo, with a stale override left in the user's environment."""
    fr.make_strix_halo(tmp_path / "root")
    start = {"PATH": "/usr/bin:/bin", "HSA_OVERRIDE_GFX_VERSION": "11.0.0", "HOME": str(tmp_path)}
    out = cli(tmp_path / "root", "env", "--shell", "bash", env=start)
    assert out.returncode == 0, out.stderr
    got = sourced_once("bash", out.stdout, start, tmp_path)
    expected = {
        "ROCM_PATH": "/opt/rocm", "HIP_PATH": "/opt/rocm", "HIP_PLATFORM": "amd",
        # TheRock installs clang under lib/llvm/bin (its bin/amdclang++ link is broken here)
        "HIP_CLANG_PATH": "/opt/rocm/lib/llvm/bin",
        # TheRock keeps oclc_isa_version_*.bc in lib/llvm/amdgcn/bitcode, not amdgcn/bitcode
        "HIP_DEVICE_LIB_PATH": "/opt/rocm/lib/llvm/amdgcn/bitcode",
        # hipBLASLt has gfx1151 kernels in this tree, so rocBLAS may route GEMMs through it
        "ROCBLAS_USE_HIPBLASLT": "1",
        "PATH": "/opt/rocm/bin:/opt/rocm/lib/llvm/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/opt/rocm/lib:/opt/rocm/lib/llvm/lib",
        "CMAKE_PREFIX_PATH": "/opt/rocm", "PKG_CONFIG_PATH": "/opt/rocm/lib/pkgconfig",
    }
    assert {k: got.get(k) for k in expected} == expected
    # gfx1151's own kernels are in the tree: the stale 11.0.0 override is removed, and said
    assert "HSA_OVERRIDE_GFX_VERSION" not in got
    assert "stale HSA_OVERRIDE_GFX_VERSION=11.0.0 in the environment is unset" in out.stdout


def test_igpu_dgpu_json_values(tmp_path):
    """A gfx1036 iGPU (node 1) beside a gfx1100 dGPU (node 2) with a classic /opt/rocm 6.x whose
    libraries serve gfx1100: the dGPU is used, the iGPU masked (ROCR_VISIBLE_DEVICES counts GPU
    nodes from 0, so the dGPU is 1), no override; the user's LD_LIBRARY_PATH stays behind."""
    fr.make_igpu_dgpu(tmp_path)
    out = cli(tmp_path, "env", "--shell", "json", env={"LD_LIBRARY_PATH": "/home/u/lib"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "ROCM_PATH": "/opt/rocm", "HIP_PATH": "/opt/rocm", "HIP_PLATFORM": "amd",
        "HIP_CLANG_PATH": "/opt/rocm/llvm/bin",             # classic layout: llvm/bin
        "HIP_DEVICE_LIB_PATH": "/opt/rocm/amdgcn/bitcode",  # classic layout: amdgcn/bitcode
        "ROCR_VISIBLE_DEVICES": "1", "HSA_OVERRIDE_GFX_VERSION": None,
        "ROCBLAS_USE_HIPBLASLT": "1",
        "PATH": "/opt/rocm/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/opt/rocm/lib:/home/u/lib",
        "CMAKE_PREFIX_PATH": "/opt/rocm",
    }


def test_json_flag_is_the_json_shell(tmp_path):
    """`rocforge env --json` (every other command's spelling) prints what `--shell json` does;
    with another --shell it is one clear usage error."""
    fr.make_igpu_dgpu(tmp_path)
    env = {"LD_LIBRARY_PATH": "/home/u/lib", "ROCFORGE_NO_CACHE": "1"}
    flag = cli(tmp_path, "env", "--json", env=env)
    shell = cli(tmp_path, "env", "--shell", "json", env=env)
    assert flag.returncode == 0, flag.stderr
    assert json.loads(flag.stdout)["ROCR_VISIBLE_DEVICES"] == "1"  # the dGPU, as above
    assert flag.stdout == shell.stdout
    both = cli(tmp_path, "env", "--json", "--shell", "json", env=env)
    assert both.returncode == 0 and both.stdout == shell.stdout
    clash = cli(tmp_path, "env", "--json", "--shell", "bash", env=env)
    assert clash.returncode == 2 and clash.stdout == ""
    assert clash.stderr.splitlines()[0] == "rocforge: error: --json and --shell bash ask for two formats"


def test_debian_fish_values(tmp_path):
    """Debian bookworm's packages under /usr (hipcc 5.2.3, the perl one, with clang-15): ROCm is
    /usr; hipcc runs $HIP_CLANG_PATH/clang++-15, which exists only in /usr/bin; the device
    bitcode is in the multiarch lib dir.  No GPU in this root, so no target and no override."""
    fr.make_debian_usr(tmp_path / "root")
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = cli(tmp_path / "root", "env", "--shell", "fish", env=start)
    assert out.returncode == 0, out.stderr
    got = sourced_once("fish", out.stdout, start, tmp_path)
    expected = {"ROCM_PATH": "/usr", "HIP_PATH": "/usr", "HIP_PLATFORM": "amd",
                "HIP_CLANG_PATH": "/usr/bin",
                "HIP_DEVICE_LIB_PATH": "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
                "PATH": "/usr/bin:/bin"}               # /usr/bin is already there: unchanged
    assert {k: got.get(k) for k in expected} == expected
    assert "HSA_OVERRIDE_GFX_VERSION" not in got and "ROCBLAS_USE_HIPBLASLT" not in got


def test_dotenv_is_literal(tmp_path):
    fr.make_strix_halo(tmp_path, inner=ODD)
    out = cli(tmp_path, "env", "--shell", "dotenv", "--rocm", ODD)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")]
    assert f"ROCM_PATH={ODD}" in lines
    assert f"PATH={ODD}/bin:{ODD}/lib/llvm/bin:/usr/bin:/bin" in lines
    assert "# unset HSA_OVERRIDE_GFX_VERSION: not needed" in out.stdout


def _spawned(argv, env) -> subprocess.CompletedProcess:
    full = {**_base_env(), "PYTHONPATH": str(REPO), **env}
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120)


def test_default_shell_from_SHELL_when_the_parent_is_no_shell(tmp_path):
    """Run from Python (this test), the parent is no shell: $SHELL decides, else bash."""
    fr.make_strix_halo(tmp_path)
    argv = [sys.executable, "-m", "rocforge_build", "--root", str(tmp_path), "env"]
    assert "set -gx ROCM_PATH" in _spawned(argv, {"SHELL": "/usr/bin/fish"}).stdout
    assert "export ROCM_PATH=" in _spawned(argv, {"SHELL": "/bin/tcsh"}).stdout


@pytest.mark.parametrize("shell,line,login", [
    ("fish", "{rf} env | source; echo $ROCM_PATH", "/bin/bash"),
    ("bash", 'eval "$({rf} env)"; echo "$ROCM_PATH"', "/usr/bin/fish"),
    ("zsh", 'eval "$({rf} env)"; echo "$ROCM_PATH"', "/usr/bin/fish"),
])
def test_the_calling_shell_wins_over_SHELL(tmp_path, shell, line, login):
    """The newcomer trial: `rocforge env | source` in fish emitted bash because $SHELL (the login
    shell) was bash.  Each line is what README.md and docs/guides/strix-halo.md tell users to
    type; the shell that runs it must end up with ROCM_PATH set, twice (the second answer comes
    from the env cache)."""
    if shutil.which(shell) is None:
        pytest.fail(f"{shell} is not installed (see .ci/apt-packages.txt)")
    fr.make_strix_halo(tmp_path)
    rf = f"{sys.executable} -m rocforge_build --root {tmp_path}"
    argv = {"fish": ["fish", "--no-config", "-c"], "bash": ["bash", "--norc", "-c"],
            "zsh": ["zsh", "-f", "-c"]}[shell] + [line.format(rf=rf)]
    for _ in range(2):
        out = _spawned(argv, {"SHELL": login})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "/opt/rocm", out.stdout + out.stderr  # the fixture's tree


def test_warnings_reach_stderr_under_eval(tmp_path):
    """`eval "$(rocforge env)"` drops the script's comments, so warnings also go to stderr -
    on the first run and when the answer comes from the env cache."""
    fr.make_igpu_dgpu(tmp_path)
    rf = f"{sys.executable} -m rocforge_build --root {tmp_path}"
    for _ in range(2):
        out = _spawned(["bash", "--norc", "-c", f'eval "$({rf} env)"'], {})
        assert out.returncode == 0, out.stderr
        assert "rocforge: warning: iGPU and dGPU both visible to ROCm" in out.stderr


SOURCE = {
    "bash": ["bash", "--noprofile", "--norc", "-c", '. "$1"; . "$1"; env -0', "sh"],
    "zsh": ["zsh", "-f", "-c", '. "$1"; . "$1"; env -0', "zsh"],
    "fish": ["fish", "--no-config", "-c", 'source $argv[1]; source $argv[1]; env -0'],
}


def sourced_env(shell: str, script: Path, start: dict) -> dict:
    argv = [*SOURCE[shell], str(script)]
    out = subprocess.run(argv, env=start, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    pairs = [p.split("=", 1) for p in out.stdout.decode().split("\0") if "=" in p]
    return dict(pairs)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_scripts_sourced_twice_with_awkward_paths(tmp_path, shell):
    if shutil.which(shell) is None:
        pytest.fail(f"{shell} is not installed (see .ci/apt-packages.txt)")
    root = tmp_path / "root"
    fr.make_strix_halo(root, inner=ODD)
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LD_LIBRARY_PATH": "/user lib:/x",
             "HSA_OVERRIDE_GFX_VERSION": "11.0.0", "PKG_CONFIG_PATH": f"{ODD}/lib/pkgconfig",
             "LC_ALL": "C.UTF-8"}
    script = tmp_path / f"rocm.{shell}"
    out = cli(root, "env", "--shell", shell, "--rocm", ODD, env=start)
    assert out.returncode == 0, out.stderr
    script.write_text(out.stdout)
    expected = json.loads(cli(root, "env", "--shell", "json", "--rocm", ODD, env=start).stdout)
    got = sourced_env(shell, script, start)
    for key, value in expected.items():
        if value is None:
            assert key not in got, key
        else:
            assert got.get(key) == value, key
    assert got["ROCM_PATH"] == ODD
    assert got["HIP_DEVICE_LIB_PATH"] == f"{ODD}/lib/llvm/amdgcn/bitcode"
    assert got["PATH"] == f"{ODD}/bin:{ODD}/lib/llvm/bin:/usr/bin:/bin"
    assert got["LD_LIBRARY_PATH"] == f"{ODD}/lib:{ODD}/lib/llvm/lib:/user lib:/x"
    assert got["PKG_CONFIG_PATH"] == f"{ODD}/lib/pkgconfig"  # already there: left alone
    assert got["CMAKE_PREFIX_PATH"] == ODD  # was unset: no empty entry appended
    # A value the user set after the first source stays (idempotent and additive only).
    again = sourced_env(shell, script, {**start, "PATH": got["PATH"] + ":/extra"})
    assert again["PATH"] == got["PATH"] + ":/extra"


def test_no_rocm_exits_non_zero_with_the_nightly_hint(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    out = cli(tmp_path, "env")
    assert out.returncode == 4 and out.stdout == ""
    assert out.stderr.startswith("rocforge: error: no ROCm installation found")
    assert "rocforge nightly install --target gfx1151" in out.stderr


@pytest.mark.parametrize("case,args,code,message", [
    ("unknown target", ["env", "--target", "gfx1115"], 2, "unknown GPU target 'gfx1115'"),
    ("rocm not rocm", ["env", "--rocm", "/srv/data"], 4, "--rocm /srv/data inside --root"),
    ("bad shell", ["env", "--shell", "tcsh"], 2, "invalid choice: 'tcsh'"),
    ("garbage properties", ["env"], 3, "not a KFD `key value` line"),
    ("unreadable sysfs", ["env"], 3, "cannot read /sys/class/kfd/kfd/topology/nodes/1/properties"),
    ("doctor garbage", ["doctor", "--json"], 3, "not a KFD `key value` line"),
])
def test_bad_input_is_one_clear_line(tmp_path, case, args, code, message):
    fr.make_strix_halo(tmp_path)
    (tmp_path / "srv/data").mkdir(parents=True)
    props = tmp_path / fr.KFD / "nodes/1/properties"
    if case.endswith("garbage") or case == "garbage properties":
        props.write_text("gfx_target_version 110501\n\x00\x01 binary junk\n")
    if case == "unreadable sysfs":
        props.unlink()
        props.mkdir()
    out = cli(tmp_path, *args)
    assert out.returncode == code, out.stderr
    assert out.stdout == ""
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr


def test_real_process_bad_input_has_no_traceback(tmp_path):
    fr.make_strix_halo(tmp_path)
    (tmp_path / fr.KFD / "nodes/1/properties").write_text("simd_count lots\n")
    out = cli_subprocess(tmp_path, "env")
    assert out.returncode == 3 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[0].startswith("rocforge: error: /sys/class/kfd/kfd/topology/")


def test_env_does_not_import_heavy_modules(tmp_path):
    """rich, requests and platformdirs are not needed; dataclasses, tomllib (the data files
    are read by toml_subset, and this root has no build manifest or config file) and pathlib
    (discovery works on strings; its import with urllib.parse is ~4 ms) cost start-up time
    (issue 24 item 5)."""
    fr.make_strix_halo(tmp_path)
    code = ("import sys; from rocforge_build.cli import main; rc = main(['--root', sys.argv[1], "
            "'env']); bad = [m for m in ('rich', 'requests', 'platformdirs', 'dataclasses', "
            "'tomllib', 'pathlib') if m in sys.modules]; "
            "print('BAD', bad, file=sys.stderr) if bad else None; sys.exit(rc or (3 if bad else 0))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_env_runs_without_the_cyclic_gc_and_gives_it_back(tmp_path, monkeypatch):
    """`rocforge env` switches the cyclic garbage collector off for its run (start-up time) and,
    called with argv (in-process), on again when main returns, also after an error; as the
    program (argv from sys.argv) it leaves it off for the exit; other commands leave it alone."""
    import gc

    from rocforge_build.discover import resolver

    fr.make_strix_halo(tmp_path)
    seen = []
    real = resolver.resolve

    def spy(*a, **kw):
        seen.append(gc.isenabled())
        return real(*a, **kw)

    monkeypatch.setattr(resolver, "resolve", spy)
    assert gc.isenabled()
    assert cli(tmp_path, "env", env={"ROCFORGE_NO_CACHE": "1"}).returncode == 0
    assert seen == [False] and gc.isenabled()
    assert cli(tmp_path, "env", "--target", "gfx9999").returncode == 2 and gc.isenabled()
    assert cli(tmp_path, "doctor", "--json").returncode in (0, 1) and seen[-1] is True
    code = ("import gc, io, sys, contextlib; from rocforge_build.cli import main\n"
            "sys.argv = ['rocforge', '--root', sys.argv[1], sys.argv[2]]\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main()\n"
            "print(gc.isenabled())")
    for command, after in (("env", "False"), ("targets", "True")):  # main() as the program
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path), command], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == after, (command, out.stderr)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/usr/bin/hipcc")
                    or not os.path.isdir("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"),
                    reason="needs Debian's hipcc (.ci/apt-packages.txt)")
def test_host_env_drives_real_hipcc(tmp_path):
    """`eval "$(rocforge env)"` on this host, then Debian's real hipcc builds a HIP kernel."""
    (tmp_path / "k.hip").write_text("#include <hip/hip_runtime.h>\n"
                                    "__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n"
                                    "int main() { return 0; }\n")
    script = (f'eval "$("{sys.executable}" -m rocforge_build env --shell bash)" && '
              'test "$HIP_CLANG_PATH" = /usr/bin && '
              'hipcc --offload-arch=gfx1030 -o k k.hip')
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**_base_env(), "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "k").stat().st_size > 0
