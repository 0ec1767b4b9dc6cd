"""The Python API behind `onnxlens.analyze` and the `analyze` command: one analysis plus, on
request, estimates on hardware profiles, batch/precision sweeps and what-if scenarios."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from .analyzer.analysis import AnalysisResult
from .analyzer.analysis import analyze as _analyze_model
from .analyzer.errors import UsageError

if TYPE_CHECKING:  # imported when a profile is asked for
    from .analyzer.estimate import Efficiency
    from .analyzer.hardware import HardwareProfile

Source = str | os.PathLike | bytes | onnx.ModelProto


def analyze(
    source: Source,
    *,
    batch: int | Sequence[int] | None = None,
    hardware: Sequence[str] = (),
    precision: str | Sequence[str] = "fp32",
    threads: int | None = None,
    cached_until: str | None = None,
    from_node: str | None = None,
    to_node: str | None = None,
    plus: Source | None = None,
    **options: Any,
) -> AnalysisResult:
    """Analyze a model; see README "Using it".

    `batch` may be a list: the result is the analysis at the first, and `result.sweep` holds
    one row per (batch, precision, hardware). `hardware` names profiles (`host`, `h100`, a
    .toml path); `threads` is the thread count the `host` profile assumes (its calibration).
    `cached_until` / `from_node`+`to_node` / `plus` fill `result.whatif`. `max_nesting_depth`,
    `max_window_value` and `max_expanded_nodes` replace those of `limits`
    (`analyzer.validate.Limits`). Other options go to `onnxlens.analyzer.analysis.analyze`
    (input_shapes, strict, flops_per_mac, ...).
    """
    options = _with_limits(options)
    batches = _as_list(batch)
    precisions = _as_list(precision) or ["fp32"]
    result = _analyze_model(source, batch=batches[0] if batches else None, **options)
    targets = _targets(hardware, threads)
    for hw, efficiency in targets:
        result.add_estimate(hw, precisions[0], efficiency)
    if targets and (len(batches) > 1 or len(precisions) > 1 or len(targets) > 1):
        from .analyzer.sweep import sweep_rows

        primary = batches[0] if batches else _model_batch(result)

        def analyze_at(b: int) -> AnalysisResult:
            return result if b == primary else _analyze_model(source, batch=b, **options)

        result.sweep = sweep_rows(analyze_at, batches or [primary], precisions, targets)
    if cached_until or from_node or to_node or plus is not None:
        result.whatif = _whatif(result, targets, precisions[0], cached_until, from_node, to_node,
                                plus, options)
    return result


def _with_limits(options: dict[str, Any]) -> dict[str, Any]:
    """`max_nesting_depth=` / `max_window_value=` / `max_expanded_nodes=` folded into
    `limits=` (None: unchanged)."""
    changes = {k: options.pop(k) for k in ("max_nesting_depth", "max_window_value",
                                           "max_expanded_nodes") if k in options}
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes:
        from dataclasses import replace

        from .analyzer.validate import DEFAULT_LIMITS

        options["limits"] = replace(options.get("limits", DEFAULT_LIMITS), **changes)
    return options


def _targets(hardware: Sequence[str], threads: int | None
             ) -> list[tuple[HardwareProfile, Efficiency | None]]:
    if not hardware:
        return []
    from .analyzer.estimate import resolve_target

    return [resolve_target(name, threads) for name in dict.fromkeys(hardware)]


def _model_batch(result: AnalysisResult) -> int:
    """The first dim of the first input, as analyzed (1 when it is not a number)."""
    shape = result.model.graph_inputs[0].shape if result.model.graph_inputs else None
    return shape[0] if shape and isinstance(shape[0], int) else 1


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, int | str) else list(value)


def _whatif(result: AnalysisResult, targets: list[tuple[HardwareProfile, Efficiency | None]],
            precision: str, cached_until: str | None, from_node: str | None,
            to_node: str | None, plus: Source | None, options: dict[str, Any]) -> dict[str, Any]:
    from .analyzer.whatif import caching_scenario, subgraph, sum_costs

    mg, fpm = result.graph, result.flops_per_mac
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    out: dict[str, Any] = {}
    if from_node or to_node:
        if not (from_node and to_node):
            raise UsageError("--from and --to go together")
        nodes = subgraph(mg, from_node, to_node)
        cost = sum_costs(costs, nodes)
        out["subgraph"] = {"from": from_node, "to": to_node, "nodes": nodes,
                           "macs": cost.macs if cost else None,
                           "flops": cost.flops(fpm) if cost else None,
                           "share_of_flops": cost.flops(fpm) / result.totals["flops"]
                           if cost and result.totals["flops"] else None}
    other = _analyze_model(plus, **options) if plus is not None else None
    if cached_until:
        scenario = caching_scenario(mg, costs, cached_until)
        row = scenario.as_dict(fpm)
        if other is not None:
            row["plus_model"] = other.model.name
            row["plus_flops"] = other.totals["flops"]
            row["flops_after"] += other.totals["flops"]
            row["flops_saved"] = row["flops_before"] - row["flops_after"]
            row["saved_share"] = row["flops_saved"] / row["flops_before"]
        out["cached_prefix"] = row
    elif other is not None:
        out["plus"] = {"model": other.model.name, "flops": other.totals["flops"],
                       "flops_total": result.totals["flops"] + other.totals["flops"]}
    if targets and other is not None:
        out["plus_estimates"] = {hw.key: other.estimate(hw, precision, eff).latency_s
                                 for hw, eff in targets}
    return out


def resolve_model(spec: str, *, batch: int, image_size: int | None, keep_batchnorm: bool,
                  opset: int | None) -> Path:
    """An existing file is used as is; a model name is exported once and cached."""
    path = Path(spec)
    if path.exists() or spec.endswith(".onnx") or "/" in spec or "\\" in spec:
        return path  # the loader reports a missing or unreadable file
    from .exporters.torch_export import cached_export

    return cached_export(spec, batch=batch, image_size=image_size,
                         keep_batchnorm=keep_batchnorm, opset=opset)
