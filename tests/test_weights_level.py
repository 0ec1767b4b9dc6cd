"""Where a network's kernels re-read their weights from, one run after the last: the last-level
cache when everything a run touches fits the run's share of it, main memory otherwise
(`HardwareProfile.llc_share`, `weights_level`, `estimate.cold_weights`), each by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.calibration import constant_efficiency
from onnxlens.analyzer.estimate import estimate_group, peak_seconds
from onnxlens.analyzer.hardware import HardwareProfile, MemoryLevel, Runtime, load_profile, what_if
from onnxlens.analyzer.memory import touched_bytes

KIB, MIB = 1024, 1024 * 1024
L1, L2, L3 = 64 * KIB, 1 * MIB, 32 * MIB  # one instance each


def _profile(cores: int, logical_cpus: int = 2, l3_sharing: int = 2, facts: bool = True,
             l3: int = L3) -> HardwareProfile:
    """xeon_8480's rates on a small CPU's caches: private L1 and L2, one L3 shared by
    `l3_sharing` CPUs (of `logical_cpus` on 2 cores), a run on `cores` of them; cold
    weights measured at 10 GB/s, a CPU's launch of 0.5 us."""
    hw = load_profile("xeon_8480")
    rates = [lv.bandwidth_gbps for lv in hw.memory]
    memory = (MemoryLevel("L1", rates[0], L1), MemoryLevel("L2", rates[1], L1 + L2),
              MemoryLevel("L3", rates[2], L1 + L2 + l3), MemoryLevel("DRAM", rates[3]))
    caches = [{"level": n, "size_bytes": size, "instances": 1, "cpus_sharing": sharing}
              for n, size, sharing in ((1, L1, 1), (2, L2, 1), (3, l3, l3_sharing))]
    extra = {"cores": cores, "cores_available": 2, "logical_cpus": logical_cpus,
             **({"caches": caches} if facts else {})}
    return dataclasses.replace(hw, memory=memory, extra=extra, kernel_launch_us=0.5,
                               runtime=Runtime(cold_weight_gbps=10.0))


@pytest.mark.parametrize(("cores", "logical_cpus", "sharing", "facts", "l3_share"), [
    (1, 2, 2, True, L3 // 2),  # one core of the two sharing it: half
    (2, 2, 2, True, L3),  # both: all of it
    (1, 4, 4, True, L3 // 2),  # SMT: 4 CPUs sharing are 2 cores, one of them the run's
    (1, 2, 1, True, L3),  # a cache of its own
    (1, 2, 2, False, L3),  # no cache facts (a shipped profile): the whole level
])
def test_a_run_has_its_share_of_a_shared_last_level_cache(
        cores: int, logical_cpus: int, sharing: int, facts: bool, l3_share: int) -> None:
    llc = _profile(cores, logical_cpus, sharing, facts).llc_share
    assert llc is not None and llc.name == "L3"
    assert llc.size_bytes == L1 + L2 + l3_share  # the private levels, then the share


def test_cache_facts_not_as_host_detection_writes_them_give_the_whole_level() -> None:
    """A profile file's [extra] caches without a field, or fewer than its cache levels."""
    hw = _profile(cores=1)
    for caches in ([{"level": 3, "size_bytes": L3}], [{k: v for k, v in fact.items()
                                                       if k != "cpus_sharing"}
                                                      for fact in hw.extra["caches"]]):
        partial = dataclasses.replace(hw, extra={**hw.extra, "caches": caches})
        assert partial.llc_share == hw.memory[2]  # L1 + L2 + all of the L3


def test_weights_come_from_the_cache_only_when_the_run_fits_its_share() -> None:
    hw = _profile(cores=1)
    share = L1 + L2 + L3 // 2
    assert hw.weights_level(share).name == "L3"
    assert hw.weights_level(share + 1) == hw.main_memory
    no_caches = dataclasses.replace(hw, memory=(hw.main_memory,))
    assert no_caches.llc_share is None
    assert no_caches.weights_level(0) == no_caches.main_memory



def test_a_working_set_streams_from_the_last_cache_only_within_the_runs_share() -> None:
    """memory_level reads the last cache as weights_level does: at one core of the two sharing
    it, a working set past half the L3 streams from main memory; at both, up to all of it."""
    share = L1 + L2 + L3 // 2
    one, both = _profile(cores=1), _profile(cores=2)
    assert [one.memory_level(b).name for b in (L1, L1 + 1, share, share + 1)] == [
        "L1", "L2", "L3", "DRAM"]
    assert both.memory_level(share + 1).name == "L3"
    assert both.memory_level(L1 + L2 + L3 + 1).name == "DRAM"

LAYERS, WIDTH = 12, 256  # 12 GEMVs of 256 x 256 floats: 256 KiB of weights each


def _gemv_chain() -> onnxlens.AnalysisResult:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH), np.float32),
                                       f"w{i}") for i in range(LAYERS)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"],
                              name=f"mm{i}") for i in range(LAYERS)]
    row = [1, WIDTH]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, row)],
        [helper.make_tensor_value_info(f"y{LAYERS - 1}", TensorProto.FLOAT, row)], weights)
    return onnxlens.analyze(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]))


@pytest.mark.parametrize(("cores", "level"), [(1, "DRAM"), (2, "L3")])
def test_a_small_network_re_reads_its_weights_from_the_cache(cores: int, level: str) -> None:
    """A run touches the GEMVs' 12 x 262,144 bytes of weights and 13 rows of 1 KiB (the input
    and each GEMV's output): 3,159,040 bytes. Under an L3 of 2 MiB shared by two cores, a run
    on one has 64 KiB + 1 MiB + 1 MiB = 2,162,688 bytes: its GEMVs stream their weights from
    DRAM; on both, 3,211,264 bytes: from the L3, at its bandwidth. Each GEMV (0.5 FLOP per
    byte) is under DRAM's ridge, so either way its fetch is at the level's bandwidth, after
    its work: max(hot, work + launch + 262,144 B / bandwidth)."""
    hw = _profile(cores, l3=2 * MIB)
    r = _gemv_chain()
    assert touched_bytes(r.graph, r.groups, r.model.tensors) == (LAYERS + 1) * WIDTH * 4
    touched = LAYERS * WIDTH * WIDTH * 4 + (LAYERS + 1) * WIDTH * 4
    assert touched == 3_159_040
    eff, fp32 = constant_efficiency(hw), what_if("fp32")
    source = next(lv for lv in hw.memory if lv.name == level)
    assert hw.weights_level(touched) == source
    est = r.estimate(hw, "fp32", eff)
    for g in r.groups:
        cost = r.group_costs[g.id].cost
        assert cost is not None and cost.param_bytes == WIDTH * WIDTH * 4
        hot = estimate_group(cost, "gemm", hw, fp32, eff)
        work = peak_seconds(cost, hw, fp32) / hw.class_efficiency("gemm")
        fetch = WIDTH * WIDTH * 4 / (source.bandwidth_gbps * 1e9)
        got = est.groups[g.id]
        assert got is not None
        assert got.latency_s == pytest.approx(max(hot.latency_s, work + hot.overhead_s + fetch))
        assert str(got.bound) == f"memory:{level}"  # the fetch, longer than the launch


def test_a_tensor_read_by_many_kernels_is_touched_once() -> None:
    """x [1, 256] read by 12 MatMuls (12 KiB read in all, as a KV cache is copied once per
    query head) is 1 KiB touched; their 12 outputs, 12 KiB."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH), np.float32),
                                       f"w{i}") for i in range(LAYERS)]
    row = [1, WIDTH]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(LAYERS)], "fan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, row)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, row) for i in range(LAYERS)],
        weights)
    r = onnxlens.analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    reads = sum(nc.cost.bytes_read - nc.cost.param_bytes for nc in r.group_costs.values())
    assert reads == LAYERS * WIDTH * 4
    assert touched_bytes(r.graph, r.groups, r.model.tensors) == (1 + LAYERS) * WIDTH * 4
