"""Attack tests (issue 30, items 5, 6 and 12): `rocforge serve` knows its own process, and every
tool rocforge runs has a deadline.

Played for real: a Python http.server on 127.0.0.1 answering /health 200 as "another program";
fake llama-servers (Python scripts) that never bind, fail to bind, or answer slowly; `git` and
`cmake` on PATH as shell scripts that hang (`sleep 3600`).  Each ends in one `rocforge: error:`
line with its documented exit code, nothing announced as serving that is not rocforge's own
server, and no process left behind."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import needs
import pytest
from buildfixtures import RECIPE, git_repo, project_copy
from test_proc import HANGS, alive, left_over, wait_for

from rocforge_build import cli, proc
from rocforge_build.measure.store import Store

REPO = Path(__file__).resolve().parents[2]
PROBE_S = 2.0  # ROCFORGE_PROBE_TIMEOUT for the hanging-tool tests (the default is 20 s)
# the bound an ended run must meet: the deadline, the stop's SIGTERM grace, a loaded 2-core
# CI machine's scheduling and the CLI's own start-up
MARGIN = 4.0


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rocforge: error:")]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- another program on the port: a real HTTP server answering /health 200 ---------------------
class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}')

    def do_POST(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class OtherProgram:
    """An HTTP server on 127.0.0.1:port that answers /health 200 (bound by this test process)."""

    def __init__(self, port: int):
        deadline = time.monotonic() + 10
        while True:  # the fake may hold the port for an instant while it tries to bind
            try:
                self.server = http.server.HTTPServer(("127.0.0.1", port), _Health)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# -- fake llama-servers --------------------------------------------------------------------------
SERVER_HEAD = r'''#!{python}
import http.server, json, os, socket, sys, time
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
here = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(here, "started"), "w").write(str(os.getpid()))
'''

NEVER_BINDS = SERVER_HEAD + '''
time.sleep(3600)  # loads "forever" and never listens
'''

FAILS_TO_BIND = SERVER_HEAD + '''
while True:  # llama-server's bind, retried until the port is taken (then it fails, as it does)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        print(f"main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}", flush=True)
        sys.exit(1)
    s.close()
    time.sleep(0.02)
'''

WARMS_UP = SERVER_HEAD + '''
COMPLETION_STATUS = 200
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(1.0)  # the first request's one-time warm-up
        open(os.path.join(here, "warm-up"), "w").write(json.dumps({"path": self.path, "body": json.loads(body)}))
        self.send_response(COMPLETION_STATUS)
        self.end_headers()
        self.wfile.write(b'{"content": "x"}')
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def install(tmp_path: Path, script: str, ranges: dict[str, int] | None = None) -> Path:
    """A fake build whose bin/llama-server is `script`, and a stored preset for model "m" that
    runs it (one range per name -> context); returns the build's bin directory."""
    from stackfixtures import make_build
    from test_measure_proof import preset

    from rocforge_build.discover.builds import read_manifest

    prefix = make_build(tmp_path / "builds", "llama-cpp", "gfx1151", "cpu")
    exe = prefix / "bin" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(script.replace("{python}", sys.executable))
    exe.chmod(0o755)
    p = preset(argv=[str(exe), "-m", "/m/m.gguf", "-c", "4096"])
    template = p["ranges"].pop("short")
    for name, ctx in (ranges or {"short": 4096}).items():
        p["ranges"][name] = {**template, "ctx": ctx, "prefix": str(prefix),
                             "stamp": read_manifest(prefix).get("stamp"),
                             "argv": [str(exe), "-m", "/m/m.gguf", "-c", str(ctx)]}
    with Store() as s:
        s.add_preset("m", "ab" * 32, 1, p)
    return exe.parent


def start_serve(port: int, wait: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rocforge_build", "serve", "m", "--port", str(port),
                             "--wait", str(wait), "--no-canary"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def stop_fake(bindir: Path) -> None:
    started = bindir / "started"
    if started.exists() and alive(int(started.read_text())):
        os.kill(int(started.read_text()), signal.SIGKILL)


@dataclass
class Ended:
    """A `rocforge serve` run's end: exit code, output, seconds, whether its fake still runs."""
    code: int
    out: str
    err: str
    seconds: float
    server_left: bool


def serve_to_its_end(bindir: Path, wait: float) -> Ended:
    """`rocforge serve` of the fake in `bindir` until it exits (killed after 60 s); whether serve
    stopped its fake is read before this stops it, so that cleanup is never taken for serve's."""
    serve = start_serve(free_port(), wait=wait)
    start = time.monotonic()
    try:
        out, err = serve.communicate(timeout=60)
        seconds = time.monotonic() - start
        started = bindir / "started"
        left = started.exists() and alive(int(started.read_text()))
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        stop_fake(bindir)
    return Ended(serve.returncode, out, err, seconds, left)


def serve_while_another_takes_the_port(bindir: Path, port: int, signal_file: str,
                                       wait: float) -> tuple[int, str, str]:
    """`rocforge serve` of the fake in `bindir`; once the fake writes `signal_file`, another
    program takes the port and answers /health.  (exit code, stdout, stderr).  The fake is
    stopped here only when serve had to be killed (it is in a process group of its own): whether
    serve stopped it is the caller's to check."""
    serve = start_serve(port, wait=wait)
    other = None
    try:
        wait_for(bindir / signal_file)
        other = OtherProgram(port)
        out, err = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            stop_fake(bindir)
        if other:
            other.close()
    return serve.returncode, out, err


def test_a_port_in_use_is_one_line_before_llama_server_starts(tmp_path, capsys):
    bindir = install(tmp_path, WARMS_UP)
    port = free_port()
    other = OtherProgram(port)
    try:
        rc = cli.main(["serve", "m", "--port", str(port), "--wait", "5", "--no-canary"])
    finally:
        other.close()
    out, err = capsys.readouterr()
    assert rc == 2
    assert error_lines(err) == [f"rocforge: error: port {port} on 127.0.0.1 is in use by another program"]
    assert "Traceback" not in err and "serving" not in out
    assert not (bindir / "started").exists()  # llama-server was never started
    assert "starting" not in err  # nor announced as starting


@pytest.mark.parametrize("fake", ["never binds", "fails to bind"])
def test_another_programs_health_is_never_taken_for_llama_servers(tmp_path, fake):
    """The trial: llama-server failed to bind while another program answered /health on the
    port, and serve announced "serving".  The other program takes the port after serve's check
    (the fake signals when it has started): its /health must not count."""
    bindir = install(tmp_path, NEVER_BINDS if fake == "never binds" else FAILS_TO_BIND)
    port = free_port()
    code, out, err = serve_while_another_takes_the_port(bindir, port, "started", wait=3)
    assert code == 9, err
    assert "serving" not in out  # never announced
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    if fake == "never binds":
        assert f"another program listens on http://127.0.0.1:{port}, and llama-server (pid" in lines[0]
    else:  # its own failure, with its last line
        assert lines[0] == ("rocforge: error: llama-server exited with code 1 before it was ready: main: "
                            f"couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}")
    assert not alive(int((bindir / "started").read_text()))  # and it is stopped


def test_serving_is_said_after_the_one_token_warm_up(tmp_path):
    bindir = install(tmp_path, WARMS_UP)
    port = free_port()
    serve = start_serve(port, wait=30)
    try:
        line = serve.stdout.readline()
        # the warm-up request was answered before the line was printed
        warm = json.loads((bindir / "warm-up").read_text())
        assert warm == {"path": "/completion", "body": {"prompt": "Hello", "n_predict": 1}}
        assert line.startswith(f"serving m at http://127.0.0.1:{port} (first request warmed up in ")
        took = float(line.split("warmed up in ")[1].split(" s;")[0])
        assert took >= 1.0  # the fake's one-second warm-up, measured
    finally:
        os.killpg(serve.pid, signal.SIGINT)
        serve.wait(timeout=30)
    assert not alive(int((bindir / "started").read_text()))


def test_a_server_that_cannot_complete_one_token_is_not_serving(tmp_path):
    """/health 200 but the first completion fails (HTTP 500): one line, exit 9, server stopped."""
    bindir = install(tmp_path, WARMS_UP.replace("COMPLETION_STATUS = 200", "COMPLETION_STATUS = 500"))
    ended = serve_to_its_end(bindir, wait=30)
    assert ended.code == 9 and "serving" not in ended.out and "Traceback" not in ended.err
    lines = error_lines(ended.err)
    assert len(lines) == 1 and "one-token request to http://127.0.0.1:" in lines[0] and lines[0].endswith(
        "/completion got HTTP 500"), ended.err
    assert (bindir / "started").exists() and not ended.server_left


def test_preset_show_shell_and_serve_default_to_the_same_range(tmp_path, capsys):
    """Both default to the longest context (`serve.default_range`): the script `preset show
    --shell` prints, run by sh without ROCFORGE_RANGE, starts the range serve starts."""
    install(tmp_path, WARMS_UP, ranges={"short": 4096, "long": 32768})
    assert cli.main(["serve", "m", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "range long (auto" in dry and "-c 32768 --host" in dry
    assert cli.main(["preset", "show", "m", "--shell"]) == 0
    script = tmp_path / "preset.sh"
    script.write_text(capsys.readouterr().out)
    # the script execs llama-server: a stand-in on PATH's place prints its arguments instead
    text = script.read_text()
    exe = next(w for w in text.split() if w.endswith("/bin/llama-server"))
    echo = tmp_path / "echo-args"
    echo.write_text('#!/bin/sh\necho "$@"\n')
    echo.chmod(0o755)
    script.write_text(text.replace(exe, str(echo)))
    env = {k: v for k, v in os.environ.items() if k != "ROCFORGE_RANGE"}
    ran = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert "-c 32768" in ran.stdout and "-c 4096" not in ran.stdout


# -- hanging tools (proc.run's own deadline: test_proc.py) -----------------------------------------
def hanging(bindir: Path, tool: str, pids: Path, *, only: str | None = None) -> None:
    """`tool` on PATH as a script that hangs (with a child: the whole tree must be stopped);
    with `only`, it hangs only when its first argument is `only` and else runs the real tool."""
    bindir.mkdir(exist_ok=True)
    body = HANGS.format(pids=pids)
    if only:
        real = shutil.which(tool)
        body = (f'#!/bin/sh\nif [ "$1" != "{only}" ]; then exec "{real}" "$@"; fi\n'
                + body.split("\n", 1)[1])
    (bindir / tool).write_text(body)
    (bindir / tool).chmod(0o755)


@needs.needs("git")
def test_a_hanging_git_ends_a_dry_run_in_one_line_naming_it(tmp_path, capsys, monkeypatch):
    src = git_repo(tmp_path / "src")  # a git tree as --source: rocforge asks git for its commit
    pids = tmp_path / "pids"
    hanging(tmp_path / "bin", "git", pids)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv(proc.PROBE_ENV, str(PROBE_S))
    start = time.monotonic()
    rc = cli.main(["build", str(RECIPE), "--target", "gfx1151", "--backend", "cpu", "--source", str(src),
                   "--dry-run"])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert rc == 5 and "Traceback" not in err
    assert error_lines(err) == [f"rocforge: error: git did not finish within {PROBE_S:g} s and was stopped: "
                                f"git -C {src} rev-parse HEAD"]
    assert elapsed < PROBE_S + MARGIN
    assert pids.read_text().split() and left_over(pids) == []  # the script and its sleep are gone


@needs.needs("git", "cmake", "ninja", "cc")
def test_a_hanging_cmake_ends_a_build_in_one_line_and_installs_nothing(tmp_path, capsys, monkeypatch):
    """A cmake that builds but hangs when asked its version (what rocforge records in the
    manifest): the build ends in one line naming it, and no build is installed."""
    src = project_copy(tmp_path / "src")
    pids = tmp_path / "pids"
    hanging(tmp_path / "bin", "cmake", pids, only="--version")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv(proc.PROBE_ENV, str(PROBE_S))
    prefix = tmp_path / "prefix"
    rc = cli.main(["build", str(RECIPE), "--target", "gfx1151", "--backend", "cpu", "--source", str(src),
                   "--prefix", str(prefix)])
    err = capsys.readouterr().err
    assert rc == 5 and "Traceback" not in err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith(
        f"rocforge: error: cmake did not finish within {PROBE_S:g} s and was stopped: "), err
    assert lines[0].endswith("cmake --version")
    assert not prefix.exists()
    assert pids.read_text().split() and left_over(pids) == []


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon", "1e300"])
def test_a_bad_probe_deadline_is_one_line(value, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(proc.PROBE_ENV, value)
    src = project_copy(tmp_path / "src")
    rc = cli.main(["build", str(RECIPE), "--target", "gfx1151", "--backend", "cpu", "--source", str(src),
                   "--dry-run"])
    lines = error_lines(capsys.readouterr().err)
    # the fixture's dry run asks a tool (git on the copy, patch checks): the bad value is refused
    assert rc == 2 and lines == [f"rocforge: error: {proc.PROBE_ENV}={value!r} is not a number of seconds "
                                 "above 0 up to 86400"]


# -- a second trial (issue 30): address, escaping, warm-up deadline, messages, death of serve -------
def bind_or_skip(family, address: str, port: int):
    import socket

    s = socket.socket(family)
    try:
        s.bind((address, port))
    except OSError as exc:
        s.close()
        pytest.skip(f"this machine cannot bind {address} ({exc.strerror})")
    s.listen()
    return s


def test_our_socket_on_another_address_of_the_port_is_not_ours(tmp_path):
    """proc.port_holder answers for the address serve connects to: our socket on [::1]:P says
    nothing of 127.0.0.1:P; a wildcard socket of ours takes 127.0.0.1 (the kernel's choice)."""
    import socket

    port = free_port()
    v6 = bind_or_skip(socket.AF_INET6, "::1", port)
    try:
        assert proc.port_holder(os.getpid(), "::1", port) == "ours"
        assert proc.port_holder(os.getpid(), "127.0.0.1", port) == "nobody"
        other = OtherProgram(port)  # bound by this process too: a child plays "another program"
        other.close()
        holder = subprocess.Popen([sys.executable, "-c", "import socket,sys,time; s=socket.socket(); "
                                   f"s.bind(('127.0.0.1',{port})); s.listen(); print(1, flush=True); "
                                   "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
        try:
            holder.stdout.readline()
            assert proc.port_holder(holder.pid, "127.0.0.1", port) == "ours"
            bystander = subprocess.Popen(["sleep", "60"])  # neither holder nor its ancestor
            try:
                assert proc.port_holder(bystander.pid, "127.0.0.1", port) == "other"
                assert proc.port_holder(bystander.pid, "::1", port) == "other"  # this test's own
            finally:
                bystander.kill()
                bystander.wait()
        finally:
            holder.kill()
            holder.wait()
    finally:
        v6.close()
    wild = bind_or_skip(socket.AF_INET, "0.0.0.0", port)
    try:
        assert proc.port_holder(os.getpid(), "127.0.0.1", port) == "ours"
    finally:
        wild.close()


SICK_ON_V6 = SERVER_HEAD + '''
import socket as _s
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503)  # loading, for ever
        self.end_headers()
    def log_message(self, *a):
        pass
class V6(http.server.HTTPServer):
    address_family = _s.AF_INET6
srv = V6(("::1", port), H)
open(os.path.join(here, "bound"), "w").write("1")
srv.serve_forever()
'''


def test_another_programs_health_on_the_address_serve_dials_is_not_ours(tmp_path):
    """The trial: the server listens on [::1]:P answering 503, another program on 127.0.0.1:P
    answers 200; serve on 127.0.0.1 must not say "serving"."""
    import socket

    bind_or_skip(socket.AF_INET6, "::1", 0).close()
    bindir = install(tmp_path, SICK_ON_V6)
    port = free_port()
    code, out, err = serve_while_another_takes_the_port(bindir, port, "bound", wait=4)
    stop_fake(bindir)
    assert code == 9 and "serving" not in out, (out, err)
    assert error_lines(err) == [f"rocforge: error: another program listens on http://127.0.0.1:{port}, and "
                                f"llama-server (pid {(bindir / 'started').read_text()}) did not within 4 s: "
                                "it was stopped"]


def serve_host(tmp_path: Path, host: str) -> tuple[str, list[str]]:
    """`serve --host HOST` of a fake that binds the --host it is given: (its first stdout line,
    the argv the fake got)."""
    script = WARMS_UP.replace('HTTPServer(("127.0.0.1", port)', 'HTTPServer((argv[argv.index("--host") + 1], port)')
    script = script.replace('open(os.path.join(here, "started")',
                            'open(os.path.join(here, "argv"), "w").write(json.dumps(argv))\nopen(os.path.join(here, "started")')
    bindir = install(tmp_path, script)
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "rocforge_build", "serve", "m", "--host", host,
                              "--port", str(port), "--wait", "30", "--no-canary"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = serve.stdout.readline()
    finally:
        os.killpg(serve.pid, signal.SIGINT)
        serve.wait(timeout=30)
        stop_fake(bindir)
    return line.replace(str(port), "PORT"), json.loads((bindir / "argv").read_text())


def test_a_host_name_is_resolved_once_for_the_server_and_for_serve(tmp_path):
    """`--host localhost` reaches llama-server as the one IP address serve connects to and prints."""
    from rocforge_build.serve import server as serve

    address = serve.resolve_host("localhost", 8080)
    assert address in ("127.0.0.1", "::1")
    line, argv = serve_host(tmp_path, "localhost")
    assert argv[argv.index("--host") + 1] == address
    shown = f"[{address}]" if ":" in address else address
    assert line.startswith(f"serving m at http://{shown}:PORT (first request"), line


def test_a_wildcard_host_prints_a_url_that_connects(tmp_path):
    line, argv = serve_host(tmp_path, "0.0.0.0")
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert line.startswith("serving m at http://127.0.0.1:PORT (listening on all addresses) (first "), line


GARBAGE = WARMS_UP.replace('''        self.send_response(COMPLETION_STATUS)
        self.end_headers()
        self.wfile.write(b'{"content": "x"}')''', '''        self.wfile.write(b"\\x00\\x01garbage\\x1b[31m\\r\\n\\r\\n")
        self.wfile.flush()''')


def test_a_servers_garbage_answer_is_one_escaped_line(tmp_path):
    ended = serve_to_its_end(install(tmp_path, GARBAGE), wait=30)
    assert ended.code == 9 and "serving" not in ended.out
    assert not any(c in ended.err for c in "\x00\x01\x1b\r"), repr(ended.err)
    lines = error_lines(ended.err)
    assert len(lines) == 1 and "garbage" in lines[0], ended.err
    assert lines[0].split("garbage")[1].startswith(" [31m")  # the ESC became a space


def test_a_tools_output_in_an_error_is_escaped(tmp_path):
    script = tmp_path / "noisy-tool"
    script.write_text("#!/bin/sh\nprintf 'ok\\n\\033[2J\\033]0;title\\007cleared\\r\\000x\\n'\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(proc.CommandFailed) as exc:
        proc.run([str(script), "a\nb"])
    text = str(exc.value)
    assert all(c.isprintable() for c in text.replace("\n", "")), repr(text)
    assert text.splitlines()[0] == f"command failed with exit code 3: {script} 'a b'"
    assert text.splitlines()[1:] == ["ok", "[2J ]0;title cleared", "x"]  # CR ends a line, NUL a space


HANGS_ON_COMPLETION = WARMS_UP.replace("time.sleep(1.0)  # the first", "time.sleep(3600)  # the first")


def test_the_warm_up_ends_within_wait_and_says_it_started(tmp_path):
    bindir = install(tmp_path, HANGS_ON_COMPLETION)
    ended = serve_to_its_end(bindir, wait=3)
    assert ended.seconds < 3 + 2 * MARGIN  # not the 120 s floor the trial met
    assert ended.code == 9 and "serving" not in ended.out
    assert "rocforge: serve: warming up: one token from http://127.0.0.1:" in ended.err
    lines = error_lines(ended.err)
    assert len(lines) == 1 and "answered /health but not a one-token request" in lines[0], ended.err
    assert (bindir / "started").exists() and not ended.server_left


EXITS_AFTER_HEALTH = WARMS_UP.replace('''    def do_GET(self):
        self.send_response(200)
        self.end_headers()''', '''    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.flush()
        print("bye", flush=True)
        os._exit(3)''')


def test_a_server_that_exits_after_health_is_said_to_have_exited(tmp_path):
    ended = serve_to_its_end(install(tmp_path, EXITS_AFTER_HEALTH), wait=30)
    assert ended.code == 9 and "serving" not in ended.out
    assert error_lines(ended.err) == ["rocforge: error: llama-server exited with code 3 after it answered /health: bye"]


ECHOES_HOSTILE_METADATA = EXITS_AFTER_HEALTH.replace('print("bye", flush=True)', (
    # what llama-server echoes of a GGUF's metadata, from a file whose strings carry terminal
    # controls: a title change (OSC), a screen clear, a carriage return over the line (read as
    # text, the carriage return ends a line of its own)
    'print("llama_model_loader: - kv   2: general.name str = \\x1b]0;owned\\x07\\x1b[2Jm\\rX", flush=True)\n'
    '        print("bye", flush=True)'))


def test_the_servers_output_reaches_the_terminal_with_its_controls_escaped(tmp_path):
    ended = serve_to_its_end(install(tmp_path, ECHOES_HOSTILE_METADATA), wait=30)
    assert ended.code == 9 and not any(c in ended.err for c in "\x1b\x07\r"), repr(ended.err)
    # line by line: rocforge's own lines (the warm-up) come from another thread and may fall between
    lines = ended.err.splitlines()
    assert "llama_model_loader: - kv   2: general.name str = \\x1b]0;owned\\x07\\x1b[2Jm" in lines, ended.err
    assert "X" in lines, ended.err


@pytest.mark.parametrize("value", ["127.0.0.1\nX", "a b", "-x", "http://h", "", "a..b", "x" * 254])
def test_a_bad_host_is_one_line_naming_it(value, capsys, tmp_path):
    install(tmp_path, WARMS_UP)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "m", "--host", value, "--dry-run"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    lines = error_lines(err)
    assert len(lines) == 1 and "--host" in lines[0] and "results store" not in err, err


def test_a_killed_serve_takes_its_server_with_it(tmp_path):
    """SIGKILL gives serve no chance to stop the server: PR_SET_PDEATHSIG does it."""
    bindir = install(tmp_path, WARMS_UP)
    serve = start_serve(free_port(), wait=30)
    try:
        assert serve.stdout.readline().startswith("serving m at ")
        server = int((bindir / "started").read_text())
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait(timeout=30)
        deadline = time.monotonic() + 10
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(server)
    finally:
        stop_fake(bindir)


def test_a_hanging_ldd_ends_at_the_probe_deadline(tmp_path, monkeypatch):
    from rocforge_build.ship import closure

    pids = tmp_path / "pids"
    hanging(tmp_path / "bin", "ldd", pids)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv(proc.PROBE_ENV, str(PROBE_S))
    start = time.monotonic()
    with pytest.raises(proc.ToolTimedOut) as exc:
        closure.ldd([Path(sys.executable)])
    assert time.monotonic() - start < PROBE_S + MARGIN
    assert str(exc.value).startswith(f"ldd did not finish within {PROBE_S:g} s")
    assert left_over(pids) == []


# -- issue 38 item 7: a trickling warm-up, a daemonizing llama-server ------------------------------
TRICKLES_ON_COMPLETION = WARMS_UP.replace('''        self.send_response(COMPLETION_STATUS)
        self.end_headers()
        self.wfile.write(b'{"content": "x"}')''', '''        self.send_response(COMPLETION_STATUS)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        for _ in range(100000):  # the answer's head at once, then a byte every 0.1 s
            self.wfile.write(b" ")
            self.wfile.flush()
            time.sleep(0.1)''')


def test_a_trickling_warm_up_is_one_error_line_and_no_traceback(tmp_path):
    """The warm-up's deadline passes while its answer trickles in: the deadline is the one error
    line, no thread of rocforge prints a traceback (its connection is closed by its own thread,
    never under a read in progress), and the server, stopped next, never sees its client vanish
    mid-answer (this fake would print its BrokenPipeError, relayed as the server's output)."""
    ended = serve_to_its_end(install(tmp_path, TRICKLES_ON_COMPLETION), wait=3)
    assert ended.code == 9 and "serving" not in ended.out
    assert "Traceback" not in ended.err and "Exception in thread" not in ended.err, ended.err
    lines = error_lines(ended.err)
    assert len(lines) == 1 and "answered /health but not a one-token request" in lines[0], ended.err
    assert not ended.server_left


DAEMONIZES = WARMS_UP.replace('http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()', '''
if os.fork() == 0:  # a daemon: its own session, then its parent gone, so init adopts it
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(here, "daemon.tmp"), "w").write(str(os.getpid()))
        os.rename(os.path.join(here, "daemon.tmp"), os.path.join(here, "daemon"))
        time.sleep(3600)
    os._exit(0)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()''')


def test_ctrl_c_stops_a_child_that_left_the_group_with_setsid(tmp_path):
    """llama-server's child daemonized (double fork, setsid): neither in serve's process group nor
    a descendant any more; Ctrl-C stops it too (proc.spawn's environment mark)."""
    bindir = install(tmp_path, DAEMONIZES)
    serve = start_serve(free_port(), wait=30)
    daemon = None
    try:
        assert serve.stdout.readline().startswith("serving m at ")
        wait_for(bindir / "daemon")
        daemon = int((bindir / "daemon").read_text())
        assert alive(daemon) and os.getsid(daemon) != os.getsid(int((bindir / "started").read_text()))
        os.killpg(serve.pid, signal.SIGINT)
        serve.wait(timeout=30)
        deadline = time.monotonic() + 10
        while alive(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(daemon) and not alive(int((bindir / "started").read_text()))
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        stop_fake(bindir)
        if daemon and alive(daemon):
            os.kill(daemon, signal.SIGKILL)


def test_the_relay_of_a_servers_output_ends_quietly_when_its_pipe_is_closed(monkeypatch):
    """stop_group closes llama-server's output pipe while the relay thread (LlamaServer's) may be between two
    lines (writing one to the terminal): its next read meets a closed file, which must end the
    relay, not print a thread's traceback before serve's error line."""
    from rocforge_build.serve.llama_server import LlamaServer

    read_fd, write_fd = os.pipe()
    stream = os.fdopen(read_fd, "r")
    in_write, closed, crashed = threading.Event(), threading.Event(), []

    class Terminal:
        def write(self, text):
            in_write.set()
            closed.wait(10)  # the pipe is closed while this line is being written

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_type))
    os.write(write_fd, b"a line\n")
    server = LlamaServer(["llama-server"], host="127.0.0.1", port=1)
    thread = server.read_output(stream)
    assert in_write.wait(10)
    stream.close()
    closed.set()
    os.close(write_fd)
    thread.join(10)
    assert not thread.is_alive() and crashed == [] and server.last_words() == "a line"


def test_the_last_words_are_the_servers_last_line_read_to_its_end():
    """An error's last words wait for the relay to read the output to its end (the server's exit
    closes the pipe), instead of a sleep that hoped it had: a line written just before the exit
    is the one named."""
    from rocforge_build.serve.llama_server import LlamaServer

    read_fd, write_fd = os.pipe()
    server = LlamaServer(["llama-server"], host="127.0.0.1", port=1, relay=False)
    server.read_output(os.fdopen(read_fd, "r"))
    os.write(write_fd, b"loading\n" + b"x" * 4000 + b"\nerror: out of memory\n")
    os.close(write_fd)
    assert server.last_words() == "error: out of memory"
