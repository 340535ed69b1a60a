"""rocforge's own kernels: build them for one target, run them, check them against NumPy.

The sources (`rocforge_build/kernels/`, package data) are one HIP translation unit: the kernels
(bandwidth probe, Q4_0 GEMV, FP16 GEMM with a WMMA path on gfx11/gfx12) and a small host harness
(`rocforge-kernels`).  The harness reads raw input files, times a kernel with device events and
writes the result; this module writes the inputs with NumPy, checks every result against a NumPy
reference and turns the times into GB/s and TFLOPS, as a share of the target's peak (target
table) and of the copy bandwidth measured in the same run (the runtime's memcpy).

The platforms (AMD through the resolved ROCm's clang, NVIDIA through nvcc and the project's
portability header) and the benchmark list are data: `data/kernels.toml`.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from rocforge_build import ownership, paths, proc, replace
from rocforge_build.discover import targets
from rocforge_build.download import sha256_file
from rocforge_build.errors import (
    BuildError,
    NoRocmError,
    RocforgeError,
    ToolchainError,
    UsageError,
)
from rocforge_build.resources import load_toml, package_data
from rocforge_build.rootfs import Root

SOURCE_DIR = Path(__file__).resolve().parent  # the .hip/.hpp sources beside this module
_TABLE = package_data("kernels.toml")
MANIFEST = "rocforge-kernels.json"


@cache
def table() -> dict:
    return load_toml(_TABLE, "kernel table")


def platform_of(target: str) -> str:
    """`gfx1151` -> "amd", `sm_90` -> "cuda" (patterns in kernels.toml)."""
    for name, spec in table()["platform"].items():
        if re.match(spec["pattern"], target):
            return name
    raise UsageError(
        f"{target!r} is neither an AMD target (gfx...) nor an NVIDIA one (sm_..)",
        "see `rocforge targets` for the AMD targets",
    )


# -- toolchains -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toolchain:
    platform: str
    compiler: Path  # host path
    version: str
    origin: str  # where it came from, for people
    rocm: Path | None = None
    device_libs: Path | None = None
    processors: tuple[str, ...] = ()

    def tool(self, name: str) -> str | None:
        """An LLVM/CUDA tool beside the compiler (also `name-15` for Debian's clang++-15)."""
        m = re.search(r"-(\d+)$", self.compiler.name)
        names = [name] + ([f"{name}-{m.group(1)}"] if m else [])
        for d in (self.compiler.parent, self.compiler.resolve().parent):
            for n in names:
                if (d / n).is_file() and os.access(d / n, os.X_OK):
                    return str(d / n)
        for n in names:
            found = proc.which(n)
            if found:
                return found
        return None

    def to_json(self) -> dict:
        return {
            "platform": self.platform, "compiler": str(self.compiler), "version": self.version,
            "origin": self.origin, "rocm": str(self.rocm) if self.rocm else None,
            "device_libs": str(self.device_libs) if self.device_libs else None,
        }


def find_toolchain(root: Root, target: str, *, rocm: str | None = None,
                   environ: Mapping[str, str] | None = None) -> Toolchain:
    platform = platform_of(target)
    if platform == "cuda":
        return _cuda_toolchain(environ)
    compiler, rocm_path, device_libs, origin = _amd_compiler(root, target, rocm, environ)
    return Toolchain(
        platform="amd", compiler=compiler, version=_compiler_version(compiler), origin=origin,
        rocm=rocm_path, device_libs=device_libs,
        processors=amd_processors(compiler),
    )


def _amd_compiler(root: Root, target: str, rocm: str | None,
                  environ: Mapping[str, str] | None) -> tuple[Path, Path, Path, str]:
    """The resolved ROCm's HIP compiler, ROCm path and device libraries (host paths)."""
    from rocforge_build.discover import resolver

    res = resolver.resolve(root, target=target, rocm=rocm, environ=environ)
    if res.rocm is None:
        raise NoRocmError(
            "no ROCm installation was found to compile the kernels with",
            "install one (`rocforge nightly install`) or name it with --rocm PATH",
        )
    env = res.toolchain_env()
    hipcxx = env.get("HIPCXX")
    if not hipcxx:
        raise ToolchainError(f"the ROCm at {res.rocm.path} has no HIP compiler (clang++)",
                             "name a complete ROCm with --rocm PATH")
    if not env.get("HIP_DEVICE_LIB_PATH"):
        raise ToolchainError(f"the ROCm at {res.rocm.path} has no device libraries "
                             "(amdgcn/bitcode)", "name a complete ROCm with --rocm PATH")
    rocm_path = env.get("ROCM_PATH") or env.get("HIP_PATH") or str(root.host(res.rocm.path))
    origin = f"ROCm {res.rocm.version or '?'} ({res.rocm.layout}) at {res.rocm.path}"
    return (_cxx_driver(Path(hipcxx)), Path(rocm_path), Path(env["HIP_DEVICE_LIB_PATH"]), origin)


def _cxx_driver(compiler: Path) -> Path:
    """clang -> its clang++ sibling: the harness is C++ and links the C++ runtime."""
    m = re.fullmatch(r"(amd)?clang(-\d+)?", compiler.name)
    if m:
        sibling = compiler.with_name(f"{m.group(1) or ''}clang++{m.group(2) or ''}")
        if sibling.is_file():
            return sibling
    return compiler


def _compiler_version(compiler: Path) -> str:
    out = proc.run([compiler, "--version"], check=False).stdout or ""
    first = out.strip().splitlines()[0] if out.strip() else "unknown"
    for line in out.splitlines():  # nvcc: "Cuda compilation tools, release 13.0, V13.0.88"
        if "release" in line and "Cuda" in line:
            return line.strip()
    return first


def amd_processors(compiler: Path) -> tuple[str, ...]:
    """The gfx processors this clang can generate code for (asked, not assumed)."""
    out = proc.run(
        [compiler, "--target=amdgcn-amd-amdhsa", "-nogpulib", "--print-supported-cpus",
         "-x", "c", os.devnull, "-c", "-o", os.devnull], check=False,
    ).stdout or ""
    return tuple(sorted(set(re.findall(r"^\s*(gfx[0-9a-f]+)\b", out, re.M))))


def _cuda_toolchain(environ: Mapping[str, str] | None) -> Toolchain:
    environ = os.environ if environ is None else environ
    nvcc = None
    for home in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin/nvcc").is_file():
            nvcc = Path(home) / "bin/nvcc"
            break
    if nvcc is None:
        found = proc.which("nvcc", environ.get("PATH"))
        if not found:
            raise ToolchainError("nvcc was not found (needed for an sm_.. target)",
                                 "put CUDA's bin directory on PATH or set CUDA_HOME")
        nvcc = Path(found)
    codes = proc.run([nvcc, "--list-gpu-code"], check=False).stdout or ""
    return Toolchain(platform="cuda", compiler=nvcc, version=_compiler_version(nvcc),
                     origin=f"nvcc at {nvcc}", processors=tuple(re.findall(r"sm_\d+a?", codes)))


def check_target(tc: Toolchain, target: str) -> None:
    """Refuse, with the reason, a target this toolchain cannot build the kernels for."""
    if tc.platform == "amd":
        targets.get_target(target)  # a known gfx name (UsageError with suggestions otherwise)
    if target not in tc.processors:
        same_family = [p for p in tc.processors if p[:-2] == target[:-2]] or list(tc.processors[-6:])
        raise ToolchainError(
            f"{tc.version} ({tc.compiler}; {tc.origin}) cannot compile for {target}: the "
            f"compiler does not know that processor (it knows e.g. {', '.join(same_family)})",
            "use a ROCm that supports it, e.g. a TheRock nightly for the target "
            "(`rocforge nightly install`), and pass --rocm PATH" if tc.platform == "amd"
            else "use a CUDA toolkit that supports it",
        )
    if tc.platform == "amd":
        isa = tc.device_libs / f"oclc_isa_version_{target[3:]}.bc" if tc.device_libs else None
        if isa is None or not isa.is_file():
            raise ToolchainError(
                f"the device libraries at {tc.device_libs} have no oclc_isa_version_{target[3:]}.bc: "
                f"that ROCm ({tc.origin}) cannot link device code for {target}",
                "use a ROCm whose device libraries know the target, and pass --rocm PATH",
            )


# -- build ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildResult:
    target: str
    platform: str
    out: Path
    binary: Path
    code_object: Path | None
    bundles: tuple[str, ...]
    code_object_target: str | None
    wave_sizes: dict[str, int]
    toolchain: dict
    commands: tuple[str, ...]
    outputs: dict[str, str] = field(default_factory=dict)  # name -> sha256

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(out=str(self.out), binary=str(self.binary),
                    code_object=str(self.code_object) if self.code_object else None)
        data["bundles"] = list(self.bundles)
        data["commands"] = list(self.commands)
        return data


def default_out(target: str) -> Path:
    return paths.data_dir() / "kernels" / target


def build(root: Root, target: str | None = None, *, rocm: str | None = None,
          out: str | os.PathLike[str] | None = None,
          environ: Mapping[str, str] | None = None) -> BuildResult:
    """Compile the kernels for `target` into `out` (replaced as a whole, never half-written)."""
    target = _pick_target(root, target, rocm, environ)
    out_dir = Path(out) if out else default_out(target)
    replace.check_replaceable(out_dir, MANIFEST, "--out")  # only a kernels build is replaced
    tc = find_toolchain(root, target, rocm=rocm, environ=environ)
    check_target(tc, target)
    spec = table()
    platform = spec["platform"][tc.platform]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # made here, removed on the way out unless the swap took it (ownership.scratch_dir)
    with ownership.scratch_dir(out_dir.parent, f".{out_dir.name}.") as work:
        binary = work / spec["binary"]
        values = {
            "compiler": str(tc.compiler), "target": target, "rocm": str(tc.rocm or ""),
            "device_libs": str(tc.device_libs or ""), "include": str(SOURCE_DIR),
            "source": str(SOURCE_DIR / spec["main_source"]), "object": str(work / "harness.o"),
            "binary": str(binary), "libdir": str((tc.rocm or Path("/")) / "lib"),
        }
        commands = []
        for step in ("compile", "link"):
            if step not in platform:
                continue
            argv = [arg.format(**values) for arg in platform[step]]
            commands.append(proc.quote(argv))
            result = proc.run(argv, check=False, group=True, timeout=None)  # a compile: no deadline
            if result.returncode != 0:
                log = work.parent / f"{out_dir.name}-build.log"
                log.write_text(proc.quote(argv) + "\n" + (result.stdout or ""), encoding="utf-8")
                tail = "\n".join((result.stdout or "").strip().splitlines()[-12:])
                raise BuildError(f"{step} of the kernels for {target} failed (log: {log})\n{tail}")
        (work / "harness.o").unlink(missing_ok=True)
        if tc.platform == "amd":
            code_object, bundles, co_target, waves = _amd_code_object(tc, target, binary, work)
        else:
            code_object, bundles, co_target, waves = None, _cuda_elfs(tc, binary), target, {}
        result = BuildResult(
            target=target, platform=tc.platform, out=out_dir, binary=out_dir / binary.name,
            code_object=out_dir / code_object.name if code_object else None,
            bundles=bundles, code_object_target=co_target, wave_sizes=waves,
            toolchain=tc.to_json(), commands=tuple(commands),
            outputs={p.name: sha256_file(p) for p in sorted(work.iterdir()) if p.is_file()},
        )
        (work / MANIFEST).write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
        work.chmod(0o755)  # mkdtemp's 0700 would hide the build from other users
        replace.swap(work, out_dir, MANIFEST)
        return result


def extra_install_hint(extra: str) -> str:
    """How to install one of rocforge's extras, in a form that works where this rocforge runs:
    from a source checkout (pyproject.toml beside the package) the checkout itself, editable —
    `pip install 'rocforge[...]'` would look for rocforge on the package index instead."""
    import shlex

    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "rocforge_build").is_dir():
        return f"pip install -e {shlex.quote(f'{checkout}[{extra}]')}"
    return f"pip install 'rocforge[{extra}]'"


def _pick_target(root: Root, target: str | None, rocm: str | None,
                 environ: Mapping[str, str] | None) -> str:
    if target:
        return target.strip().lower()
    from rocforge_build.discover import resolver

    res = resolver.resolve(root, rocm=rocm, environ=environ)
    if res.target:
        return res.target
    from rocforge_build.discover import targets

    raise UsageError("no GPU target was given and none was detected", targets.choices_hint())


def _amd_code_object(tc: Toolchain, target: str, binary: Path,
                     work: Path) -> tuple[Path, tuple[str, ...], str, dict[str, int]]:
    """Pull the device code object out of the executable and ask it which target it is."""
    objcopy, bundler, readelf = (tc.tool(n) for n in
                                 ("llvm-objcopy", "clang-offload-bundler", "llvm-readelf"))
    missing = [n for n, t in (("llvm-objcopy", objcopy), ("clang-offload-bundler", bundler),
                              ("llvm-readelf", readelf)) if t is None]
    if missing:
        raise ToolchainError(f"{', '.join(missing)} not found beside {tc.compiler} or on PATH")
    fatbin = work / "harness.hip_fatbin"
    proc.run([objcopy, f"--dump-section=.hip_fatbin={fatbin}", binary])
    listed = proc.run([bundler, "--list", "--type=o", f"--input={fatbin}"]).stdout or ""
    bundles = tuple(line.strip() for line in listed.splitlines() if line.strip())
    device = [b for b in bundles if "amdgcn" in b]
    if len(device) != 1 or not re.search(rf"--{re.escape(target)}(:|$)", device[0]):
        raise BuildError(f"the kernels for {target} hold device code for {device or 'nothing'}")
    code_object = work / f"rocforge-kernels-{target}.co"
    proc.run([bundler, "--unbundle", "--type=o", f"--input={fatbin}", f"--targets={device[0]}",
              f"--output={code_object}"])
    fatbin.unlink()
    co_target, waves = describe_code_object(readelf, code_object)
    if co_target is None or not re.search(rf"--{re.escape(target)}(:|$)", co_target):
        raise BuildError(f"the code object for {target} names target {co_target!r}")
    return code_object, bundles, co_target, waves


def describe_code_object(readelf: str, code_object: Path) -> tuple[str | None, dict[str, int]]:
    """(`amdhsa.target`, {kernel: wavefront size}) from the code object's metadata note."""
    notes = proc.run([readelf, "--notes", code_object]).stdout or ""
    m = re.search(r"amdhsa\.target:\s*'?([^\s']+)", notes)
    waves: dict[str, int] = {}
    name = None
    for line in notes.splitlines():
        nm = re.match(r"\s*\.name:\s*'?([^\s']+)", line)
        if nm:
            name = nm.group(1)
        ws = re.match(r"\s*\.wavefront_size:\s*(\d+)", line)
        if ws and name:
            waves[name] = int(ws.group(1))
    return (m.group(1) if m else None), waves


def _cuda_elfs(tc: Toolchain, binary: Path) -> tuple[str, ...]:
    cuobjdump = tc.tool("cuobjdump")
    if cuobjdump is None:
        return ()
    listed = proc.run([cuobjdump, "--list-elf", binary], check=False).stdout or ""
    return tuple(sorted(set(re.findall(r"sm_\d+a?", listed))))


def load_build(target: str | None, out: str | os.PathLike[str] | None) -> dict:
    """The manifest of a finished build (`--out DIR`, or the default place for `target`)."""
    if out is None and target is None:
        raise UsageError("say which build to run", "pass --target GFX (or --out DIR)")
    out_dir = Path(out) if out else default_out(target.strip().lower())
    manifest = out_dir / MANIFEST
    if not manifest.is_file():
        raise UsageError(
            f"no kernel build at {out_dir}",
            f"build it first: rocforge kernels build --target {target or 'GFX'}"
            + (f" --out {out}" if out else ""),
        )
    data = json.loads(manifest.read_text(encoding="utf-8"))
    data["out"] = str(out_dir)
    data["binary"] = str(out_dir / Path(data["binary"]).name)
    return data


# -- bench ------------------------------------------------------------------------------------


@dataclass
class KernelResult:
    kernel: str
    what: str
    metric: str
    shape: dict
    passed: bool
    error: float  # worst |gpu - reference| / tolerance (<= 1 passes)
    ms_median: float
    ms_best: float
    gbs: float | None = None
    tflops: float | None = None
    pct_peak: float | None = None  # of the target table's peak (bandwidth or fp16)
    pct_copy: float | None = None  # of the memcpy bandwidth measured in the same run


@dataclass
class BenchReport:
    target: str
    device: dict
    peak_bandwidth_gbs: float | None
    peak_fp16_tflops: float | None
    iters: int
    results: list[KernelResult]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_json(self) -> dict:
        return {
            "target": self.target, "device": self.device,
            "peak_bandwidth_gbs": self.peak_bandwidth_gbs,
            "peak_fp16_tflops": self.peak_fp16_tflops, "iters": self.iters,
            "passed": self.passed, "results": [asdict(r) for r in self.results],
        }


def harness(binary: str | os.PathLike[str], *args: str) -> dict:
    """Run the harness once; its last stdout line is a JSON object."""
    result = proc.run([binary, *args], check=False, timeout=None)  # the measurement itself
    lines = [ln for ln in (result.stdout or "").splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        data = {}
    if result.returncode != 0 or not data.get("ok"):
        reason = data.get("error") or (result.stdout or "").strip()[-500:] or "no output"
        raise RocforgeError(
            f"rocforge-kernels {' '.join(args[:2])} failed: {reason}",
            "check that the GPU is visible (`rocforge doctor`) and the build is for this GPU",
        )
    return data


def bench(target: str | None = None, *, out: str | os.PathLike[str] | None = None,
          iters: int = 20, quick: bool = False, only: list[str] | None = None,
          workdir: str | os.PathLike[str] | None = None) -> BenchReport:
    try:
        import numpy as np
    except ImportError as exc:
        raise ToolchainError("`rocforge kernels bench` checks results with NumPy, which is not "
                             "installed", f"{extra_install_hint('kernels')} (or pip install numpy)") from exc
    from rocforge_build.kernels import reference as ref

    build_info = load_build(target, out)
    target = build_info["target"]
    binary = build_info["binary"]
    device = harness(binary, "info")
    if device.get("arch") != target:
        raise UsageError(
            f"the kernels at {build_info['out']} were built for {target}, but the GPU the runtime "
            f"shows is {device.get('arch')} ({device.get('device')})",
            f"build for it: rocforge kernels build --target {device.get('arch')}",
        )
    peak_bw = peak_fp16 = None
    if build_info["platform"] == "amd" and targets.known(target):
        t = targets.get_target(target)
        peak_bw, peak_fp16 = t.peak_bandwidth_gbs, t.peak_fp16_tflops
    entries = [dict(e) for e in table()["bench"]]
    if quick:
        q = table()["quick"]
        for e in entries:
            if "n" in e and e["metric"] == "bandwidth":
                e["n"] = q["n"]
            if e["kernel"] == "q4_0_gemv":
                e.update(m=q["m"], k=q["k"])
            if e["kernel"] == "gemm_f16":
                e.update(m=q["gemm"], n=q["gemm"], k=q["gemm"])
    if only:
        unknown = set(only) - {e["kernel"] for e in entries}
        if unknown:
            raise UsageError(f"unknown kernel(s) {sorted(unknown)}",
                             f"choose from {', '.join(e['kernel'] for e in entries)}")
        entries = [e for e in entries if e["kernel"] in only or e["kernel"] == "memcpy"]
    rng = np.random.default_rng(20261120)
    results: list[KernelResult] = []
    copy_gbs = None
    with ownership.scratch_dir(workdir, "rocforge-kernels-") as work:
        for entry in entries:
            case = ref.make_case(entry, rng)
            case.write_inputs(work)
            shape_args = [a for k in ("n", "m", "k") if k in case.shape
                          for a in (f"--{k}", str(case.shape[k]))]
            extra = ["--scalar", repr(case.scalar)] if case.scalar is not None else []
            run = harness(binary, "run", entry["kernel"], "--dir", str(work),
                          "--iters", str(iters), *shape_args, *extra)
            output = np.fromfile(work / "out.bin", dtype=case.out_dtype)
            error = case.check(output)
            ms = [float(x) for x in run["ms"]]
            med, best = statistics.median(ms), min(ms)
            r = KernelResult(kernel=entry["kernel"], what=entry["what"], metric=entry["metric"],
                             shape=case.shape, passed=error <= 1.0, error=error,
                             ms_median=med, ms_best=best)
            if entry["metric"] == "bandwidth":
                r.gbs = case.bytes / (med * 1e-3) / 1e9
                if peak_bw:
                    r.pct_peak = 100.0 * r.gbs / peak_bw
                if entry["kernel"] == "memcpy":
                    copy_gbs = r.gbs
                if copy_gbs:
                    r.pct_copy = 100.0 * r.gbs / copy_gbs
            else:
                r.tflops = case.flops / (med * 1e-3) / 1e12
                if peak_fp16:
                    r.pct_peak = 100.0 * r.tflops / peak_fp16
            results.append(r)
            for p in work.iterdir():
                p.unlink()
    return BenchReport(target=target, device=device, peak_bandwidth_gbs=peak_bw,
                       peak_fp16_tflops=peak_fp16, iters=iters, results=results)
