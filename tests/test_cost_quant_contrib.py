"""Cost formulas of ONNX Runtime's contrib ops (transformers, LLMs) and of the quantization
ops, against counts derived by hand in each test (never the formula's code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from onnxlens.analyzer.analysis import analyze
from onnxlens.analyzer.cost import Cost, lookup
from onnxlens.analyzer.ir import NodeInfo, TensorInfo

F32, U8, I8, I32 = (onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8, onnx.TensorProto.INT8,
                    onnx.TensorProto.INT32)
MS = "com.microsoft"
OMITTED = "omitted"


def cost(op: str, inputs: list[Any], outputs: list[Any], domain: str = MS, **attrs: Any
         ) -> tuple[int, int, int]:
    """(macs, other_flops, transcendental) of one node; a shape or OMITTED per input."""
    ins = tuple(None if s == OMITTED else TensorInfo(f"x{i}", F32, s)
                for i, s in enumerate(inputs))
    outs = tuple(TensorInfo(f"y{i}", F32, s) for i, s in enumerate(outputs))
    spec = lookup(op, domain)
    assert spec is not None, f"no formula for {domain}::{op}"
    c: Cost = spec.formula(NodeInfo(op.lower(), op, domain, attrs, ins, outs))
    return c.macs, c.other_flops, c.transcendental


def softmax(rows: int, n: int) -> tuple[int, int]:
    # max n-1, sub n, exp n, sum n-1, div n per row; n exp.
    return rows * (5 * n - 2), rows * n


# ---- attention ---------------------------------------------------------------------------------

def test_ms_attention_with_projection_and_past() -> None:
    # input [2,8,32] x weights [32,96] (+ bias [96]): Q, K, V of 32 each, 4 heads of 8;
    # past [2,2,4,6,8]: L = 6 + 8 = 14.
    c = cost("Attention", [(2, 8, 32), (32, 96), (96,), OMITTED, (2, 2, 4, 6, 8)],
             [(2, 8, 32), (2, 2, 4, 14, 8)], num_heads=4)
    proj_macs, proj_bias = 2 * 8 * 32 * 96, 2 * 8 * 96
    rows, scores = 2 * 4 * 8, 2 * 4 * 8 * 14
    sm_flops, sm_exp = softmax(rows, 14)
    # QK^T and PV: 8 + 8 MACs per score; 1 scale multiply per score, no mask.
    assert c == (proj_macs + scores * 16, proj_bias + scores + sm_flops, sm_exp)
    # A mask and unidirectional: one more add per score.
    c2 = cost("Attention", [(2, 8, 32), (32, 96), (96,), (2, 8)], [(2, 8, 32)], num_heads=4,
              unidirectional=1)
    scores = 2 * 4 * 8 * 8
    sm_flops, sm_exp = softmax(rows, 8)
    assert c2 == (proj_macs + scores * 16, proj_bias + 2 * scores + sm_flops, sm_exp)


def test_ms_attention_qkv_hidden_sizes() -> None:
    # Q, K 16 wide, V 32 wide, 2 heads: Dq 8, Dv 16; weights [24, 64]; no bias; L = S = 5.
    c = cost("Attention", [(1, 5, 24), (24, 64)], [(1, 5, 32)], num_heads=2,
             qkv_hidden_sizes=[16, 16, 32])
    rows = 2 * 5
    sm_flops, sm_exp = softmax(rows, 5)
    assert c == (5 * 24 * 64 + rows * 5 * (8 + 16), rows * 5 + sm_flops, sm_exp)


def test_q_attention() -> None:
    # As ms Attention, int8: + 1 rescale multiply per projected value; mask_index at 5.
    ins = [(1, 4, 16), (16, 48), (48,), (), (), (1, 4)]
    c = cost("QAttention", ins, [(1, 4, 16)], num_heads=2)
    rows, scores = 2 * 4, 2 * 4 * 4
    sm_flops, sm_exp = softmax(rows, 4)
    assert c == (4 * 16 * 48 + scores * 16, 4 * 48 * 2 + scores * 2 + sm_flops, sm_exp)


def test_multi_head_attention_forms() -> None:
    # query [2,6,16], key/value [2,10,16], 2 heads of 8, bias [48], past_key [2,2,3,8]:
    # L = 3 + 10 = 13; bias adds on new Q (2*6*16) and new K, V (2*10*32).
    ins = [(2, 6, 16), (2, 10, 16), (2, 10, 16), (48,), OMITTED, OMITTED, (2, 2, 3, 8),
           (2, 2, 3, 8)]
    c = cost("MultiHeadAttention", ins, [(2, 6, 16)], num_heads=2)
    rows = 2 * 2 * 6
    sm_flops, sm_exp = softmax(rows, 13)
    assert c == (rows * 13 * 16, 2 * 6 * 16 + 2 * 10 * 32 + rows * 13 + sm_flops, sm_exp)
    # Packed QKV [2,6,2,3,8] (no key): L = S = 6; key_padding_mask adds one add per score.
    c = cost("MultiHeadAttention", [(2, 6, 2, 3, 8), OMITTED, OMITTED, OMITTED, (2, 6)],
             [(2, 6, 16)], num_heads=2)
    sm_flops, sm_exp = softmax(rows, 6)
    assert c == (rows * 6 * 16, 2 * rows * 6 + sm_flops, sm_exp)
    # Key already [B, N, L, D] (cross attention, cached): no past appended.
    c = cost("MultiHeadAttention", [(2, 6, 16), (2, 2, 7, 8), (2, 2, 7, 8)], [(2, 6, 16)],
             num_heads=2)
    assert c[0] == rows * 7 * 16


def test_group_query_attention_counts_query_heads_over_past_plus_new() -> None:
    # 8 query heads, 2 KV heads, D = 16: query [1,4,128], key/value [1,4,32];
    # past [1,2,60,16]: L = 60 + 4 = 64. Causal: 1 mask add per score; scale 1.
    past = (1, 2, 60, 16)
    ins = [(1, 4, 128), (1, 4, 32), (1, 4, 32), past, past, (1,), ()]
    c = cost("GroupQueryAttention", ins, [(1, 4, 128), (1, 2, 64, 16), (1, 2, 64, 16)],
             num_heads=8, kv_num_heads=2)
    rows, scores = 8 * 4, 8 * 4 * 64
    sm_flops, sm_exp = softmax(rows, 64)
    assert c == (scores * 32, 2 * scores + sm_flops, sm_exp)
    # Decode: one new token over the same past, L = 61; the MACs follow KV length.
    dec = cost("GroupQueryAttention", [(1, 1, 128), (1, 1, 32), (1, 1, 32), past, past],
               [(1, 1, 128)], num_heads=8, kv_num_heads=2)
    assert dec[0] == 8 * 1 * 61 * 32
    # Prefill without past: L = S.
    pre = cost("GroupQueryAttention", [(1, 4, 128), (1, 4, 32), (1, 4, 32)], [(1, 4, 128)],
               num_heads=8, kv_num_heads=2)
    assert pre[0] == 8 * 4 * 4 * 32
    # do_rotary with cos_cache [max, 8]: 16 of each head's 16 values rotated, on the new
    # tokens of the 8 + 2 heads: 3 FLOPs per rotated value.
    rot = cost("GroupQueryAttention", [*ins, (128, 8), (128, 8)], [(1, 4, 128)],
               num_heads=8, kv_num_heads=2, do_rotary=1)
    assert rot[1] - c[1] == 3 * 4 * 10 * 16


def test_group_query_attention_options() -> None:
    # Bidirectional (causal=0): no mask add. query [1,4,64] 4 heads of 16, 2 KV heads, no past.
    ins = [(1, 4, 64), (1, 4, 32), (1, 4, 32)]
    rows, scores = 4 * 4, 4 * 4 * 4
    sm_flops, sm_exp = softmax(rows, 4)
    base = (scores * 32, scores + sm_flops, sm_exp)
    assert cost("GroupQueryAttention", ins, [(1, 4, 64)], num_heads=4, kv_num_heads=2,
                causal=0) == base
    # Q/K RMS norm per head (Qwen3): 4*4 Q heads + 4*2 K heads of 16, 4*16 + 3 each, 1 sqrt.
    c = cost("GroupQueryAttention", [*ins, *[OMITTED] * 11, (16,), (16,)], [(1, 4, 64)],
             num_heads=4, kv_num_heads=2, causal=0)
    assert c == (base[0], base[1] + 24 * (16 + 16 + 3 + 16 + 16), base[2] + 24)


def test_rotary_embedding() -> None:
    # ORT: input [2,5,64] with 4 heads (D 16), cos_cache [32, 4]: 8 of 16 rotated per head;
    # 2*5*4 heads x 8 rotated x 3 FLOPs (4 mul + 2 add per pair).
    c = cost("RotaryEmbedding", [(2, 5, 64), (2, 5), (32, 4), (32, 4)], [(2, 5, 64)],
             num_heads=4, rotary_embedding_dim=8)
    assert c == (0, 2 * 5 * 4 * 8 * 3, 0)
    # ONNX (opset 23): X [2,4,5,16], cos_cache [2,5,8]: the whole head.
    c = cost("RotaryEmbedding", [(2, 4, 5, 16), (2, 5, 8), (2, 5, 8)], [(2, 4, 5, 16)],
             domain="")
    assert c == (0, 2 * 4 * 5 * 16 * 3, 0)


# ---- norms and activations ---------------------------------------------------------------------

def test_simplified_and_skip_norms() -> None:
    # RMSNorm over 8 on 10 rows: square 8, sum 7 + div 1, eps, sqrt, reciprocal 3, scale x 8,
    # gamma 8 = 35 per row.
    rms = 8 + 8 + 3 + 8 + 8
    assert cost("SimplifiedLayerNormalization", [(2, 5, 8), (8,)], [(2, 5, 8)],
                domain="") == (0, 10 * rms, 10)
    # Skip: + skip (1 per element) and + bias (1 per element).
    assert cost("SkipSimplifiedLayerNormalization", [(2, 5, 8), (2, 5, 8), (8,)],
                [(2, 5, 8)]) == (0, 10 * (rms + 8), 10)
    assert cost("SkipSimplifiedLayerNormalization", [(2, 5, 8), (2, 5, 8), (8,), (8,)],
                [(2, 5, 8)]) == (0, 10 * (rms + 16), 10)
    # LayerNorm with beta: mean 8, x - mean 8, square 8, variance 8, 3, normalize 8, gamma 8,
    # beta 8.
    ln = 8 + 8 + 8 + 8 + 3 + 8 + 8 + 8
    assert cost("SkipLayerNormalization", [(2, 5, 8), (2, 5, 8), (8,), (8,), (8,)],
                [(2, 5, 8)]) == (0, 10 * (ln + 16), 10)
    assert cost("SkipLayerNormalization", [(2, 5, 8), (2, 5, 8), (8,)],
                [(2, 5, 8)]) == (0, 10 * (ln - 8 + 8), 10)


@pytest.mark.parametrize(("op", "inputs", "flops"), [
    ("FastGelu", [(3, 4)], 9),  # tanh form: x^3 2, *c 1, + x 1, *k 1, tanh, + 1, * x, * 0.5
    ("FastGelu", [(3, 4), (4,)], 10),  # + bias first
    ("BiasGelu", [(3, 4), (4,)], 6),  # + bias, / sqrt2, erf, + 1, * x, * 0.5
    ("QuickGelu", [(3, 4)], 3),  # alpha * x, sigmoid, * x
    ("Gelu", [(3, 4)], 5),  # com.microsoft Gelu: the erf form
])
def test_gelu_family(op: str, inputs: list[Any], flops: int) -> None:
    assert cost(op, inputs, [(3, 4)]) == (0, 12 * flops, 12)


def test_gemm_fast_gelu() -> None:
    # [6,32] x [32,16]: 96 outputs x K 32; + bias and tanh-GELU: 10 FLOPs, 1 tanh each.
    assert cost("GemmFastGelu", [(6, 32), (32, 16), (16,)], [(6, 16)]) == (96 * 32, 960, 96)


def test_matmul_n_bits_has_the_float_matmuls_macs() -> None:
    # A [1,7,64] x int4 B (N 48, K 64, blocks of 32: B [48, 2, 16] uint8): 7*48 outputs x 64,
    # as the fp32 MatMul; each of the 64*48 weights dequantized: 2 FLOPs.
    c = cost("MatMulNBits", [(1, 7, 64), (48, 2, 16), (96,), (48,)], [(1, 7, 48)],
             K=64, N=48, bits=4, block_size=32)
    fp32 = cost("MatMul", [(1, 7, 64), (64, 48)], [(1, 7, 48)], domain="")
    assert c[0] == fp32[0] == 7 * 48 * 64
    assert c == (7 * 48 * 64, 2 * 64 * 48, 0)


# ---- quantization ------------------------------------------------------------------------------

def test_quantize_and_dequantize_linear() -> None:
    x = (2, 3, 4, 4)  # 96 elements
    # quantize: x / scale, round, clamp 2, + zero point.
    assert cost("QuantizeLinear", [x, (), ()], [x], domain="") == (0, 96 * 5, 0)
    assert cost("QuantizeLinear", [x, ()], [x], domain="") == (0, 96 * 4, 0)
    # dequantize: convert, - zero point, * scale; per axis and blocked alike.
    assert cost("DequantizeLinear", [x, (3,), (3,)], [x], domain="", axis=1) == (0, 96 * 3, 0)
    assert cost("DequantizeLinear", [x, (2, 3, 2, 4)], [x], domain="", axis=2,
                block_size=2) == (0, 96 * 2, 0)
    assert cost("DequantizeLinear", [x, ()], [x]) == (0, 96 * 2, 0)  # com.microsoft


def test_dynamic_quantize_linear() -> None:
    # 24 values: min and max with 0: 48 compares; scale 2; zero point 5; quantize 24 x 5.
    assert cost("DynamicQuantizeLinear", [(4, 6)], [(4, 6), (), ()], domain="") == (
        0, 48 + 2 + 5 + 120, 0)


def test_integer_matmuls_equal_the_float_ones() -> None:
    fp32 = cost("MatMul", [(3, 4, 8), (8, 5)], [(3, 4, 5)], domain="")[0]
    assert fp32 == 3 * 4 * 5 * 8
    # MatMulIntegerToFloat: per output convert, * scale, + bias.
    assert cost("MatMulIntegerToFloat", [(3, 4, 8), (8, 5), (), (), (), (), (5,)],
                [(3, 4, 5)]) == (fp32, 60 * 3, 0)
    # DynamicQuantizeMatMul: A's 96 values quantized (2*96 + 7 + 5*96), then as above.
    assert cost("DynamicQuantizeMatMul", [(3, 4, 8), (8, 5), (), ()], [(3, 4, 5)]) == (
        fp32, 2 * 96 + 7 + 5 * 96 + 60 * 2, 0)


def test_qgemm() -> None:
    # transB: A [4,8], B [5,8]: 20 outputs x 8; + C, requantize with y_zp (5) -> 6 per output.
    ins = [(4, 8), (), (), (5, 8), (), (), (5,), (), ()]
    assert cost("QGemm", ins, [(4, 5)], transB=1) == (160, 20 * 6, 0)
    # Float output (no y_scale): + C, convert, scale -> 3 per output.
    assert cost("QGemm", ins[:7], [(4, 5)], transB=1) == (160, 20 * 3, 0)


def test_qlinear_pointwise() -> None:
    # QLinearAdd with zero points: dequantize A 3 + B 3, add 1, quantize 5 = 12 per output.
    ins = [(2, 8), (), (), (8,), (), (), (), ()]
    assert cost("QLinearAdd", ins, [(2, 8)]) == (0, 16 * 12, 0)
    assert cost("QLinearMul", ins, [(2, 8)]) == (0, 16 * 12, 0)
    # Sigmoid: dequantize 3, sigmoid 1 (transcendental), quantize 5.
    assert cost("QLinearSigmoid", [(2, 8), (), (), (), ()], [(2, 8)]) == (0, 16 * 9, 16)
    # LeakyRelu: 3 + compare and multiply 2 + 5.
    assert cost("QLinearLeakyRelu", [(2, 8), (), (), (), ()], [(2, 8)]) == (0, 16 * 10, 0)
    # Concat of 2 inputs into [2,16]: each element requantized, 3 + 5.
    ins = [(), (), (2, 8), (), (), (2, 8), (), ()]
    assert cost("QLinearConcat", ins, [(2, 16)]) == (0, 32 * 8, 0)


def test_qlinear_pools() -> None:
    # Global over 7x7, NCHW and NHWC alike: 48 adds + 1 divide, then requantize 3 + 5, per each
    # of 2*16 outputs.
    scal = [(), (), (), ()]
    nchw = cost("QLinearGlobalAveragePool", [(2, 16, 7, 7), *scal], [(2, 16, 1, 1)])
    nhwc = cost("QLinearGlobalAveragePool", [(2, 7, 7, 16), *scal], [(2, 1, 1, 16)],
                channels_last=1)
    assert nchw == nhwc == (0, 32 * (49 + 8), 0)
    # 2x2 windows: 3 adds + 1 divide; 4*4*4 = 64 outputs.
    c = cost("QLinearAveragePool", [(1, 4, 8, 8), *scal], [(1, 4, 4, 4)], kernel_shape=[2, 2],
             strides=[2, 2])
    assert c == (0, 64 * (4 + 8), 0)


# ---- ORT's fused forms -------------------------------------------------------------------------

def test_fused_conv_and_gemm() -> None:
    # Conv [1,3,8,8] x [4,3,3,3] pad 1: 256 outputs x 27 MACs; bias 1, Z 1, Relu 1 per output.
    c = cost("FusedConv", [(1, 3, 8, 8), (4, 3, 3, 3), (4,), (1, 4, 8, 8)], [(1, 4, 8, 8)],
             pads=[1, 1, 1, 1], activation="Relu")
    assert c == (256 * 27, 256 * 3, 0)
    # NHWC: the same MACs and bias.
    assert cost("NhwcConv", [(1, 8, 8, 3), (4, 3, 3, 3), (4,)], [(1, 8, 8, 4)]) == (
        256 * 27, 256, 0)
    # Gemm [4,8] x [8,5] + C, then Sigmoid: 20 x 8 MACs, add 1, sigmoid 1 (transcendental).
    assert cost("FusedGemm", [(4, 8), (8, 5), (5,)], [(4, 5)], activation="Sigmoid") == (
        160, 40, 20)


def test_fused_matmul() -> None:
    # transA: A [2, 8, 4] is K=8 x M=4; B [2, 8, 5]: 2*4*5 outputs x 8; alpha 0.5: 1 multiply.
    assert cost("FusedMatMul", [(2, 8, 4), (2, 8, 5)], [(2, 4, 5)], transA=1, alpha=0.5) == (
        40 * 8, 40, 0)
    assert cost("FusedMatMul", [(2, 4, 8), (2, 5, 8)], [(2, 4, 5)], transB=1) == (320, 0, 0)


def test_bias_ops_and_embed_layer_norm() -> None:
    assert cost("BiasAdd", [(2, 4, 8), (8,), (2, 4, 8)], [(2, 4, 8)]) == (0, 128, 0)
    # [3, 10] + bias, softmax along 1: 30 adds; 3 rows of 10: 9 + 10 + 10 + 9 + 10 each.
    assert cost("BiasSoftmax", [(3, 10), (3, 10)], [(3, 10)]) == (0, 30 + 3 * 48, 30)
    # [1, 6, 16] from word + position + segment embeddings: 2 adds per element; LayerNorm per
    # token 7*16 + 3, 1 sqrt.
    ins = [(1, 6), (1, 6), (100, 16), (64, 16), (2, 16), (16,), (16,)]
    assert cost("EmbedLayerNormalization", ins, [(1, 6, 16), (1,)]) == (
        0, 2 * 96 + 6 * 115, 6)


def test_qlinear_softmax_and_nhwc_qlinear_conv() -> None:
    # [2, 5]: each element dequantized 3, quantized 5; softmax of 2 rows of 5: 23 each.
    assert cost("QLinearSoftmax", [(2, 5), (), (), (), ()], [(2, 5)]) == (
        0, 10 * 8 + 2 * 23, 10)
    # com.microsoft QLinearConv (channels_last): ONNX QLinearConv's count, on NHWC tensors.
    scalars = [(), ()]
    c = cost("QLinearConv", [(1, 8, 8, 3), *scalars, (4, 3, 3, 3), *scalars, *scalars],
             [(1, 8, 8, 4)], channels_last=1)
    assert c == (256 * 27, 256 * 5, 0)


# ---- the attended length, against ONNX Runtime ---------------------------------------------------

def _present_length(op: str, inputs: dict[str, Any], names: list[str], outputs: int,
                    **attrs: Any) -> int:
    """Run one com.microsoft attention node on ORT's CPU provider; the attended length is the
    length of the KV cache it returns (present_key [B, N, L, D], or [2, B, N, L, D])."""
    ort = pytest.importorskip("onnxruntime")
    h = onnx.helper
    node = h.make_node(op, names, [f"o{i}" for i in range(outputs)], domain=MS, **attrs)
    graph = h.make_graph([node], "g", [h.make_tensor_value_info(
        k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()],
        [h.make_tensor_value_info(f"o{i}", F32, None) for i in range(outputs)])
    model = h.make_model(graph, ir_version=10, opset_imports=[h.make_opsetid("", 17),
                                                              h.make_opsetid(MS, 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[1].shape[-2]


def _length(op: str, shapes: list[Any], out: Any, rows: int, head: int, **attrs: Any) -> int:
    """The attended length our formula used: its attention MACs over (rows x (D + Dv))."""
    return cost(op, shapes, [out], **attrs)[0] // (rows * 2 * head)


def test_gqa_present_shape_is_the_one_ort_returns(tmp_path: Path) -> None:
    """ORT's symbolic inference gives GroupQueryAttention's present the past's shape (right
    only for a buffer shared by both); run with separate buffers, ORT appends the new tokens:
    the loader's shape is what the session returns."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("sympy")
    rng = np.random.default_rng(0)
    gqa = {"q": rng.standard_normal((1, 4, 128)).astype(np.float32),
           "pk": rng.standard_normal((1, 2, 60, 16)).astype(np.float32),
           "sl": np.array([63], np.int32), "tl": np.array(64, np.int32)}
    gqa["pv"] = gqa["pk"]
    names = ["q", "", "", "pk", "pv", "sl", "tl"]
    attrs = {"num_heads": 4, "kv_num_heads": 2}
    ort = pytest.importorskip("onnxruntime")
    h = onnx.helper
    node = h.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"],
                       domain=MS, **attrs)
    graph = h.make_graph([node], "g", [h.make_tensor_value_info(
        k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in gqa.items()],
        [h.make_tensor_value_info("y", F32, [1, 4, 64])] +  # as the genai export declares
        [h.make_tensor_value_info(n, F32, [1, 2, "total_sequence_length", 16])
         for n in ("present_k", "present_v")])
    model = h.make_model(graph, ir_version=10, opset_imports=[h.make_opsetid("", 17),
                                                              h.make_opsetid(MS, 1)])
    onnx.save(model, tmp_path / "gqa.onnx")
    session = ort.InferenceSession(str(tmp_path / "gqa.onnx"),
                                   providers=["CPUExecutionProvider"])
    ran = {o.name: v.shape for o, v in zip(session.get_outputs(), session.run(None, gqa),
                                            strict=True)}
    assert ran["present_k"] == (1, 2, 64, 16)  # 60 past + 4 new
    shapes = {t.name: t.shape for t in analyze(tmp_path / "gqa.onnx").model.graph_outputs}
    assert shapes == ran


def test_attended_length_is_ort_s_present_length() -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)

    def f(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float32)

    # GroupQueryAttention: 4 new tokens over a past of 60: L = 64.
    gqa = {"q": f(1, 4, 128), "k": f(1, 4, 32), "v": f(1, 4, 32), "pk": f(1, 2, 60, 16),
           "pv": f(1, 2, 60, 16), "sl": np.array([63], np.int32), "tl": np.array(64, np.int32)}
    attrs = {"num_heads": 8, "kv_num_heads": 2}
    assert _present_length("GroupQueryAttention", gqa, list(gqa), 3, **attrs) == 64
    shapes = [v.shape for v in gqa.values()]
    assert _length("GroupQueryAttention", shapes, (1, 4, 128), 8 * 4, 16, **attrs) == 64
    # MultiHeadAttention: 10 new keys over a past of 3: L = 13.
    mha = {"q": f(2, 6, 16), "k": f(2, 10, 16), "v": f(2, 10, 16), "b": f(48),
           "pk": f(2, 2, 3, 8), "pv": f(2, 2, 3, 8)}
    names = ["q", "k", "v", "b", "", "", "pk", "pv"]
    assert _present_length("MultiHeadAttention", mha, names, 3, num_heads=2) == 13
    shapes = [mha[n].shape if n else OMITTED for n in names]
    assert _length("MultiHeadAttention", shapes, (2, 6, 16), 2 * 2 * 6, 8, num_heads=2) == 13
    # Attention: 8 tokens over a past of 6 (past [2, B, N, P, D]): L = 14.
    att = {"x": f(2, 8, 32), "w": f(32, 96), "b": f(96), "past": f(2, 2, 4, 6, 8)}
    names = ["x", "w", "b", "", "past"]
    assert _present_length("Attention", att, names, 2, num_heads=4, unidirectional=1) == 14
    shapes = [att[n].shape if n else OMITTED for n in names]
    projection = 2 * 8 * 32 * 96
    c = cost("Attention", shapes, [(2, 8, 32)], num_heads=4, unidirectional=1)
    assert (c[0] - projection) // (2 * 4 * 8 * 2 * 8) == 14


def test_gather_block_quantized_of_a_tied_int4_table_on_disk(tmp_path: Path) -> None:
    """An onnxruntime-genai int4 decoder with tied embeddings: one uint8 table [N = 96 rows,
    K = 128 / 32 = 4 blocks, 16 bytes] stays in its file (6,144 values: more than the loader
    reads for folding), read by MatMulNBits (the lm_head) and, reshaped to [96, 64], by
    GatherBlockQuantized (the embedding lookup). Its output has
    the unpacked K = 128 values a row, as ORT's session returns (ORT's symbolic inference
    said 64, its Gather's rule, and gave up at the MatMulNBits after it); each of the
    2 x 3 x 128 values gathered is dequantized with the uint8 default zero point (3 FLOPs, as
    DequantizeLinear with a zero point); the table's 96 x 128 int4 weights are counted once;
    ORT's gather reads only its 6 rows of 64 bytes."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("sympy")
    ort = pytest.importorskip("onnxruntime")
    from onnxlens.analyzer.runtimes.ort_cpu import gathered

    h, rng = onnx.helper, np.random.default_rng(0)
    table = rng.integers(0, 256, (96, 4, 16), dtype=np.uint8)
    scales = rng.random((96, 4), dtype=np.float32)
    inits = [onnx.numpy_helper.from_array(table, "table"),
             onnx.numpy_helper.from_array(scales, "scales"),
             onnx.numpy_helper.from_array(np.array([96, 64], np.int64), "rows")]
    nodes = [h.make_node("Reshape", ["table", "rows"], ["flat"]),
             h.make_node("GatherBlockQuantized", ["flat", "ids", "scales"], ["emb"],
                         domain=MS, name="embed", bits=4, block_size=32, gather_axis=0,
                         quantize_axis=1),
             h.make_node("MatMulNBits", ["emb", "table", "scales"], ["logits"], domain=MS,
                         K=128, N=96, bits=4, block_size=32)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", onnx.TensorProto.INT64,
                                                               [2, 3])],
                         [h.make_tensor_value_info(name, F32, [2, 3, dim])
                          for name, dim in (("emb", "k"), ("logits", "n"))], inits)
    model = h.make_model(graph, ir_version=10, opset_imports=[h.make_opsetid("", 17),
                                                              h.make_opsetid(MS, 1)])
    onnx.save(model, tmp_path / "tied.onnx", save_as_external_data=True, size_threshold=1024,
              location="tied.onnx.data")
    session = ort.InferenceSession(str(tmp_path / "tied.onnx"),
                                   providers=["CPUExecutionProvider"])
    ran = session.run(None, {"ids": np.array([[0, 5, 95], [7, 7, 1]], np.int64)})
    result = analyze(tmp_path / "tied.onnx")
    assert not [w for w in result.warnings if "symbolic" in w and "gave up" in w]
    assert [t.shape for t in result.model.graph_outputs] == [r.shape for r in ran] == [
        (2, 3, 128), (2, 3, 96)]
    embed = next(k for k in result.node_costs if result.graph.info(k).op_type
                 == "GatherBlockQuantized")
    assert result.node_costs[embed].cost.other_flops == 3 * 2 * 3 * 128
    assert result.totals["params"] == 96 * 128 + 96 * 4 + 2  # and the Reshape's 2 dims
    info = result.graph.info(embed)
    assert gathered(info, result.node_costs[embed].cost).bytes_read == (
        result.node_costs[embed].cost.bytes_read - 96 * 64 + 6 * 64)
