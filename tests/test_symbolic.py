"""Costs as formulas of symbolic dims: the exact fit, and whole models with batch and seq."""

from __future__ import annotations

from fractions import Fraction

import onnx
import pytest
from onnx import TensorProto, helper

import onnxlens
from onnxlens.analyzer.symbolic import fit_polynomial, format_polynomial, formulas, sample_points


def test_fit_recovers_polynomials_exactly() -> None:
    fit, check = sample_points(2)
    assert len(fit) == 10 and check not in fit  # monomials of total degree <= 3 in 2 variables

    def poly(b: int, s: int) -> int:
        return 7 * b * s * s - 3 * b + 11

    coeffs = fit_polynomial({p: poly(*p) for p in [*fit, check]}, fit, check)
    assert coeffs == {(1, 2): Fraction(7), (1, 0): Fraction(-3), (0, 0): Fraction(11)}
    assert format_polynomial(coeffs, ["batch", "seq"]) == "7*batch*seq^2 - 3*batch + 11"


def test_non_polynomial_totals_get_no_formula() -> None:
    # A peak that moves from one layer to another as the dim grows is piecewise, not a
    # polynomial: the check point must catch it rather than report a wrong formula.
    found = formulas(lambda p: {"peak": max(3 * p[0], 10), "macs": 5 * p[0]}, ["batch"])
    assert found == {"macs": "5*batch"}


def _dynamic_attention_scores() -> onnx.ModelProto:
    """x[batch, seq, 16] -> scores = x @ x^T  ([batch, seq, seq]): batch*seq*seq*16 MACs."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["y"], name="qk")]
    graph = helper.make_graph(
        nodes, "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "seq"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_attention_macs_are_a_formula_of_batch_and_seq() -> None:
    result = onnxlens.analyze(_dynamic_attention_scores())
    assert result.symbols == {"batch": 1, "seq": 1}
    assert result.formulas["macs"] == "16*batch*seq^2"
    # Bytes: Transpose reads and writes x once; MatMul reads x and xt, writes y (4 B/elem).
    assert result.formulas["bytes_read"] == "192*batch*seq"
    assert result.formulas["bytes_written"] == "4*batch*seq^2 + 64*batch*seq"
    assert result.totals["macs"] == 16  # the primary analysis is at batch = seq = 1
    assert result.to_dict()["symbolic"]["totals"]["macs"] == "16*batch*seq^2"


def test_pinning_one_symbol_leaves_a_formula_of_the_other() -> None:
    result = onnxlens.analyze(_dynamic_attention_scores(), input_shapes=None, batch=4)
    assert result.symbols == {"seq": 1}
    assert result.formulas["macs"] == "64*seq^2"


def test_symbolic_off_reports_unknown_costs() -> None:
    result = onnxlens.analyze(_dynamic_attention_scores(), symbolic=False)
    assert result.formulas == {} and result.totals["complete"] is False
    reason = result.node_costs["qk"].unknown_reason
    assert reason is not None and reason.startswith("shape of tensor")


def test_formulas_are_skipped_past_the_node_analysis_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two symbols take 11 analyses: 2 nodes x 11 = 22 node analyses, over a budget of 21."""
    from onnxlens.analyzer import analysis

    monkeypatch.setattr(analysis, "SYMBOLIC_MAX_NODE_ANALYSES", 22)
    assert onnxlens.analyze(_dynamic_attention_scores()).formulas["macs"] == "16*batch*seq^2"
    monkeypatch.setattr(analysis, "SYMBOLIC_MAX_NODE_ANALYSES", 21)
    result = onnxlens.analyze(_dynamic_attention_scores())
    assert result.formulas == {} and result.symbols == {"batch": 1, "seq": 1}
    assert result.totals["macs"] == 16  # still analyzed at batch = seq = 1
    assert result.warnings[-1] == (
        "symbolic dim(s) batch, seq analyzed at 1, without formulas: 11 analyses of 2 nodes "
        "would be over 21 node analyses; pin them with --batch or --input-shape")
