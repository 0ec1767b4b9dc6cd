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
from onnxlens.analyzer.cost.base import Cost
from onnxlens.analyzer.estimate import estimate_kernel
from onnxlens.analyzer.hardware import ORT_CPU, SUBCLASS_OF, load_profile, stored
from onnxlens.analyzer.host import host_profile
from onnxlens.analyzer.runtimes import Kernel
from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
from onnxlens.backends.calibrate import catalogue, fit, measure
from onnxlens.backends.ort_timing import profile_model

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
    from onnxlens.analyzer.runtimes.ort_moe import picked_experts

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


def _kernel(model: onnx.ModelProto, tmp_path) -> tuple[Kernel, Cost]:
    onnx.save(model, tmp_path / "m.onnx")
    result = onnxlens.analyze(tmp_path / "m.onnx")
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    [kernel] = ort_kernels(result.graph, result.groups[0], costs, 16)
    return kernel, next(iter(costs.values()))


@pytest.mark.parametrize(("make", "cls", "dequantize"), [(_moe, "moe", 0), (_qmoe, "qmoe", 1536)])
def test_ort_runs_a_moe_as_one_kernel_a_call_per_picked_expert(
        tmp_path, make, cls: str, dequantize: int) -> None:
    """ORT's kernel (`ort_moe`): T·k = 10 routes over E = 4 experts, all picked, a call each
    (fc1's GEMM, the scalar SwiGLU loop, fc2's GEMM); its reuse is H = 16, the MACs each of
    the F + 1 = 3 products does per activated inter value ((H·F·I + I·H) / (I·3)), so the
    curve's I / (I + i_half) is a cost per value, as the loop's. The estimator reads its
    class's curve at one call's FLOPs, 2·MACS / 4. QMoE's per-route dequantization (1536
    FLOPs a token, the node's cost) is not charged: ORT does not dequantize per row."""
    kernel, node = _kernel(make(), tmp_path)
    assert (kernel.cls, kernel.calls, kernel.reuse) == (cls, E, H)
    assert kernel.cost.macs == MACS
    assert kernel.cost.other_flops == node.other_flops - T * dequantize
    asked = []

    def efficiency(c: str, flops: float, intensity: float) -> float:
        asked.append((c, flops, intensity))
        return 0.1

    estimate_kernel(kernel, load_profile("xeon_8480"), stored("float32"), efficiency)
    assert asked == [(cls, 2 * MACS / E, H)]
    assert SUBCLASS_OF[cls] == "gemm"  # a calibration without its benchmarks


@pytest.mark.parametrize(("bits", "op"), [(0, "MoE"), (4, "QMoE")])
def test_a_moe_benchmark_is_one_kernel_of_its_class(bits: int, op: str) -> None:
    """The catalogue's MoE node (8 tokens of 32, 4 experts of 32, top 2; QMoE at 4 bits) is
    one ORT kernel; its point is its class's, a call per expert (16 routes pick all 4),
    MACs 8·2·(32·64 + 32·32) = 49152, reuse H = 32."""
    bench = catalogue.moe(8, 32, 32, 4, bits=bits)
    model = bench.build()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [op]
    point = measure._point(bench.name, model, 1e-4, 0.0, 0.0,
                           measure._kernels_of(ORT_CPU, host_profile(1)))
    assert point is not None
    assert (point.op_class, point.calls, point.macs, point.reuse) == (
        "qmoe" if bits else "moe", 4, 49152, 32)


def test_the_moe_curve_recovers_a_cost_per_mac_per_value_and_per_expert() -> None:
    """Synthetic MoE timings of the shape ORT's kernel has (module docstring of `ort_moe`):
    7.5 ps a MAC, 9.4 ns an activated inter value, 2 us a picked expert, at a peak of 400
    GFLOP/s, over the catalogue's shapes and two more. Read at its calls and reuse H, one
    curve fits them within 5% (its cross term f_half·i_half / (F·H) aside), at i_half = b /
    (3c) = 418 and e_max = 2 / (c·peak) = 0.67, and prices a shape it was not fitted on, 16
    tokens over 8 experts of 384 x 768, within 5%."""
    peak = 400e9

    def timing(tokens: int, hidden: int, inter: int, experts: int) -> tuple[float, ...]:
        routes = 2 * tokens
        calls, macs = min(experts, routes), routes * 3 * hidden * inter
        seconds = macs * 7.5e-12 + routes * inter * 9.4e-9 + calls * 2e-6
        return 2 * macs / calls, hidden, 2 * macs / peak / seconds

    shapes = [(128, 128, 128, 4), (32, 128, 128, 4), (1, 128, 128, 4), (128, 512, 128, 4),
              (128, 128, 512, 4), (64, 512, 512, 8), (256, 256, 256, 8), (8, 256, 1024, 4)]
    flops, reuse, eff = map(np.asarray, zip(*map(lambda s: timing(*s), shapes), strict=True))
    curve = fit.fit_curve(flops, reuse, eff)
    assert (curve.i_half, curve.e_max) == (pytest.approx(418, rel=0.05),
                                           pytest.approx(0.667, rel=0.05))
    for f, r, e in zip(flops, reuse, eff, strict=True):
        assert curve(f, r) == pytest.approx(e, rel=0.05)
    f, r, e = timing(16, 384, 768, 8)
    assert curve(f, r) == pytest.approx(e, rel=0.05)
