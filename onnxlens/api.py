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
    from .analyzer.llm import KvLayout

Source = str | os.PathLike | bytes | onnx.ModelProto


def analyze(
    source: Source,
    *,
    batch: int | Sequence[int] | None = None,
    hardware: Sequence[str] = (),
    precision: str | Sequence[str] | None = None,
    threads: int | None = None,
    runtime: str = "ort-cpu",
    cached_until: str | None = None,
    from_node: str | None = None,
    to_node: str | None = None,
    plus: Source | None = None,
    prompt_len: int | None = None,
    context_len: int | Sequence[int] | None = None,
    **options: Any,
) -> AnalysisResult:
    """Analyze a model; see README "Using it".

    `batch` may be a list: the result is the analysis at the first, and `result.sweep` holds
    one row per (batch, precision, hardware). `hardware` names profiles (`host`, `h100`, a
    .toml path); `threads` is the thread count the `host` profile assumes (its calibration),
    `runtime` the runtime it was calibrated on and whose kernels it costs (ort-cpu or
    native-cpu).
    `cached_until` / `from_node`+`to_node` / `plus` fill `result.whatif`. `max_nesting_depth`,
    `max_window_value` and `max_expanded_nodes` replace those of `limits`
    (`analyzer.validate.Limits`). Other options go to `onnxlens.analyzer.analysis.analyze`
    (input_shapes, strict, flops_per_mac, ...). A decoder with a KV cache also gets
    `result.llm` (`analyzer.llm`): its cache layout, and prefill at `prompt_len` and decode at
    each `context_len` (defaults 512 and 2048), analyzed and estimated on `hardware`.
    """
    options = _with_limits(options)
    batches = _as_list(batch)
    precisions: list[str | None] = _as_list(precision) or [None]  # None: the graph's own
    result = _analyze_model(source, batch=batches[0] if batches else None, **options)
    if result.dims_added:  # a KV cache's head size: the other analyses need not look again
        options = options | {"dims": (options.get("dims") or {}) | result.dims_added}
    targets = _targets(hardware, threads, runtime)
    for hw, efficiency in targets:
        result.add_estimate(hw, precisions[0], efficiency)
    if targets and (len(batches) > 1 or len(precisions) > 1 or len(targets) > 1):
        from .analyzer.sweep import sweep_rows

        primary = batches[0] if batches else _model_batch(result)

        def analyze_at(b: int) -> AnalysisResult:
            return result if b == primary else _analyze_model(source, batch=b, **options)

        result.sweep = sweep_rows(analyze_at, batches or [primary], precisions, targets)
    layout = _kv_layout(result, prompt_len or context_len, options.get("dims"))
    if layout is not None:
        contexts = _as_list(context_len) or [DEFAULT_CONTEXT_LEN]
        if prompt_len and (short := [c for c in contexts if c < prompt_len]):
            raise UsageError(f"--context-len {short[0]} is shorter than --prompt-len "
                             f"{prompt_len}: decode steps follow the prompt")
        result.llm = _llm_view(source, result, layout, targets, precisions[0],
                               batches[0] if batches else 1,
                               prompt_len or min(DEFAULT_PROMPT_LEN, *contexts), contexts,
                               options | ({"batch": batches[0]} if batches else {}))
    elif prompt_len or context_len:
        raise UsageError("--prompt-len / --context-len: the model has no KV-cache inputs "
                         "(past_key_values.N.key/value or past_key/past_value)")
    if cached_until or from_node or to_node or plus is not None:
        result.whatif = _whatif(result, targets, precisions[0], cached_until, from_node, to_node,
                                plus, options)
    return result


DEFAULT_PROMPT_LEN, DEFAULT_CONTEXT_LEN = 512, 2048


def _kv_layout(result: AnalysisResult, asked: object, dims: dict[str, int] | None
               ) -> KvLayout | None:
    """The cache layout of the analyzed inputs. When `--dim` pinned a cache dim the phases
    need named, there is no LLM view (a warning says so) unless one was asked for."""
    from .analyzer.llm import kv_layout, unpinned_encoder_len

    try:
        layout = kv_layout(result.declared_inputs, result.graph)
    except UsageError as e:
        if asked or not dims:
            raise
        result.warnings.append(f"no LLM view: --dim pins a KV-cache dim the prefill and decode "
                               f"phases pin themselves ({e})")
        return None
    if layout is not None and (encoder := unpinned_encoder_len(layout, dims or {})):
        why = (f"the cross-attention cache's length is the encoder's: pin it with --dim "
               f"{encoder}=N")
        if asked:
            raise UsageError(f"--prompt-len / --context-len: {why}")
        result.warnings.append(f"no LLM view: {why}")
        return None
    return layout


def _llm_view(source: Source, result: AnalysisResult, layout: KvLayout,
              targets: list[tuple[HardwareProfile, Efficiency | None]], precision: str | None,
              batch: int, prompt_len: int, context_lens: list[int], options: dict[str, Any]
              ) -> dict[str, Any]:
    """Prefill and decode of a KV-cache decoder, each analyzed at its pinned dims (`--dim`'s
    path: the caller's dims, every other named dim at `batch`, then the phase's)."""
    from .analyzer.llm import decode_dims, memory_at_context, prefill_dims, present_rows

    batch = layout.batch or batch  # a batch dim --dim pinned: the MACs follow it, so do tokens
    inputs = result.declared_inputs
    if any(t.shape is None or None in t.shape for t in inputs):
        raise UsageError("LLM view: an input's shape is unknown; pin it with --input-shape")
    # The user's --dim last, so it wins even where an input still names it
    others = {d: batch for t in inputs for d in t.shape or () if isinstance(d, str)} | (
        options.get("dims") or {})

    def phase(dims: dict[str, int], tokens: int) -> tuple[dict[str, Any], AnalysisResult]:
        r = _analyze_model(source, **(options | {"dims": others | dims, "symbolic": False}))
        if not r.totals["complete"]:
            at = ", ".join(f"{k}={v}" for k, v in dims.items())
            unknown = next((w for w in r.warnings if w.startswith("cost unknown")), "")
            result.warnings.append(f"LLM view at {at}: incomplete, its figures cover the known "
                                   f"part only ({unknown or 'analyze at these dims says why'})")
        est = {hw.key: r.estimate(hw, precision, eff) for hw, eff in targets}
        return {"dims": dims, "macs": r.totals["macs"], "flops": r.totals["flops"],
                "complete": r.totals["complete"],
                "activation_peak_bytes": r.activation_peak_bytes,
                "estimates": {k: {"latency_s": e.latency_s, "calibrated": e.calibrated,
                                  "tokens_per_s": batch * tokens / e.latency_s
                                  if e.latency_s > 0 else None}
                              for k, e in est.items()}}, r

    cross_len = layout.cross.encoder_len if layout.cross else 0
    encoder_len = others[cross_len] if isinstance(cross_len, str) else cross_len
    if layout.new_dim is None and layout.fixed_new is not None and layout.fixed_new != prompt_len:
        # An export traced at one new token (optimum's decoder-with-past): its "prefill" is
        # that step on an empty cache, and its tokens/s counts what it took.
        result.warnings.append(f"LLM view: the model takes {layout.fixed_new} new token(s) a "
                               f"step (fixed by its export), so prefill is {layout.fixed_new}, "
                               f"not {prompt_len}")
        prompt_len = layout.fixed_new
    prefill, pre = phase(prefill_dims(layout, prompt_len), prompt_len)
    prefill["prompt_len"] = prompt_len
    decodes = []
    for c in context_lens:
        row, r = phase(decode_dims(layout, c), 1)
        peaks = [p for p in (pre.activation_peak_bytes, r.activation_peak_bytes)
                 if p is not None]
        row["context_len"] = c
        row["memory"] = memory_at_context(layout, weight_bytes=r.total.param_bytes,
                                          batch=batch, context_len=c,
                                          activation_bytes=max(peaks) if peaks else None,
                                          encoder_len=encoder_len,
                                          held=present_rows(layout, r.model.graph_outputs))
        decodes.append(row)
    return {**layout.as_dict(), "batch": batch, "precision": precision or result.default_precision,
            "prefill": prefill,
            "decode": decodes[0], **({"context_sweep": decodes} if len(decodes) > 1 else {})}


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


def _targets(hardware: Sequence[str], threads: int | None, runtime: str = "ort-cpu"
             ) -> list[tuple[HardwareProfile, Efficiency | None]]:
    if not hardware:
        return []
    from .analyzer.calibration import resolve_target

    if runtime != "ort-cpu":
        from . import backends  # noqa: F401  (registers the backends' kernel models)
    return [resolve_target(name, threads, runtime) for name in dict.fromkeys(hardware)]


def _model_batch(result: AnalysisResult) -> int:
    """The first dim of the first input, as analyzed (1 when it is not a number)."""
    shape = result.model.graph_inputs[0].shape if result.model.graph_inputs else None
    return shape[0] if shape and isinstance(shape[0], int) else 1


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, int | str) else list(value)


def _whatif(result: AnalysisResult, targets: list[tuple[HardwareProfile, Efficiency | None]],
            precision: str | None, cached_until: str | None, from_node: str | None,
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
