"""A plain progress line for long work when stderr is not a terminal (a CI log, `2> build.log`,
nohup, a pipe): rich's bars draw only on a terminal, and without them such a log showed nothing
for the many minutes of a build, a download or a tune.  Every `ROCFORGE_PROGRESS_INTERVAL`
seconds (default 10) one line: `rocforge: STEP [n/N] ELAPSED elapsed: DETAIL`."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable

from rocforge_build.errors import UsageError

ENV = "ROCFORGE_PROGRESS_INTERVAL"
DEFAULT_SECONDS = 10.0


def interval() -> float:
    """Seconds between lines, from the environment (tests use a short one)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{ENV}={raw!r} is not a number of seconds > 0",
                         f"unset it (default {DEFAULT_SECONDS:g} s) or give e.g. {ENV}=10")
    return value


def elapsed_text(seconds: float) -> str:
    """`9s`, `1m05s`, `2h03m`: whole units, as a log reader wants them."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Heartbeat:
    """Prints the latest state of one piece of work every interval from a daemon thread, so a
    step that prints nothing for minutes (a long link, a stalled download) still shows it is
    alive.  Off on a terminal (the rich bar shows it there) and when `enabled` is false."""

    def __init__(self, step: str, *, enabled: bool = True, stream=None,
                 count: Callable[[int], str] = str):
        self.stream = stream if stream is not None else sys.stderr
        self.on = enabled and not _isatty(self.stream)
        self.every = interval() if self.on else 0.0
        self.step, self.count = step, count
        self.done: int | None = None
        self.total: int | None = None
        self.detail = ""
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, done: int | None = None, total: int | None = None, detail: str | None = None) -> None:
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if detail is not None:
            self.detail = detail

    def line(self) -> str:
        n = ""
        if self.done is not None:
            n = f" [{self.count(self.done)}/{self.count(self.total)}]" if self.total else f" [{self.count(self.done)}]"
        tail = f": {self.detail}" if self.detail else ""
        return f"rocforge: {self.step}{n} {elapsed_text(time.monotonic() - self.t0)} elapsed{tail}"

    def start(self) -> Heartbeat:
        if self.on and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rocforge-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.stream.write(self.line() + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # stderr closed (a reader went away): stay quiet
                return

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def human_size(n: int | None) -> str:
    """Bytes in decimal units, as `df -H` and download pages show them."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class DownloadProgress:
    """When asked for: a rich bar on a terminal, a plain line every interval otherwise."""

    def __init__(self, label: str, total: int | None, done: int, enabled: bool):
        self._bar = None
        self._beat = None
        if enabled and not sys.stderr.isatty():  # a log or pipe: a plain line every interval
            self._done = done
            self._beat = Heartbeat(f"download {label}", count=human_size).start()
            self._beat.update(done, total)
            return
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=total, completed=done)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)
        if self._beat is not None:
            self._done += n
            self._beat.update(self._done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._beat is not None:
            self._beat.stop()
            self._beat = None
