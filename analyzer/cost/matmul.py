"""Matrix products: MatMul (numpy batching and broadcasting), Gemm, Einsum, quantized MatMul.

MatMulInteger and QLinearMatMul do MatMul's multiply-accumulates on integers; their
zero-point and requantization arithmetic is not counted (approximation, as for ConvInteger).
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, register


@register("MatMul", "MatMulInteger", "QLinearMatMul", family="matmul")
def matmul(node: NodeInfo) -> Cost:
    # Every output element (broadcast batch dims included) is a dot product over K, A's last
    # dim; numpy's 1-D promotions only drop an output dim, so this holds for them too.
    return Cost(macs=node.outputs[0].size * node.inputs[0].dims[-1])


@register("Gemm", family="matmul")
def gemm(node: NodeInfo) -> Cost:
    a, y = node.inputs[0], node.outputs[0]
    k = a.dims[0] if node.attr("transA", 0) else a.dims[1]
    # MACs: M*N dot products over K. Epilogue per output element: alpha*AB one multiply when
    # alpha != 1, + C one add when C is given, beta*C one multiply when beta != 1.
    with_c = node.input(2) is not None
    epilogue = ((node.attr("alpha", 1.0) != 1.0) + with_c
                + (with_c and node.attr("beta", 1.0) != 1.0))
    return Cost(macs=y.size * k, other_flops=epilogue * y.size)


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
