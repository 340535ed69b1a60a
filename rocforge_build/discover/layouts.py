"""Where each kind of ROCm install keeps its parts (`data/layouts.toml`), read into `Layout`
values: the one reader of that table, below both `installs` (which finds installs by it) and
`rocm_version` (which reads an install's version from the sources its layout names).

Stdlib only: `rocforge env` runs this on every shell start-up.
"""

from __future__ import annotations

from functools import cache

from rocforge_build.errors import ConfigError
from rocforge_build.records import Record, init
from rocforge_build.resources import load_toml, package_data

_LAYOUTS = package_data("layouts.toml")
_LAYOUT_KEYS = {
    "markers", "compiler_dirs", "hip_clang_dirs", "bitcode_dirs", "bin_dirs", "lib_dirs",
    "pkgconfig_dirs", "cmake_prefix", "rocblas_dirs", "hipblaslt_dirs", "version_from", "rank",
    "hip_clang_from_hipcc", "runtime_libs", "rocblas_libs",
}


class Layout(Record):
    __slots__ = ("name", "markers", "compiler_dirs", "bitcode_dirs", "bin_dirs", "lib_dirs",
                 "pkgconfig_dirs", "cmake_prefix", "rocblas_dirs", "hipblaslt_dirs",
                 "version_from", "rank", "hip_clang_dirs", "hip_clang_from_hipcc", "runtime_libs",
                 "rocblas_libs")

    def __init__(self, name: str, markers: tuple[str, ...], compiler_dirs: tuple[str, ...],
                 bitcode_dirs: tuple[str, ...], bin_dirs: tuple[str, ...],
                 lib_dirs: tuple[str, ...], pkgconfig_dirs: tuple[str, ...], cmake_prefix: bool,
                 rocblas_dirs: tuple[str, ...], hipblaslt_dirs: tuple[str, ...],
                 version_from: tuple[str, ...], rank: int, hip_clang_dirs: tuple[str, ...] = (),
                 hip_clang_from_hipcc: bool = False, runtime_libs: tuple[str, ...] = (),
                 rocblas_libs: tuple[str, ...] = ()):
        init(self, name, markers, compiler_dirs, bitcode_dirs, bin_dirs, lib_dirs, pkgconfig_dirs,
             cmake_prefix, rocblas_dirs, hipblaslt_dirs, version_from, rank, hip_clang_dirs,
             hip_clang_from_hipcc, runtime_libs, rocblas_libs)


@cache
def layouts() -> dict[str, Layout]:
    raw = load_toml(_LAYOUTS, "layout table")
    table = {}
    for name, entry in raw.items():
        unknown = set(entry) - _LAYOUT_KEYS
        if unknown:
            raise ConfigError(f"layout table: {name}: unknown key(s) {sorted(unknown)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
        table[name] = Layout(name=name, **values)
    return table
