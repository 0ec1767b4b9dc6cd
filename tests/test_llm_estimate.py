"""The ORT CPU estimate of what an LLM decode step runs: an embedding lookup that copies one row
of a big table, and GEMVs that stream their cold weights (each by hand)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.calibration import constant_efficiency
from onnxlens.analyzer.cost.base import Cost
from onnxlens.analyzer.estimate import cold_weights, estimate_group, estimate_kernel, peak_seconds
from onnxlens.analyzer.hardware import (
    SUBCLASS_OF,
    HardwareProfile,
    Runtime,
    load_profile,
    stored,
    what_if,
)
from onnxlens.analyzer.ir import NodeInfo
from onnxlens.analyzer.runtimes import node_class
from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels, where_passes
from onnxlens.backends.ort_timing import profile_model

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
        "attention", "gemm", "skip_rms_normalization"]
    assert SUBCLASS_OF["skip_rms_normalization"] == "normalization"  # uncalibrated profiles


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


@pytest.mark.parametrize(("rows", "level", "cls", "flops"), [
    # prefill, CompInt8: the MLAS kernel's own class, no dequantizing of B
    (8, 4, "gemm_nbits", 0),
    # one row (decode: a GEMV of its own class) and accuracy_level 0 (fp32 GEMM on
    # dequantized B): the node's cost, 2 FLOPs per weight to dequantize B (2 x 64 x 32)
    (1, 4, "gemv_nbits", 4096),
    (8, 0, "gemm", 4096),
])
def test_matmul_n_bits_runs_mlas_int8_kernel_in_a_class_of_its_own(rows: int, level: int,
                                                                    cls: str, flops: int) -> None:
    r = _n_bits(rows, level)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    assert costs["q4"].macs == rows * 64 * 32
    [kernel] = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert (kernel.cls, kernel.cost.macs, kernel.cost.other_flops) == (
        cls, rows * 64 * 32, flops)
    assert kernel.cost.param_bytes == costs["q4"].param_bytes  # 4-bit weights and scales
    assert kernel.reuse == (2 * 64 if cls == "gemm_nbits" else 0)  # 2·K FLOPs per output


def test_matmul_n_bits_prefill_reads_its_curve_at_2k_flops_per_output() -> None:
    """The CompInt8 kernel's cost per output (a horizontal sum and a scaled store after its
    K/32 blocks) makes its efficiency a function of K: the estimator asks the curve at one
    call's 2·M·K·N = 2·8·64·32 FLOPs and at I = 2·K = 128, not at FLOPs per byte."""
    r = _n_bits(8, 4)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    [kernel] = ort_kernels(r.graph, r.groups[0], costs, 16)
    asked = []

    def efficiency(cls: str, flops: float, intensity: float) -> float:
        asked.append((cls, flops, intensity))
        return 0.25

    estimate_kernel(kernel, load_profile("xeon_8480"), stored("float32"), efficiency)
    assert asked == [("gemm_nbits", 2 * 8 * 64 * 32, 128)]


def _gqa(past: int, new: int = 1, **attrs: int) -> onnxlens.AnalysisResult:
    """GroupQueryAttention on `new` tokens (1: a decode step) after a past of `past`: packed
    QKV [1, new, (4 + 2·2)·8], 4 query heads over 2 KV heads of 8; `attrs` the node's own."""
    heads, kv_heads, head = 4, 2, 8
    node = helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total"],
        ["y", "present_key", "present_value"], name="gqa", domain="com.microsoft",
        num_heads=heads, kv_num_heads=kv_heads, **attrs)
    cache = [1, kv_heads, past, head]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("qkv", TensorProto.FLOAT,
                                       [1, new, (heads + 2 * kv_heads) * head]),
         helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),  # fixed: no LLM view
         helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
         helper.make_tensor_value_info("total", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, new, heads * head]),
         helper.make_tensor_value_info("present_key", TensorProto.FLOAT,
                                       [1, kv_heads, past + new, head]),
         helper.make_tensor_value_info("present_value", TensorProto.FLOAT,
                                       [1, kv_heads, past + new, head])])
    return onnxlens.analyze(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]))


def test_group_query_attention_decode_is_one_kernel_of_loops_over_its_scores() -> None:
    """ORT 1.31's GQA at decode (past 7 + 1 new = T 8 tokens, 4 query heads over 2 KV heads
    of 8 floats) is one `gqa_decode` kernel, a call per query head (its job: copy its KV
    head's cache, then a dot product and an axpy a score), with the node's MACs, 4·8·(8 + 8)
    = 512, and its boundary traffic, each tensor once: read the packed QKV (1·(4 + 2·2)·8
    floats, 256 bytes) and the past K and V (2·2·7·8 floats, 896 bytes); write the output
    (4·8 floats, 128 bytes) and the present K and V (2·2·8·8 floats, 1024 bytes). The
    estimator asks its curve at one job's 2·512 / 4 = 256 FLOPs and at I = 4·D = 32, the
    FLOPs of one score's dot product and axpy: the curve's I / (I + i_half) is its cost per
    score."""
    r = _gqa(7)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    [decode] = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert (decode.cls, decode.calls, decode.launches) == ("gqa_decode", 4, 1)
    assert decode.cost.macs == costs["gqa"].macs == 4 * 8 * (8 + 8)
    assert (decode.cost.bytes_read, decode.cost.bytes_written) == (256 + 896, 128 + 1024)
    asked = []

    def efficiency(cls: str, flops: float, intensity: float) -> float:
        asked.append((cls, flops, intensity))
        return 0.1

    estimate_kernel(decode, load_profile("xeon_8480"), stored("float32"), efficiency)
    assert asked == [("gqa_decode", 2 * 512 / 4, 4 * 8)]
    assert SUBCLASS_OF["gqa_decode"] == "gemm"  # a calibration without its benchmarks


def test_group_query_attention_prefill_softmaxes_row_by_row_beside_its_products() -> None:
    """ORT 1.31's GQA on a prompt of 4 tokens (no past: T = 4): per query head one SGEMM call
    for Q·Kᵀ and one for P·V (8 calls), and between them, inside the same kernel, a softmax
    over each of the 1·4·4 = 16 score rows of T = 4 with a scalar mask loop before it. The
    node's cost: 64 scores, (8 + 8)·64 = 1024 MACs, 2 FLOPs a score (scale, mask) and the
    softmax's (5·4 - 2)·16 = 288 FLOPs and 64 exps. The products keep the MACs and the 128
    FLOPs of scale and mask; the row softmax takes the 288 FLOPs and 64 exps, plus the mask
    loop's 16 lanes (AVX-512's fp32 width, the `block` passed) a score, 1024, over 16 rows, its
    float32 scratch of 64 scores read and written in place (256 bytes each way), no launch."""
    r = _gqa(0, new=4)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    assert (costs["gqa"].macs, costs["gqa"].other_flops, costs["gqa"].transcendental) == (
        1024, 128 + 288, 64)
    cache, products, softmax = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert cache.cls == "data_movement"
    assert (products.cls, products.calls, products.cost.macs) == ("attention", 8, 1024)
    assert (products.cost.other_flops, products.cost.transcendental) == (128, 0)
    assert (softmax.cls, softmax.rows, softmax.launches) == ("softmax", 16, 0)
    assert (softmax.cost.other_flops, softmax.cost.transcendental) == (288 + 16 * 64, 64)
    assert (softmax.cost.bytes_read, softmax.cost.bytes_written) == (256, 256)
    # the vector width is the profile's: AVX2's 8 lanes, 8 FLOPs a score
    assert ort_kernels(r.graph, r.groups[0], costs, 8)[2].cost.other_flops == 288 + 8 * 64


def test_a_sliding_window_prompt_multiplies_every_prompt_key() -> None:
    """A sliding-window layer (window W = 2, its past the cache's capacity, 2) on a prompt of
    4 tokens: the node's cost attends min(W, 2 + 4) = 2 keys a query (16 rows: 512 MACs, 2
    FLOPs a score and a softmax of (5·2 - 2)·16 = 128 FLOPs, 32 exps), where ORT 1.31
    multiplies each head's 4 query rows by the prompt's 4 keys and applies the window in the
    softmax: the products 1024 MACs (the unwindowed prompt's), the scale and mask's 64
    FLOPs, no exps left (none negative); the row softmax over 16 rows of 4, as without the
    window."""
    r = _gqa(2, new=4, sliding_window_cache=1, local_window_size=2)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    assert (costs["gqa"].macs, costs["gqa"].other_flops, costs["gqa"].transcendental) == (
        512, 64 + 128, 32)
    _, products, softmax = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert (products.cost.macs, products.cost.other_flops, products.cost.transcendental) == (
        1024, 64, 0)
    assert (softmax.rows, softmax.cost.other_flops, softmax.cost.transcendental) == (
        16, 288 + 16 * 64, 64)


def test_a_softcap_passes_each_score_to_libm_alone() -> None:
    """Gemma 2's softcap on the same prompt of 4 tokens: the node's cost adds 3 FLOPs and a
    tanh a score (64 scores: 192 FLOPs, 64 tanhs); ORT 1.31 runs it as a tanhf per score
    through libm (ComputeAttentionSoftcapInplace), so the products keep only scale and mask,
    the row softmax its own work, and 64 libm calls, which the estimate charges at the
    calibrated 6.3 ns each (403.2 ns on top of the kernel's compute time). At a decode step
    (past 7: T = 8) the `gqa_decode` kernel makes the 4·8 = 32 calls, its curve's work
    without them."""
    r = _gqa(0, new=4, softcap=50.0)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    assert (costs["gqa"].other_flops, costs["gqa"].transcendental) == (128 + 192 + 288, 128)
    _, products, softmax = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert (products.cost.other_flops, products.cost.transcendental) == (128, 0)
    assert (softmax.cost.other_flops, softmax.cost.transcendental) == (288 + 16 * 64, 64)
    assert (products.libm_calls, softmax.libm_calls) == (0, 64)
    hw = load_profile("xeon_8480")
    libm = dataclasses.replace(hw, runtime=dataclasses.replace(hw.runtime, libm_call_ns=6.3))
    def at(profile: HardwareProfile) -> float:
        return estimate_kernel(softmax, profile, stored("float32"),
                               lambda *_: 0.1).compute_s
    assert at(libm) - at(hw) == pytest.approx(64 * 6.3e-9)
    r = _gqa(7, softcap=50.0)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    [decode] = ort_kernels(r.graph, r.groups[0], costs, 16)
    assert decode.libm_calls == 4 * 8
    plain = _gqa(7).node_costs["gqa"].cost  # its softmax's 32 exps stay
    assert (decode.cost.other_flops, decode.cost.transcendental) == (
        plain.other_flops, plain.transcendental)


def _masked_attention() -> onnx.ModelProto:
    """The dynamo export's attention on 2 heads of 4 tokens x 8: Q·Kᵀ, a scalar scale, the
    mask's Add, Softmax, IsNaN -> Where (a fully masked row's NaNs to 0), P·V."""
    def value(name: str, shape: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale"),
             helper.make_node("Add", ["ss", "mask"], ["sm"], name="mask_add"),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
             helper.make_node("IsNaN", ["p"], ["nan"], name="isnan"),
             helper.make_node("Where", ["nan", "zero", "p"], ["pz"], name="where"),
             helper.make_node("MatMul", ["pz", "v"], ["y"], name="pv")]
    consts = [numpy_helper.from_array(np.array(0.35, np.float32), "scale"),
              numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    graph = helper.make_graph(
        nodes, "g", [value("q", [1, 2, 4, 8]), value("kt", [1, 2, 8, 4]), value("v", [1, 2, 4, 8]),
                     value("mask", [1, 1, 4, 4])], [value("y", [1, 2, 4, 8])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_attention_groups_mask_kernels_run_apart_from_its_products() -> None:
    """ORT folds the scale into a FusedMatMul and runs the mask's Add, the Softmax, IsNaN and
    Where as kernels of their own (profiled); the group is costed as the calibrated products
    (the two MatMuls and the scale, with the group's boundary traffic: Q, Kᵀ, V, the mask and
    the two scalars in, Y out), the Softmax at the softmax class over its 1·2·4 rows of 4, and
    the mask's Add and IsNaN at their nodes' costs, the Where at ORT's three passes
    (`where_passes`: its class's own)."""
    model = _masked_attention()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [
        "FusedMatMul", "Add", "Softmax", "IsNaN", "Where", "MatMul"]
    r = onnxlens.analyze(model)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    [group] = r.groups
    block, *apart = ort_kernels(r.graph, group, costs, 16)
    assert [(k.cls, k.nodes, k.rows) for k in apart] == [("elementwise", ("mask_add",), 0),
                                                         ("softmax", ("softmax",), 8),
                                                         ("elementwise", ("isnan",), 0),
                                                         ("where", ("where",), 0)]
    assert [k.cost for k in apart] == [*(costs[k] for k in ("mask_add", "softmax", "isnan")),
                                       where_passes(r.graph.info("where"), costs["where"])]
    assert block.cls == "attention" and block.cost.macs == 2 * (2 * 4 * 4 * 8)
    assert block.cost.other_flops == costs["scale"].other_flops == 2 * 4 * 4
    assert block.cost.transcendental == 0
    assert block.cost.bytes_read == 4 * (3 * 2 * 4 * 8 + 4 * 4 + 2)
    assert block.cost.bytes_written == 4 * 2 * 4 * 8
