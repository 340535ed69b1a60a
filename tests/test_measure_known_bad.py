"""Known llama.cpp faults at a serving shape (recipe `[[known_bad]]`, measure/known_bad.py):
the table's schema, the matcher at the edges of the measured rule, verify's failure line and
serve's refusal through the CLI.  The figures are issue 38 item 5's measurements on an H200:
Vulkan, 0.3.36 tree, fa off: 4 x 8192 cells in one unified cache wrong, 2 x 8192 right."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from stackfixtures import make_build, program
from test_forge_recipes import MINIMAL, error, load
from tiny_gguf import write as write_gguf

from rocforge_build import paths
from rocforge_build.measure import known_bad
from rocforge_build.measure.verify import Check

ENTRY = """
[[known_bad]]
when = { backend = "vulkan", source_version = ">=0.3.36,<1" }
fa = false
parallel_min = 2
cells_over = 16384
symptom = "wrong"
seen = "4 x 8192 wrong"
evidence = ["docs/measurements/gpu-journey.md"]
"""


def test_the_table_loads_and_is_listed(tmp_path):
    r = load(tmp_path, MINIMAL + ENTRY)
    assert r.known_bad[0]["cells_over"] == 16384
    assert r.to_json()["known_bad"][0]["symptom"] == "wrong"


@pytest.mark.parametrize("change,says", [
    (("fa = false", "fa = \"off\""), "known_bad[0].fa: must be bool, got str"),
    (("parallel_min = 2", "parallel_min = 1"), "known_bad[0].parallel_min: 1 is out of range"),
    (("cells_over = 16384", "cells_over = -1"), "known_bad[0].cells_over: -1 is out of range"),
    (("cells_over = 16384", "cels_over = 16384"), "unknown key 'cels_over'"),
    (('symptom = "wrong"\n', ""), "missing required key 'symptom'"),
    (('evidence = ["docs/measurements/gpu-journey.md"]', "evidence = [3]"), "evidence[0]: must be str"),
    (('backend = "vulkan",', 'tool = "glslc",'), "'tool' is not recorded in a build's manifest"),
    (('source_version = ">=0.3.36,<1"', 'source_version = "newest"'), "is not a version range"),
    (("fa = false\nparallel_min = 2\ncells_over = 16384\n", ""), "names no shape"),
])
def test_a_bad_entry_is_one_error_naming_it(tmp_path, change, says):
    text = MINIMAL + ENTRY.replace(*change)
    assert text != MINIMAL + ENTRY
    assert says in str(error(tmp_path, text))


def test_the_cli_refuses_a_bad_packaged_style_recipe_with_one_line(tmp_path):
    (tmp_path / "recipes").mkdir()
    p = tmp_path / "recipes" / "demo.toml"
    p.write_text(MINIMAL + ENTRY.replace("fa = false", "fa = 0"))
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "recipe", "show", str(p)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("rocforge: error: ") and "fa: must be bool" in out.stderr


def test_llama_cpp_lists_the_vulkan_unified_cache_fault():
    out = subprocess.run([sys.executable, "-m", "rocforge_build", "recipe", "show", "llama-cpp"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "known faults" in out.stdout
    assert "docs/upstream/vulkan-kvu-np4.md" in out.stdout


VK = {"backend": "vulkan", "target": "gfx1151", "source": {"version": "0.3.36"}}


@pytest.mark.parametrize("manifest,fa,parallel,cells,hit", [
    (VK, False, 4, 4 * 8192, True),     # measured wrong
    (VK, False, 2, 2 * 8192, False),    # measured right: 16384 cells is not over the limit
    (VK, False, 2, 16385, True),        # not proven right: refused
    (VK, False, 3, 3 * 8192, True),     # P=3 not measured: refused with the rule
    (VK, True, 4, 4 * 8192, False),     # flash attention on: measured right
    (VK, False, 1, 65536, False),       # one sequence: measured right
    ({**VK, "backend": "cpu"}, False, 4, 4 * 8192, False),
    ({**VK, "source": {"version": "0.3.9"}}, False, 4, 4 * 8192, False),   # older: not seen
    ({**VK, "source": {"version": "0.3.40"}}, False, 4, 4 * 8192, True),   # open range
    ({**VK, "source": {"version": "b6000"}}, False, 4, 4 * 8192, False),   # upstream tag: not claimed
    ({**VK, "source": {}}, False, 4, 4 * 8192, False),                      # unknown version
])
def test_the_matcher_at_the_edges_of_the_rule(manifest, fa, parallel, cells, hit):
    manifest = {**manifest, "recipe": {"name": "llama-cpp"}}
    assert (known_bad.find(manifest, fa, parallel, cells) is not None) == hit


@pytest.mark.parametrize("argv,shape", [
    (["-c", "32768", "-np", "4", "-kvu", "-fa", "off"], (False, 4, 32768)),
    (["-c", "32768", "-np", "4", "--kv-unified"], (False, 4, 32768)),
    (["-c", "32768", "-np", "4", "-fa", "on", "-kvu"], (True, 4, 32768)),
    (["-c", "32768", "-np", "4", "-fa", "auto", "-kvu"], (False, 4, 32768)),
    (["-c", "32768", "-np", "4", "-fa", "-kvu"], (True, 4, 32768)),  # older trees: a bare switch
    (["-c", "32768", "-np", "4"], (False, 1, 8192)),  # a cache per slot
])
def test_a_servers_shape_is_read_from_its_command(argv, shape):
    assert known_bad.served_shape(["llama-server", *argv]) == shape


def test_verify_names_the_fault_of_a_failed_check_only():
    manifest = {**VK, "recipe": {"name": "llama-cpp"}}
    bad = Check(ctx=8192, kld_mean=7.74911, top1=0.48248, ppl=45922.23, ppl_ref=22.3511, ubatch=512,
                fa=False, parallel=4, failed=["kld_mean 7.74911 > 0.05: ..."])
    other = Check(ctx=8192, kld_mean=7.7, top1=0.5, ppl=4e4, ppl_ref=22.3, ubatch=512, fa=True,
                  parallel=4, failed=["kld_mean 7.7 > 0.05: ..."])
    good = Check(ctx=8192, kld_mean=0.003, top1=0.99, ppl=22.3, ppl_ref=22.3, ubatch=512, fa=False,
                 parallel=4, passed=True)
    known_bad.name_failures(manifest, [bad, other, good])
    assert bad.failed[-1].startswith("matches a known llama.cpp fault: llama.cpp's Vulkan backend")
    assert "docs/measurements/gpu-journey.md" in bad.failed[-1]
    assert len(other.failed) == 1 and good.failed == []


def _serve_preset(tmp_path: Path, argv_tail: list[str], parallel: int, fa: bool) -> subprocess.CompletedProcess:
    from rocforge_build.measure import provenance
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.measure.store import Store

    name = "llama-cpp-gfx1151-vulkan"
    prefix = tmp_path / str(paths.builds_prefix()).lstrip("/") / name
    make_build(tmp_path, "llama-cpp", "gfx1151", "vulkan", version="0.3.36", recorded_prefix=str(prefix))
    server = program(prefix, "llama-server", "#!/bin/sh\nexit 3\n")
    model = tmp_path / "model.gguf"
    write_gguf(model)
    sha = provenance.model_sha256(model)
    build = LlamaBuild.open(prefix)
    ctx = 8192
    entry = {"prefix": str(prefix), "backend": "vulkan", "stamp": build.stamp, "depth": 0, "ctx": ctx,
             "variant": {"ubatch": 512, "fa": fa, "env": {}}, "variant_label": "ub=512", "score": 1.0,
             "figures": [], "runner_up": None, "env": {}, "notes": [],
             "argv": [str(server), "-m", str(model), *argv_tail],
             "verified": {"shape": {"ctx": ctx, "ubatch": 512, "fa": fa, "ngl": 99, "kv": "f16",
                                    "load": "mmap", "parallel": parallel}}}
    with Store() as s:
        s.add_preset("model", sha, None, {"model": {"name": "model", "sha256": sha, "path": str(model)},
                                          "created": "test", "ranges": {"long": entry}})
    return subprocess.run([sys.executable, "-m", "rocforge_build", "serve", str(model), "--dry-run"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_serve_refuses_the_known_bad_shape_on_that_build(tmp_path):
    out = _serve_preset(tmp_path, ["-c", "32768", "-np", "4", "-kvu", "-fa", "off"], 4, False)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    first, *rest = out.stderr.splitlines()
    assert first.startswith("rocforge: error: the preset serves 4 sequences in one unified KV cache "
                            "of 32768 cells with flash attention off")
    assert "matches a known llama.cpp fault" in first
    assert rest and rest[0].startswith("rocforge: hint:") and "flash attention on" in rest[0]
    assert out.stdout == ""


@pytest.mark.parametrize("argv_tail,parallel,fa", [
    (["-c", "32768", "-np", "4", "-kvu", "-fa", "on"], 4, True),
    (["-c", "16384", "-np", "2", "-kvu", "-fa", "off"], 2, False),
])
def test_serve_passes_the_shapes_measured_right(tmp_path, argv_tail, parallel, fa):
    out = _serve_preset(tmp_path, argv_tail, parallel, fa)
    assert out.returncode == 0, out.stderr
    assert "llama-server" in out.stdout


class _Told:
    def verifying(self, *a): pass

    def refused(self, *a): pass


@pytest.mark.parametrize("parallel,fa,stored", [(4, False, False), (2, False, True), (4, True, True)])
def test_tune_never_stores_a_known_bad_shape_even_when_its_check_passes(monkeypatch, parallel, fa, stored):
    from types import SimpleNamespace

    from rocforge_build.measure import bench, tune_choice
    from rocforge_build.measure.verify import Shape

    build = SimpleNamespace(manifest={**VK, "recipe": {"name": "llama-cpp"}}, prefix=Path("/b"))
    cand = SimpleNamespace(build=build)
    v = bench.Variant(ubatch=512, fa=fa)
    monkeypatch.setattr(tune_choice, "range_shape",
                        lambda ctx, c, var, host=None: Shape(ctx, 512, fa, 99, parallel=parallel))
    checked = []

    def check_at(b, shape, env):
        checked.append(shape)
        return {"passed": True, "checks": [{"failed": []}]}

    won, rejected = tune_choice.first_verified("long", [(1.0, cand, v)], 8192, check_at, _Told())
    assert (won is not None) == stored
    if not stored:
        assert checked == [] and "matches a known llama.cpp fault" in rejected[0]["reason"]
