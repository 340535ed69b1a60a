"""Which backend a build uses, decided twice: before the source is fetched, from the rules that
need no source facts (`check_before_fetch`: no toolchain for any possible backend, or a
`[[stop]]` that already holds, stops the build before a download of tens of MB), and after it,
with every fact (`choose_backend`: --backend, else the first `[[default]]` whose `when` holds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rocforge_build.errors import ToolchainError, UsageError
from rocforge_build.forge import conditions, recipes
from rocforge_build.forge.toolchains import detect

if TYPE_CHECKING:
    from rocforge_build.forge.plan import Request


def facts_maker(recipe, tgt, root, environ, req: Request, toolchains: dict, known: dict):
    """facts_for(backend): the facts a backend is judged by (its toolchain detected once);
    the source's facts once `known["source"]` is set (before the fetch: unknown)."""

    def facts_for(backend: str) -> conditions.Facts:
        kind = recipe.backends[backend].toolchain
        if kind not in toolchains:
            toolchains[kind] = detect(kind, root, tgt.name, environ, rocm=req.rocm)
        tc = toolchains[kind]
        return conditions.Facts(
            target=tgt.name, families=tgt.therock_groups, backend=backend,
            rocm_version=tc.rocm_version, source=known.get("source"),
            host=conditions.HostFacts(include_dirs=tc.include_dirs, path=tc.path,
                                      probe_glslc=tc.probe_glslc),
            toolchain_found=tc.missing is None, rocblas_hipblaslt=tc.rocblas_hipblaslt,
        )

    return facts_for


_SOURCE_KEYS = {"source_version", "cmake_option", "file", "source_contains"}


def source_free(cond) -> bool:
    """Whether a condition can be decided before the source is fetched."""
    if not cond:
        return True
    for key, value in cond.items():
        if key in _SOURCE_KEYS:
            return False
        if key == "not" and not source_free(value):
            return False
        if key in ("any", "all") and not all(source_free(c) for c in value):
            return False
    return True


def possible_backends(recipe: recipes.Recipe, req: Request,
                       facts_for: Callable[[str], conditions.Facts]) -> list[str]:
    """The backends the plan may choose, known before the source is: --backend, else the
    `[[default]]` rules up to the first that holds whatever the source says."""
    if req.backend:
        return [req.backend] if req.backend in recipe.backends else []
    out = []
    for rule in recipe.of("default"):
        backend = rule.get("backend")
        if not source_free(rule.when):
            out.append(backend)
        elif conditions.evaluate(rule.when, facts_for(backend)):
            return list(dict.fromkeys([*out, backend]))
    return list(dict.fromkeys([*out, next(iter(recipe.backends))]))


def check_before_fetch(recipe: recipes.Recipe, req: Request,
               facts_for: Callable[[str], conditions.Facts], toolchains: dict) -> None:
    """Before the source is fetched (a download of tens of MB): no toolchain for any backend the
    plan could choose, or a `[[stop]]` that holds whatever the source says — each stops here, as
    it would after the fetch (`plan.preflight` checks the user's prefix first)."""
    possible = possible_backends(recipe, req, facts_for)
    if not possible:
        return  # an unknown --backend: choose_backend says so with its suggestions
    if len(possible) == 1:  # the plan's order: the recipe's stops, then the toolchain
        facts = facts_for(possible[0])
        for rule in recipe.of("stop"):
            holds, why = (conditions.explain(rule.when, facts) if source_free(rule.when)
                          else (False, ""))
            if holds:
                hint = rule.get("hint")
                raise ToolchainError(f"{rule.get('message')} ({why})",
                                     hint.replace("{target}", facts.target) if hint else None)
    missing = []
    for backend in possible:
        facts_for(backend)
        tc = toolchains[recipe.backends[backend].toolchain]
        if tc.missing:
            missing.append(tc)
    if len(missing) == len(possible):
        missing[0].require()


def choose_backend(recipe: recipes.Recipe, req: Request,
                    facts_for: Callable[[str], conditions.Facts]) -> tuple[str, str]:
    """--backend, else the first `[[default]]` whose `when` holds — evaluated with the facts
    (toolchain headers included) of the backend it proposes."""
    if req.backend:
        if req.backend not in recipe.backends:
            import difflib

            close = difflib.get_close_matches(req.backend, recipe.backends, n=1)
            hint = f"did you mean {close[0]}?" if close else "backends: " + ", ".join(recipe.backends)
            raise UsageError(f"recipe {recipe.name} has no backend {req.backend!r}", hint)
        return req.backend, "asked for with --backend"
    for rule in recipe.of("default"):
        if conditions.evaluate(rule.when, facts_for(rule.get("backend"))):
            return rule.get("backend"), rule.get("reason")
    first = next(iter(recipe.backends))
    return first, "the recipe's first backend"
