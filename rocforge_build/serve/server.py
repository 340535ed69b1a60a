"""`rocforge serve`: run what tune proved — the preset's build's llama-server with the preset's
flags and environment — wait until it answers `/health`, and stop it whole on Ctrl-C.  A preset
whose build changed since it was verified is refused until a verify of the new build covers the
range's verified shape (`covers`).

Ready means its own llama-server answered: --host is resolved once to one IP address, which the
server is told to listen on and serve connects to; the port is checked free before it starts, and
`/health` counts only while the socket that takes a connection to that address and port is the
child's (proc.port_holder); a one-token request then pays the first request's one-time warm-up,
within what is left of --wait, before "serving" is said.  The process itself (its start, its
readiness, its requests, its stop) is serve/llama_server.py's `LlamaServer`; what one serve works
with, each opened once, is serve/session.py's `ServeSession`."""

from __future__ import annotations

import errno
import json
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rocforge_build.errors import RocforgeError, UsageError
from rocforge_build.measure import serving
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.preset import model_at, pick_range
from rocforge_build.measure.preset_values import Preset, PresetRange, VerifiedShape
from rocforge_build.serve.llama_server import LlamaServer, NotReady, ServerError, dial_address

__all__ = ["Plan", "ServeError", "check_port", "covers", "dial_address", "model_file", "plan", "resolve_host",
           "run", "served_dimensions", "still_proven", "verified_shape", "warm_up"]


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
    host: str
    port: int


def verified_shape(r: PresetRange, build: LlamaBuild) -> tuple[VerifiedShape, dict[str, str]]:
    """(shape, env) a range was verified at before it was stored: tune's `verified.shape` (the
    range's context, its -ub, flash attention and -ngl) and the variant's env, which verify runs
    the build with on top of its runtime env.  A range stored without `verified` is taken at the
    shape tune would have checked: its context, -ub (llama.cpp's default 512), flash attention,
    -ngl 99 on a GPU build."""
    shape = r.verified_shape or VerifiedShape(ctx=r.ctx, ubatch=r.variant.ubatch or 512, fa=bool(r.variant.fa),
                                              ngl=99 if build.gpu else None)
    if not shape.serving_known:  # stored before verify knew them: what its argv serves
        shape = replace(shape, **served_dimensions(r.argv, shape.to_json()))
    return shape, dict(r.variant.env)


def served_dimensions(argv: list, shape: dict) -> dict:
    """The serving dimensions a stored command runs (serving.SERVING_FIELDS), read from its argv:
    -ctk, the weights' loading (--no-mmap, -dio/--direct-io, -lm), -np; what it leaves out is
    llama.cpp's default."""
    words = [str(w) for w in argv]

    def after(*names) -> str | None:
        return next((words[i + 1] for i, w in enumerate(words[:-1]) if w in names), None)

    mode = after("-lm", "--load-mode")
    load = ("dio" if {"-dio", "--direct-io"} & set(words) or mode == "dio" else
            "read" if "--no-mmap" in words or mode == "none" else "mmap")
    np = after("-np", "--parallel")
    return {"kv": after("-ctk", "--cache-type-k") or "f16", "load": load,
            "parallel": int(np) if np and np.isascii() and np.isdigit() and int(np) > 0 else 1}


def covers(d: dict, stamp: str | None, model_sha: str, shape: dict, env: dict) -> bool:
    """Whether a verify row proves a build at a preset's shape: the build's current stamp and this
    model, every check passed (not one right shape of a build wrong elsewhere), run with the same
    env (`--env`), and among its checks exactly the preset's context, micro-batch, flash attention
    and offload.  Exactly: a fault can show at one context or one micro-batch only (RoPE past 5000
    tokens, RMS norm in 256-token batches: tests/e2e/test_verify_shapes.py), so a check at another
    shape, or a `--quick` one at the shortest context, says nothing of the preset's."""
    if not stamp or d.get("stamp") != stamp or d.get("model_sha256") != model_sha or d.get("passed") is not True:
        return False
    row_env = d.get("env") if isinstance(d.get("env"), dict) else {}
    if {str(k): str(v) for k, v in row_env.items()} != env:
        return False

    def key(s: dict) -> tuple:  # a check without the serving dimensions (an older verify) matches none
        return (s.get("ctx"), s.get("ubatch"), bool(s.get("fa")), s.get("ngl"),
                *(s.get(k) for k in serving.SERVING_FIELDS))

    return serving.serving_known(shape) and any(
        isinstance(c, dict) and c.get("passed") is True and serving.serving_known(c) and key(c) == key(shape)
        for c in d.get("checks") or [])


def still_proven(r: PresetRange, store, model_sha: str, model_path: str, build: LlamaBuild | None = None
                 ) -> tuple[str, str] | None:
    """None when the build is the one tune verified (same stamp), rocforge's reference itself (a CPU
    build of the default plan: nothing to verify it against), or a verify of the build as it is
    now, with this model, covers the range's verified shape (`covers`); else (why serving it would
    be unproven, the `rocforge verify` command that would prove it).  `build`: the range's build,
    already opened by the caller."""
    from rocforge_build.measure import verify, verify_reference

    build = build or LlamaBuild.open(r.prefix)
    old_proof = r.verified_shape is None or not r.verified_shape.serving_known
    if build.stamp and build.stamp == r.stamp and not old_proof:  # no stamp proves nothing
        return None
    if verify_reference.is_default_plan(build):  # the reference itself: verify has nothing to compare it
        return None  # with (its one line); the canary checks it against rocforge's own build of the plan
    typed, env = verified_shape(r, build)
    shape = typed.to_json()
    for row in reversed(list(store.rows(prefix=str(build.prefix), kind="verify"))):
        if covers(row.data, build.stamp, model_sha, shape, env):
            return None
    label = verify.Shape.from_json(shape).label()
    with_env = " with " + " ".join(f"{k}={v}" for k, v in sorted(env.items())) if env else ""
    if build.stamp and build.stamp == r.stamp:
        return (f"the preset was verified before verify checked the KV cache type, the weights' loading "
                f"and parallel slots, and no verify of {build.prefix} with this model covers the shape it "
                f"serves ({label}{with_env})",
                f"verify it at that shape: {verify.command_line(build.prefix, model_path, shape, env)}")
    return (f"{build.prefix} was rebuilt since the preset was verified (stamp {str(r.stamp)[:12]} -> "
            f"{str(build.stamp)[:12]}) and the new build has not passed verify with this model at the "
            f"preset's shape ({label}{with_env})",
            f"verify it at that shape: {verify.command_line(build.prefix, model_path, shape, env)}")


def model_file(path: str, sha256: str | None = None) -> str:
    """The model serve names after -m, absolute (never a word llama-server takes for an option);
    refused when something other than a regular file is there (a device such as /dev/zero, a FIFO,
    a directory).  The sha256 that picked the preset is checked where the GGUF path is given
    (`preset.model_key`); a path the preset stored is checked here against the preset's `sha256`
    (the model it was tuned for) through the digests kept per file (`provenance.model_sha256`: no
    hash while the file is the one tune read; a file put there since, or a link to another, is
    hashed once and refused).  An absent file is llama-server's one error line."""
    import os
    import stat

    from rocforge_build.shellsafe import one_line

    full = os.path.abspath(path)
    try:
        mode = os.stat(full).st_mode
    except FileNotFoundError:
        return full
    except (OSError, ValueError) as exc:
        raise UsageError(f"the preset's model {one_line(full)!r} cannot be read "
                         f"({getattr(exc, 'strerror', None) or exc})",
                         "pass the GGUF file: rocforge serve PATH/TO/MODEL.gguf") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"the preset's model {one_line(full)!r} is not a regular file",
                         "pass the GGUF file: rocforge serve PATH/TO/MODEL.gguf")
    if sha256 is not None:
        from rocforge_build.measure import provenance

        now = provenance.model_sha256(Path(full))
        if now != sha256:
            raise UsageError(f"the preset's model {one_line(full)!r} is not the model the preset was "
                             f"tuned for: its sha256 is {now[:12]}, the preset's {str(sha256)[:12]} "
                             "(the file was replaced, or is a link to another)",
                             "pass the GGUF file the preset was made for: rocforge serve "
                             "PATH/TO/MODEL.gguf; or tune this one (`rocforge tune`)")
    return full


def plan(preset: Preset, model_path: str, wanted: str, host: str, port: int) -> Plan:
    name, why = pick_range(preset, wanted)
    r = preset.ranges[name]
    argv = list(r.argv)
    if Path(argv[0]).name != "llama-server":
        raise UsageError(f"the preset's build {r.prefix} has no llama-server (it runs {Path(argv[0]).name})",
                         "rebuild it with llama-server (rocforge build ... --cmake-target llama-server) "
                         "and tune again")
    at = model_at(argv)  # the one model word the preset schema allows
    if at is not None:
        argv[at] = model_path
    argv += ["--host", host, "--port", str(port)]
    dial = dial_address(host)
    shown = f"[{dial}]" if ":" in dial else dial
    return Plan(name, why, dict(r.env), argv, f"http://{shown}:{port}", list(r.notes), host, port)


def resolve_host(host: str, port: int) -> str:
    """--host as the one IP address llama-server is told to listen on and serve connects to:
    its first address (getaddrinfo's order, which llama-server's own bind takes first), so a name
    such as localhost cannot mean ::1 to the server and 127.0.0.1 to the /health check."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host!r} is not an address of this machine ({exc})",
                         "give an address to listen on, e.g. --host 127.0.0.1") from None
    return str(infos[0][4][0])


def check_port(host: str, port: int) -> None:
    """Refuse, before anything starts, a port another program already listens on: bound here
    (with SO_REUSEADDR, as llama-server binds) and let go at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host!r} is not an address of this machine ({exc})",
                         "give an address to listen on, e.g. --host 127.0.0.1") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise UsageError(f"port {port} on {host} is in use by another program",
                                     "stop that program, or serve on another port: --port N") from None
                raise UsageError(f"cannot listen on {host} port {port}: {exc.strerror}",
                                 "give an address of this machine (--host) and a port you may use "
                                 "(below 1024 needs root)") from None


def _wait_ready(server: LlamaServer, p: Plan, wait_s: float) -> None:
    """Until /health answers 200 from a socket the child (or its descendants) listens on
    (LlamaServer.wait_ready), in serve's words."""
    try:
        server.wait_ready(wait_s)
    except NotReady as why:
        if why.why == "exited":
            raise ServeError(f"llama-server exited with code {why.code} before it was ready"
                             + _said(why.last), "its output is above") from None
        if why.why == "other":
            raise ServeError(f"another program listens on {p.url}, and llama-server (pid "
                             f"{server.pid}) did not within {wait_s:g} s: it was stopped",
                             "stop that program, or serve on another port: --port N") from None
        raise ServeError(f"llama-server did not answer {p.url}/health within {wait_s:g} s",
                         "a large model loads slowly: give --wait SECONDS") from None


def _said(last: str) -> str:
    return f": {last[:300]}" if last else ""


def warm_up(server: LlamaServer, p: Plan, timeout: float) -> float:
    """One request for one token: a fresh GPU compiles and loads its kernels on the first request
    (tens of seconds: docs/measurements/measuring.md), which the first client would otherwise
    wait for.  The whole request (a server that trickles its answer too) ends within `timeout`
    seconds.  Returns the seconds it took."""
    headers = {"Content-Type": "application/json"}
    if "--api-key" in p.argv[:-1]:
        headers["Authorization"] = f"Bearer {p.argv[p.argv.index('--api-key') + 1]}"
    body = json.dumps({"prompt": "Hello", "n_predict": 1}).encode()
    start = time.monotonic()
    try:  # the bounded exchange: its reader thread ends its own connection, so nothing of http.client
        # is closed under a read in progress (which raised on that thread, a traceback); not cut at
        # the deadline: the server is stopped next
        status, _ = server.request("POST", "/completion", body, headers, timeout=max(timeout, 0.001), cut=False)
    except ServerError as exc:
        raise ServeError(f"llama-server answered /health but not a one-token request to {p.url}"
                         f"/completion within {timeout:g} s ({exc.message})",
                         "a fresh GPU's first request can take a minute: give --wait SECONDS "
                         "(it bounds the load and this warm-up together)") from None
    if status != 200:
        raise ServeError(f"llama-server's one-token request to {p.url}/completion got HTTP {status}",
                         "its output is above")
    return time.monotonic() - start


def run(p: Plan, *, wait_s: float, on_ready, before_ready=None) -> int:
    """Start the plan's llama-server (LlamaServer: its own process group, its output relayed to
    stderr); wait until it is ready (`_wait_ready`) and warmed up (`warm_up`), then until it ends.
    Ctrl-C, SIGTERM or an error stops its whole tree.  `before_ready(p)` (the numerics canary) runs
    against the live server before `on_ready`; what it raises stops the server.  Returns its exit
    status."""
    with LlamaServer(p.argv, host=p.host, port=p.port, env=p.env).start() as server:
        start = time.monotonic()
        _wait_ready(server, p, wait_s)
        left = max(wait_s - (time.monotonic() - start), 0.0)
        sys.stderr.write(f"rocforge: serve: warming up: one token from {p.url}/completion "
                         f"(at most {left:.0f} s of --wait left)\n")
        sys.stderr.flush()
        try:
            took = warm_up(server, p, left)
        except ServeError:
            server.wait(0.5)  # a server that died answers with a reset before its exit is seen
            if server.returncode is None:
                raise
        if server.returncode is not None:
            raise ServeError(f"llama-server exited with code {server.returncode} after it answered /health"
                             + _said(server.last_words()), "its output is above")
        if before_ready is not None:
            before_ready(p)
        on_ready(took)
        code = server.wait()
        server.stop(grace=2.0)  # what llama-server left running (a daemonized child) ends with it
    return code
