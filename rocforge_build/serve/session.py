"""What one `rocforge serve` works with, each opened once and handed down (docs/layout.md, "One
served request, walked"): the results store (open for the whole serve), the preset and its range,
the range's build, the model, the host's fingerprint and the canary's reference build.

`find` picks the preset's range for a model and proves it servable (`Choice`); `this_host` reads
the fingerprint once (and warns of a known-bad host); `ServeSession.open` adds the model's header
and the canary's reference when a canary runs; `run` serves it: llama-server alone
(serve/server.py) or behind the canary front (serve/front.py), the start canary before the URL is
said (serve/canary.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocforge_build import shellsafe
from rocforge_build.errors import UsageError
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.measure.preset_values import Preset, PresetRange


@dataclass(frozen=True)
class ServedModel:
    """The model served: its absolute path, the sha256 the preset was tuned for (checked against
    the file: server.model_file), its name, and its GGUF header (read once, when a canary needs it;
    canary.plan reads the training context, file type and vocabulary from here)."""

    path: str
    sha256: str
    name: str | None
    header: object | None = None

    @property
    def n_ctx_train(self):
        return getattr(self.header, "n_ctx_train", None)

    @property
    def file_type(self):
        return getattr(self.header, "file_type", None)

    @property
    def n_vocab(self):
        return getattr(self.header, "n_vocab", None)


@dataclass(frozen=True)
class Choice:
    """The preset's range picked for a model, its build opened once and proven (`find`)."""

    preset: Preset
    range: str
    why: str
    build: LlamaBuild | None
    model: ServedModel

    @property
    def version(self) -> int | None:
        return self.preset.version


@dataclass(frozen=True)
class ServeSession:
    """Everything one `rocforge serve` serves with, made once by the command and passed down:
    nothing below it opens the build, the model, the store or the reference again, nor reads the
    host's fingerprint.  `reference` is None when no canary runs."""

    preset: Preset
    range: str
    build: LlamaBuild
    model: ServedModel
    store: object  # measure.store.Store, open for the whole serve (threads: the front records from its own)
    host: dict | None
    reference: LlamaBuild | None

    @classmethod
    def open(cls, choice: Choice, store, *, host: dict | None, canary: bool,
             reference: str | None) -> ServeSession:
        """The session of `choice`: with `canary` (the start canary, or the one while serving),
        the model's header and the canary's reference build (`independent_reference`: never the
        served build itself, built first if it has to be), each once."""
        model, ref = choice.model, None
        if canary:
            from dataclasses import replace

            from rocforge_build.measure import gguf
            from rocforge_build.measure.verify_reference import independent_reference

            model = replace(model, header=gguf.check(Path(model.path)))
            ref = independent_reference(choice.build, reference)
        return cls(choice.preset, choice.range, choice.build, model, store, host, ref)


def find(store, model: str, wanted: str) -> Choice:
    """The preset for `model` (a GGUF path, a sha256 or a name) in the results store, its range
    (`wanted`: short, long or auto), its build opened once: still the one tune proved or one verify
    proved since (`server.still_proven`), running its own program (`preset.runnable`) at a shape no
    known fault matches (`known_bad.preset_problem`); else a UsageError or StoreError line."""
    from rocforge_build.measure import known_bad as known_bad_shape
    from rocforge_build.measure.preset import model_key, pick_range, runnable
    from rocforge_build.serve import server

    model_path = model if Path(model).is_file() else None
    if model_path is None and ("/" in model or model.endswith(".gguf")):
        from rocforge_build.measure import gguf

        gguf.check(model)  # a path that names no file says so, not "no preset"
    preset = store.preset(model_key(model))
    if preset is None:
        raise UsageError(f"no preset for {model!r}", "run `rocforge tune` for it first")
    name, why = pick_range(preset, wanted)
    r = preset.ranges[name]
    _build_is_there(r, name)
    build = LlamaBuild.open(r.prefix) if Path(r.prefix).is_dir() else None
    runnable(preset, [name], f"results database {store.path}: preset for "
             f"{shellsafe.one_line(preset.model.name)} version {preset.version}",
             manifests={name: build.manifest or None} if build else None)
    stored = None if model_path else preset.model.sha256  # a given path picked it by its sha256
    model_path = server.model_file(model_path or preset.model.path, stored)
    problem = server.still_proven(r, store, preset.model.sha256, model_path, build)
    problem = problem or known_bad_shape.preset_problem(r, build)
    if problem:
        raise UsageError(*problem)
    return Choice(preset, name, why, build, ServedModel(model_path, preset.model.sha256, preset.model.name))


def _build_is_there(r: PresetRange, name: str) -> None:
    """A preset whose build directory is gone is a usage error naming that prefix and the way
    back, not a damaged results store: the record is sound, the build was removed."""
    if not Path(r.prefix).exists():
        raise UsageError(f"the {name} range's build {shellsafe.one_line(r.prefix)} is gone",
                         f"build it again (`rocforge build llama-cpp --backend {r.backend} "
                         f"--prefix {shellsafe.one_line(r.prefix)}`) and tune again (`rocforge tune`)")


def this_host(rootfs=None) -> dict:
    """The host's fingerprint (measure/provenance.host), read once per serve; a known-bad host is
    said first (discover/known_bad)."""
    from rocforge_build.discover import known_bad
    from rocforge_build.measure import provenance

    host = provenance.host(rootfs)
    known_bad.warn_before_measuring(host)
    return host


def run(session: ServeSession, p, *, every: float | None, wait_s: float, request_s: float | None,
        argv: list[str], on_ready, canary_at_start: bool) -> int:
    """Serve `p` (server.Plan) of `session`: with `every`, llama-server behind the canary front
    (front.run), else alone (server.run); with `canary_at_start`, the numerics canary against the
    live server before `on_ready` says the URL.  Returns llama-server's exit status."""
    from rocforge_build.serve import front, server

    before_ready = _start_canary(session, wait_s) if canary_at_start else None
    if every:
        return front.run(session, p, every=every, wait_s=wait_s, on_ready=on_ready, before_ready=before_ready,
                         argv=argv, request_s=request_s)
    return server.run(p, wait_s=wait_s, on_ready=on_ready, before_ready=before_ready)


def _start_canary(session: ServeSession, timeout: float):
    """What serve runs against the live server before it prints its URL (canary.at_serve_start):
    its row in the session's store, with the session's fingerprint; its lines on stderr."""
    def gate(plan) -> None:
        from rocforge_build.serve import canary
        from rocforge_build.serve.front import say_to_stderr

        target = canary.target_of(plan.url, plan.argv)
        say = say_to_stderr  # one line each, terminal controls escaped: it quotes servers' replies
        record = {"model_sha256": session.model.sha256, "model": session.model.name,
                  "range": plan.range, "host": session.host}
        verdict = canary.at_serve_start(session.build, session.model, target, ref_build=session.reference,
                                        store=session.store, record=record, progress=say, timeout=timeout)
        say(f"canary passed in {verdict.seconds:.1f} s: " + ", ".join(
            f"{r.label} top-1 {r.comparison.top1:.3f} KLD {r.comparison.kld_mean:.2g}"
            for r in verdict.rows if r.comparison))

    return gate
