"""TheRock nightlies whose compiler really compiles: the generated TheRock trees
(therock_tarballs, fixtures_roots) with `lib/llvm/bin/clang-20` replaced by a wrapper around the
host's clang 15 (Debian's, which hipcc brings: .ci/apt-packages.txt), so a build made "against a
nightly" runs that nightly's compiler.  A miscompiling nightly's wrapper drops `-DFIXTURE_LOUD` from every compile: the fixture program
then prints its greeting in lower case, a toolchain regression the output checker
(upgrade_history.output_checker) sees.  And the fixture recipe made to build its `hip` backend's C
with the ROCm's clang (no HIP library: these trees carry no HIP headers or runtime)."""

from __future__ import annotations

from pathlib import Path

from buildfixtures import recipe_copy
from therock_tarballs import make_tree, pack, tarball_name

CLANG = "lib/llvm/bin/clang-20"  # fixtures_roots._llvm_bin: clang and clang++ link to it
GOOD_CC = '#!/bin/sh\nexec clang-15 "$@"\n'
# every argument but the loud-greeting define, in order (POSIX sh: `for` reads the original list)
WRONG_CC = ('#!/bin/sh\nfor a; do shift; [ "$a" = -DFIXTURE_LOUD ] || set -- "$@" "$a"; done\n'
            'exec clang-15 "$@"\n')


def compiling_tarball(work: Path, version: str, *, wrong: bool = False) -> Path:
    """A gfx1151 TheRock dist tarball of `version` whose clang compiles C (wrongly if asked)."""
    tree = make_tree(work / f"tree-{version}", version, ["gfx1151"])
    clang = tree / CLANG
    clang.write_text(WRONG_CC if wrong else GOOD_CC)
    clang.chmod(0o755)
    return pack(tree, work / "out" / tarball_name("gfx1151", version))


def rocm_recipe(dest: Path, source_uri: str | None = None) -> Path:
    """The fixture recipe whose `hip` backend compiles the C with the ROCm's clang."""
    replace = {'value = true\nwhen = { backend = "hip", cmake_option = "FIXTURE_HIP" }':
               'value = false\nwhen = { backend = "hip", cmake_option = "FIXTURE_HIP" }'}
    if source_uri:
        replace["file:///nonexistent/fixture.git"] = source_uri
    recipe = recipe_copy(dest, **replace)
    recipe.write_text(recipe.read_text() + (
        '\n[[env]]\nname = "CC"\nvalue = "{hip_clang_dir}/clang"\nwhen = { backend = "hip" }\n'
        'reason = "the ROCm\'s compiler builds the C: a toolchain regression shows in the '
        'program"\n'))
    return recipe
