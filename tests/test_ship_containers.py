"""Container images: the rendered Containerfiles (hip, vulkan), labels and env from a build's
facts, engine choice, the GPU run command; and (slow) a real buildah build from a Debian base
made here, whose slim runtime image runs the built program."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_roots import make_system
from needs import needs

from rocforge_build import ownership
from rocforge_build.cli import main
from rocforge_build.errors import BuildError, ConfigError, ToolchainError, UsageError
from rocforge_build.rootfs import Root
from rocforge_build.ship import container_context, container_engines, containers

INSTRUCTIONS = {"FROM", "RUN", "COPY", "ENV", "LABEL", "WORKDIR", "ARG", "CMD", "ENTRYPOINT", "USER"}


def parse_containerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((word, rest.strip()))
        buf = ""
    assert not buf, "a continuation line ends the file"
    return out


def stages(instrs) -> dict[str, list[tuple[str, str]]]:
    result: dict[str, list] = {}
    current = None
    for word, rest in instrs:
        if word == "FROM":
            parts = rest.split()
            current = parts[2] if len(parts) == 3 and parts[1] == "AS" else f"#{len(result)}"
            result[current] = [(word, rest)]
        else:
            result[current].append((word, rest))
    return result


def check_wellformed(text: str) -> dict[str, list[tuple[str, str]]]:
    assert "${" not in text, "an unfilled template field"
    instrs = parse_containerfile(text)
    assert {w for w, _ in instrs} <= INSTRUCTIONS
    st = stages(instrs)
    names = list(st)
    for i, body in enumerate(st.values()):
        for word, rest in body:
            m = re.match(r"--from=(\S+)", rest) if word == "COPY" else None
            if m and m.group(1) in st:  # a stage source must be an earlier stage
                assert names.index(m.group(1)) < i
    return st


def test_variant_follows_the_backends_toolchain():
    """llama-cpp's rocwmma backend uses the hip toolchain: the TheRock builder, like hip."""
    assert containers.plan("llama-cpp", target="gfx1151", backend="rocwmma").variant.name == "therock"
    assert containers.plan("llama-cpp", target="gfx1151", backend="cpu").variant.name == "debian"
    assert containers.plan(str(HELLO), target="gfx1151", backend="cpu").recipe.name == "container-hello"


def test_hip_containerfile():
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip")
    text = containers.render(plan)
    st = check_wellformed(text)
    assert list(st) == ["builder", "runtime"]
    builder = " ".join(f"{w} {r}" for w, r in st["builder"])
    # Debian 12 with python.org's Python: Debian's 3.11.2 lacks tarfile's extraction filters
    assert st["builder"][0] == ("FROM", "docker.io/library/python:3.11-slim-bookworm AS builder")
    # ROCm from a TheRock nightly for the target, then the build, the env and the closure
    assert "rocforge nightly install --target gfx1151" in builder
    assert "rocforge build llama-cpp --target gfx1151 --backend hip" in builder
    assert "rocforge env --target gfx1151 --shell dotenv > /opt/rocforge/out/env" in builder
    assert ("rocforge container closure /opt/rocforge/builds/llama-cpp-gfx1151-hip "
            "--env-file /opt/rocforge/out/env") in builder
    assert builder.index("nightly install") < builder.index("rocforge build") < builder.index("closure")
    assert "--mount=type=cache,id=rocforge-cache,target=/opt/rocforge/cache" in builder
    assert "pip install --no-index" in builder  # rocforge goes in from the context's wheels
    runtime = st["runtime"]
    assert runtime[0] == ("FROM", "scratch AS runtime")
    copies = [r for w, r in runtime if w == "COPY"]
    assert copies == [
        "--from=builder /opt/rocforge/closure/ /",
        "--from=builder /opt/rocforge/builds/llama-cpp-gfx1151-hip/ /opt/rocforge/builds/llama-cpp-gfx1151-hip/",
        "--from=builder /opt/rocforge/out/ /opt/rocforge/facts/",
    ]
    assert not any(w == "RUN" for w, _ in runtime)  # nothing runs in the slim stage
    label = next(r for w, r in runtime if w == "LABEL")
    assert 'io.rocforge.target="gfx1151"' in label and 'io.rocforge.backend="hip"' in label
    assert 'org.opencontainers.image.title="llama-cpp for gfx1151 (hip)"' in label


def test_vulkan_containerfile():
    plan = containers.plan("llama-cpp", target="gfx1100", backend="vulkan")
    text = containers.render(plan)
    st = check_wellformed(text)
    builder = " ".join(f"{w} {r}" for w, r in st["builder"])
    assert "nightly install" not in builder  # Vulkan needs no ROCm
    install = next(r for w, r in st["builder"] if w == "RUN" and "apt-get install" in r)
    for pkg in ("libvulkan-dev", "glslc", "spirv-headers", "mesa-vulkan-drivers", "cmake", "g++", "git"):
        assert f" {pkg}" in install
    assert "rocforge build llama-cpp --target gfx1100 --backend vulkan" in builder
    assert "rocforge env --target" not in builder  # no ROCm in the image: nothing for env to describe
    assert "/opt/rocforge/builds/llama-cpp-gfx1100-vulkan/" in text
    assert plan.variant.name == "debian-vulkan"
    assert [d.key for d in plan.decisions][:2] == ["variant", "rocm"]


DATA = Path(__file__).parent / "data"
HELLO = DATA / "recipes/container-hello.toml"
MINIMAL = ('[recipe]\nname = "hello"\n[source]\ngit = "file:///x.git"\nref = "main"\n'
           '[backends.cpu]\ntoolchain = "host"\n')


def test_recipe_path_base_and_runtime_base(tmp_path):
    recipe = tmp_path / "mine.toml"
    recipe.write_text(MINIMAL)
    plan = containers.plan(str(recipe), target="gfx1151", backend="cpu", variant="preinstalled",
                           base="localhost/my-tools:1", runtime_base="debian:bookworm-slim", tag="me/hello:1")
    text = containers.render(plan)
    st = check_wellformed(text)
    assert st["builder"][0] == ("FROM", "localhost/my-tools:1 AS builder")
    assert st["runtime"][0] == ("FROM", "debian:bookworm-slim AS runtime")
    assert "apt-get" not in text
    assert ("rocforge build /opt/rocforge/recipe/recipes/hello.toml --target gfx1151 --backend cpu "
            "--prefix /opt/rocforge/builds/hello-gfx1151-cpu") in text
    assert "/opt/rocforge/builds/hello-gfx1151-cpu/" in text
    assert containers.stage_tag("me/hello:1") == "me/hello:1-stage"
    assert containers.stage_tag("localhost:5000/me/hello") == "localhost:5000/me/hello:stage"


def test_plan_errors_name_the_fix(tmp_path):
    with pytest.raises(UsageError, match="gfx1151"):
        containers.plan("llama-cpp", target="gfx1115", backend="hip")
    with pytest.raises(UsageError) as err:
        containers.plan("llama-cpp", target="gfx1151", backend="vulkn")
    assert "did you mean 'vulkan'" in err.value.hint and "rocwmma" in err.value.hint
    with pytest.raises(UsageError, match="unknown recipe"):
        containers.plan("llama-cp", target="gfx1151", backend="hip")
    with pytest.raises(UsageError, match="--base"):
        containers.plan("llama-cpp", target="gfx1151", backend="cpu", variant="preinstalled")
    with pytest.raises(UsageError, match="does not exist"):
        containers.plan(str(tmp_path / "nope.toml"), target="gfx1151", backend="cpu")


def _facts(manifest: dict | None = None, env: dict | None = None) -> containers.Facts:
    return containers.Facts(
        env=env if env is not None else {"ROCM_PATH": "/opt/rocforge/rocm/current",
                                         "PATH": "/opt/rocforge/rocm/current/bin:/usr/bin:/bin",
                                         "HIP_PLATFORM": "amd", "EMPTY": ""},
        # the keys pipeline.write_manifest writes
        manifest=manifest if manifest is not None else {
            "rocforge": "0.1.0", "recipe": {"name": "llama-cpp", "file": "/x/llama-cpp.toml"},
            "source": {"kind": "git", "location": "https://github.com/ggml-org/llama.cpp", "ref": "b6123",
                       "identity": "b6a0c9f3e1d2", "commit": "b6a0c9f3e1d2", "version": ""},
            "target": "gfx1151", "backend": "hip",
            "runtime_env": {"GGML_CUDA_ENABLE_UNIFIED_MEMORY": "1"},
            "toolchain": {"kind": "hip", "rocm_version": "7.10.0a20251021"},
            "built_at": "2026-11-20T23:59:00Z",
        })


def test_final_containerfile_env_and_labels_from_facts():
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip")
    text = containers.render_final(plan, _facts())
    st = check_wellformed(text)
    (body,) = st.values()
    assert body[0] == ("FROM", "localhost/rocforge/llama-cpp:gfx1151-hip-stage")
    env = next(r for w, r in body if w == "ENV")
    assert 'ROCM_PATH="/opt/rocforge/rocm/current"' in env
    assert ('PATH="/opt/rocforge/builds/llama-cpp-gfx1151-hip/bin:/opt/rocforge/rocm/current/bin:/usr/bin:/bin"'
            in env)
    assert "EMPTY" not in env  # empty = unset in dotenv; the image starts without it
    assert 'GGML_CUDA_ENABLE_UNIFIED_MEMORY="1"' in env  # the recipe's runtime env
    labels = containers.labels(plan, _facts().manifest)
    assert labels["org.opencontainers.image.revision"] == "b6a0c9f3e1d2"
    assert labels["org.opencontainers.image.source"] == "https://github.com/ggml-org/llama.cpp"
    assert labels["org.opencontainers.image.version"] == "b6123"  # version empty: the ref
    assert labels["org.opencontainers.image.created"] == "2026-11-20T23:59:00Z"
    assert labels["io.rocforge.rocm.version"] == "7.10.0a20251021"
    assert "ROCm 7.10.0a20251021" in labels["org.opencontainers.image.description"]
    local = {**_facts().manifest, "source": {"kind": "local", "location": "/opt/rocforge/source"}}
    assert "org.opencontainers.image.source" not in containers.labels(plan, local)
    # a manifest without a commit: the label is left out, not written empty
    bare = containers.labels(plan, {"recipe": {"name": "x"}})
    assert "org.opencontainers.image.revision" not in bare
    assert bare["org.opencontainers.image.description"].endswith("ROCm none")


def test_env_values_are_quoted_for_containerfiles():
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip")
    text = containers.env_lines(plan, _facts(env={"ODD": 'a "b" $HOME \\x'}))
    assert 'ODD="a \\"b\\" \\$HOME \\\\x"' in text


def test_read_facts(tmp_path):
    with pytest.raises(ConfigError, match="no facts"):
        containers.read_facts(tmp_path)
    (tmp_path / "env").write_text("# header\nROCM_PATH=/usr\n")
    (tmp_path / "rocforge-manifest.toml").write_text('recipe = "hello"\n[source]\ncommit = "abc"\n')
    (tmp_path / "closure.json").write_text(json.dumps({"files": 3, "bytes": 10, "elf_files": 1}))
    f = containers.read_facts(tmp_path)
    assert f.env == {"ROCM_PATH": "/usr"} and f.manifest["source"]["commit"] == "abc" and f.closure["files"] == 3


def _fake_programs(tmp_path, monkeypatch, *names) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for n in names:
        p = bindir / n
        p.write_text("#!/bin/sh\nexit 0\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bindir))


def test_engine_detection_order(tmp_path, monkeypatch):
    _fake_programs(tmp_path, monkeypatch, "docker", "buildah")
    engine, why = container_engines.detect_engine()
    assert engine.name == "buildah" and "podman, buildah, docker" in why.reason
    _fake_programs(tmp_path, monkeypatch, "podman")
    assert container_engines.detect_engine()[0].name == "podman"
    assert container_engines.detect_engine("docker")[0].name == "docker"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolchainError, match="no container engine"):
        container_engines.detect_engine()


def test_build_commands(tmp_path):
    steps = container_engines.build_commands(container_engines.get_engine("podman"), tmp_path, "localhost/rocforge/x:gfx1151-hip")
    assert steps.stage == ["podman", "build", "--layers", "-f", f"{tmp_path}/Containerfile", "--target", "runtime",
                           "-t", "localhost/rocforge/x:gfx1151-hip-stage", str(tmp_path)]
    assert steps.facts[-3:] == ["--output", f"type=local,dest={tmp_path}/facts", f"{tmp_path}/empty"]
    assert steps.final[-3:] == ["-t", "localhost/rocforge/x:gfx1151-hip", f"{tmp_path}/empty"]
    assert steps.cleanup == ["podman", "rmi", "localhost/rocforge/x:gfx1151-hip-stage"]


def test_run_command_docker_uses_numeric_gids(tmp_path):
    make_system(tmp_path)  # /etc/group: render 44, video 105; /dev/kfd, /dev/dri
    rp = container_engines.run_plan(container_engines.get_engine("docker"), "img", ["llama-cli", "--version"],
                             rootfs=Root(tmp_path), rootless=False)
    (cmd,) = rp.commands
    assert list(cmd) == ["docker", "run", "--rm", "--device", "/dev/kfd", "--device", "/dev/dri",
                         "--group-add", "105", "--group-add", "44",
                         "--security-opt", "seccomp=unconfined", "img", "llama-cli", "--version"]
    assert rp.warnings == ()
    assert any(d.key == "groups" and d.value == "video=105,render=44" for d in rp.decisions)


def test_run_command_rootless_podman_and_buildah(tmp_path):
    make_system(tmp_path, groups={"video": ()})
    rp = container_engines.run_plan(container_engines.get_engine("podman"), "img", ["sh"], rootfs=Root(tmp_path),
                             rootless=True, interactive=True)
    assert rp.commands[0][:4] == ("podman", "run", "--rm", "-it")
    assert ("--group-add", "keep-groups") in zip(rp.commands[0], rp.commands[0][1:], strict=False)
    rp = container_engines.run_plan(container_engines.get_engine("podman"), "img", ["sh"], rootfs=Root(tmp_path), rootless=False)
    assert "render" in rp.commands[0]  # not in /etc/group: the name, with a warning
    assert any("render is not in /etc/group" in w for w in rp.warnings)
    rp = container_engines.run_plan(container_engines.get_engine("buildah"), "img", ["sh", "-c", "x"], rootfs=Root(tmp_path))
    assert rp.commands[0] == ("buildah", "from", "--device", "/dev/kfd", "--device", "/dev/dri",
                              "--security-opt", "seccomp=unconfined", "img")
    assert rp.commands[1] == ("buildah", "run", "$CTR", "--", "sh", "-c", "x")
    assert rp.commands[2] == ("buildah", "rm", "$CTR")


def test_cli_run_names_a_group_missing_from_etc_group_without_none(tmp_path, capsys, docker_ok):
    """A GPU group that /etc/group lacks is passed by name; the printed decision says the name
    (it used to say `render=None`)."""
    make_system(tmp_path, groups={"video": ()})  # video 44; no render group
    assert main(["--root", str(tmp_path), "container", "run", "llama-cpp", "--target", "gfx1151",
                 "--backend", "hip", "--engine", "docker", "--dry-run", "--", "true"]) == 0
    out = capsys.readouterr().out
    assert "--group-add 44 --group-add render " in out
    assert re.search(r"^  groups +video=44,render$", out, re.M), out
    assert "None" not in out


def test_run_without_gpu_devices_leaves_them_out(tmp_path):
    make_system(tmp_path, kfd=False)
    rp = container_engines.run_plan(container_engines.get_engine("docker"), "img", ["x"], rootfs=Root(tmp_path), rootless=False)
    assert "--device" not in rp.commands[0]
    assert any("/dev/kfd, /dev/dri not found" in w for w in rp.warnings)


def test_cli_run_dry_run_takes_the_command_after_dashes(tmp_path, capsys, docker_ok):
    make_system(tmp_path)
    rc = main(["--root", str(tmp_path), "container", "run", "llama-cpp", "--target", "gfx1151", "--backend",
               "hip", "--engine", "docker", "--dry-run", "--", "llama-cli", "-m", "/models/x.gguf", "--version"])
    assert rc == 0
    out = capsys.readouterr().out
    assert ("docker run --rm --device /dev/kfd --device /dev/dri --group-add 105 --group-add 44 --security-opt "
            "seccomp=unconfined localhost/rocforge/llama-cpp:gfx1151-hip llama-cli -m /models/x.gguf --version") in out
    assert main(["--root", str(tmp_path), "container", "run", "llama-cpp", "--target", "gfx1151",
                 "--backend", "hip", "--engine", "docker", "--dry-run"]) == 2
    assert "put the command after --" in capsys.readouterr().err


def test_cli_build_dry_run(capsys):
    rc = main(["container", "build", "llama-cpp", "--target", "gfx1151", "--backend", "vulkan",
               "--engine", "podman", "--dry-run", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["variant"] == "debian-vulkan" and data["engine"] == "podman"
    assert data["commands"][0][:3] == ["podman", "build", "--layers"]
    check_wellformed(data["containerfile"])
    check_wellformed(data["containerfile_facts"])
    assert main(["container", "build", "llama-cpp", "--target", "gfx1151", "--backend", "hip",
                 "--engine", "buildah", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "FROM docker.io/library/python:3.11-slim-bookworm AS builder" in out
    assert "buildah build -f" in out and "Containerfile.final" in out


def test_context_holds_wheels_recipe_and_containerfiles(tmp_path, monkeypatch):
    """prepare_context with pip stubbed out (the real wheel build runs in the slow test)."""
    calls = []
    monkeypatch.setattr(container_context, "build_wheels", lambda dest: calls.append(dest))
    recipe = tmp_path / "recipes/r.toml"
    recipe.parent.mkdir()
    recipe.write_text(MINIMAL)
    (tmp_path / "patches/hello").mkdir(parents=True)
    (tmp_path / "patches/hello/fix.patch").write_text("--- a\n+++ b\n")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub/main.c").write_text("int main(void){return 0;}\n")
    plan = containers.plan(str(recipe), target="gfx1151", backend="cpu", source=str(src), ref="v1")
    assert plan.source_arg == "/opt/rocforge/source"
    ctx = tmp_path / "ctx"
    (ctx / "stale").mkdir(parents=True)
    ownership.write_mark(ctx, "an earlier context")  # rocforge replaces only a context it made
    container_context.prepare_context(plan, ctx)
    assert calls == [ctx / "wheels"]
    assert (ctx / "recipe/recipes/hello.toml").read_text() == MINIMAL  # by its recipe name
    assert (ctx / "recipe/patches/hello/fix.patch").is_file()  # <recipe dir>/../patches/<name>
    assert (ctx / "source/sub/main.c").is_file()
    text = (ctx / "Containerfile").read_text()
    assert ("--prefix /opt/rocforge/builds/hello-gfx1151-cpu --source /opt/rocforge/source --ref v1") in text
    assert "COPY source/ /opt/rocforge/source/" in text
    assert (ctx / "Containerfile").read_text() == containers.render(plan)
    assert (ctx / "empty").is_dir() and not (ctx / "stale").exists()
    for word, rest in parse_containerfile((ctx / "Containerfile").read_text()):
        if word == "COPY" and not rest.startswith("--from"):
            assert (ctx / rest.split()[0]).exists(), rest  # every context source is there


def test_url_sources_pass_through_and_tarballs_travel(tmp_path):
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip",
                           source="https://github.com/ggml-org/llama.cpp.git", ref="b6123")
    assert plan.local_source is None
    text = containers.render(plan)
    assert "--source https://github.com/ggml-org/llama.cpp.git --ref b6123" in text
    assert "COPY source/" not in text
    tarball = tmp_path / "llama.cpp-b6123.tar.gz"
    tarball.write_bytes(b"\x1f\x8b")
    plan = containers.plan("llama-cpp", target="gfx1151", backend="hip", source=str(tarball))
    assert plan.source_arg == "/opt/rocforge/source/llama.cpp-b6123.tar.gz"
    assert containers.plan("llama-cpp", target="gfx1151", backend="hip",
                           source=tarball.as_uri()).local_source == tarball  # file:// is local too
    with pytest.raises(UsageError, match="no such file"):
        containers.plan("llama-cpp", target="gfx1151", backend="hip", source=str(tmp_path / "nope"))


# -- slow: a real image, built with buildah from a Debian base made here --------------------------
# No registry is reachable, so the base image is made the honest way: mmdebstrap (minbase
# bookworm, from the Debian mirror apt uses) with the `debian` variant's own package list, the
# rootfs tarball wrapped as a one-layer OCI image layout and pulled into an isolated storage.
# vfs storage and chroot isolation need neither overlayfs nor a daemon; vfs copies whole layers,
# so the base is made once per test session and the image steps are kept few.


def write_oci_layout(tar: Path, out: Path, ref: str) -> None:
    """An OCI image layout (index.json, blobs) whose one uncompressed layer is `tar`."""
    import hashlib

    blobs = out / "blobs/sha256"
    blobs.mkdir(parents=True)
    h = hashlib.sha256()
    with open(tar, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    layer = h.hexdigest()
    os.link(tar, blobs / layer)

    def blob(obj) -> tuple[str, int]:
        data = json.dumps(obj, separators=(",", ":")).encode()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    config = blob({"architecture": "amd64", "os": "linux",
                   "config": {"Env": [f"PATH={containers.DEFAULT_PATH}"], "Cmd": ["/bin/bash"]},
                   "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer}"]},
                   "history": [{"created_by": "mmdebstrap --variant=minbase bookworm"}]})
    manifest = blob({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                     "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                "digest": config[0], "size": config[1]},
                     "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                 "digest": f"sha256:{layer}", "size": tar.stat().st_size}]})
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest[0], "size": manifest[1],
         "annotations": {"org.opencontainers.image.ref.name": ref}}]}))
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


def _sh(argv, env=None, **kw):
    return subprocess.run(argv, env={**os.environ, **(env or {})}, check=True, text=True,
                          capture_output=True, **kw)


@pytest.fixture(scope="session")
def buildah_env(tmp_path_factory):
    """An isolated containers-storage (vfs) for the session; removed at the end."""
    top = tmp_path_factory.mktemp("containers")
    conf = top / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{top}/storage"\nrunroot = "{top}/run"\n')
    env = {"CONTAINERS_STORAGE_CONF": str(conf), "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}
    yield env
    subprocess.run(["buildah", "rm", "--all"], env={**os.environ, **env}, capture_output=True)
    if os.geteuid() == 0:
        shutil.rmtree(top, ignore_errors=True)
    else:  # rootless vfs files belong to sub-UIDs
        subprocess.run(["buildah", "unshare", "rm", "-rf", str(top)], env={**os.environ, **env})


@pytest.fixture(scope="session")
def debian_base(buildah_env, tmp_path_factory) -> str:
    """localhost/rocforge-test/debian:bookworm: minbase + the `debian` variant's packages, and
    Debian's python3 standing in for the variant's python.org base (the test's source is a local
    tree, which needs no tar extraction, so Debian's Python 3.11.2 does here)."""
    work = tmp_path_factory.mktemp("debian-base")
    tar = work / "rootfs.tar"
    packages = (*containers.get_variant("debian").packages, "python3", "python3-venv")
    mode = [] if os.geteuid() == 0 else ["--mode=unshare"]
    _sh(["mmdebstrap", "--variant=minbase", *mode, f"--include={','.join(packages)}",
         *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "locale", "info")),
         "bookworm", str(tar)])
    write_oci_layout(tar, work / "oci", "bookworm")
    name = "localhost/rocforge-test/debian:bookworm"
    image = _sh(["buildah", "pull", "--quiet", f"oci:{work / 'oci'}:bookworm"], buildah_env).stdout.split()[-1]
    _sh(["buildah", "tag", image, name], buildah_env)
    tar.unlink()
    return name


@pytest.mark.slow
def test_real_image_runs_the_build_in_a_slim_stage(tmp_path, monkeypatch, capfd, buildah_env, debian_base):
    for key, value in buildah_env.items():
        monkeypatch.setenv(key, value)
    repo = tmp_path / "container-hello"  # the source as a git repository: the label carries its commit
    shutil.copytree(DATA / "container-hello", repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    _sh(["git", "init", "-q", "-b", "main", str(repo)])
    _sh([*git, "add", "-A"])
    _sh([*git, "commit", "-qm", "container-hello 1.0"])
    commit = _sh([*git, "rev-parse", "HEAD"]).stdout.strip()
    tag = "localhost/rocforge-test/container-hello:gfx1151-cpu"
    common = [str(HELLO), "--target", "gfx1151", "--backend", "cpu", "--engine", "buildah", "--tag", tag]

    rc = main(["container", "build", *common, "--base", debian_base, "--source", str(repo),
               "--json"])
    out = capfd.readouterr()
    assert rc == 0, out.err[-3000:]
    summary = json.loads(out.out)
    assert summary["variant"] == "debian"  # the real apt step ran on the made base
    assert summary["labels"]["org.opencontainers.image.revision"] == commit
    assert summary["env"]["CONTAINER_HELLO_MODE"] == "image for gfx1151"
    assert summary["closure"]["elf_files"] == 2  # the program and its own libgreet

    # the image itself carries them (buildah's view, not ours)
    info = json.loads(_sh(["buildah", "inspect", "--type", "image", tag]).stdout)["OCIv1"]
    labels, env = info["config"]["Labels"], info["config"]["Env"]
    assert labels["org.opencontainers.image.revision"] == commit
    assert labels["io.rocforge.target"] == "gfx1151" and labels["io.rocforge.backend"] == "cpu"
    assert "CONTAINER_HELLO_MODE=image for gfx1151" in env
    assert any(e.startswith("PATH=/opt/rocforge/builds/container-hello-gfx1151-cpu/bin:") for e in env)
    ctx = Path(summary["context"])
    closure = json.loads((ctx / "facts/closure.json").read_text())
    names = {os.path.basename(e["path"]) for e in closure["entries"]}
    assert {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6"} <= names

    # the slim stage runs the program: scratch + prefix + closure, found through PATH
    assert main(["container", "run", *common, "--", "container-hello", "from the image"]) == 0
    assert "hello from rocforge, from the image (sqrt(2)=1.41421)" in capfd.readouterr().out
    # ... and it holds nothing else: no shell
    assert main(["container", "run", *common, "--", "/bin/sh", "-c", "true"]) != 0
    size = json.loads(_sh(["buildah", "images", "--json", tag]).stdout)[0]["size"]  # e.g. "5.43 MB"
    number, unit = size.split()
    assert float(number) * {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit] < 30e6, size


# -- the default backend, exactly as `rocforge build` chooses it ----------------------------------
def test_default_backend_is_the_build_choice_with_its_reason(tmp_path, capsys):
    from buildfixtures import recipe_copy, tarball

    recipe = str(recipe_copy(tmp_path / "r"))
    src = str(tarball(tmp_path / "fixture.tar.gz"))
    for target in ("gfx1151", "gfx1100"):
        assert main(["build", recipe, "--target", target, "--source", src, "--dry-run", "--json"]) == 0
        built = json.loads(capsys.readouterr().out)
        assert main(["container", "build", recipe, "--target", target, "--source", src, "--engine", "buildah",
                     "--dry-run", "--json"]) == 0
        image = json.loads(capsys.readouterr().out)
        chosen = next(d for d in image["decisions"] if d["key"] == "backend")
        assert (image["backend"], chosen["reason"]) == (built["backend"], built["backend_reason"])
        assert image["tag"].endswith(f":{target}-{built['backend']}")
    # the fixture recipe's [[default]] rules: accel where the tree has FIXTURE_ACCEL on gfx1151
    assert (image["backend"], built["backend"]) == ("cpu", "cpu")
    assert main(["container", "run", recipe, "--target", "gfx1151", "--source", src, "--engine", "buildah",
                 "--dry-run", "--", "fixture-hello"]) == 0
    out = capsys.readouterr().out
    assert "backend       accel" in out and "(gfx1151 gets the accelerated mode where the tree has it)" in out
    assert "localhost/rocforge/fixture:gfx1151-accel" in out


# -- the engine check: the real docker client, no daemon, no buildx plugin on this machine --------
needs_docker = needs("docker", "buildah")  # the hint names buildah only where it is installed


@needs_docker
def test_docker_without_daemon_or_buildx_is_one_line_before_anything_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))  # no user plugins
    assert main(["container", "build", str(HELLO), "--target", "gfx1151", "--backend", "cpu",
                 "--engine", "docker"]) == ToolchainError.exit_code
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("rocforge: error: ") and err[1].startswith("rocforge: hint: ")
    assert f"docker cannot reach its daemon at unix://{tmp_path}/no-such-docker.sock" in err[0]
    buildx = subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0
    assert ("docker has no buildx (BuildKit)" in err[0]) == (not buildx)
    assert "DOCKER_HOST" in err[1] and "--engine buildah" in err[1]  # buildah is installed here (CI too)
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "containers").exists()  # nothing prepared
    # run needs the daemon only
    assert main(["container", "run", str(HELLO), "--target", "gfx1151", "--backend", "cpu",
                 "--engine", "docker", "--", "true"]) == ToolchainError.exit_code
    err = capsys.readouterr().err
    assert "daemon" in err and "buildx" not in err.splitlines()[0]
    # --dry-run prints the plan with the problem, then exits as the build would
    assert main(["container", "build", str(HELLO), "--target", "gfx1151", "--backend", "cpu",
                 "--engine", "docker", "--dry-run"]) == ToolchainError.exit_code
    assert "# docker cannot build here: docker cannot reach its daemon" in capsys.readouterr().out


@pytest.mark.parametrize("action", ["build", "run"])
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_engine_dry_run_exits_as_the_real_run(tmp_path, monkeypatch, capsys, action, json_out):
    """A docker without buildx and without a daemon (a fake client on PATH): the real run stops
    with exit 5 before anything is built; its dry run makes the same check, prints its plan with
    the problem, and exits 5 too (it used to skip the check and exit 0)."""
    from fake_engines import calls, fake_docker

    bindir = fake_docker(tmp_path / "bin", buildx=False, daemon=False)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    argv = ["container", action, str(HELLO), "--target", "gfx1151", "--backend", "cpu",
            "--engine", "docker", *(["--", "true"] if action == "run" else [])]
    codes = {}
    for dry in (True, False):
        extra = ["--dry-run", *(["--json"] if json_out else [])] if dry else []
        at = argv.index("--") if "--" in argv else len(argv)
        codes[dry] = main([*argv[:at], *extra, *argv[at:]])
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.startswith("rocforge: error:")]
        assert len(lines) == 1 and "docker cannot reach its daemon" in lines[0], err
        assert ("docker has no buildx" in lines[0]) == (action == "build")
        if dry:  # the plan is printed first
            if json_out:
                assert "docker cannot reach its daemon" in json.loads(out)["engine_problems"][-1]
            else:
                assert f"# docker cannot {action} here: " in out
                assert ("localhost/rocforge/container-hello:gfx1151-cpu" in out)
        else:
            assert out == ""
    assert codes == {True: ToolchainError.exit_code, False: ToolchainError.exit_code}
    asked = calls(bindir)
    assert all(c.startswith(("buildx version", "version --format")) for c in asked), asked
    assert not (Path(os.environ["ROCFORGE_CACHE_DIR"]) / "containers").exists()  # nothing prepared


def test_engine_check_comes_before_a_planning_error(tmp_path, monkeypatch, capsys):
    """The real `container build` checks the engine before it plans; a dry run whose plan also
    fails (an unknown backend, exit 2) exits with the engine's error, as the build does."""
    from fake_engines import fake_docker

    monkeypatch.setenv("PATH", f"{fake_docker(tmp_path / 'bin', daemon=False)}:/usr/bin:/bin")
    for extra in (["--dry-run"], []):
        rc = main(["container", "build", str(HELLO), "--target", "gfx1151", "--backend", "nope",
                   "--engine", "docker", *extra])
        assert rc == ToolchainError.exit_code, capsys.readouterr().err


def test_engine_dry_run_with_a_working_engine_exits_0(tmp_path, capsys, docker_ok):
    from fake_engines import calls

    for action in ("build", "run"):
        assert main(["container", action, str(HELLO), "--target", "gfx1151", "--backend", "cpu",
                     "--engine", "docker", "--dry-run", "--", "true"][: None if action == "run" else -2]) == 0
        assert "cannot" not in capsys.readouterr().out
    asked = calls(docker_ok)
    assert asked and all(c.startswith(("buildx version", "version --format")) for c in asked), asked


def test_daemonless_engines_need_no_check():
    assert container_engines.engine_problems(container_engines.get_engine("buildah"), building=True) == []
    assert container_engines.engine_problems(container_engines.get_engine("podman"), building=True) == []


# -- an installed rocforge (`pip install .`, not editable) puts itself into the image --------------
@pytest.mark.slow  # two real venvs and pip installs (~45 s)
def test_installed_rocforge_ships_its_own_wheel(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    a = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "venv", str(a)], check=True)
    subprocess.run([str(a / "bin/pip"), "install", "-q", str(repo)], check=True)
    site = subprocess.run([str(a / "bin/python"), "-c", "import rocforge_build, pathlib; "
                           "print(pathlib.Path(rocforge_build.__file__).parent.parent)"],
                          capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert not (Path(site) / "pyproject.toml").exists()  # no checkout: what the README's install gives
    # the command pip installed is bin/rocforge, its interpreter line pointed at this venv
    installed = (a / "bin/rocforge").read_text().split("\n", 1)
    assert installed[0].startswith(f"#!{a / 'bin/python'}")
    assert installed[1] == (repo / "bin/rocforge").read_text().split("\n", 1)[1]
    env = {**os.environ, "PATH": f"{a / 'bin'}:{os.environ['PATH']}"}
    dry = subprocess.run([str(a / "bin/rocforge"), "container", "build", str(HELLO), "--target", "gfx1151",
                          "--backend", "cpu", "--engine", "buildah", "--dry-run"], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    wheels = tmp_path / "wheels"
    ctx = tmp_path / "ctx"
    made = subprocess.run([str(a / "bin/python"), "-c", (
        "import sys; from pathlib import Path; from rocforge_build.ship import containers as c; "
        "from rocforge_build.ship import container_context as cc; "
        f"p = c.plan({str(HELLO)!r}, target='gfx1151', backend='cpu'); cc.prepare_context(p, Path({str(ctx)!r}))")],
        capture_output=True, text=True, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    shutil.copytree(ctx / "wheels", wheels)
    ours = list(wheels.glob("rocforge-*.whl"))
    assert len(ours) == 1 and ours[0].name == "rocforge-0.1.0-py3-none-any.whl"
    import zipfile

    with zipfile.ZipFile(ours[0]) as zf:
        names = set(zf.namelist())
    assert {"rocforge_build/cli.py", "rocforge_build/_data/recipes/llama-cpp.toml",
            "rocforge_build/_data/containers/Containerfile.in", "rocforge_build/data/bundle.toml",
            "rocforge-0.1.0.data/scripts/rocforge", "rocforge-0.1.0.dist-info/RECORD"} <= names
    with zipfile.ZipFile(ours[0]) as zf:  # the installer's interpreter line is not the image's
        assert zf.read("rocforge-0.1.0.data/scripts/rocforge").startswith(b"#!python\n")
    assert not any(n.endswith(".pyc") or "direct_url.json" in n for n in names)
    # the builder's install: offline, from the context's wheels only; then the program runs
    b = tmp_path / "builder"
    subprocess.run([sys.executable, "-m", "venv", str(b)], check=True)
    subprocess.run([str(b / "bin/pip"), "install", "-q", "--no-index", "--find-links", str(wheels), "rocforge"],
                   check=True)
    listed = subprocess.run([str(b / "bin/rocforge"), "recipes"], capture_output=True, text=True, cwd=tmp_path)
    assert listed.returncode == 0 and "llama-cpp" in listed.stdout, listed.stderr


def test_an_engine_step_that_fails_is_one_build_error_naming_the_step_and_its_containerfile(tmp_path, capfd):
    with pytest.raises(BuildError) as got:
        container_engines.run_step(["sh", "-c", "echo building; exit 3"], "image build (builder and runtime stages)",
                                   tmp_path / "Containerfile", quiet_stdout=True)
    assert got.value.message == "container build failed in the image build (builder and runtime stages) (exit code 3)"
    assert got.value.hint == f"the engine's output above names the failing step; the Containerfile is {tmp_path / 'Containerfile'}"
    out, err = capfd.readouterr()
    # with --json, stdout carries only the JSON: the engine's own output goes to stderr
    assert out == "" and "building" in err and err.startswith("rocforge: image build (builder and runtime stages): sh -c")
