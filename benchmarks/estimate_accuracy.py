"""How close is the calibrated `host` estimate to ONNX Runtime's measured CPU latency?

    python benchmarks/estimate_accuracy.py --threads 1                # uses a saved calibration
    python benchmarks/estimate_accuracy.py --threads 1 --recalibrate  # measures this host first
    python benchmarks/estimate_accuracy.py --threads 1 --runs 20 --models resnet18 mobilenet_v2
    python benchmarks/estimate_accuracy.py --threads 1 --measured-cache m.json  # reuse timings
    python benchmarks/estimate_accuracy.py --threads 1 --backend native-cpu  # the executor's

1. The calibration of this host at `--threads` (`onnxlens calibrate`, backends/calibrate/):
   loaded from the cache dir, or run (about 100 s) when there is none or with --recalibrate.
   It sees synthetic one-op micro-benchmarks only, never the models below.
2. Each torchvision model, exported once at 224x224 with BatchNorm folded into the cache dir
   (`cached_export`, random weights), is timed on ONNX Runtime's CPU provider at the same
   thread count: median of `--runs` runs after 3 warm-up runs, profiling off, inputs and
   outputs bound once. At one thread the clock is the process's CPU time, which is the
   latency on an idle machine and does not grow when other processes share the cores; with
   more threads it is wall time. On a shared machine even CPU time drifts (caches and memory
   bandwidth are shared), so the models are measured in `--rounds` rounds, one model after
   the other in each, and the fastest round's median is kept (the calibration likewise keeps
   the fastest of five passes). `--measured-cache FILE` keeps each model's round medians
   (keyed by model, threads, runs, ORT version and export file) and measures only what it
   lacks, so a change to the estimator is judged against the same measurements.
3. Estimated: `estimate_model` with the calibrated host profile and the calibration's curves,
   summed over our fused groups, each costed as the kernels ORT makes of it (the profile
   names the runtime it was calibrated on; `analyzer/estimate.py`). Naive: every group at
   one measured GEMM peak, 2 x MACs / (best GEMM FLOP/s of the calibration).

4. Drift (a diagnostic, not part of the result): a fixed probe of three of the calibration's
   own micro-benchmarks (a GEMM, a 3x3 convolution, an elementwise Relu out of L2; all in its
   coarse tier, so in every calibration) is timed through the calibration's own timer of the
   backend (`measure.PREPARE`: ORT's session, the native executor's step clock) right before
   each model's measurement in every round. Its time over the
   time the calibration recorded for the same benchmarks (geometric mean of the three
   ratios) is the machine-state ratio of that round; the model's ratio is that of the round
   whose median was kept. "Corrected" is the estimate times that ratio.

Printed per model: measured, estimated and naive latency with their errors
((estimate - measured) / measured), the drift ratio and the drift-corrected error; then median
absolute error, share within 10% and 25% and the largest error for raw, corrected and naive,
over the models whose analysis costed every group (a model with groups of unknown cost is
listed, marked, and left out of the summary: its error would measure the missing cost, not the
calibration); `--breakdown` adds estimated time per op class.

`--backend native-cpu` does the same for the project's own executor: its calibration
(`onnxlens calibrate --backend native-cpu`), its kernel model (`backends/native/
kernel_model.py`: the kernels its planner makes of each group) and its measurement (the same
clock and statistic, through `NativeCpuBackend`), its drift probe the same three benchmarks
timed on the executor's step clock, against its calibration's points.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import onnxruntime as ort

import onnxlens
from onnxlens.analyzer.analysis import AnalysisResult
from onnxlens.analyzer.calibration import Calibration, apply_calibration, find_calibration
from onnxlens.analyzer.hardware import HOST_RUNTIMES, ORT_CPU
from onnxlens.analyzer.host import host_profile
from onnxlens.analyzer.runtimes import op_class
from onnxlens.backends.base import input_specs, load_proto, pin_dims, random_inputs
from onnxlens.backends.calibrate.catalogue import benchmarks
from onnxlens.backends.calibrate.fit import describe_fit_check
from onnxlens.backends.calibrate.measure import PREPARE, BackendSession, run_calibration
from onnxlens.backends.native_cpu import NativeCpuBackend
from onnxlens.backends.ort_timing import Runnable, make_session, time_session
from onnxlens.exporters.torch_export import cached_export

MODELS = ("resnet18", "resnet50", "vgg11", "densenet121", "googlenet", "squeezenet1_0",
          "mobilenet_v2", "mobilenet_v3_large", "mnasnet1_0", "efficientnet_b0",
          "shufflenet_v2_x1_0", "regnet_y_400mf", "convnext_tiny", "vit_b_16", "swin_t")
IMAGE_SIZE = 224
TARGETS = {"median": 0.08, "within_10": 0.75, "within_25": 1.0}
# The drift probe: coarse-tier calibration benchmarks (always timed), each well above the
# microseconds of fixed run-call cost the calibration takes out and this probe does not.
PROBES = ("MatMul 256x512x512", "Conv 3x3/1 64->64 @24", "Relu 2097152")
PROBE_MIN_TIME_S = 0.07  # per benchmark per probe: the calibration's window at a 100 s budget


@dataclass(frozen=True)
class Row:
    model: str
    measured_s: float  # the fastest round's median
    rounds_s: tuple[float, ...]  # each round's median
    estimated_s: float
    naive_s: float
    groups: int
    unknown_groups: int  # groups without a cost: the estimate leaves them out
    by_class_s: dict[str, float]
    drift: float | None = None  # probe now / probe at calibration, in the kept round

    @property
    def error(self) -> float:
        return self.estimated_s / self.measured_s - 1

    @property
    def corrected_error(self) -> float | None:
        """The estimate scaled by the machine-state ratio: a diagnostic of how much of the
        error is the machine having changed since the calibration. Not a fit: the ratio comes
        from fixed synthetic benchmarks timed next to the model, nothing is tuned on the
        models' measurements, and the raw error stays the result."""
        if self.drift is None:
            return None
        return self.estimated_s * self.drift / self.measured_s - 1

    @property
    def naive_error(self) -> float:
        return self.naive_s / self.measured_s - 1


def calibration(threads: int, recalibrate: bool, budget_s: float, backend: str
                ) -> Calibration:
    cal = None if recalibrate else find_calibration(threads, backend=backend)
    if cal is None:
        print(f"calibrating this host at {threads} thread(s) through {backend} (about "
              f"{budget_s:g} s) ...", file=sys.stderr, flush=True)
        cal = run_calibration(threads, budget_s=budget_s, backend=backend)
        print(f"saved {cal.save()}", file=sys.stderr)
    return cal


def estimate(result: AnalysisResult, cal: Calibration
             ) -> tuple[float, float, int, int, dict[str, float]]:
    """Calibrated and naive estimates (seconds) of the analyzed model (`onnxlens.analyze`,
    named dims pinned as `--dim` does), at the graph's own precision (fp32 for an fp32 graph;
    each group's for a quantized or fp16 one), groups, groups without a cost, and estimated
    seconds per class."""
    hw = apply_calibration(host_profile(cal.threads), cal)
    node_costs = {k: nc.cost for k, nc in result.node_costs.items()}
    est = result.estimate(hw, None, cal.efficiency)
    by_class: dict[str, float] = defaultdict(float)
    for g in result.groups:
        ge = est.groups[g.id]
        if ge is not None:
            by_class[op_class(result.graph, g, node_costs)] += ge.latency_s
    naive = 2 * result.total.macs / (cal.gemm_tflops * 1e12)
    unknown = sum(ge is None for ge in est.groups.values())
    return est.latency_s, naive, len(result.groups), unknown, dict(by_class)


class Probe:
    """The drift probe: `PROBES` timed through the calibration's own timer of its backend
    (ORT's, or the native executor's step clock), against the times the calibration recorded
    for them (its `points`, plus the per-kernel overhead it took out; the fixed cost of a run
    call it also took out, a few microseconds through ORT, stays in).
    The calibration kept the fastest of five passes' medians and a probe is one median, so
    a ratio reads a little above 1 on an unchanged machine."""

    def __init__(self, cal: Calibration) -> None:
        recorded = {p.name: p.seconds for p in cal.points}
        builds = {b.name: b.build for b in benchmarks() if b.name in PROBES}
        names = [n for n in PROBES if n in recorded and n in builds]
        self.reference = {n: recorded[n] + cal.kernel_overhead_us * 1e-6 for n in names}
        self.timers = {n: PREPARE[cal.backend](builds[n](), cal.threads) for n in names}
        self.spent_s = 0.0

    def __call__(self) -> dict[str, float]:
        """Each probe benchmark's median now (seconds)."""
        start = time.perf_counter()
        out = {n: timer(PROBE_MIN_TIME_S) for n, timer in self.timers.items()}
        self.spent_s += time.perf_counter() - start
        return out

    def ratio(self, seconds: dict[str, float]) -> float | None:
        """Geometric mean of probe now / probe at calibration (None without a probe)."""
        names = [n for n in self.reference if n in seconds]
        if not names:
            return None
        return math.exp(statistics.fmean(math.log(seconds[n] / self.reference[n])
                                         for n in names))


def measured(path: Path, threads: int, runs: int, backend: str,
             dims: dict[str, int] | None = None) -> float:
    """Median of `runs` runs after 3 warm-up runs (CPU time at one thread, else wall), on
    random inputs of the named dims pinned to `dims` (an attention mask all ones)."""
    clock = "cpu" if threads == 1 else "wall"
    specs = pin_dims(input_specs(load_proto(path, weights=False)), dims or {})
    feeds = random_inputs(specs, count=1, batch=1)[0]
    if backend == ORT_CPU:
        session: Runnable = make_session(path, threads)
    else:
        native = NativeCpuBackend(threads)
        native.prepare(path)
        session = BackendSession(native.run)
    return time_session(session, feeds, runs=runs, warmup=3, clock=clock).median_s


def measurement_key(path: Path, threads: int, runs: int, backend: str) -> str:
    """What a cached measurement is valid for: the model file, threads, runs, the backend
    and ORT's version."""
    suffix = "" if backend == ORT_CPU else f" {backend}"
    return f"{path.name} t{threads} r{runs} ort{ort.__version__}{suffix}"


Probes = dict[str, list[dict[str, float]]]  # model -> per round: probe benchmark -> seconds


def measure_all(paths: dict[str, Path], threads: int, runs: int, rounds: int,
                cache: Path | None, probe: Probe, backend: str = ORT_CPU
                ) -> tuple[dict[str, list[float]], Probes]:
    """Each model's round medians (`paths`: name -> model file), and the probe timed right
    before each (cached ones reused, with the probes cached beside them, if any)."""
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache and cache.is_file() else {}
    models = list(paths)
    keys = {m: measurement_key(paths[m], threads, runs, backend) for m in models}
    out = {m: saved[keys[m]] for m in models if len(saved.get(keys[m], ())) >= rounds}
    probes: Probes = {m: saved.get(keys[m] + " probe", []) for m in out}
    todo = [m for m in models if m not in out]
    for m in todo:
        out[m], probes[m] = [], []
    for r in range(rounds if todo else 0):
        for model in todo:
            print(f"\rmeasuring: round {r + 1}/{rounds}, {model:24s}", end="",
                  file=sys.stderr, flush=True)
            probes[model].append(probe())
            out[model].append(measured(paths[model], threads, runs, backend))
    print(file=sys.stderr)
    if cache and todo:
        for m in todo:
            saved[keys[m]] = out[m]
            saved[keys[m] + " probe"] = probes[m]
        cache.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    return out, probes


def kept_drift(medians: list[float], probes: list[dict[str, float]], probe: Probe
               ) -> float | None:
    """The drift ratio of the round whose median is kept (the fastest)."""
    kept = medians.index(min(medians))
    return probe.ratio(probes[kept]) if kept < len(probes) else None


def summary(errors: list[float]) -> dict[str, float]:
    magnitude = [abs(e) for e in errors]
    return {"median": statistics.median(magnitude),
            "within_10": sum(e <= 0.10 for e in magnitude) / len(magnitude),
            "within_25": sum(e <= 0.25 for e in magnitude) / len(magnitude),
            "max": max(magnitude)}


def print_summary(models: int, ours: dict[str, float], corrected: dict[str, float] | None,
                  naive: dict[str, float], targets: dict[str, float] = TARGETS) -> None:
    """Raw (the result), drift-corrected (a diagnostic) and naive, side by side, beside the
    `targets` (summary key -> goal)."""
    print(f"\n{models} models with complete estimates"
          f"\n{'':24s}{'calibrated':>12s}{'corrected':>12s}{'naive':>12s}{'target':>10s}")
    labels = {"median": "median |error|", "within_10": "within 10%", "within_25": "within 25%",
              "max": "largest |error|"}
    for key, label in labels.items():
        target = f"{targets[key]:.0%}" if key in targets else ""
        fixed = f"{corrected[key]:12.1%}" if corrected else f"{'-':>12s}"
        print(f"{label:24s}{ours[key]:12.1%}{fixed}{naive[key]:12.1%}{target:>10s}")


def describe_calibration(cal: Calibration) -> str:
    """The calibration's measured numbers, as printed above the table."""
    lines = [f"calibration {cal.created}, {cal.threads} thread(s), {cal.duration_s:.0f} s: "
             f"peak {cal.peak_fp32_tflops * 1e3:.1f} GFLOP/s, best GEMM "
             f"{cal.gemm_tflops * 1e3:.1f} GFLOP/s, {cal.kernel_overhead_us:.2f} us/kernel, "
             + ", ".join(f"{k} {v:.1f} GB/s" for k, v in
                         sorted(cal.bandwidth_gbps.items(), key=lambda kv: -kv[1]))]
    lines += [f"  {cls:12s} e_max {c.e_max:.3f}  f_half {c.f_half:9.3g}  i_half {c.i_half:6.3g}"
              f"  ({c.points} benchmarks, mean |log error| {c.log_error:.2f})"
              for cls, c in cal.curves.items()]
    lines.append(f"a transcendental costs {cal.transcendental_flops:.2f} plain FLOPs; denormal "
                 f"MatMul factor {cal.denormal_factor:.1f}; cold weights fetched at "
                 f"{cal.cold_weight_gbps:.1f} GB/s, depthwise filter lines at "
                 f"{cal.cold_line_ns:.1f} ns, a cold kernel {cal.cold_kernel_us:.2f} us\n"
                 f"{describe_fit_check(cal)}")
    return "\n".join(lines)


def measure_rows(paths: dict[str, Path], cal: Calibration, args: argparse.Namespace
                 ) -> tuple[list[Row], Probe, Probes]:
    """Estimate, then measure (`measure_all`), each model in `paths` and print its row;
    `args`: threads, runs, rounds, measured_cache, backend, breakdown. Also the drift probe
    and its timings."""
    clock = "CPU time" if args.threads == 1 else "wall"
    estimates = {m: estimate(onnxlens.analyze(path), cal) for m, path in paths.items()}
    probe = Probe(cal)
    none = "none (the calibration has none of its benchmarks)"
    print(f"drift probe: {', '.join(probe.reference) or none}"
          + "".join(f"; {n} {t * 1e3:.3f} ms at calibration"
                    for n, t in probe.reference.items()))
    start = time.perf_counter()
    rounds, probes = measure_all(paths, args.threads, args.runs, args.rounds,
                                 args.measured_cache, probe, args.backend)
    spent = time.perf_counter() - start
    print(f"measuring took {spent:.0f} s, of which the probe {probe.spent_s:.1f} s "
          f"({probe.spent_s / max(spent, 1e-9):.1%})")
    width = max(20, *map(len, paths))
    print(f"\n{'model':{width}s} {'groups':>6s} {'measured':>10s} {'estimated':>10s} "
          f"{'error':>7s} {'naive':>9s} {'error':>7s} {'drift':>6s} {'corr.':>7s}   (ms; "
          f"measured: fastest of {args.rounds} rounds' medians of {args.runs} runs, {clock}; "
          "drift: probe now / at calibration, in that round; corr.: error of the estimate x "
          "drift)")
    rows = []
    for model in paths:
        row = Row(model, min(rounds[model]), tuple(rounds[model]), *estimates[model],
                  drift=kept_drift(rounds[model], probes[model], probe))
        rows.append(row)
        drift = ("-", "-") if row.drift is None else (f"{row.drift:.2f}",
                                                       f"{row.corrected_error:+.1%}")
        print(f"{model:{width}s} {row.groups:6d} {row.measured_s * 1e3:10.2f} "
              f"{row.estimated_s * 1e3:10.2f} {row.error:+7.1%} {row.naive_s * 1e3:9.2f} "
              f"{row.naive_error:+7.1%} {drift[0]:>6s} {drift[1]:>7s}   rounds "
              + " ".join(f"{t * 1e3:.1f}" for t in row.rounds_s) + "   drift "
              + " ".join(f"{d:.2f}" for r in probes[model]
                         if (d := probe.ratio(r)) is not None)
              + (f"   INCOMPLETE: {row.unknown_groups} groups without a cost, not in the "
                 "summary" if row.unknown_groups else ""))
        if args.breakdown:
            print("      " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in
                                      sorted(row.by_class_s.items(), key=lambda kv: -kv[1])))
    return rows, probe, probes


def summaries(rows: list[Row], targets: dict[str, float] = TARGETS
              ) -> tuple[dict[str, float], dict[str, float] | None, dict[str, float]]:
    """Calibrated, drift-corrected (None without a probe) and naive summaries over the rows
    whose estimates are complete, printed side by side."""
    complete = [r for r in rows if not r.unknown_groups]
    ours = summary([r.error for r in complete])
    naive = summary([r.naive_error for r in complete])
    drifted = [r.corrected_error for r in complete if r.corrected_error is not None]
    corrected = summary(drifted) if drifted else None
    print_summary(len(complete), ours, corrected, naive, targets)
    if len(drifted) < len(complete):
        print(f"corrected: over the {len(drifted)} models with a probe (cached measurements "
              "taken before the probe have none)")
    return ours, corrected, naive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runtime", "--backend", dest="backend", choices=HOST_RUNTIMES,
                    default=ORT_CPU, help="the runtime calibrated, estimated and measured "
                    "(analyze's --runtime; --backend: the same)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of measurement (fastest kept)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--recalibrate", action="store_true", help="measure this host again")
    ap.add_argument("--budget", type=float, default=100.0, help="calibration budget, seconds")
    ap.add_argument("--breakdown", action="store_true", help="estimated ms per op class")
    ap.add_argument("--json", type=Path, help="write the rows and summaries here")
    ap.add_argument("--measured-cache", type=Path,
                    help="JSON file of measured round medians to reuse and extend")
    args = ap.parse_args(argv)

    cal = calibration(args.threads, args.recalibrate, args.budget, args.backend)
    print(describe_calibration(cal))
    paths = {m: cached_export(m, image_size=IMAGE_SIZE) for m in args.models}
    rows, probe, probes = measure_rows(paths, cal, args)
    ours, corrected, naive = summaries(rows)
    met = (ours["median"] <= TARGETS["median"] and ours["within_10"] >= TARGETS["within_10"]
           and ours["within_25"] >= TARGETS["within_25"])
    better = (ours["median"] < naive["median"] and ours["within_10"] > naive["within_10"]
              and ours["within_25"] >= naive["within_25"] and ours["max"] < naive["max"])
    print(f"targets met: {'yes' if met else 'no'}; better than naive on every figure: "
          f"{'yes' if better else 'no'}")
    if args.json:
        args.json.write_text(json.dumps({
            "calibration": {k: v for k, v in cal.to_dict().items() if k != "points"},
            "runs": args.runs, "rounds": args.rounds,
            "clock": "CPU time" if args.threads == 1 else "wall",
            "rows": [asdict(r) for r in rows],
            "probe": {"benchmarks_s_at_calibration": probe.reference,
                      "rounds_s": probes, "seconds": probe.spent_s},
            "summary": {"calibrated": ours, "drift_corrected": corrected, "naive": naive}},
            indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
