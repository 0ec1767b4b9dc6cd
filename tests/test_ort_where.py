"""ORT's Where on CPU (`ort_cpu.where_passes`): two select passes into temporaries and a merge,
costed by hand on a tiny node, and the catalogue's benchmark read as the `where` class."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.calibration import OWN_VECTOR_CLASSES
from onnxlens.analyzer.hardware import ORT_CPU, SUBCLASS_OF
from onnxlens.analyzer.host import host_profile
from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels
from onnxlens.backends.calibrate import catalogue, measure
from onnxlens.backends.ort_timing import profile_model


def test_ort_runs_where_as_two_selects_and_a_merge(tmp_path) -> None:
    """Where(C [2, 1, 3] bool, X scalar 0, Y [2, 4, 3] float): N = 24 output floats. Pass 1
    reads C (6 bytes) and X (4), writes a temporary (96); pass 2 reads C again and Y (96),
    writes another (96); the merge reads both temporaries (192), writes the output (96). So
    6 + 4 + 6 + 96 + 192 = 304 bytes read, 3·96 = 288 written, 3 selects an element: 72."""
    node = helper.make_node("Where", ["c", "x", "y"], ["o"])
    graph = helper.make_graph(
        [node], "w", [helper.make_tensor_value_info("c", TensorProto.BOOL, [2, 1, 3]),
                      helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 4, 3])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "x")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "w.onnx")
    result = onnxlens.analyze(tmp_path / "w.onnx")
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    [kernel] = ort_kernels(result.graph, result.groups[0], costs, 16)
    assert kernel.cls == "where"
    assert (kernel.cost.other_flops, kernel.cost.bytes_read, kernel.cost.bytes_written) == (
        72, 304, 288)
    assert SUBCLASS_OF["where"] == "elementwise" and "where" in OWN_VECTOR_CLASSES


def test_a_where_benchmark_is_one_kernel_of_its_class() -> None:
    """The catalogue's SDPA guard, Where(C, 0, Y) over [8, 32, 32] (N = 8192): one ORT
    kernel, a `where` point of 3·N selects and 2·N + 4 + 4·N + 8·N bytes read, 12·N
    written."""
    bench = catalogue.where((8, 32, 32))
    model = bench.build()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == ["Where"]
    point = measure._point(bench.name, model, 1e-5, 0.0, 0.0,
                           measure._kernels_of(ORT_CPU, host_profile(1)))
    assert point is not None
    n = 8 * 32 * 32
    assert (point.op_class, point.other_flops, point.bytes) == (
        "where", 3 * n, 2 * n + 4 + 4 * n + 8 * n + 12 * n)
