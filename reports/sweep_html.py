"""The sweep report (`DIR/report.html`): many models compared, from the rows of a sweep's
results.jsonl. Drawn by the single-model report's own pieces (`reports.html`: the page, its
tables, log-log charts and bars), so it is as self-contained, offline and escaped as that one.

Sections: models x targets at the first batch; latency against MACs per target (log-log: the
scaling study); estimated against measured with y = x and ±10%/±25% bands; throughput against
batch per target; precision and hardware bars per model; the failed rows with their reasons.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..analyzer.hardware import GRAPH
from .html import _hbars, _loglog_chart, _section, _table, esc, page
from .terminal import binary, seconds, si

Row = Mapping[str, Any]


def write_sweep_html(rows: Iterable[Row], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_sweep_html(list(rows)), encoding="utf-8")
    return path


def render_sweep_html(rows: list[Row]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    sections = [_summary(rows), _matrix(ok), _scaling(ok), _accuracy(ok), _throughput(ok),
                _bars(ok), _failures(rows)]
    body = "\n".join(s for s in sections if s)
    links = [("summary", "Summary"), ("matrix", "Models × targets"), ("scaling", "Scaling"),
             ("accuracy", "Estimated vs measured"), ("throughput", "Throughput"),
             ("bars", "Precision and hardware"), ("failures", "Failures")]
    nav = " · ".join(f'<a href="#{a}">{t}</a>' for a, t in links if f'id="{a}"' in body)
    return page("onnxlens sweep", body, nav, "")


def _models(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def _targets(rows: list[Row]) -> list[str]:
    """Estimate targets first, then the measured backends, each in the order first seen."""
    return list(dict.fromkeys([r["target"] for r in rows if r["kind"] == "estimate"] +
                              [r["target"] for r in rows if r["kind"] == "measured"]))


def _first(rows: list[Row], key: str) -> Any:
    return rows[0][key] if rows else None


def _at_first_precision(rows: list[Row]) -> list[Row]:
    """The measurements (each at its model's own precision) and the estimates at the first
    precision estimated."""
    precision = _first([r for r in rows if r["kind"] == "estimate"], "precision")
    return [r for r in rows if r["kind"] == "measured" or r["precision"] == precision]


def _headline(rows: list[Row]) -> list[Row]:
    """One row per (model, target): the first batch, and for estimates the first precision."""
    batch = _first(rows, "batch")
    return [r for r in _at_first_precision(rows) if r["batch"] == batch]


def _summary(rows: list[Row]) -> str:
    failed = sum(r["status"] != "ok" for r in rows)
    hosts = sorted({f"{h.get('name')} ({h.get('cpu')}, {h.get('isa')})"
                    for r in rows if (h := r.get("host"))})
    kv = [("rows", f"{len(rows)} ({failed} failed)"), ("models", len(_models(rows))),
          ("batches", ", ".join(map(str, dict.fromkeys(r["batch"] for r in rows)))),
          ("targets", ", ".join(_targets(rows))), ("hosts", "; ".join(hosts)),
          ("onnxlens", ", ".join(sorted({str(r["onnxlens_version"]) for r in rows})))]
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in kv)
    return _section("summary", "Summary", f'<table class="kv">{table}</table>')


def _matrix(rows: list[Row]) -> str:
    """Latency of each model on each target, at the first batch (and precision)."""
    head = _headline(rows)
    if not head:
        return ""
    targets = _targets(head)
    cell = {(r["model"], r["target"]): r for r in head}
    lines = []
    for model in _models(head):
        some = next(r for r in head if r["model"] == model)
        lines.append([model, si(some["macs"]), f"{some['params']:,}" if some["params"] else "-",
                      binary(some["activation_peak_bytes"]),
                      *(seconds(cell[model, t]["latency_s"]) if (model, t) in cell else "-"
                        for t in targets)])
    what = f"batch {head[0]['batch']}"
    precision = _first([r for r in head if r["kind"] == "estimate"], "precision")
    if precision:
        at = "each model's own precision" if precision == GRAPH else precision
        what += f", estimates at {at}, measurements at the model's own precision"
    return _section("matrix", f"Latency, models × targets ({what})",
                    _table(["model", "MACs", "parameters", "activation peak", *targets], lines))


def _scaling(rows: list[Row]) -> str:
    """Latency against MACs, log-log, one chart per target; a series per batch."""
    charts, compared = [], _at_first_precision(rows)
    for target in _targets(rows):
        mine = [r for r in compared
                if r["target"] == target and r["macs"] and r["latency_s"]]
        batches = list(dict.fromkeys(r["batch"] for r in mine))
        points = [(r["macs"], r["latency_s"], f"{r['model']} batch {r['batch']}: "
                   f"{si(r['macs'])}MACs, {seconds(r['latency_s'])}", batches.index(r["batch"]))
                  for r in mine]
        if points:
            charts.append(f"<h3>{esc(target)}</h3>" + _loglog_chart(
                points, [], "MACs", "latency (s)", [f"batch {b}" for b in batches]))
    return _section("scaling", "Latency against MACs", "".join(charts)) if charts else ""


# A measured backend's estimate: the host's, for a backend that runs on the host's CPU.
def _estimate_target(backend: str) -> str | None:
    return "host" if backend.endswith("-cpu") else None


def _accuracy(rows: list[Row]) -> str:
    """Each measurement against the estimate of the same model and batch on the matching
    target, at the graph's own precision (what was measured) or else at the precision named
    like the measurement's: y = x is a perfect estimate."""
    estimates = {(r["model_sha256"], r["batch"], r["precision"], r["target"]): r
                 for r in rows if r["kind"] == "estimate"}
    backends: list[str] = []
    points = []
    for r in rows:
        if r["kind"] != "measured":
            continue
        sha, batch, hw = r["model_sha256"], r["batch"], _estimate_target(r["target"])
        est = (estimates.get((sha, batch, GRAPH, hw))
               or estimates.get((sha, batch, r["precision"], hw)))
        if est is None or not est["latency_s"] or not r["latency_s"]:
            continue
        if r["target"] not in backends:
            backends.append(r["target"])
        off = est["latency_s"] / r["latency_s"] - 1
        points.append((r["latency_s"], est["latency_s"],
                       f"{r['model']} batch {r['batch']} on {r['target']}: measured "
                       f"{seconds(r['latency_s'])}, estimated on {est['target']} "
                       f"{seconds(est['latency_s'])} ({off:+.0%})", backends.index(r["target"])))
    if not points:
        return ""
    within = sum(abs(y / x - 1) <= 0.25 for x, y, _, _ in points)
    note = (f'<p class="lead">{within} of {len(points)} estimates within 25% of the '
            "measurement (the yellow band; green: 10%).</p>")
    chart = _loglog_chart(points, [], "measured latency (s)", "estimated latency (s)",
                          [f"{b} vs {_estimate_target(b)}" for b in backends], diagonal=True)
    return _section("accuracy", "Estimated against measured", note + chart)


def _throughput(rows: list[Row]) -> str:
    """Samples per second against batch, one chart per target, a line per model."""
    if len({r["batch"] for r in rows}) < 2:
        return ""
    charts, compared = [], _at_first_precision(rows)
    for target in _targets(rows):
        mine = [r for r in compared
                if r["target"] == target and r["throughput_per_s"]]
        models = _models(mine)
        points = [(r["batch"], r["throughput_per_s"], f"{r['model']}: batch {r['batch']}, "
                   f"{r['throughput_per_s']:.4g} samples/s", models.index(r["model"]))
                  for r in sorted(mine, key=lambda r: r["batch"])]
        if points:
            charts.append(f"<h3>{esc(target)}</h3>" + _loglog_chart(
                points, [], "batch", "samples/s", models, lines=True))
    return _section("throughput", "Throughput against batch", "".join(charts)) if charts else ""


def _bars(rows: list[Row]) -> str:
    """Per model at the first batch: estimated latency by precision (first target), and
    latency by target (first precision)."""
    estimates = [r for r in rows if r["kind"] == "estimate"]
    if not estimates:
        return ""
    batch, hw, precision = (estimates[0][k] for k in ("batch", "target", "precision"))
    parts = []
    for model in _models(rows):
        mine = [r for r in rows if r["model"] == model and r["batch"] == batch]
        by_precision = {r["precision"]: r["latency_s"] for r in mine
                        if r["kind"] == "estimate" and r["target"] == hw}
        by_target = {r["target"]: r["latency_s"] for r in mine
                     if r["kind"] == "measured" or r["precision"] == precision}
        parts += [_hbars(f"{model}: by precision on {hw}", by_precision, seconds),
                  _hbars(f"{model}: by target ({precision})", by_target, seconds)]
    body = "".join(p for p in parts if p)
    return _section("bars", f"Precision and hardware, batch {batch}", body) if body else ""


def _failures(rows: list[Row]) -> str:
    failed = [r for r in rows if r["status"] != "ok"]
    if not failed:
        return ""
    return _section("failures", f"Failed rows ({len(failed)})", _table(
        ["model", "batch", "precision", "target", "kind", "error"],
        [[r["model"], r["batch"], r["precision"], r["target"], r["kind"], r["error"]]
         for r in failed]))
