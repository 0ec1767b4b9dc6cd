"""ONNX Runtime's mixture-of-experts ops, MoE and its weight-quantized QMoE (com.microsoft), as
onnxruntime-genai's builder writes gpt-oss, Phi-MoE and Qwen-MoE.

input [T, H] or [B, S, H] (T = B·S token rows), router_probs [T, E] (logits), expert weights
fc1 [E, F·I, H], fc2 [E, H, I], fc3 [E, I, H] (optional: the gate of an unfused SwiGLU);
F = 2 when `swiglu_fusion` packs SwiGLU's gate and linear halves into fc1, else 1. QMoE stores
the same matrices at `expert_weight_bits` (fc1/2/3_expert_weight_bits override) in uint8 bytes,
with a scale per row or per `block_size` of K.

Each token runs only its top `k` experts: the MACs are those k experts' products, the weights
read are every expert's (the whole table is an input; a batch of tokens touches most of it):

    MACs / token = k · (H·F·I  [fc1]  +  H·I  [fc3, when given]  +  I·H  [fc2])

Other FLOPs per token: the router's softmax over E (5E - 2, E exp); the top-k picks, k passes
of E - 1 compares; with `normalize_routing_weights` the k weights' sum and k divides (2k - 1);
per picked expert the biases (F·I, H and I adds when given) and the activation of its I values
(`_ACTIVATION`); the weighted sum of the k expert outputs, a multiply and an add per value
(2·k·H). approximation: QMoE's dequantization (2 FLOPs per weight) is charged for the picked
experts' weights only, once per token, as a kernel that dequantizes per use does.
"""

from __future__ import annotations

import onnx

from ..ir import NodeInfo, TensorInfo
from .base import MS, Cost, register

# FLOPs and transcendental per activated inter value. relu: 1 compare; gelu (exact): the 5
# FLOPs + 1 erf of `activation.gelu`; silu x·sigmoid(x): sigmoid + 1 mul; identity: none;
# swiglu G·sigmoid(alpha·G)·(L + beta): mul, sigmoid, mul, add, mul = 5 FLOPs, 1 sigmoid, and
# 3 compares when `swiglu_limit` clamps G (max) and L (min and max).
_ACTIVATION = {"relu": (1, 0), "gelu": (5, 1), "silu": (2, 1), "identity": (0, 0),
               "swiglu": (5, 1)}


def moe_layout(node: NodeInfo) -> tuple[int, int, int, int, int]:
    """Token rows T, hidden H, experts E, inter I and fc1's fusion F."""
    x, fc1 = node.inputs[0], node.inputs[2]
    swiglu = node.attr("activation_type", "relu") == "swiglu"
    fusion = 2 if swiglu and node.attr("swiglu_fusion", 0) in (1, 2) else 1
    return x.size // x.dims[-1], x.dims[-1], fc1.dims[0], fc1.dims[1] // fusion, fusion


def _moe(node: NodeInfo, *, fc3: TensorInfo | None, biases: tuple[int, ...],
         dequantized: int = 0) -> Cost:
    tokens, hidden, experts, inter, fusion = moe_layout(node)
    k = node.attr("k", 1)
    act = node.attr("activation_type", "relu")  # one of _ACTIVATION (validate._moe_shapes)
    act_flops, act_transcendental = _ACTIVATION[act]
    if act == "swiglu" and node.attr("swiglu_limit", None) is not None:
        act_flops += 3
    fc3_macs = hidden * inter if fc3 is not None else 0
    bias_adds = sum(width for width, at in zip((fusion * inter, hidden, inter), biases,
                                               strict=True) if node.input(at) is not None)
    per_expert = Cost(macs=hidden * fusion * inter + fc3_macs + inter * hidden,
                      other_flops=bias_adds + act_flops * inter + dequantized,
                      transcendental=act_transcendental * inter)
    normalize = 2 * k - 1 if node.attr("normalize_routing_weights", 0) else 0
    routing = Cost(other_flops=5 * experts - 2 + k * (experts - 1) + normalize + 2 * k * hidden,
                   transcendental=experts)
    picked = Cost(k * per_expert.macs, k * per_expert.other_flops, k * per_expert.transcendental)
    one = routing + picked
    return Cost(tokens * one.macs, tokens * one.other_flops, tokens * one.transcendental)


@register("MoE", family="matmul", domain=MS, operands=lambda n: (n.inputs[0], n.inputs[2]))
def moe(node: NodeInfo) -> Cost:
    # inputs: input, router_probs, fc1 (2), fc1_bias (3), fc2 (4), fc2_bias (5), fc3 (6),
    # fc3_bias (7)
    return _moe(node, fc3=node.input(6), biases=(3, 5, 7))


def _bits(node: NodeInfo, fc: int) -> int:
    return node.attr(f"fc{fc}_expert_weight_bits", node.attr("expert_weight_bits", 4))


def _q_operands(node: NodeInfo) -> tuple[TensorInfo | int, ...]:
    # accuracy_level 4: activations quantized to int8 (MatMulNBits' meaning); else the weights
    # are dequantized to the activations' float type.
    if node.attr("accuracy_level", 0) == 4:
        return (onnx.TensorProto.INT8,)
    return (node.inputs[0],)


def _q_parameters(node: NodeInfo) -> dict[int, int]:
    # fc1 (2), fc2 (5), fc3 (8): bytes packing 8 / bits weights each (their shapes' last dim
    # is K · bits / 8).
    packed = {}
    for fc, at in ((1, 2), (2, 5), (3, 8)):
        t = node.input(at)
        if t is not None:
            packed[at] = t.size * 8 // _bits(node, fc)
    return packed


@register("QMoE", family="matmul", domain=MS, operands=_q_operands, packed=_q_parameters)
def qmoe(node: NodeInfo) -> Cost:
    # inputs: input, router_probs, fc1 (2), fc1_scales (3), fc1_bias (4), fc2 (5), fc2_scales
    # (6), fc2_bias (7), fc3 (8), fc3_scales (9), fc3_bias (10), ...; fc1's rows F·I, its K is
    # H (the stored last dim is H · bits / 8).
    _, hidden, _, inter, fusion = moe_layout(node)
    fc3 = node.input(8)
    weights = hidden * fusion * inter + inter * hidden + (inter * hidden if fc3 else 0)
    return _moe(node, fc3=fc3, biases=(4, 7, 10), dequantized=2 * weights)
