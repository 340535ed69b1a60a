"""Where a measurement was taken: host (kernel, CPU, RAM, GPUs, ROCm) and model (name, sha256,
size, type).  Read once per command and stored with every row."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from rocforge_build import paths
from rocforge_build.discover import host as host_facts
from rocforge_build.download import sha256_file
from rocforge_build.measure.gguf import Model
from rocforge_build.rootfs import Root


def _read(path: str) -> str:
    # the machine the programs run on: /proc and /opt/rocm of "/", even under --rootfs
    return host_facts.read(Root("/"), path) or ""


def host(root=None) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    kib = host_facts.parse_meminfo(_read("/proc/meminfo"))
    mem = kib * 1024 if kib is not None else None
    info = {"kernel": platform.release(), "os": platform.platform(terse=True), "cpu": cpu,
            "cpus": os.cpu_count(), "ram_bytes": mem, "gpus": [], "rocm": None}
    try:
        from rocforge_build.discover import gpus as gpu_mod

        found = gpu_mod.discover(root or Root("/")).gpus
        info["gpus"] = [{"name": g.marketing_name, "gfx": g.gfx, "kind": g.kind,
                         "driver": _read("/sys/module/amdgpu/version").strip() or None} for g in found]
    except Exception as exc:  # detection is provenance, never a reason to stop measuring
        info["gpus_error"] = f"{type(exc).__name__}: {exc}"
    rocm = _read("/opt/rocm/.info/version").strip()
    info["rocm"] = rocm or None
    return info


def model(m: Model) -> dict:
    return {"path": str(m.path), "name": m.name, "arch": m.arch, "type": m.file_type,
            "size": m.size, "sha256": model_sha256(m.path), "n_ctx_train": m.n_ctx_train}


def model_sha256(path: Path) -> str:
    """sha256 of a model file, cached by (path, size, mtime): models are large and re-read often."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache = paths.cache_dir() / "model-sha256.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = sha256_file(path)
    known[key] = digest
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(cache, json.dumps(known))  # a per-process temporary file
    except OSError:
        pass  # only the cache is lost
    return digest
