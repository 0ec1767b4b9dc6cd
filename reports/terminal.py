"""The terminal summary: model, inputs/outputs, totals, the most expensive groups, warnings.

Model-derived strings go through `plain` (control characters removed, long names shortened)
and into `rich.text.Text`, never into markup, so a node named ``[red]x`` prints as written.
"""

from __future__ import annotations

import re

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analyzer.serialize import summary_weight

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


def seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= factor:
            return f"{value / factor:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def _groups_table(d: dict, console: Console, top: int) -> None:
    """The most expensive groups: by estimated time on the first profile, else by FLOPs."""
    first_hw = next(iter(d.get("estimates", {})), None)

    def weight(g: dict) -> float:
        est = (g.get("estimates") or {}).get(first_hw) if first_hw else None
        return summary_weight(g["flops"], est["latency_s"] if est else None)

    known = [g for g in d["groups"] if g["flops"] is not None]
    ranked = sorted(known, key=weight, reverse=True)[:top]
    # totals: `d` may hold only the rows shown (`analysis_to_dict(top_groups=)`)
    table = Table(title=f"Most expensive fused groups (top {len(ranked)} of "
                        f"{d['totals']['groups']})", title_justify="left")
    columns = ["#", "pattern", "first node", "MACs", "FLOPs", "share", "bytes"]
    if first_hw:
        columns += [f"est. {plain(first_hw, 20)}", "bound"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("pattern", "first node", "bound")
                         else "right")
    total_flops = d["totals"]["flops"] or 1
    for g in ranked:
        row = [str(g["id"]), Text(plain(g["pattern"], 40)), Text(plain(g["nodes"][0])),
               si(g["macs"]), si(g["flops"]), f"{100 * g['flops'] / total_flops:.1f}%",
               binary(g["bytes_read"] + g["bytes_written"])]
        if first_hw:
            est = (g.get("estimates") or {}).get(first_hw)
            row += [seconds(est["latency_s"]), est["bound"]] if est else ["unknown", ""]
        table.add_row(*row)
    console.print(table)


def _label(hw: str, calibrated: bool) -> Text:
    return Text(plain(hw, 30)) + Text("" if calibrated else " (uncalibrated)", style="dim")


def _estimates_table(d: dict, console: Console) -> None:
    table = Table(title="Estimates (roofline per fused group, summed)", title_justify="left")
    for col in ("hardware", "precision", "latency", "energy", "complete"):
        table.add_column(col, justify="left" if col in ("hardware", "precision") else "right")
    for hw, e in d["estimates"].items():
        table.add_row(_label(hw, e["calibrated"]), e["precision"], seconds(e["latency_s"]),
                      f"{e['energy_j']:.3g} J", "yes" if e["complete"] else "no")
    console.print(table)


def _sweep_table(rows: list[dict], console: Console) -> None:
    first = rows[0]["hardware"]
    table = Table(title=f"Sweep (speedup and energy efficiency versus {plain(first, 30)})",
                  title_justify="left")
    for col in ("batch", "precision", "hardware", "latency", "throughput", "energy",
                "speedup", "energy eff."):
        table.add_column(col, justify="left" if col in ("precision", "hardware") else "right")
    for r in rows:
        table.add_row(str(r["batch"]), r["precision"], _label(r["hardware"], r["calibrated"]),
                      seconds(r["latency_s"]),
                      f"{r['throughput_per_s']:.4g}/s" if r["throughput_per_s"] else "-",
                      f"{r['energy_j']:.3g} J",
                      f"{r['speedup']:.3g}x" if r["speedup"] else "-",
                      f"{r['energy_efficiency']:.3g}x" if r["energy_efficiency"] else "-")
    console.print(table)


def _whatif(w: dict, console: Console) -> None:
    console.print(Text("What if", style="bold"))
    if "subgraph" in w:
        s = w["subgraph"]
        share = f" ({100 * s['share_of_flops']:.1f}% of the model)" if s["share_of_flops"] else ""
        console.print(Text(f"  subgraph {plain(s['from'])} → {plain(s['to'])}: "
                           f"{len(s['nodes'])} nodes, {si(s['macs'])} MACs, "
                           f"{si(s['flops'])} FLOPs{share}"))
    if "cached_prefix" in w:
        c = w["cached_prefix"]
        plus = (f" + {plain(c['plus_model'])} {si(c['plus_flops'])} FLOPs"
                if "plus_model" in c else "")
        console.print(Text(
            f"  cached until {plain(c['cached_until'])}: {c['prefix_nodes']} nodes not run, "
            f"{len(c['cached_tensors'])} tensor(s) read back ({binary(c['cache_read_bytes'])})"))
        console.print(Text(f"  FLOPs {si(c['flops_before'])} → {si(c['flops_after'])}{plus}: "
                           f"saves {si(c['flops_saved'])} ({100 * c['saved_share']:.1f}%)"))
    if "plus" in w:
        p = w["plus"]
        console.print(Text(f"  plus {plain(p['model'])}: {si(p['flops'])} FLOPs, together "
                           f"{si(p['flops_total'])}"))


def _llm(llm: dict, console: Console) -> None:
    decodes = llm.get("context_sweep") or [llm["decode"]]
    m = decodes[0]["memory"]
    console.print(Text(
        f"LLM: {llm['layers']} layers, {llm['kv_heads']} KV heads x {llm['head_dim']}, KV cache "
        f"{binary(llm['kv_cache_bytes_per_token'])}/token{cross_cache_text(llm)}, "
        f"batch {llm['batch']}, weights {binary(m['weights_bytes'])}", style="bold"))
    table = Table(title_justify="left", title=f"prefill {llm['prefill']['prompt_len']} tokens, "
                  "one decode step at each context; memory = weights + KV + activations")
    for col in ("phase", "hardware", "latency", "tokens/s", "KV cache", "memory"):
        table.add_column(col, justify="left" if col in ("phase", "hardware") else "right",
                         no_wrap=col == "phase")
    for hw, e in llm["prefill"]["estimates"].items():
        table.add_row(_phase("prefill", llm["prefill"]), _label(hw, e["calibrated"]),
                      seconds(e["latency_s"]), _rate(e["tokens_per_s"]), "", "")
    for d in decodes:
        m = d["memory"]
        for hw, e in d["estimates"].items() or [("-", None)]:
            table.add_row(_phase(f"decode @{d['context_len']}", d),
                          _label(hw, e["calibrated"]) if e else Text("-"),
                          seconds(e["latency_s"]) if e else "-",
                          _rate(e["tokens_per_s"]) if e else "-",
                          binary(m["kv_cache_bytes"]), binary(m["total_bytes"]))
    console.print(table)


def cross_cache_text(llm: dict) -> str:
    """An encoder-decoder's cross-attention cache: held at the encoder's length."""
    c = llm.get("cross_attention")
    return (f" + cross-attention {binary(c['kv_cache_bytes_per_encoder_token'])}/encoder token x "
            f"{c['encoder_len']}" if c else "")


def _phase(name: str, phase: dict) -> Text:
    """A phase's label, marked when some of its costs are unknown (its figures too low)."""
    return Text(name) if phase.get("complete", True) else Text(f"{name} (incomplete)",
                                                               style="yellow")


def _rate(value: float | None) -> str:
    return f"{value:,.0f}" if value else "-"


def _shape(shape: object) -> str:
    if shape is None:
        return "?"
    return "x".join("?" if d is None else str(d) for d in shape)  # type: ignore[attr-defined]


def render(d: dict, console: Console, *, top: int = 10) -> None:
    """The summary of an analysis dict (`AnalysisResult.to_dict()`, measurements merged)."""
    model, totals = d["model"], d["totals"]
    console.print(Text.assemble(("onnxlens ", "bold cyan"), (plain(model["name"]), "bold"),
                                f"  opset {model['opset']}",
                                f"  {totals['nodes']} nodes, {totals['groups']} fused groups"))
    io = Table.grid(padding=(0, 2))
    for kind in ("inputs", "outputs"):
        for t in model[kind]:
            io.add_row(kind[:-1], Text(plain(t["name"])), t["dtype"], _shape(t["shape"]))
    console.print(io)

    fpm = d["conventions"]["flops_per_mac"]
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

    _groups_table(d, console, top)
    if d.get("estimates"):
        _estimates_table(d, console)
    if d.get("sweep"):
        _sweep_table(d["sweep"], console)
    if d.get("whatif"):
        _whatif(d["whatif"], console)
    if d.get("llm"):
        _llm(d["llm"], console)

    if d["unsupported_ops"]:
        ops = ", ".join(f"{plain(op)} x{len(n)}" for op, n in d["unsupported_ops"].items())
        console.print(Text("unsupported ops (cost unknown): ", style="bold yellow") + Text(ops))
    for w in d["warnings"]:
        console.print(Text("warning: ", style="yellow") + Text(plain(w, 300)))


def _peak(tflops: float) -> str:
    """A peak in at most 5 characters: 0.193, 7.37, 66.9, 989, 1979."""
    return f"{tflops:.0f}" if tflops >= 100 else f"{tflops:.3g}"


def render_hardware(profiles: list, console: Console) -> None:
    """`onnxlens hardware`: one row per profile, the units in the title so that the table fits
    80 columns; then each profile's device and the sources of its numbers."""
    table = Table(title="Hardware profiles: peaks in TFLOP/s, main memory in GB/s, kernel "
                  "launch in µs, TDP in W", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in ("key", "kind", "fp32", "fp16", "int8", "memory", "launch", "TDP",
                "calibrated"):
        table.add_column(col, justify="left" if col in ("key", "kind") else "right",
                         no_wrap=True)
    for hw in profiles:
        peaks = hw.peak_tflops
        table.add_row(plain(hw.key, 30), hw.kind,
                      *(_peak(peaks[p]) if p in peaks else "-" for p in ("fp32", "fp16", "int8")),
                      f"{hw.main_memory.bandwidth_gbps:.4g}", f"{hw.kernel_launch_us:.3g}",
                      f"{hw.tdp_w:.4g}", "yes" if hw.calibrated else "no")
    console.print(table)
    for hw in profiles:
        console.print(Text(f"{plain(hw.key, 30)}: ", style="bold")
                      + Text(f"{plain(hw.name, 80)}. {plain(hw.source, 2000)}"))
