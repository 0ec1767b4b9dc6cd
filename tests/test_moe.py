"""MoE and QMoE (ONNX Runtime's mixture-of-experts contrib ops) on one hand-built node each, run
by ONNX Runtime (so the layout read is the one it accepts) and costed against a hand count.

T = 5 tokens of H = 16, E = 4 experts of I = 8, top k = 2, SwiGLU fused into fc1 (F = 2, 16
rows), fc1 and fc2 biases, routing weights normalized. Per token:

    MACs   = k · (H·F·I + I·H) = 2 · (256 + 128) = 768
    FLOPs  = router softmax 5E - 2 = 18, top-k k·(E - 1) = 6, normalize 2k - 1 = 3,
             weighted sum 2·k·H = 64; per expert biases F·I + H = 32, SwiGLU 5·I = 40
             (+ 3·I = 24 clamps with swiglu_limit): 18 + 6 + 3 + 64 + 2 · (32 + 40) = 235
    transcendental = E + k·I = 20

QMoE (4 bits) adds the dequantization of the picked experts' weights, 2 per weight:
2 · k · (H·F·I + I·H) = 1536 per token; its parameters are every expert's weights,
E · (H·F·I + I·H) = 1536, stored at half a byte.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens

T, H, E, INTER, K = 5, 16, 4, 8, 2
MACS, FLOPS, TRANSCENDENTAL = T * 768, T * 235, T * 20


def _model(op: str, weights: dict[str, np.ndarray], inputs: list[str], **attrs: object
           ) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "router", *inputs], ["y"], domain="com.microsoft",
                            k=K, activation_type="swiglu", swiglu_fusion=1,
                            normalize_routing_weights=1, **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, H]),
         helper.make_tensor_value_info("router", TensorProto.FLOAT, [T, E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, H])],
        [numpy_helper.from_array(v, n) for n, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _moe() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = {"fc1": rng.standard_normal((E, 2 * INTER, H)), "b1": rng.standard_normal((E, 2 * INTER)),
         "fc2": rng.standard_normal((E, H, INTER)), "b2": rng.standard_normal((E, H))}
    return _model("MoE", {n: v.astype(np.float32) for n, v in w.items()},
                  ["fc1", "b1", "fc2", "b2"])


def _qmoe() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = {"fc1": rng.integers(0, 256, (E, 2 * INTER, H // 2), dtype=np.uint8),
         "s1": rng.random((E, 2 * INTER), dtype=np.float32),
         "b1": rng.standard_normal((E, 2 * INTER)).astype(np.float32),
         "fc2": rng.integers(0, 256, (E, H, INTER // 2), dtype=np.uint8),
         "s2": rng.random((E, H), dtype=np.float32),
         "b2": rng.standard_normal((E, H)).astype(np.float32)}
    return _model("QMoE", w, ["fc1", "s1", "b1", "fc2", "s2", "b2"], expert_weight_bits=4)


def _run_in_ort(model: onnx.ModelProto) -> None:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    y = sess.run(None, {"x": rng.standard_normal((1, T, H), np.float32),
                        "router": rng.standard_normal((T, E), np.float32)})[0]
    assert y.shape == (1, T, H) and np.isfinite(y).all()


@pytest.mark.parametrize("limit", [None, 7.0])
def test_moe_costs_the_top_k_experts_a_token_runs(tmp_path, limit: float | None) -> None:
    model = _moe()
    if limit is not None:
        model.graph.node[0].attribute.append(helper.make_attribute("swiglu_limit", limit))
    _run_in_ort(model)
    onnx.save(model, tmp_path / "moe.onnx")
    result = onnxlens.analyze(tmp_path / "moe.onnx")
    assert not result.unsupported_ops and not result.incomplete
    clamps = 0 if limit is None else T * K * 3 * INTER
    assert result.total.macs == MACS
    assert result.total.flops() == 2 * MACS + FLOPS + clamps
    assert result.total.transcendental == TRANSCENDENTAL
    assert result.total.params == E * (H * 2 * INTER + INTER * H) + E * (2 * INTER + H)


def test_qmoe_dequantizes_the_picked_experts_and_stores_all_at_their_bits(tmp_path) -> None:
    model = _qmoe()
    _run_in_ort(model)
    onnx.save(model, tmp_path / "qmoe.onnx")
    result = onnxlens.analyze(tmp_path / "qmoe.onnx")
    assert not result.unsupported_ops and not result.incomplete
    assert result.total.macs == MACS
    assert result.total.flops() == 2 * MACS + FLOPS + T * 1536
    weights = E * (H * 2 * INTER + INTER * H)
    scales_biases = 2 * E * (2 * INTER + H)
    assert result.total.params == weights + scales_biases
    assert result.total.param_bytes == weights // 2 + 4 * scales_biases


def test_a_moe_with_an_unknown_activation_is_refused_by_name(tmp_path) -> None:
    model = _moe()
    for a in model.graph.node[0].attribute:
        if a.name == "activation_type":
            a.s = b"mish"
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(onnxlens.analyzer.errors.InvalidModelError, match="activation_type"):
        onnxlens.analyze(tmp_path / "bad.onnx")


@pytest.mark.parametrize(("tokens", "touched"), [(1, K), (T, E)])
def test_ort_reads_the_experts_its_tokens_pick(tmp_path, tokens: int, touched: int) -> None:
    """On ORT's CPU kernel a step reads the weights, scales and biases of at most
    min(E, tokens · k) experts: one token 2 of the 4, five tokens all of them."""
    from onnxlens.analyzer.runtimes.ort_cpu import picked_experts

    model = _moe()
    for t in (*model.graph.input, *model.graph.output):
        dims = t.type.tensor_type.shape.dim
        dims[1 if t.name != "router" else 0].dim_value = tokens
    onnx.save(model, tmp_path / "moe.onnx")
    result = onnxlens.analyze(tmp_path / "moe.onnx")
    key = next(iter(result.node_costs))
    cost = result.node_costs[key].cost
    tables = 4 * E * (2 * INTER * H + 2 * INTER + H * INTER + H)  # fc1, b1, fc2, b2 (float32)
    picked = picked_experts(result.graph.info(key), cost)
    assert picked.bytes_read == cost.bytes_read - tables * (E - touched) // E
    assert picked.param_bytes == tables * touched // E


def test_a_qmoe_output_gets_its_shape_where_ort_inference_has_none(tmp_path) -> None:
    """ORT 1.31's symbolic inference lacks QMoE: the node after it (the builder's residual
    add) had no shape and no cost. Its output is the input's shape."""
    model = _qmoe()
    model.graph.node[0].output[0] = "moe_out"
    model.graph.node.append(helper.make_node("Relu", ["moe_out"], ["y"]))
    onnx.save(model, tmp_path / "qmoe_relu.onnx")
    result = onnxlens.analyze(tmp_path / "qmoe_relu.onnx")
    assert not result.incomplete
    assert result.total.flops() == 2 * MACS + FLOPS + T * 1536 + T * H  # + the Relu's
