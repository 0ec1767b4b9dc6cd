"""The measuring harness of `onnxlens calibrate`: a timer per benchmark graph and backend,
the calibration run (timing passes, then the fit), the cold-weight and denormal probes.
"""


from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ...analyzer.analysis import AnalysisResult, analyze
from ...analyzer.calibration import (
    DEFAULT_BACKEND,
    Calibration,
    Point,
)
from ...analyzer.cost.base import Cost
from ...analyzer.errors import UsageError
from ...analyzer.hardware import (
    GPU_RUNTIMES,
    NATIVE_CPU,
    ORT_CPU,
    HardwareProfile,
    load_profile,
)
from ...analyzer.host import host_profile
from ...analyzer.runtimes import Kernel, op_class
from ...analyzer.runtimes.ort_cpu import depthwise_filter_lines, nchwc_block, ort_kernels
from ..base import BackendError, input_specs, random_inputs
from ..ort_timing import (
    NodeTime,
    make_session,
    profile_model,
    profile_runs,
    random_feeds,
    time_session,
)
from .catalogue import (
    CHAIN,
    COLD_CHAINS,
    COLD_FILTER_CHAINS,
    FLUSH,
    Bench,
    benchmarks,
    chain,
    conv_chain,
    depthwise_chain,
    flushed,
    value_info,
)
from .fit import cold_weight_rate, fit, fit_copy_fixed, fit_line

# ORT's NCHWc layout changes around a lone Conv or pool: not part of the op's own time.
LAYOUT_KERNELS = ("ReorderInput", "ReorderOutput")
# Its NHWC ones around a lone QLinearConv (uint8 Transposes), which in a network sit only at
# the ends of a run of quantized convolutions (ResNet-18 QDQ: 2 of 36 kernels).
NHWC_KERNELS = ("Transpose",)
NCHWC = "com.microsoft.nchwc"
NCHWC_OPS = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
PASSES = 5  # timings of each benchmark, spread over the run; the fastest median is kept


# ---- measuring ---------------------------------------------------------------------------------

Timer = Callable[[float], float]  # min_time_s -> the median run (seconds) over that long
Prepare = Callable[[onnx.ModelProto, int], Timer]


def prepare_ort(model: onnx.ModelProto, threads: int) -> Timer:
    """A timer of `model` on ORT's CPU provider: each call gives the median run over at least
    its `min_time_s` (3 runs at least), on the CPU clock at one thread, wall time otherwise
    (the statistic models are measured with: a minimum over hundreds of runs of a tiny kernel
    would flatter it).

    A lone Conv or pool is run by ORT in NCHWc layout between a ReorderInput and a
    ReorderOutput, which in a network sit only at the ends of a run of convolutions: such a
    graph is timed as ORT optimized it, less those layout kernels. An attention block is
    timed without its Softmax (`without_softmax`).
    """
    model = without_softmax(model)
    if any(node.op_type in NCHWC_OPS for node in model.graph.node):
        with tempfile.TemporaryDirectory(prefix="onnxlens-calibrate-") as tmp:
            path = str(Path(tmp) / "optimized.onnx")
            kernels = profile_model(model, threads, runs=1, warmup=0, optimized_model_path=path)
            layout = LAYOUT_KERNELS + (NHWC_KERNELS if any(
                k.op_type == "QLinearConv" for k in kernels[0]) else ())
            if any(k.op_type in layout for k in kernels[0]):
                model = without_layout(onnx.load(path), kernels[0], layout)
    session = make_session(model, threads)
    feeds = random_feeds(session)
    clock = "cpu" if threads == 1 else "wall"
    return lambda min_time_s: time_session(session, feeds, runs=3, warmup=1,
                                           min_time_s=min_time_s, clock=clock).median_s


def prepare_native(model: onnx.ModelProto, threads: int) -> Timer:
    """A timer of `model` on the native executor (`native-cpu`): each call gives the median,
    over at least `min_time_s` (3 runs at least), of the run's steps as the executor times
    them (one step per fused group, so nothing is cut off). A run call also copies the inputs
    into the arena and the outputs out of it, which in a network happens once at its ends but
    in a one-op benchmark is most of its traffic (a Relu of 2^21 floats copied in, computed and
    copied out moves three times its own bytes), as ORT's bound inputs and outputs leave out.
    BackendError if it cannot run the graph."""
    from ..native_cpu import NativeCpuBackend

    backend = NativeCpuBackend(threads)
    backend.prepare(model)
    feeds = random_inputs(input_specs(model), count=1, batch=1)[0]
    backend.run(feeds)  # plans for these shapes, and warms up
    prepared = backend.prepared

    def timer(min_time_s: float) -> float:
        prepared.run(feeds)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < min_time_s:
            times.append(sum(prepared.run(feeds)[1]))
        return statistics.median(times)
    return timer


class BackendSession:
    """A backend's `run` seen as an ORT session's, for `time_session`."""

    def __init__(self, run: Callable[[dict[str, np.ndarray]], object]) -> None:
        self._run = run

    def run(self, _names: None, feeds: dict[str, np.ndarray]) -> object:
        return self._run(feeds)


def prepare_gpu(backend: str) -> Prepare:
    """A timer of a graph on GPU backend `backend` (ort-cuda, native-cuda), through its own
    `time` (a synchronized run, wall clock): each call times enough runs to fill `min_time_s`
    (3 at least) and gives their median. BackendUnavailable where there is no GPU."""
    def prepare(model: onnx.ModelProto, threads: int) -> Timer:
        from ..registry import create

        gpu = create(backend, threads=threads)
        gpu.prepare(model)
        feeds = random_inputs(input_specs(model), count=1, batch=1)[0]
        first = gpu.time(feeds, warmup=2, runs=3).median_s

        def timer(min_time_s: float) -> float:
            runs = max(3, math.ceil(min_time_s / max(first, 1e-7)))
            return gpu.time(feeds, warmup=1, runs=runs).median_s
        return timer
    return prepare


PREPARE: dict[str, Prepare] = {ORT_CPU: prepare_ort, NATIVE_CPU: prepare_native,
                               **{b: prepare_gpu(b) for b in GPU_RUNTIMES}}
# What every calibration of a GPU runtime says: its fitting is tested on synthetic timings only.
GPU_NOT_VALIDATED = ("not validated on a GPU: this fit of GPU timings has been tested only "
                     "on synthetic timings; read its fit check before trusting it")


def without_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """An attention block (a Softmax between two MatMuls) with its Softmax cut out, the second
    MatMul reading the scores; any other graph as it is. ORT runs the Softmax as a kernel of
    its own, which the estimator costs apart at the softmax class
    (`ort_attention.in_attention_block`): the attention class is its products' time."""
    graph = model.graph
    ops = [n.op_type for n in graph.node]
    if "Softmax" not in ops or ops.count("MatMul") < 2:
        return model
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    softmax = next(n for n in cut.graph.node if n.op_type == "Softmax")
    for node in cut.graph.node:
        node.input[:] = [softmax.input[0] if x == softmax.output[0] else x for x in node.input]
    cut.graph.node.remove(softmax)
    return cut


def without_layout(optimized: onnx.ModelProto, kernels: Sequence[NodeTime],
                   layout: Sequence[str] = LAYOUT_KERNELS) -> onnx.ModelProto:
    """ORT's optimized graph with its layout changes (`layout`: ReorderInput /
    ReorderOutput, the Transposes around a QLinearConv) at the graph's input and output cut
    off: the kernel's side becomes a graph input or output, of the shape ORT's profiler
    reports and the type of the graph's tensor it stood for."""
    by_name = {k.name: k for k in kernels}
    graph = optimized.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    ins = [n for n in graph.node if n.op_type in layout and n.input[0] in types]
    outs = [n for n in graph.node if n.op_type in layout and n.output[0] in types]
    nodes = [n for n in graph.node if n not in ins and n not in outs]
    used = {name for n in nodes for name in n.input}
    made = {name for n in nodes for name in n.output}
    inputs = [*(v for v in graph.input if v.name in used),
              *(value_info(n.output[0], by_name[n.name].output_shapes[0], types[n.input[0]])
                for n in ins)]
    outputs = [*(v for v in graph.output if v.name in made),
               *(value_info(n.input[0], by_name[n.name].input_shapes[0], types[n.output[0]])
                 for n in outs)]
    cut = helper.make_graph(nodes, graph.name, inputs, outputs,
                            [t for t in graph.initializer if t.name in used])
    return helper.make_model(cut, ir_version=optimized.ir_version,
                             opset_imports=list(optimized.opset_import))


# ---- the calibration run -----------------------------------------------------------------------

def run_calibration(threads: int, *, budget_s: float = 100, progress: bool = True,
                    backend: str = DEFAULT_BACKEND, prepare: Prepare | None = None,
                    profile: str | None = None) -> Calibration:
    """Measure this host at `threads` through `backend` (`ort-cpu` or `native-cpu`), or the GPU
    of profile `profile` (a100, h100, a .toml) through a GPU backend (`ort-cuda`,
    `native-cuda`), within about `budget_s` seconds and fit a Calibration (not saved:
    `Calibration.save()` puts it in the cache dir). `progress` shows a rich progress bar on
    stderr. `prepare` makes a benchmark graph's timer (default: the backend's; tests give a
    fake). A benchmark the backend cannot run is left out.

    Every benchmark is timed in PASSES passes, alternately forwards and backwards through the
    list, and its fastest median kept: on a shared machine other processes slow it down in
    bursts, which rarely hit one benchmark every time.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if backend not in PREPARE:
        raise UsageError(f"backend {backend!r}: expected one of {', '.join(PREPARE)}")
    prepare = prepare or PREPARE[backend]
    start = time.perf_counter()
    hw = _base_profile(backend, profile, threads)
    benches = benchmarks(backend)
    min_time_s = max(0.01, 0.15 * budget_s / len(benches))
    models: dict[str, onnx.ModelProto] = {}
    timers: dict[str, Timer] = {}
    samples: dict[str, float] = {}
    refused: set[str] = set()
    order = [b for i in range(PASSES) for b in (benches if i % 2 == 0 else benches[::-1])]
    with _progress_bar(progress, len(order)) as advance:
        for i, bench in enumerate(order):
            advance(bench.name)
            if bench.name in refused:
                continue
            new = bench.name not in timers
            expected = (0.1 if new else 0.0) + max(min_time_s, 4 * bench.work)
            if time.perf_counter() - start + expected > budget_s and (
                    bench.tier > 0 or i >= len(benches)):
                continue
            if new:
                models[bench.name] = bench.build()
                try:
                    timers[bench.name] = prepare(models[bench.name], threads)
                except BackendError:
                    refused.add(bench.name)
                    continue
            seconds = timers[bench.name](min_time_s)
            samples[bench.name] = min(seconds, samples.get(bench.name, seconds))
    timers.clear()  # the sessions and their buffers
    fixed_s, kernel_s, copy_ns, part_ns = _chain_fits(benches, models, samples)
    kernels = _kernels_of(backend, hw)
    points = [p for b in benches if b.name in samples and CHAIN not in b.name
              for p in [_point(b.name, models[b.name], samples[b.name], fixed_s, kernel_s,
                               kernels)] if p is not None]
    cal = fit(points, hw, threads, kernel_s)
    skipped = len(benches) - len(samples) - len(refused)
    notes = [GPU_NOT_VALIDATED] if backend in GPU_RUNTIMES else []
    if skipped:
        notes.append(f"{skipped} benchmark(s) skipped to stay within {budget_s:g} s")
    if refused:
        notes.append(f"{len(refused)} benchmark(s) {backend} cannot run: "
                     + ", ".join(sorted(refused)))
    on_ort = backend == ORT_CPU and prepare is PREPARE[ORT_CPU]  # probes through ORT's own
    factor = denormal_factor(threads) if on_ort else 1.0
    line_ns = cold_line_ns(threads) if on_ort else 0.0
    kernel_us = cold_kernel_us(threads) if on_ort else 0.0
    main_gbps = cal.bandwidth_gbps.get(hw.main_memory.name)
    # The native executor packs each Conv's weights into a buffer of its own, so the probe's
    # shared chain shares nothing: its difference is noise (four probes in a row here: 29.3,
    # 9.0, 8.9 and 0 GB/s). A network's weights, larger than the caches, stream from main
    # memory once per run: they are fetched at its fitted rate (0, not charged, when unfitted).
    cold = (main_gbps or 0.0) if backend == NATIVE_CPU else cold_weight_rate(
        cold_weight_gbps(1, prepare), threads, main_gbps or math.inf)
    return dataclasses.replace(cal, duration_s=time.perf_counter() - start, notes=notes,
                               backend=backend, denormal_factor=factor, cold_weight_gbps=cold,
                               cold_line_ns=line_ns, cold_kernel_us=kernel_us,
                               run_call_us=max(fixed_s, 0.0) * 1e6,
                               copy_fixed_ns=copy_ns, copy_part_ns=part_ns,
                               profile=hw.key if backend in GPU_RUNTIMES else "")


def _chain_fits(benches: list[Bench], models: dict[str, onnx.ModelProto],
                samples: dict[str, float]) -> tuple[float, float, dict[str, float], float]:
    """A run call's fixed cost and a kernel's overhead, the intercept and slope of the Relu
    chains' run time over their length (the slope at least 0), and the copy kernels' fixed
    costs from their chains (`fit_copy_fixed`)."""
    chain = {len(models[b.name].graph.node): samples[b.name]
             for b in benches if b.name.startswith(f"Relu{CHAIN}") and b.name in samples}
    fixed_s, kernel_s = fit_line(list(chain), list(chain.values()))
    kernel_s = max(kernel_s, 0.0)
    return (fixed_s, kernel_s, *fit_copy_fixed(samples, kernel_s))


def _base_profile(backend: str, profile: str | None, threads: int) -> HardwareProfile:
    """What the fit starts from: this host's CPU, or the GPU profile a GPU backend measures."""
    if backend not in GPU_RUNTIMES:
        if profile is not None:
            raise UsageError(f"--profile names the GPU a GPU backend measures; {backend} "
                             "measures this host's CPU")
        return host_profile(threads)
    if profile is None:
        raise UsageError(f"{backend} measures a GPU: name its profile with --profile "
                         "(a100, h100, ... or a .toml)")
    hw = load_profile(profile)
    if hw.kind != "gpu":
        raise UsageError(f"--profile {profile}: a {hw.kind} profile, not a GPU")
    return hw


def cold_weight_gbps(threads: int, prepare: Prepare = prepare_ort,
                     min_time_s: float = 0.05) -> float:
    """The rate at which a network's kernels fetch weights that are cold (last read one
    inference ago): over COLD_CHAINS, the weight bytes of the chain with a weight per layer
    over the time it takes beyond the same chain sharing one weight (each the fastest of
    three medians, the two alternating). Measured on this host (AMD EPYC, one thread):
    14-18 GB/s in every calibration and trial, below the L3's 42 and the DRAM's 19 GB/s streaming
    rates: the fetch does not hide behind the convolutions' MACs. 0 when no extra time shows
    (not measured; the estimator then charges nothing)."""
    extra_s = extra_bytes = 0.0
    for layers, channels, kernel, size in COLD_CHAINS:
        timers = {shared: prepare(conv_chain(layers, channels, kernel, size, shared), threads)
                  for shared in (True, False)}
        best = {shared: math.inf for shared in timers}
        for _ in range(3):
            for shared, timer in timers.items():
                best[shared] = min(best[shared], timer(min_time_s))
        extra_s += best[False] - best[True]
        extra_bytes += (layers - 1) * channels * channels * kernel * kernel * 4
    return extra_bytes / extra_s / 1e9 if extra_s > 0 else 0.0


def cold_line_ns(threads: int, layers: int = 8, runs: int = 30, repeats: int = 3) -> float:
    """What a depthwise NCHWc kernel pays per filter line the caches did not keep from the last
    run (`analyzer.runtimes.ort_cpu.cold_filter_lines`), over COLD_FILTER_CHAINS: each chain of
    `layers` Convs profiled with a filter per layer and with one shared, a Relu over 32 MB
    evicting every line between runs in both, so the two differ only in the filters' fetch;
    per chain the median Conv time (all but the first, which reads even the shared filter
    cold) of the one less the other, the median of `repeats` such pairs (the host drifts
    between sessions); summed over chains, over the filters' lines. Measured (AMD EPYC Zen 5,
    ORT 1.31, one thread): 9x9 168@7 51-57 us against 21-22, 7x7 384@12 55-77 against 36-55,
    3x3 960@7 20-21 against 15: 16-19 ns a line, near a main-memory miss apiece (single pairs
    at load 8-13: 10.6-22.6). 0 when no extra time shows."""
    def median_conv(shared: bool, channels: int, size: int, kernel: int) -> float:
        profile = profile_model(flushed(depthwise_chain(layers, channels, size, kernel, shared)),
                                threads, runs=runs)
        return statistics.median(t for run in profile for t in [
            t.duration_s for t in run if t.op_type == "Conv"][1:])

    extra_s, lines, block = 0.0, 0, nchwc_block(host_profile(threads))
    for shape in COLD_FILTER_CHAINS:
        extra_s += statistics.median(median_conv(False, *shape) - median_conv(True, *shape)
                                     for _ in range(repeats)) * (layers - 1)
        lines += (layers - 1) * depthwise_filter_lines(shape[0], shape[2] ** 2, block)
    return max(extra_s, 0.0) / lines * 1e9


def cold_kernel_us(threads: int, lengths: tuple[int, int] = (17, 129), runs: int = 100,
                   repeats: int = 3) -> float:
    """What a kernel pays when a run has evicted its state since the last (the runtime's
    kernel object, its arguments' records, the code it runs), beyond the calibrated per-kernel
    overhead: Relu chains on 16 floats (next to no work) of two `lengths`, profiled with a
    Relu over 32 MB between runs and without; the fastest run (less the flush's own kernel)
    grows with the length by more with the flush than without, the difference per kernel, the
    median of `repeats`. Every kernel of a network whose run moves more than the last-level
    cache keeps starts so. Measured (AMD EPYC Zen 5, ORT 1.31, one thread, the host loaded):
    single probes 0.4-1.6 us, where the Relu chain's fit reads a kernel's overhead hot. 0 when
    no extra time shows."""
    def fastest_run(model: onnx.ModelProto) -> float:
        return min(run_s - sum(t.duration_s for t in kernels if t.name == FLUSH)
                   for run_s, kernels in profile_runs(model, threads, runs=runs))

    def slope(flush: bool) -> float:
        short, long = (flushed(m) if flush else m for m in (chain(n).build() for n in lengths))
        return (fastest_run(long) - fastest_run(short)) / (lengths[1] - lengths[0])

    return max(statistics.median(slope(True) - slope(False) for _ in range(repeats)), 0.0) * 1e6


def denormal_factor(threads: int, min_time_s: float = 0.05) -> float:
    """How much slower ORT's MatMul runs on a left operand of float32 denormals (1e-40) than on
    normal numbers, on the shape of a shifted-window attention's P x V ([48, 49, 49] x
    [48, 49, 32], Swin-T's third stage): time_denormal / time_normal, each the median run over
    `min_time_s` (well under a second in all). x86 cores take a microcode assist on each
    denormal operand unless flush-to-zero is set, which ORT's CPU provider leaves off."""
    a, b = helper.make_tensor_value_info, TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "denormal",
                              [a("A", b, [48, 49, 49]), a("B", b, [48, 49, 32])],
                              [a("Y", b, [48, 49, 32])])
    session = make_session(helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17)]), threads)
    rng = np.random.default_rng(0)
    rhs = rng.random((48, 49, 32), dtype=np.float32)
    clock = "cpu" if threads == 1 else "wall"

    def median(lhs: np.ndarray) -> float:
        return time_session(session, {"A": lhs, "B": rhs}, runs=3, warmup=1,
                            min_time_s=min_time_s, clock=clock).median_s

    normal = median(rng.random((48, 49, 49), dtype=np.float32))
    return max(1.0, median(np.full((48, 49, 49), 1e-40, np.float32)) / normal)


# The kernels a runtime runs for a benchmark's one group, given its analysis and node costs;
# None: not a point of its fit.
KernelsOf = Callable[[AnalysisResult, dict[str, Cost | None]], list[Kernel] | None]


def _kernels_of(backend: str, hw: HardwareProfile) -> KernelsOf | None:
    """The kernel model a point of `backend` is read through, as the estimator will cost it:
    ORT's (NCHWc block of `hw`), the native executor's plan; None for a GPU runtime (one
    kernel of the group's class). A benchmark the native executor runs as several kernels
    (attention's MatMul, Softmax, MatMul; a quantized op's Casts around its program) is no
    point of its fit: its time is their sum, which no one kernel's curve explains (through
    ORT such a benchmark is read as its largest kernel, the others' time being small)."""
    if backend == ORT_CPU:
        block = nchwc_block(hw)
        return lambda result, costs: ort_kernels(result.graph, result.groups[0], costs, block)
    if backend == NATIVE_CPU:
        from ..native.kernel_model import NATIVE_CPU_MODEL

        def native(result: AnalysisResult, costs: dict[str, Cost | None]
                   ) -> list[Kernel] | None:
            group_costs = {g: gc.cost for g, gc in result.group_costs.items()}
            kernels = NATIVE_CPU_MODEL.kernels(result.graph, result.groups, costs,
                                               group_costs, hw, result.model)
            mine = kernels[result.groups[0].id]
            return mine if mine is not None and len(mine) == 1 else None
        return native
    return None


def _point(name: str, model: onnx.ModelProto, run_s: float, fixed_s: float,
           kernel_s: float, kernels_of: KernelsOf | None = None) -> Point | None:
    """The benchmark's group cost (onnxlens's analysis) and the time the estimator's
    max(compute, memory) term should give it: its fastest run less the fixed cost of a run
    call and one kernel overhead (the estimator adds its own). Read through the runtime's
    kernels (`kernels_of`) where given, as the estimator costs them: the class of its largest
    kernel (through ORT, a Conv off the NCHWc path is `grouped_conv`), that kernel's reuse,
    calls and copy runs, and the activation it runs as a pass over its output (MLAS's ReLU6
    or HardSwish; the native executor's epilogue program that its GEMM tile cannot apply)."""
    result = analyze(model)
    if len(result.groups) != 1:
        return None
    group = result.groups[0]
    cost = result.group_costs[group.id].cost
    seconds = run_s - fixed_s - kernel_s
    if cost is None or seconds <= 0:
        return None
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    nbytes = cost.bytes_read + cost.bytes_written
    kernels = kernels_of(result, costs) if kernels_of else []
    if kernels is None:
        return None
    if not kernels:
        return Point(name, op_class(result.graph, group, costs), cost.macs, cost.other_flops,
                     nbytes, seconds, transcendental=cost.transcendental)
    main = max(kernels, key=lambda k: k.cost.flops())
    # One kernel: its bytes, as the estimator costs them (a Slice, native or ORT's, reads only
    # the half it copies: `ort_cpu.gathered`; no other lone kernel's bytes of the catalogue
    # differ from its group's).
    if len(kernels) == 1:
        nbytes = main.cost.bytes_read + main.cost.bytes_written
    # Its largest kernel's work (less what ORT does not run: a quantized kernel's DQs): the
    # estimator costs the other kernels apart at their own classes, so their FLOPs in this
    # point would be charged to the main kernel's class (quantize_dynamic's depthwise Conv is
    # 6 kernels, whose DynamicQuantizeLinear, Cast, Mul and Add do 1.5 MFLOP to its 2.7: with them
    # the grouped ConvInteger curve read MobileNetV2's depthwise ConvIntegers 3x fast). Their
    # time stays in the point's (a few percent of a Conv's).
    work = main.cost + main.epilogue
    return Point(name, main.cls, work.macs, work.other_flops, nbytes, seconds, main.reuse,
                 main.calls, work.transcendental, main.epilogue.other_flops,
                 main.epilogue.transcendental, main.runs, main.rows,
                 main.elements, sum(k.libm_calls for k in kernels))


class _progress_bar:
    """A context giving `advance(label)`; a rich progress bar on stderr, or nothing."""

    def __init__(self, show: bool, total: int) -> None:
        self.show, self.total = show, total

    def __enter__(self) -> Callable[[str], None]:
        if not self.show:
            return lambda label: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"),
                            console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("", total=self.total)

        def advance(label: str) -> None:
            self.bar.update(task, advance=1, description=label)
        return advance

    def __exit__(self, *exc: object) -> None:
        if self.show:
            self.bar.stop()
