"""The one place where rocforge decides: which ROCm install, which GPUs, which gfx target, and
the environment that follows.  Every choice is a `Decision(key, value, reason)`.

Rules (each names its evidence in the reason):
- install: `--rocm` wins; else a valid `$ROCM_PATH` (warned about when another install serves the
  GPU better); else the install whose libraries serve the preferred GPU best (own kernels >
  kernels of the target table's `override_with` target > none), then rocforge's `nightly use`
  choice, then the newest version, then the layout rank of data/layouts.toml.
- GPUs: the preferred GPU is a dGPU before an iGPU, a known target before an unknown one, more
  compute units, then KFD order.  GPUs whose kernels the chosen libraries lack are masked with
  ROCR_VISIBLE_DEVICES when at least one GPU is served (lemonade-sdk/llamacpp-rocm #96: an
  unsupported iGPU visible to ROCm can crash apps).
- HSA_OVERRIDE_GFX_VERSION only when the libraries lack the GPU's own kernels but carry its
  `override_with` target's (or `--target` names that target); otherwise it is unset — a stale
  override crashes ROCm 7.2.4 on native gfx1151 (kyuz0/amd-strix-halo-toolboxes #115).
- ROCBLAS_USE_HIPBLASLT=1 only when hipBLASLt carries kernels for the effective target
  (lemonade-sdk/llamacpp-rocm #10: it fails when the arch's library is missing) — the ROCm's,
  or a hipBLASLt rocforge built for the target.
- Builds (`builds.py`): a prefix rocforge built for the effective target whose expected outputs
  are all still there goes in front of CMAKE_PREFIX_PATH, and its recipe's
  exported variables are set (ROCBLAS_TENSILE_LIBPATH, HIPBLASLT_TENSILE_LIBPATH,
  AOTRITON_INSTALLED_PREFIX, TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL where the recipe's version
  table says so).  Builds for other targets, or with missing outputs, are left out with a reason.
  No build goes on LD_LIBRARY_PATH: each runs from its RUNPATH ($ORIGIN/../lib), and a list of
  prefixes would let one build's libggml-base/-cpu serve another's libggml.  PATH gets at most
  one build per recipe (`choices.py`): the one chosen with `rocforge use`, else the newest that
  passed `rocforge verify`; the others are named in a decision.

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rocforge_build import shellsafe
from rocforge_build.discover import builds as builds_mod
from rocforge_build.discover import gpus as gpus_mod
from rocforge_build.discover import installs as installs_mod
from rocforge_build.discover import layouts, rocm_version, targets
from rocforge_build.discover.gpus import Gpu
from rocforge_build.discover.installs import RocmInstall
from rocforge_build.errors import NoRocmError
from rocforge_build.records import FRESH, Record, fresh, init
from rocforge_build.rootfs import Root, inner_join

PATH_VARS = ("PATH", "LD_LIBRARY_PATH", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH")
OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"


class Decision(Record):
    __slots__ = ("key", "value", "reason")

    def __init__(self, key: str, value: object, reason: str):
        init(self, key, value, reason)

    def to_json(self) -> dict:
        value = self.value
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        return {"key": self.key, "value": value, "reason": self.reason}

    def text(self) -> str:
        """The value as a person reads it: no Python None, [] or True."""
        value = self.value
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, (list, tuple, set, frozenset)):
            return ", ".join(str(v) for v in value) or "none"
        return str(value)


class Resolution(Record):
    __slots__ = ("gpus", "target", "rocm", "env", "decisions", "warnings", "installs", "selected",
                 "prepend", "root", "gpu_source", "builds", "blockers")
    _hidden = ("root",)

    def __init__(self, gpus: tuple[Gpu, ...], target: str | None, rocm: RocmInstall | None,
                 env: dict[str, str | None], decisions: list[Decision], warnings: list[str],
                 installs: tuple[RocmInstall, ...] = (),
                 selected: tuple[int, ...] = (),  # indices into .gpus of the GPUs left visible
                 prepend: dict[str, tuple[str, ...]] = FRESH,  # path-list entries
                 root: Root | None = None,
                 gpu_source: str = "none",
                 builds: tuple[builds_mod.Build, ...] = (),  # rocforge builds used by the environment
                 # what makes the machine's main GPU unusable with this ROCm
                 blockers: tuple[str, ...] = ()):
        init(self, gpus, target, rocm, env, decisions, warnings, installs, selected,
             fresh(prepend), root, gpu_source, builds, blockers)

    @property
    def usable(self) -> bool:
        """A ROCm install was found and it serves the effective target (or no GPU to serve)."""
        if self.rocm is None:
            return False
        if self.target is None:
            return True
        return self.rocm.coverage.kernels_for(self.target)[0]

    def decision(self, key: str) -> Decision | None:
        for d in self.decisions:
            if d.key == key:
                return d
        return None

    def toolchain_env(self) -> dict[str, str]:
        """Compiler variables for builds, as host paths: HIPCXX, HIP_PATH, ROCM_PATH,
        HIP_DEVICE_LIB_PATH, HIP_PLATFORM."""
        if self.rocm is None:
            raise NoRocmError("no ROCm installation found", install_hint(self.target))
        root = self.root or Root("/")
        inst = self.rocm
        out = {"HIP_PLATFORM": "amd"}
        if inst.hipcxx is not None:
            # Keep the name: clang++ is usually a link to clang, and the driver picks its C++
            # mode from argv[0].
            parent, name = os.path.split(inst.hipcxx)
            out["HIPCXX"] = os.path.join(root.host_str(parent), name)
        hip_path = self.env.get("HIP_PATH")
        rocm_path = self.env.get("ROCM_PATH")
        if hip_path:
            out["HIP_PATH"] = root.host_str(hip_path)
        if rocm_path:
            out["ROCM_PATH"] = root.host_str(rocm_path)
        if inst.bitcode_dir is not None:
            out["HIP_DEVICE_LIB_PATH"] = root.host_str(inst.bitcode_dir)
        return out

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "usable": self.usable,
            "gpu_source": self.gpu_source,
            "gpus": [g.to_json() for g in self.gpus],
            "selected": [self.gpus[i].index for i in self.selected],
            "rocm": self.rocm.to_json() if self.rocm else None,
            "installs": [i.to_json() for i in self.installs],
            "env": dict(self.env),
            "decisions": [d.to_json() for d in self.decisions],
            "warnings": list(self.warnings),
            "builds": [b.to_json() for b in self.builds],
        }


def install_hint(target: str | None) -> str:
    return (f"install a TheRock nightly: `rocforge nightly install --target {target or 'GFX'}`"
            + ("" if target else " (see `rocforge targets`)")
            + ", or pass --rocm PATH to an existing ROCm tree")


def prepend_list(current: str | None, entries: tuple[str, ...]) -> str:
    """`entries` in front of the colon list `current`, leaving entries already present where
    they are (so applying it twice changes nothing) and keeping the user's list byte for byte —
    exactly what the emitted shell code does when sourced."""
    items = current.split(":") if current else []
    new = [e for e in dict.fromkeys(entries) if e not in items]
    return ":".join(new + items)


# -- ranking ------------------------------------------------------------------------------------
def _gpu_order(g: Gpu) -> tuple:
    return (g.is_igpu, not g.known, -(g.compute_units or 0), g.index)


def _support(inst: RocmInstall, gfx: str) -> tuple[int, str, str | None]:
    """(level, evidence, override target): 2 own kernels, 1 via override_with, 0 none."""
    ok, why = inst.coverage.kernels_for(gfx)
    if ok:
        return 2, why, None
    t = targets.get_target(gfx) if targets.known(gfx) else None
    if t and t.override_with:
        ok2, why2 = inst.coverage.kernels_for(t.override_with)
        if ok2:
            return 1, f"{why}, but {why2}", t.override_with
    if t is None:
        why += f" ({gfx} is not in rocforge's target table: no override fallback known)"
    return 0, why, None


def _rank_key(inst: RocmInstall, gfx: str | None) -> tuple:
    level = _support(inst, gfx)[0] if gfx else 0
    rank = layouts.layouts()[inst.layout].rank
    return (level, inst.nightly_current, rocm_version.version_key(inst.version), -rank)


# -- the steps' results -------------------------------------------------------------------------
def _in_front(entries: tuple[str, ...], earlier: tuple[str, ...]) -> tuple[str, ...]:
    """A path list with `entries` first, then the `earlier` entries not among them."""
    return entries + tuple(e for e in earlier if e not in entries)


class Decided(Record):
    """What one step of `resolve()` decided, each part in the order it was decided: variables to
    set (a None value unsets), path-list entries to put in front, decisions, warnings, and
    blockers (what makes the main GPU unusable, also among the warnings)."""
    __slots__ = ("env", "prepend", "decisions", "warnings", "blockers")

    def __init__(self, env: tuple[tuple[str, str | None], ...] = (),
                 prepend: tuple[tuple[str, tuple[str, ...]], ...] = (),
                 decisions: tuple[Decision, ...] = (), warnings: tuple[str, ...] = (),
                 blockers: tuple[str, ...] = ()):
        init(self, env, prepend, decisions, warnings, blockers)

    def then(self, later: Decided) -> Decided:
        """These results followed by `later`'s: its variables assigned after these, its path-list
        entries in front of these, and its decision on a path list in the place of the earlier
        one for that list (the later decision names the whole list and what it went in front of)."""
        prepend = dict(self.prepend)
        for var, entries in later.prepend:
            prepend[var] = _in_front(entries, prepend.get(var, ()))
        decisions = list(self.decisions)
        for d in later.decisions:
            old = next((i for i, e in enumerate(decisions) if e.key == d.key), None) \
                if d.key in PATH_VARS else None
            if old is None:
                decisions.append(d)
            else:
                decisions[old] = d
        return Decided(self.env + later.env, tuple(prepend.items()), tuple(decisions),
                       self.warnings + later.warnings, self.blockers + later.blockers)


class InstallChoice(Record):
    """The ROCm install the environment uses (None when there is none) and the decision on it."""
    __slots__ = ("rocm", "decided")

    def __init__(self, rocm: RocmInstall | None, decided: Decided):
        init(self, rocm, decided)


class TargetChoice(Record):
    """The gfx target the environment is for: the GPUs it knows (the detected ones, and a virtual
    one for a `--target` no GPU here matches), those it keeps visible, the effective target, the
    HSA_OVERRIDE_GFX_VERSION that makes them run it (or None), and the decision on it."""
    __slots__ = ("gpus", "selected", "effective", "override", "decided")

    def __init__(self, gpus: tuple[Gpu, ...], selected: tuple[Gpu, ...], effective: str | None,
                 override: str | None, decided: Decided):
        init(self, gpus, selected, effective, override, decided)


class BuildsUsed(Record):
    """The rocforge builds the environment uses, and what using them decided."""
    __slots__ = ("builds", "decided")

    def __init__(self, builds: tuple[builds_mod.Build, ...], decided: Decided):
        init(self, builds, decided)


def _choose_install(found: list[RocmInstall], gfx: str | None, environ: Mapping[str, str],
                    rocm: str | None) -> InstallChoice:
    def chosen(inst: RocmInstall | None, why: str, *warnings: str) -> InstallChoice:
        rocm_path = None if inst is None else str(inst.path)
        return InstallChoice(inst, Decided(decisions=(Decision("rocm", rocm_path, why),),
                                           warnings=warnings))

    if not found:
        return chosen(None, "no ROCm install found (looked at $ROCM_PATH, rocforge nightlies, "
                            "/opt/rocm, /opt/rocm-*, /usr, pip rocm-sdk)")
    if rocm:
        return chosen(found[0], f"--rocm {rocm} given")
    ranked = sorted(found, key=lambda i: _rank_key(i, gfx), reverse=True)
    best = ranked[0]
    env_path = environ.get("ROCM_PATH")
    ignored: tuple[str, ...] = ()
    if env_path:
        from_env = [i for i in found if "$ROCM_PATH" in i.sources]
        if from_env:
            inst = from_env[0]
            better = ((f"ROCM_PATH={env_path} is used because it is set, but {best.path} serves "
                       f"{gfx} better ({_support(best, gfx)[1]}); unset ROCM_PATH or pass --rocm",)
                      if gfx and _rank_key(best, gfx)[0] > _rank_key(inst, gfx)[0] else ())
            return chosen(inst, f"$ROCM_PATH={env_path} is set and is a {inst.layout} ROCm tree",
                          *better)
        ignored = (f"ROCM_PATH={env_path} is not a ROCm install; ignored",)
    parts = []
    if gfx:
        parts.append(f"{_support(best, gfx)[1]}")
    if best.nightly_current:
        parts.append("it is rocforge's current nightly (`rocforge nightly use`)")
    others = [i for i in ranked[1:]]
    if others:
        why_not = "; ".join(
            f"{o.path} ({o.layout} {o.version or '?'}"
            + (f": {_support(o, gfx)[1]}" if gfx else "") + ")" for o in others[:4])
        parts.append(f"ranked above {why_not}")
    reason = f"{best.layout} {best.version or '(version unknown)'}"
    if parts:
        reason += ": " + "; ".join(parts)
    if len(found) > 1:
        reason += " (order: kernels for the GPU, nightly in use, newest version, layout)"
    return chosen(best, reason, *ignored)


# -- the resolver -------------------------------------------------------------------------------
def resolve(root: Root, *, target: str | None = None, rocm: str | None = None,
            environ: Mapping[str, str] | None = None) -> Resolution:
    """Each step returns what it decided; they are folded in order into the `Resolution`."""
    env_in: Mapping[str, str] = os.environ if environ is None else environ
    wanted = targets.get_target(target).name if target else None  # UsageError when unknown
    discovery = gpus_mod.discover(root, environ=dict(env_in))
    detected = tuple(discovery.gpus)
    found = installs_mod.find_installs(root, rocm=rocm, environ=env_in)

    # The GPU the environment is for: --target, else the preferred detected GPU.
    anchor = wanted or (min(detected, key=_gpu_order).gfx if detected else None)
    install = _choose_install(found, anchor, env_in, rocm)
    inst = install.rocm
    unknown = Decided(warnings=tuple(
        f"{gfx} is not in rocforge's target table (newer than this rocforge?): no override "
        "fallback or family is known for it" for gfx in sorted({g.gfx for g in detected if not g.known})))
    chosen = (_target_wanted(wanted, detected, inst) if wanted
              else _target_detected(root, detected, inst, discovery.source))
    effective = chosen.effective
    so_far = Decided(warnings=tuple(discovery.warnings)).then(install.decided).then(unknown)
    so_far = so_far.then(chosen.decided)
    if inst is not None:
        so_far = so_far.then(_toolchain_decisions(inst))
    so_far = so_far.then(_mask_gpus(inst, wanted, detected, chosen.selected, env_in))
    so_far = so_far.then(_override_decisions(inst, detected, chosen, env_in))

    # without a ROCm, the builds that need none (CPU, Vulkan) still get their PATH
    used = _build_decisions(root, effective, so_far, inst is not None)
    so_far = so_far.then(used.decided)
    built_lt = [b for b in used.builds if effective in installs_mod.tensile_targets(
        root, (inner_join(b.prefix, "lib/hipblaslt/library"),))]
    if inst is not None and effective:
        so_far = so_far.then(_hipblaslt_decision(inst, effective, built_lt, env_in))
    if inst is not None:
        so_far = so_far.then(Decided(warnings=tuple(
            f"{inst.path}: {p}" for p in inst.problems
            if any(k in p for k in ("broken link", "no device bitcode", "no clang++",
                                    "cannot compile", "compiler (lib/llvm-")))))

    env = dict(so_far.env)
    prepend = dict(so_far.prepend)
    for var, entries in prepend.items():
        env[var] = prepend_list(env_in.get(var), entries)
    index_of = {id(g): i for i, g in enumerate(chosen.gpus)}
    return Resolution(
        gpus=chosen.gpus, target=effective, rocm=inst, env=env, decisions=list(so_far.decisions),
        warnings=list(so_far.warnings), installs=tuple(found),
        selected=tuple(index_of[id(g)] for g in chosen.selected if id(g) in index_of),
        prepend=prepend, root=root, gpu_source=discovery.source, builds=used.builds,
        blockers=so_far.blockers,
    )


def _target_wanted(wanted: str, detected: tuple[Gpu, ...], inst: RocmInstall | None) -> TargetChoice:
    """`--target` given: the GPUs it names (directly, or as their override target), else a
    virtual GPU so the environment can still build for it."""
    related = tuple(g for g in detected if g.gfx == wanted)
    via_override = tuple(g for g in detected if g.known and g.target.override_with == wanted)
    gpus, selected, override = detected, (), None
    warnings: tuple[str, ...] = ()
    if related:
        selected = related
        decision = Decision("target", wanted, f"--target {wanted}: "
                            f"{len(related)} matching GPU(s) in this machine")
    elif via_override:
        selected = via_override
        override = targets.get_target(wanted).hsa_version
        names = ", ".join(sorted({g.gfx for g in via_override}))
        decision = Decision("target", wanted, f"--target {wanted} on {names}: the "
                            f"target table names {wanted} as their override target")
    else:
        gpus = (*detected, gpus_mod.virtual_gpu(wanted))
        where = ", ".join(g.gfx for g in detected) or "no GPU detected"
        decision = Decision("target", wanted, f"--target {wanted} (this machine: "
                            f"{where}); environment is for building {wanted}")
        if detected:
            warnings = (f"--target {wanted} matches no GPU here ({where}); programs "
                        f"built for {wanted} will not run on this machine",)
    if inst is not None:
        ok, why_k = inst.coverage.kernels_for(wanted)
        if not ok:
            warnings += (f"{inst.path}: {why_k}",)
    return TargetChoice(gpus, selected, wanted, override,
                        Decided(decisions=(decision,), warnings=warnings))


def _target_detected(root: Root, detected: tuple[Gpu, ...], inst: RocmInstall | None,
                     source: str) -> TargetChoice:
    """No `--target`: the preferred detected GPU the install serves natively, else one it serves
    through its override target, else the preferred GPU with a warning."""
    def chosen(selected: tuple[Gpu, ...], effective: str | None, reason: str,
               override: str | None = None, warnings: tuple[str, ...] = ()) -> TargetChoice:
        return TargetChoice(detected, selected, effective, override,
                            Decided(decisions=(Decision("target", effective, reason),),
                                    warnings=warnings))

    if not detected:
        return chosen((), None, "no GPU detected ("
                      + ("KFD topology has no GPU node" if source == "kfd"
                         else "no KFD topology under /sys/class/kfd"
                         + ("" if root.is_host else " in this --root"))
                      + ") and no --target given")
    if inst is None:
        best = min(detected, key=_gpu_order)
        return chosen(detected, best.gfx, f"{best.describe()} (no ROCm install "
                      "to check its kernels against)")
    levels = {g.index: _support(inst, g.gfx) for g in detected}
    native = tuple(g for g in detected if levels[g.index][0] == 2)
    by_override = tuple(g for g in detected if levels[g.index][0] == 1)
    if native:
        best = min(native, key=_gpu_order)
        return chosen(native, best.gfx, f"{best.describe()}: {levels[best.index][1]}")
    if by_override:
        best = min(by_override, key=_gpu_order)
        effective = levels[best.index][2]
        return chosen(tuple(g for g in by_override if levels[g.index][2] == effective), effective,
                      f"{best.describe()}: {levels[best.index][1]}; running "
                      f"{effective} kernels through HSA_OVERRIDE_GFX_VERSION",
                      targets.get_target(effective).hsa_version)
    best = min(detected, key=_gpu_order)
    return chosen(detected, best.gfx, f"{best.describe()}: {levels[best.index][1]}; no "
                  "compatible kernels either — nothing to fall back on",
                  warnings=(f"{inst.path} carries no kernels for {best.gfx}: " + install_hint(best.gfx),))


def _mask_gpus(inst: RocmInstall | None, wanted: str | None, detected: tuple[Gpu, ...],
               selected: tuple[Gpu, ...], env_in: Mapping[str, str]) -> Decided:
    """ROCR_VISIBLE_DEVICES hides the GPUs not selected (an unsupported GPU visible to ROCm can
    crash apps); a main dGPU left unserved while only the iGPU is, is a blocker."""
    igpus = [g for g in detected if g.is_igpu]
    dgpus = [g for g in detected if not g.is_igpu]
    warnings: list[str] = []
    if igpus and dgpus:
        warnings.append("iGPU and dGPU both visible to ROCm: "
                        + ", ".join(g.describe() for g in detected))
    masked = [g for g in detected if g not in selected]
    blockers: list[str] = []
    if inst is not None and not wanted and selected and all(g.is_igpu for g in selected):
        for g in (g for g in dgpus if g not in selected):
            msg = (f"the main GPU, {g.describe()}, is NOT served by {inst.path} "
                   f"({inst.layout} {inst.version or '?'}): {_support(inst, g.gfx)[1]}; only the "
                   f"iGPU {', '.join(x.describe() for x in selected)} is, so programs run on the "
                   f"small GPU. For {g.gfx}: {install_hint(g.gfx)}")
            warnings.append(msg)
            blockers.append(msg)
    if not (selected and masked):
        return Decided(warnings=tuple(warnings), blockers=tuple(blockers))
    value = ",".join(str(g.index) for g in selected)
    reason = ("masked " + ", ".join(
        f"{g.describe()}" + (f": {_support(inst, g.gfx)[1]}" if inst else "")
        for g in masked)
        + f"; kept {', '.join(g.describe() for g in selected)}"
        + " (an unsupported GPU visible to ROCm can crash apps, lemonade-sdk/llamacpp-rocm #96)")
    user = env_in.get("ROCR_VISIBLE_DEVICES")
    if user is not None and user != value:
        warnings.append(f"ROCR_VISIBLE_DEVICES={user} in the environment replaced by {value}")
    return Decided(env=(("ROCR_VISIBLE_DEVICES", value),),
                   decisions=(Decision("ROCR_VISIBLE_DEVICES", value, reason),),
                   warnings=tuple(warnings), blockers=tuple(blockers))


def _override_decisions(inst: RocmInstall | None, detected: tuple[Gpu, ...], chosen: TargetChoice,
                        env_in: Mapping[str, str]) -> Decided:
    """HSA_OVERRIDE_GFX_VERSION: set when the target was chosen through its override, else
    unset with whatever stale (per-node) override the environment carries."""
    stale = {k: v for k, v in env_in.items() if k == OVERRIDE or k.startswith(OVERRIDE + "_")}
    effective, override = chosen.effective, chosen.override
    if override:
        gpu_names = ", ".join(sorted({g.gfx for g in chosen.selected})) or "the GPU"
        evidence = "; ".join(dict.fromkeys(_support(inst, g.gfx)[1] for g in chosen.selected
                                           if inst is not None and g.gfx != effective))
        decision = Decision(OVERRIDE, override,
                            f"{gpu_names} run {effective} kernels: ROCm must see them as "
                            f"{effective} ({override})" + (f" — {evidence}" if evidence else ""))
        per_node = [k for k in stale if k != OVERRIDE]
        return Decided(env=((OVERRIDE, override), *((k, None) for k in per_node)),
                       decisions=(decision,),
                       warnings=tuple(f"{k}={stale[k]} in the environment unset (per-node "
                                      "override would win over the decided one)" for k in per_node))
    if not (detected or stale):
        return Decided()
    why_none = ("the libraries carry kernels for the GPU itself"
                if effective and inst and inst.coverage.kernels_for(effective)[0]
                else "no compatible target's kernels to point at")
    return Decided(env=((OVERRIDE, None), *((k, None) for k in stale)),
                   decisions=(Decision(OVERRIDE, None, f"not needed: {why_none}"),),
                   warnings=tuple(f"stale {k}={v} in the environment is unset: {effective or 'the GPU'} "
                                  "needs no override here, and a stale override crashes ROCm on "
                                  "native targets (kyuz0/amd-strix-halo-toolboxes #115)"
                                  for k, v in stale.items()))


def _hipblaslt_decision(inst: RocmInstall, effective: str, built_lt: list[builds_mod.Build],
                        env_in: Mapping[str, str]) -> Decided:
    """ROCBLAS_USE_HIPBLASLT=1 only when a hipBLASLt (the ROCm's or one rocforge built) has
    kernels for the target; otherwise unset, since rocBLAS fails to load a missing library."""
    links_lt, why_lt = inst.coverage.rocblas_uses_hipblaslt()
    gain = "(lhl/strix-halo-testing: hgemm 6.1 -> 28.7 TFLOPS on gfx1151)"
    if links_lt is False and not built_lt:
        why_unset = why_lt
        reason = (f"{why_lt}: the variable would do nothing (Debian's changelog: \"Disable "
                  "hipBLASlt support until it is packaged\")" if inst.layout == "debian"
                  else f"{why_lt}: it would do nothing")
    elif inst.coverage.has_hipblaslt and inst.coverage.hipblaslt_for(effective):
        return _uses_hipblaslt(f"hipBLASLt has TensileLibrary files for {effective}: rocBLAS "
                               f"routes GEMMs through it {gain}")
    elif built_lt:
        return _uses_hipblaslt(f"the hipBLASLt rocforge built at {built_lt[0].prefix} has "
                               f"TensileLibrary files for {effective}: rocBLAS routes GEMMs "
                               f"through it {gain}")
    else:
        why_unset = ("no hipBLASLt installed" if not inst.coverage.has_hipblaslt
                     else f"hipBLASLt has no TensileLibrary files for {effective}")
        reason = f"{why_unset}; rocBLAS would fail to load it (lemonade-sdk/llamacpp-rocm #10)"
    user = env_in.get("ROCBLAS_USE_HIPBLASLT")
    return Decided(env=(("ROCBLAS_USE_HIPBLASLT", None),),
                   decisions=(Decision("ROCBLAS_USE_HIPBLASLT", None, reason),),
                   warnings=(f"ROCBLAS_USE_HIPBLASLT={user} in the environment is unset: "
                             f"{why_unset}",) if user not in (None, "", "0") else ())


def _uses_hipblaslt(reason: str) -> Decided:
    return Decided(env=(("ROCBLAS_USE_HIPBLASLT", "1"),),
                   decisions=(Decision("ROCBLAS_USE_HIPBLASLT", "1", reason),))


# Variables the resolver itself decides: a build's recipe cannot export them.
_RESERVED = frozenset({"ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH",
                       "HIP_DEVICE_LIB_PATH", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                       OVERRIDE, "ROCBLAS_USE_HIPBLASLT", *PATH_VARS})


def _build_decisions(root: Root, target: str | None, before: Decided,
                     rocm_found: bool = True) -> BuildsUsed:
    """The builds this environment uses, outputs intact: a HIP build when a ROCm was found and it
    was built for the effective target; a CPU or Vulkan build (no ROCm, no GPU target) always.
    `before` is what the earlier steps decided: the path lists these builds go in front of and
    the variables an exported one must not contradict."""
    found, refused = builds_mod.scan_builds(root)
    warnings: list[str] = list(refused)
    if not found:
        return BuildsUsed((), Decided(warnings=tuple(warnings)))
    used: list[builds_mod.Build] = []
    skipped: list[str] = []
    for b in found:
        if b.needs_rocm and not rocm_found:
            skipped.append(f"{b.recipe} at {b.prefix} (a {b.backend} build: needs a ROCm, none found)")
        elif b.needs_rocm and b.target != target:
            skipped.append(f"{b.recipe} at {b.prefix} (built for {b.target})")
        elif b.missing:
            warnings.append(f"{b.describe()} lacks {', '.join(b.missing)} (deleted since the build?): "
                            f"not used; rebuild with `rocforge build {b.recipe} --target {b.target} "
                            "--force`")
        else:
            used.append(b)
    if target or used:
        summary = (("used for " + target if target else "used without a GPU target (CPU and Vulkan "
                    "builds need none)") + ": "
                   + (", ".join(b.describe() for b in used) or "none")
                   + (f"; not used: {', '.join(skipped)}" if skipped and not target else "")
                   + (f"; not for this target: {', '.join(skipped)}" if skipped and target else ""))
    else:  # no GPU here and no --target: nothing to match a build's target against
        summary = "none used: no GPU target (give --target)" + (f"; found: {', '.join(skipped)}" if skipped else "")
    summary += ("; none goes on LD_LIBRARY_PATH: each build loads its own libraries through "
                "its RUNPATH" if used else "")
    decisions = [Decision("builds", [str(b.prefix) for b in used], summary)]
    if not used:
        return BuildsUsed((), Decided(decisions=tuple(decisions), warnings=tuple(warnings)))
    on_path, path_decisions = _path_builds(root, target, used)
    decisions += path_decisions
    lists = {"PATH": tuple(str(b.bin_dir) for b, _ in on_path),
             "CMAKE_PREFIX_PATH": tuple(str(b.prefix) for b in used)}
    earlier_lists, earlier_decisions = dict(before.prepend), before.decisions
    for var, entries in lists.items():
        if entries:
            old = next((d for d in earlier_decisions if d.key == var), None)
            then = f"; then the ROCm's: {old.reason}" if old is not None else ""
            first = (", ".join(f"{os.path.basename(b.prefix)} ({why})" for b, why in on_path)
                     if var == "PATH" else f"rocforge builds for {target or 'no GPU target'}")
            whole = _in_front(entries, earlier_lists.get(var, ()))
            decisions.append(Decision(var, ":".join(whole), f"{first} first{then}"))
    env = dict(before.env)
    exported: list[tuple[str, str]] = []
    for b in used:
        for key, value in b.export_env.items():
            problem = shellsafe.env_name_problem(key) or shellsafe.env_value_problem(value)
            if problem:  # an edited or hostile manifest: never printed into a script
                warnings.append(f"{b.describe()} exports {problem}: ignored")
                continue
            if key in _RESERVED:
                warnings.append(f"{b.describe()} exports {key}, which the resolver decides: ignored")
                continue
            if key in env and env[key] != value:
                warnings.append(f"{key}: {b.describe()} wants {value}, kept {env[key]} "
                                "(from an earlier build)")
                continue
            env[key] = value
            exported.append((key, value))
            why = b.export_reasons.get(key, "exported by the recipe")
            decisions.append(Decision(key, value, f"{b.describe()}: {why}"))
    return BuildsUsed(tuple(used), Decided(
        env=tuple(exported), prepend=tuple((var, e) for var, e in lists.items() if e),
        decisions=tuple(decisions), warnings=tuple(warnings)))


def _path_builds(root: Root, target: str | None, used: list[builds_mod.Build]
                 ) -> tuple[list[tuple[builds_mod.Build, str]], list[Decision]]:
    """At most one build per recipe on PATH, with why: the one chosen with `rocforge use`, else
    the newest that passed `rocforge verify`; and the decisions that say so.  Two builds of one
    recipe carry the same program names (llama-cli of the cpu build and of the vulkan build), so
    more than one would only shadow each other; the rest are named in a decision so the user
    knows they exist."""
    from rocforge_build.discover import choices

    chosen = choices.chosen(root)
    groups: dict[str, list[builds_mod.Build]] = {}
    for b in used:
        if b.bin_dir is not None:
            groups.setdefault(b.recipe, []).append(b)
    picked: list[tuple[builds_mod.Build, str]] = []
    notes: list[str] = []
    for recipe, group in groups.items():
        pick, why = None, ""
        if recipe in chosen:
            name, at = chosen[recipe]
            pick = next((b for b in group if os.path.basename(b.prefix) == name), None)
            if pick is not None:
                why = f"chosen with `rocforge use` on {at[:10] or 'an unknown date'}"
            else:
                notes.append(f"the `rocforge use` choice for {recipe}, {name}, is not a usable "
                             f"build for {target}")
        if pick is None:
            passed = [(b, v) for b in group if (v := choices.verdict(root, os.path.basename(b.prefix), b.stamp))]
            if passed:
                pick, (date, itself) = max(passed, key=lambda bv: (bv[0].built_at or "", bv[1][0]))
                why = (f"newest build of {recipe} verify took as rocforge's reference, a CPU build of the "
                       f"default plan that other builds are verified against ({date[:10]})" if itself
                       else f"newest build of {recipe} that passed verify ({date[:10]})")
        if pick is not None:
            picked.append((pick, why))
    decisions: list[Decision] = []
    if picked:
        decisions.append(Decision("builds on PATH", [str(b.bin_dir) for b, _ in picked],
                                  "; ".join(f"{b.prefix} — {why}" for b, why in picked)))
    rest = [b for group in groups.values() for b in group if b not in [p for p, _ in picked]]
    if rest or notes:
        decisions.append(Decision(
            "builds not on PATH", [str(b.prefix) for b in rest],
            "; ".join(notes + ([", ".join(os.path.basename(b.prefix) for b in rest) + " (run them by path, or "
                                "put one on PATH with `rocforge use PREFIX`; `rocforge verify` "
                                "passing puts the newest on PATH)"] if rest else []))))
    return picked, decisions


def _toolchain_decisions(inst: RocmInstall) -> Decided:
    """The compiler variables and path lists of the chosen install."""
    distro = inst.layout in ("debian", "fedora")
    hip_clang_why = f"{inst.layout} layout: clang for HIP lives in {inst.hip_clang_path}"
    if any("broken link" in p for p in inst.problems):
        hip_clang_why += " (this tree's bin/amdclang* links are broken, as before Mar 2026)"
    if inst.extra.get("hip_clang_why"):
        hip_clang_why = f"{inst.extra['hip_clang_why']} ({inst.layout} layout)"
    elif inst.layout == "debian":
        hip_clang_why += " (Debian's hipcc calls $HIP_CLANG_PATH/clang++-N, found only in /usr/bin)"
    bitcode_why = f"device bitcode (oclc_isa_version_*.bc) is in {inst.bitcode_dir}"
    if inst.layout in ("therock", "pip") and inst.bitcode_dir != inner_join(inst.path, "amdgcn/bitcode"):
        bitcode_why += ", not $ROCM_PATH/amdgcn/bitcode (TheRock layout)"
    variables = (
        ("ROCM_PATH", inst.path, f"the chosen {inst.layout} install"),
        ("HIP_PATH", inst.path, "HIP lives in the ROCm tree" if not distro
         else f"{inst.layout} installs HIP under /usr"),
        ("HIP_PLATFORM", "amd", "AMD GPUs (hipcc and CMake's HIP language read it)"),
        ("HIP_CLANG_PATH", inst.hip_clang_path, hip_clang_why),
        ("HIP_DEVICE_LIB_PATH", inst.bitcode_dir, bitcode_why),
    )
    setting = [(key, str(value), why) for key, value, why in variables if value is not None]
    lists = {
        "PATH": inst.bin_dirs,
        "LD_LIBRARY_PATH": inst.lib_dirs,
        "CMAKE_PREFIX_PATH": (inst.path,) if inst.cmake_prefix else (),
        "PKG_CONFIG_PATH": inst.pkgconfig_dirs,
    }
    prepend = tuple((var, tuple(str(d) for d in dirs)) for var, dirs in lists.items() if dirs)
    return Decided(
        env=tuple((key, value) for key, value, _ in setting), prepend=prepend,
        decisions=(*(Decision(key, value, why) for key, value, why in setting),
                   *(Decision(var, ":".join(entries),
                              f"prepended unless already present ({inst.layout} layout)")
                     for var, entries in prepend)))
