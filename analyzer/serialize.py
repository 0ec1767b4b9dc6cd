"""Serializations of an analysis that are part of its contract: the JSON dict and CSV rows.

The JSON schema is "onnxlens/1" (README, "JSON output"). CSV cells that a spreadsheet would run
as a formula are neutralized.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analysis import AnalysisResult
    from .fusion import Group
    from .graph import ModelGraph

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _put_cost_fields(row: dict[str, Any], nc: Any, flops_per_mac: int) -> None:
    """A node's or group's cost columns, stored into its row (a dict of its own, merged into
    the row, took a fifth of the 50,000 node rows' time)."""
    c = nc.cost
    if c is None:
        row["macs"] = row["flops"] = row["transcendental"] = row["bytes_read"] = None
        row["bytes_written"] = row["params"] = None
        row["unknown_reason"] = nc.unknown_reason
        return
    row["macs"] = c.macs
    row["flops"] = c.flops(flops_per_mac)
    row["transcendental"] = c.transcendental
    row["bytes_read"] = c.bytes_read
    row["bytes_written"] = c.bytes_written
    row["params"] = c.params


def summary_weight(flops: int | None, latency_s: float | None) -> float:
    """What ranks a group in the terminal summary: its estimated time on the first profile,
    else its FLOPs."""
    return latency_s if latency_s is not None else (flops or 0)


def summary_groups(result: AnalysisResult, top: int) -> list[Group]:
    """The `top` groups the terminal summary lists (`summary_weight`, groups of unknown cost
    left out, ties in model order), in model order."""
    first = next(iter(result.estimates.values()), None)
    costs, fpm = result.group_costs, result.flops_per_mac

    def weight(g: Group) -> float:
        est = first.groups[g.id] if first else None
        return summary_weight(costs[g.id].cost.flops(fpm), est.latency_s if est else None)

    known = [g for g in result.groups if costs[g.id].cost is not None]
    shown = {g.id for g in sorted(known, key=weight, reverse=True)[:top]}
    return [g for g in result.groups if g.id in shown]


def analysis_to_dict(result: AnalysisResult, *, nodes: bool = True,
                     top_groups: int | None = None) -> dict[str, Any]:
    """The JSON contract; without `nodes` the per-node rows and the edges between groups are
    left out (`"nodes": []`, `"group_edges": []`), for a caller that only shows totals and
    groups (the terminal summary of a 50,000-node model). With `top_groups`, `"groups"` holds
    only the rows the summary lists (`summary_groups`; `totals.groups` still counts them all):
    a 50,000-node chain has 33,332 rows, the summary shows 10."""
    from .analysis import SCHEMA, describe_tensor

    model, mg = result.model, result.graph
    group_of = {key: g.id for g in result.groups for key in g.nodes} if nodes else {}
    infos, node_costs, group_costs, fpm = (mg.infos, result.node_costs, result.group_costs,
                                           result.flops_per_mac)
    node_rows = []
    for key in mg.order if nodes else ():
        info = infos[key]
        row = {"name": key, "op_type": info.op_type, "group": group_of[key]}
        _put_cost_fields(row, node_costs[key], fpm)
        row["output_shapes"] = [list(t.shape) if t.shape is not None else None
                                for t in info.outputs]
        node_rows.append(row)
    groups = []
    shown = result.groups if top_groups is None else summary_groups(result, top_groups)
    precisions = (result.group_precisions if top_groups is None
                  else {g.id: result.precision_of_group(g) for g in shown})
    for g in shown:  # a loop of plain stores: 33,000 rows on a 50,000-node chain
        row = {"id": g.id, "pattern": g.pattern, "nodes": list(g.nodes)}
        _put_cost_fields(row, group_costs[g.id], fpm)
        row["precision"] = precisions[g.id]
        row["output_shapes"] = [list(t.shape) if t.shape is not None else None
                                for t in infos[g.nodes[-1]].outputs]
        if result.estimates:
            row["estimates"] = {hw: _group_estimate(est.groups[g.id])
                                for hw, est in result.estimates.items()}
        groups.append(row)
    return {
        "schema": SCHEMA,
        "model": {
            "name": model.name,
            "path": str(model.path) if model.path else None,
            "opset": model.opset,
            "inputs": [describe_tensor(t) for t in model.graph_inputs],
            "outputs": [describe_tensor(t) for t in model.graph_outputs],
            "metadata": {p.key: p.value for p in model.proto.metadata_props},
        },
        "conventions": {"flops_per_mac": result.flops_per_mac},
        "totals": result.totals,
        **({"symbolic": {"dims": result.symbols, "totals": result.formulas}}
           if result.symbols else {}),
        "nodes": node_rows,
        "groups": groups,
        **({"estimates": {hw: {"latency_s": est.latency_s, "energy_j": est.energy_j,
                               "calibrated": est.calibrated, "precision": est.precision,
                               "complete": est.complete}
                          for hw, est in result.estimates.items()}}
           if result.estimates else {}),
        **({"hardware": {hw: _profile_summary(est, result.macs_by_dtype)
                         for hw, est in result.estimates.items()}}
           if result.estimates else {}),
        "group_edges": _group_edges(mg, group_of) if nodes else [],
        **({"sweep": result.sweep} if result.sweep else {}),
        **({"whatif": result.whatif} if result.whatif else {}),
        **({"llm": result.llm} if result.llm else {}),
        "unsupported_ops": {op: names for op, names in result.unsupported_ops.items()},
        "warnings": list(result.warnings),
    }


def _group_edges(mg: ModelGraph, group_of: dict[str, int]) -> list[tuple[int, int]]:
    """Group to group, where a tensor made in one is read in another (from the tensors'
    producers and readers: the node-to-node edges need not be built)."""
    pairs = set()
    producer = mg.producer
    for name, users in mg.consumers.items():
        src = producer.get(name)
        if src is None:
            continue
        a = group_of[src]
        for user in users:
            b = group_of[user]
            if b != a:
                pairs.add((a, b))
    return sorted(pairs)


def _profile_summary(est: Any, macs_by_dtype: dict[str, int]) -> dict[str, Any]:
    """What a reader (or the HTML roofline) needs of the profile an estimate used; at the
    graph's own precision, the peak is that of the precision doing most MACs."""
    from .hardware import GRAPH, stored

    hw = est.profile
    peak = est.precision if est.precision != GRAPH else stored(
        next(iter(macs_by_dtype), "float32")).peak
    return {"name": hw.name, "kind": hw.kind, "calibrated": hw.calibrated,
            "precision": est.precision, "peak_flops": hw.peak_flops(peak),
            "memory": [{"name": m.name, "size_bytes": m.size_bytes,
                        "bandwidth_gbps": m.bandwidth_gbps} for m in hw.memory],
            "kernel_launch_us": hw.kernel_launch_us, "source": hw.source}


def _group_estimate(e: Any) -> dict[str, Any] | None:
    if e is None:
        return None
    return {"latency_s": e.latency_s, "energy_j": e.energy_j, "bound": str(e.bound),
            "bound_kind": e.bound.kind,
            "intensity": e.intensity if e.intensity != float("inf") else None,
            "level": e.level}


def write_json(result: AnalysisResult, path: str | os.PathLike | None = None) -> str:
    return dump_json(analysis_to_dict(result), path)


# Output up to this size is indented (2 spaces) for people to read; larger output is compact.
INDENT_MAX_BYTES = 1 << 20


def dump_json(d: dict[str, Any], path: str | os.PathLike | None = None) -> str:
    """An analysis dict (measurements merged or not) as JSON text, written to `path` if given.

    orjson writes it (0.04 s for the 24 MB of a 50,000-node chain, where the stdlib's indenting
    encoder, pure Python, took 1.4 s): compact, then indented when that is under
    `INDENT_MAX_BYTES`. What orjson refuses (an int past 64 bits, text with a lone surrogate)
    goes through the stdlib's encoder instead; parsed, both give the same document (a NaN or
    infinity, which no analysis field holds, would be null in orjson's strict JSON).
    """
    data = encode_json(d)
    if path is not None:
        Path(path).write_bytes(data + b"\n")
    return data.decode("utf-8")


def encode_json(d: Any) -> bytes:
    """`d` as UTF-8 JSON (see `dump_json`)."""
    import orjson

    try:
        data = orjson.dumps(d, option=orjson.OPT_NON_STR_KEYS)
        if len(data) <= INDENT_MAX_BYTES:
            data = orjson.dumps(d, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2)
        return data
    except orjson.JSONEncodeError:  # ASCII: a lone surrogate escaped
        text = json.dumps(d)
        if len(text) <= INDENT_MAX_BYTES:
            text = json.dumps(d, indent=2)
        return text.encode("ascii")


def safe_cell(value: Any) -> Any:
    """Quote a text cell that a spreadsheet would evaluate (CSV formula injection)."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    if isinstance(value, list):
        return safe_cell(" ".join(str(v) for v in value))
    return value


def write_csv(result: AnalysisResult, path: str | os.PathLike | None = None, *,
              level: str = "nodes") -> str:
    if level not in ("nodes", "groups"):
        raise ValueError(f"level must be 'nodes' or 'groups', not {level!r}")
    rows = result.to_dict()[level]
    columns = [c for c in rows[0] if c != "unknown_reason"] + ["unknown_reason"] if rows else []
    buffer = io.StringIO()
    # CRLF (RFC 4180): the writer quotes a cell holding any character of the line terminator,
    # so a name with a bare "\r" cannot end the row early and start a row of its own.
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore",
                            lineterminator="\r\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: safe_cell(row.get(c)) for c in columns})
    text = buffer.getvalue()
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text
