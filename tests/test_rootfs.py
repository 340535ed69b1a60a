import os
from pathlib import PurePosixPath

from rocforge_build.rootfs import Root


def test_absolute_links_stay_inside_the_root(tmp_path):
    (tmp_path / "opt/rocm-6.4.1/bin").mkdir(parents=True)
    os.symlink("/opt/rocm-6.4.1", tmp_path / "opt/rocm")
    root = Root(tmp_path)
    assert root.resolve("/opt/rocm/bin") == PurePosixPath("/opt/rocm-6.4.1/bin")
    assert root.host("/opt/rocm/bin") == tmp_path / "opt/rocm-6.4.1/bin"
    assert root.is_symlink("/opt/rocm")


def test_dotdot_cannot_escape(tmp_path):
    root = Root(tmp_path)
    assert root.resolve("/../../etc/passwd") == PurePosixPath("/etc/passwd")
    assert root.host("/../../etc") == tmp_path / "etc"


def test_link_loop_does_not_hang(tmp_path):
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    root = Root(tmp_path)
    assert not root.exists("/a/x")


def test_inner_inverse(tmp_path):
    root = Root(tmp_path)
    assert root.inner(tmp_path / "usr/lib") == PurePosixPath("/usr/lib")
