"""Pooling: windowed (MaxPool, AveragePool, LpPool) and global (over all spatial dims).

Cost per output element from the window size K (kernel_shape, or every spatial element for
the Global forms).
approximation: windows clipped by padding are counted as full windows (the count differs
only along padded borders); dilation changes which elements are read, not how many.
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, register


def _window(node: NodeInfo) -> int:
    if "Global" in node.op_type:
        # One window per (batch, channel) output: all input elements over the outputs, whichever
        # axes are spatial (QLinearGlobalAveragePool's channels_last too).
        return node.inputs[0].size // node.outputs[0].size
    return math.prod(node.attr("kernel_shape"))


@register("MaxPool", "GlobalMaxPool", family="pool")
def max_pool(node: NodeInfo) -> Cost:
    # K - 1 comparisons per output.
    return Cost(other_flops=(_window(node) - 1) * node.outputs[0].size)


@register("AveragePool", "GlobalAveragePool", family="pool")
def average_pool(node: NodeInfo) -> Cost:
    # K - 1 adds and 1 divide per output: K.
    return Cost(other_flops=_window(node) * node.outputs[0].size)


@register("LpPool", "GlobalLpPool", family="pool")
def lp_pool(node: NodeInfo) -> Cost:
    # (sum |x|^p)^(1/p): K powers, K - 1 adds, 1 root (transcendental) per output: 2K.
    # approximation: |x|^p counted as 1 FLOP (a multiply for the default p=2).
    n = node.outputs[0].size
    return Cost(other_flops=2 * _window(node) * n, transcendental=n)
