"""Shape subgraphs made constant by pinned shapes are folded, so later shapes become known."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.fold import MAX_ELEMENTS, fold_shape_subgraphs


def _window_padding(side: int) -> onnx.ModelProto:
    """Swin's spelling: pad H and W up to a multiple of 4 with pads computed from Shape.

    x[1,3,side,side] -> Pad(pads = [0,0,0,0, 0,0,p,p], p = (4 - side % 4) % 4) -> Conv 3x3.
    """
    ints = {name: numpy_helper.from_array(np.array(v, dtype=np.int64), name) for name, v in
            (("two", [2]), ("four", 4), ("zeros", [0, 0, 0, 0, 0, 0]), ("axis0", [0]))}
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), dtype=np.float32), "w")
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["h"]),  # [side]
        helper.make_node("Mod", ["h", "four"], ["rem"]),
        helper.make_node("Sub", ["four", "rem"], ["gap"]),
        helper.make_node("Mod", ["gap", "four"], ["p"]),
        helper.make_node("Concat", ["zeros", "p", "p"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad"),
        helper.make_node("Conv", ["padded", "w"], ["y"], name="conv"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, None, None])
    graph = helper.make_graph(nodes, "window", [x], [y], [*ints.values(), w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_padding_computed_from_shape_is_folded() -> None:
    result = onnxlens.analyze(_window_padding(5))
    assert result.totals["complete"] is True
    padded = 8  # 5 padded up to a multiple of 4
    out = padded - 2  # 3x3 conv, no padding
    assert result.node_costs["conv"].cost.macs == 2 * out * out * 3 * 9  # type: ignore[union-attr]
    assert result.model.tensors["padded"].shape == (1, 3, padded, padded)


def test_fold_refuses_values_too_large_to_be_shape_arithmetic() -> None:
    big = numpy_helper.from_array(np.array([MAX_ELEMENTS + 1], dtype=np.int64), "n")
    node = helper.make_node("ConstantOfShape", ["n"], ["z"])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info(
        "z", TensorProto.FLOAT, [None])], [big])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert fold_shape_subgraphs(model, {}) == {}
    small = numpy_helper.from_array(np.array([3], dtype=np.int64), "n")
    model.graph.initializer[0].CopyFrom(small)
    assert fold_shape_subgraphs(model, {})["z"].tolist() == [0.0, 0.0, 0.0]
