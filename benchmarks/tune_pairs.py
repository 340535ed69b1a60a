"""Pooled analysis of default-vs-exhaustive `rocforge tune` pairs (benchmarks/gpu/tune_vs_exhaustive.sh).

Reads a folder with times.tsv (label, rc, start, end, wall seconds per tune), LABEL.json (each
tune's --json), export.json (`rocforge results export --json`) and runs.json (`rocforge results
list --json`).  For each range it pools every llama-bench run of every variant from all the tunes
and takes the best mean score (the geometric mean of pp and tg t/s at the range's depth, per run,
as rocforge_build/measure/tune.py range_score does); then per default tune: is its pick within
2 % of that pooled best, and how long did it take against the exhaustive tune of its pair.
Stdlib only, so it runs where rocforge ran.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from datetime import datetime
from pathlib import Path

TOLERANCE = 0.02  # issue 22 item 8: the pick within 2 % of the pooled best
TIME_GOAL = 1 / 3  # ... in at most a third of the exhaustive search's time


def variant_key(row: dict) -> tuple:
    """What makes two rows the same variant of the same build."""
    return (row.get("prefix"), row.get("ubatch"), bool(row.get("fa")),
            json.dumps(row.get("env") or {}, sort_keys=True))


def key_label(key: tuple) -> str:
    env = " ".join(f"{k}={v}" for k, v in json.loads(key[3]).items())
    return f"ub={key[1]} fa={int(key[2])}" + (f" {env}" if env else "")


def invocations(rows: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """One run's ok pp/tg rows cut into llama-bench runs: a run's rows come out together, so a
    new one starts where the variant changes or a (test, depth) repeats."""
    out: list[tuple[tuple, list[dict]]] = []
    seen: set = set()
    for r in sorted(rows, key=lambda r: r["id"]):
        k, td = variant_key(r), (r["test"], r["depth"])
        if not out or out[-1][0] != k or td in seen:
            out.append((k, []))
            seen = set()
        out[-1][1].append(r)
        seen.add(td)
    return out


def score(rows: list[dict], depth: int) -> float | None:
    """The range's score of one llama-bench run: geometric mean of its pp and tg t/s at `depth`."""
    at = [r for r in rows if r["depth"] == depth]
    if {r["test"] for r in at} != {"pp", "tg"}:
        return None
    return math.exp(sum(math.log(r["t_s"]) for r in at) / len(at))


def seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").timestamp()


def load(folder: Path) -> dict:
    times = {}
    for line in (folder / "times.tsv").read_text().splitlines():
        lab, rc, _, _, wall = line.split("\t")
        times[lab] = {"rc": int(rc), "wall": float(wall)}
    tunes = {}
    for lab in times:
        try:
            tunes[lab] = json.loads((folder / f"{lab}.json").read_text())
        except (OSError, ValueError):
            tunes[lab] = None
    rows = json.loads((folder / "export.json").read_text())
    runs = {r["id"]: r for r in json.loads((folder / "runs.json").read_text())}
    return {"times": times, "tunes": tunes, "rows": rows, "runs": runs}


def analyse(data: dict) -> dict:
    tunes = {lab: t for lab, t in data["tunes"].items() if t and t.get("preset")}
    run_of = {lab: t["run"] for lab, t in tunes.items()}
    ranges = {}
    for t in tunes.values():
        for name, r in t["preset"]["ranges"].items():
            ranges.setdefault(name, r["depth"])
    by_run: dict[int, list[dict]] = {}
    for r in data["rows"]:
        if (r.get("kind") == "bench" and r.get("status") == "ok" and r.get("test") in ("pp", "tg")
                and r.get("t_s") and r.get("run") in run_of.values()):
            by_run.setdefault(r["run"], []).append(r)
    runs_inv = {run: invocations(rows) for run, rows in by_run.items()}
    pooled = {}
    for name, depth in ranges.items():
        scores: dict[tuple, list[float]] = {}
        for inv in runs_inv.values():
            for k, rows in inv:
                if (s := score(rows, depth)) is not None:
                    scores.setdefault(k, []).append(s)
        table = sorted(((sum(v) / len(v), k, v) for k, v in scores.items()), key=lambda x: -x[0])
        pooled[name] = {"depth": depth, "table": [{"variant": key_label(k), "key": list(k), "mean": m,
                                                   "n": len(v), "min": min(v), "max": max(v)}
                                                  for m, k, v in table]}
    per_run = []
    for lab, t in tunes.items():
        run = data["runs"].get(t["run"], {})
        rows = sorted(by_run.get(t["run"], []), key=lambda r: r["id"])
        first, last = (seconds(rows[0]["created"]), seconds(rows[-1]["created"])) if rows else (0, 0)
        inv = runs_inv.get(t["run"], [])
        entry = {"label": lab, "run": t["run"], "wall": data["times"][lab]["wall"],
                 "exhaustive": bool(t["preset"].get("exhaustive")),
                 "llama_bench_runs": len(inv), "variants": len({k for k, _ in inv}),
                 "before_first_row": first - seconds(run["started"]) if rows and run else None,
                 "benching": last - first if rows else None,
                 "after_last_row": seconds(run["finished"]) - last if rows and run.get("finished") else None,
                 "picks": {}}
        for name, r in t["preset"]["ranges"].items():
            k = (r["prefix"], r["variant"]["ubatch"], bool(r["variant"]["fa"]),
                 json.dumps(r["variant"].get("env") or {}, sort_keys=True))
            table = pooled[name]["table"]
            mine = next((x["mean"] for x in table if tuple(x["key"]) == k), None)
            best = table[0]["mean"]
            entry["picks"][name] = {"variant": key_label(k), "own_score": r["score"],
                                    "pooled": mine, "of_best": mine / best if mine else None,
                                    "within": bool(mine and mine >= (1 - TOLERANCE) * best),
                                    "settled": r.get("settled"), "repetitions": r.get("repetitions")}
        per_run.append(entry)
    pairs = {}
    for e in per_run:
        m = re.match(r"p(\d+)-(default|exhaustive)$", e["label"])
        if m:
            pairs.setdefault(int(m.group(1)), {})[m.group(2)] = e
    for p in pairs.values():
        if "default" in p and "exhaustive" in p:
            p["default"]["time_ratio"] = p["default"]["wall"] / p["exhaustive"]["wall"]
    return {"ranges": ranges, "pooled": pooled, "runs": per_run, "pairs": pairs}


def markdown(res: dict) -> str:
    out = ["## Per run", "",
           "| run | label | wall s | llama-bench runs | variants | before 1st row s | benching s "
           "| after last row s | " + " | ".join(f"{n} pick (pooled % of best, within 2 %)"
                                               for n in res["ranges"]) + " | time / exhaustive |",
           "|" + "---|" * (9 + len(res["ranges"]))]
    for e in res["runs"]:
        picks = [f"{p['variant']} ({100 * (p['of_best'] or 0):.1f} %, {'yes' if p['within'] else 'no'})"
                 for p in e["picks"].values()]
        ratio = f"{e['time_ratio']:.2f}" if "time_ratio" in e else ""
        out.append(f"| {e['run']} | {e['label']} | {e['wall']:.0f} | {e['llama_bench_runs']} | "
                   f"{e['variants']} | {e['before_first_row']} | {e['benching']} | "
                   f"{e['after_last_row']} | " + " | ".join(picks) + f" | {ratio} |")
    for name, p in res["pooled"].items():
        out += ["", f"## Pooled, range {name} (depth {p['depth']})", "",
                "| variant | mean score | n | min | max | % of best |", "|---|---|---|---|---|---|"]
        best = p["table"][0]["mean"]
        for x in p["table"]:
            out.append(f"| {x['variant']} | {x['mean']:.1f} | {x['n']} | {x['min']:.1f} | "
                       f"{x['max']:.1f} | {100 * x['mean'] / best:.1f} |")
    defaults = [e for e in res["runs"] if e["label"].endswith("-default")]
    agree = sum(p["within"] for e in defaults for p in e["picks"].values())
    n = sum(len(e["picks"]) for e in defaults)
    ratios = [e["time_ratio"] for e in defaults if "time_ratio" in e]
    out += ["", "## Goal", "",
            f"- default picks within {100 * TOLERANCE:.0f} % of the pooled best: {agree} of {n}",
            "- default wall time / paired exhaustive: " + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (goal <= {TIME_GOAL:.2f})"]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path, help="also write the analysis as JSON here")
    args = ap.parse_args()
    res = analyse(load(args.folder))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    print(markdown(res), end="")


if __name__ == "__main__":
    main()
