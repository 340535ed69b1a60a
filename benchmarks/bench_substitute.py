"""What a substitute store saves, measured side by side in one run against a real registry.

    python benchmarks/bench_substitute.py [--rounds N] [--blob-rounds N] [--blob-mb MB] [--profile]
                                          [--cmake-target NAME ...]
    python benchmarks/bench_substitute.py --blobs-only      # part 2 alone (seconds, no compile)

1. From nothing to a verified build: a cold compile of the May 2025 llama.cpp CPU build
   (`rocforge build recipes/llama-cpp.toml --target gfx1151 --backend cpu --source <the
   llama-cpp-python 0.3.9 sdist> --no-substitutes`: the recipe's default plan, every program it
   installs; `--cmake-target llama-perplexity` narrows both sides to that one program), fresh
   ROCFORGE_*_DIR, a fresh EMPTY CCACHE_DIR) vs the same command with `--substitute-only` on
   another fresh data dir, pulling that build from the registry (substitute.verify = quick with
   the trained SmolLM2-135M): pull + check + unpack + quick verify, and its manifest's
   [substituted.seconds] breakdown.  Round 1's cold compile is the publishing machine's own build
   (`rocforge publish --model`), so each round is one compile and one pull.
2. Blob throughput: rocforge's store (`open_store(url).push_blob_file` / `fetch_blob`) vs `curl`
   on the same registry (push: POST /v2/<repo>/blobs/uploads/ then PUT ?digest= with
   `--data-binary @file` and with `-T file`; pull: `curl -o`), a blob of random bytes and the real
   bundle layer, rounds alternating (each push into a fresh repository, so nothing is skipped as
   already there).  Ratios are curl / rocforge (above 1: rocforge faster).  rocforge hashes what it
   pushes and pulls; `sha256sum` of the same file is shown so curl + sha256sum can be compared too.

Needs `docker-registry` and `curl` on PATH and the network once (the sdist and the model are
fetched into ~/.cache/rocforge-test by tests/llama_trees.py and tests/trained_model.py, which
this script imports with tests/registry_server.py).  Prints medians and ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "llama-cpp.toml"
MEDIA = "application/octet-stream"


def rocforge(*args: str, env: dict, timeout: float = 3600) -> subprocess.CompletedProcess:
    """`rocforge ARGS` as a new process on `env`, stopping the benchmark with its stderr if it fails."""
    res = subprocess.run([sys.executable, "-m", "rocforge_build", *args], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    if res.returncode != 0:
        raise SystemExit(f"rocforge {' '.join(args[:2])} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res


def machine(base: Path, ccache: Path) -> dict:
    """A machine of its own: config, cache and data dirs, and the compiler cache it uses."""
    ccache.mkdir(parents=True, exist_ok=True)
    return {"ROCFORGE_CONFIG_DIR": str(base / "config"), "ROCFORGE_CACHE_DIR": str(base / "cache"),
            "ROCFORGE_DATA_DIR": str(base / "data"), "CCACHE_DIR": str(ccache)}


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def from_nothing(tmp: Path, registry, rounds: int, jobs: int, sdist: Path, model: Path,
                 targets: list[str]) -> dict:
    """Part 1: cold compile vs substitute pull on fresh machines; returns what part 2 reuses."""
    build = ["build", str(RECIPE), "--target", "gfx1151", "--backend", "cpu", "--source", str(sdist),
             *(a for t in targets for a in ("--cmake-target", t)), "-j", str(jobs), "--no-recheck"]
    store = registry.store_url("bench/llama")
    compiles, pulls, breakdowns, published = [], [], [], {}
    public = ""
    for n in range(rounds):
        a = machine(tmp / f"compile-{n}", tmp / f"compile-{n}" / "ccache-empty")
        if n == 0:
            public = rocforge("key", "generate", env=a).stdout.strip()
        t = time.perf_counter()
        prefix = rocforge(*build, "--no-substitutes", env=a).stdout.strip().splitlines()[-1]
        compiles.append(time.perf_counter() - t)
        print(f"  round {n + 1}: cold compile {compiles[-1]:.1f} s", flush=True)
        if n == 0:
            t = time.perf_counter()
            published = json.loads(rocforge("publish", prefix, "--to", store, "--model", str(model),
                                            "--json", env=a).stdout)
            print(f"  publish --model (bundle, sign, measure, push) {time.perf_counter() - t:.1f} s "
                  f"({published.get('kind')})", flush=True)
        b = machine(tmp / f"pull-{n}", tmp / f"pull-{n}" / "ccache-empty")
        for key, value in (("substitute.stores", json.dumps([store])),
                           ("substitute.trusted_keys", json.dumps([public])),
                           ("substitute.verify_model", str(model)), ("substitute.verify", "quick")):
            rocforge("config", "set", key, value, env=b)
        t = time.perf_counter()
        pulled = Path(rocforge(*build, "--substitute-only", env=b).stdout.strip().splitlines()[-1])
        pulls.append(time.perf_counter() - t)
        sub = tomllib.loads((pulled / "rocforge-manifest.toml").read_text())["substituted"]
        if sub["verified_here"] != "passed":
            raise SystemExit(f"the pulled build was not verified here: {sub['verified_here']}")
        breakdowns.append(sub["seconds"])
        print(f"  round {n + 1}: substitute pull {pulls[-1]:.1f} s {sub['seconds']}", flush=True)
    med = statistics.median
    what = ", ".join(targets) or "the recipe's default plan: every program"
    print(f"from nothing to a verified llama.cpp CPU build ({what}), {rounds} round(s), medians")
    print(f"  cold compile (empty ccache, -j {jobs})  {med(compiles):8.1f} s")
    print(f"  --substitute-only (pull, check, unpack, quick verify)  {med(pulls):8.1f} s")
    print(f"  ratio compile / substitute  {med(compiles) / med(pulls):.1f}x")
    parts = {k: med(b[k] for b in breakdowns) for k in ("check", "pull", "unpack", "verify")}
    rest = med(pulls) - sum(parts.values())
    print("  substitute breakdown [substituted.seconds]: "
          + "  ".join(f"{k} {v:.2f} s" for k, v in parts.items()) + f"  rest of the process {rest:.2f} s")
    return {"store": store, "tag": published.get("tag", "")}


def curl_push(base: str, repo: str, path: Path, digest: str, mode: str) -> None:
    """POST an upload, then PUT the file with ?digest= (`--data-binary @file` or `-T file`)."""
    head = subprocess.run(["curl", "-sfS", "-X", "POST", "-o", "/dev/null", "-D", "-",
                           f"{base}/v2/{repo}/blobs/uploads/"], capture_output=True, text=True, check=True)
    location = next(line.split(":", 1)[1].strip() for line in head.stdout.splitlines()
                    if line.lower().startswith("location:"))
    url = location + ("&" if "?" in location else "?") + f"digest={digest}"
    body = ["--data-binary", f"@{path}"] if mode == "data-binary" else ["-T", str(path)]
    subprocess.run(["curl", "-sfS", "-X", "PUT", "-o", "/dev/null", "-H", f"Content-Type: {MEDIA}", *body,
                    url], check=True)


def curl_pull(base: str, repo: str, digest: str, dest: Path) -> None:
    subprocess.run(["curl", "-sfS", "-o", str(dest), f"{base}/v2/{repo}/blobs/{digest}"], check=True)


def profile(fn, what: str) -> None:
    """The 12 costliest functions of one call, by their own time."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print(f"  profile of one {what}:")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip())[:6000])


def throughput(tmp: Path, registry, label: str, path: Path, rounds: int, want_profile: bool) -> None:
    """Part 2 for one file: rocforge vs curl, push and pull, rounds alternating."""
    import hashlib

    from rocforge_build.substitute.oci import Descriptor
    from rocforge_build.substitute.stores import open_store

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    size = path.stat().st_size
    desc = Descriptor(MEDIA, "sha256:" + h.hexdigest(), size)
    tag = label.split()[0]
    source_repo = f"bench/{tag}-src"
    with open_store(registry.store_url(source_repo), timeout=60) as store:
        store.push_blob_file(path, MEDIA)
    dest = tmp / f"{tag}.pulled"
    times: dict[str, list[float]] = {k: [] for k in ("push rocforge", "push curl -T", "push curl --data-binary",
                                                      "pull rocforge", "pull curl", "sha256sum")}
    pushes = 0

    def fresh_repo() -> str:
        nonlocal pushes
        pushes += 1
        return f"bench/{tag}-push-{pushes}"

    def push_ours() -> None:
        with open_store(registry.store_url(fresh_repo()), timeout=60) as s:
            got = s.push_blob_file(path, MEDIA)
        assert got.digest == desc.digest

    def pull_ours() -> None:
        dest.unlink(missing_ok=True)
        with open_store(registry.store_url(source_repo), timeout=60) as s:
            s.fetch_blob(desc, dest, cap=1 << 40)

    def pull_curl() -> None:
        dest.unlink(missing_ok=True)
        curl_pull(registry.base, source_repo, desc.digest, dest)

    steps = [("push rocforge", push_ours),
             ("push curl -T", lambda: curl_push(registry.base, fresh_repo(), path, desc.digest, "T")),
             ("push curl --data-binary",
              lambda: curl_push(registry.base, fresh_repo(), path, desc.digest, "data-binary")),
             ("pull rocforge", pull_ours), ("pull curl", pull_curl),
             ("sha256sum", lambda: subprocess.run(["sha256sum", str(path)], check=True, capture_output=True))]
    for step in steps:  # one untimed pass: the file in the page cache, connections and imports warm
        step[1]()
    for n in range(rounds):
        for name, fn in (steps if n % 2 == 0 else steps[::-1]):
            times[name].append(timed(fn))
    dest.unlink(missing_ok=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = size / 1e6
    print(f"{label}: {mb:.1f} MB, {rounds} rounds alternating, medians (MB/s)")
    for k in times:
        print(f"  {k:26s} {med[k]:7.3f} s  {mb / med[k]:7.0f} MB/s")
    print(f"  push: curl -T / rocforge {med['push curl -T'] / med['push rocforge']:.2f}   "
          f"curl --data-binary / rocforge {med['push curl --data-binary'] / med['push rocforge']:.2f}   "
          f"(curl -T + sha256sum) / rocforge {(med['push curl -T'] + med['sha256sum']) / med['push rocforge']:.2f}")
    print(f"  pull: curl / rocforge {med['pull curl'] / med['pull rocforge']:.2f}   "
          f"(curl + sha256sum) / rocforge {(med['pull curl'] + med['sha256sum']) / med['pull rocforge']:.2f}")
    if want_profile:
        profile(push_ours, f"rocforge push ({label})")
        profile(pull_ours, f"rocforge pull ({label})")
        dest.unlink(missing_ok=True)


def bundle_layer(tmp: Path, store_url: str, tag: str) -> Path | None:
    """The published build's bundle layer, fetched once (untimed) for part 2."""
    from rocforge_build.substitute.stores import open_store

    if not tag:
        return None
    with open_store(store_url, timeout=60) as store:
        man = store.manifest(tag)
        layer = max(man.layers, key=lambda d: d.size)
        out = tmp / "bundle-layer"
        store.fetch_blob(layer, out, cap=1 << 40)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="cold compiles and pulls (minutes each; default 1)")
    ap.add_argument("--blob-rounds", type=int, default=5, help="rounds of each blob transfer (default 5)")
    ap.add_argument("--blob-mb", type=int, default=200, help="random blob size in MB (default 200)")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--blobs-only", action="store_true", help="part 2 on a random blob only")
    ap.add_argument("--profile", action="store_true", help="cProfile one rocforge push and pull")
    ap.add_argument("--cmake-target", action="append", default=[], metavar="NAME",
                    help="build only these targets on both sides (default: the recipe's default plan)")
    a = ap.parse_args()
    for tool in ("docker-registry", "curl"):
        if shutil.which(tool) is None:
            print(f"bench_substitute.py: skipped: {tool} is not on PATH (Debian: "
                  f"{'docker-registry' if tool == 'docker-registry' else 'curl'})")
            return 0
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from registry_server import start_registry

    print(f"load average at start: {os.getloadavg()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-bench-substitute-"))
    try:
        with start_registry(tmp / "registry") as registry:
            published = {"store": "", "tag": ""}
            if not a.blobs_only:
                from llama_trees import sdist
                from trained_model import smollm2

                published = from_nothing(tmp, registry, a.rounds, a.jobs, sdist("0.3.9"), smollm2(),
                                         a.cmake_target)
            blob = tmp / "random.bin"
            with open(blob, "wb") as out:
                for _ in range(a.blob_mb):
                    out.write(os.urandom(1_000_000))
            throughput(tmp, registry, "random blob", blob, a.blob_rounds, a.profile)
            layer = bundle_layer(tmp, published["store"], published["tag"])
            if layer is not None:
                throughput(tmp, registry, "bundle layer (the published llama.cpp CPU build)", layer,
                           a.blob_rounds, a.profile)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
