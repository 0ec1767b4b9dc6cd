"""Matrix products: MatMul (numpy batching and broadcasting), Gemm, Einsum, MatMulInteger,
and ONNX Runtime's weight-only quantized MatMulNBits. The quantized forms with scales
(QLinearMatMul, QGemm, ...) are in `quant`, on these formulas.

MatMulInteger does MatMul's multiply-accumulates on integers (they count as MACs); its
zero-point arithmetic is not counted (approximation: a per-row/column correction, as for
ConvInteger).
"""

from __future__ import annotations

import math

import onnx

from ..ir import NodeInfo, TensorInfo
from .base import MS, Cost, register


@register("MatMul", "MatMulInteger", family="matmul")
def matmul(node: NodeInfo) -> Cost:
    # Every output element (broadcast batch dims included) is a dot product over K, A's last
    # dim; numpy's 1-D promotions only drop an output dim, so this holds for them too.
    return Cost(macs=node.outputs[0].size * node.inputs[0].dims[-1])


def _n_bits_operands(node: NodeInfo) -> tuple[TensorInfo | int, ...]:
    # accuracy_level 4: A is quantized to int8 and the MACs are int8 x int8 (ORT's
    # CompInt8); otherwise B is dequantized to A's float type.
    if node.attr("accuracy_level", 0) == 4:
        return (onnx.TensorProto.INT8,)
    return (node.inputs[0],)


def _n_bits_parameters(node: NodeInfo) -> dict[int, int]:
    # B (1) holds the K x N weights; zero_points (3), when uint8, pack one per block of each
    # of the N columns (bits wide); scales (2) are one float per block.
    k, n, block = node.attr("K"), node.attr("N"), node.attr("block_size")
    packed = {1: k * n}
    zero_points = node.input(3)
    if zero_points is not None and zero_points.elem_type == onnx.TensorProto.UINT8:
        packed[3] = n * -(-k // block)
    return packed


@register("MatMulNBits", family="matmul", domain=MS, operands=_n_bits_operands,
          packed=_n_bits_parameters)
def matmul_n_bits(node: NodeInfo) -> Cost:
    """A [..., K] x B, K x N weights of `bits` bits packed in uint8 blocks with a scale (and a
    zero point) per `block_size` of K: the fp32 MatMul's MACs (K per output). Each weight is
    dequantized once per call, (w - zero point) * scale: 2 FLOPs per weight (the zero point
    defaults to 2^(bits-1), so there is always one); + bias [N] 1 add per output when given.
    approximation: a kernel that quantizes A instead (accuracy_level 4, int8 MACs) or
    dequantizes a block again per row tile does other bookkeeping; counted as once per call."""
    y, k, n = node.outputs[0], node.attr("K"), node.attr("N")
    bias = y.size if node.input(5) is not None else 0
    return Cost(macs=y.size * k, other_flops=2 * k * n + bias)


def gemm_macs(node: NodeInfo) -> int:
    """Gemm's (and QGemm's) MACs: M*N dot products over K, K read from A (input 0) after
    transA."""
    a = node.inputs[0]
    return node.outputs[0].size * (a.dims[0] if node.attr("transA", 0) else a.dims[1])


@register("Gemm", family="matmul")
def gemm(node: NodeInfo) -> Cost:
    # Epilogue per output element: alpha*AB one multiply when alpha != 1, + C one add when C is
    # given, beta*C one multiply when beta != 1.
    with_c = node.input(2) is not None
    epilogue = ((node.attr("alpha", 1.0) != 1.0) + with_c
                + (with_c and node.attr("beta", 1.0) != 1.0))
    return Cost(macs=gemm_macs(node), other_flops=epilogue * node.outputs[0].size)


def _broadcast(a: int, b: int) -> int:
    return a if b == 1 else b


def _einsum_extents(equation: str, operands: list[tuple[int, ...]]) -> list[int]:
    """The extent of every distinct index of `equation`'s operands, the '...' dims included
    (broadcast like numpy, right-aligned)."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    labels: dict[str, int] = {}
    ellipses: list[tuple[int, ...]] = []
    for term, dims in zip(terms, operands, strict=True):
        head, dots, tail = term.partition("...")
        n_ellipsis = len(dims) - len(head) - len(tail) if dots else 0
        named = dims[:len(head)] + dims[len(head) + n_ellipsis:]
        for label, size in zip(head + tail, named, strict=True):
            labels[label] = _broadcast(labels.get(label, 1), size)
        ellipses.append(dims[len(head):len(head) + n_ellipsis])
    rank = max(map(len, ellipses))
    ellipsis = [1] * rank
    for dims in ellipses:
        for i, size in enumerate(dims, rank - len(dims)):
            ellipsis[i] = _broadcast(ellipsis[i], size)
    return [*labels.values(), *ellipsis]


@register("Einsum", family="matmul")
def einsum(node: NodeInfo) -> Cost:
    operands = [t.dims for t in node.inputs if t is not None]
    if len(operands) == 1:
        # One operand: a transpose, diagonal or sum; each summed-away element is one add.
        return Cost(other_flops=math.prod(operands[0]) - node.outputs[0].size)
    # MACs: one per combination of all index values (the product of every index's extent).
    # approximation: with k > 2 operands, k - 1 multiplies per combination (a naive
    # contraction; runtimes that contract pairwise do fewer).
    combos = math.prod(_einsum_extents(node.attr("equation"), operands))
    return Cost(macs=(len(operands) - 1) * combos)
