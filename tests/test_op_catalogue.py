"""The op catalogue (`analyzer.cost.ops`) is the one definition of a pointwise op: the cost
formulas, fusion's activations and the native lowering read it, and the lowering checks every
instruction it names against ops.def (the C++ / CUDA side) when it is imported."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, reference

from onnxlens.analyzer.cost import lookup
from onnxlens.analyzer.cost.base import MS
from onnxlens.analyzer.cost.ops import ACTIVATION, POINTWISE, PointwiseOp
from onnxlens.analyzer.cost.reduce import REDUCE_OPS
from onnxlens.backends.native import lower
from onnxlens.backends.native.catalogue import EW_OPS, EwOp, same_reductions


def test_every_op_the_executor_runs_elementwise_has_a_cost_formula() -> None:
    # Shrink ran on the executor with no formula before the catalogue. ORT's FastGelu and
    # BiasGelu are formulas of its contrib domain.
    missing = sorted(op for op in lower.ELEMENTWISE
                     if lookup(op) is None and lookup(op, MS) is None)
    assert missing == []


@pytest.mark.parametrize(("row", "ops", "message"), [
    (PointwiseOp(ACTIVATION, (1, 0), "Frobnicate"), EW_OPS, "Frobnicate"),
    # ops.def's LeakyRelu reads one parameter (alpha)
    (PointwiseOp(ACTIVATION, (2, 0), "LeakyRelu"), EW_OPS, "0 parameter"),
    (PointwiseOp(ACTIVATION, (1, 0), "Relu", variadic=True), EW_OPS, "Relu"),
    (PointwiseOp(ACTIVATION, (1, 0), "Relu"), {"Relu": EwOp("Relu", 1, 1)}, "Relu"),
])
def test_an_instruction_ops_def_lacks_is_refused(row: PointwiseOp, ops: dict, message: str
                                                 ) -> None:
    with pytest.raises(ValueError, match=message):
        lower.instructions({"Op": row}, ops)


def test_the_catalogue_names_only_instructions_of_ops_def() -> None:
    table = lower.instructions(POINTWISE, EW_OPS)
    assert {op for op, row in POINTWISE.items() if row.native} == set(table)
    assert table["Sum"][0] == "Add" and table["Dropout"][0] == "Identity"


def test_the_reductions_are_one_list_in_the_analyzer_and_ops_def() -> None:
    assert "ReduceLogSumExp" in REDUCE_OPS and "ArgMax" not in REDUCE_OPS  # no axes-reduce kernel
    with pytest.raises(ValueError, match="ReduceFoo"):
        same_reductions((*REDUCE_OPS, "ReduceFoo"), REDUCE_OPS)
    with pytest.raises(ValueError, match="ReduceSum"):
        same_reductions(tuple(op for op in REDUCE_OPS if op != "ReduceSum"), REDUCE_OPS)


def _run_lowered(node: onnx.NodeProto, x: np.ndarray) -> np.ndarray:
    """`node`'s program on `x` in numpy, one instruction at a time, with ops.def's arithmetic
    for the instructions it uses (written here from the ONNX definitions, not the code)."""
    from onnxlens.analyzer.ir import NodeInfo, TensorInfo

    t = TensorInfo("x", onnx.TensorProto.FLOAT, x.shape)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    info = NodeInfo("n", node.op_type, "", attrs, (t,), (TensorInfo("y", t.elem_type, x.shape),))
    low = lower.Lowering({"x": t}, {}, 17)
    regs: list[int] = []

    def new_reg() -> int:
        regs.append(len(regs))
        return regs[-1]

    def src(name: str) -> int:
        return -1

    code, _ = lower.elementwise_instrs(info, low, src, new_reg)  # type: ignore[arg-type]
    (instr,) = code
    p = instr.params
    arithmetic = {"LeakyRelu": lambda v: np.where(v < 0, p[0] * v, v),
                  "HardSigmoid": lambda v: np.clip(p[0] * v + p[1], 0, 1),
                  "Shrink": lambda v: np.where(v < -p[1], v + p[0],
                                               np.where(v > p[1], v - p[0], 0))}
    return arithmetic[instr.op](x).astype(np.float32)


@pytest.mark.parametrize(("op", "attrs"), [
    ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.3}), ("HardSigmoid", {}),
    ("HardSigmoid", {"alpha": 0.5, "beta": 0.25}), ("Shrink", {}),
    ("Shrink", {"bias": 0.5, "lambd": 1.0})])
def test_attributes_and_their_defaults_become_the_instructions_parameters(op: str, attrs: dict
                                                                          ) -> None:
    # The catalogue's defaults against ONNX's own (onnx.reference applies them).
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    x = np.linspace(-3, 3, 25, dtype=np.float32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [25])],
                              [helper.make_tensor_value_info("y", 1, [25])])
    (expected,) = reference.ReferenceEvaluator(helper.make_model(graph)).run(None, {"x": x})
    np.testing.assert_allclose(_run_lowered(node, x), expected, rtol=1e-6, atol=1e-7)
