"""How close a bench row came to what its device can do at most.

Generation (tg) reads every weight a token needs once per token, so its ceiling is the device's
memory bandwidth over the model bytes read per token; prompt processing (pp) is matrix products,
about 2 FLOP per active parameter per token, so its ceiling is the device's FP16 GEMM peak.

The bandwidth is the copy bandwidth `rocforge kernels bench` measured on the device (its memcpy,
saved per target in `<data dir>/kernels-bandwidth.json`) where it ran, else the target table's
specified peak (`data/targets.toml`), and the row says which.  A CPU build gets no figure: rocforge
knows no specified bandwidth for host memory and does not invent one.

A row's `ceiling` (every key always present; a figure rocforge does not have is None):
  device                 the gfx target the figures are for (None: no GPU figure applies)
  model_bytes_per_token  weight bytes one generated token reads (gguf.Model.bytes_per_token)
  active_parameters      matrix parameters one token multiplies through (gguf.Model)
  bandwidth_gbs          the device's memory bandwidth, GB/s (10^9 bytes/s)
  bandwidth_source       "measured: ..." or "specified peak of GFX (data/targets.toml)"
  tg_pct_of_bandwidth    tg rows: t/s x model_bytes_per_token / bandwidth, in %
  gemm_peak_tflops       the target's specified FP16 peak, TFLOPS
  gemm_source            where that peak comes from
  pp_pct_of_gemm_peak    pp rows: t/s x 2 x active_parameters / GEMM peak, in %
  why_none               why a figure is missing (None when none is)
Both percentages count weights only: the KV cache a deep row also reads is left out, so at depth
> 0 they understate how busy the device was.
"""

from __future__ import annotations

import json
import math
import time

from rocforge_build import paths

MEASURED_FILE = "kernels-bandwidth.json"  # in the data dir: {target: {"memcpy_gbs", "measured", ...}}
TARGET_TABLE = "data/targets.toml"


def measured_path():
    return paths.data_dir() / MEASURED_FILE


def _positive(value) -> float | None:
    """A usable figure from a file a user could have edited: a finite number above zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _read_measured() -> dict:
    try:
        data = json.loads(measured_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_copy(target: str, gbs: float, *, device: str | None, iters: int):
    """Keep the memcpy bandwidth `rocforge kernels bench` measured for `target`, so bench rows
    can use it as their ceiling: a measured figure is what this device reaches, a specified peak
    only what the vendor prints.  Written whole (never half a file); returns the file, or None
    when the data dir is unwritable (only the figure is lost)."""
    known = _read_measured()
    known[target] = {"memcpy_gbs": round(gbs, 1), "measured": time.strftime("%Y-%m-%d"),
                     "device": device, "iters": iters}
    try:
        measured_path().parent.mkdir(parents=True, exist_ok=True)
        paths.write_whole(measured_path(), json.dumps(known, indent=1, sort_keys=True) + "\n")
    except OSError:
        return None
    return measured_path()


def measured_copy(target: str) -> tuple[float, str] | None:
    """(GB/s, source) of the memcpy `rocforge kernels bench` measured for `target`, if any."""
    entry = _read_measured().get(target)
    if not isinstance(entry, dict) or _positive(entry.get("memcpy_gbs")) is None:
        return None
    when = entry.get("measured")
    on = f" on {when}" if isinstance(when, str) and when else ""
    return float(entry["memcpy_gbs"]), f"measured: rocforge kernels bench memcpy{on}"


def device_of(row: dict) -> tuple[str | None, str | None]:
    """(gfx target, None) of the GPU a row ran on, or (None, why not).

    The build's target when the host's detected GPUs include it (or detection found exactly one
    GPU, e.g. a gfx1151 running a gfx1100 build through HSA_OVERRIDE_GFX_VERSION: that one ran it).
    A target the host does not have would put another device's figure on the row, so it gets none."""
    backend = row.get("backend") or (row.get("build") or {}).get("backend")
    if backend in (None, "cpu", "unknown"):
        return None, ("a CPU build: rocforge has no specified bandwidth or GEMM peak for host "
                      "memory and CPUs, and does not invent one")
    target = (row.get("build") or {}).get("target")
    host = row.get("host") or {}
    found = sorted({g.get("gfx") for g in host.get("gpus") or [] if isinstance(g, dict) and g.get("gfx")})
    if target in found:
        return target, None
    if len(found) == 1:
        return found[0], None
    if not found:
        why = host.get("gpus_error") or "no AMD GPU was detected on the host"
        return None, (f"{why}: the {backend} build (for {target}) ran on a device rocforge has no "
                      "figure for")
    return None, (f"the build is for {target} but the host has {', '.join(found)}: which one ran it "
                  "is not known")


def device_figures(target: str) -> dict:
    """Bandwidth and GEMM peak of `target`, measured bandwidth first, with their sources."""
    from rocforge_build.discover import targets

    spec = targets.get_target(target) if targets.known(target) else None
    out = {"bandwidth_gbs": None, "bandwidth_source": None, "gemm_peak_tflops": None, "gemm_source": None}
    measured = measured_copy(target)
    if measured:
        out["bandwidth_gbs"], out["bandwidth_source"] = measured
    elif spec is not None and spec.peak_bandwidth_gbs:
        out["bandwidth_gbs"] = float(spec.peak_bandwidth_gbs)
        out["bandwidth_source"] = f"specified peak of {target} ({TARGET_TABLE})"
    if spec is not None and spec.peak_fp16_tflops:
        out["gemm_peak_tflops"] = float(spec.peak_fp16_tflops)
        out["gemm_source"] = f"specified FP16 peak of {target} ({TARGET_TABLE})"
    return out


def ceiling(row: dict) -> dict | None:
    """The `ceiling` of a bench row (see the module docstring); None when the row carries no model
    figures (rows stored before rocforge counted them)."""
    model = row.get("model") or {}
    if "bytes_per_token" not in model:
        return None
    out = {"device": None, "model_bytes_per_token": model.get("bytes_per_token"),
           "active_parameters": model.get("active_parameters"), "bandwidth_gbs": None,
           "bandwidth_source": None, "tg_pct_of_bandwidth": None, "gemm_peak_tflops": None,
           "gemm_source": None, "pp_pct_of_gemm_peak": None, "why_none": None}
    device, why = device_of(row)
    if device is None:
        out["why_none"] = why
        return out
    out["device"] = device
    out.update(device_figures(device))
    missing = []
    t_s = _positive(row.get("t_s")) if row.get("status") == "ok" else None
    if row.get("test") == "tg":
        nbytes = out["model_bytes_per_token"]
        if out["bandwidth_gbs"] is None:
            missing.append(f"rocforge has no bandwidth for {device} (neither measured nor specified)")
        elif not nbytes:
            missing.append(model.get("per_token_note") or "the model's bytes per token are not known")
        elif t_s is not None:
            out["tg_pct_of_bandwidth"] = round(100 * t_s * nbytes / (out["bandwidth_gbs"] * 1e9), 1)
    elif row.get("test") == "pp":
        params = out["active_parameters"]
        if out["gemm_peak_tflops"] is None:
            missing.append(f"rocforge has no FP16 GEMM peak for {device}")
        elif not params:
            missing.append(model.get("per_token_note") or "the model's parameter count is not known")
        elif t_s is not None:
            out["pp_pct_of_gemm_peak"] = round(100 * t_s * 2 * params / (out["gemm_peak_tflops"] * 1e12), 1)
    out["why_none"] = "; ".join(missing) or None
    return out


def note(row: dict) -> str:
    """The human form: `74 % of 256 GB/s specified`, or '' when the row has no percentage."""
    c = row.get("ceiling") or {}
    if c.get("tg_pct_of_bandwidth") is not None:
        kind = "measured" if str(c.get("bandwidth_source", "")).startswith("measured") else "specified"
        return f"{c['tg_pct_of_bandwidth']:g} % of {c['bandwidth_gbs']:g} GB/s {kind}"
    if c.get("pp_pct_of_gemm_peak") is not None:
        return f"{c['pp_pct_of_gemm_peak']:g} % of {c['gemm_peak_tflops']:g} FP16 TFLOPS specified"
    return ""
