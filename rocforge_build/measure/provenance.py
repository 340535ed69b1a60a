"""Where a measurement was taken: host (kernel, CPU, RAM, GPUs, ROCm) and model (name, sha256,
size, type).  Read once per command and stored with every row."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from pathlib import Path

from rocforge_build import paths, proc
from rocforge_build.discover import host as host_facts
from rocforge_build.errors import RocforgeError, reason
from rocforge_build.measure.gguf import Model
from rocforge_build.rootfs import Root


def _read(path: str) -> str:
    # the machine the programs run on: /proc and /opt/rocm of "/", even under --rootfs
    return host_facts.read(Root("/"), path) or ""


def host(root=None) -> dict:
    """Today's host: kernel, os, CPU, RAM, GPUs, ROCm, and the fingerprint (command line,
    firmware, TuneD profile, IOMMU, GTT and VRAM carve-out) that explains why two runs of the
    same build differ.  Nothing here fails: an unreadable fact is None."""
    # os.uname, not platform.platform() or platform.processor(): on Linux those run `uname -p`,
    # a process on every bench call
    root = root or Root("/")
    u = os.uname()
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), None) or u.machine
    kib = host_facts.parse_meminfo(_read("/proc/meminfo"))
    mem = kib * 1024 if kib is not None else None
    libc = "".join(platform.libc_ver())  # glibc's confstr, no file scan when it answers
    system = f"{u.sysname}-{u.release}-{u.machine}" + (f"-with-{libc}" if libc else "")
    # the kernel of the root the GPUs and the fingerprint are read from (the same as uname on
    # this machine); a root without /proc (a container's file system) runs on this kernel
    kernel = host_facts.read_kernel(root)
    info = {"kernel": kernel.release if kernel else u.release, "os": system, "cpu": cpu,
            "cpus": os.cpu_count(), "ram_bytes": mem, "gpus": [], "rocm": None}
    found = []
    try:
        from rocforge_build.discover import gpus as gpu_mod

        found = gpu_mod.discover(root).gpus
        info["gpus"] = [{"name": g.marketing_name, "gfx": g.gfx, "kind": g.kind,
                         "driver": _read("/sys/module/amdgpu/version").strip() or None} for g in found]
    except Exception as exc:  # detection is provenance, never a reason to stop measuring
        info["gpus_error"] = reason(exc)
    rocm = _read("/opt/rocm/.info/version").strip()
    info["rocm"] = rocm or None
    try:
        info.update(host_facts.fingerprint(root, found))
    except Exception as exc:  # the readers return None; this is for what they did not foresee
        info.update(dict.fromkeys(FINGERPRINT))
        info["fingerprint_error"] = reason(exc)
    return info


# the fields host_facts.fingerprint adds to every row's host
FINGERPRINT = ("cmdline", "firmware", "firmware_packages", "tuned_profile", "iommu", "gtt_bytes",
               "vram_bytes")


# ggml-vulkan's line per device, printed when a program starts its backend:
# `ggml_vulkan: 0 = AMD Radeon Graphics (RADV GFX1151) (radv) | uma: 1 | fp16: 1 | ...`
# (the device name may hold parentheses; the driver's is the last group before the first `|`)
_VK_DEVICE = re.compile(r"ggml_vulkan: (\d{1,3}) = ([^|\n]*) \(([^()|\n]*)\) \|")
_VK_LINE = 2000  # a device line is short: a longer one (or one past the first MiB) is not read
# where the Vulkan loader finds its drivers (ICD manifests) unless VK_DRIVER_FILES/VK_ICD_FILENAMES say
_ICD_DIRS = ("/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/usr/share/vulkan/icd.d")


def vulkan(prefix: Path) -> dict:
    """The Vulkan devices a Vulkan build's own program sees here, each with its driver, and the
    ICD manifests the loader reads: what "GPUs" and "ROCm" cannot say on a Vulkan host (Mesa's
    RADV, AMDVLK or lavapipe run the same build's bytes differently).  The program is started
    afresh, never read from a cache: a driver updated since is the point.  Nothing here fails."""
    exe = next((prefix / "bin" / n for n in ("llama-bench", "llama-cli", "llama-perplexity", "llama-server")
                if (prefix / "bin" / n).is_file()), None)
    out: dict = {"devices": [], "icds": _icds()}
    if exe is None:
        out["error"] = "the build has no llama.cpp program to ask"
        return out
    try:
        run = proc.run([str(exe), "--help"], check=False, timeout=60, stderr=subprocess.PIPE)
    except (RocforgeError, OSError) as exc:
        out["error"] = f"{exe.name} did not start: {reason(exc)}"
        return out
    out["devices"] = vulkan_devices(run.stdout + run.stderr)
    return out


def vulkan_devices(text: str) -> list[dict]:
    """The devices in ggml-vulkan's lines of a llama.cpp program's output, each with the driver
    llama.cpp names (`radv`, `amdvlk`, `llvmpipe`), in the order it numbers them (at most 16)."""
    found = []
    for line in text[:1 << 20].splitlines():
        m = _VK_DEVICE.match(line) if len(line) <= _VK_LINE else None
        if m:
            found.append({"index": int(m.group(1)), "name": m.group(2).strip(), "driver": m.group(3).strip()})
            if len(found) == 16:
                break
    return found


def _icds() -> list[dict]:
    """Each ICD manifest's file and the driver library it names (VK_DRIVER_FILES or
    VK_ICD_FILENAMES when set, as the loader reads them first)."""
    chosen = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    if chosen:
        files = [Path(f) for f in chosen.split(os.pathsep) if f]
    else:
        files = [f for d in _ICD_DIRS if os.path.isdir(d) for f in sorted(Path(d).glob("*.json"))]
    icds = []
    for f in files[:32]:
        try:
            icd = json.loads(f.read_text(encoding="utf-8")[:65536]).get("ICD", {})
            library, api = icd.get("library_path"), icd.get("api_version")
        except (OSError, ValueError, AttributeError, RecursionError):
            library = api = None
        icds.append({"file": str(f), "library": library if isinstance(library, str) else None,
                     "api_version": api if isinstance(api, str) else None})
    return icds


def model(m: Model) -> dict:
    """The model a row measured; with its weights per token, the basis of the row's ceiling
    (measure/roofline.py)."""
    cost = m.per_token()
    return {"path": str(m.path), "name": m.name, "arch": m.arch, "type": m.file_type,
            "size": m.size, "sha256": model_sha256(m.path), "n_ctx_train": m.n_ctx_train,
            "bytes_per_token": cost.bytes, "active_parameters": cost.parameters,
            "per_token_note": cost.note}


DIGESTS = "model-digests.json"  # in the data dir: {"dev:ino:size:mtime_ns": {"sha256": ..., "path": ...}}
_KEEP = 64  # digests kept (the most recently computed); a model not among them is hashed again


def _file_key(st: os.stat_result) -> str:
    # device and inode as well as size and mtime: a model replaced by another file of the same size
    # (a rename over it, a copy with `cp -p`) is a new inode, and is hashed again
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def model_sha256(path: Path) -> str:
    """sha256 of a model file, computed once per (device, inode, size, mtime_ns): a 20-40 GB model
    takes many seconds to hash, which no bench or verify call should pay again."""
    key = _file_key(path.stat())
    cache = paths.data_dir() / DIGESTS
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    hit = known.get(key)
    if isinstance(hit, dict) and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    from rocforge_build.download import sha256_file  # only here: download pulls in urllib

    digest = sha256_file(path)
    if _file_key(path.stat()) != key:  # changed while it was read: the digest is of no one file
        return digest
    known.pop(key, None)
    known[key] = {"sha256": digest, "path": str(path.resolve())}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(cache, json.dumps(dict(list(known.items())[-_KEEP:]), indent=1))
    except OSError:
        pass  # only the cache is lost
    return digest
