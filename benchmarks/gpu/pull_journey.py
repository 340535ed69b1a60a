"""publish -> pull -> serve on a GPU (Vulkan), through the CLI as users type it: machine A builds
llama.cpp for Vulkan, verifies it against rocforge's own CPU reference and publishes it (the
reference goes beside it) to a file store; machine B — a fresh HOME, config, cache and data dir,
so a fresh driver shader cache too — trusts A's key and asks for the same build with
`--substitute-only`: it takes the Vulkan build and its reference from the store, verifies here,
compiles nothing, then tunes and serves, and the official `openai` client asks it a question.
The same path as tests/journeys/test_vulkan_lavapipe.py's publish test, which walks it on lavapipe.

Parts, each within one device call (600 s): `--part builds` (A's Vulkan build), `--part publish`
(A's verify and publish), `--part pull` (B's pull, tune and serve).  Each step's command, exit
code, seconds and last lines go to the JSON file named by --json.  Run by benchmarks/gpu/journey.sh
PHASE=pull-build, pull-model, pull-first."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from upgrade_journey import PROGRAMS, Journey, prefix_of, run_parts


class Machine(Journey):
    """A journey whose every command runs with this machine's own directories."""

    def __init__(self, args, home: Path | None, steps: list[dict]):
        super().__init__(args, steps)
        self.home = home
        self.env = {}
        if home is not None:
            self.env = {"HOME": str(home / "home"), "XDG_CACHE_HOME": str(home / "home" / ".cache"),
                        **{f"ROCFORGE_{v.upper()}_DIR": str(home / v) for v in ("config", "cache", "data")}}
            for d in self.env.values():
                Path(d).mkdir(parents=True, exist_ok=True)

    def run(self, name, *argv, env_extra=None, timeout=580):
        return super().run(name, *argv, env_extra={**self.env, **(env_extra or {})}, timeout=timeout)

    def serve(self, name, ask):
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return super().serve(name, ask)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def targets() -> list[str]:
    return [w for p in PROGRAMS for w in ("--cmake-target", p)]


def builds(a, state: dict, steps: list[dict]) -> None:
    j = Machine(a, None, steps)
    out = j.run("A: build vulkan", "build", "llama-cpp", "--backend", "vulkan", "--source", a.tree, *targets(),
                "-j", "16", env_extra=j.sid)
    if out.returncode:
        raise SystemExit("the build failed")
    state["vk"] = prefix_of(out)


def publish(a, state: dict, steps: list[dict]) -> None:
    j = Machine(a, None, steps)
    store = Path(a.work) / "store"
    state["store"] = store.as_uri()
    j.run("A: verify against rocforge's own reference", "verify", state["vk"], "--model", a.model)
    key = j.run("A: key generate", "key", "generate")
    state["public"] = key.stdout.strip()
    j.run("A: publish (the reference beside it)", "publish", state["vk"], "--to", state["store"], "--model", a.model)


def pull(a, state: dict, steps: list[dict]) -> None:
    b = Machine(a, Path(a.work) / "machine-b", steps)
    for name, value in (("substitute.stores", [state["store"]]), ("substitute.trusted_keys", [state["public"]]),
                        ("substitute.verify_model", a.model)):
        b.run(f"B: config set {name}", "config", "set", name, json.dumps(value))
    out = b.run("B: build --substitute-only (zero to verified)", "build", "llama-cpp", "--backend", "vulkan",
                "--source", a.tree, *targets(), "--substitute-only", env_extra=b.sid)
    if out.returncode:
        raise SystemExit("the pull failed")
    prefix = prefix_of(out)
    state["b_prefix"] = prefix
    cmake = list(Path(b.env["ROCFORGE_CACHE_DIR"]).rglob("CMakeCache.txt"))
    state["b_compiled_anything"] = bool(cmake)
    state["b_installed_line"] = [x for x in out.stderr.splitlines() if "installed" in x][-2:]
    b.run("B: tune", "tune", "llama-cpp", "--backends", "vulkan", "--source", a.tree, "--model", a.model,
          "--contexts", "short", "-p", "128", "-n", "16", "--reps", "1", "--ctx", "512", "--timeout", "30",
          env_extra=b.sid)
    b.serve("B: serve + openai", ask=True)


def main() -> int:
    return run_parts(__doc__.splitlines()[0], {"builds": builds, "publish": publish, "pull": pull},
                     "/tmp/pull-journey", lambda part, a, state, steps: part(a, state, steps))


if __name__ == "__main__":
    sys.exit(main())
