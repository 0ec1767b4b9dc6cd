"""ORT's CPU provider in a float16 graph (`runtimes.ort_fp16`): which ops keep a float16 kernel,
and the Casts it inserts between them and the float32-computed rest, counted against ORT's own
optimized graphs of tiny models."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.host import host_profile
from onnxlens.analyzer.runtimes.ort_cpu import MODEL
from onnxlens.analyzer.runtimes.ort_fp16 import FLOAT16_KERNELS, cast_kernel

F16 = TensorProto.FLOAT16


def _ort_casts(model: onnx.ModelProto, tmp_path) -> int:
    """The Casts in ORT's optimized graph of `model` (CPU provider)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sum(n.op_type == "Cast" for n in onnx.load(tmp_path / "optimized.onnx").graph.node)


def _model(nodes: list[onnx.NodeProto], shape: list[int], weights: dict[str, np.ndarray],
           output_shape: list[int] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F16, shape)],
        [helper.make_tensor_value_info("y", F16, output_shape or shape)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _weight(*dims: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(dims).astype(np.float16)


def _model_casts(model: onnx.ModelProto) -> list:
    """The Cast kernels the kernel model runs for `model`."""
    result = onnxlens.analyze(model)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    kernels = MODEL.kernels(result.graph, result.groups, costs, {}, host_profile(1))
    return [k for run in kernels.values() for k in run or () if not k.nodes]


@pytest.mark.parametrize("op", ["Transpose", "Concat", "Split", "Identity", "Neg", "Softmax",
                                "Sigmoid", "Add"])
def test_an_op_keeps_float16_where_its_one_node_graph_holds_no_cast(op: str, tmp_path) -> None:
    """x -> op -> y, both float16 graph I/O: no Cast where ORT has a float16 kernel, one on
    each side of the float32 kernel otherwise."""
    inputs = ["x", "x"] if op == "Add" else ["x"]
    attrs = {"Concat": {"axis": 1}, "Split": {"axis": 1, "num_outputs": 1}}.get(op, {})
    model = _model([helper.make_node(op, inputs, ["y"], **attrs)], [2, 8], {})
    assert _ort_casts(model, tmp_path) == (0 if op in FLOAT16_KERNELS else 2)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                                "SimplifiedLayerNormalization", "FastGelu"])
def test_ort_norms_keep_float16(op: str, tmp_path) -> None:
    """ORT's own norms over [2, 8] (gamma an initializer) have float16 kernels; FastGelu not."""
    skip = op.startswith("Skip")
    domain = "" if op == "SimplifiedLayerNormalization" else "com.microsoft"
    inputs = ["x", "x", "g"] if skip else ["x", "g"] if "Norm" in op else ["x"]
    model = _model([helper.make_node(op, inputs, ["y"], domain=domain)], [2, 8],
                   {"g": _weight(8)} if "Norm" in op else {})
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert _ort_casts(model, tmp_path) == (0 if op in FLOAT16_KERNELS else 2)


def test_matmul_reshape_matmul_runs_in_float32_with_casts_at_the_ends(tmp_path) -> None:
    """The Reshape between two float32 MatMuls is isolated: ORT forces it to float32, so only
    the graph input and output are cast: 2, as the kernel model says."""
    model = _model([helper.make_node("MatMul", ["x", "w1"], ["a"]),
                    helper.make_node("Reshape", ["a", "s"], ["b"]),
                    helper.make_node("MatMul", ["b", "w2"], ["y"])],
                   [4, 16], {"w1": _weight(16, 16), "s": np.array([8, 8]),
                             "w2": _weight(8, 8)}, [8, 8])
    assert len(_model_casts(model)) == _ort_casts(model, tmp_path) == 2


def test_rotate_half_casts_at_each_float16_float32_boundary(tmp_path) -> None:
    """RoPE's rotate-half: x -> MatMul -> t; Split(t) -> a, b; Neg(b); Concat(-b, a) -> r;
    y = r * t. Split keeps its float16 kernel; Concat, whose first input (all ORT checks of a
    variadic one) comes from the float32 Neg and whose reader is the float32 Mul, is isolated
    and runs in float32. Casts: x up, t down (Split reads it), a and b up, y down: 5, counted
    by ORT too."""
    model = _model([helper.make_node("MatMul", ["x", "w"], ["t"]),
                    helper.make_node("Split", ["t"], ["a", "b"], axis=1, num_outputs=2),
                    helper.make_node("Neg", ["b"], ["nb"]),
                    helper.make_node("Concat", ["nb", "a"], ["r"], axis=1),
                    helper.make_node("Mul", ["r", "t"], ["y"])],
                   [4, 16], {"w": _weight(16, 16)})
    assert len(_model_casts(model)) == _ort_casts(model, tmp_path) == 5


def test_transpose_into_mul_casts_per_tensor_not_per_reader(tmp_path) -> None:
    """x -> MatMul -> Reshape -> Transpose -> z, read by two Muls (float32): Reshape and
    Transpose keep float16 (neither is isolated: each has a float16 neighbour); Casts: x up,
    the MatMul's output down, z up once for both readers, y down: 4, as ORT counts."""
    model = _model([helper.make_node("MatMul", ["x", "w"], ["a"]),
                    helper.make_node("Reshape", ["a", "s"], ["b"]),
                    helper.make_node("Transpose", ["b"], ["z"], perm=[1, 0, 2]),
                    helper.make_node("Mul", ["z", "c"], ["m"]),
                    helper.make_node("Mul", ["z", "m"], ["y"])],
                   [4, 16], {"w": _weight(16, 16), "s": np.array([4, 2, 8]),
                             "c": _weight(1)}, [2, 4, 8])
    casts = _model_casts(model)
    assert len(casts) == _ort_casts(model, tmp_path) == 4
    # each converts its 64 elements: 2 bytes on one side, 4 on the other
    assert [(k.cost.bytes_read + k.cost.bytes_written) for k in casts] == [6 * 64] * 4


def test_a_cast_moves_two_and_four_bytes_an_element() -> None:
    t = onnxlens.analyze(_model([helper.make_node("Neg", ["x"], ["y"])], [3, 5], {})).graph
    kernel = cast_kernel(t.info(t.order[0]).inputs[0])
    assert (kernel.cost.bytes_read, kernel.cost.bytes_written, kernel.cost.other_flops) == (
        30, 60, 15)


@pytest.mark.parametrize("readers", [1, 2])
def test_a_constant_is_cast_at_run_time_only_when_float32_nodes_share_it(readers: int,
                                                                         tmp_path) -> None:
    """ORT folds the Cast of a float16 initializer into its reader when it has one; shared
    by two Muls, the Cast runs. Casts: x up, c (if shared), y down."""
    muls = [helper.make_node("Mul", ["x", "c"], ["m0"])] + [
        helper.make_node("Mul", [f"m{i - 1}", "c"], [f"m{i}"]) for i in range(1, readers)]
    model = _model([*muls, helper.make_node("Sigmoid", [f"m{readers - 1}"], ["y"])], [4, 8],
                   {"c": _weight(1)})
    assert len(_model_casts(model)) == _ort_casts(model, tmp_path) == readers + 1
