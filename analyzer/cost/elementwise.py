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

# op_type: (FLOPs, transcendental) per output element.
_POINTWISE: dict[str, tuple[int, int]] = {
    # arithmetic: one operation each
    "Add": (1, 0), "Sub": (1, 0), "Mul": (1, 0), "Div": (1, 0), "Neg": (1, 0), "Abs": (1, 0),
    "Reciprocal": (1, 0), "Floor": (1, 0), "Ceil": (1, 0), "Round": (1, 0), "Sign": (1, 0),
    # approximation: fmod counted as 1 FLOP (it is a divide, truncate and multiply-subtract)
    "Mod": (1, 0),
    # comparisons, logic, selects, casts: one instruction each
    "Equal": (1, 0), "Less": (1, 0), "LessOrEqual": (1, 0), "Greater": (1, 0),
    "GreaterOrEqual": (1, 0), "Not": (1, 0), "And": (1, 0), "Or": (1, 0), "Xor": (1, 0),
    "IsNaN": (1, 0), "IsInf": (1, 0), "Where": (1, 0), "Cast": (1, 0), "CastLike": (1, 0),
    # special functions: one evaluation each
    "Sqrt": (1, 1), "Exp": (1, 1), "Log": (1, 1), "Erf": (1, 1), "Tanh": (1, 1),
    "Sin": (1, 1), "Cos": (1, 1), "Tan": (1, 1), "Asin": (1, 1), "Acos": (1, 1),
    "Atan": (1, 1), "Sinh": (1, 1), "Cosh": (1, 1), "Asinh": (1, 1), "Acosh": (1, 1),
    "Atanh": (1, 1),
    # approximation: Pow as one special function, exp(y*log x); exporters' constant exponents
    # (x^2 in a spelled-out LayerNorm) are a multiply on most runtimes
    "Pow": (1, 1),
}

for _op, (_flops, _transcendental) in _POINTWISE.items():
    register(_op, family="elementwise")(pointwise(_flops, _transcendental))


@register("Sum", "Max", "Min", "Mean", family="elementwise")
def variadic(node: NodeInfo) -> Cost:
    k = sum(t is not None for t in node.inputs)
    # k inputs: k-1 binary ops per output element; Mean adds one multiply by 1/k.
    per_element = k - 1 + (node.op_type == "Mean")
    return Cost(other_flops=per_element * node.outputs[0].size)


@register("Clip", family="elementwise")
def clip(node: NodeInfo) -> Cost:
    # One comparison per bound given (opset >= 11: inputs min, max; opset 6: attributes);
    # no bound makes Clip a copy.
    bounds = sum(node.input(i) is not None or key in node.attrs
                 for i, key in ((1, "min"), (2, "max")))
    return Cost(other_flops=bounds * node.outputs[0].size)
