"""Latency and energy of each fused group on a hardware profile: a roofline with memory levels.

Per group g on profile h at precision p (derivation, README "Estimates"):

    compute_s  = (2·MACs / peak_p  +  V / peak_fp32) / eff(class, g)      # a kernel with MACs
               = V / (peak_fp32 · eff(vector))                          # one without
    V          = other_flops + (τ - 1) · transcendental                 # Cost.vector_flops
    bytes      = (bytes_read + bytes_written) · bytes(p) / 4       # the model's tensors are fp32
    level      = the fastest memory level whose size holds the group's working set
                 (its boundary tensors: inputs incl. weights, and outputs)
    memory_s   = bytes / bandwidth(level)
    overhead_s = kernel_launch_us · 1e-6                          # per kernel
    latency_s  = max(compute_s, memory_s) + overhead_s            # compute and memory overlap
    bound      = "compute" | "memory:<level>" | "overhead", whichever term is largest
    energy_j   = FLOPs · pJ/FLOP(p) + bytes · pJ/byte(level) + static_w · latency_s

where `vector` is the group's own class for a pool, normalization or reduction and
`elementwise` otherwise, and τ what one transcendental evaluation
(exp, tanh, erf) costs in plain vector FLOPs (`extra["transcendental_flops"]`, measured by a
calibration; 1 otherwise). A kernel with MACs runs its other work (bias, activation, a sum
folded into it) in its epilogue, on values still in registers, at the kernel's own rate:
measured, a residual sum of 803 KB folded into a 1x1 Conv costs nothing measurable, where
the standalone elementwise rate said 58 us. Approximations, signed: non-MAC FLOPs run on the
vector units at the fp32 peak (they do not use tensor cores or a systolic array); one τ for
every transcendental function (measured here, erf costs about twice a sigmoid); the
working-set rule ignores what the previous group left in cache; the
model's latency is the sum over kernels in execution order (no overlap between kernels).

Kernels of a runtime. A profile calibrated through a runtime (`extra["runtime"]`, set by
`analyzer.calibration`) is estimated as that runtime's kernels, since those are what its
curves measured: on `ort-cpu` a group is split into the kernels ONNX Runtime makes of it
(`ort_kernels`), each costed by the roofline above with its own overhead, plus the layout
changes (NCHWc reorders) ORT puts between kernels that want different layouts
(`layout_changes`). The native executor (`native-cpu`) and uncalibrated profiles run one
kernel per group, as above. Fusion's groups are unchanged; only their cost is split.

Cold weights. On a profile whose calibration measured it, each kernel of a model also fetches
its weights cold, not overlapped with its work (`cold_weights`): the micro-benchmarks a
calibration fits run one kernel over and over, with its weights in cache.

Denormal operands. On a profile calibrated through ORT, a MatMul that reads a softmax's output
where the softmax's input had a constant mask added (Swin's shifted-window mask, -100) costs

    latency_s · (1 + share · (factor - 1))

with `share` the fraction of the mask's entries v for which exp(v) is a float32 denormal
(`denormal_reads`) and `factor` the calibration's measured MatMul slowdown on denormal
operands (`extra["denormal_factor"]`; 1 when not measured). Other profiles are unchanged (a GPU
flushes denormals to zero: no penalty).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .calibration import COLD_WEIGHT_KEY, COPY_RUN_KEY, DENORMAL_KEY, TRANSCENDENTAL_KEY
from .cost.base import ZERO, Cost
from .fusion import Group
from .graph import ModelGraph
from .hardware import ORT_CPU, PRECISION_BYTES, RUNTIME_KEY, HardwareProfile, MemoryLevel
from .ir import NodeInfo, TensorInfo

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
# Classes without MACs: a group of one of these runs its FLOPs at its own class's efficiency
# (a calibration fits pools, normalizations, reductions apart); any other group's non-MAC
# FLOPs (bias, activation) run at `elementwise`'s.
VECTOR_CLASSES = ("elementwise", "normalization", "pool", "reduce", "data_movement")


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
    return _dominant_class(mg, group.nodes, costs)


def _dominant_class(mg: ModelGraph, nodes: Iterable[str], costs: dict[str, Cost | None]) -> str:
    anchor = max(nodes, key=lambda k: (c.flops() if (c := costs.get(k)) else -1))
    return node_class(mg.info(anchor))


def node_class(info: NodeInfo) -> str:
    """A node's op class; a convolution is `depthwise` when each group sees one input channel,
    `grouped_conv` when its groups see several (neither is a dense convolution's kernel)."""
    cls = _CLASS_OF_OP.get(info.op_type, "elementwise")
    if cls == "conv" and info.attr("group", 1) > 1:
        w = info.input(1)
        return "depthwise" if w is not None and w.known and w.dims[1] == 1 else "grouped_conv"
    return cls


def constant_efficiency(hw: HardwareProfile) -> Efficiency:
    """An uncalibrated profile: one achievable fraction of peak per op class."""
    return lambda cls, flops, intensity: hw.class_efficiency(cls)


def memory_level(hw: HardwareProfile, working_set_bytes: float) -> MemoryLevel:
    for level in hw.memory:
        if level.size_bytes is None or working_set_bytes <= level.size_bytes:
            return level
    return hw.main_memory


def _tau(hw: HardwareProfile) -> float:
    return float(hw.extra.get(TRANSCENDENTAL_KEY, 1.0))


def peak_seconds(cost: Cost, hw: HardwareProfile, precision: str) -> float:
    """A kernel's arithmetic at peak: its MACs at the precision's, its vector work V at
    fp32's (module docstring); a class's efficiency divides it."""
    return (2 * cost.macs / hw.peak_flops(precision)
            + cost.vector_flops(_tau(hw)) / hw.peak_flops("fp32"))


def estimate_group(cost: Cost, cls: str, hw: HardwareProfile, precision: str,
                   efficiency: Efficiency, launches: int = 1, reuse: float = 0.0,
                   calls: int = 1, runs: int = 0) -> GroupEstimate:
    """One kernel's roofline (module docstring); `launches` kernel overheads (0: the work runs
    inside another kernel, as a sum ORT folds into the convolution before it). A kernel that
    is `calls` GEMMs of `reuse` FLOP/B each (a grouped convolution: `group_gemms`) reads its
    MAC efficiency at one call's FLOPs and that reuse: the per-call cost t0 is paid `calls`
    times, t = calls·t0 + F/(e·peak), which is the curve's F/(F + f_half) factor at
    F / calls. With a reuse, a call's F is its GEMM's 2·M·K·N alone, so that F / reuse is
    its operands' bytes, the working set whose memory level the curve reads (the epilogue's
    FLOPs had pushed ShuffleNet's 58-channel depthwise calls, 31.4 KB of operands, past a
    32 KB L1 and doubled their estimate). A kernel that copies `runs` contiguous runs one at
    a time (a Transpose: `transpose_runs`) pays, on a profile whose calibration fitted it,
    `extra["copy_run_ns"]` per run on top of its bytes, in its memory term."""
    scale = PRECISION_BYTES[precision] / 4
    nbytes = (cost.bytes_read + cost.bytes_written) * scale
    flops = cost.flops(2)
    intensity = flops / nbytes if nbytes else float("inf")
    vector_flops = cost.vector_flops(_tau(hw))
    if cost.macs:  # the epilogue at the kernel's rate (module docstring)
        call_flops = (2 * cost.macs if reuse else flops) / calls
        eff = efficiency(cls, call_flops, reuse or intensity)
    elif vector_flops:
        eff = efficiency(cls if cls in VECTOR_CLASSES else "elementwise", vector_flops,
                         intensity)
    else:
        eff = 1.0  # no arithmetic
    compute_s = peak_seconds(cost, hw, precision) / eff
    level = memory_level(hw, nbytes)
    memory_s = nbytes / (level.bandwidth_gbps * 1e9) + runs * float(
        hw.extra.get(COPY_RUN_KEY, 0.0)) * 1e-9
    overhead_s = launches * hw.kernel_launch_us * 1e-6
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


def combine(parts: list[GroupEstimate], costs: list[Cost], precision: str) -> GroupEstimate:
    """A group run as several kernels (`parts`, of `costs`), one after another: times and
    energies add; the bound and memory level are those of its longest kernel; the intensity
    is all their FLOPs over all their traffic."""
    longest = max(parts, key=lambda e: e.latency_s)
    nbytes = sum(c.bytes_read + c.bytes_written for c in costs) * PRECISION_BYTES[precision] / 4
    flops = sum(c.flops(2) for c in costs)
    return GroupEstimate(sum(e.latency_s for e in parts), sum(e.energy_j for e in parts),
                         longest.bound, flops / nbytes if nbytes else float("inf"),
                         sum(e.compute_s for e in parts), sum(e.memory_s for e in parts),
                         sum(e.overhead_s for e in parts), longest.level)


# ---- ONNX Runtime's kernels (CPU provider, ORT_ENABLE_ALL) ------------------------------------

NCHWC, NCHW, ANY = "nchwc", "nchw", "any"
# Activations ORT's Conv/Gemm activation fusion takes into the kernel (FusedConv, the NCHWc
# Conv's activation, FusedGemm); anything else (SiLU -> QuickGelu, GELU -> Gelu) is a kernel of
# its own that reads and writes the whole output once more.
ORT_FUSED_ACTIVATIONS = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "LeakyRelu",
                                   "Tanh", "HardSwish"})
_ANCHORS = frozenset({"Conv", "Gemm", "MatMul"})
# Groups ORT also runs as one kernel: its LayerNormalization fusion; the attention block is
# costed whole, as the calibration measured it (its micro-benchmark is the same ORT kernels).
_WHOLE = frozenset({"LayerNorm", "Attention"})


@dataclass(frozen=True)
class Kernel:
    """One kernel a runtime runs for (part of) a group, and the layouts it reads and writes
    its 4-D activations in (ANY: whatever its first activation input has)."""

    cls: str
    cost: Cost
    nodes: tuple[str, ...]
    reads: str = ANY
    writes: str = ANY
    inputs: tuple[TensorInfo, ...] = ()  # activations from outside the kernel
    outputs: tuple[TensorInfo, ...] = ()  # what it writes that others read
    open_sum: bool = False  # a lone NCHWc Conv or BN: ORT folds a following Add or activation
    launches: int = 1
    host: Kernel | None = None  # the kernel it runs inside (`_folded`), costed as a marginal
    reuse: float = 0.0  # the intensity its efficiency reads, where not FLOPs per byte
    calls: int = 1  # GEMM calls it makes (a grouped convolution: `group_gemms`)
    runs: int = 0  # contiguous runs it copies one at a time (a Transpose: `transpose_runs`)
    # An activation MLAS applies in a pass over the output in cache (`activation_passes`):
    # its FLOPs, at the elementwise rate, no traffic, no launch.
    epilogue: Cost = ZERO


def activation_passes(mg: ModelGraph, nodes: Iterable[str], in_kernel: bool) -> frozenset[str]:
    """The activations among `nodes` that MLAS runs as a pass of MlasActivation over the
    kernel's output after computing it, not inside the kernel: all of them (`in_kernel`
    False: FusedGemm, the NCHW path's FusedConv), or all but ReLU, which an NCHWc convolution
    kernel applies as it stores (its bias and a sum input likewise). Measured: a Conv with
    ReLU6 or HardSwish ran about 20% slower than its MACs at a ReLU Conv's rate said."""
    return frozenset(k for k in nodes if (op := mg.info(k).op_type) in ORT_FUSED_ACTIVATIONS
                     and not (in_kernel and op == "Relu"))


def _kernel(mg: ModelGraph, nodes: list[str], costs: dict[str, Cost | None], cls: str,
            reads: str, writes: str, open_sum: bool = False, reuse: float = 0.0,
            calls: int = 1, passes: frozenset[str] = frozenset(), runs: int = 0) -> Kernel:
    """The kernel of `nodes`: their arithmetic, and bytes for the tensors crossing its boundary
    (one node: its own cost, which already leaves out views); the FLOPs of `passes` go to its
    `epilogue`."""
    members = set(nodes)
    infos = [mg.info(k) for k in nodes]
    inside = {t.name for info in infos for t in info.outputs}
    inputs = {t.name: t for info in infos for i, t in enumerate(info.inputs)
              if t is not None and t.name not in inside and i not in info.const_inputs
              and t.name not in mg.initializers}
    outputs = {t.name: t for info in infos for t in info.outputs
               if t.name in mg.graph_outputs
               or any(u not in members for u in mg.consumers.get(t.name, ()))}
    total = epilogue = Cost()
    for k in nodes:
        c: Cost = costs[k]  # type: ignore[assignment]
        if k in passes:
            epilogue = epilogue + Cost(other_flops=c.other_flops, transcendental=c.transcendental)
        else:
            total = total + c
    if len(nodes) > 1:
        consts = [t for info in infos for i, t in enumerate(info.inputs)
                  if t is not None and t.name not in inside and t.name not in inputs]
        read = sum(t.nbytes for t in {t.name: t for t in consts}.values()) + sum(
            t.nbytes for t in inputs.values())
        total = Cost(total.macs, total.other_flops, total.transcendental, read,
                     sum(t.nbytes for t in outputs.values()), total.params, total.param_bytes)
    return Kernel(cls, total, tuple(nodes), reads, writes, tuple(inputs.values()),
                  tuple(outputs.values()), open_sum, reuse=reuse, calls=calls, runs=runs,
                  epilogue=epilogue)


def ort_conv_path(info: NodeInfo, block: int) -> tuple[str, str, str]:
    """(class, layout read, layout written) of a Conv as ORT's NCHWc transformer places it
    (`block`: the NCHWc block in channels). A dense or depthwise Conv whose output channels
    are a multiple of 4 runs as an NCHWc kernel (it reads plain NCHW when its input channels
    are not a multiple of 4: the stem); a grouped Conv does when its groups' input and output
    channels are whole blocks, as one convolution per group. Other grouped Convs and odd
    channel counts stay on the NCHW path (MlasConv: im2col and GEMMs): a dense Conv there
    runs at a dense Conv's rate (`conv`). A grouped Conv on either path, and a depthwise one
    on the NCHW path, is many small problems, one or more per group (`grouped_conv`, fitted
    apart and read per call, `group_gemms`): measured on AVX2 (block 8), 8 channels per
    group run at half a dense Conv's rate on the NCHWc path. Probed on ORT 1.31 with AVX-512
    (block 16): 8, 12 and 24 channels per group NCHW, 16, 32 and 48 NCHWc; on AVX2 (block 8)
    all multiples of 8 NCHWc."""
    cls = node_class(info)
    w = info.input(1)
    if w is None or not w.known or len(w.dims) != 4:
        return cls, NCHW, NCHW
    cout, cin_per_group = w.dims[0], w.dims[1]
    groups = info.attr("group", 1)
    if cls == "grouped_conv":
        layout = NCHW if cin_per_group % block or (cout // groups) % block else NCHWC
        return "grouped_conv", layout, layout
    if cls == "depthwise" and cout % 4:
        return "grouped_conv", NCHW, NCHW
    if cout % 4:
        return cls, NCHW, NCHW
    return cls, NCHWC if cin_per_group * groups % 4 == 0 else NCHW, NCHWC


# MLAS's SGEMM blocking (mlasi.h): a convolution's column buffer holds at most
# STRIDE_N x STRIDE_K floats, the two traded against each other for short K or N.
MLAS_STRIDE_N = MLAS_STRIDE_K = 128


def group_gemms(info: NodeInfo, sliced: bool = True) -> tuple[int, float]:
    """(calls, FLOPs per byte of one call) of a grouped Conv, 0 reuse when the shapes are
    unknown: on ORT's NCHW path (MlasConv, `sliced`) its GEMM calls; on the NCHWc path one
    direct convolution per image and group, of the same M, K and N (no column buffer).

    Derivation (MLAS convolve.cpp): per image and group the output is W_g[M, K] · cols[K, N]
    with M = output channels per group, K = input channels per group x kernel size, N =
    output pixels. A pointwise Conv (1x1, stride 1, no padding) is one GEMM on the input
    itself; one with M > N expands the whole cols matrix and makes one GEMM; any other
    (ExpandThenGemmSegmented) walks N in slices of StrideN and K in slices of StrideK,
    im2col-ing each slice into the column buffer and making one GEMM of it, with StrideN
    doubled (StrideK halved) while StrideK / 2 >= K when N >= K, and the reverse while
    StrideN / 2 >= N otherwise. Each call pays its packing, im2col and dispatch: RegNet's
    3x3 Conv of 8 channels per group at 56x56 is 25 calls per group of M = 8, K = 72, N =
    128. A call's reuse is 2·M·K·N FLOPs over 4·(M·K + K·N + M·N) bytes (8 channels per
    group reuse each loaded column about 3.4 times, a dense 1x1 Conv of 54 channels 54)."""
    w, y = info.input(1), info.outputs[0] if info.outputs else None
    if w is None or y is None or not w.known or not y.known or len(w.dims) < 3 or not y.rank:
        return 1, 0.0
    groups = info.attr("group", 1)
    m, k, n = w.dims[0] // groups, math.prod(w.dims[1:]), math.prod(y.dims[2:])
    spatial = len(w.dims) - 2
    pointwise = (all(d == 1 for d in w.dims[2:])
                 and all(s == 1 for s in info.attr("strides", [1] * spatial))
                 and not any(info.attr("pads", [0] * 2 * spatial)))
    calls = y.dims[0] * groups
    if sliced and not pointwise and m <= n:
        stride_n, stride_k = MLAS_STRIDE_N, MLAS_STRIDE_K
        if n >= k:
            while stride_k // 2 >= k:
                stride_n, stride_k = stride_n * 2, stride_k // 2
        else:
            while stride_n > 16 and stride_n // 2 >= n:
                stride_n, stride_k = stride_n // 2, stride_k * 2
        calls *= math.ceil(n / stride_n) * math.ceil(k / stride_k)
        n, k = min(n, stride_n), min(k, stride_k)
    return calls, 2 * m * k * n / (4 * (m * k + k * n + m * n))


def _elementwise_layout(info: NodeInfo) -> str:
    """ORT's NCHWc transformer converts unary ops and binary ops on equal shapes; a
    broadcast (squeeze-excite's per-channel gate) runs in plain NCHW."""
    shapes = {t.shape for i, t in enumerate(info.inputs)
              if t is not None and i not in info.const_inputs}
    return ANY if len(shapes) <= 1 else NCHW


def _concat_layout(info: NodeInfo, block: int) -> str:
    """A channel Concat stays NCHWc when every input's channels fill whole blocks."""
    ok = info.attr("axis") == 1 and all(
        t is not None and t.known and t.rank == 4 and t.dims[1] % block == 0
        for t in info.inputs)
    return ANY if ok else NCHW


def transpose_runs(info: NodeInfo) -> int:
    """The contiguous runs ORT's Transpose copies one at a time, 0 where it streams.

    Derivation (ORT's cpu/tensor/transpose.cc): the input's trailing axes that the
    permutation leaves last, in order, form a block that is copied whole (a memcpy), and the
    walk over the other axes costs each block a step; size-1 axes move nothing. A
    permutation that moves the innermost axis (NCHW <-> NHWC) takes MLAS's blocked transpose
    instead, which streams, and one that moves nothing is a copy: 0 for both. Swin-T's
    [64, 49, 3, 3, 32] with perm (2, 0, 3, 1, 4) is 28,224 runs of 32 floats; measured, such
    runs cost 6-11 ns each beyond their bytes, 8x the time the bytes alone say for runs of 8
    floats."""
    x = info.input(0)
    if info.op_type != "Transpose" or x is None or not x.known or not x.rank:
        return 0
    dims = x.dims
    moved = [a for a in info.attr("perm", list(reversed(range(len(dims))))) if dims[a] != 1]
    kept = sorted(moved)
    if not moved or moved[-1] != kept[-1]:
        return 0
    run = 1
    for out_axis, in_axis in zip(reversed(moved), reversed(kept), strict=True):
        if out_axis != in_axis:
            break
        run *= dims[in_axis]
    runs = math.prod(dims) // run
    return runs if runs > 1 else 0


def matmul_calls(info: NodeInfo) -> int:
    """The GEMM calls ORT's MatMul makes: one per matrix of the batch when both operands are
    batched ([..., M, K] x [..., K, N]: attention's Q·Kᵀ and P·V, one per head and window);
    one when the right operand is a single matrix, which it multiplies by the left operand
    flattened to rows. Swin-T's first-stage attention is 192 calls of 49x32x49: each call's
    fixed cost, not the 59 MFLOP in all, sets its rate."""
    rhs, y = info.input(1), info.outputs[0] if info.outputs else None
    if rhs is None or y is None or not (rhs.known and y.known) or rhs.rank <= 2:
        return 1
    return max(1, math.prod(y.dims[:-2]))


def ort_kernels(mg: ModelGraph, group: Group, costs: dict[str, Cost | None],
                block: int) -> list[Kernel]:
    """The kernels ORT's CPU provider makes of one of our groups (ORT 1.2x, ORT_ENABLE_ALL).

    Derivation (ORT's fusions, seen in its profiles of torchvision models): a Conv, Gemm or
    MatMul takes the BatchNormalization after it (folded at load), the Add after it (the
    NCHWc Conv's sum input; a MatMul's bias, as Gemm) and an activation in
    ORT_FUSED_ACTIVATIONS, each only while the tensor it reads has no other reader; the nodes
    left over form one kernel per connected elementwise run (x·sigmoid(x) is one QuickGelu,
    the erf GELU one Gelu); a BatchNormalization that no Conv precedes is an NCHWc kernel of
    its own that takes its activation like a Conv (DenseNet's pre-activation BN+Relu); any
    other node is a kernel of its own (squeeze-excite: a pool, two small convolutions, the
    gate's Mul). Constant nodes are folded when ORT loads the model: no kernel (a group of
    only constants costs nothing). `block`: the NCHWc block in channels."""
    if group.pattern in _WHOLE:
        cls = op_class(mg, group, costs)
        matmul = next((i for k in group.nodes if (i := mg.info(k)).op_type == "MatMul"), None)
        return [_kernel(mg, list(group.nodes), costs, cls, NCHW, NCHW,
                        calls=matmul_calls(matmul) if matmul else 1)]
    kernels: list[tuple[list[str], str]] = []  # (nodes, role: anchor / closed / vector / other)
    for key in group.nodes:
        info = mg.info(key)
        if info.op_type == "Constant":
            continue
        last = kernels[-1] if kernels else None
        reads_last = last is not None and any(
            t is not None and mg.producer.get(t.name) in last[0] for t in info.inputs)
        sole = last is not None and all(
            len(mg.consumers.get(t.name, ())) == 1 for t in mg.info(last[0][-1]).outputs)
        if info.op_type in _ANCHORS:
            kernels.append(([key], "anchor"))
        elif last and last[1] == "anchor" and reads_last and sole and (
                info.op_type in ("BatchNormalization", "Add")):
            last[0].append(key)
        elif last and last[1] == "anchor" and reads_last and sole and (
                info.op_type in ORT_FUSED_ACTIVATIONS):
            last[0].append(key)
            kernels[-1] = (last[0], "closed")
        elif last and last[1] == "vector" and reads_last and node_class(info) == "elementwise":
            last[0].append(key)
        elif info.op_type == "BatchNormalization":
            kernels.append(([key], "anchor"))
        else:
            kernels.append(([key], "vector" if node_class(info) == "elementwise" else "other"))
    return [_ort_kernel(mg, nodes, role, costs, block) for nodes, role in kernels] or [
        Kernel("data_movement", Cost(), (), launches=0)]


def _ort_kernel(mg: ModelGraph, nodes: list[str], role: str, costs: dict[str, Cost | None],
                block: int) -> Kernel:
    head = mg.info(nodes[0])
    if head.op_type == "Conv":
        cls, reads, writes = ort_conv_path(head, block)
        calls, reuse = group_gemms(head, reads == NCHW) if cls == "grouped_conv" else (1, 0.0)
        return _kernel(mg, nodes, costs, cls, reads, writes,
                       open_sum=role == "anchor" and len(nodes) == 1 and writes == NCHWC,
                       reuse=reuse, calls=calls,
                       passes=activation_passes(mg, nodes, writes == NCHWC))
    if head.op_type in _ANCHORS:
        return _kernel(mg, nodes, costs, node_class(head), NCHW, NCHW,
                       calls=matmul_calls(head) if head.op_type == "MatMul" else 1,
                       passes=activation_passes(mg, nodes, False))
    if head.op_type == "BatchNormalization":
        x = head.input(0)
        layout = NCHWC if x is not None and x.known and x.rank == 4 else NCHW
        return _kernel(mg, nodes, costs, "normalization", layout, layout,
                       open_sum=len(nodes) == 1 and layout == NCHWC,
                       passes=activation_passes(mg, nodes, layout == NCHWC))
    cls = _dominant_class(mg, nodes, costs)
    if cls == "pool":
        layout = ANY
    elif head.op_type == "Concat":
        layout = _concat_layout(head, block)
    elif cls == "elementwise":
        layout = _elementwise_layout(head)
    else:
        layout = NCHW
    return _kernel(mg, nodes, costs, cls, layout, layout, runs=transpose_runs(head))


def layout_changes(kernel: Kernel, have: dict[str, set[str]]) -> list[TensorInfo]:
    """The activations ORT must reorder (ReorderInput / ReorderOutput) before `kernel` runs.
    `have` maps a tensor to the layouts it exists in so far (graph
    inputs: plain NCHW) and is updated: a tensor is reordered once per layout, as ORT reuses a
    reorder for every reader. Only 4-D tensors have an NCHWc form."""
    image = [t for t in kernel.inputs if t.known and t.rank == 4]
    want = kernel.reads
    if want == ANY:
        want = next((lay for t in image for lay in (NCHWC, NCHW) if lay in have.get(t.name, ())),
                    NCHW)
    moved = []
    for t in image:
        layouts = have.setdefault(t.name, {NCHW})
        if want not in layouts:
            moved.append(t)
            layouts.add(want)
    writes = want if kernel.writes == ANY else kernel.writes
    for t in kernel.outputs:
        have[t.name] = {writes}
    return moved


def reorder_cost(t: TensorInfo) -> Cost:
    """A layout change reads the tensor and writes it once in the other layout (the NCHWc
    side's padding to whole blocks is left out)."""
    return Cost(bytes_read=t.nbytes, bytes_written=t.nbytes)


def _ort_group_estimates(mg: ModelGraph, groups: list[Group], node_costs: dict[str, Cost | None],
                         hw: HardwareProfile, precision: str, eff: Efficiency
                         ) -> dict[int, GroupEstimate | None]:
    """Every group as ORT's kernels, in execution order, with the layout changes between them
    charged to the group that needs them, and the kernels ORT folds into the one before
    across our groups (`_folded`), at what they add to it (`absorbed`)."""
    block = max(1, int(hw.extra.get("simd_bits", 256)) // 32)  # NCHWc block: one vector of fp32
    factor = float(hw.extra.get(DENORMAL_KEY, 1.0))
    denormal = denormal_reads(mg) if factor > 1 else {}
    have: dict[str, set[str]] = {t: {NCHW} for t in mg.graph_inputs}
    open_sums: dict[str, Kernel] = {}  # output of a lone NCHWc kernel -> that kernel
    out: dict[int, GroupEstimate | None] = {}
    for g in groups:
        if any(node_costs.get(k) is None for k in g.nodes):
            out[g.id] = None
            continue
        parts, costs = [], []
        for k in ort_kernels(mg, g, node_costs, block):
            k = _folded(mg, k, open_sums) or k
            for t in layout_changes(k, have):
                costs.append(reorder_cost(t))
                parts.append(estimate_group(costs[-1], "data_movement", hw, precision, eff))
            costs.append(k.cost)
            parts.append(absorbed(k, hw, precision, eff) if k.host else cold_weights(
                estimate_group(k.cost, k.cls, hw, precision, eff, k.launches, k.reuse, k.calls,
                               k.runs),
                k.cost, k.cls, hw, precision))
            if share := max((denormal.get(n, 0.0) for n in k.nodes), default=0.0):
                parts[-1] = denormal_slowed(parts[-1], share, factor, hw.static_w)
            if k.epilogue.other_flops:
                costs.append(k.epilogue)
                parts.append(activation_pass(k.epilogue, hw, precision, eff))
            if k.open_sum:
                open_sums.update((t.name, k) for t in k.outputs
                                 if len(mg.consumers.get(t.name, ())) == 1)
        out[g.id] = combine(parts, costs, precision)
    return out


def _folded(mg: ModelGraph, k: Kernel, open_sums: dict[str, Kernel]) -> Kernel | None:
    """`k` run inside the lone NCHWc Conv or BatchNormalization kernel whose output (read by
    nothing else) it reads (its `host`), or None when ORT does not fold it
    (NchwcTransformer): an Add is the Conv's sum input, reading its other operand; a ReLU
    only computes; another fusable activation is a pass over the output (`epilogue`). None
    writes anything of its own."""
    host_input = next((t for t in k.inputs if t.name in open_sums), None)
    if len(k.nodes) != 1 or host_input is None:
        return None
    op_type = mg.info(k.nodes[0]).op_type
    work = Cost(other_flops=k.cost.other_flops, transcendental=k.cost.transcendental)
    if op_type in ORT_FUSED_ACTIVATIONS and op_type != "Relu":  # a pass after the kernel
        return Kernel(k.cls, ZERO, k.nodes, NCHWC, NCHWC, (), k.outputs, launches=0,
                      epilogue=work)
    if op_type == "Add" and len(k.inputs) == 2:
        other = tuple(t for t in k.inputs if t is not host_input)
    elif op_type == "Relu":
        other = ()
    else:
        return None
    cost = work + Cost(bytes_read=sum(t.nbytes for t in other))
    return Kernel(k.cls, cost, k.nodes, NCHWC, NCHWC, other, k.outputs,
                  host=open_sums[host_input.name])


def activation_pass(work: Cost, hw: HardwareProfile, precision: str, eff: Efficiency
                    ) -> GroupEstimate:
    """An activation MLAS applies over a kernel's output in cache (`activation_passes`): its
    FLOPs at the elementwise rate, no traffic, no launch."""
    return estimate_group(work, "elementwise", hw, precision, eff, launches=0)


def absorbed(k: Kernel, hw: HardwareProfile, precision: str, eff: Efficiency
             ) -> GroupEstimate:
    """What `k` adds to the kernel it runs inside (`k.host`): that kernel's roofline with k's
    work and traffic, less its roofline without them; no launch. A sum read in a compute-bound
    convolution's epilogue hides behind its MACs; in a memory-bound one it is more traffic."""
    host = k.host
    assert host is not None
    args = (host.cls, hw, precision, eff, 0, host.reuse, host.calls)
    alone = estimate_group(host.cost, *args)
    both = estimate_group(host.cost + k.cost, *args)
    nbytes = (k.cost.bytes_read + k.cost.bytes_written) * PRECISION_BYTES[precision] / 4
    return GroupEstimate(both.latency_s - alone.latency_s, both.energy_j - alone.energy_j,
                         both.bound, k.cost.flops(2) / nbytes if nbytes else float("inf"),
                         both.compute_s - alone.compute_s, both.memory_s - alone.memory_s, 0.0,
                         both.level)


# ---- denormal operands ------------------------------------------------------------------------

# exp(v) in float32 is a denormal for ln(2^-149) = -103.28 < v < ln(2^-126) = -87.34: below
# it rounds to exact zero (fast), above it is a normal number. softmax(x + m) = exp(x + m -
# max) / sum: with the logits x a few units apart, a mask entry m in this band makes the
# probability it lands on a denormal (Swin-T: the share of -100 entries equals the share of
# denormal probabilities, measured), and the MatMul reading P stalls on them.
DENORMAL_BAND = (math.log(2.0 ** -149), math.log(2.0 ** -126))
_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def denormal_share(values: np.ndarray) -> float:
    """The fraction of `values` whose exp is a float32 denormal (DENORMAL_BAND)."""
    low, high = DENORMAL_BAND
    return float(np.mean((values > low) & (values < high))) if values.size else 0.0


def constant_value(mg: ModelGraph, name: str) -> np.ndarray | None:
    """The value of tensor `name` when it is computed from Constant nodes alone (Swin's mask:
    Where over ScatterNDs of constants), evaluated by onnx's reference evaluator; None when it
    depends on a graph input or an initializer (whose values the graph does not hold)."""
    import onnx
    from onnx import helper

    nodes: dict[str, NodeInfo] = {}
    todo = [name]
    while todo:
        tensor = todo.pop()
        key = mg.producer.get(tensor)
        if key is None:
            return None
        if key in nodes:
            continue
        info = nodes[key] = mg.info(key)
        todo += [t.name for t in info.inputs if t is not None]
        if len(nodes) > 256:
            return None
    ordered = sorted(nodes.values(), key=lambda i: i.index)
    protos = [helper.make_node(i.op_type, [t.name if t else "" for t in i.inputs],
                               [t.name for t in i.outputs], domain=i.domain or None, **i.attrs)
              for i in ordered]
    graph = helper.make_graph(protos, "constant", [],
                              [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)])
    try:
        from onnx.reference import ReferenceEvaluator

        return np.asarray(ReferenceEvaluator(helper.make_model(graph)).run(None, {})[0])
    except Exception:  # an op the reference cannot run: no value, no penalty
        return None


def _through_views(mg: ModelGraph, tensor: str) -> NodeInfo | None:
    """The first node producing `tensor` that is not a view (Reshape and the like)."""
    while (key := mg.producer.get(tensor)) is not None:
        info = mg.info(key)
        if info.op_type not in _VIEWS or not info.inputs or info.inputs[0] is None:
            return info
        tensor = info.inputs[0].name
    return None


def _readers_through_views(mg: ModelGraph, tensor: str) -> list[NodeInfo]:
    out = []
    for key in mg.consumers.get(tensor, ()):
        info = mg.info(key)
        if info.op_type in _VIEWS:
            out += _readers_through_views(mg, info.outputs[0].name)
        else:
            out.append(info)
    return out


def denormal_reads(mg: ModelGraph) -> dict[str, float]:
    """MatMul node key -> share of its left operand that is denormal: the MatMuls reading (as
    operand 0, through views) a Softmax whose input is (through views) an Add of a constant
    mask with entries in DENORMAL_BAND; the share is the mask's (`denormal_share`)."""
    out: dict[str, float] = {}
    for info in mg.infos.values():
        if info.op_type != "Softmax" or not info.inputs or info.inputs[0] is None:
            continue
        add = _through_views(mg, info.inputs[0].name)
        if add is None or add.op_type != "Add":
            continue
        shares = [denormal_share(v) for t in add.inputs if t is not None
                  and (v := constant_value(mg, t.name)) is not None]
        share = max(shares, default=0.0)
        if share <= 0:
            continue
        for reader in _readers_through_views(mg, info.outputs[0].name):
            if reader.op_type == "MatMul" and _through_views(
                    mg, reader.inputs[0].name) is info:  # type: ignore[union-attr]
                out[reader.name] = share
    return out


def denormal_slowed(e: GroupEstimate, share: float, factor: float,
                    static_w: float) -> GroupEstimate:
    """A kernel reading `share` denormal operands: its time x (1 + share · (factor - 1)); the
    extra time costs static power."""
    scale = 1 + share * (max(factor, 1.0) - 1)
    extra = e.latency_s * (scale - 1)
    return dataclasses.replace(e, latency_s=e.latency_s + extra, compute_s=e.compute_s * scale,
                               energy_j=e.energy_j + static_w * extra)


def cold_weights(e: GroupEstimate, cost: Cost, cls: str, hw: HardwareProfile, precision: str
                 ) -> GroupEstimate:
    """A kernel of a network, whose weights were last read one inference ago: on a profile
    whose calibration measured the rate of that fetch (`extra["cold_weight_gbps"]`), the
    fetch of its W weight bytes serializes with the kernel's arithmetic but overlaps its
    stalls,

        latency_s = max(latency_s, work_s + overhead_s + W / rate)

    with work_s its FLOPs at its class's best efficiency (no size or reuse penalty); their
    energy at main memory's pJ/byte. A compute-bound convolution pays the fetch on top
    (measured: Conv chains with a weight per layer against one shared weight,
    `backends.calibrate.cold_weight_gbps`); a GEMV, whose time is already its weight stream,
    is re-rated to it (VGG-11's FusedGemm layers, 16 to 411 MB, ran at 16-18 GB/s, the rate
    the chains measured). Calibration benchmarks, hot, are not changed. Approximation,
    signed: every weight counts as cold, which over-estimates a network small enough that
    the caches keep its weights between runs."""
    gbps = float(hw.extra.get(COLD_WEIGHT_KEY, 0.0))
    weights = cost.param_bytes * PRECISION_BYTES[precision] / 4
    if gbps <= 0 or not weights:
        return e
    best = hw.class_efficiency(cls if cost.macs or cls in VECTOR_CLASSES else "elementwise")
    work_s = peak_seconds(cost, hw, precision) / best
    fetch_s = weights / (gbps * 1e9)
    latency_s = max(e.latency_s, work_s + e.overhead_s + fetch_s)
    level = next(lv for lv in hw.memory if lv.name == e.level)
    energy_j = e.energy_j + (hw.static_w * (latency_s - e.latency_s) + weights * (
        hw.main_memory.energy_pj_per_byte - level.energy_pj_per_byte) * 1e-12)
    bound = f"memory:{hw.main_memory.name}" if fetch_s > max(work_s, e.memory_s) else e.bound
    return dataclasses.replace(e, latency_s=latency_s, energy_j=energy_j, bound=bound,
                               memory_s=max(e.memory_s, fetch_s))


def estimate_model(mg: ModelGraph, groups: list[Group], group_costs: dict[int, Cost | None],
                   node_costs: dict[str, Cost | None], hw: HardwareProfile, precision: str,
                   efficiency: Efficiency | None = None) -> ModelEstimate:
    """Every group's estimate and the model's: latency and energy summed in execution order.
    On a profile calibrated through ORT a group is costed as ORT's kernels (module
    docstring); otherwise as one kernel."""
    if precision not in PRECISION_BYTES:
        from .errors import UsageError

        raise UsageError(f"precision {precision!r}: expected one of {', '.join(PRECISION_BYTES)}")
    eff = efficiency or constant_efficiency(hw)
    if hw.extra.get(RUNTIME_KEY) == ORT_CPU:
        out = _ort_group_estimates(mg, groups, node_costs, hw, precision, eff)
    else:
        out = {g.id: None if (cost := group_costs[g.id]) is None else cold_weights(
            estimate_group(cost, cls := op_class(mg, g, node_costs), hw, precision, eff), cost,
            cls, hw, precision) for g in groups}
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
