"""The ORT CPU estimate of what an LLM decode step runs: an embedding lookup that copies one row
of a big table, and GEMVs that stream their cold weights (each by hand)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.calibration import constant_efficiency
from onnxlens.analyzer.cost.base import Cost
from onnxlens.analyzer.estimate import cold_weights, estimate_group, peak_seconds
from onnxlens.analyzer.hardware import Runtime, load_profile, what_if
from onnxlens.analyzer.ir import NodeInfo
from onnxlens.analyzer.runtimes import node_class
from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels

VOCAB, HIDDEN, TOKENS = 4096, 64, 3


def _lookup() -> onnxlens.AnalysisResult:
    """input_ids [1, 3] -> Gather from a [4096, 64] float table (1 MiB)."""
    table = numpy_helper.from_array(np.zeros((VOCAB, HIDDEN), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, TOKENS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, HIDDEN])], [table])
    return onnxlens.analyze(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]))


def test_an_embedding_lookup_reads_the_rows_it_copies() -> None:
    r = _lookup()
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    rows = TOKENS * HIDDEN * 4  # 768 bytes copied
    assert costs["embed"].bytes_read == VOCAB * HIDDEN * 4 + TOKENS * 8  # the node: all of it
    [kernel] = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert kernel.cost.bytes_read == rows + TOKENS * 8  # ORT's kernel: the rows and the ids
    assert kernel.cost.bytes_written == rows
    assert kernel.cost.param_bytes == rows  # the weights it fetches cold
    assert kernel.cost.params == VOCAB * HIDDEN  # the model still has the whole table


def test_contrib_kernels_take_their_classes() -> None:
    def cls(op: str) -> str:
        return node_class(NodeInfo("n", op, "com.microsoft", {}, (), ()))

    assert [cls(op) for op in ("GroupQueryAttention", "MatMulNBits",
                               "SkipSimplifiedLayerNormalization")] == [
        "attention", "gemm", "normalization"]


def test_a_gemv_streams_its_cold_weights_at_main_memory_bandwidth() -> None:
    """On xeon_8480 with a cold-fetch rate of 10 GB/s: a GEMV (1 x 1024 x 1024, 4 MiB of
    weights, 0.5 FLOP per byte, far under the DRAM ridge) fetches them at DRAM's streaming
    bandwidth; a 512-row GEMM of the same weights (compute-bound) at the cold rate, after its
    work."""
    hw = load_profile("xeon_8480")
    hw = dataclasses.replace(hw, runtime=Runtime(cold_weight_gbps=10.0))
    fp32, eff = what_if("fp32"), constant_efficiency(hw)
    weights = 4 * 1024 * 1024
    dram = hw.main_memory.bandwidth_gbps * 1e9
    for rows, rate in ((1, dram), (512, 10e9)):
        cost = Cost(macs=rows * 1024 * 1024, bytes_read=weights + rows * 4096,
                    bytes_written=rows * 4096, params=1024 * 1024, param_bytes=weights)
        hot = estimate_group(cost, "gemm", hw, fp32, eff)
        work = peak_seconds(cost, hw, fp32) / hw.class_efficiency("gemm")
        e = cold_weights(hot, cost, "gemm", hw, fp32)
        assert e.latency_s == pytest.approx(
            max(hot.latency_s, work + hot.overhead_s + weights / rate))
        assert e.latency_s > hot.latency_s  # the weights' fetch shows in both


def _n_bits(rows: int, level: int) -> onnxlens.AnalysisResult:
    """A [rows, 64] x 4-bit B (K 64, N 32, blocks of 32): 2 blocks per column."""
    k, n, block = 64, 32, 32
    blob = numpy_helper.from_array(np.zeros((n, k // block, block // 2), np.uint8), "b")
    scales = numpy_helper.from_array(np.ones(n * k // block, np.float32), "s")
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], name="q4",
                            domain="com.microsoft", K=k, N=n, bits=4, block_size=block,
                            accuracy_level=level)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])], [blob, scales])
    return onnxlens.analyze(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]))


@pytest.mark.parametrize(("rows", "level", "macs", "flops"), [
    # prefill, CompInt8: 8 x 64 x 32 = 16384 MACs at 8/23 of the int8 peak, no dequantizing
    (8, 4, round(16384 * 23 / 8), 0),
    # one row (decode) and accuracy_level 0 (fp32 GEMM on dequantized B): the node's cost,
    # 2 FLOPs per weight to dequantize B (2 x 64 x 32)
    (1, 4, 2048, 4096),
    (8, 0, 16384, 4096),
])
def test_matmul_n_bits_runs_mlas_int8_kernel_at_its_issue_rate(rows: int, level: int,
                                                               macs: int, flops: int) -> None:
    r = _n_bits(rows, level)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    assert costs["q4"].macs == rows * 64 * 32
    [kernel] = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert (kernel.cost.macs, kernel.cost.other_flops) == (macs, flops)
    assert kernel.cost.param_bytes == costs["q4"].param_bytes  # 4-bit weights and scales
