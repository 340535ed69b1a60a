"""What `publish` needs is checked before it measures anything, and `store show` tells each check's
serving dimensions (KV cache type, how the weights were loaded, slots, the logical batch) beside
its shape (context, micro-batch) — a check at q8_0 with 4 slots proves nothing about f16 with one,
so a reader of the store must see which.

The build is the fixture recipe's CPU build from git (seconds), published by the real CLI to a
file store; the verify evidence shown is a signed document attached the way `publish` attaches one
(a signer vouches for the bytes it signs: what store show prints comes from that document)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from buildfixtures import git_repo, recipe_copy
from needs import require
from trust_helpers import one_error, rocforge


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("publish-tools")
    repo = git_repo(base / "repo")
    recipe = recipe_copy(base / "r", **{"file:///nonexistent/fixture.git": repo.as_uri()})
    a = {"ROCFORGE_CONFIG_DIR": str(base / "a" / "config"), "ROCFORGE_CACHE_DIR": str(base / "a" / "cache"),
         "ROCFORGE_DATA_DIR": str(base / "a" / "data")}
    public = _ok(rocforge("key", "generate", env=a)).stdout.strip()
    out = _ok(rocforge("build", str(recipe), "--target", "gfx1030", "--backend", "cpu", env=a))
    return {"base": base, "a": a, "public": public, "prefix": out.stdout.strip().splitlines()[-1]}


def _path_without(base: Path, *missing: str) -> str:
    """A PATH of links to every program on this PATH but `missing` (what a machine without them has)."""
    bin_dir = base / ("bin-without-" + "-".join(missing))
    bin_dir.mkdir(exist_ok=True)
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = Path(d).absolute() / name  # a relative PATH entry (.venv/bin) names it from here
            if name not in missing and not os.path.lexists(bin_dir / name) and os.access(target, os.X_OK):
                (bin_dir / name).symlink_to(target)
    return str(bin_dir)


def test_publish_without_patchelf_stops_before_it_measures(built, tmp_path):
    """With --model, publish measures the build's own figures first (this build has no
    llama-perplexity, the model is no GGUF: measuring would stop on either); the missing tool is
    the one line instead, exit 5 (a tool is missing), with the hint naming how to install it, in
    well under a second, and nothing reached the store."""
    not_a_model = tmp_path / "model.gguf"
    not_a_model.write_text("not a model\n")
    store = tmp_path / "store"
    env = {**built["a"], "PATH": _path_without(tmp_path, "patchelf")}
    t0 = time.monotonic()
    res = rocforge("publish", built["prefix"], "--to", store.as_uri(), "--model", str(not_a_model), env=env)
    seconds = time.monotonic() - t0  # the whole process, Python's start included: 0.2 s here
    line = one_error(res, code=5)
    assert "patchelf" in line and "not found" in line and "llama-perplexity" not in res.stderr
    [hint] = [x for x in res.stderr.splitlines() if x.startswith("rocforge: hint:")]
    assert "apt-get install patchelf" in hint, res.stderr
    assert not store.exists()
    assert seconds < 1.0, f"publish took {seconds:.2f}s to say patchelf is missing"


def test_store_show_lists_each_checks_serving_dimensions(built, tmp_path):
    require("patchelf")
    store = (tmp_path / "store").as_uri()
    tag = _ok(rocforge("publish", built["prefix"], "--to", store, "--unverified", env=built["a"])).stdout.strip()
    from rocforge_build.substitute import artifact, catalog, evidence, oci, signing
    from rocforge_build.substitute.stores import open_store

    checks = [{"ctx": 4096, "ubatch": 512, "fa": True, "ngl": 99, "kv": "q8_0", "load": "read", "parallel": 4,
               "batch": 16384,
               "passed": True, "kld_mean": 0.0012, "top1": 0.991},
              {"ctx": 512, "ubatch": 512, "fa": False, "ngl": 99,  # a check stored before serving dims were
               "passed": True, "kld_mean": 0.0008, "top1": 0.995}]
    with open_store(store) as st:
        man = catalog.resolve(st, tag)
        pair = signing.read_secret_key(next(Path(built["a"]["ROCFORGE_CONFIG_DIR"]).rglob("*.key")))
        doc = evidence.document(kind="verify", key=man.config.digest, host={"kernel": os.uname().release},
                                model=None, passed=True, verify_rows=[{"passed": True, "checks": checks}])
        artifact.attach(st, man, oci.EVIDENCE_TYPE, doc, pair, annotations={"dev.rocforge.kind": "verify"})
    env = {**built["a"], "ROCFORGE_CONFIG_DIR": str(tmp_path / "reader")}
    _ok(rocforge("config", "set", "substitute.trusted_keys", json.dumps([built["public"]]), env=env))
    text = _ok(rocforge("store", "show", store, tag, env=env)).stdout
    assert "ctx 4096 b 16384 ub 512 fa True ngl 99, kv q8_0 load read slots 4: passed" in text, text
    assert "ctx 512 ub 512 fa False ngl 99, serving not recorded: passed" in text, text
    shown = json.loads(_ok(rocforge("store", "show", store, tag, "--json", env=env)).stdout)
    [verify] = [a for a in shown["attestations"] if a["kind"] == "verify"]
    assert [(s["kv"], s["load"], s["parallel"], s["batch"]) for s in verify["shapes"]] == [
        ("q8_0", "read", 4, 16384), (None, None, None, None)]
