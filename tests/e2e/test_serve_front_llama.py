"""`rocforge serve --canary-every` on a real llama-server (slow; CI runs it): the May 2025 tree's
CPU backend built twice (the session's `measure_builds`: the reference and the wrong-on-demand
build, tests/data/patches/llama-cpp-wrong/), the trained SmolLM2-135M-Instruct
(tests/trained_model.py), on 127.0.0.1.

- `rocforge serve --canary-every 5s` (the start canary skipped: tests/e2e/test_serve_canary_llama.py
  covers it) answers an OpenAI-style client through its front — a streamed chat completion arrives
  as server-sent events, a plain one whole — says that the periodic canary passed, and stops on
  Ctrl-C.
- A server made wrong mid-way (the canary every second: the front is made here, past the CLI's 5 s floor): the front's upstream is a relay (a TCP relay written here, the one
  fake: a real llama-server cannot become another program while it runs) that forwards to the
  reference build's llama-server, then — while the front keeps serving — to the wrong-on-demand
  build's with ROCFORGE_TEST_WRONG=flash-attn and -fa (flash attention's output scaled, a real
  fault of the real program).  The canary passes before the switch, fails after it, the front
  answers 503 naming the failed check, and the failure is in the results store with the host.

Cost, measured on 2 shared cores at load average 8-12 (other builds and tests beside it), builds
from the session fixture (53-95 s of setup from the shared ccache when no other test made them):
the CLI test 92-106 s, the mid-way test 74-207 s — most of it llama-servers starting and the
reference's answers (a -np 1 server each time the plan's cache is cold), each a few seconds on a
quiet machine; expect well under 3 min for both there.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trained_model import smollm2

from rocforge_build.measure import gguf
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.serve import canary
from rocforge_build.serve import front as serve_front


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "llama-server exited"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            c.close()
        time.sleep(0.25)
    raise AssertionError(f"llama-server on {port} did not come up")


def llama_server(prefix: Path, model: Path, *extra: str, env: dict | None = None):
    port = free_port()
    proc = subprocess.Popen([str(prefix / "bin" / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "-c", "2048", "-np", "2", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    wait_healthy(port, proc)
    return proc, port


class Relay:
    """A TCP relay on 127.0.0.1 that sends each new connection to `self.to` (a port)."""

    def __init__(self, to: int):
        self.to = to
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.to), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)  # an answer may take longer than the connect's bound on a loaded machine
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def chat(port: int, stream: bool) -> tuple[int, bytes, int]:
    """(status, body, pieces read) of an OpenAI-style chat completion."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "stream": stream}
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    pieces, out = 0, b""
    while piece := r.read1(65536):
        pieces += 1
        out += piece
    c.close()
    return r.status, out, pieces


def store_preset(prefix: Path, model: Path) -> None:
    """The preset tune would store for this build (2 slots of 1024 tokens), put in the store
    directly: this module is about serving it."""
    from rocforge_build.measure import preset, provenance
    from rocforge_build.measure.store import Store

    build = LlamaBuild.open(prefix)
    penv, argv, notes = preset.command(build, str(model), {"ubatch": 512, "fa": False}, 2048, False)
    argv += ["-np", "2"]
    sha = provenance.model_sha256(model)
    entry = {"prefix": str(prefix), "backend": "cpu", "stamp": build.stamp, "depth": 0, "ctx": 2048,
             "variant": {"ubatch": 512, "fa": False, "env": {}}, "variant_label": "ub=512 fa=0", "score": 1.0,
             "figures": [], "runner_up": None, "env": penv, "argv": argv, "notes": notes,
             "verified": {"shape": {"ctx": 2048, "ubatch": 512, "fa": False, "ngl": None, "kv": "f16", "load": "mmap",
                                    "parallel": 2}}}
    with Store() as s:
        s.add_preset("smollm2", sha, None, {"model": {"name": "smollm2", "sha256": sha, "path": str(model)},
                                            "created": "test", "ranges": {"long": entry}})


@pytest.mark.slow
def test_serve_canary_every_answers_a_client_through_its_front(measure_builds):
    cpu, wrong = measure_builds
    model = smollm2()
    store_preset(wrong, model)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rocforge_build", "serve", str(model), "--port", str(port),
                             "--reference", str(cpu), "--no-canary", "--canary-every", "5s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    try:
        line = proc.stdout.readline()
        assert f"at http://127.0.0.1:{port}" in line, "".join(err)[-3000:]
        status, body, pieces = chat(port, stream=True)
        assert status == 200 and body.count(b"data: ") >= 3 and b"data: [DONE]" in body and pieces >= 2
        deadline = time.monotonic() + 120
        while not any("the first check while serving passed" in e for e in err) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert any("the first check while serving passed" in e for e in err), "".join(err)[-3000:]
        status, body, _ = chat(port, stream=False)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130  # Ctrl-C, as serve without the front (test_measure_slow.py)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in "".join(err)


@pytest.mark.slow
def test_a_server_made_wrong_mid_way_gets_503_through_the_front(measure_builds):
    from rocforge_build.measure.store import Store

    cpu, wrong = measure_builds
    model_path = smollm2()
    good, good_port = llama_server(cpu, model_path)
    bad, bad_port = llama_server(wrong, model_path, "-fa", env={"ROCFORGE_TEST_WRONG": "flash-attn"})
    relay = Relay(good_port)
    front = None
    try:
        model = gguf.check(model_path)
        target = canary.target_of(f"http://127.0.0.1:{relay.port}", ["-c", "2048", "-np", "2"])
        checker = serve_front.short_checker(model, LlamaBuild.open(cpu), target)
        front = serve_front.Front(("127.0.0.1", 0), ("127.0.0.1", relay.port), every=1.0, checker=checker)
        front.record = serve_front.store_recorder({"model_sha256": "test"}, LlamaBuild.open(wrong), ["test"],
                                                  "front", 1.0, lambda: front.stats)
        front.start()
        deadline = time.monotonic() + 180  # each canary is ~0.3 s alone, ~15 s on 2 cores at load 10
        while front.stats.passed < 1 and time.monotonic() < deadline:
            assert chat(front.port, stream=False)[0] == 200
            time.sleep(1.5)  # idle: the canary's turn
        assert front.stats.passed >= 1 and front.failure is None  # idle or overdue: tests/test_serve_front.py
        assert chat(front.port, stream=True)[0] == 200
        relay.to = bad_port  # the server goes wrong while the front serves
        deadline = time.monotonic() + 180
        while front.failure is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert front.failure is not None
        status, body, _ = chat(front.port, stream=True)
        err = json.loads(body)["error"]
        assert status == 503 and err["type"] == "canary_failed" and "canary: request 1" in err["message"]
        assert front.recorded.wait(60)  # the 503s come first, the store's row right after
        with Store() as s:
            (row,) = [r.data for r in s.rows(kind="canary")]
        assert not row["passed"] and row["failures"] == list(front.failure.failures)
        assert row["host"]["cpus"] and row["stamp"] == LlamaBuild.open(wrong).stamp
        assert row["while_serving"]["passed"] >= 1
    finally:
        if front:
            front.stop()
        relay.close()
        for p in (good, bad):
            p.terminate()
            p.wait(30)
