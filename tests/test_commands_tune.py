"""tune's GPU-target rule: only a backend whose toolchain compiles for a GPU (hip) needs one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rocforge_build.commands import tune as tune_cmd
from rocforge_build.errors import UsageError
from rocforge_build.rootfs import Root


def args(tmp_path, backends, target=None):
    # an empty directory as the root filesystem: no /sys, no /dev/kfd, so no GPU is detected
    return SimpleNamespace(recipe="llama-cpp", backends=backends, target=target, rootfs=Root(tmp_path))


@pytest.mark.parametrize("backends", ["cpu", "vulkan", "cpu,vulkan"])
def test_cpu_and_vulkan_need_no_gpu_target(tmp_path, backends):
    assert tune_cmd._target(args(tmp_path, backends)) == ""


@pytest.mark.parametrize("backends", ["hip", "cpu,hip", None])
def test_a_hip_backend_still_asks_for_one(tmp_path, backends):
    """None: every backend of the recipe, hip among them."""
    with pytest.raises(UsageError, match="no GPU target was given and none was detected"):
        tune_cmd._target(args(tmp_path, backends))


def test_a_given_target_is_kept(tmp_path):
    assert tune_cmd._target(args(tmp_path, "cpu", "gfx1151")) == "gfx1151"
