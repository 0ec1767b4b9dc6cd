"""The HTML report: one self-contained page, readable offline, printable.

Plotting approach: charts are SVG drawn here in Python, with a `<title>` on every mark so the
browser shows its values on hover; no JavaScript library, no CDN, no fonts to fetch. The only
script is a few lines that sort and filter the groups table and highlight a hovered point.
That keeps the page small (vit_b_16 with everything is well under 1 MB), interactive the
moment it is parsed, and safe: every model-derived string passes through `esc` (HTML escaping)
and the script only ever sets `textContent`, never `innerHTML`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .terminal import binary, cross_cache_text, seconds, si

MAX_DRAWN_GROUPS = 200  # above this, the graph of groups is a collapsible list, not a drawing
COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#b83280", "#6b46c1", "#975a16", "#2c7a7b",
          "#c53030"]
CEILING_COLORS = ["#4a5568", "#718096", "#a0aec0", "#cbd5e0"]
LABEL_GAP_PX = 13  # between roof labels' baselines: a 10 px label's box is 11-12 px tall


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_html(d: dict[str, Any]) -> str:
    """The report of an analysis dict (`AnalysisResult.to_dict()`, or a saved JSON)."""
    sections = [
        _glance(d),
        _groups_section(d),
        _graph_section(d),
        *_roofline_sections(d),
        _bars_section(d),
        _hardware_section(d),
        _llm_section(d),
        _backends_section(d),
        _validation_section(d),
        _warnings_section(d),
    ]
    body = "\n".join(s for s in sections if s)
    return page(f"onnxlens: {d['model']['name']}", body, _nav(body), _JS)


def page(title: str, body: str, nav: str, script: str) -> str:
    """The self-contained page around report sections: styles inline, a policy that lets
    nothing load from anywhere, `script` inline. `title` is escaped here."""
    title = esc(title)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            f"style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<title>{title}</title><style>{_CSS}</style></head>\n<body>\n"
            f"<header><h1>{title}</h1><nav>{nav}</nav></header>\n<main>{body}</main>\n"
            f"<script>{script}</script>\n</body></html>\n")


def load_analysis_json(path: str | Path) -> dict[str, Any]:
    """A saved analysis, checked enough to render: schema and the keys the report reads."""
    import json

    from ..analyzer.errors import UsageError

    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not a JSON analysis ({e})") from None
    if not isinstance(d, dict) or d.get("schema") != "onnxlens/1":
        raise UsageError(f"{path}: not an onnxlens analysis (schema is not 'onnxlens/1')")
    for key in ("model", "totals", "groups"):
        if key not in d:
            raise UsageError(f"{path}: analysis has no {key!r}")
    return d


def write_html(d: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_html(d), encoding="utf-8")
    return path


# ---- sections ---------------------------------------------------------------------------

def _section(anchor: str, title: str, content: str) -> str:
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>\n{content}\n</section>'


def _nav(body: str) -> str:
    links = [("glance", "At a glance"), ("groups", "Fused groups"), ("graph", "Graph"),
             ("roofline", "Roofline"), ("bars", "Estimated vs measured"),
             ("hardware", "Hardware"), ("backends", "Backends"), ("validation", "Validation")]
    return " · ".join(f'<a href="#{a}">{t}</a>' for a, t in links if f'id="{a}' in body)


def _shape(shape: Sequence[Any] | None) -> str:
    if shape is None:
        return "?"
    return "×".join("?" if s is None else str(s) for s in shape)


def _glance(d: dict[str, Any]) -> str:
    m, t = d["model"], d["totals"]
    rows = [("model", m["name"]), ("opset", m["opset"])]
    rows += [(f"input {i['name']}", f"{i['dtype']} {_shape(i['shape'])}") for i in m["inputs"]]
    rows += [(f"output {o['name']}", f"{o['dtype']} {_shape(o['shape'])}") for o in m["outputs"]]
    rows += [("MACs", si(t["macs"])), ("FLOPs", si(t["flops"])),
             ("parameters", f"{t['params']:,} ({binary(t['param_bytes'])})"),
             ("activation peak", binary(t["activation_peak_bytes"])),
             ("nodes / fused groups", f"{t['nodes']} / {t['groups']}")]
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return _section("glance", "At a glance",
                    f'<p class="lead">{esc(bottleneck_sentence(d))}</p><table class="kv">'
                    f"{table}</table>")


def bottleneck_sentence(d: dict[str, Any]) -> str:
    """Where the time (estimated on the first profile) or the FLOPs go, in one sentence."""
    groups = [g for g in d["groups"] if g["flops"] is not None]
    hw = next(iter(d.get("estimates", {})), None)
    if hw:
        time = {g["id"]: (g["estimates"][hw] or {}).get("latency_s", 0) for g in groups}
        total = sum(time.values()) or 1
        by_pattern: dict[str, float] = {}
        bounds: dict[str, float] = {}
        for g in groups:
            by_pattern[g["pattern"]] = by_pattern.get(g["pattern"], 0) + time[g["id"]]
            bound = (g["estimates"][hw] or {}).get("bound_kind", "?")
            bounds[bound] = bounds.get(bound, 0) + time[g["id"]]
        pattern, share = max(by_pattern.items(), key=lambda kv: kv[1])
        bound, bshare = max(bounds.items(), key=lambda kv: kv[1])
        return (f"On {hw}, {pattern} groups take {100 * share / total:.0f}% of the estimated "
                f"{seconds(d['estimates'][hw]['latency_s'])}; {100 * bshare / total:.0f}% of "
                f"the time is {bound}-bound.")
    total = d["totals"]["flops"] or 1
    by_pattern = {}
    for g in groups:
        by_pattern[g["pattern"]] = by_pattern.get(g["pattern"], 0) + g["flops"]
    if not by_pattern:
        return "No group has a known cost."
    pattern, flops = max(by_pattern.items(), key=lambda kv: kv[1])
    return f"{pattern} groups do {100 * flops / total:.0f}% of the model's FLOPs."


def _first_keys(d: dict[str, Any]) -> tuple[str | None, str | None]:
    hw = next(iter(d.get("estimates", {})), None)
    backend = next(iter(d.get("measurements", {})), None)
    return hw, backend


def _group_times(g: dict[str, Any], hw: str | None, backend: str | None
                 ) -> tuple[float | None, float | None]:
    est = ((g.get("estimates") or {}).get(hw) or {}).get("latency_s") if hw else None
    meas = ((g.get("measured") or {}).get(backend) or {}).get("latency_s") if backend else None
    return est, meas


def _groups_section(d: dict[str, Any]) -> str:
    hw, backend = _first_keys(d)
    heads = [("#", "num"), ("pattern", "text"), ("first node", "text"), ("output", "text"),
             ("MACs", "num"), ("FLOPs", "num"), ("bytes", "num"), ("intensity", "num")]
    if hw:
        heads += [(f"est. {hw}", "num"), ("bound", "text")]
    if backend:
        heads += [(f"measured {backend}", "num")]
    if hw and backend:
        heads += [("est/meas", "num")]
    head = "".join(f'<th data-type="{kind}" tabindex="0">{esc(h)}</th>' for h, kind in heads)
    rows = []
    for g in d["groups"]:
        b = None if g["bytes_read"] is None else g["bytes_read"] + g["bytes_written"]
        intensity = g["flops"] / b if b and g["flops"] is not None else None
        cells = [_num(g["id"], str(g["id"])), _text(g["pattern"]), _text(g["nodes"][0]),
                 _text(_shape((g.get("output_shapes") or [None])[0])),
                 _num(g["macs"], si(g["macs"])), _num(g["flops"], si(g["flops"])),
                 _num(b, binary(b)), _num(intensity, f"{intensity:.3g}" if intensity else "-")]
        est, meas = _group_times(g, hw, backend)
        if hw:
            bound = ((g.get("estimates") or {}).get(hw) or {}).get("bound", "")
            cells += [_num(est, seconds(est)), _text(bound)]
        if backend:
            cells.append(_num(meas, seconds(meas)))
        if hw and backend:
            ratio = est / meas if est and meas else None
            cells.append(_num(ratio, f"{ratio:.2f}" if ratio else "-"))
        rows.append(f"<tr>{''.join(cells)}</tr>")
    filt = ('<input id="filter" type="search" placeholder="filter by pattern or node name" '
            'aria-label="filter groups">')
    return _section("groups", f"Fused groups ({len(d['groups'])})",
                    f'{filt}<div class="scroll"><table id="groups-table" class="data">'
                    f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _num(value: float | None, shown: str) -> str:
    key = "" if value is None else f"{float(value):.15g}"
    return f'<td class="n" data-v="{key}">{esc(shown)}</td>'


def _text(value: object) -> str:
    return f"<td>{esc(value)}</td>"


def _graph_section(d: dict[str, Any]) -> str:
    groups = d["groups"]
    edges = [tuple(e) for e in d.get("group_edges", [])]
    if len(groups) > MAX_DRAWN_GROUPS or not edges:
        inputs: dict[int, list[int]] = {}
        for a, b in edges:
            inputs.setdefault(b, []).append(a)
        lines = "".join(
            f"<li>{esc(g['pattern'])} <span class=\"dim\">{len(g['nodes'])} node(s) from "
            f"{esc(g['nodes'][0])}"
            + (f"; reads #{', #'.join(map(str, inputs[g['id']]))}" if g["id"] in inputs else "")
            + "</span></li>" for g in groups)
        return _section("graph", "Graph of groups",
                        f"<details><summary>{len(groups)} groups in execution order, each with "
                        f"the groups it reads (too many to draw)</summary>"
                        f'<ol class="groups" start="0">{lines}</ol></details>')
    return _section("graph", "Graph of groups", _dag_svg(groups, edges))


def _dag_svg(groups: list[dict[str, Any]], edges: list[tuple[int, int]]) -> str:
    """Groups laid out in columns by longest path from the inputs; edges as lines."""
    layer = {g["id"]: 0 for g in groups}
    for a, b in sorted(edges, key=lambda e: e[1]):  # ids follow execution order
        layer[b] = max(layer[b], layer[a] + 1)
    columns: dict[int, list[int]] = {}
    for gid, col in layer.items():
        columns.setdefault(col, []).append(gid)
    w, h, dx, dy = 118, 26, 150, 36
    pos = {gid: (10 + col * dx, 10 + row * dy) for col, ids in columns.items()
           for row, gid in enumerate(ids)}
    width = 20 + (max(columns) + 1) * dx
    height = 20 + max(len(ids) for ids in columns.values()) * dy
    lines = [f'<line x1="{pos[a][0] + w}" y1="{pos[a][1] + h / 2}" x2="{pos[b][0]}" '
             f'y2="{pos[b][1] + h / 2}" class="edge"/>' for a, b in edges]
    boxes = []
    for g in groups:
        x, y = pos[g["id"]]
        label = g["pattern"] if len(g["pattern"]) <= 16 else g["pattern"][:15] + "…"
        boxes.append(f'<g class="node"><title>#{g["id"]} {esc(g["pattern"])}: '
                     f'{esc(g["nodes"][0])} … ({esc(si(g["flops"]))}FLOPs)</title>'
                     f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4"/>'
                     f'<text x="{x + 6}" y="{y + 17}">{esc(label)}</text></g>')
    return (f'<div class="scroll"><svg class="dag" width="{width}" height="{height}" '
            f'role="img" aria-label="graph of fused groups">{"".join(lines)}'
            f'{"".join(boxes)}</svg></div>')


def _roofline_sections(d: dict[str, Any]) -> list[str]:
    out = []
    _, backend = _first_keys(d)
    for hw, est in d.get("estimates", {}).items():
        profile = (d.get("hardware") or {}).get(hw)
        points = []
        for g in d["groups"]:
            e = (g.get("estimates") or {}).get(hw)
            if not e or not g["flops"] or not e.get("intensity"):
                continue
            label = f"#{g['id']} {g['pattern']}"
            where = f"intensity {e['intensity']:.3g} FLOP/B"
            rate = g["flops"] / e["latency_s"]
            points.append((e["intensity"], rate, f"{label} estimated: {where}, "
                           f"{si(rate)}FLOP/s, {seconds(e['latency_s'])}, {e['bound']}", 0))
            meas = ((g.get("measured") or {}).get(backend) or {}).get("latency_s") \
                if backend else None
            if meas:
                rate = g["flops"] / meas
                points.append((e["intensity"], rate, f"{label} measured: {where}, "
                               f"{si(rate)}FLOP/s, {seconds(meas)}", 1))
        ceilings = _ceilings(profile)
        chart = _loglog_chart(points, ceilings, "intensity (FLOP/byte)", "FLOP/s",
                              ["estimated", f"measured ({backend})" if backend else ""])
        calibrated = "" if est["calibrated"] else " (uncalibrated)"
        out.append(_section("roofline" if not out else f"roofline-{esc(hw)}",
                            f"Roofline: {hw}{calibrated}", chart))
    return out


def _ceilings(profile: dict[str, Any] | None) -> list[tuple[str, float, float]]:
    """(label, peak FLOP/s, bandwidth B/s) per memory level, from a profile summary."""
    if not profile:
        return []
    peak = profile["peak_flops"]
    return [(f"{lv['name']} {lv['bandwidth_gbps']:.4g} GB/s", peak, lv["bandwidth_gbps"] * 1e9)
            for lv in profile["memory"]]


@dataclass(frozen=True)
class _LogLogFrame:
    """A log-log plot area: decades x0..x1, y0..y1 mapped onto a W x H viewBox."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = 640
    height: int = 360
    left: int = 70
    bottom: int = 40

    def px(self, x: float) -> float:
        return self.left + (math.log10(x) - self.x0) / (self.x1 - self.x0) * (
            self.width - self.left - 10)

    def py(self, y: float) -> float:
        return self.height - self.bottom - (math.log10(y) - self.y0) / (self.y1 - self.y0) * (
            self.height - self.bottom - 10)

    def axes(self, xlabel: str, ylabel: str) -> str:
        w, h, left, bottom = self.width, self.height, self.left, self.bottom
        ticks = []
        for e in range(int(self.x0), int(self.x1) + 1):
            x = self.px(10.0**e)
            ticks.append(f'<line class="grid" x1="{x:.1f}" y1="10" x2="{x:.1f}" '
                         f'y2="{h - bottom}"/><text x="{x:.1f}" y="{h - bottom + 16}" '
                         f'class="tick" text-anchor="middle">1e{e}</text>')
        for e in range(int(self.y0), int(self.y1) + 1):
            y = self.py(10.0**e)
            ticks.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{w - 10}" '
                         f'y2="{y:.1f}"/><text x="{left - 6}" y="{y + 4:.1f}" class="tick" '
                         f'text-anchor="end">{esc(tick(10.0**e))}</text>')
        mid = (h - bottom) / 2
        return ("".join(ticks) +
                f'<text x="{(w + left) / 2}" y="{h - 6}" class="label" text-anchor="middle">'
                f"{esc(xlabel)} (log)</text>"
                f'<text x="14" y="{mid}" class="label" text-anchor="middle" '
                f'transform="rotate(-90 14 {mid})">{esc(ylabel)} (log)</text>')


def tick(value: float) -> str:
    """A decade as an axis label: 1e-3 -> '1 m', 1e12 -> '1 T', 100 -> '100'."""
    for factor, prefix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k"), (1, ""),
                           (1e-3, " m"), (1e-6, " µ"), (1e-9, " n")):
        if value >= factor * 0.999:
            return f"{value / factor:.0f}{prefix}"
    return f"{value:.0e}"


def _loglog_chart(points: list[tuple[float, float, str, int]],
                  ceilings: list[tuple[str, float, float]], xlabel: str, ylabel: str,
                  legend: list[str], lines: bool = False, diagonal: bool = False) -> str:
    """Points (x, y, hover text, series), roofline ceilings, optionally joined per series;
    with `diagonal`, both axes span the same decades and carry y = x with ±10% and ±25%
    bands (estimated against measured).

    Series 0 are circles, the others squares, each in its own colour."""
    if not points:
        return '<p class="dim">No group has both a cost and an estimate.</p>'
    xs = [p[0] for p in points]
    ys = [p[1] for p in points] + [c[1] for c in ceilings]
    if diagonal:
        xs = ys = xs + ys
    f = _LogLogFrame(*_decades(min(xs), max(xs)), *_decades(min(ys), max(ys)))
    parts = [f.axes(xlabel, ylabel)]
    if diagonal:
        parts.append(_bands(f))
    lo, hi = 10.0**f.y0, 10.0**f.y1
    xa, xb = 10.0**f.x0, 10.0**f.x1
    # Each level's label sits just above its roof at the left edge, moved apart where roofs of
    # close bandwidths would stack them on one another.
    label_ys = spread([f.py(max(bw * xa, lo)) - 4 for _, _, bw in ceilings], LABEL_GAP_PX,
                      top=10 + LABEL_GAP_PX, bottom=f.height - f.bottom - 2)
    for i, ((label, peak, bw), label_y) in enumerate(zip(ceilings, label_ys, strict=True)):
        knee = peak / bw
        pts = [(xa, bw * xa), (knee, peak), (xb, peak)] if knee > xa else [(xa, peak),
                                                                           (xb, peak)]
        path = " ".join(f"{f.px(x):.1f},{f.py(min(max(y, lo), hi)):.1f}" for x, y in pts)
        color = CEILING_COLORS[i % len(CEILING_COLORS)]
        parts.append(f'<polyline class="ceiling" points="{path}" stroke="{color}">'
                     f"<title>{esc(label)}; peak {si(peak)}FLOP/s</title></polyline>"
                     f'<text x="{f.px(xa) + 4:.1f}" y="{label_y:.1f}" '
                     f'class="tick" fill="{color}">{esc(label)}</text>')
    if lines:
        series_points: dict[int, list[tuple[float, float]]] = {}
        for x, y, _, series in points:
            series_points.setdefault(series, []).append((f.px(x), f.py(y)))
        for series, pts in series_points.items():
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline class="series" points="{path}" '
                         f'stroke="{COLORS[series % len(COLORS)]}"/>')
    for x, y, label, series in points:
        cx, cy = f.px(x), f.py(y)
        shape = "circle" if series == 0 else "rect"
        mark = (f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4"' if series == 0 else
                f'<rect x="{cx - 4:.1f}" y="{cy - 4:.1f}" width="8" height="8"')
        parts.append(f'{mark} class="pt" fill="{COLORS[series % len(COLORS)]}">'
                     f"<title>{esc(label)}</title></{shape}>")
    keys = "".join(f'<span class="key"><i style="background:{COLORS[i % len(COLORS)]}"></i>'
                   f"{esc(t)}</span>" for i, t in enumerate(legend) if t)
    return (f'<svg class="chart" viewBox="0 0 {f.width} {f.height}" role="img" '
            f'aria-label="{esc(ylabel)} against {esc(xlabel)}">{"".join(parts)}</svg>'
            f'<div class="legend">{keys}</div>')


def spread(ys: Sequence[float], gap: float, top: float, bottom: float) -> list[float]:
    """Baselines `ys` moved apart, in their order, so that neighbours are at least `gap`
    apart and all lie in [top, bottom] where they fit: pushed down from the highest, then, if
    the lowest passed `bottom`, pushed up from it. Deterministic: equal ys keep their order."""
    order = sorted(range(len(ys)), key=lambda i: (ys[i], i))
    placed = [max(ys[i], top) for i in order]
    for k in range(1, len(placed)):
        placed[k] = max(placed[k], placed[k - 1] + gap)
    if placed and placed[-1] > bottom:
        placed[-1] = bottom
        for k in range(len(placed) - 2, -1, -1):
            placed[k] = min(placed[k], placed[k + 1] - gap)
    out = [0.0] * len(ys)
    for k, i in enumerate(order):
        out[i] = placed[k]
    return out


def _bands(f: _LogLogFrame) -> str:
    """y = x, and the bands where y is within 10% and 25% of x, across a square frame."""
    lo, hi = 10.0**f.x0, 10.0**f.x1
    parts = []
    for share, cls in ((0.25, "band25"), (0.10, "band10")):
        pts = [(lo, lo * (1 + share)), (hi, hi * (1 + share)), (hi, hi * (1 - share)),
               (lo, lo * (1 - share))]
        path = " ".join(f"{f.px(x):.1f},{f.py(min(max(y, lo), hi)):.1f}" for x, y in pts)
        parts.append(f'<polygon class="{cls}" points="{path}"><title>within '
                     f"±{share:.0%}</title></polygon>")
    parts.append(f'<line class="diagonal" x1="{f.px(lo):.1f}" y1="{f.py(lo):.1f}" '
                 f'x2="{f.px(hi):.1f}" y2="{f.py(hi):.1f}"><title>y = x</title></line>')
    return "".join(parts)


def _decades(lo: float, hi: float) -> tuple[float, float]:
    lo, hi = max(lo, 1e-12), max(hi, 1e-12)
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return (a, b) if b > a else (a, a + 1)


def _bars_section(d: dict[str, Any], top: int = 25) -> str:
    hw, backend = _first_keys(d)
    if not hw and not backend:
        return ""
    rows = []
    for g in d["groups"]:
        est, meas = _group_times(g, hw, backend)
        if est or meas:
            rows.append((max(est or 0, meas or 0), g, est, meas))
    rows.sort(key=lambda r: r[0], reverse=True)
    rows = rows[:top]
    if not rows:
        return ""
    scale = rows[0][0] or 1
    bars = []
    for _, g, est, meas in rows:
        label = f"#{g['id']} {g['pattern']}"
        cells = [f'<div class="bar-label" title="{esc(g["nodes"][0])}">{esc(label)}</div>']
        for value, cls, name in ((est, "s0", f"estimated on {hw}"),
                                 (meas, "s1", f"measured on {backend}")):
            if value is not None:
                cells.append(f'<div class="bar {cls}" style="width:{100 * value / scale:.1f}%"'
                             f' title="{esc(name)}: {esc(seconds(value))}">'
                             f"<span>{esc(seconds(value))}</span></div>")
        bars.append(f'<div class="bar-row">{"".join(cells)}</div>')
    keys = "".join(f'<span class="key {c}">{esc(t)}</span>' for c, t in
                   (("s0", f"estimated ({hw})" if hw else ""),
                    ("s1", f"measured ({backend})" if backend else "")) if t)
    return _section("bars", f"Estimated vs measured, top {len(rows)} groups",
                    f'<div class="legend">{keys}</div><div class="bars">{"".join(bars)}</div>')


def _hardware_section(d: dict[str, Any]) -> str:
    sweep = d.get("sweep") or []
    estimates = d.get("estimates") or {}
    if not estimates:
        return ""
    table = _table(["hardware", "precision", "latency", "energy", "calibrated"],
                   [[hw, e["precision"], seconds(e["latency_s"]), f"{e['energy_j']:.3g} J",
                     "yes" if e["calibrated"] else "no"] for hw, e in estimates.items()])
    parts = [table, _hbars("latency", {hw: e["latency_s"] for hw, e in estimates.items()},
                           seconds),
             _hbars("energy", {hw: e["energy_j"] for hw, e in estimates.items()},
                    lambda v: f"{v:.3g} J")]
    if sweep:
        parts.append(_table(
            ["batch", "precision", "hardware", "latency", "throughput", "energy", "speedup",
             "energy efficiency"],
            [[r["batch"], r["precision"], r["hardware"], seconds(r["latency_s"]),
              f"{r['throughput_per_s']:.4g}/s" if r["throughput_per_s"] else "-",
              f"{r['energy_j']:.3g} J", _x(r["speedup"]), _x(r["energy_efficiency"])]
             for r in sweep]))
        parts.append(_sweep_chart(sweep))
    return _section("hardware", "Hardware comparison and sweeps", "".join(parts))


def _llm_section(d: dict[str, Any]) -> str:
    """The LLM view (`llm`): the cache layout, and per phase and profile its MACs, latency,
    tokens/s, KV cache and memory; a phase with unknown costs is marked."""
    llm = d.get("llm")
    if not llm:
        return ""
    # Escaped whole: a saved JSON (`onnxlens report`) is read back as it is.
    layout = "<p>" + esc(f"{llm['layers']} layers, {llm['kv_heads']} KV heads x "
                         f"{llm['head_dim']}, KV cache {binary(llm['kv_cache_bytes_per_token'])}"
                         f"/token{cross_cache_text(llm)}, batch {llm['batch']}" + "".join(
                             f", {w['layers']} layer(s) with a {w['window']}-token window"
                             for w in llm.get("sliding_window", []))) + "</p>"
    phases = [(f"prefill {llm['prefill']['prompt_len']}", llm["prefill"])] + [
        (f"decode @{r['context_len']}", r) for r in llm.get("context_sweep") or [llm["decode"]]]
    rows = [[name + ("" if phase.get("complete", True) else " (incomplete)"), hw,
             si(phase["macs"]), seconds(e["latency_s"]),
             f"{e['tokens_per_s']:,.0f}" if e["tokens_per_s"] else "-",
             binary(phase["memory"]["kv_cache_bytes"]) if "memory" in phase else "",
             binary(phase["memory"]["total_bytes"]) if "memory" in phase and
             phase["memory"]["total_bytes"] is not None else ""]
            for name, phase in phases for hw, e in phase["estimates"].items()]
    table = _table(["phase", "hardware", "MACs", "latency", "tokens/s", "KV cache", "memory"],
                   rows)
    return _section("llm", "LLM: prefill and decode", layout + table)


def _hbars(title: str, values: dict[str, float], fmt: Any) -> str:
    """One horizontal bar per key, on a log scale when the values span over 2 decades."""
    if len(values) < 2:
        return ""
    lo, hi = min(values.values()), max(values.values())
    log = lo > 0 and hi / lo > 100
    def width(v: float) -> float:
        if log:
            return 100 * (math.log10(v / lo) + 0.3) / (math.log10(hi / lo) + 0.3)
        return 100 * v / hi if hi else 0
    rows = "".join(f'<div class="bar-row1"><div class="bar-label">{esc(k)}</div>'
                   f'<div class="bar s0" style="width:{width(v):.1f}%" title="{esc(k)}: '
                   f'{esc(fmt(v))}"><span>{esc(fmt(v))}</span></div></div>'
                   for k, v in values.items())
    scale = " (log scale)" if log else ""
    return f'<h3>{esc(title)}{scale}</h3><div class="bars">{rows}</div>'


def _x(value: float | None) -> str:
    return f"{value:.3g}×" if value else "-"


def _sweep_chart(rows: list[dict[str, Any]]) -> str:
    """Throughput against batch, one line per (hardware, precision), log-log."""
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["throughput_per_s"]:
            series.setdefault(f"{r['hardware']} {r['precision']}", []).append(
                (r["batch"], r["throughput_per_s"]))
    if not series or max(len(v) for v in series.values()) < 2:
        return ""
    points = []
    for i, (name, pts) in enumerate(series.items()):
        points += [(x, y, f"{name}: batch {x}, {y:.4g} samples/s", i) for x, y in pts]
    return _loglog_chart(points, [], "batch", "samples/s", list(series), lines=True)


def _backends_section(d: dict[str, Any]) -> str:
    measurements = d.get("measurements") or {}
    if not measurements:
        return ""
    rows = []
    for name, m in measurements.items():
        lat = m.get("latency_s") or {}
        rows.append([name, seconds(lat.get("median")), seconds(lat.get("p90")),
                     seconds(lat.get("min")),
                     f"{m['throughput_per_s']:.4g}/s" if m.get("throughput_per_s") else "-",
                     m.get("threads", "-"), binary(m.get("peak_memory_bytes")),
                     f"{100 * m['unmapped_share']:.1f}%" if m.get("unmapped_share") is not None
                     else "-"])
    parts = [_table(["backend", "median", "p90", "min", "throughput", "threads",
                     "peak memory", "unmapped"], rows)]
    agreement = d.get("agreement") or {}
    if agreement:
        arows = []
        for pair, a in agreement.items():
            arows.append([pair, _fmt(a.get("max_abs_error")), _fmt(a.get("max_rel_error")),
                          _fmt(a.get("cosine")), _pct(a.get("top1_agreement")),
                          a.get("first_divergence") or "-"])
        parts.append(_table(["backends", "max abs error", "max rel error", "cosine",
                             "top-1 agreement", "first divergent node"], arows))
    return _section("backends", "Backends measured", "".join(parts))


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _validation_section(d: dict[str, Any]) -> str:
    from .validation import references

    refs = references(d)
    if not refs:
        return ""
    rows = [[r["figure"], _figure(r["ours"]), _figure(r["reference"]),
             f"{r['ratio']:.4f}" if r["ratio"] else "-", r["source"], r["verdict"]]
            for r in refs]
    return _section("validation", "Validation against published figures",
                    _table(["figure", "onnxlens", "published", "ratio", "source",
                            "why they differ"], rows))


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value < 1e6 else si(value)


def _warnings_section(d: dict[str, Any]) -> str:
    items = [*(f"unsupported op {op} ({len(n)} nodes)" for op, n in
               (d.get("unsupported_ops") or {}).items()), *d.get("warnings", [])]
    if not items:
        return ""
    return _section("warnings", "Warnings",
                    "<ul>" + "".join(f"<li>{esc(w)}</li>" for w in items) + "</ul>")


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="data"><thead><tr>{h}</tr></thead>' \
           f"<tbody>{body}</tbody></table></div>"


_CSS = """
:root{--fg:#1a202c;--dim:#718096;--line:#e2e8f0;--bg:#fff;--accent:#2b6cb0}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{position:sticky;top:0;background:#f7fafc;border-bottom:1px solid var(--line);
padding:8px 20px;z-index:2}h1{font-size:18px;margin:0}nav{font-size:13px}
nav a{color:var(--accent);text-decoration:none}main{padding:0 20px 40px;max-width:1400px}
section{content-visibility:auto;contain-intrinsic-size:auto 600px}
h2{font-size:16px;border-bottom:1px solid var(--line);padding-bottom:4px;margin-top:28px}
.lead{font-size:15px}.dim{color:var(--dim)}.scroll{overflow-x:auto}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid var(--line);
text-align:left;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
table.data td:not(.n){white-space:normal;overflow-wrap:anywhere;min-width:8em;max-width:36em}
table.kv th{font-weight:600;color:var(--dim)}
table.data thead th{position:sticky;top:0;background:#edf2f7;cursor:pointer}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
#filter{margin:6px 0;padding:4px 8px;width:320px;max-width:100%}
svg.chart{width:100%;max-width:720px;height:auto}
.grid{stroke:#edf2f7}.tick{font-size:10px;fill:var(--dim)}.label{font-size:11px}
.ceiling{fill:none;stroke-width:2}.pt{opacity:.8}.pt:hover{opacity:1;stroke:#000;stroke-width:2}
.series{fill:none;stroke-width:1.5;opacity:.6}.diagonal{stroke:#4a5568;stroke-dasharray:4 3}
.band25{fill:#fefcbf;opacity:.6}.band10{fill:#c6f6d5;opacity:.8}h3{font-size:14px;margin:16px 0 4px}
.bar-row1{display:grid;grid-template-columns:220px 1fr;gap:2px 8px;align-items:center;
margin:3px 0}div.scroll{margin:8px 0}
.legend{font-size:12px;margin:4px 0}.key{margin-right:14px}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px}
.key.s0::before,.key.s1::before{content:"";display:inline-block;width:10px;height:10px;
margin-right:4px}.key.s0::before{background:#2b6cb0}.key.s1::before{background:#c05621}
.dag .edge{stroke:#a0aec0}.dag rect{fill:#ebf4ff;stroke:#2b6cb0}
.dag text{font-size:11px}.dag .node:hover rect{fill:#bee3f8}
.bar-row{display:grid;grid-template-columns:220px 1fr;gap:2px 8px;align-items:center}
.bar-label{grid-row:span 2;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.bar{height:11px;min-width:1px;position:relative}.bar.s0{background:#2b6cb0}
.bar.s1{background:#c05621}.bar span{position:absolute;left:100%;padding-left:4px;
font-size:10px;top:-2px;white-space:nowrap}.bars{max-width:900px}
ol.groups{font-size:12px}@media print{header{position:static}.bar span{display:none}
table.data thead th{position:static}}
"""

_JS = """
(function(){
var t=document.getElementById('groups-table');if(!t)return;
var body=t.tBodies[0],rows=Array.prototype.slice.call(body.rows);
function key(r,i,num){var c=r.cells[i];if(!num)return c.textContent.toLowerCase();
var v=c.getAttribute('data-v');return v===''?-Infinity:parseFloat(v);}
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){
function sort(){var num=th.getAttribute('data-type')==='num';
var asc=th.getAttribute('aria-sort')!=='ascending';
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(o){o.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',asc?'ascending':'descending');
rows.sort(function(a,b){var x=key(a,i,num),y=key(b,i,num);return (x<y?-1:x>y?1:0)*(asc?1:-1);});
rows.forEach(function(r){body.appendChild(r);});}
th.addEventListener('click',sort);
th.addEventListener('keydown',function(e){if(e.key==='Enter')sort();});});
var f=document.getElementById('filter');
f.addEventListener('input',function(){var q=f.value.toLowerCase();
rows.forEach(function(r){r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':'';});});
})();
"""
