"""A comparison's measured timeline in Chrome's Trace Event Format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open.

The format (catapult's "Trace Event Format" document): a JSON object whose `traceEvents` is a
list of events; a complete event has `"ph": "X"`, a `name`, a category `cat`, a start `ts` and
a duration `dur` in microseconds (fractions allowed), the `pid` and `tid` of the track it is
drawn on and free-form `args`; metadata events (`"ph": "M"`, `process_name` / `thread_name`)
name the process and its tracks. `displayTimeUnit` only sets the viewer's unit.

One process (the model), and per backend with per-group times (`MeasuredTimes`):

- `<backend>: groups`: one event per fused group, in execution order, laid end to end from 0.
  Its time is the group's share of the measured (unprofiled) median latency
  (`profile_map.map_profile`): the track is a typical run rebuilt from its parts, not one
  recorded run, and it ends at the latency less the share of kernels with no ONNX
  counterpart.
- `<backend>: kernels`: one event per kernel of the profiled runs (ORT's kernels; native-cpu's
  steps), in the order they ran, at the same scale (all kernels add up to the latency).

A backend with no per-kernel profile (torch) has no track. Model-derived strings (node and
kernel names) are JSON string data, escaped by the encoder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..analyzer.analysis import AnalysisResult
from ..analyzer.estimate import ModelEstimate
from ..analyzer.serialize import encode_json
from .compare import Comparison
from .profile_map import MeasuredTimes

PID = 1
US_PER_S = 1e6
# (event name, seconds, args)
Span = tuple[str, float, dict[str, Any]]


def chrome_trace(comparison: Comparison) -> dict[str, Any]:
    """The trace document of `comparison`: two tracks per backend that has per-group times."""
    events: list[dict[str, Any]] = [_metadata("process_name", 0, comparison.analysis.model.name)]
    tid = 0
    for name, run in comparison.runs.items():
        if run.times is None:
            continue
        for track, cat, spans in ((f"{name}: groups", "group",
                                   _group_spans(comparison.analysis, run.times, run.estimate)),
                                  (f"{name}: kernels", "kernel", _kernel_spans(run.times))):
            tid += 1
            events.append(_metadata("thread_name", tid, track))
            events.extend(_end_to_end(spans, cat, tid))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(comparison: Comparison, path: str | os.PathLike) -> int:
    """Write `comparison`'s trace to `path`; the number of complete events written."""
    doc = chrome_trace(comparison)
    Path(path).write_bytes(encode_json(doc) + b"\n")
    return sum(1 for e in doc["traceEvents"] if e["ph"] == "X")


def _group_spans(analysis: AnalysisResult, times: MeasuredTimes,
                 estimate: ModelEstimate | None) -> Iterable[Span]:
    """Each fused group in execution order: '<pattern> <first node>', its measured seconds,
    and the estimate of the backend's hardware profile beside it where there is one."""
    for g in analysis.groups:
        cost = analysis.group_costs[g.id].cost
        args: dict[str, Any] = {"group": g.id, "pattern": g.pattern, "nodes": list(g.nodes),
                                "macs": cost.macs if cost is not None else None,
                                "measured_s": times.group_s[g.id]}
        est = estimate.groups.get(g.id) if estimate is not None else None
        if estimate is not None and est is not None:
            args |= {"estimated_s": est.latency_s, "hardware": estimate.hardware}
        yield f"{g.pattern} {g.nodes[0]}", times.group_s[g.id], args


def _kernel_spans(times: MeasuredTimes) -> Iterable[Span]:
    """Each kernel in the order it ran, scaled as `map_profile` scales them (to the latency)."""
    profiled = sum(k.duration_s for k in times.kernels)
    scale = times.latency_s / profiled if profiled else 0.0
    for k in times.kernels:
        yield k.name, k.duration_s * scale, {"op_type": k.op_type, "nodes": list(k.nodes),
                                             "profiled_s": k.duration_s}


def _end_to_end(spans: Iterable[Span], cat: str, tid: int) -> list[dict[str, Any]]:
    """Complete events, each starting where the one before ends (ts, dur in microseconds)."""
    events, start = [], 0.0
    for name, seconds, args in spans:
        dur = seconds * US_PER_S
        events.append({"name": name, "cat": cat, "ph": "X", "ts": start, "dur": dur,
                       "pid": PID, "tid": tid, "args": args})
        start += dur
    return events


def _metadata(kind: str, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}}
