"""tune's ranking and noise-aware settling; presets, their exports, and serve — without builds (the
real runs are in test_verify_shapes.py; verify's coverage and limits are test_measure_verify.py's,
the presets' history test_measure_store.py's).  Each test states the right answer and where it
comes from."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny_gguf import write as write_gguf

from rocforge_build import cli
from rocforge_build.measure import bench, gguf, tune, verify
from rocforge_build.measure.store import Store


@pytest.fixture(scope="module")
def model8k(tmp_path_factory):
    """A llama of 2 layers trained (as its metadata says) at 8192 tokens, like SmolLM2-135M."""
    return gguf.check(write_gguf(tmp_path_factory.mktemp("m") / "m.gguf", n_ctx=8192))


# -- tune: ranking and settling -----------------------------------------------------------------
def rows(pp, tg, depth=0):
    return [{"test": "pp", "depth": depth, "status": "ok", "t_s": pp},
            {"test": "tg", "depth": depth, "status": "ok", "t_s": tg}]


def test_every_measured_variant_is_ranked_for_every_range():
    a, b = bench.Variant(512, True), bench.Variant(256, False)
    cand = tune.Candidate(object())
    cand.measured = {a: rows(100, 100) + rows(50, 50, 4096), b: rows(90, 90) + rows(80, 80, 4096)}
    # each range ranks both, whichever range's search measured them
    assert [v for _, _, v in tune.ranking([cand], 0)] == [a, b]
    assert [v for _, _, v in tune.ranking([cand], 4096)] == [b, a]


def settle_with(first: dict, repeats: dict, default=None, rounds=3):
    cand = tune.Candidate(object())
    cand.measured = {v: rows(s, s) for v, s in first.items()}
    queue = {v: list(r) for v, r in repeats.items()}
    clock = [0.0]

    def remeasure(c, v):
        clock[0] += 1
        score = queue[v].pop(0)
        return rows(score, score)

    out = tune.settle([cand], 0, remeasure, default or {"fa": True, "ubatch": 512}, rounds=rounds,
                      deadline=100.0, clock=lambda: clock[0])
    return out, cand


def test_a_lead_beyond_the_noise_is_kept():
    a, b = bench.Variant(256, True), bench.Variant(512, True)
    out, cand = settle_with({a: 110, b: 100}, {a: [111, 110], b: [100, 101]})
    assert out["ranked"][0][2] == a and "beyond the" in out["note"]
    assert len(cand.samples[a]) == 2  # one repeat each told them apart (spread 1 < lead ~10)


def test_a_tie_within_the_noise_goes_to_the_defaults():
    near, far = bench.Variant(512, True), bench.Variant(2048, False)
    # far leads (mean 101.4 against 100.2) by less than the spread between repetitions (9): a tie
    out, _ = settle_with({far: 102, near: 100}, {far: [101, 106, 97, 101], near: [104, 96, 101, 100]})
    assert out["ranked"][0][2] == near and "closer to the recipe's defaults" in out["note"]


def test_the_default_search_starts_at_the_defaults_and_the_next_range_where_the_last_ended():
    # fa off wins everywhere; the micro-batch peaks at 1024 at depth 0 and at 2048 at depth 4096.
    # The first run is ub 512 with fa off (it has no pace to be raced against, so it must be the
    # setting that does not stall), the second the recipe's defaults (fa on, ub 512); then ub on
    # the fa-off plane (3 more), fa again at 1024 (1 more); the long range starts at (off, 1024)
    # and adds nothing new but 2048's fa-on point: 7 of 8 at most.
    peak = {0: {256: 0.7, 512: 0.9, 1024: 1.0, 2048: 0.95}, 4096: {256: 0.6, 512: 0.8, 1024: 0.9, 2048: 1.0}}
    order = []

    def measure(v):
        order.append(v)
        return [r for d in (0, 4096) for r in rows(*(2 * [100 * peak[d][v.ubatch] * (0.5 if v.fa else 1)]), d)]

    cand = tune.Candidate(object())
    dims = [[True, False], [256, 512, 1024, 2048]]
    best = tune.search(cand, dims, [], {"short": 0, "long": 4096}, measure)
    assert order[:2] == [bench.Variant(512, False), bench.Variant(512, True)]
    assert (best["short"]["variant"], best["long"]["variant"]) == (bench.Variant(1024, False), bench.Variant(2048, False))
    assert len(order) == len(set(order)) < 8  # nothing measured twice, fewer than the cross product


def test_screening_uses_one_repetition_never_more_than_asked(model8k):
    assert tune.screening(bench.Spec(model8k, reps=3)).reps == 1
    assert tune.screening(bench.Spec(model8k, reps=1)).reps == 1


def test_settling_repeats_screenings_unraced_and_exhaustive_runs_the_full_reps(model8k):
    spec = bench.Spec(model8k, reps=3, timeout=60)
    race = tune.Race(factor=2.0, floor_s=3.0, fastest=4.0)
    searching = tune.run_spec(spec, race, settling=False)
    assert (searching.reps, searching.timeout) == (1, 8.0)  # one repetition, raced at 2 x 4 s
    settling = tune.run_spec(spec, race, settling=True)
    assert (settling.reps, settling.timeout) == (1, 60)  # the leaders are the pace: the user's limit
    assert tune.run_spec(spec, None, settling=False) is spec  # --exhaustive: 3 repetitions, as asked
    assert tune.run_spec(spec, None, settling=True) is spec


def test_a_stored_figure_is_the_mean_over_every_run_of_the_variant():
    from rocforge_build.measure.tune_choice import pooled_rows

    def run(pp, tg, sd=0.0):
        return [{"test": "pp", "depth": 0, "status": "ok", "t_s": pp, "stddev": sd},
                {"test": "tg", "depth": 0, "status": "ok", "t_s": tg, "stddev": sd},
                {"test": "tg", "depth": 4096, "status": "failed", "t_s": None, "stddev": None}]
    got = {r["test"]: r for r in pooled_rows([run(100, 10), run(110, 12), run(90, 8)], 0)}
    assert got["pp"]["t_s"] == pytest.approx(100) and got["pp"]["stddev"] == pytest.approx(10)
    assert got["tg"]["t_s"] == pytest.approx(10) and got["tg"]["stddev"] == pytest.approx(2)
    one = {r["test"]: r for r in pooled_rows([run(100, 10, sd=3.5)], 0)}
    assert one["pp"]["stddev"] == 3.5  # one run: llama-bench's own spread over its repetitions
    assert pooled_rows([run(100, 10)], 4096) == []  # a failed row is no figure


def bench_stub(tmp_path: Path, script: str):
    exe = tmp_path / "llama-bench"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)

    class Build:
        gpu = False
        runtime_env: dict = {}

        def program(self, name):
            return exe
    return Build()


def test_the_race_stops_a_slow_run_and_keeps_what_it_finished(tmp_path, model8k):
    # llama-bench prints depth 0's rows first, then hangs at depth (as flash attention falling back
    # to the CPU did on the H100): the race stops it at 2 x the fastest run (0.6 s), not after the
    # user's 60 s, and its depth-0 rows still give it a short-range score
    build = bench_stub(tmp_path, """
echo '{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 900.0, "stddev_ts": 1.0}'
echo '{"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 90.0, "stddev_ts": 1.0}'
exec sleep 60
""")
    race = tune.Race(factor=2.0, floor_s=0.1, fastest=0.6)
    spec = race.spec(tune.screening(bench.Spec(model8k, depths=(0, 4096), timeout=60)))
    assert spec.timeout == pytest.approx(1.2) and spec.reps == 1
    t0, clock = time.monotonic(), []
    got = bench.run_variant(build, spec, bench.Variant(512, True), {}, (0, 4096), lambda r: None, clock=clock)
    assert time.monotonic() - t0 < 10
    race.record(clock[-1], got, spec)
    assert race.stopped == 1 and race.fastest == 0.6  # a stopped run is no one's pace
    assert tune.range_score(got, 0) == pytest.approx((900 * 90) ** 0.5)
    assert tune.range_score(got, 4096) == float("-inf")
    failed = [r for r in got if r["status"] == "failed"]
    assert {r["depth"] for r in failed} == {4096} and "2x the fastest variant's run (0.6 s)" in failed[0]["error"]


def test_the_race_waits_for_a_complete_run_and_never_loosens_the_users_timeout(model8k):
    race = tune.Race(factor=2.0, floor_s=3.0)
    spec = bench.Spec(model8k, timeout=15)
    assert race.spec(spec) is spec  # no complete run yet: the user's --timeout alone
    race.record(4.0, rows(10, 10), spec)
    assert race.spec(spec).timeout == 8.0
    race.record(0.5, rows(10, 10), spec)
    assert race.spec(spec).timeout == 3.0  # the floor: process start and model load are not a pace
    assert race.spec(bench.Spec(model8k, timeout=2)).timeout == 2  # the user's tighter limit stays
    race.record(0.1, rows(10, 10) + [{"test": "tg", "depth": 4096, "status": "failed", "error": "x"}], spec)
    assert race.fastest == 0.5  # an incomplete run sets no pace


# -- presets: a history, chosen versions, exports -----------------------------------------------
def preset(model="m", score=1.0, env=None, argv=None):
    return {"model": {"name": model, "sha256": "ab" * 32, "path": "/m/m.gguf"}, "created": "now",
            "ranges": {"short": {"prefix": "/p", "backend": "cpu", "stamp": "s1", "depth": 0, "ctx": 4096,
                                 "variant": {}, "variant_label": "ub=512 fa=1", "score": score, "figures": [],
                                 "runner_up": None, "env": env or {},
                                 "argv": argv or ["/p/bin/llama-server", "-m", "/m/m.gguf", "-c", "4096"],
                                 # as tune stores it: the shape it verified, serving dimensions included
                                 "verified": {"shape": {"ctx": 4096, "ubatch": 512, "fa": False, "ngl": None,
                                                        "kv": "f16", "load": "mmap", "parallel": 1}},
                                 "notes": []}}}


def as_build(prefix: Path, stamp: str = "s1") -> Path:
    """`prefix` made a rocforge build (its manifest, stamp `stamp`), with a bin/llama-server:
    a preset is printed or served only for its own build's program."""
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "rocforge-manifest.toml").write_text(
        f'stamp = "{stamp}"\ntarget = ""\nbackend = "cpu"\n[recipe]\nname = "llama-cpp"\n')
    server = prefix / "bin" / "llama-server"
    if not server.exists():
        server.write_text("#!/bin/sh\n")
        server.chmod(0o755)
    return server


def test_export_quotes_for_systemd_and_llama_swap(tmp_path, capsys):
    hostile = "a b$HOME%i\"q'"
    server = as_build(tmp_path / "p")
    p = preset(env={"GGML_X": hostile}, argv=[str(server), "-m", "/m/m.gguf", "-c", "4096"])
    p["ranges"]["short"]["prefix"] = str(tmp_path / "p")
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["preset", "export", "m", "--format", "systemd", "--port", "8081"]) == 0
    unit = capsys.readouterr().out
    # systemd.unit(5): `%` doubled, `"` escaped inside double quotes; systemd.exec(5): `$` has no
    # special meaning in Environment= (doubled only on command lines, systemd.service(5))
    assert 'Environment="GGML_X=a b$HOME%%i\\"q\'"' in unit
    assert f'ExecStart="{server}" "-m" "/m/m.gguf" "-c" "4096" "--host" "127.0.0.1" "--port" "8081"' in unit
    assert cli.main(["preset", "export", "m", "--format", "llama-swap"]) == 0
    swap = yaml.safe_load(capsys.readouterr().out)  # PyYAML's safe dumper wrote it: any value round-trips
    assert swap["models"]["m"]["env"] == [f"GGML_X={hostile}"]
    assert swap["models"]["m"]["cmd"].endswith("--port ${PORT}")


DUMP_ARGV = r'''#!{python}
import json, os, sys
json.dump({"argv": sys.argv[1:], "GGML_X": os.environ.get("GGML_X")}, open(os.environ["ARGV_OUT"], "w"))
'''


def test_export_shell_runs_exactly_the_presets_command(tmp_path, capsys):
    exe = tmp_path / "bin" / "llama-server"  # writes the argv and env it was started with
    exe.parent.mkdir()
    exe.write_text(DUMP_ARGV.replace("{python}", sys.executable))
    exe.chmod(0o755)
    hostile = "a b$HOME%i\"q'`id`;$(id)"
    argv = [str(exe), "-m", "/m/my model.gguf", "-c", "4096", "--alias", "it's $USER"]
    p = preset(env={"GGML_X": hostile}, argv=argv)
    p["ranges"]["short"]["prefix"] = str(tmp_path)  # the program lies inside its build's prefix
    as_build(tmp_path)
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["preset", "export", "m", "--format", "shell"]) == 0
    script = tmp_path / "m.sh"
    script.write_text(capsys.readouterr().out)
    script.chmod(0o755)
    out = tmp_path / "argv.json"
    # run by bash, by its own #!/bin/sh, and sourced by bash: each time exactly the preset's argv
    # (then the caller's arguments) and env, nothing expanded
    extra = ["--port", "9", "--log-prefix", "a b"]
    for how in (["bash", str(script), *extra], [str(script), *extra],
                ["bash", "-c", 'source "$0" "$@"', str(script), *extra]):
        out.unlink(missing_ok=True)
        subprocess.run(how, env={**os.environ, "ARGV_OUT": str(out)}, check=True, timeout=60)
        assert json.loads(out.read_text()) == {"argv": argv[1:] + extra, "GGML_X": hostile}, how


HELP = """usage: llama-server [options]
  -fa,   --flash-attn [on|off|auto]       set Flash Attention use
  --no-mmap                               do not memory-map model (slower load but may reduce pageouts)
"""
DIO = "  -dio,  --direct-io                      use DirectIO if available\n"


@pytest.mark.parametrize("host, backend, tree_help, added", [
    # Strix Halo (an APU: host facts say igpu), a HIP build of a tree with both flags: both added
    ("strix", "hip", HELP + DIO, ["--no-mmap", "-dio"]),
    # an older tree without -dio: only what it has
    ("strix", "hip", HELP, ["--no-mmap"]),
    # an iGPU beside a dGPU (Raphael + RX 7900 XTX): the server may run on the dGPU, nothing added
    ("igpu+dgpu", "hip", HELP + DIO, []),
    # a CPU build on the APU offloads nothing to GPU memory: nothing added
    ("strix", "cpu", HELP + DIO, []),
])
def test_an_apu_preset_loads_without_mmap_where_the_tree_can(tmp_path, host, backend, tree_help, added):
    import fixtures_roots as fr
    from stackfixtures import make_build

    from rocforge_build.measure import preset as preset_mod
    from rocforge_build.measure import provenance
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.rootfs import Root

    root = tmp_path / "root"
    (fr.make_strix_halo if host == "strix" else fr.make_igpu_dgpu)(root)
    facts = provenance.host(Root(str(root)))  # what tune passes: the host facts of every row
    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", backend)
    server = prefix / "bin" / "llama-server"  # answers --help as the tree's llama-server would
    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text(f"#!/bin/sh\ncat <<'EOF'\n{tree_help}EOF\n")
    server.chmod(0o755)
    build = LlamaBuild.open(prefix)
    env, argv, notes = preset_mod.command(build, "/m/m.gguf", {"ubatch": 512, "fa": True}, 4096,
                                          preset_mod.is_igpu(build, facts))
    base = [str(server), "-m", "/m/m.gguf", "-c", "4096"] + (["-ngl", "99"] if backend != "cpu" else [])
    assert argv == base + ["-fa", "on", "-ub", "512", "-b", "2048"] + added
    assert [n.split(":")[0] for n in notes] == added


def test_export_refuses_a_hostile_env_name(capsys):
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, preset(env={"X;touch /tmp/p": "1"}))
    assert cli.main(["preset", "export", "m", "--format", "systemd"]) == 11  # refused as the store reads it
    assert "field ranges.short.env: 'X;touch /tmp/p' is not an environment variable name" in capsys.readouterr().err


# -- serve --------------------------------------------------------------------------------------
FAKE_SERVER = r'''#!{python}
"""Answers /health like llama-server: 503 while "loading", then 200; writes its argv."""
import http.server, json, sys, time, os
argv = sys.argv[1:]
open(os.environ["ARGV_OUT"], "w").write(json.dumps(argv))
port = int(argv[argv.index("--port") + 1])
ready = time.monotonic() + 0.5
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.monotonic() > ready else 503)
        self.end_headers()
    def do_POST(self):  # the one-token warm-up serve sends to /completion
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200 if self.path == "/completion" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_build(tmp_path: Path) -> Path:
    from stackfixtures import make_build

    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    exe = prefix / "bin" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(FAKE_SERVER.replace("{python}", sys.executable))
    exe.chmod(0o755)
    return prefix


def test_serve_runs_the_preset_waits_for_health_and_stops_on_ctrl_c(tmp_path):
    from rocforge_build.discover.builds import read_manifest

    prefix = fake_build(tmp_path)
    stamp = read_manifest(prefix).get("stamp")
    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", "/m/m.gguf", "-c", "4096"])
    p["ranges"]["short"]["prefix"], p["ranges"]["short"]["stamp"] = str(prefix), stamp
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    port = free_port()
    argv_out = tmp_path / "argv.json"
    proc = subprocess.Popen([sys.executable, "-m", "rocforge_build", "serve", "m", "--port", str(port), "--wait", "30",
                             "--no-canary"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "ARGV_OUT": str(argv_out)})
    line = proc.stdout.readline()
    assert f"at http://127.0.0.1:{port}" in line
    assert json.loads(argv_out.read_text())[-4:] == ["--host", "127.0.0.1", "--port", str(port)]
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    # serve stops its server before it exits (proc.stop_group waits until the process is gone, and
    # a process's sockets close when it exits): no wait here, nothing listens on the port any more
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_refuses_a_build_changed_since_it_was_verified(tmp_path, capsys):
    prefix = fake_build(tmp_path)
    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", "/m/m.gguf"])
    p["ranges"]["short"]["prefix"], p["ranges"]["short"]["stamp"] = str(prefix), "an-older-stamp"
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "rebuilt since the preset was verified" in err and "rocforge verify" in err


def test_serve_takes_rocforges_reference_rebuilt_since_the_preset_as_proven(tmp_path, capsys):
    """A CPU build of the packaged recipe as shipped is the reference itself: rebuilt (an upgrade to
    a new commit), there is nothing verify could compare it with (it says so in one line), so serve
    does not ask for a verify that cannot prove it; its canary checks it against rocforge's own
    build of the plan.  Found walking tests/journeys/test_upgrade_journey.py: serve named a verify command,
    the command printed the reference line, and serve refused again."""
    import hashlib

    import tomlkit

    from rocforge_build.forge import recipes

    prefix = fake_build(tmp_path)
    path = prefix / "rocforge-manifest.toml"
    doc = tomlkit.parse(path.read_text())
    doc["recipe"]["sha256"] = hashlib.sha256(recipes.load("llama-cpp").text.encode()).hexdigest()
    doc["source"]["identity"] = doc["source"]["commit"] = "1" * 40
    path.write_text(tomlkit.dumps(doc))
    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", "/m/m.gguf"])
    p["ranges"]["short"]["prefix"], p["ranges"]["short"]["stamp"] = str(prefix), "an-older-stamp"
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    assert cli.main(["serve", "m", "--dry-run"]) == 0, capsys.readouterr().err
    assert str(prefix / "bin/llama-server") in capsys.readouterr().out


# the preset's range was verified at ctx=4096 ub=512 fa=on (a CPU build: ngl None) with GGML_X=1
SHAPE = {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None}


def rebuilt_preset(tmp_path: Path, model) -> tuple[Path, str, str]:
    """A stored preset whose build has been rebuilt since (its stamp is not the preset's): (prefix,
    the build's stamp now, the model's sha256)."""
    from rocforge_build.discover.builds import read_manifest

    prefix = fake_build(tmp_path)
    from rocforge_build.measure import provenance

    p = preset(argv=[str(prefix / "bin/llama-server"), "-m", str(model.path), "-c", "4096"])
    sha = provenance.model_sha256(Path(model.path))  # as tune stores it: serve checks the file is this model
    p["model"].update(sha256=sha, path=str(model.path))
    r = p["ranges"]["short"]
    r.update(prefix=str(prefix), stamp="an-older-stamp", variant={"ubatch": 512, "fa": True, "env": {"GGML_X": "1"}},
             verified={"shape": SHAPE, "kld_mean": 0.001, "top1": 0.99, "reference": "/ref"})
    with Store() as s:
        s.add_preset("m", sha, 1, p)
    return prefix, read_manifest(prefix)["stamp"], sha


def verify_row(prefix, stamp, sha, shapes, *, env=None, failed=()) -> dict:
    # as verify writes a check: its serving dimensions at llama-perplexity's defaults
    checks = [{"ctx": c, "ubatch": u, "fa": fa, "ngl": ngl, "kv": "f16", "load": "mmap", "parallel": 1,
               "passed": (c, u, fa, ngl) not in failed} for c, u, fa, ngl in shapes]
    return {"prefix": str(prefix), "stamp": stamp, "model_sha256": sha, "env": env or {},
            "passed": all(c["passed"] for c in checks), "checks": checks}


EXACT = (4096, 512, True, None)


@pytest.mark.parametrize("case", ["quick", "other ubatch", "other fa", "other env", "no env", "failed elsewhere",
                                  "older stamp", "other model"])
def test_serve_wants_a_verify_of_the_rebuilt_build_at_the_presets_shape(tmp_path, capsys, model8k, case):
    prefix, stamp, sha = rebuilt_preset(tmp_path, model8k)
    env = {"GGML_X": "1"}
    # each row below passed every check it ran, but none proves the preset's shape with its env
    row = {
        # `verify --quick`: the shortest context only (verify.plan), 512 tokens, not the preset's 4096
        "quick": verify_row(prefix, stamp, sha, [(512, 2048, True, None), (512, 256, False, None)], env=env),
        "other ubatch": verify_row(prefix, stamp, sha, [(4096, 2048, True, None)], env=env),
        "other fa": verify_row(prefix, stamp, sha, [(4096, 512, False, None)], env=env),
        "other env": verify_row(prefix, stamp, sha, [EXACT], env={"GGML_X": "0"}),
        "no env": verify_row(prefix, stamp, sha, [EXACT]),
        # the shape passed, another check of the same verify failed: the build is wrong somewhere
        "failed elsewhere": verify_row(prefix, stamp, sha, [EXACT, (512, 256, True, None)], env=env,
                                       failed={(512, 256, True, None)}),
        "older stamp": verify_row(prefix, "an-older-stamp", sha, [EXACT], env=env),
        "other model": verify_row(prefix, stamp, "cd" * 32, [EXACT], env=env),
    }[case]
    with Store() as s:
        s.add_row(s.start_run("verify"), "verify", row, status="passed" if row["passed"] else "failed")
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "has not passed verify with this model at the preset's shape (ctx=4096 ub=512 fa=on with GGML_X=1)" in err
    assert (f"hint: verify it at that shape: rocforge verify {prefix} --model {model8k.path} --ctx 4096 "
            "--ubatch 512 --fa on --kv f16 --load mmap --parallel 1 --env GGML_X=1") in err


def test_serve_accepts_the_rebuilt_build_once_verified_at_the_presets_shape(tmp_path, capsys, model8k):
    prefix, stamp, sha = rebuilt_preset(tmp_path, model8k)
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    hint = capsys.readouterr().err.split("verify it at that shape: ")[1].strip()
    # the command the refusal gives, read by verify's own parser, checks exactly the preset's shape
    # first (verify.plan: the given context, micro-batch and flash attention meet in row 0)
    args = cli.build_parser("verify").parse_args(hint.split()[1:])
    cov = verify.plan(model8k, gpu=False, ctx=args.ctx, ubatch=args.ubatch, fa=[args.fa == "on"],
                      kv=args.kv, load=args.load, parallel=args.parallel)
    assert cov.shapes == [verify.Shape(*EXACT)]
    assert {k: v[0] for k, v in bench.env_pairs(args.env).items()} == {"GGML_X": "1"}
    # the row that command writes when it passes: serve runs the preset again
    with Store() as s:
        s.add_row(s.start_run("verify"), "verify", verify_row(prefix, stamp, sha, [EXACT], env={"GGML_X": "1"}),
                  status="passed")
    assert cli.main(["serve", "m", "--dry-run"]) == 0
    assert f"{prefix}/bin/llama-server -m {model8k.path} -c 4096 --host 127.0.0.1 --port 8080" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [["--port", "0"], ["--port", "70000"], ["--wait", "nan"], ["--wait", "-1"]])
def test_serve_flags_are_checked(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "m", *flag])
    assert exc.value.code == 2 and f"argument {flag[0]}" in capsys.readouterr().err
