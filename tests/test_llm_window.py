"""Sliding-window layers as onnxruntime-genai's builder writes Gemma 2/3 and gpt-oss for CPU: a
GroupQueryAttention with `sliding_window_cache = 1`, `local_window_size = W` reads a cache whose
past dim is its own (`past_sliding_length`), a buffer of capacity W in every phase (ORT refuses
less). A hand-built decoder of two attention layers, layer 0 windowed (W = 8) and layer 1
global, each Q/K/V a MatMul of the embeddings (hidden 32, 2 query and 1 KV head of 16).

MACs of one step of s new tokens at context c (past p = c - s), by hand:

    projections, per layer:  s · 32 · (32 + 16 + 16)          = 2048 · s
    attention, global layer: 2 · 2 heads · s · (p + s) · 16     = 64 · s · (p + s)
    attention, window layer: 64 · s · min(W, W + s)             (at most W keys per query)

Cache bytes after a step at context c: per layer and token 2 · 1 · 16 · 4 = 128; the global
layer holds c tokens, the windowed one its W.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxlens

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 32, 2, 1, 16, 8
PAST = {0: "past_sliding_length", 1: "past_sequence_length"}


def _layer(i: int, x: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    rng = np.random.default_rng(i)
    widths = {"q": HEADS * HEAD_DIM, "k": KV_HEADS * HEAD_DIM, "v": KV_HEADS * HEAD_DIM}
    inits = [onnx.numpy_helper.from_array(
        rng.standard_normal((HIDDEN, w)).astype(np.float32) / 8, f"w{n}{i}")
        for n, w in widths.items()]
    nodes = [helper.make_node("MatMul", [x, f"w{n}{i}"], [f"{n}{i}"]) for n in widths]
    window = {"local_window_size": WINDOW, "sliding_window_cache": 1} if i == 0 else {}
    nodes.append(helper.make_node(
        "GroupQueryAttention",
        [f"q{i}", f"k{i}", f"v{i}", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
         "seqlens_k", "total_len"],
        [f"h{i}", f"present.{i}.key", f"present.{i}.value"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, **window))
    return nodes, inits


def _decoder(path: str) -> None:
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "one"], ["seqlen"], keepdims=0),
        helper.make_node("Sub", ["seqlen", "one"], ["seqlen_1"]),
        helper.make_node("Cast", ["seqlen_1"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"], start=1),
        helper.make_node("Cast", ["mask_shape"], ["total_len"], to=TensorProto.INT32),
    ]
    inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "one")]
    x, outputs, cache = "inputs_embeds", [], []
    for i in range(2):
        n, w = _layer(i, x)
        nodes += n
        inits += w
        x = f"h{i}"
        for kv in ("key", "value"):
            cache.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kv}", TensorProto.FLOAT,
                ["batch_size", KV_HEADS, PAST[i], HEAD_DIM]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kv}", TensorProto.FLOAT,
                ["batch_size", KV_HEADS, f"total_{PAST[i]}", HEAD_DIM]))
    graph = helper.make_graph(
        [*nodes, helper.make_node("Identity", [x], ["logits"])], "window", [
            helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT,
                                          ["batch_size", "sequence_length", HIDDEN]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                          ["batch_size", "total_sequence_length"]), *cache],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                        ["batch_size", "sequence_length", HEADS * HEAD_DIM]),
         *outputs], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)],
                                 ir_version=10),
              path)


def _macs(s: int, c: int) -> int:
    return 2 * 2048 * s + 64 * s * c + 64 * s * WINDOW


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("window") / "decoder.onnx")
    _decoder(path)
    return path


def test_the_window_capacity_is_pinned_from_the_attention_node(decoder: str) -> None:
    result = onnxlens.analyze(decoder, dims={"sequence_length": 1, "past_sequence_length": 31,
                                             "total_sequence_length": 32, "batch_size": 1})
    assert result.dims_added == {"past_sliding_length": WINDOW}
    assert any("past_sliding_length=8 added" in w and "sliding-window" in w
               for w in result.warnings)
    assert result.total.macs == _macs(1, 32)


def test_a_windowed_layer_decodes_over_its_window_and_holds_it(decoder: str) -> None:
    result = onnxlens.analyze(decoder, prompt_len=4, context_len=[5, 32])
    llm = result.llm
    assert llm["dims"]["past"] == "past_sequence_length"
    assert llm["sliding_window"] == [{"window": WINDOW, "layers": 1}]
    assert llm["kv_cache_bytes_per_token"] == 2 * 128
    assert llm["prefill"]["macs"] == 2 * 2048 * 4 + 64 * 4 * 4 + 64 * 4 * WINDOW
    sweep = llm["context_sweep"]
    assert [d["macs"] for d in sweep] == [_macs(1, 5), _macs(1, 32)]
    assert [d["memory"]["kv_cache_bytes"] for d in sweep] == [
        128 * (5 + WINDOW), 128 * (32 + WINDOW)]


def test_ort_runs_the_decode_step_at_the_dims_the_view_pins(decoder: str) -> None:
    """The decode dims are ones ONNX Runtime executes (a window cache under W it refuses): the
    window layer's present keeps its W tokens (the view's count), the global layer's holds the
    whole context."""
    ort = pytest.importorskip("onnxruntime")
    result = onnxlens.analyze(decoder, context_len=32)
    dims = result.llm["decode"]["dims"] | result.dims_added
    sess = ort.InferenceSession(decoder, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"inputs_embeds": rng.standard_normal((1, 1, HIDDEN), np.float32),
             "attention_mask": np.ones((1, dims["total_sequence_length"]), np.int64)}
    for i in range(2):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal(
                (1, KV_HEADS, dims[PAST[i]], HEAD_DIM), np.float32)
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    assert out["present.0.key"].shape[2] == WINDOW
    assert out["present.1.key"].shape[2] == 32
