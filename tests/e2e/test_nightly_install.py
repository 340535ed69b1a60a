"""`rocforge nightly install|installed|use|prune` end to end against a real HTTP server on
127.0.0.1 serving generated TheRock tarballs; every fault leaves `current` and the other
installs as they were and nothing outside the prefix."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile

import pytest
from therock_tarballs import Mirror, hostile, make_tarball

from rocforge_build import cli, download, download_policy, extract, ownership
from rocforge_build.nightly import install as nightly_install

OLD, NEW = "7.10.0a20251021", "7.10.0a20251101"


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(download_policy, "_sleep", lambda s: None)


MTIME = {OLD: 1761030000.0, NEW: 1761980000.0}


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """gfx1151 and gfx110X-all tarballs of two nightlies, generated once per session."""
    work = tmp_path_factory.mktemp("tarballs")
    archives = {}
    for group, targets_ in (("gfx1151", ["gfx1151"]), ("gfx110X-all", ["gfx1100", "gfx1101"])):
        for version in (OLD, NEW):
            # one archive large enough for a resume to keep whole network chunks
            payload = 600_000 if (group, version) == ("gfx1151", NEW) else 0
            archives[(group, version)] = make_tarball(work, group, version, targets_,
                                                      payload=payload)
    return archives


@pytest.fixture
def site(http_server, built, capsys):
    """A CDN folder serving the tarballs, and the config pointed at it (as a user following a
    hosting move would)."""
    mirror = Mirror(http_server, "/tarball/")
    archives = dict(built)
    for (_group, version), arch in archives.items():
        mirror.add_file(arch, MTIME[version])
    assert cli.main(["config", "set", "nightly.sources.cdn.url", mirror.url]) == 0
    assert cli.main(["config", "set", "nightly.use", '["cdn"]']) == 0
    capsys.readouterr()
    return mirror, archives


@pytest.fixture
def prefix(tmp_path):
    return tmp_path / "rocm"


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def state(tmp_path, prefix):
    """Everything observable: the files under tmp_path except the test's own work folder."""
    out = []
    for p in sorted(tmp_path.rglob("*")):
        rel = p.relative_to(tmp_path)
        if rel.parts[0] == "work" or rel.parts[0] == "rocforge-home":
            continue
        out.append((str(rel), os.readlink(p) if p.is_symlink() else None))
    return out


def install(capsys, prefix, *extra):
    return run(capsys, "nightly", "install", "--target", "gfx1151", "--prefix", str(prefix),
               "--no-progress", *extra)


def test_install_latest_then_roll_back_and_prune(site, prefix, capsys):
    _mirror, archives = site
    rc, out, err = install(capsys, prefix, "--version", OLD)
    assert rc == 0, err
    old_dir = f"therock-{OLD}-gfx1151"
    assert os.readlink(prefix / "current") == old_dir  # relative link
    rec = nightly_install.read_record(prefix / old_dir)
    arch = archives[("gfx1151", OLD)]
    assert rec["sha256"] == hashlib.sha256(arch.read_bytes()).hexdigest()
    assert rec["size"] == arch.stat().st_size and rec["version"] == OLD
    assert rec["family"] == "gfx1151" and rec["url"].endswith(arch.name) and rec["date"]
    assert rec["verified"] is False and [layer["family"] for layer in rec["layers"]] == ["gfx1151"]
    assert (prefix / "current/lib/llvm/bin/clang").exists()
    assert (prefix / "current/.info/version").read_text().strip() == OLD
    assert not list((prefix / ".downloads").iterdir())  # archives removed after install
    rc, out, err = install(capsys, prefix)  # latest
    assert rc == 0, err
    new_dir = f"therock-{NEW}-gfx1151"
    assert os.readlink(prefix / "current") == new_dir and f"was {old_dir}" in out
    rc, out, _ = run(capsys, "nightly", "installed", "--prefix", str(prefix), "--json")
    items = json.loads(out)
    assert [(i["name"], i["current"]) for i in items] == [(new_dir, True), (old_dir, False)]
    rc, out, _ = run(capsys, "nightly", "use", OLD, "--prefix", str(prefix))
    assert rc == 0 and os.readlink(prefix / "current") == old_dir
    rc, out, err = run(capsys, "nightly", "use", "9.9.9", "--prefix", str(prefix))
    assert rc == 2 and "not installed" in err and os.readlink(prefix / "current") == old_dir
    (prefix / ".staging-leftover").mkdir()  # from a killed run: marked by extract.staging
    ownership.write_mark(prefix / ".staging-leftover", "a nightly install being unpacked")
    rc, out, _ = run(capsys, "nightly", "prune", "--keep", "0", "--prefix", str(prefix))
    assert f"removed {new_dir}" in out and ".staging-leftover" in out
    assert (prefix / old_dir).is_dir()  # current is always kept
    assert sorted(p.name for p in prefix.iterdir()) == [".downloads", ".lock", "current", old_dir]


def test_reinstall_is_a_switch_and_dry_run_downloads_nothing(site, prefix, capsys, http_server):
    install(capsys, prefix, "--version", OLD)
    install(capsys, prefix, "--version", NEW)
    n = len(http_server.requests)
    rc, _, err = install(capsys, prefix, "--version", OLD)
    assert rc == 0 and "already installed" in err
    assert os.readlink(prefix / "current") == f"therock-{OLD}-gfx1151"
    assert all(p.endswith("/tarball/") for _m, p, _h in http_server.requests[n:])
    rc, out, _ = install(capsys, prefix, "--dry-run", "--json")
    plan = json.loads(out)
    assert plan["version_dir"] == f"therock-{NEW}-gfx1151" and len(plan["layers"]) == 1


def test_layered_install_seed_004(site, prefix, capsys):
    rc, out, err = install(capsys, prefix, "--layer", "--json")
    assert rc == 0, err
    name = f"therock-{NEW}-gfx110X-all+gfx1151"
    assert os.readlink(prefix / "current") == name
    lib = prefix / name / "lib/rocblas/library"
    assert {p.name for p in lib.glob("TensileLibrary_lazy_*")} == {
        f"TensileLibrary_lazy_{t}.dat" for t in ("gfx1100", "gfx1101", "gfx1151")}
    rec = json.loads(out)["record"]
    assert [layer["family"] for layer in rec["layers"]] == ["gfx110X-all", "gfx1151"]
    assert all(len(layer["sha256"]) == 64 for layer in rec["layers"])
    # the top layer wins where both have a file
    assert json.loads((prefix / name / "share/therock/dist_info.json").read_text())[
        "dist_amdgpu_targets"] == "gfx1151"


def test_published_checksum_is_verified(site, prefix, capsys):
    mirror, archives = site
    arch = archives[("gfx1151", NEW)]
    digest = hashlib.sha256(arch.read_bytes()).hexdigest()
    mirror.server.add(f"/tarball/{arch.name}.sha256", f"{digest}  {arch.name}\n")
    rc, out, err = install(capsys, prefix)
    assert rc == 0, err
    assert "verified against published checksum" in out
    rec = nightly_install.read_record(prefix / "current")
    assert rec["verified"] is True and rec["layers"][0]["checksum"].startswith("published at")


def _installed_old(capsys, prefix):
    rc, _, err = install(capsys, prefix, "--version", OLD)
    assert rc == 0, err
    return f"therock-{OLD}-gfx1151"


def test_checksum_mismatch_changes_nothing(site, prefix, capsys, tmp_path):
    mirror, archives = site
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    arch = archives[("gfx1151", NEW)]
    mirror.server.add(f"/tarball/{arch.name}.sha256", "0" * 64 + f"  {arch.name}\n")
    rc, _, err = install(capsys, prefix)
    assert rc == 7 and "sha256 is" in err and "hint" in err
    assert os.readlink(prefix / "current") == old
    assert state(tmp_path, prefix) == before


def test_dropped_connection_and_http_500_are_survived(site, prefix, capsys, http_server):
    _mirror, archives = site
    arch = archives[("gfx1151", NEW)]
    path = f"/tarball/{arch.name}"
    http_server.fail(path, status=500)
    http_server.fail(path, drop_after=arch.stat().st_size // 3)
    rc, out, err = install(capsys, prefix)
    assert rc == 0, err
    gets = http_server.gets(path)
    assert len(gets) == 3 and gets[2]["Range"].startswith("bytes=")
    rec = nightly_install.read_record(prefix / "current")
    assert rec["sha256"] == hashlib.sha256(arch.read_bytes()).hexdigest()


def test_network_gives_up_keeps_part_for_resume(site, prefix, capsys, http_server, tmp_path):
    _mirror, archives = site
    old = _installed_old(capsys, prefix)
    arch = archives[("gfx1151", NEW)]
    path = f"/tarball/{arch.name}"
    for _ in range(5):
        http_server.fail(path, drop_after=4096)
    rc, _, err = install(capsys, prefix)
    assert rc == 6 and "resumes" in err
    assert os.readlink(prefix / "current") == old
    part = prefix / ".downloads" / (arch.name + ".part")
    assert part.stat().st_size >= 4096  # inside the prefix, for the next run
    assert not [p for p in prefix.iterdir() if p.name.startswith(".staging")]
    rc, _, err = install(capsys, prefix)
    assert rc == 0, err
    assert any("Range" in h for h in http_server.gets(path)[-1:])


@pytest.mark.parametrize("kind", ["truncated", "dotdot", "symlink", "absolute", "not-rocm"])
def test_bad_archives_change_nothing(site, prefix, capsys, tmp_path, kind):
    mirror, archives = site
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    arch = archives[("gfx1151", NEW)]
    if kind == "truncated":
        data = arch.read_bytes()[: arch.stat().st_size * 2 // 3]
    else:
        members = {
            "dotdot": [("dir", "bin"), ("file", "../../escaped.txt", b"pwned")],
            "symlink": [("dir", "lib"), ("symlink", "lib/out", "../../../.."),
                        ("file", "bin/x", b"x")],
            "absolute": [("file", str(tmp_path / "abs-escaped.txt"), b"pwned")],
            "not-rocm": [("file", "README", b"hello")],
        }[kind]
        data = hostile(tmp_path / "work" / "bad.tar.gz", members).read_bytes()
    mirror.add(arch.name, data, 1761980000.0)
    rc, _, err = install(capsys, prefix)
    assert rc == 7, err
    assert os.readlink(prefix / "current") == old
    assert state(tmp_path, prefix) == before  # nothing new anywhere, the bad archive removed


def test_disk_full_checked_first(site, prefix, capsys, tmp_path, monkeypatch, http_server):
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    monkeypatch.setattr(download, "free_bytes", lambda path: 1000)
    n = len(http_server.requests)
    rc, _, err = install(capsys, prefix)
    assert rc == 10 and "not enough free space" in err and "prune" in err
    assert not any(p.endswith(".tar.gz") and m == "GET"
                   for m, p, _h in http_server.requests[n:])
    assert os.readlink(prefix / "current") == old and state(tmp_path, prefix) == before


def test_disk_full_while_unpacking(site, prefix, capsys, tmp_path, monkeypatch):
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    real = tarfile.TarFile.makefile
    calls = {"n": 0}

    def full(self, tarinfo, targetpath):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(self, tarinfo, targetpath)

    monkeypatch.setattr(tarfile.TarFile, "makefile", full)
    rc, _, err = install(capsys, prefix)
    assert rc == 10 and "no space left while unpacking" in err
    assert os.readlink(prefix / "current") == old
    after = [s for s in state(tmp_path, prefix) if ".downloads/" not in s[0]]
    assert after == [s for s in before if ".downloads/" not in s[0]]


def test_ctrl_c_during_extraction(site, prefix, capsys, tmp_path, monkeypatch):
    old = _installed_old(capsys, prefix)
    real = extract.safe_extract

    def interrupted(archive, dest, on_member=None):
        def hook(member):
            if member.name.endswith("hipconfig"):
                assert any(p.name.startswith(".staging-") for p in prefix.iterdir())
                raise KeyboardInterrupt
        return real(archive, dest, on_member=hook)

    monkeypatch.setattr(extract, "safe_extract", interrupted)
    rc, _, err = install(capsys, prefix)
    assert rc == 130 and "interrupted" in err
    assert os.readlink(prefix / "current") == old
    assert not [p for p in prefix.iterdir() if p.name.startswith((".staging", "therock-7.10.0a2025110"))]


def test_concurrent_install_is_refused(site, prefix, capsys):
    with nightly_install.locked(prefix):
        rc, _, err = install(capsys, prefix)
    assert rc == 1 and "another rocforge" in err


def test_default_prefix_and_configured_prefix(site, capsys, tmp_path, http_server):
    from rocforge_build import paths

    mirror, archives = site
    arch = archives[("gfx1151", NEW)]
    http_server.fail(f"/tarball/{arch.name}.sha256", status=403)  # S3/CloudFront's "missing"
    rc, out, err = run(capsys, "nightly", "install", "--target", "gfx1151", "--no-progress")
    assert rc == 0, err
    assert os.readlink(paths.nightly_prefix() / "current") == f"therock-{NEW}-gfx1151"
    mine = tmp_path / "opt-rocm"
    run(capsys, "config", "set", "nightly.prefix", str(mine))
    rc, out, err = run(capsys, "nightly", "install", "--target", "gfx1151", "--version", OLD,
                       "--no-progress")
    assert rc == 0, err
    assert os.readlink(mine / "current") == f"therock-{OLD}-gfx1151"
    rc, out, _ = run(capsys, "nightly", "installed")
    assert f"* therock-{OLD}-gfx1151" in out and str(mine) in out


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_real_signal_during_download_keeps_current_and_part(site, prefix, capsys, http_server,
                                                           tmp_path, sig):
    import signal
    import subprocess
    import sys
    import time

    mirror, archives = site
    old = _installed_old(capsys, prefix)
    arch = archives[("gfx1151", NEW)]
    http_server.fail(f"/tarball/{arch.name}", drop_after=200_000, delay=0.0)
    http_server.fail(f"/tarball/{arch.name}", delay=30)  # the retry hangs: signal it there
    from pythons import env_for

    env = env_for(sys.executable)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocforge_build", "nightly", "install", "--target", "gfx1151",
         "--prefix", str(prefix), "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = prefix / ".downloads" / (arch.name + ".part")
    deadline = time.monotonic() + 20
    while len(http_server.gets(f"/tarball/{arch.name}")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(getattr(signal, sig))
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "interrupted" in err
    assert os.readlink(prefix / "current") == old
    assert part.stat().st_size > 0  # resumable
    assert not [p for p in prefix.iterdir() if p.name.startswith((".staging", ".current-"))]


def test_root_maps_the_prefix_inside_it(site, capsys, tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    rc, out, err = run(capsys, "--root", str(image), "nightly", "install", "--target", "gfx1151",
                       "--prefix", "/opt/rocm-nightly", "--no-progress")
    assert rc == 0, err
    assert os.readlink(image / "opt/rocm-nightly/current") == f"therock-{NEW}-gfx1151"
    assert f"installed /opt/rocm-nightly/therock-{NEW}-gfx1151" in out


def test_env_and_doctor_find_the_install_without_flags(site, capsys, tmp_path, monkeypatch):
    """The layout contract with installs.find_installs: after `nightly install`, `rocforge env`
    and `doctor` pick `<prefix>/current` with no flag, and `nightly use` switches them (through
    env's output cache, which must notice the `current` link moving)."""
    import fixtures_roots as fr

    root = tmp_path / "machine"
    fr.make_gpus(root, fr.STRIX_HALO)
    fr.make_system(root)
    data = root / "home/alice/.local/share/rocforge"
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(data))
    inner = "/home/alice/.local/share/rocforge/rocm"
    rc, _out, err = run(capsys, "--root", str(root), "env", "--shell", "json")
    assert rc == 4 and "rocforge nightly install --target gfx1151" in err  # nothing yet
    for version in (OLD, NEW):
        rc, out, err = run(capsys, "--root", str(root), "nightly", "install", "--target",
                           "gfx1151", "--version", version, "--no-progress")
        assert rc == 0, err
        assert f"installed {inner}/therock-{version}-gfx1151" in out
    rc, out, err = run(capsys, "--root", str(root), "env", "--shell", "json")
    assert rc == 0, err
    env = json.loads(out)
    assert env["ROCM_PATH"] == f"{inner}/current"
    assert env["HSA_OVERRIDE_GFX_VERSION"] is None  # the nightly has gfx1151 kernels
    rc, out, err = run(capsys, "--root", str(root), "doctor", "--json")
    assert rc == 0, err
    rocm = json.loads(out)["rocm"]
    assert rocm["path"] == f"{inner}/current" and rocm["nightly_current"] is True
    assert rocm["version"] == NEW and rocm["family"] == "gfx1151"
    for _ in range(2):  # the second answer comes from env's output cache
        rc, out, err = run(capsys, "--root", str(root), "env", "--shell", "bash")
        assert rc == 0 and f"ROCm {inner}/current (therock {NEW})" in out.splitlines()[0]
    # roll back: env (cached a moment ago) and doctor follow the link at once
    rc, out, err = run(capsys, "--root", str(root), "nightly", "use", OLD)
    assert rc == 0, err
    rc, out, err = run(capsys, "--root", str(root), "env", "--shell", "bash")
    assert rc == 0 and f"ROCm {inner}/current (therock {OLD})" in out.splitlines()[0]
    rc, out, err = run(capsys, "--root", str(root), "doctor", "--json")
    assert json.loads(out)["rocm"]["version"] == OLD


def test_env_follows_a_configured_nightly_prefix(site, capsys, tmp_path, monkeypatch):
    """`rocforge config set nightly.prefix DIR` moves installs; env finds them there, and its
    output cache notices the config change (host root, prefix outside the data dir)."""
    import fixtures_roots as fr

    root = tmp_path / "machine"
    fr.make_gpus(root, fr.STRIX_HALO)
    fr.make_system(root)
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(root / "home/alice/.local/share/rocforge"))
    rc, _out, err = run(capsys, "--root", str(root), "env", "--shell", "json")
    assert rc == 4, err  # cached "no ROCm" answer from here on, until something changes
    rc, _out, err = run(capsys, "config", "set", "nightly.prefix", "/srv/rocm-nightlies")
    assert rc == 0, err
    rc, out, err = run(capsys, "--root", str(root), "nightly", "install", "--target", "gfx1151",
                       "--version", NEW, "--no-progress")
    assert rc == 0, err
    assert f"installed /srv/rocm-nightlies/therock-{NEW}-gfx1151" in out
    rc, out, err = run(capsys, "--root", str(root), "env", "--shell", "json")
    assert rc == 0, err
    assert json.loads(out)["ROCM_PATH"] == "/srv/rocm-nightlies/current"


# -- attacks from the hostile-input trial, on both Pythons (the real CLI in a subprocess) ------

from pythons import PYTHONS, python_version, rocforge  # noqa: E402


def _serve_new(mirror, data):
    """Publish `data` as the newest gfx1151 nightly (the one a plain install picks)."""
    from therock_tarballs import tarball_name

    mirror.add(tarball_name("gfx1151", NEW), data, MTIME[NEW])


def _cli_install(python, prefix, *extra, **kw):
    return rocforge(python, "nightly", "install", "--target", "gfx1151", "--prefix", str(prefix),
                    "--no-progress", *extra, **kw)


def _one_line_error(proc, code):
    print(proc.stderr)
    assert proc.returncode == code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rocforge: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and "internal error" not in \
        proc.stderr, proc.stderr
    return errors[0]


_TREE = [("dir", "bin"), ("dir", "lib"), ("file", "bin/hipconfig", b"#!/bin/sh\n")]


@pytest.mark.parametrize("python", PYTHONS)
def test_late_link_escape_writes_nothing_outside(site, prefix, capsys, tmp_path, python):
    """`rocforge-install.toml -> q/q/../../victim.txt` passes every check made while unpacking
    (q does not exist yet, so it reads as `victim.txt`); then `q -> .` makes it climb out of the
    staging dir. Before the fix rocforge wrote its record through it, outside the prefix."""
    mirror, _ = site
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    bad = hostile(tmp_path / "work" / "late.tar.gz", _TREE + [
        ("symlink", "rocforge-install.toml", "q/q/../../victim.txt"), ("symlink", "q", ".")])
    _serve_new(mirror, bad.read_bytes())
    line = _one_line_error(_cli_install(python, prefix), 7)
    assert "resolves outside the tree" in line
    assert not (tmp_path / "victim.txt").exists() and not os.path.lexists(tmp_path / "victim.txt")
    assert os.readlink(prefix / "current") == old and state(tmp_path, prefix) == before


@pytest.mark.parametrize("python", PYTHONS)
def test_late_link_to_the_real_etc_is_refused(site, prefix, capsys, tmp_path, python):
    """`lib/esc -> ../q/q/.../../etc` (as many `..` as `q`s: lexically `etc`, inside) with
    `q -> .` added after: on disk it climbs to the filesystem root and lands on the real /etc."""
    mirror, _ = site
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    depth = len(tmp_path.parts) + 4
    target = "../" + "q/" * depth + "../" * depth + "etc"
    bad = hostile(tmp_path / "work" / "etc.tar.gz", _TREE + [
        ("symlink", "lib/esc", target), ("symlink", "q", ".")])
    _serve_new(mirror, bad.read_bytes())
    line = _one_line_error(_cli_install(python, prefix), 7)
    assert "lib/esc" in line and "resolves outside" in line
    assert os.readlink(prefix / "current") == old and state(tmp_path, prefix) == before


def _tar_with_modes(dest):
    """A ROCm-looking tree whose members carry a root-owned 6777 file, a foreign-owned
    world-writable file, a sticky 1777 directory and a 0700 directory."""
    import io

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for name, kind, mode, uid in (("bin", "dir", 0o700, 0), ("lib", "dir", 0o1777, 4242),
                                      ("bin/hipconfig", "file", 0o6777, 0),
                                      ("lib/libfoo.so", "file", 0o666, 4242)):
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = mode, uid, uid
            info.uname = info.gname = "root" if uid == 0 else "mallory"
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return dest


@pytest.mark.parametrize("python", PYTHONS)
def test_archive_modes_and_owners_are_not_applied(site, prefix, tmp_path, python):
    """On Debian's 3.11.2 the archive's 6777 root-owned member used to install setuid-root and
    world-writable, and members kept foreign uids; under umask 077 the tree was 0700.  Now: no
    setuid/setgid/sticky, no group/other write, owned by the user running rocforge, dirs 0755."""
    import stat

    mirror, _ = site
    _serve_new(mirror, _tar_with_modes(tmp_path / "work" / "modes.tar.gz").read_bytes())
    proc = _cli_install(python, prefix, umask=0o077)
    assert proc.returncode == 0, proc.stderr
    tree = prefix / f"therock-{NEW}-gfx1151"
    seen = {}
    for p in [tree, *tree.rglob("*")]:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            continue
        seen[str(p.relative_to(tree))] = stat.S_IMODE(st.st_mode)
        assert st.st_uid == os.getuid() and st.st_gid == os.getgid(), p
    assert seen == {".": 0o755, "bin": 0o755, "lib": 0o755, "bin/hipconfig": 0o755,
                    "lib/libfoo.so": 0o644, "rocforge-install.toml": 0o644}, python_version(python)


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1:]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("damage", ["crc", "isize", "trailing-garbage", "flipped-data"])
def test_corrupted_gzip_is_refused(site, prefix, capsys, tmp_path, python, damage):
    """TheRock publishes no checksums: the gzip trailer is the only end-to-end check.  A flipped
    bit used to install a corrupted tree with exit 0 (tarfile stops at the tar end marker and
    never reads the trailer); now the integrity exit code (7) and one line."""
    mirror, archives = site
    old = _installed_old(capsys, prefix)
    before = state(tmp_path, prefix)
    data = archives[("gfx1151", NEW)].read_bytes()
    bad = {"crc": lambda d: _flip(d, len(d) - 8), "isize": lambda d: _flip(d, len(d) - 4),
           "trailing-garbage": lambda d: d + b"<html>not a gzip member</html>",
           # a byte inside the random payload's stored blocks: inflates fine, CRC differs
           "flipped-data": lambda d: _flip(d, len(d) // 2)}[damage](data)
    _serve_new(mirror, bad)
    line = _one_line_error(_cli_install(python, prefix), 7)
    assert "truncated or corrupt" in line
    if damage == "crc":  # (a flipped data byte is most often a CRC mismatch too, or bad deflate)
        assert "CRC32" in line
    assert os.readlink(prefix / "current") == old and state(tmp_path, prefix) == before


def _mount_ns() -> list[str] | None:
    """A private mount namespace (unprivileged via a user namespace when not root), or None."""
    import shutil
    import subprocess

    unshare = shutil.which("unshare")
    if not unshare:
        return None
    cmd = [unshare, "--mount", "--propagation", "private"]
    if os.getuid() != 0:
        cmd.insert(1, "--map-root-user")
    ok = subprocess.run([*cmd, "true"], capture_output=True)
    return cmd if ok.returncode == 0 else None


def _zero_bomb(dest, size):
    """One member of `size` zero bytes: a few hundred kB of gzip."""
    import io

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz", compresslevel=9) as tar:
        for name in ("bin", "lib"):
            d = tarfile.TarInfo(name)
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(d)
        info = tarfile.TarInfo("lib/libzero.so")
        info.size, info.mode = size, 0o644
        tar.addfile(info, io.BufferedReader(Zeros(size)))
    return dest


@pytest.mark.parametrize("python", PYTHONS)
def test_zero_bomb_is_refused_before_the_disk_fills(site, tmp_path, python):
    """A 96 MB member of zeros (under 100 kB of gzip) into a 16 MiB tmpfs: the archive passes
    the up-front space check (archive x (1 + extract_ratio)), and is refused from its tar
    header's declared size, by the real statvfs of the real small filesystem."""
    ns = _mount_ns()
    if ns is None:
        pytest.skip("LOUD SKIP: cannot make a mount namespace here (unshare missing or user "
                    "namespaces disabled); the zero-bomb test needs a small real filesystem")
    mirror, _ = site
    bomb = _zero_bomb(tmp_path / "work" / "bomb.tar.gz", 96_000_000)
    assert bomb.stat().st_size < 200_000
    _serve_new(mirror, bomb.read_bytes())
    small = tmp_path / "small"
    small.mkdir()
    import shlex

    script = (f"mount -t tmpfs -o size=16m tmpfs {shlex.quote(str(small))} && "
              '"$@"; rc=$?; df -B1 --output=used "$0" | tail -1 >&2; '
              'echo $(ls -A "$0/rocm") >&2; exit $rc')
    proc = rocforge(python, "nightly", "install", "--target", "gfx1151",
                    "--prefix", str(small / "rocm"), "--no-progress",
                    wrap=[*ns, "sh", "-c", script, str(small)])
    line = _one_line_error(proc, 10)
    assert "member lib/libzero.so declares 96.0 MB but only" in line
    assert "stopped before filling the disk" in line
    tail = proc.stderr.splitlines()
    assert ".lock" in tail[-1] or ".downloads" in tail[-1]  # no staging dir, no version dir
    assert "therock-" not in tail[-1] and ".staging" not in tail[-1]
    # what the tmpfs held at the end: the archive (kept for a retry) and nothing else to speak of
    assert int(tail[-2].strip()) < 1_000_000, tail[-2]


# -- one clear line where an internal error used to be (in process: same code, both Pythons
#    are covered by the tests above) -----------------------------------------------------------

@pytest.mark.parametrize("where", ["file", "below-file"])
def test_prefix_at_or_below_a_file(site, capsys, tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    prefix = blocker if where == "file" else blocker / "rocm"
    for argv in (("install", "--target", "gfx1151", "--no-progress"), ("use", OLD),
                 ("prune",)):
        rc, _out, err = run(capsys, "nightly", *argv, "--prefix", str(prefix))
        assert rc == 2 and "rocforge: error:" in err and "internal error" not in err, err
        assert ("is a file" if where == "file" else "which is a file") in err
    assert blocker.read_text() == "mine"


def test_read_only_prefix_is_one_line(site, tmp_path):
    """A read-only filesystem (a bind mount remounted ro, in a private mount namespace)."""
    import shlex
    import sys

    ns = _mount_ns()
    if ns is None:
        pytest.skip("LOUD SKIP: cannot make a mount namespace here (unshare missing or user "
                    "namespaces disabled)")
    ro = tmp_path / "ro"
    (ro / "rocm").mkdir(parents=True)
    q = shlex.quote(str(ro))
    script = f'mount --bind {q} {q} && mount -o remount,bind,ro {q} {q} && exec "$@"'
    for argv in (("install", "--target", "gfx1151"), ("use", OLD), ("prune",)):
        proc = rocforge(sys.executable, "nightly", *argv, "--prefix", str(ro / "rocm"),
                        wrap=[*ns, "sh", "-c", script, "sh"])
        line = _one_line_error(proc, 2)
        assert "cannot write to the prefix" in line and "Read-only file system" in line


def test_current_that_is_a_real_directory_is_left_alone(site, prefix, capsys, http_server):
    (prefix / "current").mkdir(parents=True)
    (prefix / "current" / "notes.txt").write_text("mine")
    n = len(http_server.requests)
    rc, _out, err = install(capsys, prefix)
    assert rc == 2 and "current is a directory, not the link" in err, err
    assert not any(p.endswith(".tar.gz") for _m, p, _h in http_server.requests[n:])
    assert (prefix / "current" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("record", [None, "[x]\n"])  # none, or one that does not validate
@pytest.mark.parametrize("force", [False, True])
def test_version_dir_rocforge_did_not_make_is_left_alone(site, prefix, capsys, http_server, force,
                                                        record):
    mine = prefix / f"therock-{NEW}-gfx1151"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    if record is not None:
        (mine / "rocforge-install.toml").write_text(record)
    n = len(http_server.requests)
    rc, _out, err = install(capsys, prefix, *(["--force"] if force else []))
    assert rc == 2 and "is not an install rocforge made" in err, err
    assert not any(p.endswith(".tar.gz") for _m, p, _h in http_server.requests[n:])
    assert (mine / "notes.txt").read_text() == "mine" and not os.path.lexists(prefix / "current")


def test_record_with_wrong_types_breaks_nothing_else(site, prefix, capsys):
    old = _installed_old(capsys, prefix)
    rc, _out, err = install(capsys, prefix)
    assert rc == 0, err
    (prefix / old / "rocforge-install.toml").write_text(
        'version = 7\nbuild_date = 20251021\ndate = ["x"]\nlayers = "gfx1151"\n')
    rc, out, err = run(capsys, "nightly", "installed", "--prefix", str(prefix))
    assert rc == 0 and old in out and "wrong type: build_date, date, layers, version" in out, err
    rc, out, err = run(capsys, "nightly", "installed", "--prefix", str(prefix), "--json")
    assert rc == 0 and {i["name"] for i in json.loads(out)} == {old, f"therock-{NEW}-gfx1151"}
    rc, out, err = run(capsys, "nightly", "prune", "--keep", "0", "--prefix", str(prefix))
    assert rc == 0 and f"removed {old}" not in out and "does not validate" in err, err
    assert (prefix / old / "rocforge-install.toml").is_file()  # nothing proves it rocforge's


def test_directory_inside_downloads(site, prefix, capsys):
    from therock_tarballs import tarball_name

    mine = prefix / ".downloads" / tarball_name("gfx1151", NEW)
    (mine / "sub").mkdir(parents=True)
    rc, _out, err = install(capsys, prefix)
    assert rc == 2 and "is not a file rocforge downloaded" in err and mine.is_dir(), err
    rc, out, err = run(capsys, "nightly", "prune", "--prefix", str(prefix))
    assert rc == 0 and "left" in err and (mine / "sub").is_dir(), err


def test_complete_archive_is_reused_after_interrupted_extraction(site, prefix, capsys,
                                                                 monkeypatch, http_server):
    """Ctrl-C while unpacking, then the same install again: the archive in .downloads is
    complete (size from HEAD: TheRock's CDN page lists no sizes) and is not fetched again."""
    _mirror, archives = site
    path = f"/tarball/{archives[('gfx1151', NEW)].name}"
    real = extract.safe_extract

    def interrupted(archive, dest, **kw):
        def hook(member):
            if member.name.endswith("hipconfig"):
                raise KeyboardInterrupt
        return real(archive, dest, on_member=hook)

    monkeypatch.setattr(extract, "safe_extract", interrupted)
    rc, _, err = install(capsys, prefix)
    assert rc == 130
    monkeypatch.setattr(extract, "safe_extract", real)
    rc, _, err = install(capsys, prefix)
    assert rc == 0 and "reusing" in err, err
    assert len(http_server.gets(path)) == 1
    assert any(m == "HEAD" and p == path for m, p, _h in http_server.requests)


def test_trickling_server_hits_the_configured_deadline(site, prefix, capsys, http_server):
    _mirror, archives = site
    old = _installed_old(capsys, prefix)
    path = f"/tarball/{archives[('gfx1151', NEW)].name}"
    for key, value in (("download.min_rate", "1000"), ("download.rate_window", "1"),
                       ("download.attempts", "2")):
        assert run(capsys, "config", "set", key, value)[0] == 0
    for _ in range(2):
        http_server.fail(path, trickle=0.05)
    rc, _, err = install(capsys, prefix)
    assert rc == 6 and "too slow" in err and "retrying in" in err, err
    assert os.readlink(prefix / "current") == old


def test_sha256_validation_and_wording(site, prefix, capsys, http_server, monkeypatch):
    _mirror, archives = site
    n = len(http_server.requests)
    rc, _, err = install(capsys, prefix, "--sha256", "abc123")
    assert rc == 2 and "not a sha256 (64 hexadecimal digits)" in err
    assert http_server.requests[n:] == []  # refused before anything was asked of the network
    digest = hashlib.sha256(archives[("gfx1151", NEW)].read_bytes()).hexdigest()
    rc, out, err = install(capsys, prefix, "--sha256", digest.upper())
    assert rc == 0 and "verified against the sha256 you gave" in out and "published" not in out
    monkeypatch.setattr(download, "free_bytes", lambda path: 1000)
    rc, _, err = install(capsys, prefix, "--version", OLD)
    assert rc == 10 and "kB needed (archive + unpacked tree), 1.0 kB free" in err, err


def test_offline_fails_fast_with_a_warning_per_source(capsys, monkeypatch):
    slept = []
    monkeypatch.setattr(download_policy, "_sleep", slept.append)
    used = ("repo-nightly", "cdn", "cdn-multiarch")  # the default `nightly.use`, in order
    for name in used:
        run(capsys, "config", "set", f"nightly.sources.{name}.url",
            f"https://{name}.rocforge-test.invalid/tarball/")
    rc, _out, err = run(capsys, "nightly", "list", "--target", "gfx1151")
    assert rc == 6 and slept == [], err
    warnings = [line for line in err.splitlines() if "warning: source skipped" in line]
    assert [w.split("source skipped: ")[1].split(":")[0] for w in warnings] == list(used)
    assert "cannot resolve the host name 'cdn.rocforge-test.invalid'" in warnings[1]
    assert "none of the 3 nightly sources could be read" in err
    run(capsys, "config", "set", "nightly.pip.family_index",
        "https://pip.rocforge-test.invalid/v2/{family}/")
    rc, _out, err = run(capsys, "nightly", "pip", "--target", "gfx1151")
    assert rc == 6 and "cannot resolve the host name" in err and slept == [], err


def test_gate_installs_beside_and_switches_when_no_build_used_the_current_one(
        site, prefix, capsys, tmp_path):
    # a real rocforge build in the builds directory, made with the host compilers: it was not
    # built against the current nightly, so the gate leaves it alone and has nothing to refuse
    from buildfixtures import RECIPE, project_copy
    from upgrade_history import tree_hashes

    from rocforge_build import paths

    rc, _, err = install(capsys, prefix, "--version", OLD)
    assert rc == 0, err
    src = project_copy(tmp_path / "src")
    assert cli.main(["build", str(RECIPE), "--target", "gfx1151", "--source", str(src),
                     "--no-recheck"]) == 0
    capsys.readouterr()
    build = next(p for p in paths.builds_prefix().iterdir())
    before = tree_hashes(build)
    rc, out, err = install(capsys, prefix, "--gate", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["switched"] and doc["builds"] == [] and doc["previous"] == f"therock-{OLD}-gfx1151"
    assert os.readlink(prefix / "current") == f"therock-{NEW}-gfx1151"
    assert (prefix / f"therock-{OLD}-gfx1151").is_dir() and tree_hashes(build) == before


@pytest.mark.parametrize("extra", [["--gate", "--run", "$(touch {marker})"],
                                   ["--gate", "--run", ""], ["--gate", "--threshold", "nan"],
                                   ["--gate", "--model", "{absent}"], ["--model", "{absent}"],
                                   ["--run", "true"], ["--gate", "--dry-run"]])
def test_gate_flags_refused_before_anything_is_downloaded(site, prefix, capsys, tmp_path, extra):
    marker = tmp_path / "pwned"
    extra = [e.format(marker=marker, absent=tmp_path / "absent.gguf") for e in extra]
    try:
        rc, _out, err = install(capsys, prefix, *extra)
    except SystemExit as exc:  # argparse's refusal (a value its type function refused)
        rc, (_out, err) = exc.code, capsys.readouterr()
    assert rc == 2 and err.count("rocforge: error:") + err.count("error: argument") == 1, err
    assert not marker.exists() and not prefix.exists()  # nothing listed, fetched or made


def test_unpack_shows_its_layer_and_files_when_not_on_a_terminal(site, prefix, capsys, monkeypatch):
    """Issue 25 item 19: a nightly's unpack (minutes for a real one) prints a plain line every
    interval — `unpack [layer/layers] ELAPSED: NAME: FILES files, SIZE written` — slowed down
    here to 20 ms a member so that 0.1 s lines come."""
    import re
    import time

    monkeypatch.setenv("ROCFORGE_PROGRESS_INTERVAL", "0.1")
    real = extract.safe_extract

    def slow(archive, dest, on_member=None):
        def hook(member):
            time.sleep(0.02)
            on_member(member)
        return real(archive, dest, on_member=hook)

    monkeypatch.setattr(extract, "safe_extract", slow)
    rc, _, err = run(capsys, "nightly", "install", "--target", "gfx1151", "--prefix", str(prefix))
    assert rc == 0, err
    line = re.compile(r"rocforge: unpack \[1/1\] \d+s elapsed: (\S+): (\d+) files, .+ written")
    beats = [m for ln in err.splitlines() if (m := line.fullmatch(ln))]
    assert beats, err
    assert beats[-1][1].startswith("therock-dist-linux-gfx1151-") and int(beats[-1][2]) > 0
