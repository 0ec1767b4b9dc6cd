"""Fused attention: the ONNX Attention op (opset 23), softmax(Q K^T * scale + mask) V.

Q is [B, Hq, Sq, D], or [B, Sq, Hq*D] with `q_num_heads`; K [B, Hkv, Skv, D] or
[B, Skv, Hkv*D]; V likewise with head size Dv (`kv_num_heads` for the 3-D forms); past_key
[B, Hkv, P, D] makes the attended length L = P + Skv. Grouped-query heads share K and V but
each query head does its own products.
"""

from __future__ import annotations

import math

from ..ir import NodeInfo
from .activation import softmax_rows
from .base import Cost, register


@register("Attention", family="attention")
def attention(node: NodeInfo) -> Cost:
    q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
    past = node.input(4)
    q_heads = node.attr("q_num_heads") if q.rank == 3 else 1
    kv_heads = node.attr("kv_num_heads") if v.rank == 3 else 1
    rows = math.prod(q.dims[:-1]) * q_heads  # B * Hq * Sq query rows
    head, head_v = q.dims[-1] // q_heads, v.dims[-1] // kv_heads  # D, Dv
    length = k.dims[-2 if k.rank == 4 else 1] + (past.dims[-2] if past is not None else 0)
    scores = rows * length
    # MACs: Q K^T is D per score, P V is Dv per score.
    macs = scores * (head + head_v)
    # Per score: 1 multiply by scale; 1 add of the mask when attn_mask or is_causal is given;
    # softcap*tanh(x/softcap) 3 FLOPs (1 transcendental) when softcap != 0; then the softmax.
    masked = node.input(3) is not None or bool(node.attr("is_causal", 0))
    capped = node.attr("softcap", 0.0) != 0.0
    epilogue = Cost(other_flops=scores * (1 + masked + 3 * capped),
                    transcendental=scores * capped)
    return Cost(macs=macs) + epilogue + softmax_rows(rows, length)
