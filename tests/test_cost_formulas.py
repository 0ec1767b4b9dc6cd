"""Every cost formula against a count derived by hand in the test.

Nodes are built directly as `NodeInfo`s with the shapes ONNX shape inference would give, so
each expected number below is the derivation, written out, never the formula's own code.
"""

from __future__ import annotations

from typing import Any

import onnx
import pytest

from onnxlens.analyzer.cost import REGISTRY, Cost, lookup, register
from onnxlens.analyzer.cost.base import DuplicateOpError
from onnxlens.analyzer.ir import NodeInfo, TensorInfo, UnknownShape

# A shape; None: rank unknown; OMITTED: an optional input left out.
Shape = tuple[Any, ...] | str | None
OMITTED = "omitted"
FLOAT = onnx.TensorProto.FLOAT


def make(op: str, inputs: list[Shape], outputs: list[Shape], **attrs: Any) -> NodeInfo:
    """A node whose inputs are named x0, x1, ... and whose outputs are y0, y1, ..."""
    ins = tuple(None if s == OMITTED else TensorInfo(f"x{i}", FLOAT, s)  # type: ignore[arg-type]
                for i, s in enumerate(inputs))
    outs = tuple(TensorInfo(f"y{i}", FLOAT, s) for i, s in enumerate(outputs))
    return NodeInfo(op.lower(), op, "", attrs, ins, outs)


def cost(op: str, inputs: list[Shape], outputs: list[Shape], **attrs: Any) -> Cost:
    spec = lookup(op)
    assert spec is not None, f"no formula for {op}"
    return spec.formula(make(op, inputs, outputs, **attrs))


def arith(c: Cost) -> tuple[int, int, int]:
    """(macs, other_flops, transcendental): all a formula may return."""
    assert (c.bytes_read, c.bytes_written, c.params, c.param_bytes) == (0, 0, 0, 0)
    return c.macs, c.other_flops, c.transcendental


# ---- conv --------------------------------------------------------------------------------------

def test_conv_with_bias() -> None:
    # y [1,4,8,8] = 256 outputs, each a 3 (in channels) x 3x3 dot product; bias 1 add/output.
    c = cost("Conv", [(1, 3, 8, 8), (4, 3, 3, 3), (4,)], [(1, 4, 8, 8)], pads=[1, 1, 1, 1])
    assert arith(c) == (256 * 27, 256, 0)


def test_conv_without_bias() -> None:
    c = cost("Conv", [(1, 3, 8, 8), (4, 3, 3, 3)], [(1, 4, 8, 8)], pads=[1, 1, 1, 1])
    assert arith(c) == (6912, 0, 0)


def test_conv_grouped() -> None:
    # group 2: 8 in channels -> 4 per group; y [2,6,8,8] = 768 outputs x (4 x 3x3) = 27,648.
    c = cost("Conv", [(2, 8, 10, 10), (6, 4, 3, 3)], [(2, 6, 8, 8)], group=2)
    assert arith(c) == (27_648, 0, 0)


def test_conv_depthwise() -> None:
    # group = channels = 16: each output a 1 x 3x3 window; 16*14*14 = 3136 outputs x 9.
    c = cost("Conv", [(1, 16, 14, 14), (16, 1, 3, 3), (16,)], [(1, 16, 14, 14)], group=16,
             pads=[1, 1, 1, 1])
    assert arith(c) == (28_224, 3136, 0)


def test_conv_strided_resnet_stem() -> None:
    # 7x7 stride 2 pad 3: 224 -> 112; 64*112*112 = 802,816 outputs x (3*7*7 = 147).
    c = cost("Conv", [(1, 3, 224, 224), (64, 3, 7, 7)], [(1, 64, 112, 112)], strides=[2, 2],
             pads=[3, 3, 3, 3])
    assert arith(c) == (118_013_952, 0, 0)


def test_conv_dilated() -> None:
    # 3x3 dilation 2 spans 5: 10 -> 6; 3*6*6 = 108 outputs x (2*3*3 = 18); dilation does not
    # change the window's element count.
    c = cost("Conv", [(1, 2, 10, 10), (3, 2, 3, 3)], [(1, 3, 6, 6)], dilations=[2, 2])
    assert arith(c) == (1944, 0, 0)


def test_conv_1d_and_3d() -> None:
    # 1-D: y [1,8,30] = 240 outputs x (4 x 3); 3-D: y [1,2,4,4,4] = 128 outputs x (3 x 27).
    assert cost("Conv", [(1, 4, 32), (8, 4, 3)], [(1, 8, 30)]).macs == 2880
    assert cost("Conv", [(1, 3, 6, 6, 6), (2, 3, 3, 3, 3)], [(1, 2, 4, 4, 4)]).macs == 10_368


def test_conv_transpose() -> None:
    # W [C_in=4, M/g=2, 3, 3]: each of the 4*5*5 = 100 inputs is scattered into 2 x 9 outputs;
    # stride 2: 5 -> (5-1)*2 + 3 = 11; bias 1 add per output (2*11*11 = 242).
    c = cost("ConvTranspose", [(1, 4, 5, 5), (4, 2, 3, 3), (2,)], [(1, 2, 11, 11)],
             strides=[2, 2])
    assert arith(c) == (1800, 242, 0)


def test_conv_transpose_grouped() -> None:
    # group 2: W [4, 1, 3, 3] -> M = 2; each input scatters into 1 channel x 9 positions.
    c = cost("ConvTranspose", [(1, 4, 5, 5), (4, 1, 3, 3)], [(1, 2, 11, 11)], strides=[2, 2],
             group=2)
    assert arith(c) == (900, 0, 0)


def test_quantized_convs() -> None:
    # ConvInteger: x, w, x_zero_point (not a bias); QLinearConv: weight at 3, bias at 8.
    c = cost("ConvInteger", [(1, 3, 8, 8), (4, 3, 3, 3), ()], [(1, 4, 8, 8)],
             pads=[1, 1, 1, 1])
    assert arith(c) == (6912, 0, 0)
    scalars: list[Shape] = [(), ()]
    c = cost("QLinearConv", [(1, 3, 8, 8), *scalars, (4, 3, 3, 3), *scalars, *scalars, (4,)],
             [(1, 4, 8, 8)], pads=[1, 1, 1, 1])
    # Per output: bias add 1; requantize: rescale 1, round 1, clamp 2, + y_zero_point 1.
    assert arith(c) == (6912, 256 * (1 + 1 + 1 + 2 + 1), 0)


# ---- matmul ------------------------------------------------------------------------------------

def test_gemm_plain() -> None:
    # [4,8] x [8,5]: 20 outputs x K=8.
    assert arith(cost("Gemm", [(4, 8), (8, 5)], [(4, 5)])) == (160, 0, 0)


def test_gemm_transposed() -> None:
    # transA: A is [K=8, M=4]; transB: B is [N=5, K=8].
    c = cost("Gemm", [(8, 4), (5, 8)], [(4, 5)], transA=1, transB=1)
    assert arith(c) == (160, 0, 0)
    # Only transB (the nn.Linear spelling): A [M=4, K=8].
    assert cost("Gemm", [(4, 8), (5, 8)], [(4, 5)], transB=1).macs == 160


def test_gemm_bias_alpha_beta() -> None:
    # C [5] broadcast: 1 add per output (20).
    assert arith(cost("Gemm", [(4, 8), (8, 5), (5,)], [(4, 5)])) == (160, 20, 0)
    # alpha != 1: +1 mul per output; beta != 1: +1 mul per output -> 3 x 20.
    c = cost("Gemm", [(4, 8), (8, 5), (4, 5)], [(4, 5)], alpha=0.5, beta=2.0)
    assert arith(c) == (160, 60, 0)
    # beta without C scales nothing; alpha alone: 1 x 20.
    assert arith(cost("Gemm", [(4, 8), (8, 5)], [(4, 5)], alpha=2.0, beta=3.0)) == (160, 20, 0)


def test_matmul_broadcast() -> None:
    # [2,1,4,8] x [3,8,5] -> [2,3,4,5]: 120 outputs, K = 8.
    assert arith(cost("MatMul", [(2, 1, 4, 8), (3, 8, 5)], [(2, 3, 4, 5)])) == (960, 0, 0)


@pytest.mark.parametrize(("a", "b", "y", "macs"), [
    ((8,), (8, 5), (5,), 5 * 8),  # vector x matrix
    ((4, 8), (8,), (4,), 4 * 8),  # matrix x vector
    ((8,), (8,), (), 8),  # dot product
    ((6, 4, 8), (8, 5), (6, 4, 5), 6 * 4 * 5 * 8),  # batched x shared weight
])
def test_matmul_1d_promotions(a: Shape, b: Shape, y: Shape, macs: int) -> None:
    assert arith(cost("MatMul", [a, b], [y])) == (macs, 0, 0)


def test_quantized_matmuls() -> None:
    assert cost("MatMulInteger", [(4, 8), (8, 5)], [(4, 5)]).macs == 160
    scalars: list[Shape] = [(), ()]
    # 20 outputs requantized: rescale, round, clamp 2, + y_zero_point.
    assert arith(cost("QLinearMatMul", [(4, 8), *scalars, (8, 5), *scalars, *scalars],
                      [(4, 5)])) == (160, 20 * 5, 0)


def test_einsum_attention_scores() -> None:
    # b=2 h=4 q=16 k=32 d=8: one MAC per (b, h, q, k, d).
    c = cost("Einsum", [(2, 4, 16, 8), (2, 4, 32, 8)], [(2, 4, 16, 32)],
             equation="bhqd,bhkd->bhqk")
    assert arith(c) == (2 * 4 * 16 * 32 * 8, 0, 0)


def test_einsum_ellipsis() -> None:
    # '...' covers [2,4] and [4] -> broadcast [2,4]; q=16 d=8 k=32.
    c = cost("Einsum", [(2, 4, 16, 8), (4, 32, 8)], [(2, 4, 16, 32)],
             equation="...qd,...kd->...qk")
    assert c.macs == 2 * 4 * 16 * 8 * 32
    # Size-1 ellipsis dims broadcast: [2,1] with [3] -> [2,3].
    c = cost("Einsum", [(2, 1, 16, 8), (3, 32, 8)], [(2, 3, 16, 32)],
             equation="...qd , ...kd -> ...qk")
    assert c.macs == 2 * 3 * 16 * 8 * 32
    # Ellipsis in the middle, implicit output.
    c = cost("Einsum", [(5, 2, 3, 7), (7, 4)], [(5, 2, 3, 4)], equation="b...k,kn")
    assert c.macs == 5 * 2 * 3 * 7 * 4


def test_einsum_implicit_and_many_operands() -> None:
    assert cost("Einsum", [(3, 4), (4, 5)], [(3, 5)], equation="ij,jk").macs == 3 * 4 * 5
    # Three operands: i=2 j=3 k=4 l=5, two multiplies per index combination (naive).
    c = cost("Einsum", [(2, 3), (3, 4), (4, 5)], [(2, 5)], equation="ij,jk,kl->il")
    assert c.macs == 2 * (2 * 3 * 4 * 5)


def test_einsum_single_operand() -> None:
    # Row sums of [3,4]: 3 outputs, each 4 - 1 adds.
    assert arith(cost("Einsum", [(3, 4)], [(3,)], equation="ij->i")) == (0, 9, 0)
    # A transpose moves data only.
    assert arith(cost("Einsum", [(3, 4)], [(4, 3)], equation="ij->ji")) == (0, 0, 0)


# ---- elementwise -------------------------------------------------------------------------------

# op: (FLOPs, transcendental) per output element, by hand.
ONE_OP = ["Add", "Sub", "Mul", "Div", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sign",
          "Mod", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or",
          "Xor", "IsNaN", "IsInf", "Cast", "CastLike"]
SPECIAL = ["Sqrt", "Exp", "Log", "Erf", "Tanh", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
           "Cosh", "Asinh", "Acosh", "Atanh", "Pow"]


@pytest.mark.parametrize("op", ONE_OP)
def test_one_op_per_element(op: str) -> None:
    # [2,1,4] with [3,1] broadcasts to [2,3,4] = 24 outputs, one op each.
    assert arith(cost(op, [(2, 1, 4), (3, 1)], [(2, 3, 4)])) == (0, 24, 0)


@pytest.mark.parametrize("op", SPECIAL)
def test_special_function_per_element(op: str) -> None:
    # 2*3 = 6 outputs, one special-function evaluation (1 FLOP + 1 transcendental) each.
    assert arith(cost(op, [(2, 3), ()], [(2, 3)])) == (0, 6, 6)


def test_where() -> None:
    # cond [2,1], x [3], y scalar -> [2,3]: one select per output.
    assert arith(cost("Where", [(2, 1), (3,), ()], [(2, 3)])) == (0, 6, 0)


@pytest.mark.parametrize(("op", "k", "per_element"), [
    ("Sum", 3, 2),  # 2 adds
    ("Max", 2, 1),  # 1 compare
    ("Min", 4, 3),  # 3 compares
    ("Mean", 3, 3),  # 2 adds + 1 multiply by 1/3
    ("Sum", 1, 0),  # a copy
])
def test_variadic(op: str, k: int, per_element: int) -> None:
    assert arith(cost(op, [(5, 4)] * k, [(5, 4)])) == (0, 20 * per_element, 0)


def test_clip_counts_bounds_given() -> None:
    x, y = (2, 8), (2, 8)
    assert cost("Clip", [x, (), ()], [y]).other_flops == 2 * 16  # Relu6: min and max
    assert cost("Clip", [x, OMITTED, ()], [y]).other_flops == 16  # only max
    assert cost("Clip", [x], [y]).other_flops == 0  # no bound: a copy
    assert cost("Clip", [x], [y], min=0.0).other_flops == 16  # opset 6 attribute


# ---- activation --------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "flops", "transcendental"), [
    ("Relu", 1, 0),  # max(x, 0)
    ("LeakyRelu", 1 + 1, 0),  # compare, alpha*x
    ("ThresholdedRelu", 1, 0),  # compare
    ("Sigmoid", 1, 1),  # one sigmoid
    ("HardSigmoid", 1 + 1 + 1 + 1, 0),  # alpha*x, + beta, min 1, max 0
    ("HardSwish", 4 + 1, 0),  # HardSigmoid, times x
    ("Swish", 1 + 1 + 1, 1),  # alpha*x, sigmoid, times x
    ("Elu", 1 + 1 + 1 + 1, 1),  # compare, exp, - 1, * alpha
    ("Selu", 4 + 1, 1),  # Elu, * gamma
    ("Celu", 1 + 1 + 1 + 1 + 1 + 1 + 1, 1),  # x/alpha, exp, -1, *alpha, min, max, +
    ("Softplus", 1 + 1 + 1, 2),  # exp, + 1, log
    ("Softsign", 1 + 1 + 1, 0),  # |x|, 1 +, divide
    ("Mish", 1 + 1 + 1 + 1 + 1, 3),  # exp, + 1, log, tanh, * x
    ("Shrink", 1 + 1 + 1, 0),  # x < -lambd, x > lambd, x +- bias
])
def test_activation(op: str, flops: int, transcendental: int) -> None:
    # [2,3,5] = 30 elements.
    assert arith(cost(op, [(2, 3, 5)], [(2, 3, 5)])) == (0, 30 * flops, 30 * transcendental)


def test_prelu_broadcast_slope() -> None:
    # slope [3,1,1] broadcast over [2,3,4,4] = 96 outputs: compare + multiply each.
    assert arith(cost("PRelu", [(2, 3, 4, 4), (3, 1, 1)], [(2, 3, 4, 4)])) == (0, 192, 0)


def test_gelu() -> None:
    # exact: x/sqrt2, erf, +1, *x, *0.5 = 5 FLOPs, 1 erf; on 10 elements.
    assert arith(cost("Gelu", [(2, 5)], [(2, 5)])) == (0, 50, 10)
    # tanh: x*x*x (2), *0.044715, + x, *sqrt(2/pi), tanh, + 1, *x, *0.5 = 9 FLOPs, 1 tanh.
    assert arith(cost("Gelu", [(2, 5)], [(2, 5)], approximate="tanh")) == (0, 90, 10)


def test_softmax_last_axis() -> None:
    # [2,3,10] along -1: 6 rows of 10; per row max 9, sub 10, exp 10, sum 9, div 10 = 48.
    assert arith(cost("Softmax", [(2, 3, 10)], [(2, 3, 10)])) == (0, 6 * 48, 60)


def test_softmax_middle_axis() -> None:
    # along axis 1 (length 3): 2*10 = 20 rows; per row 2 + 3 + 3 + 2 + 3 = 13.
    assert arith(cost("Softmax", [(2, 3, 10)], [(2, 3, 10)], axis=1)) == (0, 260, 60)


def test_log_softmax_and_hardmax() -> None:
    # 6 rows of 10: max 9, sub 10, exp 10, sum 9, log 1, sub 10; 10 exp + 1 log per row.
    c = cost("LogSoftmax", [(2, 3, 10)], [(2, 3, 10)])
    assert arith(c) == (0, 6 * (9 + 10 + 10 + 9 + 1 + 10), 6 * 11)
    # Hardmax: argmax per row, 9 compares.
    assert arith(cost("Hardmax", [(2, 3, 10)], [(2, 3, 10)])) == (0, 54, 0)


# ---- normalization -----------------------------------------------------------------------------

def test_layer_norm() -> None:
    # [2,5,8] over the last axis: 10 rows of n=8. Per row: mean 7 adds + 1 div, x-mean 8,
    # square 8, sum 7 + 1 div, +eps 1, sqrt 1, reciprocal 1, normalize 8, scale 8, bias 8.
    per_row = (7 + 1) + 8 + 8 + (7 + 1) + 3 + 8 + 8 + 8
    c = cost("LayerNormalization", [(2, 5, 8), (8,), (8,)], [(2, 5, 8)])
    assert arith(c) == (0, 10 * per_row, 10)
    # No bias: 8 fewer per row.
    c = cost("LayerNormalization", [(2, 5, 8), (8,)], [(2, 5, 8)])
    assert arith(c) == (0, 10 * (per_row - 8), 10)
    # axis=1: 2 rows of n=40 -> 7*40 + 3 each.
    c = cost("LayerNormalization", [(2, 5, 8), (5, 8), (5, 8)], [(2, 5, 8)], axis=1)
    assert arith(c) == (0, 2 * 283, 2)


def test_rms_norm() -> None:
    # 10 rows of 8: square 8, sum 7 + div 1, eps 1, sqrt 1, reciprocal 1, normalize 8, scale 8.
    c = cost("RMSNormalization", [(2, 5, 8), (8,)], [(2, 5, 8)])
    assert arith(c) == (0, 10 * (8 + 8 + 3 + 8 + 8), 10)


def test_instance_and_group_norm() -> None:
    # Instance on [2,3,4,4]: 6 groups of 16, 7*16 + 3 each.
    c = cost("InstanceNormalization", [(2, 3, 4, 4), (3,), (3,)], [(2, 3, 4, 4)])
    assert arith(c) == (0, 6 * 115, 6)
    # Group (3 groups) on [2,6,4,4]: 2*3 = 6 groups of 2*16 = 32, 7*32 + 3 each.
    c = cost("GroupNormalization", [(2, 6, 4, 4), (6,), (6,)], [(2, 6, 4, 4)], num_groups=3)
    assert arith(c) == (0, 6 * 227, 6)


def test_batch_norm() -> None:
    # Folded scale and shift: 1 mul + 1 add on each of 96 elements.
    c = cost("BatchNormalization", [(2, 3, 4, 4), (3,), (3,), (3,), (3,)], [(2, 3, 4, 4)])
    assert arith(c) == (0, 192, 0)


def test_mean_variance_norm() -> None:
    # Default axes [0,2,3] on [2,3,4,4]: 3 groups of 2*16 = 32; center 2n, variance 2n,
    # eps/sqrt/reciprocal 3, normalize n: 5*32 + 3.
    c = cost("MeanVarianceNormalization", [(2, 3, 4, 4)], [(2, 3, 4, 4)])
    assert arith(c) == (0, 3 * 163, 3)


def test_lp_norm() -> None:
    # [3,4] along -1, p=2: square 4, sum 3, sqrt 1, divide 4 = 12 per row.
    assert arith(cost("LpNormalization", [(3, 4)], [(3, 4)])) == (0, 36, 3)
    # p=1: abs 4, sum 3, divide 4 = 11 per row, no root.
    assert arith(cost("LpNormalization", [(3, 4)], [(3, 4)], p=1)) == (0, 33, 0)
    # axis 0: 4 columns of 3: 3 + 2 + 1 + 3 = 9.
    assert arith(cost("LpNormalization", [(3, 4)], [(3, 4)], axis=0)) == (0, 36, 4)


def test_lrn() -> None:
    # size 5 on 128 elements: square 1, window sum 4, *alpha/size 1, +bias 1, pow 1, div 1.
    c = cost("LRN", [(1, 8, 4, 4)], [(1, 8, 4, 4)], size=5)
    assert arith(c) == (0, 128 * 9, 128)


# ---- pooling -----------------------------------------------------------------------------------

def test_max_pool() -> None:
    # 3x3 window: 8 compares per output; 64*56*56 = 200,704 outputs.
    c = cost("MaxPool", [(1, 64, 112, 112)], [(1, 64, 56, 56)], kernel_shape=[3, 3],
             strides=[2, 2], pads=[1, 1, 1, 1])
    assert arith(c) == (0, 1_605_632, 0)


def test_average_pool() -> None:
    # 2x2 window: 3 adds + 1 divide per output; 4*4*4 = 64 outputs.
    c = cost("AveragePool", [(1, 4, 8, 8)], [(1, 4, 4, 4)], kernel_shape=[2, 2], strides=[2, 2])
    assert arith(c) == (0, 256, 0)


def test_lp_pool() -> None:
    # 2x2, p=2: 4 squares, 3 adds, 1 sqrt per output; 64 outputs.
    c = cost("LpPool", [(1, 4, 8, 8)], [(1, 4, 4, 4)], kernel_shape=[2, 2], strides=[2, 2])
    assert arith(c) == (0, 64 * 8, 64)


def test_global_pools() -> None:
    # 512 outputs over 7x7 = 49 each: average 48 adds + 1 div; max 48 compares.
    x, y = (1, 512, 7, 7), (1, 512, 1, 1)
    assert arith(cost("GlobalAveragePool", [x], [y])) == (0, 512 * 49, 0)
    assert arith(cost("GlobalMaxPool", [x], [y])) == (0, 512 * 48, 0)
    # Lp over 3x3: 9 squares, 8 adds, 1 sqrt; 4 outputs.
    assert arith(cost("GlobalLpPool", [(1, 4, 3, 3)], [(1, 4, 1, 1)])) == (0, 4 * 18, 4)


# ---- reductions --------------------------------------------------------------------------------

# [2,3,4] reduced over axis 1 -> [2,1,4]: 24 inputs, 8 outputs, 8 groups of 3.
@pytest.mark.parametrize(("op", "flops", "transcendental"), [
    ("ReduceSum", 8 * 2, 0),  # 2 adds per group
    ("ReduceMax", 8 * 2, 0),  # 2 compares per group
    ("ReduceMin", 8 * 2, 0),
    ("ReduceProd", 8 * 2, 0),  # 2 multiplies per group
    ("ArgMax", 8 * 2, 0),
    ("ArgMin", 8 * 2, 0),
    ("ReduceMean", 8 * (2 + 1), 0),  # + 1 divide per group
    ("ReduceSumSquare", 24 + 16, 0),  # square each, then sum
    ("ReduceL1", 24 + 16, 0),  # abs each, then sum
    ("ReduceL2", 24 + 16 + 8, 8),  # square, sum, sqrt per group
    ("ReduceLogSum", 16 + 8, 8),  # sum, log per group
    # max 16, x - max 24, exp 24, sum 16, log 8, + max 8; 24 exp + 8 log.
    ("ReduceLogSumExp", 16 + 24 + 24 + 16 + 8 + 8, 24 + 8),
])
def test_reductions(op: str, flops: int, transcendental: int) -> None:
    c = cost(op, [(2, 3, 4), (1,)], [(2, 1, 4)], keepdims=1)
    assert arith(c) == (0, flops, transcendental)


def test_reduce_all_without_keepdims() -> None:
    # Everything into a scalar: 24 - 1 adds + 1 divide.
    assert cost("ReduceMean", [(2, 3, 4)], [()], keepdims=0).other_flops == 24


def test_cumsum() -> None:
    # approximation in the formula: 1 add per element.
    assert arith(cost("CumSum", [(3, 5), ()], [(3, 5)])) == (0, 15, 0)


def test_top_k() -> None:
    # [2,100], k=5 along -1: 2 slices x 100 x ceil(log2 5) = 3 compares.
    assert arith(cost("TopK", [(2, 100), (1,)], [(2, 5), (2, 5)])) == (0, 600, 0)
    # k=1 along axis 0 of [8,3]: 3 slices x 8 x 1.
    assert arith(cost("TopK", [(8, 3), (1,)], [(1, 3), (1, 3)], axis=0)) == (0, 24, 0)


# ---- shape and data movement -------------------------------------------------------------------

VIEWS = ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size", "Dropout"]
MOVES = ["Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
         "Scatter", "ScatterElements", "ScatterND", "Expand", "Tile", "Pad", "Constant",
         "ConstantOfShape", "Range", "NonZero", "DepthToSpace", "SpaceToDepth", "Trilu", "OneHot",
         "EyeLike", "ReverseSequence", "Compress", "CenterCropPad"]


@pytest.mark.parametrize("op", VIEWS + MOVES)
def test_data_movement_has_no_arithmetic(op: str) -> None:
    spec = lookup(op)
    assert spec is not None and spec.is_view == (op in VIEWS)
    assert arith(cost(op, [(2, 3, 4)], [(4, 3, 2)])) == (0, 0, 0)


def test_resize() -> None:
    x = (1, 3, 4, 4)
    # nearest: a gather.
    assert arith(cost("Resize", [x, OMITTED, (4,)], [(1, 3, 8, 8)])) == (0, 0, 0)
    # bilinear on 2 axes: 4 taps -> 4 multiplies + 3 adds per output; 3*8*8 = 192 outputs.
    c = cost("Resize", [x, OMITTED, (4,)], [(1, 3, 8, 8)], mode="linear")
    assert arith(c) == (0, 192 * 7, 0)
    # bicubic on 2 axes: 16 taps -> 16 + 15 per output.
    c = cost("Resize", [x, OMITTED, (4,)], [(1, 3, 8, 8)], mode="cubic")
    assert arith(c) == (0, 192 * 31, 0)
    # linear along one axis only: 2 taps -> 3 per output on 3*4*8 = 96 outputs.
    c = cost("Upsample", [x, (4,)], [(1, 3, 4, 8)], mode="linear")
    assert arith(c) == (0, 96 * 3, 0)


# ---- attention ---------------------------------------------------------------------------------

def test_attention_4d_grouped_query() -> None:
    # Q [2,4,16,8], K/V [2,2,32,8]: 2*4*16 = 128 query rows x 32 keys = 4096 scores; QK^T 8
    # MACs and PV 8 MACs per score. Per score 1 scale multiply; softmax per row of 32:
    # 31 + 32 + 32 + 31 + 32 = 158, 32 exp.
    q, kv = (2, 4, 16, 8), (2, 2, 32, 8)
    c = cost("Attention", [q, kv, kv], [q])
    assert arith(c) == (4096 * 16, 4096 + 128 * 158, 4096)
    # is_causal adds the mask: 1 add per score.
    c = cost("Attention", [q, kv, kv], [q], is_causal=1)
    assert arith(c) == (4096 * 16, 2 * 4096 + 128 * 158, 4096)


def test_attention_3d_with_past() -> None:
    # Q [2,16,32] with 4 heads (D=8), K/V [2,32,16] with 2 heads, past [2,2,10,8]: 42 keys.
    q, kv, past = (2, 16, 32), (2, 32, 16), (2, 2, 10, 8)
    c = cost("Attention", [q, kv, kv, OMITTED, past, past], [q, past, past],
             q_num_heads=4, kv_num_heads=2, softcap=30.0)
    scores = 128 * 42
    # softcap: divide, tanh, multiply per score; softmax per row of 42: 41 + 42 + 42 + 41 + 42.
    assert arith(c) == (scores * 16, scores * (1 + 3) + 128 * 208, scores * 2)


# ---- unknown shapes and the registry -----------------------------------------------------------

def test_unknown_dim_names_the_tensor() -> None:
    with pytest.raises(UnknownShape) as e:
        cost("Conv", [(1, 3, 8, 8), (4, 3, 3, 3)], [("batch", 4, 8, 8)])
    assert e.value.tensor == "y0"


def test_unknown_rank_names_the_tensor() -> None:
    with pytest.raises(UnknownShape) as e:
        cost("MatMul", [None, (8, 5)], [(4, 5)])
    assert e.value.tensor == "x0"
    with pytest.raises(UnknownShape) as e:
        cost("Softmax", [(2, None)], [(2, None)])
    assert e.value.tensor == "x0"


def test_registering_twice_is_an_error() -> None:
    before = dict(REGISTRY)
    with pytest.raises(DuplicateOpError, match="Conv"):
        register("Conv", family="test")(lambda node: Cost())
    try:
        register("OnnxlensTestOp", family="test")(lambda node: Cost())
        with pytest.raises(DuplicateOpError, match="OnnxlensTestOp"):
            register("OnnxlensTestOp", family="other")(lambda node: Cost())
    finally:
        REGISTRY.pop(("", "OnnxlensTestOp"), None)
    assert before == REGISTRY
