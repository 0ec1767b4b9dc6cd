"""Hardware profiles: one TOML file per device, every number with its units in its name and a
source beside it.

File layout (see `analyzer/profiles/h100.toml` for a complete one)::

    name = "NVIDIA H100 SXM5 80 GB"
    kind = "gpu"                       # cpu | gpu | tpu | npu
    source = "where the device facts come from"

    [compute]                          # dense peaks, no structured sparsity
    peak_fp32_tflops = 66.9
    peak_tf32_tflops = 494.7           # a precision the device lacks is left out
    peak_fp16_tflops = 989.4
    peak_bf16_tflops = 989.4
    peak_int8_tops = 1978.9
    source = "..."

    [[memory]]                         # fastest first; the last level is main memory
    name = "L2"
    size_bytes = 52428800              # left out for main memory (unbounded)
    bandwidth_gbps = 5500.0            # GB/s, 1e9 bytes per second
    energy_pj_per_byte = 2.0
    source = "..."

    [overhead]
    kernel_launch_us = 4.0             # fixed cost per fused group (launch or dispatch)
    source = "..."

    [power]
    static_w = 100.0                   # drawn whenever the device is busy, whatever it does
    tdp_w = 700.0
    compute_pj_per_flop_fp32 = 0.6     # per precision; missing ones scale from fp32
    source = "..."

    [efficiency]                       # achievable fraction of peak per op class, uncalibrated
    conv = 0.6
    gemm = 0.7
    ...
    source = "..."

    [runtime]                          # optional: what a calibration measured of a runtime
    name = "ort-cpu"                   # whose kernels the estimate models (RUNTIMES)
    transcendental_flops = 5.0         # τ: plain vector FLOPs per exp / tanh / erf
    copy_run_ns = 9.8                  # per contiguous run a Transpose copies
    cold_weight_gbps = 16.0            # rate of a network's cold weight fetches; 0: not measured
    cold_line_ns = 18.0                # per line fetched cold one at a time (a depthwise filter)
    cold_kernel_us = 1.0               # per kernel whose state the run evicted
    denormal_factor = 1.0              # MatMul slowdown on float32 denormal operands
    norm_row_ns = 14.0                 # per row a row-wise norm (LayerNorm, Softmax) reduces
    copy_element_ns = 2.2              # per element a Transpose copies one at a time
    libm_call_ns = 6.3                 # per value a kernel passes to libm alone (a tanhf)
    copy_gbps = {reorder = 87.0}       # GB/s of a blocked copy class (COPY_CLASSES)
    copy_fixed_ns = {Slice = 159.0}    # a lone copy kernel's fixed cost beyond the launch
    copy_part_ns = 118.0               # per Split output / Concat input beyond the first
    per_call_classes = ["dequantize"]  # classes whose curves were fitted per call

    [extra]                            # optional facts behind the numbers (cores, clocks, ...)

A CPU's `[compute]` may give `simd_bits`, its fp32 vector width (ONNX Runtime's NCHWc block
is one vector).

Peaks are per precision; int8 is in TOP/s under `peak_int8_tops`. A memory level is listed
only if data stays in it from one fused group to the next (a GPU's L1/shared memory does not
outlive a kernel, so GPU profiles start at L2). `--hardware file.yaml` reads the same layout
as YAML when PyYAML is installed. `profile_to_toml` writes a profile back in this layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import OnnxLensError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8")
# Not a what-if: each group at the precision its graph stores and computes (analyzer.estimate).
GRAPH = "graph"
# Storage bytes per element of each precision (tf32 is stored as fp32).
PRECISION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int8": 1}
# The op classes an estimate distinguishes; `analyzer.runtimes.op_class` maps groups to them.
OP_CLASSES = ("conv", "depthwise", "gemm", "attention", "elementwise", "normalization",
              "pool", "reduce", "data_movement")
# Finer classes a calibration may measure; a profile without them uses the class given here
# (a grouped convolution is a convolution to a profile that does not tell them apart).
SUBCLASS_OF = {"grouped_conv": "conv", "grouped_conv_nchwc": "conv", "conv_int8": "conv",
               "depthwise_nchw": "grouped_conv",
               "depthwise_int8": "depthwise",
               "gemm_int8": "gemm", "gemv_int8": "gemm_int8", "gemm_int8_unpacked": "gemm_int8",
               "conv_integer": "conv",
               "gemm_s8s8": "gemm",
               "grouped_conv_integer": "conv",
               "gemm_nbits": "gemm", "gemv_nbits": "gemm", "conv_int8_im2col": "conv",
               "conv_unpacked": "conv",
               "gqa_decode": "gemm", "native_nbits": "gemm", "native_gqa": "attention",
               "moe": "gemm", "qmoe": "gemm", "where": "elementwise",
               "skip_normalization": "normalization", "skip_rms_normalization": "normalization",
               "softmax": "normalization",
               "softmax_int8": "normalization",
               "elementwise_int8": "elementwise", "gelu": "elementwise", "quantize": "elementwise",
               "dequantize": "elementwise", "reduce_squares": "reduce",
               "reorder": "data_movement",
               "blocked_transpose": "data_movement"}


def lineage(cls: str) -> Iterator[str]:
    """`cls`, then its parent, its parent's parent, ... (`SUBCLASS_OF`), nearest first."""
    ancestor: str | None = cls
    while ancestor is not None:
        yield ancestor
        ancestor = SUBCLASS_OF.get(ancestor)


# MLAS's blocked copies, which shuffle vectors between planes rather than stream: ORT's NCHWc
# layout changes (ReorderInput / ReorderOutput) and its Transpose that moves one axis past the
# innermost (NCHW <-> NHWC, MlasTranspose). Each streams at a rate of its own, which a
# calibration fits on its benchmarks (`Runtime.copy_gbps`): measured (ORT 1.31, Zen 5, 1
# thread) the Transposes of 1-1.2 MB at 44-54 GB/s where the L2 and L3 bandwidths were 135
# and 95, a ReorderInput padding 8 channels to 16 at 50, the other reorders at 76-126.
REORDER, BLOCKED_TRANSPOSE = "reorder", "blocked_transpose"
COPY_CLASSES = (REORDER, BLOCKED_TRANSPOSE)
# A runtime's kernels whose MACs multiply integers (ORT's QLinearConv, QGemm,
# DynamicQuantizeMatMul) are classes of their own, their efficiencies fractions of the int8
# peak: measured by `onnxlens calibrate`, never assumed from the float kernels' rates.
# ConvInteger (quantize_dynamic's Conv) is a class apart: ORT runs it on a path of its own,
# measured 4-5x slower than a float Conv on this host (AVX-512 VNNI), where QLinearConv is
# 3x faster.
INT8_CLASS = {"conv": "conv_int8", "depthwise": "depthwise_int8", "gemm": "gemm_int8"}
CONV_INTEGER = "conv_integer"
# A QLinearConv, QLinearMatMul or QGemm on int8 activations (quantize_static's default in the
# QOperator format): on x86 MLAS has no fast int8 x int8 GEMM short of AVX-VNNI-INT8 and runs
# them in its portable one, measured (ORT 1.31, Zen 5) 13-19 GMAC/s in three models, 15-30x
# slower than with uint8 activations: a class of its own.
GEMM_S8S8 = "gemm_s8s8"
# An integer GEMM of one row (a batch-1 decode step's DynamicQuantizeMatMul or QGemm): MLAS's
# uint8 x int8 kernel on one row of A runs without the per-call cost that the multi-row GEMMs
# fit into `gemm_int8`'s f_half (0.86 us: their A packing, a cost per row block), at the rate
# of its weights' bytes. Measured (ORT 1.31, 1 thread, Zen 5), the whole kernel less a
# launch: [1, 128] x [128, 128] 0.64 us, [1, 128] x [128, 256] 0.81, [1, 1024] x [1024, 1024]
# 10.1 (102 GMAC/s), where gemm_int8's curve read 2.7 us for the first. A class of its own,
# read as `gemm_int8` by a calibration without it.
GEMV_INT8 = "gemv_int8"
# An integer product of two activations (a quantized attention's Q·Kᵀ and P·V: QLinearMatMul,
# or a QDQ MatMul without weights), one call per head: ORT packs B at every call, where a
# weight is packed once at load. Measured (ORT 1.31, 1 thread, Zen 5, QDQ u8 x u8): 8, 12 and 4
# heads of [128, 32] x [32, 128], [64, 64] x [64, 64], [256, 64] x [64, 256] at 97-133 GMAC/s,
# a weights GEMM of as many MACs ([64, 256] x [256, 256]) at 363. A class of its own, read as
# `gemm_int8` by a calibration without it.
GEMM_INT8_UNPACKED = "gemm_int8_unpacked"
# ORT's MatMulNBits at accuracy_level 4 over more than one row (MLAS's CompInt8 kernel:
# int8 VNNI dot products on 4-bit weights unpacked per block, with per-block scale work):
# measured (ORT 1.31, Zen 5) at 0.25 of the int8 GEMMs' peak, a class of its own.
GEMM_NBITS = "gemm_nbits"
# The same at one row of A (a batch-1 decode step): a GEMV over the 4-bit weights, whose
# per-call work (A quantized per block, the kernel's setup) the fp32 `gemm` curve it was read
# at does not have. Measured (ORT 1.31, 1 thread, Zen 5, chains of the node): [1, 128] x
# [128, 128] 0.90 us a kernel, [1, 256] x [256, 256] 1.63, where `gemm` read 0.44 / 1.24. A
# class of its own, read as `gemm` by a calibration without it.
GEMV_NBITS = "gemv_nbits"
# ORT's GroupQueryAttention at one new token (a decode step): per query head it copies its KV
# head's past into the present and runs one score at a time, a dot product of the head size
# for Q·Kᵀ and an axpy for P·V, in SSE loops outside MLAS's AVX-512 kernels (`ort_attention.
# decode_kernel`): measured (ORT 1.31, Zen 5) 8.3 ns a score at head size 32, 0.06 of the fp32
# peak, where the gemm curve's per-call term read each head's products as 1.4 us calls.
GQA_DECODE = "gqa_decode"
# ORT's MoE and QMoE (com.microsoft) on CPU: per picked expert an unpacked MlasGemm for fc1
# (B transposed and packed at each call), a scalar SwiGLU loop over its inter values (std::exp,
# a divide and clamps: measured ~12 ns a value, ORT 1.31, Zen 5), fc2's MlasGemm, a scalar
# weighted scatter (`ort_moe.moe_kernel`); QMoE's 4-bit experts run measured 1.15-1.4x MoE's
# time at prefill. Their prefills ran at ~25 GMAC/s where the gemm curve read ~100: classes
# of their own.
MOE, QMOE = "moe", "qmoe"
# ORT's Where on CPU: two broadcast select passes (cond ? X : 0, !cond ? Y : 0) into
# temporaries and a merge pass, in Eigen's scalar selects (`ort_cpu.where_passes`): measured
# (ORT 1.31, Zen 5) 0.6-0.8 ns an element over [4, 128, 128] (an encoder's SDPA guard, Where(
# IsNaN(p), 0, p)), 2.5x what the elementwise curve read for it: a class of its own.
WHERE = "where"
# The native executor's own decoder kernels (backends/native/kernel_model.py), each measured
# on benchmarks of its own that only a native-cpu calibration times: MatMulNBits (k_nbits.cpp:
# the 4-bit weights converted to floats as it multiplies, in C++ the compiler vectorizes) and
# GroupQueryAttention (k_attention.cpp: one query row at a time, a dot product and an axpy of
# the head size a score). Measured (1 thread, Zen 5) at 0.25-0.45x and 0.33x of the gemm and
# attention curves' times they were read at.
NATIVE_NBITS, NATIVE_GQA = "native_nbits", "native_gqa"
# A grouped or depthwise ConvInteger: ORT runs an im2col and an unpacked MlasGemm per image and
# group (conv_integer.cc), read per call (`ort_cpu.group_gemms`). Measured (ORT 1.31, 1 thread,
# Zen 5) ~20 us per 3x3 channel at 48x48 or 56x56, 2 GOPS: MobileNetV2's 17 depthwise
# ConvIntegers are 30 of its 42 ms; at a dense ConvInteger's rate they read 5x too fast.
GROUPED_CONV_INTEGER = "grouped_conv_integer"
# A dense QLinearConv on uint8 that MLAS's symmetric convolution kernel does not take (the
# stem's 3 input channels: `ort_cpu.symmetric_conv`): an im2col and a QGEMM, whose short K
# (27 for a 3x3 stem) sets its rate. Measured (ORT 1.31, Zen 5): MobileNetV2's stem ~0.3 ms
# for 10.8 M MACs, ResNet-18's ~0.9 ms for 118 M, where conv_int8's curve read 0.05 and 0.3.
CONV_INT8_IM2COL = "conv_int8_im2col"
# A float Conv whose weights are computed at run time (a DequantizeLinear's output: the
# float kernel of a QDQ unit ORT leaves unfused): ORT can neither prepack them nor reorder
# them to NCHWc (its NchwcTransformer and Conv's PrePack want constant weights), so MLAS's
# NCHW convolution (im2col, SGEMM packing them per call) runs it. Measured (ORT 1.31, Zen 5,
# ResNet-18 QDQ with int8 activations): its 11 float Convs 1.3-1.5x the NCHWc rate's time.
CONV_UNPACKED = "conv_unpacked"
INT8_CLASSES = (*INT8_CLASS.values(), CONV_INTEGER, GEMM_S8S8, GEMM_NBITS, GROUPED_CONV_INTEGER,
                CONV_INT8_IM2COL, GEMV_INT8, GEMM_INT8_UNPACKED, GEMV_NBITS)
# The runtime whose kernels a profile's calibration measured (`Runtime.name`; the estimator
# then costs groups as that runtime's kernels); ORT_CPU is ONNX Runtime's CPU provider,
# NATIVE_CPU the project's executor: the runtimes `-H host` can be calibrated on.
ORT_CPU = "ort-cpu"
NATIVE_CPU = "native-cpu"
HOST_RUNTIMES = (ORT_CPU, NATIVE_CPU)
# The runtimes of a GPU profile: ONNX Runtime's CUDA provider and the native executor's CUDA
# kernels (a calibration of either, `onnxlens calibrate --backend ... --profile`, is made on a
# machine with that GPU; none has been validated on one).
ORT_CUDA = "ort-cuda"
NATIVE_CUDA = "native-cuda"
GPU_RUNTIMES = (ORT_CUDA, NATIVE_CUDA)
RUNTIMES = (*HOST_RUNTIMES, *GPU_RUNTIMES)
PROFILES_DIR = Path(__file__).parent / "profiles"
KINDS = ("cpu", "gpu", "tpu", "npu")


@dataclass(frozen=True, slots=True)
class Precision:
    """What a kernel runs at: `peak` names the profile peak its MACs run at (fp32, fp16, bf16,
    int8), `byte_scale` scales the graph's bytes. The graph's own precision (GRAPH) keeps the
    bytes as stored and runs each group's MACs at the precision that does them (a QDQ Conv's
    uint8 x int8 at int8, an fp16 model's at fp16: `analysis.group_precisions`); a what-if
    (`what_if`) runs an fp32 graph at another precision, its bytes scaled to that width."""

    peak: str
    byte_scale: float = 1.0


def what_if(precision: str) -> Precision:
    """The fp32 graph's tensors and MACs at `precision` (fp16: half the bytes)."""
    return Precision(precision, PRECISION_BYTES[precision] / 4)


def stored(group_precision: str) -> Precision:
    """A group at the precision its graph gives (`cost.precision.group_precision`): floats by
    width (float16, bfloat16, else fp32: float8 types have no peak of their own in a profile),
    any integer type on the int8 units (int4 weights are unpacked to int8 to multiply)."""
    floats = {"float16": "fp16", "bfloat16": "bf16"}
    peak = "int8" if group_precision.startswith(("int", "uint")) else floats.get(
        group_precision, "fp32")
    return Precision(peak)


def precision_for(precision: str, group_precisions: Mapping[int, str]
                  ) -> Callable[[int], Precision]:
    """Group id -> what its kernels run at: under GRAPH, the group's own precision
    (`group_precisions`, float32 where not given); else the what-if `precision`."""
    if precision == GRAPH:
        return lambda g: stored(group_precisions.get(g, "float32"))
    if precision not in PRECISION_BYTES:
        raise UsageError(f"precision {precision!r}: expected one of "
                         f"{', '.join([GRAPH, *PRECISION_BYTES])}")
    at = what_if(precision)
    return lambda g: at


class HardwareProfileError(OnnxLensError):
    """A hardware profile file is missing, unreadable or has a bad field (named)."""


@dataclass(frozen=True, slots=True)
class MemoryLevel:
    name: str
    bandwidth_gbps: float
    size_bytes: int | None = None  # None: main memory, holds everything
    energy_pj_per_byte: float = 0.0
    source: str = ""


@dataclass(frozen=True, slots=True)
class Runtime:
    """What a calibration measured of the runtime it ran on, beyond peaks, bandwidths and
    efficiency curves (`analyzer.calibration` says how each is measured); the defaults are
    a profile nobody measured: no runtime's kernels, each transcendental one FLOP, nothing
    added per copied run or element, per normalized row, for cold weights or for
    denormals."""

    name: str | None = None  # ORT_CPU, NATIVE_CPU, ...: whose kernels the estimate models
    transcendental_flops: float = 1.0  # τ: plain vector FLOPs one exp / tanh / erf costs
    copy_run_ns: float = 0.0  # per contiguous run a Transpose copies, beyond its bytes
    cold_weight_gbps: float = 0.0  # rate of a network's cold weight fetches; 0: not measured
    cold_line_ns: float = 0.0  # per cache line fetched cold one at a time; 0: not measured
    cold_kernel_us: float = 0.0  # per kernel whose state a run evicted; 0: not measured
    run_call_us: float = 0.0  # a run call's own fixed cost, once a model; 0: not measured
    # A small copy kernel's fixed cost beyond the launch, by op type, and per part (Split's
    # output, Concat's input) beyond the first (`copy_fixed_s`); none: nothing added.
    copy_fixed_ns: dict[str, float] = field(default_factory=dict)
    copy_part_ns: float = 0.0
    denormal_factor: float = 1.0  # a MatMul's slowdown on float32 denormal operands
    norm_row_ns: float = 0.0  # per row a row-wise normalization reduces, beyond its FLOPs
    copy_element_ns: float = 0.0  # per element a Transpose copies one at a time
    libm_call_ns: float = 0.0  # per value a kernel passes to a scalar libm function alone
    # GB/s of each blocked copy class (COPY_CLASSES) the calibration fitted; a class not in
    # it streams at its memory level's bandwidth.
    copy_gbps: dict[str, float] = field(default_factory=dict)
    # The classes whose curves the calibration read per call (its benchmarks of them made
    # several calls: a grouped ConvInteger, a per-axis QuantizeLinear); the others per kernel.
    per_call_classes: frozenset[str] = frozenset()

    def copy_fixed_s(self, op: str, parts: int) -> float:
        """Seconds a lone copy kernel of `op` pays beyond the launch, with `parts` parts beyond
        its first (0 for an op not measured)."""
        return (self.copy_fixed_ns.get(op, 0.0) + parts * self.copy_part_ns) * 1e-9


@dataclass(frozen=True)
class HardwareProfile:
    key: str  # how users name it: the file stem, "h100"
    name: str
    kind: str
    source: str
    peak_tflops: dict[str, float]  # precision -> dense peak in TFLOP/s (int8: TOP/s)
    memory: tuple[MemoryLevel, ...]  # fastest first; last is main memory
    kernel_launch_us: float
    static_w: float
    tdp_w: float
    compute_pj_per_flop: dict[str, float]  # precision -> pJ per FLOP
    efficiency: dict[str, float]  # op class -> achievable fraction of peak
    calibrated: bool = False
    sources: dict[str, str] = field(default_factory=dict)  # section -> source
    simd_bits: int | None = None  # a CPU's fp32 vector width ([compute] simd_bits)
    runtime: Runtime = Runtime()
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. cores, clocks of a CPU

    def peak_flops(self, precision: str) -> float:
        """Peak in FLOP/s (or OP/s for int8); a precision the device lacks falls back to the
        nearest wider one it has (fp16 -> fp32 on a CPU without fp16 units)."""
        for p in _FALLBACK[precision]:
            if p in self.peak_tflops:
                return self.peak_tflops[p] * 1e12
        raise HardwareProfileError(f"profile {self.key!r} has no peak for {precision}")

    def class_efficiency(self, cls: str) -> float:
        """The constant efficiency of op class `cls` (a subclass reads its nearest ancestor's)."""
        return self.efficiency[next((c for c in lineage(cls) if c in self.efficiency), cls)]

    def pj_per_flop(self, precision: str) -> float:
        if precision in self.compute_pj_per_flop:
            return self.compute_pj_per_flop[precision]
        # Energy per operation scales roughly with operand width (Horowitz, ISSCC 2014).
        return self.compute_pj_per_flop["fp32"] * PRECISION_BYTES[precision] / 4

    @property
    def main_memory(self) -> MemoryLevel:
        return self.memory[-1]

    @functools.cached_property
    def llc_share(self) -> MemoryLevel | None:
        """The last cache level as one run has it: its `size_bytes` the levels before it plus
        the run's share of it. A cache instance shared by C cores (a detected host's
        `extra["caches"]`: the CPUs sharing it over the CPUs per core) gives a run on c of them
        c / C of it, the other cores' work claiming the rest (measured, Zen 5 at one thread of
        two sharing a 32 MB L3, the other busy: GEMV chains of 2-16 MB re-read their weights
        at 85-96 GB/s, the L3's rate; of 24, 32 and 128 MB at 51, 46 and 33, main memory's
        coming in). Without those facts, the whole level; None: a profile without caches."""
        caches = [lv for lv in self.memory if lv.size_bytes is not None]
        if not caches:
            return None
        llc, facts, extra = caches[-1], self.extra.get("caches") or [], self.extra
        try:  # the facts as host detection writes them; anything else: the whole level
            last = facts[-1] if len(facts) == len(caches) else {}
            size, instances = last["size_bytes"], last["instances"]
            cpus_per_core = extra["logical_cpus"] / extra["cores_available"]
            share = size * min(instances, extra["cores"] * cpus_per_core / last["cpus_sharing"])
        except (KeyError, TypeError, ZeroDivisionError):
            return llc
        below = llc.size_bytes - size * instances  # the levels before it
        return dataclasses.replace(llc, size_bytes=below + round(share)) if below >= 0 else llc

    def memory_level(self, working_set_bytes: float) -> MemoryLevel:
        """The level a kernel streams its working set from: the first that holds it, the last
        cache at the run's share of it (`llc_share`), as `weights_level` reads it: measured (Zen
        5, one thread of two sharing a 32 MB L3), GEMV chains of 24-32 MB run at 45-51 GB/s,
        near main memory's 33, not the L3's 85-96 (`benchmarks/weight_residency.py`)."""
        llc = self.llc_share
        for level in self.memory:
            size = llc.size_bytes if llc is not None and level.name == llc.name else (
                level.size_bytes)
            if size is None or working_set_bytes <= size:
                return level
        return self.main_memory

    def evicted(self) -> HardwareProfile:
        """This profile where a run evicts every kernel's state (the runtime's kernel object,
        its arguments' records, its code) before the next run reaches that kernel: each
        kernel's overhead grows by the calibration's `runtime.cold_kernel_us`
        (`backends.calibrate.measure.cold_kernel_us`; ORT 1.31, Zen 5: 0.8-1.3 us)."""
        cold_us = self.kernel_launch_us + self.runtime.cold_kernel_us
        return dataclasses.replace(self, kernel_launch_us=cold_us)

    def weights_level(self, run_bytes: float) -> MemoryLevel:
        """Where a network's kernels fetch their weights from, read one run ago, when a run
        touches `run_bytes` (the weights its kernels read plus every tensor it materializes,
        each once: `memory.touched_bytes`): the last-level cache when they fit the run's share
        of it (`llc_share`), main memory otherwise. Measured (Zen 5, ORT 1.31, one thread):
        a small Qwen2's decode step touches 10-12 MB at contexts 128-1024 and ORT reads its
        weights at the L3's 80-85 GB/s at all of them, its time growing smoothly with the KV
        cache (it moves 12-24 MB: counting each read and write, the KV copies of its 8 query
        heads over 2 KV heads put a cliff at context 640 that the measurements do not have);
        ShuffleNet-V2 touches 34 MB (its peak of live activations is 1.7 MB) and reads its 4
        MB classifier at 36 GB/s, main memory's rate. Approximation, signed: a runtime whose
        arena reuses buffers touches less (8 MB of GEMVs beside 32 Relu / Neg stages through
        1 MB buffers come mostly from the L3), so it can land in main memory when it is not."""
        llc = self.llc_share
        if llc is not None and llc.size_bytes is not None and run_bytes <= llc.size_bytes:
            return llc
        return self.main_memory


_FALLBACK = {"fp32": ("fp32",), "tf32": ("tf32", "fp32"), "fp16": ("fp16", "fp32"),
             "bf16": ("bf16", "fp16", "fp32"), "int8": ("int8", "fp16", "fp32")}
PEAK_FIELDS = {p: "peak_int8_tops" if p == "int8" else f"peak_{p}_tflops" for p in PRECISIONS}
_SECTIONS = ("compute", "overhead", "power", "efficiency")
# The fields each part of a file may hold: anything else is a typo, reported by name.
_FIELDS = {
    "": {"name", "kind", "source", "calibrated", "memory", "extra", "runtime", *_SECTIONS},
    "compute": {"source", "simd_bits", *PEAK_FIELDS.values()},
    "memory": {"name", "size_bytes", "bandwidth_gbps", "energy_pj_per_byte", "source"},
    "overhead": {"kernel_launch_us", "source"},
    "power": {"static_w", "tdp_w", "source", *(f"compute_pj_per_flop_{p}" for p in PRECISIONS)},
    "efficiency": {"source", *OP_CLASSES, *SUBCLASS_OF},  # a subclass where calibrated
    "runtime": {f.name for f in dataclasses.fields(Runtime)},
}


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by key (`h100`), `host` (detected), or a TOML (or YAML) file."""
    text = str(name_or_path)
    if text == "host":
        from .host import host_profile

        return host_profile()
    path = Path(text)
    if not path.suffix and (PROFILES_DIR / f"{text}.toml").exists():
        path = PROFILES_DIR / f"{text}.toml"
    elif not path.is_file():
        raise HardwareProfileError(f"hardware {text!r}: no such profile or file (profiles: "
                                   f"host, {', '.join(available_profiles())})")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HardwareProfileError(f"{path}: cannot read ({e})") from None
    data = _parse_yaml(raw, path) if path.suffix in (".yaml", ".yml") else _parse_toml(raw, path)
    return profile_from_dict(data, key=path.stem, where=str(path))


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HardwareProfileError(f"{path}: not valid TOML ({e})") from None


def _parse_yaml(text: str, path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise HardwareProfileError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); "
                                   "TOML needs nothing") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise HardwareProfileError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{path}: expected a mapping at the top of the file")
    return data


def profile_from_dict(data: dict[str, Any], *, key: str, where: str) -> HardwareProfile:
    """Validate and build a profile; errors name the file and the field."""
    r = _Reader(data, where)
    r.known(data, "")
    compute = r.table("compute")
    peaks = {p: r.positive(compute, f, "compute") for p, f in PEAK_FIELDS.items()
             if f in compute}
    if "fp32" not in peaks:
        raise HardwareProfileError(f"{where}: compute.peak_fp32_tflops is required")
    levels = _memory_levels(r, data.get("memory"))
    overhead = r.table("overhead")
    power = r.table("power")
    energy = {p: r.non_negative(power, f"compute_pj_per_flop_{p}", "power")
              for p in PRECISIONS if f"compute_pj_per_flop_{p}" in power}
    if "fp32" not in energy:
        raise HardwareProfileError(f"{where}: power.compute_pj_per_flop_fp32 is required")
    static_w = r.non_negative(power, "static_w", "power")
    tdp_w = r.positive(power, "tdp_w", "power")
    if static_w > tdp_w:
        raise HardwareProfileError(f"{where}: power.static_w = {static_w} is more than "
                                   f"power.tdp_w = {tdp_w}")
    eff_table = r.table("efficiency")
    efficiency = {}
    for cls in (*OP_CLASSES, *(c for c in SUBCLASS_OF if c in eff_table)):
        value = r.positive(eff_table, cls, "efficiency")
        if value > 1:
            raise HardwareProfileError(f"{where}: efficiency.{cls} = {value} is over 1")
        efficiency[cls] = value
    extra = data.get("extra", {})
    if not isinstance(extra, dict):
        raise HardwareProfileError(f"{where}: extra must be a table")
    calibrated = data.get("calibrated", False)
    if not isinstance(calibrated, bool):
        raise HardwareProfileError(f"{where}: calibrated = {calibrated!r} must be true or false")
    return HardwareProfile(
        key=key, name=r.string(data, "name", ""), kind=r.choice(data, "kind", KINDS),
        simd_bits=r.whole(compute, "simd_bits", "compute") if "simd_bits" in compute else None,
        runtime=_runtime(r, data.get("runtime")),
        source=r.string(data, "source", ""), peak_tflops=peaks, memory=levels,
        kernel_launch_us=r.non_negative(overhead, "kernel_launch_us", "overhead"),
        static_w=static_w, tdp_w=tdp_w, compute_pj_per_flop=energy, efficiency=efficiency,
        calibrated=calibrated,
        sources={name: r.optional_string(data[name], "source", name) for name in _SECTIONS},
        extra=dict(extra))


def _runtime(r: _Reader, table: Any) -> Runtime:
    if table is None:
        return Runtime()
    if not isinstance(table, dict):
        raise HardwareProfileError(f"{r.where}: runtime must be a table")
    r.known(table, "runtime")
    name = table.get("name")
    if name is not None and name not in RUNTIMES:
        raise HardwareProfileError(f"{r.where}: runtime.name = {name!r}: expected one of "
                                   f"{', '.join(RUNTIMES)}")
    per_call = table.get("per_call_classes", [])
    if not isinstance(per_call, list) or not all(isinstance(c, str) for c in per_call):
        raise HardwareProfileError(f"{r.where}: runtime.per_call_classes must be a list of "
                                   "op class names")
    default = Runtime()
    return Runtime(
        name,
        transcendental_flops=r.positive(table, "transcendental_flops", "runtime",
                                        default.transcendental_flops),
        copy_run_ns=r.non_negative(table, "copy_run_ns", "runtime", default.copy_run_ns),
        cold_weight_gbps=r.non_negative(table, "cold_weight_gbps", "runtime",
                                        default.cold_weight_gbps),
        cold_line_ns=r.non_negative(table, "cold_line_ns", "runtime", default.cold_line_ns),
        cold_kernel_us=r.non_negative(table, "cold_kernel_us", "runtime",
                                      default.cold_kernel_us),
        run_call_us=r.non_negative(table, "run_call_us", "runtime", default.run_call_us),
        copy_fixed_ns=_copy_fixed_ns(r, table.get("copy_fixed_ns", {})),
        copy_part_ns=r.non_negative(table, "copy_part_ns", "runtime", default.copy_part_ns),
        denormal_factor=r.positive(table, "denormal_factor", "runtime", default.denormal_factor),
        norm_row_ns=r.non_negative(table, "norm_row_ns", "runtime", default.norm_row_ns),
        copy_element_ns=r.non_negative(table, "copy_element_ns", "runtime",
                                       default.copy_element_ns),
        libm_call_ns=r.non_negative(table, "libm_call_ns", "runtime", default.libm_call_ns),
        copy_gbps=_copy_gbps(r, table.get("copy_gbps", {})),
        per_call_classes=frozenset(per_call))


def _copy_fixed_ns(r: _Reader, table: Any) -> dict[str, float]:
    """runtime.copy_fixed_ns: a table of op type -> non-negative ns."""
    if not isinstance(table, dict):
        raise HardwareProfileError(f"{r.where}: runtime.copy_fixed_ns must be a table of "
                                   "op type -> ns")
    return {op: r.non_negative(table, op, "runtime.copy_fixed_ns", 0.0) for op in table}


def _copy_gbps(r: _Reader, table: Any) -> dict[str, float]:
    """runtime.copy_gbps: a table of COPY_CLASSES -> positive GB/s."""
    if not isinstance(table, dict) or not set(table) <= set(COPY_CLASSES):
        raise HardwareProfileError(f"{r.where}: runtime.copy_gbps must be a table of "
                                   f"{', '.join(COPY_CLASSES)} -> GB/s")
    return {cls: r.positive(table, cls, "runtime.copy_gbps") for cls in table}


def _memory_levels(r: _Reader, memory: Any) -> tuple[MemoryLevel, ...]:
    if not isinstance(memory, list) or not memory:
        raise HardwareProfileError(f"{r.where}: [[memory]] needs at least one level")
    levels: list[MemoryLevel] = []
    for i, level in enumerate(memory):
        section = f"memory[{i}]"
        if not isinstance(level, dict):
            raise HardwareProfileError(f"{r.where}: {section} must be a table")
        r.known(level, "memory", section)
        last = i == len(memory) - 1
        size = None if last and "size_bytes" not in level else r.whole(level, "size_bytes",
                                                                        section)
        previous = levels[-1].size_bytes if levels else None
        if previous is not None and size is not None and size <= previous:
            raise HardwareProfileError(
                f"{r.where}: {section}.size_bytes = {size} must be larger than "
                f"memory[{i - 1}].size_bytes = {previous} (fastest level first)")
        levels.append(MemoryLevel(r.string(level, "name", section),
                                  r.positive(level, "bandwidth_gbps", section), size,
                                  r.non_negative(level, "energy_pj_per_byte", section, 0.0),
                                  r.optional_string(level, "source", section)))
    return tuple(levels)


def profile_to_dict(hw: HardwareProfile) -> dict[str, Any]:
    """The file layout of a profile, as plain data (`profile_from_dict` reads it back)."""
    levels = []
    for lv in hw.memory:
        level: dict[str, Any] = {"name": lv.name}
        if lv.size_bytes is not None:
            level["size_bytes"] = lv.size_bytes
        levels.append({**level, "bandwidth_gbps": lv.bandwidth_gbps,
                       "energy_pj_per_byte": lv.energy_pj_per_byte, "source": lv.source})
    power: dict[str, Any] = {"static_w": hw.static_w, "tdp_w": hw.tdp_w}
    power.update({f"compute_pj_per_flop_{p}": v for p, v in hw.compute_pj_per_flop.items()})
    data: dict[str, Any] = {
        "name": hw.name, "kind": hw.kind, "source": hw.source, "calibrated": hw.calibrated,
        "compute": {PEAK_FIELDS[p]: v for p, v in hw.peak_tflops.items()}
        | ({} if hw.simd_bits is None else {"simd_bits": hw.simd_bits}),
        "memory": levels,
        "overhead": {"kernel_launch_us": hw.kernel_launch_us},
        "power": power,
        "efficiency": dict(hw.efficiency),
    }
    for name in _SECTIONS:
        data[name]["source"] = hw.sources.get(name, "")
    if hw.runtime != Runtime():
        # per_call_classes as a sorted list: TOML has no sets
        data["runtime"] = {k: sorted(v) if isinstance(v, frozenset) else v
                           for k, v in dataclasses.asdict(hw.runtime).items() if v is not None}
    if hw.extra:
        data["extra"] = dict(hw.extra)
    return data


def profile_to_toml(hw: HardwareProfile) -> str:
    """The profile as TOML text in the file layout; `load_profile` reads it back equal."""
    data = profile_to_dict(hw)
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items()
             if not isinstance(v, dict | list)]
    for name in _SECTIONS:
        lines += ["", f"[{name}]", *_toml_pairs(data[name])]
    for level in data["memory"]:
        lines += ["", "[[memory]]", *_toml_pairs(level)]
    for name in ("runtime", "extra"):
        if name in data:
            lines += ["", f"[{name}]", *_toml_pairs(data[name])]
    return "\n".join(lines) + "\n"


def _toml_pairs(table: dict[str, Any]) -> list[str]:
    return [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]


def _toml_key(key: str) -> str:
    bare = bool(key) and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else _toml_string(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise HardwareProfileError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@dataclass(frozen=True)
class _Reader:
    data: dict[str, Any]
    where: str

    def _name(self, section: str, key: str) -> str:
        return f"{section}.{key}" if section else key

    def known(self, table: dict[str, Any], part: str, section: str | None = None) -> None:
        """Every key of `table` is a field `part` may hold (a typo names itself)."""
        unknown = sorted(set(map(str, table)) - _FIELDS[part])
        if unknown:
            where = section if section is not None else part
            raise HardwareProfileError(
                f"{self.where}: unknown field {self._name(where, unknown[0])} (expected one "
                f"of {', '.join(sorted(_FIELDS[part]))})")

    def table(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        if not isinstance(value, dict):
            raise HardwareProfileError(f"{self.where}: missing table [{name}]")
        self.known(value, name)
        return value

    def string(self, table: dict[str, Any], key: str, section: str) -> str:
        value = table.get(key)
        if not isinstance(value, str) or not value:
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} must be a "
                                       "non-empty string")
        return value

    def optional_string(self, table: dict[str, Any], key: str, section: str) -> str:
        value = table.get(key, "")
        if not isinstance(value, str):
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value!r} "
                                       "must be a string")
        return value

    def choice(self, table: dict[str, Any], key: str, options: tuple[str, ...]) -> str:
        value = self.string(table, key, "")
        if value not in options:
            raise HardwareProfileError(f"{self.where}: {key} = {value!r}, expected one of "
                                       f"{', '.join(options)}")
        return value

    def _number(self, table: dict[str, Any], key: str, section: str,
                default: float | None) -> float:
        if key not in table:
            if default is not None:
                return default
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} is required")
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value!r} "
                                       "is not a finite number")
        return float(value)

    def positive(self, table: dict[str, Any], key: str, section: str,
                 default: float | None = None) -> float:
        value = self._number(table, key, section, default)
        if value <= 0:
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value} "
                                       "must be positive")
        return value

    def whole(self, table: dict[str, Any], key: str, section: str) -> int:
        value = self.positive(table, key, section)
        if not value.is_integer():
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value} "
                                       "must be a whole number")
        return int(value)

    def non_negative(self, table: dict[str, Any], key: str, section: str,
                     default: float | None = None) -> float:
        value = self._number(table, key, section, default)
        if value < 0:
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value} "
                                       "must not be negative")
        return value
