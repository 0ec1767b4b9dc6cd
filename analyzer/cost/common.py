"""Helpers shared by the op families: per-element formulas and axis bookkeeping."""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import Cost, Formula


def pointwise(flops: int, transcendental: int = 0) -> Formula:
    """A formula charging `flops` FLOPs, `transcendental` of them special functions, per output
    element."""

    def formula(node: NodeInfo) -> Cost:
        n = node.outputs[0].size
        return Cost(other_flops=flops * n, transcendental=transcendental * n)

    return formula


def along_axis(dims: tuple[int, ...], axis: int) -> tuple[int, int]:
    """(number of 1-D slices, slice length) along `axis` (negative counts from the end); a
    scalar is one slice of one element."""
    if not dims:
        return 1, 1
    axis %= len(dims)
    return math.prod(dims[:axis] + dims[axis + 1:]), dims[axis]
