"""The upgrading user's journey on a GPU (Vulkan), through the CLI as a user types it: a llama.cpp git
checkout built for CPU and Vulkan, the Vulkan build verified against the CPU one, tuned, served with
the canary and asked by the official `openai` client; then the checkout gains a commit, `rocforge
upgrade VK --ref NEW --model M` gates and swaps it in, `serve` refuses the preset whose build
changed under it with the one command that proves it, that command runs, and `serve` answers again.
The same path as tests/journeys/test_upgrade_journey.py, which walks it on the CPU backend in CI.

Three parts, each within one device call (600 s): `--part builds` (the checkout, CPU and Vulkan
builds), `--part first` (verify, tune, serve) and `--part second` (commit, upgrade, refusal, the
proving command, serve).  Each step's
command, exit code, seconds and last lines go to the JSON file named by --json (appended by part).
Run by benchmarks/gpu/journey.sh PHASE=upgrade-build, -first, -second."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PROGRAMS = ("llama-bench", "llama-perplexity", "llama-cli", "llama-server")
GIT = {"GIT_AUTHOR_NAME": "journey", "GIT_AUTHOR_EMAIL": "journey@example.org",
       "GIT_COMMITTER_NAME": "journey", "GIT_COMMITTER_EMAIL": "journey@example.org"}


def say(text: str) -> None:
    print(f"[upgrade {time.strftime('%H:%M:%S')}] {text}", flush=True)


class Journey:
    def __init__(self, args, steps: list[dict] | None = None):
        self.args = args
        self.steps: list[dict] = [] if steps is None else steps  # the part's list, kept when a step fails
        self.rf = [sys.executable, "-m", "rocforge_build"]
        self.sid = dict(x.split("=", 1) for x in args.sid_env)  # glslc and the Vulkan SDK for builds

    def run(self, name: str, *argv: str, env_extra: dict | None = None, timeout: float = 580) -> subprocess.CompletedProcess:
        start = time.monotonic()
        env = {**os.environ, **(env_extra or {})}
        out = subprocess.run([*self.rf, *argv], env=env, text=True, capture_output=True, timeout=timeout)
        took = time.monotonic() - start
        self.steps.append({"step": name, "argv": ["rocforge", *argv], "rc": out.returncode,
                           "seconds": round(took, 1), "stdout_tail": out.stdout[-1500:],
                           "stderr_tail": out.stderr[-2500:]})
        say(f"{name}: rc={out.returncode} in {took:.0f} s")
        return out

    def serve(self, name: str, ask: bool) -> dict:
        """`rocforge serve MODEL`: when its URL comes, the `openai` client asks, then Ctrl-C."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        start = time.monotonic()
        proc = subprocess.Popen([*self.rf, "serve", self.args.model, "--port", str(port), "--wait", "400"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
        reader.start()
        answer, announced = None, None
        try:
            line = proc.stdout.readline()
            announced = round(time.monotonic() - start, 1) if line else None
            if line and ask:
                from openai import OpenAI

                client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
                got = client.chat.completions.create(model="served", max_tokens=16, temperature=0,
                                                     messages=[{"role": "user",
                                                                "content": "What is the capital of France?"}])
                answer = got.choices[0].message.content
            if line:
                os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(10)
        text = "".join(err)
        step = {"step": name, "argv": ["rocforge", "serve", self.args.model], "rc": code, "announced_after": announced,
                "answer": answer, "canary_passed": "canary passed" in text, "stderr_tail": text[-2500:],
                "seconds": round(time.monotonic() - start, 1)}
        self.steps.append(step)
        say(f"{name}: rc={code}, URL after {announced} s, answer {answer!r}")
        return step


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(repo.parent), **GIT}).stdout.strip()


def prefix_of(out: subprocess.CompletedProcess) -> str:
    return out.stdout.strip().splitlines()[-1]


def builds(j: Journey, state: dict) -> None:
    a = j.args
    repo = Path(a.work) / "llama.cpp"
    if not repo.is_dir():
        shutil.copytree(a.tree, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    state["git"] = shutil.which("git") is not None  # without git: the next tree is a changed copy
    if not state["git"]:
        state["repo"], state["first"] = str(repo), None
    else:
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A", "--force")  # as upstream tracks them: build-info-gen-cpp.cmake matches its .gitignore
        git(repo, "commit", "-q", "-m", "the tree as released")
        state["repo"], state["first"] = str(repo), git(repo, "rev-parse", "HEAD")
    targets = [w for p in PROGRAMS for w in ("--cmake-target", p)]
    common = ["--source", str(repo), *targets]
    result: dict[str, subprocess.CompletedProcess] = {}
    threads = [threading.Thread(target=lambda b=b, jobs=jobs: result.__setitem__(b, j.run(
        f"build {b}", "build", "llama-cpp", "--backend", b, *common, "-j", str(jobs),
        env_extra=j.sid if b == "vulkan" else None))) for b, jobs in (("cpu", 5), ("vulkan", 11))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(r.returncode for r in result.values()):
        raise SystemExit("a build failed")
    state["cpu"], state["vk"] = prefix_of(result["cpu"]), prefix_of(result["vulkan"])


def first(j: Journey, state: dict) -> None:
    a, repo = j.args, Path(state["repo"])
    j.run("verify", "verify", state["vk"], "--model", a.model, "--reference", state["cpu"])
    j.run("tune", "tune", "llama-cpp", "--backends", "vulkan", "--source", str(repo), "--model", a.model,
          "--contexts", "short", "-p", "128", "-n", "16", "--reps", "1", "--ctx", "512", "--timeout", "30",
          env_extra=j.sid)
    j.serve("serve (before the upgrade)", ask=True)


def second(j: Journey, state: dict) -> None:
    a = j.args
    repo = Path(state["repo"])
    if not state["git"]:
        repo = repo.with_name("llama.cpp-next")
        if not repo.is_dir():
            shutil.copytree(state["repo"], repo, symlinks=True)
    src = repo / "ggml" / "src" / "ggml.c"
    if "ggml_journey_upgrade_marker" not in src.read_text():
        src.write_text(src.read_text() + "\nint ggml_journey_upgrade_marker(void) { return 2; }\n")
        if state["git"]:
            git(repo, "commit", "-q", "-am", "the next commit")
    state["second"] = git(repo, "rev-parse", "HEAD") if state["git"] else str(repo)
    new = ["--ref", state["second"]] if state["git"] else ["--source", str(repo)]
    up = j.run("upgrade", "upgrade", state["vk"], *new, "--model", a.model, "-j", "16", env_extra=j.sid)
    manifest = (Path(state["vk"]) / "rocforge-manifest.toml").read_text()
    state["upgraded_commit_in_manifest"] = state["second"] in manifest
    state["upgraded"] = up.returncode == 0 and "UPGRADED" in up.stdout
    refused = j.serve("serve (after the upgrade, before a verify)", ask=False)
    lines = [x for x in refused["stderr_tail"].splitlines() if "verify it at that shape: " in x]
    state["refusal"] = [x for x in refused["stderr_tail"].splitlines() if x.startswith("rocforge:")]
    if not lines:
        raise SystemExit("serve did not name a verify command")
    argv = shlex.split(lines[-1].split("verify it at that shape: ", 1)[1])
    j.run("the command serve named", *argv[1:])
    j.serve("serve (after the proving verify)", ask=True)


def run_parts(description: str, parts: dict, default_work: str, call) -> int:
    """The command line of a journey in parts (one device call each): `--part NAME` runs
    `call(parts[NAME], args, state, steps)`; the state between parts is kept in WORK/state.json,
    and each part's steps, state and time are added to the JSON file named by --json, even when
    a step fails."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--part", choices=tuple(parts), required=True)
    p.add_argument("--tree", required=True, help="a llama.cpp tree")
    p.add_argument("--model", required=True)
    p.add_argument("--work", default=default_work)
    p.add_argument("--sid-env", action="append", default=[], help="NAME=VALUE for builds and tune (glslc)")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    state_file = Path(a.work) / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    start = time.monotonic()
    steps: list[dict] = []
    try:
        call(parts[a.part], a, state, steps)
    finally:
        state_file.write_text(json.dumps(state))
        out = Path(a.json)
        done = json.loads(out.read_text()) if out.is_file() else {}
        done[a.part] = {"state": state, "steps": steps, "seconds": round(time.monotonic() - start, 1),
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out.write_text(json.dumps(done, indent=1))
        say(f"part {a.part} done in {time.monotonic() - start:.0f} s")
    return 0


def main() -> int:
    return run_parts(__doc__.splitlines()[0], {"builds": builds, "first": first, "second": second},
                     "/tmp/upgrade-journey", lambda part, a, state, steps: part(Journey(a, steps), state))


if __name__ == "__main__":
    sys.exit(main())
