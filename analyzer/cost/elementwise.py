"""Elementwise ops: one result per output element, numpy broadcasting included.

Counted per output element (a broadcast operand is read once but the op runs once per
output). Each special-function evaluation (exp, log, erf, tanh, sqrt, sin, ...) is one FLOP
and one transcendental. Comparisons, selects, logic and casts are one instruction per element
and are counted as one FLOP each, like the arithmetic ones (the README's "elementwise: 1 per
output element").
"""

from __future__ import annotations

from ..ir import NodeInfo
from .base import Cost, register
from .common import pointwise
from .ops import ELEMENTWISE, VARIADIC, costed

# The fixed counts per output element, with their derivations, are the op catalogue's
# (`ops.POINTWISE`).
for _op, (_flops, _transcendental) in costed(ELEMENTWISE).items():
    register(_op, family=ELEMENTWISE)(pointwise(_flops, _transcendental))


@register(*VARIADIC, family=ELEMENTWISE)  # Sum, Max, Min, Mean
def variadic(node: NodeInfo) -> Cost:
    k = sum(t is not None for t in node.inputs)
    # k inputs: k-1 binary ops per output element; Mean adds one multiply by 1/k.
    per_element = k - 1 + (node.op_type == "Mean")
    return Cost(other_flops=per_element * node.outputs[0].size)


@register("Clip", family=ELEMENTWISE)
def clip(node: NodeInfo) -> Cost:
    # One comparison per bound given (opset >= 11: inputs min, max; opset 6: attributes);
    # no bound makes Clip a copy.
    bounds = sum(node.input(i) is not None or key in node.attrs
                 for i, key in ((1, "min"), (2, "max")))
    return Cost(other_flops=bounds * node.outputs[0].size)
