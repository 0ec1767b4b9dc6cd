"""The terminal view of a comparison (`onnxlens compare`, `analyze --measure`) and of
`onnxlens backends`, plus the progress bar shown while measuring.

This layer renders the plain dicts of `Comparison.to_dict()` (schema "onnxlens-compare/1") and
`BackendInfo.to_dict()`; it never imports the backends. Model-derived strings go through
`plain` into `Text`, never into markup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .terminal import binary, plain, seconds


@contextmanager
def measuring(console: Console) -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar; the yielded callback takes (steps done, steps in all, what runs now)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("measuring", total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=plain(what, 50))

        yield update


def render_backends(rows: list[dict[str, Any]], console: Console) -> None:
    """`onnxlens backends`: each backend, whether it runs here, and why not in one line."""
    table = Table(title="Backends", title_justify="left")
    for col in ("name", "available", "description", "why not / note"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], Text("yes", style="green") if r["available"]
                      else Text("no", style="red"), r["description"],
                      Text(plain(r["reason"] or r["note"], 200),
                           style="" if r["available"] else "yellow"))
    console.print(table)
    for r in rows:
        if r.get("ops"):
            console.print(Text.assemble((r["name"], "bold"), " runs: ", plain(r["ops"], 4000)))


def render_comparison(d: dict[str, Any], console: Console, *, top: int = 10) -> None:
    s = d["settings"]
    console.print(Text.assemble(
        ("onnxlens compare ", "bold cyan"), (plain(d["model"]["name"]), "bold"),
        f"  threads {s['threads']}  batch {', '.join(map(str, s['batches']))}  "
        f"{s['runs']} timed runs after {s['warmup']} warm-up"))
    for name, why in d["unavailable"].items():
        console.print(Text("skipped ", style="bold yellow") + Text(f"{name}: {plain(why, 300)}"))
    if d["measurements"]:
        _latency_table(d, console)
        _groups_table(d, console, top)
    if d["agreement"]:
        _agreement_table(d, console)
    for key, dd in d.get("dump_diff", {}).items():
        _dump_diff_line(key, dd, console)
    for name, m in d["measurements"].items():
        for note in m["notes"]:
            console.print(Text(f"note: {name}: ", style="dim") + Text(plain(note, 300)))
    for w in d["warnings"]:
        console.print(Text("warning: ", style="yellow") + Text(plain(w, 300)))


def _latency_table(d: dict[str, Any], console: Console) -> None:
    table = Table(title="Measured (median of timed runs; spread = (max - min) / median)",
                  title_justify="left")
    for col in ("backend", "median", "p90", "min", "spread", "throughput", "peak memory"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for name, m in d["measurements"].items():
        lat = m["latency_s"]
        throughput = "  ".join(f"b{r['batch']} {r['throughput_per_s']:.3g}/s"
                               for r in m["sweep"])
        table.add_row(
            name, seconds(lat["median"]), seconds(lat["p90"]), seconds(lat["min"]),
            f"{100 * lat['spread']:.0f}%", throughput,
            binary(m["peak_memory_bytes"]) if m["peak_memory_bytes"] is not None else "-")
    console.print(table)
    for name, m in d["measurements"].items():
        prof, est = m["profile"], m["estimate"]
        parts = []
        if prof:
            unmapped = ", ".join(plain(k["name"], 30) for k in prof["unmapped_kernels"])
            parts.append(f"{prof['mapped_kernels']}/{prof['kernels']} kernels mapped to our "
                         f"nodes, unmapped {100 * m['unmapped_share']:.2f}% of kernel time"
                         + (f" ({unmapped})" if unmapped else ""))
        if est:
            calibrated = "" if est["calibrated"] else " (uncalibrated)"
            parts.append(f"estimate on {plain(est['hardware'], 30)}{calibrated} "
                         f"{seconds(est['latency_s'])} = {_ratio(est['error_ratio'])} measured")
        if parts:
            console.print(Text(f"{name}: ", style="bold") + Text("; ".join(parts)))


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _off(ratio: float | None) -> float:
    return abs(math.log(ratio)) if ratio else -1.0


def _groups_table(d: dict[str, Any], console: Console, top: int) -> None:
    """Per group: measured time per backend, and the estimate beside it, furthest off first
    (by the first backend with an estimate; without one, slowest first)."""
    backends = [n for n, m in d["measurements"].items() if m["profile"]]
    if not backends:
        return
    judged = next((n for n in backends if d["measurements"][n]["estimate"]), None)
    if judged:
        def key(g: dict[str, Any]) -> float:
            return _off((g["estimated"].get(judged) or {}).get("error_ratio"))
        title = f"Fused groups, estimate furthest off first ({judged})"
    else:
        def key(g: dict[str, Any]) -> float:
            return (g["measured"].get(backends[0]) or {}).get("latency_s", 0.0)
        title = f"Slowest fused groups ({backends[0]})"
    ranked = sorted(d["groups"], key=key, reverse=True)[:top]
    console.print(Text(f"{title}, top {len(ranked)} of {len(d['groups'])}", style="italic"))
    table = Table()
    table.add_column("#", justify="right")
    table.add_column("pattern")
    for name in backends:
        table.add_column(f"{name}", justify="right")
        table.add_column("share", justify="right")
    if judged:
        for col in ("estimate", "est/meas"):
            table.add_column(col, justify="right")
    for g in ranked:
        row: list[Any] = [str(g["id"]), Text(plain(g["pattern"], 40))]
        for name in backends:
            m = g["measured"].get(name)
            row += [seconds(m["latency_s"]), f"{100 * m['share']:.1f}%"] if m else ["-", "-"]
        if judged:
            e = g["estimated"].get(judged)
            row += [seconds(e["latency_s"]), _ratio(e["error_ratio"])] if e else ["-", "-"]
        table.add_row(*row)
    console.print(table)


def _agreement_table(d: dict[str, Any], console: Console) -> None:
    table = Table(title="Agreement (per output, over all input sets)", title_justify="left")
    for col in ("pair", "output", "max abs err", "max rel err", "min cosine", "top-1",
                "atol/rtol", "passed"):
        table.add_column(col, justify="left" if col in ("pair", "output") else "right")
    for key, a in d["agreement"].items():
        for o in a["outputs"]:
            top1 = o["top1_agreement"]
            table.add_row(
                key, Text(plain(o["name"], 40)), f"{o['max_abs_err']:.3g}",
                f"{o['max_rel_err']:.3g}", f"{o['min_cosine']:.6f}",
                f"{100 * top1:.1f}%" if top1 is not None else "-",
                f"{o['atol']:g}/{o['rtol']:g}",
                Text("yes", style="green") if o["passed"] else Text("no", style="bold red"))
    console.print(table)


def _dump_diff_line(key: str, dd: dict[str, Any], console: Console) -> None:
    first = dd["first_divergence"]
    head = Text(f"dump-diff {key}: ", style="bold")
    if first is None:
        line = head + Text(f"all {dd['tensors_compared']} tensors within tolerance")
    else:
        line = head + Text(
            f"first divergence at node {plain(first['node'])} ({plain(first['op_type'], 30)}), "
            f"tensor {plain(first['tensor'])}: max abs err {first['max_abs_err']:.3g}, "
            f"cosine {first['cosine']:.6f}; {dd['tensors_diverging']} of "
            f"{dd['tensors_compared']} tensors diverge", style="red")
    console.print(line)
    if dd["note"]:
        console.print(Text(f"  {plain(dd['note'], 200)}", style="dim"))
