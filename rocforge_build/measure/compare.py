"""Compare two sets of bench results (two runs, or a build's latest run against another's):
the same test at the same depth and variant, flagged when B is slower than A by more than a
threshold (default 5 %), or when B failed or lost its gate where A did not."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rocforge_build.errors import UsageError

DEFAULT_THRESHOLD = 0.05


@dataclass(frozen=True)
class Line:
    key: tuple
    a: float | None
    b: float | None
    change: float | None  # b / a - 1
    verdict: str  # "ok" | "regression" | "faster" | "failed" | "wrong" | "only in A" | "only in B"
    a_pct: float | None = None  # % of the device's ceiling (measure/roofline.py), where known
    b_pct: float | None = None

    def to_json(self) -> dict:
        test, n, depth, ubatch, fa, env = self.key[:6]
        return {"test": test, "n": n, "depth": depth, "ubatch": ubatch, "fa": fa, "env": json.loads(env),
                "a_t_s": self.a, "b_t_s": self.b,
                "change": None if self.change is None else round(self.change, 4), "verdict": self.verdict,
                "a_pct_of_ceiling": self.a_pct, "b_pct_of_ceiling": self.b_pct}


def key(row: dict) -> tuple:
    n = row.get("n_prompt") if row.get("test") == "pp" else row.get("n_gen")
    return (row.get("test"), n, row.get("depth"), row.get("ubatch"), row.get("fa"),
            json.dumps(row.get("env") or {}, sort_keys=True), row.get("model_sha256"))


def compare(rows_a: list[dict], rows_b: list[dict], threshold: float = DEFAULT_THRESHOLD) -> list[Line]:
    a = {key(r): r for r in rows_a if r.get("test") != "gate"}
    b = {key(r): r for r in rows_b if r.get("test") != "gate"}
    gate_b = {r.get("gate") for r in rows_b}
    out = []
    for k in sorted(set(a) | set(b), key=lambda k: tuple(str(x) for x in k)):
        ra, rb = a.get(k), b.get(k)
        ta = ra.get("t_s") if ra and ra.get("status") == "ok" else None
        tb = rb.get("t_s") if rb and rb.get("status") == "ok" else None
        change = tb / ta - 1 if ta and tb else None
        if rb is None:
            verdict = "only in A" if "failed" not in gate_b else "wrong"
        elif ra is None:
            verdict = "only in B"
        elif tb is None:
            verdict = "failed"
        elif ta is None:
            verdict = "ok"
        elif change < -threshold:
            verdict = "regression"
        elif change > threshold:
            verdict = "faster"
        else:
            verdict = "ok"
        out.append(Line(k, ta, tb, change, verdict, _pct(ra) if ta else None, _pct(rb) if tb else None))
    return out


def _pct(row: dict | None) -> float | None:
    """The row's share of its ceiling: bandwidth for tg, GEMM peak for pp."""
    c = (row or {}).get("ceiling") or {}
    return c.get("tg_pct_of_bandwidth") if row.get("test") == "tg" else c.get("pp_pct_of_gemm_peak")


def flagged(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line.verdict in ("regression", "failed", "wrong")]


def resolve(store, spec: str) -> tuple[str, list[dict]]:
    """`N`/`run:N` = a run; a prefix = that build's latest bench run; `PREFIX@N` = its rows of run N."""
    prefix, _, run = spec.rpartition("@") if "@" in spec else ("", "", "")
    if spec.startswith("run:") or (spec.isascii() and spec.isdigit()):
        run_id = int(spec.removeprefix("run:"))
        rows = [r.data for r in store.rows(run_id=run_id, kind="bench")]
        if not rows:
            raise UsageError(f"run {run_id} has no bench results", "see `rocforge results list`")
        return f"run {run_id}", rows
    from pathlib import Path

    if prefix and run.isascii() and run.isdigit():
        p = str(Path(prefix).expanduser().resolve())
        rows = [r.data for r in store.rows(run_id=int(run), prefix=p, kind="bench")]
    else:
        p = str(Path(spec).expanduser().resolve())
        last = store.last_run_of(p)
        rows = [r.data for r in store.rows(run_id=last, prefix=p, kind="bench")] if last else []
    if not rows:
        raise UsageError(f"no bench results for {spec!r}", "give a run number or a measured build's prefix "
                         "(rocforge results list)")
    return spec, rows


def table(lines: list[Line], label_a: str, label_b: str, threshold: float) -> str:
    out = [f"A = {label_a}", f"B = {label_b}",
           f"{'test':<8} {'depth':>6} {'ub':>5} {'fa':>3} {'env':<24} {'A t/s':>10} {'B t/s':>10} {'change':>8} "
           f"{'A %ceil':>7} {'B %ceil':>7}  verdict"]
    for line in lines:
        d = line.to_json()
        env = ",".join(f"{k}={v}" for k, v in d["env"].items()) or "-"
        change = "" if line.change is None else f"{line.change * 100:+.1f}%"
        out.append(f"{d['test']}{d['n'] or '':<6} {d['depth']!s:>6} {d['ubatch']!s:>5} {_fa(d['fa']):>3} {env:<24} "
                   f"{_num(line.a):>10} {_num(line.b):>10} {change:>8} {_share(line.a_pct):>7} {_share(line.b_pct):>7}  "
                   f"{line.verdict}")
    bad = flagged(lines)
    if any(x.a_pct is not None or x.b_pct is not None for x in lines):
        out.append("%ceil: generation as % of the memory bandwidth, prompt processing as % of the FP16 "
                   "GEMM peak (rocforge results export --json names each figure's source)")
    out.append(f"{len(bad)} of {len(lines)} flagged (regression = B slower than A by more than "
               f"{threshold * 100:g} %)" if bad else f"no regression beyond {threshold * 100:g} %")
    return "\n".join(out)


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _share(x) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _fa(x) -> str:
    return "-" if x is None else ("on" if x else "off")


# -- host and stack differences ------------------------------------------------------------------
_STACK = ("backend", "stamp")  # per-build fields of the rows, beside the host's rocm


def _flat(value, key: str = "") -> dict[str, object]:
    """`{"firmware": {"mes": "0x83"}}` -> `{"firmware.mes": "0x83"}`; lists by index
    (`gpus.0.gfx`)."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {key: value}
    out: dict[str, object] = {}
    for k, v in items:
        out.update(_flat(v, f"{key}.{k}" if key else str(k)))
    return out


def stack_of(rows: list[dict]) -> dict[str, object]:
    """The host (the first row's: one run reads it once) and the builds' backend and stamp."""
    host = next((r.get("host") for r in rows if isinstance(r.get("host"), dict)), {}) or {}
    out = {k: v for k, v in _flat(host).items() if k != "cmdline"}
    out["cmdline"] = host.get("cmdline")
    for field in _STACK:
        values = sorted({str(r[field]) for r in rows if r.get(field) is not None})
        out[field] = ", ".join(values) if values else None
    return out


def host_differences(rows_a: list[dict], rows_b: list[dict]) -> list[tuple[str, object, object]]:
    """(key, A's value, B's value) for every host and stack field that differs, in key order;
    the kernel command line as words added and removed."""
    a, b = stack_of(rows_a), stack_of(rows_b)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def difference_line(key: str, a, b) -> str:
    """`kernel 6.18.4 -> 6.19.0`, `cmdline: + amd_iommu=off - quiet`."""
    if key == "cmdline" and isinstance(a, str) and isinstance(b, str):
        from rocforge_build.discover.host import parse_cmdline

        wa, wb = parse_cmdline(a), parse_cmdline(b)
        changes = [f"+ {w}" for w in wb if w not in wa] + [f"- {w}" for w in wa if w not in wb]
        return "cmdline: " + (" ".join(changes) or "same words, another order")
    return f"{key} {_show(a)} -> {_show(b)}"


def _show(value) -> str:
    return "(none)" if value is None else str(value)


def differences_text(diffs: list[tuple[str, object, object]]) -> str:
    if not diffs:
        return "host and stack differences: none"
    return "\n".join(["host and stack differences:"] + [f"  {difference_line(*d)}" for d in diffs])
