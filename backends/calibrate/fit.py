"""The fitting library of `onnxlens calibrate`: overhead, peak, bandwidth per level, τ and
the efficiency curves from timed benchmarks, and how well they explain them (`fit_check`).
"""


from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import onnxruntime as ort

from ...analyzer.calibration import (
    MAC_CLASSES,
    OWN_VECTOR_CLASSES,
    VECTOR_CLASS,
    Calibration,
    Curve,
    Point,
    apply_calibration,
    host_name,
)
from ...analyzer.estimate import activation_pass, estimate_group
from ...analyzer.hardware import (
    COPY_CLASSES,
    INT8_CLASSES,
    HardwareProfile,
    Precision,
    load_profile,
)
from ...analyzer.host import detect_cpu, host_profile, replace_measured
from .catalogue import CAPPED, COPY_CHAIN_PARTS, COPY_CHAIN_STEPS, SQUARE_GEMM, copy_chain

# Without MACs (`fit_vector`), a benchmark is informative on efficiency only if memory takes
# less than this share of it (bandwidths and the curve are fitted in turn, each on its own).
# The MAC classes need no such cut (`fit_curve`'s floor).
COMPUTE_BOUND_SHARE = 0.8
FIT_ROUNDS = 4
LEVEL_POINTS = 3  # benchmarks a memory level needs for an i_half factor of its own
LEVEL_GRID = np.logspace(-1, 2, 31)  # the i_half factors a level may take (1 included)
F_HALF_GRID = (0.0, *np.logspace(3, 10, 57))
# Below it, for a class read per call whose calls are a few FLOPs (a per-axis
# DequantizeLinear's blocks of one element: 3 FLOPs, 1.1 ns each, an f_half of ~30): offered
# to such classes only (`fit_curve`'s `per_call`), so no other curve's fit changes.
F_HALF_LOW_GRID = tuple(np.logspace(0, 3, 25)[:-1])
I_HALF_GRID = (0.0, *np.logspace(-2, 3, 41))
# Plain vector FLOPs one transcendental evaluation may cost (1: as cheap as an add).
TRANSCENDENTAL_GRID = np.logspace(0, 2, 31)
# Nanoseconds per row a row-wise normalization may pay beyond its FLOPs (`fit_norm_rows`).
ROW_NS_GRID = np.arange(0.0, 40.5, 0.5)
FP32 = Precision("fp32")  # the float benchmarks are fp32 graphs, costed as stored
INT8 = Precision("int8")  # the quantized ones (`catalogue.quantized`): int8 x uint8 MACs


def class_precision(cls: str) -> Precision:
    """The precision a class's kernels run their MACs at: its curve is a fraction of that
    precision's peak (an int8 class's of the int8 peak, as the estimator reads it)."""
    return INT8 if cls in INT8_CLASSES else FP32


def cold_weight_rate(per_core_gbps: float, threads: int, main_memory_gbps: float) -> float:
    """The cold-weight rate at `threads` threads, from the one measured at one thread: each
    thread fetches the weights of its share of a kernel, so the rates add, up to what main
    memory streams at that thread count,

        rate(T) = min(T x rate(1), main memory GB/s at T threads).

    Measured at one thread because the chains' extra time is a small difference of two
    larger ones, and at two threads on two shared vCPUs it came out anywhere from 2.5 to 34
    GB/s (at one: 14-18). At two threads on this host the chains' own 16 GB/s over-charged
    the 15 models of benchmarks/estimate_accuracy.py (median error 4.7%, mobilenet_v3 +27%);
    this rule's 28.8 GB/s gave 2.2% on the same measurements and 3.9% in a fresh run."""
    return min(threads * per_core_gbps, main_memory_gbps)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope (a single point: intercept only)."""
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


# ---- fitting ----------------------------------------------------------------------------------

def fit(points: Sequence[Point], hw: HardwareProfile, threads: int,
        kernel_s: float) -> Calibration:
    """Peak, bandwidths and curves from measured points (module docstring, Fitting)."""
    # A soft-capped benchmark and its twin time libm's calls (`fit_libm_call`), not a curve:
    # the twins, GQA prefills of 4 query heads at 32-128 tokens, fitted with the attention
    # blocks, took its log error from 0.06 to 0.23.
    paired = {p.name for pair in capped_pairs(points) for p in pair}
    mac_points = [p for p in points if p.macs and not p.libm_calls and p.name not in paired]
    gemm_rates = {p.name: 2 * p.macs / p.seconds for p in mac_points if p.op_class == "gemm"}
    peak = max(hw.peak_flops("fp32"), *gemm_rates.values())
    # The measured GEMM peak of the naive estimate: the largest square GEMM, as one would
    # measure a peak (the best rate of any GEMM when that one was skipped).
    square = gemm_rates.get(SQUARE_GEMM.name, max(gemm_rates.values(), default=peak))
    # Transposes that copy run by run stay in the bandwidth fit: without them, at two threads
    # it found a degenerate optimum (all levels 94 GB/s, τ 54; with them 53 GB/s, τ 1.8).
    # `fit_copy_run` then rates their runs against the bandwidths fitted.
    # Transposes that copy element by element stay out: their time is their elements'
    # (`fit_copy_element`), not their bytes'.
    # Blocked copies stay out too: they stream at rates of their own (`fit_copy_rates`; the
    # 17:03 calibration's NCHW <-> NHWC Transposes 40-80 GB/s, its Adds in L2 117-123).
    vector_points = [p for p in points if not p.macs and not p.elements
                     and p.op_class not in COPY_CLASSES]
    bandwidth, vector, tau = fit_vector(vector_points, hw, peak)
    row_ns = fit_norm_rows(vector_points, hw, peak, tau)
    curves = {VECTOR_CLASS: vector,
              **fit_vector_classes(vector_points, hw, peak, bandwidth, tau, row_ns)}
    # The int8 peak, like fp32's, is raised to the best int8 rate measured (AVX-512 VNNI here:
    # QLinearConv at 1.0 TOPS, above the profile's 4 x fp32 assumption).
    int8_peak = max([hw.peak_flops("int8"), *(2 * p.macs / p.seconds for p in mac_points
                                              if class_precision(p.op_class) is INT8)])
    peaks = replace_measured(hw, peak_tflops={"fp32": peak / 1e12, "int8": int8_peak / 1e12})
    for cls in MAC_CLASSES:
        eff_points = []
        macs_peak = peaks.peak_flops(class_precision(cls).peak)
        for p in (p for p in mac_points if p.op_class == cls):
            flops = 2 * p.macs + p.other_flops
            intensity = flops / p.bytes
            memory_s = _stream_s(p.bytes, hw, bandwidth)
            # MACs at their precision's peak, the epilogue at fp32's (`peak_seconds`)
            ideal_s = 2 * p.macs / macs_peak + p.cost().vector_flops(tau) / peak
            # An activation pass after the kernel, at the elementwise rate (`activation_pass`).
            pass_work = p.pass_cost().vector_flops(tau)
            run_s = p.seconds - (pass_work / (peak * vector(pass_work, math.inf))
                                 if pass_work else 0.0)
            # The curve reads one call's FLOPs (its GEMM's alone when a reuse is given), the
            # reuse, and the level of their ratio, as the estimator asks it (`estimate_group`,
            # `Calibration.efficiency`).
            reuse = p.reuse or intensity
            call_flops = (2 * p.macs if p.reuse else flops) / p.calls
            # Every benchmark counts, its memory time as a floor (`fit_curve`).
            if run_s > 0:
                eff_points.append((call_flops, reuse, min(1.0, ideal_s / run_s),
                                   hw.memory_level(call_flops / reuse).name,
                                   math.log(memory_s / run_s)))
        if eff_points:
            f, i, e, lv, floor = zip(*eff_points, strict=True)
            curves[cls] = fit_curve(np.asarray(f), np.asarray(i), np.asarray(e), lv,
                                    floor=np.asarray(floor))
    return Calibration(
        host=host_name(), cpu=detect_cpu().model, threads=threads,
        peak_fp32_tflops=peak / 1e12, gemm_tflops=square / 1e12,
        kernel_overhead_us=kernel_s * 1e6, bandwidth_gbps=bandwidth, curves=curves,
        levels=[(lv.name, lv.size_bytes) for lv in hw.memory],
        points=tuple(points), ort_version=ort.__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        transcendental_flops=tau, peak_int8_tops=int8_peak / 1e12,
        copy_run_ns=fit_copy_run([p for p in points if p.runs], hw, bandwidth),
        norm_row_ns=row_ns,
        copy_element_ns=fit_copy_element([p for p in points if p.elements], hw, bandwidth),
        copy_gbps=fit_copy_rates(points), libm_call_ns=fit_libm_call(points))


def fit_copy_rates(points: Sequence[Point]) -> dict[str, float]:
    """GB/s of each blocked copy class (COPY_CLASSES) with benchmarks: all its benchmarks'
    bytes over all their time (the large ones weigh most; a rate per benchmark would let a
    3 us one, half noise, count as much as a 100 us one)."""
    out = {}
    for cls in COPY_CLASSES:
        mine = [p for p in points if p.op_class == cls]
        if mine:
            out[cls] = sum(p.bytes for p in mine) / sum(p.seconds for p in mine) / 1e9
    return out


def fit_copy_fixed(samples: Mapping[str, float], kernel_s: float
                   ) -> tuple[dict[str, float], float]:
    """A small copy kernel's fixed cost inside a graph, beyond a kernel's overhead (`kernel_s`,
    the Relu chains' slope), in ns per op type, and what Split and Concat pay per part (output
    or input) beyond their first, from the run times of `catalogue.copy_chain`'s chains
    (`samples`, by name). A chain's step costs s = (t(long) - t(short)) / (long - short)
    steps, the run call and the graph's ends cancelling; each step's kernels k·kernel_s; its
    bytes (a few hundred, ~5 ns in L1) are left in. Slice, Gather: s - kernel_s. Expand:
    s - 2·kernel_s - Slice's (its step ends in a Slice). Split and Concat: a line through s
    over their parts p, s(p) = 2·kernel_s + Split + Concat + 2·part·(p - 1), each half the
    fixed sum (one chain cannot tell them apart). Measured (ORT 1.31, Zen 5, 1 thread, 128
    floats, kernel 152 ns): Slice 159, Gather 364, Expand 115, Split and Concat 102 each,
    108 a part; one-op graphs of them had read 420-490 ns alone, an estimate of ~170.
    A family without both step counts is left out; none: ({}, 0), nothing added."""
    short, long = COPY_CHAIN_STEPS

    def step_s(family: str, parts: int = 2) -> float | None:
        a, b = (samples.get(copy_chain(family, n, parts).name) for n in (short, long))
        return None if a is None or b is None else (b - a) / (long - short)

    fixed: dict[str, float] = {}
    for op in ("Slice", "Gather"):
        if (s := step_s(op)) is not None:
            fixed[op] = s - kernel_s
    if (s := step_s("Expand")) is not None and "Slice" in fixed:
        fixed["Expand"] = s - 2 * kernel_s - fixed["Slice"]
    split = {p: s for p in COPY_CHAIN_PARTS if (s := step_s("Split", p)) is not None}
    part_s = 0.0
    if len(split) >= 2:
        intercept, slope = fit_line(list(split), list(split.values()))
        part_s = max(slope / 2, 0.0)
        fixed["Split"] = fixed["Concat"] = (intercept + slope - 2 * kernel_s) / 2
    return {op: max(s, 0.0) * 1e9 for op, s in fixed.items()}, part_s * 1e9


def capped_pairs(points: Sequence[Point]) -> list[tuple[Point, Point]]:
    """Each soft-capped benchmark (`catalogue.CAPPED` in its name, libm calls counted) with
    its twin without the cap, where both were timed."""
    by_name = {p.name: p for p in points}
    return [(p, by_name[twin]) for p in points if p.libm_calls and CAPPED in p.name
            and (twin := p.name.split(CAPPED)[0]) in by_name]


def fit_libm_call(points: Sequence[Point]) -> float:
    """Nanoseconds per value a kernel passes to libm alone (`Point.libm_calls`): each
    soft-capped benchmark's time less its twin's (`capped_pairs`), all pairs' over all their
    calls, never negative; 0 without pairs. Measured (ORT 1.31, Zen 5): 3.1-6.4 ns a tanhf,
    in two modes run to run (the 02:30 calibration fitted 3.3), where MLAS's vector Tanh
    takes 0.23-0.26 ns an element."""
    pairs = capped_pairs(points)
    calls = sum(p.libm_calls for p, _ in pairs)
    extra_s = sum(p.seconds - twin.seconds for p, twin in pairs)
    return max(0.0, extra_s / calls * 1e9) if calls else 0.0


def fit_copy_run(points: Sequence[Point], hw: HardwareProfile, bandwidth: dict[str, float]
                 ) -> float:
    """Nanoseconds per contiguous run a Transpose copies (`transpose_runs`) or span a
    broadcasting elementwise op makes a vector call for (`broadcast_spans`: a loop step with
    a call's set-up, as a run's copy is), beyond the time their bytes take at the fitted
    bandwidth of their level: all the points' extra time over
    all their runs (a least-squares slope through the origin would let the point with most
    runs decide alone; a median would let one with 128 runs, whose extra time is noise). 0
    without such points. Measured here: 10.9 ns per run of 8 floats, 6.3 ns per run of 32."""
    return _extra_ns_per(points, [p.runs for p in points], hw, bandwidth)


def fit_copy_element(points: Sequence[Point], hw: HardwareProfile,
                     bandwidth: dict[str, float]) -> float:
    """Nanoseconds per element a Transpose copies one at a time (`transpose_elements`),
    beyond its bytes at the fitted bandwidth of their level: all the points' extra time over
    all their elements; 0 without such points. Measured here: 2.2 ns at every shape tried."""
    return _extra_ns_per(points, [p.elements for p in points], hw, bandwidth)


def _extra_ns_per(points: Sequence[Point], units: Sequence[int], hw: HardwareProfile,
                  bandwidth: dict[str, float]) -> float:
    """The points' time beyond their bytes at the fitted bandwidth of their level, in
    nanoseconds per unit (`units`: each point's count), never negative; 0 without units."""
    extra_s = sum(p.seconds - _stream_s(p.bytes, hw, bandwidth) for p in points)
    total = sum(units)
    return max(0.0, extra_s / total * 1e9) if total else 0.0


def _stream_s(nbytes: float, hw: HardwareProfile, bandwidth: dict[str, float]) -> float:
    """`nbytes` at the fitted bandwidth of the level they fit in (the profile's own where
    that level was not fitted)."""
    level = hw.memory_level(nbytes)
    return nbytes / (bandwidth.get(level.name, level.bandwidth_gbps) * 1e9)


def fit_vector(points: Sequence[Point], hw: HardwareProfile, peak: float
               ) -> tuple[dict[str, float], Curve, float]:
    """Bandwidth per memory level, the `elementwise` curve and τ, the plain vector FLOPs one
    transcendental evaluation costs, from benchmarks without MACs: for each τ on
    TRANSCENDENTAL_GRID, `_fit_vector_at` fits bandwidths and curve on the benchmarks they
    are for (all but the classes with curves of their own, `own_curve_classes`); the τ whose
    fit predicts those best, by mean |ln(max(compute, memory) / measured)|, wins. A Relu and
    a Sigmoid of the same size do one FLOP per element each by our count, the Sigmoid's a
    transcendental: the Relu streams at the bandwidth, the Sigmoid is slower by what τ says."""
    own = own_curve_classes(points)
    mine = [p for p in points if p.op_class not in own]
    levels = [hw.memory_level(p.bytes).name for p in mine]
    best: tuple[float, dict[str, float], Curve, float] | None = None
    for tau in map(float, TRANSCENDENTAL_GRID):
        bandwidth, curve = _fit_vector_at(mine, levels, hw, peak, tau)
        error = statistics.fmean(
            abs(math.log(_vector_time(p, bandwidth[lv], curve, peak, tau) / p.seconds))
            for p, lv in zip(mine, levels, strict=True))
        if best is None or error < best[0]:
            best = (error, bandwidth, curve, tau)
    assert best is not None
    return best[1], best[2], best[3]


def own_curve_classes(points: Sequence[Point]) -> frozenset[str]:
    """The classes among OWN_VECTOR_CLASSES with LEVEL_POINTS benchmarks or more that do
    vector work: those `fit_vector_classes` gives a curve of their own (the one test of
    both, so that no class is left out of the `elementwise` fit without a curve). Their
    benchmarks say
    nothing of the `elementwise` curve or the bandwidths: fitted on them too, the curve
    (e_max 0.064, f_half 1000 FLOPs, mean |log error| 0.96 on the 15:34 calibration's points)
    took SkipLayerNormalization's 2.7 GB/s and a per-column DequantizeLinear's 4 GB/s for an
    elementwise op's rate, and the L2 bandwidth (73 GB/s) the median of pools, reductions and
    normalizations, where an Add or Relu in L2 streams at 111-122 GB/s."""
    counts: dict[str, int] = {}
    for p in points:
        if p.op_class in OWN_VECTOR_CLASSES and p.other_flops:
            counts[p.op_class] = counts.get(p.op_class, 0) + 1
    return frozenset(cls for cls, n in counts.items() if n >= LEVEL_POINTS)


def _vector_time(p: Point, gbps: float, curve: Curve, peak: float, tau: float) -> float:
    """The estimator's time of a benchmark without MACs: max(compute, memory)."""
    work = p.cost().vector_flops(tau)
    compute_s = work / (peak * curve(work, work / p.bytes)) if work else 0.0
    return max(compute_s, p.bytes / (gbps * 1e9))


def _fit_vector_at(points: Sequence[Point], levels: Sequence[str], hw: HardwareProfile,
                   peak: float, tau: float) -> tuple[dict[str, float], Curve]:
    """Bandwidths and the `elementwise` curve at τ, fitted in turn: bandwidth on the
    benchmarks the curve calls memory bound, the curve on those the bandwidths call compute
    bound. The curve has no reuse factor and no level factors (an elementwise op's traffic is
    the memory term's business); it costs kernels without MACs only (a kernel with MACs runs
    its bias and activation at its own rate)."""
    rates = [p.bytes / p.seconds / 1e9 for p in points]
    bandwidth = {lv: max(r for r, lv2 in zip(rates, levels, strict=True) if lv2 == lv)
                 for lv in set(levels)}
    curve = Curve(1.0)

    def compute_s(p: Point) -> float:
        work = p.cost().vector_flops(tau)
        return work / (peak * curve(work, work / p.bytes))

    for _ in range(FIT_ROUNDS):
        eff_points = _compute_bound(points, levels, bandwidth, peak, tau)
        if eff_points:
            curve = fit_curve(*map(np.asarray, zip(*eff_points, strict=True)), reuse=False)
        for lv in bandwidth:
            bound = [r for p, r, lv2 in zip(points, rates, levels, strict=True) if lv2 == lv
                     and (not p.other_flops or compute_s(p) < COMPUTE_BOUND_SHARE * p.seconds)]
            if bound:
                bandwidth[lv] = statistics.median(bound)
    # A faster level is never slower: its tiny benchmarks are mostly fixed cost.
    slowest = 0.0
    for level in reversed([lv.name for lv in hw.memory if lv.name in bandwidth]):
        slowest = bandwidth[level] = max(bandwidth[level], slowest)
    return bandwidth, curve


def _compute_bound(points: Sequence[Point], levels: Sequence[str], bandwidth: dict[str, float],
                   peak: float, tau: float) -> list[tuple[float, float, float]]:
    """(work, FLOPs per byte, efficiency) of the benchmarks without MACs that `bandwidth`
    does not call memory bound, their work in plain-FLOP equivalents at τ; the intensity is
    the estimator's (`estimate_group`: a transcendental counts one FLOP), which a reuse
    factor reads (at τ-weighted work per byte, the normalization curve's own benchmarks came
    out 37-41% off in the fit check, 27% for QLinearSoftmax's)."""
    out = []
    for p, lv in zip(points, levels, strict=True):
        work = p.cost().vector_flops(tau)
        if work and p.bytes / (bandwidth[lv] * 1e9) < COMPUTE_BOUND_SHARE * p.seconds:
            # one call's work, as the estimator reads the curve (a per-axis Q's blocks)
            out.append((work / p.calls, p.cost().flops() / p.bytes, work / (peak * p.seconds)))
    return out


def fit_vector_classes(points: Sequence[Point], hw: HardwareProfile, peak: float,
                       bandwidth: dict[str, float], tau: float = 1.0, row_ns: float = 0.0
                       ) -> dict[str, Curve]:
    """A curve of its own for each class `own_curve_classes` names (pools, normalizations,
    reductions with LEVEL_POINTS benchmarks or more): their loops (a window, a row statistic,
    exp) run at rates of their own, not an elementwise op's. Fitted on every benchmark of the
    class, memory bound or not, its work in plain-FLOP equivalents at τ: the curve then gives
    its measured time, and the memory term takes over only where the bandwidths say a level
    is slower still (a pool streams its input faster than an elementwise op of the same
    bytes, which writes as much as it reads: its benchmarks sit above the fitted bandwidths,
    not on them). A benchmark's time less `row_ns` per row it normalizes (`fit_norm_rows`:
    the estimator adds that apart) is what its curve gives; one that leaves no time is left
    out (a class none is left to has no curve)."""
    curves = {}
    own = own_curve_classes(points)
    for cls in (c for c in OWN_VECTOR_CLASSES if c in own):
        mine = [replace(p, seconds=p.seconds - p.rows * row_ns * 1e-9) for p in points
                if p.op_class == cls]
        mine = [p for p in mine if p.seconds > 0]
        eff_points = _compute_bound(mine, [hw.memory_level(p.bytes).name for p in mine],
                                    {lv: math.inf for lv in bandwidth}, peak, tau)
        if eff_points:
            curves[cls] = fit_curve(*map(np.asarray, zip(*eff_points, strict=True)),
                                    per_call=any(p.calls > 1 for p in mine))
    return curves


def fit_norm_rows(points: Sequence[Point], hw: HardwareProfile, peak: float,
                  tau: float = 1.0) -> float:
    """Nanoseconds per row a row-wise normalization pays beyond its FLOPs at its class's
    curve (`normalized_rows`): for each value on ROW_NS_GRID the curves of the classes with
    rows are fitted on their benchmarks' times less rows x that value (`fit_vector_classes`),
    and the value whose curves plus row term predict those benchmarks best, by mean
    |ln(estimate / measured)|, wins. 0 without benchmarks with rows. A row term
    is not the curve's f_half, a fixed cost per kernel: measured here, LayerNormalization over
    [3136, 24] takes 73 us where [64, 1024], with 2.6x the FLOPs, takes 25."""
    classes = {p.op_class for p in points if p.rows}
    mine = [p for p in points if p.op_class in classes]
    if not classes:
        return 0.0
    infinite = {hw.memory_level(p.bytes).name: math.inf for p in mine}
    best = (math.inf, 0.0)
    for row_ns in map(float, ROW_NS_GRID):
        curves = fit_vector_classes(mine, hw, peak, infinite, tau, row_ns)
        if any(p.op_class not in curves for p in mine):
            continue
        error = statistics.fmean(
            abs(math.log(_norm_time(p, curves[p.op_class], peak, tau, row_ns) / p.seconds))
            for p in mine)
        best = min(best, (error, row_ns))
    return best[1]


def _norm_time(p: Point, curve: Curve, peak: float, tau: float, row_ns: float) -> float:
    """The estimator's compute term of a benchmark with rows: its work at its curve's rate,
    plus its rows."""
    work = p.cost().vector_flops(tau)
    return work / (peak * curve(work, p.cost().flops() / p.bytes)) + p.rows * row_ns * 1e-9


def fit_check(cal: Calibration) -> dict[str, float]:
    """Per op class, the median |estimate / measured - 1| of the calibration's own benchmarks:
    each costed by the estimator (`estimate_group`, one kernel on the calibrated profile, no
    overhead: a point's time has it taken out) against the time measured. How well the fitted
    model explains what it was fitted on; a curve's own `log_error` covers only the points
    that curve was fitted on."""
    base = load_profile(cal.profile) if cal.profile else host_profile(cal.threads)
    hw = apply_calibration(base, cal)
    errors: dict[str, list[float]] = {}
    for p in cal.points:
        seconds = estimate_group(p.cost(), p.op_class, hw, class_precision(p.op_class),
                                 cal.efficiency, launches=0, reuse=p.reuse, calls=p.calls,
                                 runs=p.runs, rows=p.rows, elements=p.elements,
                                 libm_calls=p.libm_calls).latency_s
        if p.pass_flops:
            seconds += activation_pass(p.pass_cost(), hw, FP32, cal.efficiency).latency_s
        errors.setdefault(p.op_class, []).append(abs(seconds / p.seconds - 1))
    return {cls: statistics.median(errs) for cls, errs in errors.items()}


def describe_fit_check(cal: Calibration) -> str:
    """`fit_check` in one line, worst class first."""
    check = sorted(fit_check(cal).items(), key=lambda kv: -kv[1])
    return ("fit check, median |estimate / measured - 1| on its own benchmarks: "
            + ", ".join(f"{cls} {err:.0%}" for cls, err in check))


def fit_curve(flops: np.ndarray, intensity: np.ndarray, eff: np.ndarray,
              levels: Sequence[str] = (), reuse: bool = True, per_call: bool = False,
              floor: np.ndarray | None = None) -> Curve:
    """Least absolute deviations on ln(eff) of e_max · F/(F + f_half) · I/(I + i_half · level
    factor), with e_max <= 1. For each f_half on a grid: i_half is fitted on the most common
    level's points (the reference, factor 1; all points when no levels are given) with the
    best e_max for each (`_best_log_scale`); each other level with LEVEL_POINTS points or more
    takes the factor from LEVEL_GRID that fits its points best; e_max is refitted on all. The
    f_half whose curve fits all points best wins (`_fit_reuse`). Intensities past the largest
    fitted one are read as it (no extrapolation). Absolute, not squared, deviations: one odd
    benchmark (a channel count ORT runs on a slow path) must not drag a whole class. Fewer
    than 3 points fit e_max alone; `reuse` False fits no reuse factor (i_half 0); `per_call`
    offers F_HALF_LOW_GRID too.

    f_half is a cost per call, the same wherever the operands live, so every level's points
    judge it. (Judged on the reference level's alone, large GEMMs in L3 here, it was free
    below them: calibrations minutes apart landed on 0, 237K, 422K or 562K FLOPs, and the
    last priced a 32x32x32 MatMul in L1 at 2.5 us against 0.58 measured, a tiny decoder's
    [1, 128] x [128, 384] projection at 1.4-3.2 us against 1.8.)

    `floor`, per point, is ln(memory time / measured time): the estimator takes max(compute,
    memory), so a curve that puts a point's compute time under its memory time predicts the
    memory time, and its deviation is that floor whatever the curve says (`_deviations`).
    A benchmark mostly spent streaming bytes then tells the curve only that its efficiency
    is not lower than measured, and no cut decides which benchmarks count: a GEMV whose
    memory share moved across a cut from one calibration to the next (0.78 / 1.09 of its
    time) reshaped the whole GEMM curve with it. None: no point has a memory term."""
    y = np.log(eff)
    floor = np.full_like(y, -np.inf) if floor is None else np.asarray(floor, float)
    names = np.asarray(levels if len(levels) else [""] * len(y))
    counts = {lv: int((names == lv).sum()) for lv in dict.fromkeys(names.tolist())}
    reference = max(counts, key=lambda lv: counts[lv])
    enough = counts[reference] >= 3
    f_grid = sorted((*F_HALF_GRID, *F_HALF_LOW_GRID)) if per_call else F_HALF_GRID
    f_grid = f_grid if enough else (0.0,)
    i_grid = np.asarray(I_HALF_GRID if reuse and enough else (0.0,))
    fits = [_fit_reuse(y, flops, intensity, names, reference, floor, f_half, i_grid)
            for f_half in f_grid]
    error, f_half, i_half, factors, e_max = min(fits, key=lambda fit: fit[0])
    return Curve(float(math.exp(e_max)), f_half, i_half, float(intensity.max()), factors,
                 len(y), float(error))


def _fit_reuse(y: np.ndarray, flops: np.ndarray, intensity: np.ndarray, names: np.ndarray,
               reference: str, floor: np.ndarray, f_half: float, i_grid: np.ndarray
               ) -> tuple[float, float, float, dict[str, float], float]:
    """`fit_curve` at one f_half: (mean deviation over all points, f_half, i_half, the level
    factors, ln e_max)."""
    size = np.log(flops / (flops + f_half))
    ref = names == reference
    g = np.log(intensity[ref] / (intensity[ref] + i_grid[:, None]))  # per i_half
    log_e, err = _best_log_scale(y[ref] - size[ref] - g, floor[ref])
    best = int(np.argmin(err))
    i_half = float(i_grid[best])
    scale = np.ones_like(y)  # each point's i_half factor
    factors: dict[str, float] = {}
    for level in dict.fromkeys(names.tolist()) if i_half else ():
        mask = names == level
        if level != reference and mask.sum() >= LEVEL_POINTS:
            reuse = np.log(intensity[mask] / (intensity[mask] + i_half * LEVEL_GRID[:, None]))
            level_err = _deviations(y[mask] - log_e[best] - size[mask] - reuse,
                                    floor[mask]).mean(axis=-1)
            factors[level] = float(LEVEL_GRID[int(np.argmin(level_err))])
            scale[mask] = factors[level]
    shape = size + np.log(intensity / (intensity + i_half * scale))
    e_max, error = _best_log_scale(y - shape, floor)
    return float(error), float(f_half), i_half, factors, float(e_max)


def _deviations(residual: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """|ln(estimate / measured)| of points whose ln(efficiency measured / fitted) is
    `residual`: the compute term's deviation, or the memory term's (`floor`) where that one
    is the longer."""
    return np.abs(np.maximum(residual, floor))


def _best_log_scale(r: np.ndarray, floor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ln e_max <= 0 that minimizes the mean deviation (`_deviations`) of points whose
    ln efficiency less the curve's shape is `r` (last axis: the points), and that mean. Each
    point's deviation is piecewise linear in ln e_max, convex only where it meets zero
    (ln e_max = r - max(floor, 0)), so the minimum is there for some point, or at the cap 0;
    the median of r comes first among equals (without floors, the classic LAD answer)."""
    candidates = np.minimum(np.concatenate(
        [np.median(r, axis=-1, keepdims=True), r - np.maximum(floor, 0.0),
         np.zeros((*r.shape[:-1], 1))], axis=-1), 0.0)
    err = _deviations(r[..., None, :] - candidates[..., :, None], floor).mean(axis=-1)
    best = np.argmin(err, axis=-1)[..., None]
    return (np.take_along_axis(candidates, best, -1)[..., 0],
            np.take_along_axis(err, best, -1)[..., 0])
