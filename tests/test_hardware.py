"""Hardware profiles: the shipped files, their round trip, bad files, host detection."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from onnxlens.analyzer import host
from onnxlens.analyzer.hardware import (
    NATIVE_CPU,
    OP_CLASSES,
    PRECISIONS,
    PROFILES_DIR,
    HardwareProfile,
    HardwareProfileError,
    Runtime,
    available_profiles,
    load_profile,
    profile_to_dict,
    profile_to_toml,
)

SHIPPED = available_profiles()


def test_the_issue_devices_are_shipped() -> None:
    wanted = {"xeon_8480", "v100", "a100", "h100", "h200", "jetson_orin", "tpu_v4", "tpu_v5e",
              "kpu", "snapdragon_8g2"}
    assert wanted <= set(SHIPPED)


@pytest.mark.parametrize("key", SHIPPED)
def test_shipped_profile_loads_with_a_source_for_every_number(key: str) -> None:
    hw = load_profile(key)
    assert hw.key == key and hw.kind in ("cpu", "gpu", "tpu", "npu") and not hw.calibrated
    assert hw.source and all(hw.sources[s] for s in ("compute", "overhead", "power",
                                                      "efficiency"))
    assert all(level.source for level in hw.memory)
    assert hw.main_memory.size_bytes is None
    assert set(hw.efficiency) == set(OP_CLASSES)
    assert set(hw.peak_tflops) <= set(PRECISIONS) and set(hw.compute_pj_per_flop) == set(
        hw.peak_tflops)
    assert 0 <= hw.static_w < hw.tdp_w


@pytest.mark.parametrize("key", SHIPPED)
def test_peak_power_fits_the_tdp(key: str) -> None:
    """Running flat out at any precision costs at most the TDP (energy figures agree with
    the peaks they were derived from)."""
    hw = load_profile(key)
    for p in hw.peak_tflops:
        watts = hw.peak_flops(p) * hw.pj_per_flop(p) * 1e-12 + hw.static_w
        assert watts <= hw.tdp_w * 1.01, (p, watts)


@pytest.mark.parametrize("key", [*SHIPPED, "host"])
def test_profile_round_trips_through_toml(tmp_path: Path, key: str) -> None:
    hw = load_profile(key)
    path = tmp_path / f"{key}.toml"
    path.write_text(profile_to_toml(hw), encoding="utf-8")
    assert load_profile(path) == hw


def test_a_calibrated_runtime_round_trips_through_toml(tmp_path: Path) -> None:
    # what apply_calibration sets, per_call_classes included (a set, written as a list)
    runtime = Runtime(NATIVE_CPU, transcendental_flops=5.0, copy_run_ns=9.8,
                      cold_weight_gbps=16.0, denormal_factor=3.5, norm_row_ns=14.0,
                      copy_element_ns=2.2, cold_line_ns=18.0, cold_kernel_us=1.1,
                      per_call_classes=frozenset({"dequantize", "quantize"}),
                      copy_gbps={"reorder": 87.0, "blocked_transpose": 53.0},
                      copy_fixed_ns={"Slice": 159.0, "Split": 98.0}, copy_part_ns=118.0)
    hw = dataclasses.replace(load_profile("xeon_8480"), runtime=runtime)
    path = tmp_path / "xeon_8480.toml"
    path.write_text(profile_to_toml(hw), encoding="utf-8")
    assert load_profile(path) == hw
    assert host.replace_measured(hw, peak_tflops={"fp32": 1.0}).runtime == runtime


def test_profile_reads_from_yaml(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    hw = load_profile("a100")
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(hw)), encoding="utf-8")
    assert load_profile(path) == hw


BAD = {
    "missing fp32 peak": ("peak_fp32_tflops = 66.9\n", "", "compute.peak_fp32_tflops"),
    "negative bandwidth": ("bandwidth_gbps = 3350.0", "bandwidth_gbps = -3350.0",
                           "memory[1].bandwidth_gbps"),
    "efficiency over 1": ("gemm = 0.7", "gemm = 1.5", "efficiency.gemm"),
    "string for a number": ("tdp_w = 700.0", 'tdp_w = "700 W"', "power.tdp_w"),
    "unknown kind": ('kind = "gpu"', 'kind = "fpga"', "kind"),
    "typo in a field": ("peak_fp16_tflops", "peak_fp16_tflop", "compute.peak_fp16_tflop"),
    "static over tdp": ("static_w = 84.0", "static_w = 800.0", "power.static_w"),
    "fractional bytes": ("size_bytes = 52428800", "size_bytes = 5.5", "memory[0].size_bytes"),
}


def test_a_blocked_copy_rate_of_an_unknown_class_is_rejected(tmp_path: Path) -> None:
    text = profile_to_toml(load_profile("h100")) + "\n[runtime]\ncopy_gbps = {gather = 50.0}\n"
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(HardwareProfileError, match=r"runtime\.copy_gbps"):
        load_profile(path)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_is_rejected_with_the_field_named(tmp_path: Path, case: str) -> None:
    old, new, field_name = BAD[case]
    text = profile_to_toml(load_profile("h100"))
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(HardwareProfileError, match=r"bad\.toml") as err:
        load_profile(path)
    assert field_name in str(err.value)


def test_missing_table_is_named(tmp_path: Path) -> None:
    text = profile_to_toml(load_profile("h100"))
    path = tmp_path / "no_overhead.toml"
    path.write_text(text[:text.index("[overhead]")] + text[text.index("[power]"):], "utf-8")
    with pytest.raises(HardwareProfileError, match=r"missing table \[overhead\]"):
        load_profile(path)


def test_memory_levels_must_grow(tmp_path: Path) -> None:
    text = profile_to_toml(load_profile("xeon_8480"))
    path = tmp_path / "shrinks.toml"
    path.write_text(text.replace("size_bytes = 120193024", "size_bytes = 1000"), "utf-8")
    with pytest.raises(HardwareProfileError, match=r"memory\[1\]\.size_bytes = 1000 must be "
                                                   r"larger than memory\[0\]\.size_bytes"):
        load_profile(path)


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\n[[[compute\n', encoding="utf-8")
    with pytest.raises(HardwareProfileError, match="not valid TOML"):
        load_profile(path)
    with pytest.raises(HardwareProfileError, match="no such profile or file"):
        load_profile("no_such_device")


def _profile(key: str) -> HardwareProfile:
    return load_profile(key)


def test_tensor_core_gpus_are_faster_in_fp16() -> None:
    gpus = [_profile(k) for k in SHIPPED if _profile(k).kind == "gpu"]
    assert len(gpus) >= 5
    for hw in gpus:
        assert hw.peak_tflops["fp16"] >= hw.peak_tflops["fp32"], hw.key


def test_gpu_generations_in_order() -> None:
    fp16 = {k: _profile(k).peak_tflops["fp16"] for k in ("v100", "a100", "h100", "h200")}
    assert fp16["v100"] < fp16["a100"] < fp16["h100"] <= fp16["h200"]
    assert _profile("h200").main_memory.bandwidth_gbps > _profile("h100").main_memory \
        .bandwidth_gbps
    assert _profile("h100").peak_tflops == {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4,
                                            "bf16": 989.4, "int8": 1978.9}


def test_kpu_cites_the_graphs_pipeline() -> None:
    kpu = _profile("kpu")
    assert "branes-ai/graphs" in kpu.source and kpu.kind == "npu"
    assert kpu.peak_flops("int8") > kpu.peak_flops("bf16") > kpu.peak_flops("fp32")


def test_missing_precision_falls_back_to_a_wider_one() -> None:
    v100 = _profile("v100")  # no bf16 or tf32 units
    assert v100.peak_flops("bf16") == v100.peak_flops("fp16")
    assert v100.peak_flops("tf32") == v100.peak_flops("fp32")


# --- host detection -------------------------------------------------------------------------


def test_host_is_detected_on_this_machine() -> None:
    hw = load_profile("host")
    assert hw.key == "host" and hw.kind == "cpu" and not hw.calibrated
    cores = hw.extra["cores"]
    assert cores >= 1 and hw.peak_tflops["fp32"] > 0 and hw.extra["freq_ghz"] > 0
    assert hw.main_memory.name == "DRAM" and hw.main_memory.bandwidth_gbps == 10.0 * cores
    if any(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        assert hw.extra["caches_detected"] and len(hw.memory) >= 3
    one = host.host_profile(threads=1)
    assert one.extra["cores"] == 1 and one.extra["threads"] == 1
    assert one.peak_tflops["fp32"] * cores == pytest.approx(hw.peak_tflops["fp32"])


def _fake_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpuinfo: str,
                  cpus: int, files: dict[str, str]) -> None:
    (tmp_path / "cpuinfo").write_text(cpuinfo, encoding="utf-8")
    for name, text in files.items():
        path = tmp_path / "sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
    (tmp_path / "sys").mkdir(exist_ok=True)
    monkeypatch.setattr(host, "PROC_CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(host, "SYS_CPU", tmp_path / "sys")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)


ARM_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm asimdhp asimddp\n"
    f"CPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\n" for i in range(4))


def test_host_without_cache_or_frequency_info(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An aarch64 machine whose /sys has no cache or cpufreq directory: NEON, an assumed
    2.0 GHz, the assumed per-core L1 and L2."""
    _fake_machine(tmp_path, monkeypatch, ARM_CPUINFO, 4, {})
    hw = host.host_profile()
    assert hw.extra["simd"] == "neon" and hw.simd_bits == 128
    assert hw.extra["cores"] == 4 and hw.extra["freq_ghz"] == 2.0
    assert "assumed" in hw.extra["freq_source"] and not hw.extra["caches_detected"]
    assert "implementer 0x41" in hw.name
    # 4 cores x 2 GHz x 4 lanes x 2 (FMA) x 2 FMA units; fp16 (asimdhp) 2x, int8 (asimddp) 4x
    assert hw.peak_tflops == pytest.approx({"fp32": 0.128, "fp16": 0.256, "int8": 0.512})
    assert [lv.name for lv in hw.memory] == ["L1", "L2", "DRAM"]
    assert hw.memory[0].size_bytes == 4 * 32 * 1024
    assert hw.memory[1].size_bytes == 4 * (32 * 1024 + 1024 * 1024)
    assert hw.memory[0].bandwidth_gbps == pytest.approx(32 * 4 * 2.0)  # 2 NEON loads/clock


def test_host_with_smt_caches_and_cpufreq(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """4 logical CPUs on 2 cores (SMT pairs 0,2 and 1,3), AVX2, 3 GHz from cpufreq, private L1
    and L2 per core, one shared L3."""
    cpuinfo = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Fake CPU @ 2.5GHz\n"
               "cpu MHz\t\t: 800.000\ncache size\t: 16384 KB\n"
               "flags\t\t: fpu sse2 avx fma avx2 avx_vnni\n\n")
    files = {}
    for cpu in range(4):
        files[f"cpu{cpu}/topology/thread_siblings_list"] = f"{cpu % 2},{cpu % 2 + 2}"
    files["cpu0/cpufreq/cpuinfo_max_freq"] = "3000000"
    for index, (level, kind, size, shared) in enumerate(
            [(1, "Data", "32K", "0,2"), (1, "Instruction", "32K", "0,2"),
             (2, "Unified", "1024K", "0,2"), (3, "Unified", "16M", "0-3")]):
        for name, value in (("level", level), ("type", kind), ("size", size),
                            ("shared_cpu_list", shared)):
            files[f"cpu0/cache/index{index}/{name}"] = str(value)
    _fake_machine(tmp_path, monkeypatch, cpuinfo, 4, files)
    hw = host.host_profile()
    assert hw.extra["cores"] == 2 and hw.extra["logical_cpus"] == 4
    assert hw.extra["freq_ghz"] == 3.0 and "cpuinfo_max_freq" in hw.extra["freq_source"]
    # 2 cores x 3 GHz x 8 lanes x 2 x 2 FMA units = 192 GFLOP/s; avx_vnni int8 at 4x
    assert hw.peak_tflops == pytest.approx({"fp32": 0.192, "int8": 0.768})
    assert [lv.name for lv in hw.memory] == ["L1", "L2", "L3", "DRAM"]
    l1, l2, l3 = (lv.size_bytes for lv in hw.memory[:3])
    assert (l1, l2, l3) == (2 * 32 << 10, 2 * (32 << 10) + 2 * (1 << 20),
                            2 * (32 << 10) + 2 * (1 << 20) + (16 << 20))
    one = host.host_profile(threads=1)  # one core: one instance of each cache
    assert one.memory[0].size_bytes == 32 << 10
    assert one.peak_tflops["fp32"] == pytest.approx(0.096)
    assert one.kernel_launch_us < hw.kernel_launch_us
    assert host.host_profile(threads=8).extra["cores"] == 2  # SMT threads add no FMA units


def test_replace_measured_merges_and_validates() -> None:
    hw = host.host_profile(threads=1)
    measured = host.replace_measured(hw, peak_tflops={"fp32": 0.1}, efficiency={"gemm": 0.9},
                                     kernel_launch_us=1.5)
    assert measured.calibrated and measured.peak_tflops["fp32"] == 0.1
    assert measured.efficiency["gemm"] == 0.9 and measured.efficiency["conv"] == hw.efficiency[
        "conv"]
    assert measured.kernel_launch_us == 1.5 and "measured" in measured.sources["efficiency"]
    assert measured.memory == hw.memory and measured.extra == hw.extra
    with pytest.raises(HardwareProfileError, match=r"efficiency\.gemm = 1\.2 is over 1"):
        host.replace_measured(hw, efficiency={"gemm": 1.2})
    with pytest.raises(HardwareProfileError, match=r"memory\[0\]\.bandwidth_gbps"):
        host.replace_measured(hw, memory=[hw.memory[0].__class__("L1", -1.0, 10), hw.memory[-1]])


def test_a_subclass_reads_its_parents_efficiency() -> None:
    hw = load_profile("h100")
    assert hw.class_efficiency("grouped_conv") == hw.efficiency["conv"]
    assert hw.class_efficiency("gemm") == hw.efficiency["gemm"]
    with pytest.raises(KeyError):
        hw.class_efficiency("no such class")


def test_the_hardware_listing_fits_80_columns_with_every_number_whole() -> None:
    """`onnxlens hardware` on an 80-column terminal: no line wider, no cell cut (rich ends a
    cut cell with an ellipsis), each shipped profile's fp32 peak as its file gives it, and
    the uncalibrated ones marked."""
    import io
    import re

    from rich.console import Console

    from onnxlens.reports.terminal import render_hardware

    profiles = [load_profile(key) for key in available_profiles()]
    console = Console(width=80, file=io.StringIO(), highlight=False)
    render_hardware(profiles, console)
    lines = console.file.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    assert not any("…" in line for line in lines)
    keys = available_profiles()
    rows = {cells[0]: cells for line in lines if (cells := line.split()) and cells[0] in keys}
    for key in keys:
        text = (PROFILES_DIR / f"{key}.toml").read_text()
        fp32 = float(re.search(r"^peak_fp32_tflops = ([0-9.]+)", text, re.M).group(1))
        assert float(rows[key][2]) == pytest.approx(fp32, rel=5e-3)
        assert rows[key][-1] == "no"
