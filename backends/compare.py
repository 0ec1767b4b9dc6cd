"""Run one model on several backends: latency, throughput, memory, per-group times mapped to
our fusion groups, the estimate beside the measurement, and numerical agreement.

`compare` is what `onnxlens compare` and `analyze --measure` call; `Comparison.to_dict` is its
JSON, and `attach_measurements` merges that into the analysis JSON (`measurements`, per-group
`measured`, `agreement`).

Per backend, at the first batch of `batches` (the primary one): outputs on the agreement
inputs, latency (warm-up, then `runs` timed runs), a profiled run mapped to our groups
(`profile_map`), peak memory in a fresh process (`memory`), and the estimate of the matching
hardware profile (ort-cpu and torch: `host`; ort-cuda: the GPU profile the caller names).
Latency and throughput (samples per second = batch / median latency) at every batch. The first
backend named is the reference of the dump-diff; agreement is reported for every pair.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analyzer.analysis import AnalysisResult, analyze
from ..analyzer.errors import OnnxLensError, UsageError
from ..analyzer.estimate import ModelEstimate
from ..analyzer.validate import DEFAULT_LIMITS, Limits
from .agreement import Agreement, DumpDiff, agreement, dump_diff
from .base import (
    Backend,
    BackendProblem,
    Feeds,
    fixed_batch,
    input_specs,
    latency_dict,
    load_inputs,
    load_proto,
    pin_dims,
    random_inputs,
)
from .memory import peak_memory
from .profile_map import MeasuredTimes, map_profile
from .registry import create, needs_module
from .torch_eager import ModuleFactory
from .values import Timing

SCHEMA = "onnxlens-compare/1"
# Backend -> the hardware profile its measurement is set beside (the caller may add ort-cuda).
DEFAULT_HARDWARE = {"ort-cpu": "host", "native-cpu": "host", "torch": "host"}
# (steps done, steps in all, what runs now)
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class ModelSpec:
    """What to compare: an ONNX file, and for models onnxlens exported the module factory
    (torch backend) and the export at another batch (`--batch` with a fixed-batch model)."""

    path: Path
    torch_factory: ModuleFactory | None = None
    at_batch: Callable[[int], Path] | None = None


@dataclass
class BackendRun:
    name: str
    batch: int  # the primary batch
    description: dict[str, Any]
    latency: dict[int, Timing] = field(default_factory=dict)  # batch -> timing
    times: MeasuredTimes | None = None
    peak_memory_bytes: int | None = None
    estimate: ModelEstimate | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def latency_s(self) -> float:
        return self.latency[self.batch].median_s

    def to_dict(self) -> dict[str, Any]:
        sweep = [{"batch": b, "latency_s": latency_dict(t), "throughput_per_s": b / t.median_s}
                 for b, t in self.latency.items()]
        out: dict[str, Any] = {
            "latency_s": latency_dict(self.latency[self.batch]),
            "batch": self.batch,
            "throughput_per_s": self.batch / self.latency_s,
            "sweep": sweep,
            "peak_memory_bytes": self.peak_memory_bytes,
            "threads": self.description.get("threads"),
            "unmapped_share": self.times.unmapped_share if self.times else None,
            "profile": self.times.to_dict() if self.times else None,
            "estimate": None,
            "backend": self.description,
            "notes": self.notes,
        }
        if self.estimate is not None:
            ratios = {gid: _ratio(e.latency_s if e else None,
                                  self.times.group_s.get(gid) if self.times else None)
                      for gid, e in self.estimate.groups.items()}
            off = sorted((g for g, r in ratios.items() if r), key=lambda g: -_off(ratios[g]))
            out["estimate"] = {"hardware": self.estimate.hardware,
                               "calibrated": self.estimate.calibrated,
                               "latency_s": self.estimate.latency_s,
                               "error_ratio": _ratio(self.estimate.latency_s, self.latency_s),
                               "furthest_off_groups": off[:10]}
        return out


@dataclass
class Comparison:
    analysis: AnalysisResult
    path: Path
    settings: dict[str, Any]
    runs: dict[str, BackendRun]
    unavailable: dict[str, str]  # backend -> one line why it did not run
    agreements: list[Agreement]
    dump_diffs: list[DumpDiff]
    warnings: list[str]

    @property
    def nothing_ran(self) -> bool:
        """No backend the user asked for could run (the CLI then exits non-zero)."""
        return not self.runs

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "model": {"name": self.analysis.model.name, "path": str(self.path)},
            "settings": self.settings,
            "measurements": {n: r.to_dict() for n, r in self.runs.items()},
            "groups": [self._group(g.id, g.pattern, g.nodes) for g in self.analysis.groups],
            "agreement": {a.key: a.to_dict() for a in self.agreements},
            "unavailable": self.unavailable,
            "warnings": self.warnings,
        }
        if self.settings["dump_diff"]:
            out["dump_diff"] = {f"{d.reference} vs {d.candidate}": d.to_dict()
                                for d in self.dump_diffs}
        return out

    def _group(self, gid: int, pattern: str, nodes: tuple[str, ...]) -> dict[str, Any]:
        cost = self.analysis.group_costs[gid].cost
        measured, estimated = {}, {}
        for name, run in self.runs.items():
            seconds = run.times.group_s[gid] if run.times else None
            if seconds is not None:
                measured[name] = {"latency_s": seconds, "share": seconds / run.latency_s}
            est = run.estimate.groups.get(gid) if run.estimate else None
            if run.estimate is not None and est is not None:
                estimated[name] = {"hardware": run.estimate.hardware,
                                   "latency_s": est.latency_s,
                                   "error_ratio": _ratio(est.latency_s, seconds)}
        return {"id": gid, "pattern": pattern, "nodes": len(nodes),
                "flops": cost.flops(self.analysis.flops_per_mac) if cost else None,
                "measured": measured, "estimated": estimated}


def _ratio(estimated: float | None, measured: float | None) -> float | None:
    """estimated / measured: above 1 the estimate is too slow, below 1 too fast."""
    return estimated / measured if estimated and measured else None


def _off(ratio: float | None) -> float:
    return abs(math.log(ratio)) if ratio else 0.0


def compare(
    model: ModelSpec | str | os.PathLike,
    backends: Sequence[str],
    *,
    threads: int = 1,
    runs: int = 50,
    warmup: int = 5,
    profile_runs: int = 5,
    batches: Sequence[int] = (),
    inputs: Sequence[str | os.PathLike] = (),
    samples: int = 20,
    seed: int = 0,
    dump_diff: bool = False,
    hardware: Mapping[str, str] | None = None,
    memory: bool = True,
    analysis: AnalysisResult | None = None,
    limits: Limits = DEFAULT_LIMITS,
    progress: Progress | None = None,
    dims: Mapping[str, int] | None = None,
) -> Comparison:
    """Measure `model` on each of `backends` (names from `registry`) and compare them.

    `batches`: latency and throughput at each (default: the model's own batch); the first is
    where everything else is measured. `inputs`: .npy/.npz/.pb files, one input set each, for
    the agreement check (default: `samples` random sets from `seed`). `hardware`: backend ->
    hardware profile for the estimate column, over `DEFAULT_HARDWARE`. `memory`: measure peak
    memory (a subprocess per backend). `analysis`: an analysis of the same model at the first
    batch, to reuse. `limits`: the validation limits of the model's analysis and of the input
    files (their byte budget among them). `dims`: named dims pinned (`--dim`), in the analysis
    and in the inputs made (a KV cache's named head dim too, from the model: the analysis's
    `dims_added`). Backends that cannot run are listed in `unavailable` with the reason;
    errors of the user's making (bad flags or files) raise `OnnxLensError`.
    """
    spec = model if isinstance(model, ModelSpec) else ModelSpec(Path(model))
    if runs < 1 or warmup < 0 or profile_runs < 1 or samples < 1:
        raise UsageError("runs, profile runs and samples must be at least 1, warm-up at least 0")
    plan = _BatchPlan.make(spec, batches)
    primary = plan.batches[0]
    path = plan.paths[primary]
    if analysis is None:
        analysis = analyze(path, batch=primary if plan.symbolic else None, limits=limits,
                           dims=dims)
    declared = input_specs(load_proto(path, weights=False))
    dims = {**(dims or {}), **analysis.dims_added}
    specs = pin_dims(declared, dims)
    settings = {"threads": threads, "runs": runs, "warmup": warmup, "profile_runs": profile_runs,
                "batches": plan.batches, "dump_diff": dump_diff,
                "inputs": [str(p) for p in inputs] or None,
                "samples": len(inputs) or samples, "seed": seed, "dims": dims or None}
    warnings = list(plan.warnings)
    ready, unavailable = _prepare(backends, spec, path, threads)
    agree_inputs = (load_inputs(inputs, specs, limits=limits) if inputs else
                    random_inputs(specs, count=samples, batch=primary, seed=seed))
    steps = _Steps(progress, len(ready) * (len(plan.paths) + 1 + int(len(ready) > 1)
                                           + int(memory) + int(dump_diff)))
    results: dict[str, BackendRun] = {}
    outputs: dict[str, list[dict[str, np.ndarray]]] = {}
    for name, backend in ready.items():
        try:
            results[name], outputs[name] = _measure(
                backend, spec, plan, agree_inputs if len(ready) > 1 else [], threads, runs,
                warmup, profile_runs, seed, memory, analysis, steps, dims)
        except BackendProblem as e:
            unavailable[name] = _reason(e, name)
    if results:
        _add_estimates(results, analysis, {**DEFAULT_HARDWARE, **(hardware or {})}, threads,
                       warnings)
    names = list(results)
    agreements = [agreement(a, outputs[a], b, outputs[b])
                  for i, a in enumerate(names) for b in names[i + 1:]]
    diffs: list[DumpDiff] = []
    if dump_diff:
        if len(names) < 2:
            warnings.append("dump-diff needs two backends that run")
        else:
            diffs = _dump_diffs({n: ready[n] for n in names}, analysis, agree_inputs[0], steps)
    steps.finish()
    return Comparison(analysis, path, settings, results, unavailable, agreements, diffs,
                      warnings)


@dataclass(frozen=True)
class _BatchPlan:
    batches: list[int]
    paths: dict[int, Path]  # batch -> the model to run at it (batches that can run)
    symbolic: bool  # the model's batch dim is symbolic: any batch runs on the same file
    warnings: list[str]

    @staticmethod
    def make(spec: ModelSpec, batches: Sequence[int]) -> _BatchPlan:
        fixed = fixed_batch(input_specs(load_proto(spec.path, weights=False)))
        wanted = list(dict.fromkeys(batches)) or [fixed or 1]
        if any(b < 1 for b in wanted):
            raise UsageError(f"batch sizes must be at least 1, got {wanted}")
        paths, warnings = {}, []
        for b in wanted:
            if fixed is None or fixed == b:
                paths[b] = spec.path
            elif spec.at_batch is not None:
                paths[b] = spec.at_batch(b)
            elif b == wanted[0]:
                raise UsageError(f"{spec.path.name} is fixed at batch {fixed}; batch {b} needs "
                                 "a model name or a model exported with a symbolic batch dim")
            else:
                warnings.append(f"batch {b} skipped: {spec.path.name} is fixed at batch {fixed}")
        return _BatchPlan([b for b in wanted if b in paths], paths, fixed is None, warnings)


class _Steps:
    def __init__(self, progress: Progress | None, total: int) -> None:
        self._progress, self._total, self._done = progress, total, 0

    def __call__(self, what: str) -> None:
        """Report that `what` starts (the step before it is done)."""
        if self._progress is not None:
            self._progress(self._done, self._total, what)
        self._done += 1

    def finish(self) -> None:
        if self._progress is not None:
            self._progress(self._total, self._total, "done")


def _prepare(names: Sequence[str], spec: ModelSpec, path: Path, threads: int
             ) -> tuple[dict[str, Backend], dict[str, str]]:
    ready: dict[str, Backend] = {}
    unavailable: dict[str, str] = {}
    for name in dict.fromkeys(names):
        try:
            backend = create(name, threads=threads, torch_factory=spec.torch_factory)
            backend.prepare(path)
        except BackendProblem as e:
            unavailable[name] = _reason(e, name)
            continue
        ready[name] = backend
    return ready, unavailable


def _reason(e: BackendProblem, name: str) -> str:
    """Why backend `name` is skipped: the error's reason when it is that backend's."""
    return e.reason if e.backend == name else str(e)


def _measure(backend: Backend, spec: ModelSpec, plan: _BatchPlan,
             agree_inputs: list[dict[str, np.ndarray]], threads: int, runs: int, warmup: int,
             profile_runs: int, seed: int, memory: bool, analysis: AnalysisResult,
             steps: _Steps, dims: Mapping[str, int]
             ) -> tuple[BackendRun, list[dict[str, np.ndarray]]]:
    name, primary = backend.name, plan.batches[0]
    run = BackendRun(name, primary, backend.describe())
    outputs = []
    if agree_inputs:
        steps(f"{name}: outputs on {len(agree_inputs)} input sets")
        outputs = [backend.run(x) for x in agree_inputs]
    feeds: dict[int, Feeds] = {}
    for b, path in plan.paths.items():
        steps(f"{name}: latency at batch {b}")
        at_b = backend if b == primary else _prepared(name, spec, path, threads)
        feeds[b] = random_inputs(pin_dims(input_specs(load_proto(path, weights=False)), dims),
                                 count=1, batch=b, seed=seed)[0]
        run.latency[b] = at_b.time(feeds[b], warmup=warmup, runs=runs)
    steps(f"{name}: profile")
    profile = backend.profile(feeds[primary], runs=profile_runs)
    if profile is None:
        run.notes.append("no per-kernel profile: per-group times come from ONNX Runtime")
    else:
        run.times = map_profile(profile, analysis, run.latency_s)
    if memory:
        steps(f"{name}: peak memory")
        factory = spec.torch_factory if needs_module(name) else None
        run.peak_memory_bytes, why = peak_memory(name, threads, plan.paths[primary],
                                                 feeds[primary], factory)
        if why:
            run.notes.append(why)
    return run, outputs


def _prepared(name: str, spec: ModelSpec, path: Path, threads: int) -> Backend:
    backend = create(name, threads=threads, torch_factory=spec.torch_factory)
    backend.prepare(path)
    return backend


def _add_estimates(results: dict[str, BackendRun], analysis: AnalysisResult,
                   hardware: Mapping[str, str], threads: int, warnings: list[str]) -> None:
    """The estimate of each backend's hardware profile; a profile that cannot load is a
    warning (the estimate column stays empty), never a failed comparison. A backend that is
    a host runtime (ort-cpu, native-cpu) is estimated on `host` by its own calibration and
    kernel model, beside its own measurement; others (torch) by ORT CPU's."""
    from ..analyzer.calibration import resolve_target
    from ..analyzer.hardware import ORT_CPU, RUNTIMES

    for name, run in results.items():
        key = hardware.get(name)
        if key is None:
            continue
        try:
            runtime = name if name in RUNTIMES else ORT_CPU
            hw, efficiency = resolve_target(key, threads, runtime)
            run.estimate = analysis.estimate(hw, None, efficiency)  # the graph's own precision
        except (OnnxLensError, ImportError) as e:
            warnings.append(f"{name}: no estimate on hardware {key!r} ({e})")


def _dump_diffs(backends: dict[str, Backend], analysis: AnalysisResult, inputs: Feeds,
                steps: _Steps) -> list[DumpDiff]:
    """The first backend against each other one, every tensor both can name."""
    tensors = {}
    for name, backend in backends.items():
        steps(f"{name}: intermediate tensors")
        tensors[name] = backend.intermediates(inputs)
    (ref, ref_backend), *others = backends.items()
    diffs = []
    for name, backend in others:
        limited = [n for n, b in ((ref, ref_backend), (name, backend))
                   if not b.intermediates_complete]
        note = (f"only graph outputs compared: {' and '.join(limited)} cannot name "
                "intermediate tensors" if limited else "")
        diffs.append(dump_diff(analysis.graph, ref, tensors[ref], name, tensors[name],
                               note=note))
    return diffs


def attach_measurements(analysis: dict[str, Any], comparison: dict[str, Any]
                        ) -> dict[str, Any]:
    """The analysis JSON with the comparison merged in: top-level `measurements`, `measured`
    {backend: {latency_s, share}} on each group, `agreement` per backend pair (and `dump_diff`,
    `unavailable_backends` when present). The inputs are not changed."""
    measured = {g["id"]: g["measured"] for g in comparison["groups"]}
    out = dict(analysis)
    out["measurements"] = comparison["measurements"]
    out["groups"] = [g | {"measured": measured.get(g["id"], {})} for g in analysis["groups"]]
    out["agreement"] = comparison["agreement"]
    if "dump_diff" in comparison:
        out["dump_diff"] = comparison["dump_diff"]
    if comparison["unavailable"]:
        out["unavailable_backends"] = comparison["unavailable"]
    out["warnings"] = [*analysis.get("warnings", []), *comparison["warnings"]]
    return out
