"""Shape subgraphs made constant by pinned shapes are folded, so later shapes become known."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.fold import MAX_ELEMENTS, fold_nodes, fold_shape_subgraphs, static_nodes


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


# ---- the one folding every caller uses ----------------------------------------------------------

def _gather_elements_model() -> onnx.ModelProto:
    """HF BERT's token-type ids as the dynamo exporter writes them: GatherElements over
    constants, then y = x + float(ids). onnx 1.2x's reference evaluator fails on it ("cannot
    reshape array of size 1 into shape (1,128)")."""
    data = numpy_helper.from_array(np.zeros((1, 512), np.int64), "buffer")
    index = numpy_helper.from_array(np.arange(128, dtype=np.int64)[None], "positions")
    nodes = [helper.make_node("GatherElements", ["buffer", "positions"], ["ids"], axis=1,
                              name="gather"),
             helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Add", ["x", "ids_f"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])], [data, index])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_node_folding_cannot_evaluate_stays_unfolded_and_nothing_raises() -> None:
    model = _gather_elements_model()
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    folded = fold_nodes(model.graph.node, dict(values), {"": 17})
    want = np.take_along_axis(values["buffer"], values["positions"], axis=1)
    if "ids" in folded:  # an onnx whose reference evaluator gets GatherElements right
        np.testing.assert_array_equal(folded["ids"], want)
        assert folded["ids_f"].dtype == np.float32
    else:  # unfolded, and so is what reads it
        assert folded == {}
    # The native plan keeps an unfolded node as a node to run (it has a GatherElements
    # kernel), folded or not the model computes y = x + ids.
    native_cpu = pytest.importorskip("onnxlens.backends.native_cpu")
    backend = native_cpu.NativeCpuBackend()
    backend.prepare(model)
    x = np.random.default_rng(0).random((1, 128), dtype=np.float32)
    np.testing.assert_array_equal(backend.run({"x": x})["y"], x + want.astype(np.float32))


def test_a_failing_evaluator_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx.reference

    class Broken:
        def __init__(self, *_: object, **__: object) -> None:
            raise ValueError("cannot reshape array of size 1 into shape (1,128)")

    monkeypatch.setattr(onnx.reference, "ReferenceEvaluator", Broken)
    model = _gather_elements_model()
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert fold_nodes(model.graph.node, values, {"": 17}) == {}


def test_fold_nodes_rules() -> None:
    """Shape/Size from a known shape; constants through the reference; random ops and other
    domains never; results over max_elements refused (ConstantOfShape before it runs)."""
    n = numpy_helper.from_array(np.array([2, 3], np.int64), "n")
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=-2),
             helper.make_node("Size", ["x"], ["size"]),
             helper.make_node("Mul", ["s", "s"], ["s2"]),
             helper.make_node("ConstantOfShape", ["n"], ["zeros"]),
             helper.make_node("RandomNormalLike", ["zeros"], ["noise"]),
             helper.make_node("Relu", ["s2"], ["r"], domain="com.example")]
    dims = {"x": (4, 5, 6)}.get
    values = {"n": numpy_helper.to_array(n)}
    folded = fold_nodes(nodes, values, {"": 17}, dims=dims)
    assert set(folded) == {"s", "size", "s2", "zeros"}
    assert folded["s"].tolist() == [5, 6] and folded["s2"].tolist() == [25, 36]
    assert folded["size"].shape == () and int(folded["size"]) == 120
    assert folded["zeros"].shape == (2, 3) and values["zeros"] is folded["zeros"]
    small = fold_nodes(nodes, {"n": numpy_helper.to_array(n)}, {"": 17}, dims=dims,
                       max_elements=5)
    assert "zeros" not in small and small["s2"].tolist() == [25, 36]
    limited = fold_nodes(nodes, {"n": numpy_helper.to_array(n)}, {"": 17}, dims=dims,
                         ops=frozenset({"Shape"}))
    assert set(limited) == {"s"}


def test_static_nodes_is_the_rule_of_fold_nodes() -> None:
    """The nodes `static_nodes` names (no values) are those `fold_nodes` folds, where every
    evaluation succeeds; a random op and what reads it are not static."""
    model = _window_padding(5)
    model.graph.node.insert(0, helper.make_node("RandomUniformLike", ["x"], ["noise"],
                                                name="noise"))
    model.graph.node.insert(1, helper.make_node("Shape", ["noise"], ["noise_shape"],
                                                name="noise_shape"))
    model.graph.node.insert(2, helper.make_node("Abs", ["noise"], ["noise_abs"],
                                                name="noise_abs"))
    result = onnxlens.analyze(model)
    mg = result.graph
    static = static_nodes((mg.info(k) for k in mg.order), mg.initializers)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dims = {name: t.dims for name, t in result.model.tensors.items() if t.known}.get
    folded = fold_nodes(model.graph.node, values, {"": 17}, dims=dims)
    assert static == {mg.producer[t] for t in folded}
    assert "noise" not in static and "noise_abs" not in static and "noise_shape" in static
    assert {"pad", "conv"}.isdisjoint(static)
