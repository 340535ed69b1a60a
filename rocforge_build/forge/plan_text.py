"""A build plan for people (`rocforge build --dry-run`, and before every build): every decision
with its reason, in the order the build takes them, and the reason's evidence under it.
"""

from __future__ import annotations

import sys

from rocforge_build.credentials import redact
from rocforge_build.forge.parallel import print_plan as print_parallel
from rocforge_build.forge.plan import Plan
from rocforge_build.forge.recipes import evidence_lines
from rocforge_build.proc import quote


def print_plan(plan: Plan, out=None) -> None:
    """Human-readable plan: every decision with its reason."""
    w = (out or sys.stdout).write  # looked up per call: sys.stdout may have been replaced
    w(f"recipe   {plan.recipe.name} ({plan.recipe.path})\n")
    w(f"target   {plan.target or 'none (the backend needs no GPU target)'}\nbackend  {plan.backend} — {plan.backend_reason}\n")
    _print_evidence(w, "  ", plan.backend_evidence)
    unread = "" if plan.source.read else " (not fetched: a dry run downloads nothing)"
    w(f"source   {plan.source.spec.kind} {plan.source.spec.location} @ "
      f"{plan.source.identity or 'known after the download'}{unread}\n")
    w(f"prefix   {plan.prefix}\n")
    key, policy = plan.substitute_key, plan.substitutes
    w(f"key      {key.digest if key else 'none: ' + plan.no_substitute_key}\n")
    if policy is not None and key is not None:
        asked = ("not asked (--no-substitutes)" if policy.mode == "off" else
                 f"asked first: {redact(', '.join(policy.stores))}" if policy.stores else
                 "no substitute.stores: compiled here")
        w(f"         substitutes {asked}" + (" (pull or fail)" if policy.mode == "only" else "") + "\n")
    if plan.toolchain.missing:
        w(f"toolchain MISSING: {plan.toolchain.missing}\n  hint: {plan.toolchain.hint}\n")
    w("options\n")
    for o in plan.options:
        w(f"  {o.define}\n      {o.reason} [{o.because}]\n")
        _print_evidence(w, "      ", list(o.evidence))
    _print_env(w, "env", plan.env, plan.env_reasons, plan.env_evidence)
    _print_env(w, "runtime env (recorded in the manifest)", plan.runtime_env, plan.env_reasons,
               plan.env_evidence)
    w("patches\n")
    for p in plan.patch_status:
        w(f"  {p.name}: {p.status} — {p.reason}\n")
        _print_evidence(w, "    ", p.evidence)
        if p.detail:
            w("    " + p.detail.replace("\n", "\n    ") + "\n")
    for n in plan.notes:
        w(f"note: {n}\n")
    for d in plan.dependencies:
        used = " (existing build, used as it is)" if d.built else ""
        w(f"depends  {d.recipe} ({d.backend}) -> {d.prefix}{used}\n"
          f"      {d.reason} [{d.because}]\n")
        _print_evidence(w, "      ", d.evidence)
        for var, sub in d.prepend.items():
            w(f"      {var} += {d.prefix if sub in ('', '.') else d.prefix / sub}\n")
    if plan.venv:
        w(f"venv     {plan.venv.path} — {plan.venv.reason}\n")
        _print_evidence(w, "  ", list(plan.venv.evidence))
        for argv in plan.venv.commands:
            w(f"  {quote(argv)}\n")
    if plan.parallel:
        print_parallel(plan.parallel, w)
    w(f"configure  {quote(plan.configure)}\nbuild      {quote(plan.build)}\n")
    w(f"install    {' '.join(plan.install)}\n")
    for s in plan.smoke:
        w(f"smoke      {quote(s)}\n")
    for o in plan.outputs:
        w(f"expects    {o.path} — {o.reason}\n")
        _print_evidence(w, "  ", list(o.evidence))
    _print_env(w, "exported by `rocforge env` (recorded in the manifest)", plan.export_env,
               plan.env_reasons, plan.env_evidence)
    if not plan.source.read:
        print_after_fetch(plan, w)


_LABELS = {
    "backend": lambda e: f"backend {e.name} exists in this source" + (f" (else: {e.message})" if e.message else ""),
    "refused": lambda e: f"backend {e.name} is not available, the build stops" + (f": {e.message}" if e.message else ""),
    "stop": lambda e: f"stop: {e.name}",
    "toolchain": lambda e: f"toolchain {e.name} MISSING, the build stops: {e.message}",
    "note": lambda e: f"note: {e.name}",
    "option": lambda e: f"-D{e.name}={e.value or ''} — {e.reason or ''}",
    "declared": lambda e: f"-D{e.name} is passed: the build stops (CMake would ignore it) unless",
    "headers": lambda e: f"headers of {e.name}:",
    "env": lambda e: f"{e.name}={e.value or ''}" + (f" ({e.stage} env)" if e.stage else "") + f" — {e.reason or ''}",
    "patch": lambda e: f"patch {e.name} — {e.reason or ''}",
    "depends": lambda e: f"depends {e.name} — {e.reason or ''}",
    "output": lambda e: f"expects {e.name} — {e.reason or ''}",
    "smoke": lambda e: f"smoke {e.name}",
}
_NOT_IF = {"declared", "headers"}


def print_after_fetch(plan: Plan, w) -> None:
    """What the dry run of a source it did not download leaves to the fetch: each rule with the
    condition only the source decides."""
    entries = plan.after_fetch
    w("decided after the fetch (the source is not in the cache and a dry run downloads nothing;"
      " the build fetches it, then decides)\n")
    for other in plan.backend_alternatives:
        w(f"  this is the plan of backend {plan.backend}; should the source make it {other}, "
          f"`--backend {other} --dry-run` shows that one\n")
    if not entries:
        w("  nothing: no rule of this recipe depends on the source's contents\n")
    for e in entries:
        label = _LABELS.get(e.rule, lambda e: f"{e.rule} {e.name}")(e)
        when = e.when if e.rule in _NOT_IF or e.when.startswith("the source makes") else f"if {e.when}"
        w(f"  {label}\n      {when}\n" + (f"      hint: {e.hint}\n" if e.hint else ""))
        _print_evidence(w, "      ", list(e.evidence))


def _print_env(w, title: str, env: dict[str, str], reasons: dict[str, str],
               evidence: dict[str, list[str]]) -> None:
    if env:
        w(f"{title}\n")
        for k, v in env.items():
            w(f"  {k}={v}  ({reasons.get(k, '')})\n")
            _print_evidence(w, "      ", evidence.get(k))


def _print_evidence(w, indent: str, items) -> None:
    for line in evidence_lines(items, indent):
        w(line + "\n")
