"""serve/session.py: one `rocforge serve` opens its build, its model, the results store and the
canary's reference once each, and reads the host's fingerprint once (issue 40 item 1), counted on a
whole serve with the start canary and the canary front: `cli.main(["serve", ...])` in this process
against a fake llama-server (a Python http.server script: /health, /props, /tokenize and
/completion with log-probabilities; it ends by itself once the start canary's requests are
answered), the openers wrapped to count their calls."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from stackfixtures import make_build
from test_measure_proof import preset
from tiny_gguf import write as write_gguf

from rocforge_build import cli
from rocforge_build.proc import free_loopback_port

FAKE = r'''#!{python}
import http.server, json, os, sys, threading
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
reference = "-np" in argv  # the canary's reference runs with -np 1; the preset's command has none
lock, answered = threading.Lock(), [0]

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, d):
        body = json.dumps(d).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/props":  # one slot of 70 tokens: no long prompt, two short requests
            return self.reply({"total_slots": 1, "default_generation_settings": {"n_ctx": 70}})
        self.reply({"status": "ok"})

    def do_POST(self):
        d = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            return self.reply({"tokens": [1, 2, 3]})
        if "n_probs" not in d:  # the one-token warm-up
            return self.reply({"content": "x"})
        self.reply({"completion_probabilities": [
            {"id": 5, "top_logprobs": [{"id": 5, "logprob": -0.01}, {"id": 6, "logprob": -5.0}]}] * d["n_predict"]})
        with lock:
            answered[0] += 1
            if not reference and answered[0] == 2:  # the start canary answered: this server ends
                threading.Timer(0.5, os._exit, (0,)).start()

    def log_message(self, *a):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


class StandInReference:
    """The canary's reference build, its llama-server the same fake (said so: the point here is
    how often serve opens things, not what the canary finds)."""

    gpu = False
    runtime_env: dict = {}
    backend = "cpu"

    def __init__(self, prefix: Path):
        self.prefix, self.stamp = prefix, "reference-stamp"

    def program(self, name: str) -> Path:
        return self.prefix / "bin" / name

    def label(self) -> str:
        return "the stand-in reference"


def _install(tmp_path: Path) -> Path:
    """A fake build whose bin/llama-server is FAKE, a tiny model, and a stored preset for model "m"
    serving it; returns the model's path."""
    from rocforge_build.discover.builds import read_manifest
    from rocforge_build.measure import provenance
    from rocforge_build.measure.store import Store

    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    exe = prefix / "bin" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(FAKE.replace("{python}", sys.executable))
    exe.chmod(0o755)
    model = write_gguf(tmp_path / "m.gguf")
    p = preset(argv=[str(exe), "-m", str(model), "-c", "4096"])
    p["ranges"]["short"].update(prefix=str(prefix), stamp=read_manifest(prefix).get("stamp"))
    sha = provenance.model_sha256(model)  # as tune hashed it
    p["model"].update(sha256=sha, path=str(model))
    with Store() as s:
        s.add_preset("m", sha, 1, p)
    return model


def test_one_serve_opens_its_build_model_store_reference_and_fingerprint_once(tmp_path, monkeypatch, capsys):
    from rocforge_build.discover import builds
    from rocforge_build.measure import gguf, provenance, verify_reference
    from rocforge_build.measure.llama_tools import LlamaBuild
    from rocforge_build.measure.store import Store

    model = _install(tmp_path)
    served = str(next((tmp_path / "builds").rglob("bin/llama-server")).parents[1])
    counts: dict[str, int] = {}

    def counted(name, fn):
        def wrapper(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return fn(*a, **k)
        return wrapper

    open_build, read_manifest = LlamaBuild.open.__func__, builds.read_manifest
    monkeypatch.setattr(LlamaBuild, "open", classmethod(counted("build", open_build)))
    monkeypatch.setattr(builds, "read_manifest", lambda prefix: (
        counted("manifest", read_manifest) if str(prefix) == served else read_manifest)(prefix))
    monkeypatch.setattr(gguf, "check", counted("model header", gguf.check))
    monkeypatch.setattr(provenance, "model_sha256", counted("model sha256", provenance.model_sha256))
    monkeypatch.setattr(provenance, "host", counted("fingerprint", provenance.host))
    monkeypatch.setattr(Store, "__init__", counted("store", Store.__init__))
    reference = StandInReference(Path(served))
    monkeypatch.setattr(verify_reference, "independent_reference",
                        counted("reference", lambda build, given, **k: reference))
    start = time.monotonic()
    code = cli.main(["serve", "m", "--port", str(free_loopback_port()), "--wait", "30", "--canary-every", "60s"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("serving m at http://127.0.0.1:"), (out, err)
    assert "canary passed in" in err and str(model) in err
    assert counts == {"build": 1, "manifest": 1, "model header": 1, "model sha256": 1, "fingerprint": 1,
                      "store": 1, "reference": 1}, counts
    assert time.monotonic() - start < 30
