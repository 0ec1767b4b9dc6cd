"""Lowerings of the ops onnxruntime-genai's decoders use beyond the ONNX standard.

- SimplifiedLayerNormalization (ORT's, in the default domain) and the contrib
  SkipSimplifiedLayerNormalization: one `RMSNormalization` kernel (k_rms_norm.cpp), the skip sum
  an output of its own when the graph reads it;
- SkipLayerNormalization (the model builder's Phi-2, ORT's optimized BERT): the skip sum an
  Elementwise kernel, then the core's LayerNormalization;
- GroupQueryAttention: one kernel (k_attention.cpp), rotary, cache and attention together,
  with a local window (and the builder's sliding-window cache of W rows), softcap and sinks;
- MatMulNBits (4 bits): one kernel (k_nbits.cpp) on the packed weight (re-laid out here, still
  half a byte a value), dequantized as it multiplies (A in int8 at accuracy level 4);
- GatherBlockQuantized (uint8 data): one kernel (k_nbits.cpp) reading the packed table as the
  model lays it out (a tied embedding reads lm_head's weight, which MatMulNBits re-lays in a
  copy of its own) and dequantizing the picked rows;
- MoE: one kernel (k_moe.cpp) routing each token to its top k experts; QMoE the same kernel on
  its 4-bit experts laid out as MatMulNBits' weights, or its 8-bit ones dequantized here to
  float32 (4 bytes a weight where the model keeps 1).
"""

from __future__ import annotations

import numpy as np

from ...analyzer.ir import NodeInfo, TensorInfo
from .lower import FLOAT, Instr, Kernel, Lowering, Unsupported, _axis, _require_float

# The contrib ops lowered here (their domain is com.microsoft).
CONTRIB_OPS = frozenset({"SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
                         "GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized", "MoE",
                         "QMoE"})


def _name(node: NodeInfo, i: int) -> str | None:
    t = node.input(i)
    return t.name if t is not None and t.name else None


def _norm_outputs(node: NodeInfo, low: Lowering, x: str, skip: bool) -> tuple[str, list[str]]:
    """A norm's output y and, for a Skip norm, its sum x + skip (output 3, x's shape) where the
    graph reads it; the mean and inv_std_var outputs ([..., 1]) are refused by name."""
    y, *rest = [t.name for t in node.outputs]  # the graph keeps the named outputs only
    sums = [n for n in rest if skip and low.shape(n) == low.shape(x)]
    if len(sums) != len(rest):
        raise Unsupported(f"{node.op_type}'s mean / inv_std_var outputs")
    return y, sums


def rms_norm(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """y = x / sqrt(mean(x^2) + eps) * gamma (Skip: over x + skip (+ bias), that sum output 3)."""
    skip = node.op_type == "SkipSimplifiedLayerNormalization"
    _require_float(node, *node.inputs[:4 if skip else 2])
    x = node.inputs[0].name
    y, sums = _norm_outputs(node, low, x, skip)
    if skip:
        ins, axis = [x, _name(node, 2), _name(node, 1), _name(node, 3)], len(low.shape(x)) - 1
    else:
        ins, axis = [x, _name(node, 1)], _axis(int(node.attr("axis", -1)), len(low.shape(x)))
    kept = [y, *sums]
    return [Kernel("RMSNormalization", ins, kept, {"axis": [axis]},
                   {"epsilon": [float(node.attr("epsilon", 1e-5))]})]


def skip_layer_norm(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """s = x + skip (+ bias), y = LayerNormalization(s, gamma, beta) over the last axis
    (inputs x, skip, gamma, beta, bias; outputs y, mean, inv_std_var, s): the sum one Elementwise
    kernel, written to output 3 when the graph reads it, else to a scratch tensor."""
    _require_float(node, *node.inputs[:5])
    x = node.inputs[0].name
    y, sums = _norm_outputs(node, low, x, skip=True)
    shape = low.shape(x)
    total = sums[0] if sums else f"{y}::skip_sum"
    if not sums:
        low.twins[total] = TensorInfo(total, FLOAT, shape)
    add = Kernel("Elementwise", [], [total])
    bias = _name(node, 4)
    add.program.append(Instr("Add", 1 if bias else 0, (add.operand(x),
                                                      add.operand(_name(node, 1)))))
    if bias:
        add.program.append(Instr("Add", 0, (1, add.operand(bias))))
    return [add, Kernel("LayerNormalization", [total, _name(node, 2), _name(node, 3)], [y],
                        {"axis": [len(shape) - 1]},
                        {"epsilon": [float(node.attr("epsilon", 1e-12))]})]


def group_query_attention(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """One kernel, with a local window (`local_window_size`, and a `sliding_window_cache` of
    that many rows: the kernel refuses a wider one), softcap and a sink per head (`head_sink`,
    or `smooth_softmax`'s zero);
    what it does not implement (the inputs position_ids, attention_bias and past them;
    output_qk) is refused by name."""
    extra = [i for i in (9, 10, *range(12, len(node.inputs))) if _name(node, i)]
    if extra:
        raise Unsupported(f"GroupQueryAttention's input {extra[0]} (position_ids, "
                          "attention_bias, k/v scales, q/k norms)")
    outs = [t.name for t in node.outputs]  # the graph keeps the named outputs only
    if int(node.attr("qk_output", 0)) or len(outs) != 3:
        raise Unsupported("GroupQueryAttention without both present outputs, or with output_qk")
    _require_float(node, *node.inputs[:5], node.input(11))
    ints = {name: [int(node.attr(name, default))]
            for name, default in (("num_heads", None), ("kv_num_heads", None), ("do_rotary", 0),
                                  ("rotary_interleaved", 0), ("local_window_size", -1),
                                  ("sliding_window_cache", 0), ("smooth_softmax", 0))}
    floats = {"scale": [float(node.attr("scale", 0.0))],
              "softcap": [float(node.attr("softcap", 0.0))]}
    rotary = bool(ints["do_rotary"][0])
    ins = [_name(node, i) for i in range(6)] + (
        [_name(node, 7), _name(node, 8)] if rotary else [None, None]) + [_name(node, 11)]
    return [Kernel("GroupQueryAttention", ins, outs, ints, floats)]


def matmul_nbits(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """One MatMulNBits kernel (k_nbits.cpp) on the packed 4-bit weight, laid out by block and
    byte with the columns inner, with each block's scale and zero point ([blocks, N]; zero
    points packed like the weight (uint8), float, or absent: 8), w = (q - zero) · scale. At
    accuracy level 4 it quantizes A to int8 as ONNX Runtime does."""
    if _name(node, 4):
        raise Unsupported("MatMulNBits with g_idx")
    bits = int(node.attr("bits", 4))
    if bits != 4:
        raise Unsupported(f"MatMulNBits with bits={bits} (only 4)")
    _require_float(node, node.inputs[0])
    k_dim, n_dim, block = int(node.attr("K")), int(node.attr("N")), int(node.attr("block_size"))
    blocks = -(-k_dim // block)
    packed = low.need_const(node, 1, "MatMulNBits' weight")
    scales = low.need_const(node, 2, "MatMulNBits' scales")
    zeros = low.need_const(node, 3, "MatMulNBits' zero points")
    if packed is None or packed.dtype != np.uint8 or packed.size != n_dim * blocks * (block // 2):
        raise Unsupported(f"MatMulNBits' weight is not uint8 [{n_dim}, {blocks}, {block // 2}]")
    if scales is None or scales.size != n_dim * blocks:
        raise Unsupported(f"MatMulNBits' scales are not {n_dim} x {blocks}")
    scale = np.asarray(scales, dtype=np.float32).reshape(n_dim, blocks)
    integral = zeros is None or zeros.dtype == np.uint8  # ORT's int8 path needs whole zeros
    if zeros is not None and zeros.size != n_dim * (-(-blocks // 2) if integral else blocks):
        raise Unsupported(f"MatMulNBits' zero points {list(zeros.shape)} for {n_dim} x {blocks}")
    if zeros is None:
        zero = np.full((n_dim, blocks), 8.0, dtype=np.float32)
    elif zeros.dtype == np.uint8:
        zero = _unpack(zeros.reshape(n_dim, -1), bits)[:, :blocks].astype(np.float32)
    else:
        zero = np.asarray(zeros, dtype=np.float32).reshape(n_dim, blocks)
    # By block and byte, columns inner (k_nbits.cpp): [N, blocks, block / 2] -> [blocks, .., N].
    by_block = packed.reshape(n_dim, blocks, block // 2).transpose(1, 2, 0)
    ins = [node.inputs[0].name,
           low.add_const(f"{node.name}::packed", np.ascontiguousarray(by_block)),
           low.add_const(f"{node.name}::scales", np.ascontiguousarray(scale.T)),
           low.add_const(f"{node.name}::zeros", np.ascontiguousarray(zero.T)),
           _name(node, 5)]
    return [Kernel("MatMulNBits", ins, [node.outputs[0].name],
                   {"K": [k_dim], "N": [n_dim], "block_size": [block],
                    "accuracy_level": [int(node.attr("accuracy_level", 0)) if integral else 0]})]


def gather_block_quantized(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """One GatherBlockQuantized kernel on a constant uint8 table, gathered along axis 0 and
    quantized in blocks along its last axis (ORT's only layout for uint8 data), float32 scales;
    zero points (packed like the data) become floats of the scales' shape, absent: 2^(bits - 1)."""
    data = low.need_const(node, 0, "GatherBlockQuantized's data")
    scales = low.need_const(node, 2, "GatherBlockQuantized's scales")
    zeros = low.need_const(node, 3, "GatherBlockQuantized's zero points")
    bits = int(node.attr("bits", 4))
    if data is None or data.dtype != np.uint8:
        raise Unsupported("GatherBlockQuantized's data is not uint8")
    rank = data.ndim
    gather_axis, quantize_axis = (int(node.attr(a, d)) for a, d in (("gather_axis", 0),
                                                                      ("quantize_axis", 1)))
    if gather_axis % rank != 0 or quantize_axis % rank != rank - 1:
        raise Unsupported("GatherBlockQuantized on uint8 data gathers along axis 0 and "
                          "quantizes along the last")
    if scales is None or scales.dtype != np.float32 or scales.ndim != rank:
        raise Unsupported("GatherBlockQuantized's scales are not float32 of the data's rank")
    ins = [low.add_const(f"{node.name}::data", np.ascontiguousarray(data)),
           node.inputs[1].name,
           low.add_const(f"{node.name}::scales", np.ascontiguousarray(scales))]
    if zeros is not None:
        blocks = scales.shape[-1]
        if zeros.dtype != np.uint8 or zeros.shape[-1] != -(-blocks * bits // 8):
            raise Unsupported(f"GatherBlockQuantized's zero points {list(zeros.shape)} for "
                              f"{blocks} blocks of {bits} bits")
        zero = _unpack(zeros, bits)[..., :blocks].astype(np.float32)
        ins.append(low.add_const(f"{node.name}::zeros", np.ascontiguousarray(zero)))
    return [Kernel("GatherBlockQuantized", ins, [node.outputs[0].name],
                   {"bits": [bits], "block_size": [int(node.attr("block_size", 128))]})]


# MoE's activation_type as k_moe.cpp numbers it.
_MOE_ACTIVATIONS = {"relu": 0, "gelu": 1, "silu": 2, "identity": 3, "swiglu": 4}


def moe(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """One MoE kernel: input, router_probs, fc1 [E, F·I, H] and fc2 [E, H, I] weights (out
    rows of in values, ORT's layout; the legacy transposed one is refused) with their biases.
    What ORT's CPU kernel does not run either is refused by name: fc3, the sparse mixer,
    SwiGLU halves not interleaved (swiglu_fusion != 1)."""
    _require_float(node, *node.inputs[:6])
    _check_experts(node, node.inputs[2].dims, node.inputs[4].dims)
    return [_moe_kernel(node, [_name(node, i) for i in range(6)], fc3_at=6)]


def qmoe(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """QMoE as MoE's kernel: each weight (q - 2^(bits - 1)) · scale, q unsigned (4 bits: two a
    byte, low nibble first), the scale per output row [E, N] or per `block_size` values of a
    row [E, N, blocks]. 4-bit experts stay packed, laid out per expert as MatMulNBits' weight
    (`_nbits_experts`: a row's scale one block of the whole row); 8-bit ones by rows are
    dequantized to float32 here; zero points are refused, and 8 bits in blocks (ORT 1.31's
    CPU kernel differs there from that dequantization by 1%)."""
    _require_float(node, node.inputs[0], node.inputs[1], node.input(4), node.input(7))
    block = int(node.attr("block_size", 0))
    bits = [int(node.attr(f"fc{fc}_expert_weight_bits", node.attr("expert_weight_bits", 4)))
            for fc in (1, 2)]
    if any(b not in (4, 8) or (b == 8 and block) for b in bits) or bits[0] != bits[1]:
        raise Unsupported(f"QMoE with {'/'.join(map(str, bits))}-bit experts"
                          f"{' in blocks' if block else ''} (4 bits, or 8 by rows)")
    fcs = []
    for fc, (q_at, scale_at) in ((1, (2, 3)), (2, (5, 6))):
        q = low.need_const(node, q_at, f"QMoE's fc{fc} weight")
        scales = low.need_const(node, scale_at, f"QMoE's fc{fc} scales")
        if q is None or q.dtype != np.uint8 or q.ndim != 3 or scales is None:
            raise Unsupported(f"QMoE's fc{fc} weight is not a uint8 [E, N, K·{bits[0]}/8] "
                              "constant")
        blocks = -(-q.shape[-1] * 8 // bits[0] // block) if block else 1
        if scales.shape[:2] != q.shape[:2] or scales.size != q.shape[0] * q.shape[1] * blocks:
            raise Unsupported(f"QMoE's fc{fc} scales {list(scales.shape)} for its weight "
                              f"{list(q.shape)}")
        fcs.append((q, np.asarray(scales, np.float32).reshape(*q.shape[:2], blocks)))
    _check_experts(node, (*fcs[0][0].shape[:2], fcs[0][0].shape[2] * 8 // bits[0]),
                   (*fcs[1][0].shape[:2], fcs[1][0].shape[2] * 8 // bits[0]))
    if bits[0] == 8:
        weights = [(_unpack(q, 8).astype(np.float32) - 128) * scale for q, scale in fcs]
        fc1, fc2 = (low.add_const(f"{node.name}::fc{i}", np.ascontiguousarray(w))
                    for i, w in ((1, weights[0]), (2, weights[1])))
        return [_moe_kernel(node, [_name(node, 0), _name(node, 1), fc1, _name(node, 4), fc2,
                                   _name(node, 7)], fc3_at=8)]
    ins = [_name(node, 0), _name(node, 1)]
    for fc, (q, scale) in zip((1, 2), fcs, strict=True):
        packed, zeros = _nbits_experts(q, scale)
        ins += [low.add_const(f"{node.name}::fc{fc}_packed", packed),
                low.add_const(f"{node.name}::fc{fc}_scales",
                              np.ascontiguousarray(scale.transpose(0, 2, 1))),
                low.add_const(f"{node.name}::fc{fc}_zeros", zeros), _name(node, 4 + 3 * (fc - 1))]
    kernel = _moe_kernel(node, ins, fc3_at=8)
    kernel.ints.update(bits=[4], inter=[fcs[1][0].shape[2] * 2],
                       block_size=[fcs[0][0].shape[2] * 2 // fcs[0][1].shape[2],
                                   fcs[1][0].shape[2] * 2 // fcs[1][1].shape[2]])
    return [kernel]


def _nbits_experts(q: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E experts' 4-bit [E, N, K / 2] bytes in `blocks` blocks a row (scale [E, N, blocks])
    laid out as MatMulNBits' (k_nbits.cpp): [E, blocks, block / 2, N], the last block padded
    with zero bytes (the kernel reads only K values), and their zero points (8) [E, blocks, N]."""
    experts, n, half = q.shape
    blocks = scale.shape[-1]
    per_block = -(-half // blocks)
    padded = np.zeros((experts, n, blocks * per_block), np.uint8)
    padded[..., :half] = q
    by_block = padded.reshape(experts, n, blocks, per_block).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(by_block), np.full((experts, blocks, n), 8.0, np.float32)


def _check_experts(node: NodeInfo, fc1: tuple[int, ...], fc2: tuple[int, ...]) -> None:
    """fc1's and fc2's shapes against ORT's layout (out rows of in values)."""
    hidden = node.inputs[0].dims[-1]
    experts, inter = fc2[0], fc2[-1]
    fusion = 2 if node.attr("activation_type", "relu") == "swiglu" else 1
    if list(fc1) != [experts, fusion * inter, hidden] or list(fc2) != [experts, hidden, inter]:
        raise Unsupported(f"{node.op_type}'s expert weights fc1 {list(fc1)}, fc2 {list(fc2)} "
                          f"(ORT's layout: [E, {fusion}·I, H], [E, H, I])")


def _moe_kernel(node: NodeInfo, ins: list[str | None], fc3_at: int) -> Kernel:
    activation = node.attr("activation_type", "relu")
    if activation not in _MOE_ACTIVATIONS:
        raise Unsupported(f"{node.op_type} with activation_type {activation!r}")
    fc3 = [i for i in range(fc3_at, len(node.inputs)) if _name(node, i)]
    if fc3:
        raise Unsupported(f"{node.op_type}'s input {fc3[0]} (fc3 or zero points)")
    if int(node.attr("use_sparse_mixer", 0)):
        raise Unsupported(f"{node.op_type} with use_sparse_mixer")
    if activation == "swiglu" and int(node.attr("swiglu_fusion", 0)) != 1:
        raise Unsupported(f"{node.op_type}'s SwiGLU with swiglu_fusion != 1 (interleaved)")
    ints = {"k": [int(node.attr("k", 1))], "activation": [_MOE_ACTIVATIONS[activation]],
            "normalize_routing_weights": [int(node.attr("normalize_routing_weights", 0))]}
    floats = {"activation_alpha": [float(node.attr("activation_alpha", 1.0))],
              "activation_beta": [float(node.attr("activation_beta", 0.0))],
              "swiglu_limit": [float(node.attr("swiglu_limit", float("inf")))]}
    return Kernel("MoE", ins, [node.outputs[0].name], ints, floats)


def _unpack(data: np.ndarray, bits: int) -> np.ndarray:
    """Each byte's `bits`-bit fields, lowest first, along the last axis."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    fields = (data[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return fields.reshape(*data.shape[:-1], -1)
