"""Progress when stderr is not a terminal (pytest's capture is not one): plain lines every
ROCFORGE_PROGRESS_INTERVAL seconds with the step, [n/N] and the elapsed time.  The build's own
lines are checked on a real fixture build in tests/test_pipeline.py."""

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
    time.sleep(0.3)
    p.close()
    beats = _beats(capsys.readouterr().err)
    assert beats and beats[-1]["step"] == "tune" and beats[-1]["n"] == "1/3"
    assert beats[-1]["detail"] == "warming up cpu (one discarded run)"
