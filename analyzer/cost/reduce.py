"""Reductions (Reduce*, ArgMax/ArgMin), scans (CumSum) and selection (TopK).

A reduction of `n` elements into one takes n - 1 binary ops, so a Reduce* node does
(input elements - output elements) of them; keepdims and the axes only shape the output.
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, register
from .common import along_axis

# op_type: (FLOPs per input element, per output element; transcendental per input, per output).
# The Reduce* rows are the reductions every layer knows: the native executor's kernels
# (backends/native/ops.def, checked against `REDUCE_OPS` when it is imported) and its planner.
REDUCE_ARITHMETIC: dict[str, tuple[int, int, int, int]] = {
    "ReduceSum": (1, -1, 0, 0),  # in - out adds
    "ReduceMax": (1, -1, 0, 0),  # in - out compares
    "ReduceMin": (1, -1, 0, 0),  # in - out compares
    "ReduceProd": (1, -1, 0, 0),  # in - out multiplies
    "ArgMax": (1, -1, 0, 0),  # in - out compares
    "ArgMin": (1, -1, 0, 0),  # in - out compares
    "ReduceMean": (1, 0, 0, 0),  # in - out adds, out divides
    "ReduceSumSquare": (2, -1, 0, 0),  # in squares, in - out adds
    "ReduceL1": (2, -1, 0, 0),  # in abs, in - out adds
    "ReduceL2": (2, 0, 0, 1),  # in squares, in - out adds, out sqrt
    "ReduceLogSum": (1, 0, 0, 1),  # in - out adds, out log
    # stable: max (in - out), x - max (in), exp (in), sum (in - out), log (out), + max (out)
    "ReduceLogSumExp": (4, 0, 1, 1),
}
REDUCE_OPS: tuple[str, ...] = tuple(op for op in REDUCE_ARITHMETIC if op.startswith("Reduce"))


@register(*REDUCE_ARITHMETIC, family="reduce")
def reduce(node: NodeInfo) -> Cost:
    per_in, per_out, t_in, t_out = REDUCE_ARITHMETIC[node.op_type]
    n_in, n_out = node.inputs[0].size, node.outputs[0].size
    return Cost(other_flops=per_in * n_in + per_out * n_out,
                transcendental=t_in * n_in + t_out * n_out)


@register("CumSum", family="reduce")
def cumsum(node: NodeInfo) -> Cost:
    # approximation: 1 add per element; the axis is an input tensor whose value formulas do not
    # see, and the exact count is size - size/len(axis).
    return Cost(other_flops=node.outputs[0].size)


@register("TopK", family="reduce")
def top_k(node: NodeInfo) -> Cost:
    axis = node.attr("axis", -1)
    slices, n = along_axis(node.inputs[0].dims, axis)
    k = node.outputs[0].dims[axis]
    # approximation: heap selection, n * max(1, ceil(log2 k)) compares per slice; ordering the
    # k results is not counted.
    per_slice = n * max(1, math.ceil(math.log2(k))) if k else 0
    return Cost(other_flops=slices * per_slice)
