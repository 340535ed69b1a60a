"""The toolchain a backend needs: HIP (from the resolver), Vulkan (glslc + headers + loader),
or the host compilers alone.  Detection never raises; `require()` turns what is missing into a
ToolchainError that says how to get it, or a NoRocmError (exit 4, as `rocforge env`) when no ROCm
install was found at all (a ROCm that is there but lacks a tool stays a toolchain error, exit 5).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocforge_build import ownership
from rocforge_build.errors import NoRocmError, ToolchainError
from rocforge_build.proc import ToolTimedOut, run, which

VULKAN_PACKAGES = "libvulkan-dev glslc spirv-headers"
# glslc extensions llama.cpp's Vulkan backend probes at configure time (ggml-vulkan CMakeLists:
# coopmat, coopmat2, integer dot, bf16); without them the matching shaders are not built.
GLSLC_FEATURES = {
    "GL_KHR_cooperative_matrix": "coopmat (KHR cooperative matrix: matrix cores)",
    "GL_NV_cooperative_matrix2": "coopmat2 (NV cooperative matrix 2)",
    "GL_EXT_integer_dot_product": "integer dot product (quantized matmul)",
    "GL_EXT_bfloat16": "bf16",
}
_PROBE = "#version 450\n#extension {ext} : require\nvoid main() {{}}\n"


@dataclass
class Toolchain:
    kind: str  # hip | vulkan | host
    env: dict[str, str] = field(default_factory=dict)  # for configure and build
    defines: dict[str, str] = field(default_factory=dict)  # -D values the toolchain implies
    include_dirs: tuple[Path, ...] = ()
    path: str | None = None  # PATH to look programs up in
    rocm_version: str | None = None
    info: dict[str, str] = field(default_factory=dict)  # for the manifest
    missing: str | None = None
    hint: str | None = None
    glslc: str | None = None
    # whether the ROCm's rocBLAS links libhipblaslt (ELF NEEDED; None = not read), and why
    rocblas_hipblaslt: tuple[bool | None, str] = (None, "no HIP toolchain: rocBLAS not read")
    glslc_probed: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)
    no_rocm: bool = False  # what is missing is a ROCm install, not a tool of one

    def probe_glslc(self, ext: str) -> bool:
        """Whether glslc compiles a shader that requires `ext`.  The first call probes `ext` and
        every extension in GLSLC_FEATURES in one glslc process (a plan asks for all of them)."""
        if not self.glslc:
            return False
        if ext not in self.glslc_probed:
            wanted = [e for e in {**GLSLC_FEATURES, ext: ""} if e not in self.glslc_probed]
            self.glslc_probed.update(probe_glslc_extensions(self.glslc, wanted))
        return self.glslc_probed[ext]

    def to_json(self) -> dict:
        d = {"kind": self.kind, "env": self.env, "defines": self.defines, **self.info}
        if self.rocm_version:
            d["rocm_version"] = self.rocm_version
        if self.missing:
            d["missing"] = self.missing
            d["hint"] = self.hint
        return d

    def require(self) -> None:
        if self.missing:
            raise (NoRocmError if self.no_rocm else ToolchainError)(self.missing, self.hint)


def probe_glslc_extensions(glslc: str, extensions: list[str]) -> dict[str, bool]:
    """Which extensions glslc compiles a shader for, all in one glslc run: with `-c` glslc
    compiles each input on its own and writes `<input>.spv` for every one that compiles, whatever
    the others do — one process start instead of one per extension, glslc's start being most of
    what probing costs a Vulkan plan."""
    with ownership.scratch_dir(None, "rocforge-glslc-") as tmp:
        names = [f"probe{i}.comp" for i in range(len(extensions))]
        for name, ext in zip(names, extensions, strict=True):
            (Path(tmp) / name).write_text(_PROBE.format(ext=ext))
        try:
            run([glslc, "-fshader-stage=compute", "--target-env=vulkan1.3", "-c", *names],
                cwd=tmp, check=False, timeout=60)
        except (ToolchainError, OSError):  # a timeout too (proc.ToolTimedOut)
            return dict.fromkeys(extensions, False)
        return {ext: (Path(tmp) / f"{name}.spv").is_file()
                for name, ext in zip(names, extensions, strict=True)}


def _version_of(program: str | None) -> str | None:
    if not program:
        return None
    try:
        out = run([program, "--version"], check=False).stdout
    except ToolTimedOut:
        raise  # a hung compiler would hang the build too: one line naming it, now
    except (ToolchainError, OSError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def host_identity(environ: Mapping[str, str]) -> dict[str, str]:
    """cmake and ninja as path + size + mtime: cheap enough for every no-op check."""
    out = {}
    for tool in ("cmake", "ninja"):
        exe = which(tool, environ.get("PATH"))
        if exe:
            st = Path(exe).resolve().stat()
            out[tool] = f"{exe}:{st.st_size}:{st.st_mtime_ns}"
    return out


def host_info(environ: Mapping[str, str]) -> dict[str, str]:
    path = environ.get("PATH")
    info = {}
    for tool in ("cmake", "ninja"):
        exe = which(tool, path)
        info[tool] = f"{exe} ({_version_of(exe)})" if exe else "missing"
    return info


def detect(kind: str, root, target: str, environ: Mapping[str, str] | None = None, *,
           rocm: str | None = None) -> Toolchain:
    environ = dict(os.environ if environ is None else environ)
    if kind == "hip":
        return _hip(root, target, environ, rocm)
    if kind == "vulkan":
        return _vulkan(root, environ)
    return Toolchain("host", path=environ.get("PATH"), include_dirs=(root.host("/usr/include"),))


def _hip(root, target: str, environ: dict[str, str], rocm: str | None = None) -> Toolchain:
    how = (f"install a TheRock nightly for it: `rocforge nightly install --target {target}`, "
           "then run the build again (or point ROCM_PATH at an existing ROCm)")
    try:
        from rocforge_build.discover import resolver
    except ImportError:
        return Toolchain("hip", missing="no ROCm resolver in this rocforge build", hint=how)
    res = resolver.resolve(root, target=target, rocm=rocm, environ=environ)
    if res.rocm is None:
        return Toolchain("hip", missing=f"no ROCm toolchain found for {target}", hint=how, no_rocm=True)
    if res.rocm.bitcode_dir is not None and target not in res.rocm.coverage.bitcode:
        return Toolchain("hip", missing=(
            f"ROCm at {res.rocm.path} ({res.rocm.layout} {res.rocm.version or 'version unknown'}) "
            f"cannot compile for {target}: its device libraries ({res.rocm.bitcode_dir}) have no "
            f"oclc_isa_version_{target[3:]}.bc"), hint=how)
    env = {k: str(v) for k, v in res.toolchain_env().items() if v is not None}
    hipcxx = env.get("HIPCXX")
    if not hipcxx or not Path(hipcxx).exists():
        return Toolchain("hip", missing=f"ROCm at {res.rocm.path} has no HIP compiler ({hipcxx})",
                         hint=how)
    rocm_host = Path(env.get("ROCM_PATH", ""))
    includes = tuple(p for p in (rocm_host / "include",) if p.is_dir())
    bindir = str(Path(hipcxx).parent)
    info = {"rocm_path": str(res.rocm.path), "rocm_layout": res.rocm.layout,
            "hip_compiler": f"{hipcxx} ({_version_of(hipcxx)})"}
    return Toolchain("hip", env=env, include_dirs=includes, rocm_version=res.rocm.version,
                     path=bindir + os.pathsep + environ.get("PATH", ""), info=info,
                     rocblas_hipblaslt=res.rocm.coverage.rocblas_uses_hipblaslt())


def _vulkan(root, environ: dict[str, str]) -> Toolchain:
    sdk = environ.get("VULKAN_SDK")
    path = environ.get("PATH", "")
    include_dirs: list[Path] = []
    lib_candidates: list[Path] = []
    if sdk:
        path = str(Path(sdk) / "bin") + os.pathsep + path
        include_dirs.append(Path(sdk) / "include")
        lib_candidates += [Path(sdk) / "lib" / "x86_64-linux-gnu", Path(sdk) / "lib"]
    include_dirs.append(root.host("/usr/include"))
    lib_candidates += [root.host("/usr/lib/x86_64-linux-gnu"), root.host("/usr/lib64"),
                       root.host("/usr/lib")]
    glslc = which("glslc", path)
    header_dir = next((d for d in include_dirs if (d / "vulkan" / "vulkan.h").is_file()), None)
    library = next((d / n for d in lib_candidates for n in ("libvulkan.so", "libvulkan.so.1")
                    if (d / n).exists()), None)
    missing = [what for what, ok in (("glslc", glslc), ("Vulkan headers (vulkan/vulkan.h)",
               header_dir), ("the Vulkan loader (libvulkan.so)", library)) if not ok]
    tc = Toolchain("vulkan", path=path, include_dirs=tuple(include_dirs), glslc=glslc)
    if missing:
        tc.missing = "Vulkan backend needs " + ", ".join(missing)
        tc.hint = (f"Debian/Ubuntu: apt-get install {VULKAN_PACKAGES}; "
                   "or set VULKAN_SDK to an SDK root holding bin/glslc, include/ and lib/")
        return tc
    version = None
    core = header_dir / "vulkan" / "vulkan_core.h"
    if core.is_file():
        for line in core.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("#define VK_HEADER_VERSION "):
                version = line.split()[-1]
                break
    tc.defines = {"Vulkan_INCLUDE_DIR": str(header_dir), "Vulkan_LIBRARY": str(library),
                  "Vulkan_GLSLC_EXECUTABLE": glslc}
    tc.info = {"glslc": f"{glslc} ({_version_of(glslc)})",
               "vulkan_headers": f"{header_dir} (VK_HEADER_VERSION {version or 'unknown'})"}
    return tc
