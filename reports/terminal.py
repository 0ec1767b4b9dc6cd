"""The terminal summary: model, inputs/outputs, totals, the most expensive groups, warnings.

Model-derived strings go through `plain` (control characters removed, long names shortened)
and into `rich.text.Text`, never into markup, so a node named ``[red]x`` prints as written.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ..analyzer.analysis import AnalysisResult

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MAX_NAME = 60


def plain(value: object, limit: int = MAX_NAME) -> str:
    """A model-derived string made safe to print: no control characters, at most `limit` chars."""
    text = _CONTROL.sub("?", str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def si(value: float | None, unit: str = "") -> str:
    """1_814_073_344 -> '1.814 G'."""
    if value is None:
        return "unknown"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def binary(value: int | None) -> str:
    if value is None:
        return "unknown"
    for factor, prefix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= factor:
            return f"{value / factor:.2f} {prefix}"
    return f"{value} B"


def _shape(shape: object) -> str:
    if shape is None:
        return "?"
    return "x".join("?" if d is None else str(d) for d in shape)  # type: ignore[attr-defined]


def render(result: AnalysisResult, console: Console, *, top: int = 10) -> None:
    d = result.to_dict()
    model, totals = d["model"], d["totals"]
    console.print(Text.assemble(("onnxlens ", "bold cyan"), (plain(model["name"]), "bold"),
                                f"  opset {model['opset']}",
                                f"  {totals['nodes']} nodes, {totals['groups']} fused groups"))
    io = Table.grid(padding=(0, 2))
    for kind in ("inputs", "outputs"):
        for t in model[kind]:
            io.add_row(kind[:-1], Text(plain(t["name"])), t["dtype"], _shape(t["shape"]))
    console.print(io)

    fpm = result.flops_per_mac
    summary = Table(title="Totals", title_justify="left", show_header=False, box=None)
    summary.add_row("MACs (Conv, Gemm, MatMul, Einsum)", si(totals["macs"]))
    summary.add_row(f"FLOPs ({fpm} per MAC + other work)", si(totals["flops"]))
    summary.add_row("parameters", f"{totals['params']:,}  ({binary(totals['param_bytes'])})")
    summary.add_row("activation peak (fused plan)", binary(totals["activation_peak_bytes"]))
    summary.add_row("bytes read / written (per node)",
                    f"{binary(totals['bytes_read'])} / {binary(totals['bytes_written'])}")
    symbolic = d.get("symbolic")
    if symbolic:
        dims = ", ".join(f"{plain(k)}={v}" for k, v in symbolic["dims"].items())
        summary.add_row(Text(f"as formulas (above: {dims})", style="bold"), "")
        for key, label in (("macs", "MACs"), ("flops", "FLOPs"),
                           ("activation_peak_bytes", "activation peak bytes")):
            if key in symbolic["totals"]:
                summary.add_row(f"  {label}", Text(plain(symbolic["totals"][key], 120)))
    if not totals["complete"]:
        summary.add_row(Text("incomplete", style="bold yellow"),
                        "some costs are unknown; totals cover the known part")
    console.print(summary)

    known = [g for g in d["groups"] if g["flops"] is not None]
    ranked = sorted(known, key=lambda g: g["flops"], reverse=True)[:top]
    table = Table(title=f"Most expensive fused groups (top {len(ranked)} of {len(d['groups'])})",
                  title_justify="left")
    for col in ("#", "pattern", "first node", "MACs", "FLOPs", "share", "bytes"):
        table.add_column(col, justify="right" if col in ("#", "MACs", "FLOPs", "share", "bytes")
                         else "left")
    total_flops = totals["flops"] or 1
    for g in ranked:
        table.add_row(str(g["id"]), Text(plain(g["pattern"], 40)), Text(plain(g["nodes"][0])),
                      si(g["macs"]), si(g["flops"]), f"{100 * g['flops'] / total_flops:.1f}%",
                      binary(g["bytes_read"] + g["bytes_written"]))
    console.print(table)

    if d["unsupported_ops"]:
        ops = ", ".join(f"{plain(op)} x{len(n)}" for op, n in d["unsupported_ops"].items())
        console.print(Text("unsupported ops (cost unknown): ", style="bold yellow") + Text(ops))
    for w in d["warnings"]:
        console.print(Text("warning: ", style="yellow") + Text(plain(w, 300)))
