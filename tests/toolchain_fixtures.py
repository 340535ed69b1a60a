"""Toolchains the build tests plan against: a TheRock root with the headers the llama.cpp recipe's
conditions read, and a Vulkan SDK root whose glslc rejects the extensions Debian 12's does."""

from __future__ import annotations

import stat
from pathlib import Path

from rocforge_build.rootfs import Root


def fake_vulkan_sdk(base: Path, *, layer_settings: bool) -> Path:
    """A Vulkan SDK root: headers (with or without VK_EXT_layer_settings), a loader stub and a
    glslc that, like Debian 12's, rejects the coopmat / integer-dot / bf16 extensions."""
    inc = base / "include" / "vulkan"
    inc.mkdir(parents=True)
    (inc / "vulkan.h").write_text('#include "vulkan_core.h"\n')
    core = "#define VK_HEADER_VERSION 239\n"
    if layer_settings:
        core = "#define VK_HEADER_VERSION 296\ntypedef struct VkLayerSettingEXT { int x; } VkLayerSettingEXT;\n"
    (inc / "vulkan_core.h").write_text(core)
    (base / "lib").mkdir()
    (base / "lib" / "libvulkan.so").write_text("")
    (base / "bin").mkdir()
    glslc = base / "bin" / "glslc"
    # glslc -c compiles each input on its own: <input>.spv for each that compiles, exit 1 if any failed
    glslc.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "shaderc 2023.2-1"; exit 0; }\n'  # Debian 12's
                     'rc=0\nfor f; do case "$f" in *.comp)\n'
                     '  if grep -qE "cooperative_matrix|integer_dot|bfloat16" "$f"; then\n'
                     '    echo "$f:2: error: extension not supported" >&2; rc=1\n'
                     '  else : > "$f.spv"; fi;; esac; done\nexit $rc\n')
    glslc.chmod(glslc.stat().st_mode | stat.S_IEXEC)
    return base


def therock_root(tmp_path, version="7.9.0rc20250812", rocwmma_gfx1151=True) -> Root:
    """A TheRock tree (the foundation's fixture) plus the headers the recipe's checks read."""
    from fixtures_roots import make_therock_tree

    root = tmp_path / "therock-root"
    tree_dir = make_therock_tree(root, version, ("gfx1151",))
    inc = tree_dir / "include"
    (inc / "hip").mkdir(parents=True, exist_ok=True)
    (inc / "hip" / "hip_runtime.h").write_text("// hip runtime\n")
    (inc / "rocwmma" / "internal").mkdir(parents=True, exist_ok=True)
    (inc / "rocwmma" / "rocwmma.hpp").write_text("// rocwmma\n")
    arch = "#define ROCWMMA_ARCH_GFX1151 __gfx1151__\n" if rocwmma_gfx1151 else "#define ROCWMMA_ARCH_GFX1100\n"
    (inc / "rocwmma" / "internal" / "config.hpp").write_text(arch)
    return Root(root)
