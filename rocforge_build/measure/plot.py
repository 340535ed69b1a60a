"""Depth curves as one self-contained HTML file with inline SVG (no plotting library): prompt
processing and generation t/s against KV depth, one line per build and variant."""

from __future__ import annotations

import html
import json
from collections import defaultdict

from rocforge_build.measure.roofline import note

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
W, H, ML, MR, MT, MB = 560, 340, 70, 20, 30, 50
# the page's second line: how `results plot -o` knows a file it may overwrite (an HTML comment)
MARKER = "<!-- made by rocforge results plot; rocforge overwrites only files with this line -->"


def made_by_rocforge(head: bytes) -> bool:
    """Whether a file's first bytes are a page this module wrote (the marker on line 1 or 2)."""
    lines = head.decode("utf-8", errors="replace").splitlines()[:2]
    return MARKER in lines


def series(rows: list[dict]) -> dict[str, dict[str, list[tuple[int, float, str]]]]:
    """{test: {line label: [(depth, t/s, share of the ceiling)]}} from ok bench rows; the share is
    measure/roofline.py's note (`74 % of 256 GB/s specified`), '' where the row has none."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("status") != "ok" or r.get("t_s") is None:
            continue
        label = _label(r)
        n = r["n_prompt"] if r["test"] == "pp" else r["n_gen"]
        out[f"{r['test']}{n}"][label].append((int(r["depth"]), float(r["t_s"]), note(r)))
    return {t: {k: sorted(v) for k, v in lines.items()} for t, lines in out.items()}


def _label(r: dict) -> str:
    from rocforge_build.measure.bench import Variant

    return (f"{(r.get('prefix') or '').rstrip('/').rsplit('/', 1)[-1]} ({r.get('backend') or 'unknown'}) "
            + Variant.of_row(r).label())


def ceilings(rows: list[dict]) -> dict[str, str]:
    """{line label: what its percentages are of}, for the legend: the bandwidth and GEMM peak
    with their sources, or why the line has none."""
    out: dict[str, set] = defaultdict(set)
    for r in rows:
        c = r.get("ceiling")
        if r.get("status") != "ok" or r.get("t_s") is None or not c:
            continue
        if c.get("bandwidth_gbs") is not None:
            out[_label(r)].add(f"tg: % of {c['bandwidth_gbs']:g} GB/s, {c['bandwidth_source']}")
        if c.get("gemm_peak_tflops") is not None:
            out[_label(r)].add(f"pp: % of {c['gemm_peak_tflops']:g} TFLOPS, {c['gemm_source']}")
        if c.get("device") is None and c.get("why_none"):
            out[_label(r)].add(f"no ceiling: {c['why_none']}")
    return {label: "; ".join(sorted(parts)) for label, parts in out.items()}


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    mag = 10 ** len(str(int(step))) / 10 if step >= 1 else 1
    step = max(mag, round(step / mag) * mag) if step >= 1 else step
    ticks, v = [], lo
    while v <= hi + 1e-9:
        ticks.append(v)
        v += step
    return ticks


def svg(title: str, lines: dict[str, list[tuple[int, float, str]]], labels: dict[str, str]) -> str:
    xs = sorted({d for pts in lines.values() for d, _, _ in pts})
    ymax = max(t for pts in lines.values() for _, t, _ in pts) * 1.1 or 1
    pw, ph = W - ML - MR, H - MT - MB

    def x(d):  # depths are spaced evenly by rank: 0, 4096 and 16384 stay readable
        return ML + (xs.index(d) / max(1, len(xs) - 1)) * pw if len(xs) > 1 else ML + pw / 2

    def y(t):
        return MT + ph - t / ymax * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
             f'font-family="DejaVu Sans, sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="18" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" stroke="black"/>',
             f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" stroke="black"/>',
             f'<text x="{ML + pw / 2}" y="{H - 10}" text-anchor="middle">KV depth (tokens)</text>',
             f'<text x="16" y="{MT + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {MT + ph / 2})">tokens/s</text>']
    for d in xs:
        parts.append(f'<text x="{x(d):.1f}" y="{MT + ph + 16}" text-anchor="middle">{d}</text>')
    for t in _ticks(0, ymax):
        parts.append(f'<line x1="{ML - 4}" y1="{y(t):.1f}" x2="{ML + pw}" y2="{y(t):.1f}" stroke="#ddd"/>'
                     f'<text x="{ML - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for label, pts in lines.items():
        color = labels[label]
        coords = " ".join(f"{x(d):.1f},{y(t):.1f}" for d, t, _ in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}">'
                     f'<title>{html.escape(label)}</title></polyline>')
        parts += [f'<circle cx="{x(d):.1f}" cy="{y(t):.1f}" r="3" fill="{color}"><title>{html.escape(label)}: '
                  f'{t:.1f} t/s at depth {d}{html.escape(f" ({share})" if share else "")}</title></circle>'
                  for d, t, share in pts]
    parts.append("</svg>")
    return "\n".join(parts)


def page(rows: list[dict], title: str) -> str:
    data = series(rows)
    if not data:
        from rocforge_build.errors import UsageError

        raise UsageError("nothing to plot: no successful bench rows were selected")
    all_labels = sorted({label for lines in data.values() for label in lines})
    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(all_labels)}
    charts = "\n".join(svg(f"{test} t/s vs depth", lines, colors) for test, lines in sorted(data.items()))
    basis = ceilings(rows)
    legend = "\n".join(f'<li><span style="color:{colors[label]}">&#9632;</span> {html.escape(label)}'
                       + (f' <small>({html.escape(basis[label])})</small>' if label in basis else "")
                       + "</li>" for label in all_labels)
    return (f"<!DOCTYPE html>\n{MARKER}\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font-family:'DejaVu Sans',sans-serif;margin:16px} svg{margin:8px} "
            "ul{list-style:none;padding:0}</style></head><body>"
            f"<h2>{html.escape(title)}</h2>\n{charts}\n<ul>{legend}</ul>\n"
            f"<script type=\"application/json\" id=\"data\">{html.escape(json.dumps(data))}</script>"
            "</body></html>\n")
