"""Tiny models whose analysis used to cost far more than their size: now analyzed quickly.

(The local-function call trees, which are refused, are cases of test_bad_inputs.py.)

Shape folding evaluates small constant subgraphs with onnx.reference. Inputs of at most
`fold.MAX_ELEMENTS` values each were enough to ask for far more: a Range of 4096 unsqueezed
to [4096, 1] and [1, 4096] and multiplied is 16M int64 (128 MB and 0.1 s per Mul node, a few
dozen bytes of file each); a Where of three such is 4096**3. Each output is now bounded from
the input shapes before anything is computed.
"""

from __future__ import annotations

import time
import tracemalloc

import onnx
import pytest
from onnx import TensorProto, helper

import onnxlens
from onnxlens.analyzer.fold import MAX_ELEMENTS

vi = helper.make_tensor_value_info


def _scalar(name: str, value: int, dims: tuple[int, ...] = ()) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, TensorProto.INT64, dims, [value]))


def broadcast_bomb(op: str, copies: int, length: int = MAX_ELEMENTS) -> onnx.ModelProto:
    """r = Range(0, length); col, row, deep = r as [n,1], [1,n], [n,1,1]; `copies` nodes `op`
    of them, each reduced to one value; and a NonZero, whose unknown output shape makes
    the loader fold."""
    nodes = [_scalar("start", 0), _scalar("limit", length), _scalar("delta", 1),
             helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
             _scalar("one", 1, (1,)), _scalar("zero", 0, (1,)), _scalar("last", -1, (1,)),
             helper.make_node("Unsqueeze", ["r", "one"], ["col"]),
             helper.make_node("Unsqueeze", ["r", "zero"], ["row"]),
             helper.make_node("Unsqueeze", ["col", "last"], ["deep"]),
             helper.make_node("Cast", ["deep"], ["cond"], to=TensorProto.BOOL),
             helper.make_node("NonZero", ["x"], ["nz"])]
    reduced = []
    for i in range(copies):
        inputs = ["cond", "row", "col"] if op == "Where" else ["col", "row"]
        nodes += [helper.make_node(op, inputs, [f"big{i}"]),
                  helper.make_node("ReduceMax", [f"big{i}"], [f"r{i}"], keepdims=0)]
        reduced.append(f"r{i}")
    nodes.append(helper.make_node("Max", reduced, ["y"]))
    graph = helper.make_graph(nodes, "bomb", [vi("x", TensorProto.FLOAT, [3])],
                              [vi("y", TensorProto.INT64, []),
                               vi("nz", TensorProto.INT64, [None, None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# Where: 2048**3 int64 is 64 GiB, under the tensor budget (4096**3 is refused after inference).
@pytest.mark.parametrize(("op", "copies", "length"), [("Mul", 40, MAX_ELEMENTS),
                                                     ("Max", 40, MAX_ELEMENTS), ("Where", 2, 2048)])
def test_broadcasts_in_shape_subgraphs_are_not_computed(op: str, copies: int, length: int
                                                        ) -> None:
    model = broadcast_bomb(op, copies, length)
    assert len(model.SerializeToString()) < 4096
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = onnxlens.analyze(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - start
    # Before: 40 x 128 MB computed (5 s); for the Where, numpy asked for 64 GiB.
    assert peak < 64 << 20, peak
    assert seconds < 10, seconds
    assert result.totals["nodes"] == len(model.graph.node)
