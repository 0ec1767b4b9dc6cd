"""Convolutions: Conv, ConvTranspose, and the quantized ConvInteger/QLinearConv.

ConvInteger and QLinearConv do Conv's multiply-accumulates on integers; their zero-point and
requantization arithmetic is not counted (approximation: integer bookkeeping, and the one
float rescale per output of QLinearConv, are left out).
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, register

# op_type: (position of the weight W, position of the bias B or None).
_CONV_INPUTS: dict[str, tuple[int, int | None]] = {
    "Conv": (1, 2),
    "ConvInteger": (1, None),  # input 2 is x_zero_point, not a bias
    "QLinearConv": (3, 8),
}


@register(*_CONV_INPUTS, family="conv")
def conv(node: NodeInfo) -> Cost:
    weight_at, bias_at = _CONV_INPUTS[node.op_type]
    w, y = node.inputs[weight_at], node.outputs[0]
    _, c_per_group, *kernel = w.dims
    # MACs: each output element is a dot product over (C/group) x kernel window.
    macs = y.size * c_per_group * math.prod(kernel)
    # Bias: one add per output element.
    bias = y.size if bias_at is not None and node.input(bias_at) is not None else 0
    return Cost(macs=macs, other_flops=bias)


@register("ConvTranspose", family="conv")
def conv_transpose(node: NodeInfo) -> Cost:
    x, w = node.inputs[0], node.inputs[1]
    _, m_per_group, *kernel = w.dims
    # MACs: every input element is scattered through the kernel into M/group output channels.
    macs = x.size * m_per_group * math.prod(kernel)
    # Bias: one add per output element.
    bias = node.outputs[0].size if node.input(2) is not None else 0
    return Cost(macs=macs, other_flops=bias)
