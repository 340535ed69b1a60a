"""Tests that need a program beyond the README's developer set-up (python, bash, zsh, fish): on
a machine without it they skip with a "lacks TOOL" reason.  tests/conftest.py lists those skips
under NOT RUN and fails them under CI=true, where .ci/apt-packages.txt installs everything."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

WHERE = "Debian packages in .ci/apt-packages.txt"


def lacking(*tools: str) -> list[str]:
    """The tools (program names) not on PATH."""
    return [t for t in tools if shutil.which(t) is None]


def reason(missing: list[str]) -> str:
    return f"lacks {', '.join(missing)} ({WHERE})"


def needs(*tools: str):
    """A mark: the test runs only where every tool is on PATH, else it skips saying which lack."""
    missing = lacking(*tools)
    return pytest.mark.skipif(bool(missing), reason=reason(missing))


def lacking_pkg_config(*modules: str) -> list[str]:
    """pkg-config itself if it is not on PATH, else the modules (.pc files) it does not find."""
    if shutil.which("pkg-config") is None:
        return ["pkg-config"]
    return [f"pkg-config module {m}" for m in modules
            if subprocess.run(["pkg-config", "--exists", m], timeout=30).returncode != 0]


def needs_pkg_config(*modules: str):
    """A mark: the test runs only where pkg-config finds every module (liblzma: liblzma-dev)."""
    missing = lacking_pkg_config(*modules)
    return pytest.mark.skipif(bool(missing), reason=reason(missing))


def require(*tools: str) -> None:
    """The same, inside a test or fixture (for a parameter or a fixture that needs the tool)."""
    missing = lacking(*tools)
    if missing:
        pytest.skip(reason(missing))


LAVAPIPE_ICD = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"  # Debian's mesa-vulkan-drivers


def needs_lavapipe():
    """A mark: the test runs llama.cpp on lavapipe, Debian's software Vulkan device (its ICD file
    from mesa-vulkan-drivers), and glslc builds the Vulkan backend; without them it skips as a
    missing package."""
    missing = lacking("glslc") + lacking_lavapipe_icd()
    return pytest.mark.skipif(bool(missing), reason=reason(missing))


def lacking_lavapipe_icd() -> list[str]:
    return [] if os.path.isfile(LAVAPIPE_ICD) else [f"lavapipe ({LAVAPIPE_ICD}: mesa-vulkan-drivers)"]


def needs_lavapipe_icd():
    """A mark: the test reads lavapipe's real ICD manifest (mesa-vulkan-drivers), nothing built."""
    missing = lacking_lavapipe_icd()
    return pytest.mark.skipif(bool(missing), reason=reason(missing))


LAVAPIPE = "ROCFORGE_TEST_LAVAPIPE"


def lavapipe_budget():
    """A mark for a test that runs llama.cpp on lavapipe (Debian's software Vulkan device) for tens of
    minutes: over CI's budget on 2 cores, so it runs where asked (`ROCFORGE_TEST_LAVAPIPE=1`) and
    otherwise shows as an optional skip, never as a missing tool."""
    return pytest.mark.skipif(os.environ.get(LAVAPIPE) != "1",
                              reason=f"[optional] llama.cpp on lavapipe for tens of minutes, over CI's budget "
                                     f"on 2 cores: {LAVAPIPE}=1 runs it")
