"""Fused attention: softmax(Q K^T * scale + mask) V, as ONNX and ONNX Runtime spell it.

Every form reduces to `scaled_dot_product`: `rows` query rows (batch x query heads x query
tokens) each attending to `length` keys (past plus new tokens), Q K^T over the head size D and
P V over the value head size Dv. Grouped-query heads share K and V, but each query head does its
own products, so the MACs count query heads.

approximation: a causal mask (`is_causal`, `unidirectional`, GroupQueryAttention) and a local
window are counted as the full S x L score matrix with a mask add: ONNX Runtime's CPU kernels
compute the full product and mask it; a kernel that skips the masked half does about half.
"""

from __future__ import annotations

import math

from ..ir import NodeInfo, TensorInfo
from .activation import softmax_rows
from .base import MS, Cost, register
from .norm import normalize


def scaled_dot_product(rows: int, length: int, head: int, head_v: int, *, masked: bool,
                       capped: bool = False) -> Cost:
    """`rows` query rows over `length` keys: Q K^T D MACs and P V Dv MACs per score.

    Per score: 1 multiply by scale; 1 add of the mask when one is given (mask, bias and
    causality combine into one additive term); softcap*tanh(x/softcap) 3 FLOPs (1
    transcendental) when capped; then the softmax of each row.
    """
    scores = rows * length
    epilogue = Cost(other_flops=scores * (1 + masked)) + softcap_scores(scores * capped)
    return Cost(macs=scores * (head + head_v)) + epilogue + softmax_rows(rows, length)


def softcap_scores(scores: int) -> Cost:
    """softcap·tanh(x / softcap) on `scores` scores: a divide, a multiply and a tanh each (3
    FLOPs, 1 transcendental)."""
    return Cost(other_flops=3 * scores, transcendental=scores)


def rotate(elements: int) -> Cost:
    """Rotary embedding of `elements` values: each pair (x1, x2) becomes x1*cos - x2*sin,
    x1*sin + x2*cos, 4 multiplies and 2 adds per pair: 3 FLOPs per rotated element."""
    return Cost(other_flops=3 * elements)


@register("Attention", family="attention")
def attention(node: NodeInfo) -> Cost:
    """ONNX Attention (opset 23). Q is [B, Hq, Sq, D], or [B, Sq, Hq*D] with `q_num_heads`;
    K [B, Hkv, Skv, D] or [B, Skv, Hkv*D]; V likewise with head size Dv (`kv_num_heads` for the
    3-D forms); past_key [B, Hkv, P, D] makes the attended length L = P + Skv."""
    q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
    past = node.input(4)
    q_heads = node.attr("q_num_heads") if q.rank == 3 else 1
    kv_heads = node.attr("kv_num_heads") if v.rank == 3 else 1
    rows = math.prod(q.dims[:-1]) * q_heads  # B * Hq * Sq query rows
    head, head_v = q.dims[-1] // q_heads, v.dims[-1] // kv_heads  # D, Dv
    length = k.dims[-2 if k.rank == 4 else 1] + (past.dims[-2] if past is not None else 0)
    masked = node.input(3) is not None or bool(node.attr("is_causal", 0))
    return scaled_dot_product(rows, length, head, head_v, masked=masked,
                              capped=node.attr("softcap", 0.0) != 0.0)


def _packed_attention(node: NodeInfo, *, mask_at: tuple[int, ...], past_at: int,
                      rescale: bool) -> Cost:
    """com.microsoft Attention / QAttention: input [B, S, In] times weights [In, Hq+Hk+Hv]
    (plus bias) gives Q, K and V; past [2, B, N, P, D] makes L = P + S."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    batch, seq, _ = x.dims
    heads = node.attr("num_heads")
    hq, hv = (node.attr("qkv_hidden_sizes") or [w.dims[1] // 3] * 3)[0], y.dims[-1]
    projected = batch * seq * w.dims[1]
    # Projection: B*S*In*(Hq+Hk+Hv) MACs; 1 add per projected value with a bias; QAttention
    # rescales its int32 accumulators to float first (1 multiply by input_scale*weight_scale).
    projection = Cost(macs=projected * w.dims[0],
                      other_flops=projected * ((node.input(2) is not None) + rescale))
    past = node.input(past_at)
    length = seq + (past.dims[3] if past is not None else 0)
    masked = (any(node.input(i) is not None for i in mask_at)
              or bool(node.attr("unidirectional", 0)))
    return projection + scaled_dot_product(batch * heads * seq, length, hq // heads, hv // heads,
                                           masked=masked)


@register("Attention", family="attention", domain=MS)
def ms_attention(node: NodeInfo) -> Cost:
    # inputs: input, weights, bias, mask_index, past, attention_bias, past_sequence_length
    return _packed_attention(node, mask_at=(3, 5), past_at=4, rescale=False)


@register("QAttention", family="attention", domain=MS)
def q_attention(node: NodeInfo) -> Cost:
    # inputs: input, weight, bias, input_scale, weight_scale, mask_index, input_zero_point,
    # weight_zero_point, past
    return _packed_attention(node, mask_at=(5,), past_at=8, rescale=True)


@register("MultiHeadAttention", family="attention", domain=MS)
def multi_head_attention(node: NodeInfo) -> Cost:
    """query [B, S, Hq] or packed QKV [B, S, N, 3, D] (no key); key [B, L, Hk], packed KV
    [B, L, N, 2, D] (no value), or [B, N, L, D] already projected (no past appended); bias
    [Hq+Hk+Hv]; key_padding_mask (4), attention_bias (5); past_key [B, N, P, D] (6)."""
    q, k, y = node.inputs[0], node.input(1), node.outputs[0]
    heads = node.attr("num_heads")
    batch, seq = q.dims[0], q.dims[1]
    hq = q.dims[2] if q.rank == 3 else q.dims[2] * q.dims[4]
    hv = y.dims[-1]
    new = seq if k is None else k.dims[2] if k.rank == 4 else k.dims[1]
    past = node.input(6) if k is None or k.rank != 4 else None
    length = new + (past.dims[2] if past is not None else 0)
    bias = node.input(3)
    # Bias: 1 add per new Q value (B*S*Hq) and per new K and V value (B*L_new*(Hk+Hv)).
    bias_adds = batch * (seq * hq + new * (bias.size - hq)) if bias is not None else 0
    masked = (node.input(4) is not None or node.input(5) is not None
              or bool(node.attr("unidirectional", 0)))
    return Cost(other_flops=bias_adds) + scaled_dot_product(
        batch * heads * seq, length, hq // heads, hv // heads, masked=masked)


@register("GroupQueryAttention", family="attention", domain=MS)
def group_query_attention(node: NodeInfo) -> Cost:
    """query [B, S, N*D] (or packed [B, S, (N + 2*Nkv)*D] without key), key [B, Skv, Nkv*D]
    (1), past_key [B, Nkv, P, D] (3), cos_cache [max, R/2] (7), attention_bias (10),
    q_norm_weight (14); output [B, S, N*D]. The attended length is L = P + Skv (past plus new
    tokens; approximation: a past buffer shared with present is counted at its full length).
    With `sliding_window_cache` the past is a buffer of fixed capacity and each query attends
    at most `local_window_size` = W keys: L = min(W, P + Skv) (a decode step's W measured
    against ORT 1.31; approximation: a prefill's first W - 1 queries attend fewer).
    Causal unless `causal` = 0. `do_rotary` rotates R of each head's D values of the new Q and
    K (R = D without a cos_cache); q/k_norm_weight first RMS-normalizes each new Q and K head
    (4D + 3 per head, `norm.rms_norm`)."""
    q, k, y = node.inputs[0], node.input(1), node.outputs[0]
    heads, kv_heads = node.attr("num_heads"), node.attr("kv_num_heads")
    batch, seq = q.dims[0], q.dims[1]
    head = y.dims[-1] // heads
    past = node.input(3)
    new = k.dims[1] if k is not None else seq
    length = new + (past.dims[2] if past is not None else 0)
    if node.attr("sliding_window_cache", 0) and node.attr("local_window_size", -1) > 0:
        length = min(length, node.attr("local_window_size"))
    masked = bool(node.attr("causal", 1)) or node.input(10) is not None
    cost = scaled_dot_product(batch * heads * seq, length, head, head, masked=masked,
                              capped=node.attr("softcap", 0.0) != 0.0)
    new_heads = batch * (seq * heads + new * kv_heads)  # new Q heads and new K heads
    if node.input(14) is not None:
        cost = cost + normalize(new_heads, head, center=False, affine=1)
    if node.attr("do_rotary", 0):
        cos = node.input(7)
        cost = cost + rotate(new_heads * (2 * cos.dims[-1] if cos is not None else head))
    return cost


def _rotary(node: NodeInfo, cos: TensorInfo) -> Cost:
    """x [B, S, N*D] (with num_heads) or [B, N, S, D]; cos_cache [..., R/2]: R of each head's D
    values rotated (rotary_embedding_dim), the rest copied."""
    x = node.inputs[0]
    rotated = 2 * cos.dims[-1]
    heads = node.attr("num_heads", 0)
    head = x.dims[-1] if x.rank == 4 else x.dims[-1] // heads if heads else rotated
    return rotate(x.size // head * rotated)


@register("RotaryEmbedding", family="attention")
def rotary_embedding(node: NodeInfo) -> Cost:
    # ONNX (opset 23): X, cos_cache, sin_cache, position_ids
    return _rotary(node, node.inputs[1])


@register("RotaryEmbedding", family="attention", domain=MS)
def ms_rotary_embedding(node: NodeInfo) -> Cost:
    # com.microsoft: input, position_ids, cos_cache, sin_cache
    return _rotary(node, node.inputs[2])
