"""What a bisect's result says outside the terminal: the JSON document (`--json`) and the
pre-filled upstream issue (`--report FILE.md`), written only over a file rocforge wrote."""

from __future__ import annotations

import json
import platform
import shlex
from pathlib import Path

from rocforge_build.workflows.bisect import Asked, Result, short

REPORT_MARK = "<!-- written by rocforge bisect"

# axis -> (one candidate, the candidates)
WORDS = {"git": ("commit", "first-parent commits"), "versions": ("version", "versions"),
         "nightlies": ("nightly", "TheRock nightlies")}


def ours(head: bytes) -> bool:
    """A report file rocforge wrote: it starts with the mark, so it may be written over."""
    return head.startswith(REPORT_MARK.encode())


def to_json(asked: Asked, location: str, good: str, r: Result) -> dict:
    """`--json`'s document: the bisect as asked, the first bad candidate, and every step."""
    return {"recipe": asked.recipe, "target": asked.target, "backend": asked.backend, "axis": asked.axis,
            "source": location, "good": asked.good if asked.axis == "git" else good,
            "bad": asked.bad if asked.axis == "git" else r.candidates[-1],
            "candidates": len(r.candidates), "first_bad": r.first_bad,
            "first_bad_subject": r.subjects.get(r.first_bad) if r.first_bad else None,
            "suspects": r.suspects, "builds": r.builds, "steps": [s.to_json() for s in r.steps],
            "test": asked.test.words()}


def axis_words(asked: Asked, good: str, r: Result) -> str:
    """The command line's candidate part, as given (the report's reproduction)."""
    source = f" --source {shlex.quote(asked.source)}" if asked.source else ""
    if asked.axis == "git":
        return f"--good {shlex.quote(asked.good)} --bad {shlex.quote(asked.bad)}" + source
    return (f"--{asked.axis} {shlex.quote(asked.listed)} --good {shlex.quote(good)} --bad "
            f"{shlex.quote(r.candidates[-1])}" + source)


def report_text(asked: Asked, location: str, good: str, r: Result, host: dict, manifest: dict) -> str:
    """A pre-filled upstream issue: what regressed, where, on what (`host`, and the toolchain and
    configure line of a step's `manifest`), and how to reproduce it."""
    axis = asked.axis
    toolchain = manifest.get("toolchain", {}) if isinstance(manifest.get("toolchain"), dict) else {}
    word, plural = WORDS[axis]
    bad = asked.bad if axis == "git" else r.candidates[-1]
    shown_good = asked.good if axis == "git" else good
    title = (f"Regression in {short(r.first_bad)}: {r.subjects.get(r.first_bad, '')}"
             if r.first_bad else f"Regression between {shown_good} and {bad}")
    where = {"git": "Repository", "versions": "Tarballs", "nightlies": "Source"}[axis]
    lines = [f"{REPORT_MARK}; edit freely, rocforge may overwrite this file -->", "",
             f"# {title}", "",
             f"First bad {word}: `{r.first_bad or 'one of ' + ', '.join(r.suspects)}`  ",
             f"Good: `{shown_good}`, bad: `{bad}` ({len(r.candidates)} {plural}, "
             f"{r.builds} builds)  ", f"{where}: {location}", "",
             "## Hardware and host", "", f"- target: {asked.target}",
             f"- platform: {platform.platform()}"]
    lines += [f"- {k}: {json.dumps(v, default=str)}" for k, v in sorted(host.items())]
    lines += ["", "## ROCm and toolchain", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(toolchain.items()) if not isinstance(v, dict)]
    lines += [f"- backend: {manifest.get('backend', asked.backend or 'default')}", "",
              "## How it was found", "", "```sh",
              f"rocforge bisect {shlex.quote(asked.recipe)} --target {asked.target} "
              f"{axis_words(asked, good, r)}"
              + (f" --backend {asked.backend}" if asked.backend else "") + f" {asked.test.words()}",
              "```", "", f"| {word} | verdict | detail | {'subject' if axis == 'git' else 'what'} |",
              "|---|---|---|---|"]
    lines += [f"| `{short(s.ref)}` | {s.verdict} | {s.detail.replace('|', '/')} | "
              f"{r.subjects.get(s.ref, '').replace('|', '/')} |" for s in r.steps]
    flags = manifest.get("flags", {}) if isinstance(manifest.get("flags"), dict) else {}
    if flags.get("configure"):
        lines += ["", "Configure line of the builds:", "", "```sh",
                  " ".join(shlex.quote(str(a)) for a in flags["configure"]), "```"]
    return "\n".join(lines) + "\n"


def write_report(path: Path, asked: Asked, location: str, good: str, r: Result, root) -> None:
    """The report written to `path` (`--report`), with the host read under `root` and the latest
    step's manifest."""
    from rocforge_build import replace
    from rocforge_build.measure import provenance

    try:
        host = provenance.host(root)
    except Exception as exc:  # the report is still useful without it; say what happened
        from rocforge_build.errors import reason

        host = {"error": f"host details unreadable: {reason(exc)}"}
    replace.write_own_file(path, report_text(asked, location, good, r, host, step_manifest(r)),
                           "--report", ours)


def step_manifest(r: Result) -> dict:
    """The manifest of the latest step that has one: the toolchain and configure line shown."""
    from rocforge_build.discover.builds import read_manifest

    for s in reversed(r.steps):
        m = read_manifest(Path(s.prefix)) if s.prefix else None
        if m:
            return m
    return {}
