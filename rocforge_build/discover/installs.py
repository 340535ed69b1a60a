"""ROCm discovery: every install rocforge can see, what it is and which GPUs its libraries serve.

Candidates, in the order they are named (the order only matters for the name an install is
shown under; `resolver` ranks them): `--rocm`, `$ROCM_PATH`, rocforge's nightly prefix
(`current` first, then its siblings), `/opt/rocm`, `/opt/rocm-*`, distro trees under `/usr`,
pip `rocm-sdk` in the running Python (host root only).  Where each layout keeps its parts is
data: `data/layouts.toml`.

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from rocforge_build.discover import binaries
from rocforge_build.discover.envcache import touch
from rocforge_build.discover.layouts import Layout, layouts
from rocforge_build.discover.rocm_version import install_version
from rocforge_build.discover.watched_reads import all_dirs, first, glob, read, watch
from rocforge_build.errors import NoRocmError, UsageError
from rocforge_build.records import FRESH, Record, fresh, init, replace
from rocforge_build.rootfs import Root, inner_join, inner_path
from rocforge_build.toml_subset import tomllib_loads

_TENSILE_RE = re.compile(r"^TensileLibrary.*?_(gfx[0-9]+[0-9a-f]*)(?=[^0-9a-z]|$)")
_ARCH_DIR_RE = re.compile(r"^gfx[0-9]+[0-9a-f]*$")
_ISA_RE = re.compile(r"^oclc_isa_version_([0-9]+[0-9a-f]*)\.bc$")
HIPCXX_NAMES = ("clang++", "amdclang++")


class Coverage(Record):
    """Which gfx targets an install's libraries carry, by kind of evidence."""

    __slots__ = ("rocblas", "hipblaslt", "bitcode", "dist", "has_rocblas", "has_hipblaslt",
                 "has_dist_info", "runtime", "runtime_lib", "rocblas_lib", "rocblas_needed",
                 "kpack")

    def __init__(self, rocblas: tuple[str, ...] = (), hipblaslt: tuple[str, ...] = (),
                 bitcode: tuple[str, ...] = (),
                 dist: tuple[str, ...] = (),  # TheRock dist_info.json `dist_amdgpu_targets`
                 has_rocblas: bool = False,  # a rocBLAS kernel library directory exists at all
                 has_hipblaslt: bool = False, has_dist_info: bool = False,
                 # ISA names (amdgcn-amd-amdhsa--gfx*) in the HIP runtime's ISA table, and the
                 # library they were read from; no library = not known (an empty or stripped
                 # file tells nothing).
                 runtime: tuple[str, ...] = (), runtime_lib: str | None = None,
                 # The rocBLAS library's ELF NEEDED entries; None = not read (no rocBLAS, or not
                 # an ELF).
                 rocblas_lib: str | None = None, rocblas_needed: tuple[str, ...] | None = None,
                 # gfx -> the kernel pack (.kpack/*.kpack) that carries it (TheRock multi-arch
                 # installs).
                 kpack: tuple[tuple[str, str], ...] = ()):
        init(self, rocblas, hipblaslt, bitcode, dist, has_rocblas, has_hipblaslt, has_dist_info,
             runtime, runtime_lib, rocblas_lib, rocblas_needed, kpack)

    def kernels_for(self, gfx: str) -> tuple[bool, str]:
        """Whether this install can run `gfx` kernels, and the evidence: the runtime must know
        the ISA (device bitcode is compiler support only), and the libraries must carry them."""
        if self.runtime_lib is not None and gfx not in self.runtime:
            return False, (f"the HIP runtime {self.runtime_lib} has no ISA amdgcn-amd-amdhsa--{gfx} "
                           f"(its table ends at {_last_of(self.runtime, gfx)}): it cannot load "
                           f"{gfx} code")
        ok, why = self._libraries_for(gfx)
        if ok and self.runtime_lib is not None:
            why += f"; the runtime knows amdgcn-amd-amdhsa--{gfx}"
        return ok, why

    def rocblas_uses_hipblaslt(self) -> tuple[bool | None, str]:
        """Whether this rocBLAS was built with hipBLASLt (libhipblaslt among its NEEDED)."""
        if self.rocblas_needed is None:
            return None, "rocBLAS's ELF NEEDED entries not read"
        if any(n.startswith("libhipblaslt") for n in self.rocblas_needed):
            return True, f"{self.rocblas_lib} links libhipblaslt (ELF NEEDED)"
        return False, (f"{self.rocblas_lib} was built without hipBLASLt: its ELF NEEDED entries "
                       f"({', '.join(self.rocblas_needed)}) name no libhipblaslt")

    def _libraries_for(self, gfx: str) -> tuple[bool, str]:
        if self.kpack:  # a kpack-split install: its device code is in the packs, nowhere else
            packs = [f for g, f in self.kpack if g == gfx]
            if packs:
                blas = [f for f in packs if "blas" in os.path.basename(f)] or packs
                return True, f"kernel pack {blas[0]} carries {gfx}"
            have = ", ".join(gfx_sorted({g for g, _ in self.kpack}))
            return False, (f"no kernel pack in .kpack/ carries {gfx} (packs for {have}; TheRock "
                           f"native packages: install amdrocm-blas<X.Y>-{gfx})")
        if self.has_rocblas:
            if gfx in self.rocblas:
                return True, f"rocBLAS has TensileLibrary files for {gfx}"
            return False, f"rocBLAS has no TensileLibrary files for {gfx}"
        if self.has_dist_info:
            if gfx in self.dist:
                return True, f"dist_info.json lists {gfx}"
            return False, f"dist_info.json does not list {gfx}"
        if gfx in self.bitcode:
            return True, f"device bitcode for {gfx} (compiler only; no rocBLAS installed)"
        return False, f"no rocBLAS, no dist_info.json and no device bitcode for {gfx}"

    def hipblaslt_for(self, gfx: str) -> bool:
        return gfx in self.hipblaslt

    def targets(self) -> list[str]:
        return list(gfx_sorted([*self.rocblas, *self.hipblaslt, *self.bitcode, *self.dist,
                                *(g for g, _ in self.kpack)]))

    def to_json(self) -> dict:
        return {
            "rocblas": list(self.rocblas), "hipblaslt": list(self.hipblaslt),
            "bitcode": list(self.bitcode), "dist_amdgpu_targets": list(self.dist),
            "runtime_isas": list(self.runtime), "runtime_lib": self.runtime_lib,
            "kpack": sorted({g for g, _ in self.kpack}),
            "rocblas_lib": self.rocblas_lib,
            "rocblas_needed": None if self.rocblas_needed is None else list(self.rocblas_needed),
        }


def _last_of(isas: tuple[str, ...], gfx: str) -> str:
    """The runtime's newest ISA of `gfx`'s major family (gfx1036 -> gfx1035), else its newest."""
    family = [i for i in isas if i[:-2] == gfx[:-2]] or list(isas)
    return gfx_sorted(family)[-1] if family else "nothing"


class RocmInstall(Record):
    __slots__ = ("path", "real_path", "version", "layout", "compiler_dir", "bitcode_dir",
                 "coverage", "hip_clang_path", "bin_dirs", "lib_dirs", "pkgconfig_dirs",
                 "cmake_prefix", "sources", "problems", "nightly_current", "family", "extra")
    _hidden = ("extra",)

    def __init__(self,
                 path: str,  # inner path, as the install was named (may be a link)
                 real_path: str,  # links resolved inside the root
                 version: str | None,
                 layout: str,  # "therock" | "classic" | "debian" | "fedora" | "pip"
                 compiler_dir: str | None, bitcode_dir: str | None,  # inner paths, as all below
                 coverage: Coverage, hip_clang_path: str | None = None,
                 bin_dirs: tuple[str, ...] = (),
                 lib_dirs: tuple[str, ...] = (),
                 pkgconfig_dirs: tuple[str, ...] = (), cmake_prefix: bool = True,
                 # how it was found: "--rocm", "$ROCM_PATH", "/opt/rocm", ...
                 sources: tuple[str, ...] = (),
                 problems: tuple[str, ...] = (), nightly_current: bool = False,
                 family: str | None = None,  # rocforge-install.toml `family`
                 extra: dict = FRESH):
        init(self, path, real_path, version, layout, compiler_dir, bitcode_dir, coverage,
             hip_clang_path, bin_dirs, lib_dirs, pkgconfig_dirs, cmake_prefix, sources, problems,
             nightly_current, family, fresh(extra))

    @property
    def hipcxx(self) -> str | None:
        return self.extra.get("hipcxx")

    def describe(self) -> str:
        return f"{self.path} ({self.layout} {self.version or 'version unknown'})"

    def to_json(self) -> dict:
        return {
            "path": self.path, "real_path": self.real_path, "version": self.version,
            "layout": self.layout, "compiler_dir": self.compiler_dir,
            "hipcxx": self.hipcxx, "hip_clang_path": self.hip_clang_path,
            "bitcode_dir": self.bitcode_dir, "coverage": self.coverage.to_json(),
            "sources": list(self.sources), "problems": list(self.problems),
            "nightly_current": self.nightly_current, "family": self.family,
        }


# -- coverage -----------------------------------------------------------------------------------
def gfx_sorted(names) -> tuple[str, ...]:
    from rocforge_build.discover.targets import gfx_version

    def key(name: str) -> tuple:
        try:
            return (gfx_version(name), name)
        except ValueError:
            return (10**9, name)

    return tuple(sorted(set(names), key=key))


def _tensile_targets(root: Root, dirs: tuple[str, ...]) -> tuple[str, ...]:
    found: set[str] = set()
    for d in dirs:
        watch(root, d)
        for name in root.listdir(d):
            m = _TENSILE_RE.match(name)
            if m:
                found.add(m.group(1))
            elif _ARCH_DIR_RE.match(name) and root.is_dir(sub := inner_join(d, name)):
                watch(root, sub)
                if any(n.startswith("TensileLibrary") for n in root.listdir(sub)):
                    found.add(name)
    return gfx_sorted(found)


def tensile_targets(root: Root, dirs: tuple[str, ...]) -> tuple[str, ...]:
    """Targets with TensileLibrary files in `dirs` (rocBLAS / hipBLASLt library directories)."""
    return _tensile_targets(root, tuple(d for d in dirs if root.is_dir(d)))


def _coverage(root: Root, bases: list[str], layout: Layout, bitcode_dir: str | None) -> Coverage:
    rocblas_dirs = tuple(d for b in bases for d in all_dirs(root, b, layout.rocblas_dirs))
    hipblaslt_dirs = tuple(d for b in bases for d in all_dirs(root, b, layout.hipblaslt_dirs))
    bitcode = ()
    if bitcode_dir is not None:
        watch(root, bitcode_dir)
        bitcode = gfx_sorted(f"gfx{m.group(1)}" for n in root.listdir(bitcode_dir)
                             if (m := _ISA_RE.match(n)))
    dist: list[str] = []
    has_dist = False
    for b in bases:
        text = read(root, inner_join(b, "share/therock/dist_info.json"))
        if text is None:
            continue
        import json  # only for a TheRock tree

        try:
            data = json.loads(text)
        except ValueError:
            continue
        has_dist = True
        value = data.get("dist_amdgpu_targets") if isinstance(data, dict) else None
        items = value if isinstance(value, list) else re.split(r"[;,\s]+", str(value or ""))
        dist.extend(i for i in items if isinstance(i, str) and i.startswith("gfx"))
    runtime = binaries.runtime_isas(
        root, [h for b in bases for pat in layout.runtime_libs for h in glob(root, b, pat)])
    rocblas_lib, rocblas_needed = None, None
    for b in bases:
        for hit in (h for pat in layout.rocblas_libs for h in glob(root, b, pat)):
            info = binaries.read_elf(root.host_str(hit))
            if info is not None:
                rocblas_lib, rocblas_needed = hit, info.needed
                break
        if rocblas_lib:
            break
    kpack: list[tuple[str, str]] = []
    for b in bases:
        for hit in glob(root, b, ".kpack/*.kpack"):
            pack = binaries.read_kpack(root, hit)
            if pack is not None:
                kpack.extend((g, hit) for g in pack.arches)
    return Coverage(
        kpack=tuple(kpack),
        runtime=gfx_sorted(runtime.isas) if runtime else (),
        runtime_lib=runtime.library if runtime else None,
        rocblas_lib=rocblas_lib, rocblas_needed=rocblas_needed,
        rocblas=_tensile_targets(root, rocblas_dirs),
        hipblaslt=_tensile_targets(root, hipblaslt_dirs),
        bitcode=bitcode, dist=gfx_sorted(dist),
        has_rocblas=any(root.listdir(d) for d in rocblas_dirs),
        has_hipblaslt=any(root.listdir(d) for d in hipblaslt_dirs),
        has_dist_info=has_dist,
    )


# -- inspecting one tree ------------------------------------------------------------------------
def _layout_of(root: Root, path: str, allowed: tuple[str, ...]) -> Layout | None:
    table = layouts()
    for name in allowed:
        layout = table[name]
        if not layout.markers:
            return layout
        for marker in layout.markers:
            if glob(root, path, marker):
                return layout
    return None


def _hipcxx(root: Root, compiler_dir: str | None) -> str | None:
    if compiler_dir is None:
        return None
    for name in HIPCXX_NAMES:
        hipcxx = inner_join(compiler_dir, name)
        watch(root, hipcxx)
        if root.exists(hipcxx):
            return hipcxx
    return None


_LLVM_DIR_RE = re.compile(r"llvm-(\d+)(?:/|$)")


def _llvm_of(p: str | None) -> int | None:
    m = _LLVM_DIR_RE.search(p) if p is not None else None
    return int(m.group(1)) if m else None


def _bitcode_and_llvm(root: Root, path: str, layout: Layout,
                      hipcc: binaries.Hipcc | None) -> tuple[str | None, int | None]:
    """The device library directory and the LLVM major that owns the compiler.

    Several LLVMs may be installed (Debian: clang-21 with rocm-device-libs-21, plus clang-22
    without): the compiler is the LLVM that hipcc calls, else the one whose tree holds the
    device libraries (`lib/llvm-N/lib/clang/N/amdgcn/bitcode`), never simply the newest."""
    want = hipcc.llvm_major if hipcc is not None else None
    hits: list[str] = []
    for pattern in layout.bitcode_dirs:
        hits += [h for h in glob(root, path, pattern) if root.is_dir(h) and h not in hits]
        if hits and not any(_llvm_of(h) is not None for h in hits):
            break  # an unversioned directory (bookworm's multiarch one): first pattern wins
    if not hits:
        return None, want
    owned = [h for h in hits if want is not None and _llvm_of(h) == want]
    if owned:
        return owned[-1], want
    unversioned = [h for h in hits if _llvm_of(h) is None]
    if unversioned:
        return unversioned[0], want
    best = max(hits, key=lambda h: _llvm_of(h) or -1)
    return best, want if want is not None else _llvm_of(best)


def _compiler_dir(root: Root, path: str, layout: Layout, owner: int | None) -> str | None:
    if owner is not None:
        versioned = False
        for pattern in layout.compiler_dirs:
            for hit in glob(root, path, pattern):
                versioned = versioned or _llvm_of(hit) is not None
                if root.is_dir(hit) and _llvm_of(hit) == owner:
                    return hit
        if versioned:
            return None  # the owning LLVM is not installed; another LLVM is no substitute
    return first(root, path, layout.compiler_dirs)


class HipClang(Record):
    """Where HIP_CLANG_PATH points (None: nowhere) and the evidence; `problem` says why hipcc
    cannot compile when the program it runs is not installed."""
    __slots__ = ("path", "why", "problem")

    def __init__(self, path: str | None, why: str = "", problem: str | None = None):
        init(self, path, why, problem)


def _hip_clang_path(root: Root, path: str, layout: Layout, hipcc: binaries.Hipcc | None,
                    compiler_dir: str | None) -> HipClang:
    """HIP_CLANG_PATH: the directory where the program hipcc runs actually is."""
    if hipcc is not None:
        same_llvm = compiler_dir is not None and hipcc.llvm_major in (None, _llvm_of(compiler_dir))
        for d in (*hipcc.default_dirs, *([compiler_dir] if same_llvm else [])):
            program = inner_join(d, hipcc.calls)
            watch(root, program)
            if root.exists(program):
                return HipClang(d, f"{hipcc.evidence}; {program} exists")
        return HipClang(None, problem=f"{hipcc.evidence}, but no {hipcc.calls} exists there: "
                        "hipcc cannot compile until that LLVM is installed")
    if layout.hip_clang_from_hipcc:
        hipcc_path = inner_join(path, "bin/hipcc")
        watch(root, hipcc_path)
        if not root.exists(hipcc_path):
            return HipClang(None)  # no hipcc: no compiler variable for it
    if layout.hip_clang_dirs:
        return HipClang(first(root, path, layout.hip_clang_dirs))
    return HipClang(compiler_dir)


def inspect(root: Root, path: str | os.PathLike[str], *, allowed: tuple[str, ...] | None = None,
            sources: tuple[str, ...] = (), extra_bases: tuple[str, ...] = (),
            nightly_current: bool = False) -> RocmInstall | None:
    """What the tree at inner `path` is; None when it is no ROCm tree."""
    path = inner_path(path)
    real = root.resolve_str(path)
    watch(root, path)
    if not root.is_dir(path):
        return None
    if allowed is None:
        allowed = ("debian", "fedora") if real == "/usr" else ("therock", "classic")
    layout = _layout_of(root, path, allowed)
    if layout is None:
        return None
    problems: list[str] = []
    hipcc = binaries.read_hipcc(root, path) if layout.hip_clang_from_hipcc else None
    if hipcc is not None:
        watch(root, hipcc.path)
    bitcode_dir, owner = _bitcode_and_llvm(root, path, layout, hipcc)
    compiler_dir = _compiler_dir(root, path, layout, owner)
    if layout.hip_clang_from_hipcc and hipcc is None and bitcode_dir is None:
        compiler_dir = None  # no hipcc and no device libraries: no HIP compiler here
    if compiler_dir is None and owner is not None and (hipcc is not None or bitcode_dir):
        problems.append(f"no LLVM {owner} compiler (lib/llvm-{owner}/bin), which "
                        + (f"{hipcc.path} calls" if hipcc else f"the device libraries in "
                           f"{bitcode_dir} belong to") + f": install clang-{owner}")
    hipcxx = _hipcxx(root, compiler_dir)
    if compiler_dir is not None and hipcxx is None:
        problems.append(f"{compiler_dir} has no clang++")
    if layout.name in ("therock", "pip"):
        for name in ("amdclang++", "amdclang"):
            link = inner_join(path, "bin", name)
            watch(root, link)
            if root.is_symlink(link) and not root.exists(link):
                problems.append(f"{link} is a broken link (TheRock trees before Mar 2026); "
                                f"using {compiler_dir}")
                break
    hip_clang = _hip_clang_path(root, path, layout, hipcc, compiler_dir)
    if hip_clang.problem is not None:
        problems.append(hip_clang.problem)
    if bitcode_dir is None:
        if compiler_dir is not None or hipcc is not None or not layout.hip_clang_from_hipcc:
            problems.append("no device bitcode directory (oclc_isa_version_*.bc) found")
    elif layout.name == "therock" and not root.exists(inner_join(path, "amdgcn")):
        problems.append("no amdgcn link at the root (trees before Feb 2026): "
                        f"HIP_DEVICE_LIB_PATH must point at {bitcode_dir}")
    bases = [path, *extra_bases]
    family = None
    meta = read(root, inner_join(path, "rocforge-install.toml"))
    if meta:
        data = tomllib_loads(meta)
        if data is None:
            problems.append("rocforge-install.toml is not valid TOML")
        else:
            family = data.get("family")
    return RocmInstall(
        path=path, real_path=real, version=install_version(root, path, layout), layout=layout.name,
        compiler_dir=compiler_dir, bitcode_dir=bitcode_dir,
        coverage=_coverage(root, bases, layout, bitcode_dir),
        hip_clang_path=hip_clang.path,
        bin_dirs=tuple(d for b in bases for d in all_dirs(root, b, layout.bin_dirs)),
        lib_dirs=tuple(d for b in bases for d in all_dirs(root, b, layout.lib_dirs)),
        pkgconfig_dirs=tuple(d for b in bases for d in all_dirs(root, b, layout.pkgconfig_dirs)),
        cmake_prefix=layout.cmake_prefix, sources=sources, problems=tuple(problems),
        nightly_current=nightly_current, family=family,
        extra={"hipcxx": hipcxx, "hip_clang_why": hip_clang.why,
               "llvm_owner": owner, "hipcc": hipcc},
    )


# -- candidates ---------------------------------------------------------------------------------
def _nightly_prefix(root: Root) -> str | None:
    from rocforge_build import config, paths

    touch(paths.config_file_str())  # `nightly.prefix` lives there: a change invalidates env's cache
    prefix = config.nightly_prefix_str()
    if root.is_host:
        return prefix
    try:
        return root.inner_str(prefix)  # a data dir inside the root (tests, containers)
    except ValueError:
        return prefix  # the same path read inside the root


def _site_dirs() -> list[str]:
    dirs = [p for p in dict.fromkeys(sys.path) if p.endswith(("site-packages", "dist-packages"))]
    for d in dirs:
        touch(d)
    return [d for d in dirs if os.path.isdir(d)]


def _pip_installs(root: Root) -> list[RocmInstall]:
    out: list[RocmInstall] = []
    for site in _site_dirs():
        site_inner = root.inner_str(site) if not root.is_host else inner_path(site)
        for core in glob(root, site_inner, "_rocm_sdk_core*"):
            if not root.is_dir(core):
                continue
            libs = tuple(p for p in glob(root, site_inner, "_rocm_sdk_libraries_*") if root.is_dir(p))
            inst = inspect(root, core, allowed=("pip",), sources=("pip rocm-sdk",), extra_bases=libs)
            if inst is not None:
                out.append(inst)
    return out


def _candidates(root: Root, environ: Mapping[str, str]) -> list[tuple[str, str, bool]]:
    cands: list[tuple[str, str, bool]] = []
    rocm_path = environ.get("ROCM_PATH")
    if rocm_path:
        cands.append((inner_path(rocm_path), "$ROCM_PATH", False))
    prefix = _nightly_prefix(root)
    if prefix is not None:
        watch(root, prefix)
    if prefix is not None and root.is_dir(prefix):
        cands.append((inner_join(prefix, "current"), "rocforge nightly (current)", True))
        for name in root.listdir(prefix):
            if name != "current" and not name.startswith("."):
                cands.append((inner_join(prefix, name), "rocforge nightly", False))
    # TheRock native packages (amdrocm-*): the tree is /opt/rocm/core-X.Y, with /opt/rocm/core and
    # /opt/rocm/core-X alternatives links to it, and /opt/rocm/{bin,lib,...} links into it
    # (build_tools/packaging/linux/template/scripts/amdrocm-core-postinst.j2): /opt/rocm itself
    # is then a link farm, not an install of its own.
    native = [h for h in glob(root, "/opt/rocm", "core*") if root.is_dir(h)]
    for hit in native:
        cands.append((hit, "/opt/rocm/core-*", False))
    if not native:
        cands.append(("/opt/rocm", "/opt/rocm", False))
    for hit in glob(root, "/opt", "rocm-*"):
        cands.append((hit, "/opt/rocm-*", False))
    cands.append(("/usr", "distro /usr", False))
    return cands


def _extras_for(root: Root, real: str) -> tuple[str, ...]:
    """/opt/rocm/extras-X beside a native /opt/rocm/core-X.Y: its libraries belong to that core."""
    m = re.fullmatch(r"/opt/rocm/core-(\d+)(?:\.\d+)*", real)
    if not m:
        return ()
    extra = f"/opt/rocm/extras-{m.group(1)}"
    watch(root, extra)
    return (extra,) if root.is_dir(extra) else ()


def find_installs(root: Root, *, rocm: str | None = None,
                  environ: Mapping[str, str] | None = None,
                  include_pip: bool = True) -> list[RocmInstall]:
    """Every ROCm install in `root`, deduplicated by real path, in candidate order.

    With `rocm` only that tree is inspected; NoRocmError when it is no ROCm tree.
    """
    env = os.environ if environ is None else environ
    if rocm and ":" in rocm:  # it would split PATH/LD_LIBRARY_PATH (see envscript.check_lists)
        raise UsageError(f"--rocm {rocm} contains ':', which separates PATH entries; rocforge "
                         "refuses ROCm paths with ':'",
                         "make a link without ':' to the tree and pass that to --rocm")
    if rocm:
        inst = inspect(root, rocm, sources=("--rocm",))
        if inst is None:
            where = f" inside --root {root.base_str}" if not root.is_host else ""
            raise NoRocmError(
                f"--rocm {rocm}{where} is not a ROCm install (no dist_info.json, .info/version, "
                "rocm_version.h, hipcc or llvm found)",
                "point --rocm at the directory holding bin/ and lib/ of a ROCm tree, or run "
                "`rocforge doctor` to see the installs rocforge finds",
            )
        return [inst]
    by_real: dict[str, RocmInstall] = {}
    order: list[str] = []
    for path, source, is_current in _candidates(root, env):
        real = root.resolve_str(path)
        if real in by_real:
            prev = by_real[real]
            by_real[real] = _merge(prev, source, is_current)
            continue
        inst = inspect(root, path, sources=(source,), nightly_current=is_current,
                       extra_bases=_extras_for(root, real))
        if inst is None:
            continue
        by_real[real] = inst
        order.append(real)
    result = [by_real[r] for r in order]
    if include_pip and root.is_host:
        for inst in _pip_installs(root):
            if inst.real_path not in by_real:
                result.append(inst)
    return result


def _merge(prev: RocmInstall, source: str, is_current: bool) -> RocmInstall:
    sources = prev.sources + ((source,) if source not in prev.sources else ())
    return replace(prev, sources=sources, nightly_current=prev.nightly_current or is_current)
