"""Quantization: ONNX's QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearConv,
QLinearMatMul, and ONNX Runtime's com.microsoft quantized ops.

Integer multiply-accumulates count as MACs, so a quantized model has its float twin's MACs
(the conv and matmul formulas are reused). Around them, per element:

- quantize, saturate(round(x / scale) + zero_point): divide, round-and-convert, clamp low and
  high (4), + 1 add with a zero point: `quantize(zp)`.
- dequantize, (x - zero_point) * scale: convert, multiply (2), + 1 subtract with a zero point:
  `dequantize(zp)`.

Per tensor, per axis and blocked scales cost the same per element (the scale is read, not
computed). An op on quantized values (QLinearAdd, QLinearSigmoid ...) is counted as dequantize
its inputs, the float op, quantize the result, like the DequantizeLinear -> op ->
QuantizeLinear chain it replaces.
approximation: ONNX Runtime's CPU kernels do some of these with a 256-entry lookup table (the
activations, when scales are constant) or a plain copy (QLinearConcat inputs already at the
output's scale); counted as the arithmetic they stand for.
"""

from __future__ import annotations

import onnx

from ..ir import NodeInfo, TensorInfo
from .activation import ACTIVATIONS, softmax_rows
from .base import MS, Cost, Formula, operands_at, register
from .common import along_axis
from .conv import conv_cost
from .matmul import gemm_macs, matmul
from .pool import average_pool


def quantize(zero_point: bool) -> int:
    return 4 + zero_point


def dequantize(zero_point: bool) -> int:
    return 2 + zero_point


def _given(node: NodeInfo, position: int) -> bool:
    return node.input(position) is not None


@register("QuantizeLinear", family="quant")
@register("QuantizeLinear", family="quant", domain=MS)
def quantize_linear(node: NodeInfo) -> Cost:
    # x, y_scale, y_zero_point (optional)
    return Cost(other_flops=quantize(_given(node, 2)) * node.inputs[0].size)


@register("DequantizeLinear", family="quant")
@register("DequantizeLinear", family="quant", domain=MS)
def dequantize_linear(node: NodeInfo) -> Cost:
    # x, x_scale, x_zero_point (optional)
    return Cost(other_flops=dequantize(_given(node, 2)) * node.inputs[0].size)


def dynamic_quantize(n: int) -> int:
    """FLOPs to quantize n floats to uint8 with a range measured on them.

    min and max over the n values and 0: 2n compares; scale (max - min) / 255: 2; zero point
    clamp(round(0 - min / scale)): divide, subtract, round, 2 clamps = 5; then quantize each
    value with the zero point: 5n. Total 7n + 7.
    """
    return 2 * n + 2 + 5 + quantize(True) * n


def _table_values(node: NodeInfo) -> dict[int, int]:
    # data (0): uint8 bytes pack 8 / bits values each (MatMulNBits' layout); an int4, uint4 or
    # int8 table holds one per element.
    data = node.inputs[0]
    per_byte = 8 // node.attr("bits", 4) if data.elem_type == onnx.TensorProto.UINT8 else 1
    return {0: data.size * per_byte}


@register("GatherBlockQuantized", family="quant", domain=MS, packed=_table_values)
def gather_block_quantized(node: NodeInfo) -> Cost:
    """Rows of a block-quantized table (an int4 decoder's embeddings) gathered and
    dequantized: each output value is (q - zero point) * its block's scale. A uint8 table
    always has a zero point (2^(bits - 1) by default, MatMulNBits' convention); another only
    when zero_points (3) is given."""
    zero_point = _given(node, 3) or node.inputs[0].elem_type == onnx.TensorProto.UINT8
    return Cost(other_flops=dequantize(zero_point) * node.outputs[0].size)


@register("DynamicQuantizeLinear", family="quant")
def dynamic_quantize_linear(node: NodeInfo) -> Cost:
    return Cost(other_flops=dynamic_quantize(node.inputs[0].size))


@register("QLinearConv", family="quant", operands=operands_at(0, 3))
@register("QLinearConv", family="quant", domain=MS, operands=operands_at(0, 3))  # channels_last
def qlinear_conv(node: NodeInfo) -> Cost:
    # x, x_scale, x_zp, w (3), w_scale, w_zp, y_scale, y_zp (7), B (8, int32): Conv's MACs and
    # bias add; the int32 accumulator is requantized to y's scale and zero point per output.
    y = node.outputs[0]
    return conv_cost(node, 3, 8) + Cost(other_flops=quantize(_given(node, 7)) * y.size)


@register("QLinearMatMul", family="quant", operands=operands_at(0, 3))
def qlinear_matmul(node: NodeInfo) -> Cost:
    # a, a_scale, a_zp, b (3), b_scale, b_zp, y_scale, y_zp (7): MatMul's MACs (K from a), then
    # requantization per output.
    y = node.outputs[0]
    return matmul(node) + Cost(other_flops=quantize(_given(node, 7)) * y.size)


@register("MatMulIntegerToFloat", family="quant", domain=MS)
def matmul_integer_to_float(node: NodeInfo) -> Cost:
    # A, B, a_scale, b_scale, a_zp, b_zp, bias (6): MatMul's MACs; per output: convert the
    # int32 sum to float and multiply by a_scale * b_scale (2), + bias (1 when given).
    y = node.outputs[0]
    return matmul(node) + Cost(other_flops=(2 + _given(node, 6)) * y.size)


def _quantized_a(node: NodeInfo) -> tuple[int, TensorInfo]:
    return onnx.TensorProto.UINT8, node.inputs[1]  # A is quantized to uint8 inside the op


@register("DynamicQuantizeMatMul", family="quant", domain=MS, operands=_quantized_a)
def dynamic_quantize_matmul(node: NodeInfo) -> Cost:
    # A (float, quantized to uint8 on the fly), B (int8), b_scale, b_zp, bias (4): A's dynamic
    # quantization, MatMul's MACs, then as MatMulIntegerToFloat per output.
    y = node.outputs[0]
    return matmul(node) + Cost(other_flops=dynamic_quantize(node.inputs[0].size)
                               + (2 + _given(node, 4)) * y.size)


@register("QGemm", family="quant", domain=MS, operands=operands_at(0, 3))
def qgemm(node: NodeInfo) -> Cost:
    # A, a_scale, a_zp, B (3), b_scale, b_zp, C (6, int32), y_scale (7), y_zp (8): Gemm's MACs;
    # per output: + C (1 when given), then either requantize to y (y_scale given) or convert
    # and scale by alpha * a_scale * b_scale to a float output (2).
    y = node.outputs[0]
    out = quantize(_given(node, 8)) if _given(node, 7) else 2
    return Cost(macs=gemm_macs(node), other_flops=(_given(node, 6) + out) * y.size)


def _qlinear_pointwise(op_flops: int, transcendental: int, zero_points: tuple[int, ...],
                       y_zero_point: int) -> Formula:
    """An op on dequantized inputs (their zero points at `zero_points`), quantized to y's scale
    (its zero point at `y_zero_point`): per output element, each input's dequantization, the
    float op, the quantization."""

    def formula(node: NodeInfo) -> Cost:
        per = (sum(dequantize(_given(node, z)) for z in zero_points) + op_flops
               + quantize(_given(node, y_zero_point)))
        n = node.outputs[0].size
        return Cost(other_flops=per * n, transcendental=transcendental * n)

    return formula


# A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp: one add / multiply per output.
register("QLinearAdd", "QLinearMul", family="quant", domain=MS)(
    _qlinear_pointwise(1, 0, (2, 5), 7))
# X, X_scale, X_zp, Y_scale, Y_zp: the float activation's own count (activation module).
for _op in ("Sigmoid", "LeakyRelu"):
    register(f"QLinear{_op}", family="quant", domain=MS)(
        _qlinear_pointwise(*ACTIVATIONS[_op], (2,), 4))


@register("QLinearSoftmax", family="quant", domain=MS)
def qlinear_softmax(node: NodeInfo) -> Cost:
    # X, X_scale, x_zp, y_scale, y_zp: each element dequantized, Softmax along `axis` (default
    # -1; approximation: opset < 13's flattening read as one axis, as Softmax), quantized.
    n = node.outputs[0].size
    per = dequantize(_given(node, 2)) + quantize(_given(node, 4))
    return Cost(other_flops=per * n) + softmax_rows(*along_axis(node.inputs[0].dims,
                                                                node.attr("axis", -1)))


@register("QLinearAveragePool", "QLinearGlobalAveragePool", family="quant", domain=MS)
def qlinear_average_pool(node: NodeInfo) -> Cost:
    # X, x_scale, x_zp, y_scale, y_zp: AveragePool's K per output on the integers, then the
    # mean is requantized from x's scale and zero point to y's per output.
    requantize = dequantize(_given(node, 2)) + quantize(_given(node, 4))
    return average_pool(node) + Cost(other_flops=requantize * node.outputs[0].size)


@register("QLinearConcat", family="quant", domain=MS)
def qlinear_concat(node: NodeInfo) -> Cost:
    # Y_scale, Y_zp, then (X, X_scale, X_zp) per input, zero points required: every element
    # requantized from its input's scale to Y's (approximation: an input already at Y's scale
    # is a copy).
    n = node.outputs[0].size
    return Cost(other_flops=(dequantize(True) + quantize(_given(node, 1))) * n)
