"""`rocforge env` and rocforge builds: none on LD_LIBRARY_PATH (each runs from its RUNPATH); on
PATH at most one build per recipe, the one chosen with `rocforge use` or else the newest that
passed `rocforge verify`, its reason in a comment; `use` itself, and the env cache around it."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib

import fixtures_roots as fr
from stackfixtures import make_build, program
from test_commands_env import cli, sourced_once
from test_commands_env_builds import MARK, _tamper

from rocforge_build import paths
from rocforge_build.discover import choices


def two_llama_builds(root):
    """llama-cpp built twice for the Strix Halo: cpu first, vulkan a day later, each with its own
    llama-cli (a real script naming its build) and its own libggml-base.so."""
    out = {}
    for backend, day in (("cpu", "20"), ("vulkan", "21")):
        prefix = make_build(root, "llama-cpp", "gfx1151", backend,
                            files=("lib/libggml-base.so",), built_at=f"2026-11-{day}T10:00:00Z")
        program(prefix, "llama-cli", f"#!/bin/sh\necho {backend}\n")
        out[backend] = prefix
    return out


def inner(name: str) -> str:
    return f"{paths.builds_prefix()}/{name}"


def env_json(root, env=None) -> dict:
    out = cli(root, "env", "--shell", "json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def stamp_of(prefix) -> str:
    return tomllib.loads((prefix / "rocforge-manifest.toml").read_text())["stamp"]


def record(prefix, stamp, passed) -> None:
    """What `rocforge verify` records (measure/verify.verify calls it), for a build in the
    builds directory inside the test's root."""
    assert choices.record_verify(prefix, stamp, passed, model="m.gguf", reference="ref",
                                 builds=prefix.parent) is not None


def verified_pass(prefix) -> None:
    record(prefix, stamp_of(prefix), True)


def test_no_build_on_ld_library_path_and_none_on_path_unverified(tmp_path):
    fr.make_strix_halo(tmp_path)
    two_llama_builds(tmp_path)
    data = env_json(tmp_path)
    # the ROCm's libraries only: the cpu build's libggml-base must not serve the vulkan build
    assert data["LD_LIBRARY_PATH"] == "/opt/rocm/lib:/opt/rocm/lib/llvm/lib"
    assert "/builds/" not in data["PATH"]
    text = cli(tmp_path, "env", "--shell", "bash").stdout
    named = [line for line in text.splitlines() if line.startswith("# builds not on PATH:")]
    assert len(named) == 1
    assert "llama-cpp-gfx1151-cpu" in named[0] and "llama-cpp-gfx1151-vulkan" in named[0]


def test_path_gets_the_newest_verified_then_the_chosen_build(tmp_path):
    fr.make_strix_halo(tmp_path)
    built = two_llama_builds(tmp_path)
    verified_pass(built["cpu"])
    verified_pass(built["vulkan"])
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    data = env_json(tmp_path, env=start)
    vulkan_bin, cpu_bin = inner("llama-cpp-gfx1151-vulkan/bin"), inner("llama-cpp-gfx1151-cpu/bin")
    assert [e for e in data["PATH"].split(":") if "/builds/" in e] == [vulkan_bin]
    assert "/builds/" not in data["LD_LIBRARY_PATH"]
    text = cli(tmp_path, "env", "--shell", "bash", env=start).stdout
    assert "newest build of llama-cpp that passed verify (20" in text
    # after `rocforge use` of the cpu build: that one, and only that one
    out = cli(tmp_path, "use", str(built["cpu"]))
    assert out.returncode == 0, out.stderr
    data = env_json(tmp_path, env=start)
    assert [e for e in data["PATH"].split(":") if "/builds/" in e] == [cpu_bin]
    text = cli(tmp_path, "env", "--shell", "bash", env=start).stdout
    assert "chosen with `rocforge use` on 20" in text
    assert "builds not on PATH: llama-cpp-gfx1151-vulkan" in text
    # `use --clear` gives the newest verified build back
    assert cli(tmp_path, "use", "--clear", "llama-cpp").returncode == 0
    data = env_json(tmp_path, env=start)
    assert [e for e in data["PATH"].split(":") if "/builds/" in e] == [vulkan_bin]


def test_a_failed_or_stale_verify_does_not_count(tmp_path):
    fr.make_strix_halo(tmp_path)
    built = two_llama_builds(tmp_path)
    verified_pass(built["cpu"])
    record(built["vulkan"], "0" * 64, True)  # another build's stamp: rebuilt since
    data = env_json(tmp_path)
    assert [e for e in data["PATH"].split(":") if "/builds/" in e] == [
        inner("llama-cpp-gfx1151-cpu/bin")]
    record(built["cpu"], stamp_of(built["cpu"]), False)  # its last verify failed
    assert "/builds/" not in env_json(tmp_path)["PATH"]


def test_sourced_bash_finds_the_chosen_build_program(tmp_path):
    """Real bash sources the script; `command -v llama-cli` is the chosen build's, and running it
    runs that build's program."""
    root = tmp_path / "root"
    fr.make_strix_halo(root)
    built = two_llama_builds(root)
    assert cli(root, "use", str(built["vulkan"])).returncode == 0
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    text = cli(root, "env", "--shell", "bash", env=start).stdout
    script = tmp_path / "env.sh"
    script.write_text(text)
    # the script names inner paths (the data dir's, which lies outside this root): make that
    # path lead to the builds inside the root, so the sourcing bash finds the real programs
    paths.builds_prefix().parent.mkdir(parents=True, exist_ok=True)
    paths.builds_prefix().symlink_to(built["vulkan"].parent)
    got = sourced_once("bash", text, start, tmp_path)
    assert got["PATH"].split(":")[0] == inner("llama-cpp-gfx1151-vulkan/bin")
    assert "/builds/" not in got["LD_LIBRARY_PATH"]
    probe = subprocess.run(["bash", "-c", f". {script} 2>/dev/null; command -v llama-cli; llama-cli"],
                           env=start, capture_output=True, text=True, timeout=20)
    assert probe.stdout.split() == [inner("llama-cpp-gfx1151-vulkan/bin/llama-cli"), "vulkan"]


def test_cache_does_not_serve_the_old_answer_after_verify_or_use(tmp_path):
    """The env cache (validated by stamps) must see a new verify record and a `use`: run env
    around each, with a marker appended to the cached entry to tell a cached answer apart."""
    def path_builds() -> tuple[str, str]:
        text = cli(tmp_path, "env", "--shell", "bash").stdout
        on_path = text.split("# PATH: ")[1].split(" first")[0]
        return on_path, text

    fr.make_strix_halo(tmp_path)
    built = two_llama_builds(tmp_path)
    verified_pass(built["cpu"])
    assert path_builds()[0].startswith("llama-cpp-gfx1151-cpu (newest build")
    _tamper()
    assert path_builds()[1].endswith(MARK)  # unchanged: served from the cache
    verified_pass(built["vulkan"])  # newer build, now verified: the answer changes
    on_path, text = path_builds()
    assert MARK not in text and on_path.startswith("llama-cpp-gfx1151-vulkan (newest build")
    _tamper()
    assert path_builds()[1].endswith(MARK)
    assert cli(tmp_path, "use", str(built["cpu"])).returncode == 0
    on_path, text = path_builds()
    assert MARK not in text and on_path.startswith("llama-cpp-gfx1151-cpu (chosen with `rocforge use`")


def test_use_refuses_what_is_not_a_rocforge_build(tmp_path):
    fr.make_strix_halo(tmp_path)
    plain = tmp_path / "opt" / "llama"
    (plain / "bin").mkdir(parents=True)
    out = cli(tmp_path, "use", str(plain))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("rocforge: error: ") and "is not a rocforge build" in lines[0]
    assert not list(tmp_path.rglob("use.toml"))  # nothing recorded


def test_use_lists_and_doctor_shows_the_decision(tmp_path):
    fr.make_strix_halo(tmp_path)
    built = two_llama_builds(tmp_path)
    assert "no build chosen" in cli(tmp_path, "use").stdout
    assert cli(tmp_path, "use", str(built["cpu"])).returncode == 0
    assert "llama-cpp  llama-cpp-gfx1151-cpu  (chosen 20" in cli(tmp_path, "use").stdout
    doctor = cli(tmp_path, "doctor", env={"COLUMNS": "400"})
    assert "builds on PATH" in doctor.stdout and "chosen with `rocforge use`" in doctor.stdout


GOOD = "   1  5.1234 ± 0.1234  -0.00012 ± 0.00034  0.00123 ± 0.00002  0.123 ± 0.012 %  99.123 ± 0.123 %"
BAD = "   1  3024.0 ± 9.0  6.37 ± 0.1  4.5 ± 0.1  50.0 ± 1.0 %  3.0 ± 0.5 %"  # #27506's garbage


def perplexity_program(prefix, line: str) -> None:
    """bin/llama-perplexity as a real program: `--help` prints usage without -fa, a run prints
    the cumulative result line llama.cpp's KL-divergence mode ends with."""
    # the reference's run (--kl-divergence-base FILE alone) writes FILE and its own PPL
    program(prefix, "llama-perplexity",
            '#!/bin/sh\nif [ "$1" = --help ]; then echo "usage: -m FILE"; exit 0; fi\n'
            'case " $* " in *" --kl-divergence "*) ;; *)\n'
            '  while [ $# -gt 0 ]; do [ "$1" = --kl-divergence-base ] && : > "$2"; shift; done\n'
            '  echo "Final estimate: PPL = 5.1240 +/- 0.1"; exit 0;; esac\n'
            f"echo '{line}'\n")


def test_verify_records_its_verdict_for_env(tmp_path, monkeypatch):
    """`verify.verify` (what `rocforge verify`, bench's and tune's gate run) records the verdict
    `rocforge env` reads: a pass puts the build on PATH; a later fail takes it off."""
    from pathlib import Path

    from tiny_gguf import write as write_gguf

    from rocforge_build.measure import gguf, verify
    from rocforge_build.measure.llama_tools import LlamaBuild

    env_root = tmp_path / "root"
    fr.make_strix_halo(env_root)
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(env_root / "data"))  # `rocforge env` sees /data
    host = Path("/")  # `verify` runs on the host: the builds as host paths
    ref = make_build(host, "llama-cpp", "gfx1151", "cpu", files=("bin/llama-cli",))
    build = make_build(host, "llama-cpp", "gfx1151", "vulkan", files=("bin/llama-cli",))
    perplexity_program(ref, GOOD)
    perplexity_program(build, GOOD)
    model = gguf.check(write_gguf(tmp_path / "tiny.gguf", byte_tokens=True))
    assert "/builds/" not in env_json(env_root)["PATH"]
    one = verify.Coverage([verify.Shape(64, 64, False)])
    result = verify.verify(LlamaBuild.open(build), LlamaBuild.open(ref), model, one)
    assert result["passed"]
    assert [e for e in env_json(env_root)["PATH"].split(":") if "/builds/" in e] == [
        "/data/builds/llama-cpp-gfx1151-vulkan/bin"]
    perplexity_program(build, BAD)
    assert not verify.verify(LlamaBuild.open(build), LlamaBuild.open(ref), model, one)["passed"]
    assert "/builds/" not in env_json(env_root)["PATH"]


def test_use_with_a_read_only_data_dir_is_one_line(tmp_path):
    """A data dir rocforge cannot write (here: a file where the directory should be): one line
    naming it and ROCFORGE_DATA_DIR, exit 2, the build untouched."""
    fr.make_strix_halo(tmp_path)
    built = two_llama_builds(tmp_path)
    data = tmp_path / str(paths.data_dir()).lstrip("/")
    blocker = data / "use.toml"
    blocker.mkdir()  # the choice file's name is taken by a directory: the rename must fail
    out = cli(tmp_path, "use", str(built["cpu"]))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("rocforge: error: cannot record the choice")
    assert "ROCFORGE_DATA_DIR" in out.stderr and "Traceback" not in out.stderr
    assert blocker.is_dir() and (built["cpu"] / "rocforge-manifest.toml").is_file()


def test_a_hostile_recipe_name_never_reaches_the_choice_file(tmp_path):
    """A manifest whose recipe name would add TOML keys or tables to use.toml, or shell code to
    the env script, is refused where the manifest is read: `use` says which field (exit 2) and
    writes no choice; `env` leaves the build out with a warning, and real bash runs nothing."""
    fr.make_strix_halo(tmp_path)
    marker = tmp_path / "ran"  # `cd` alone goes to HOME, the test's directory: no '/' needed
    name = 'x"]\\nprefix = "p" [choices.y] $(cd;touch ran)'
    prefix = make_build(tmp_path, name, "gfx1151", files=("bin/tool",))
    out = cli(tmp_path, "use", str(prefix))
    errors = [line for line in out.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert out.returncode == 2 and len(errors) == 1 and "field recipe.name" in errors[0], out.stderr
    assert not list(tmp_path.rglob("use.toml"))
    start = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    env = cli(tmp_path, "env", "--shell", "bash", env=start)
    assert env.returncode == 0 and "field recipe.name" in env.stderr
    got = sourced_once("bash", env.stdout, start, tmp_path)
    assert inner(f"{prefix.name}/bin") not in got["PATH"].split(":")
    assert not marker.exists()


def test_env_with_builds_and_a_verdict_imports_no_pathlib(tmp_path):
    """The builds, their manifests and the verify verdicts are read on strings too: an uncached
    `rocforge env` over a verified build still imports no pathlib (issue 24 item 5)."""
    import sys

    fr.make_strix_halo(tmp_path)
    prefixes = two_llama_builds(tmp_path)
    verified_pass(prefixes["vulkan"])
    code = ("import sys; from rocforge_build.cli import main; rc = main(['--root', sys.argv[1], "
            "'env', '--shell', 'bash']); print('pathlib' in sys.modules, file=sys.stderr); "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "ROCFORGE_NO_CACHE": "1"})
    assert out.returncode == 0 and out.stderr.splitlines()[-1] == "False", out.stderr
    assert "vulkan" in out.stdout  # the verified build went on PATH: its verdict was read
