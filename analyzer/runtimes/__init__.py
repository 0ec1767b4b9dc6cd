"""The seam between a runtime and the estimator: the kernels a runtime runs for our groups.

Fusion's groups are the unit every report speaks in; a runtime may run a group as several
kernels (ONNX Runtime splits a SiLU off a convolution), fold a kernel into one of another
group (a residual sum into the convolution before it), or put layout changes between them.
A `KernelModel` says which: it takes the fused groups to the `Kernel`s its runtime runs
(sizes, reuse, calls, layout, epilogues), and the general estimator
(`analyzer.estimate.cost_kernels`: roofline, memory levels, calibrated efficiency curves)
costs those kernels, whatever the runtime.

Models: `one_kernel_per_group` (uncalibrated profiles, and any runtime without a model of its
own); ONNX Runtime's CPU provider (`runtimes.ort_cpu`: the documented rules of its fusions and
MLAS kernels, read from the graph alone); others register from the layer that knows their
runtime (`register_kernel_model`: the native executor's model reads its own planner, which
lives in `backends/`, so `onnxlens.backends` registers it and the analyzer imports no backend).
A calibrated profile names the runtime it measured (`HardwareProfile.runtime`), and that
runtime's model costs the groups on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypedDict

from ..cost.base import ZERO, Cost
from ..fusion import Group
from ..graph import ModelGraph
from ..hardware import REORDER, HardwareProfile
from ..ir import NodeInfo, TensorInfo
from ..loader import LoadedModel

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

ANY = "any"  # a kernel that reads and writes whatever layout its input has

_CLASS_OF_OP = {
    "Conv": "conv", "ConvTranspose": "conv", "Gemm": "gemm", "MatMul": "gemm", "Einsum": "gemm",
    # quantized: ONNX's integer and QLinear ops, ORT's contrib ones
    "ConvInteger": "conv", "QLinearConv": "conv", "MatMulInteger": "gemm",
    "QLinearMatMul": "gemm", "QGemm": "gemm", "DynamicQuantizeMatMul": "gemm",
    "MatMulIntegerToFloat": "gemm",
    "MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "pool",
    "GlobalMaxPool": "pool", "LpPool": "pool",
    "BatchNormalization": "normalization", "LayerNormalization": "normalization",
    "InstanceNormalization": "normalization", "GroupNormalization": "normalization",
    "Softmax": "normalization", "LogSoftmax": "normalization", "QLinearSoftmax": "normalization",
    # ONNX Runtime's own: its norms, attention and 4-bit MatMul kernels (contrib ops)
    "SimplifiedLayerNormalization": "normalization", "RMSNormalization": "normalization",
    # ORT's residual norms run at rates of their own (ORT 1.31, 1 thread, Zen 5, [1, R, C] for
    # R x C of 256x64 to 128x1024): SkipLayerNormalization 4.0-4.3 ns per element,
    # SkipSimplifiedLayerNormalization 0.66-0.82, its SimplifiedLayerNormalization 0.24:
    # calibrated apart (`normalization` to a profile or calibration without them).
    "SkipLayerNormalization": "skip_normalization",
    "SkipSimplifiedLayerNormalization": "skip_rms_normalization",
    "GroupQueryAttention": "attention", "MultiHeadAttention": "attention", "MatMulNBits": "gemm",
    "ReduceMean": "reduce", "ReduceSum": "reduce", "ReduceMax": "reduce", "ReduceMin": "reduce",
    "ReduceProd": "reduce", "ReduceLogSumExp": "reduce", "ArgMax": "reduce", "ArgMin": "reduce",
    # Sums of squares run at rates of their own, calibrated apart (a `reduce` to a profile or
    # calibration without them): ORT has no fast path for them, 0.24-0.48 ns per element over
    # [1, C, H, W] -> [1, C, 1, 1] against ReduceMean's 0.04-0.06 ([1, 160, 56, 56]: 240 us
    # against 30; ConvNeXt-V2's GRN norms), the native executor 1.0-1.2 against 0.04-0.06
    # (ORT 1.31, 1 thread, Zen 5).
    "ReduceL2": "reduce_squares", "ReduceSumSquare": "reduce_squares",
    "Reshape": "data_movement", "Flatten": "data_movement", "Squeeze": "data_movement",
    "Unsqueeze": "data_movement", "Transpose": "data_movement", "Concat": "data_movement",
    "Split": "data_movement", "Slice": "data_movement", "Gather": "data_movement",
    "GatherBlockQuantized": "data_movement",
    "Expand": "data_movement", "Tile": "data_movement", "Pad": "data_movement",
    "Identity": "data_movement", "Shape": "data_movement", "Resize": "data_movement",
    "ReorderInput": REORDER, "ReorderOutput": REORDER,  # ORT's NCHWc layout changes
}


def inner_run(dims: Sequence[int], out: Sequence[int]) -> int:
    """The elements of the output's innermost axes (size-1 axes skipped) over which an
    input of `dims` (aligned right) either broadcasts on every axis or reads every one: the
    span one vector call covers in ORT's Broadcaster and in the native executor's
    element-wise programs (ewprog.cpp suffix_block) alike."""
    run, broadcast = 1, None
    for axis in range(1, len(out) + 1):
        if out[-axis] == 1:
            continue
        here = axis > len(dims) or dims[-axis] == 1
        if broadcast is not None and here != broadcast:
            break
        run, broadcast = run * out[-axis], here
    return run


def constant_input(mg: ModelGraph, info: NodeInfo, i: int) -> bool:
    """Whether input `i` of `info` is a constant: an initializer, or a Constant node's output
    (what a runtime's fusions that want constant operands accept)."""
    t = info.input(i)
    return i in info.const_inputs or (
        t is not None and (k := mg.producer.get(t.name)) is not None
        and mg.info(k).op_type == "Constant")


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
        w = conv_weight(info)
        return "depthwise" if w is not None and w.known and w.dims[1] == 1 else "grouped_conv"
    return cls


def conv_weight(info: NodeInfo) -> TensorInfo | None:
    """A convolution's weight: input 1, a QLinearConv's input 3 (after x, its scale, zp)."""
    return info.input(3 if info.op_type == "QLinearConv" else 1)


@dataclass(frozen=True)
class Kernel:
    """One kernel a runtime runs for (part of) a group, and the layouts it reads and writes
    its 4-D activations in (ANY: whatever its first activation input has). The general
    estimator (`analyzer.estimate.cost_kernels`) costs it."""

    cls: str
    cost: Cost
    nodes: tuple[str, ...]
    reads: str = ANY
    writes: str = ANY
    inputs: tuple[TensorInfo, ...] = ()  # activations from outside the kernel
    outputs: tuple[TensorInfo, ...] = ()  # what it writes that others read
    open_sum: bool = False  # a lone NCHWc Conv or BN: ORT folds a following Add or activation
    launches: int = 1
    host: Kernel | None = None  # the kernel it runs inside, costed as a marginal (`absorbed`)
    reuse: float = 0.0  # the intensity its efficiency reads, where not FLOPs per byte
    calls: int = 1  # GEMM calls it makes (a grouped convolution, batched MatMul)
    runs: int = 0  # runs it copies (a Transpose) or spans it broadcasts over, one at a time
    rows: int = 0  # rows it normalizes one at a time (LayerNormalization, Softmax)
    elements: int = 0  # elements it copies one at a time (a Transpose's element-wise path)
    libm_calls: int = 0  # values it passes one at a time to a scalar libm function (tanhf)
    # An activation applied in a pass over the output in cache after the kernel: its FLOPs,
    # at the elementwise rate, no traffic, no launch.
    epilogue: Cost = ZERO
    # The share of its operands that are float32 denormals (the estimator slows it by the
    # profile's measured factor: `denormal_slowed`).
    denormal_share: float = 0.0
    # Activation bytes it reads or writes on lines the last run evicted (the image input and
    # the stem's output), fetched like cold weights, after its work (`estimate.cold_weights`).
    cold_bytes: int = 0
    # Cache lines it fetches cold one at a time, each a main-memory latency its work does not
    # hide (a depthwise NCHWc kernel's filter: `ort_cpu.cold_filter_lines`), priced at the
    # calibration's `runtime.cold_line_ns` (`estimate.cold_weights`).
    cold_lines: int = 0
    # The peak its MACs run at where not its group's precision's (an int8 group that ORT runs
    # as DequantizeLinear, a float32 Conv and QuantizeLinear: `ort_cpu._unfused_kernels`).
    peak: str | None = None
    # A lone copy node's op type and its parts beyond the first (Split's outputs, Concat's
    # inputs), whose fixed cost a calibration measured (`Runtime.copy_fixed_s`).
    op: str = ""
    parts: int = 0


class KernelShape(TypedDict, total=False):
    """The `Kernel` fields the roofline (`analyzer.estimate.estimate_kernel`) reads beside its
    class and cost."""

    launches: int
    reuse: float
    calls: int
    runs: int
    rows: int
    elements: int
    libm_calls: int


def roofline_kernel(cls: str, cost: Cost, **shape: Unpack[KernelShape]) -> Kernel:
    """A kernel of `cls` and `cost` shaped by `shape`; any other `Kernel` field (peak=,
    epilogue=: the roofline alone would drop it unseen) is a TypeError naming it."""
    unknown = shape.keys() - KernelShape.__optional_keys__
    if unknown:
        raise TypeError(f"estimate_group: unknown kernel shape field(s) "
                        f"{', '.join(sorted(unknown))}; the fields are "
                        f"{', '.join(KernelShape.__annotations__)}")
    return Kernel(cls, cost, (), **shape)


def kernel_of(mg: ModelGraph, nodes: list[str], costs: dict[str, Cost | None], cls: str,
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


GroupKernels = dict[int, list[Kernel] | None]  # group id -> its kernels; None: cost unknown


class KernelModel(Protocol):
    """What a runtime runs for a model's fused groups, in execution order. `model` (the
    loaded model: tensors, constants) is there for a model that plans as its runtime does;
    None when the caller has only the graph."""

    runtime: str

    def kernels(self, mg: ModelGraph, groups: list[Group], node_costs: dict[str, Cost | None],
                group_costs: dict[int, Cost | None], hw: HardwareProfile,
                model: LoadedModel | None = None) -> GroupKernels: ...


@dataclass(frozen=True)
class OneKernelPerGroup:
    """A runtime that runs each fused group as one kernel of the group's cost and class."""

    runtime: str = "one-kernel-per-group"

    def kernels(self, mg: ModelGraph, groups: list[Group], node_costs: dict[str, Cost | None],
                group_costs: dict[int, Cost | None], hw: HardwareProfile,
                model: LoadedModel | None = None) -> GroupKernels:
        return {g.id: None if (cost := group_costs[g.id]) is None else
                [Kernel(op_class(mg, g, node_costs), cost, tuple(g.nodes))] for g in groups}


one_kernel_per_group = OneKernelPerGroup()
# Runtimes whose model is an analyzer module, imported on first use.
_BUILT_IN = {"ort-cpu": "ort_cpu"}
_REGISTERED: dict[str, KernelModel] = {}


def register_kernel_model(model: KernelModel) -> None:
    """Make `model` cost the groups on profiles calibrated through `model.runtime`."""
    _REGISTERED[model.runtime] = model


def kernel_model(runtime: str | None) -> KernelModel:
    """The model of `runtime` (None or a runtime without a model: one kernel per group)."""
    if runtime in _REGISTERED:
        return _REGISTERED[runtime]
    if runtime in _BUILT_IN:
        module = importlib.import_module(f"{__name__}.{_BUILT_IN[runtime]}")
        register_kernel_model(module.MODEL)
        return module.MODEL
    return one_kernel_per_group
