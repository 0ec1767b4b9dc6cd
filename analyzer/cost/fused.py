"""ONNX Runtime's fused forms of standard ops, as its graph optimizer writes them into saved
models: FusedConv, NhwcConv, FusedGemm, FusedMatMul, BiasAdd, BiasSoftmax,
EmbedLayerNormalization. Each is the sum of the standard ops it stands for, on their
formulas."""

from __future__ import annotations

from ..ir import NodeInfo
from .activation import ACTIVATIONS, softmax_rows
from .base import MS, Cost, register
from .common import along_axis
from .conv import conv_cost
from .matmul import gemm
from .norm import normalize

# The `activation` attribute's ops: (FLOPs, transcendental) per element, as in `activation`;
# Tanh one special function; Clip a min and a max.
_EPILOGUES = {**ACTIVATIONS, "Tanh": (1, 1), "Clip": (2, 0)}


def _activation(node: NodeInfo) -> Cost:
    """The fused `activation` on every output element (none: nothing)."""
    name = node.attr("activation")
    if not name:
        return Cost()
    flops, transcendental = _EPILOGUES.get(name, (1, 0))  # approximation: an unlisted one as 1
    n = node.outputs[0].size
    return Cost(other_flops=flops * n, transcendental=transcendental * n)


@register("FusedConv", family="fused", domain=MS)
def fused_conv(node: NodeInfo) -> Cost:
    # X, W, B, Z: Conv (+ bias), + Z (a residual, 1 add per output when given), activation.
    z = node.outputs[0].size if node.input(3) is not None else 0
    return conv_cost(node, 1, 2) + Cost(other_flops=z) + _activation(node)


@register("NhwcConv", family="fused", domain=MS)
def nhwc_conv(node: NodeInfo) -> Cost:
    # Conv in channels-last layout: the same MACs (output size x window), bias B.
    return conv_cost(node, 1, 2)


@register("FusedGemm", family="fused", domain=MS)
def fused_gemm(node: NodeInfo) -> Cost:
    return gemm(node) + _activation(node)


@register("FusedMatMul", family="fused", domain=MS)
def fused_matmul(node: NodeInfo) -> Cost:
    # A [..., M, K] (transA: [..., K, M]) x B: K per output element; alpha != 1: 1 multiply per
    # output. approximation: transBatchA/B move batch dims, not the contracted one.
    a, y = node.inputs[0], node.outputs[0]
    k = a.dims[-2] if node.attr("transA", 0) and a.rank >= 2 else a.dims[-1]
    return Cost(macs=y.size * k, other_flops=(node.attr("alpha", 1.0) != 1.0) * y.size)


@register("BiasAdd", family="fused", domain=MS)
def bias_add(node: NodeInfo) -> Cost:
    # X + bias + skip: 2 adds per element.
    return Cost(other_flops=2 * node.outputs[0].size)


@register("BiasSoftmax", family="fused", domain=MS)
def bias_softmax(node: NodeInfo) -> Cost:
    # data + bias (1 add per element), then Softmax along `axis` (default 1).
    rows, n = along_axis(node.inputs[0].dims, node.attr("axis", 1))
    return Cost(other_flops=rows * n) + softmax_rows(rows, n)


@register("EmbedLayerNormalization", family="fused", domain=MS)
def embed_layer_norm(node: NodeInfo) -> Cost:
    # Gathers (no arithmetic) of word, position and, with segment_ids, segment embeddings:
    # 1 or 2 adds per element of the [B, S, H] output, then LayerNorm over H with gamma and
    # beta (7H + 3 per token).
    y = node.outputs[0]
    rows, hidden = y.size // y.dims[-1], y.dims[-1]
    adds = 1 + (node.input(1) is not None)
    return Cost(other_flops=adds * y.size) + normalize(rows, hidden, center=True, affine=2)
