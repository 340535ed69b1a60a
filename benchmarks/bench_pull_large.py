"""A large layer's pull from a real registry: rocforge against `curl` on the same registry, side by
side in one run, at several sizes.

    python benchmarks/bench_pull_large.py [--sizes-mb 64,512,2048] [--rounds N]

A blob of random bytes of each size is pushed once into a real `docker-registry` (distribution
2.8, plain HTTP on 127.0.0.1, tests/registry_server.py), then pulled, rounds alternating which side
goes first:

- `rocforge`: `open_store(url).fetch_blob(desc, dest, cap=...)` as `rocforge build` pulls a
  substitute's layer: above `oci.RANGED_THRESHOLD` the first range alone, then parallel range
  requests, or one stream where that first range came at `oci.RANGED_ENOUGH` bytes/s or more
  (loopback does); sha256 of the bytes as they come, in order, checked at the end (nothing read
  twice);
- `rocforge N streams forced`: the same with parallel ranges whatever the size and the first
  range's rate (`--streams` picks N; default `oci.RANGED_STREAMS`);
- `rocforge 1 stream`: the same with `oci.RANGED_STREAMS = 1` (one GET, as before ranged pulls);
- `curl`: `curl -sfS -o FILE URL` of the same blob, which checks nothing.

Per side: the median time, GB/s (10^9 bytes/s), the ratio of its speed to curl's (above 1:
faster than curl), and the CPU cores it used, (user + sys) / wall, of the client (rocforge's own
process; curl's child) and of the registry process serving it (from /proc).  Also the machine's
load and core count at start and end, and sha256's speed on one core here (the bound of any pull
that checks the digest as it reads, since sha256 is sequential).  Needs `docker-registry` and
`curl` on PATH; nothing from the network.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEDIA = "application/octet-stream"
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """utime + stime of a process (its threads too), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sha256_speed() -> float:
    """GB/s of hashlib.sha256 over 256 MiB in 1 MiB updates (one core)."""
    block = os.urandom(1 << 20)
    h = hashlib.sha256()
    t = time.perf_counter()
    for _ in range(256):
        h.update(block)
    return (256 << 20) / (time.perf_counter() - t) / 1e9


def make_blob(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            block = os.urandom(min(left, 8 << 20))
            h.update(block)
            out.write(block)
            left -= len(block)
    return "sha256:" + h.hexdigest()


def curl_push(base: str, repo: str, path: Path, digest: str) -> None:
    head = subprocess.run(["curl", "-sfS", "-X", "POST", "-o", "/dev/null", "-D", "-",
                           f"{base}/v2/{repo}/blobs/uploads/"], capture_output=True, text=True, check=True)
    location = next(line.split(":", 1)[1].strip() for line in head.stdout.splitlines()
                    if line.lower().startswith("location:"))
    url = location + ("&" if "?" in location else "?") + f"digest={digest}"
    subprocess.run(["curl", "-sfS", "-X", "PUT", "-o", "/dev/null", "-H", f"Content-Type: {MEDIA}",
                    "-T", str(path), url], check=True)


def measure(fn, server_pid: int, clock) -> tuple[float, float, float]:
    """(wall s, client CPU s, server CPU s) of one call."""
    c0, s0, t0 = clock(), process_cpu(server_pid), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return wall, clock() - c0, process_cpu(server_pid) - s0


def one_size(tmp: Path, registry, size_mb: int, rounds: int, streams: list[int], piece: int) -> list[str]:
    from rocforge_build.substitute import oci
    from rocforge_build.substitute.stores import open_store

    size = size_mb * 1_000_000
    blob = tmp / f"blob-{size_mb}"
    digest = make_blob(blob, size)
    repo = f"bench/pull-{size_mb}"
    curl_push(registry.base, repo, blob, digest)
    blob.unlink()
    desc = oci.Descriptor(MEDIA, digest, size)
    url = registry.store_url(repo)
    dest = tmp / "pulled"

    def ours(count: int | None, forced: bool = False):
        def pull() -> None:
            dest.unlink(missing_ok=True)
            saved = oci.RANGED_STREAMS, oci.RANGED_PIECE, oci.RANGED_ENOUGH, oci.RANGED_THRESHOLD, oci.RANGED_CORES
            oci.RANGED_STREAMS = count or oci.RANGED_STREAMS
            oci.RANGED_PIECE = piece or oci.RANGED_PIECE
            if forced:
                oci.RANGED_ENOUGH, oci.RANGED_THRESHOLD = float("inf"), 1
            try:
                with open_store(url, timeout=60) as store:
                    store.fetch_blob(desc, dest, cap=1 << 40)
            finally:
                (oci.RANGED_STREAMS, oci.RANGED_PIECE, oci.RANGED_ENOUGH, oci.RANGED_THRESHOLD,
                 oci.RANGED_CORES) = saved
        return pull

    def curl() -> None:
        dest.unlink(missing_ok=True)
        subprocess.run(["curl", "-sfS", "-o", str(dest), f"{registry.base}/v2/{repo}/blobs/{digest}"],
                       check=True)

    sides = [("rocforge", ours(None), own_cpu)]
    sides += [(f"rocforge {n} streams forced", ours(n, forced=True), own_cpu)
              for n in streams or [oci.RANGED_STREAMS]]
    sides += [("rocforge 1 stream", ours(1), own_cpu), ("curl", curl, children_cpu)]
    for _, fn, _ in sides:  # one untimed pass: the registry's file in the page cache, imports warm
        fn()
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in sides}
    for n in range(rounds):
        for name, fn, clock in (sides if n % 2 == 0 else sides[::-1]):
            runs[name].append(measure(fn, registry.process.pid, clock))
    dest.unlink(missing_ok=True)
    med = {name: tuple(statistics.median(r[i] for r in v) for i in range(3)) for name, v in runs.items()}
    curl_wall = med["curl"][0]
    lines = []
    for name, (wall, client, server) in med.items():
        lines.append(f"| {size_mb} MB | {name} | {wall:.3f} s | {size / wall / 1e9:.2f} | "
                     f"{curl_wall / wall:.2f} | {client / wall:.2f} | {server / wall:.2f} |")
    return lines


def throttled(tmp: Path, size_mb: int, rate_mb: float, rounds: int) -> list[str]:
    """A link whose every connection is held to `rate_mb` MB/s (a server far away, a shaped
    CDN): tests/registry_server.FakeRegistry serving the blob (Range too) in 256 KiB blocks paced
    per connection.  rocforge's own choice, one stream and curl, side by side."""
    from registry_server import FakeRegistry

    from rocforge_build.substitute import oci
    from rocforge_build.substitute.stores import open_store

    data = os.urandom(size_mb * 1_000_000)
    dest = tmp / "pulled"

    def paced(request):
        found = request.headers.get("Range", "").removeprefix("bytes=").split("-")
        start = int(found[0]) if found[0] else 0
        end = int(found[1]) if len(found) > 1 and found[1] else len(data) - 1
        h = request.handler
        h.send_response(206 if request.headers.get("Range") else 200)
        if request.headers.get("Range"):
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        h.send_header("Content-Length", str(end - start + 1))
        h.end_headers()
        began = time.monotonic()
        try:
            for at in range(start, end + 1, 256 << 10):
                h.wfile.write(data[at:min(at + (256 << 10), end + 1)])
                ahead = began + (at + (256 << 10) - start) / (rate_mb * 1e6) - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        except OSError:
            pass
        return "raw", {}, b""

    with FakeRegistry() as fake:
        digest = fake.add_blob(data)
        desc = oci.Descriptor(MEDIA, digest, len(data))
        fake.route("GET", "/blobs/", paced)

        def ours(count: int | None):
            def pull() -> None:
                dest.unlink(missing_ok=True)
                saved = oci.RANGED_STREAMS
                oci.RANGED_STREAMS = count or oci.RANGED_STREAMS
                try:
                    with open_store(fake.store_url("bench/slow"), timeout=60) as store:
                        store.fetch_blob(desc, dest, cap=1 << 40)
                finally:
                    oci.RANGED_STREAMS = saved
            return pull

        def curl() -> None:
            dest.unlink(missing_ok=True)
            subprocess.run(["curl", "-sfS", "-o", str(dest), f"{fake.base}/v2/bench/slow/blobs/{digest}"],
                           check=True)

        sides = [("rocforge", ours(None), own_cpu), ("rocforge 1 stream", ours(1), own_cpu),
                 ("curl", curl, children_cpu)]
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in sides}
        for n in range(rounds):
            for name, fn, clock in (sides if n % 2 == 0 else sides[::-1]):
                runs[name].append(measure(fn, os.getpid(), clock))  # only the wall time is shown
    dest.unlink(missing_ok=True)
    curl_wall = statistics.median(r[0] for r in runs["curl"])
    lines = []
    for name, v in runs.items():
        wall = statistics.median(r[0] for r in v)  # no CPU: the server runs in this process
        lines.append(f"| {size_mb} MB at {rate_mb:g} MB/s per connection | {name} | {wall:.3f} s | "
                     f"{len(data) / wall / 1e9:.3f} | {curl_wall / wall:.2f} | - | - |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", default="64,512,2048", help="blob sizes in MB (default 64,512,2048)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each side (default 3)")
    ap.add_argument("--streams", default="", help="parallel streams to force (whatever the first "
                    "range's rate), as 2,4 (default: oci.RANGED_STREAMS)")
    ap.add_argument("--piece-mib", type=int, default=0, help="range size in MiB (default: oci.RANGED_PIECE)")
    ap.add_argument("--throttled", default="128@25", metavar="MB@MB_PER_S",
                    help="also a blob of MB from a server holding each connection to MB_PER_S "
                    "(default 128@25; empty: none)")
    a = ap.parse_args()
    for tool in ("docker-registry", "curl"):
        if shutil.which(tool) is None:
            print(f"bench_pull_large.py: skipped: {tool} is not on PATH (Debian: {tool})")
            return 0
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from registry_server import start_registry

    from rocforge_build.substitute import oci

    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()}", flush=True)
    print(f"sha256 on one core (hashlib, 1 MiB updates): {sha256_speed():.2f} GB/s", flush=True)
    print(f"rocforge: {oci.RANGED_STREAMS} streams of {oci.RANGED_PIECE >> 20} MiB ranges above "
          f"{oci.RANGED_THRESHOLD >> 20} MiB, one stream after a first range at "
          f"{oci.RANGED_ENOUGH / 1e6:.0f} MB/s or more on fewer than {oci.RANGED_CORES} cores", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="rocforge-bench-pull-"))
    rows = []
    try:
        with start_registry(tmp / "registry") as registry:
            for size_mb in (int(s) for s in a.sizes_mb.split(",")):
                added = one_size(tmp, registry, size_mb, a.rounds,
                                 [int(n) for n in a.streams.split(",") if n], a.piece_mib << 20)
                rows += added
                print("\n".join(added), flush=True)
            if a.throttled:
                size_mb, rate = a.throttled.split("@")
                added = throttled(tmp, int(size_mb), float(rate), a.rounds)
                rows += added
                print("\n".join(added), flush=True)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    print(f"\n{a.rounds} rounds alternating, medians; GB/s = 10^9 bytes/s; x curl = curl's time / this "
          "side's; cores = (user + sys) / wall")
    print("| size | side | time | GB/s | x curl | client cores | registry cores |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
