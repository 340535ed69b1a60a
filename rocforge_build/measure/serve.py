"""`rocforge serve`: run what tune proved — the preset's build's llama-server with the preset's
flags and environment — wait until it answers `/health`, and stop it whole on Ctrl-C.  A preset
whose build changed since it was verified is refused until the new build passes verify."""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass
from pathlib import Path

from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.measure.llama_tools import LlamaBuild


class ServeError(RocforgeError):
    exit_code = 9


@dataclass
class Plan:
    range: str
    why: str
    env: dict
    argv: list[str]
    url: str
    notes: list[str]


def pick_range(preset: dict, wanted: str) -> tuple[str, str]:
    """(range, why): `auto` serves the range with the longest context, since a server must hold
    the longest prompt its clients send."""
    ranges = preset["ranges"]
    if wanted != "auto":
        if wanted not in ranges:
            raise UsageError(f"the preset has no range {wanted!r}", f"ranges: {', '.join(ranges)}")
        return wanted, f"--range {wanted}"
    name = max(ranges, key=lambda n: ranges[n]["ctx"])
    return name, f"auto: the range with the longest context ({ranges[name]['ctx']} tokens)"


def still_proven(r: dict, store, model_sha: str) -> str | None:
    """None when the build is the one tune verified (same stamp), or a later build of the prefix
    passed verify with this model; else why serving it would be unproven."""
    build = LlamaBuild.open(r["prefix"])
    if build.stamp == r.get("stamp"):
        return None
    for row in reversed(list(store.rows(prefix=str(build.prefix), kind="verify"))):
        d = row.data
        if d.get("stamp") == build.stamp and d.get("model_sha256") == model_sha and d.get("passed"):
            return None
    return (f"{build.prefix} was rebuilt since the preset was verified (stamp {str(r.get('stamp'))[:12]} -> "
            f"{str(build.stamp)[:12]}) and the new build has not passed verify with this model")


def plan(preset: dict, model_path: str, wanted: str, host: str, port: int) -> Plan:
    name, why = pick_range(preset, wanted)
    r = preset["ranges"][name]
    argv = list(r["argv"])
    if Path(argv[0]).name != "llama-server":
        raise UsageError(f"the preset's build {r['prefix']} has no llama-server (it runs {Path(argv[0]).name})",
                         "rebuild it with llama-server (rocforge build ... --build-target llama-server) "
                         "and tune again")
    if "-m" in argv:
        argv[argv.index("-m") + 1] = model_path
    argv += ["--host", host, "--port", str(port)]
    shown = f"[{host}]" if ":" in host else host
    return Plan(name, why, dict(r["env"]), argv, f"http://{shown}:{port}", list(r.get("notes", [])))


def healthy(host: str, port: int, timeout: float = 2.0) -> bool:
    """llama-server answers 200 on /health once the model is loaded (503 while loading)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def run(p: Plan, host: str, port: int, *, wait_s: float, on_ready) -> int:
    """Start the server in its own process group, wait for /health, then until it ends; Ctrl-C or
    SIGTERM stops its whole tree (proc.reaped).  Returns the server's exit status."""
    from rocforge_build.proc import merged_env, reaped, spawn, stop_group

    child = spawn(p.argv, env=merged_env(p.env))
    with reaped(child):
        deadline = time.monotonic() + wait_s
        while not healthy(host, port):
            if child.poll() is not None:
                raise ServeError(f"llama-server exited with code {child.returncode} before it was ready",
                                 "run the command `rocforge serve --dry-run` prints to see its output")
            if time.monotonic() > deadline:
                stop_group(child)
                raise ServeError(f"llama-server did not answer {p.url}/health within {wait_s:g} s",
                                 "a large model loads slowly: give --wait SECONDS")
            time.sleep(0.25)
        on_ready()
        return child.wait()
