"""A generated model of any size, for the speed benchmarks and the big-report test.

Kept apart from analyze_speed.py so that using it needs no benchmark-only package (onnx-tool).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def chain_model(nodes: int, channels: int = 8, side: int = 8) -> onnx.ModelProto:
    """A chain of residual blocks ``x -> Conv3x3 -> Relu -> Add(x, .)``: 3 nodes per block.

    Every Conv has weights of its own (channels x channels x 3 x 3, and a bias), as in a model.
    """
    rng = np.random.default_rng(0)
    shape = [1, channels, side, side]
    graph_nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    x = "input"
    for b in range(max(1, nodes // 3)):
        w = rng.standard_normal((channels, channels, 3, 3), dtype=np.float32) * 0.1
        inits += [numpy_helper.from_array(w, f"b{b}.w"),
                  numpy_helper.from_array(np.zeros(channels, np.float32), f"b{b}.bias")]
        graph_nodes += [
            helper.make_node("Conv", [x, f"b{b}.w", f"b{b}.bias"], [f"b{b}.conv"],
                             name=f"/b{b}/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"b{b}.conv"], [f"b{b}.relu"], name=f"/b{b}/Relu"),
            helper.make_node("Add", [x, f"b{b}.relu"], [f"b{b}.out"], name=f"/b{b}/Add"),
        ]
        x = f"b{b}.out"
    graph = helper.make_graph(
        graph_nodes, f"chain{nodes}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
