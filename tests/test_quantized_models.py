"""Models quantized and converted by ONNX Runtime's own tools, analyzed against their fp32 twin:
the same MACs (integer multiply-accumulates are MACs), parameters stored at their precision,
every node costed, and the precision that does the MACs named in the JSON."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import pytest
from quant_models import Reader, quantize_qdq, resnet18

from onnxlens.analyzer.analysis import AnalysisResult, analyze
from onnxlens.analyzer.cost.precision import combine
from onnxlens.analyzer.errors import OnnxLensError

quantization = pytest.importorskip("onnxruntime.quantization")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

T = onnx.TensorProto


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisResult]:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    d = tmp_path_factory.mktemp("quantized")
    fp32 = resnet18(d)
    quantize_qdq(fp32, d / "qdq.onnx")
    fmt = quantization.QuantFormat
    quantization.quantize_static(fp32, d / "qop.onnx", Reader(), quant_format=fmt.QOperator)
    quantization.quantize_dynamic(fp32, d / "dynamic.onnx")
    onnx.save(convert_float_to_float16(onnx.load(fp32)), d / "fp16.onnx")
    return {"fp32": analyze(fp32), "qdq": analyze(d / "qdq.onnx"),
            "qoperator": analyze(d / "qop.onnx"),  # QLinearGlobalAveragePool, QGemm: loader
            "dynamic": analyze(d / "dynamic.onnx"), "fp16": analyze(d / "fp16.onnx")}


@pytest.mark.parametrize("name", ["qdq", "qoperator", "dynamic", "fp16"])
def test_every_node_costed_and_macs_equal_the_fp32_twin(models: dict[str, AnalysisResult],
                                                        name: str) -> None:
    result, fp32 = models[name], models["fp32"]
    assert not result.unsupported_ops and not result.incomplete
    assert all(nc.cost is not None for nc in result.node_costs.values())
    # ResNet-18's Conv + Gemm MACs at 64x64 (DESIGN.md's 1,814,073,344 at 224 scales with the
    # spatial area of the convolutions, not the Gemm's: checked against the fp32 analysis).
    assert fp32.total.macs == 148_557_824
    assert abs(result.total.macs - fp32.total.macs) <= 0.01 * fp32.total.macs


@pytest.mark.parametrize(("name", "dtype"), [("fp32", "float32"), ("qdq", "int8"),
                                             ("qoperator", "int8"), ("dynamic", "int8"),
                                             ("fp16", "float16")])
def test_macs_by_dtype_names_the_precision(models: dict[str, AnalysisResult], name: str,
                                           dtype: str) -> None:
    result = models[name]
    totals = result.to_dict()["totals"]
    assert totals["macs_by_dtype"] == {dtype: result.total.macs}
    # Every group that does MACs has that precision.
    groups = result.to_dict()["groups"]
    assert {g["precision"] for g in groups if g["macs"]} == {dtype}


def test_param_bytes_at_the_stored_precision(models: dict[str, AnalysisResult]) -> None:
    fp32 = models["fp32"].total.param_bytes
    assert fp32 == 4 * models["fp32"].total.params
    # fp16: every weight 2 bytes (all initializers are float tensors here).
    assert models["fp16"].total.param_bytes == fp32 // 2
    # int8: weights 1 byte, plus per-channel scales and zero points and the int32 biases:
    # about a quarter.
    for name in ("qdq", "qoperator", "dynamic"):
        ratio = models[name].total.param_bytes / fp32
        assert 0.25 <= ratio < 0.26, (name, ratio)


@pytest.mark.parametrize(("name", "own"), [("fp32", "fp32"), ("qdq", "graph"),
                                           ("qoperator", "graph"), ("fp16", "graph")])
def test_an_estimate_runs_at_the_graph_precision(models: dict[str, AnalysisResult], name: str,
                                                 own: str) -> None:
    """Unless told, a model is estimated at its own precision: each MAC group at the peak of
    the precision that does its MACs (A100: int8 624 TOP/s, fp16 312 TFLOP/s, fp32 19.5),
    its bytes as stored; an fp32 model's own estimate is its fp32 one. Checked on the groups
    with the most MACs, against the roofline by hand."""
    from onnxlens.analyzer.hardware import load_profile

    result, hw = models[name], load_profile("a100")
    est = result.estimate(hw)
    assert result.default_precision == est.precision == own
    peak = {"fp32": 19.5e12, "graph": {"qdq": 624e12, "qoperator": 624e12,
                                       "fp16": 312e12}.get(name)}[own]
    assert hw.peak_flops({"int8": "int8", "float16": "fp16", "float32": "fp32"}[
        result.group_precisions[_biggest(result)]]) == peak
    group = result.group_costs[_biggest(result)].cost
    e = est.groups[_biggest(result)]
    vector = group.other_flops / 19.5e12  # tau 1: an uncalibrated profile
    assert e.compute_s == pytest.approx((2 * group.macs / peak + vector) / hw.efficiency["conv"])
    nbytes = group.bytes_read + group.bytes_written  # as stored: no what-if scale
    assert e.intensity == pytest.approx(group.flops(2) / nbytes)
    if own == "fp32":
        assert est == result.estimate(hw, "fp32")
    else:
        with pytest.raises(OnnxLensError, match="graph's own precision"):
            result.estimate(hw, "fp16")
        assert result.estimate(hw, "graph") == est


def _biggest(result: AnalysisResult) -> int:
    """The group with the most MACs (a 3x3 Conv of ResNet-18)."""
    return max(result.group_costs, key=lambda g: result.group_costs[g].cost.macs)


def test_the_json_says_which_precision_an_estimate_ran_at(
        models: dict[str, AnalysisResult]) -> None:
    from onnxlens.analyzer.hardware import load_profile

    result = models["qdq"]
    result.add_estimate(load_profile("h100"))
    d = result.to_dict()
    assert d["estimates"]["h100"]["precision"] == "graph"
    assert {g["precision"] for g in d["groups"] if g["macs"]} == {"int8"}


def test_a_qdq_group_precision_follows_dequantization() -> None:
    # uint8 activations x int8 weights, both dequantized: int8 MACs; an int4 weight
    # dequantized for a float16 activation (weight-only): float16; int8 x int4: int8.
    assert combine([T.UINT8, T.INT8]) == "int8"
    assert combine([T.FLOAT16, T.INT4]) == "float16"
    assert combine([T.INT8, T.UINT4]) == "int8"
    assert combine([T.FLOAT8E4M3FN, T.FLOAT8E4M3FN]) == "float8e4m3fn"
    assert combine([T.BFLOAT16, T.BFLOAT16]) == "bfloat16"
    assert combine([0, 0]) is None
    # operands of one width and two types: the first operand's, whatever the order
    assert combine([T.FLOAT16, T.BFLOAT16]) == "float16"
    assert combine([T.BFLOAT16, T.FLOAT16]) == "bfloat16"
    assert combine([T.FLOAT8E5M2, T.FLOAT8E4M3FN]) == "float8e5m2"
    assert combine([T.FLOAT8E4M3FN, T.FLOAT8E5M2]) == "float8e4m3fn"


def _blocked_int4_model(weight_type: int = T.INT4) -> onnx.ModelProto:
    """x [3, 64] (float) x W [64, 10]: W stored as 4-bit values, dequantized by blocks of 16
    along K (opset 21's blocked DequantizeLinear), scales [4, 10] float."""
    h = onnx.helper
    rng = np.random.default_rng(0)
    w = h.make_tensor("w", weight_type, [64, 10], rng.integers(0, 7, 640).tolist())
    scale = h.make_tensor("s", T.FLOAT, [4, 10], (rng.random(40) + 0.5).tolist())
    nodes = [h.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=16),
             h.make_node("MatMul", ["x", "wf"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 64])],
                         [h.make_tensor_value_info("y", T.FLOAT, [3, 10])], [w, scale])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])


def test_int4_weights_are_packed_and_weight_only_macs_are_float() -> None:
    result = analyze(_blocked_int4_model())
    # 640 4-bit weights: 320 bytes; 40 float scales: 160 bytes.
    assert result.total.params == 640 + 40
    assert result.total.param_bytes == 320 + 160
    # MACs: 3 x 10 outputs x K 64, at the activation's precision (weights dequantized).
    assert result.macs_by_dtype == {"float32": 3 * 10 * 64}
    # The DequantizeLinear: 640 elements x (convert, * scale) = 1280 FLOPs; reads 320 + 160.
    dq = result.node_costs[result.graph.order[0]].cost
    assert dq is not None
    assert (dq.other_flops, dq.bytes_read, dq.bytes_written) == (1280, 480, 640 * 4)


def test_uint8_activation_through_a_transpose_is_int8() -> None:
    # x (uint8) -> DQ -> Transpose -> MatMul with an int8 weight behind a DQ: int8 MACs.
    h = onnx.helper
    w = h.make_tensor("w", T.INT8, [4, 6], [1] * 24)
    one = h.make_tensor("one", T.FLOAT, [], [0.5])
    nodes = [h.make_node("DequantizeLinear", ["x", "one"], ["xf"]),
             h.make_node("Transpose", ["xf"], ["xt"], perm=[1, 0]),
             h.make_node("DequantizeLinear", ["w", "one"], ["wf"]),
             h.make_node("MatMul", ["xt", "wf"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.UINT8, [4, 5])],
                         [h.make_tensor_value_info("y", T.FLOAT, [5, 6])], [w, one])
    result = analyze(h.make_model(graph, opset_imports=[h.make_opsetid("", 21)]))
    assert result.macs_by_dtype == {"int8": 5 * 6 * 4}
    matmul_group = next(g for g in result.to_dict()["groups"] if g["macs"])
    assert matmul_group["precision"] == "int8"


def test_a_short_last_block_is_valid() -> None:
    # ONNX's blocked rule: ceil(64 / 24) = 3 blocks along K, the last one short. Not refused.
    model = _blocked_int4_model()
    scale = onnx.helper.make_tensor("s", T.FLOAT, [3, 10], [0.5] * 30)
    model.graph.initializer[1].CopyFrom(scale)
    model.graph.node[0].attribute[1].i = 24  # block_size
    result = analyze(model)
    assert result.total.params == 640 + 30 and result.macs_by_dtype == {"float32": 1920}


def _mlp() -> onnx.ModelProto:
    """x [1, 7, 128] -> MatMul [128, 256] -> Relu -> MatMul [256, 64]."""
    h, rng = onnx.helper, np.random.default_rng(0)
    weights = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (128, 256)), ("w2", (256, 64)))]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Relu", ["a"], ["r"]),
             h.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, [1, 7, 128])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 7, 64])], weights)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize(("accuracy_level", "dtype"), [(0, "float32"), (4, "int8")])
def test_matmul_n_bits_from_ort_quantizer(accuracy_level: int, dtype: str) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    fp32 = analyze(_mlp())
    quantizer = MatMulNBitsQuantizer(_mlp(), block_size=32, is_symmetric=False,
                                     accuracy_level=accuracy_level)
    quantizer.process()
    model = quantizer.model.model
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits", "Relu", "MatMulNBits"]
    result = analyze(model)
    assert not result.incomplete and not result.unsupported_ops
    # The fp32 MLP's MACs: 7 x (128 x 256 + 256 x 64).
    assert result.total.macs == fp32.total.macs == 7 * (128 * 256 + 256 * 64)
    assert result.macs_by_dtype == {dtype: result.total.macs}
    # 49,152 4-bit weights: 24,576 bytes; a float scale per block of 32 along K: 4 x 256 +
    # 8 x 64 = 1,536 scales (6,144 bytes); as many 4-bit zero points, packed per column:
    # 256 x 2 + 64 x 4 = 768 bytes. Parameters: the weights, scales and zero points.
    assert result.total.param_bytes == 24_576 + 6_144 + 768
    assert result.total.params == 49_152 + 1_536 + 1_536


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisResult]:
    """A 2-layer BERT (hidden 64, 2 heads, FFN 128, seq 16, random weights): fp32, quantized by
    quantize_dynamic (the issue's BERT case), and rewritten by ORT's transformer optimizer
    (com.microsoft SkipLayerNormalization and Gelu), then that quantized too."""
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    d = tmp_path_factory.mktemp("bert")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100,
                                     max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = module

        def forward(self, ids: Any, mask: Any, types: Any) -> Any:
            return self.bert(input_ids=ids, attention_mask=mask,
                             token_type_ids=types).last_hidden_state

    ids = torch.randint(0, 100, (1, 16))
    ones, zeros = torch.ones(1, 16, dtype=torch.int64), torch.zeros(1, 16, dtype=torch.int64)
    fp32 = d / "bert.onnx"
    torch.onnx.export(Hidden(), (ids, ones, zeros), fp32, dynamo=False, opset_version=17,
                      input_names=["ids", "mask", "types"])
    optimize_model(str(fp32), model_type="bert", num_heads=2,
                   hidden_size=64).save_model_to_file(str(d / "opt.onnx"))
    float_default = {"DefaultTensorType": T.FLOAT}
    quantization.quantize_dynamic(fp32, d / "dynamic.onnx")
    quantization.quantize_dynamic(d / "opt.onnx", d / "opt_dynamic.onnx",
                                  extra_options=float_default)
    return {name: analyze(d / f"{name}.onnx")
            for name in ("bert", "dynamic", "opt", "opt_dynamic")}


def test_bert_dynamic_and_optimized(bert: dict[str, AnalysisResult]) -> None:
    # Per layer: Q, K, V, output projections 4 x 16x64x64; FFN 2 x 16x64x128; attention
    # Q K^T and P V, 2 heads x 16x16 scores x 32 each.
    per_layer = 4 * 16 * 64 * 64 + 2 * 16 * 64 * 128 + 2 * 2 * 16 * 16 * 32
    for name, result in bert.items():
        assert not result.incomplete and not result.unsupported_ops, name
        assert result.total.macs == 2 * per_layer, name
    ops = {(n.domain, n.op_type) for n in bert["opt"].graph.infos.values()}
    assert {("com.microsoft", "SkipLayerNormalization"), ("com.microsoft", "Gelu")} <= ops
    # Dynamic quantization makes the 12 weight MatMuls int8 (DynamicQuantizeLinear +
    # MatMulInteger); the attention products of two activations stay float32.
    for name in ("dynamic", "opt_dynamic"):
        assert bert[name].macs_by_dtype == {"int8": 2 * (per_layer - 2 * 2 * 16 * 16 * 32),
                                            "float32": 2 * 2 * 2 * 16 * 16 * 32}


@pytest.mark.parametrize(("elem_type", "values", "nbytes"), [
    (T.FLOAT, 15, 60), (T.FLOAT16, 15, 30), (T.BFLOAT16, 15, 30), (T.INT8, 15, 15),
    (T.UINT8, 15, 15), (T.FLOAT8E4M3FN, 15, 15), (T.FLOAT8E5M2, 15, 15),
    (T.FLOAT8E4M3FNUZ, 15, 15), (T.FLOAT8E5M2FNUZ, 15, 15),
    (T.INT4, 15, 8), (T.UINT4, 16, 8), (T.FLOAT4E2M1, 3, 2),  # two per byte, rounded up
])
def test_bytes_at_the_stored_precision(elem_type: int, values: int, nbytes: int) -> None:
    from onnxlens.analyzer.ir import TensorInfo

    assert TensorInfo("t", elem_type, (values,)).nbytes == nbytes


def _qdq_pair(scale: float) -> onnx.ModelProto:
    """x [2, 4] -> QuantizeLinear -> DequantizeLinear -> y, both at `scale`, zero point 0."""
    h = onnx.helper
    consts = [onnx.numpy_helper.from_array(np.array(scale, np.float32), "s"),
              onnx.numpy_helper.from_array(np.array(0, np.uint8), "z")]
    graph = h.make_graph([h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
                          h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")],
                         "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2, 4])], consts)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 19)], ir_version=9)


def test_an_infinite_scale_is_a_warning() -> None:
    """ORT's quantizer writes an inf scale for a tensor whose range overflows float32 (a
    TorchScript attention mask) and ORT runs the model: analyzed with a warning naming node and
    scale, costed as a finite scale (Q: 5 FLOPs per element with a zero point, DQ: 3); a NaN
    scale stays an error."""
    result = analyze(_qdq_pair(np.inf))
    assert [w for w in result.warnings if "holds inf" in w] == [
        "node 'q' (QuantizeLinear): scale 's' holds inf (the quantizer met a range past "
        "float32's): the tensor quantizes to its zero point and dequantizes to NaN; costed as "
        "any other scale",
        "node 'dq' (DequantizeLinear): scale 's' holds inf (the quantizer met a range past "
        "float32's): the tensor quantizes to its zero point and dequantizes to NaN; costed as "
        "any other scale"]
    assert result.total == analyze(_qdq_pair(0.5)).total
    assert result.total.other_flops == 8 * (5 + 3)
    ort.InferenceSession(_qdq_pair(np.inf).SerializeToString(),
                         providers=["CPUExecutionProvider"])  # ORT loads it
    with pytest.raises(OnnxLensError, match="scale 's' holds nan"):
        analyze(_qdq_pair(np.nan))


def test_qlinear_softmax_passes_its_shape_on() -> None:
    """The QOperator BERT's QLinearSoftmax (com.microsoft), whose shape neither onnx's nor
    ORT's symbolic inference gives: its output has its input's shape, so the DequantizeLinear
    after it is costed (3 FLOPs per element with a zero point: 2 x 3 x 8 = 48 elements)."""
    h = onnx.helper
    consts = [onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s"),
              onnx.numpy_helper.from_array(np.array(0, np.uint8), "z")]
    graph = h.make_graph(
        [h.make_node("QLinearSoftmax", ["x", "s", "z", "s", "z"], ["p"], domain="com.microsoft",
                     axis=-1, opset=13),
         h.make_node("DequantizeLinear", ["p", "s", "z"], ["y"])],
        "g", [h.make_tensor_value_info("x", T.UINT8, [2, 3, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, ["a", "b", "c"])], consts)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 19),
                                               h.make_opsetid("com.microsoft", 1)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.zeros((2, 3, 8), np.uint8)})[0].shape == (2, 3, 8)
    result = analyze(model)
    dq = next(k for k in result.node_costs if result.graph.info(k).op_type == "DequantizeLinear")
    assert result.node_costs[dq].cost is not None
    assert result.node_costs[dq].cost.other_flops == 48 * 3


def test_ort_cpu_runs_an_fp16_conv_as_fp32_with_its_clip_apart() -> None:
    """ORT's CPU provider runs an fp16 Conv + ReLU6 (Clip with constant bounds) as the fp32
    Conv with the Clip a kernel of its own in NCHW (its profile: reorders around the Clip): the
    kernel model says so, and charges the Conv twice its stored (float16) bytes."""
    import onnx_ir
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from onnxlens.analyzer.runtimes.ort_cpu import NCHW, ort_kernels
    from onnxlens.analyzer.runtimes.ort_fp16 import float16_as_float32, float32_nodes
    from onnxlens.backends.calibrate.catalogue import conv
    from onnxlens.backends.ort_timing import profile_model

    ir = onnx_ir.from_proto(convert_float_to_float16(conv(16, 16, 12, act="Clip").build(),
                                                     keep_io_types=True))
    ir.graph.sort()
    model = onnx_ir.to_proto(ir)
    kernels = [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]]
    assert "Clip" in kernels and kernels.count("ReorderOutput") >= 1
    result = analyze(model)
    group = next(g for g in result.groups if g.pattern.startswith("Conv"))
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    conv_k, clip_k = ort_kernels(result.graph, group, costs, 16)
    assert result.graph.info(clip_k.nodes[0]).op_type == "Clip" and clip_k.reads == NCHW
    stored = conv_k.cost
    assert stored.bytes_written == 16 * 12 * 12 * 2  # float16 as stored
    run = float16_as_float32(conv_k, float32_nodes(result.graph)).cost
    assert (run.bytes_read, run.bytes_written, run.param_bytes) == (
        2 * stored.bytes_read, 2 * stored.bytes_written, 2 * stored.param_bytes)
    assert run.macs == stored.macs == 16 * 16 * 9 * 12 * 12


def _residual_convs(directory: Any, activations: Any) -> onnx.ModelProto:
    """x -> Conv -> a -> Conv -> b -> Conv -> c, y = c + b (8 channels, 3x3, 16x16), quantized
    by quantize_static (QDQ, per channel) with `activations` of that QuantType: b has two
    readers, every other tensor one."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    shape = [1, 8, 16, 16]
    pairs = [("x", "a"), ("a", "b"), ("b", "c")]
    nodes = [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[1] * 4)
             for i, (x, y) in enumerate(pairs)] + [helper.make_node("Add", ["c", "b"], ["y"])]
    weights = [numpy_helper.from_array(rng.standard_normal(s, dtype=np.float32) * 0.1, f"{n}{i}")
               for i in range(3) for n, s in (("w", (8, 8, 3, 3)), ("b", (8,)))]
    graph = onnx.helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", T.FLOAT, shape)],
        [helper.make_tensor_value_info("y", T.FLOAT, shape)], weights)
    fp32 = directory / f"fp32-{activations.name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), fp32)
    out = directory / f"qdq-{activations.name}.onnx"
    quantization.quantize_static(fp32, out, Reader(tuple(shape)), per_channel=True,
                                 quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=activations)
    return onnx.load(out)


def test_ort_cpu_leaves_int8_activations_of_shared_tensors_unfused(tmp_path: Any) -> None:
    """With int8 activations (quantize_static's default) ORT on x86 turns to uint8 only the
    Q -> DQ pairs whose tensor one node unit reads, and fuses no Conv reading or writing int8:
    of the three Convs only the first (its input and output each read once) is a
    QLinearConv; the second (writing b, read twice), the third (reading b) and the Add run as
    DQ, float kernel and Q, b's DQ copied per reader. The kernel model names the same kernels
    as ORT's profile, costs the float Conv at fp32 on float weights, and runs all three Convs
    as QLinearConv with uint8 activations."""
    from collections import Counter

    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.ort_timing import profile_model

    def kernel_ops(model: onnx.ModelProto) -> tuple[Counter[str], Counter[str], list[Any]]:
        profiled = Counter(k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0])
        result = analyze(model)
        costs = {k: nc.cost for k, nc in result.node_costs.items()}
        kernels = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)]
        names = Counter(k.cls if "_int8" in k.cls else result.graph.info(
            k.nodes[0]).op_type for k in kernels)
        return profiled, names, kernels

    qtype = quantization.QuantType
    profiled, modelled, kernels = kernel_ops(_residual_convs(tmp_path, qtype.QInt8))
    # (8 output channels: MLAS's symmetric kernel wants 16, so QLinearConv's im2col path)
    for ort_name, ours in (("QLinearConv", "conv_int8_im2col"), ("Conv", "Conv"), ("Add", "Add"),
                           ("DequantizeLinear", "DequantizeLinear"),
                           ("QuantizeLinear", "QuantizeLinear")):
        assert profiled[ort_name] == modelled[ours], ort_name
    assert (profiled["QLinearConv"], profiled["Conv"], profiled["DequantizeLinear"]) == (1, 2, 9)
    float_conv = next(k for k in kernels if k.peak == "fp32" and k.cls == "conv_unpacked")
    pixels = 8 * 16 * 16
    assert float_conv.cost.macs == pixels * 8 * 9
    # x, its float weights and bias (the DQs' outputs) read; y written, all float32
    assert float_conv.cost.bytes_read == 4 * (pixels + 8 * 8 * 9 + 8)
    assert float_conv.cost.bytes_written == 4 * pixels

    profiled, modelled, _ = kernel_ops(_residual_convs(tmp_path, qtype.QUInt8))
    assert profiled["QLinearConv"] == modelled["conv_int8_im2col"] == 3
    assert profiled["Conv"] == modelled["Conv"] == 0


def test_a_qoperator_conv_on_int8_activations_is_its_own_class() -> None:
    """quantize_static's default QOperator Conv reads int8 activations: ORT's profile shows a
    QLinearConv (between NHWC transposes), which MLAS runs in its portable int8 x int8 GEMM
    on x86; the kernel model costs it as GEMM_S8S8 with the Conv's MACs, its uint8 twin as
    conv_int8, and the calibration catalogue times such kernels."""
    from onnxlens.analyzer.hardware import GEMM_S8S8, INT8_CLASSES
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.calibrate import catalogue
    from onnxlens.backends.ort_timing import profile_model

    for mode, cls in (("qop-s8", GEMM_S8S8), ("qdq", "conv_int8")):
        model = catalogue.quantized(catalogue.conv(16, 16, 12), mode).build()
        assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [
            "Transpose", "QLinearConv", "Transpose"]
        result = analyze(model)
        costs = {k: nc.cost for k, nc in result.node_costs.items()}
        kernel = next(k for g in result.groups
                      for k in ort_kernels(result.graph, g, costs, 16) if k.cost.macs)
        assert kernel.cls == cls and kernel.cost.macs == 16 * 16 * 9 * 12 * 12
    assert GEMM_S8S8 in INT8_CLASSES
    assert sum(b.name.endswith("QOperator s8s8") for b in catalogue.benchmarks()) == 3


def test_ort_cpu_runs_a_dynamic_conv_as_a_kernel_per_node() -> None:
    """quantize_dynamic's Conv: ORT fuses nothing of ConvInteger's chain (it has no
    DynamicQuantizeMatMul for convolutions), so its profile names one kernel per node, and
    the kernel model names the same ones in the same order, the bias and scale Reshapes of
    constants folded; the Cast reads the int32 output and writes it as float32."""
    from onnxlens.analyzer.hardware import CONV_INTEGER
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.calibrate import catalogue
    from onnxlens.backends.ort_timing import profile_model

    model = catalogue.quantized(catalogue.conv(16, 16, 12, act="Clip"), "dynamic").build()
    profiled = [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]]
    result = analyze(model)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    kernels = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)]
    ops = [result.graph.info(k.nodes[0]).op_type for k in kernels]
    assert sorted(ops) == sorted(profiled)
    assert profiled.count("Mul") == 2 and len(profiled) == 7
    assert next(k for k in kernels if k.cost.macs).cls == CONV_INTEGER
    cast = kernels[ops.index("Cast")].cost
    assert (cast.bytes_read, cast.bytes_written) == (4 * 16 * 12 * 12, 4 * 16 * 12 * 12)


def _dequantize(shape: list[int], axis: int | None, block_size: int = 0) -> onnx.ModelProto:
    """y = DequantizeLinear(x int8 of `shape`), per tensor (`axis` None), per axis or blocked."""
    from onnx import helper, numpy_helper

    scale_shape: list[int] = [] if axis is None else [shape[axis]]
    if block_size:
        scale_shape = [d // block_size if i == axis else d for i, d in enumerate(shape)]
    scale = numpy_helper.from_array(np.full(scale_shape, 0.02, np.float32), "s")
    attrs = {} if axis is None else {"axis": axis}
    if block_size:
        attrs["block_size"] = block_size
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s"], ["y"], **attrs)], "dq",
        [helper.make_tensor_value_info("x", T.INT8, shape)],
        [helper.make_tensor_value_info("y", T.FLOAT, shape)], [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize(("shape", "axis", "block_size", "blocks"), [
    ([64, 32, 3, 3], None, 0, 1),  # per tensor: one loop over all
    ([64, 32, 3, 3], 0, 0, 64),  # a Conv weight per channel: 64 loops of 288
    ([256, 512], 1, 0, 256 * 512),  # a MatMul weight per column: a loop per element
    ([1, 64, 56, 56], 1, 0, 64),  # an activation per channel
    ([256, 512], 0, 32, 256),  # blocked along K: a loop over N per row
])
def test_a_dequantize_runs_one_block_per_index_up_to_its_axis(shape, axis, block_size,
                                                                blocks) -> None:
    from onnxlens.analyzer.runtimes.ort_cpu import DEQUANTIZE, ort_kernels

    result = analyze(_dequantize(shape, axis, block_size))
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)]
    assert (kernel.cls, kernel.calls) == (DEQUANTIZE, blocks)


def test_a_dequantize_pays_its_curves_fixed_cost_per_block_once_calibrated() -> None:
    """A [256, 512] DQ per column: 131,072 blocks. With a curve f / (f + f_half) the
    estimator charges (F + blocks x f_half) / peak, hand-derived; a calibration whose
    dequantize benchmarks all made one call (an older file) reads it per kernel."""
    from onnxlens.analyzer.estimate import estimate_group
    from onnxlens.analyzer.hardware import Runtime, what_if
    from onnxlens.analyzer.host import host_profile
    from onnxlens.analyzer.runtimes.ort_cpu import DEQUANTIZE, MODEL

    result = analyze(_dequantize([256, 512], 1))
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    base = host_profile(1)
    kernels = {}
    for classes in (frozenset(), frozenset({DEQUANTIZE})):
        hw = dataclasses.replace(base, runtime=Runtime("ort-cpu", per_call_classes=classes))
        (kernels[classes],) = [k for run in MODEL.kernels(
            result.graph, result.groups, costs, {}, hw).values() for k in run or ()]
    assert kernels[frozenset()].calls == 1
    kernel = kernels[frozenset({DEQUANTIZE})]
    assert kernel.calls == 256 * 512
    flops = kernel.cost.vector_flops(1.0)
    assert flops == 2 * 256 * 512  # x x scale and the int -> float convert (no zero point)

    def curve(cls: str, f: float, intensity: float) -> float:
        assert cls == DEQUANTIZE
        return f / (f + 10.0)

    est = estimate_group(kernel.cost, kernel.cls, base, what_if("fp32"), curve,
                         calls=kernel.calls)
    assert est.compute_s == pytest.approx((flops + 256 * 512 * 10.0) / base.peak_flops("fp32"))


@pytest.mark.parametrize(("group", "cls", "calls"), [(16, "grouped_conv_integer", 16),
                                                     (1, "conv_integer", 1)])
def test_a_grouped_conv_integer_is_a_gemm_call_per_group(group, cls, calls) -> None:
    """ORT's ConvInteger makes an im2col and a MlasGemm per image and group: a depthwise one
    of 16 channels is 16 calls of M 1, K 9, N 144 (reuse 2·9·144 / (4·(9 + 1296 + 144))); a
    dense one is one call of the curve ConvInteger always had."""
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.calibrate import catalogue

    model = catalogue.quantized(catalogue.conv(16, 16, 12, group=group), "dynamic").build()
    result = analyze(model)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)
                 if k.cost.macs]
    assert (kernel.cls, kernel.calls) == (cls, calls)
    reuse = 2 * 9 * 144 / (4 * (9 + 9 * 144 + 144)) if group > 1 else 0.0
    assert kernel.reuse == pytest.approx(reuse)


def test_a_calibration_point_carries_its_largest_kernels_work_alone() -> None:
    """quantize_dynamic's depthwise Conv is 6 ORT kernels; its calibration point is the
    grouped ConvInteger's: its MACs (64 channels x 9 x 48²), none of the other kernels'
    FLOPs (DynamicQuantizeLinear, Cast, Mul, Add: the estimator costs them apart), 64 calls."""
    from onnxlens.analyzer.hardware import ORT_CPU
    from onnxlens.analyzer.host import host_profile
    from onnxlens.backends.calibrate import catalogue
    from onnxlens.backends.calibrate.measure import _kernels_of, _point

    model = catalogue.quantized(catalogue.depthwise(64, 48), "dynamic").build()
    p = _point("dw", model, 1e-3, 0.0, 0.0, _kernels_of(ORT_CPU, host_profile(1)))
    assert p is not None
    assert (p.op_class, p.macs, p.other_flops, p.calls) == (
        "grouped_conv_integer", 64 * 9 * 48 * 48, 0, 64)


def test_a_qdq_add_fetches_its_scales_at_its_own_classes_rate() -> None:
    """A kernel with weights (a QLinearAdd's scales and zero points: a few bytes) is costed
    max(roofline, work + overhead + W / cold rate), its work at its class's best efficiency:
    elementwise_int8's own e_max once calibrated, not the parent elementwise's (which read
    ORT's QLinearAdd 14x slow: ResNet-18's residual 77 us, measured 5). Hand-derived with
    bandwidths so high that memory takes no time: F / (peak · 0.8) + overhead + W at the
    last-level cache's bandwidth (the run moves far less than its share of that cache, so its
    weights come from there, not at the 20 GB/s cold rate: `weights_level`)."""
    from onnxlens.analyzer.calibration import Calibration, Curve, apply_calibration, host_name
    from onnxlens.analyzer.host import detect_cpu, host_profile
    from onnxlens.analyzer.runtimes.ort_cpu import ELEMENTWISE_INT8, MODEL
    from onnxlens.backends.calibrate import catalogue

    base = host_profile(1)
    cal = Calibration(
        host=host_name(), cpu=detect_cpu().model, threads=1, peak_fp32_tflops=0.2,
        gemm_tflops=0.15, kernel_overhead_us=0.5,
        bandwidth_gbps={lv.name: 1e9 for lv in base.memory},
        curves={"elementwise": Curve(0.05), "gemm": Curve(0.9),
                ELEMENTWISE_INT8: Curve(0.8)},
        levels=[(lv.name, lv.size_bytes) for lv in base.memory], points=(),
        ort_version="1.0", created="2026-01-01T00:00:00+00:00", duration_s=1.0,
        cold_weight_gbps=20.0)
    hw = apply_calibration(base, cal)
    assert hw.class_efficiency(ELEMENTWISE_INT8) == 0.8
    assert hw.class_efficiency("quantize") == 0.05  # no curve of its own: the parent's
    result = analyze(catalogue.quantized(catalogue.binary("Add", 1 << 14), "qdq").build())
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = [k for run in MODEL.kernels(result.graph, result.groups, costs, {}, hw).values()
                 for k in run or ()]
    assert kernel.cls == ELEMENTWISE_INT8 and 0 < kernel.cost.param_bytes < 32
    flops = kernel.cost.vector_flops(1.0)
    assert flops == 12 * (1 << 14)  # two DQs (3 FLOPs each), the Add, the Q (5)
    llc = hw.llc_share
    assert llc is not None and hw.weights_level(0) == llc
    expected = flops / 0.2e12 / 0.8 + 0.5e-6 + kernel.cost.param_bytes / (llc.bandwidth_gbps * 1e9)
    assert result.estimate(hw, None, cal.efficiency).latency_s == pytest.approx(expected,
                                                                               rel=1e-6)
    old = dataclasses.replace(hw, efficiency={**hw.efficiency, ELEMENTWISE_INT8: 0.05})
    assert result.estimate(old, None, cal.efficiency).latency_s > 10 * expected


def test_a_calibrated_class_efficiency_round_trips_through_toml(tmp_path: Any) -> None:
    from onnxlens.analyzer.hardware import load_profile, profile_to_toml

    hw = load_profile("xeon_8480")
    hw = dataclasses.replace(hw, efficiency={**hw.efficiency, "elementwise_int8": 0.8})
    path = tmp_path / "calibrated.toml"
    path.write_text(profile_to_toml(hw), encoding="utf-8")
    assert load_profile(path).efficiency == hw.efficiency


@pytest.mark.parametrize("activations", ["QInt8", "QUInt8"])
def test_ort_cpu_transposes_the_8_bit_tensors_around_nhwc_quantized_convs(
        tmp_path: Any, activations: str) -> None:
    """ORT runs each QLinearConv channels-last, with Transposes of its 8-bit input and output
    where its neighbours are not NHWC kernels too: the kernel model places as many reorders
    as ORT's profile has Transposes, each of an 8-bit [1, 8, 16, 16] (2,048 bytes read and
    written). With int8 activations the first Conv alone is fused (between the input's Q and
    a DQ: 2); with uint8 all three and the QLinearAdd run NHWC (a Transpose in, one out)."""
    from onnxlens.analyzer.host import host_profile
    from onnxlens.analyzer.runtimes.ort_cpu import MODEL
    from onnxlens.backends.ort_timing import profile_model

    model = _residual_convs(tmp_path, getattr(quantization.QuantType, activations))
    profiled = [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]]
    result = analyze(model)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    reorders = [k for run in MODEL.kernels(result.graph, result.groups, costs, {},
                                           host_profile(1)).values()
                for k in run or () if not k.nodes and k.cost.bytes_read]
    assert len(reorders) == profiled.count("Transpose") == 2
    assert all(k.cost.bytes_read == k.cost.bytes_written == 8 * 16 * 16 for k in reorders)


def test_ort_cpu_runs_a_qdq_reshape_on_the_8_bit_values() -> None:
    """DQ -> Reshape -> Q (one scale and zero point, as quantize_static writes them): ORT drops
    the DQ and Q (its profile: one Reshape kernel); the kernel model's kernel is a data
    movement without their arithmetic, reading and writing the uint8 tensors: 64 x 256 bytes
    each way, plus the shape (2 int64) and the scale and zero point (4 + 1 bytes) read."""
    from onnx import helper, numpy_helper

    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.ort_timing import profile_model

    consts = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
              numpy_helper.from_array(np.array(128, np.uint8), "z"),
              numpy_helper.from_array(np.array([64, 256], np.int64), "shape")]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
         helper.make_node("Reshape", ["f", "shape"], ["r"]),
         helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])], "qdq_reshape",
        [helper.make_tensor_value_info("x", T.UINT8, [1, 64, 16, 16])],
        [helper.make_tensor_value_info("y", T.UINT8, [64, 256])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == ["Reshape"]
    result = analyze(model)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)]
    assert (kernel.cls, kernel.cost.other_flops) == ("data_movement", 0)
    assert kernel.cost.bytes_read == 64 * 256 + 2 * 8 + 4 + 1
    assert kernel.cost.bytes_written == 64 * 256


@pytest.mark.parametrize(("cin", "cout", "block", "taken"), [
    (64, 64, 16, True), (3, 32, 16, False), (64, 8, 16, False),
    (64, 20, 16, True), (64, 20, 8, False), (12, 24, 8, True)])
def test_mlas_symmetric_conv_takes_4_input_and_16_output_channels(cin, cout, block,
                                                                   taken) -> None:
    """MlasConvSymPackWSize on x86: Cin a multiple of 4, Cout at least 16 and a multiple of 4
    (AVX-512 VNNI, NCHWc block 16) or 8 (AVX2): a stem of 3 input channels is not taken."""
    from onnx import helper

    from onnxlens.analyzer.runtimes.ort_cpu import symmetric_conv

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], "conv",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, cin, 8, 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, cout, 8, 8])],
        [onnx.numpy_helper.from_array(np.zeros((cout, cin, 3, 3), np.float32), "w")])
    result = analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert symmetric_conv(result.graph.info(result.groups[0].nodes[0]), block) is taken


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_quantized_stem_is_an_im2col_and_a_qgemm(tmp_path: Any, fmt: str) -> None:
    """A 3x3/2 Conv of 3 -> 32 channels at 208x208 (MobileNetV2's stem), uint8: MLAS's
    symmetric kernel does not take 3 input channels, so ORT makes an im2col and a QGEMM of
    M 32, K 27, N 104² (CONV_INT8_IM2COL), its reuse 2·M·K·N / (4·(M·K + K·N + M·N)) =
    7.31, hand-derived; in both formats (the QOperator node's weight is its 4th input)."""
    from onnxlens.analyzer.hardware import CONV_INT8_IM2COL
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.calibrate import catalogue

    fp32 = tmp_path / "stem.onnx"
    model = catalogue.conv(3, 32, 208, 3, 2).build()
    model.graph.input[0].name = model.graph.node[0].input[0] = "x"  # Reader's input
    onnx.save(model, fp32)
    out = tmp_path / f"stem-{fmt}.onnx"
    quantization.quantize_static(fp32, out, Reader((1, 3, 208, 208)), per_channel=True,
                                 quant_format=getattr(quantization.QuantFormat, fmt),
                                 activation_type=quantization.QuantType.QUInt8)
    result = analyze(out)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)
                 if k.cost.macs]
    m, k, n = 32, 27, 104 * 104
    assert kernel.cls == CONV_INT8_IM2COL
    assert kernel.reuse == pytest.approx(2 * m * k * n / (4 * (m * k + k * n + m * n)))


@pytest.mark.parametrize(("weight_input", "cls", "layout"), [
    (True, "conv_unpacked", "nchw"), (False, "conv", "nchwc")])
def test_a_conv_whose_weights_are_made_at_run_time_runs_unpacked(weight_input, cls,
                                                                  layout) -> None:
    """ORT prepacks a Conv's weights and reorders the Conv to NCHWc only when they are
    constant: a Conv whose weight is a graph input (as a DQ's output is, in a QDQ unit ORT
    leaves unfused) is MLAS's NCHW convolution, class conv_unpacked; its twin with the weight
    an initializer the NCHWc kernel of class conv."""
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.calibrate import catalogue

    bench = (catalogue.conv_weight_input if weight_input else catalogue.conv)(64, 64, 28)
    result = analyze(bench.build())
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)]
    assert (kernel.cls, kernel.reads, kernel.writes) == (cls, layout, layout)
    assert kernel.cost.macs == 64 * 64 * 9 * 28 * 28


@pytest.mark.parametrize(("bench", "mode", "elements"), [
    ("conv", "qop-s8", 64 * 64 * 9), ("matmul", "qop-s8", 0), ("conv", "qdq", 0)])
def test_a_qlinear_conv_on_int8_reorders_its_filter_each_call(bench, mode, elements) -> None:
    """ORT's QLinearConv on int8 activations (MLAS's portable GEMM, nothing prepacked) copies
    its filter to the GEMM's layout on every call, element by element: a data movement of
    Cout·Cin·kh·kw = 36,864 elements and bytes each way before the GEMM (3x3, 64 -> 64); a
    QLinearMatMul (B already [K, N]) and a uint8 QLinearConv (packed at load) have none."""
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
    from onnxlens.backends.calibrate import catalogue

    fp32 = catalogue.conv(64, 64, 24) if bench == "conv" else catalogue.matmul(64, 256, 256)
    result = analyze(catalogue.quantized(fp32, mode).build())
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    kernels = [k for g in result.groups for k in ort_kernels(result.graph, g, costs, 16)
               if k.cost.macs or k.elements]
    reorders = [k for k in kernels if k.elements]
    assert [k.elements for k in reorders] == ([elements] if elements else [])
    assert all(k.cost.bytes_read == k.cost.bytes_written == elements for k in reorders)
    if elements:
        assert kernels.index(reorders[0]) < kernels.index(next(k for k in kernels if k.cost.macs))
