"""Latency and energy of each fused group on a hardware profile: a roofline with memory levels.

Per group g on profile h at precision p (derivation, README "Estimates"):

    compute_s  = 2·MACs / (peak_p · eff(class, g))  +  other_flops / (peak_fp32 · eff(elementwise))
    bytes      = (bytes_read + bytes_written) · bytes(p) / 4       # the model's tensors are fp32
    level      = the fastest memory level whose size holds the group's working set
                 (its boundary tensors: inputs incl. weights, and outputs)
    memory_s   = bytes / bandwidth(level)
    overhead_s = kernel_launch_us · 1e-6                          # one kernel per group
    latency_s  = max(compute_s, memory_s) + overhead_s            # compute and memory overlap
    bound      = "compute" | "memory:<level>" | "overhead", whichever term is largest
    energy_j   = FLOPs · pJ/FLOP(p) + bytes · pJ/byte(level) + static_w · latency_s

Approximations, signed: non-MAC FLOPs run on the vector units at the fp32 peak (an
elementwise op does not use tensor cores or a systolic array); the working-set rule ignores
what the previous group left in cache; every group is one kernel; the model's latency is the
sum over groups in execution order (no overlap between kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .cost.base import Cost
from .fusion import Group
from .graph import ModelGraph
from .hardware import PRECISION_BYTES, HardwareProfile, MemoryLevel

# (op class, FLOPs, arithmetic intensity) -> achieved fraction of peak.
Efficiency = Callable[[str, float, float], float]

_CLASS_OF_OP = {
    "Conv": "conv", "ConvTranspose": "conv", "Gemm": "gemm", "MatMul": "gemm", "Einsum": "gemm",
    "MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "pool",
    "GlobalMaxPool": "pool", "LpPool": "pool",
    "BatchNormalization": "normalization", "LayerNormalization": "normalization",
    "InstanceNormalization": "normalization", "GroupNormalization": "normalization",
    "Softmax": "normalization", "LogSoftmax": "normalization",
    "ReduceMean": "reduce", "ReduceSum": "reduce", "ReduceMax": "reduce", "ReduceMin": "reduce",
    "ReduceProd": "reduce", "ReduceL2": "reduce", "ReduceSumSquare": "reduce",
    "ReduceLogSumExp": "reduce", "ArgMax": "reduce", "ArgMin": "reduce",
    "Reshape": "data_movement", "Flatten": "data_movement", "Squeeze": "data_movement",
    "Unsqueeze": "data_movement", "Transpose": "data_movement", "Concat": "data_movement",
    "Split": "data_movement", "Slice": "data_movement", "Gather": "data_movement",
    "Expand": "data_movement", "Tile": "data_movement", "Pad": "data_movement",
    "Identity": "data_movement", "Shape": "data_movement", "Resize": "data_movement",
}


@dataclass(frozen=True, slots=True)
class GroupEstimate:
    latency_s: float
    energy_j: float
    bound: str
    intensity: float  # FLOPs per byte of boundary traffic (at the estimate's precision)
    compute_s: float
    memory_s: float
    overhead_s: float
    level: str


@dataclass(frozen=True)
class ModelEstimate:
    hardware: str
    profile: HardwareProfile
    precision: str
    calibrated: bool
    groups: dict[int, GroupEstimate | None]  # None where the group's cost is unknown
    latency_s: float
    energy_j: float

    @property
    def complete(self) -> bool:
        return all(g is not None for g in self.groups.values())


def op_class(mg: ModelGraph, group: Group, costs: dict[str, Cost | None]) -> str:
    """The class of a group's dominant node (most FLOPs; ties to the first)."""
    if group.pattern == "Attention":
        return "attention"
    anchor = max(group.nodes, key=lambda k: (costs[k].flops() if costs.get(k) else -1))
    info = mg.info(anchor)
    cls = _CLASS_OF_OP.get(info.op_type, "elementwise")
    if cls == "conv" and _is_depthwise(mg, anchor):
        return "depthwise"
    return cls


def _is_depthwise(mg: ModelGraph, key: str) -> bool:
    info = mg.info(key)
    w = info.input(1)
    group = info.attr("group", 1)
    return group > 1 and w is not None and w.known and w.dims[1] == 1


def constant_efficiency(hw: HardwareProfile) -> Efficiency:
    """An uncalibrated profile: one achievable fraction of peak per op class."""
    return lambda cls, flops, intensity: hw.efficiency[cls]


def memory_level(hw: HardwareProfile, working_set_bytes: float) -> MemoryLevel:
    for level in hw.memory:
        if level.size_bytes is None or working_set_bytes <= level.size_bytes:
            return level
    return hw.main_memory


def estimate_group(cost: Cost, cls: str, hw: HardwareProfile, precision: str,
                   efficiency: Efficiency) -> GroupEstimate:
    scale = PRECISION_BYTES[precision] / 4
    nbytes = (cost.bytes_read + cost.bytes_written) * scale
    flops = cost.flops(2)
    intensity = flops / nbytes if nbytes else float("inf")
    mac_flops = 2 * cost.macs
    compute_s = 0.0
    if mac_flops:
        compute_s += mac_flops / (hw.peak_flops(precision) * efficiency(cls, flops, intensity))
    if cost.other_flops:
        vector_eff = efficiency("elementwise", cost.other_flops, intensity)
        compute_s += cost.other_flops / (hw.peak_flops("fp32") * vector_eff)
    level = memory_level(hw, nbytes)
    memory_s = nbytes / (level.bandwidth_gbps * 1e9)
    overhead_s = hw.kernel_launch_us * 1e-6
    latency_s = max(compute_s, memory_s) + overhead_s
    if overhead_s >= max(compute_s, memory_s):
        bound = "overhead"
    elif compute_s >= memory_s:
        bound = "compute"
    else:
        bound = f"memory:{level.name}"
    energy_j = (flops * hw.pj_per_flop(precision) + nbytes * level.energy_pj_per_byte) * 1e-12 \
        + hw.static_w * latency_s
    return GroupEstimate(latency_s, energy_j, bound, intensity, compute_s, memory_s, overhead_s,
                         level.name)


def estimate_model(mg: ModelGraph, groups: list[Group], group_costs: dict[int, Cost | None],
                   node_costs: dict[str, Cost | None], hw: HardwareProfile, precision: str,
                   efficiency: Efficiency | None = None) -> ModelEstimate:
    """Every group's estimate and the model's: latency and energy summed in execution order."""
    if precision not in PRECISION_BYTES:
        from .errors import UsageError

        raise UsageError(f"precision {precision!r}: expected one of {', '.join(PRECISION_BYTES)}")
    eff = efficiency or constant_efficiency(hw)
    out: dict[int, GroupEstimate | None] = {}
    for g in groups:
        cost = group_costs[g.id]
        out[g.id] = None if cost is None else estimate_group(
            cost, op_class(mg, g, node_costs), hw, precision, eff)
    known = [e for e in out.values() if e is not None]
    return ModelEstimate(hw.key, hw, precision, hw.calibrated, out,
                         sum(e.latency_s for e in known), sum(e.energy_j for e in known))


def resolve_target(name: str, threads: int | None = None) -> tuple[HardwareProfile, Efficiency]:
    """A profile by name and the efficiency curve to estimate with on it.

    `host` is this machine: detected, and calibrated when `onnxlens calibrate` has been run for
    `threads`; its measured curves then replace the profile's constant efficiencies.
    """
    from .hardware import load_profile

    if name == "host":
        from .calibration import calibrated_host

        return calibrated_host(threads)
    hw = load_profile(name)
    return hw, constant_efficiency(hw)
