"""native-cpu against ONNX Runtime's CPU provider: latency ratios and GFLOP/s per fused group.

    python benchmarks/native_vs_ort.py                   # resnet18, resnet50, mobilenet_v2,
                                                          # vit_b_16 at 1 and 2 threads, batch 1, 8
    python benchmarks/native_vs_ort.py --models resnet18 --threads 1 --batch 1 --runs 20
    python benchmarks/native_vs_ort.py --groups 8         # also the 8 slowest groups of each
    python benchmarks/native_vs_ort.py --ort-level extended  # ORT without its layout passes

Everything is measured in one run: for each model, batch and thread count both backends are
prepared, then timed in alternation (native, ORT, native, ORT, ...), so that a machine shared
with other jobs slows both alike; the ratio is native / ORT of the medians (below 1: native is
faster). The ratio of the fastest runs is printed too: on a loaded machine it is the better
guess of what each backend does when it has the cores to itself. Each model is exported once
at each batch (torchvision, random weights, BatchNorm folded) into the onnxlens cache.

Per group: the executor's own step times (median of profiled runs) against the analyzer's FLOPs
of the same group (the cost model's formulas, 2 FLOPs per MAC) give achieved GFLOP/s, set
beside the host roofline at that thread count: min(peak, FLOPs / bytes x main-memory bandwidth)
with the host profile's detected peak (`analyzer.host`).

`--ort-level extended` runs ORT at ORT_ENABLE_EXTENDED, which leaves out the layout passes of
ORT_ENABLE_ALL (the NCHWc transformer of the CPU provider): ORT on the layout native-cpu runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from onnxlens.analyzer.host import host_profile
from onnxlens.backends.base import Backend, input_specs, load_proto, random_inputs
from onnxlens.backends.native_cpu import NativeCpuBackend
from onnxlens.backends.ort import OrtBackend
from onnxlens.backends.ort_timing import session_options
from onnxlens.exporters.torch_export import cached_export

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "vit_b_16")
LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}


@dataclass
class Row:
    model: str
    batch: int
    threads: int
    native_s: float  # medians
    ort_s: float
    native_min_s: float
    ort_min_s: float
    gflop: float

    @property
    def ratio(self) -> float:
        return self.native_s / self.ort_s


def side_by_side(a: Backend, b: Backend, feeds: dict[str, np.ndarray], runs: int,
                 warmup: int, pause: float) -> tuple[list[float], list[float]]:
    """Seconds of each run of `a.run` and `b.run`, timed in alternation, `pause` seconds
    apart: both thread pools spin-wait for a while after a run, and a pool still spinning
    would take a core from the other backend's next run."""
    for _ in range(warmup):
        a.run(feeds)
        b.run(feeds)
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(runs):
        for backend, times in ((a, ta), (b, tb)):
            time.sleep(pause)
            start = time.perf_counter()
            backend.run(feeds)
            times.append(time.perf_counter() - start)
    return ta, tb


def group_table(native: NativeCpuBackend, feeds: dict[str, np.ndarray], threads: int,
                top: int) -> list[str]:
    """The `top` slowest groups: time, achieved GFLOP/s, roofline GFLOP/s."""
    result = native.prepared.result
    hw = host_profile(threads)
    peak, bandwidth = hw.peak_flops("fp32"), hw.main_memory.bandwidth_gbps * 1e9
    profile = native.profile(feeds, runs=5, warmup=1)
    rows = []
    for kernel, group in zip(profile.kernels, result.groups, strict=True):
        cost = result.group_costs[group.id].cost
        flops = cost.flops(2) if cost else 0
        moved = (cost.bytes_read + cost.bytes_written) if cost else 0
        roof = min(peak, flops / moved * bandwidth) if moved else peak
        rows.append((kernel.duration_s, group.pattern, kernel.name, flops, roof))
    rows.sort(reverse=True)
    lines = ["| group | pattern | ms | share | GFLOP/s | roofline GFLOP/s |",
             "|---|---|---|---|---|---|"]
    total = sum(r[0] for r in rows)
    for seconds, pattern, name, flops, roof in rows[:top]:
        lines.append(f"| `{name}` | {pattern} | {seconds * 1e3:.2f} | {seconds / total:.0%} | "
                     f"{flops / seconds / 1e9 if seconds else 0:.1f} | {roof / 1e9:.0f} |")
    return lines


class LeveledOrt(OrtBackend):
    """ORT's CPU provider at another graph optimization level than ORT_ENABLE_ALL."""

    def __init__(self, threads: int, level: str) -> None:
        super().__init__("cpu", threads)
        self.level = LEVELS[level]

    def prepare(self, model: object) -> None:  # a path: cached_export's
        options = session_options(self.threads)
        options.graph_optimization_level = self.level
        self._model = str(model)
        self._session = self._new_session(self._model, options)


def measure(model: str, batch: int, threads: int, runs: int, warmup: int, top: int,
            pause: float, ort_level: str = "all") -> tuple[Row, list[str]]:
    path = cached_export(model, batch=batch)
    native = NativeCpuBackend(threads)
    theirs_backend = LeveledOrt(threads, ort_level)
    native.prepare(path)
    theirs_backend.prepare(path)
    feeds = random_inputs(input_specs(load_proto(path, weights=False)), count=1, batch=batch)[0]
    ours, theirs = side_by_side(native, theirs_backend, feeds, runs, warmup, pause)
    gflop = native.prepared.result.totals["flops"] / 1e9
    table = group_table(native, feeds, threads, top) if top else []
    return Row(model, batch, threads, statistics.median(ours), statistics.median(theirs),
               min(ours), min(theirs), gflop), table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--groups", type=int, default=0, help="slowest groups to list")
    parser.add_argument("--pause", type=float, default=0.05,
                        help="seconds between timed runs (spinning thread pools settle)")
    parser.add_argument("--ort-level", choices=sorted(LEVELS), default="all",
                        help="ORT's graph optimization level (extended: no NCHWc layout)")
    args = parser.parse_args(argv)
    print("| model | batch | threads | native ms | ORT ms | native / ORT | fastest runs: "
          "native / ORT | native GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    tables = []
    for model in args.models.split(","):
        for batch in map(int, args.batch.split(",")):
            for threads in map(int, args.threads.split(",")):
                row, table = measure(model, batch, threads, args.runs, args.warmup, args.groups,
                                     args.pause, args.ort_level)
                print(f"| {model} | {batch} | {threads} | {row.native_s * 1e3:.1f} | "
                      f"{row.ort_s * 1e3:.1f} | {row.ratio:.2f} | "
                      f"{row.native_min_s / row.ort_min_s:.2f} | "
                      f"{row.gflop / row.native_min_s:.0f} |", flush=True)
                if table:
                    tables.append((f"{model}, batch {batch}, {threads} thread(s)", table))
    for title, table in tables:
        print(f"\n{title}:\n" + "\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
