"""What every measuring command does first: check the inputs (model, builds, results database)
before running anything, gather the provenance every row carries, and warn (one line each) when
that host fingerprint matches a known-bad state (nightly/known_bad.warn_before_measuring, which
serve calls too)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rocforge_build.discover import known_bad
from rocforge_build.measure import gguf, provenance
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.store import Store


@dataclass
class Session:
    model: gguf.Model
    store: Store
    base: dict  # provenance shared by every row: model, host, model_sha256


def open_session(model_path: str, builds: list[LlamaBuild], programs: tuple[str, ...], root=None) -> Session:
    model = gguf.check(model_path)
    for b in builds:
        for program in programs:
            b.program(program)
    store = Store()
    m = provenance.model(model)
    base = {"model_sha256": m["sha256"], "model": m, "host": provenance.host(root)}
    known_bad.warn_before_measuring(base["host"])
    return Session(model, store, base)


class Progress:
    """A progress bar on a terminal (rich), one line per finished row otherwise."""

    def __init__(self, total: int, quiet: bool = False, step: str = "bench"):
        from rocforge_build.progress import Heartbeat

        self.quiet = quiet
        self.bar = None
        self.done, self.total = 0, total
        # not a terminal: besides a line per row, a plain line every interval (a row can take minutes)
        self.beat = Heartbeat(step, enabled=not quiet).start()
        self.beat.update(0, total or None)
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            # redrawn once a second, not rich's default 10: its thread would take CPU from a
            # CPU build's llama-bench all along the run (the elapsed time shows whole seconds)
            self.bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), transient=True, refresh_per_second=1)
            self.task = self.bar.add_task("bench", total=total)
            self.bar.start()

    def status(self, text: str) -> None:
        self.beat.update(detail=text)
        if self.bar is not None:
            self.bar.update(self.task, description=text)
        elif not self.quiet:
            sys.stderr.write(f"rocforge: {text}\n")

    def advance(self, row: dict) -> None:
        self.done += 1
        self.beat.update(self.done)
        if self.bar is not None:
            self.bar.advance(self.task)
        elif not self.quiet:
            sys.stderr.write(f"  {describe(row)}\n")

    def skip(self, n: int) -> None:
        self.done += max(n, 0)
        self.beat.update(self.done)
        if self.bar is not None and n > 0:
            self.bar.advance(self.task, n)

    def close(self) -> None:
        self.beat.stop()
        if self.bar is not None:
            self.bar.stop()


def describe(row: dict) -> str:
    if row.get("test") == "gate":
        return f"{row.get('prefix')}: gate failed"
    n = row.get("n_prompt") if row.get("test") == "pp" else row.get("n_gen")
    what = f"{row.get('test')}{n} @ d{row.get('depth')}"
    if row.get("status") != "ok":
        return f"{what}: {row.get('status')}: {row.get('error')}"
    from rocforge_build.measure.roofline import note

    share = note(row)
    spread = "" if row.get("stddev") is None else f" ± {row['stddev']:.2f}"  # None: one repetition
    return f"{what}: {row.get('t_s', 0):.2f}{spread} t/s" + (f" ({share})" if share else "")
