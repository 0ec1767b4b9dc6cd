"""This host's calibration: measured efficiency curves, memory bandwidths and kernel overhead.

`onnxlens calibrate` (`backends/calibrate/`: catalogue, measure, fit) times single-op
micro-benchmarks through ONNX Runtime's CPU provider and fits what is stored here; this module
only holds, reads and writes that data (the analyzer never runs a model). A calibration is a
JSON file in the user's cache dir (`$ONNXLENS_CACHE`, else `$XDG_CACHE_HOME/onnxlens`, else
`~/.cache/onnxlens`) named by host and thread count: ``calibration-<host>-t<threads>.json``.

What it holds:

- `curves`: per op class, the achieved fraction of the fp32 peak (`peak_fp32_tflops`, the peak
  the curves are fractions of) as a function of a group's FLOPs F and intensity I (FLOP/byte):

      eff(F, I) = e_max · F / (F + f_half) · I / (I + i_half · level_factor[level(F / I)])

  The first factor is a fixed cost per kernel call t0 (packing, loop set-up, a partial last
  tile): t = t0 + F / (e_max·peak) is exactly this with f_half = e_max·peak·t0. The second is
  operand reuse: a kernel with little work per byte (a skinny GEMM, a 1x1 convolution with few
  channels) stalls on loads and stores even when its data sits in cache. f_half or i_half 0
  drops that factor; an intensity above the largest the curve was fitted on (`i_max`) is read
  as that one, so a curve never extrapolates. The level factor says how much more reuse a
  kernel needs when its working set lives further away: F / I is the group's traffic in
  bytes, `level` the memory level it fits in by the estimator's rule; a 1x1 convolution
  streaming from the last-level cache stalls where the same one held in L2 does not, while a
  3x3 convolution with a hundred FLOPs per byte runs at the same rate from either (measured:
  a factor on the efficiency itself slowed the second as much as the first). 1 for a level
  not fitted.
  Classes: those with multiply-accumulates (conv, depthwise, grouped_conv, gemm, attention),
  whose curves rate all the work of their kernels (MACs and the epilogue: bias, activation);
  `elementwise`, which the estimator applies to kernels without MACs other than a pool,
  normalization or reduction, and which is fitted on the benchmarks without MACs of the
  classes that have no curve of their own (elementwise ops, data movement); and
  `pool`, `normalization`, `skip_normalization` (ORT's SkipLayerNormalization),
  `skip_rms_normalization` (its SkipSimplifiedLayerNormalization), `softmax`
  (ORT's, MLAS's vectorized row loops, where its LayerNormalization's are scalar), `reduce`, each
  fitted on its own benchmarks when it has enough (a class without a curve reads
  `elementwise`'s, a subclass without one its parent's: `grouped_conv` `conv`'s). The int8
  classes (`conv_int8`, `depthwise_int8`, `gemm_int8`, `conv_integer`: ORT's quantized
  kernels, timed on graphs quantized by onnxruntime.quantization) are fractions of
  `peak_int8_tops`, the profile's int8 peak raised to the best int8 rate measured.
  The curves of classes without MACs read F as vector work in plain-FLOP equivalents
  (`Cost.vector_flops` at `transcendental_flops`), and `elementwise`'s has no reuse factor
  (i_half 0): an elementwise op reuses nothing, its traffic is the memory term's alone. (Given
  one, it turned into a second, slower bandwidth: at low I, F / (e·peak) with I / (I + i_half)
  is bytes · i_half / (e_max·peak), which fitted to Erf's rate made a Relu 6x too slow.)
- `bandwidth_gbps`: per memory level of the host profile, the streaming rate measured on ops
  whose traffic fits that level (and not the one before), in GB/s.
- `kernel_overhead_us`: the time the runtime spends per kernel besides the kernel's work.
- `transcendental_flops`: what one transcendental evaluation (exp, tanh, erf, a sigmoid)
  costs in plain vector FLOPs on this host (AVX2 here: about 5), fitted with the vector curve
  and the bandwidths (a Relu streams at the bandwidth, a Sigmoid of the same bytes and FLOP
  count does not). The calibrated profile carries it as `runtime.transcendental_flops`; the
  estimator then costs a group's FLOPs without MACs as `Cost.vector_flops` of it. A file
  without it reads 1 (each transcendental one FLOP).
- `cold_weight_gbps`: the rate at which a network's kernels read weights the caches did not keep
  since the last inference (`backends.calibrate.measure.cold_weight_gbps`: a chain of Convs with
  a weight per layer against the same chain sharing one, timed at one thread; at T threads
  `cold_weight_rate`: T times that, up to main memory's bandwidth). Every micro-benchmark runs
  one kernel over and over, its weights hot; in a network each weight is read once per
  inference. The calibrated profile carries it as `runtime.cold_weight_gbps`, and
  `estimate_model` adds each kernel's weight fetch at that rate (`cold_weights`), or, for a
  network whose run touches less than its share of the last-level cache, at that cache's
  bandwidth (`HardwareProfile.weights_level`: its weights are still there from the last run;
  the chains, 17-19 MB of weights each, touch 21-26 MB a run with their activations, more
  than a one-thread run's 17.9 MB share here). A file without it reads 0 (not measured:
  nothing added).
- `cold_line_ns`: what a depthwise NCHWc kernel pays per line of a filter the caches did not
  keep since the last inference, beyond its time with the filter in cache
  (`backends.calibrate.measure.cold_line_ns`: depthwise chains with a Relu over 32 MB between
  runs, a filter per layer against one shared, profiled per kernel). MLAS walks a depthwise
  filter a tap at a time, a line per tap and block of channels, and the fetch does not overlap
  (Zen 5, ORT 1.31: EdgeNeXt's 9x9 168@7, 891 lines, 22 us with the filter in cache, 56 cold).
  The calibrated profile carries it as `runtime.cold_line_ns`; `estimate_model` adds it per
  line (`Kernel.cold_lines`) where the run's weights come from main memory. A file without it
  reads 0 (nothing added).
- `cold_kernel_us`: what each kernel pays beyond `kernel_overhead_us` when a run has evicted
  its state since the last (the runtime's kernel object, its arguments' records, its code):
  `backends.calibrate.measure.cold_kernel_us`, Relu chains on 16 floats of two lengths with
  and without a Relu over 32 MB between runs, profiled, the difference of their slopes. The
  Relu chains that fit the overhead run hot; a network that moves more than the last-level
  cache runs every kernel cold. The calibrated profile carries it as `runtime.cold_kernel_us`;
  `estimate_model` adds it per kernel where the run's weights come from main memory
  (`HardwareProfile.evicted`). A file without it reads 0 (nothing added).
- `run_call_us`: the fixed cost of one run call, whatever its kernels: the intercept of the
  run time over the Relu chains' length (the fit that gives `kernel_overhead_us` its slope),
  which every benchmark's point has taken out. A model's measured latency holds it once;
  `estimate_model` adds it to the model's total, in no group. ORT 1.31, Zen 5, one thread:
  2.0-2.3 us, outputs of dynamic shape (ORT allocates them each run) adding nothing
  measurable: 2% of a tiny decoder's decode step. A file without it reads 0 (nothing added).
- `copy_fixed_ns`, `copy_part_ns`: what a small copy kernel (Slice, Gather, Expand, Split,
  Concat) pays inside a graph beyond a kernel's overhead, per op type, and Split and Concat
  per part (output or input) beyond their first: `backends.calibrate.fit.fit_copy_fixed`,
  from chains of them on 128 floats (`catalogue.copy_chain`), unprofiled. The calibrated
  profile carries them as `runtime.copy_fixed_ns` and `runtime.copy_part_ns`; the estimator
  adds them to a lone node's kernel of that op (`Kernel.op`, `Kernel.parts`). A file without
  them reads {} and 0 (nothing added).
- `copy_run_ns`: what ORT's Transpose pays per contiguous run it copies, and a broadcasting
  elementwise op per span it makes a vector call for, beyond the bytes at the bandwidth
  (`backends.calibrate.fit.fit_copy_run`, from the calibration's transposes and per-channel
  Muls; `analyzer.runtimes.ort_cpu.transpose_runs` and `broadcast_spans` count them). The
  calibrated profile carries it as `runtime.copy_run_ns`; a file without it reads 0.
- `copy_element_ns`: what ORT's Transpose pays per element it copies one at a time (a
  permutation that moves the innermost axis other than alone: `transpose_elements`), beyond
  the bytes at the bandwidth (`backends.calibrate.fit.fit_copy_element`). The calibrated
  profile carries it as `runtime.copy_element_ns`; a file without it reads 0 (nothing added).
- `copy_gbps`: the rate of each of MLAS's blocked copies (`hardware.COPY_CLASSES`: NCHWc
  reorders, NCHW <-> NHWC Transposes), all its benchmarks' bytes over all their time
  (`backends.calibrate.fit.fit_copy_rates`); the calibrated profile carries it as
  `runtime.copy_gbps`, read where below the level's bandwidth. A file without it, or a class
  without benchmarks, streams such a copy at its level's bandwidth, as before.
- `libm_call_ns`: what ORT pays per value one of its kernels passes to a scalar libm function
  alone (GroupQueryAttention's softcap: a tanhf per score, `ort_attention.row_softmax`), from
  the catalogue's GQA prefills with and without a softcap: each pair's difference over its
  scores (`backends.calibrate.fit.fit_libm_call`). The calibrated profile carries it as
  `runtime.libm_call_ns`; a file without it reads 0 (nothing added).
- `norm_row_ns`: what ORT's row-wise normalization kernels (LayerNormalization and its
  simplified form, Softmax) pay per row beyond their FLOPs at the `normalization` curve's
  rate (`backends.calibrate.fit.fit_norm_rows`, from the calibration's normalizations, whose
  points then fit the curve less that time; `analyzer.runtimes.ort_cpu.normalized_rows`
  counts a kernel's rows). The calibrated profile carries it as `runtime.norm_row_ns`; a file
  without it reads 0 (nothing added).
- `denormal_factor`: how much slower a MatMul runs when its left operand is all float32
  denormals (1e-40) than on normal numbers (time_denormal / time_normal, one micro-benchmark;
  x86 cores take a microcode assist per denormal operand). The calibrated profile carries it as
  `runtime.denormal_factor`; the estimator charges it to MatMuls that read a masked softmax's
  denormal probabilities (`analyzer.runtimes.ort_cpu.denormal_reads`). A file without it reads 1.
- `backend`: the runtime measured (`ort-cpu`, or `native-cpu`, the project's executor); the
  calibrated profile carries it as `runtime.name`, and the estimator then costs groups as
  that runtime's kernels (`analyzer.estimate`). Non-ORT calibrations are saved under a name
  of their own, ``calibration-<host>-t<threads>-<backend>.json``.

`calibrated_host(threads)` gives the `host` profile with these numbers in place of its assumed
ones and `Calibration.efficiency` as the estimator's efficiency; without a calibration file it
gives the detected profile, labelled uncalibrated (`calibrated` False).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .cost.base import Cost
from .errors import OnnxLensError, UsageError
from .hardware import (
    CONV_UNPACKED,
    GPU_RUNTIMES,
    GQA_DECODE,
    HOST_RUNTIMES,
    INT8_CLASSES,
    MOE,
    NATIVE_GQA,
    NATIVE_NBITS,
    OP_CLASSES,
    ORT_CPU,
    QMOE,
    RUNTIMES,
    HardwareProfile,
    MemoryLevel,
    Runtime,
    lineage,
    load_profile,
)
from .host import detect_cpu, host_profile, replace_measured

SCHEMA = "onnxlens-calibration/2"  # 2: level factors scale i_half; grouped_conv; backend
# Op classes with multiply-accumulates get a curve of their own; the others use `elementwise`.
MAC_CLASSES = ("conv", "depthwise", "grouped_conv", "grouped_conv_nchwc", "depthwise_nchw", "gemm",
               "attention", CONV_UNPACKED, GQA_DECODE, MOE, QMOE, *INT8_CLASSES,
               NATIVE_NBITS, NATIVE_GQA)
VECTOR_CLASS = "elementwise"
# Classes without MACs that get a curve of their own when they have enough benchmarks.
OWN_VECTOR_CLASSES = ("pool", "normalization", "skip_normalization", "skip_rms_normalization",
                      "softmax", "softmax_int8", "gelu", "elementwise_int8", "quantize",
                      "dequantize", "reduce", "reduce_squares", "where")
DEFAULT_BACKEND = ORT_CPU
# Never predict less than this fraction of peak: a curve far outside its data must not blow up.
MIN_EFFICIENCY = 1e-4

# (op class, FLOPs, arithmetic intensity) -> achieved fraction of peak (the estimator's type).
EfficiencyFn = Callable[[str, float, float], float]


class CalibrationError(OnnxLensError):
    """A calibration file is unreadable or not a calibration."""


@dataclass(frozen=True, slots=True)
class Curve:
    """eff(F, I) = e_max · F/(F + f_half) · I/(I + i_half · level_factor) (module docstring)."""

    e_max: float
    f_half: float = 0.0  # FLOPs at which the per-call cost halves the efficiency; 0: none
    i_half: float = 0.0  # FLOP/byte at which low reuse halves the efficiency; 0: none
    i_max: float = math.inf  # intensities above the largest fitted one are read as it
    level_factors: dict[str, float] = field(default_factory=dict)  # level -> i_half factor
    points: int = 0  # micro-benchmarks it was fitted on
    log_error: float = 0.0  # mean |ln(measured / fitted)| over them

    def __call__(self, flops: float, intensity: float, level: str | None = None) -> float:
        eff = self.e_max
        if self.f_half:
            eff *= flops / (flops + self.f_half)
        if self.i_half:
            intensity = min(intensity, self.i_max)
            i_half = self.i_half * (self.level_factors.get(level, 1.0) if level else 1.0)
            eff *= intensity / (intensity + i_half)
        return max(eff, MIN_EFFICIENCY)


@dataclass(frozen=True, slots=True)
class Point:
    """One micro-benchmark: its cost by onnxlens's own formulas and its measured time."""

    name: str
    op_class: str
    macs: int
    other_flops: int
    bytes: int  # read + written, across the group's boundary
    seconds: float  # its kernels' time: session overhead and layout reorders taken out
    reuse: float = 0.0  # the intensity its curve reads where not FLOPs per byte (estimator's)
    calls: int = 1  # GEMM calls its kernel makes: its curve reads FLOPs / calls (estimator's)
    transcendental: int = 0  # of its other_flops, transcendental evaluations
    # Of those, the work of an activation its kernel runs as a pass over its output
    # (`analyzer.runtimes.ort_cpu.activation_passes`): FLOPs and transcendental evaluations.
    pass_flops: int = 0
    pass_transcendental: int = 0
    runs: int = 0  # contiguous runs its kernel copies one at a time (`transpose_runs`)
    rows: int = 0  # rows its kernel normalizes one at a time (`normalized_rows`)
    elements: int = 0  # elements its kernel copies one at a time (`transpose_elements`)
    libm_calls: int = 0  # values its kernels pass to libm one at a time (`row_softmax`)

    def cost(self) -> Cost:
        """Its kernel's cost as the estimator sees it (all its bytes counted as read), less
        the activation pass."""
        return Cost(self.macs, self.other_flops - self.pass_flops,
                    self.transcendental - self.pass_transcendental, self.bytes)

    def pass_cost(self) -> Cost:
        """The activation pass over its output: FLOPs only."""
        return Cost(other_flops=self.pass_flops, transcendental=self.pass_transcendental)


@dataclass(frozen=True)
class Calibration:
    host: str
    cpu: str
    threads: int
    peak_fp32_tflops: float  # the peak the curves are fractions of (int8 classes': below)
    gemm_tflops: float  # the largest square GEMM's rate (the naive one-peak estimate uses it)
    kernel_overhead_us: float
    bandwidth_gbps: dict[str, float]  # memory level name -> measured GB/s
    curves: dict[str, Curve]
    levels: list[tuple[str, int | None]]  # the profile's memory levels: name, size_bytes
    points: tuple[Point, ...] = ()
    ort_version: str = ""
    created: str = ""  # ISO 8601, UTC
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    backend: str = DEFAULT_BACKEND  # the runtime whose kernels were timed
    profile: str = ""  # the GPU profile a GPU runtime's timings calibrate ("": this CPU)
    denormal_factor: float = 1.0  # MatMul time on denormal / normal operands; 1: not measured
    transcendental_flops: float = 1.0  # plain vector FLOPs per transcendental; 1: not fitted
    cold_weight_gbps: float = 0.0  # a network's cold weight fetch; 0: not measured
    cold_line_ns: float = 0.0  # per depthwise filter line fetched cold; 0: not measured
    cold_kernel_us: float = 0.0  # per kernel whose state a run evicted; 0: not measured
    run_call_us: float = 0.0  # a run call's own fixed cost; 0: not measured
    copy_fixed_ns: dict[str, float] = field(default_factory=dict)  # copy op -> fixed ns
    copy_part_ns: float = 0.0  # per Split output / Concat input beyond the first; 0: not fitted
    copy_run_ns: float = 0.0  # per run a Transpose copies, span a broadcast calls; 0: not fitted
    norm_row_ns: float = 0.0  # a row-wise normalization's cost per row; 0: not fitted
    copy_element_ns: float = 0.0  # a Transpose's cost per element copied alone; 0: not fitted
    libm_call_ns: float = 0.0  # per value passed to libm alone (a tanhf); 0: not fitted
    copy_gbps: dict[str, float] = field(default_factory=dict)  # blocked copy class -> GB/s
    # The int8 peak the int8 classes' curves are fractions of: the profile's, raised to the
    # best int8 rate measured (`fit`); 0: not measured (the profile's stays).
    peak_int8_tops: float = 0.0

    def efficiency(self, cls: str, flops: float, intensity: float) -> float:
        """The estimator's `Efficiency`: fraction of `peak_fp32_tflops` for a group of class
        `cls` doing `flops` at `intensity`."""
        return self.curve(cls)(flops, intensity, self.level(flops / intensity if intensity
                                                            else 0.0))

    def level(self, nbytes: float) -> str:
        """The memory level `nbytes` of traffic fits in (the estimator's rule)."""
        for name, size in self.levels:
            if size is None or nbytes <= size:
                return name
        return self.levels[-1][0]

    def curve(self, cls: str) -> Curve:
        """Its class's curve, else its nearest calibrated ancestor's (`SUBCLASS_OF`)."""
        own = next((self.curves[c] for c in lineage(cls) if c in self.curves), None)
        if own is not None:
            return own
        if cls in MAC_CLASSES and "gemm" in self.curves:
            return self.curves["gemm"]
        return self.curves[VECTOR_CLASS]

    # ---- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["points"] = [asdict(p) for p in self.points]
        return {"schema": SCHEMA, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "calibration") -> Calibration:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise CalibrationError(f"{where}: not an onnxlens calibration (schema {SCHEMA})")
        try:
            fields = {k: v for k, v in data.items() if k != "schema"}
            fields["curves"] = {k: Curve(**v) for k, v in fields["curves"].items()}
            fields["points"] = tuple(Point(**p) for p in fields.get("points", ()))
            fields["bandwidth_gbps"] = {k: float(v) for k, v in fields["bandwidth_gbps"].items()}
            fields["levels"] = [(str(n), None if size is None else int(size))
                                for n, size in fields["levels"]]
            out = cls(**fields)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CalibrationError(f"{where}: malformed calibration ({e})") from None
        if VECTOR_CLASS not in out.curves:
            raise CalibrationError(f"{where}: no {VECTOR_CLASS!r} curve")
        return out

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the JSON (atomically) to `path`, by default this host's cache file."""
        out = Path(path) if path is not None else calibration_path(
            self.threads, self.host, self.backend, self.profile)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CalibrationError(f"{path}: cannot read calibration ({e})") from None
        return cls.from_dict(data, str(path))


# ---- where calibrations live ------------------------------------------------------------------

def cache_dir() -> Path:
    """``$ONNXLENS_CACHE``, else ``$XDG_CACHE_HOME/onnxlens``, else ``~/.cache/onnxlens``."""
    if os.environ.get("ONNXLENS_CACHE"):
        return Path(os.environ["ONNXLENS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "onnxlens"


def host_name() -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", socket.gethostname()) or "host"


def calibration_path(threads: int, host: str | None = None,
                     backend: str = DEFAULT_BACKEND, profile: str = "") -> Path:
    if profile:  # a GPU's: one per (machine, GPU profile, runtime), threads do not matter
        return cache_dir() / f"calibration-{host or host_name()}-{profile}-{backend}.json"
    suffix = "" if backend == DEFAULT_BACKEND else f"-{backend}"
    return cache_dir() / f"calibration-{host or host_name()}-t{threads}{suffix}.json"


def find_calibration(threads: int | None = None, backend: str = DEFAULT_BACKEND,
                     profile: str = "") -> Calibration | None:
    """This host's calibration of `backend` at `threads` (None: the newest at any thread
    count), or of GPU `profile` through `backend`, if one was saved on this machine; an
    unreadable file counts as none."""
    if profile:
        candidates = [calibration_path(1, backend=backend, profile=profile)]
    elif threads is not None:
        candidates = [calibration_path(threads, backend=backend)]
    else:
        suffix = "" if backend == DEFAULT_BACKEND else f"-{backend}"
        found = [p for p in cache_dir().glob(f"calibration-{host_name()}-t*{suffix}.json")
                 if re.fullmatch(rf"calibration-.*-t\d+{re.escape(suffix)}\.json", p.name)]
        candidates = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    cpu = detect_cpu().model
    for path in candidates:
        if path.is_file():
            try:
                cal = Calibration.load(path)
            except CalibrationError:
                continue
            if cal.cpu == cpu:
                return cal
    return None


# ---- the calibrated host profile --------------------------------------------------------------

def apply_calibration(profile: HardwareProfile, cal: Calibration) -> HardwareProfile:
    """`profile` (this host, detected) with the calibration's measured numbers: fp32 peak,
    bandwidth of each measured level, kernel overhead, as the constant efficiency of each
    class its curve's e_max (estimates use the whole curve, `Calibration.efficiency`), the
    runtime measured and what was measured of it (`HardwareProfile.runtime`, see the module
    docstring): the estimator models that runtime's kernels."""
    where = f"onnxlens calibrate, {cal.created}, {cal.threads} thread(s)"
    levels = [MemoryLevel(lv.name, cal.bandwidth_gbps[lv.name], lv.size_bytes,
                          lv.energy_pj_per_byte, f"measured: {where}")
              if lv.name in cal.bandwidth_gbps else lv for lv in profile.memory]
    measured = replace_measured(
        profile, peak_tflops={"fp32": cal.peak_fp32_tflops,
                              **({"int8": cal.peak_int8_tops} if cal.peak_int8_tops else {})},
        memory=levels,
        kernel_launch_us=cal.kernel_overhead_us,
        # every class with a curve of its own at its own best: `cold_weights` reads a kernel's
        # work at it (an elementwise_int8 kernel at elementwise's e_max read 14x slow)
        efficiency={c: min(1.0, cal.curve(c).e_max) for c in (*OP_CLASSES, *cal.curves)},
        source=f"measured: {where}")
    runtime = Runtime(name=cal.backend, transcendental_flops=cal.transcendental_flops,
                      copy_run_ns=cal.copy_run_ns, cold_weight_gbps=cal.cold_weight_gbps,
                      cold_line_ns=cal.cold_line_ns, cold_kernel_us=cal.cold_kernel_us,
                      run_call_us=cal.run_call_us, copy_fixed_ns=dict(cal.copy_fixed_ns),
                      copy_part_ns=cal.copy_part_ns,
                      denormal_factor=cal.denormal_factor, norm_row_ns=cal.norm_row_ns,
                      copy_element_ns=cal.copy_element_ns, copy_gbps=dict(cal.copy_gbps),
                      libm_call_ns=cal.libm_call_ns,
                      per_call_classes=frozenset(p.op_class for p in cal.points if p.calls > 1))
    return replace(measured, runtime=runtime)


def constant_efficiency(hw: HardwareProfile) -> EfficiencyFn:
    """An uncalibrated profile: one achievable fraction of peak per op class (a subclass,
    such as grouped_conv, at its parent's)."""
    return lambda cls, flops, intensity: hw.class_efficiency(cls)


def calibrated_gpu(profile: HardwareProfile, runtime: str
                   ) -> tuple[HardwareProfile, EfficiencyFn]:
    """GPU `profile` estimated as `runtime`'s kernels: calibrated by this machine's calibration
    of that profile through `runtime` when there is one (made on a machine with that GPU),
    else at the profile's constant efficiencies."""
    cal = find_calibration(backend=runtime, profile=profile.key)
    if cal is None:
        hw = replace(profile, runtime=replace(profile.runtime, name=runtime))
        return hw, constant_efficiency(hw)
    return apply_calibration(profile, cal), cal.efficiency


def calibrated_host_profile(threads: int | None = None) -> HardwareProfile:
    """The `host` profile, calibrated if this host has a calibration at `threads` (None: the
    newest), else as detected with `calibrated` False."""
    return calibrated_host(threads)[0]


def calibrated_host(threads: int | None = None, runtime: str = DEFAULT_BACKEND
                    ) -> tuple[HardwareProfile, EfficiencyFn]:
    """The `host` profile and the efficiency to estimate with on it: the calibration of
    `runtime` (whose kernels its curves measured) when there is one, else the profile's
    constant per-class efficiencies (uncalibrated)."""
    cal = find_calibration(threads, backend=runtime)
    if cal is None:
        hw = host_profile(threads)
        return hw, constant_efficiency(hw)
    return apply_calibration(host_profile(cal.threads), cal), cal.efficiency


def resolve_target(name: str, threads: int | None = None, runtime: str = ORT_CPU
                   ) -> tuple[HardwareProfile, EfficiencyFn]:
    """A profile by name and the efficiency curve to estimate with on it.

    `host` is this machine: detected, and calibrated when `onnxlens calibrate --backend
    runtime` has been run for `threads`; its measured curves then replace the profile's
    constant efficiencies, and the estimate costs `runtime`'s kernels (`ort-cpu` or
    `native-cpu`: HOST_RUNTIMES). A GPU profile with a GPU runtime (ort-cuda, native-cuda)
    is estimated as that runtime's kernels (native-cuda: the native executor's CUDA launches),
    calibrated when `onnxlens calibrate --backend RUNTIME --profile NAME` was run on this
    machine, else at the profile's constant efficiencies; otherwise a profile runs one kernel
    per group.
    """
    if runtime not in RUNTIMES:
        raise UsageError(f"runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if name == "host":
        if runtime not in HOST_RUNTIMES:
            raise UsageError(f"runtime {runtime!r} runs on a GPU; -H host is this CPU "
                             f"({' or '.join(HOST_RUNTIMES)})")
        return calibrated_host(threads, runtime)
    hw = load_profile(name)
    if runtime in GPU_RUNTIMES:
        if hw.kind != "gpu":
            raise UsageError(f"runtime {runtime!r} estimates a GPU profile; {hw.key} is a "
                             f"{hw.kind}")
        return calibrated_gpu(hw, runtime)
    return hw, constant_efficiency(hw)
