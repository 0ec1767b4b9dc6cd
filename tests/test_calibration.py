"""Calibration: the curve fit, the JSON file and where it lives, the calibrated host profile, a
real mini-calibration, and the ORT timing helper it stands on."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.calibration import (
    Calibration,
    CalibrationError,
    Curve,
    Point,
    apply_calibration,
    cache_dir,
    calibrated_host,
    calibrated_host_profile,
    calibration_path,
    find_calibration,
    host_name,
    resolve_target,
)
from onnxlens.analyzer.errors import UsageError
from onnxlens.analyzer.hardware import NATIVE_CUDA, OP_CLASSES, ORT_CPU, Runtime, load_profile
from onnxlens.analyzer.host import detect_cpu, host_profile
from onnxlens.analyzer.runtimes.ort_cpu import depthwise_filter_lines, nchwc_block
from onnxlens.backends.calibrate import catalogue, fit, measure
from onnxlens.backends.calibrate.catalogue import CAPPED
from onnxlens.backends.ort_timing import NodeTime, profile_model, time_model
from onnxlens.backends.values import Timing


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ONNXLENS_CACHE", str(tmp_path))
    return tmp_path


def _calibration(threads: int = 1, **changes: object) -> Calibration:
    hw = host_profile(threads)
    fields: dict[str, object] = dict(
        host=host_name(), cpu=detect_cpu().model, threads=threads, peak_fp32_tflops=0.2,
        gemm_tflops=0.15, kernel_overhead_us=0.5,
        bandwidth_gbps={lv.name: 10.0 * (len(hw.memory) - i) for i, lv in enumerate(hw.memory)},
        curves={"elementwise": Curve(0.3, 2e3, 0.5), "conv": Curve(0.8, 1e6, 4.0, 1e5, {"L3": 0.7}),
                "gemm": Curve(0.9, 1e5, 2.0, 500.0, {}, 12, 0.1)},
        levels=[(lv.name, lv.size_bytes) for lv in hw.memory],
        points=(Point("MatMul 64x64x64", "gemm", 262144, 0, 49152, 4e-6),),
        ort_version="1.0", created="2026-01-01T00:00:00+00:00", duration_s=90.0)
    fields.update(changes)
    return Calibration(**fields)  # type: ignore[arg-type]


# ---- the fit ------------------------------------------------------------------------------

def test_fit_recovers_a_known_curve() -> None:
    truth = Curve(0.8, 1e6, 4.0)
    flops = np.logspace(4, 10, 25)
    intensity = np.tile([0.5, 2.0, 8.0, 32.0, 128.0], 5)
    eff = np.array([truth(f, i) for f, i in zip(flops, intensity, strict=True)])
    curve = fit.fit_curve(flops, intensity, eff)
    assert curve.e_max == pytest.approx(0.8, rel=0.1)
    assert curve.log_error < 0.05 and curve.points == 25
    for f, i, e in zip(flops, intensity, eff, strict=True):
        assert curve(f, i) == pytest.approx(e, rel=0.08)


def test_fit_recovers_level_factors_and_caps_efficiency_at_one() -> None:
    """From L3, a kernel needs 10x the reuse for the same rate: slow at 2 FLOP/B, as fast
    as from L2 at 1000."""
    truth = Curve(0.9, 0.0, 4.0, level_factors={"L3": 10.0})
    intensity = np.tile([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0], 2)
    flops = np.full(12, 1e9)
    levels = ["L2"] * 7 + ["L3"] * 5  # L2, the most common level, is the reference
    eff = np.array([truth(f, i, lv) for f, i, lv in zip(flops, intensity, levels, strict=True)])
    curve = fit.fit_curve(flops, intensity, eff, levels)
    assert curve.level_factors == {"L3": pytest.approx(10.0, rel=0.05)}
    assert curve(1e9, 2.0, "L2") == pytest.approx(0.9 * 2 / 6, rel=0.05)
    assert curve(1e9, 2.0, "L3") == pytest.approx(0.9 * 2 / 42, rel=0.08)
    assert curve(1e9, 1024.0, "L3") == pytest.approx(0.9 * 1024 / 1064, rel=0.05)
    too_fast = fit.fit_curve(flops, intensity, np.full(12, 1.7))
    assert too_fast.e_max <= 1.0


def test_a_memory_bound_benchmark_bounds_the_curve_from_below_only() -> None:
    """Three GEMV-like benchmarks whose streamed bytes take 70-95% of their time run at 2% of
    peak, a quarter of the true curve at their FLOPs and reuse. Given their memory time
    (`floor`), the fit recovers the true curve, and its error counts each of them at its
    memory term's deviation, |ln(memory / measured)|, as the estimator's max(compute,
    memory) would predict them. And nothing jumps when their memory share crosses the 0.8
    cut the fit once applied: curves fitted at shares 0.78 and 0.82 agree within 1%."""
    truth = Curve(0.8, 1e6, 4.0)
    flops = np.concatenate([np.logspace(4, 10, 25), [5e7, 1e8, 4e8]])
    intensity = np.concatenate([np.tile([0.5, 2.0, 8.0, 32.0, 128.0], 5), [0.5, 0.5, 0.5]])
    eff = np.array([truth(f, i) for f, i in zip(flops, intensity, strict=True)])
    eff[25:] = 0.02
    shares = np.array([0.7, 0.9, 0.95])
    curve = fit.fit_curve(flops, intensity, eff,
                          floor=np.concatenate([np.full(25, -np.inf), np.log(shares)]))
    fitted = np.array([curve(f, i) for f, i in zip(flops, intensity, strict=True)])
    assert np.abs(fitted[:25] / eff[:25] - 1).max() < 0.08
    assert fitted[25:].min() > 2 * 0.02  # their compute under their memory time
    deviations = [*np.abs(np.log(eff[:25] / fitted[:25])), *np.abs(np.log(shares))]
    assert curve.log_error == pytest.approx(np.mean(deviations), rel=1e-6)
    near = [fit.fit_curve(flops, intensity, eff, floor=np.concatenate(
        [np.full(25, -np.inf), np.log([share] * 3)])) for share in (0.78, 0.82)]
    for f, i in zip(flops, intensity, strict=True):
        assert near[0](f, i) == pytest.approx(near[1](f, i), rel=0.01)


def test_a_subclass_without_a_curve_reads_its_nearest_calibrated_ancestors() -> None:
    """gemv_int8 -> gemm_int8 -> gemm (SUBCLASS_OF): a calibration made before the one-row
    class existed estimates it as it did, at gemm_int8's curve, not gemm's; a profile's
    constant efficiencies likewise."""
    int8, gemv = Curve(0.8, 7.5e5, 4.2), Curve(0.95, 7.5e4, 7.5)
    assert _calibration().curve("gemv_int8") == _calibration().curves["gemm"]
    assert _calibration(curves={**_calibration().curves, "gemm_int8": int8}).curve(
        "gemv_int8") is int8
    assert _calibration(curves={**_calibration().curves, "gemm_int8": int8,
                                "gemv_int8": gemv}).curve("gemv_int8") is gemv
    assert _calibration(curves={"elementwise": Curve(0.3)}).curve("gemv_int8").e_max == 0.3
    hw = host_profile(1)
    efficiency = {**hw.efficiency, "gemm_int8": 0.25}
    assert dataclasses.replace(hw, efficiency=efficiency).class_efficiency("gemv_int8") == 0.25
    assert hw.class_efficiency("gemm_int8_unpacked") == hw.efficiency["gemm"]


def test_the_per_call_cost_is_judged_on_every_level() -> None:
    """f_half is a cost per call, whatever level the operands sit in. Large GEMMs in L3 (the
    reference level, the most points) hardly tell it: at 1e8-1e10 FLOPs an f_half of 1e5
    moves them 0.1% or less. Small ones in L1 (3e4-3e5 FLOPs, 25-75% of their time a per-call
    cost) do, and the fit recovers it from them: the L1 points within 5%, where the best fit
    of the L3 points alone may take any f_half up to 1e6 within 1% of theirs."""
    truth = Curve(0.9, 1e5, 0.0)
    flops = np.concatenate([np.logspace(8, 10, 7), [3e4, 1e5, 3e5]])
    levels = ["L3"] * 7 + ["L1"] * 3
    intensity = np.full(10, 100.0)
    eff = np.array([truth(f, i) for f, i in zip(flops, intensity, strict=True)])
    curve = fit.fit_curve(flops, intensity, eff, levels)
    assert curve.f_half == pytest.approx(1e5, rel=0.1)
    for f in flops[7:]:
        assert curve(f, 100.0, "L1") == pytest.approx(truth(f, 100.0), rel=0.05)


def test_a_constant_curve_from_too_few_points() -> None:
    curve = fit.fit_curve(np.array([1e6, 1e7]), np.array([1.0, 10.0]), np.array([0.2, 0.4]))
    assert curve.f_half == curve.i_half == 0.0
    assert curve.e_max == pytest.approx(math.sqrt(0.2 * 0.4))


def _fake_machine(model: onnx.ModelProto, threads: int) -> measure.Timer:
    """A timer of a machine whose every op takes max(FLOPs at 40% of peak, bytes at 20 GB/s)
    plus fixed costs (5 us a run, 1 us a kernel)."""
    peak = host_profile(1).peak_flops("fp32")
    if model.graph.node[0].op_type == "Relu" and model.graph.input[0].type.tensor_type \
            .shape.dim[-1].dim_value == 16:  # the overhead chain
        return lambda min_time_s: 5e-6 + 1e-6 * len(model.graph.node)
    result = measure.analyze(model)
    cost = result.group_costs[0].cost
    assert cost is not None
    work = max(cost.flops() / (0.4 * peak), (cost.bytes_read + cost.bytes_written) / 20e9)
    return lambda min_time_s: 5e-6 + 1e-6 + work


def test_run_calibration_fits_a_fake_machine() -> None:
    """The fake machine (`_fake_machine`): the fit finds the overhead and bandwidths, and
    efficiencies near 40%."""
    peak = host_profile(1).peak_flops("fp32")
    prepare = _fake_machine
    # 0.3 s: the coarse tier always runs; analyzing the rest alone takes longer than that.
    cal = measure.run_calibration(1, budget_s=0.3, progress=False, prepare=prepare)
    assert cal.kernel_overhead_us == pytest.approx(1.0, rel=1e-6)
    assert cal.points and "skipped to stay within 0.3 s" in cal.notes[0]
    assert all(bw == pytest.approx(20.0, rel=0.05) for bw in cal.bandwidth_gbps.values())
    for point in cal.points:
        if point.macs:
            f = 2 * point.macs + point.other_flops
            if point.bytes / 20e9 < f / (0.4 * peak):
                # An int8 class's efficiency is a fraction of the int8 peak (4x fp32's on a
                # host with VNNI), which this machine does not reach: its 40% of fp32's.
                macs_peak = host_profile(1).peak_flops(fit.class_precision(point.op_class).peak)
                expected = (2 * point.macs / macs_peak + point.other_flops / peak) / (
                    f / (0.4 * peak))
                assert cal.efficiency(point.op_class, f, f / point.bytes) == pytest.approx(
                    expected, rel=0.15)
    assert {p.op_class for p in cal.points} >= {"conv_int8", "depthwise_int8", "gemm_int8"}


def test_a_gpu_calibration_fits_synthetic_gpu_timings(cache: Path) -> None:
    """`calibrate --backend native-cuda --profile a100` on timings made up for an A100 (no GPU
    has run it: every op max(FLOPs at 60% of the A100's fp32 peak, bytes at 1,500 GB/s) plus a
    4 us launch): the fit starts from the GPU's profile, finds its launch cost and
    bandwidth, says it is not validated on a GPU, and `-H a100 --runtime native-cuda` then
    estimates with it."""
    gpu = load_profile("a100")
    peak = gpu.peak_flops("fp32")

    def prepare(model: onnx.ModelProto, threads: int) -> measure.Timer:
        if model.graph.node[0].op_type == "Relu" and model.graph.input[0].type.tensor_type \
                .shape.dim[-1].dim_value == 16:  # the overhead chain
            return lambda min_time_s: 10e-6 + 4e-6 * len(model.graph.node)
        cost = measure.analyze(model).group_costs[0].cost
        assert cost is not None
        work = max(cost.flops() / (0.6 * peak), (cost.bytes_read + cost.bytes_written) / 1.5e12)
        return lambda min_time_s: 10e-6 + 4e-6 + work

    cal = measure.run_calibration(1, budget_s=0.3, progress=False, prepare=prepare,
                                  backend=NATIVE_CUDA, profile="a100")
    assert cal.profile == "a100" and cal.backend == NATIVE_CUDA
    assert cal.notes[0] == measure.GPU_NOT_VALIDATED
    assert cal.kernel_overhead_us == pytest.approx(4.0, rel=1e-6)
    assert cal.levels == [(lv.name, lv.size_bytes) for lv in gpu.memory]
    # the coarse tier (all a 0.3 s budget times) streams from the A100's 40 MB L2 at most
    assert cal.bandwidth_gbps and all(bw == pytest.approx(1500.0, rel=0.05)
                                      for bw in cal.bandwidth_gbps.values())
    path = cal.save()
    assert path.name == f"calibration-{host_name()}-a100-{NATIVE_CUDA}.json"
    hw, eff = resolve_target("a100", 1, NATIVE_CUDA)
    assert hw.calibrated and hw.runtime.name == NATIVE_CUDA
    assert hw.kernel_launch_us == pytest.approx(4.0)
    assert eff("gemm", 1e9, 100.0) == cal.efficiency("gemm", 1e9, 100.0)
    assert not resolve_target("a100", 1, "ort-cuda")[0].calibrated  # another runtime's
    with pytest.raises(UsageError, match="--profile"):
        measure.run_calibration(1, backend=NATIVE_CUDA, progress=False, prepare=prepare)
    with pytest.raises(UsageError, match="not a GPU"):
        measure.run_calibration(1, backend=NATIVE_CUDA, progress=False, prepare=prepare,
                                profile="xeon_8480")


def test_a_real_mini_calibration() -> None:
    cal = measure.run_calibration(1, budget_s=4.0, progress=False)
    assert cal.bandwidth_gbps and all(bw > 0 for bw in cal.bandwidth_gbps.values())
    assert cal.kernel_overhead_us >= 0 and cal.peak_fp32_tflops > 0
    assert all(0 < c.e_max <= 1 for c in cal.curves.values())
    for point in cal.points:
        f = 2 * point.macs + point.other_flops
        if f:
            assert 0 < cal.efficiency(point.op_class, f, f / point.bytes) <= 1
    assert {"elementwise", "conv", "gemm"} <= set(cal.curves)


def test_a_native_calibration_fetches_cold_weights_at_main_memory_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The native executor packs each Conv's weights into a buffer of its own, so the cold
    probe's shared chain would share nothing: a native-cpu calibration does not time the
    probe's chains (more than one Conv) and charges cold weights at main memory's fitted
    rate, the fake machine's 20 GB/s."""
    def prepare(model: onnx.ModelProto, threads: int) -> measure.Timer:
        assert sum(n.op_type == "Conv" for n in model.graph.node) <= 1, "timed a chain"
        return _fake_machine(model, threads)

    # the coarse tier and a Relu of 64 MB each way, so that main memory's rate is fitted
    benches = [*(b for b in catalogue.benchmarks() if b.tier == 0),
               catalogue.unary("Relu", 1 << 24, 0)]
    monkeypatch.setattr(measure, "benchmarks", lambda backend: benches)
    cal = measure.run_calibration(1, budget_s=5.0, progress=False, prepare=prepare,
                                  backend="native-cpu")
    assert cal.cold_weight_gbps == pytest.approx(20.0, rel=0.05)
    assert cal.cold_weight_gbps == cal.bandwidth_gbps[host_profile(1).main_memory.name]


def test_a_real_mini_calibration_of_the_native_executor() -> None:
    pytest.importorskip("onnxlens.backends._native")
    cal = measure.run_calibration(1, budget_s=3.0, progress=False, backend="native-cpu")
    assert cal.backend == "native-cpu" and cal.points
    assert all(0 < c.e_max <= 1 for c in cal.curves.values())
    assert {"elementwise", "conv", "gemm"} <= set(cal.curves)


def test_the_layout_kernels_are_cut_off() -> None:
    bench = catalogue.conv(32, 32, 28)
    model = bench.build()
    assert measure.prepare_ort(model, 1)(0.0) > 0
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "opt.onnx")
        kernels = profile_model(model, 1, runs=1, warmup=0, optimized_model_path=path)[0]
        cut = measure.without_layout(onnx.load(path), kernels)
    assert {k.op_type for k in kernels} >= {"ReorderInput", "ReorderOutput"}
    assert [n.op_type for n in cut.graph.node] == ["Conv"]


def test_a_quantized_convolution_is_timed_without_its_nhwc_transposes(tmp_path: Path) -> None:
    """quantize_static's Conv (QDQ, uint8 activations) runs as ORT's NHWC QLinearConv between
    two uint8 Transposes, which a network has only at the ends of its quantized convolutions:
    cut off, the QLinearConv alone reads and writes uint8 NHWC and computes what the whole
    graph did (the original's output, transposed)."""
    model = catalogue.quantized(catalogue.conv(16, 32, 12, act="Relu"), "qdq").build()
    assert [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)] \
        == [TensorProto.UINT8] * 2
    path = str(tmp_path / "opt.onnx")
    kernels = profile_model(model, 1, runs=1, warmup=0, optimized_model_path=path)[0]
    assert [k.op_type for k in kernels] == ["Transpose", "QLinearConv", "Transpose"]
    cut = measure.without_layout(onnx.load(path), kernels,
                                 measure.LAYOUT_KERNELS + measure.NHWC_KERNELS)
    assert [n.op_type for n in cut.graph.node] == ["QLinearConv"]
    x = np.random.default_rng(0).integers(0, 256, (1, 16, 12, 12), dtype=np.uint8)
    whole = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    alone = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = whole.run(None, {whole.get_inputs()[0].name: x})[0]
    got = alone.run(None, {alone.get_inputs()[0].name: x.transpose(0, 2, 3, 1)})[0]
    np.testing.assert_array_equal(got, expected.transpose(0, 2, 3, 1))
    assert measure.prepare_ort(model, 1)(0.0) > 0


def test_an_attention_benchmark_is_timed_as_its_products_without_the_softmax() -> None:
    """softmax(Q·Kᵀ·s)·V over 3 heads of 8 tokens x 4: ORT runs FusedMatMul (the scale folded
    in), Softmax, MatMul. Cut, the graph is the two products alone, (Q·Kᵀ·s)·V by numpy, which
    ORT runs as FusedMatMul and MatMul; the point is the attention kernel's: 2·3·8·8·4 MACs and
    the scale's 3·8·8 FLOPs, no softmax work. A graph without attention is left as it is."""
    bench = catalogue.attention(3, 8, 4)
    model = bench.build()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [
        "FusedMatMul", "Softmax", "MatMul"]
    cut = measure.without_softmax(model)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Mul", "Softmax", "MatMul"]
    assert [k.op_type for k in profile_model(cut, 1, runs=1, warmup=0)[0]] == [
        "FusedMatMul", "MatMul"]
    rng = np.random.default_rng(0)
    feeds = {"Q": rng.standard_normal((3, 8, 4), np.float32),
             "Kt": rng.standard_normal((3, 4, 8), np.float32),
             "V": rng.standard_normal((3, 8, 4), np.float32)}
    session = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, feeds)[0],
                               feeds["Q"] @ feeds["Kt"] * 4 ** -0.5 @ feeds["V"], rtol=1e-5)
    point = measure._point(bench.name, model, 1e-4, 0.0, 0.0,
                           measure._kernels_of(ORT_CPU, host_profile(1)))
    assert point is not None
    assert (point.op_class, point.macs, point.other_flops, point.transcendental, point.calls,
            point.rows) == ("attention", 2 * 3 * 8 * 8 * 4, 3 * 8 * 8, 0, 3, 0)
    plain = catalogue.conv(8, 8, 6).build()
    assert measure.without_softmax(plain) is plain


@pytest.mark.parametrize(("op", "cls"), [("ReduceL2", "reduce_squares"),
                                         ("ReduceSumSquare", "reduce_squares"),
                                         ("ReduceMean", "reduce")])
def test_a_sum_of_squares_is_a_reduction_class_of_its_own(op: str, cls: str) -> None:
    """ORT runs ReduceL2 / ReduceSumSquare over [32, 48]'s rows as one kernel of that op,
    sqrt(Σx²) / Σx² by numpy; our kernel is class `reduce_squares` (ReduceMean stays
    `reduce`), on ORT's kernel model and the native executor's (`node_class`). Calibrated,
    its curve is read; without one, its parent's, `reduce`: the estimate of a calibration
    that predates the class is unchanged."""
    from onnxlens.analyzer.runtimes import node_class
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels

    model = catalogue.row_op(op, 32, 48).build()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [op]
    x = np.random.default_rng(0).standard_normal((32, 48), np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = {"ReduceL2": np.sqrt((x * x).sum(-1, keepdims=True)),
                "ReduceSumSquare": (x * x).sum(-1, keepdims=True),
                "ReduceMean": x.mean(-1, keepdims=True)}[op]
    np.testing.assert_allclose(session.run(None, {"X": x})[0], expected, rtol=1e-5)
    result = measure.analyze(model)
    (group,) = result.groups
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = ort_kernels(result.graph, group, costs, 16)
    assert kernel.cls == node_class(result.graph.info(group.nodes[0])) == cls  # native's too
    cal = _calibration(curves={**_calibration().curves, "reduce": Curve(0.05)})
    assert cal.curve(cls).e_max == 0.05
    own = dataclasses.replace(cal, curves={**cal.curves, "reduce_squares": Curve(0.01)})
    assert own.curve(cls).e_max == (0.01 if cls == "reduce_squares" else 0.05)


@pytest.mark.parametrize(("bench", "cls", "calls"), [
    (catalogue.conv(128, 128, 24, 3, 1, 8), "grouped_conv_nchwc", 8),  # 16 channels a group
    # 8 channels a group: M = 8, K = 72, N = 48 x 48 in slices of 128, 18 GEMMs a group
    (catalogue.conv(64, 64, 48, 3, 1, 8), "grouped_conv", 8 * 18),
    # quantized, ORT's NHWC QLinearConv: no NCHWc path, the class it had before
    (catalogue.quantized(catalogue.conv(128, 128, 24, 3, 1, 8), "qdq"), "grouped_conv", 1),
    # depthwise with 54 channels (off a multiple of 4): per channel M = 1, K = 9, N = 48 x 48
    # in slices of 1024 (StrideN doubled while StrideK / 2 >= K), 3 GEMMs a channel
    (catalogue.depthwise(54, 48), "depthwise_nchw", 54 * 3)])
def test_a_grouped_conv_benchmark_is_read_at_its_path(bench: catalogue.Bench, cls: str,
                                                      calls: int) -> None:
    """A grouped Conv whose groups are whole NCHWc blocks (16 channels on AVX-512) is ORT's
    NCHWc kernel, one per group, class `grouped_conv_nchwc`; with 8 channels a group it is
    the NCHW path's im2col and GEMMs, `grouped_conv`; quantized, a QLinearConv, never on the
    NCHWc path; a depthwise one off the NCHWc path is `depthwise_nchw`. A calibration without
    these classes reads them at `conv`'s curve (`depthwise_nchw` through `grouped_conv`)."""
    point = measure._point(bench.name, bench.build(), 1e-4, 0.0, 0.0,
                           measure._kernels_of(ORT_CPU, host_profile(1)))
    assert point is not None and (point.op_class, point.calls) == (cls, calls)
    cal = _calibration()
    assert cal.curve(cls) is cal.curves["conv"]


def test_a_gqa_decode_benchmark_is_one_kernel_of_its_class() -> None:
    """One decode step of GroupQueryAttention, 4 query / 2 KV heads of 16 (ORT's rotary needs
    a multiple of 16) over a past of 7 (T = 8): ORT runs one kernel; its point is the
    `gqa_decode` kernel's, a call per query head, 4·8·(16 + 16) = 1024 MACs, 4·16 FLOPs a
    score (its reuse: a dot product and an axpy of the head size), its bytes each
    tensor once: the packed QKV (8·16 floats), the past K and V (2·2·7·16), the rotary caches'
    row at position 7 (2·8) read; the output (4·16) and the present K and V (2·2·8·16)
    written. A calibration without the class reads it at `gemm`'s curve."""
    bench = catalogue.gqa_decode(4, 2, 16, 7)
    model = bench.build()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [
        "GroupQueryAttention"]
    point = measure._point(bench.name, model, 1e-4, 0.0, 0.0,
                           measure._kernels_of(ORT_CPU, host_profile(1)))
    assert point is not None
    assert (point.op_class, point.calls, point.macs, point.reuse, point.bytes) == (
        "gqa_decode", 4, 1024, 4 * 16,
        4 * (8 * 16 + 2 * 2 * 7 * 16 + 2 * 8) + 4 * (4 * 16 + 2 * 2 * 8 * 16))
    cal = _calibration()
    assert cal.curve("gqa_decode") is cal.curves["gemm"]


R, C = 32, 64  # a residual norm's rows and columns, floats


@pytest.mark.parametrize(("bench", "kernel_op", "cls", "read", "written"), [
    # Add + LayerNormalization, fused by ORT: x, residual, gamma, beta in; y out
    (catalogue.skip_norm, "SkipLayerNormalization", "skip_normalization",
     2 * R * C * 4 + 2 * C * 4, R * C * 4),
    # onnxruntime-genai's node: x, residual, gamma in; y and the residual sum out
    (catalogue.skip_rms_norm, "SkipSimplifiedLayerNormalization", "skip_rms_normalization",
     2 * R * C * 4 + C * 4, 2 * R * C * 4),
])
def test_a_residual_norm_is_one_ort_kernel_of_its_own_class(
        bench: Callable[[int, int], catalogue.Bench], kernel_op: str, cls: str, read: int,
        written: int) -> None:
    """ORT runs a residual norm as one kernel, at a rate of its own (1 thread, Zen 5:
    SkipLayerNormalization 4.0-4.3 ns per element, SkipSimplifiedLayerNormalization 0.66-0.82,
    a LayerNormalization 0.24-0.35): one kernel of a class the catalogue calibrates, which a
    calibration without it reads at `normalization`'s curve."""
    from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels

    model = bench(R, C).build()
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [kernel_op]
    result = measure.analyze(model)
    (group,) = result.groups
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    (kernel,) = ort_kernels(result.graph, group, costs, 16)
    assert kernel.cls == cls
    assert (kernel.cost.bytes_read, kernel.cost.bytes_written) == (read, written)
    kind = bench(R, C).name.split()[0]  # the benchmarks' op, e.g. "Add+LayerNormalization"
    assert sum(b.name.split()[0] == kind for b in catalogue.benchmarks()) >= 3
    cal = _calibration()
    cal = dataclasses.replace(cal, curves={**cal.curves, "normalization": Curve(0.2, 1e3, 0.3)})
    assert cal.curve(cls) is cal.curves["normalization"]


def test_a_quantized_softmax_is_ort_qlinear_softmax() -> None:
    """quantize_static's DQ -> Softmax -> Q (DQ, DQ -> Add -> Q) is one group of ours and, as
    ORT's profile shows, one QLinearSoftmax (QLinearAdd) kernel: the kernel model costs it as
    one softmax_int8 (elementwise_int8) kernel writing uint8 (an fp32 Softmax is a float
    softmax kernel)."""
    from onnxlens.analyzer.runtimes.ort_cpu import (
        ELEMENTWISE_INT8,
        SOFTMAX,
        SOFTMAX_INT8,
        ort_kernels,
    )

    for bench, cls, ops in ((catalogue.quantized(catalogue.row_op("Softmax", 32, 64), "qdq"),
                             SOFTMAX_INT8, ["QLinearSoftmax"]),
                            (catalogue.row_op("Softmax", 32, 64), SOFTMAX, ["Softmax"]),
                            (catalogue.quantized(catalogue.binary("Add", 32 * 64), "qdq"),
                             ELEMENTWISE_INT8, ["QLinearAdd"])):
        model = bench.build()
        assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == ops
        result = measure.analyze(model)
        (group,) = result.groups
        costs = {k: nc.cost for k, nc in result.node_costs.items()}
        (kernel,) = ort_kernels(result.graph, group, costs, 16)
        width = 4 if cls == SOFTMAX else 1
        assert kernel.cls == cls and kernel.cost.bytes_written == 32 * 64 * width


def test_a_qoperator_softmax_after_a_qlinear_add_is_a_kernel_of_its_own() -> None:
    """quantize_static's QOperator attention: a QLinearAdd of the mask, then a QLinearSoftmax,
    one group of ours. ORT runs them as two kernels (its profile), and the QLinearSoftmax is a
    softmax_int8 kernel, not part of the Add's elementwise run: QOperator BERT read 0.53x
    of measured with its softmaxes at the elementwise rate."""
    from onnxlens.analyzer.fusion import Group
    from onnxlens.analyzer.runtimes.ort_cpu import ELEMENTWISE_INT8, SOFTMAX_INT8, ort_kernels

    def scalar(name: str, value: float | int, dtype: type) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(value, dtype), name)

    consts = [scalar("s", 0.05, np.float32), scalar("z", 128, np.uint8),
              scalar("ps", 1 / 256, np.float32), scalar("pz", 0, np.uint8)]
    nodes = [helper.make_node("QLinearAdd", ["x", "s", "z", "m", "s", "z", "s", "z"], ["a"],
                              domain="com.microsoft", name="add"),
             helper.make_node("QLinearSoftmax", ["a", "s", "z", "ps", "pz"], ["p"], axis=-1,
                              opset=13, domain="com.microsoft", name="softmax")]
    shape = [1, 4, 32, 32]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.UINT8, shape)
                     for n in ("x", "m")],
        [helper.make_tensor_value_info("p", TensorProto.UINT8, shape)], consts)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    assert [k.op_type for k in profile_model(model, 1, runs=1, warmup=0)[0]] == [
        "QLinearAdd", "QLinearSoftmax"]
    result = measure.analyze(model)
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    kernels = ort_kernels(result.graph, Group(0, "Attention", ("add", "softmax")), costs, 16)
    assert [(k.cls, k.nodes) for k in kernels] == [(ELEMENTWISE_INT8, ("add",)),
                                                   (SOFTMAX_INT8, ("softmax",))]


# ---- the data, the file and the profile ------------------------------------------------------

def test_json_round_trip(cache: Path) -> None:
    cal = _calibration()
    path = cal.save()
    assert path == calibration_path(1) and path.parent == cache
    assert Calibration.load(path) == cal
    assert Calibration.from_dict(cal.to_dict()) == cal


def test_bad_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}", encoding="utf-8")
    (tmp_path / "b.json").write_text("not json", encoding="utf-8")
    data = _calibration().to_dict()
    del data["curves"]["elementwise"]
    (tmp_path / "c.json").write_text(__import__("json").dumps(data), encoding="utf-8")
    for name in ("a", "b", "c"):
        with pytest.raises(CalibrationError):
            Calibration.load(tmp_path / f"{name}.json")


def test_cache_dir_respects_the_environment(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXLENS_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    assert calibration_path(2) == tmp_path / "mine" / f"calibration-{host_name()}-t2.json"
    monkeypatch.delenv("ONNXLENS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "onnxlens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "onnxlens"


def test_uncalibrated_without_a_file(cache: Path) -> None:
    hw = calibrated_host_profile(1)
    assert hw.key == "host" and not hw.calibrated
    hw, eff = calibrated_host(1)
    assert eff("conv", 1e9, 10.0) == hw.efficiency["conv"]
    assert find_calibration(None) is None


def test_calibrated_with_a_file(cache: Path) -> None:
    cal = _calibration()
    cal.save()
    hw, eff = calibrated_host(1)
    assert hw.calibrated and hw.kernel_launch_us == 0.5
    assert hw.peak_tflops["fp32"] == 0.2
    assert {lv.name: lv.bandwidth_gbps for lv in hw.memory} == cal.bandwidth_gbps
    assert all(0 < hw.efficiency[c] <= 1 for c in OP_CLASSES)
    assert eff("conv", 1e9, 10.0) == cal.efficiency("conv", 1e9, 10.0)
    assert calibrated_host_profile(None).calibrated  # the newest, whatever its threads
    assert not calibrated_host_profile(2).calibrated
    _calibration(cpu="another CPU").save()  # a file from another machine does not count
    assert not calibrated_host_profile(1).calibrated


def test_efficiency_by_class_and_level() -> None:
    levels = [("L1", 32 << 10), ("L2", 1 << 20), ("L3", 32 << 20), ("DRAM", None)]
    cal = dataclasses.replace(_calibration(), levels=levels)
    assert [cal.level(b) for b in (1e3, 1e5, 1e7, 1e9)] == ["L1", "L2", "L3", "DRAM"]
    assert cal.curve("depthwise") is cal.curves["gemm"]  # a MAC class without a curve
    assert cal.curve("pool") is cal.curves["elementwise"]
    size = 1e9 / (1e9 + 1e6)  # conv: Curve(0.8, f_half=1e6, i_half=4, {"L3": 0.7})
    assert cal.efficiency("conv", 1e9, 1e4) == pytest.approx(0.8 * size * 1e4 / (1e4 + 4))
    # L3 (1e7 bytes of traffic): i_half 4 scaled by the level's factor 0.7
    assert cal.efficiency("conv", 1e9, 100) == pytest.approx(0.8 * size * 100 / (100 + 2.8))
    assert cal.efficiency("conv", 1.0, 1e-9) > 0  # never zero
    assert cal.efficiency("gemm", 1e9, 5e3) == cal.efficiency("gemm", 1e9, 500.0)  # i_max
    assert cal.curve("grouped_conv") is cal.curves["conv"]  # a subclass reads its parent's
    own = dataclasses.replace(cal, curves={**cal.curves, "pool": Curve(0.05)})
    assert own.efficiency("pool", 1e6, 0.25) == pytest.approx(0.05)


def test_own_curves_for_pools_normalizations_and_reductions() -> None:
    """Three compute-bound LayerNorm-like points at 5% of peak give a `normalization` curve
    of 0.05; two pool points are too few for a curve of their own."""
    hw = host_profile(1)
    peak = 1e11
    bandwidth = {lv.name: 10.0 for lv in hw.memory}  # GB/s: 4 KB takes 0.4 us
    norm = [Point(f"n{i}", "normalization", 0, f, 4096, f / (0.05 * peak))
            for i, f in enumerate((1e6, 4e6, 1.6e7))]  # 200 us and more: not memory bound
    pools = [Point(f"p{i}", "pool", 0, 1e6, 4096, 1e-3) for i in range(2)]
    curves = fit.fit_vector_classes(norm + pools, hw, peak, bandwidth)
    assert set(curves) == {"normalization"}
    assert curves["normalization"](1e6, 244.0) == pytest.approx(0.05, rel=1e-6)


def test_a_class_out_of_the_elementwise_fit_gets_a_curve_of_its_own() -> None:
    """The classes left out of the elementwise fit (`own_curve_classes`: three LayerNorm-like
    points) are the classes given a curve of their own, even where the row term leaves only
    two of their points time (rows x 10 ns: 100 us and 400 us beside 200 and 800 us of work
    at 5% of peak; the third's 300 us over its 250 measured): the two fit its rate, where it
    had no curve and fell to the elementwise curve, which was not fitted on them."""
    hw = host_profile(1)
    peak, bandwidth = 1e11, {lv.name: 10.0 for lv in hw.memory}
    norm = [Point(f"n{i}", "normalization", 0, f, 4096, f / (0.05 * peak) + rows * 1e-8,
                  rows=rows) for i, (f, rows) in enumerate(((1e6, 10_000), (4e6, 40_000)))]
    norm.append(Point("n2", "normalization", 0, 1e6, 4096, 250e-6, rows=30_000))
    assert fit.own_curve_classes(norm) == {"normalization"}
    curves = fit.fit_vector_classes(norm, hw, peak, bandwidth, row_ns=10.0)
    assert set(curves) == {"normalization"} and curves["normalization"].points == 2
    assert curves["normalization"](1e6, 244.0) == pytest.approx(0.05, rel=1e-6)


def _elementwise_points(peak: float, gbps: float, tau: float) -> list[Point]:
    """Relu, Sigmoid and HardSwish of 2^12 to 2^24 elements on a machine where plain
    elementwise work runs at 5% of `peak`, a transcendental costs `tau` plain FLOPs and every
    level streams at `gbps`: each one's time max(work / (0.05·peak), 8n bytes / gbps)."""
    points = []
    for n in (2 ** 12, 2 ** 14, 2 ** 16, 2 ** 19, 2 ** 21, 2 ** 24):
        for op, flops, transcendental in (("Relu", n, 0), ("Sigmoid", n, n),
                                          ("HardSwish", 5 * n, 0)):
            work = flops + (tau - 1) * transcendental
            points.append(Point(f"{op} {n}", "elementwise", 0, flops, 8 * n,
                                max(work / (0.05 * peak), 8 * n / (gbps * 1e9)),
                                transcendental=transcendental))
    return points


def test_the_vector_fit_tells_bandwidth_from_transcendental_work() -> None:
    """A machine where plain elementwise ops stream at 20 GB/s and a transcendental costs τ
    plain FLOPs at 5% of peak: a Relu and a Sigmoid of n elements both do n FLOPs by our
    count, 8n bytes, but the Sigmoid's are transcendental; a HardSwish does 5 plain FLOPs.
    Times max(work / (0.05·peak), bytes / 20 GB/s): every Relu is memory bound, every
    Sigmoid and HardSwish compute bound (the HardSwish pins the plain rate: without a plain
    op that is compute bound, any larger τ at a proportionally higher rate fits as well).
    The fit finds τ, the bandwidth at every level and the curve, and predicts a Relu at its
    bandwidth (given a reuse factor, the curve fitted to the Sigmoids became a second,
    slower bandwidth and made a Relu several times too slow)."""
    hw = host_profile(1)
    peak, gbps, tau = 1e11, 20.0, float(fit.TRANSCENDENTAL_GRID[9])  # tau ~ 3.98
    points = _elementwise_points(peak, gbps, tau)
    bandwidth, curve, fitted_tau = fit.fit_vector(points, hw, peak)
    assert fitted_tau == pytest.approx(tau)
    assert set(bandwidth) == {lv.name for lv in hw.memory}
    assert all(bw == pytest.approx(gbps, rel=1e-6) for bw in bandwidth.values())
    assert curve.i_half == 0 and curve(1e6, 0.1) == pytest.approx(0.05, rel=0.02)
    cal = dataclasses.replace(_calibration(), peak_fp32_tflops=peak / 1e12,
                              bandwidth_gbps=bandwidth, curves={"elementwise": curve},
                              transcendental_flops=fitted_tau, points=tuple(points))
    assert max(fit.fit_check(cal).values()) < 0.02  # every point within 2%


def test_classes_with_curves_of_their_own_leave_the_elementwise_fit_alone() -> None:
    """The machine above, plus two ReduceMean-like points per size that read 8n bytes with
    n / 4 FLOPs (memory bound by the elementwise rate) in 8n / 5 GB/s, and three slow
    LayerNorm-like points (10 FLOPs per element at 0.5% of peak): reductions and
    normalizations get curves of their own, so the bandwidths and the elementwise curve
    are the same as without them (fitted on them too, L2, L3 and DRAM came out at the
    reductions' 5 GB/s, the curve at 0.5% of peak and τ at 1)."""
    hw = host_profile(1)
    peak, gbps, tau = 1e11, 20.0, float(fit.TRANSCENDENTAL_GRID[9])
    plain = _elementwise_points(peak, gbps, tau)
    others = [Point(f"ReduceMean {n} {i}", "reduce", 0, n // 4, 8 * n, 8 * n / 5e9)
              for n in (2 ** 12, 2 ** 14, 2 ** 16, 2 ** 19, 2 ** 21, 2 ** 24) for i in (1, 2)]
    others += [Point(f"LayerNorm {n}", "normalization", 0, 10 * n, 8 * n, 10 * n / (0.005 * peak))
               for n in (2 ** 12, 2 ** 14, 2 ** 16)]
    assert fit.own_curve_classes(plain + others) == {"reduce", "normalization"}
    bandwidth, curve, fitted_tau = fit.fit_vector(plain + others, hw, peak)
    assert (bandwidth, curve, fitted_tau) == fit.fit_vector(plain, hw, peak)
    assert all(bw == pytest.approx(gbps, rel=1e-6) for bw in bandwidth.values())
    assert curve(1e6, 0.1) == pytest.approx(0.05, rel=0.02)


@pytest.mark.parametrize(("ns_per_byte", "gbps"), [(1.0, 1.0), (0.0, 0.0)])
def test_the_cold_weight_rate_is_the_extra_time_of_distinct_weights(ns_per_byte: float,
                                                                    gbps: float) -> None:
    """A fake machine where a run takes 1 ms plus `ns_per_byte` per byte of the graph's
    initializers: the chain with a weight per layer has (layers - 1) weights more than the
    shared one, so the rate is exactly 1 / ns_per_byte GB/s; with no such cost, 0 (not
    measured)."""
    def prepare(model: onnx.ModelProto, threads: int) -> measure.Timer:
        nbytes = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
        return lambda min_time_s: 1e-3 + nbytes * ns_per_byte * 1e-9

    assert measure.cold_weight_gbps(1, prepare) == pytest.approx(gbps)


@pytest.mark.parametrize("line_ns", [30.0, 0.0])
def test_the_cold_line_cost_is_the_extra_time_of_distinct_filters(line_ns: float,
                                                                  monkeypatch) -> None:
    """A fake profiler where every depthwise Conv takes 5 us, plus `line_ns` per line of its
    filter when the filter is its own, not the one the first Conv read (the flush evicted
    it), and the flush's Relu 2 ms: the probe reads back exactly `line_ns` (0: not measured).
    On AVX-512's block of 16 the lines are padded channels x taps: 960@3x3 60 x 9 = 540."""
    def profile(model: onnx.ModelProto, threads: int, runs: int) -> list[list[NodeTime]]:
        weights = model.graph.initializer
        channels, _, kernel, _ = weights[0].dims
        lines = depthwise_filter_lines(channels, kernel * kernel, nchwc_block(host_profile(1)))
        shared = len(weights) == 1
        convs = [NodeTime(n.output[0], n.op_type, 5e-6 + (i > 0 and not shared) * lines
                          * line_ns * 1e-9, "CPU") for i, n in enumerate(model.graph.node)
                 if n.op_type == "Conv"]
        return [[*convs, NodeTime("FR", "Relu", 2e-3, "CPU")]] * runs

    monkeypatch.setattr(measure, "profile_model", profile)
    assert depthwise_filter_lines(960, 9, 16) == 540 and depthwise_filter_lines(20, 25, 8) == 38
    assert measure.cold_line_ns(1) == pytest.approx(line_ns)


@pytest.mark.parametrize("cold_us", [1.2, 0.0])
def test_the_cold_kernel_cost_is_the_extra_slope_of_flushed_chains(cold_us: float,
                                                                  monkeypatch) -> None:
    """A fake profiler where a run takes 20 us plus 2 us a Relu kernel, `cold_us` more with
    the flush's 3 ms Relu beside them (its own time, reported as a kernel, taken out): the
    probe reads back exactly `cold_us` from the slopes over the chain's lengths."""
    def runs(model: onnx.ModelProto, threads: int, runs: int) -> list:
        flush = any(n.name == catalogue.FLUSH for n in model.graph.node)
        relus = len(model.graph.node) - flush
        kernels = [NodeTime(catalogue.FLUSH, "Relu", 3e-3, "CPU")] if flush else []
        run_s = 20e-6 + relus * (2e-6 + flush * cold_us * 1e-6) + flush * 3e-3
        return [(run_s, kernels)] * runs

    monkeypatch.setattr(measure, "profile_runs", runs)
    assert measure.cold_kernel_us(1) == pytest.approx(cold_us)


@pytest.mark.parametrize(("per_core", "threads", "main", "rate"),
                         [(17.5, 1, 19.1, 17.5),   # one core: its own rate
                          (10.0, 2, 28.8, 20.0),   # two cores fetch their shares at once
                          (17.5, 2, 28.8, 28.8)])  # ... up to main memory's bandwidth
def test_the_cold_weight_rate_adds_over_threads_up_to_main_memory(
        per_core: float, threads: int, main: float, rate: float) -> None:
    assert fit.cold_weight_rate(per_core, threads, main) == pytest.approx(rate)


def test_the_copy_run_cost_is_the_extra_time_over_all_runs() -> None:
    """Two transposes that take 100 us more than their bytes at the bandwidth over 10,000
    runs, and 0 more over 128: (100 + 0) us / 10,128 runs; none: 0 (not fitted)."""
    hw = host_profile(1)
    bandwidth = {lv.name: 10.0 for lv in hw.memory}  # GB/s: 10 KB per us
    point = functools.partial(Point, op_class="data_movement", macs=0, other_flops=0,
                              bytes=10**5)
    points = [point("a", seconds=10e-6 + 100e-6, runs=10_000),
              point("b", seconds=10e-6, runs=128)]
    assert fit.fit_copy_run(points, hw, bandwidth) == pytest.approx(100e3 / 10_128)
    assert fit.fit_copy_run([], hw, bandwidth) == 0.0


def test_the_copy_element_cost_is_the_extra_time_over_all_elements() -> None:
    """Two element-wise transposes taking 10 us for their bytes at the bandwidth plus 2 ns
    per element (100,000 and 50,000): 2 ns; none: 0 (not fitted)."""
    hw = host_profile(1)
    bandwidth = {lv.name: 10.0 for lv in hw.memory}  # GB/s: 10 KB per us
    point = functools.partial(Point, op_class="data_movement", macs=0, other_flops=0,
                              bytes=10**5)
    points = [point("a", seconds=10e-6 + 200e-6, elements=100_000),
              point("b", seconds=10e-6 + 100e-6, elements=50_000)]
    assert fit.fit_copy_element(points, hw, bandwidth) == pytest.approx(2.0)
    assert fit.fit_copy_element([], hw, bandwidth) == 0.0


def test_the_libm_call_cost_is_each_capped_benchmarks_time_over_its_twins() -> None:
    """GQA prefills soft-capped (4,096 and 16,384 scores, a tanhf each) taking 26 and 102 us
    more than their twins without the cap: 128 us over 20,480 calls, 6.25 ns; a capped one
    without its twin, or no pair at all: not fitted (0)."""
    def point(name: str, seconds: float, calls: int = 0) -> Point:
        return Point(name, "attention", 1000, 0, 10**4, seconds, libm_calls=calls)

    twin = catalogue.gqa_decode(4, 2, 32, 0, seq=32).name
    long = catalogue.gqa_decode(4, 2, 32, 0, seq=64).name
    points = [point(twin, 30e-6), point(twin + CAPPED + "50", 56e-6, 4096),
              point(long, 60e-6), point(long + CAPPED + "50", 162e-6, 16384)]
    assert fit.fit_libm_call(points) == pytest.approx(6.25)
    assert fit.fit_libm_call(points[1:2]) == fit.fit_libm_call([]) == 0.0
    capped = catalogue.gqa_decode(4, 2, 32, 0, seq=32, softcap=50.0)
    assert capped.name == twin + CAPPED + "50"
    [node] = capped.build().graph.node
    assert helper.get_node_attr_value(node, "softcap") == 50.0


def test_each_blocked_copy_class_streams_at_its_benchmarks_bytes_over_their_time() -> None:
    """Blocked transposes of 1.2 MB in 24 us and 0.3 MB in 6 us: 1.5 MB / 30 us = 50 GB/s;
    reorders of 1.6 MB in 16 us and 0.4 MB in 4 us: 100 GB/s; a plain copy is no such class;
    without benchmarks, no rate."""
    def point(name: str, cls: str, nbytes: int, seconds: float) -> Point:
        return Point(name, cls, 0, 0, nbytes, seconds)

    points = [point("t1", "blocked_transpose", 1_200_000, 24e-6),
              point("t2", "blocked_transpose", 300_000, 6e-6),
              point("r1", "reorder", 1_600_000, 16e-6), point("r2", "reorder", 400_000, 4e-6),
              point("c", "data_movement", 1_000_000, 1e-6)]
    assert fit.fit_copy_rates(points) == pytest.approx({"blocked_transpose": 50.0,
                                                        "reorder": 100.0})
    assert fit.fit_copy_rates(points[-1:]) == {}


@pytest.mark.parametrize("op", ["ReorderInput", "ReorderOutput"])
def test_a_reorder_benchmark_is_orts_nchwc_layout_change(op: str) -> None:
    """The catalogue's reorder runs on ORT as one kernel that lays [1, 8, 4, 4] out in whole
    blocks of this host's channels (numpy: pad the channels to the block, then make the
    channel within the block the innermost axis), or back; its point is class `reorder`
    with the NCHW side's 512 bytes and the NCHWc side's 64 x block."""
    block = nchwc_block(host_profile(1))
    model = catalogue.reorder(op, 8, 4).build()
    x = np.arange(8 * 16, dtype=np.float32).reshape(1, 8, 4, 4)
    padded = np.concatenate([x, np.zeros((1, block - 8, 4, 4), np.float32)], axis=1)
    blocked = padded.reshape(1, 1, block, 4, 4).transpose(0, 1, 3, 4, 2).reshape(padded.shape)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    if op == "ReorderInput":
        np.testing.assert_array_equal(session.run(None, {"X": x})[0], blocked)
    else:
        np.testing.assert_array_equal(session.run(None, {"X": blocked})[0], x)
    kernels = measure._kernels_of(ORT_CPU, host_profile(1))
    p = measure._point(op, model, 10e-6, 1e-6, 0.0, kernels)
    assert p is not None and (p.op_class, p.bytes) == ("reorder", 4 * 8 * 16 + 4 * block * 16)


def test_the_norm_row_cost_is_recovered_from_timings() -> None:
    """LayerNormalizations timed as 12 ns per row plus their FLOPs at 5% of the peak (rows
    of 8 to 1024): the fit finds 12 ns, and a curve that then gives the rest; without rows, 0."""
    hw, peak = host_profile(1), 250e9
    points = []
    for rows, n in ((4608, 8), (2304, 24), (1152, 48), (4096, 64), (256, 256), (64, 1024)):
        flops, nbytes = rows * (7 * n + 3), 8 * rows * n
        points.append(Point(f"LN {rows}x{n}", "normalization", 0, flops, nbytes,
                            flops / (0.05 * peak) + rows * 12e-9, rows=rows))
    row_ns = fit.fit_norm_rows(points, hw, peak)
    assert row_ns == pytest.approx(12.0)
    levels = {lv.name: 1.0 for lv in hw.memory}  # (unread: the class curves take every point)
    curve = fit.fit_vector_classes(points, hw, peak, levels, 1.0, row_ns)["normalization"]
    assert curve(1e6, 0.9) == pytest.approx(0.05, rel=1e-6)
    assert fit.fit_norm_rows([dataclasses.replace(p, rows=0) for p in points], hw, peak) == 0.0


def test_an_old_file_reads_the_factors_it_lacks_as_neutral(cache: Path) -> None:
    data = _calibration(denormal_factor=120.0, transcendental_flops=3.0,
                        cold_weight_gbps=17.0, copy_run_ns=9.0, norm_row_ns=14.0,
                        copy_element_ns=2.0, cold_line_ns=18.0, cold_kernel_us=1.0,
                        run_call_us=2.2, copy_fixed_ns={"Slice": 150.0},
                        copy_part_ns=100.0).to_dict()
    runtime = apply_calibration(host_profile(1), Calibration.from_dict(data)).runtime
    assert runtime == Runtime(ORT_CPU, transcendental_flops=3.0, copy_run_ns=9.0,
                              cold_weight_gbps=17.0, denormal_factor=120.0, norm_row_ns=14.0,
                              copy_element_ns=2.0, cold_line_ns=18.0, cold_kernel_us=1.0,
                              run_call_us=2.2, copy_fixed_ns={"Slice": 150.0},
                              copy_part_ns=100.0)
    for key in ("denormal_factor", "transcendental_flops", "cold_weight_gbps", "copy_run_ns",
                "norm_row_ns", "copy_element_ns", "cold_line_ns", "cold_kernel_us",
                "run_call_us", "copy_fixed_ns", "copy_part_ns"):
        del data[key]
    for point in data["points"]:
        del point["transcendental"], point["pass_flops"], point["pass_transcendental"]
        del point["runs"], point["rows"], point["elements"]
    old = Calibration.from_dict(data)
    assert old.denormal_factor == old.transcendental_flops == 1.0
    assert old.cold_weight_gbps == old.copy_run_ns == old.norm_row_ns == 0.0  # nothing added
    assert old.copy_element_ns == old.cold_line_ns == old.cold_kernel_us == old.run_call_us == 0.0
    assert old.copy_fixed_ns == {} and old.copy_part_ns == 0.0
    assert all(p.runs == p.rows == p.elements == 0 for p in old.points)
    assert apply_calibration(host_profile(1), old).runtime == Runtime(ORT_CPU)


def test_a_run_calls_fixed_cost_is_added_once_to_the_model_in_no_group(cache: Path) -> None:
    """Relu over [1, 16], then Neg: the estimate with `run_call_us` 2.2 is the one without
    plus 2.2 us (and the static power over it), every group's estimate unchanged."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", f, [1, 16])],
        [helper.make_tensor_value_info("y", f, [1, 16])])
    result = onnxlens.analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    without, with_call = (_calibration(run_call_us=us) for us in (0.0, 2.2))
    a, b = (result.estimate(apply_calibration(host_profile(1), cal), None, cal.efficiency)
            for cal in (without, with_call))
    assert a.groups == b.groups and len(a.groups) == 2
    assert b.latency_s - a.latency_s == pytest.approx(2.2e-6, rel=1e-9)
    assert b.energy_j - a.energy_j == pytest.approx(a.profile.static_w * 2.2e-6, rel=1e-9)


def test_copy_fixed_costs_are_recovered_from_chain_timings() -> None:
    """The catalogue's copy chains timed by hand from known costs (ns: a run call 2000, a
    kernel 150, beyond it Slice 160, Gather 360, Expand 120, Split and Concat 100 each, 110 a
    part beyond the first, each step's bytes 5): fit_copy_fixed finds them, the bytes left in;
    without the Split chains, no Split or Concat cost and no part cost."""
    kernel, step_ns = 150.0, {"Slice": 160.0 + 150, "Gather": 360.0 + 150,
                              "Expand": 120.0 + 150 + 160 + 150}
    samples = {}
    for bench in catalogue.copy_chains():
        family, steps = bench.name.split(catalogue.CHAIN)[0], int(bench.name.split()[2])
        parts = int(bench.name.split(" x")[1]) if family == "Split" else 0
        ns = step_ns.get(family, 2 * (kernel + 100.0 + 110.0 * (parts - 1)))
        samples[bench.name] = (2000.0 + steps * (ns + 5.0)) * 1e-9
    fixed, part = fit.fit_copy_fixed(samples, kernel * 1e-9)
    assert fixed == pytest.approx({"Slice": 165.0, "Gather": 365.0, "Expand": 120.0,
                                   "Split": 102.5, "Concat": 102.5})
    assert part == pytest.approx(110.0)
    no_split = {k: v for k, v in samples.items() if not k.startswith("Split")}
    assert fit.fit_copy_fixed(no_split, kernel * 1e-9) == (
        pytest.approx({"Slice": 165.0, "Gather": 365.0, "Expand": 120.0}), 0.0)


def test_a_lone_copy_kernel_pays_its_calibrated_fixed_cost(cache: Path,
                                                            tmp_path: Path) -> None:
    """A Split into 3, a Concat of the 3 reversed, a Slice and a Gather, which ORT's optimized
    graph keeps as kernels of their own: the estimate with copy_fixed_ns and copy_part_ns is
    the one without plus each op's fixed cost and 2 parts each for the Split and the Concat,
    every other group unchanged."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    consts = [helper.make_tensor(name, i64, [len(v)], v) for name, v in (
        ("sizes", [32, 32, 64]), ("zero", [0]), ("end", [100]), ("one", [1]),
        ("perm", list(range(99, -1, -1))))]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Split", ["r", "sizes"], ["a", "b", "c"], axis=1),
         helper.make_node("Concat", ["c", "b", "a"], ["j"], axis=1),
         helper.make_node("Slice", ["j", "zero", "end", "one"], ["s"]),
         helper.make_node("Gather", ["s", "perm"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", f, [1, 128])],
        [helper.make_tensor_value_info("y", f, [1, 100])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    kept = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    assert kept == ["Relu", "Split", "Concat", "Slice", "Gather"]
    result = onnxlens.analyze(model)
    fixed = {"Split": 90.0, "Concat": 80.0, "Slice": 150.0, "Gather": 350.0, "Expand": 1e6}
    without, with_fixed = (_calibration(copy_fixed_ns=costs, copy_part_ns=part)
                           for costs, part in (({}, 0.0), (fixed, 100.0)))
    a, b = (result.estimate(apply_calibration(host_profile(1), cal), None, cal.efficiency)
            for cal in (without, with_fixed))
    added = {g.nodes[0]: b.groups[g.id].latency_s - a.groups[g.id].latency_s
             for g in result.groups}
    assert added == pytest.approx({"Relu_0": 0.0, "Split_1": 290e-9, "Concat_2": 280e-9,
                                   "Slice_3": 150e-9, "Gather_4": 350e-9}, abs=1e-15)


def test_the_denormal_factor_is_measured() -> None:
    assert measure.denormal_factor(1, min_time_s=0.01) >= 1.0


def test_the_calibrated_profile_names_its_runtime(cache: Path) -> None:
    """The estimator models the kernels of the runtime a calibration measured; a native-cpu
    calibration is a file of its own that the `host` target (ORT) does not pick up."""
    hw = apply_calibration(host_profile(1), _calibration())
    assert hw.runtime.name == ORT_CPU
    native = _calibration(backend="native-cpu")
    path = native.save()
    assert path.name == f"calibration-{host_name()}-t1-native-cpu.json"
    assert find_calibration(1) is None and find_calibration(None) is None
    assert find_calibration(1, "native-cpu") == native
    assert apply_calibration(host_profile(1), native).runtime.name == "native-cpu"
    with pytest.raises(UsageError, match="backend"):
        measure.run_calibration(1, backend="tpu", progress=False)


# ---- ORT timing -----------------------------------------------------------------------------

def _tiny_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]),
                               helper.make_node("Sigmoid", ["h"], ["y"])], "tiny", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_timing_runs_and_statistics(clock: str) -> None:
    timing = time_model(_tiny_model(), 1, runs=7, warmup=2, clock=clock)
    assert len(timing.runs_s) == 7 and timing.clock == clock
    assert timing.min_s <= timing.median_s <= timing.p90_s <= timing.max_s
    assert timing.min_s >= 0


def test_timing_statistics_by_hand() -> None:
    t = Timing((3.0, 1.0, 2.0, 10.0))
    assert (t.min_s, t.median_s, t.max_s, t.p90_s) == (1.0, 2.5, 10.0, 10.0)


def test_timing_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        time_model(_tiny_model(), 1, runs=0)
    with pytest.raises(ValueError):
        time_model(_tiny_model(), 0)
    with pytest.raises(ValueError):
        time_model(_tiny_model(), 1, clock="sundial")


def test_profile_gives_kernels_per_run() -> None:
    runs = profile_model(_tiny_model(), 1, runs=3, warmup=1)
    assert len(runs) == 3
    assert [k.op_type for k in runs[0]] == ["Relu", "Sigmoid"]
    assert all(k.duration_s >= 0 and k.input_shapes == ((1, 64),) for k in runs[0])


def test_a_per_call_curve_recovers_a_few_flops_fixed_cost_per_call() -> None:
    """A per-axis DequantizeLinear read per block: calls of 3 FLOPs at a fixed cost of 30
    FLOPs' time each (e = 0.1 · f / (f + 30)) beside per-tensor ones of 3e3-1e6 FLOPs. Offered
    the low grid (`per_call`) the fit reads a 3-FLOP call within 10%; the plain grid, whose
    smallest f_half is 1000, cannot."""
    flops = np.array([3.0, 3.0, 3e3, 5e4, 1e6])
    intensity = np.full(5, 0.6)
    eff = 0.1 * flops / (flops + 30.0)
    assert fit.fit_curve(flops, intensity, eff, per_call=True)(3.0, 0.6) == pytest.approx(
        0.1 * 3 / 33, rel=0.1)
    assert fit.fit_curve(flops, intensity, eff)(3.0, 0.6) != pytest.approx(0.1 * 3 / 33,
                                                                            rel=0.5)
