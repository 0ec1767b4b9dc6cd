"""Activations (one result per element) and the row-wise Softmax family.

Each special-function evaluation (exp, log, tanh, erf, sigmoid) is one FLOP and one
transcendental; the arithmetic around it is counted op by op.
"""

from __future__ import annotations

from ..ir import NodeInfo
from .base import MS, Cost, register
from .common import along_axis, pointwise
from .ops import ACTIVATION, costed

# op_type: (FLOPs, transcendental) per output element; the derivations are the op catalogue's
# (`ops.POINTWISE`).
ACTIVATIONS = costed(ACTIVATION)

for _op, (_flops, _transcendental) in ACTIVATIONS.items():
    register(_op, family=ACTIVATION)(pointwise(_flops, _transcendental))


# tanh-approximate GELU: 9 FLOPs and 1 tanh per element (derivation in `gelu`).
_TANH_GELU = 9


# com.microsoft Gelu is the exact (erf) form, without the attribute.
@register("Gelu", family="activation")
@register("Gelu", family="activation", domain=MS)
def gelu(node: NodeInfo) -> Cost:
    n = node.outputs[0].size
    if node.attr("approximate", "none") == "tanh":
        # 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))): x^3 2 mul, 1 mul, 1 add, 1 mul, tanh,
        # 1 add, 2 mul = 9 FLOPs, 1 transcendental.
        return Cost(other_flops=_TANH_GELU * n, transcendental=n)
    # 0.5x(1 + erf(x/sqrt(2))): div, erf, add, mul, mul = 5 FLOPs, 1 transcendental (the same as
    # the Div, Erf, Add, Mul, Mul that opset < 20 exporters spell it with).
    return Cost(other_flops=5 * n, transcendental=n)


@register("FastGelu", family="activation", domain=MS)
def fast_gelu(node: NodeInfo) -> Cost:
    # x (+ bias, 1 add per element when given), then the tanh approximation.
    n = node.outputs[0].size
    return Cost(other_flops=(_TANH_GELU + (node.input(1) is not None)) * n, transcendental=n)


@register("BiasGelu", family="activation", domain=MS)
def bias_gelu(node: NodeInfo) -> Cost:
    # Gelu(A + B): 1 add, then the exact form's 5 FLOPs and 1 erf.
    n = node.outputs[0].size
    return Cost(other_flops=6 * n, transcendental=n)


@register("QuickGelu", family="activation", domain=MS)
def quick_gelu(node: NodeInfo) -> Cost:
    # x * sigmoid(alpha * x): mul, sigmoid, mul.
    n = node.outputs[0].size
    return Cost(other_flops=3 * n, transcendental=n)


@register("GemmFastGelu", family="activation", domain=MS)
def gemm_fast_gelu(node: NodeInfo) -> Cost:
    # X [M, K] x W [K, N]: M*N dot products over K; + bias [N] (1 add per output when given),
    # then FastGelu's 9 FLOPs and 1 tanh per output.
    y = node.outputs[0]
    epilogue = _TANH_GELU + (node.input(2) is not None)
    return Cost(macs=y.size * node.inputs[0].dims[-1], other_flops=epilogue * y.size,
                transcendental=y.size)


def softmax_rows(rows: int, n: int) -> Cost:
    """Numerically stable softmax of `rows` rows of length `n`.

    Per row: max (n-1 compares), x - max (n subs), exp (n), sum (n-1 adds), divide (n):
    5n - 2 FLOPs, n transcendental.
    """
    return Cost(other_flops=rows * (5 * n - 2), transcendental=rows * n)


def _rows(node: NodeInfo) -> tuple[int, int]:
    """(number of rows, row length) along the `axis` attribute (opset >= 13 semantics)."""
    # approximation: opset < 13 Softmax flattens dims[axis:] into one row (default axis 1); the
    # formula does not see the opset and reads `axis` as opset 13 does, a single axis (default
    # -1). The totals differ only in the per-row constant.
    return along_axis(node.inputs[0].dims, node.attr("axis", -1))


@register("Softmax", family="activation")
def softmax(node: NodeInfo) -> Cost:
    return softmax_rows(*_rows(node))


@register("LogSoftmax", family="activation")
def log_softmax(node: NodeInfo) -> Cost:
    rows, n = _rows(node)
    # x - max - log(sum(exp(x - max))): max n-1, sub n, exp n, sum n-1, log 1, sub n = 5n - 1
    # FLOPs per row; n + 1 transcendental.
    return Cost(other_flops=rows * (5 * n - 1), transcendental=rows * (n + 1))


@register("Hardmax", family="activation")
def hardmax(node: NodeInfo) -> Cost:
    rows, n = _rows(node)
    # argmax per row (n-1 compares), then a one-hot write.
    return Cost(other_flops=rows * (n - 1))
