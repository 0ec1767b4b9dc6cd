"""ONNX Runtime's CPU provider as kernels (ORT 1.2x-1.3x, ORT_ENABLE_ALL, MLAS).

On a profile calibrated through ORT (`runtime = "ort-cpu"`) each of our groups is costed as the
kernels ORT makes of it (`ort_kernels`), plus the layout changes (NCHWc reorders) ORT puts
between kernels that want different layouts (`layout_changes`), with the kernels ORT folds
into one of an earlier group (`_folded`) costed at what they add to it. Fusion's groups are
unchanged; only their cost is split. Everything here is read from the graph: the rules below
are ORT's documented fusions and MLAS's blocking, each with its derivation.

Denormal operands: a MatMul that reads a softmax's output where the softmax's input had a
constant mask added (Swin's shifted-window mask, -100) reads `share` float32 denormals
(`denormal_reads`); the estimator slows it by the profile's measured factor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
import onnx

from ..cost.base import ZERO, Cost, lookup
from ..cost.common import along_axis
from ..cost.ops import RESHAPES
from ..cost.precision import mac_precision
from ..fold import fold_nodes, static_nodes
from ..fusion import ADD_LAYER_NORM, ADD_RMS_NORM, ATTENTION, LAYER_NORM, RMS_NORM, Group
from ..graph import ModelGraph
from ..hardware import (
    BLOCKED_TRANSPOSE,
    CONV_INT8_IM2COL,
    CONV_INTEGER,
    CONV_UNPACKED,
    GEMM_INT8_UNPACKED,
    GEMM_NBITS,
    GEMM_S8S8,
    GEMV_INT8,
    GEMV_NBITS,
    GROUPED_CONV_INTEGER,
    INT8_CLASS,
    ORT_CPU,
    REORDER,
    WHERE,
    HardwareProfile,
)
from ..ir import NodeInfo, TensorInfo
from ..loader import LoadedModel
from . import (
    ANY,
    GroupKernels,
    Kernel,
    _dominant_class,
    constant_input,
    conv_weight,
    inner_run,
    kernel_of,
    node_class,
    op_class,
)
from .ort_attention import gqa_kernels, in_attention_block, packed_keys, without_work_of
from .ort_fp16 import (
    cast_kernel,
    float16_as_float32,
    float32_nodes,
    inserted_casts,
    is_float16,
)
from .ort_moe import moe_kernel

NCHWC, NCHW, NHWC = "nchwc", "nchw", "nhwc"
CACHE_LINE_BYTES = 64  # x86-64's
# Activations ORT's Conv/Gemm activation fusion takes into the kernel (FusedConv, the NCHWc
# Conv's activation, FusedGemm); anything else (SiLU -> QuickGelu, GELU -> Gelu) is a kernel of
# its own that reads and writes the whole output once more.
ORT_FUSED_ACTIVATIONS = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "LeakyRelu",
                                   "Tanh", "HardSwish"})
_ANCHORS = frozenset({"Conv", "Gemm", "MatMul", "MatMulInteger", "ConvInteger", "QLinearConv",
                      "QLinearMatMul", "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})
_CONVS = frozenset({"Conv", "ConvInteger", "QLinearConv"})
# Quantization edges (`analyzer.fusion`): ORT's QDQ transformer runs DQ -> op -> Q as the op's
# quantized kernel (QLinearConv, QGemm, QLinearAdd, MaxPool on uint8 ...) and
# quantize_dynamic's chain as one DynamicQuantizeMatMul: they ride in a neighbouring kernel.
_QUANT_EDGES = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Groups ORT also runs as one kernel: its LayerNormalization fusion; the attention block's
# products are costed as one, as the calibration measured them (`in_attention_block`).
_WHOLE = frozenset({LAYER_NORM, ATTENTION})
# An RMSNorm is one kernel when ORT's SimplifiedLayerNormFusion takes it: a Div for 1/sqrt
# (x / s, or 1 / s then Mul), not a Reciprocal (torch dynamo's rsqrt, as HF Llama exports
# it), which ORT leaves node by node. Checked (ORT 1.31's optimized graphs): hand-built chains
# of each form; HF T5 and a TorchScript Llama, one SimplifiedLayerNormalization per norm; a
# dynamo Llama, Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul.
_NORMS_ONE_KERNEL = frozenset({LAYER_NORM, RMS_NORM})


def runs_whole(mg: ModelGraph, group: Group) -> bool:
    """Whether ORT runs a (float) group as one kernel: `_WHOLE`, and an RMSNorm it fuses."""
    if group.pattern == RMS_NORM:
        return not any(mg.info(k).op_type == "Reciprocal" for k in group.nodes)
    return group.pattern in _WHOLE


# A residual Add joined to the norm after it, where ORT does not run it as a SkipLayerNorm
# (below): costed as the Add's kernel, then the norm's, the kernels the two groups had before
# the join (ORT's SkipSimplifiedLayerNormalization on CPU is not measured here; a quantized
# Add is a QLinearAdd, profiled in the QDQ BERT: 38 QLinearAdd, 9 LayerNormalization).
_RESIDUAL_NORMS = {ADD_LAYER_NORM: LAYER_NORM, ADD_RMS_NORM: RMS_NORM}
# Add + LayerNormalization: ORT's SkipLayerNormFusion makes it one SkipLayerNormalization,
# measured (ORT 1.31, 1 thread, Zen 5) 7-10x slower than a LayerNormalization of the same
# rows (4.1 ns per element: [64, 256] 68.8 us, LayerNormalization 9.1 us): a class of its own,
# calibrated (`catalogue.skip_norm`). BERT-4L's 9 of them were 0.6 ms of its 2.35.
SKIP_NORMALIZATION = "skip_normalization"
# DQ -> Softmax -> Q (and QOperator's node): ORT's QLinearSoftmax, measured 2.2 ns per element
# in the QDQ BERT ([1, 16, 64, 64]: 141 us; its 4 were 0.57 of 1.63 ms): calibrated apart.
SOFTMAX_INT8 = "softmax_int8"
# A float Softmax: MLAS's row loops are vectorized, LayerNormalization's scalar (measured, ORT
# 1.31, Zen 5: 0.18 against 0.35 ns per element), though our counts give the Softmax more work
# per element (its exp): one curve for both had every Softmax 50-90% over.
SOFTMAX = "softmax"
# GELU in erf, spelled out (Div, Erf, Add, Mul, Mul) or ORT's own Gelu / BiasGelu: ORT runs it
# as one Gelu kernel (scale, MlasComputeErf, combine): timed apart (`catalogue.gelu`, ORT
# 1.31, Zen 5: 0.44-0.48 ns per element), since erf costs about 1.5x a sigmoid or tanh (0.34
# against 0.23-0.26 ns), which one τ for every transcendental cannot say.
GELU = "gelu"
_ERF_GELUS = frozenset({"Gelu", "BiasGelu"})
# What ORT's BiasGelu / FastGelu and SkipLayerNorm fusions take a bias Add into (`takes_add`).
_BIAS_GELUS = frozenset({"Gelu", "FastGelu", "BiasGelu"})
_SKIP_NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization"})
_GELU_MARKS = _BIAS_GELUS | {"Erf", "Tanh"}
_GELU_DEPTH = 4  # x -> Add(x, 0.044715·x³) -> Mul -> Tanh: GPT-2's tanh formula, the longest
# A grouped Conv whose groups' channels are whole NCHWc blocks: MLAS's NCHWc convolution kernel,
# one direct convolution per group (no im2col), measured (ORT 1.31, 1 thread, Zen 5) at 0.6
# of peak (16 channels per group, 128 at 24x24: 130 us), where the NCHW path's im2col and
# small GEMMs (8 channels per group and fewer, a depthwise Conv with odd channels) run at 0.1-
# 0.25: fitted on both, one `grouped_conv` curve read the first 2.2-3.6x slow and the second
# 26-33% fast. A class of its own, a `conv` to a calibration without it.
GROUPED_CONV_NCHWC = "grouped_conv_nchwc"
# A depthwise Conv on the NCHW path (output channels off a multiple of 4, or a channel
# multiplier): MlasConv's one im2col and GEMM of M = 1 or 2 rows per channel, a fixed cost
# per call that the `grouped_conv` curve, fitted on 4-24 channels per group, did not hold:
# one curve for both read ReXNet's depthwise Convs (38-185 channels) 1.8x slow or the
# grouped ones 1.5x slow, depending on which its fit favoured. A class of its own, read per
# call like them, a `grouped_conv` to a calibration without it.
DEPTHWISE_NCHW = "depthwise_nchw"
_GROUP_CALLS = frozenset({"grouped_conv", GROUPED_CONV_NCHWC, DEPTHWISE_NCHW})  # `group_gemms`
# An elementwise kernel between DQs and a Q (QDQ Add, Mul; QLinearAdd, QLinearMul nodes):
# ORT's QLinearAdd / QLinearMul work on the uint8 values (MLAS), measured 5 us for a ResNet
# residual where the float rate of its dequantize, add, requantize FLOPs said 4x that.
ELEMENTWISE_INT8 = "elementwise_int8"
_QLINEAR_ELEMENTWISE = frozenset({"QLinearAdd", "QLinearMul"})
# Nodes that only move or pick quantized values: ORT's QDQ transformer drops the DQ before
# and the Q after them (DropQDQNodesRules, qdq_selector_action_transformer.cc), so they run
# on the 8-bit tensor itself (`moves_quantized_values`).
_QDQ_DROPPED = frozenset({"Gather", "GatherElements", "Reshape", "Transpose", "Squeeze",
                          "Unsqueeze", "Expand", "Flatten", "Slice"})
# A QuantizeLinear or DequantizeLinear that ORT runs as a kernel of its own (an unfused node
# unit's, the graph's input Q and output DQ): classes of their own, read per block
# (`quantization_blocks`). Measured (ORT 1.31, 1 thread, Zen 5): per tensor or per channel on
# the first axis DQ 0.10 and Q 0.06 ns per element, where the generic elementwise rate said
# 2-3x that (MobileNetV2 with int8 activations: 69 DQ profiled 0.41 ms, estimated 0.80); per
# block beyond that DQ 1.1 ns, Q 13.5 ns (a [4096, 256] DQ on its last axis 1.24 ms).
QUANTIZE, DEQUANTIZE = "quantize", "dequantize"
_STANDALONE_CLASS = {"QuantizeLinear": QUANTIZE, "DequantizeLinear": DEQUANTIZE}
# Classes read per call (per group, per block) since their calibration benchmarks made several
# calls: a calibration from before reads them per kernel (its curves were fitted so).
_PER_CALL = frozenset({GROUPED_CONV_INTEGER, QUANTIZE, DEQUANTIZE})
_BEFORE = {GROUPED_CONV_INTEGER: CONV_INTEGER}  # what such a calibration costed it as


def activation_passes(mg: ModelGraph, nodes: Iterable[str], in_kernel: bool) -> frozenset[str]:
    """The activations among `nodes` that MLAS runs as a pass of MlasActivation over the
    kernel's output after computing it, not inside the kernel: all of them (`in_kernel`
    False: FusedGemm, the NCHW path's FusedConv), or all but ReLU, which an NCHWc convolution
    kernel applies as it stores (its bias and a sum input likewise). Measured: a Conv with
    ReLU6 or HardSwish ran about 20% slower than its MACs at a ReLU Conv's rate said."""
    return frozenset(k for k in nodes if (op := mg.info(k).op_type) in ORT_FUSED_ACTIVATIONS
                     and not (in_kernel and op == "Relu"))


def ort_conv_path(info: NodeInfo, block: int) -> tuple[str, str, str]:
    """(class, layout read, layout written) of a Conv as ORT's NCHWc transformer places it (`block`:
    the NCHWc block in channels). A dense or depthwise Conv whose output channels are a multiple of
    4 runs as an NCHWc kernel (a depthwise one only with one output channel per group: with a
    channel multiplier, FastViT's downsampling [2C, 1, 7, 7] over C groups, it stays a plain
    Conv in ORT's optimized graph, measured 6-10x slower than the NCHWc rate said: C = 48 at
    56x56, stride 2, 353 us, estimated 59); a dense one reads plain NCHW when its input
    channels are not a multiple of 4 (the stem) or fewer than a block (its filter then in
    MLAS's OIHWBo form, NchwcTransformer: RepGhostNet's 1x1 Convs from 4, 8 and 12 channels,
    each after a ReorderOutput in ORT's optimized graph); a grouped Conv does when its groups'
    input and output channels are
    whole blocks, as one convolution per group. Other grouped Convs and odd channel counts stay on
    the NCHW path (MlasConv: im2col and GEMMs): a dense Conv there runs at a dense Conv's rate
    (`conv`). A grouped Conv on either path, and a depthwise one on the NCHW path, is many small
    problems, one or more per group, read per call (`group_gemms`): `grouped_conv` on the NCHW
    path, `grouped_conv_nchwc` on the NCHWc one (`GROUPED_CONV_NCHWC`), each fitted apart:
    measured on AVX2 (block 8), 8 channels per group run at half a dense Conv's rate on the NCHWc
    path. Probed on ORT 1.31 with AVX-512 (block 16): 8, 12 and 24 channels per group NCHW, 16, 32
    and 48 NCHWc; on AVX2 (block 8) all multiples of 8 NCHWc."""
    cls = node_class(info)
    w = info.input(1)
    if w is None or not w.known or len(w.dims) != 4:
        return cls, NCHW, NCHW
    cout, cin_per_group = w.dims[0], w.dims[1]
    groups = info.attr("group", 1)
    if cls == "grouped_conv":
        if cin_per_group % block or (cout // groups) % block:
            return "grouped_conv", NCHW, NCHW
        return GROUPED_CONV_NCHWC, NCHWC, NCHWC
    if cls == "depthwise" and (cout % 4 or cout != groups):
        return DEPTHWISE_NCHW, NCHW, NCHW
    if cout % 4:
        return cls, NCHW, NCHW
    cin = cin_per_group * groups
    return cls, NCHWC if cin % 4 == 0 and (groups > 1 or cin >= block) else NCHW, NCHWC


def nchwc_padding(info: NodeInfo, block: int, reads: str) -> float:
    """The MACs an NCHWc Conv computes per MAC of the model: MLAS's NCHWc kernels work on
    whole blocks of `block` channels, the filter reordered with its channels padded to
    blocks, so a Conv's output channels (and its input channels, when it reads NCHWc) count
    rounded up to a block; a depthwise Conv's channels likewise; a grouped one's groups are
    whole blocks already (`ort_conv_path`). GhostNet's 1x1 Conv to 4 channels at 112x112
    computes 16: measured 4.9x its MACs' time at the dense rate."""
    w = info.input(1)
    if w is None or not w.known or len(w.dims) != 4:
        return 1.0
    cout, cin = w.dims[0], w.dims[1]
    if info.attr("group", 1) > 1:
        return _padded(cout, block) / cout if w.dims[1] == 1 else 1.0
    return _padded(cout, block) / cout * (_padded(cin, block) / cin if reads == NCHWC else 1.0)


def _padded(channels: int, block: int) -> int:
    return -(-channels // block) * block


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
    w = conv_weight(info)
    y = info.outputs[0] if info.outputs else None
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


_NCHWC_BINARY = frozenset({"Add", "Sum", "Mul"})


def _elementwise_layout(info: NodeInfo) -> str:
    """ORT's NCHWc transformer converts unary ops (EfficientNet's 49 QuickGelus run on NCHWc
    tensors: 55 reorders in its optimized graph) and Add, Sum and Mul on equal shapes; a
    broadcast (squeeze-excite's per-channel gate) and any other binary op (EfficientFormer's
    pool(x) - x: a ReorderOutput before each of its 14 Subs) run in plain NCHW."""
    inputs = [t for i, t in enumerate(info.inputs) if t is not None and i not in info.const_inputs]
    if len(inputs) > 1 and info.op_type not in _NCHWC_BINARY:
        return NCHW
    return ANY if len({t.shape for t in inputs}) <= 1 else NCHW


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
    if (axes := _transpose_axes(info)) is None:
        return 0
    dims, perm = axes
    moved = [a for a in perm if dims[a] != 1]
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


# ORT's binary elementwise kernels that broadcast through its Broadcaster (cpu/math/
# element_wise_ops.h): arithmetic, comparisons, logic.
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Max", "Min", "Sum",
                           "Mean", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
                           "GreaterOrEqual", "And", "Or", "Xor"})


def gathered_slices(info: NodeInfo) -> int:
    """The slices ORT's GatherND copies one at a time (cpu/tensor/gather_nd.cc): one per index
    tuple, the indices' elements over their last axis, each its offset computed from the tuple
    and then a memcpy of the slice: a run, as a Transpose's (`transpose_runs`), at
    `runtime.copy_run_ns` each. Measured (ORT 1.31, 1 thread, Zen 5), single-element slices
    (an HF causal mask's [1, 1, 1, T, 2] indices into its [1, T] attention mask): 6.2 us at
    T = 512 and 46 us at 4,096, bool or float, 11.3-12.2 ns a slice, where 6.4 ns a run
    gives half (the tuple's offset arithmetic beyond a run is not modelled); as an
    elementwise kernel the slices had cost 0.3-0.4 us in all."""
    indices = info.input(1)
    if indices is None or not indices.known or indices.rank < 1 or not indices.dims[-1]:
        return 0
    return indices.size // indices.dims[-1]


def broadcast_spans(info: NodeInfo) -> int:
    """The spans ORT's broadcasting loop makes one vector call each for, 0 where one call
    does the whole output (equal shapes, or one input a scalar).

    Derivation (ORT's cpu/math/element_wise_ops.h, Broadcaster): from the innermost axis out,
    skipping axes of output size 1, each input's axes are merged into runs that it either
    broadcasts or reads whole; the span is the shorter of the two inputs' innermost runs,
    and the loop calls the op's vector (or scalar-times-vector) function once per span of
    the output. A squeeze-excite gate, [1, C, H, W] x [1, C, 1, 1], is C spans of H·W; a
    channels-last scale, [1, H·W, C] x [C], H·W spans of C. Each call pays its set-up, as a
    Transpose's copied run does (`transpose_runs`): measured (ORT 1.31, Zen 5) a gate of 1024
    channels at 6x6 took 9.8 us where its bytes at the L2 bandwidth take 2.5."""
    if info.op_type not in _BROADCASTING or len(info.inputs) != 2 or not info.outputs:
        return 0
    a, b, y = info.inputs[0], info.inputs[1], info.outputs[0]
    if a is None or b is None or not (a.known and b.known and y.known) or not y.size:
        return 0
    span = min(inner_run(a.dims, y.dims), inner_run(b.dims, y.dims))
    return y.size // span if span < y.size else 0


# ORT's row-wise normalization kernels: LayerNormalization and its simplified form (one
# LayerNormImpl), over dims[axis:]; Softmax and LogSoftmax (MLAS), over one axis.
_LAYER_NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization",
                          "RMSNormalization"})
_SOFTMAXES = frozenset({"Softmax", "LogSoftmax"})


def normalized_rows(infos: Iterable[NodeInfo]) -> int:
    """The rows the first row-wise normalization among `infos` (one kernel's nodes) reduces
    one at a time, 0 where none does (a BatchNormalization) or its shape is unknown; a
    spelled-out LayerNorm, which ORT fuses into one LayerNormalization, has the rows of its
    first ReduceMean's output.

    Derivation (ORT's cpu/nn/layer_norm_impl.cc): each row is a job (TryBatchParallelFor)
    that sums x and x² in one scalar loop, takes the mean, variance and 1/sqrt, then writes
    the row in a second loop that waits for them: a serial tail per row that the elements do
    not amortize when rows are short. MLAS's softmax likewise reduces each row twice (max,
    then the sum of exp) before scaling it. Measured (ORT 1.31, 1 thread, Zen 5):
    LayerNormalization 14 ns per row beyond 0.35 ns per element ([3136, 24]: 73 us, where
    [64, 1024], 2.6x the elements, takes 25), Softmax 9 ns per row beyond 0.18 ns."""
    for info in infos:
        x = info.input(0)
        if x is None or not x.known or not x.rank:
            continue
        if info.op_type in _LAYER_NORMS:
            return math.prod(x.dims[:info.attr("axis", -1) % x.rank])
        if info.op_type in _SOFTMAXES:
            return along_axis(x.dims, info.attr("axis", -1))[0]
        if info.op_type == "ReduceMean" and info.outputs and info.outputs[0].known:
            return info.outputs[0].size
    return 0


def transpose_elements(info: NodeInfo) -> int:
    """The elements ORT's Transpose copies one at a time, 0 where it copies runs or streams.

    Derivation (ORT's cpu/tensor/transpose.cc): a permutation that keeps the axes longer than
    1 in order is a reshape (one copy); one that moves a single axis (IsTransposeMovingSingleAxis,
    on the whole permutation, size-1 axes included) is MLAS's blocked transpose; any other
    copies the trailing axes the permutation leaves in place as blocks (`transpose_runs`), and
    when there are none (the innermost axis moves) walks the output element by element,
    computing each one's source offset (DoTransposeEltWise). EdgeNeXt's split attention,
    [1, 784, 3, 4, 12] with perm (2, 0, 3, 4, 1), is 112,896 such copies: measured 2.2 ns
    each, 20x what their bytes take at the bandwidth."""
    if (axes := _transpose_axes(info)) is None:
        return 0
    dims, perm = axes
    longer = [a for a in perm if dims[a] != 1]
    if longer == sorted(longer) or _moves_one_axis(perm):
        return 0
    suffix = 1
    for axis in range(len(perm) - 1, -1, -1):
        if perm[axis] != axis:
            break
        suffix *= dims[axis]
    return math.prod(dims) if suffix == 1 else 0


def blocked_transpose(info: NodeInfo) -> bool:
    """A Transpose ORT runs as MLAS's blocked transpose (class BLOCKED_TRANSPOSE): one axis
    moved past the innermost (NCHW <-> NHWC, [B, C, N] <-> [B, N, C]), where it neither copies
    runs (`transpose_runs`) nor elements (`transpose_elements`) and is no reshape (the axes
    longer than 1 out of order). Measured (ORT 1.31, Zen 5, 1 thread), [1, 64, 56, 56] to
    NHWC 23.5 us and back 42 us: 68 and 38 GB/s, where the L3 bandwidth was 74-95 GB/s."""
    if (axes := _transpose_axes(info)) is None:
        return False
    dims, perm = axes
    longer = [a for a in perm if dims[a] != 1]
    return longer != sorted(longer) and not transpose_runs(info) and not (
        transpose_elements(info))


def _transpose_axes(info: NodeInfo) -> tuple[tuple[int, ...], list[int]] | None:
    """A Transpose's input dims and permutation (by default the axes reversed), None for
    another op or an unknown or scalar input."""
    x = info.input(0)
    if info.op_type != "Transpose" or x is None or not x.known or not x.rank:
        return None
    return x.dims, list(info.attr("perm", list(reversed(range(x.rank)))))


def _moves_one_axis(perm: list[int]) -> bool:
    """The identity permutation with one axis moved elsewhere."""
    return any(rest == sorted(rest) for i in range(len(perm))
               for rest in [perm[:i] + perm[i + 1:]])


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
                block: int, run_time: frozenset[str] = frozenset()) -> list[Kernel]:
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
    only constants costs nothing). Quantized groups: a Q rides in the kernel before it, a DQ
    (of an activation or a weight), a DynamicQuantizeLinear and the Mul of its scale in the
    kernel after them (the DQ ending a group in the last kernel), so a QDQ Conv (+Relu) group
    is one kernel reading and writing int8 and Conv -> Q -> DQ -> Add two (QLinearConv,
    QLinearAdd); MatMulInteger is an anchor taking
    the Cast and scale Mul after it (DynamicQuantizeMatMul). The weights' DQ arithmetic stays
    in the kernel's FLOPs (ORT prepacks them: an overcount of 2 FLOPs per weight, under 1% of
    a Conv's MACs). Profiled (ORT 1.31, AVX-512 VNNI, QDQ ResNet-18 per channel): with uint8
    activations ORT runs 20 QLinearConv, 8 QLinearAdd, one kernel per pool, Flatten and QGemm
    (36 kernels, 2 of them NHWC transposes not modelled here); with int8 activations
    (quantize_static's default) only the node units ORT turns to uint8 are fused
    (`_int8_unfused`): 9 QLinearConv, and 11 Convs and 8 Adds run as DQ, float kernel and Q
    (124 kernels, `_unfused_kernels`). `block`: the NCHWc block in channels."""
    # QDQ or QOperator nodes: ORT runs each QLinear node, no attention or norm kernel of its
    # own (quantize_static's QOperator attention, one group since 1853d06, is not one block)
    quantized = any(mg.info(k).op_type in _QUANT_EDGES | _QOPERATOR for k in group.nodes)
    if len(group.nodes) == 1 and mg.info(group.nodes[0]).op_type == "GroupQueryAttention":
        return gqa_kernels(mg.info(group.nodes[0]), kernel_of(
            mg, list(group.nodes), costs, "attention", NCHW, NCHW), block)
    if any(mg.info(k).op_type == "ConvInteger" for k in group.nodes):
        return _conv_integer_kernels(mg, group, costs, block)
    if group.pattern == ADD_LAYER_NORM and not quantized:
        return [kernel_of(mg, list(group.nodes), costs, SKIP_NORMALIZATION, NCHW, NCHW)]
    norm = _RESIDUAL_NORMS.get(group.pattern)
    adds = [i for i, k in enumerate(group.nodes) if mg.info(k).op_type == "Add"]
    if norm is not None and adds:  # (ORT's Skip*LayerNormalization op has no Add)
        split = adds[0] + 1
        return (ort_kernels(mg, Group(group.id, "Add", group.nodes[:split]), costs, block,
                            run_time)
                + ort_kernels(mg, Group(group.id, norm, group.nodes[split:]), costs, block,
                              run_time))
    if runs_whole(mg, group) and not quantized:  # QDQ attention: QLinearMatMul, QLinearSoftmax
        norm = group.pattern in _NORMS_ONE_KERNEL
        cls = "normalization" if norm else op_class(mg, group, costs)
        matmul = next((i for k in group.nodes if (i := mg.info(k)).op_type == "MatMul"), None)
        rows = normalized_rows(map(mg.info, group.nodes)) if norm else 0
        whole = replace(kernel_of(mg, list(group.nodes), costs, cls, NCHW, NCHW,
                                  calls=matmul_calls(matmul) if matmul else 1), rows=rows)
        apart = [k for k in group.nodes  # Softmax, the mask's (Add, IsNaN, Where), Expand
                 if group.pattern == ATTENTION and not in_attention_block(mg, mg.info(k))]
        keys = packed_keys(mg, group.nodes) if group.pattern == ATTENTION else []
        return [*keys, without_work_of(whole, [costs[k] for k in apart])] + [  # type: ignore[misc]
            _ort_kernel(mg, [k], "other", costs, block) for k in apart]
    kernels = _node_runs(mg, group.nodes, block, run_time)
    out = [k for nodes, role in kernels for k in (
        _unfused_kernels(mg, nodes, costs) if _int8_unfused(mg, nodes)
        else filter_reordered(mg, _ort_kernel(mg, nodes, role, costs, block)))]
    return out or [Kernel("data_movement", Cost(), (), launches=0)]


def _node_runs(mg: ModelGraph, nodes: Sequence[str], block: int,
               run_time: frozenset[str] = frozenset()) -> list[tuple[list[str], str]]:
    """A group's nodes cut into the kernels ORT runs (`ort_kernels`' rules for a group that
    no special case takes), each with its role: "anchor" (a Conv, Gemm, MatMul or lone
    BatchNormalization still taking what follows it), "closed" (one that took its
    activation), "vector" (a run of elementwise nodes) or "other". A HardSwish closes only
    an NCHWc Conv (`takes_activation`)."""
    kernels: list[tuple[list[str], str]] = []
    riders: list[str] = []  # quantization edges waiting for the kernel that reads them
    for key in nodes:
        info = mg.info(key)
        if info.op_type == "Constant":
            continue
        if info.op_type == "QuantizeLinear" and kernels:
            kernels[-1][0].append(key)
            continue
        if _rides_ahead(mg, info):
            riders.append(key)
            continue
        last = kernels[-1] if kernels else None
        reads_last = last is not None and any(
            t is not None and mg.producer.get(t.name) in last[0] for t in info.inputs)
        sole = last is not None and all(
            len(mg.consumers.get(t.name, ())) == 1 for t in mg.info(last[0][-1]).outputs)
        if info.op_type in _ANCHORS:
            kernels.append(([key], "anchor"))
        elif last and last[1] == "anchor" and reads_last and sole and (
                info.op_type == "BatchNormalization"
                or (info.op_type == "Add" and takes_add(mg, mg.info(last[0][0]), info, run_time))
                or (mg.info(last[0][0]).op_type in ("MatMulInteger", "ConvInteger")
                    and info.op_type in ("Cast", "Mul"))):
            last[0].append(key)
        elif last and last[1] == "anchor" and reads_last and sole and (
                takes_activation(mg.info(last[0][0]), info, block)) and not _cast_constants(
                mg, info):
            last[0].append(key)
            kernels[-1] = (last[0], "closed")
        elif last and last[1] == "vector" and reads_last and _vector_op(info):
            last[0].append(key)
        elif info.op_type == "BatchNormalization":
            kernels.append(([key], "anchor"))
        else:
            kernels.append(([key], "vector" if _vector_op(info) else "other"))
        if riders:  # ahead of the node they feed: `_ort_kernel` reads the first other node
            kernels[-1][0].extend(riders)
            riders = []
    if riders and kernels:  # the DQ a QDQ group ends in (ORT copies it into each reader)
        kernels[-1][0].extend(riders)
    elif riders:  # a group of quantization edges alone (the model's input Q, output DQ)
        kernels += [([k], "other") for k in riders]
    return kernels


def takes_add(mg: ModelGraph, anchor: NodeInfo, add: NodeInfo, run_time: frozenset[str]
              ) -> bool:
    """Whether ORT runs the Add after `anchor` inside the anchor's kernel. A MatMul takes it
    as Gemm (MatMulAddFusion), but a left operand of rank other than 2 needs the Reshapes
    around the Gemm, which ORT builds only from a concrete shape: one whose shape it knows
    only at run time (`run_time`, from the file's symbolic dims) leaves MatMul and Add two
    kernels. Such an Add is still no kernel of its own where ORT's later fusions take the
    bias (`bias_taken_later`). Seen in ORT 1.31's optimized graphs: an HF GPTBigCode decode
    step (dynamo, symbolic sequence lengths) runs 5 of its 8 bias Adds alone, 2 in FastGelu,
    1 in SkipLayerNormalization; [1, n, 8] x [8, 4] + bias, MatMul and Add, Gemm with n = 3
    in the file (`test_estimate`)."""
    a = anchor.input(0)
    if anchor.op_type != "MatMul" or a is None or a.rank == 2 or a.name not in run_time:
        return True
    return bias_taken_later(mg, add)


def bias_taken_later(mg: ModelGraph, add: NodeInfo) -> bool:
    """Whether ORT fuses bias Add `add` into what follows it: a GELU (BiasGelu, or FastGelu
    with its bias input; the GELU an op, or its erf or tanh formula spelled out, which ORT's
    Gelu fusions first make one op: an Erf or Tanh within `_GELU_DEPTH` elementwise nodes)
    or a residual Add feeding only a LayerNormalization or RMS norm (SkipLayerNormalization,
    SkipSimplifiedLayerNormalization with its bias input)."""
    nxt = _sole_reader(mg, add)
    if nxt is not None and nxt.op_type == "Add":
        norm = _sole_reader(mg, nxt)
        return norm is not None and norm.op_type in _SKIP_NORMS
    front = [add]
    for _ in range(_GELU_DEPTH):
        front = [mg.info(k) for i in front for t in i.outputs for k in mg.consumers.get(t.name, ())]
        if any(i.op_type in _GELU_MARKS for i in front):
            return True
        front = [i for i in front if _vector_op(i)]
    return False


def _sole_reader(mg: ModelGraph, info: NodeInfo) -> NodeInfo | None:
    readers = mg.consumers.get(info.outputs[0].name, ()) if info.outputs else ()
    return mg.info(readers[0]) if len(readers) == 1 else None


def _vector_op(info: NodeInfo) -> bool:
    """Whether ORT runs `info` inside a run of elementwise nodes: an elementwise class, but a
    GatherND, which copies slices in a kernel of its own (`gathered_slices`)."""
    return node_class(info) == "elementwise" and info.op_type != "GatherND"


def takes_activation(anchor: NodeInfo, act: NodeInfo, block: int) -> bool:
    """Whether ORT runs activation `act` inside `anchor`'s kernel. ORT's CPU provider has no
    HardSwish kernel: only the NchwcTransformer takes one into an NCHWc Conv; anywhere else
    ORT inlines its function body, HardSigmoid then Mul, two kernels (`hard_swish_products`).
    Seen in ORT 1.31's optimized graphs: Conv -> HardSwish on the NCHWc path one Conv with
    activation HardSwish; after a Gemm, a 3-D MatMul + Add (Reshape, Gemm, Reshape) or a grouped
    Conv on the NCHW path, and alone, HardSigmoid and Mul (LeViT-128S: 22 of each)."""
    if act.op_type == "HardSwish":
        return anchor.op_type == "Conv" and ort_conv_path(anchor, block)[2] == NCHWC
    return act.op_type in ORT_FUSED_ACTIVATIONS


def hard_swish_products(mg: ModelGraph, k: Kernel) -> list[Kernel]:
    """The Mul kernel x · hardsigmoid(x) after each HardSwish of kernel `k` that ORT runs as
    its inlined HardSigmoid (`takes_activation`; none in a Conv's kernel or folded into one):
    it reads x and the HardSigmoid's output and writes the result, 1 FLOP per element: 3
    tensors of x's size moved, where the HardSwish kernel itself (costed as the node:
    HardSigmoid's work and one more FLOP) moves 2."""
    if k.launches == 0 or mg.info(k.nodes[0]).op_type == "Conv":
        return []
    out = []
    for key in k.nodes:
        info = mg.info(key)
        y = info.outputs[0] if info.op_type == "HardSwish" and info.outputs else None
        if y is not None and y.known:
            out.append(Kernel("elementwise", Cost(other_flops=y.size, bytes_read=2 * y.nbytes,
                                                  bytes_written=y.nbytes), (key,), NCHW, NCHW))
    return out


def symmetric_conv(head: NodeInfo, block: int) -> bool:
    """Whether MLAS runs dense quantized Conv `head` (uint8 activations, int8 weights of zero
    zero point, as quantize_static writes them: not checked) in its symmetric convolution
    kernel, as ORT's QLinearConv does wherever MlasConvSymPackWSize accepts the shape; else
    ORT makes an im2col of the input and a QGEMM (CONV_INT8_IM2COL, its reuse that GEMM's,
    `group_gemms`). Derivation (MLAS convsym.cpp, the x86 dispatches): the kernel packs 16
    output channels and reads 4 input channels at a time, so it wants Cout >= 16, Cin a
    multiple of 4 and Cout one of 4 (AVX-512 VNNI, `block` 16) or 8 (AVX2, AVX-VNNI): a stem
    of 3 input channels is not taken. Unknown shapes: taken."""
    w = conv_weight(head)
    if w is None or not w.known or len(w.dims) != 4:
        return True
    cout, cin = w.dims[0], w.dims[1]
    return cin % 4 == 0 and cout >= 16 and cout % (4 if block >= 16 else 8) == 0


def filter_reordered(mg: ModelGraph, k: Kernel) -> list[Kernel]:
    """`k`, after the reorder of its filter that ORT's QLinearConv makes on every call when it
    has no packed one: on x86 a QLinearConv on int8 activations (GEMM_S8S8: MLAS's portable
    GEMM, which prepacks nothing) copies its weights from [Cout, Cin, kh, kw] to the
    [kh·kw·Cin, Cout] its GEMM reads, one element at a time (qlinearconv.cc ReorderFilter):
    a kernel of data movement of W elements, each at the calibration's per-element copy cost
    (`copy_element_ns`, from ORT's element-wise Transpose). Measured (ORT 1.31, Zen 5,
    ResNet-18 QOperator int8 activations): each Conv 1.6-3.5 ns per weight over its MACs'
    time (7x7 512->512, 2.4 M weights: 14.0 ms, 5.8 from its MACs), where a QLinearMatMul,
    whose B is already [K, N], pays none (64x2048x1024 at 17 GMAC/s)."""
    conv = next((i for n in k.nodes if (i := mg.info(n)).op_type in _CONVS), None)
    if k.cls != GEMM_S8S8 or conv is None:
        return [k]
    w = conv_weight(conv)
    if w is None or not w.known:
        return [k]
    return [Kernel("data_movement", Cost(bytes_read=w.nbytes, bytes_written=w.nbytes),
                   (conv.name,), NCHW, NCHW, elements=w.size), k]


def nhwc_conv(head: NodeInfo) -> str:
    """The layout ORT runs a quantized Conv in: NHWC. Its NhwcTransformer (ORT_ENABLE_ALL, x86)
    makes each QLinearConv (a QDQ unit's too) the channels-last com.microsoft op with
    Transposes of its 8-bit input and output, which the transpose optimizer pushes through
    the quantized kernels next to it (QLinearAdd, NhwcMaxPool, QLinearGlobalAveragePool: any
    layout) and cancels in pairs: a chain of them pays one Transpose at each end (profiled,
    ORT 1.31, ResNet-18 QDQ uint8: 2), a QLinearConv between float kernels one on each side
    (MobileNetV2 QDQ with int8 activations, 37 QLinearConv among 15 float Convs: 32
    Transposes, 0.25 ms of 4.5 profiled). `layout_changes` places them, on the 8-bit tensors
    (the DequantizeLinear after a QLinearConv reads NCHW). A Conv with a 1-D or 3-D input
    stays NCHW: nothing to transpose."""
    x = head.input(0)
    return NHWC if x is not None and x.known and x.rank == 4 else NCHW


def moves_quantized_values(mg: ModelGraph, head: NodeInfo, nodes: Sequence[str]) -> bool:
    """Whether ORT runs kernel `nodes` as `head` alone on 8-bit values: a node of _QDQ_DROPPED
    whose data input a DequantizeLinear of the kernel makes and whose output a QuantizeLinear
    of the kernel reads (the DQ and Q dropped; their arithmetic is none of its work, its bytes
    those of the 8-bit tensors). Profiled (ORT 1.31, BERT QDQ uint8): 20 Reshapes and 16
    Transposes on uint8 and no DQ or Q beside them, where the kernel model had charged each
    the DQ and Q arithmetic at the elementwise rate (9 us where ORT's profile says 3 to 10).
    Approximation, signed: ORT drops them only where the DQ and Q have one scale and zero
    point, which quantize_static writes for these ops; that is not checked."""
    x, y = head.input(0), head.outputs[0] if head.outputs else None
    if head.op_type not in _QDQ_DROPPED or x is None or y is None:
        return False
    inside = {mg.info(k).op_type: k for k in nodes if k != head.name}
    dq, q = inside.get("DequantizeLinear"), inside.get("QuantizeLinear")
    return (dq is not None and mg.producer.get(x.name) == dq
            and q is not None and y.name in {t.name for t in mg.info(q).inputs if t})


def _conv_integer_kernels(mg: ModelGraph, group: Group, costs: dict[str, Cost | None],
                          block: int) -> list[Kernel]:
    """quantize_dynamic's Conv as ORT's CPU provider runs it: one kernel per node. ORT fuses
    MatMulInteger's chain into a DynamicQuantizeMatMul but has no fusion for ConvInteger's,
    so its DynamicQuantizeLinear, the Mul of the two scales, the ConvInteger, the Cast of its
    int32 output, the Mul by the scale, the bias Add and the activation each read and write
    their tensors; a node of constants alone (the Reshape of the bias or the weight's scale)
    is folded when ORT loads the model. Profiled (ORT 1.31, 1 thread, MobileNetV2
    quantize_dynamic): DynamicQuantizeLinear, ConvInteger, Cast, Mul, Mul, Add, Clip per Conv,
    360 kernels for 52 Convs."""
    def folded(info: NodeInfo) -> bool:
        return info.op_type == "Constant" or all(
            i in info.const_inputs for i, t in enumerate(info.inputs) if t is not None)
    return [_ort_kernel(mg, [k], "anchor" if info.op_type == "ConvInteger" else "other",
                        costs, block)
            for k in group.nodes if not folded(info := mg.info(k))]


def quantization_blocks(info: NodeInfo) -> int:
    """The blocks ORT's QuantizeLinear / DequantizeLinear kernel runs one after another: 1 per
    tensor, else one per index of the axes up to and including `axis`, 1 where the shape is
    unknown.

    Derivation (ORT's cpu/quantization/quantize_linear.cc): a scale of one element is one
    block of the whole tensor; per axis (and blocked) the tensor is [before, axis, after], and
    for each (before, axis) index the kernel reads that index's scale and zero point and runs
    a loop over the `after` elements (DQ), or calls MLAS's quantize routine on them (Q). A
    Conv weight per channel on axis 0 is Cout blocks of Cin·kh·kw; a MatMul weight [K, N] per
    column on axis 1 is K·N blocks of one element each, where each block's fixed cost is all
    there is (measured, 1 thread, Zen 5: DQ 1.2 ns per element there, 0.1 on axis 0)."""
    x, scale = info.input(0), info.input(1)
    if x is None or not x.known or not x.rank or scale is None or not scale.known or (
            scale.size <= 1):
        return 1
    return math.prod(x.dims[:info.attr("axis", 1) % x.rank + 1])


def standalone_quantization(mg: ModelGraph, key: str, costs: dict[str, Cost | None]) -> Kernel:
    """A QuantizeLinear or DequantizeLinear run as a kernel of its own: its class's curve read
    per block (`calls`: the estimator charges the curve's fixed cost once per block)."""
    info = mg.info(key)
    return kernel_of(mg, [key], costs, _STANDALONE_CLASS[info.op_type], NCHW, NCHW,
                     calls=quantization_blocks(info))


def _rides_ahead(mg: ModelGraph, info: NodeInfo) -> bool:
    """A DQ, a DynamicQuantizeLinear, or a Mul of a DynamicQuantizeLinear's scale."""
    if info.op_type in _QUANT_EDGES:
        return True
    sources = [mg.producer.get(t.name) for t in info.inputs if t is not None]
    return info.op_type == "Mul" and any(
        src is not None and mg.info(src).op_type == "DynamicQuantizeLinear" for src in sources)


def activation_type(mg: ModelGraph, dq: NodeInfo) -> int:
    """The element type ORT's CPU provider on x86 runs quantized activation `dq` reads in (a
    DequantizeLinear's input made by a QuantizeLinear; 0 for a weight or an unknown type).
    ORT copies a DQ with several readers into one per reader (EnsureUniqueDQForNodeUnit,
    level 1), then its QDQS8ToU8Transformer turns an int8 Q -> DQ pair with a scalar zero
    point into uint8 where the Q's only reader is the DQ (level 2): an int8 tensor read by one
    node unit (or that is the graph's output) becomes uint8, one read by several (a
    residual's input: a Conv and the Add) stays int8. Profiled (ORT 1.31, QDQ ResNet-18
    with int8 activations): the 9 Convs whose input and output each have one reader are
    QLinearConv, the other 11 and the 8 Adds float."""
    x = dq.input(0)
    q = None if x is None else mg.producer.get(x.name)
    if x is None or q is None or mg.info(q).op_type != "QuantizeLinear":
        return 0
    if x.elem_type != onnx.TensorProto.INT8:
        return x.elem_type
    zero_point = mg.info(q).input(2)
    y = dq.outputs[0].name
    readers = len(mg.consumers.get(y, ())) + (y in mg.graph_outputs)  # DQ copies ORT makes
    converted = (len(mg.consumers.get(x.name, ())) == 1 and readers == 1
                 and zero_point is not None and zero_point.known and zero_point.size == 1)
    return onnx.TensorProto.UINT8 if converted else onnx.TensorProto.INT8


_QOPERATOR_MACS = frozenset({"QLinearConv", "QLinearMatMul", "QGemm"})
_QOPERATOR = _QOPERATOR_MACS | _QLINEAR_ELEMENTWISE | {"QLinearSoftmax", "QLinearConcat",
                                                       "QAttention"}


def multiplies_int8_activations(mg: ModelGraph, head: NodeInfo) -> bool:
    """Whether ORT runs `head`'s integer MACs on int8 activations (GEMM_S8S8): a QOperator
    node reading int8, or a QDQ Gemm whose input ORT keeps int8 (`activation_type`; a QDQ
    Conv or MatMul on int8 is not fused at all: `_int8_unfused`)."""
    x = head.input(0)
    if x is None:
        return False
    if head.op_type in _QOPERATOR_MACS:
        return x.elem_type == onnx.TensorProto.INT8
    dq = mg.producer.get(x.name)
    return dq is not None and mg.info(dq).op_type == "DequantizeLinear" and activation_type(
        mg, mg.info(dq)) == onnx.TensorProto.INT8


def _unit(mg: ModelGraph, nodes: list[str]) -> tuple[NodeInfo, list[NodeInfo], NodeInfo | None]:
    """A kernel's node unit as ORT's QDQ selectors see it: the op, the DequantizeLinears of
    its activation inputs (in the kernel or before it), the QuantizeLinear of its output."""
    infos = [mg.info(k) for k in nodes]
    head = next(i for i in infos if i.op_type not in _QUANT_EDGES)
    dqs = [mg.info(k) for t in head.inputs if t is not None
           and (k := mg.producer.get(t.name)) is not None
           and mg.info(k).op_type == "DequantizeLinear" and activation_type(mg, mg.info(k))]
    q = next((i for i in infos if i.op_type == "QuantizeLinear"
              and any(mg.producer.get(t.name) == head.name for t in i.inputs if t)), None)
    return head, dqs, q


def _int8_unfused(mg: ModelGraph, nodes: list[str]) -> bool:
    """Whether ORT leaves a QDQ node unit (DQs -> op -> Q) unfused because of int8
    activations (`activation_type`): its selectors (qdq_selectors.cc, ORT 1.31) fuse a Conv
    or MatMul whose first input and output have one type, never int8 on x86 (MLAS's fast
    integer GEMMs there want uint8 activations: QDQIsInt8Allowed is ARM's only); any other
    op (QLinearAdd, QLinearSoftmax, QLinearGlobalAveragePool, MaxPool on the integers) whose
    inputs and output have one type, int8 or not."""
    if not any(mg.info(k).op_type == "QuantizeLinear" for k in nodes) or all(
            mg.info(k).op_type in _QUANT_EDGES for k in nodes):
        return False
    head, dqs, q = _unit(mg, nodes)
    if not dqs or q is None or any(t is None or not t.elem_type for t in (
            dq.input(0) for dq in dqs)):
        return False
    inputs = [activation_type(mg, dq) for dq in dqs]
    output = q.outputs[0].elem_type
    readers = mg.consumers.get(q.outputs[0].name, ())
    if len(readers) == 1 and mg.info(readers[0]).op_type == "DequantizeLinear":
        output = activation_type(mg, mg.info(readers[0]))
    if head.op_type in ("Conv", "MatMul"):
        return inputs[0] == onnx.TensorProto.INT8 or inputs[0] != output
    return len({*inputs, output}) > 1


def _unfused_kernels(mg: ModelGraph, nodes: list[str], costs: dict[str, Cost | None]
                     ) -> list[Kernel]:
    """A QDQ node unit ORT does not fuse (`_int8_unfused`), as ORT runs it: a DequantizeLinear
    kernel per quantized input (weights and bias included: ORT keeps their DQs, run every
    inference; an activation's DQ that several units read is one copy per reader, each
    counted by its reader, so a DQ of `nodes` that the op does not read is left out), the
    op's float kernel at fp32 (a Conv on the NCHW path: the NCHWc transformer wants constant
    weights), and a QuantizeLinear kernel. Profiled (ORT 1.31, QDQ ResNet-18, int8
    activations): DQ, DQ, DQ, Conv, Q per unfused Conv; 51 DQ kernels, 1.1 ms of 12.7."""
    head = _unit(mg, nodes)[0]
    dequantized = [k for t in head.inputs if t is not None
                   and (k := mg.producer.get(t.name)) is not None
                   and mg.info(k).op_type == "DequantizeLinear"]
    work = [k for k in nodes if mg.info(k).op_type not in _QUANT_EDGES]
    cls, calls, reuse = node_class(head), 1, 0.0
    if cls == "depthwise":  # on the NCHW path, one small GEMM per channel (`ort_conv_path`)
        cls = "grouped_conv"
    if cls == "conv":  # its weights a DQ's output, computed at run time
        cls = CONV_UNPACKED
    if cls == "grouped_conv":
        calls, reuse = group_gemms(head)
    elif head.op_type == "MatMul":
        calls = matmul_calls(head)
    float_kernel = replace(kernel_of(mg, work, costs, cls, NCHW, NCHW, calls=calls, reuse=reuse,
                                     passes=activation_passes(mg, work, False)), peak="fp32")
    return ([standalone_quantization(mg, k, costs) for k in dequantized] + [float_kernel]
            + [standalone_quantization(mg, k, costs) for k in nodes
               if mg.info(k).op_type == "QuantizeLinear"])


def _cast_constants(mg: ModelGraph, info: NodeInfo) -> bool:
    """A float16 node with constant inputs (a Clip's bounds): ORT's CPU provider, lacking a
    float16 kernel, reads them through Casts it inserts, so its fusions, which want constants,
    leave the node alone and the NCHWc transformer keeps it in NCHW. Profiled (ORT 1.31,
    MobileNetV2 fp16): 35 Clips (ReLU6) as kernels of their own between 34 ReorderInput and 35
    ReorderOutput; fp32: each fused into its Conv."""
    x = info.input(0)
    return is_float16(x) and any(
        constant_input(mg, info, i) for i in range(1, len(info.inputs)))


def _integer_macs(mg: ModelGraph, head: NodeInfo) -> bool:
    """Whether `head`'s MACs multiply integers (seen through DequantizeLinear: a QDQ Conv's
    uint8 x int8; MatMulInteger, ConvInteger): ORT runs its quantized kernel (QLinearConv,
    QGemm, DynamicQuantizeMatMul), costed at the int8 classes' fitted rates (INT8_CLASS)."""
    def producer(tensor: str) -> NodeInfo | None:
        key = mg.producer.get(tensor)
        return None if key is None else mg.info(key)
    precision = mac_precision(head, producer)
    return precision is not None and precision.startswith("int")


def int8_gemm_class(mg: ModelGraph, head: NodeInfo) -> str:
    """The class of an integer GEMM on uint8 activations: GEMM_INT8_UNPACKED when its B is an
    activation, GEMV_INT8 on weights with one row of A, gemm_int8 otherwise."""
    b = 3 if head.op_type in _QOPERATOR_MACS else 1  # QLinearMatMul, QGemm: A, scale, zero, B
    if not _weights(mg, head, b):
        return GEMM_INT8_UNPACKED
    return GEMV_INT8 if gemm_rows(head) == 1 else INT8_CLASS["gemm"]


def _weights(mg: ModelGraph, info: NodeInfo, i: int) -> bool:
    """Whether input `i` is constant, or a DequantizeLinear of a constant (a QDQ weight, which
    ORT's QDQ fusion takes as the quantized kernel's constant B, prepacked at load)."""
    if constant_input(mg, info, i):
        return True
    t = info.input(i)
    key = None if t is None else mg.producer.get(t.name)
    return key is not None and mg.info(key).op_type == "DequantizeLinear" and constant_input(
        mg, mg.info(key), 0)


def gemm_rows(head: NodeInfo) -> int | None:
    """M, the rows of A a GEMM node multiplies (a MatMul's leading dims flattened, as MLAS
    runs a MatMul on 2-D weights; a Gemm's A, transposed by transA); None when unknown."""
    a = head.input(0)
    if a is None or not a.known or a.rank < 2:
        return None
    if head.op_type in ("Gemm", "QGemm"):
        return a.dims[1] if head.attr("transA", 0) else a.dims[0]
    return a.size // a.dims[-1]


def _integer_kernel(mg: ModelGraph, k: Kernel, costs: dict[str, Cost | None]) -> Kernel:
    """A kernel multiplying integers without the arithmetic of its DequantizeLinear nodes:
    ORT's QDQ transformer runs DQ -> op -> Q as the op's quantized kernel (QLinearConv,
    QGemm), which multiplies the stored integers (weights prepacked at load, activations never
    dequantized) and requantizes its int32 accumulator (the Q's arithmetic stands for that).
    So a QDQ model's kernel does the work of its QOperator twin's (ORT 1.31 profiles: the same
    36 kernels for ResNet-18 in both formats, 69 for MobileNetV2)."""
    dq = [costs[n] for n in k.nodes if mg.info(n).op_type == "DequantizeLinear"]
    flops = sum(c.other_flops for c in dq if c is not None)
    if not flops:
        return k
    return replace(k, cost=replace(k.cost, other_flops=k.cost.other_flops - flops))


def _ort_kernel(mg: ModelGraph, nodes: list[str], role: str, costs: dict[str, Cost | None],
                block: int) -> Kernel:
    head = mg.info(nodes[0])
    if head.op_type in _CONVS:
        return _conv_kernel(mg, nodes, role, costs, block)
    if head.op_type in _ANCHORS:
        cls = node_class(head)
        kernel = kernel_of(mg, nodes, costs, cls, NCHW, NCHW,
                           calls=matmul_calls(head) if head.op_type == "MatMul" else 1,
                           passes=activation_passes(mg, nodes, False))
        if _integer_macs(mg, head):
            cls = GEMM_S8S8 if multiplies_int8_activations(mg, head) else INT8_CLASS.get(cls, cls)
            cls = int8_gemm_class(mg, head) if cls == INT8_CLASS["gemm"] else cls
            return _integer_kernel(mg, replace(kernel, cls=cls), costs)
        return kernel
    if head.op_type == "BatchNormalization":
        x = head.input(0)
        layout = NCHWC if x is not None and x.known and x.rank == 4 else NCHW
        return kernel_of(mg, nodes, costs, "normalization", layout, layout,
                       open_sum=len(nodes) == 1 and layout == NCHWC,
                       passes=activation_passes(mg, nodes, layout == NCHWC))
    if len(nodes) == 1 and head.op_type in _STANDALONE_CLASS:
        return standalone_quantization(mg, nodes[0], costs)
    if head.op_type == "MatMulNBits":
        return n_bits_kernel(head, kernel_of(mg, nodes, costs, "gemm", NCHW, NCHW))
    if head.op_type in ("MoE", "QMoE"):
        return moe_kernel(head, kernel_of(mg, nodes, costs, "gemm", NCHW, NCHW))
    if moves_quantized_values(mg, head, nodes):
        kernel = kernel_of(mg, nodes, costs, node_class(head), NCHW, NCHW,
                           runs=transpose_runs(head))
        if elements := transpose_elements(head):
            kernel = replace(kernel, elements=elements)
        return without_work_of(kernel, [c for n in nodes if mg.info(n).op_type in _QUANT_EDGES
                                        and (c := costs[n]) is not None])
    return _vector_kernel(mg, nodes, costs, block)


def _conv_kernel(mg: ModelGraph, nodes: list[str], role: str, costs: dict[str, Cost | None],
                 block: int) -> Kernel:
    """A Conv's kernel: its MLAS path and layout, integer classes, grouped GEMMs and NCHWc
    channel padding."""
    head = mg.info(nodes[0])
    cls, reads, writes = ort_conv_path(head, block)
    if _integer_macs(mg, head):  # no NCHWc reorders; a QLinearConv NHWC (`nhwc_conv`)
        cls = INT8_CLASS.get(cls, "grouped_conv" if cls in _GROUP_CALLS else cls)
        if head.op_type == "ConvInteger":  # `grouped_conv_integer`: the class's comment
            cls = GROUPED_CONV_INTEGER if head.attr("group", 1) > 1 else CONV_INTEGER
        cls = GEMM_S8S8 if multiplies_int8_activations(mg, head) else cls
        if cls == INT8_CLASS["conv"] and not symmetric_conv(head, block):
            cls = CONV_INT8_IM2COL
        calls, reuse = (group_gemms(head, False) if cls in (GROUPED_CONV_INTEGER,
                                                            CONV_INT8_IM2COL) else (1, 0.0))
        layout = NCHW if head.op_type == "ConvInteger" else nhwc_conv(head)
        return _integer_kernel(mg, kernel_of(mg, nodes, costs, cls, layout, layout, passes=(
            activation_passes(mg, nodes, True)), calls=calls, reuse=reuse), costs)
    if cls == "conv" and not constant_input(mg, head, 1):  # weights made at run time
        cls, reads, writes = CONV_UNPACKED, NCHW, NCHW
    calls, reuse = group_gemms(head, reads == NCHW) if cls in _GROUP_CALLS else (1, 0.0)
    kernel = kernel_of(mg, nodes, costs, cls, reads, writes,
                       open_sum=role == "anchor" and len(nodes) == 1 and writes == NCHWC,
                       reuse=reuse, calls=calls,
                       passes=activation_passes(mg, nodes, writes == NCHWC))
    padding = nchwc_padding(head, block, reads) if writes == NCHWC else 1.0
    return replace(kernel, cost=replace(kernel.cost, macs=round(kernel.cost.macs * padding)))


def _vector_kernel(mg: ModelGraph, nodes: list[str], costs: dict[str, Cost | None],
                   block: int) -> Kernel:
    """A kernel without MACs: its class (softmax, GELU, int8 elementwise, ...), the layout
    it runs in, and the runs, elements or rows it loops over."""
    head = mg.info(nodes[0])
    cls = _dominant_class(mg, nodes, costs)
    requantized = any(mg.info(k).op_type == "QuantizeLinear" for k in nodes)
    if head.op_type == "QLinearSoftmax" or (head.op_type == "Softmax" and requantized):
        cls = SOFTMAX_INT8
    elif head.op_type in _SOFTMAXES:
        cls = SOFTMAX
    elif head.op_type == "Where" and len(nodes) == 1:
        cls = WHERE
    elif cls == "elementwise" and is_erf_gelu(map(mg.info, nodes)):
        cls = GELU
    elif head.op_type in _QLINEAR_ELEMENTWISE or (
            head.op_type in ("Add", "Mul") and requantized and any(
                mg.info(k).op_type == "DequantizeLinear" for k in nodes)):
        cls = ELEMENTWISE_INT8
    if cls == "pool":
        layout = ANY
    elif head.op_type == "Concat":
        layout = _concat_layout(head, block)
    elif cls in ("elementwise", ELEMENTWISE_INT8):  # a QLinearAdd in NHWC too (`nhwc_conv`)
        layout = NCHW if _cast_constants(mg, head) else _elementwise_layout(head)
    elif cls == GELU:  # unary, as ORT's Gelu runs on NCHWc (FastViT's: 9 reorders in all)
        layout = ANY
    else:
        layout = NCHW
    runs = (gathered_slices(head) if head.op_type == "GatherND"
            else broadcast_spans(head) if cls == "elementwise" else transpose_runs(head))
    if blocked_transpose(head):
        cls = BLOCKED_TRANSPOSE
    kernel = kernel_of(mg, nodes, costs, cls, layout, layout, runs=runs)
    if elements := transpose_elements(head):
        kernel = replace(kernel, elements=elements)
    if cls in ("normalization", SOFTMAX):
        kernel = replace(kernel, rows=normalized_rows(map(mg.info, nodes)))
    if head.op_type in _GATHERS and len(nodes) == 1:
        return replace(kernel, cost=gathered(head, kernel.cost))
    if cls == WHERE:
        return replace(kernel, cost=where_passes(head, kernel.cost))
    return kernel


def where_passes(info: NodeInfo, cost: Cost) -> Cost:
    """A Where's cost as ORT's CPU kernel runs it (cpu/tensor/where_op.cc, ORT 1.2x-1.3x): a
    broadcast pass selecting X where the condition holds (0 elsewhere) into a temporary of
    the output's shape, a second selecting Y where it does not into another, and a merge
    pass taking, per element, whichever of the two is not zero (UntypedSelect twice, then
    UntypedMerge), each an Eigen select per element. So for N output elements of e bytes it
    reads the condition twice, X and Y once, and the two temporaries (2·N·e), writes 3·N·e,
    and does 3 selects an element (the node's cost counts one pass: 1 an element). Measured
    (ORT 1.31, 1 thread, Zen 5) over [1, 4, 128, 128] with X a scalar 0 (an encoder's SDPA
    guard): 41-51 us, 0.6-0.8 ns an element, where one pass at the elementwise rate read 5."""
    cond, x, y = info.input(0), info.input(1), info.input(2)
    out = info.outputs[0] if info.outputs else None
    if (cond is None or x is None or y is None or out is None
            or not (cond.known and x.known and y.known and out.known)):
        return cost
    temporaries = 2 * out.nbytes
    return replace(cost, other_flops=3 * out.size,
                   bytes_read=2 * cond.nbytes + x.nbytes + y.nbytes + temporaries,
                   bytes_written=out.nbytes + temporaries)


def is_erf_gelu(infos: Iterable[NodeInfo]) -> bool:
    """One kernel's nodes are a GELU in erf: ORT's Gelu or BiasGelu (not its tanh form), or
    an Erf with the nodes around it that ORT's GeluFusion takes (a lone Erf is not)."""
    infos = list(infos)
    return any(i.op_type in _ERF_GELUS and i.attr("approximate", "none") != "tanh"
               for i in infos) or (len(infos) > 1 and any(i.op_type == "Erf" for i in infos))


def n_bits_kernel(info: NodeInfo, k: Kernel) -> Kernel:
    """A MatMulNBits as ORT's CPU kernel runs it. At accuracy_level 4 with more than one row
    of A (a prefill), MLAS quantizes A to int8 per block and runs its CompInt8 kernel, which
    is not a register-blocked GEMM: per block it unpacks the 4-bit weights, issues VNNI dot
    products, and converts, scales and accumulates the int32 sums in float, so the mix, not
    the dot products, sets its rate (an issue count of sqnbitgemm_kernel_avx512_int8_blklen32.h
    said 0.35 of the int8 peak; measured, ORT 1.31, Zen 5: 0.25, 262 GFLOP/s at M 128, K
    1024, N 16384). Its MACs are int8 (the group's precision) in a class of its own,
    `gemm_nbits`, calibrated on MatMulNBits benchmarks (`catalogue.matmul_n_bits`), and B is
    never dequantized to float (its 2 FLOPs per weight are inside that rate). One row (a
    decode step) is a GEMV whose time is its 4-bit weights and scales streamed from memory
    (`cold_weights`) plus a cost per call: the node's cost in a class of its own,
    `gemv_nbits`; other accuracy levels dequantize B blocks to fp32 for an fp32 GEMM (float32
    MACs): the node's cost.

    The CompInt8 kernel's efficiency reads its reuse as 2·K FLOPs per output: each output
    ends its K/32 blocks of dot products with a horizontal sum of its accumulators and a
    scaled store, a cost per output whatever K, so t = 2·M·K·N / (e·peak) + M·N·c, which is
    the curve's I / (I + i_half) at I = 2·K with i_half = c·e·peak (a calibration fits it).
    Measured (ORT 1.31, 1 thread, Zen 5, the catalogue's node alone, /tmp/gqa/nbits.py): M 128
    at K 256 runs at 147-166 GOPS for N 256-4096, at K 1024-2048 at 212-254: one fit, 235
    GOPS and 0.95 ns per output, holds 8 of 10 shapes (M 32 and 128, K 256-2048) within 5%."""
    a = info.input(0)
    if info.attr("accuracy_level", 0) != 4 or a is None or not a.known or not k.cost.macs:
        return k
    rows = gemm_rows(info)  # None: a vector A, one row
    if rows is None or rows <= 1:
        return replace(k, cls=GEMV_NBITS)
    dequantize = 2 * info.attr("K") * info.attr("N")
    return replace(k, cls=GEMM_NBITS, reuse=2 * info.attr("K"),
                   cost=replace(k.cost, other_flops=k.cost.other_flops - dequantize))


_GATHERS = frozenset({"Gather", "Slice", "GatherBlockQuantized"})


def gathered(info: NodeInfo, cost: Cost) -> Cost:
    """A Gather's or Slice's cost as ORT's kernel runs it: it copies the slices its indices
    or bounds select, so it reads the data's bytes of the values it writes, not the whole
    tensor (a decoder's embedding lookup at one token reads one row of its table: 4 KB of 64
    MB; measured, ORT 1.31, Zen 5: the second half of [1, 128, 48, 48]'s channels in 9.1 us,
    its 1.2 MB copied at 129 GB/s, where the whole input read would be 194); a constant
    table's slices are the weights it fetches. A GatherBlockQuantized's table packs several
    values a byte (`OpSpec.packed`): its row of an int4 table is an eighth of the floats out."""
    data, touched = info.input(0), gathered_bytes(info)
    if data is None or touched is None:
        return cost
    weights = cost.param_bytes - data.nbytes + touched if 0 in info.const_inputs else (
        cost.param_bytes)
    return replace(cost, bytes_read=cost.bytes_read - data.nbytes + touched, param_bytes=weights)


def gathered_bytes(info: NodeInfo) -> int | None:
    """The bytes of its data (input 0) a Gather or Slice copies: the data's bytes of the
    values it writes, or all of them where it writes more (None where a shape is unknown)."""
    data, out = info.input(0), info.outputs[0]
    if data is None or not data.known or not out.known:
        return None
    spec = lookup(info.op_type, info.domain)
    values = spec.packed(info)[0] if spec is not None and spec.packed is not None else data.size
    return data.nbytes * min(out.size, values) // max(values, 1)


def layout_changes(kernel: Kernel, have: dict[str, set[str]]) -> list[TensorInfo]:
    """The activations ORT must reorder (ReorderInput / ReorderOutput) before `kernel` runs.
    `have` maps a tensor to the layouts it exists in so far (graph
    inputs: plain NCHW) and is updated: a tensor is reordered once per layout, as ORT reuses a
    reorder for every reader. Only 4-D tensors have an NCHWc form."""
    image = [t for t in kernel.inputs if t.known and t.rank == 4]
    want = kernel.reads
    if want == ANY:  # a layout every input has (ORT's NchwcTransformer converts an Add whose
        # inputs are all NCHWc outputs; EfficientFormer's residual Adds of an NCHW layer-scale
        # Mul run NCHW, the NCHWc input reordered out)
        want = next((lay for lay in (NCHWC, NHWC, NCHW)
                     if image and all(lay in have.get(t.name, (NCHW,)) for t in image)), NCHW)
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


def reorder_cost(t: TensorInfo, block: int) -> Cost:
    """A layout change reads the tensor in one layout and writes it in the other; its NCHWc
    side holds the channels padded to whole blocks of `block` (MLAS's ReorderInput writes
    the padding, ReorderOutput reads it), so both sides are counted as ORT stores them (the
    NCHW side as read, the NCHWc side as written, whichever way it goes: the memory term
    reads their sum).
    GhostNet's [1, 8, 112, 112] out of its 16-channel blocks reads 803 KB to write 401 KB:
    profiled (ORT 1.31, Zen 5, 1 thread) 23-33 us, where 2 x 401 KB at the L3 bandwidth
    said 10."""
    padded = t.nbytes * _padded(t.dims[1], block) // t.dims[1] if t.dims[1] else t.nbytes
    return Cost(bytes_read=t.nbytes, bytes_written=padded)


def _folded(mg: ModelGraph, k: Kernel, open_sums: dict[str, Kernel]) -> Kernel | None:
    """`k` run inside the lone NCHWc Conv or BatchNormalization kernel whose output (read by
    nothing else) it reads (its `host`), or None when ORT does not fold it
    (NchwcTransformer): an Add is the Conv's sum input, reading its other operand; a ReLU
    only computes; another fusable activation is a pass over the output (`epilogue`). None
    writes anything of its own."""
    host_input = next((t for t in k.inputs if t.name in open_sums), None)
    if len(k.nodes) != 1 or host_input is None or _cast_constants(mg, mg.info(k.nodes[0])):
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


# exp(v) in float32 is a denormal for ln(2^-149) = -103.28 < v < ln(2^-126) = -87.34: below
# it rounds to exact zero (fast), above it is a normal number. softmax(x + m) = exp(x + m -
# max) / sum: with the logits x a few units apart, a mask entry m in this band makes the
# probability it lands on a denormal (Swin-T: the share of -100 entries equals the share of
# denormal probabilities, measured), and the MatMul reading P stalls on them.
DENORMAL_BAND = (math.log(2.0 ** -149), math.log(2.0 ** -126))


def denormal_share(values: np.ndarray) -> float:
    """The fraction of `values` whose exp is a float32 denormal (DENORMAL_BAND)."""
    low, high = DENORMAL_BAND
    return float(np.mean((values > low) & (values < high))) if values.size else 0.0


# The largest constant `constant_value` computes (Swin-T's shifted-window mask: 153,664).
MAX_CONSTANT_ELEMENTS = 1 << 24


def constant_value(mg: ModelGraph, name: str) -> np.ndarray | None:
    """The value of tensor `name` when it is computed from Constant nodes alone (Swin's mask:
    Where over ScatterNDs of constants), folded by `analyzer.fold`; None when it depends on a
    graph input or an initializer (whose values the graph does not hold), or cannot fold."""
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
    protos = [helper.make_node(i.op_type, [t.name if t else "" for t in i.inputs],
                               [t.name for t in i.outputs], domain=i.domain or None, **i.attrs)
              for i in sorted(nodes.values(), key=lambda i: i.index)]
    values = fold_nodes(protos, {}, {"": onnx.defs.onnx_opset_version()},
                        max_elements=MAX_CONSTANT_ELEMENTS)
    return values.get(name)


def _through_views(mg: ModelGraph, tensor: str) -> NodeInfo | None:
    """The first node producing `tensor` that is not a view (Reshape and the like)."""
    while (key := mg.producer.get(tensor)) is not None:
        info = mg.info(key)
        if info.op_type not in RESHAPES or not info.inputs or info.inputs[0] is None:
            return info
        tensor = info.inputs[0].name
    return None


def _readers_through_views(mg: ModelGraph, tensor: str) -> list[NodeInfo]:
    out = []
    for key in mg.consumers.get(tensor, ()):
        info = mg.info(key)
        if info.op_type in RESHAPES:
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


def gemm_bias(mg: ModelGraph, head: NodeInfo, nodes: Sequence[str]) -> TensorInfo | None:
    """The C that ORT's Gemm kernel adds for an anchor `head` of `nodes`: a Gemm's third input,
    or the other operand of the Add after a MatMul of a 2-D right operand (MatMulAddFusion;
    a 3-D left operand gets a Reshape on each side); None otherwise."""
    if head.op_type == "Gemm":
        return head.input(2)
    w, y = head.input(1), head.outputs[0].name
    if head.op_type != "MatMul" or w is None or not w.known or w.rank != 2:
        return None
    add = next((a for n in nodes[1:] if (a := mg.info(n)).op_type == "Add"
                and any(t is not None and t.name == y for t in a.inputs)), None)
    return None if add is None else next(
        (t for t in add.inputs if t is not None and t.name != y), None)


def bias_broadcast(mg: ModelGraph, k: Kernel) -> list[Kernel]:
    """`k`, a float GEMM with a C (`gemm_bias`), as ORT's Gemm kernel runs it (gemm.cc,
    ComputeGemm): it first broadcasts C into the output Y (GemmBroadcastBias: a pass writing
    Y, inside the node: no launch), then runs SGEMM with beta = 1, which reads Y back as it
    stores each tile. So the pass reads C and writes M·N values, and the GEMM reads as many
    more. Measured (ORT 1.31, 1 thread, Zen 5, a chain of 6 MatMuls [1, M, K] x [K, N] and
    back, fastest of 7 x 200 runs, load 5), the bias Adds' cost a Gemm: M, K, N = 3136, 64,
    256: 63 us (estimated 2 before, 27 now); 196, 160, 640: 11 (0.4, 3); 784, 128, 512: 5
    (1, 13)."""
    if k.cls != "gemm" or not k.nodes:
        return [k]
    head = mg.info(k.nodes[0])
    c, y = gemm_bias(mg, head, k.nodes), head.outputs[0]
    if c is None or not c.known or not y.known:
        return [k]
    copy = Kernel("data_movement", Cost(bytes_read=c.nbytes, bytes_written=y.nbytes), k.nodes,
                  launches=0)
    return [copy, replace(k, cost=replace(k.cost, bytes_read=k.cost.bytes_read + y.nbytes))]


def cold_start(k: Kernel, unread: set[str]) -> Kernel:
    """`k`, where it is the run's first kernel to read a graph input (`unread`: the graph's
    inputs until then; emptied), with that input and its own outputs as `cold_bytes`. A run
    that moves more than the last-level cache keeps leaves the next run's input in main
    memory (the caller wrote it before the last run, or long ago), and the first output
    lands on lines the run evicted (a write allocates: each line is read first); every later
    kernel reads what the run just wrote. Profiled (ORT 1.31, 1 thread, Zen 5): the stem Conv
    3 -> 16, 3x3/2 from 224x224 (GhostNet's, LeViT's; 1.4 MB in and out) 66-69 us alone, 81
    and 168 after a Relu over 8 and 32 MB, 138-228 in the networks; across the 14 timm
    models the first kernel, always the stem, 100-130 us over its estimate a run."""
    fresh = [t for t in k.inputs if t.name in unread]
    if not fresh:
        return k
    unread.clear()
    return replace(k, cold_bytes=k.cold_bytes + sum(t.nbytes for t in (*fresh, *k.outputs)
                                                    if t.known))


def folded_at_load(mg: ModelGraph, run_time: frozenset[str] = frozenset()) -> set[str]:
    """The nodes ORT's constant folding computes when a session loads (`static_nodes`), less
    DequantizeLinear and what only it makes constant: ORT keeps a DQ (ConstantFolding's
    skip_dequantize_linear, on while QDQ fusion is) for its QDQ transformer to fuse, or to run
    each run where it does not (BERT's int8 weights). ORT loads the file as it is, its
    symbolic inputs unpinned, so a Shape or Size of a tensor whose shape depends on them
    (`run_time`: `shaped_at_run_time`'s) runs each step, and so does what it feeds: the HF
    Llama's decode step (dynamo, past 511) runs its mask's Range, LessOrEqual, Expand, Concat
    and GatherND and the position ids' Slice every step, which the pinned dims had folded
    here."""
    return static_nodes((i for i in map(mg.info, mg.order) if i.op_type != "DequantizeLinear"
                         and not (i.op_type in ("Shape", "Size") and i.inputs[0] is not None
                                  and i.inputs[0].name in run_time)), mg.initializers)


def shaped_at_run_time(mg: ModelGraph, symbolic_inputs: frozenset[str]) -> set[str]:
    """The tensors reachable from `symbolic_inputs`: those whose shape a runtime that sees the
    inputs' symbolic dims can know only when it runs (an over-approximation: a reduction over
    the symbolic axis has a static shape again)."""
    reached = set(symbolic_inputs)
    for info in map(mg.info, mg.order):
        if any(t is not None and t.name in reached for t in info.inputs):
            reached.update(t.name for t in info.outputs)
    return reached


def reads_constants(mg: ModelGraph, k: Kernel, constants: set[str]) -> Kernel:
    """`k` reading tensors ORT's constant folding computed when the session loaded
    (`constants`: outputs of `folded_at_load`, such as LeViT's and TinyViT's attention
    biases, or the Transpose of a tied decoder's lm_head weight that its embedding Gather
    reads): initializers now, read cold a run like any weight. A kernel with MACs pays their
    fetch as weights (`cold_weights`), only those its GEMM or Conv reads; a kernel without
    (the bias Add) streams them from main memory after its other traffic (`cold_bytes`), as
    the stem does its input. A Gather or Slice of a folded table reads only the rows it
    copies (`gathered_bytes`): a tied-embedding decoder's lookup of one token is one row, not
    the table. Measured (ORT 1.31, 1 thread, Zen 5): the Add of [1, 4, 196, 196] scores and
    its [4, 196, 196] bias (614 KB) 19.8 us alone, 41-43 in LeViT-128S; TinyViT's [1, 5, 196,
    196] 56-63 in the network: 22-37 us more a run for 614-768 KB, 21-28 GB/s, the calibrated
    cold-weight rate's neighbourhood (24.5). The builder's Gemma 2 (tied, fp32, 4 MB table)
    at decode@512: 0.22 ms measured, 0.57 estimated with its Transpose run every step."""
    head = mg.info(k.nodes[0]) if len(k.nodes) == 1 else None
    rows = gathered_bytes(head) if head is not None and head.op_type in _GATHERS else None
    table = head.input(0).name if rows is not None else None
    read = [t for t in k.inputs if t.name in constants and t.known]
    if k.cost.macs:  # its weights: what its GEMM or Conv reads
        products = {n for n in k.nodes if mg.info(n).op_type in _ANCHORS | _QOPERATOR_MACS}
        read = [t for t in read if products.intersection(mg.consumers.get(t.name, ()))]
    folded = sum(rows if t.name == table else t.nbytes for t in read)
    if not folded:
        return k
    if k.cost.macs:
        return replace(k, cost=replace(k.cost, param_bytes=k.cost.param_bytes + folded))
    return replace(k, cold_bytes=k.cold_bytes + folded)


def cold_filter_lines(mg: ModelGraph, k: Kernel, block: int) -> Kernel:
    """`k`, where it is a depthwise NCHWc Conv, with its filter's cache lines as `cold_lines`:
    C channels padded to blocks x kh x kw taps x 4 bytes over 64-byte lines (with AVX-512's
    block of 16 a line per tap and block; GhostNet's 3x3 of 120 channels 72, EdgeNeXt's 9x9
    of 168 891). MLAS's depthwise kernels read a block's filter a tap at a time, interleaved
    with the input rows the tap multiplies, so the prefetchers do not run ahead of a cold
    filter, and a network reads each of its filters once a run, after megabytes of other
    weights and activations. Profiled (ORT 1.31, Zen 5, one thread; chains of 8 depthwise
    Convs after a Relu over 32 MB, a filter per layer against one shared): 9x9 168@7 +35 us
    a Conv (891 lines), 7x7 384@12 +19-22 (1176), 5x5 240@14 +4 (375), 3x3 960@7 +4-6 (540)."""
    if k.cls != "depthwise":
        return k
    w = next((conv_weight(mg.info(n)) for n in k.nodes if mg.info(n).op_type == "Conv"), None)
    if w is None or not w.known or len(w.dims) != 4:
        return k
    return replace(k, cold_lines=depthwise_filter_lines(w.dims[0], math.prod(w.dims[2:]), block))


def depthwise_filter_lines(channels: int, taps: int, block: int) -> int:
    """Cache lines of a depthwise filter as MLAS reorders it: channels padded to NCHWc blocks
    x taps x 4 bytes (`cold_filter_lines`)."""
    return -(-_padded(channels, block) * taps * 4 // CACHE_LINE_BYTES)


# Copy ops whose kernels' fixed cost a calibration measures (`fit.fit_copy_fixed`).
COPY_OPS = frozenset({"Slice", "Gather", "Expand", "Split", "Concat"})


def lone_copy(mg: ModelGraph, k: Kernel) -> Kernel:
    """`k` with its op and parts (`Kernel.op`, `Kernel.parts`) where it is one launched node of
    COPY_OPS: a Split's outputs, a Concat's inputs beyond the first."""
    if len(k.nodes) != 1 or not k.launches:
        return k
    info = mg.info(k.nodes[0])
    if info.op_type not in COPY_OPS:
        return k
    tensors = {"Split": info.outputs, "Concat": info.inputs}.get(info.op_type, ())
    return replace(k, op=info.op_type, parts=max(len(tensors) - 1, 0))


def nchwc_block(hw: HardwareProfile) -> int:
    """Channels per block of ORT's NCHWc layout: one fp32 vector of the CPU (8 with AVX2, 16
    with AVX-512; 8 where the profile does not give its vector width)."""
    return max(1, (hw.simd_bits or 256) // 32)


class OrtCpu:
    """ORT's CPU provider: every group as ORT's kernels, in execution order."""

    runtime = ORT_CPU

    def kernels(self, mg: ModelGraph, groups: list[Group], node_costs: dict[str, Cost | None],
                group_costs: dict[int, Cost | None], hw: HardwareProfile,
                model: LoadedModel | None = None) -> GroupKernels:
        """Layout changes are charged to the group that needs them, before the kernel that
        reads them; a kernel ORT folds into a lone NCHWc kernel of an earlier group carries
        that kernel as its `host`."""
        block = nchwc_block(hw)
        factor = hw.runtime.denormal_factor
        denormal = denormal_reads(mg) if factor > 1 else {}
        have: dict[str, set[str]] = {t: {NCHW} for t in mg.graph_inputs}
        open_sums: dict[str, Kernel] = {}  # output of a lone NCHWc kernel -> that kernel
        out: GroupKernels = {}
        cold = set(mg.graph_inputs)  # until the first kernel reading one of them (`cold_start`)
        symbolic = model.symbolic_inputs if model else frozenset()
        run_time = frozenset(shaped_at_run_time(mg, symbolic))
        static = folded_at_load(mg, run_time)
        constants = {t.name for key in static for t in mg.info(key).outputs}
        fp32 = float32_nodes(mg)
        casts = inserted_casts(mg, fp32, constants | mg.initializers)
        for g in groups:
            if any(node_costs.get(k) is None for k in g.nodes):
                out[g.id] = None
                continue
            run: list[Kernel] = []
            for k in ort_kernels(mg, g, node_costs, block, run_time):
                k = float16_as_float32(k, fp32)
                if k.nodes and static.issuperset(k.nodes):
                    continue  # computed once, when the session loads
                k = reads_constants(mg, _folded(mg, k, open_sums) or k, constants)
                if k.cls in _PER_CALL and k.cls not in hw.runtime.per_call_classes:
                    k = replace(k, calls=1, reuse=0.0, cls=_BEFORE.get(k.cls, k.cls))
                # an NHWC Transpose (`nhwc_conv`) has no blocks to pad: block 1
                nhwc = k.reads == NHWC or any(NHWC in have.get(t.name, ()) for t in k.inputs)
                run += [cold_start(Kernel("data_movement" if nhwc else REORDER,
                                          reorder_cost(t, 1 if nhwc else block), (),
                                          inputs=(t,)), cold)
                        for t in layout_changes(k, have)]
                if share := max((denormal.get(n, 0.0) for n in k.nodes), default=0.0):
                    k = replace(k, denormal_share=share)
                k = lone_copy(mg, cold_filter_lines(mg, cold_start(k, cold), block))
                run += [*bias_broadcast(mg, k), *hard_swish_products(mg, k)]
                run += [cast_kernel(t) for n in k.nodes for t in casts.get(n, ())]
                if k.open_sum:
                    open_sums.update((t.name, k) for t in k.outputs
                                     if len(mg.consumers.get(t.name, ())) == 1)
            out[g.id] = run
        return out


MODEL = OrtCpu()
