"""The serving dimensions in the proof (fast): the KV cache type, the weights' loading and parallel
sequences in one unified KV cache join verify's covering design where the build's own --help has
them, the preset's command runs exactly the shape tune verified, and serve refuses a preset proven
before verify knew these dimensions until a verify covers the shape it serves.

The help texts below are the programs' own: the May 2025 tree's lines as its llama-perplexity and
llama-server print them (llama-cpp-python 0.3.9, built by tests/llama_builds.py), the Oct 2026
tree's as its common/arg.cpp spells them (llama-cpp-python 0.3.36: `-kvu, --kv-unified` listed for
llama-perplexity, `-lm, --load-mode` with mmap|none|dio and no --no-mmap).
"""

from __future__ import annotations

import pytest
from tiny_gguf import write as write_gguf

from rocforge_build import cli
from rocforge_build.errors import UsageError
from rocforge_build.measure import gguf, serving, verify
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.store import Store

MAY_2025 = """\
-fa,   --flash-attn                     enable Flash Attention (default: disabled)
-ctk,  --cache-type-k TYPE              KV cache data type for K
-ctv,  --cache-type-v TYPE              KV cache data type for V
-np,   --parallel N                     number of parallel sequences to decode (default: 1)
--no-mmap                               do not memory-map model (slower load but may reduce pageouts if not
"""
OCT_2026 = """\
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
-ctk,  --cache-type-k TYPE              KV cache data type for K
-ctv,  --cache-type-v TYPE              KV cache data type for V
-kvu,  --kv-unified, -no-kvu, --no-kv-unified
                                        use single unified KV buffer shared across all sequences
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
-lm,   --load-mode MODE                 model loading mode (default: auto)
                                        - auto: mmap, unless a device does not support it
                                        - none: no special loading mode
                                        - mmap: memory-map model
                                        - dio: use DirectIO if available
"""
# a tree between the two (llama.cpp had -dio/--direct-io beside --no-mmap)
WITH_DIO = MAY_2025 + "-dio,  --direct-io                      use DirectIO if available\n"


@pytest.fixture(scope="module")
def model8k(tmp_path_factory):
    """A llama of 2 layers trained (as its metadata says) at 8192 tokens, like SmolLM2-135M."""
    return gguf.check(write_gguf(tmp_path_factory.mktemp("m") / "m.gguf", n_ctx=8192))


def build_with(tmp_path, help_text: str, backend: str = "cpu", programs=("llama-perplexity", "llama-server")):
    """A rocforge build whose programs answer --help with `help_text` (nothing else is run)."""
    from stackfixtures import make_build

    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", backend)
    for name in programs:
        exe = prefix / "bin" / name
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}EOF\n")
        exe.chmod(0o755)
    return LlamaBuild.open(prefix)


# -- which tree runs what -----------------------------------------------------------------------
@pytest.mark.parametrize("help_text, kv, loads, parallel", [
    (MAY_2025, True, ("mmap", "read"), False),  # KL divergence one sequence at a time; no direct I/O
    (WITH_DIO, True, ("mmap", "read", "dio"), False),
    (OCT_2026, True, ("mmap", "read", "dio"), True),  # -lm none / -lm dio; -kvu
    ("-m FNAME  model path\n", False, ("mmap",), False),  # a tree with none of them
])
def test_support_is_read_from_the_programs_own_help(tmp_path, help_text, kv, loads, parallel):
    s = serving.ServingSupport.of(build_with(tmp_path, help_text))
    assert (s.kv, s.loads, s.parallel) == (kv, loads, parallel)


@pytest.mark.parametrize("help_text, load, args", [
    (MAY_2025, "read", ["--no-mmap"]),
    (WITH_DIO, "dio", ["--no-mmap", "-dio"]),  # read, not mapped, where O_DIRECT is not available
    (OCT_2026, "read", ["-lm", "none"]),
    (OCT_2026, "dio", ["-lm", "dio"]),
    (OCT_2026, "mmap", []),  # llama.cpp's default: nothing added, the argv of every earlier verify
    (MAY_2025, "dio", None),
])
def test_loading_is_spelled_as_each_tree_spells_it(tmp_path, help_text, load, args):
    assert serving.load_args(build_with(tmp_path, help_text), "llama-perplexity", load) == args


# -- the covering design ------------------------------------------------------------------------
DEFAULTS = {"kv": "f16", "load": "mmap", "parallel": 1}


def test_the_full_coverage_holds_every_serving_value_beside_the_old_rows(model8k):
    cov = verify.plan(model8k, gpu=False, support=serving.ALL_SERVING)
    rows = [s.to_json() for s in cov.shapes]
    # the first check is still the longest context, largest micro-batch, flash attention on, and
    # llama.cpp's defaults (what a plain llama-server runs)
    assert rows[0] == {"ctx": 8192, "ubatch": 2048, "fa": True, "ngl": None, **DEFAULTS}
    assert {r["kv"] for r in rows} == {"f16", "q8_0"}
    assert {r["load"] for r in rows} == {"mmap", "read", "dio"}
    assert {r["parallel"] for r in rows} == {1, 4}
    # a quantized V cache only with flash attention (llama.cpp refuses it without)
    assert all(r["fa"] for r in rows if r["kv"] != "f16")
    # the old design's contexts, micro-batches and attention paths are all still there
    assert {(r["ctx"], r["ubatch"], r["fa"]) for r in rows} == {(8192, 2048, True), (2048, 256, False),
                                                                (512, 2048, True)}
    # the serving values ride on the cheap rows (P sequences of 512 tokens are one 2048 batch)
    assert all(r["ctx"] < 8192 for r in rows if any(r[k] != v for k, v in DEFAULTS.items()))


def test_quick_is_as_fast_as_before(model8k):
    cov = verify.plan(model8k, gpu=False, quick=True, support=serving.ALL_SERVING)
    # the shortest context with both micro-batches and both attention paths, nothing more
    assert [s.to_json() for s in cov.shapes] == [
        {"ctx": 512, "ubatch": 2048, "fa": True, "ngl": None, **DEFAULTS},
        {"ctx": 512, "ubatch": 256, "fa": False, "ngl": None, **DEFAULTS}]


def test_quick_takes_a_serving_value_asked_for(model8k):
    cov = verify.plan(model8k, gpu=False, quick=True, load=["mmap", "read"], support=serving.ALL_SERVING)
    assert {s.load for s in cov.shapes} == {"mmap", "read"}


def test_a_tree_without_a_dimension_is_checked_without_it_and_says_so(tmp_path, model8k):
    support = serving.ServingSupport.of(build_with(tmp_path, MAY_2025))
    cov = verify.plan(model8k, gpu=False, support=support)
    assert {s.parallel for s in cov.shapes} == {1} and {s.load for s in cov.shapes} == {"mmap", "read"}
    said = " | ".join(cov.bounds)
    assert "parallel 4 not checked: the build's llama-perplexity has no --kv-unified" in said
    assert "load dio not checked" in said


def test_a_value_the_tree_cannot_run_is_one_line(tmp_path, model8k):
    support = serving.ServingSupport.of(build_with(tmp_path, MAY_2025))
    with pytest.raises(UsageError, match=r"--parallel 4: the build's llama-perplexity has no --kv-unified"):
        verify.plan(model8k, gpu=False, parallel=[1, 4], support=support)
    with pytest.raises(UsageError, match="needs flash attention"):
        verify.plan(model8k, gpu=False, fa=[False], kv=["q8_0"], support=serving.ALL_SERVING)


@pytest.mark.parametrize("flag, value", [("--kv", "q4_0"), ("--load", "mlock"), ("--parallel", "0"),
                                         ("--parallel", "x")])
def test_bad_flag_values_are_one_line(flag, value):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rocforge_build", "verify", "/nonexistent", "--model", "m.gguf",
                          flag, value], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()
    assert err[0].startswith(f"rocforge: error: verify: argument {flag}: ") and value in err[0], err
    assert err[1:] == ["rocforge: hint: `rocforge verify --help` lists what it takes"]


# -- what llama-perplexity is asked to run ------------------------------------------------------
@pytest.mark.parametrize("help_text, shape, args", [
    # 4 sequences of 512 tokens in one batch and one unified KV cache, 4 chunks so they share it
    (OCT_2026, verify.Shape(512, 512, True, None, "f16", "mmap", 4), ["-b", "2048", "-kvu"]),
    (OCT_2026, verify.Shape(2048, 256, True, None, "q8_0", "read", 1),
     ["-b", "2048", "-ctk", "q8_0", "-ctv", "q8_0", "-lm", "none"]),
    (MAY_2025, verify.Shape(512, 256, False, None, "f16", "read", 1), ["-b", "2048", "--no-mmap"]),
    # the defaults: exactly the arguments every earlier verify ran
    (MAY_2025, verify.Shape(8192, 2048, True, None), ["-b", "2048"]),
])
def test_the_check_runs_its_shape(tmp_path, monkeypatch, help_text, shape, args):
    build = build_with(tmp_path, help_text)
    ran = []

    def perplexity(build, argv, env=None, ngl=None):
        ran.append(argv)
        return "  1  10.0 ± 0.1  0.0 ± 0.0  0.001 ± 0.0  0.1 ± 0.0 %  99.0 ± 0.1 %\n"

    monkeypatch.setattr(verify, "_perplexity", perplexity)
    model = type("M", (), {"path": "/m.gguf", "n_vocab": 100})()
    check = verify.check_shape(build, model, shape, ("/base", 10.0), (), None)
    argv = ran[0]
    assert argv[argv.index("-ub") + 2:] [:len(args)] == args
    assert int(argv[argv.index("--chunks") + 1]) >= shape.parallel
    assert check.shape == shape
    # the logical batch it ran with is recorded beside the shape (publish's evidence, store show)
    assert check.to_json()["batch"] == int(argv[argv.index("-b") + 1])


# -- serve: the proof covers what is served -----------------------------------------------------
def _row(build, sha, checks, passed=True):
    return {"prefix": str(build.prefix), "stamp": build.stamp, "model_sha256": sha, "env": {},
            "passed": passed, "checks": [{**c, "passed": True} for c in checks]}


def test_covers_compares_the_serving_dimensions():
    from rocforge_build.serve.server import covers

    shape = {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None, "kv": "q8_0", "load": "read", "parallel": 4}
    row = {"stamp": "s", "model_sha256": "m", "env": {}, "passed": True}
    assert covers({**row, "checks": [{**shape, "passed": True}]}, "s", "m", shape, {})
    for k, other in (("kv", "f16"), ("load", "mmap"), ("parallel", 1)):
        assert not covers({**row, "checks": [{**shape, k: other, "passed": True}]}, "s", "m", shape, {}), k
    # a check from before verify knew them proves nothing of them, even at llama.cpp's defaults
    old = {k: shape[k] for k in ("ctx", "ubatch", "fa", "ngl")}
    plain = {**old, **DEFAULTS}
    assert not covers({**row, "checks": [{**old, "passed": True}]}, "s", "m", plain, {})


def test_the_served_dimensions_of_an_old_command_are_read_from_its_argv():
    from rocforge_build.serve.server import served_dimensions

    assert served_dimensions(["/b/llama-server", "-m", "x", "-c", "4096"], {}) == DEFAULTS
    assert served_dimensions(["s", "--no-mmap", "-dio", "-ctk", "q8_0", "-np", "4"], {}) == {
        "kv": "q8_0", "load": "dio", "parallel": 4}
    assert served_dimensions(["s", "-lm", "none"], {})["load"] == "read"


def test_a_preset_verified_before_the_serving_dimensions_is_verified_again_before_it_is_served(
        tmp_path, capsys, model8k):
    from rocforge_build.measure import provenance

    build = build_with(tmp_path, MAY_2025)
    sha = provenance.model_sha256(model8k.path)  # as tune stores it: serve checks the file is this model
    old_shape = {"ctx": 4096, "ubatch": 512, "fa": True, "ngl": None}  # what tune stored before
    argv = [str(build.prefix / "bin/llama-server"), "-m", str(model8k.path), "-c", "4096", "-fa",
            "-ub", "512", "-b", "2048", "--no-mmap"]
    preset = {"model": {"name": "m", "sha256": sha, "path": str(model8k.path)}, "created": "now",
              "ranges": {"short": {"prefix": str(build.prefix), "backend": "cpu", "stamp": build.stamp,
                                   "depth": 0, "ctx": 4096, "variant": {"ubatch": 512, "fa": True},
                                   "variant_label": "ub=512 fa=1", "score": 1.0, "figures": [],
                                   "runner_up": None, "env": {}, "argv": argv, "notes": [],
                                   "verified": {"shape": old_shape}}}}
    with Store() as s:
        s.add_preset("m", sha, 1, preset)
    # the same build tune verified: still refused, its proof never ran the weights read (--no-mmap)
    assert cli.main(["serve", "m", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("rocforge: error: the preset was verified before verify checked the KV cache type")
    assert "(ctx=4096 ub=512 fa=on load=read)" in err[0]
    assert err[1] == (f"rocforge: hint: verify it at that shape: rocforge verify {build.prefix} --model "
                      f"{model8k.path} --ctx 4096 --ubatch 512 --fa on --kv f16 --load read --parallel 1")
    # the verify that command writes when it passes: served
    with Store() as s:
        s.add_row(s.start_run("verify"), "verify",
                  _row(build, sha, [{**old_shape, "kv": "f16", "load": "read", "parallel": 1}]), status="passed")
    assert cli.main(["serve", "m", "--dry-run"]) == 0
    assert "--no-mmap" in capsys.readouterr().out


# -- the preset's command is its verified shape -------------------------------------------------
def test_the_command_runs_exactly_the_serving_shape(tmp_path):
    from rocforge_build.measure import preset

    build = build_with(tmp_path, OCT_2026, backend="vulkan")
    variant = {"ubatch": 512, "fa": True, "kv": "q8_0", "parallel": 4}
    shape = preset.serving_shape(build, variant, 8192, igpu=True)
    assert shape == verify.Shape(8192, 512, True, 99, "q8_0", "dio", 4)
    _, argv, notes = preset.command(build, "/m.gguf", variant, 8192, igpu=True)
    # 4 slots of 8192 tokens each: -c is their sum; -np and -kvu said, never the tree's "auto"
    assert argv[1:] == ["-m", "/m.gguf", "-c", "32768", "-ngl", "99", "-fa", "on", "-ub", "512", "-b", "2048",
                        "-ctk", "q8_0", "-ctv", "q8_0", "-np", "4", "-kvu", "-lm", "dio"]
    # one slot is said too: the Oct 2026 server's default is 4 slots in one unified KV cache
    _, argv, _ = preset.command(build, "/m.gguf", {"ubatch": 512, "fa": True}, 4096, igpu=False)
    assert argv[argv.index("-np") + 1] == "1" and "-kvu" not in argv and "-lm" not in argv
    assert argv[argv.index("-c") + 1] == "4096"


def test_a_caller_that_has_not_read_the_builds_help_gets_the_old_coverage(model8k):
    # bench's gate, recheck and a substitute's pull plan without `support`: llama.cpp's defaults
    # only, the three rows of the covering design as before
    cov = verify.plan(model8k, gpu=False)
    assert [s.to_json() for s in cov.shapes] == [
        {"ctx": c, "ubatch": u, "fa": fa, "ngl": None, **DEFAULTS}
        for c, u, fa in ((8192, 2048, True), (2048, 256, False), (512, 2048, True))]


# -- tune: the KV cache type as a dimension of the search ---------------------------------------
def test_tune_searches_the_kv_cache_type_and_never_measures_q8_0_without_flash_attention():
    from rocforge_build.measure import bench, tune

    dims, names = tune.dimensions("cpu", [512, 2048], [True, False], {}, 8192, ["f16", "q8_0"])
    assert dims == [[True, False], [512, 2048], ["f16", "q8_0"]] and names == [tune.KV]
    # f16, llama.cpp's default, is no flag: the variant (and llama-bench's argv) of every earlier search
    assert tune.to_variant((True, 512, "f16"), names) == bench.Variant(512, True)
    assert tune.to_variant((True, 512, "q8_0"), names) == bench.Variant(512, True, (), "q8_0")
    measured = []

    def measure(v):
        measured.append(v)
        t = {(True, None): 100.0, (False, None): 90.0, (True, "q8_0"): 120.0}.get((v.fa, v.kv), 80.0)
        return [{"test": "pp", "depth": 0, "status": "ok", "t_s": t},
                {"test": "tg", "depth": 0, "status": "ok", "t_s": t}]

    best = tune.search(tune.Candidate(build=None), dims, names, {"short": 0}, measure)
    assert best["short"]["variant"] == bench.Variant(512, True, (), "q8_0")
    assert not [v for v in measured if v.kv and v.fa is False]  # llama.cpp refuses it: never run


def test_a_kv_variant_runs_llama_bench_with_ctk_and_ctv(tmp_path, model8k):
    from rocforge_build.measure import bench

    build = build_with(tmp_path, MAY_2025, programs=("llama-bench",))
    argv = bench.argv_for(build, bench.Spec(model8k), bench.Variant(512, True, (), "q8_0"), (0,))
    assert argv[argv.index("-ctk"):argv.index("-ctk") + 4] == ["-ctk", "q8_0", "-ctv", "q8_0"]
    assert "-ctk" not in bench.argv_for(build, bench.Spec(model8k), bench.Variant(512, True), (0,))


def test_a_serving_value_asked_alone_is_in_every_check(model8k):
    """`--parallel 4` (or `--kv q8_0`, `--load read`) without the default beside it is what every
    check runs: a verify that asked for 4 sequences and checked 1 would prove the wrong shape (seen
    on a Vulkan build: two checks at parallel 1, "passed")."""
    cov = verify.plan(model8k, gpu=True, parallel=[4], support=serving.ALL_SERVING)
    assert cov.shapes and {s.parallel for s in cov.shapes} == {4}
    cov = verify.plan(model8k, gpu=False, kv=["q8_0"], load=["read"], support=serving.ALL_SERVING)
    assert {(s.kv, s.load) for s in cov.shapes} == {("q8_0", "read")}
    assert all(s.fa for s in cov.shapes)  # a quantized V cache needs flash attention
