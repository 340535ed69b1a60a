"""A user walking a journey (tests/journeys/): a fresh HOME, config, cache and data directory,
`rocforge` run in them as a command, `rocforge serve` started, asked and stopped with Ctrl-C as a
person does, and the processes a prefix's programs left behind.  Each step's cost is printed past
pytest's capture, so CI's log says what a journey costs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from llama_builds import shared_ccache


class User:
    """A fresh HOME, config, cache and data dir below `base`; `label` names the journey in its lines."""

    def __init__(self, base: Path, label: str):
        self.label = label
        self.base = base
        self.env = {**os.environ, "HOME": str(base / "home"), "CCACHE_DIR": shared_ccache(),
                    **{f"ROCFORGE_{v.upper()}_DIR": str(base / v) for v in ("config", "cache", "data")}}
        for v in ("home", "config", "cache", "data"):
            (base / v).mkdir(parents=True, exist_ok=True)

    def say(self, text: str) -> None:
        sys.__stderr__.write(f"\n[{self.label}] {text}\n")

    def rocforge(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "rocforge_build", *args], env=self.env, text=True,
                             capture_output=True, timeout=timeout)
        self.say(f"rocforge {args[0]}: exit {out.returncode} in {time.monotonic() - start:.0f} s")
        return out

    def serve(self, model: Path, *extra: str, ask: Callable[[int], None] | None = None) -> tuple[int, str, str]:
        """`rocforge serve MODEL EXTRA...`: when it announces its URL, `ask(port)` runs, then Ctrl-C;
        (exit code, stdout's first line, stderr)."""
        port = free_port()
        start = time.monotonic()
        argv = [sys.executable, "-m", "rocforge_build", "serve", str(model), "--port", str(port), "--wait", "1500",
                *extra]

        def asked(line: str) -> None:
            self.say(f"rocforge serve: announced its URL after {time.monotonic() - start:.0f} s")
            if ask is not None:
                assert f"http://127.0.0.1:{port}" in line, line
                ask(port)

        code, line, err = serve_until_url(argv, self.env, asked)
        if not line:
            self.say(f"rocforge serve: exited after {time.monotonic() - start:.0f} s")
        return code, line, err


def serve_until_url(argv: list[str], env: dict | None, on_url: Callable[[str], None] | None = None
                    ) -> tuple[int, str, str]:
    """`rocforge serve` run as a person runs it: when it prints its URL, `on_url(line)` runs, then
    Ctrl-C to its process group; (exit code, stdout's first line or "", stderr)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        line = proc.stdout.readline()
        if line:
            if on_url is not None:
                on_url(line)
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    return code, line, "".join(err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running_from(prefix: Path) -> list[int]:
    """The processes whose program lies in `prefix` (a llama-server left running, say)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "exe").startswith(str(prefix) + "/"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def capital(port: int) -> str:
    """An OpenAI-style client's question, one the trained 135M instruct model answers right."""
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16,
            "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]
