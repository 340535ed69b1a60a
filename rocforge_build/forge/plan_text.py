"""A build plan for people (`rocforge build --dry-run`, and before every build): every decision
with its reason, in the order the build takes them.
"""

from __future__ import annotations

import sys

from rocforge_build.forge.parallel import print_plan as print_parallel
from rocforge_build.forge.plan import Plan
from rocforge_build.proc import quote


def print_plan(plan: Plan, out=None) -> None:
    """Human-readable plan: every decision with its reason."""
    w = (out or sys.stdout).write  # looked up per call: sys.stdout may have been replaced
    w(f"recipe   {plan.recipe.name} ({plan.recipe.path})\n")
    w(f"target   {plan.target}\nbackend  {plan.backend} — {plan.backend_reason}\n")
    w(f"source   {plan.source.spec.kind} {plan.source.spec.location} @ {plan.source.identity}\n")
    w(f"prefix   {plan.prefix}\n")
    if plan.toolchain.missing:
        w(f"toolchain MISSING: {plan.toolchain.missing}\n  hint: {plan.toolchain.hint}\n")
    w("options\n")
    for o in plan.options:
        w(f"  -D{o['name']}={o['value']}\n      {o['reason']} [{o['because']}]\n")
    _print_env(w, "env", plan.env, plan.env_reasons)
    _print_env(w, "runtime env (recorded in the manifest)", plan.runtime_env, plan.env_reasons)
    w("patches\n")
    for p in plan.patch_status:
        w(f"  {p.name}: {p.status} — {p.reason}\n")
        if p.detail:
            w("    " + p.detail.replace("\n", "\n    ") + "\n")
    for n in plan.notes:
        w(f"note: {n}\n")
    for d in plan.dependencies:
        used = " (existing build, used as it is)" if d.built else ""
        w(f"depends  {d.recipe} ({d.backend}) -> {d.prefix}{used}\n"
          f"      {d.reason} [{d.because}]\n")
        for var, sub in d.prepend.items():
            w(f"      {var} += {d.prefix if sub in ('', '.') else d.prefix / sub}\n")
    if plan.venv:
        w(f"venv     {plan.venv['path']} — {plan.venv['reason']}\n")
        for argv in plan.venv["commands"]:
            w(f"  {quote(argv)}\n")
    if plan.parallel:
        print_parallel(plan.parallel, w)
    w(f"configure  {quote(plan.configure)}\nbuild      {quote(plan.build)}\n")
    w(f"install    {' '.join(plan.install)}\n")
    for s in plan.smoke:
        w(f"smoke      {quote(s)}\n")
    for o in plan.outputs:
        w(f"expects    {o['path']} — {o['reason']}\n")
    _print_env(w, "exported by `rocforge env` (recorded in the manifest)", plan.export_env,
               plan.env_reasons)


def _print_env(w, title: str, env: dict[str, str], reasons: dict[str, str]) -> None:
    if env:
        w(f"{title}\n")
        for k, v in env.items():
            w(f"  {k}={v}  ({reasons.get(k, '')})\n")
