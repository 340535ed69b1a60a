"""docs/reference/glossary.md names every key rocforge's `--json` outputs use: the keys of real
outputs (commands run on fixture machines, and the recorded `build --dry-run --json` plans) are
each looked up in it, so a new key without an entry fails here (issue 24 item 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import fixtures_roots as fr
import host_roots as hr
import pytest
from buildfixtures import RECIPE
from fake_engines import fake_docker
from stackfixtures import make_build
from test_commands_env import cli

REPO = Path(__file__).resolve().parents[1]
GLOSSARY = REPO / "docs" / "reference" / "glossary.md"
PLANS = REPO / "tests" / "data" / "plans" / "recorded.json"
SCHEMA_KEY = re.compile(r"[a-z][a-z0-9_]*")
# maps whose keys are data (variable names, backend names, range names, shape labels), not schema
DATA_MAPS = {"backends", "ranges", "figures", "labels", "defines", "env", "export_env", "runtime_env",
             "env_reasons", "env_evidence", "prepend", "firmware", "warmup_s", "verdicts", "value", "when"}


def documented() -> set[str]:
    """Every `key` in the first column of the glossary's tables."""
    names = set()
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z][a-z0-9_]*)`", line.split("|")[1]))
    return names


def keys_of(data, found: set[str] | None = None) -> set[str]:
    found = set() if found is None else found
    if isinstance(data, dict):
        for k, v in data.items():
            if SCHEMA_KEY.fullmatch(k):
                found.add(k)
            if k not in DATA_MAPS:
                keys_of(v, found)
    elif isinstance(data, list):
        for v in data:
            keys_of(v, found)
    return found


def _json(root, *args, env=None):
    out = cli(root, *args, env=env)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def outputs(tmp_path_factory):
    """Real --json outputs: a Strix Halo with a build and a host to plan for, and the packaged
    recipes and targets."""
    strix = tmp_path_factory.mktemp("strix")
    fr.make_strix_halo(strix)
    make_build(strix, "llama-cpp", "gfx1151", files=("bin/llama-cli",))
    host = hr.strix_defaults(tmp_path_factory.mktemp("host"))
    docker = fake_docker(tmp_path_factory.mktemp("docker"))  # the dry run checks the engine
    return {
        "targets": _json(strix, "targets", "--json"),
        "doctor": _json(strix, "doctor", "--json"),
        "recipes": _json(strix, "recipes", "--json"),
        "recipe show": _json(strix, "recipe", "show", "llama-cpp", "--json"),
        "config list": _json(strix, "config", "list", "--json"),
        "host plan": _json(host, "host", "plan", "--json"),
        "container build": _json(strix, "container", "build", "llama-cpp", "--target", "gfx1151",
                                 "--backend", "vulkan", "--engine", "podman", "--dry-run", "--json"),
        "container run": _json(strix, "container", "run", "llama-cpp", "--target", "gfx1151",
                               "--backend", "hip", "--engine", "docker", "--dry-run", "--json", "--", "true",
                               env={"PATH": f"{docker}:/usr/bin:/bin"}),
        "build --dry-run": [case["json"] for case in json.loads(PLANS.read_text()).values()],
        # a remote source not in the cache: nothing is downloaded (no server listens there)
        "build --dry-run, not fetched": _json(strix, "build", str(RECIPE), "--target", "gfx1151",
                                              "--source", "http://127.0.0.1:9/fixture.tar.gz",
                                              "--dry-run", "--json"),
    }


def test_the_glossary_is_read():
    names = documented()
    assert {"prefix", "recipe_path", "t_s", "kld_mean", "usable"} <= names
    assert "recipe_file" not in names  # the old name of recipe_path


def test_every_key_is_in_the_glossary(outputs):
    names = documented()
    missing = {}
    for command, data in outputs.items():
        keys = keys_of(data)
        assert len(keys) >= 2, (command, keys)  # the output was read
        if keys - names:
            missing[command] = sorted(keys - names)
    assert missing == {}


def test_one_name_for_the_recipe_file(outputs):
    """The recipe's file: recipe_path where a plan names the recipe, path in the recipe's own
    object (issue 24: it was recipe_file in build plans)."""
    plan = outputs["build --dry-run"][0]
    assert plan["recipe_path"].endswith(".toml") and "recipe_file" not in plan
    # a container plan names a file only when RECIPE was one (a packaged recipe's copy is the image's)
    assert "recipe_path" in outputs["container build"] and outputs["container build"]["recipe_path"] is None
    assert outputs["recipe show"]["path"].endswith("recipes/llama-cpp.toml")
    assert {r["name"]: r["path"] for r in outputs["recipes"]}["llama-cpp"] == outputs["recipe show"]["path"]


def test_cache_upgrade_and_bisect_keys_are_in_the_glossary(tmp_path, capsys, monkeypatch):
    """Real --json outputs on the fixture project's git history (tests/upgrade_history.py): an
    upgrade the user's checker refuses, a bisect, and the cache they leave behind (listed, and
    cleaned with --dry-run: nothing is removed, the compiler cache included)."""
    from upgrade_history import history, output_checker

    from rocforge_build import cli as rf

    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))  # never the user's
    monkeypatch.setenv("SCCACHE_DIR", str(tmp_path / "sccache"))
    h, check = history(tmp_path), output_checker(tmp_path)
    prefix = tmp_path / "prefix"

    def out(*argv: str, rc: int = 0):
        capsys.readouterr()
        assert rf.main(list(argv)) == rc
        return json.loads(capsys.readouterr().out)

    assert rf.main(["build", str(h.recipe), "--target", "gfx1151", "--prefix", str(prefix),
                    "--no-recheck"]) == 0
    got = {
        "upgrade": out("upgrade", str(prefix), "--ref", h.commits["break"], "--run", str(check),
                       "--json", rc=1),
        "bisect": out("bisect", str(h.recipe), "--target", "gfx1151", "--good", h.commits["docs2"],
                      "--bad", h.commits["docs3"], "--run", str(check), "--json"),
        "cache list": out("cache", "list", "--json"),
        "cache clean": out("cache", "clean", "--dry-run", "--work", "--bisect", "--sources",
                           "--ccache", "--json"),
    }
    assert got["upgrade"]["status"] == "refused" and got["bisect"]["first_bad"] == h.commits["break"]
    assert {e["category"] for e in got["cache list"]["entries"]} >= {"bisect", "sources"}
    assert got["cache clean"]["entries"] and got["cache clean"]["ccache"] is not None
    names = documented()
    missing = {c: sorted(keys_of(d) - names) for c, d in got.items() if keys_of(d) - names}
    assert missing == {}
    # the keys inside a gate's and a step's figures (a data map elsewhere): --run's exit status
    assert got["upgrade"]["gates"][-1]["figures"] == {"exit_code": 1}
    assert {k for s in got["bisect"]["steps"] for k in s["figures"]} == {"exit_code"} <= names
