"""`rocforge doctor`: JSON for scripts, exit status, preflight checks on fixture roots."""

import json

import fixtures_roots as fr
from test_commands_env import cli


def doctor(root, *args, env=None):
    out = cli(root, "doctor", "--json", *args, env=env)
    assert "Traceback" not in out.stderr
    return out.returncode, json.loads(out.stdout)


def test_strix_halo_is_usable(tmp_path):
    fr.make_strix_halo(tmp_path)
    code, data = doctor(tmp_path)
    assert code == 0 and data["usable"] and data["target"] == "gfx1151"
    assert data["blockers"] == []
    # the fixture tree's one wrinkle, the broken amdclang++ link TheRock shipped until Mar 2026
    assert data["warnings"] == ["/opt/rocm: /opt/rocm/bin/amdclang++ is a broken link (TheRock "
                                "trees before Mar 2026); using /opt/rocm/lib/llvm/bin"]
    row = next(r for r in data["coverage"] if r["target"] == "gfx1151")
    assert row == {"install": "/opt/rocm", "target": "gfx1151", "kernels": True,
                   "evidence": "rocBLAS has TensileLibrary files for gfx1151", "rocblas": True,
                   "hipblaslt": True, "bitcode": True, "dist_info": True}
    assert any(r["target"] == "gfx1100" and not r["kernels"] for r in data["coverage"])


def test_stale_override_and_igpu_dgpu_warnings(tmp_path):
    fr.make_igpu_dgpu(tmp_path)
    code, data = doctor(tmp_path, env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert code == 0
    assert any(w.startswith("stale HSA_OVERRIDE_GFX_VERSION=10.3.0") for w in data["warnings"])
    assert any(w.startswith("iGPU and dGPU both visible") for w in data["warnings"])
    assert data["env"]["ROCR_VISIBLE_DEVICES"] == "1"


def test_missing_dev_kfd_blocks(tmp_path):
    fr.make_strix_halo(tmp_path)
    (tmp_path / "dev/kfd").unlink()
    code, data = doctor(tmp_path)
    assert code == 1 and not data["usable"]
    assert data["blockers"][0].startswith("/dev/kfd is missing")


def test_dev_kfd_not_accessible_names_the_groups(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path, groups={"render": ("bob",), "video": ()})
    fr.make_therock_tree(tmp_path)
    (tmp_path / "dev/kfd").chmod(0o660)
    code, data = doctor(tmp_path)
    assert code == 1
    blocker = data["blockers"][0]
    assert "render: bob; video: no members" in blocker and "usermod -aG render,video" in blocker


def test_old_kernel_warning(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path, kernel="6.8.0-45-generic")
    fr.make_therock_tree(tmp_path)
    code, data = doctor(tmp_path)
    assert code == 0
    assert data["warnings"][-1:] == [
        "kernel 6.8.0 is older than 6.10, which rocforge recommends for rdna3.5 GPUs: amdkfd "
        "support for GC 11.5.x (Strix Point/Halo) and its APU memory fixes"]


def test_no_rocm_is_not_usable(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path)
    code, data = doctor(tmp_path)
    assert code == 1 and data["rocm"] is None and data["installs"] == []
    # the newcomer trial found `usable: false` with `blockers: []`: every "no" has its reason
    assert data["usable"] is False
    assert data["blockers"] == ["no ROCm install found: install a TheRock nightly: `rocforge "
                                "nightly install --target gfx1151`, or pass --rocm PATH to an "
                                "existing ROCm tree"]
    assert "checks" not in data  # one warnings list and one blockers list, at the top


def test_a_rocm_without_the_targets_kernels_says_so(tmp_path):
    fr.make_gpus(tmp_path, fr.STRIX_HALO)
    fr.make_system(tmp_path)
    fr.make_therock_tree(tmp_path, targets=("gfx1201",))
    code, data = doctor(tmp_path, "--target", "gfx1151")
    assert code == 1 and data["usable"] is False
    assert len(data["blockers"]) == 1
    assert data["blockers"][0].startswith("ROCm /opt/rocm has no kernels for gfx1151 (")


def test_no_gpu_text_says_none_detected_not_from_none(tmp_path):
    fr.make_debian_usr(tmp_path)
    out = cli(tmp_path, "doctor", env={"COLUMNS": "200"})
    assert "GPUs (none detected)" in out.stdout and "from none" not in out.stdout
    assert "no KFD topology under /sys/class/kfd in this --root" in out.stdout


def test_no_gpu_build_host_is_usable(tmp_path):
    fr.make_debian_usr(tmp_path)
    code, data = doctor(tmp_path)
    assert code == 0 and data["gpus"] == [] and data["rocm"]["layout"] == "debian"
    assert data["warnings"] == ["/dev/kfd is missing: the amdgpu kernel driver is not "
                                          "loaded, or the container was started without "
                                          "--device=/dev/kfd --device=/dev/dri"]


def test_rich_tables(tmp_path):
    fr.make_future_gpu(tmp_path)
    fr.make_therock_tree(tmp_path, targets=("gfx1201",))
    out = cli(tmp_path, "doctor", env={"COLUMNS": "200"})
    assert out.returncode == 1, out.stderr
    for text in ("GPUs (from kfd)", "gfx1300", "ROCm installs", "Library coverage per target",
                 "Decisions", "not in rocforge's target table", "not usable"):
        assert text in out.stdout, text


# -- tables never cut a path or a version ---------------------------------------------------------
# TheRock's layout of 2026 nightlies: /opt/rocm/core-10.1, bitcode under lib/llvm/amdgcn/bitcode
LONG_PATH = "/opt/rocm/core-10.1/lib/llvm/amdgcn/bitcode"
LONG_VERSION = "10.1.0a20261102"


def _long_tree(root):
    fr.make_strix_halo(root, version=LONG_VERSION)
    fr.make_therock_tree(root, version=LONG_VERSION, inner="/opt/rocm/core-10.1")


def test_piped_tables_keep_paths_and_versions_whole(tmp_path):
    """COLUMNS=80 and stdout a pipe (a real subprocess): rich would fit the 7-column ROCm table into
    80 columns by cutting cells with "…"; doctor prints plain lines there instead."""
    from test_commands_env import cli_subprocess

    _long_tree(tmp_path)
    out = cli_subprocess(tmp_path, "doctor", env={"COLUMNS": "80"})
    assert "Traceback" not in out.stderr
    assert LONG_PATH in out.stdout and LONG_VERSION in out.stdout and "/opt/rocm/core-10.1" in out.stdout
    assert "…" not in out.stdout
    assert "version: " + LONG_VERSION in out.stdout  # plain `column: value` lines


def test_terminal_at_80_columns_keeps_them_whole(tmp_path):
    """On a real terminal (a pty of 80 columns) too wide a table falls back to plain lines."""
    import fcntl
    import os
    import pty
    import re
    import struct
    import subprocess
    import sys
    import termios

    from test_commands_env import REPO, _base_env

    _long_tree(tmp_path)
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**_base_env(), "COLUMNS": "80", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "rocforge_build", "--root", str(tmp_path), "doctor"],
                            cwd=REPO, env=env, stdin=child, stdout=child, stderr=child)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(parent, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(parent)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))
    text = text.replace("\r\n", "\n")
    assert "Traceback" not in text and "…" not in text
    assert LONG_PATH in text and LONG_VERSION in text
    assert "GPUs (from kfd)" in text  # the narrow GPU table still fits and is drawn as a table
    assert "┃" in text or "│" in text


def test_no_gpu_with_builds_says_why_none_is_used(tmp_path):
    """No GPU and no --target: the builds row used to read `[]` and "used for None"; it says
    that nothing is used, why, and which builds were found (plain lines: a pipe at 80 columns)."""
    from stackfixtures import make_build
    from test_commands_env import cli_subprocess

    fr.make_debian_usr(tmp_path)
    inner = "/" + make_build(tmp_path, "llama-cpp", "gfx1100", files=("bin/llama-cli",)).relative_to(tmp_path).as_posix()
    out = cli_subprocess(tmp_path, "doctor", env={"COLUMNS": "80"})
    assert "Traceback" not in out.stderr
    assert (f"  key: builds; value: none; reason: none used: no GPU target (give --target); "
            f"found: llama-cpp at {inner} (built for gfx1100)") in out.stdout.splitlines()
    for python in ("None", "[]", "True", "False"):
        assert python not in out.stdout, python
    # JSON keeps the data: an empty list
    code, data = doctor(tmp_path)
    assert next(d for d in data["decisions"] if d["key"] == "builds")["value"] == []
