"""The roofline estimate: a hand-computed case, and sanity on every shipped profile."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.calibration import constant_efficiency, resolve_target
from onnxlens.analyzer.cost.base import Cost
from onnxlens.analyzer.estimate import (
    Bound,
    absorbed,
    cold_weights,
    denormal_slowed,
    estimate_group,
    estimate_kernel,
    estimate_model,
)
from onnxlens.analyzer.hardware import (
    ORT_CPU,
    PRECISION_BYTES,
    Runtime,
    available_profiles,
    load_profile,
    profile_from_dict,
    what_if,
)
from onnxlens.analyzer.host import host_profile
from onnxlens.analyzer.ir import NodeInfo, TensorInfo
from onnxlens.analyzer.runtimes import Kernel, node_class
from onnxlens.analyzer.runtimes.ort_attention import packed_keys
from onnxlens.analyzer.runtimes.ort_cpu import (
    OrtCpu,
    blocked_transpose,
    broadcast_spans,
    denormal_reads,
    group_gemms,
    is_erf_gelu,
    layout_changes,
    matmul_calls,
    nchwc_block,
    normalized_rows,
    ort_conv_path,
    ort_kernels,
    reorder_cost,
    transpose_elements,
    transpose_runs,
)

TEST_GPU = {
    "name": "Test GPU", "kind": "gpu", "source": "made up for the test",
    "compute": {"peak_fp32_tflops": 60.0, "peak_fp16_tflops": 900.0},
    "memory": [
        {"name": "L2", "size_bytes": 50_000_000, "bandwidth_gbps": 6000.0,
         "energy_pj_per_byte": 2.0},
        {"name": "HBM", "bandwidth_gbps": 3000.0, "energy_pj_per_byte": 20.0},
    ],
    "overhead": {"kernel_launch_us": 3.0},
    "power": {"static_w": 100.0, "tdp_w": 700.0, "compute_pj_per_flop_fp32": 0.5},
    "efficiency": {"conv": 0.6, "depthwise": 0.2, "gemm": 0.7, "attention": 0.5,
                   "elementwise": 0.5, "normalization": 0.4, "pool": 0.4, "reduce": 0.3,
                   "data_movement": 0.3},
}


@pytest.fixture()
def gpu():
    return profile_from_dict(TEST_GPU, key="test", where="test")


def test_gemm_by_hand(gpu) -> None:
    cost = Cost(macs=10**9, bytes_read=4 * 10**6, bytes_written=4 * 10**6)
    e = estimate_group(cost, "gemm", gpu, what_if("fp32"), constant_efficiency(gpu))
    compute = 2e9 / (60e12 * 0.7)  # 2 FLOPs per MAC at 70% of the fp32 peak
    assert e.compute_s == pytest.approx(compute)
    assert e.level == "L2"  # 8 MB of traffic fits the 50 MB L2
    assert e.memory_s == pytest.approx(8e6 / 6000e9)
    assert e.latency_s == pytest.approx(compute + 3e-6)
    assert e.bound == Bound("compute")
    assert e.intensity == pytest.approx(2e9 / 8e6)
    energy = (2e9 * 0.5 + 8e6 * 2.0) * 1e-12 + 100 * (compute + 3e-6)
    assert e.energy_j == pytest.approx(energy)


def test_a_kernels_epilogue_runs_at_its_rate(gpu) -> None:
    """A GEMM with 10^8 bias and activation FLOPs: at fp32, (2·10^9 + 10^8) FLOPs at 70% of
    60 TFLOP/s; at fp16 the MACs use the 900 TFLOP/s peak, the epilogue the fp32 one, both at
    the GEMM's efficiency (not the elementwise one, 0.5)."""
    cost = Cost(macs=10**9, other_flops=10**8, bytes_read=4000, bytes_written=4000)
    eff = constant_efficiency(gpu)
    fp32 = estimate_group(cost, "gemm", gpu, what_if("fp32"), eff)
    assert fp32.compute_s == pytest.approx(2.1e9 / (60e12 * 0.7))
    fp16 = estimate_group(cost, "gemm", gpu, what_if("fp16"), eff)
    assert fp16.compute_s == pytest.approx((2e9 / 900e12 + 1e8 / 60e12) / 0.7)


def test_a_transcendental_costs_the_calibrated_plain_flops(gpu) -> None:
    """10^9 other FLOPs of which 4·10^8 transcendental, τ = 5: the vector units do
    10^9 + 4·4·10^8 = 2.6·10^9 plain-FLOP equivalents at 50% of the 60 TFLOP/s fp32 peak; a
    profile without τ counts each transcendental once."""
    cost = Cost(other_flops=10**9, transcendental=4 * 10**8, bytes_read=4000, bytes_written=4000)
    plain = estimate_group(cost, "elementwise", gpu, what_if("fp32"), constant_efficiency(gpu))
    assert plain.compute_s == pytest.approx(1e9 / (60e12 * 0.5))
    tau_hw = dataclasses.replace(gpu, runtime=Runtime(transcendental_flops=5.0))
    e = estimate_group(cost, "elementwise", tau_hw, what_if("fp32"), constant_efficiency(gpu))
    assert e.compute_s == pytest.approx(2.6e9 / (60e12 * 0.5))


def test_cold_weights_serialize_with_work_and_overlap_stalls(gpu) -> None:
    """4 MB of weights fetched cold at 10 GB/s (0.4 ms), on the test GPU (GEMM at 70% of
    60 TFLOP/s, 3 us launch). A compute-bound GEMM (2·10^9 FLOPs: 47.6 us) pays the fetch on
    top: 47.6 + 3 + 400 us. A GEMV already streaming 8 GB from HBM (2.7 ms) hides it. A
    profile without the measured rate is unchanged."""
    cold = dataclasses.replace(gpu, runtime=Runtime(cold_weight_gbps=10.0))
    eff = constant_efficiency(gpu)
    gemm = Cost(macs=10**9, bytes_read=4 * 10**6, bytes_written=4000, param_bytes=4 * 10**6)
    hot = estimate_group(gemm, "gemm", cold, what_if("fp32"), eff)
    e = cold_weights(hot, gemm, "gemm", cold, what_if("fp32"))
    assert e.latency_s == pytest.approx(2e9 / (60e12 * 0.7) + 3e-6 + 4e-4)
    assert e.bound == Bound("memory", "HBM") and e.energy_j > hot.energy_j
    stream = Cost(macs=10**6, bytes_read=8 * 10**9, param_bytes=4 * 10**6)
    hot = estimate_group(stream, "gemm", cold, what_if("fp32"), eff)
    assert cold_weights(hot, stream, "gemm", cold, what_if("fp32")).latency_s == hot.latency_s
    assert cold_weights(hot, gemm, "gemm", gpu, what_if("fp32")) == hot


def test_cold_activations_add_their_fetch_after_the_work(gpu) -> None:
    """1 MB of activations on evicted lines at a cold rate of 10 GB/s: 100 us on top of a
    compute-bound GEMM's 47.6 + 3 us, whatever overlapped before; on a kernel streaming below
    the ridge point (1 FLOP per 8 bytes) they come at the source's bandwidth, HBM's 3,000 GB/s
    (0.33 us); without the measured rate, nothing."""
    cold = dataclasses.replace(gpu, runtime=Runtime(cold_weight_gbps=10.0))
    eff = constant_efficiency(gpu)
    gemm = Cost(macs=10**9, bytes_read=4 * 10**6, bytes_written=4000)
    hot = estimate_group(gemm, "gemm", cold, what_if("fp32"), eff)
    e = cold_weights(hot, gemm, "gemm", cold, what_if("fp32"), cold=10**6)
    assert e.latency_s == pytest.approx(2e9 / (60e12 * 0.7) + 3e-6 + 1e-4)
    assert e.memory_s == pytest.approx(hot.memory_s + 1e-4) and e.energy_j > hot.energy_j
    stream = Cost(other_flops=10**6, bytes_read=8 * 10**6)
    hot = estimate_group(stream, "elementwise", cold, what_if("fp32"), eff)
    e = cold_weights(hot, stream, "elementwise", cold, what_if("fp32"), cold=10**6)
    assert e.latency_s == pytest.approx(hot.latency_s + 1e6 / 3000e9)
    assert cold_weights(hot, stream, "elementwise", gpu, what_if("fp32"), cold=10**6) == hot


def test_the_first_kernel_reading_the_input_fetches_it_and_its_output_cold(gpu) -> None:
    """A stem Conv 3 -> 16, 3x3/2 over [1, 3, 32, 32], then a 1x1 Conv: the stem reads the
    input (3 x 32 x 32 x 4 = 12,288 bytes) and writes [1, 16, 16, 16] (16,384) on evicted
    lines; the second Conv reads what the stem just wrote: nothing cold."""
    r = _analyzed([helper.make_node("Conv", ["x", "w"], ["s"], strides=[2, 2], pads=[1] * 4),
                   helper.make_node("Relu", ["s"], ["a"]),
                   helper.make_node("Conv", ["a", "v"], ["y"])], [1, 3, 32, 32],
                  ("y", [1, 16, 16, 16]), {"w": [16, 3, 3, 3], "v": [16, 16, 1, 1]})
    hw = dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(name=ORT_CPU))
    kernels = [k for run in OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {}, hw).values()
               for k in run or ()]
    assert [k.cold_bytes for k in kernels if k.nodes] == [12288 + 16384, 0]
    assert all(k.cold_bytes == 0 for k in kernels if not k.nodes)


def test_what_ort_folds_at_load_is_no_kernel_and_its_readers_read_it_cold(
        gpu, tmp_path: Path) -> None:
    """LeViT's attention bias: a Gather of a [4, 64] table by constant [8, 8] indices, added to
    [1, 4, 8, 8] scores (here a Softmax's, so the Add is not the first kernel, which reads
    the input cold). ORT computes the Gather when the session loads (its optimized graph has
    none), so it is no kernel of ours; the Add reads its [4, 8, 8] output, 4 x 8 x 8 x 4 =
    1,024 bytes, as a constant fetched cold. A tied decoder's embedding, a Gather of one
    token from the Transpose of its [8, 16] lm_head weight: the Transpose is folded too, and
    the Gather reads one row of 8 floats, 32 bytes, not the table."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 64)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.integers(0, 64, (8, 8)), "idx"),
             numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "lm")]
    nodes = [helper.make_node("Gather", ["table", "idx"], ["bias"], axis=1, name="gather"),
             helper.make_node("Softmax", ["x"], ["s"], axis=-1, name="softmax"),
             helper.make_node("Add", ["s", "bias"], ["y"], name="add"),
             helper.make_node("Transpose", ["lm"], ["emb"], perm=[1, 0], name="tied"),
             helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                     helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    kept = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    assert "Transpose" not in kept and "Gather" in kept  # the lookup by input ids stays
    r = onnxlens.analyze(model)
    hw = dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(name=ORT_CPU))
    kernels = [k for run in OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {}, hw).values()
               for k in run or () if k.nodes]
    assert not [k for k in kernels if {"gather", "tied"} & set(k.nodes)]
    assert [k.cold_bytes for k in kernels if "add" in k.nodes] == [1024]
    assert [k.cold_bytes for k in kernels if "embed" in k.nodes] == [32]


def test_a_depthwise_kernel_fetches_its_filter_a_line_at_a_time_from_main_memory(gpu) -> None:
    """A depthwise 3x3 Conv over [1, 24, 8, 8], then a 1x1 Conv: with AVX-512's block of 16,
    MLAS's filter is 32 padded channels x 9 taps x 4 bytes = 18 lines of 64 bytes (AVX2's
    block of 8: 24 x 9 x 4 / 64 = 13.5, 14 lines); the dense Conv has none. At 20 ns a line
    (`runtime.cold_line_ns`) the depthwise group costs 360 ns more when the run's weights
    come from main memory, nothing more when they stay in the last-level cache (this tiny
    graph, analyzed: a run touches a few KB) or without the calibrated figure."""
    r = _analyzed([helper.make_node("Conv", ["x", "w"], ["d"], group=24, pads=[1] * 4),
                   helper.make_node("Conv", ["d", "v"], ["y"])], [1, 24, 8, 8],
                  ("y", [1, 16, 8, 8]), {"w": [24, 1, 3, 3], "v": [16, 24, 1, 1]})
    lines = {}
    for bits in (512, 256):
        hw = dataclasses.replace(gpu, simd_bits=bits, runtime=Runtime(name=ORT_CPU))
        lines[bits] = [k.cold_lines for run in OrtCpu().kernels(
            r.graph, r.groups, _node_costs(r), {}, hw).values() for k in run or () if k.nodes]
    assert lines == {512: [18, 0], 256: [14, 0]}
    args = (r.graph, r.groups, {g: gc.cost for g, gc in r.group_costs.items()}, _node_costs(r))
    hw = {ns: dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(ORT_CPU, cold_line_ns=ns))
          for ns in (0.0, 20.0)}
    cold, hot = (estimate_model(*args, hw[ns], "fp32") for ns in (20.0, 0.0))
    dw = r.groups[0].id
    assert cold.groups[dw].latency_s - hot.groups[dw].latency_s == pytest.approx(360e-9)
    assert cold.latency_s - hot.latency_s == pytest.approx(360e-9)
    in_llc = (estimate_model(*args, hw[ns], "fp32", model=r.model) for ns in (20.0, 0.0))
    assert next(in_llc).latency_s == next(in_llc).latency_s


def test_every_kernel_starts_cold_when_the_run_evicts_it(gpu) -> None:
    """Two Relus on [1, 16, 8, 8] through ORT's kernels: 2 kernels, each paying the profile's
    calibrated 1.5 us (`runtime.cold_kernel_us`) beside its launch when the run's weights come
    from main memory (3 us in all), nothing more when the run stays in the last-level cache
    (this graph analyzed: a few KB) or without the calibrated figure."""
    r = _analyzed([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                  [1, 16, 8, 8], ("y", [1, 16, 8, 8]), {})
    args = (r.graph, r.groups, {g: gc.cost for g, gc in r.group_costs.items()}, _node_costs(r))
    hw = {us: dataclasses.replace(gpu, runtime=Runtime(ORT_CPU, cold_kernel_us=us))
          for us in (0.0, 1.5)}
    kernels = [k for run in OrtCpu().kernels(*args[:2], args[3], {}, hw[0.0]).values()
               for k in run or ()]
    assert sum(k.launches for k in kernels) == 2
    cold, hot = (estimate_model(*args, hw[us], "fp32") for us in (1.5, 0.0))
    assert cold.latency_s - hot.latency_s == pytest.approx(3e-6)
    in_llc = (estimate_model(*args, hw[us], "fp32", model=r.model) for us in (1.5, 0.0))
    assert next(in_llc).latency_s == next(in_llc).latency_s
    assert hw[1.5].evicted().kernel_launch_us == gpu.kernel_launch_us + 1.5


def test_a_gemm_with_a_bias_broadcasts_it_into_its_output_first(gpu, tmp_path: Path) -> None:
    """MatMul [1, 64, 16] x [16, 32] + a [32] bias: ORT runs one Gemm (MatMulAddFusion, in its
    optimized graph), which writes the bias into every row of Y (64 x 32 x 4 = 8,192 bytes,
    reading the 128-byte bias), a pass with no launch of its own, then reads Y back as C:
    the GEMM's bytes read grow by 8,192. Without the Add, one GEMM kernel and no pass."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    r = _analyzed(nodes, [1, 64, 16], ("y", [1, 64, 32]), {"w": [16, 32], "b": [32]})
    model = r.model.proto
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert "Gemm" in {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    hw = dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(name=ORT_CPU))
    plain = _analyzed(nodes[:1], [1, 64, 16], ("m", [1, 64, 32]), {"w": [16, 32]})
    (gemm,), = [run for run in OrtCpu().kernels(plain.graph, plain.groups, _node_costs(plain),
                                                {}, hw).values()]
    copy, fused = [k for run in OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {},
                                                 hw).values() for k in run or ()]
    assert (copy.cls, copy.launches, copy.cost.bytes_read, copy.cost.bytes_written) == (
        "data_movement", 0, 128, 8192)
    assert fused.cls == "gemm" and fused.cost.bytes_read == gemm.cost.bytes_read + 128 + 8192


def test_big_elementwise_is_memory_bound_in_main_memory(gpu) -> None:
    n = 100_000_000  # Add of two 400 MB tensors: 1 FLOP per 12 bytes
    cost = Cost(other_flops=n, bytes_read=8 * n, bytes_written=4 * n)
    e = estimate_group(cost, "elementwise", gpu, what_if("fp32"), constant_efficiency(gpu))
    assert e.bound == Bound("memory", "HBM")
    assert e.memory_s == pytest.approx(12 * n / 3000e9)


def test_fp16_halves_bytes_and_int8_quarters_them(gpu) -> None:
    cost = Cost(other_flops=10, bytes_read=4 * 10**8, bytes_written=0)
    eff = constant_efficiency(gpu)
    def memory_s(precision: str) -> float:
        return estimate_group(cost, "elementwise", gpu, what_if(precision), eff).memory_s

    assert memory_s("fp16") == pytest.approx(memory_s("fp32") / 2)
    assert memory_s("int8") == pytest.approx(memory_s("fp32") / 4)
    assert PRECISION_BYTES["int8"] == 1


def test_tiny_kernel_is_overhead_bound(gpu) -> None:
    e = estimate_group(Cost(other_flops=64, bytes_read=256, bytes_written=256), "elementwise",
                       gpu, what_if("fp32"), constant_efficiency(gpu))
    assert e.bound == Bound("overhead")


def test_working_set_picks_the_level(gpu) -> None:
    assert gpu.memory_level(10).name == "L2"
    assert gpu.memory_level(50_000_001).name == "HBM"


SHIPPED = available_profiles()


@pytest.mark.parametrize("key", SHIPPED)
def test_roofline_sanity_on_every_profile(key: str) -> None:
    hw = load_profile(key)
    eff = constant_efficiency(hw)
    n = 8192  # square fp32 GEMM: 2*n^3 FLOPs over 12*n^2 bytes, intensity ~1365 FLOP/B
    gemm = Cost(macs=n**3, bytes_read=8 * n * n, bytes_written=4 * n * n)
    assert estimate_group(gemm, "gemm", hw, what_if("fp32"), eff).bound == Bound("compute")
    m = 1 << 28  # elementwise Add of 1 GiB tensors
    add = Cost(other_flops=m, bytes_read=8 * m, bytes_written=4 * m)
    assert estimate_group(add, "elementwise", hw, what_if("fp32"), eff).bound.kind == "memory"
    if hw.kind == "gpu" and hw.peak_tflops.get("fp16", 0) > hw.peak_tflops["fp32"]:
        fp32 = estimate_group(gemm, "gemm", hw, what_if("fp32"), eff).latency_s
        assert estimate_group(gemm, "gemm", hw, what_if("fp16"), eff).latency_s <= fp32


def test_shipped_profiles_cover_the_issue() -> None:
    wanted = {"v100", "a100", "h100", "h200", "tpu_v4", "tpu_v5e", "kpu"}
    assert wanted <= set(SHIPPED), sorted(wanted - set(SHIPPED))
    assert len(SHIPPED) >= 11


def test_estimates_in_the_json(tmp_path, gpu) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text(_toml(TEST_GPU))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"], name="mm")], "g",
                              [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    d = onnxlens.analyze(model, hardware=[str(path)], precision=["fp32", "fp16"],
                         batch=None).to_dict()
    est = d["estimates"]["gpu"]
    assert est["calibrated"] is False and est["precision"] == "fp32"
    group = d["groups"][0]["estimates"]["gpu"]
    assert group["latency_s"] == pytest.approx(est["latency_s"])
    kind = group["bound_kind"]
    assert group["bound"] == (f"memory:{group['level']}" if kind == "memory" else kind)
    assert {r["precision"] for r in d["sweep"]} == {"fp32", "fp16"}


def _toml(data: dict) -> str:
    """Enough TOML for the test profile: scalars, tables and one array of tables."""
    def value(v: object) -> str:
        return f'"{v}"' if isinstance(v, str) else repr(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict | list)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{kk} = {value(vv)}" for kk, vv in v.items())]
        elif isinstance(v, list):
            for item in v:
                lines += [f"[[{k}]]", *(f"{kk} = {value(vv)}" for kk, vv in item.items())]
    return "\n".join(lines) + "\n"


# ---- ONNX Runtime's kernels (a profile calibrated through ORT) --------------------------------

def _analyzed(nodes: list, x_shape: list[int], y: tuple[str, list[int]], consts: dict):
    """A float graph of `nodes` with input x, initializers `consts` (name -> shape), analyzed."""
    inits = [helper.make_tensor(n, TensorProto.FLOAT, s, [0.1] * math.prod(s))
             for n, s in consts.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            y[0], TensorProto.FLOAT, y[1])], inits)
    return onnxlens.analyze(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]))


def _ort(hw):
    """`hw` as a calibration through ORT leaves it: its runtime named."""
    return dataclasses.replace(hw, runtime=dataclasses.replace(hw.runtime, name=ORT_CPU))


def _node_costs(result) -> dict:
    return {k: nc.cost for k, nc in result.node_costs.items()}


def test_conv_silu_is_a_conv_kernel_a_quickgelu_and_a_reorder(gpu) -> None:
    """Conv+SiLU on [1,16,8,8]: ORT runs the Conv in NCHWc (a ReorderInput of the graph input
    first) and x·sigmoid(x) as a QuickGelu kernel reading and writing the output again."""
    r = _analyzed([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
                   helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
                   helper.make_node("Mul", ["c", "s"], ["y"], name="mul")],
                  [1, 16, 8, 8], ("y", [1, 16, 8, 8]), {"w": [16, 16, 1, 1], "b": [16]})
    assert [g.pattern for g in r.groups] == ["Conv+SiLU"]
    act = 4 * 1024  # bytes of one [1,16,8,8] tensor
    conv, quick = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    assert (conv.cls, conv.reads, conv.writes) == ("conv", "nchwc", "nchwc")
    assert conv.cost.macs == 16 * 16 * 64
    assert (conv.cost.bytes_read, conv.cost.bytes_written) == (act + 4 * (256 + 16), act)
    silu_flops = _node_costs(r)["sig"].other_flops + _node_costs(r)["mul"].other_flops
    assert quick.cost == Cost(other_flops=silu_flops, transcendental=quick.cost.transcendental,
                              bytes_read=act, bytes_written=act)
    eff = constant_efficiency(gpu)
    by_hand = (estimate_group(Cost(bytes_read=act, bytes_written=act), "data_movement", gpu,
                              what_if("fp32"), eff).latency_s  # the reorder of x
               + estimate_group(conv.cost, "conv", gpu, what_if("fp32"), eff).latency_s
               + estimate_group(quick.cost, "elementwise", gpu, what_if("fp32"), eff).latency_s)
    est = r.estimate(_ort(gpu))
    assert est.latency_s == pytest.approx(by_hand)
    assert est.groups[0].overhead_s == pytest.approx(3 * 3e-6)  # three kernels
    one_kernel = r.estimate(gpu)  # not calibrated through ORT: the group is one kernel
    assert one_kernel.groups[0].overhead_s == pytest.approx(3e-6)


@pytest.mark.parametrize(("act", "anchor", "weight", "in_kernel"), [
    ("Relu", "Conv", [16, 16, 1, 1], True),  # the NCHWc kernel applies ReLU as it stores
    ("HardSigmoid", "Conv", [16, 16, 1, 1], False),  # any other activation: a pass
    ("Relu", "Conv", [18, 16, 1, 1], False),  # 18 channels: the NCHW path, a pass
    ("Relu", "Gemm", [8, 8], False),  # FusedGemm: a pass
])
def test_an_activation_mlas_applies_after_the_kernel_is_a_pass(
        gpu, act: str, anchor: str, weight: list[int], in_kernel: bool) -> None:
    """Anchor + activation: one ORT kernel. Where MLAS applies the activation in a pass over
    the output (`activation_passes`), its FLOPs leave the kernel's cost for the epilogue, and
    the group costs the kernel plus that pass at the elementwise rate, with no launch."""
    x = [1, 16, 8, 8] if anchor == "Conv" else [4, 8]
    y = [1, weight[0], 8, 8] if anchor == "Conv" else [4, 8]
    r = _analyzed([helper.make_node(anchor, ["x", "w"], ["c"], name="anchor"),
                   helper.make_node(act, ["c"], ["y"], name="act")], x, ("y", y), {"w": weight})
    [kernel] = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    act_cost = _node_costs(r)["act"]
    anchor_cost = _node_costs(r)["anchor"]
    if in_kernel:
        assert kernel.epilogue == Cost()
        assert kernel.cost.other_flops == anchor_cost.other_flops + act_cost.other_flops
        return
    assert kernel.epilogue == Cost(other_flops=act_cost.other_flops,
                                   transcendental=act_cost.transcendental)
    assert kernel.cost.other_flops == anchor_cost.other_flops
    eff = constant_efficiency(gpu)
    est = r.estimate(_ort(gpu)).groups[r.groups[0].id]
    assert est is not None
    pass_s = act_cost.other_flops / (60e12 * 0.5)  # the elementwise rate, no traffic
    assert est.latency_s == pytest.approx(
        estimate_group(kernel.cost, kernel.cls, gpu, what_if("fp32"), eff).latency_s + pass_s
        + sum(estimate_group(reorder_cost(t, nchwc_block(gpu)), "data_movement", gpu,
                             what_if("fp32"), eff).latency_s
              for t in layout_changes(kernel, {"x": {"nchw"}})))


@pytest.mark.parametrize(("channels", "block", "nchwc_bytes"), [
    (8, 16, 4 * 16 * 112 * 112),  # GhostNet's 8 channels in one 16-channel block
    (24, 8, 4 * 24 * 112 * 112),  # whole blocks: no padding
    (4, 8, 4 * 8 * 112 * 112),
])
def test_a_reorder_moves_the_nchwc_sides_padded_blocks(channels, block, nchwc_bytes) -> None:
    t = TensorInfo("t", TensorProto.FLOAT, (1, channels, 112, 112))
    cost = reorder_cost(t, block)
    assert (cost.bytes_read, cost.bytes_written) == (4 * channels * 112 * 112, nchwc_bytes)


def test_an_add_after_a_lone_conv_is_its_sum_input(gpu) -> None:
    """Conv, then Add of its output and x: two groups of ours, one NCHWc Conv of ORT's whose
    sum input is x. The Add costs what it adds to that Conv: 1024 adds in its epilogue and
    the read of x (4096 bytes), no launch. This Conv is memory bound on the test GPU, so the
    Add costs exactly its read at the level's bandwidth."""
    r = _analyzed([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                   helper.make_node("Add", ["c", "x"], ["y"], name="add")],
                  [1, 16, 8, 8], ("y", [1, 16, 8, 8]), {"w": [16, 16, 1, 1]})
    assert [g.pattern for g in r.groups] == ["Conv", "Add"]
    est = r.estimate(_ort(gpu))
    add = est.groups[r.groups[1].id]
    conv = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)[0]
    eff = constant_efficiency(gpu)
    alone = estimate_group(conv.cost, "conv", gpu, what_if("fp32"), eff, launches=0)
    both = estimate_group(conv.cost + Cost(other_flops=1024, bytes_read=4096), "conv", gpu,
                          what_if("fp32"), eff, launches=0)
    assert alone.bound.kind == "memory" and both.level == alone.level
    bandwidth = next(lv.bandwidth_gbps for lv in gpu.memory if lv.name == both.level)
    assert add.latency_s == pytest.approx(both.latency_s - alone.latency_s)
    assert add.latency_s == pytest.approx(4096 / (bandwidth * 1e9))
    assert add.overhead_s == 0


def test_squeeze_excite_is_five_kernels_and_its_gate_runs_in_nchw() -> None:
    """Squeeze-excite after an NCHWc Conv: ORT's pool, two small convolutions (ReLU and
    Sigmoid fused), and the broadcast Mul, which reads x and the gate in plain NCHW: both
    are reordered first; the second convolution reads 8 channels, fewer than a block of 16,
    in NCHW (`ort_conv_path`), so they are reordered back before it."""
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], name="conv0"),
             helper.make_node("Relu", ["c"], ["t"], name="relu0"),
             helper.make_node("GlobalAveragePool", ["t"], ["p"], name="gap"),
             helper.make_node("Conv", ["p", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu1"),
             helper.make_node("Conv", ["hr", "w2"], ["g"], name="fc2"),
             helper.make_node("Sigmoid", ["g"], ["s"], name="sig"),
             helper.make_node("Mul", ["t", "s"], ["y"], name="gate")]
    r = _analyzed(nodes, [1, 32, 8, 8], ("y", [1, 32, 8, 8]),
                  {"w0": [32, 32, 1, 1], "w1": [8, 32, 1, 1], "w2": [32, 8, 1, 1]})
    assert [g.pattern for g in r.groups] == ["Conv+Relu", "SqueezeExcite"]
    costs = _node_costs(r)
    kernels = ort_kernels(r.graph, r.groups[1], costs, 16)
    assert [k.nodes for k in kernels] == [("gap",), ("fc1", "relu1"), ("fc2", "sig"), ("gate",)]
    assert [k.cls for k in kernels] == ["pool", "conv", "conv", "elementwise"]
    have: dict[str, set[str]] = {"x": {"nchw"}}
    for k in ort_kernels(r.graph, r.groups[0], costs, 16):
        layout_changes(k, have)
    moved = [[t.name for t in layout_changes(k, have)] for k in kernels]
    assert moved == [[], [], ["hr"], ["t", "s"]]


def _reordered_as_ort_does(tmp_path: Path, r) -> tuple[set[str], set[str]]:
    """The tensors ORT reorders (its optimized graph's ReorderInput inputs and ReorderOutput
    outputs, the graph output's left out: the kernel model charges layout changes before the
    kernels that read them) and those our kernel model moves, at this host's block."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    model = r.model.proto
    model.ir_version = 8  # what ORT 1.18+ reads
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnxlens.analyze(str(tmp_path / "opt.onnx")).graph
    theirs = {t.name for i in optimized.infos.values() for t in (
        i.inputs[:1] if i.op_type == "ReorderInput" else
        i.outputs if i.op_type == "ReorderOutput" else ())} - {"y"}
    have: dict[str, set[str]] = {"x": {"nchw"}}
    block = nchwc_block(host_profile(1))
    ours = {t.name for g in r.groups for k in ort_kernels(r.graph, g, _node_costs(r), block)
            for t in layout_changes(k, have)}
    return theirs, ours


@pytest.mark.parametrize("middle", [8, 12, 16, 32])
def test_orts_reorders_around_a_conv_reading_few_channels(tmp_path: Path, middle: int) -> None:
    """1x1 Convs 16 -> `middle` -> 16 channels: we reorder what ORT's optimized graph does
    (AVX-512: a Conv reading 8 or 12 channels, fewer than a block, reads them in NCHW; AVX2
    blocks of 8 read 12 in NCHW)."""
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"]),
             helper.make_node("Conv", ["h", "w1"], ["y"])]
    r = _analyzed(nodes, [1, 16, 8, 8], ("y", [1, 16, 8, 8]),
                  {"w0": [middle, 16, 1, 1], "w1": [16, middle, 1, 1]})
    theirs, ours = _reordered_as_ort_does(tmp_path, r)
    assert ours == theirs


def test_orts_reorders_around_elementwise_ops_it_runs_in_nchw(tmp_path: Path) -> None:
    """EfficientFormer's pooling mixer and layer scale, Conv -> AveragePool -> Sub, and an Add
    of that to a per-channel Mul (NCHW, a broadcast), then a Conv: ORT runs the Sub (not an op
    its NchwcTransformer converts) and the Add (an input not NCHWc) in NCHW, so the pool's and
    the Conv's outputs are reordered out and the Add's back in, as its optimized graph has."""
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"]),
             helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[3, 3], pads=[1] * 4,
                              count_include_pad=0),
             helper.make_node("Sub", ["p", "c"], ["d"]),
             helper.make_node("Mul", ["d", "s"], ["m"]),
             helper.make_node("Add", ["c", "m"], ["a"]),
             helper.make_node("Conv", ["a", "w1"], ["y"])]
    r = _analyzed(nodes, [1, 32, 8, 8], ("y", [1, 32, 8, 8]),
                  {"w0": [32, 32, 1, 1], "w1": [32, 32, 1, 1], "s": [1, 32, 1, 1]})
    theirs, ours = _reordered_as_ort_does(tmp_path, r)
    assert ours == theirs and "a" in ours


def test_orts_gelu_between_convs_stays_nchwc(tmp_path: Path) -> None:
    """Conv, GELU in erf (ORT's Gelu kernel), Conv: ORT runs the Gelu on the NCHWc tensor, no
    reorder between the Convs (FastViT's 18 such had 35 reorders in our model, 9 in ORT's
    optimized graph), as its optimized graph has."""
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"])] + [
        helper.make_node(op, ins, [out]) for op, ins, out in (
            ("Div", ["c", "sqrt2"], "d"), ("Erf", ["d"], "e"), ("Add", ["e", "one"], "a"),
            ("Mul", ["c", "a"], "p"), ("Mul", ["p", "half"], "g"))] + [
        helper.make_node("Conv", ["g", "w1"], ["y"])]
    inits = [helper.make_tensor(n, TensorProto.FLOAT, s, [v] * math.prod(s)) for n, s, v in (
        ("w0", [32, 32, 1, 1], 0.1), ("w1", [32, 32, 1, 1], 0.1), ("sqrt2", [], math.sqrt(2)),
        ("one", [], 1.0), ("half", [], 0.5))]  # GELU's own constants, which ORT's fusion wants
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 32, 8, 8]) for n in "xy"]
    r = onnxlens.analyze(helper.make_model(helper.make_graph(nodes, "g", vi[:1], vi[1:], inits),
                                           opset_imports=[helper.make_opsetid("", 17)]))
    theirs, ours = _reordered_as_ort_does(tmp_path, r)
    assert ours == theirs == {"x"}


def test_convolution_classes() -> None:
    def conv(w: list[int], group: int) -> NodeInfo:
        return NodeInfo("c", "Conv", "", {"group": group}, (TensorInfo("x"), TensorInfo(
            "w", TensorProto.FLOAT, tuple(w))), (TensorInfo("y"),))

    assert node_class(conv([64, 8, 3, 3], 8)) == "grouped_conv"  # 8 channels per group
    assert node_class(conv([64, 1, 3, 3], 64)) == "depthwise"
    assert node_class(conv([64, 64, 3, 3], 1)) == "conv"
    # ORT's NCHWc path: output channels a multiple of 4; a 3-channel input is read as NCHW.
    assert ort_conv_path(conv([64, 3, 3, 3], 1), 16) == ("conv", "nchw", "nchwc")
    assert ort_conv_path(conv([58, 58, 1, 1], 1), 16) == ("conv", "nchw", "nchw")
    # A depthwise one with odd channels: MlasConv per channel, a class of its own.
    assert ort_conv_path(conv([58, 1, 3, 3], 58), 16) == ("depthwise_nchw", "nchw", "nchw")
    assert ort_conv_path(conv([64, 8, 3, 3], 8), 16) == ("grouped_conv", "nchw", "nchw")
    assert ort_conv_path(conv([64, 1, 3, 3], 64), 16) == ("depthwise", "nchwc", "nchwc")
    # Grouped: NCHWc when each group's channels fill whole blocks (16 here, 8 on AVX2), a class
    # of its own (MLAS's NCHWc kernel per group, no im2col).
    assert ort_conv_path(conv([64, 16, 3, 3], 4), 16) == ("grouped_conv_nchwc", "nchwc", "nchwc")
    assert ort_conv_path(conv([64, 8, 3, 3], 8), 8) == ("grouped_conv_nchwc", "nchwc", "nchwc")
    assert ort_conv_path(conv([96, 24, 3, 3], 4), 16) == ("grouped_conv", "nchw", "nchw")


@pytest.mark.parametrize(("multiplier", "nchwc"), [(1, True), (2, False), (4, False)])
def test_a_depthwise_conv_with_a_channel_multiplier_is_a_plain_conv(
        tmp_path: Path, multiplier: int, nchwc: bool) -> None:
    """A Conv over 32 groups of one input channel each, `multiplier` output channels per group
    ([32 x multiplier, 1, 3, 3], FastViT's downsampling with 2): ORT's NchwcTransformer takes
    it only with one output channel per group; with more it is a plain Conv in ORT's optimized
    graph, ours `depthwise_nchw` on the NCHW path: 32 groups of M = multiplier, K = 9, N = 196
    output pixels, N >= K and 64 >= 9 so StrideN doubles to 1024 (StrideK 16): one GEMM call
    per group."""
    import onnxruntime as ort

    cout = 32 * multiplier
    w = numpy_helper.from_array(np.ones((cout, 1, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=32, kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 14, 14])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    [theirs] = [n for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node if n.op_type == "Conv"]
    assert (theirs.domain == "com.microsoft.nchwc") == nchwc
    [head] = onnxlens.analyze(model).graph.infos.values()
    assert ort_conv_path(head, 16) == (("depthwise", "nchwc", "nchwc") if nchwc
                                       else ("depthwise_nchw", "nchw", "nchw"))
    if not nchwc:
        assert group_gemms(head) == (32, _reuse(multiplier, 9, 196))


def _conv_info(w: tuple[int, ...], y: tuple[int, ...], **attrs: object) -> NodeInfo:
    return NodeInfo("c", "Conv", "", attrs,
                    (TensorInfo("x", TensorProto.FLOAT, (y[0], w[1] * attrs.get("group", 1),
                                                         *y[2:])),
                     TensorInfo("w", TensorProto.FLOAT, w)),
                    (TensorInfo("y", TensorProto.FLOAT, y),))


def _reuse(m: int, k: int, n: int) -> float:
    return 2 * m * k * n / (4 * (m * k + k * n + m * n))


def test_grouped_convolutions_are_mlas_calls() -> None:
    """MlasConv's GEMM calls on the NCHW path (`group_gemms`), derived by hand from its
    blocking (StrideN = StrideK = 128, traded while one side is short); one call per image
    and group on the NCHWc path."""
    # 3x3, 64 channels in 8 groups, 24x24: M = 8, K = 72, N = 576 >= K and 64 < 72, so the
    # strides stay 128 x 128: 8 groups x ceil(576 / 128) = 40 calls of M = 8, K = 72, N = 128.
    calls, reuse = group_gemms(_conv_info((64, 8, 3, 3), (1, 64, 24, 24), group=8,
                                          pads=[1, 1, 1, 1]))
    assert calls == 40
    assert reuse == pytest.approx(_reuse(8, 72, 128)) and reuse == pytest.approx(3.408, rel=1e-3)
    # Depthwise 3x3 at 48x48, batch 2: K = 9, so StrideK halves 3 times (64, 32, 16 >= 9) and
    # StrideN becomes 1024: 2 images x 54 groups x ceil(2304 / 1024) = 324 calls.
    calls, reuse = group_gemms(_conv_info((54, 1, 3, 3), (2, 54, 48, 48), group=54,
                                          pads=[1, 1, 1, 1]))
    assert (calls, reuse) == (324, pytest.approx(_reuse(1, 9, 1024)))
    # Short N (3x3 at 4x4, 16 pixels < K = 144): StrideN halves to 16, StrideK grows to 1024.
    calls, reuse = group_gemms(_conv_info((32, 16, 3, 3), (1, 32, 4, 4), group=2,
                                          pads=[1, 1, 1, 1]))
    assert (calls, reuse) == (2, pytest.approx(_reuse(16, 144, 16)))
    # Pointwise grouped: one GEMM per group on the input itself, whatever N.
    calls, reuse = group_gemms(_conv_info((64, 8, 1, 1), (1, 64, 56, 56), group=8))
    assert (calls, reuse) == (8, pytest.approx(_reuse(8, 8, 3136)))
    # More filters than pixels (M = 64 > N = 4): the whole expansion, one GEMM per group.
    calls, reuse = group_gemms(_conv_info((128, 8, 3, 3), (1, 128, 2, 2), group=2,
                                          pads=[1, 1, 1, 1]))
    assert (calls, reuse) == (2, pytest.approx(_reuse(64, 72, 4)))
    # The NCHWc path: one direct convolution per image and group, no column buffer slices.
    calls, reuse = group_gemms(_conv_info((64, 8, 3, 3), (2, 64, 24, 24), group=8,
                                          pads=[1, 1, 1, 1]), sliced=False)
    assert (calls, reuse) == (16, pytest.approx(_reuse(8, 72, 576)))


def test_a_grouped_convolution_reads_one_calls_size_and_reuse(gpu) -> None:
    """The MAC efficiency reads a call's reuse in place of the kernel's FLOPs per byte, and
    the curve's size factor F/(F + f_half) one call's FLOPs."""
    reuse = _reuse(8, 72, 128)
    cost = Cost(macs=10**9, bytes_read=10**6, bytes_written=10**6)
    by_intensity = estimate_group(cost, "grouped_conv", gpu, what_if("fp32"),
                                  lambda c, f, i: i / 1e4, reuse=reuse)
    assert by_intensity.compute_s == pytest.approx(2e9 / (60e12 * reuse / 1e4))
    sized = estimate_group(cost, "grouped_conv", gpu, what_if("fp32"),
                           lambda c, f, i: i / 1e4 * f / (f + 1e8), reuse=reuse, calls=8)
    assert sized.compute_s == pytest.approx(2e9 / (60e12 * reuse / 1e4 * 2.5e8 / 3.5e8))


def test_a_calls_size_is_its_gemm_flops_whose_operands_set_the_level(gpu) -> None:
    """With a reuse, the curve reads 2·M·K·N per call, not the bias epilogue's FLOPs too:
    F / reuse is then the call's operand bytes 4(MK + KN + MN), the level's working set."""
    m, k, n, calls = 1, 9, 784, 58  # ShuffleNet's 58-channel depthwise: a GEMM per channel
    cost = Cost(macs=m * k * n * calls, other_flops=m * n * calls, bytes_read=10**5)
    asked: list[tuple[float, float]] = []

    def efficiency(cls: str, flops: float, intensity: float) -> float:
        asked.append((flops, intensity))
        return 0.5

    estimate_group(cost, "grouped_conv", gpu, what_if("fp32"), efficiency, reuse=_reuse(m, k, n),
                   calls=calls)
    ((flops, reuse),) = asked
    assert flops == 2 * m * k * n
    assert flops / reuse == pytest.approx(4 * (m * k + k * n + m * n))  # 31,376 B: in L1


def _transpose_info(shape: tuple[int, ...], perm: tuple[int, ...]) -> NodeInfo:
    f = TensorProto.FLOAT
    return NodeInfo("t", "Transpose", "", {"perm": list(perm)},
                    (TensorInfo("x", f, shape),),
                    (TensorInfo("y", f, tuple(shape[a] for a in perm)),))


@pytest.mark.parametrize(("shape", "perm", "runs"), [
    ((64, 49, 3, 3, 32), (2, 0, 3, 1, 4), 64 * 49 * 3 * 3),  # Swin's qkv split: runs of 32
    ((256, 16, 8, 8), (0, 2, 1, 3), 256 * 16 * 8),  # heads <-> tokens: runs of 8 x 8
    ((1, 2, 64, 24, 24), (0, 2, 1, 3, 4), 2 * 64),  # channel shuffle: runs of 24 x 24
    ((1, 64, 48, 48), (0, 2, 3, 1), 0),  # NCHW -> NHWC moves the innermost axis: streams
    ((1, 48, 48, 64), (0, 3, 1, 2), 0),
    ((1, 64, 1, 48), (0, 2, 1, 3), 0),  # only a size-1 axis moves: a copy
    ((8, 16), (0, 1), 0),
])
def test_a_transpose_copies_the_runs_its_permutation_leaves_whole(shape, perm, runs) -> None:
    assert transpose_runs(_transpose_info(shape, perm)) == runs


def _binary_info(op: str, a: tuple[int, ...], b: tuple[int, ...], y: tuple[int, ...]
                 ) -> NodeInfo:
    f = TensorProto.FLOAT
    return NodeInfo("n", op, "", {}, (TensorInfo("a", f, a), TensorInfo("b", f, b)),
                    (TensorInfo("y", f, y),))


@pytest.mark.parametrize(("op", "a", "b", "spans"), [
    ("Mul", (1, 1024, 6, 6), (1, 1024, 1, 1), 1024),  # squeeze-excite gate: C spans of H·W
    ("Mul", (1, 960, 1, 1), (1, 960, 7, 7), 960),  # the gate on the left: the same
    ("Mul", (1, 1, 1, 1), (1, 960, 7, 7), 0),  # one value for all: a scalar, one call
    ("Mul", (1, 3136, 48), (48,), 3136),  # channels-last layer scale: a span per row
    ("Add", (1, 196, 384), (1, 196, 384), 0),  # equal shapes: one call
    ("Add", (1, 196, 384), (), 0),  # a scalar: one call
    ("Div", (2, 1, 5), (2, 3, 5), 6),  # the middle axis broadcast: spans of 5
    ("Add", (8, 1), (8, 16), 8),  # the last axis broadcast: spans of 16
    ("Relu", (1, 8), (1, 8), 0),  # not a broadcasting op
])
def test_a_broadcast_makes_one_call_per_span(op, a, b, spans) -> None:
    y = tuple(max(p, q) for p, q in zip((1,) * (len(b) - len(a)) + a,
                                        (1,) * (len(a) - len(b)) + b, strict=True))
    assert broadcast_spans(_binary_info(op, a, b, y)) == spans


def test_a_broadcast_gates_spans_are_the_kernels_runs(gpu) -> None:
    """A [1, 64, 7, 7] x [1, 64, 1, 1] Mul is one elementwise kernel of 64 runs; a Slice of
    the second half of [1, 64, 7, 7]'s channels reads the 32 x 49 floats it copies."""
    r = _analyzed([helper.make_node("Mul", ["x", "g"], ["y"])], [1, 64, 7, 7],
                  ("y", [1, 64, 7, 7]), {"g": [1, 64, 1, 1]})
    [mul] = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    assert (mul.cls, mul.runs) == ("elementwise", 64)
    bounds = {"s": [32], "e": [64], "ax": [1]}
    inits = [helper.make_tensor(n, TensorProto.INT64, [1], v) for n, v in bounds.items()]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "ax"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 7, 7])], inits)
    r = onnxlens.analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    costs = _node_costs(r)
    [node] = costs.values()
    [kernel] = ort_kernels(r.graph, r.groups[0], costs, 16)
    half = 4 * 32 * 49
    assert kernel.cost.bytes_written == half
    assert kernel.cost.bytes_read == node.bytes_read - half == half + 3 * 8  # and bounds


def test_a_gelu_in_erf_is_one_gelu_kernel() -> None:
    """GELU as torch exports it (Div, Erf, Add, Mul, Mul) is one ORT kernel of class `gelu`;
    so are ORT's Gelu and BiasGelu; a lone Erf, and opset 20's tanh Gelu, are not."""
    def node(op: str, **attrs: str) -> NodeInfo:
        return NodeInfo("n", op, "", attrs, (), ())

    assert is_erf_gelu([node("Div"), node("Erf"), node("Add"), node("Mul"), node("Mul")])
    assert is_erf_gelu([node("Gelu")]) and is_erf_gelu([node("BiasGelu")])
    assert not is_erf_gelu([node("Erf")])
    assert not is_erf_gelu([node("Gelu", approximate="tanh")])
    assert not is_erf_gelu([node("Sigmoid"), node("Mul")])
    nodes = [helper.make_node(op, ins, [out]) for op, ins, out in (
        ("Div", ["x", "sqrt2"], "d"), ("Erf", ["d"], "e"), ("Add", ["e", "one"], "a"),
        ("Mul", ["x", "a"], "p"), ("Mul", ["p", "half"], "y"))]
    r = _analyzed(nodes, [1, 64, 56, 56], ("y", [1, 64, 56, 56]),
                  {"sqrt2": [], "one": [], "half": []})
    [kernel] = [k for g in r.groups for k in ort_kernels(r.graph, g, _node_costs(r), 16)]
    assert kernel.cls == "gelu" and len(kernel.nodes) == 5


def test_a_transposes_runs_cost_the_calibrated_time_each(gpu) -> None:
    cost = Cost(bytes_read=10**6, bytes_written=10**6)
    hot = estimate_group(cost, "data_movement", gpu, what_if("fp32"), constant_efficiency(gpu))
    fitted = dataclasses.replace(gpu, runtime=Runtime(copy_run_ns=8.0))
    slow = estimate_group(cost, "data_movement", fitted, what_if("fp32"), constant_efficiency(gpu),
                          runs=1000)
    assert slow.memory_s - hot.memory_s == pytest.approx(1000 * 8e-9)
    assert estimate_group(cost, "data_movement", gpu, what_if("fp32"), constant_efficiency(gpu),
                          runs=1000) == hot  # not fitted: nothing added


@pytest.mark.parametrize(("shape", "perm", "elements"), [
    ((1, 784, 3, 4, 12), (2, 0, 3, 4, 1), 784 * 3 * 4 * 12),  # EdgeNeXt's qkv split
    ((8, 96, 3, 32), (2, 0, 3, 1), 8 * 96 * 3 * 32),
    ((1, 64, 48, 48), (0, 2, 3, 1), 0),  # one axis moved: MLAS's blocked transpose
    ((64, 49, 3, 3, 32), (2, 0, 3, 1, 4), 0),  # the innermost axis stays: runs of 32
    ((1, 1, 1024, 4096), (2, 0, 3, 1), 0),  # the longer axes keep their order: a reshape
])
def test_a_transpose_moving_the_innermost_axis_with_others_copies_each_element(
        shape, perm, elements) -> None:
    assert transpose_elements(_transpose_info(shape, perm)) == elements


def test_a_transposes_elements_cost_the_calibrated_time_each(gpu) -> None:
    """112,896 elements copied one at a time at 2.2 ns: 248.4 us on top of their bytes."""
    cost = Cost(bytes_read=4 * 112_896, bytes_written=4 * 112_896)
    eff = constant_efficiency(gpu)
    hot = estimate_group(cost, "data_movement", gpu, what_if("fp32"), eff)
    fitted = dataclasses.replace(gpu, runtime=Runtime(copy_element_ns=2.2))
    slow = estimate_group(cost, "data_movement", fitted, what_if("fp32"), eff,
                          elements=112_896)
    assert slow.memory_s - hot.memory_s == pytest.approx(248.3712e-6)
    assert estimate_group(cost, "data_movement", gpu, what_if("fp32"), eff,
                          elements=112_896) == hot  # not fitted: nothing added


@pytest.mark.parametrize(("shape", "perm", "blocked"), [
    ((1, 64, 56, 56), (0, 2, 3, 1), True),  # NCHW -> NHWC: MLAS's blocked transpose
    ((1, 56, 56, 40), (0, 3, 1, 2), True),  # and back
    ((1, 128, 196), (0, 2, 1), True),  # [B, C, N] -> [B, N, C] (LeViT, TinyViT)
    ((64, 36, 4, 32), (0, 2, 1, 3), False),  # the innermost axis stays: runs of 32
    ((1, 576, 3, 4, 16), (2, 0, 3, 4, 1), False),  # several axes move: element by element
    ((1, 1, 1, 320), (0, 3, 1, 2), False),  # the longer axes keep their order: a reshape
])
def test_a_transpose_moving_one_axis_past_the_innermost_is_a_blocked_copy(
        shape, perm, blocked) -> None:
    assert blocked_transpose(_transpose_info(shape, perm)) == blocked


def test_a_blocked_copy_streams_at_its_calibrated_rate(gpu) -> None:
    """2 MB of a blocked transpose in the test GPU's L2 (6,000 GB/s) at a calibrated 50 GB/s:
    40 us; a reorder with no rate of its own, and any other class, at the level's 0.33 us;
    a rate above the level's bandwidth leaves the level's."""
    cost = Cost(bytes_read=10**6, bytes_written=10**6)
    eff = constant_efficiency(gpu)
    fitted = dataclasses.replace(gpu, runtime=Runtime(copy_gbps={"blocked_transpose": 50.0}))
    level_s = 2e6 / 6000e9
    assert estimate_group(cost, "blocked_transpose", fitted, what_if("fp32"),
                          eff).memory_s == pytest.approx(40e-6)
    for cls in ("reorder", "data_movement"):
        assert estimate_group(cost, cls, fitted, what_if("fp32"), eff).memory_s == (
            pytest.approx(level_s))
    faster = dataclasses.replace(gpu, runtime=Runtime(copy_gbps={"reorder": 9000.0}))
    assert estimate_group(cost, "reorder", faster, what_if("fp32"), eff).memory_s == (
        pytest.approx(level_s))


def test_ort_cpus_layout_changes_are_reorder_kernels(gpu) -> None:
    """A lone Conv of 24 channels: ORT reorders its NCHW input to 16-channel blocks, a kernel
    of class `reorder` reading 4 x 24 x 64 bytes of NCHW and writing 4 x 32 x 64 of NCHWc."""
    r = _analyzed([helper.make_node("Conv", ["x", "w"], ["y"])], [1, 24, 8, 8],
                  ("y", [1, 24, 8, 8]), {"w": [24, 24, 1, 1]})
    hw = dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(name=ORT_CPU))
    kernels = [k for run in OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {}, hw).values()
               for k in run or ()]
    reorders = [(k.cls, k.cost.bytes_read, k.cost.bytes_written) for k in kernels if not k.nodes]
    assert reorders == [("reorder", 4 * 24 * 64, 4 * 32 * 64)]


@pytest.mark.parametrize(("anchor", "x", "weight", "y"), [
    ("Gemm", [16, 64], [64, 32], [16, 32]),  # FusedGemm takes no HardSwish
    ("Conv", [1, 6, 8, 8], [6, 2, 3, 3], [1, 6, 8, 8]),  # 2 channels per group: NCHW path
    # NCHWc: the Conv takes it (then a Conv: ORT leaves a graph output's HardSwish apart)
    ("Conv", [1, 16, 8, 8], [16, 16, 1, 1], [1, 16, 8, 8]),
    (None, [1, 16, 64], None, [1, 16, 64]),  # alone
])
def test_a_hardswish_is_orts_hardsigmoid_and_mul_unless_an_nchwc_conv_takes_it(
        gpu, tmp_path: Path, anchor: str | None, x: list[int], weight: list[int] | None,
        y: list[int]) -> None:
    """ORT's CPU provider has no HardSwish kernel: it inlines HardSigmoid and Mul wherever
    its NchwcTransformer does not fold the HardSwish into an NCHWc Conv (LeViT-128S: 22 of
    each). Our kernels are ORT's (its profile's kernel names: node types of its optimized
    graph, reorders aside), and the Mul, by hand, reads x and hardsigmoid(x) and writes y:
    3 x 4 bytes and 1 FLOP per element."""
    nchwc = weight == [16, 16, 1, 1]
    nodes = [helper.make_node("HardSwish", ["c" if anchor else "x"], ["h" if nchwc else "y"])]
    if anchor:
        attrs = {"group": 3, "pads": [1] * 4} if weight[1] == 2 else {}
        nodes.insert(0, helper.make_node(anchor, ["x", "w"], ["c"], **attrs))
    if nchwc:
        nodes.append(helper.make_node("Conv", ["h", "w"], ["y"]))
    r = _analyzed(nodes, x, ("y", y), {"w": weight} if weight else {})
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    model = r.model.proto
    model.ir_version = 8  # what ORT 1.18+ reads
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = [i.op_type for i in onnxlens.analyze(str(tmp_path / "opt.onnx")).graph.infos.values()
              if not i.op_type.startswith("Reorder")]
    block = nchwc_block(host_profile(1))
    hw = dataclasses.replace(gpu, simd_bits=32 * block, runtime=Runtime(name=ORT_CPU))
    kernels = [k for run in OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {}, hw).values()
               for k in run or () if k.nodes]
    assert len(kernels) == len(theirs)
    n = math.prod(y)
    mul = ("elementwise", Cost(other_flops=n, bytes_read=8 * n, bytes_written=4 * n))
    assert [(k.cls, k.cost) for k in kernels if k.cost == mul[1]] == ([] if nchwc else [mul])


def _row_node(op: str, shape: tuple[int, ...], **attrs: int) -> NodeInfo:
    f = TensorProto.FLOAT
    return NodeInfo("n", op, "", attrs, (TensorInfo("x", f, shape),), (TensorInfo("y", f, shape),))


@pytest.mark.parametrize(("op", "shape", "attrs", "rows"), [
    ("LayerNormalization", (1, 56, 56, 24), {}, 56 * 56),  # channels-last: rows of 24
    ("LayerNormalization", (2, 3, 4, 5), {"axis": 2}, 2 * 3),  # normalizes dims[2:]
    ("SimplifiedLayerNormalization", (1, 128, 64), {}, 128),
    ("Softmax", (8, 49, 49), {}, 8 * 49),
    ("Softmax", (2, 5, 7), {"axis": 1}, 2 * 7),  # one axis (opset 13)
    ("BatchNormalization", (1, 16, 8, 8), {}, 0),  # no row statistics
])
def test_a_row_wise_norm_reduces_the_rows_before_its_axis(op, shape, attrs, rows) -> None:
    assert normalized_rows([_row_node(op, shape, **attrs)]) == rows


def test_a_norms_rows_cost_the_calibrated_time_each(gpu) -> None:
    """[1, 56, 56, 24] LayerNormalization at 14 ns per row: 3136 x 14 ns = 43.9 us on top of
    its FLOPs' time, in the compute term; a profile without the term adds nothing."""
    cost = Cost(other_flops=3136 * (7 * 24 + 3), transcendental=3136,
                bytes_read=4 * 3136 * 24, bytes_written=4 * 3136 * 24)
    eff = constant_efficiency(gpu)
    plain = estimate_group(cost, "normalization", gpu, what_if("fp32"), eff)
    fitted = dataclasses.replace(gpu, runtime=Runtime(norm_row_ns=14.0))
    rows = estimate_group(cost, "normalization", fitted, what_if("fp32"), eff, rows=3136)
    assert rows.compute_s - plain.compute_s == pytest.approx(3136 * 14e-9)
    assert rows.latency_s == pytest.approx(
        max(plain.compute_s + 43.904e-6, plain.memory_s) + plain.overhead_s)
    assert estimate_group(cost, "normalization", gpu, what_if("fp32"), eff, rows=3136) == plain


def test_a_shape_field_the_roofline_does_not_read_is_a_type_error(gpu) -> None:
    """`peak` is a Kernel field the roofline never reads: passed to estimate_group it was
    dropped unseen; a misspelled field is refused likewise, naming it."""
    cost, eff = Cost(macs=10**6), constant_efficiency(gpu)
    for field in ("peak", "launch"):
        with pytest.raises(TypeError, match=f"unknown kernel shape field.*{field};"):
            estimate_group(cost, "gemm", gpu, what_if("fp32"), eff, **{field: 0})
    # no launch: the roofline alone, 2e6 FLOPs at 70% of the fp32 peak of 60 TFLOP/s
    assert estimate_group(cost, "gemm", gpu, what_if("fp32"), eff,
                          launches=0).latency_s == pytest.approx(2e6 / (60e12 * 0.7))


def test_ort_runs_a_channels_last_layer_norm_and_a_softmax_row_by_row(gpu) -> None:
    """A LayerNormalization over [1, 56, 56, 24] is one normalization kernel of 3136 rows, a
    Softmax over [8, 49, 49] one softmax kernel of 392."""
    r = _analyzed([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                  [1, 56, 56, 24], ("y", [1, 56, 56, 24]), {"g": [24], "b": [24]})
    [kernel] = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    assert (kernel.cls, kernel.rows) == ("normalization", 3136)
    r = _analyzed([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [8, 49, 49],
                  ("y", [8, 49, 49]), {})
    [kernel] = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    assert (kernel.cls, kernel.rows) == ("softmax", 8 * 49)  # MLAS's: a class of its own


def _rms_norm_chain(form: str) -> list:
    """x / sqrt(mean(x², -1) + eps) · γ over [1, 32, 64], its 1/sqrt as ORT's fusion wants it
    ("div": x / s; "one_over": (1 / s) · x) or as torch dynamo writes it ("reciprocal")."""
    head = [helper.make_node("Pow", ["x", "two"], ["p"]),
            helper.make_node("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1),
            helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"])]
    scaled = {"div": [helper.make_node("Div", ["x", "s"], ["d"])],
              "one_over": [helper.make_node("Div", ["one", "s"], ["r"]),
                           helper.make_node("Mul", ["x", "r"], ["d"])],
              "reciprocal": [helper.make_node("Reciprocal", ["s"], ["r"]),
                             helper.make_node("Mul", ["x", "r"], ["d"])]}[form]
    return head + scaled + [helper.make_node("Mul", ["d", "g"], ["y"])]


@pytest.mark.parametrize("form", ["div", "one_over", "reciprocal"])
def test_an_rms_norm_is_one_kernel_where_ort_fuses_it(tmp_path, form: str) -> None:
    """ORT runs a spelled-out RMSNorm as one SimplifiedLayerNormalization when its 1/sqrt is a
    Div (one normalization kernel of 32 rows, `normalized_rows`), node by node when it is a
    Reciprocal (its elementwise runs, as any others: `_node_runs`), as ORT's optimized graph
    says."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("two", 2.0), ("eps", 1e-6), ("one", 1.0))]
    inits.append(numpy_helper.from_array(np.full(64, 0.5, np.float32), "g"))
    graph = helper.make_graph(_rms_norm_chain(form), "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    r = onnxlens.analyze(model)
    assert [g.pattern for g in r.groups] == ["RMSNorm"]
    kernels = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    fused = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    if form == "reciprocal":
        assert len(fused) == 7 and len(kernels) > 1
        assert "normalization" not in {k.cls for k in kernels}
    else:
        assert fused == ["SimplifiedLayerNormalization"]
        assert [(k.cls, k.rows) for k in kernels] == [("normalization", 32)]


@pytest.mark.parametrize(("w", "group", "x", "padded"), [
    ([4, 16, 1, 1], 1, [1, 16, 8, 8], 16 * 16 * 64),  # GhostNet's 1x1 to 4 channels: 16
    ([20, 24, 1, 1], 1, [1, 24, 8, 8], 32 * 32 * 64),  # both sides rounded up to blocks
    ([32, 16, 3, 3], 1, [1, 16, 8, 8], 32 * 16 * 9 * 64),  # whole blocks: as counted
    ([24, 1, 3, 3], 24, [1, 24, 8, 8], 32 * 9 * 64),  # depthwise: channels in blocks
])
def test_an_nchwc_conv_computes_whole_channel_blocks(w, group, x, padded) -> None:
    """ORT's NCHWc Conv (block 16) multiplies channels padded to whole blocks."""
    r = _analyzed([helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[w[2] // 2] * 4)],
                  x, ("y", [1, w[0], 8, 8]), {"w": w})
    [kernel] = ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
    assert kernel.writes == "nchwc" and kernel.cost.macs == padded


def test_a_folded_kernel_never_makes_its_host_faster(gpu) -> None:
    """A sum whose bytes move its Conv's working set past the 50 MB L2, where the curve
    rates the Conv 5x faster (a fitted level factor can): what it adds is 0, not less."""
    def eff(cls: str, flops: float, intensity: float) -> float:
        return 0.1 if flops / intensity <= 50e6 else 0.5

    conv = Kernel("conv", Cost(macs=10**10, bytes_read=40 * 10**6, bytes_written=8 * 10**6), ())
    add = Kernel("conv", Cost(other_flops=2 * 10**6, bytes_read=8 * 10**6), (), host=conv)
    alone = estimate_group(conv.cost, "conv", gpu, what_if("fp32"), eff, launches=0)
    both = estimate_group(conv.cost + add.cost, "conv", gpu, what_if("fp32"), eff,
                          launches=0)
    assert both.latency_s < alone.latency_s  # the curve's artefact the marginal must not show
    marginal = absorbed(add, gpu, what_if("fp32"), eff)
    assert marginal.latency_s == marginal.compute_s == 0.0


def test_pool_groups_use_their_class_efficiency(gpu) -> None:
    """A pool's FLOPs run at the pool efficiency (0.4 in the test profile), a Conv's bias at
    elementwise's (0.5)."""
    cost = Cost(other_flops=6 * 10**9, bytes_read=4, bytes_written=4)
    e = estimate_group(cost, "pool", gpu, what_if("fp32"), constant_efficiency(gpu))
    assert e.compute_s == pytest.approx(6e9 / (60e12 * 0.4))
    e = estimate_group(cost, "conv", gpu, what_if("fp32"), constant_efficiency(gpu))
    assert e.compute_s == pytest.approx(6e9 / (60e12 * 0.5))
    grouped = estimate_group(Cost(macs=10**9), "grouped_conv", gpu, what_if("fp32"),
                             constant_efficiency(gpu))
    assert grouped.compute_s == pytest.approx(2e9 / (60e12 * 0.6))  # a profile's conv figure


# ---- denormal operands (a masked softmax read by a MatMul) ------------------------------------

def _masked_attention(mask: list[float] | None):
    """S = Q·K, (+ a [4] mask, as Constant nodes: Swin's is a Where over constants), viewed
    as [1, 2, 2, 4] and back, Softmax, then P·V: the shape of Swin's shifted-window block."""
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"])]
    scores = "s"
    if mask is not None:
        nodes += [helper.make_node("Constant", [], ["m0"], value=helper.make_tensor(
                      "m0", TensorProto.FLOAT, [4], mask)),
                  helper.make_node("Constant", [], ["axes"], value=helper.make_tensor(
                      "axes", TensorProto.INT64, [1], [0])),
                  helper.make_node("Unsqueeze", ["m0", "axes"], ["m"]),
                  helper.make_node("Constant", [], ["shape"], value=helper.make_tensor(
                      "shape", TensorProto.INT64, [4], [1, 2, 2, 4])),
                  helper.make_node("Reshape", ["s", "shape"], ["s4"]),
                  helper.make_node("Add", ["s4", "m"], ["sm"]),
                  helper.make_node("Constant", [], ["back"], value=helper.make_tensor(
                      "back", TensorProto.INT64, [3], [4, 1, 4])),
                  helper.make_node("Reshape", ["sm", "back"], ["s3"])]
        scores = "s3"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q", f, [4, 1, 8]),
                                           helper.make_tensor_value_info("k", f, [4, 8, 4]),
                                           helper.make_tensor_value_info("v", f, [4, 4, 8])],
                              [helper.make_tensor_value_info("y", f, [4, 1, 8])])
    return onnxlens.analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _matmul_info(a: tuple[int, ...], b: tuple[int, ...], y: tuple[int, ...]) -> NodeInfo:
    f = TensorProto.FLOAT
    return NodeInfo("m", "MatMul", "", {}, (TensorInfo("a", f, a), TensorInfo("b", f, b)),
                    (TensorInfo("y", f, y),))


@pytest.mark.parametrize(("a", "b", "y", "calls"), [
    ((2, 3, 49, 32), (2, 3, 32, 49), (2, 3, 49, 49), 6),  # a GEMM per window and head
    ((4, 1, 8), (4, 8, 4), (4, 1, 4), 4),
    ((1, 197, 768), (768, 768), (1, 197, 768), 1),  # rows flattened against one matrix
    ((49, 32), (32, 49), (49, 49), 1),
])
def test_a_batched_matmul_is_a_gemm_call_per_matrix(a, b, y, calls) -> None:
    assert matmul_calls(_matmul_info(a, b, y)) == calls


def test_an_attention_kernel_reads_its_curve_at_one_heads_gemm(gpu) -> None:
    """Q [4, 1, 8] x K [4, 8, 4]: four GEMM calls, so the curve's size is a quarter of the
    FLOPs, and with a per-call cost (f_half) the kernel is slower than one big GEMM."""
    result = _masked_attention(None)
    (group,) = result.groups
    kernel, softmax = ort_kernels(result.graph, group, _node_costs(result), 8)
    assert (kernel.cls, kernel.calls) == ("attention", 4)
    assert (softmax.cls, softmax.rows) == ("softmax", 4)  # a kernel of ORT's own
    hw = _ort(gpu)

    def per_call(cls: str, flops: float, intensity: float) -> float:  # f_half = 1000 FLOPs
        return flops / (flops + 1e3)

    flops = kernel.cost.flops(2)
    one = estimate_group(kernel.cost, "attention", hw, what_if("fp32"), per_call)
    four = estimate_group(kernel.cost, "attention", hw, what_if("fp32"), per_call, calls=4)
    assert four.compute_s / one.compute_s == pytest.approx(
        (flops / 4 + 1e3) / (flops / 4) * flops / (flops + 1e3))


@pytest.mark.parametrize(("perm", "apart"), [
    ([0, 2, 3, 1], True),  # LeViT's K: [1, N, H, D] -> [1, H, D, N], a kernel of ORT's own
    ([0, 1, 3, 2], False),  # K: [1, H, N, D] -> [1, H, D, N], FusedMatMul's transB
])
def test_a_k_transpose_is_in_the_attention_kernel_only_where_orts_fusion_takes_it(
        tmp_path: Path, perm: list[int], apart: bool) -> None:
    """softmax(Q·Kᵀ·s)·V with 4 heads of 16 over 8 tokens, K transposed by `perm`: ORT's
    optimized graph has the Transpose as a node of its own exactly where ours is a kernel
    apart from the attention kernel, whose cost then leaves it out (its bytes: 4·512); the
    Softmax is one in both, over 4·8 rows."""
    import onnxruntime as ort

    k_shape = [1, 8, 4, 16] if apart else [1, 4, 8, 16]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
             helper.make_node("MatMul", ["x", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 4, 8, 16]),
                                           helper.make_tensor_value_info("k", f, k_shape),
                                           helper.make_tensor_value_info("v", f, [1, 4, 8, 16])],
                              [helper.make_tensor_value_info("y", f, [1, 4, 8, 16])],
                              [helper.make_tensor("scale", f, [], [0.25])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = [i.op_type for i in onnxlens.analyze(str(tmp_path / "opt.onnx")).graph.infos.values()]
    assert ("Transpose" in theirs) == apart and "Softmax" in theirs
    r = onnxlens.analyze(model)
    [group] = r.groups
    kernels = ort_kernels(r.graph, group, _node_costs(r), 16)
    transposes = [k for k in kernels if k.cls in ("data_movement", "blocked_transpose")]
    assert [(k.cls, k.rows) for k in kernels if k.cls == "softmax"] == [("softmax", 32)]
    assert len(kernels) == 2 + apart
    assert [(k.nodes, k.cost.bytes_read) for k in transposes] == (
        [(group.nodes[:1], 4 * 512)] if apart else [])


@pytest.mark.parametrize("run_time_shapes", [True, False])
def test_a_k_transpose_between_views_of_run_time_shapes_is_a_kernel_of_its_own(
        tmp_path: Path, run_time_shapes: bool) -> None:
    """The dynamo SDPA's K path, Reshape to [4, n, 16], Transpose (0, 2, 1), Reshape to
    [1, 4, 16, n], then Q·Kᵀ·s, Softmax, P·V over n tokens (symbolic, 8 here): with both
    shapes computed at run time from K's Shape (the HF Llama's decode step) ORT's optimized
    graph keeps the Transpose as a node, and ours is a kernel apart (its bytes: K, 4·8·16·4);
    with both shapes constant ORT folds it into the FusedMatMul, as we do."""
    import onnxruntime as ort

    i64, f = TensorProto.INT64, TensorProto.FLOAT
    if run_time_shapes:
        shapes = [helper.make_node("Shape", ["k"], ["n"], start=2, end=3),
                  helper.make_node("Concat", ["four", "n", "sixteen"], ["s3"], axis=0),
                  helper.make_node("Concat", ["one_four", "sixteen", "n"], ["s4"], axis=0)]
        consts = [helper.make_tensor("four", i64, [1], [4]),
                  helper.make_tensor("sixteen", i64, [1], [16]),
                  helper.make_tensor("one_four", i64, [2], [1, 4])]
    else:
        shapes = []
        consts = [helper.make_tensor("s3", i64, [3], [4, 8, 16]),
                  helper.make_tensor("s4", i64, [4], [1, 4, 16, 8])]
    nodes = [*shapes, helper.make_node("Reshape", ["k", "s3"], ["k3"]),
             helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["kt", "s4"], ["kr"]),
             helper.make_node("MatMul", ["x", "kr"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(t, f, [1, 4, "n", 16]) for t in "xkv"],
        [helper.make_tensor_value_info("y", f, [1, 4, "n", 16])],
        [*consts, helper.make_tensor("scale", f, [], [0.25])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert ("Transpose" in theirs) == run_time_shapes and "FusedMatMul" in theirs
    r = onnxlens.analyze(model, dims={"n": 8})
    [group] = [g for g in r.groups if g.pattern == "Attention"]
    kernels = ort_kernels(r.graph, group, _node_costs(r), 16)
    transposes = [(k.nodes, k.cost.bytes_read) for k in kernels if k.cls == "blocked_transpose"]
    assert transposes == ([(("Transpose_4",), 4 * 8 * 16 * 4)] if run_time_shapes else [])


@pytest.mark.parametrize("length", ["n", 8])
def test_a_shape_of_a_symbolic_input_runs_each_step_as_ort_loads_the_file(
        tmp_path: Path, gpu, length: str | int) -> None:
    """x + Cast(Range(0, Shape(x)[1])) over [1, length]: with the length symbolic in the file
    (pinned to 8 here, as `--dim` does) ORT cannot fold the Shape, and runs Shape, Gather,
    Range, Cast and Add each step; with 8 in the file it folds all but the Add. Our kernels
    cover the same nodes as ORT's optimized graph in both."""
    import onnxruntime as ort

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["len"], axis=0),
             helper.make_node("Range", ["zero", "len", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=f),
             helper.make_node("Add", ["x", "rf"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [1, length])],
        [helper.make_tensor_value_info("y", f, [1, length])],
        [helper.make_tensor("one", i64, [], [1]), helper.make_tensor("zero", i64, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = sorted(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
    assert theirs == (["Add", "Cast", "Gather", "Range", "Shape"] if length == "n" else ["Add"])
    r = onnxlens.analyze(model, dims={"n": 8} if length == "n" else None)
    hw = dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(name=ORT_CPU))
    kernels = OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {}, hw, r.model)
    assert sorted(r.graph.info(n).op_type for run in kernels.values() for k in run or ()
                  for n in k.nodes) == theirs


@pytest.mark.parametrize(("length", "gelu", "theirs", "ours"), [
    ("n", False, ["MatMul", "Add"], [["MatMul"], ["Add"]]),
    ("n", True, ["MatMul", "BiasGelu"], [["MatMul", "Add"], ["Div", "Erf", "Add", "Mul", "Mul"]]),
    (3, False, ["Reshape", "Gemm", "Reshape"], [["MatMul", "Add"]]),
    (3, True, ["Reshape", "Gemm", "Reshape", "Gelu"],
     [["MatMul", "Add"], ["Div", "Erf", "Add", "Mul", "Mul"]]),
])
def test_a_bias_add_after_a_matmul_of_run_time_shape_is_a_kernel_of_its_own(
        tmp_path: Path, gpu, length: str | int, gelu: bool, theirs: list, ours: list) -> None:
    """[1, length, 8] x [8, 4] + bias, then an erf GELU or nothing. ORT's MatMulAddFusion
    makes a 3-D MatMul + Add a Gemm between Reshapes only where the file fixes the shape;
    with the length symbolic (pinned to 3 here, as `--dim` does) the Add runs alone, unless
    ORT's BiasGelu takes it. Our kernels (those with a launch) match ORT's optimized graph."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["h"])]
    if gelu:  # h · (1 + erf(h / sqrt 2)) · 0.5
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]),
                  helper.make_node("Mul", ["h", "e1"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["y"])]
    rng = np.random.default_rng(0)
    consts = {"w": rng.random((8, 4), np.float32), "b": rng.random(4, np.float32),
              "sqrt2": np.float32(2 ** 0.5), "one": np.float32(1), "half": np.float32(0.5)}
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [1, length, 8])],
        [helper.make_tensor_value_info(nodes[-1].output[0], f, [1, length, 4])],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if k in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node] == theirs
    r = onnxlens.analyze(model, dims={"n": 3} if length == "n" else None)
    hw = dataclasses.replace(gpu, simd_bits=512, runtime=Runtime(name=ORT_CPU))
    kernels = OrtCpu().kernels(r.graph, r.groups, _node_costs(r), {}, hw, r.model)
    assert [[r.graph.info(n).op_type for n in k.nodes] for run in kernels.values()
            for k in run or () if k.launches] == ours


@pytest.mark.parametrize(("rows", "scale", "packed"), [(1, 0.125, True), (1, None, False),
                                                      (3, 0.125, False)])
def test_a_decode_steps_scaled_scores_pack_the_keys_first(
        tmp_path: Path, gpu, rows: int, scale: float | None, packed: bool) -> None:
    """softmax(Q·Kᵀ·s)·V, 4 heads of 8 over 16 keys, `rows` query rows: ORT's optimized graph
    makes the scaled product a FusedMatMul with alpha = s (MatMulScaleFusion), which MLAS
    runs by packing K first unless there is one row and alpha is 1. Our kernels: at one
    row and a scale, a copy of K inside the block (4·8·16 floats read and written, no
    launch); without the scale (T5's) or with 3 rows, none."""
    f = TensorProto.FLOAT
    heads, dim, keys = 4, 8, 16
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"])]
    if scale is not None:
        nodes.append(helper.make_node("Mul", ["s", "scale"], ["ss"]))
    nodes += [helper.make_node("Softmax", [nodes[-1].output[0]], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("q", f, [1, heads, rows, dim]),
                     helper.make_tensor_value_info("kt", f, [1, heads, dim, keys]),
                     helper.make_tensor_value_info("v", f, [1, heads, keys, dim])],
        [helper.make_tensor_value_info("y", f, [1, heads, rows, dim])],
        [] if scale is None else [numpy_helper.from_array(np.float32(scale), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    first = onnx.load(str(tmp_path / "opt.onnx")).graph.node[0]
    alpha = next((a.f for a in first.attribute if a.name == "alpha"), 1.0)
    assert (first.op_type, alpha) == (("FusedMatMul", pytest.approx(scale)) if scale
                                      else ("MatMul", 1.0))
    r = onnxlens.analyze(model)
    assert [g.pattern for g in r.groups] == ["Attention"]
    copies = [k for k in ort_kernels(r.graph, r.groups[0], _node_costs(r), 16)
              if k.cls == "reorder"]
    nbytes = heads * dim * keys * 4
    assert [(k.cost.bytes_read, k.cost.bytes_written, k.launches) for k in copies] == (
        [(nbytes, nbytes, 0)] if packed else [])


def test_the_packed_keys_are_the_scores_operand_not_a_projections_weight() -> None:
    """A projection [1, 4, 1, 8] x W [8, 8] before a one-row scaled Q·Kᵀ over 16 keys: the
    copy is of Kᵀ (4·8·16 floats), the first MatMul of two activations, not of W."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [1, 4, 1, 8]),
                     helper.make_tensor_value_info("kt", f, [1, 4, 8, 16]),
                     helper.make_tensor_value_info("v", f, [1, 4, 16, 8])],
        [helper.make_tensor_value_info("y", f, [1, 4, 1, 8])],
        [numpy_helper.from_array(np.ones((8, 8), np.float32), "w"),
         numpy_helper.from_array(np.float32(0.125), "scale")])
    r = onnxlens.analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    copies = packed_keys(r.graph, r.graph.order)
    assert [(k.nodes, k.cost.bytes_read) for k in copies] == [((r.graph.order[1],), 4 * 8 * 16 * 4)]


def test_a_gathernd_is_a_kernel_copying_each_index_tuples_slice(tmp_path: Path, gpu) -> None:
    """An HF causal mask's GatherND, [1, 1, 1, 6, 2] index pairs into a [1, 6] bool mask, then
    And with another [1, 1, 1, 6] mask: ORT's optimized graph keeps both nodes, and our
    kernels are the GatherND alone, copying 6 slices one at a time (1·1·1·6·2 indices over
    the tuple's 2), each at the calibrated copy-run cost, then the And."""
    import onnxruntime as ort

    b, i64 = TensorProto.BOOL, TensorProto.INT64
    nodes = [helper.make_node("GatherND", ["mask", "idx"], ["g"]),
             helper.make_node("And", ["g", "causal"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("mask", b, [1, 6]),
                     helper.make_tensor_value_info("idx", i64, [1, 1, 1, 6, 2]),
                     helper.make_tensor_value_info("causal", b, [1, 1, 1, 6])],
        [helper.make_tensor_value_info("y", b, [1, 1, 1, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ORT 1.18+ reads
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node] == [
        "GatherND", "And"]
    r = onnxlens.analyze(model)
    kernels = [k for g in r.groups for k in ort_kernels(r.graph, g, _node_costs(r), 16)]
    assert [(k.nodes, k.runs) for k in kernels] == [(("GatherND_0",), 6), (("And_1",), 0)]
    hw = dataclasses.replace(gpu, runtime=Runtime(name=ORT_CPU, copy_run_ns=10.0))
    e = estimate_kernel(kernels[0], hw, what_if("fp32"), constant_efficiency(hw))
    nbytes = kernels[0].cost.bytes_read + kernels[0].cost.bytes_written
    assert e.memory_s == pytest.approx(nbytes / (hw.memory_level(nbytes).bandwidth_gbps * 1e9)
                                       + 6 * 10e-9)


@pytest.mark.parametrize(("mask", "share"), [
    ([0.0, -100.0, -100.0, 0.0], 0.5),  # exp(-100) = 3.7e-44: a denormal
    ([0.0, 0.0, 0.0, -95.0], 0.25),
    ([0.0, -1e9, -1e9, 0.0], None),  # exp rounds to exact zero: no denormal
    ([0.0, -10000.0, 0.0, 0.0], None),
    ([0.0, -50.0, 0.0, 0.0], None),  # exp(-50) = 2e-22: a normal number
    (None, None),
])
def test_denormal_reads_of_a_masked_softmax(mask, share) -> None:
    found = denormal_reads(_masked_attention(mask).graph)
    assert found == ({} if share is None else {"pv": pytest.approx(share)})


def test_a_denormal_matmul_costs_its_share_of_the_factor(gpu) -> None:
    e = estimate_group(Cost(macs=10**6, bytes_read=10**5, bytes_written=10**5), "gemm", gpu,
                       what_if("fp32"), constant_efficiency(gpu))
    slowed = denormal_slowed(e, 0.25, 101.0, gpu.static_w)
    assert slowed.latency_s == pytest.approx(e.latency_s * 26)  # 1 + 0.25 x (101 - 1)
    assert slowed.energy_j == pytest.approx(e.energy_j + 100.0 * 25 * e.latency_s)
    assert denormal_slowed(e, 0.5, 1.0, gpu.static_w) == e


def test_only_a_calibrated_denormal_factor_slows_the_model(gpu) -> None:
    result = _masked_attention([0.0, -100.0, -100.0, 0.0])
    args = (result.graph, result.groups, {g: nc.cost for g, nc in result.group_costs.items()},
            _node_costs(result))
    base = estimate_model(*args, _ort(gpu), "fp32")
    slow_hw = dataclasses.replace(gpu, runtime=Runtime(ORT_CPU, denormal_factor=11.0))
    slow = estimate_model(*args, slow_hw, "fp32")
    pv = next(g.id for g in result.groups if "pv" in g.nodes)
    assert base.groups[pv] is not None and slow.groups[pv] is not None
    assert slow.latency_s > base.latency_s
    assert estimate_model(*args, gpu, "fp32").latency_s == pytest.approx(
        estimate_model(*args, dataclasses.replace(gpu, runtime=Runtime(denormal_factor=11.0)),
                       "fp32").latency_s)  # not ORT-calibrated: unchanged


@pytest.mark.parametrize("target", ["host", "a100"])
def test_an_uncalibrated_profile_estimates_a_grouped_convolution(
        target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grouped convolution (RegNet's) is class grouped_conv, which an uncalibrated profile
    estimates at its parent class's efficiency (it raised KeyError: 'grouped_conv' where the
    host or a GPU runtime had no calibration)."""
    monkeypatch.setenv("ONNXLENS_CACHE", str(tmp_path))  # not this host's calibration
    result = _analyzed([helper.make_node("Conv", ["x", "w"], ["c"], group=4, pads=[1, 1, 1, 1])],
                       [1, 16, 8, 8], ("c", [1, 16, 8, 8]), {"w": [16, 4, 3, 3]})
    runtime = "native-cuda" if target == "a100" else "ort-cpu"
    hw, eff = resolve_target(target, 1, runtime)
    hw = dataclasses.replace(hw, calibrated=False)
    assert eff("grouped_conv", 1.0, 1.0) == hw.efficiency["conv"]
    est = result.estimate(hw, None, eff)
    # 16 outputs x 64 pixels x 4 input channels x 9 taps, at conv efficiency on the profile.
    group = est.groups[result.groups[0].id]
    assert group is not None and group.compute_s >= 2 * 16 * 64 * 4 * 9 / (
        hw.peak_flops("fp32") * hw.efficiency["conv"]) * 0.999
