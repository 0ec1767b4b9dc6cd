"""Normalizations: BatchNorm, LayerNorm, InstanceNorm, GroupNorm, RMSNorm, MVN, Lp, LRN, and
ONNX Runtime's SimplifiedLayerNormalization (RMSNorm) and Skip* forms (residual add, then norm).

The statistics-based ones share one count (`normalize`) over `rows` groups of `n` elements.
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .base import MS, Cost, register
from .common import along_axis


def normalize(rows: int, n: int, *, center: bool, affine: int) -> Cost:
    """Normalize `rows` groups of `n` elements, then `affine` per-element scale/shift ops.

    Per group: mean (n-1 adds, 1 div) and x - mean (n subs) when centering: 2n; mean of squares
    (n muls, n-1 adds, 1 div): 2n; + eps, sqrt, reciprocal: 3 (1 transcendental); multiply by
    it: n; scale and/or shift: n each. LayerNorm with bias: 7n + 3.
    """
    per_group = (2 * n if center else 0) + 2 * n + 3 + n + affine * n
    return Cost(other_flops=rows * per_group, transcendental=rows)


def _split_at(dims: tuple[int, ...], axis: int) -> tuple[int, int]:
    """(rows, row length) normalizing over dims[axis:]."""
    axis %= len(dims)
    return math.prod(dims[:axis]), math.prod(dims[axis:])


@register("BatchNormalization", family="norm")
def batch_norm(node: NodeInfo) -> Cost:
    # Inference: scale/sqrt(var + eps) and the shift fold into one per-channel multiplier and
    # offset: 1 mul + 1 add per element.
    # approximation: the per-channel folding (C sqrt, divs) is done once at load and not counted;
    # training_mode=1 (batch statistics) is costed as inference.
    return Cost(other_flops=2 * node.outputs[0].size)


@register("LayerNormalization", family="norm")
def layer_norm(node: NodeInfo) -> Cost:
    rows, n = _split_at(node.inputs[0].dims, node.attr("axis", -1))
    # Scale is required, the bias B optional.
    return normalize(rows, n, center=True, affine=1 + (node.input(2) is not None))


# ONNX Runtime registers SimplifiedLayerNormalization (RMSNorm) in the default domain itself.
@register("RMSNormalization", "SimplifiedLayerNormalization", family="norm")
def rms_norm(node: NodeInfo) -> Cost:
    rows, n = _split_at(node.inputs[0].dims, node.attr("axis", -1))
    # x / sqrt(mean(x^2) + eps) * scale: no centering, scale only: 4n + 3 per row.
    return normalize(rows, n, center=False, affine=1)


def _skip(node: NodeInfo, bias_at: int) -> tuple[int, int, int]:
    """(rows, hidden, adds) of a Skip* norm: input [..., hidden] + skip, + bias [hidden] when
    given, 1 add each per element, before normalizing over the last axis."""
    rows, n = _split_at(node.inputs[0].dims, -1)
    return rows, n, rows * n * (1 + (node.input(bias_at) is not None))


@register("SkipLayerNormalization", family="norm", domain=MS)
def skip_layer_norm(node: NodeInfo) -> Cost:
    # input, skip, gamma, beta (optional), bias (optional): LayerNorm of input + skip + bias.
    rows, n, adds = _skip(node, 4)
    return Cost(other_flops=adds) + normalize(rows, n, center=True,
                                               affine=1 + (node.input(3) is not None))


@register("SkipSimplifiedLayerNormalization", family="norm", domain=MS)
def skip_simplified_layer_norm(node: NodeInfo) -> Cost:
    # input, skip, gamma, bias (optional): RMSNorm (4n + 3 per row) of input + skip + bias.
    rows, n, adds = _skip(node, 3)
    return Cost(other_flops=adds) + normalize(rows, n, center=False, affine=1)


@register("InstanceNormalization", "GroupNormalization", family="norm")
def instance_group_norm(node: NodeInfo) -> Cost:
    batch, channels, *spatial = node.inputs[0].dims
    # Instance: one group per (sample, channel); Group: num_groups per sample. Scale and bias
    # are both required: 7n + 3 per group.
    groups = node.attr("num_groups") if node.op_type == "GroupNormalization" else channels
    if not groups:  # no channels: an empty tensor (num_groups >= 1 is validated)
        return Cost()
    return normalize(batch * groups, channels // groups * math.prod(spatial), center=True,
                      affine=2)


@register("MeanVarianceNormalization", family="norm")
def mean_variance_norm(node: NodeInfo) -> Cost:
    dims = node.inputs[0].dims
    axes = {a % len(dims) for a in node.attr("axes", [0, 2, 3])}
    kept = math.prod(d for i, d in enumerate(dims) if i not in axes)
    # (x - mean) / sqrt(var + eps) over `axes`, no affine: 5n + 3 per group.
    return normalize(kept, math.prod(dims[a] for a in axes), center=True, affine=0)


@register("LpNormalization", family="norm")
def lp_norm(node: NodeInfo) -> Cost:
    rows, n = along_axis(node.inputs[0].dims, node.attr("axis", -1))
    # x / ||x||_p along axis: p=2: square n, sum n-1, sqrt 1, divide n = 3n, 1 transcendental;
    # p=1: abs n, sum n-1, divide n = 3n - 1.
    l2 = node.attr("p", 2) == 2
    return Cost(other_flops=rows * (3 * n - 1 + l2), transcendental=rows * l2)


@register("LRN", family="norm")
def lrn(node: NodeInfo) -> Cost:
    size = node.attr("size")
    # x / (bias + alpha/size * sum_window x^2)^beta per element: square 1 (shared by windows),
    # window sum size-1, mul 1, add 1, pow 1 (transcendental), div 1 = size + 4.
    # approximation: windows clipped at the channel edges are counted as full.
    n = node.outputs[0].size
    return Cost(other_flops=(size + 4) * n, transcendental=n)
