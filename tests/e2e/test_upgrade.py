"""`rocforge upgrade` and `rocforge rollback` on the fixture project's git history: real git,
cmake, ninja and the C compiler; the gate is a real checker program run by `--run`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from upgrade_history import built, output_checker, tree_hashes

from rocforge_build import cli


def hello(prefix: Path) -> list[str]:
    return subprocess.run([prefix / "bin" / "fixture-hello"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def test_upgrade_refuses_a_bad_commit_then_accepts_a_good_one_and_rollback_restores(
        tmp_path, capsys):
    h, prefix = built(tmp_path)
    check = output_checker(tmp_path)
    assert "HELLO" in hello(prefix)
    original = tree_hashes(prefix)
    # the breaking commit builds and passes the smoke test; the user's checker fails it
    rc = cli.main(["upgrade", str(prefix), "--ref", h.commits["break"], "--run", str(check),
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["status"] == "refused" and not report["upgraded"]
    assert [(g["gate"], g["verdict"]) for g in report["gates"]] == [
        ("build", "pass"), ("smoke", "pass"), ("run", "fail")]
    assert report["gates"][-1]["figures"] == {"exit_code": 1}  # the checker ran and said bad
    assert tree_hashes(prefix) == original  # byte for byte, modes and links too
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("prefix")) == ["prefix"]
    # a good commit passes every gate and is swapped in; the replaced build is kept
    rc = cli.main(["upgrade", str(prefix), "--ref", h.commits["docs1"], "--run", str(check)])
    out = capsys.readouterr().out
    assert rc == 0 and "UPGRADED" in out
    assert "HELLO" in hello(prefix)
    assert tree_hashes(prefix) != original  # the new build (its manifest names the new commit)
    kept = Path(f"{prefix}.rocforge-previous")
    assert tree_hashes(kept) == original
    # rollback puts the original back, byte for byte; a second one goes forward again
    upgraded = tree_hashes(prefix)
    assert cli.main(["rollback", str(prefix)]) == 0
    assert tree_hashes(prefix) == original and tree_hashes(kept) == upgraded
    assert cli.main(["rollback", str(prefix)]) == 0
    assert tree_hashes(prefix) == upgraded and tree_hashes(kept) == original
    # every upgrade left a row of kind "upgrade" in the results store
    from rocforge_build.measure.store import Store

    with Store() as store:
        rows = list(store.rows(kind="upgrade"))
    assert [r.status for r in rows] == ["failed", "ok"]
    assert [r.data["status"] for r in rows] == ["refused", "upgraded"]


def test_upgrade_exit_125_is_cannot_test_and_refuses(tmp_path, capsys):
    h, prefix = built(tmp_path)
    original = tree_hashes(prefix)
    skip = tmp_path / "skip.sh"
    skip.write_text("#!/bin/sh\nexit 125\n")
    skip.chmod(0o755)
    rc = cli.main(["upgrade", str(prefix), "--ref", h.commits["docs1"], "--run", str(skip),
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["gates"][-1]["verdict"] == "cannot test"
    assert report["gates"][-1]["figures"] == {"exit_code": 125}
    assert tree_hashes(prefix) == original


def test_bench_gate_pairs_rows_by_shape_and_fails_beyond_the_threshold():
    # rows as `rocforge bench --json` prints them (prefix, test, tokens, depth, ubatch, fa, t_s)
    from rocforge_build.workflows.upgrade import compare_rows

    cur, cand = Path("/b/cur"), Path("/b/cand")

    def row(prefix, test, t_s, status="ok"):
        return {"prefix": str(prefix), "test": test, "n_prompt": 512 if test == "pp" else 0,
                "n_gen": 128 if test == "tg" else 0, "depth": 0, "ubatch": None, "fa": True,
                "t_s": t_s, "status": status}

    rows = [row(cur, "pp", 1000.0), row(cur, "tg", 50.0), row(cand, "pp", 970.0),
            row(cand, "tg", 44.0)]
    gate = compare_rows(rows, cur, cand, 5.0)
    assert gate.verdict == "fail" and "tg128@d0" in gate.detail and "pp512" not in gate.detail
    assert gate.figures["pp512@d0 fa1"]["change_pct"] == -3.0
    assert compare_rows(rows, cur, cand, 15.0).verdict == "pass"
    # a failed row of the candidate is no figure: nothing to compare is a failure, not a pass
    failed = [row(cur, "pp", 1000.0), row(cand, "pp", 0.0, status="failed")]
    assert compare_rows(failed, cur, cand, 5.0).verdict == "fail"


# llama-bench as its `-o jsonl` prints results (n_prompt, n_gen, n_depth, n_ubatch, flash_attn,
# avg_ts), from its own arguments; its --help lists -d, so bench passes depths.  The figure is
# 1000 t/s pp and 50 t/s tg, 800 and 40 (20 % slower) at the micro-batch SLOW_UB or with
# ROCFORGE_FAKE_KNOB=SLOW_KNOB in its environment.  Each run appends its micro-batch and that
# variable to llama-bench.log beside it: what reached it.
LLAMA_BENCH = r"""#!/bin/sh
case "$1" in --help) printf 'usage: llama-bench [options]\n  -d, --n-depth <n>   depths\n'; exit 0;; esac
P=512 N=128 D=0 U=512 F=0
while [ $# -gt 0 ]; do
  case "$1" in -p) P=$2; shift;; -n) N=$2; shift;; -d) D=$2; shift;; -ub) U=$2; shift;;
               -fa) F=$2; shift;; esac
  shift
done
echo "ub=$U ROCFORGE_FAKE_KNOB=${ROCFORGE_FAKE_KNOB-unset}" >> "$0.log"
PP=1000 TG=50
[ "$U" = "SLOW_UB" ] && PP=800 TG=40
[ "${ROCFORGE_FAKE_KNOB-}" = "SLOW_KNOB" ] && PP=800 TG=40
for d in $(echo "$D" | tr , ' '); do
  [ "$P" -gt 0 ] && echo "{\"n_prompt\": $P, \"n_gen\": 0, \"n_depth\": $d, \"n_ubatch\": $U, \"flash_attn\": $F, \"avg_ts\": $PP, \"stddev_ts\": 1.0}"
  [ "$N" -gt 0 ] && echo "{\"n_prompt\": 0, \"n_gen\": $N, \"n_depth\": $d, \"n_ubatch\": $U, \"flash_attn\": $F, \"avg_ts\": $TG, \"stddev_ts\": 0.1}"
done
exit 0
"""


def bench_build(prefix: Path, slow_ubatch: int | None, slow_knob: str | None = None) -> Path:
    (prefix / "bin").mkdir(parents=True)
    exe = prefix / "bin" / "llama-bench"
    exe.write_text(LLAMA_BENCH.replace("SLOW_UB", str(slow_ubatch or "none"))
                   .replace("SLOW_KNOB", slow_knob or "none"))
    exe.chmod(0o755)
    return prefix


def test_bench_gate_compares_at_the_models_preset_shapes(tmp_path):
    # current and candidate are as fast at the default shape; the candidate is 20 % slower at
    # micro-batch 256, the long range's tuned shape: only the preset's shapes show it
    from tiny_gguf import write as write_gguf

    from rocforge_build.measure import provenance
    from rocforge_build.measure.store import Store
    from rocforge_build.workflows.upgrade import bench_gate

    model = write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)
    cur = bench_build(tmp_path / "current", None)
    cand = bench_build(tmp_path / "candidate", 256)
    gate = bench_gate(cur, cand, str(model), 5.0, None)
    assert gate.verdict == "pass" and set(gate.figures) == {"pp512@d0 ub512 fa0",
                                                            "tg128@d0 ub512 fa0"}

    def entry(depth, ubatch, fa):
        return {"prefix": str(cur), "backend": "cpu", "stamp": "s", "depth": depth, "ctx": 8192,
                "variant": {"ubatch": ubatch, "fa": fa}, "variant_label": f"ub={ubatch}",
                "score": 1.0, "figures": [], "runner_up": None, "env": {},
                "argv": [str(cur / "bin" / "llama-server")], "notes": []}

    sha = provenance.model_sha256(model)
    with Store() as s:
        version = s.add_preset(model.name, sha, None, {
            "model": {"name": model.name, "sha256": sha, "path": str(model)}, "created": "t",
            "ranges": {"short": entry(0, 512, True), "long": entry(4096, 256, True)}})
    gate = bench_gate(cur, cand, str(model), 5.0, None)
    assert gate.verdict == "fail"
    assert gate.figures["pp512@d4096 ub256 fa1"] == {"current": 1000.0, "candidate": 800.0,
                                                     "change_pct": -20.0}
    assert gate.figures["tg128@d4096 ub256 fa1"]["change_pct"] == -20.0
    assert gate.figures["pp512@d0 ub512 fa1"]["change_pct"] == 0.0  # the short range: as fast
    assert "pp512@d4096 ub256 fa1 1000.00 -> 800.00" in gate.detail
    assert f"preset version {version}'s ranges long, short" in gate.detail
    # within a threshold above the regression, the same figures pass
    assert bench_gate(cur, cand, str(model), 25.0, None).verdict == "pass"


def tuned_range(prefix, depth, variant) -> dict:
    """A preset range as tune stores it (the store's schema holds every one it reads back)."""
    return {"prefix": str(prefix), "backend": "cpu", "depth": depth, "ctx": 8192, "variant": variant,
            "variant_label": "v", "score": 1.0, "figures": [], "env": {},
            "argv": [str(prefix / "bin" / "llama-server")], "notes": []}


def test_preset_shapes_take_only_what_tune_writes(tmp_path):
    # a store edited by hand: a shape that is not whole numbers / booleans is refused where the
    # store reads it (one line naming the field), never handed to bench
    import pytest
    from tiny_gguf import write as write_gguf

    from rocforge_build.measure import provenance
    from rocforge_build.measure.store import Store, StoreError
    from rocforge_build.workflows.upgrade import preset_shapes, shape_args

    model = write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)
    assert preset_shapes(str(model)) == ([], None)  # no preset: the default shape only
    sha = provenance.model_sha256(model)
    bad = [({"depth": "0; touch x", "variant": {"ubatch": 512, "fa": True}}, "depth"),
           ({"depth": 0, "variant": {"ubatch": -1, "fa": True}}, "variant.ubatch"),
           ({"depth": 0, "variant": {"ubatch": 512, "fa": "on"}}, "variant.fa"),
           ({"depth": True, "variant": {}}, "depth"), ({"depth": 0, "variant": "ub=512"}, "variant")]
    for fields, field in bad:
        with Store() as s:
            s.add_preset(model.name, sha, None, {
                "model": {"name": model.name, "sha256": sha, "path": str(model)}, "created": "t",
                "ranges": {"r": tuned_range(tmp_path, **fields)}})
        with pytest.raises(StoreError, match=f"field ranges.r.{field}[: ]"):
            preset_shapes(str(model))
    ranges = {"good": tuned_range(tmp_path, 2048, {"ubatch": None, "fa": False}),
              "same": tuned_range(tmp_path, 2048, {"fa": False})}
    with Store() as s:
        s.add_preset(model.name, sha, None, {"model": {"name": model.name, "sha256": sha, "path": str(model)},
                                             "created": "t", "ranges": ranges})
    shapes, _version = preset_shapes(str(model))
    assert shapes == [{"depth": 2048, "ubatch": None, "fa": False, "env": {},
                       "ranges": ["good", "same"]}]
    assert shape_args(shapes[0]) == ["--depth", "2048", "--fa", "off"]


def test_bench_gate_benches_each_range_with_its_environment(tmp_path, monkeypatch):
    # two ranges at the same depth, micro-batch and flash attention, one with a runtime
    # environment variable set: the candidate is 20 % slower only with it set.  The gate benches
    # them as two shapes, passes the variable to both builds' llama-bench, and sees the regression
    from tiny_gguf import write as write_gguf

    from rocforge_build.measure import provenance
    from rocforge_build.measure.store import Store
    from rocforge_build.workflows.upgrade import bench_gate, preset_shapes, shape_args

    monkeypatch.delenv("ROCFORGE_FAKE_KNOB", raising=False)
    model = write_gguf(tmp_path / "tiny.gguf", byte_tokens=True)
    cur = bench_build(tmp_path / "current", None)
    cand = bench_build(tmp_path / "candidate", None, slow_knob="on")

    def entry(env):
        return tuned_range(cur, 0, {"ubatch": 512, "fa": True, "env": env})

    sha = provenance.model_sha256(model)
    with Store() as s:
        version = s.add_preset(model.name, sha, None, {
            "model": {"name": model.name, "sha256": sha, "path": str(model)}, "created": "t", "ranges": {
                "short": entry({}), "long": entry({"ROCFORGE_FAKE_KNOB": "on"}),
                "longer": entry({"ROCFORGE_FAKE_KNOB": "on"}),
                "listed": entry({"ROCFORGE_FAKE_KNOB": "on,off"})}})  # not one value: not benched
    shapes, _version = preset_shapes(str(model))
    assert [(s["env"], s["ranges"]) for s in shapes] == [
        ({"ROCFORGE_FAKE_KNOB": "on"}, ["long", "longer"]), ({}, ["short"])]
    assert shape_args(shapes[0])[-2:] == ["--env", "ROCFORGE_FAKE_KNOB=on"]
    gate = bench_gate(cur, cand, str(model), 5.0, None)
    assert gate.verdict == "fail", gate.detail
    knob = "pp512@d0 ub512 fa1 ROCFORGE_FAKE_KNOB=on"
    assert gate.figures[knob] == {"current": 1000.0, "candidate": 800.0, "change_pct": -20.0}
    assert gate.figures["pp512@d0 ub512 fa1"]["change_pct"] == 0.0  # the short range: as fast
    assert f"preset version {version}'s ranges long, longer, short" in gate.detail
    for prefix in (cur, cand):  # the variable reached both sides, and only at its range's shape
        runs = (prefix / "bin" / "llama-bench.log").read_text().splitlines()
        assert runs.count("ub=512 ROCFORGE_FAKE_KNOB=on") == 1
        assert runs.count("ub=512 ROCFORGE_FAKE_KNOB=unset") == 2  # default shape, short


def test_the_gate_runs_with_the_requests_environment_not_this_processs(tmp_path, monkeypatch):
    # `nightly install --gate` builds the candidate with ROCM_PATH set to the new tree in the
    # request only; the user's --run check must test that candidate under the same environment.
    # The checker records what it was given: the request's ROCM_PATH, not this process's, and no
    # variable the request does not carry.
    from rocforge_build.rootfs import Root
    from rocforge_build.workflows import upgrade

    h, prefix = built(tmp_path)
    seen = tmp_path / "seen-env"
    recorder = tmp_path / "record-env.sh"
    recorder.write_text(f'#!/bin/sh\nenv > "{seen}"\n')
    recorder.chmod(0o755)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "old-rocm"))
    monkeypatch.setenv("ROCFORGE_ONLY_IN_THIS_PROCESS", "1")
    path, manifest = upgrade.existing_build(prefix)
    environ = {name: value for name, value in os.environ.items()
               if name != "ROCFORGE_ONLY_IN_THIS_PROCESS"}
    environ["ROCM_PATH"] = str(tmp_path / "new-rocm")
    req = upgrade.request_for(path, manifest, ref=h.commits["docs1"], environ=environ)
    out = upgrade.upgrade(path, req, Root("/"), run=[str(recorder)], quiet=True)
    assert out.status == "upgraded", [g.to_json() for g in out.gates]
    recorded = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert recorded["ROCM_PATH"] == str(tmp_path / "new-rocm")
    assert "ROCFORGE_ONLY_IN_THIS_PROCESS" not in recorded
    assert recorded["ROCFORGE_PREFIX"] == f"{prefix}.rocforge-new"  # the candidate, before the swap
