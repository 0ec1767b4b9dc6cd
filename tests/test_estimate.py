"""The roofline estimate: a hand-computed case, and sanity on every shipped profile."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

import onnxlens
from onnxlens.analyzer.cost.base import Cost
from onnxlens.analyzer.estimate import constant_efficiency, estimate_group, memory_level
from onnxlens.analyzer.hardware import (
    PRECISION_BYTES,
    available_profiles,
    load_profile,
    profile_from_dict,
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
    e = estimate_group(cost, "gemm", gpu, "fp32", constant_efficiency(gpu))
    compute = 2e9 / (60e12 * 0.7)  # 2 FLOPs per MAC at 70% of the fp32 peak
    assert e.compute_s == pytest.approx(compute)
    assert e.level == "L2"  # 8 MB of traffic fits the 50 MB L2
    assert e.memory_s == pytest.approx(8e6 / 6000e9)
    assert e.latency_s == pytest.approx(compute + 3e-6)
    assert e.bound == "compute"
    assert e.intensity == pytest.approx(2e9 / 8e6)
    energy = (2e9 * 0.5 + 8e6 * 2.0) * 1e-12 + 100 * (compute + 3e-6)
    assert e.energy_j == pytest.approx(energy)


def test_big_elementwise_is_memory_bound_in_main_memory(gpu) -> None:
    n = 100_000_000  # Add of two 400 MB tensors: 1 FLOP per 12 bytes
    cost = Cost(other_flops=n, bytes_read=8 * n, bytes_written=4 * n)
    e = estimate_group(cost, "elementwise", gpu, "fp32", constant_efficiency(gpu))
    assert e.bound == "memory:HBM"
    assert e.memory_s == pytest.approx(12 * n / 3000e9)


def test_fp16_halves_bytes_and_int8_quarters_them(gpu) -> None:
    cost = Cost(other_flops=10, bytes_read=4 * 10**8, bytes_written=0)
    eff = constant_efficiency(gpu)
    fp32 = estimate_group(cost, "elementwise", gpu, "fp32", eff).memory_s
    assert estimate_group(cost, "elementwise", gpu, "fp16", eff).memory_s == pytest.approx(fp32 / 2)
    assert estimate_group(cost, "elementwise", gpu, "int8", eff).memory_s == pytest.approx(fp32 / 4)
    assert PRECISION_BYTES["int8"] == 1


def test_tiny_kernel_is_overhead_bound(gpu) -> None:
    e = estimate_group(Cost(other_flops=64, bytes_read=256, bytes_written=256), "elementwise",
                       gpu, "fp32", constant_efficiency(gpu))
    assert e.bound == "overhead"


def test_working_set_picks_the_level(gpu) -> None:
    assert memory_level(gpu, 10).name == "L2"
    assert memory_level(gpu, 50_000_001).name == "HBM"


SHIPPED = available_profiles()


@pytest.mark.parametrize("key", SHIPPED)
def test_roofline_sanity_on_every_profile(key: str) -> None:
    hw = load_profile(key)
    eff = constant_efficiency(hw)
    n = 8192  # square fp32 GEMM: 2*n^3 FLOPs over 12*n^2 bytes, intensity ~1365 FLOP/B
    gemm = Cost(macs=n**3, bytes_read=8 * n * n, bytes_written=4 * n * n)
    assert estimate_group(gemm, "gemm", hw, "fp32", eff).bound == "compute"
    m = 1 << 28  # elementwise Add of 1 GiB tensors
    add = Cost(other_flops=m, bytes_read=8 * m, bytes_written=4 * m)
    assert estimate_group(add, "elementwise", hw, "fp32", eff).bound.startswith("memory:")
    if hw.kind == "gpu" and hw.peak_tflops.get("fp16", 0) > hw.peak_tflops["fp32"]:
        fp32 = estimate_group(gemm, "gemm", hw, "fp32", eff).latency_s
        assert estimate_group(gemm, "gemm", hw, "fp16", eff).latency_s <= fp32


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
    assert group["bound"] in ("compute", "overhead") or group["bound"].startswith("memory:")
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
