"""native-cpu on the ops of onnxruntime-genai's decoders, against ONNX Runtime: one hand-built
node each (SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization, GroupQueryAttention
at prefill and decode, MatMulNBits, GatherBlockQuantized, ReduceSum of int64) on every
instruction set, and the builder's tiny decoder (tests/data/genai) at prefill and at a decode
step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxlens.backends._native")
ort = pytest.importorskip("onnxruntime")

from onnxlens.backends import _native  # noqa: E402
from onnxlens.backends.native_cpu import NativeCpuBackend  # noqa: E402

ISAS = _native.available_isas()
DATA = Path(__file__).parent / "data" / "genai"
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.int64): TensorProto.INT64}


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray],
           outputs: dict[str, tuple[int, tuple[int, ...]]]) -> onnx.ModelProto:
    """One node; outputs typed by hand (onnx's shape inference does not know contrib ops)."""
    graph = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(n, _TYPES[v.dtype], v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(v, n) for n, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _check(model: onnx.ModelProto, inputs: dict[str, np.ndarray], rtol: float = 1e-4,
           atol: float = 1e-5) -> None:
    """native-cpu on every instruction set equals ONNX Runtime's CPU kernels."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    want = dict(zip(names, session.run(None, inputs), strict=True))
    for isa in ISAS:
        backend = NativeCpuBackend(1, isa)
        backend.prepare(model)
        got = backend.run(inputs)
        for name in names:
            scale = max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol * scale,
                                       err_msg=f"{name} on {isa}")


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_simplified_layer_norm() -> None:
    rng = np.random.default_rng(0)
    x, gamma = _rand(rng, 2, 3, 40), _rand(rng, 40)
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1,
                            epsilon=1e-6)
    _check(_model(node, {"x": x}, {"g": gamma}, {"y": (TensorProto.FLOAT, x.shape)}), {"x": x})


@pytest.mark.parametrize("skip_rows", [6, 3])  # as x, or broadcast over the batch
@pytest.mark.parametrize("bias", [False, True])
def test_skip_simplified_layer_norm_and_its_sum(skip_rows: int, bias: bool) -> None:
    """Output 0 the normalized x + skip (+ bias), output 3 that sum; 1 and 2 left unnamed."""
    rng = np.random.default_rng(1)
    x = _rand(rng, 2, 3, 40)
    skip = _rand(rng, 2, 3, 40) if skip_rows == 6 else _rand(rng, 3, 40)
    weights = {"g": _rand(rng, 40), **({"b": _rand(rng, 40)} if bias else {})}
    node = helper.make_node("SkipSimplifiedLayerNormalization",
                            ["x", "skip", "g", "b" if bias else ""], ["y", "", "", "sum"],
                            domain="com.microsoft", epsilon=1e-6)
    outs = {"y": (TensorProto.FLOAT, x.shape), "sum": (TensorProto.FLOAT, x.shape)}
    _check(_model(node, {"x": x, "skip": skip}, weights, outs), {"x": x, "skip": skip})


@pytest.mark.parametrize("skip_rows", [6, 3])  # as x, or broadcast over the batch
@pytest.mark.parametrize(("bias", "beta", "sum_out"), [(False, False, False), (True, True, True)])
def test_skip_layer_norm(skip_rows: int, bias: bool, beta: bool, sum_out: bool) -> None:
    """Output 0 LayerNormalization(x + skip (+ bias)) · gamma (+ beta); output 3 the sum when
    named (else a scratch tensor)."""
    rng = np.random.default_rng(2)
    x = _rand(rng, 2, 3, 40)
    skip = _rand(rng, 2, 3, 40) if skip_rows == 6 else _rand(rng, 3, 40)
    weights = {"g": _rand(rng, 40), **({"beta": _rand(rng, 40)} if beta else {}),
               **({"b": _rand(rng, 40)} if bias else {})}
    node = helper.make_node("SkipLayerNormalization",
                            ["x", "skip", "g", "beta" if beta else "", "b" if bias else ""],
                            ["y", "", "", "sum"] if sum_out else ["y"], domain="com.microsoft",
                            epsilon=1e-5)
    outs = {"y": (TensorProto.FLOAT, x.shape),
            **({"sum": (TensorProto.FLOAT, x.shape)} if sum_out else {})}
    _check(_model(node, {"x": x, "skip": skip}, weights, outs), {"x": x, "skip": skip})


def _gqa(batch: int, seq: int, past: int, packed: bool, interleaved: int = 0,
         scale: float | None = None, window: int = -1, capacity: int | None = None,
         sink: bool = False, head: int = 16, **attrs: float
         ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A GroupQueryAttention of 4 query heads over 2 KV heads of `head` values, `past` cached
    tokens and `seq` new ones per batch (all valid: seqlens_k = past + seq - 1), with rotary
    when `head` is a multiple of 16 (ORT's rule); `window`: its local_window_size; `capacity`:
    a sliding_window_cache of that many rows (past and present), holding the latest
    min(past, capacity) tokens; `sink`: a head_sink input."""
    heads, kv_heads = 4, 2
    total = past + seq
    rows = past if capacity is None else capacity
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    inputs = {"past_key": _rand(rng, batch, kv_heads, rows, head),
              "past_value": _rand(rng, batch, kv_heads, rows, head),
              "seqlens_k": np.full(batch, total - 1, np.int32),
              "total_sequence_length": np.array(total, np.int32)}
    if packed:
        inputs["query"] = _rand(rng, batch, seq, (heads + 2 * kv_heads) * head)
        qkv = ["query", "", ""]
    else:
        inputs.update(query=_rand(rng, batch, seq, heads * head),
                      key=_rand(rng, batch, seq, kv_heads * head),
                      value=_rand(rng, batch, seq, kv_heads * head))
        qkv = ["query", "key", "value"]
    rotary = head % 16 == 0
    angles = np.outer(np.arange(32), 1.0 / 10000 ** (np.arange(head // 2) * 2 / head))
    weights = {"cos": np.cos(angles).astype(np.float32),
               "sin": np.sin(angles).astype(np.float32)} if rotary else {}
    if sink:
        weights["sink"] = _rand(rng, heads) * 2
    attrs = {**attrs, **({"scale": scale} if scale is not None else {}),
             **({"local_window_size": window} if window > 0 else {}),
             **({"sliding_window_cache": 1} if capacity is not None else {})}
    node = helper.make_node(
        "GroupQueryAttention",
        [*qkv, "past_key", "past_value", "seqlens_k", "total_sequence_length",
         *(["cos", "sin"] if rotary else ["", ""]), *(["", "", "sink"] if sink else [])],
        ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=heads,
        kv_num_heads=kv_heads, do_rotary=int(rotary), rotary_interleaved=interleaved, **attrs)
    present = (TensorProto.FLOAT, (batch, kv_heads, rows if capacity else total, head))
    outs = {"out": (TensorProto.FLOAT, (batch, seq, heads * head)), "present_key": present,
            "present_value": present}
    return _model(node, inputs, weights, outs), inputs


@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 8, 0), (2, 5, 0), (2, 1, 8), (1, 3, 4)])
def test_group_query_attention_prefill_and_decode(batch: int, seq: int, past: int) -> None:
    """Rotary on the queries and new keys, present = past + new, the causal mask, one KV head
    per two query heads; prefill (no cache), a decode step, a chunk after a cache."""
    _check(*_gqa(batch, seq, past, packed=True))


def test_group_query_attention_right_padded_prompts() -> None:
    """A batch of prompts of 6 and 4 tokens padded to 6 (seqlens_k 5 and 3): the pad rows
    attend to their prompt's tokens only."""
    model, inputs = _gqa(2, 6, 0, packed=True)
    inputs["seqlens_k"] = np.array([5, 3], np.int32)
    _check(model, inputs)


def test_group_query_attention_separate_qkv_interleaved_rotary_and_scale() -> None:
    _check(*_gqa(1, 4, 3, packed=False, interleaved=1, scale=0.3))


def test_group_query_attention_past_the_rotary_positions_is_a_run_error() -> None:
    from onnxlens.analyzer.errors import OnnxLensError

    model, inputs = _gqa(1, 1, 8, packed=True)
    backend = NativeCpuBackend(1)
    backend.prepare(model)
    inputs["seqlens_k"] = np.array([40], np.int32)  # past 40 > the 8 cached tokens
    with pytest.raises(OnnxLensError, match="seqlens_k"):
        backend.run(inputs)


@pytest.mark.parametrize(("batch", "seq", "past", "window"),
                         [(1, 8, 0, 3), (2, 1, 12, 4), (1, 3, 6, 4), (1, 5, 2, 16)])
def test_group_query_attention_local_window(batch: int, seq: int, past: int, window: int
                                            ) -> None:
    """local_window_size W without a sliding cache (the builder's Mistral / Phi-3): the query at
    position p attends the W keys at (p - W, p], present = past + new as ever; prefill longer
    than W, a decode step and a chunk past it, a window longer than the context."""
    _check(*_gqa(batch, seq, past, packed=True, window=window))


def _sliding(batch: int, seq: int, past: int, window: int, capacity: int, **kw: bool
             ) -> None:
    """A sliding_window_cache against ORT: the output, and present's kept rows (ORT leaves the
    rest of the buffer unwritten): the last C of the past's min(past, C) rows and the new."""
    model, inputs = _gqa(batch, seq, past, packed=True, window=window, capacity=capacity, **kw)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip(["out", "present_key", "present_value"], session.run(None, inputs),
                    strict=True))
    rows = min(past, capacity) + seq
    kept = min(rows, capacity)
    for isa in ISAS:
        backend = NativeCpuBackend(1, isa)
        backend.prepare(model)
        got = backend.run(inputs)
        np.testing.assert_allclose(got["out"], want["out"], rtol=1e-4, atol=1e-5,
                                   err_msg=f"out on {isa}")
        for name in ("present_key", "present_value"):
            np.testing.assert_allclose(got[name][:, :, :kept], want[name][:, :, :kept],
                                       rtol=1e-6, atol=1e-6, err_msg=f"{name} on {isa}")
            assert not got[name][:, :, kept:].any()


@pytest.mark.parametrize(("batch", "seq", "past"),
                         [(1, 1, 20), (2, 1, 5), (1, 6, 0), (1, 11, 0), (1, 3, 13), (1, 3, 6)])
def test_group_query_attention_sliding_window_cache(batch: int, seq: int, past: int) -> None:
    """The builder's Gemma 2 / gpt-oss sliding layers: past and present one buffer of W = 8
    rows holding the latest tokens: a decode step 12 tokens past the window, one before the
    buffer fills, prefill shorter and longer than it, chunks after a full and a partial
    buffer, overflowing it."""
    _sliding(batch, seq, past, 8, 8)


def test_a_sliding_window_cache_wider_than_its_window_is_refused() -> None:
    """A buffer of C > W rows (a cache_slack): ORT infers how full it is from the token count
    alone, a rule native-cpu does not follow; it says so rather than differ."""
    from onnxlens.analyzer.errors import OnnxLensError

    model, inputs = _gqa(1, 1, 7, packed=True, window=6, capacity=10)
    backend = NativeCpuBackend(1)
    with pytest.raises(OnnxLensError, match="local_window_size rows, got window 6"):
        backend.prepare(model)
        backend.run(inputs)


@pytest.mark.parametrize(("seq", "past", "window", "capacity"),
                         [(8, 0, -1, None), (1, 10, -1, None), (1, 20, 8, 8), (5, 0, 3, None)])
def test_group_query_attention_head_sinks(seq: int, past: int, window: int,
                                          capacity: int | None) -> None:
    """gpt-oss's attention sinks: head_sink[h] one more logit in each softmax's denominator,
    alone, with a window, with its sliding cache; prefill and a decode step."""
    if capacity is None:
        _check(*_gqa(1, seq, past, packed=True, window=window, sink=True))
    else:
        _sliding(1, seq, past, window, capacity, sink=True)


@pytest.mark.parametrize(("seq", "past"), [(8, 0), (1, 9)])
def test_group_query_attention_heads_of_24(seq: int, past: int) -> None:
    """Heads of 24 values (ORT takes multiples of 8, of 16 with rotary: none here): a last
    block of 8 past the kernels' sixteen at a time; prefill (keys transposed) and a decode
    step."""
    _check(*_gqa(1, seq, past, packed=True, head=24))


def test_group_query_attention_smooth_softmax_and_softcap() -> None:
    """smooth_softmax: a sink of 0 in every head; softcap: c·tanh(score / c) first."""
    _check(*_gqa(1, 4, 6, packed=True, smooth_softmax=1, softcap=2.0))


_SWIGLU = {"swiglu_fusion": 1, "activation_alpha": 1.702, "activation_beta": 1.0,
           "swiglu_limit": 7.0}  # gpt-oss's, as the builder writes them


def _moe_model(op: str, x: np.ndarray, experts: int, weights: dict[str, np.ndarray],
               names: list[str], **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A MoE / QMoE node over token rows `x` and router logits of `experts` experts."""
    rng = np.random.default_rng(x.size)
    inputs = {"x": x, "router": _rand(rng, x.size // x.shape[-1], experts)}
    node = helper.make_node(op, ["x", "router", *names], ["y"], domain="com.microsoft", **attrs)
    return _model(node, inputs, weights, {"y": (TensorProto.FLOAT, x.shape)}), inputs


@pytest.mark.parametrize(("activation", "k", "normalize", "bias", "rows"),
                         [("swiglu", 2, 1, True, (5,)), ("swiglu", 2, 1, True, (1, 1)),
                          ("silu", 1, 0, False, (2, 3)), ("relu", 3, 1, True, (4,)),
                          ("gelu", 2, 0, True, (3,)), ("identity", 4, 1, False, (2,))])
def test_moe(activation: str, k: int, normalize: int, bias: bool, rows: tuple[int, ...]
             ) -> None:
    """MoE as the builder writes gpt-oss (SwiGLU halves interleaved, alpha 1.702, beta 1,
    limit 7) and the other activations ORT's CPU kernel runs: 4 experts of hidden 32, inter
    16, top k of the router's softmax (renormalized or not), biases or none; prefill rows, a
    decode step [1, 1, H]."""
    rng = np.random.default_rng(k)
    hidden, inter, experts = 32, 16, 4
    fusion = 2 if activation == "swiglu" else 1
    weights = {"w1": _rand(rng, experts, fusion * inter, hidden) * 0.3,
               "w2": _rand(rng, experts, hidden, inter) * 0.3}
    if bias:
        weights.update(b1=_rand(rng, experts, fusion * inter), b2=_rand(rng, experts, hidden))
    names = ["w1", "b1" if bias else "", "w2", "b2" if bias else ""]
    attrs = {"k": k, "activation_type": activation, "normalize_routing_weights": normalize,
             **(_SWIGLU if activation == "swiglu" else {})}
    _check(*_moe_model("MoE", _rand(rng, *rows, hidden), experts, weights, names, **attrs))


@pytest.mark.parametrize(("bits", "block"), [(4, 16), (4, 0), (8, 0)])
def test_qmoe(bits: int, block: int) -> None:
    """QMoE as the builder writes gpt-oss int4: uint8 experts (4 bits two a byte, low nibble
    first), (q - 2^(bits - 1)) · scale, a scale per block of 16 or per row; against ORT."""
    rng = np.random.default_rng(bits + block)
    hidden, inter, experts, per_byte = 32, 16, 4, 8 // bits
    weights = {}
    for fc, (rows, cols) in (("1", (2 * inter, hidden)), ("2", (hidden, inter))):
        weights[f"q{fc}"] = rng.integers(0, 256, (experts, rows, cols // per_byte), np.uint8)
        scale = (experts, rows, cols // block) if block else (experts, rows)
        weights[f"s{fc}"] = rng.random(scale, dtype=np.float32) * 0.05
        weights[f"b{fc}"] = _rand(rng, experts, rows)
    attrs = {"k": 2, "activation_type": "swiglu", "normalize_routing_weights": 1,
             "expert_weight_bits": bits, **_SWIGLU, **({"block_size": block} if block else {})}
    _check(*_moe_model("QMoE", _rand(rng, 3, hidden), experts, weights,
                       ["q1", "s1", "b1", "q2", "s2", "b2"], **attrs))


def test_moe_refusals_name_what_they_lack() -> None:
    """8-bit QMoE in blocks (ORT 1.31's CPU kernel is 1% off the dequantized product there)
    and an fc3 (which ORT's CPU MoE refuses too) are refused by name."""
    from onnxlens.analyzer.errors import OnnxLensError

    rng = np.random.default_rng(0)
    weights = {"q1": rng.integers(0, 256, (2, 32, 32), np.uint8),
               "s1": np.ones((2, 32, 2), np.float32),
               "q2": rng.integers(0, 256, (2, 32, 16), np.uint8),
               "s2": np.ones((2, 32, 1), np.float32)}
    model, inputs = _moe_model("QMoE", _rand(rng, 1, 32), 2, weights, ["q1", "s1", "", "q2",
                                                                       "s2"],
                               k=1, activation_type="swiglu", expert_weight_bits=8,
                               block_size=16, **_SWIGLU)
    with pytest.raises(OnnxLensError, match="8-bit experts in blocks"):
        backend = NativeCpuBackend(1)
        backend.prepare(model)
        backend.run(inputs)
    weights = {"w": _rand(rng, 2, 8, 32), "w2": _rand(rng, 2, 32, 8)}
    model, inputs = _moe_model("MoE", _rand(rng, 1, 32), 2, weights,
                               ["w", "", "w2", "", "w", ""], k=1, activation_type="silu")
    with pytest.raises(OnnxLensError, match=r"input 6 \(fc3"):
        backend = NativeCpuBackend(1)
        backend.prepare(model)
        backend.run(inputs)


@pytest.mark.parametrize(("op", "rows", "used"), [("MoE", 3, 4), ("QMoE", 3, 4), ("MoE", 1, 2),
                                                  ("QMoE", 1, 2)])
def test_the_kernel_model_runs_the_used_experts(op: str, rows: int, used: int) -> None:
    """native-cpu's estimate of a MoE / QMoE (4 experts, top 2, SwiGLU's 2 x 16 rows of 32,
    fc2 32 x 16: 1536 weights an expert) reads the experts it uses (3 tokens x 2 picks reach
    all 4, one token 2), two products each: MoE's on the GEMM (class gemm, fp32 peak) over
    float32 weights, 4 x 1536 bytes an expert, MACs 2 picks x 1536 a token; QMoE's 4-bit ones
    on MatMulNBits' product (class native_nbits: its MACs doubled, a conversion per value
    for 1 or 2 rows an expert), reading per expert fc1's 32 rows x 2 blocks of 16 (8 bytes,
    a scale and a zero point: 16) and fc2's 32 x 1 block: 1536 bytes; its dequantization
    FLOPs (2 a picked weight) are not the run's."""
    import onnxlens
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.native.kernel_model import NATIVE_CPU_MODEL

    rng = np.random.default_rng(0)
    experts, hidden, inter = 4, 32, 16
    if op == "MoE":
        weights = {"w1": _rand(rng, experts, 2 * inter, hidden),
                   "w2": _rand(rng, experts, hidden, inter)}
        names, extra = ["w1", "", "w2", ""], {}
    else:
        weights = {"q1": rng.integers(0, 256, (experts, 2 * inter, hidden // 2), np.uint8),
                   "s1": np.ones((experts, 2 * inter, 2), np.float32),
                   "q2": rng.integers(0, 256, (experts, hidden, inter // 2), np.uint8),
                   "s2": np.ones((experts, hidden, 1), np.float32)}
        names, extra = ["q1", "s1", "", "q2", "s2", ""], {"expert_weight_bits": 4,
                                                          "block_size": 16}
    model, _ = _moe_model(op, _rand(rng, rows, hidden), experts, weights, names, k=2,
                          activation_type="swiglu", normalize_routing_weights=1, **_SWIGLU,
                          **extra)
    result = onnxlens.analyze(model)
    [[kernel]] = NATIVE_CPU_MODEL.kernels(
        result.graph, result.groups, {n: c.cost for n, c in result.node_costs.items()},
        {g: c.cost for g, c in result.group_costs.items()}, host_profile(1),
        result.model).values()
    [node_cost] = [c.cost for c in result.node_costs.values()]
    quantized = op == "QMoE"
    assert (kernel.cls, kernel.peak, kernel.calls, kernel.cost.param_bytes, kernel.cost.macs,
            kernel.cost.other_flops) == (
        "native_nbits" if quantized else "gemm", "fp32", 2 * used,
        1536 * used if quantized else 4 * 1536 * used,
        rows * 2 * 1536 * (2 if quantized else 1),
        node_cost.other_flops - (2 * 1536 * rows * 2 if quantized else 0))


def _nbits(rng: np.random.Generator, n: int, k: int, block: int, zero_points: bool
           ) -> dict[str, np.ndarray]:
    blocks = -(-k // block)
    weights = {"w": rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8),
               "scales": (rng.random(n * blocks, dtype=np.float32) * 0.1 + 0.01)}
    if zero_points:
        weights["zp"] = rng.integers(0, 256, n * -(-blocks // 2), dtype=np.uint8)
    return weights


@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize(("k", "n"), [(64, 24), (80, 200)])  # a last block cut short, 2 tiles
@pytest.mark.parametrize("rows", [(1, 1), (2, 3)])  # a decode step reads the bytes directly
@pytest.mark.parametrize("level", [0, 4])
def test_matmul_nbits_int4(zero_points: bool, k: int, n: int, rows: tuple[int, int], level: int
                           ) -> None:
    """Block-quantized int4 weights (and packed zero points, 8 when absent), a bias; at
    accuracy level 0 ORT computes in float32, at 4 it quantizes A per row and block to int8
    first: native-cpu does the same, so the two agree to rounding either way."""
    rng = np.random.default_rng(k)
    block = 32
    weights = _nbits(rng, n, k, block, zero_points)
    weights["bias"] = _rand(rng, n)
    a = _rand(rng, *rows, k)
    node = helper.make_node("MatMulNBits", ["a", "w", "scales", "zp" if zero_points else "",
                                            "", "bias"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block, accuracy_level=level)
    _check(_model(node, {"a": a}, weights, {"y": (TensorProto.FLOAT, (*rows, n))}), {"a": a})


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize(("lines", "k"), [((), 64), ((3,), 40)])
def test_gather_block_quantized(bits: int, zero_points: bool, lines: tuple[int, ...], k: int
                                ) -> None:
    """A tied embedding's int4 (or int8) table, uint8 with 8 / bits values a byte, blocks of 16
    along the last axis (40 values: a short last block, and zero points packed in an odd
    count), zero points packed like the data (absent: 2^(bits - 1)); int32 indices, one
    negative."""
    rng = np.random.default_rng(bits + k)
    rows, block, per_byte = 10, 16, 8 // bits
    blocks = -(-k // block)
    data = rng.integers(0, 256, (rows, *lines, -(-k // per_byte)), dtype=np.uint8)
    weights = {"data": data, "scales": _rand(rng, rows, *lines, blocks)}
    if zero_points:
        weights["zp"] = rng.integers(0, 256, (rows, *lines, -(-blocks // per_byte)),
                                     dtype=np.uint8)
    ids = np.array([[3, 0], [-1, 9], [3, 5]], np.int32)
    node = helper.make_node("GatherBlockQuantized",
                            ["data", "ids", "scales", "zp" if zero_points else ""], ["y"],
                            domain="com.microsoft", bits=bits, block_size=block,
                            gather_axis=0, quantize_axis=len(lines) + 1)
    out = (TensorProto.FLOAT, (*ids.shape, *lines, k))
    _check(_model(node, {"ids": ids}, weights, {"y": out}), {"ids": ids}, rtol=0, atol=0)


@pytest.mark.parametrize("zero_points", [False, True])
def test_the_kernel_model_reads_the_picked_rows_of_a_quantized_table(zero_points: bool
                                                                     ) -> None:
    """native-cpu's estimate of a GatherBlockQuantized reads per index its row of the table
    (64 int4 values: 32 bytes), its 4 scales (16 bytes) and, with zero points, their 4
    floats (16 bytes), and the 6 int32 indices (24 bytes): 6 x 48 + 24 = 312 bytes, or
    6 x 64 + 24 = 408, where the analysis charges the whole table of 10 rows; each of the
    6 x 64 values it writes is computed alone (an element)."""
    import onnxlens
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.native.kernel_model import NATIVE_CPU_MODEL

    rng = np.random.default_rng(0)
    weights = {"data": rng.integers(0, 256, (10, 32), dtype=np.uint8),
               "scales": _rand(rng, 10, 4)}
    if zero_points:
        weights["zp"] = rng.integers(0, 256, (10, 2), dtype=np.uint8)
    ids = np.zeros((3, 2), np.int32)
    node = helper.make_node("GatherBlockQuantized",
                            ["data", "ids", "scales", "zp" if zero_points else ""], ["y"],
                            domain="com.microsoft", bits=4, block_size=16)
    result = onnxlens.analyze(_model(node, {"ids": ids}, weights,
                                     {"y": (TensorProto.FLOAT, (3, 2, 64))}))
    [[kernel]] = NATIVE_CPU_MODEL.kernels(
        result.graph, result.groups, {n: c.cost for n, c in result.node_costs.items()},
        {g: c.cost for g, c in result.group_costs.items()}, host_profile(1),
        result.model).values()
    assert (kernel.cost.bytes_read, kernel.elements) == (408 if zero_points else 312, 3 * 2 * 64)


def test_reduce_sum_of_int64_over_the_mask() -> None:
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int64)
    for keepdims in (0, 1):
        node = helper.make_node("ReduceSum", ["m", "axes"], ["s"], keepdims=keepdims)
        shape = (2, 1) if keepdims else (2,)
        model = _model(node, {"m": mask}, {"axes": np.array([1], np.int64)},
                       {"s": (TensorProto.INT64, shape)})
        _check(model, {"m": mask})


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 8, 0), (2, 1, 8)])
def test_the_genai_decoder_agrees_with_ort(precision: str, batch: int, seq: int, past: int
                                           ) -> None:
    """The builder's tiny Llama: logits and every present K/V at cosine >= 0.9999 with ORT.
    int4 is not exact: both quantize the activations to int8 (accuracy level 4), and a float
    differing in its last bit before (ORT's own Sigmoid, sums in another order) can round to
    another int8 value."""
    path = DATA / precision / "model.onnx"
    rng = np.random.default_rng(0)
    model = onnx.load(path, load_external_data=False)
    kv = {i.name: (batch, 1, past, 16) for i in model.graph.input if "past" in i.name}
    inputs = {"input_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
              "attention_mask": np.ones((batch, past + seq), np.int64),
              **{name: _rand(rng, *shape) for name, shape in kv.items()}}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, inputs), strict=True))
    backend = NativeCpuBackend(1)
    backend.prepare(path)
    got = backend.run(inputs)
    for name in names:
        assert got[name].shape == want[name].shape
        assert _cosine(got[name], want[name]) >= 0.9999, name
        if precision == "fp32":
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


def test_the_cuda_executor_names_the_kernels_it_lacks() -> None:
    """native-cuda (its CPU emulator here) has no GroupQueryAttention or RMSNormalization: the
    refusal names them, before the plan reaches the CUDA core."""
    from onnxlens.analyzer.errors import OnnxLensError
    from onnxlens.backends.native_cuda import NativeCudaBackend

    emu = pytest.importorskip("onnxlens.backends._native_cuda_emu")
    model, inputs = _gqa(1, 4, 0, packed=True)
    backend = NativeCudaBackend(module=emu)
    with pytest.raises(OnnxLensError, match="no kernel for GroupQueryAttention in this build"):
        backend.prepare(model)
        backend.run(inputs)


def _fixed_cache(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its past / present renamed: a cache of fixed length, not an LLM's (the
    LLM view needs the past length named)."""
    for value in [*model.graph.input, *model.graph.output]:
        value.name = value.name.replace("past_", "cache_").replace("present_", "new_")
    node = model.graph.node[0]
    for names in (node.input, node.output):
        names[:] = [n.replace("past_", "cache_").replace("present_", "new_") for n in names]
    return model


def test_the_kernel_model_charges_the_cache_copy() -> None:
    """native-cpu's estimate of a GroupQueryAttention adds the copy of past K and V into
    present: 2 tensors x [1, 2, 8, 16] float32 = 2048 bytes read and written again, one memcpy
    per batch, KV head and tensor (4)."""
    import onnxlens
    from onnxlens.backends.native.kernel_model import _cache_copies
    from onnxlens.backends.native.plan import lower_groups

    model = _fixed_cache(_gqa(1, 1, 8, packed=True)[0])
    result = onnxlens.analyze(model)
    lowered = lower_groups(result.model, result.graph, result.groups)
    [copy] = [c for step in lowered.steps
              for c in _cache_copies(step.kernels, result.model, False)]
    assert (copy.cls, copy.cost.bytes_read, copy.cost.bytes_written, copy.runs) == (
        "data_movement", 2048, 2048, 4)
    assert not [c for step in lowered.steps for c in _cache_copies(step.kernels, result.model,
                                                                    True)]


@pytest.mark.parametrize(("seq", "past", "window", "capacity", "keys"),
                         [(8, 0, 3, None, 1 + 2 + 3 * 6), (1, 20, 8, 8, 8), (2, 4, 6, None, 5 + 6),
                          (4, 2, -1, None, 3 + 4 + 5 + 6)])
def test_the_kernel_model_counts_the_keys_in_the_window(seq: int, past: int, window: int,
                                                        capacity: int | None, keys: int) -> None:
    """native-cpu's estimate of a GroupQueryAttention does 2·D MACs per score (a dot product
    and an axpy of D = 16), 4 heads, over the keys each new row attends: p + 1 at position p,
    at most W; a sliding buffer of W rows is read as full (W keys a decode step)."""
    import onnxlens
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.native.kernel_model import NATIVE_CPU_MODEL

    model = _fixed_cache(_gqa(1, seq, past, packed=True, window=window, capacity=capacity)[0])
    result = onnxlens.analyze(model)
    [[kernel]] = NATIVE_CPU_MODEL.kernels(
        result.graph, result.groups, {n: c.cost for n, c in result.node_costs.items()},
        {g: c.cost for g, c in result.group_costs.items()}, host_profile(1),
        result.model).values()
    assert (kernel.cls, kernel.cost.macs) == ("native_gqa", 2 * 16 * 4 * keys)


def _native_point(bench):  # a catalogue Bench: its calibration Point through native-cpu
    from onnxlens.analyzer.hardware import NATIVE_CPU
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.calibrate import measure

    return measure._point(bench.name, bench.build(), 1e-4, 0.0, 0.0,
                          measure._kernels_of(NATIVE_CPU, host_profile(1)))


@pytest.mark.parametrize(("m", "k", "n", "conversions"), [(1, 256, 4096, 1.0),
                                                          (8, 256, 4096, 1 / 8)])
def test_a_native_matmul_n_bits_benchmark_is_its_own_class(m: int, k: int, n: int,
                                                           conversions: float) -> None:
    """The native-cpu calibration reads a MatMulNBits benchmark as one `native_nbits` kernel
    of M·K·N MACs plus a conversion per 4-bit value: by each row up to 2 rows (1 row: 2x),
    once for 8 (1 + 1/8); traffic A, the packed weight (K·N / 2 bytes), a scale per block of
    32 and Y."""
    from onnxlens.backends.calibrate import catalogue

    bench = catalogue.matmul_n_bits(m, k, n)
    assert bench.name in {b.name for b in catalogue.benchmarks("native-cpu")}
    assert bench.name not in {b.name for b in catalogue.benchmarks("ort-cpu")}
    point = _native_point(bench)
    assert (point.op_class, point.macs, point.calls, point.bytes) == (
        "native_nbits", round(m * k * n * (1 + conversions)), 1,
        4 * m * k + k * n // 2 + 4 * n * k // 32 + 4 * m * n)
    # Its MACs are float32 multiplications, at the fp32 peak in a group the analysis calls int8.
    import onnxlens
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.native.kernel_model import NATIVE_CPU_MODEL

    result = onnxlens.analyze(bench.build())
    [[kernel]] = NATIVE_CPU_MODEL.kernels(
        result.graph, result.groups, {n: c.cost for n, c in result.node_costs.items()},
        {g: c.cost for g, c in result.group_costs.items()}, host_profile(1),
        result.model).values()
    assert (kernel.cls, kernel.peak) == ("native_nbits", "fp32")


@pytest.mark.parametrize(("seq", "past"), [(8, 0), (1, 1000)])
def test_a_native_group_query_attention_benchmark_is_its_own_class(seq: int, past: int
                                                                   ) -> None:
    """k_attention.cpp's GroupQueryAttention, 8 query / 2 KV heads of 32, read as one
    `native_gqa` kernel: the causal scores only (new token s sees past + s + 1 keys: 36 of
    64 a head at prefill 8), 2·32 MACs each; a call per query row (8 heads x seq); 4·32
    FLOPs a score its reuse; bytes: packed QKV (seq x 384 floats), past K and V, the new
    tokens' rotary rows (cos and sin, 16 each) and the seqlens_k and total scalars read, Y
    and present K and V written, and the present read again by the rows (no cache-copy
    kernel apart); at prefill (8 x 4 query rows a KV head) the keys transposed, written and
    read once more."""
    from onnxlens.backends.calibrate import catalogue

    heads, kv_heads, head, total = 8, 2, 32, past + seq
    point = _native_point(catalogue.gqa_decode(heads, kv_heads, head, past, seq=seq))
    scores = heads * (seq * past + seq * (seq + 1) // 2)
    present = 2 * kv_heads * total * head
    read = seq * (heads + 2 * kv_heads) * head + 2 * kv_heads * past * head + 2 * seq * 16
    written = seq * heads * head + present
    present += 2 * kv_heads * total * head if seq * heads // kv_heads >= 8 else 0
    assert (point.op_class, point.macs, point.calls, point.reuse, point.bytes) == (
        "native_gqa", 2 * head * scores, heads * seq, 4 * head,
        4 * (read + written + present) + 8)


def test_a_calibration_before_the_native_classes_prices_as_before() -> None:
    """A calibrated profile without `native_nbits` / `native_gqa` curves costs the kernels as
    before the classes (the gemm and attention curves; the cache copy apart); an uncalibrated
    one, and one with the curve, as the class."""
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.native.kernel_model import own_class

    hw = host_profile(1)
    old = dataclasses.replace(hw, calibrated=True)
    new = dataclasses.replace(old, efficiency={**hw.efficiency, "native_gqa": 0.1})
    assert [own_class(p, "native_gqa") for p in (hw, old, new)] == [True, False, True]
    assert not own_class(new, "native_nbits")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_pow_by_an_integer_constant_exponent(dtype: type) -> None:
    """Nemotron's squared ReLU as the genai builder writes it: Pow(relu(x), int32 [2])."""
    x = _rand(np.random.default_rng(5), 2, 3, 40)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pow", ["r", "e"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              [numpy_helper.from_array(np.array([2], dtype), "e")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _check(model, {"x": x})
