"""Attention as two more Hugging Face decoders spell it (dynamo exports, one hand-built layer
each: 4 heads, 8 tokens, head size 16): Bloom adds ALiBi to the scaled scores in a 3-D view
(baddbmm) and the mask in 4-D, Gemma 2 soft-caps the scores, 50·tanh(s / 50), before the mask.
Each is one Attention group holding the two MatMuls and the Softmax; the bias and the mask come
from outside."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.fusion import ATTENTION

HEADS, SEQ, D = 4, 8, 16


def _const(name: str, value: object, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _layer(scores: list[onnx.NodeProto], last: str, inits: list[onnx.TensorProto],
           path: str, *, rank: int = 4) -> None:
    """q, k, v [1, H, S, D] (Bloom's bmm: [H, S, D]) and a mask [1, 1, S, S]; `scores` turns
    `s` (q·kᵀ) into `last`, the Softmax's input, in 4-D (Bloom: reshaped back to 3-D)."""
    shape = [1, HEADS, SEQ, D][4 - rank:]
    perm = [0, 1, 3, 2][4 - rank:] if rank == 4 else [0, 2, 1]
    probs = [helper.make_node("Softmax", [last], ["p"], axis=-1)]
    if rank == 3:
        probs.append(helper.make_node("Reshape", ["p", "shape3"], ["p3"]))
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), *scores, *probs,
             helper.make_node("MatMul", [probs[-1].output[0], "v"], ["y"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v")]
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, SEQ, SEQ])
    graph = helper.make_graph(nodes, "layer", [*io, mask], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              path)


def _bloom(path: str) -> None:
    alibi = helper.make_tensor_value_info("alibi", TensorProto.FLOAT, [HEADS, 1, SEQ])
    scores = [helper.make_node("Mul", ["s", "alpha"], ["sa"]),
              helper.make_node("Add", ["sa", "alibi"], ["b3"]),  # baddbmm
              helper.make_node("Reshape", ["b3", "shape4"], ["b4"]),
              helper.make_node("Add", ["b4", "mask"], ["masked"])]
    inits = [_const("alpha", D ** -0.5), _const("shape3", [HEADS, SEQ, SEQ], np.int64),
             _const("shape4", [1, HEADS, SEQ, SEQ], np.int64)]
    _layer(scores, "masked", inits, path, rank=3)
    m = onnx.load(path)
    m.graph.input.append(alibi)
    onnx.save(m, path)


def _gemma2(path: str) -> None:
    scores = [helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Div", ["ss", "cap"], ["sd"]),
              helper.make_node("Tanh", ["sd"], ["st"]),
              helper.make_node("Mul", ["st", "cap"], ["sc"]),
              helper.make_node("Add", ["sc", "mask"], ["masked"])]
    _layer(scores, "masked", [_const("scale", D ** -0.5), _const("cap", 50.0)], path)


@pytest.mark.parametrize(("build", "inside"), [
    (_bloom, {"Mul", "Reshape", "Add"}), (_gemma2, {"Mul", "Div", "Tanh", "Add"})],
    ids=["bloom-alibi", "gemma2-softcap"])
def test_one_attention_group_with_its_score_arithmetic(tmp_path, build, inside: set[str]
                                                       ) -> None:
    path = str(tmp_path / "layer.onnx")
    build(path)
    ort = pytest.importorskip("onnxruntime")  # the hand-built layer is a valid model
    ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    result = onnxlens.analyze(path)
    groups = [g for g in result.groups if ATTENTION in g.pattern]
    assert len(groups) == 1
    ops = {result.graph.info(k).op_type for k in groups[0].nodes}
    assert {"MatMul", "Softmax"} | inside <= ops
    assert len(groups[0].nodes) == len(result.graph.infos)  # every node of the layer
