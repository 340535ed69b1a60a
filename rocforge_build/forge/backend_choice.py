"""Which backend a build uses, decided twice: before the source is fetched, from what the rules
say whatever the source holds (`check_before_fetch`: no toolchain for any possible backend, or a
`[[stop]]` that already holds, stops the build before a download of tens of MB), and after it,
with every fact (`choose_backend`: --backend, else the first `[[default]]` whose `when` holds).
A dry run downloads nothing: `backend_without_source` chooses as far as the rules decide without
the source, and names the backends the source may still choose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rocforge_build.errors import ToolchainError, UsageError
from rocforge_build.forge import conditions, recipes
from rocforge_build.forge.toolchains import Toolchain

FactsOf = Callable[[str], conditions.Facts]  # a backend's name -> the facts it is judged by


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str
    # a dry run of an unread source: the other backends the source may still choose
    alternatives: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()  # beside the reason: the `[[default]]` rules' evidence


def possible_backends(recipe: recipes.Recipe, requested: str | None,
                      facts_for: FactsOf) -> list[str]:
    """The backends the plan may choose, known before the source is: --backend, else the
    `[[default]]` rules up to the first that holds whatever the source says (a rule that fails
    whatever it says — another target, say — is no candidate)."""
    if requested:
        return [requested] if requested in recipe.backends else []
    return list(dict.fromkeys(backend for backend, _, _ in _candidates(recipe, facts_for)))


def _candidates(recipe: recipes.Recipe, facts_for: FactsOf
                ) -> list[tuple[str, recipes.Rule | None, str | None]]:
    """(backend, its `[[default]]` rule or None for the recipe's first backend, the condition left
    to the source or None) of every default the source may still choose, in order, up to and with
    the first that holds without it."""
    out: list[tuple[str, recipes.Rule | None, str | None]] = []
    for rule in recipe.of("default"):
        backend = rule.get("backend")
        holds, why = conditions.judge(rule.when, facts_for(backend))
        if holds is None:
            out.append((backend, rule, why))
        elif holds:
            out.append((backend, rule, None))
            break
    else:
        out.append((next(iter(recipe.backends)), None, None))
    return out


def _reason(rule: recipes.Rule | None) -> str:
    return rule.get("reason") if rule is not None else "the recipe's first backend"


def _evidence(rule: recipes.Rule | None) -> tuple[str, ...]:
    return tuple(rule.get("evidence", ())) if rule is not None else ()


def check_before_fetch(recipe: recipes.Recipe, requested: str | None, facts_for: FactsOf,
                       toolchain_of: Callable[[str], Toolchain]) -> None:
    """Before the source is fetched (a download of tens of MB): no toolchain for any backend the
    plan could choose, or a `[[stop]]` that holds whatever the source says — each stops here, as
    it would after the fetch (`context.preflight` checks the user's prefix first)."""
    possible = possible_backends(recipe, requested, facts_for)
    if not possible:
        return  # an unknown --backend: choose_backend says so with its suggestions
    if len(possible) == 1:  # the plan's order: the recipe's stops, then the toolchain
        facts = facts_for(possible[0])
        for rule in recipe.of("stop"):
            holds, why = conditions.judge(rule.when, facts)
            if holds:
                hint = rule.get("hint")
                raise ToolchainError(f"{rule.get('message')} ({why})",
                                     hint.replace("{target}", facts.target) if hint else None)
    missing = []
    for backend in possible:
        tc = toolchain_of(recipe.backends[backend].toolchain)
        if tc.missing:
            missing.append(tc)
    if len(missing) == len(possible):
        missing[0].require()


def backend_without_source(recipe: recipes.Recipe, requested: str | None, facts_for: FactsOf
                           ) -> BackendChoice:
    """The choice before the source is read: `choose_backend`'s where the rules decide without
    it (no alternatives); else the first candidate, its reason saying which condition the fetch
    decides and what follows otherwise, with the evidence of every candidate it names."""
    if requested:
        return choose_backend(recipe, requested, facts_for)
    cands = _candidates(recipe, facts_for)
    backend, rule, open_ = cands[0]
    if open_ is None:
        return BackendChoice(backend, _reason(rule), (), _evidence(rule))
    rest = "; otherwise ".join(f"{b} ({'if ' + why + ': ' if why else ''}{_reason(r)})"
                               for b, r, why in cands[1:])
    others = tuple(dict.fromkeys(b for b, _, _ in cands[1:] if b != backend))
    evidence = tuple(dict.fromkeys(e for _, r, _ in cands for e in _evidence(r)))
    return BackendChoice(backend, f"{_reason(rule)} — if {open_} (decided after the fetch); "
                         f"otherwise {rest}", others, evidence)


def check_requested(recipe: recipes.Recipe, requested: str) -> None:
    """A `--backend` the recipe lacks is a usage error, named before anything else (a GPU
    target's detection included) is asked about it."""
    if requested not in recipe.backends:
        import difflib

        close = difflib.get_close_matches(requested, recipe.backends, n=1)
        hint = f"did you mean {close[0]}?" if close else "backends: " + ", ".join(recipe.backends)
        raise UsageError(f"recipe {recipe.name} has no backend {requested!r}", hint)


def choose_backend(recipe: recipes.Recipe, requested: str | None,
                   facts_for: FactsOf) -> BackendChoice:
    """--backend, else the first `[[default]]` whose `when` holds — evaluated with the facts
    (toolchain headers included) of the backend it proposes."""
    if requested:
        check_requested(recipe, requested)
        return BackendChoice(requested, "asked for with --backend")
    for rule in recipe.of("default"):
        if conditions.evaluate(rule.when, facts_for(rule.get("backend"))):
            return BackendChoice(rule.get("backend"), _reason(rule), (), _evidence(rule))
    return BackendChoice(next(iter(recipe.backends)), _reason(None))
