"""Progress when stderr is not a terminal (pytest's capture is not one): plain lines every
ROCFORGE_PROGRESS_INTERVAL seconds with the step, [n/N] and the elapsed time.  The build's own
lines are checked on a real fixture build in tests/e2e/test_pipeline.py."""

from __future__ import annotations

import re
import time

from rocforge_build import download
from rocforge_build.measure.session import Progress

LINE = re.compile(r"rocforge: (?P<step>.+?)(?: \[(?P<n>[^\]]+)\])? (?P<s>\d+)s elapsed(?:: (?P<detail>.*))?")


def _beats(err: str) -> list[re.Match]:
    return [m for line in err.splitlines() if (m := LINE.fullmatch(line))]


def test_a_trickling_download_shows_its_step_size_and_time(http_server, tmp_path, monkeypatch, capsys):
    """8 bytes, one every 0.1 s (a real server on 127.0.0.1): with a 0.15 s interval at least
    three lines come, each naming the file and its size, 8 B."""
    monkeypatch.setenv("ROCFORGE_PROGRESS_INTERVAL", "0.15")
    url = http_server.add("/files/slow.tar.gz", b"12345678")
    http_server.fail("/files/slow.tar.gz", trickle=0.1)
    download.download(url, tmp_path / "slow.tar.gz", progress=True)
    beats = _beats(capsys.readouterr().err)
    assert len(beats) >= 3, beats
    assert {m["step"] for m in beats} == {"download slow.tar.gz"}
    assert all(m["n"].endswith("/8 B") for m in beats)


def test_no_lines_when_progress_is_off(http_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCFORGE_PROGRESS_INTERVAL", "0.05")
    url = http_server.add("/files/quiet.bin", b"1234")
    http_server.fail("/files/quiet.bin", trickle=0.1)
    download.download(url, tmp_path / "quiet.bin", progress=False)
    assert _beats(capsys.readouterr().err) == []


def test_bench_and_tune_rows_show_n_of_total_and_the_current_work(monkeypatch, capsys):
    monkeypatch.setenv("ROCFORGE_PROGRESS_INTERVAL", "0.05")
    p = Progress(3, step="tune")
    p.status("warming up cpu (one discarded run)")
    p.skip(1)
    # the heartbeat thread writes every 0.05 s: wait for its first line (a loaded machine may run
    # it late), not for a fixed time that hoped it had run
    err, deadline = "", time.monotonic() + 30
    while not _beats(err) and time.monotonic() < deadline:
        err += capsys.readouterr().err
        time.sleep(0.01)
    p.close()
    beats = _beats(err + capsys.readouterr().err)
    assert beats and beats[-1]["step"] == "tune" and beats[-1]["n"] == "1/3"
    assert beats[-1]["detail"] == "warming up cpu (one discarded run)"


# -- issue 25 item 19: verify, git fetches and nightly unpacks say where they are ---------------

def _slow_perplexity(prefix, seconds: float) -> None:
    """bin/llama-perplexity that takes `seconds` per run: the reference's run writes its KL base
    and PPL, a check prints a passing result line (what llama.cpp's KL-divergence mode ends with)."""
    from test_commands_env_path import GOOD

    exe = prefix / "bin" / "llama-perplexity"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text('#!/bin/sh\nif [ "$1" = --help ]; then echo "usage: -m FILE"; exit 0; fi\n'
                   f"sleep {seconds}\n"
                   'case " $* " in *" --kl-divergence "*) ;; *)\n'
                   '  while [ $# -gt 0 ]; do [ "$1" = --kl-divergence-base ] && : > "$2"; shift; done\n'
                   '  echo "Final estimate: PPL = 5.1240 +/- 0.1"; exit 0;; esac\n'
                   f"echo '{GOOD}'\n")
    exe.chmod(0o755)


def test_verify_shows_the_check_n_of_total_while_perplexity_runs(tmp_path, monkeypatch, capsys):
    """Two checks (one reference run each, then the build's), each run 0.5 s; with a 0.1 s
    interval the lines name verify, the checks done of 2 and what is running."""
    from pathlib import Path

    from stackfixtures import make_build
    from tiny_gguf import write as write_gguf

    from rocforge_build.measure import gguf, verify
    from rocforge_build.measure.llama_tools import LlamaBuild

    monkeypatch.setenv("ROCFORGE_PROGRESS_INTERVAL", "0.1")
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(tmp_path / "data"))
    ref = make_build(Path("/"), "llama-cpp", "gfx1151", "cpu", files=("bin/llama-cli",))
    build = make_build(Path("/"), "llama-cpp", "gfx1151", "vulkan", files=("bin/llama-cli",))
    _slow_perplexity(ref, 0.5)
    _slow_perplexity(build, 0.5)
    model = gguf.check(write_gguf(tmp_path / "tiny.gguf", byte_tokens=True))
    two = verify.Coverage([verify.Shape(64, 64, False), verify.Shape(128, 64, False)])
    said = []
    result = verify.verify(LlamaBuild.open(build), LlamaBuild.open(ref), model, two,
                           progress=said.append, record=False)
    assert result["passed"] and len(said) == 4  # two references, two checks
    beats = _beats(capsys.readouterr().err)
    assert {m["step"] for m in beats} == {"verify"}, beats
    assert {m["n"] for m in beats} >= {"0/2", "1/2"}
    details = [m["detail"] or "" for m in beats]  # a beat before the first detail has none
    assert any(d.startswith("reference ") for d in details)
    assert any("at ctx=64 ub=64 fa=off" in d for d in details)
    # a gate (no progress callback: bench and tune show their own line) prints none
    verify.verify(LlamaBuild.open(build), LlamaBuild.open(ref), model, two, record=False)
    assert _beats(capsys.readouterr().err) == []


def _slow_git(bindir, seconds: float) -> None:
    """git, with every fetch taking `seconds` longer (a slow network)."""
    import shutil

    real = shutil.which("git")
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "git"
    exe.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = fetch ] && sleep {seconds} && break; done\n'
                   f'exec {real} "$@"\n')
    exe.chmod(0o755)


def test_git_fetch_and_sparse_checkout_show_their_step(tmp_path, monkeypatch, capsys):
    import os

    from buildfixtures import git_repo

    from rocforge_build.forge import sources

    repo = git_repo(tmp_path / "repo")
    _slow_git(tmp_path / "bin", 0.5)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("ROCFORGE_PROGRESS_INTERVAL", "0.1")
    sources.GitSource(repo.as_uri(), ref="v1.2.0").fetch()
    beats = _beats(capsys.readouterr().err)
    assert beats and {m["step"] for m in beats} == {f"git {repo.as_uri()}"}, beats
    assert any(m["n"] == "1/3" and m["detail"].startswith("git fetch --depth 1 ") for m in beats)
    # the checkout shape (a real shallow, blob-less clone): fetch, checkout, submodules: [n/3]
    sources.GitSource(repo.as_uri(), ref="v1.2.0", submodules=True).fetch()
    beats = _beats(capsys.readouterr().err)
    assert beats and all(m["n"] in ("1/3", "2/3", "3/3") for m in beats), beats
    assert any(m["detail"].startswith("git fetch --depth 1 --filter=blob:none v1.2.0") for m in beats)
    # --no-progress's way (progress=False), into an empty cache: the same slow fetch, quiet
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(tmp_path / "cache2"))
    sources.GitSource(repo.as_uri(), ref="v1.2.0").fetch(progress=False)
    assert (tmp_path / "cache2" / "sources").is_dir()
    assert _beats(capsys.readouterr().err) == []
