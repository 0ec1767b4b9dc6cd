"""Convolutions: Conv, ConvTranspose, and ConvInteger (QLinearConv is in `quant`, on
`conv_cost`).

ConvInteger does Conv's multiply-accumulates on integers (they count as MACs); its zero-point
arithmetic is not counted (approximation: a per-output correction, x_zero_point times the
window's weight sum, precomputed per output channel by runtimes).
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, register

# op_type: (position of the weight W, position of the bias B or None).
_CONV_INPUTS: dict[str, tuple[int, int | None]] = {
    "Conv": (1, 2),
    "ConvInteger": (1, None),  # input 2 is x_zero_point, not a bias
}


def conv_cost(node: NodeInfo, weight_at: int, bias_at: int | None) -> Cost:
    w, y = node.inputs[weight_at], node.outputs[0]
    _, c_per_group, *kernel = w.dims
    # MACs: each output element is a dot product over (C/group) x kernel window.
    macs = y.size * c_per_group * math.prod(kernel)
    # Bias: one add per output element.
    bias = y.size if bias_at is not None and node.input(bias_at) is not None else 0
    return Cost(macs=macs, other_flops=bias)


@register("Conv", "ConvInteger", family="conv")
def conv(node: NodeInfo) -> Cost:
    return conv_cost(node, *_CONV_INPUTS[node.op_type])


@register("ConvTranspose", family="conv")
def conv_transpose(node: NodeInfo) -> Cost:
    x, w = node.inputs[0], node.inputs[1]
    _, m_per_group, *kernel = w.dims
    # MACs: every input element is scattered through the kernel into M/group output channels.
    macs = x.size * m_per_group * math.prod(kernel)
    # Bias: one add per output element.
    bias = node.outputs[0].size if node.input(2) is not None else 0
    return Cost(macs=macs, other_flops=bias)
