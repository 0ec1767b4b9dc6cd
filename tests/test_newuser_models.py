"""What broke when models nobody here had tried were brought as a new user would (issue 13,
2026-11-26): each case rebuilt tiny here and checked against ONNX Runtime or a hand count."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxlens.analyzer.analysis import analyze

MS = "com.microsoft"


def _qlinear_concat_model() -> onnx.ModelProto:
    """A QOperator ViT's embedding: the class token concatenated before the patches
    (QLinearConcat), the position embedding added (QLinearAdd), dequantized."""
    u8 = TensorProto.UINT8
    inits = [numpy_helper.from_array(np.full((1, 1, 8), 3, np.uint8), "cls"),
             numpy_helper.from_array(np.full((1, 1, 8), 5, np.uint8), "pos"),
             numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z")]
    nodes = [helper.make_node("QLinearConcat", ["s", "z", "cls", "s", "z", "x", "s", "z"],
                              ["cat"], axis=1, domain=MS),
             helper.make_node("QLinearAdd", ["cat", "s", "z", "pos", "s", "z", "s", "z"],
                              ["add"], domain=MS),
             helper.make_node("DequantizeLinear", ["add", "s", "z"], ["y"])]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "tokens", 8])
    graph = helper.make_graph(nodes, "vit_embed",
                              [helper.make_tensor_value_info("x", u8, [1, "patches", 8])], [y],
                              inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])


def test_qlinear_concat_keeps_the_quantized_type_and_concatenates() -> None:
    """ORT's symbolic inference lacks QLinearConcat and gave float: the analysis refused the
    DequantizeLinear after it ('zero point is uint8, but add_quantized is float')."""
    model = _qlinear_concat_model()
    x = np.full((1, 4, 8), 130, np.uint8)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    result = analyze(model, dims={"patches": 4})
    tensors = result.model.tensors
    assert tensors["cat"].elem_type == TensorProto.UINT8
    assert tuple(tensors["cat"].shape) == (1, 5, 8)
    assert tuple(tensors["y"].shape) == expected.shape == (1, 5, 8)
    assert result.totals["complete"]
