"""Latency and energy of each fused group on a hardware profile: a roofline with memory levels.

Per group g on profile h at precision p (derivation, README "Estimates"):

    compute_s  = (2·MACs / peak_p  +  V / peak_fp32) / eff(class, g)      # a kernel with MACs
               = V / (peak_fp32 · eff(vector))                          # one without
    V          = other_flops + (τ - 1) · transcendental                 # Cost.vector_flops
    bytes      = (bytes_read + bytes_written) · byte_scale(p)     # 1: as stored (Precision)
    level      = the fastest memory level whose size holds the group's working set
                 (its boundary tensors: inputs incl. weights, and outputs)
    memory_s   = bytes / min(bandwidth(level), copy_gbps(class))   # a blocked copy's own rate
    overhead_s = kernel_launch_us · 1e-6 + a copy's fixed cost    # per kernel
    compute_s += rows · norm_row_ns + libm_calls · libm_call_ns    (rows or values one at a time)
    memory_s  += runs · copy_run_ns + elements · copy_element_ns  (copy runs or single elements)
    latency_s  = max(compute_s, memory_s) + overhead_s            # compute and memory overlap
    bound      = "compute" | "memory:<level>" | "overhead", whichever term is largest
    energy_j   = FLOPs · pJ/FLOP(p) + bytes · pJ/byte(level) + static_w · latency_s

where `vector` is the group's own class for a vector kernel (VECTOR_CLASSES), else
`elementwise`, and τ what an exp, tanh or erf costs in plain vector FLOPs
(`runtime.transcendental_flops`, measured by a calibration; 1 otherwise). A kernel with MACs
runs its other work (bias, activation, a sum folded into it) in its epilogue, on values still in
registers, at the kernel's own rate (measured: an 803 KB residual sum folded into a 1x1 Conv
costs nothing measurable, 58 us alone). Approximations, signed: non-MAC FLOPs run on the vector
units at the fp32 peak (no tensor cores or systolic array); one τ for every transcendental
function but GELU's (its own class, `gelu`); the working-set rule ignores what the previous
group left in cache; a model's latency is its kernels' sum (no overlap).

Kernels of a runtime: a profile calibrated through a runtime (`runtime.name`) is estimated as
the kernels that runtime's `KernelModel` runs for the groups (`analyzer.runtimes`), each by
the roofline above (`cost_kernels`); an uncalibrated profile runs one kernel per group.

Refinements where a calibration measured them: weights fetched one run after their last read
(`cold_weights`), float32 denormal operands (`denormal_slowed`), a run call's fixed cost."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .calibration import OWN_VECTOR_CLASSES, VECTOR_CLASS, constant_efficiency
from .cost.base import Cost
from .fusion import Group
from .graph import ModelGraph
from .hardware import HardwareProfile, MemoryLevel, Precision, precision_for
from .loader import LoadedModel
from .memory import touched_bytes
from .runtimes import Kernel, KernelShape, kernel_model, roofline_kernel

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

# (op class, FLOPs, arithmetic intensity) -> achieved fraction of peak.
Efficiency = Callable[[str, float, float], float]

# Classes without MACs: a group of one of these runs its FLOPs at its own class's efficiency
# (those a calibration fits apart: pools, normalizations, reductions, ...); any other group's
# non-MAC FLOPs (bias, activation) run at `elementwise`'s.
VECTOR_CLASSES = (VECTOR_CLASS, *OWN_VECTOR_CLASSES, "data_movement")


@dataclass(frozen=True, slots=True)
class Bound:
    """The largest term of a roofline: `compute`, `memory` (of `level`) or `overhead`."""

    kind: str
    level: str | None = None

    def __str__(self) -> str:  # the JSON form: "compute", "memory:L2", "overhead"
        return self.kind if self.level is None else f"{self.kind}:{self.level}"


COMPUTE, OVERHEAD = Bound("compute"), Bound("overhead")


@dataclass(frozen=True, slots=True)
class GroupEstimate:
    latency_s: float
    energy_j: float
    bound: Bound
    intensity: float  # FLOPs per byte of boundary traffic (at the kernel's precision)
    compute_s: float
    memory_s: float
    overhead_s: float
    level: str


@dataclass(frozen=True)
class ModelEstimate:
    hardware: str
    profile: HardwareProfile
    precision: str  # GRAPH or a what-if (PRECISIONS)
    calibrated: bool
    groups: dict[int, GroupEstimate | None]  # None where the group's cost is unknown
    latency_s: float
    energy_j: float

    @property
    def complete(self) -> bool:
        return all(g is not None for g in self.groups.values())


def peak_seconds(cost: Cost, hw: HardwareProfile, precision: Precision) -> float:
    """A kernel's arithmetic at peak: its MACs at the precision's, its vector work V at
    fp32's (module docstring); a class's efficiency divides it."""
    return (2 * cost.macs / hw.peak_flops(precision.peak)
            + cost.vector_flops(hw.runtime.transcendental_flops) / hw.peak_flops("fp32"))


def estimate_group(cost: Cost, cls: str, hw: HardwareProfile, precision: Precision,
                   efficiency: Efficiency, **shape: Unpack[KernelShape]) -> GroupEstimate:
    """`cost` as one kernel of class `cls` (`estimate_kernel`), shaped by `shape`."""
    return estimate_kernel(roofline_kernel(cls, cost, **shape), hw, precision, efficiency)


def estimate_kernel(k: Kernel, hw: HardwareProfile, precision: Precision,
                    efficiency: Efficiency) -> GroupEstimate:
    """One kernel's roofline (module docstring); `launches` kernel overheads (0: its work runs
    inside another kernel). A kernel of `calls` GEMMs (a grouped convolution, a batched
    MatMul) reads its MAC efficiency at one call's FLOPs, so the per-call cost t0 is paid
    `calls` times: t = calls·t0 + F/(e·peak); with a `reuse`, a call's F is its GEMM's
    2·M·K·N alone and F / reuse its operands' bytes, whose level the curve reads (the
    epilogue's FLOPs had pushed ShuffleNet's depthwise calls past a 32 KB L1). Copying `runs`
    runs or `elements` single elements one at a time (ORT's Transposes) adds the calibrated
    per-run or per-element cost to the memory term (ORT 1.31, Zen 5: 2.2 ns an element, its
    bytes 0.1); normalizing `rows` one at a time, each a serial reduction (LayerNormalization,
    Softmax), `norm_row_ns` a row to the compute term (14 ns, 0.35 an element), and passing
    `libm_calls` values to libm alone (ORT's GQA softcap, a tanhf each) `libm_call_ns` each
    (3.1-6.4 ns). A blocked copy (an NCHWc reorder, MLAS's NCHW <-> NHWC Transpose) streams
    at most at its class's calibrated `runtime.copy_gbps`; a lone copy adds `copy_fixed_s`."""
    cost, cls, reuse, calls = k.cost, k.cls, k.reuse, k.calls
    nbytes = (cost.bytes_read + cost.bytes_written) * precision.byte_scale
    flops = cost.flops(2)
    intensity = flops / nbytes if nbytes else float("inf")
    vector_flops = cost.vector_flops(hw.runtime.transcendental_flops)
    if cost.macs:  # the epilogue at the kernel's rate (module docstring)
        call_flops = (2 * cost.macs if reuse else flops) / calls
        eff = efficiency(cls, call_flops, reuse or intensity)
    elif vector_flops:  # per call likewise (a per-axis QuantizeLinear's blocks)
        eff = efficiency(cls if cls in VECTOR_CLASSES else "elementwise", vector_flops / calls,
                         intensity)
    else:
        eff = 1.0  # no arithmetic
    compute_s = peak_seconds(cost, hw, precision) / eff + (
        k.rows * hw.runtime.norm_row_ns + k.libm_calls * hw.runtime.libm_call_ns) * 1e-9
    level = hw.memory_level(nbytes)
    gbps = min(level.bandwidth_gbps, hw.runtime.copy_gbps.get(cls, math.inf))
    memory_s = nbytes / (gbps * 1e9) + (
        k.runs * hw.runtime.copy_run_ns + k.elements * hw.runtime.copy_element_ns) * 1e-9
    overhead_s = k.launches * (hw.kernel_launch_us * 1e-6 + hw.runtime.copy_fixed_s(k.op, k.parts))
    latency_s = max(compute_s, memory_s) + overhead_s
    if overhead_s >= max(compute_s, memory_s):
        bound = OVERHEAD
    elif compute_s >= memory_s:
        bound = COMPUTE
    else:
        bound = Bound("memory", level.name)
    energy_j = (flops * hw.pj_per_flop(precision.peak)
                + nbytes * level.energy_pj_per_byte) * 1e-12 + hw.static_w * latency_s
    return GroupEstimate(latency_s, energy_j, bound, intensity, compute_s, memory_s, overhead_s,
                         level.name)


def combine(parts: list[GroupEstimate], costs: list[Cost], precision: Precision
            ) -> GroupEstimate:
    """A group run as several kernels (`parts`, of `costs`), one after another: times and
    energies add; bound and level are its longest kernel's; intensity, all FLOPs / traffic."""
    longest = max(parts, key=lambda e: e.latency_s)
    nbytes = sum(c.bytes_read + c.bytes_written for c in costs) * precision.byte_scale
    flops = sum(c.flops(2) for c in costs)
    return GroupEstimate(sum(e.latency_s for e in parts), sum(e.energy_j for e in parts),
                         longest.bound, flops / nbytes if nbytes else float("inf"),
                         sum(e.compute_s for e in parts), sum(e.memory_s for e in parts),
                         sum(e.overhead_s for e in parts), longest.level)


def activation_pass(work: Cost, hw: HardwareProfile, precision: Precision, eff: Efficiency
                    ) -> GroupEstimate:
    """An activation MLAS applies over a kernel's output in cache (`activation_passes`): its
    FLOPs at the elementwise rate, no traffic, no launch."""
    return estimate_group(work, "elementwise", hw, precision, eff, launches=0)


def absorbed(k: Kernel, hw: HardwareProfile, precision: Precision, eff: Efficiency
             ) -> GroupEstimate:
    """What `k` adds to the kernel it runs inside (`k.host`): the host's roofline with k's work
    and traffic less without them; no launch. A sum in a compute-bound convolution's epilogue
    hides behind its MACs; in a memory-bound one it is traffic. Never below zero: the extra
    bytes can move the working set to a level rated faster (a depthwise Conv with a ResNet sum,
    L2 -> L3, came out -0.3 us), and added work does not speed a kernel up."""
    host = k.host
    assert host is not None
    alone, both = (estimate_group(cost, host.cls, hw, precision, eff, launches=0,
                                  reuse=host.reuse, calls=host.calls)
                   for cost in (host.cost, host.cost + k.cost))
    nbytes = (k.cost.bytes_read + k.cost.bytes_written) * precision.byte_scale
    return GroupEstimate(max(0.0, both.latency_s - alone.latency_s),
                         max(0.0, both.energy_j - alone.energy_j),
                         both.bound, k.cost.flops(2) / nbytes if nbytes else float("inf"),
                         max(0.0, both.compute_s - alone.compute_s),
                         max(0.0, both.memory_s - alone.memory_s), 0.0, both.level)


def denormal_slowed(e: GroupEstimate, share: float, factor: float,
                    static_w: float) -> GroupEstimate:
    """A kernel whose runtime model says a `share` of its operands are float32 denormals
    (ORT's: a MatMul reading a softmax over Swin's shifted-window mask): its time
    x (1 + share · (factor - 1)), `factor` the calibration's measured MatMul slowdown on
    denormal operands (`runtime.denormal_factor`; 1 when not measured: a GPU flushes them to
    zero); the extra time costs static power."""
    scale = 1 + share * (max(factor, 1.0) - 1)
    extra = e.latency_s * (scale - 1)
    return dataclasses.replace(e, latency_s=e.latency_s + extra, compute_s=e.compute_s * scale,
                               energy_j=e.energy_j + static_w * extra)


def cold_weights(e: GroupEstimate, cost: Cost, cls: str, hw: HardwareProfile,
                 precision: Precision, source: MemoryLevel | None = None, cold: int = 0,
                 lines: int = 0) -> GroupEstimate:
    """A kernel whose weights were last read one run ago, where a calibration measured that
    fetch (`runtime.cold_weight_gbps`): W bytes from `source` (`weights_level`: main memory,
    or the last-level cache) serialize with its arithmetic but overlap its stalls, latency_s =
    max(latency_s, work_s + overhead_s + W / rate), work_s its FLOPs at its class's best
    efficiency; their energy at the source's pJ/byte. The rate from main memory: the
    calibrated one for a compute-bound convolution (`backends.calibrate.measure`'s Conv
    chains), its bandwidth below its ridge point (a GEMV: a stream the prefetchers run ahead
    of; Zen 5, ORT 1.31: a decoder's 4-64 MB MatMuls at 36-41 GB/s, DRAM 41.7); from the
    cache, its bandwidth. `cold` bytes of activations on lines the last run evicted
    (`Kernel.cold_bytes`: the image input and the stem's output) come at the same rate, after
    the rest: latency_s += cold / rate (ORT 1.31, Zen 5: GhostNet's stem Conv, 1.4 MB of
    input and output, 66-69 us alone, 168 after a 32 MB pass, 138-228 in the network). `lines`
    fetched one by one from main memory (`Kernel.cold_lines`) add `runtime.cold_line_ns` each."""
    gbps = hw.runtime.cold_weight_gbps
    weights, cold = (cost.param_bytes * precision.byte_scale, cold) if gbps > 0 else (0, 0)
    source, dram = source or hw.main_memory, hw.main_memory
    lines_s = lines * hw.runtime.cold_line_ns * 1e-9 if source == dram else 0.0
    if not (weights or cold or lines_s):
        return e
    best = hw.class_efficiency(cls if cost.macs or cls in VECTOR_CLASSES else "elementwise")
    work_s = peak_seconds(cost, hw, precision) / best
    if source != dram or e.intensity < hw.peak_flops(precision.peak) / (dram.bandwidth_gbps * 1e9):
        gbps = source.bandwidth_gbps
    fetch_s, cold_s = (weights / (gbps * 1e9), cold / (gbps * 1e9)) if gbps > 0 else (0, 0)
    latency_s = max(e.latency_s, work_s + e.overhead_s + fetch_s) + cold_s + lines_s
    level = next(lv for lv in hw.memory if lv.name == e.level)
    energy_j = e.energy_j + (hw.static_w * (latency_s - e.latency_s) + (weights + cold) * (
        source.energy_pj_per_byte - level.energy_pj_per_byte) * 1e-12)
    bound = Bound("memory", source.name) if fetch_s > max(work_s, e.memory_s) else e.bound
    return dataclasses.replace(e, latency_s=latency_s, energy_j=energy_j, bound=bound,
                               memory_s=max(e.memory_s, fetch_s) + cold_s + lines_s)


def cost_kernels(kernels: list[Kernel], hw: HardwareProfile, precision: Precision,
                 eff: Efficiency, source: MemoryLevel) -> GroupEstimate:
    """A group run as `kernels`, one after another: each kernel's roofline with its weight
    fetch from `source` (or, run inside another kernel, its marginal cost: `absorbed`),
    slowed by its denormal operands, then its epilogue's pass; `combine`d. A kernel whose
    MACs run at another peak than the group's (`Kernel.peak`) is costed at that one; no
    kernels (a group folded before the run: native-cpu's dequantized weights), nothing."""
    if not kernels:
        return estimate_group(Cost(), "data_movement", hw, precision, eff, launches=0)
    factor = hw.runtime.denormal_factor
    parts, costs = [], []
    for k in kernels:
        costs.append(k.cost)
        at = precision if k.peak is None else dataclasses.replace(precision, peak=k.peak)
        parts.append(absorbed(k, hw, at, eff) if k.host else cold_weights(
            estimate_kernel(k, hw, at, eff), k.cost, k.cls, hw, at, source, k.cold_bytes,
            k.cold_lines))
        if k.denormal_share:
            parts[-1] = denormal_slowed(parts[-1], k.denormal_share, factor, hw.static_w)
        if k.epilogue.other_flops:
            costs.append(k.epilogue)
            parts.append(activation_pass(k.epilogue, hw, precision, eff))
    return combine(parts, costs, precision)


def estimate_model(mg: ModelGraph, groups: list[Group], group_costs: dict[int, Cost | None],
                   node_costs: dict[str, Cost | None], hw: HardwareProfile, precision: str,
                   efficiency: Efficiency | None = None, model: LoadedModel | None = None,
                   group_precisions: Mapping[int, str] | None = None) -> ModelEstimate:
    """Every group's estimate, as its runtime's kernels (`analyzer.runtimes`), at `precision`
    (a what-if of an fp32 graph, or GRAPH: each group at its own), weights from where the run
    leaves them (`weights_level`); the model's: their sum and a run call's fixed cost."""
    at = precision_for(precision, group_precisions or {})
    eff = efficiency or constant_efficiency(hw)
    kernels = kernel_model(hw.runtime.name).kernels(mg, groups, node_costs, group_costs, hw, model)
    acts = None if model is None else touched_bytes(mg, groups, model.tensors)  # as stored
    source = hw.main_memory if acts is None else hw.weights_level(acts + sum(
        k.cost.param_bytes * at(g).byte_scale for g, ks in kernels.items() for k in ks or ()))
    run_hw = hw if source != hw.main_memory else hw.evicted()
    out = {g: None if ks is None else cost_kernels(ks, run_hw, at(g), eff, source)
           for g, ks in kernels.items()}
    known, run_s = [e for e in out.values() if e is not None], hw.runtime.run_call_us * 1e-6
    return ModelEstimate(hw.key, hw, precision, hw.calibrated, out,  # the run call: in no group
                         run_s + sum(e.latency_s for e in known),
                         hw.static_w * run_s + sum(e.energy_j for e in known))
