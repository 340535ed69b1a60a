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


def _choose_install(found: list[RocmInstall], gfx: str | None, environ: Mapping[str, str],
                    rocm: str | None, warnings: list[str]) -> tuple[RocmInstall | None, str]:
    if not found:
        return None, "no ROCm install found (looked at $ROCM_PATH, rocforge nightlies, " \
                     "/opt/rocm, /opt/rocm-*, /usr, pip rocm-sdk)"
    if rocm:
        return found[0], f"--rocm {rocm} given"
    ranked = sorted(found, key=lambda i: _rank_key(i, gfx), reverse=True)
    best = ranked[0]
    env_path = environ.get("ROCM_PATH")
    if env_path:
        from_env = [i for i in found if "$ROCM_PATH" in i.sources]
        if from_env:
            chosen = from_env[0]
            if gfx and _rank_key(best, gfx)[0] > _rank_key(chosen, gfx)[0]:
                warnings.append(
                    f"ROCM_PATH={env_path} is used because it is set, but {best.path} serves "
                    f"{gfx} better ({_support(best, gfx)[1]}); unset ROCM_PATH or pass --rocm")
            return chosen, f"$ROCM_PATH={env_path} is set and is a {chosen.layout} ROCm tree"
        warnings.append(f"ROCM_PATH={env_path} is not a ROCm install; ignored")
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
    return best, reason


# -- the resolver -------------------------------------------------------------------------------
def resolve(root: Root, *, target: str | None = None, rocm: str | None = None,
            environ: Mapping[str, str] | None = None) -> Resolution:
    env_in: Mapping[str, str] = os.environ if environ is None else environ
    decisions: list[Decision] = []
    warnings: list[str] = []

    wanted = targets.get_target(target).name if target else None  # UsageError when unknown
    discovery = gpus_mod.discover(root, environ=dict(env_in))
    warnings.extend(discovery.warnings)
    detected = list(discovery.gpus)
    found = installs_mod.find_installs(root, rocm=rocm, environ=env_in)

    # The GPU the environment is for: --target, else the preferred detected GPU.
    anchor = wanted or (min(detected, key=_gpu_order).gfx if detected else None)
    inst, why = _choose_install(found, anchor, env_in, rocm, warnings)
    decisions.append(Decision("rocm", None if inst is None else str(inst.path), why))
    for unknown in sorted({g.gfx for g in detected if not g.known}):
        warnings.append(f"{unknown} is not in rocforge's target table (newer than this "
                        "rocforge?): no override fallback or family is known for it")

    gpu_list: list[Gpu] = list(detected)
    if wanted:
        selected, effective, override = _target_wanted(wanted, detected, inst, gpu_list,
                                                       decisions, warnings)
    else:
        selected, effective, override = _target_detected(root, detected, inst, discovery.source,
                                                         decisions, warnings)

    env: dict[str, str | None] = {}
    prepend: dict[str, tuple[str, ...]] = {}
    if inst is not None:
        _toolchain_decisions(inst, decisions, env, prepend)
    blockers = _mask_gpus(inst, wanted, detected, selected, env, env_in, decisions, warnings)
    _override_decisions(inst, detected, selected, effective, override, env, env_in,
                        decisions, warnings)

    # without a ROCm, the builds that need none (CPU, Vulkan) still get their PATH
    used = _build_decisions(root, effective, decisions, env, prepend, warnings, inst is not None)
    built_lt = [b for b in used if effective in installs_mod.tensile_targets(
        root, (inner_join(b.prefix, "lib/hipblaslt/library"),))]
    if inst is not None and effective:
        _hipblaslt_decision(inst, effective, built_lt, env, env_in, decisions, warnings)

    for var, entries in prepend.items():
        env[var] = prepend_list(env_in.get(var), entries)

    if inst is not None:
        warnings.extend(f"{inst.path}: {p}" for p in inst.problems
                        if any(k in p for k in ("broken link", "no device bitcode", "no clang++",
                                                "cannot compile", "compiler (lib/llvm-")))

    index_of = {id(g): i for i, g in enumerate(gpu_list)}
    return Resolution(
        gpus=tuple(gpu_list), target=effective, rocm=inst, env=env, decisions=decisions,
        warnings=warnings, installs=tuple(found),
        selected=tuple(index_of[id(g)] for g in selected if id(g) in index_of),
        prepend=prepend, root=root, gpu_source=discovery.source, builds=tuple(used),
        blockers=tuple(blockers),
    )


def _target_wanted(wanted: str, detected: list[Gpu], inst: RocmInstall | None,
                   gpu_list: list[Gpu], decisions: list[Decision],
                   warnings: list[str]) -> tuple[list[Gpu], str, str | None]:
    """`--target` given: the GPUs it names (directly, or as their override target), else a
    virtual GPU so the environment can still build for it.  Returns (selected GPUs, effective
    target, HSA override version or None)."""
    related = [g for g in detected if g.gfx == wanted]
    via_override = [g for g in detected if g.known and g.target.override_with == wanted]
    selected: list[Gpu] = []
    override: str | None = None
    if related:
        selected = related
        decisions.append(Decision("target", wanted, f"--target {wanted}: "
                                  f"{len(related)} matching GPU(s) in this machine"))
    elif via_override:
        selected = via_override
        override = targets.get_target(wanted).hsa_version
        names = ", ".join(sorted({g.gfx for g in via_override}))
        decisions.append(Decision("target", wanted, f"--target {wanted} on {names}: the "
                                  f"target table names {wanted} as their override target"))
    else:
        gpu_list.append(gpus_mod.virtual_gpu(wanted))
        where = ", ".join(g.gfx for g in detected) or "no GPU detected"
        decisions.append(Decision("target", wanted, f"--target {wanted} (this machine: "
                                  f"{where}); environment is for building {wanted}"))
        if detected:
            warnings.append(f"--target {wanted} matches no GPU here ({where}); programs "
                            f"built for {wanted} will not run on this machine")
    if inst is not None:
        ok, why_k = inst.coverage.kernels_for(wanted)
        if not ok:
            warnings.append(f"{inst.path}: {why_k}")
    return selected, wanted, override


def _target_detected(root: Root, detected: list[Gpu], inst: RocmInstall | None, source: str,
                     decisions: list[Decision],
                     warnings: list[str]) -> tuple[list[Gpu], str | None, str | None]:
    """No `--target`: the preferred detected GPU the install serves natively, else one it serves
    through its override target, else the preferred GPU with a warning.  Returns (selected GPUs,
    effective target, HSA override version or None)."""
    if not detected:
        decisions.append(Decision("target", None, "no GPU detected ("
                                  + ("KFD topology has no GPU node" if source == "kfd"
                                     else "no KFD topology under /sys/class/kfd"
                                     + ("" if root.is_host else " in this --root"))
                                  + ") and no --target given"))
        return [], None, None
    if inst is None:
        best = min(detected, key=_gpu_order)
        decisions.append(Decision("target", best.gfx, f"{best.describe()} (no ROCm install "
                                  "to check its kernels against)"))
        return detected, best.gfx, None
    levels = {g.index: _support(inst, g.gfx) for g in detected}
    native = [g for g in detected if levels[g.index][0] == 2]
    by_override = [g for g in detected if levels[g.index][0] == 1]
    if native:
        best = min(native, key=_gpu_order)
        decisions.append(Decision("target", best.gfx,
                                  f"{best.describe()}: {levels[best.index][1]}"))
        return native, best.gfx, None
    if by_override:
        best = min(by_override, key=_gpu_order)
        effective = levels[best.index][2]
        override = targets.get_target(effective).hsa_version
        selected = [g for g in by_override if levels[g.index][2] == effective]
        decisions.append(Decision("target", effective,
                                  f"{best.describe()}: {levels[best.index][1]}; running "
                                  f"{effective} kernels through HSA_OVERRIDE_GFX_VERSION"))
        return selected, effective, override
    best = min(detected, key=_gpu_order)
    decisions.append(Decision("target", best.gfx,
                              f"{best.describe()}: {levels[best.index][1]}; no "
                              "compatible kernels either — nothing to fall back on"))
    warnings.append(f"{inst.path} carries no kernels for {best.gfx}: "
                    + install_hint(best.gfx))
    return detected, best.gfx, None


def _mask_gpus(inst: RocmInstall | None, wanted: str | None, detected: list[Gpu],
               selected: list[Gpu], env: dict[str, str | None], env_in: Mapping[str, str],
               decisions: list[Decision], warnings: list[str]) -> list[str]:
    """ROCR_VISIBLE_DEVICES hides the GPUs not selected (an unsupported GPU visible to ROCm can
    crash apps); returns the blockers: a main dGPU left unserved while only the iGPU is."""
    igpus = [g for g in detected if g.is_igpu]
    dgpus = [g for g in detected if not g.is_igpu]
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
    if selected and masked:
        value = ",".join(str(g.index) for g in selected)
        reason = ("masked " + ", ".join(
            f"{g.describe()}" + (f": {_support(inst, g.gfx)[1]}" if inst else "")
            for g in masked)
            + f"; kept {', '.join(g.describe() for g in selected)}"
            + " (an unsupported GPU visible to ROCm can crash apps, lemonade-sdk/llamacpp-rocm #96)")
        env["ROCR_VISIBLE_DEVICES"] = value
        decisions.append(Decision("ROCR_VISIBLE_DEVICES", value, reason))
        user = env_in.get("ROCR_VISIBLE_DEVICES")
        if user is not None and user != value:
            warnings.append(f"ROCR_VISIBLE_DEVICES={user} in the environment replaced by {value}")
    return blockers


def _override_decisions(inst: RocmInstall | None, detected: list[Gpu], selected: list[Gpu],
                        effective: str | None, override: str | None,
                        env: dict[str, str | None], env_in: Mapping[str, str],
                        decisions: list[Decision], warnings: list[str]) -> None:
    """HSA_OVERRIDE_GFX_VERSION: set when the target was chosen through its override, else
    unset with whatever stale (per-node) override the environment carries."""
    stale = {k: v for k, v in env_in.items() if k == OVERRIDE or k.startswith(OVERRIDE + "_")}
    if override:
        gpu_names = ", ".join(sorted({g.gfx for g in selected})) or "the GPU"
        env[OVERRIDE] = override
        evidence = "; ".join(dict.fromkeys(_support(inst, g.gfx)[1] for g in selected
                                           if inst is not None and g.gfx != effective))
        decisions.append(Decision(OVERRIDE, override,
                                  f"{gpu_names} run {effective} kernels: ROCm must see them as "
                                  f"{effective} ({override})" + (f" — {evidence}" if evidence else "")))
        for k in stale:
            if k != OVERRIDE:
                env[k] = None
                warnings.append(f"{k}={stale[k]} in the environment unset (per-node override "
                                "would win over the decided one)")
        return
    if detected or stale:
        why_none = ("the libraries carry kernels for the GPU itself"
                    if effective and inst and inst.coverage.kernels_for(effective)[0]
                    else "no compatible target's kernels to point at")
        env[OVERRIDE] = None
        decisions.append(Decision(OVERRIDE, None, f"not needed: {why_none}"))
    for k, v in stale.items():
        env[k] = None
        warnings.append(f"stale {k}={v} in the environment is unset: {effective or 'the GPU'} "
                        "needs no override here, and a stale override crashes ROCm on "
                        "native targets (kyuz0/amd-strix-halo-toolboxes #115)")


def _hipblaslt_decision(inst: RocmInstall, effective: str, built_lt: list[builds_mod.Build],
                        env: dict[str, str | None], env_in: Mapping[str, str],
                        decisions: list[Decision], warnings: list[str]) -> None:
    """ROCBLAS_USE_HIPBLASLT=1 only when a hipBLASLt (the ROCm's or one rocforge built) has
    kernels for the target; otherwise unset, since rocBLAS fails to load a missing library."""
    links_lt, why_lt = inst.coverage.rocblas_uses_hipblaslt()
    if links_lt is False and not built_lt:
        env["ROCBLAS_USE_HIPBLASLT"] = None
        decisions.append(Decision("ROCBLAS_USE_HIPBLASLT", None,
                                  f"{why_lt}: the variable would do nothing (Debian's "
                                  "changelog: \"Disable hipBLASlt support until it is packaged\")"
                                  if inst.layout == "debian" else f"{why_lt}: it would do nothing"))
        if env_in.get("ROCBLAS_USE_HIPBLASLT") not in (None, "", "0"):
            warnings.append(f"ROCBLAS_USE_HIPBLASLT={env_in['ROCBLAS_USE_HIPBLASLT']} in the "
                            f"environment is unset: {why_lt}")
    elif inst.coverage.has_hipblaslt and inst.coverage.hipblaslt_for(effective):
        env["ROCBLAS_USE_HIPBLASLT"] = "1"
        decisions.append(Decision("ROCBLAS_USE_HIPBLASLT", "1",
                                  f"hipBLASLt has TensileLibrary files for {effective}: rocBLAS "
                                  "routes GEMMs through it (lhl/strix-halo-testing: hgemm 6.1 -> 28.7 TFLOPS on gfx1151)"))
    elif built_lt:
        env["ROCBLAS_USE_HIPBLASLT"] = "1"
        decisions.append(Decision("ROCBLAS_USE_HIPBLASLT", "1",
                                  f"the hipBLASLt rocforge built at {built_lt[0].prefix} has "
                                  f"TensileLibrary files for {effective}: rocBLAS routes GEMMs "
                                  "through it (lhl/strix-halo-testing: hgemm 6.1 -> 28.7 TFLOPS on gfx1151)"))
    else:
        why_no = ("no hipBLASLt installed" if not inst.coverage.has_hipblaslt
                  else f"hipBLASLt has no TensileLibrary files for {effective}")
        env["ROCBLAS_USE_HIPBLASLT"] = None
        decisions.append(Decision("ROCBLAS_USE_HIPBLASLT", None,
                                  f"{why_no}; rocBLAS would fail to load it "
                                  "(lemonade-sdk/llamacpp-rocm #10)"))
        if env_in.get("ROCBLAS_USE_HIPBLASLT") not in (None, "", "0"):
            warnings.append(f"ROCBLAS_USE_HIPBLASLT={env_in['ROCBLAS_USE_HIPBLASLT']} in the "
                            f"environment is unset: {why_no}")


# Variables the resolver itself decides: a build's recipe cannot export them.
_RESERVED = frozenset({"ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH",
                       "HIP_DEVICE_LIB_PATH", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                       OVERRIDE, "ROCBLAS_USE_HIPBLASLT", *PATH_VARS})


def _build_decisions(root: Root, target: str | None, decisions: list[Decision],
                     env: dict[str, str | None], prepend: dict[str, tuple[str, ...]],
                     warnings: list[str], rocm_found: bool = True) -> list[builds_mod.Build]:
    """The builds this environment uses, outputs intact: a HIP build when a ROCm was found and it
    was built for the effective target; a CPU or Vulkan build (no ROCm, no GPU target) always."""
    found, refused = builds_mod.scan_builds(root)
    warnings.extend(refused)
    if not found:
        return []
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
    decisions.append(Decision("builds", [str(b.prefix) for b in used], summary))
    if not used:
        return used
    on_path = _path_builds(root, target, used, decisions)
    lists = {"PATH": tuple(str(b.bin_dir) for b, _ in on_path),
             "CMAKE_PREFIX_PATH": tuple(str(b.prefix) for b in used)}
    for var, entries in lists.items():
        if entries:
            prepend[var] = entries + tuple(e for e in prepend.get(var, ()) if e not in entries)
            old = next((i for i, d in enumerate(decisions) if d.key == var), None)
            then = f"; then the ROCm's: {decisions[old].reason}" if old is not None else ""
            first = (", ".join(f"{os.path.basename(b.prefix)} ({why})" for b, why in on_path)
                     if var == "PATH" else f"rocforge builds for {target or 'no GPU target'}")
            decision = Decision(var, ":".join(prepend[var]), f"{first} first{then}")
            if old is None:
                decisions.append(decision)
            else:
                decisions[old] = decision
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
            why = b.export_reasons.get(key, "exported by the recipe")
            decisions.append(Decision(key, value, f"{b.describe()}: {why}"))
    return used


def _path_builds(root: Root, target: str | None, used: list[builds_mod.Build],
                 decisions: list[Decision]) -> list[tuple[builds_mod.Build, str]]:
    """At most one build per recipe on PATH, with why: the one chosen with `rocforge use`, else
    the newest that passed `rocforge verify`.  Two builds of one recipe carry the same program
    names (llama-cli of the cpu build and of the vulkan build), so more than one would only
    shadow each other; the rest are named in a decision so the user knows they exist."""
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
            passed = [(b, d) for b in group if (d := choices.verified(root, os.path.basename(b.prefix), b.stamp))]
            if passed:
                pick, date = max(passed, key=lambda bd: (bd[0].built_at or "", bd[1]))
                why = f"newest build of {recipe} that passed verify ({date[:10]})"
        if pick is not None:
            picked.append((pick, why))
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
    return picked


def _toolchain_decisions(inst: RocmInstall, decisions: list[Decision],
                         env: dict[str, str | None], prepend: dict[str, tuple[str, ...]]) -> None:
    def put(key: str, value, reason: str) -> None:
        if value is None:
            return
        env[key] = str(value)
        decisions.append(Decision(key, str(value), reason))

    distro = inst.layout in ("debian", "fedora")
    put("ROCM_PATH", inst.path, f"the chosen {inst.layout} install")
    put("HIP_PATH", inst.path, "HIP lives in the ROCm tree" if not distro
        else f"{inst.layout} installs HIP under /usr")
    put("HIP_PLATFORM", "amd", "AMD GPUs (hipcc and CMake's HIP language read it)")
    if inst.hip_clang_path is not None:
        reason = f"{inst.layout} layout: clang for HIP lives in {inst.hip_clang_path}"
        if any("broken link" in p for p in inst.problems):
            reason += " (this tree's bin/amdclang* links are broken, as before Mar 2026)"
        if inst.extra.get("hip_clang_why"):
            reason = f"{inst.extra['hip_clang_why']} ({inst.layout} layout)"
        elif inst.layout == "debian":
            reason += " (Debian's hipcc calls $HIP_CLANG_PATH/clang++-N, found only in /usr/bin)"
        put("HIP_CLANG_PATH", inst.hip_clang_path, reason)
    if inst.bitcode_dir is not None:
        reason = f"device bitcode (oclc_isa_version_*.bc) is in {inst.bitcode_dir}"
        if inst.layout in ("therock", "pip") and inst.bitcode_dir != inner_join(inst.path, "amdgcn/bitcode"):
            reason += ", not $ROCM_PATH/amdgcn/bitcode (TheRock layout)"
        put("HIP_DEVICE_LIB_PATH", inst.bitcode_dir, reason)
    lists = {
        "PATH": inst.bin_dirs,
        "LD_LIBRARY_PATH": inst.lib_dirs,
        "CMAKE_PREFIX_PATH": (inst.path,) if inst.cmake_prefix else (),
        "PKG_CONFIG_PATH": inst.pkgconfig_dirs,
    }
    for var, dirs in lists.items():
        if dirs:
            prepend[var] = tuple(str(d) for d in dirs)
            decisions.append(Decision(var, ":".join(prepend[var]),
                                      f"prepended unless already present ({inst.layout} layout)"))
