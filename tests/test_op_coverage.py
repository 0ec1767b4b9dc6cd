"""Every op the models we promise to cover can contain has a cost formula."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.cost import lookup

# The op_type set of the ONNX exports of torchvision 0.29.1's classification models
# (torchvision.models.list_models(module=torchvision.models)), measured by exporting each with
# onnxlens.exporters.torch_export.export_module (TorchScript exporter, opset 17, random weights,
# 1x3x224x224, inception_v3 1x3x299x299; the vit_b_* with torch.backends.mha's fast path off)
# with BatchNorm folded, and one model of each convolutional family again with BatchNorm kept,
# then taking the union of {node.op_type for node in graph.node}: 90 exports. Left out as the
# same architectures at a larger size: vit_l_16, vit_l_32, vit_h_14, regnet_y_16gf/32gf/128gf.
TORCHVISION_OPS = frozenset({
    "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Constant",
    "ConstantOfShape", "Conv", "Div", "Einsum", "Equal", "Erf", "Exp", "Expand", "Flatten",
    "Gather", "Gemm", "GlobalAveragePool", "HardSigmoid", "HardSwish", "LayerNormalization",
    "MatMul", "MaxPool", "Mod", "Mul", "Not", "Pad", "Pow", "Range", "ReduceL2", "ReduceMean",
    "Relu", "Reshape", "ScatterND", "Shape", "Sigmoid", "Slice", "Softmax", "Squeeze", "Sub",
    "Tanh", "Transpose", "Unsqueeze", "Where"
})

# The transformer ops the issue names.
TRANSFORMER_OPS = frozenset({
    "MatMul", "Gemm", "Softmax", "LayerNormalization", "Erf", "Transpose", "Gather", "Slice",
    "Concat", "Split", "ReduceMean", "ReduceMax", "Pow", "Sqrt", "Div", "Where", "Expand",
    "Einsum",
})


def test_torchvision_ops_have_formulas() -> None:
    assert sorted(op for op in TORCHVISION_OPS if lookup(op) is None) == []


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _transformer_block() -> onnx.ModelProto:
    """Embedding, one pre-norm attention block (2 heads of 8, Einsum scores, a Where mask),
    a spelled-out LayerNorm, an Erf GELU MLP and some slicing, on 8 tokens of width 16."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def i64(*values: int) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    f32 = np.float32
    inits = [
        _init("emb", w(32, 16)), _init("ln_g", w(16)), _init("ln_b", w(16)),
        _init("w_qkv", w(16, 48)), _init("b_qkv", w(48)), _init("split", i64(16, 16, 16)),
        _init("heads", i64(1, 8, 2, 8)), _init("merged", i64(1, 8, 16)), _init("rows", i64(8, 16)),
        _init("sqrt_d", np.array(8 ** 0.5, f32)), _init("causal", np.tril(np.ones((8, 8), bool))),
        _init("neg_inf", np.array(-1e9, f32)), _init("w_o", w(16, 16)), _init("b_o", w(16)),
        _init("two", np.array(2.0, f32)), _init("eps", np.array(1e-5, f32)),
        _init("g2", w(16)), _init("b2", w(16)), _init("w1", w(16, 32)), _init("w2", w(32, 16)),
        _init("sqrt2", np.array(2 ** 0.5, f32)), _init("one", np.array(1.0, f32)),
        _init("half", np.array(0.5, f32)), _init("zero", i64(0)), _init("first", i64(1)),
        _init("axis1", i64(1)), _init("wide", i64(1, 4, 16)),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h0"]),
        helper.make_node("LayerNormalization", ["h0", "ln_g", "ln_b"], ["h1"], axis=-1),
        helper.make_node("MatMul", ["h1", "w_qkv"], ["qkv"]),
        helper.make_node("Add", ["qkv", "b_qkv"], ["qkv_b"]),
        helper.make_node("Split", ["qkv_b", "split"], ["q", "k", "v"], axis=-1),
        *[node for name in "qkv" for node in (
            helper.make_node("Reshape", [name, "heads"], [f"{name}4"]),
            helper.make_node("Transpose", [f"{name}4"], [f"{name}h"], perm=[0, 2, 1, 3]))],
        helper.make_node("Einsum", ["qh", "kh"], ["scores"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Div", ["scores", "sqrt_d"], ["scaled"]),
        helper.make_node("Where", ["causal", "scaled", "neg_inf"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vh"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "rows"], ["ctx2"]),
        helper.make_node("Gemm", ["ctx2", "w_o", "b_o"], ["proj2"]),
        helper.make_node("Reshape", ["proj2", "merged"], ["proj"]),
        helper.make_node("Add", ["h0", "proj"], ["h2"]),
        # LayerNorm spelled out, as opset < 17 exporters write it.
        helper.make_node("ReduceMean", ["h2"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["h2", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["norm"]),
        helper.make_node("Mul", ["norm", "g2"], ["scaled2"]),
        helper.make_node("Add", ["scaled2", "b2"], ["h3"]),
        # GELU spelled out with Erf.
        helper.make_node("MatMul", ["h3", "w1"], ["u"]),
        helper.make_node("Div", ["u", "sqrt2"], ["u_s"]),
        helper.make_node("Erf", ["u_s"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["erf1"]),
        helper.make_node("Mul", ["u", "erf1"], ["ue"]),
        helper.make_node("Mul", ["ue", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["mlp"]),
        helper.make_node("Add", ["h3", "mlp"], ["h4"]),
        # First token, widened and appended; max over tokens.
        helper.make_node("Slice", ["h4", "zero", "first", "axis1"], ["cls"]),
        helper.make_node("Expand", ["cls", "wide"], ["cls4"]),
        helper.make_node("Concat", ["h4", "cls4"], ["cat"], axis=1),
        helper.make_node("ReduceMax", ["cat"], ["out"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "transformer_block",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_transformer_ops_are_costed() -> None:
    model = _transformer_block()
    assert {n.op_type for n in model.graph.node} >= TRANSFORMER_OPS
    result = onnxlens.analyze(model)
    assert result.unsupported_ops == {}
    assert result.totals["complete"]
    # By hand: QKV 8x16x48, scores 2 heads x 8x8x8, context 2x8x8x8, output projection
    # 8x16x16, MLP 8x16x32 and 8x32x16.
    assert result.totals["macs"] == (8 * 16 * 48 + 2 * 8 * 8 * 8 + 2 * 8 * 8 * 8 + 8 * 16 * 16
                                     + 8 * 16 * 32 + 8 * 32 * 16)


def test_resnet18_end_to_end(resnet18_path: Path) -> None:
    result = onnxlens.analyze(resnet18_path)
    assert result.unsupported_ops == {}
    assert result.totals["complete"]
    assert result.totals["macs"] == 1_814_073_344



def test_fused_transformer_ops_are_costed() -> None:
    # RMSNormalization and Attention (opset 23), Gelu (opset 20) on [1,8,16], 2 heads of 8.
    nodes = [helper.make_node("RMSNormalization", ["x", "scale"], ["n"]),
             helper.make_node("Gelu", ["n"], ["g"], approximate="tanh"),
             helper.make_node("Attention", ["g", "g", "g"], ["y"], q_num_heads=2,
                              kv_num_heads=2, is_causal=1)]
    graph = helper.make_graph(
        nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [_init("scale", np.ones(16, np.float32))])
    result = onnxlens.analyze(helper.make_model(graph,
                                                opset_imports=[helper.make_opsetid("", 23)]))
    assert result.unsupported_ops == {}
    assert result.totals["complete"]
    # 2 heads x 8 queries x 8 keys, 8 MACs for Q K^T and 8 for P V per score.
    assert result.totals["macs"] == 2 * 8 * 8 * (8 + 8)
