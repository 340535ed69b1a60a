"""verify's reference never replaces a build the user asked for, and a build verified against
itself is not PASSED (issue 30, item 8): a user's full CPU build (18 programs) at its default
prefix was replaced by verify's 4-program reference, and its programs cost a 17-minute rebuild.

Real prefixes with real manifests (tests/stackfixtures.make_build), a real llama-perplexity
program (a shell script speaking llama.cpp's KL-divergence output), the real `rocforge verify`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import tomlkit
from stackfixtures import make_build
from test_commands_env_path import GOOD, perplexity_program
from tiny_gguf import write as write_gguf

from rocforge_build import paths
from rocforge_build.cli import main
from rocforge_build.discover.builds import read_manifest
from rocforge_build.errors import UsageError
from rocforge_build.forge import recipes
from rocforge_build.measure import verify_reference
from rocforge_build.measure.llama_tools import LlamaBuild

# what llama.cpp's CMake installs of a full CPU build: the user's "18 programs"
FULL_CPU = tuple(f"bin/llama-{p}" for p in (
    "bench", "cli", "server", "simple", "embedding", "gguf", "gguf-split", "imatrix", "quantize",
    "tokenize", "run", "tts", "mtmd-cli", "batched", "batched-bench", "lookup", "speculative"))


def _packaged(prefix: Path, *, source: str = "1" * 40) -> Path:
    """The manifest names the packaged llama-cpp recipe (its sha256) and the source `source`."""
    path = prefix / "rocforge-manifest.toml"
    doc = tomlkit.parse(path.read_text())
    doc["recipe"]["sha256"] = hashlib.sha256(recipes.load("llama-cpp").text.encode()).hexdigest()
    doc["source"]["identity"] = doc["source"]["commit"] = source
    doc["source"]["location"] = "file:///nonexistent/llama.cpp.git"
    path.write_text(tomlkit.dumps(doc))
    return prefix


def user_cpu_build(programs: tuple[str, ...] = FULL_CPU, *, perplexity: bool = True) -> Path:
    prefix = _packaged(make_build(Path("/"), "llama-cpp", "gfx1151", "cpu", files=programs))
    if perplexity:
        perplexity_program(prefix, GOOD)
    return prefix


def gpu_build(backend: str = "vulkan") -> Path:
    prefix = _packaged(make_build(Path("/"), "llama-cpp", "gfx1151", backend, files=("bin/llama-cli",)))
    perplexity_program(prefix, GOOD)
    return prefix


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry below `root`: its kind, bytes and mtime (a replaced build changes them)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, st.st_ino, data)
    return out


@pytest.fixture
def model(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)


def test_a_users_full_cpu_build_is_the_reference_as_it_is(model, capsys):
    """A vulkan build verified with no --reference: the user's CPU build of the same source at the
    default prefix has llama-perplexity, so it is the reference, used as it is — every byte, inode
    and mtime of its 18 programs unchanged, and no reference built beside it."""
    cpu, vk = user_cpu_build(), gpu_build()
    before = tree_state(cpu)
    assert main(["verify", str(vk), "--model", str(model), "--quick", "--json"]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["reference"] == str(cpu) and result["checks"]
    assert tree_state(cpu) == before
    assert not verify_reference.reference_dir().exists()


def test_a_cpu_build_without_what_verify_runs_is_never_rebuilt(tmp_path):
    """The user's CPU build lacks llama-perplexity: the reference is built in its own place under
    `<builds>/reference/`, never at the user's prefix.  The source recorded here is gone, so the
    reference's build stops before its fetch — and the user's build is left exactly as it was."""
    cpu = user_cpu_build(perplexity=False)
    vk = LlamaBuild.open(gpu_build())
    before = tree_state(cpu)
    req = verify_reference.reference_request(vk)
    where = Path(req.prefix)
    assert where.parent == paths.builds_prefix() / "reference" and where.name.startswith("llama-cpp-cpu-")
    assert req.backend == "cpu" and "llama-perplexity" in req.build_targets
    with pytest.raises(UsageError, match="no such file or directory"):
        verify_reference.reference_for(vk, None, quiet=True)
    assert tree_state(cpu) == before
    assert not where.exists()


def test_a_user_build_at_the_reference_place_is_not_replaced(tmp_path):
    """A build the user put at the reference's own prefix (`rocforge build --prefix` there) carries
    no `made_for = "reference"`: verify refuses to replace it, in one line."""
    vk = LlamaBuild.open(gpu_build())
    where = verify_reference.reference_prefix(vk)
    user = make_build(Path("/"), "llama-cpp", "gfx1151", "cpu", files=FULL_CPU)  # no perplexity
    where.parent.mkdir(parents=True)
    shutil.copytree(user, where)
    before = tree_state(where)
    with pytest.raises(UsageError, match="holds your build .*`rocforge verify`'s reference does not replace it"):
        verify_reference.reference_for(vk, None, quiet=True)
    assert tree_state(where) == before


def test_a_default_plan_cpu_build_is_the_reference(model, tmp_path, capsys):
    """A CPU build of the packaged recipe with no --reference is the reference: one line saying so,
    exit 0, no PASSED (nothing was compared), no llama-perplexity run, and the verdict recorded."""
    cpu = user_cpu_build()
    ran = tmp_path / "ran"
    exe = cpu / "bin" / "llama-perplexity"
    exe.write_text(exe.read_text().replace("#!/bin/sh\n", f"#!/bin/sh\n[ \"$1\" = --help ] || : > {ran}\n", 1))
    assert main(["verify", str(cpu), "--model", str(model), "--quick"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().splitlines() == [
        f"{cpu} is rocforge's reference (a CPU build of the default plan): nothing to compare it with; "
        "other builds of this source are verified against it"], out
    assert "PASSED" not in out + err and not ran.exists()
    from rocforge_build.discover import choices
    from rocforge_build.rootfs import Root

    assert choices.verified(Root("/"), cpu.name, read_manifest(cpu)["stamp"]) is not None
    # `rocforge env` says why the build is on PATH in the same words: the reference, not "passed"
    assert choices.verdict(Root("/"), cpu.name, read_manifest(cpu)["stamp"])[1] is True
    assert main(["env", "--shell", "bash", "--target", "gfx1151"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("# builds on PATH:")]
    assert "verify took as rocforge's reference" in line and "that passed verify" not in line, line


@pytest.mark.parametrize("change", ["patch", "recipe"])
def test_a_cpu_build_off_the_default_plan_is_never_its_own_reference(change):
    """A CPU build with a patch the packaged recipe does not ship, or from another recipe text, is
    not the default plan: its reference is rocforge's own build under <builds>/reference/ (here
    its recorded source is gone, so that build stops before its fetch), never the build itself."""
    cpu = user_cpu_build()
    path = cpu / "rocforge-manifest.toml"
    doc = tomlkit.parse(path.read_text())
    if change == "patch":
        doc["patches"] = [{"name": "wrong-on-demand.patch", "status": "applied", "sha256": "0" * 64}]
    else:
        doc["recipe"]["sha256"] = "f" * 64
    path.write_text(tomlkit.dumps(doc))
    build = LlamaBuild.open(cpu)
    assert not verify_reference.is_default_plan(build)
    assert verify_reference.existing_reference(build) is None
    with pytest.raises(UsageError, match="no such file or directory"):
        verify_reference.reference_for(build, None, quiet=True)


def test_the_shipped_patches_keep_the_default_plan():
    """A patch the packaged recipe applies (name and sha256 of the file it ships) is its plan."""
    cpu = user_cpu_build()
    shipped = sorted(recipes.load("llama-cpp").patches_dir.glob("*.patch"))[0]
    path = cpu / "rocforge-manifest.toml"
    doc = tomlkit.parse(path.read_text())
    doc["patches"] = [{"name": shipped.name, "status": "applied",
                       "sha256": hashlib.sha256(shipped.read_bytes()).hexdigest()}]
    path.write_text(tomlkit.dumps(doc))
    assert verify_reference.is_default_plan(LlamaBuild.open(cpu))


@pytest.mark.parametrize("how", ["same prefix", "a copy"])
def test_a_build_verified_against_itself_says_nothing_was_compared(model, tmp_path, capsys, how):
    """A CPU build given as its own reference (--reference with the same prefix, or a copy of
    it: one build stamp): one error line saying nothing was compared, exit 2 (usage), no PASSED
    anywhere, no llama-perplexity run."""
    cpu = user_cpu_build()
    ran = tmp_path / "ran"
    exe = cpu / "bin" / "llama-perplexity"
    exe.write_text(exe.read_text().replace("#!/bin/sh\n", f"#!/bin/sh\n[ \"$1\" = --help ] || : > {ran}\n", 1))
    argv = ["verify", str(cpu), "--model", str(model), "--quick"]
    if how == "same prefix":
        argv += ["--reference", str(cpu)]
    elif how == "a copy":
        shutil.copytree(cpu, tmp_path / "copy", symlinks=True)
        argv += ["--reference", str(tmp_path / "copy")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("rocforge: error:")]
    assert len(errors) == 1 and "nothing was compared" in errors[0] and "its own reference" in errors[0], err
    assert "PASSED" not in out + err and not ran.exists()


def test_the_canary_of_a_reference_build_uses_rocforges_own_reference_prefix():
    """The served build is the default-plan CPU reference: the canary's reference is the same plan
    in rocforge's own prefix (<builds>/reference/...), reused when it is there, never the served one."""
    cpu = user_cpu_build()
    build = LlamaBuild.open(cpu)
    where = verify_reference.reference_prefix(build)
    where.parent.mkdir(parents=True)
    shutil.copytree(cpu, where, symlinks=True)
    path = where / "rocforge-manifest.toml"
    doc = tomlkit.parse(path.read_text())
    doc["made_for"], doc["prefix"], doc["stamp"] = "reference", str(where), "e" * 64
    path.write_text(tomlkit.dumps(doc))
    ref = verify_reference.independent_reference(build, None, quiet=True)
    assert ref.prefix == where.resolve() and ref.prefix != build.prefix


def test_the_canary_is_not_run_without_an_independent_reference():
    """No reference prefix yet and the recorded source is gone (it cannot be built), or the build
    given as its own --reference: "canary not run", naming the flag that gives one."""
    cpu = user_cpu_build()
    build = LlamaBuild.open(cpu)
    with pytest.raises(UsageError, match="canary not run: no independent reference") as exc:
        verify_reference.independent_reference(build, None, quiet=True)
    assert "--reference PREFIX" in exc.value.hint
    with pytest.raises(UsageError, match="canary not run: .* compared with itself"):
        verify_reference.independent_reference(build, str(cpu), quiet=True)


def test_the_canary_of_a_gpu_build_uses_verifys_reference():
    cpu, vk = user_cpu_build(), gpu_build()
    assert verify_reference.independent_reference(LlamaBuild.open(vk), None, quiet=True).prefix == cpu.resolve()


def test_tunes_check_of_the_reference_at_a_winners_shape_runs_nothing(model, tmp_path):
    """tune checks its winner at the range's own shape; for rocforge's default-plan CPU build that
    check would compare the build with itself (two llama-perplexity runs proving nothing): it passes
    as the reference, says nothing was compared and runs no program."""
    from rocforge_build.measure import gguf, verify

    cpu = user_cpu_build()
    ran = tmp_path / "ran"
    exe = cpu / "bin" / "llama-perplexity"
    exe.write_text(exe.read_text().replace("#!/bin/sh\n", f"#!/bin/sh\n[ \"$1\" = --help ] || : > {ran}\n", 1))
    shape = verify.Shape(4096, 512, True, None, "f16", "mmap", 1)
    got = verify.verify_shape(LlamaBuild.open(cpu), gguf.check(model), shape, reference=None, quiet=True)
    assert got["passed"] is True and got["reference"] == str(cpu)
    assert got["checks"][0]["note"] == "the reference: nothing compared"
    assert {k: got["checks"][0][k] for k in shape.to_json()} == shape.to_json()
    assert got["checks"][0]["kld_mean"] is None and not ran.exists()
