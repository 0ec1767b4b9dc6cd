"""The validation layer itself: its limits (configurable, checked), warnings, use on a bare
proto by a backend, the checks on shapes that onnx's inference did not make, and no false alarm
on valid models of every checked op."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_bad_inputs import (
    _branch_tree,
    _function,
    _function_chain,
    _function_tree,
    _nested_ifs,
    _with_functions,
    conv_model,
)

import onnxlens
from onnxlens.analyzer.errors import InvalidModelError, ShapeError, UsageError
from onnxlens.analyzer.ir import TensorInfo
from onnxlens.analyzer.loader import load_model
from onnxlens.analyzer.validate import DEFAULT_LIMITS, Limits, validate_model

vi = helper.make_tensor_value_info
F = TensorProto.FLOAT


def _const(name: str, values: Any, dtype: Any = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype), name)


def _single(op: str, inputs: list[tuple[str, list[Any]]], consts: list[onnx.TensorProto],
            rank: int, domain_opsets: tuple[tuple[str, int], ...] = (), **attrs: Any
            ) -> onnx.ModelProto:
    names = [n for n, _ in inputs] + [c.name for c in consts]
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    graph = helper.make_graph([node], "g", [vi(n, F, s) for n, s in inputs],
                              [vi("y", F, [None] * rank)], consts)
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, v) for d, v in domain_opsets]
    return helper.make_model(graph, opset_imports=opsets)


def _w(*shape: int, name: str = "w") -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


# ---- limits -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("max_nesting_depth", 0),
                                              ("max_window_value", -1),
                                              ("max_tensor_bytes", True),
                                              ("max_tensor_bytes", 1.5)])
def test_limits_must_be_positive_integers(field: str, value: Any) -> None:
    with pytest.raises(UsageError, match=f"--{field.replace('_', '-')} {value!r}: must be a "
                                         "positive integer"):
        Limits(**{field: value})


def test_default_limits() -> None:
    assert Limits(1 << 38, 32, 2**31 - 1, 1_000_000) == DEFAULT_LIMITS


def _function_model(functions: list[onnx.FunctionProto]) -> onnx.ModelProto:
    class Keep:  # `_with_functions` saves through a folder object: keep the proto instead
        @staticmethod
        def save(model: onnx.ModelProto) -> onnx.ModelProto:
            return model

    return _with_functions(functions)(Keep)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize(("functions", "expanded"), [
    (_function_tree(8), 3 * 2**7 - 1),  # F_i: 2 calls + 2 x F_(i+1); the leaf 1; the call
    (_function_tree(3, times=5), 1 + 5 + 5 * (5 + 5 * 1)),
    # F_i: Constant, If, and two branches of 2 calls each; the leaf 1; the graph's call
    (_branch_tree(4), 1 + (6 + 4 * (6 + 4 * (6 + 4 * 1)))),
])
def test_expanded_size_is_counted_before_expanding(functions: list[onnx.FunctionProto],
                                                   expanded: int) -> None:
    model = _function_model(functions)
    onnxlens.analyze(model, max_expanded_nodes=expanded)
    with pytest.raises(InvalidModelError, match=rf"^the model expands to {expanded:,} nodes .* "
                                                rf"over the limit of {expanded - 1:,} "
                                                r"\(Limits.max_expanded_nodes; raise it with "
                                                r"--max-expanded-nodes\)$"):
        onnxlens.analyze(model, max_expanded_nodes=expanded - 1)


def test_functions_are_counted_where_called_only() -> None:
    """A function nobody calls expands nothing; the graph's own nodes and bodies count 1 each."""
    model = _function_model([_function("F", [helper.make_node("Relu", ["a"], ["b"])]),
                             *_function_tree(30)[1:]])  # F1..F29: 2**28 nodes, never called
    assert validate_model(model, limits=Limits(max_expanded_nodes=2)).warnings == []
    with pytest.raises(InvalidModelError, match=r"expands to 2 nodes .* limit of 1 "):
        validate_model(model, limits=Limits(max_expanded_nodes=1))


def test_nesting_limit_is_configurable() -> None:
    model = _nested_ifs(3)
    load_model(model, limits=Limits(max_nesting_depth=3))
    with pytest.raises(InvalidModelError, match=r"node 'if2' \(If\): body 'then_branch' is "
                                                r"nested 3 deep, over the limit of 2"):
        load_model(model, limits=Limits(max_nesting_depth=2))


def test_bodies_and_function_calls_add_up() -> None:
    """F's body holds an If whose body calls G: main -> F -> If body -> G is 3 deep."""
    then = helper.make_graph([helper.make_node("G", ["a"], ["t"], domain="local")], "then", [],
                             [vi("t", F, [2])])
    other = helper.make_graph([helper.make_node("Relu", ["a"], ["e"])], "else", [],
                              [vi("e", F, [2])])
    f = helper.make_function("local", "F", ["a", "c"], ["b"],
                             [helper.make_node("If", ["c"], ["b"], then_branch=then,
                                               else_branch=other)],
                             [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    g = _function("G", [helper.make_node("Relu", ["a"], ["b"])])
    graph = helper.make_graph([helper.make_node("F", ["x", "c"], ["y"], domain="local")], "g",
                              [vi("x", F, [2]), vi("c", TensorProto.BOOL, [])], [vi("y", F, [2])])
    model = helper.make_model(graph, functions=[f, g], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    validate_model(model, limits=Limits(max_nesting_depth=3))
    with pytest.raises(InvalidModelError, match=r"local function local::F: If/Loop/Scan bodies "
                                                r"and local-function calls nest 3 deep \(calls "
                                                r"local::G\), over the limit of 2"):
        validate_model(model, limits=Limits(max_nesting_depth=2))


def test_function_chain_within_the_limit_loads() -> None:
    graph = helper.make_graph([helper.make_node("F0", ["x"], ["y"], domain="local", name="c")],
                              "g", [vi("x", F, [2])], [vi("y", F, [2])])
    model = helper.make_model(graph, functions=_function_chain(5), opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    validate_model(model, limits=Limits(max_nesting_depth=5))
    with pytest.raises(InvalidModelError,
                       match=r"local::F0: .* nest at least 5 deep .* limit of 4"):
        validate_model(model, limits=Limits(max_nesting_depth=4))


def test_window_limit_is_configurable() -> None:
    model = conv_model()
    model.graph.node[0].attribute.append(helper.make_attribute("pads", [9, 9, 9, 9]))
    load_model(model)
    with pytest.raises(InvalidModelError, match=r"pads = .*: 9 is over the limit of 8"):
        load_model(model, limits=Limits(max_window_value=8))


def test_max_tensor_bytes_replaces_the_budget_of_the_limits() -> None:
    model = _single("ConstantOfShape", [], [_const("shape", [1000])], 1)
    load_model(model, limits=Limits(max_tensor_bytes=10), max_tensor_bytes=4000)
    with pytest.raises(ShapeError, match=r"\(4,000 bytes\), over the 3,999-byte limit"):
        load_model(model, max_tensor_bytes=3999)
    with pytest.raises(ShapeError, match="over the 10-byte limit"):
        load_model(model, limits=Limits(max_tensor_bytes=10))


def test_every_limit_is_an_option_of_analyze() -> None:
    deep, wide = _nested_ifs(3), conv_model()
    wide.graph.node[0].attribute.append(helper.make_attribute("pads", [9, 9, 9, 9]))
    onnxlens.analyze(deep, max_nesting_depth=3)
    onnxlens.analyze(wide, max_window_value=9, max_nesting_depth=None)
    with pytest.raises(InvalidModelError, match=r"nested 3 deep, over the limit of 2"):
        onnxlens.analyze(deep, max_nesting_depth=2)
    with pytest.raises(InvalidModelError, match=r"9 is over the limit of 8"):
        onnxlens.analyze(wide, max_window_value=8, limits=Limits(max_nesting_depth=4))
    with pytest.raises(InvalidModelError, match=r"over the limit of 1 \(Limits.max_nesting"):
        onnxlens.analyze(deep, limits=Limits(max_nesting_depth=4), max_nesting_depth=1)
    with pytest.raises(UsageError, match=r"^--max-window-value 0: must be a positive integer$"):
        onnxlens.analyze(wide, max_window_value=0)


def _analyze_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    import sys

    from onnxlens.cli import analyze_main

    argv = sys.argv
    sys.argv = ["analyze", *args]
    try:
        analyze_main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "code", "fragment"), [
    ("--max-nesting-depth", "3", 0, None),
    ("--max-nesting-depth", "2", 2, "error: body 'then_branch' of node 'if1' (If): node 'if2' "
     "(If): body 'then_branch' is nested 3 deep, over the limit of 2 (Limits.max_nesting_depth)"),
    ("--max-window-value", "9", 0, None),
    ("--max-window-value", "8", 2, "error: node 'conv' (Conv): attribute pads = [9, 9, 9, 9]: 9 "
     "is over the limit of 8 (Limits.max_window_value)"),
    ("--max-nesting-depth", "0", 2, "error: --max-nesting-depth 0: must be a positive integer"),
    ("--max-window-value", "-5", 2, "error: --max-window-value -5: must be a positive integer"),
    ("--max-expanded-nodes", "767", 0, None),
    ("--max-expanded-nodes", "766", 2, "error: the model expands to 767 nodes with its local "
     "functions inlined (local function local::F0: 766 nodes, called 1 time(s) by the graph), "
     "over the limit of 766 (Limits.max_expanded_nodes; raise it with --max-expanded-nodes)"),
])
def test_limit_flags_of_the_analyze_command(flag: str, value: str, code: int,
                                            fragment: str | None, tmp_path: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = (_nested_ifs(3) if "nesting" in flag else
             _function_model(_function_tree(9)) if "expanded" in flag else conv_model())
    if "window" in flag:
        model.graph.node[0].attribute.append(helper.make_attribute("pads", [9, 9, 9, 9]))
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    got, err = _analyze_cli([str(path), flag, value], capsys)
    if fragment is None:
        assert got == 0, err
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == fragment


# ---- warnings and backends ------------------------------------------------------------------


def test_custom_domains_are_a_warning_and_runtime_domains_are_not() -> None:
    graph = helper.make_graph([helper.make_node("Foo", ["x"], ["t"], domain="com.acme"),
                               helper.make_node("Gelu", ["t"], ["y"], domain="com.microsoft")],
                              "g", [vi("x", F, [2])], [vi("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.acme", 1),
                                                    helper.make_opsetid("com.microsoft", 1)])
    result = onnxlens.analyze(model)
    custom = [w for w in result.warnings if w.startswith("custom op domain")]
    assert custom == ["custom op domain(s) 'com.acme': their ops are checked by nothing here "
                      "and their cost is unknown"]


def test_a_backend_can_validate_a_bare_proto() -> None:
    """No loader, no inference: the checks that need no shape run; those on shapes run on the
    shapes a backend knows (here, inner dims that a lenient inference would have merged)."""
    bad = conv_model()
    bad.graph.node[0].attribute.append(helper.make_attribute("group", 0))
    with pytest.raises(InvalidModelError, match=r"node 'conv' \(Conv\): attribute group = 0"):
        validate_model(bad)
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "g",
                              [vi("a", F, ["m", "k"]), vi("b", F, ["k", "n"])],
                              [vi("y", F, ["m", "n"])])
    validation = validate_model(helper.make_model(graph))
    validation.check_shapes({"a": TensorInfo("a", F, (2, 3)), "b": TensorInfo("b", F, (3, 5))})
    with pytest.raises(ShapeError, match=r"node 'mm' \(MatMul\): inner dimensions differ: 'a' "
                                         r"\[2, 3\] has K = 3, 'b' \[4, 5\] has K = 4"):
        validation.check_shapes({"a": TensorInfo("a", F, (2, 3)),
                                 "b": TensorInfo("b", F, (4, 5))})


# ---- no false alarms ------------------------------------------------------------------------

VALID = {
    "grouped conv, SAME_UPPER, stride 2": _single(
        "Conv", [("x", [1, 4, 7, 7])], [_w(6, 2, 3, 3)], 4, group=2, strides=[2, 2],
        auto_pad="SAME_UPPER"),
    "depthwise conv with bias, dilation 2": _single(
        "Conv", [("x", [1, 4, 9, 9])], [_w(4, 1, 3, 3), _w(4, name="b")], 4, group=4,
        dilations=[2, 2], pads=[2, 2, 2, 2]),
    "1-D conv, VALID": _single("Conv", [("x", [1, 3, 10])], [_w(5, 3, 4)], 3, auto_pad="VALID"),
    "conv with symbolic batch": _single("Conv", [("x", ["n", 3, 8, 8])], [_w(4, 3, 3, 3)], 4),
    "conv transpose, group 2, stride 2": _single(
        "ConvTranspose", [("x", [1, 4, 5, 5])], [_w(4, 3, 3, 3)], 4, group=2, strides=[2, 2],
        pads=[1, 1, 1, 1], output_padding=[1, 1]),
    "conv transpose with output_shape": _single(
        "ConvTranspose", [("x", [1, 2, 4, 4])], [_w(2, 2, 3, 3)], 4, strides=[2, 2],
        output_shape=[8, 8]),
    "max pool, ceil mode, window of the whole input": _single(
        "MaxPool", [("x", [1, 3, 5, 5])], [], 4, kernel_shape=[5, 5], ceil_mode=1),
    "average pool with padding wider than the input": _single(
        "AveragePool", [("x", [1, 1, 2, 2])], [], 4, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "gemm transA transB": _single("Gemm", [("a", [3, 2])], [_w(5, 3, name="b")], 2, transA=1,
                                  transB=1),
    "batched matmul, 1-D right side": _single("MatMul", [("a", [2, 4, 3])], [_w(3, name="b")],
                                              2),
    "gather, negative indices at the edge": _single(
        "Gather", [("x", [5, 3])], [_const("i", [-5, 4, 0])], 2),
    "gather on axis 1": _single("Gather", [("x", [2, 3])], [_const("i", [[2], [-3]])], 3,
                                axis=1),
    "reshape with one -1 and a 0": _single("Reshape", [("x", [2, 3, 4])],
                                           [_const("shape", [0, -1])], 2),
    "expand with broadcasting": _single("Expand", [("x", [3, 1])], [_const("shape", [2, 1, 4])],
                                        3),
    "tile": _single("Tile", [("x", [2, 3])], [_const("repeats", [2, 2])], 2),
    "range of floats, counting down": _single(
        "Range", [], [_const("s", 10.0, np.float32), _const("l", 0.0, np.float32),
                      _const("d", -0.5, np.float32)], 1),
    "range that is empty": _single("Range", [], [_const("s", 5, np.float32),
                                                 _const("l", 0, np.float32),
                                                 _const("d", 1, np.float32)], 1),
    "resize by scales": _single("Resize", [("x", [1, 1, 4, 4])],
                                [_const("roi", [], np.float32),
                                 _const("scales", [1, 1, 2.5, 0.5], np.float32)], 4),
    "constant of shape with a 0 dim": _single("ConstantOfShape", [], [_const("shape", [0, 7])],
                                              2),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_models_pass(name: str) -> None:
    result = onnxlens.analyze(VALID[name])
    assert len(result.graph) == 1
