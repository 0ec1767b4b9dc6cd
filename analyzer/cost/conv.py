"""Convolutions: Conv, ConvTranspose (and QLinearConv/ConvInteger share Conv's arithmetic)."""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, register


@register("Conv", family="conv")
def conv(node: NodeInfo) -> Cost:
    w, y = node.inputs[1], node.outputs[0]
    n, m, *out_spatial = y.dims
    _, c_per_group, *kernel = w.dims
    # MACs: each output element is a dot product over (C/group) x kernel window.
    macs = n * m * math.prod(out_spatial) * c_per_group * math.prod(kernel)
    # Bias: one add per output element.
    bias = y.size if node.input(2) is not None else 0
    return Cost(macs=macs, other_flops=bias)


@register("ConvTranspose", family="conv")
def conv_transpose(node: NodeInfo) -> Cost:
    x, w = node.inputs[0], node.inputs[1]
    n, c, *in_spatial = x.dims
    _, m_per_group, *kernel = w.dims
    # MACs: every input element is scattered through the kernel into M/group output channels.
    macs = n * c * math.prod(in_spatial) * m_per_group * math.prod(kernel)
    bias = node.outputs[0].size if node.input(2) is not None else 0
    return Cost(macs=macs, other_flops=bias)
