"""Shared test set-up: slow tests behind --run-slow, and no test touches the user's own
config, cache, data or ROCm environment."""

from __future__ import annotations

import pytest

# a real HTTP server on 127.0.0.1 (`http_server` fixture): see tests/http_fixture.py
pytest_plugins = ["http_fixture", "llama_builds"]  # llama_builds: the shared llama.cpp CPU build


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run slow real builds")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow real build: run with --run-slow (CI does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


_LEAKY_VARS = (
    "ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "HIP_CLANG_PATH", "HIP_DEVICE_LIB_PATH",
    "HSA_OVERRIDE_GFX_VERSION", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCBLAS_USE_HIPBLASLT", "ROCFORGE_ROOT",
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("rocforge-home")
    monkeypatch.setenv("ROCFORGE_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("ROCFORGE_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("ROCFORGE_DATA_DIR", str(home / "data"))
    for var in _LEAKY_VARS:
        monkeypatch.delenv(var, raising=False)
    for key in list(__import__("os").environ):
        if key.startswith("HSA_OVERRIDE_GFX_VERSION_"):
            monkeypatch.delenv(key, raising=False)
    yield home
