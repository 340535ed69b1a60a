"""The numerics canary: is the live llama-server computing what the reference build computes, at the
slots, contexts and flags it serves with?

For fixed slices of rocforge's shipped text, the server greedily completes a few tokens (temperature
0, top_k 1, a fixed seed, `ignore_eos`) and returns, for each generated position, its top-K
pre-sampling distribution (`/completion` with `n_probs`: `completion_probabilities[i].top_logprobs`
in llama.cpp from early 2025 on, `probs` with `tok_str`/`prob` before; `top_probs` is post-sampling,
read only when nothing else is there).  The reference build's own llama-server (-np 1, one request
at a time) answers the same token-exact prompts (tokenized once by the reference's `/tokenize`), and
each position is compared with verify's limits for the model's file type (data/verify.toml):

- mean KLD, approximated on the reference's top-K: both distributions coarsened to the reference's
  K listed tokens plus one "everything else" bucket; by the data-processing inequality this never
  exceeds the true KL divergence, so a failure is a real one.  A reference token the server did not
  list gets the server's smallest listed probability (it is at most that).
- top-1 agreement: the share of compared positions whose most likely token is the reference's;
- the PPL ratio: exp(mean -log q) over exp(mean -log p) of the reference's own greedy tokens; a
  few tokens' ratio is noisy (a right CPU build served with -np 4 measured 1.04 over 16 tokens,
  verify's limit is 1.01-1.02 over thousands), so it fails only when its lower bound (3 standard
  errors of the per-token log ratio below, the spread never taken below
  `canary_compare.TOKEN_LOG_RATIO_SD`) is above the limit.

Greedy paths can part at a near-tie: positions are compared up to the first one where the server's
chosen token differs from the reference's.  A parting where the reference's top-1 margin was clear
(`canary_compare.CLEAR_MARGIN`) is judged a top-1 failure; at a near-tie the comparison ends at that
position (its distribution counts, its top-1 does not).

What it covers: one prompt as long as the model's training context and the slot's context allow
(past 8K tokens where they do), checked alone, then `parallel` different texts sent at once over the
server's slots, each checked against its own reference; an answer that matches another request's
reference is named as such (llama.cpp #25992: `-np 4 --kv-unified` returned other requests' answers).

Why log-probabilities and not the text: a greedy text canary compares only the argmax at each step,
which survives large damage to the distribution (the argmax of a sharp model moves last), so it can
run clean while a backend is broken — one did for forty minutes (llama.cpp #27506).  Scoring the
distributions sees the damage long before it flips a greedy token."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rocforge_build.errors import RocforgeError
from rocforge_build.measure import verify
from rocforge_build.measure.llama_tools import LlamaBuild
from rocforge_build.proc import free_loopback_port
from rocforge_build.serve import llama_server
from rocforge_build.serve.canary_compare import Comparison, Position, compare, judge
from rocforge_build.serve.llama_server import LlamaServer, NotReady
from rocforge_build.shellsafe import one_line

LONG_WANTED = 8448  # tokens: past 8K, where position-dependent faults show (RoPE past ~5-8K)
N_PREDICT = 16
N_PROBS = 10
SHORT_N_PREDICT = 4
MAX_REPLY = llama_server.MAX_REPLY  # bytes read of one reply: 16 positions x 10 tokens are a few KB
SEED = 42
SHORT_CHARS = 700  # each short text: a paragraph, ~150 tokens
OUTSIDE_CHARS = llama_server.OUTSIDE_CHARS  # characters of a server's text (an error, a label) a failure line quotes


class CanaryError(RocforgeError):
    """The canary could not run (a server that did not answer, a reply that is not one)."""

    exit_code = 1


class CanaryFailed(RocforgeError):
    """The live server's answers are not the reference's: serving it is refused."""

    exit_code = 1


@dataclass(frozen=True)
class Target:
    """The live server under test."""

    url: str  # http://127.0.0.1:PORT
    headers: dict  # e.g. Authorization for --api-key
    ctx_per_slot: int  # the context each slot holds
    parallel: int  # -np


@dataclass(frozen=True)
class CanaryPlan:
    """What the canary asks: `texts` (fixed slices of the shipped text, one per concurrent request),
    `long_tokens` (the long prompt's length, 0: none), `long_chars` (characters of the text's start
    it is cut from), `n_predict` tokens greedily, `n_probs` per position; limits for `file_type`."""

    texts: tuple[str, ...]
    long_tokens: int
    long_chars: int
    n_predict: int
    n_probs: int
    file_type: str | None
    n_vocab: int | None
    notes: tuple[str, ...] = ()

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Reference:
    """The reference's answers: per request (the long prompt first when there is one), its prompt
    tokens and its positions."""

    prompts: tuple[tuple[int, ...], ...]
    answers: tuple[tuple[Position, ...], ...]
    labels: tuple[str, ...]
    seconds: float

    def to_json(self) -> dict:
        return {"prompts": [list(p) for p in self.prompts], "labels": list(self.labels), "seconds": self.seconds,
                "answers": [[p.to_json() for p in a] for a in self.answers]}

    @classmethod
    def from_json(cls, d: dict) -> Reference:
        return cls(tuple(tuple(p) for p in d["prompts"]), tuple(tuple(Position.from_json(p) for p in a)
                                                               for a in d["answers"]),
                   tuple(d["labels"]), float(d["seconds"]))


@dataclass(frozen=True)
class Row:
    """One request's result."""

    label: str
    prompt_tokens: int
    comparison: Comparison | None
    failed: tuple[str, ...]
    answer_of: str | None = None  # the other request whose reference this answer matches

    def to_json(self) -> dict:
        c = self.comparison
        figures = {} if c is None else {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                        for k, v in asdict(c).items()}
        return {"label": self.label, "prompt_tokens": self.prompt_tokens, "passed": not self.failed,
                "failed": list(self.failed), "answer_of": self.answer_of, **figures}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    failures: tuple[str, ...]  # one line each, naming the check
    rows: tuple[Row, ...]
    seconds: float
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {"passed": self.passed, "failures": list(self.failures), "rows": [r.to_json() for r in self.rows],
                "seconds": round(self.seconds, 3), "notes": list(self.notes)}


def target_of(url: str, argv: list[str], timeout: float = 10.0) -> Target:
    """The Target a llama-server started with `argv` is at `url`: its API key as a header, its
    slots and each slot's context from /props (`total_slots`, `default_generation_settings.n_ctx`:
    the per-slot context, whatever -c, -np and --kv-unified made of it), else from -c / -np."""
    headers = {}
    if "--api-key" in argv[:-1]:
        headers["Authorization"] = f"Bearer {argv[argv.index('--api-key') + 1]}"

    def flag(names, default):
        for n in names:
            if n in argv[:-1]:
                with contextlib.suppress(ValueError):
                    return int(argv[argv.index(n) + 1])
        return default

    parallel, ctx = flag(("-np", "--parallel"), 1), flag(("-c", "--ctx-size"), 4096)
    per_slot = ctx if "--kv-unified" in argv or "-kvu" in argv else ctx // max(parallel, 1)
    props = {}
    with contextlib.suppress(CanaryError):  # no /props (an older server, a refusal, junk): the flags
        status, body = exchange("GET", url, "/props", None, headers, timeout)
        props = _json(body, f"{url}/props") if status == 200 else {}
    if isinstance(props, dict):
        slots = props.get("total_slots")
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        if isinstance(slots, int) and not isinstance(slots, bool) and 0 < slots < 1 << 16:
            parallel = slots
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and 0 < n_ctx < 1 << 31:
            per_slot = n_ctx
    return Target(url, headers, per_slot, parallel)


# ---------------------------------------------------------------------------------------- plan

def plan(model, target: Target, *, short: bool = False) -> CanaryPlan:
    """The requests for `model` served by `target`: `parallel` short texts (at least 2, so that a
    swap between two requests can show) and a long prompt (past 8K tokens where the model's training
    context and the slot's context allow, else the longest that fits); `short`: one short text, a
    few tokens, no long prompt (the canary repeated while serving)."""
    n_predict = SHORT_N_PREDICT if short else N_PREDICT
    count = 1 if short else max(2, target.parallel)
    text = verify.read_chars(verify.text_file(), (count + 2) * 7 * SHORT_CHARS)
    texts = tuple(_slice(text, i) for i in range(count))
    notes: list[str] = []
    long_tokens = 0
    if not short:
        room = [("8K+", LONG_WANTED)]
        if getattr(model, "n_ctx_train", None):
            room.append((f"the model's training context ({model.n_ctx_train})", model.n_ctx_train - n_predict))
        room.append((f"the slot's context ({target.ctx_per_slot})", target.ctx_per_slot - n_predict))
        why, long_tokens = min(room, key=lambda r: r[1])
        if long_tokens < 64:
            notes.append(f"no long prompt: {why} leaves only {max(long_tokens, 0)} tokens")
            long_tokens = 0
        elif why != "8K+":
            notes.append(f"the long prompt is {long_tokens} tokens, not past 8K: {why} allows no more")
    return CanaryPlan(texts, long_tokens, long_tokens * 8, n_predict, N_PROBS,
                      getattr(model, "file_type", None), getattr(model, "n_vocab", None), tuple(notes))


def _slice(text: str, i: int) -> str:
    """The i-th fixed paragraph-sized slice of the text, far apart (so no two requests share a
    prefix a prompt cache could confuse), starting at a line."""
    start = (i + 1) * 7 * SHORT_CHARS
    start = text.find("\n", start) + 1 or start
    return text[start:start + SHORT_CHARS]


# --------------------------------------------------------------------------------- the replies

def parse_reply(body: bytes, n_probs: int) -> tuple[Position, ...]:
    """A /completion reply's generated positions: each the chosen token and its top-K log
    probabilities, keyed by token id (by the token's text in the 2024 `probs` form, which has no
    ids).  Anything else than that shape raises CanaryError, one line."""
    d = _json(body, f"the server's reply ({len(body)} bytes)")
    if not isinstance(d, dict):
        raise CanaryError("the server's reply is not a JSON object")
    items = d.get("completion_probabilities")
    if not isinstance(items, list) or not items:
        raise CanaryError("the server's reply has no completion_probabilities (does it take n_probs?)")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise CanaryError(f"completion_probabilities[{i}] is not an object")
        if "top_logprobs" in item or "top_probs" in item:
            logs = "top_logprobs" in item
            entries, value_key, id_key = item.get("top_logprobs" if logs else "top_probs"), \
                "logprob" if logs else "prob", "id"
            chosen = item.get("id")
        elif "probs" in item:
            entries, value_key, id_key, logs = item.get("probs"), "prob", "tok_str", False
            chosen = item.get("content")
        else:
            raise CanaryError(f"completion_probabilities[{i}] has no top_logprobs, top_probs or probs")
        if not isinstance(entries, list) or not entries or len(entries) > max(n_probs, 1) * 4:
            raise CanaryError(f"completion_probabilities[{i}] lists {_count(entries)} tokens, asked for {n_probs}")
        top = {}
        for e in entries:
            key, value = (e.get(id_key), e.get(value_key)) if isinstance(e, dict) else (None, None)
            if not _token_key(key) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CanaryError(f"completion_probabilities[{i}] has an entry without a token and a number")
            number = _finite_or_inf(value)
            logp = number if logs else (math.log(number) if number > 0 else -math.inf)
            if math.isnan(logp) or logp > 1e-6 or (not logs and not 0 <= number <= 1 + 1e-6):
                raise CanaryError(f"completion_probabilities[{i}] has a probability out of range "
                                  f"({_outside(repr(value))})")
            top[key] = max(logp, -1e4)
        if not _token_key(chosen):
            raise CanaryError(f"completion_probabilities[{i}] does not say which token was chosen")
        out.append(Position(chosen, top))
    return tuple(out)


def _outside(text: object) -> str:
    """Text from outside (a server's status line, an exception's text, its stderr, a label read
    back from disk) as it may appear in a failure line or note: one printable line, bounded."""
    return llama_server.outside(text)


def _finite_or_inf(value: int | float) -> float:
    """A JSON number as a float: an integer past a float's range (JSON allows any length) is inf,
    out of range like any other, not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _token_key(k) -> bool:
    return (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 1 << 31) or (isinstance(k, str) and len(k) < 4096)


def _count(x) -> str:
    return str(len(x)) if isinstance(x, list) else "no"


def parse_tokens(body: bytes) -> tuple[int, ...]:
    """/tokenize's reply: {"tokens": [ids]}."""
    d = _json(body, "the server's /tokenize reply")
    toks = d.get("tokens") if isinstance(d, dict) else None
    if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31
                                             for t in toks):
        raise CanaryError("the server's /tokenize reply has no list of token ids")
    return tuple(toks)


def _json(body: bytes, what: str):
    """`body` parsed as JSON; whatever a reply can do to the parser (not UTF-8, not JSON, nested
    past the recursion limit, an integer of thousands of digits) is one CanaryError line."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CanaryError(f"{what} is not JSON") from None


def exchange(method: str, url: str, path: str, body: bytes | None, headers: dict,
             timeout: float, *, cut: bool = True) -> tuple[int, bytes]:
    """One HTTP request and its (status, reply), bounded in time and size (llama_server.exchange),
    any failure one CanaryError line.  Every request the canary makes goes through here."""
    return llama_server.exchange(method, url, path, body, headers, timeout, cut=cut, limit=MAX_REPLY,
                                 error=CanaryError)


def post(url: str, path: str, payload: dict, headers: dict, timeout: float) -> bytes:
    """POST JSON (`exchange`) and the reply of an HTTP 200; anything else is one CanaryError line."""
    status, reply = exchange("POST", url, path, json.dumps(payload).encode(),
                             {"Content-Type": "application/json", **headers}, timeout)
    if status != 200:
        raise CanaryError(f"{url}{path} answered HTTP {status}")
    return reply


def _request(plan_: CanaryPlan, prompt: tuple[int, ...]) -> dict:
    return {"prompt": list(prompt), "n_predict": plan_.n_predict, "n_probs": plan_.n_probs, "temperature": 0,
            "top_k": 1, "seed": SEED, "ignore_eos": True, "cache_prompt": False, "post_sampling_probs": False,
            "stream": False}


def complete(url: str, headers: dict, plan_: CanaryPlan, prompt: tuple[int, ...], timeout: float) -> tuple[Position, ...]:
    return parse_reply(post(url, "/completion", _request(plan_, prompt), headers, timeout), plan_.n_probs)


# ----------------------------------------------------------------------------------- reference

def _cache_file(plan_: CanaryPlan, ref: LlamaBuild, model) -> Path:
    from rocforge_build.measure import provenance

    exe = ref.program("llama-server")
    st = exe.stat()
    sha256 = getattr(model, "sha256", None) or provenance.model_sha256(Path(model.path))  # serve's: read once
    parts = [ref.stamp or "", str(exe), st.st_size, st.st_mtime_ns, sha256,
             plan_.key()]
    key = hashlib.sha256(repr(parts).encode()).hexdigest()[:32]
    return verify.cache_dir() / "canary" / f"{key}.json"


def reference(plan_: CanaryPlan, ref: LlamaBuild, model, *, progress=None, timeout: float = 900.0) -> Reference:
    """The reference build's answers: its own llama-server (-np 1, a context that holds the long
    prompt) on a free loopback port (asked only once the socket answering there is its own), the
    same requests one at a time; cached on disk by the reference's stamp and binary, the model's
    sha256 and the plan (an unreadable entry is recomputed)."""
    cached = _cache_file(plan_, ref, model)
    hit = _read_cache(cached)
    if hit is not None:
        return hit
    start = time.monotonic()
    ctx = max(plan_.long_tokens + plan_.n_predict + 64, 1024)
    argv = [str(ref.program("llama-server")), "-m", str(model.path), "-c", str(ctx), "-np", "1"] + (
        ["-ngl", "0"] if ref.gpu else [])
    if progress:
        progress(f"canary: the reference {ref.label()} answers the same requests")
    server = LlamaServer.on_loopback(argv, port=free_loopback_port(), env=ref.runtime_env, relay=False, keep=5,
                                     grace=10.0)
    with server:  # stopped whole at the end: it and all it started, a child that daemonized included
        _ready(server, timeout)
        prompts, labels = _prompts(plan_, server.url, {}, min(timeout, 120))
        answers = tuple(complete(server.url, {}, plan_, p, timeout) for p in prompts)
    result = Reference(prompts, answers, labels, time.monotonic() - start)
    with contextlib.suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.part")
        tmp.write_text(json.dumps(result.to_json()), encoding="utf-8")
        tmp.replace(cached)
    return result


def _read_cache(path: Path) -> Reference | None:
    """The cached reference at `path`, or None (a miss: recomputed) for anything unreadable: no file,
    not JSON, nested past the recursion limit, or not a reference's shape."""
    try:
        d = json.loads(path.read_bytes())
        got = Reference.from_json(d)
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError, IndexError):
        return None
    tokens_ok = all(_token_key(p.token) and all(_token_key(k) and isinstance(v, float) for k, v in p.top.items())
                    for a in got.answers for p in a if isinstance(p.top, dict))
    shape_ok = (len(got.prompts) == len(got.answers) == len(got.labels)
                and all(isinstance(t, int) for p in got.prompts for t in p)
                and all(isinstance(p.top, dict) for a in got.answers for p in a)
                and all(isinstance(label, str) for label in got.labels))
    return got if shape_ok and tokens_ok else None


def _ready(server: LlamaServer, timeout: float) -> None:
    """Until /health answers 200 from a socket the reference server (or its descendants) listens
    on: another program that took the port between the free-port probe and the start is not the
    reference (LlamaServer.wait_ready)."""
    try:
        server.wait_ready(timeout)
    except NotReady as why:
        if why.why == "exited":
            raise CanaryError(f"the reference llama-server exited with code {why.code}: "
                              f"{_outside(why.last) if why.last else 'no output'}") from None
        if why.why == "other":
            raise CanaryError(f"another program listens on the reference's port {server.port}, and the reference "
                              f"llama-server (pid {server.pid}) did not within {timeout:g} s") from None
        raise CanaryError(f"the reference llama-server did not answer /health within {timeout:g} s") from None


def _prompts(plan_: CanaryPlan, url: str, headers: dict, timeout: float) -> tuple[tuple, tuple]:
    """(token prompts, labels): the long prompt (exactly `long_tokens` tokens of the text's start)
    first when there is one, then the short texts, all tokenized by the reference's /tokenize."""
    prompts, labels = [], []
    if plan_.long_tokens:
        text = verify.read_chars(verify.text_file(), plan_.long_chars)
        toks = parse_tokens(post(url, "/tokenize", {"content": text}, headers, timeout))
        if len(toks) < plan_.long_tokens:
            raise CanaryError(f"the shipped text's start tokenizes to only {len(toks)} tokens")
        prompts.append(toks[:plan_.long_tokens])
        labels.append(f"long prompt ({plan_.long_tokens} tokens)")
    for i, t in enumerate(plan_.texts):
        prompts.append(parse_tokens(post(url, "/tokenize", {"content": t}, headers, timeout)))
        labels.append(f"request {i + 1}")
    return tuple(prompts), tuple(labels)


# ------------------------------------------------------------------------------------- the check

def check(plan_: CanaryPlan, target: Target, ref: Reference, *, timeout: float) -> Verdict:
    """The long prompt alone, then the short texts all at once over the slots; every answer against
    its own reference, and a failing one against the others' (a swapped answer is named)."""
    start = time.monotonic()
    deadline = start + timeout
    rows: list[Row] = []
    idx = list(range(len(ref.prompts)))
    long_idx = [i for i in idx if ref.labels[i].startswith("long")]
    short_idx = [i for i in idx if i not in long_idx]

    def left() -> float:
        return max(deadline - time.monotonic(), 0.001)

    answers: dict[int, tuple | Exception] = {}

    def one(i: int) -> None:
        try:
            answers[i] = complete(target.url, target.headers, plan_, ref.prompts[i], left())
        except Exception as exc:  # noqa: BLE001 - any error is this request's failure line (_row)
            answers[i] = exc

    for i in long_idx:
        one(i)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in short_idx]
    for t in threads:
        t.start()
    for t in threads:
        t.join(left())
    for i in idx:
        got = answers.get(i, CanaryError(f"{target.url}/completion did not answer within {math.ceil(timeout)} s"))
        try:
            rows.append(_row(plan_, ref, i, got, short_idx))
        except Exception as exc:  # noqa: BLE001 - a reply no check foresaw fails its row, named by type
            rows.append(_internal_error(ref, i, exc))
    failures = tuple(f"canary: {r.label} {r.failed[0]}" if r.answer_of else f"canary: {r.label}: {r.failed[0]}" + (f" ({'; '.join(r.failed[1:])})" if r.failed[1:] else "")
                     for r in rows if r.failed)
    return Verdict(not failures, failures, tuple(rows), time.monotonic() - start, plan_.notes)


def _row(plan_: CanaryPlan, ref: Reference, i: int, got, short_idx: list[int]) -> Row:
    """Request `i`'s answer (or the error that stopped it) against its reference, and a failing
    one against the other short requests' (a swapped answer is named)."""
    label = _outside(ref.labels[i])
    if isinstance(got, CanaryError):
        return Row(label, len(ref.prompts[i]), None, (f"no answer: {one_line(got.message)}",))
    if isinstance(got, Exception):
        return _internal_error(ref, i, got)
    c = compare(ref.answers[i], got)
    failed = judge(c, plan_)
    other = None
    if failed:
        for j in short_idx:
            if j != i and len(ref.answers[j]) and not judge(compare(ref.answers[j], got), plan_):
                other = _outside(ref.labels[j])
                failed = (f"got the answer meant for {other}",) + failed
                break
    return Row(label, len(ref.prompts[i]), c, failed, other)


def _internal_error(ref: Reference, i: int, exc: Exception) -> Row:
    """An error no check foresaw, as request `i`'s failure: its type kept, so a bug still shows."""
    return Row(_outside(ref.labels[i]), len(ref.prompts[i]), None, (f"internal error: {type(exc).__name__}: {_outside(exc)}",))


# ------------------------------------------------------------------------------ at serve start

def at_serve_start(build: LlamaBuild, model, target: Target, *, ref_build: LlamaBuild, store, record: dict,
                   progress=None, timeout: float = 900.0) -> Verdict:
    """The canary `rocforge serve` runs before it prints its URL: the plan for this server, the
    reference build's answers (`ref_build`: serve's session holds it,
    `verify_reference.independent_reference`: never the served build itself), the check, one
    `canary` row in the results store with `record` (the host's fingerprint, the model); a failure
    raises CanaryFailed naming the check."""
    plan_ = plan(model, target)
    for note in plan_.notes:
        if progress:
            progress(f"canary: {note}")
    ref = reference(plan_, ref_build, model, progress=progress, timeout=timeout)
    if progress:
        progress(f"canary: {len(ref.prompts)} requests to {target.url} ({target.parallel} slots of "
                 f"{target.ctx_per_slot} tokens), {plan_.n_predict} tokens each, {plan_.n_probs} log-probabilities a token")
    verdict = check(plan_, target, ref, timeout=timeout)
    run_id = store.start_run("canary", None, {"host": record.get("host"), "url": target.url})
    row = {**record, "prefix": str(build.prefix), "stamp": build.stamp, "backend": build.backend,
           "reference": str(ref_build.prefix), "reference_stamp": ref_build.stamp,
           "target": {"url": target.url, "parallel": target.parallel, "ctx_per_slot": target.ctx_per_slot},
           **verdict.to_json()}
    store.add_row(run_id, "canary", row, status="passed" if verdict.passed else "failed")
    store.finish_run(run_id, "passed" if verdict.passed else "failed")
    if not verdict.passed:
        more = f" (and {len(verdict.failures) - 1} more)" if len(verdict.failures) > 1 else ""
        raise CanaryFailed(verdict.failures[0] + more + ": the server was stopped",
                           "the build computes something else at this serving shape: verify it "
                           "(rocforge verify PREFIX --model MODEL), or serve anyway with --no-canary")
    return verdict
