"""`onnxlens calibrate`: time micro-benchmarks through ONNX Runtime's CPU provider, fit a
`Calibration` (analyzer/calibration.py) and save it in the user's cache dir.

Each micro-benchmark is a small ONNX graph built with onnx.helper that our fusion makes one
group of (one op, or a pattern ORT also runs as one kernel: Conv + activation, a Linear with
its bias and GELU, an attention block): GEMMs from skinny to square, convolutions 3x3 / 1x1 /
strided / grouped / the 3-channel stem, with channel counts on and off ORT's NCHWc block,
depthwise 3x3 / 5x5 / 7x7, elementwise ops, pools, normalizations, reductions and data
movement at sizes that span L1, L2, the last-level cache and DRAM, and a chain of tiny ops for
the per-kernel overhead. Shapes come from generic grids whose spatial sizes (96, 48, 24, 12,
6; 208 for the stems) no torchvision classifier at 224x224 has, so no benchmark is a layer of
a model the accuracy benchmark measures. Its FLOPs and bytes come from onnxlens's own
analysis of that graph (the formulas the estimate uses), so model and measurement check each
other, and its op class is the estimator's (`op_class`).

Measuring: inputs are graph inputs, weights initializers (ORT prepacks them, as in a model).
A benchmark's time is the median of its runs, on the CPU-time clock at one thread (immune
to other processes on the cores) and wall time otherwise, less the fixed cost of a `run` call.
A lone Conv or pool is run by ORT in its NCHWc layout between a ReorderInput and a
ReorderOutput, which in a network sit only at the ends of a run of convolutions: such a
benchmark is timed as ORT optimized it (its saved optimized graph) with those layout kernels
cut off, so what is timed is the `com.microsoft.nchwc` kernel a network runs. Each
benchmark's session is made once and timed in five passes over the whole list, alternately
forwards and backwards, keeping its fastest median: on a shared machine other processes slow
things down in bursts (caches and memory bandwidth are shared even when the CPU clock is
not), which rarely hit one benchmark every time.

Fitting, in the estimator's terms (a group takes max(compute, memory) + overhead):

1. overhead: the slope of run time over the length of a chain of tiny Relu kernels;
2. the fp32 peak: the host profile's, raised to the best GEMM rate measured if that beats it
   (efficiencies measured above the peak count as 1); the rate of the 1024^3 GEMM is kept as
   the "measured GEMM peak" a naive estimate would use;
3. memory bandwidth per level, the `elementwise` curve and the cost of a transcendental τ
   (`fit_vector`), on every benchmark without MACs: for each τ on a grid, alternately (four
   rounds) a level's bandwidth is the median rate of its benchmarks that the current curve
   calls memory bound and the curve (no reuse factor) is fitted on those the bandwidths call
   compute bound, its work in plain-FLOP equivalents (`Cost.vector_flops`); a level slower
   than the one after it is raised to it; the τ whose fit predicts the benchmarks' times best
   wins (plain ops such as Relu pin the bandwidths, transcendental ones the curve);
4. a curve of its own for pools, normalizations and reductions, on all their benchmarks
   (`fit_vector_classes`);
5. a curve per class with MACs, on its benchmarks that are not memory bound, its rate taken
   over all the work of the kernel: its MACs and its epilogue (bias, ReLU), which the
   estimator charges at the kernel's rate (`estimate_group`), after taking out the time of
   an activation MLAS applies in a pass after the kernel (ReLU6, HardSwish: at the
   `elementwise` rate, `activation_pass`).

`fit_check` then asks the estimator for each benchmark's time on the calibrated profile: how
well the fitted model explains what it was fitted on, per class (`onnxlens calibrate` prints
it).
   Classes are the estimator's on the runtime measured: through ORT, a convolution ORT runs
   off its NCHWc path (grouped, or output channels not a multiple of 4) is `grouped_conv`.

`--backend native-cpu` (`run_calibration(backend=...)`) times the same graphs on the
project's own executor instead (one step per group, nothing cut off; graphs it cannot run
are left out) and saves a calibration of its own.

A curve is fitted by least absolute deviations on ln(efficiency): for each (f_half, i_half)
on a log grid the best e_max is closed-form (the median log residual), and the grid point
with the smallest error wins; then each memory level with enough benchmarks gets the i_half
factor (on a grid) that fits its benchmarks best, and e_max is refitted. Benchmarks run in
priority order (a coarse set covering every class first), and those that would overrun
`budget_s` are skipped.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ..analyzer.analysis import analyze
from ..analyzer.calibration import (
    DEFAULT_BACKEND,
    MAC_CLASSES,
    OWN_VECTOR_CLASSES,
    VECTOR_CLASS,
    Calibration,
    Curve,
    Point,
    apply_calibration,
    host_name,
)
from ..analyzer.errors import UsageError
from ..analyzer.estimate import activation_pass, estimate_group, memory_level
from ..analyzer.hardware import ORT_CPU, HardwareProfile
from ..analyzer.host import detect_cpu, host_profile
from ..analyzer.runtimes import op_class
from ..analyzer.runtimes.ort_cpu import ort_kernels
from .base import BackendError, input_specs, random_inputs
from .ort_timing import NodeTime, make_session, profile_model, random_feeds, time_session

OPSET = 17
IR_VERSION = 8  # what ORT 1.18+ reads
# ORT's NCHWc layout changes around a lone Conv or pool: not part of the op's own time.
LAYOUT_KERNELS = ("ReorderInput", "ReorderOutput")
NCHWC = "com.microsoft.nchwc"
NCHWC_OPS = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
CHAIN_LENGTHS = (1, 17, 33, 65)
# A benchmark is informative on efficiency only if memory takes less than this share of it.
COMPUTE_BOUND_SHARE = 0.8
FIT_ROUNDS = 4
PASSES = 5  # timings of each benchmark, spread over the run; the fastest median is kept
LEVEL_POINTS = 3  # benchmarks a memory level needs for an i_half factor of its own
LEVEL_GRID = np.logspace(-1, 2, 31)  # the i_half factors a level may take (1 included)
F_HALF_GRID = (0.0, *np.logspace(3, 10, 57))
I_HALF_GRID = (0.0, *np.logspace(-2, 3, 41))
# Plain vector FLOPs one transcendental evaluation may cost (1: as cheap as an add).
TRANSCENDENTAL_GRID = np.logspace(0, 2, 31)

# ---- micro-benchmark graphs ---------------------------------------------------------------------

@dataclass(frozen=True)
class Bench:
    name: str
    build: Callable[[], onnx.ModelProto]
    tier: int  # 0: the coarse set, 1: the full set, 2: slow (DRAM-sized, big GEMM)
    work: float  # rough seconds per run, for the budget (FLOPs at 50 GFLOP/s, bytes at 10 GB/s)


_RNG = np.random.default_rng(0)


def _tensor(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _const(name: str, shape: Sequence[int], scale: float = 0.1) -> TensorProto:
    return numpy_helper.from_array((_RNG.standard_normal(shape, dtype=np.float32) * scale), name)


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, Sequence[int]]],
           output: tuple[str, Sequence[int]], consts: Iterable[TensorProto] = ()
           ) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", [_tensor(n, s) for n, s in inputs],
                              [_tensor(*output)], list(consts))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=IR_VERSION)


def _work(flops: float, nbytes: float) -> float:
    return flops / 50e9 + nbytes / 10e9


def matmul(m: int, k: int, n: int, tier: int = 1, weight: bool = True) -> Bench:
    """Y[m,n] = X[m,k] · W[k,n]; W a weight, or a second input (`weight` False)."""
    def build() -> onnx.ModelProto:
        node = helper.make_node("MatMul", ["X", "W"], ["Y"])
        if weight:
            return _model([node], [("X", (m, k))], ("Y", (m, n)), [_const("W", (k, n))])
        return _model([node], [("X", (m, k)), ("W", (k, n))], ("Y", (m, n)))
    return Bench(f"MatMul {m}x{k}x{n}" + ("" if weight else " of inputs"), build, tier,
                 _work(2 * m * k * n, 4 * (m * k + k * n + m * n)))


def gemm(m: int, k: int, n: int, tier: int = 1) -> Bench:
    """nn.Linear as exported: Gemm(X, W, B, transB=1)."""
    return Bench(f"Gemm {m}x{k}x{n}", lambda: _model(
        [helper.make_node("Gemm", ["X", "W", "B"], ["Y"], transB=1)], [("X", (m, k))],
        ("Y", (m, n)), [_const("W", (n, k)), _const("B", (n,))]), tier,
        _work(2 * m * k * n, 4 * (m * k + k * n + m * n)))


def linear(rows: int, k: int, n: int, gelu: bool = False, tier: int = 1) -> Bench:
    """nn.Linear on a [1, rows, k] activation as torch exports it (MatMul, Add bias), then
    GELU spelled out in erf (opset 17) if `gelu`: a transformer or ConvNeXt MLP's group."""
    def build() -> onnx.ModelProto:
        nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]),
                 helper.make_node("Add", ["M", "B"], ["H" if gelu else "Y"])]
        consts = [_const("W", (k, n)), _const("B", (n,))]
        if gelu:  # 0.5 x (1 + erf(x / sqrt 2))
            nodes += [helper.make_node("Div", ["H", "sqrt2"], ["D"]),
                      helper.make_node("Erf", ["D"], ["E"]),
                      helper.make_node("Add", ["E", "one"], ["A"]),
                      helper.make_node("Mul", ["H", "A"], ["P"]),
                      helper.make_node("Mul", ["P", "half"], ["Y"])]
            consts += [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in
                       (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]
        return _model(nodes, [("X", (1, rows, k))], ("Y", (1, rows, n)), consts)
    return Bench(f"Linear {rows}x{k}x{n}" + (" +Gelu" if gelu else ""), build, tier,
                 _work(2 * rows * k * n, 4 * (rows * k + k * n + rows * n)))


def batched_matmul(b: int, m: int, k: int, n: int, tier: int = 1) -> Bench:
    """Two activations: A[b,m,k] · B[b,k,n]."""
    return Bench(f"MatMul {b}x({m}x{k}x{n})", lambda: _model(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])], [("A", (b, m, k)), ("B", (b, k, n))],
        ("Y", (b, m, n))), tier, _work(2 * b * m * k * n, 4 * b * (m * k + k * n + m * n)))


def conv(cin: int, cout: int, size: int, kernel: int = 3, stride: int = 1, group: int = 1,
         act: str | None = None, tier: int = 1) -> Bench:
    """Conv with bias on [1, cin, size, size], 'same' padding, then `act` (Relu, Clip as
    ReLU6, HardSwish) if given: one group of ours and one NCHWc kernel of ORT's."""
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    kind = "dw" if group == cin == cout else (f"g{cin // group}" if group > 1 else "")
    name = f"Conv{kind} {kernel}x{kernel}/{stride} {cin}->{cout} @{size}" + (
        f" +{act}" if act else "")

    def build() -> onnx.ModelProto:
        nodes = [helper.make_node("Conv", ["X", "W", "B"], ["C" if act else "Y"],
                                  kernel_shape=[kernel, kernel], strides=[stride, stride],
                                  pads=[kernel // 2] * 4, group=group)]
        consts = [_const("W", (cout, cin // group, kernel, kernel)), _const("B", (cout,))]
        if act == "Clip":
            nodes.append(helper.make_node("Clip", ["C", "lo", "hi"], ["Y"]))
            consts += [numpy_helper.from_array(np.array(v, np.float32), n)
                       for n, v in (("lo", 0.0), ("hi", 6.0))]
        elif act:
            nodes.append(helper.make_node(act, ["C"], ["Y"]))
        return _model(nodes, [("X", (1, cin, size, size))], ("Y", (1, cout, out, out)), consts)
    return Bench(name, build, tier, _work(2 * out * out * cout * cin // group * kernel * kernel,
                                          4 * (cin * size * size + cout * out * out)))


def depthwise(channels: int, size: int, kernel: int = 3, stride: int = 1,
              act: str | None = None, tier: int = 1) -> Bench:
    return conv(channels, channels, size, kernel, stride, channels, act, tier)


def _flat(n: int) -> tuple[int, ...]:
    """`n` elements as [1, C, 32, 32]: onnx's shape inference is slow on long 1-D tensors."""
    return (1, max(1, n // 1024), 32, 32) if n >= 1024 else (1, 1, 1, n)


def unary(op: str, n: int, tier: int = 1) -> Bench:
    return Bench(f"{op} {n}", lambda: _model(
        [helper.make_node(op, ["X"], ["Y"])], [("X", _flat(n))], ("Y", _flat(n))), tier,
        _work(n, 8 * n))


def binary(op: str, n: int, tier: int = 1) -> Bench:
    return Bench(f"{op} {n}", lambda: _model(
        [helper.make_node(op, ["A", "B"], ["Y"])], [("A", _flat(n)), ("B", _flat(n))],
        ("Y", _flat(n))), tier, _work(n, 12 * n))


def silu(n: int, tier: int = 1) -> Bench:
    """x·sigmoid(x): one group of ours, one QuickGelu kernel of ORT's."""
    return Bench(f"SiLU {n}", lambda: _model(
        [helper.make_node("Sigmoid", ["X"], ["S"]), helper.make_node("Mul", ["X", "S"], ["Y"])],
        [("X", _flat(n))], ("Y", _flat(n))), tier, _work(4 * n, 8 * n))


def channel_scale(channels: int, size: int, tier: int = 1) -> Bench:
    """Mul of [1,C,H,W] by a per-channel [1,C,1,1] (squeeze-excite's gate)."""
    shape = (1, channels, size, size)
    return Bench(f"Mul {channels}x{size}x{size} by channel", lambda: _model(
        [helper.make_node("Mul", ["X", "S"], ["Y"])], [("X", shape), ("S", (1, channels, 1, 1))],
        ("Y", shape)), tier, _work(math.prod(shape), 8 * math.prod(shape)))


def pool(op: str, channels: int, size: int, kernel: int = 3, stride: int = 2,
         tier: int = 1) -> Bench:
    glob = op.startswith("Global")
    out = 1 if glob else (size + 2 * (kernel // 2) - kernel) // stride + 1
    attrs = {} if glob else {"kernel_shape": [kernel, kernel], "strides": [stride, stride],
                             "pads": [kernel // 2] * 4}
    name = f"{op} {channels}x{size}x{size}" + ("" if glob else f" {kernel}x{kernel}/{stride}")
    return Bench(name, lambda: _model(
        [helper.make_node(op, ["X"], ["Y"], **attrs)], [("X", (1, channels, size, size))],
        ("Y", (1, channels, out, out))), tier, _work(channels * size * size * 2,
                                                     4 * channels * size * size))


def row_op(op: str, rows: int, cols: int, tier: int = 1) -> Bench:
    """LayerNormalization, Softmax or ReduceMean over the last axis of [rows, cols]."""
    if op == "LayerNormalization":
        node = helper.make_node(op, ["X", "G", "Bt"], ["Y"], axis=-1)
        consts = [_const("G", (cols,)), _const("Bt", (cols,))]
    elif op == "ReduceMean":
        node = helper.make_node(op, ["X"], ["Y"], axes=[-1], keepdims=1)
        consts = []
    else:
        node = helper.make_node(op, ["X"], ["Y"], axis=-1)
        consts = []
    out = (rows, 1) if op == "ReduceMean" else (rows, cols)
    return Bench(f"{op} {rows}x{cols}", lambda: _model(
        [node], [("X", (rows, cols))], ("Y", out), consts), tier,
        _work(8 * rows * cols, 8 * rows * cols))


def batch_norm(channels: int, size: int, tier: int = 1) -> Bench:
    shape = (1, channels, size, size)
    return Bench(f"BatchNormalization {channels}x{size}x{size}", lambda: _model(
        [helper.make_node("BatchNormalization", ["X", "S", "Bb", "M", "V"], ["Y"])],
        [("X", shape)], ("Y", shape),
        [_const("S", (channels,)), _const("Bb", (channels,)), _const("M", (channels,)),
         numpy_helper.from_array(np.ones(channels, np.float32), "V")]), tier,
        _work(2 * math.prod(shape), 8 * math.prod(shape)))


def transpose(shape: Sequence[int], perm: Sequence[int], tier: int = 1) -> Bench:
    out = [shape[p] for p in perm]
    return Bench(f"Transpose {'x'.join(map(str, shape))} {tuple(perm)}", lambda: _model(
        [helper.make_node("Transpose", ["X"], ["Y"], perm=list(perm))], [("X", shape)],
        ("Y", out)), tier, _work(0, 8 * math.prod(shape)))


def concat(channels: int, size: int, tier: int = 1) -> Bench:
    shape = (1, channels, size, size)
    return Bench(f"Concat 2x{channels}x{size}x{size}", lambda: _model(
        [helper.make_node("Concat", ["A", "B"], ["Y"], axis=1)], [("A", shape), ("B", shape)],
        ("Y", (1, 2 * channels, size, size))), tier, _work(0, 16 * math.prod(shape)))


def slice_half(channels: int, size: int, tier: int = 1) -> Bench:
    """The second half of the channels (ShuffleNet's split)."""
    def build() -> onnx.ModelProto:
        starts = numpy_helper.from_array(np.array([channels // 2], np.int64), "s")
        ends = numpy_helper.from_array(np.array([channels], np.int64), "e")
        axes = numpy_helper.from_array(np.array([1], np.int64), "a")
        return _model([helper.make_node("Slice", ["X", "s", "e", "a"], ["Y"])],
                      [("X", (1, channels, size, size))],
                      ("Y", (1, channels - channels // 2, size, size)), [starts, ends, axes])
    return Bench(f"Slice half of {channels}x{size}x{size}", build, tier,
                 _work(0, 4 * channels * size * size))


def attention(heads: int, seq: int, dim: int, tier: int = 1) -> Bench:
    """softmax(Q·Kᵀ·s)·V over `heads` heads: the estimator's `attention` class."""
    def build() -> onnx.ModelProto:
        nodes = [helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
                 helper.make_node("Mul", ["S", "scale"], ["Ss"]),
                 helper.make_node("Softmax", ["Ss"], ["P"], axis=-1),
                 helper.make_node("MatMul", ["P", "V"], ["Y"])]
        scale = numpy_helper.from_array(np.array(dim ** -0.5, np.float32), "scale")
        return _model(nodes, [("Q", (heads, seq, dim)), ("Kt", (heads, dim, seq)),
                              ("V", (heads, seq, dim))], ("Y", (heads, seq, dim)), [scale])
    return Bench(f"Attention {heads}x{seq}x{dim}", build, tier,
                 _work(4 * heads * seq * seq * dim, 4 * heads * (4 * seq * dim + seq * seq)))


def chain(length: int) -> Bench:
    """`length` Relu kernels on 16 floats: almost nothing but per-kernel overhead."""
    return Bench(f"Relu chain {length}", lambda: _model(
        [helper.make_node("Relu", ["X" if i == 0 else f"t{i}"], [f"t{i + 1}"])
         for i in range(length)], [("X", (16,))], (f"t{length}", (16,))), 0, 0.0)


SQUARE_GEMM = matmul(1024, 1024, 1024, 2)


def benchmarks() -> list[Bench]:
    """The whole set, coarse tier first; names are unique."""
    out = [chain(n) for n in CHAIN_LENGTHS]
    # GEMM: square, skinny (one row: memory bound), wide and deep; Gemm as nn.Linear exports.
    out += [matmul(64, 256, 256, 0), matmul(256, 512, 512, 0), matmul(1, 1024, 1024, 0),
            matmul(32, 32, 32), matmul(128, 128, 128), matmul(512, 512, 512),
            matmul(1, 256, 512), matmul(4, 512, 2048), matmul(16, 1024, 256),
            matmul(64, 64, 1024), matmul(1024, 64, 64), matmul(256, 2048, 128),
            matmul(2048, 256, 256), matmul(128, 1024, 2048), gemm(1, 1024, 512),
            gemm(64, 512, 1024), gemm(1, 4096, 2048), batched_matmul(8, 64, 64, 64),
            batched_matmul(16, 128, 32, 128), batched_matmul(4, 256, 256, 64),
            linear(2048, 128, 512, gelu=True), linear(2048, 512, 128), linear(512, 256, 1024),
            linear(512, 1024, 256), linear(256, 512, 2048, gelu=True), linear(256, 2048, 512),
            SQUARE_GEMM, matmul(1, 8192, 4096, 2, weight=False)]
    # Convolutions: 3x3 over channel counts and sizes, strided, 1x1 up and down, the stem,
    # grouped (group widths 4, 8, 12, 24 on ORT's NCHW path, 16 and 32 whole NCHWc blocks on
    # AVX-512); channel counts that are and are not multiples of 16
    # (ORT's NCHWc block on AVX-512 pads the others); fused activations, from the free Relu to
    # the costlier ReLU6 and HardSwish, as networks use them.
    out += [conv(64, 64, 24, tier=0), conv(32, 128, 24, 1, tier=0),
            conv(16, 16, 96, act="Relu"), conv(32, 32, 48), conv(64, 64, 48, act="Relu"),
            conv(128, 128, 24), conv(256, 256, 12, act="Relu"), conv(512, 512, 6),
            conv(32, 64, 48), conv(256, 128, 12), conv(24, 24, 48, act="Relu"),
            conv(40, 40, 24, act="Clip"), conv(88, 88, 24, act="Relu"), conv(200, 200, 12),
            conv(32, 64, 96, 3, 2), conv(64, 128, 48, 3, 2, act="Relu"),
            conv(256, 512, 12, 3, 2), conv(3, 32, 208, 3, 2, act="Clip"),
            conv(3, 64, 208, 7, 2, act="Relu"), conv(3, 16, 208, 3, 2, act="HardSwish"),
            conv(16, 64, 96, 1), conv(64, 16, 96, 1), conv(32, 192, 48, 1, act="Clip"),
            conv(192, 32, 48, 1), conv(64, 256, 24, 1, act="Relu"), conv(256, 64, 24, 1),
            conv(128, 512, 12, 1, act="Relu"), conv(512, 128, 12, 1), conv(256, 1024, 6, 1),
            conv(1024, 256, 6, 1), conv(128, 128, 24, 1), conv(512, 512, 6, 1),
            conv(16, 16, 48, 1, act="Relu"), conv(256, 512, 24, 1, 2),
            conv(24, 120, 48, 1, act="Clip"), conv(120, 24, 48, 1), conv(24, 88, 48, 1, act="Relu"),
            conv(88, 24, 48, 1), conv(40, 200, 24, 1, act="HardSwish"), conv(200, 40, 24, 1),
            conv(72, 432, 12, 1, act="Clip"), conv(432, 72, 12, 1),
            conv(104, 624, 12, 1, act="HardSwish"), conv(624, 104, 12, 1),
            conv(176, 1056, 6, 1, act="Clip"), conv(1056, 176, 6, 1),
            conv(52, 52, 24, 1, act="Relu"), conv(100, 100, 12, 1, act="Relu"),
            conv(204, 204, 6, 1, act="Relu"),
            conv(64, 64, 48, 3, 1, 8), conv(128, 128, 24, 3, 1, 8),
            conv(256, 256, 12, 3, 1, 16), conv(512, 512, 6, 3, 1, 16),
            conv(128, 128, 48, 3, 2, 4), conv(256, 256, 24, 3, 1, 32),
            conv(32, 32, 96, 3, 2, 4, act="Relu"), conv(96, 96, 48, 3, 2, 12, act="Relu"),
            conv(192, 192, 24, 3, 1, 24, act="Relu"), conv(384, 384, 12, 3, 2, 48),
            conv(768, 768, 6, 3, 1, 96, act="Relu"), conv(64, 64, 48, 3, 1, 16),
            conv(96, 96, 24, 3, 1, 8, act="Relu"), conv(192, 192, 24, 3, 2, 8),
            conv(128, 128, 48, 3, 2, 16, act="Relu"), conv(256, 256, 12, 3, 1, 64),
            # Output channels off a multiple of 4: ORT's NCHW path.
            conv(54, 54, 24, 1, act="Relu"), conv(90, 90, 48, 1), conv(30, 30, 96, 1, act="Relu"),
            depthwise(54, 48), depthwise(90, 24, 3, 2)]
    # Depthwise: 3x3 / 5x5 / 7x7, stride 1 and 2, small and large spatial sizes, channel counts
    # on and off the NCHWc block, with and without a fused activation.
    out += [depthwise(64, 48, tier=0), depthwise(32, 96, act="Clip"), depthwise(128, 48),
            depthwise(128, 24, act="Relu"), depthwise(256, 12), depthwise(512, 12, act="Clip"),
            depthwise(1024, 6), depthwise(64, 96, 3, 2), depthwise(128, 48, 3, 2),
            depthwise(256, 24, 3, 2, act="Relu"), depthwise(128, 24, 5), depthwise(256, 12, 5),
            depthwise(512, 6, 5, act="HardSwish"), depthwise(256, 24, 5, 2), depthwise(96, 48, 7),
            depthwise(192, 24, 7), depthwise(384, 12, 7), depthwise(768, 6, 7),
            depthwise(88, 48, act="Relu"), depthwise(120, 48, act="Clip"),
            depthwise(120, 48, 3, 2, act="Clip"), depthwise(104, 24, 5, act="Relu"),
            depthwise(200, 24, 5, 2, act="HardSwish"), depthwise(432, 12, act="HardSwish"),
            depthwise(624, 12, 5), depthwise(52, 24), depthwise(100, 12), depthwise(204, 6)]
    # Working sets past L2 (several MB at 96x96): depthwise and pointwise convolutions that
    # stream from the last-level cache, so those classes get a level factor there.
    out += [depthwise(96, 96), depthwise(144, 96, act="Clip"), depthwise(192, 96, 3, 2),
            conv(16, 96, 96, 1, act="Clip"), conv(96, 24, 96, 1), conv(144, 24, 96, 1)]
    # Elementwise at sizes in L1 (2^10), L2 (2^14, 2^16), the LLC (2^19, 2^21) and DRAM (2^24).
    out += [unary("Relu", 1 << 16, 0), binary("Add", 1 << 16, 0), unary("Relu", 1 << 21, 0)]
    for n in (1 << 10, 1 << 14, 1 << 19):
        out += [unary("Relu", n), binary("Add", n), binary("Mul", n)]
    out += [binary("Add", 1 << 21), binary("Mul", 1 << 16)]
    for n in (1 << 12, 1 << 16, 1 << 19):
        out += [unary("Sigmoid", n), unary("HardSwish", n), unary("Tanh", n), unary("Erf", n),
                binary("Div", n)]
    out += [channel_scale(256, 24), channel_scale(64, 96), channel_scale(1024, 6)]
    out += [silu(1 << 14), silu(1 << 17), silu(1 << 20)]
    out += [unary("Relu", 1 << 24, 2), binary("Add", 1 << 24, 2)]
    # Pools, normalizations, reductions.
    out += [pool("MaxPool", 64, 96), pool("MaxPool", 128, 48, 2, 2), pool("MaxPool", 256, 24),
            pool("AveragePool", 128, 48, 2, 2), pool("AveragePool", 256, 24, 2, 2),
            pool("GlobalAveragePool", 64, 48), pool("GlobalAveragePool", 1024, 6),
            pool("GlobalAveragePool", 256, 24),
            row_op("LayerNormalization", 256, 256), row_op("LayerNormalization", 1024, 128),
            row_op("LayerNormalization", 64, 1024), row_op("LayerNormalization", 4096, 64),
            row_op("Softmax", 512, 64), row_op("Softmax", 256, 256), row_op("Softmax", 64, 1024),
            row_op("Softmax", 2048, 128), row_op("ReduceMean", 1024, 256),
            row_op("ReduceMean", 64, 4096), row_op("ReduceMean", 4096, 32),
            batch_norm(128, 24), batch_norm(256, 12)]
    # Data movement: 4-D and 5-D (channel shuffle) transposes, concat, slice.
    out += [transpose((1, 64, 48, 48), (0, 2, 3, 1)), transpose((1, 256, 12, 12), (0, 2, 3, 1)),
            transpose((1, 48, 48, 64), (0, 3, 1, 2)),
            transpose((1, 2, 64, 24, 24), (0, 2, 1, 3, 4)),
            transpose((64, 36, 4, 32), (0, 2, 1, 3)), transpose((256, 16, 8, 8), (0, 2, 1, 3)),
            transpose((96, 32, 16, 16), (0, 2, 1, 3)),
            concat(64, 48), concat(128, 24), concat(256, 6), slice_half(128, 48),
            slice_half(256, 12)]
    # Attention blocks: heads x sequence x head dim.
    out += [attention(4, 64, 32, 0), attention(8, 128, 64), attention(4, 256, 32),
            attention(16, 64, 64), attention(2, 512, 64), attention(32, 36, 32)]
    return sorted(out, key=lambda b: b.tier)


# ---- measuring ---------------------------------------------------------------------------------

Timer = Callable[[float], float]  # min_time_s -> the median run (seconds) over that long
Prepare = Callable[[onnx.ModelProto, int], Timer]


def prepare_ort(model: onnx.ModelProto, threads: int) -> Timer:
    """A timer of `model` on ORT's CPU provider: each call gives the median run over at least
    its `min_time_s` (3 runs at least), on the CPU clock at one thread, wall time otherwise
    (the statistic models are measured with: a minimum over hundreds of runs of a tiny kernel
    would flatter it).

    A lone Conv or pool is run by ORT in NCHWc layout between a ReorderInput and a
    ReorderOutput, which in a network sit only at the ends of a run of convolutions: such a
    graph is timed as ORT optimized it, less those layout kernels.
    """
    if any(node.op_type in NCHWC_OPS for node in model.graph.node):
        with tempfile.TemporaryDirectory(prefix="onnxlens-calibrate-") as tmp:
            path = str(Path(tmp) / "optimized.onnx")
            kernels = profile_model(model, threads, runs=1, warmup=0, optimized_model_path=path)
            if any(k.op_type in LAYOUT_KERNELS for k in kernels[0]):
                model = without_layout(onnx.load(path), kernels[0])
    session = make_session(model, threads)
    feeds = random_feeds(session)
    clock = "cpu" if threads == 1 else "wall"
    return lambda min_time_s: time_session(session, feeds, runs=3, warmup=1,
                                           min_time_s=min_time_s, clock=clock).median_s


def prepare_native(model: onnx.ModelProto, threads: int) -> Timer:
    """A timer of `model` on the native executor (`native-cpu`), as `prepare_ort` times ORT:
    one step per fused group, so nothing is cut off. BackendError if it cannot run the graph."""
    from .native_cpu import NativeCpuBackend

    backend = NativeCpuBackend(threads)
    backend.prepare(model)
    feeds = random_inputs(input_specs(model), count=1, batch=1)[0]
    clock = "cpu" if threads == 1 else "wall"
    session = _BackendSession(backend.run)
    return lambda min_time_s: time_session(session, feeds, runs=3, warmup=1,
                                           min_time_s=min_time_s, clock=clock).median_s


class _BackendSession:
    """A backend's `run` seen as an ORT session's, for `time_session`."""

    def __init__(self, run: Callable[[dict[str, np.ndarray]], object]) -> None:
        self._run = run

    def run(self, _names: None, feeds: dict[str, np.ndarray]) -> object:
        return self._run(feeds)


PREPARE: dict[str, Prepare] = {ORT_CPU: prepare_ort, "native-cpu": prepare_native}


def without_layout(optimized: onnx.ModelProto, kernels: Sequence[NodeTime]) -> onnx.ModelProto:
    """ORT's optimized graph with its ReorderInput / ReorderOutput nodes cut off: a reorder's
    NCHWc side becomes a graph input or output, of the shape ORT's profiler reports."""
    by_name = {k.name: k for k in kernels}
    graph = optimized.graph
    nodes = [n for n in graph.node if n.op_type not in LAYOUT_KERNELS]
    used = {name for n in nodes for name in n.input}
    made = {name for n in nodes for name in n.output}
    inputs = [*(v for v in graph.input if v.name in used),
              *(_tensor(n.output[0], by_name[n.name].output_shapes[0]) for n in graph.node
                if n.op_type == "ReorderInput")]
    outputs = [*(v for v in graph.output if v.name in made),
               *(_tensor(n.input[0], by_name[n.name].input_shapes[0]) for n in graph.node
                 if n.op_type == "ReorderOutput")]
    cut = helper.make_graph(nodes, graph.name, inputs, outputs,
                            [t for t in graph.initializer if t.name in used])
    return helper.make_model(cut, ir_version=optimized.ir_version,
                             opset_imports=list(optimized.opset_import))


# ---- the calibration run -----------------------------------------------------------------------

def run_calibration(threads: int, *, budget_s: float = 100, progress: bool = True,
                    backend: str = DEFAULT_BACKEND, prepare: Prepare | None = None
                    ) -> Calibration:
    """Measure this host at `threads` through `backend` (`ort-cpu` or `native-cpu`) within
    about `budget_s` seconds and fit a Calibration (not saved: `Calibration.save()` puts it in
    the cache dir). `progress` shows a rich progress bar on stderr. `prepare` makes a
    benchmark graph's timer (default: the backend's; tests give a fake). A benchmark the
    backend cannot run is left out.

    Every benchmark is timed in PASSES passes, alternately forwards and backwards through the
    list, and its fastest median kept: on a shared machine other processes slow it down in
    bursts, which rarely hit one benchmark every time.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if backend not in PREPARE:
        raise UsageError(f"backend {backend!r}: expected one of {', '.join(PREPARE)}")
    prepare = prepare or PREPARE[backend]
    start = time.perf_counter()
    hw = host_profile(threads)
    benches = benchmarks()
    min_time_s = max(0.01, 0.15 * budget_s / len(benches))
    models: dict[str, onnx.ModelProto] = {}
    timers: dict[str, Timer] = {}
    samples: dict[str, float] = {}
    refused: set[str] = set()
    order = [b for i in range(PASSES) for b in (benches if i % 2 == 0 else benches[::-1])]
    with _progress_bar(progress, len(order)) as advance:
        for i, bench in enumerate(order):
            advance(bench.name)
            if bench.name in refused:
                continue
            new = bench.name not in timers
            expected = (0.1 if new else 0.0) + max(min_time_s, 4 * bench.work)
            if time.perf_counter() - start + expected > budget_s and (
                    bench.tier > 0 or i >= len(benches)):
                continue
            if new:
                models[bench.name] = bench.build()
                try:
                    timers[bench.name] = prepare(models[bench.name], threads)
                except BackendError:
                    refused.add(bench.name)
                    continue
            seconds = timers[bench.name](min_time_s)
            samples[bench.name] = min(seconds, samples.get(bench.name, seconds))
    timers.clear()  # the sessions and their buffers
    chain = {len(models[b.name].graph.node): samples[b.name]
             for b in benches if b.name.startswith("Relu chain") and b.name in samples}
    fixed_s, kernel_s = _line(list(chain), list(chain.values()))
    kernel_s = max(kernel_s, 0.0)
    block = max(1, int(hw.extra.get("simd_bits", 256)) // 32)
    points = [p for b in benches if b.name in samples and not b.name.startswith("Relu chain")
              for p in [_point(b.name, models[b.name], samples[b.name], fixed_s, kernel_s,
                               block if backend == ORT_CPU else 0)]
              if p is not None]
    cal = fit(points, hw, threads, kernel_s)
    skipped = len(benches) - len(samples) - len(refused)
    notes = [f"{skipped} benchmark(s) skipped to stay within {budget_s:g} s"] if skipped else []
    if refused:
        notes.append(f"{len(refused)} benchmark(s) {backend} cannot run: "
                     + ", ".join(sorted(refused)))
    factor = denormal_factor(threads) if backend == ORT_CPU and prepare is PREPARE[ORT_CPU] \
        else 1.0
    cold = cold_weight_rate(cold_weight_gbps(1, prepare), threads,
                            cal.bandwidth_gbps.get(hw.main_memory.name, math.inf))
    return dataclasses.replace(cal, duration_s=time.perf_counter() - start, notes=notes,
                               backend=backend, denormal_factor=factor, cold_weight_gbps=cold)


# Conv+Relu chains (layers, channels, kernel, size) whose weights, one per layer, add up to
# 17-19 MB, as a mid-sized network's do: what one inference reads that the caches did not keep
# from the last. Size 12, as every calibration grid: no torchvision layer at 224x224.
COLD_CHAINS = ((64, 256, 1, 12), (32, 128, 3, 12))


def conv_chain(layers: int, channels: int, kernel: int, size: int, shared: bool
               ) -> onnx.ModelProto:
    """`layers` Conv+Relu of `channels` channels at `size`, each with a weight of its own, or
    all reading one (`shared`: ORT prepacks it once, so every layer finds it in cache)."""
    nodes, weights, x = [], [], "X"
    for i in range(layers):
        w = "W0" if shared else f"W{i}"
        if not shared or i == 0:
            weights.append(_const(w, (channels, channels, kernel, kernel)))
        nodes += [helper.make_node("Conv", [x, w], [f"C{i}"], kernel_shape=[kernel, kernel],
                                   pads=[kernel // 2] * 4),
                  helper.make_node("Relu", [f"C{i}"], [f"R{i}"])]
        x = f"R{i}"
    shape = (1, channels, size, size)
    return _model(nodes, [("X", shape)], (x, shape), weights)


def cold_weight_gbps(threads: int, prepare: Prepare = prepare_ort,
                     min_time_s: float = 0.05) -> float:
    """The rate at which a network's kernels fetch weights that are cold (last read one
    inference ago): over COLD_CHAINS, the weight bytes of the chain with a weight per layer
    over the time it takes beyond the same chain sharing one weight (each the fastest of
    three medians, the two alternating). Measured on this host (AMD EPYC, one thread):
    14-18 GB/s in every calibration and trial, below the L3's 42 and the DRAM's 19 GB/s streaming
    rates: the fetch does not hide behind the convolutions' MACs. 0 when no extra time shows
    (not measured; the estimator then charges nothing)."""
    extra_s = extra_bytes = 0.0
    for layers, channels, kernel, size in COLD_CHAINS:
        timers = {shared: prepare(conv_chain(layers, channels, kernel, size, shared), threads)
                  for shared in (True, False)}
        best = {shared: math.inf for shared in timers}
        for _ in range(3):
            for shared, timer in timers.items():
                best[shared] = min(best[shared], timer(min_time_s))
        extra_s += best[False] - best[True]
        extra_bytes += (layers - 1) * channels * channels * kernel * kernel * 4
    return extra_bytes / extra_s / 1e9 if extra_s > 0 else 0.0


def cold_weight_rate(per_core_gbps: float, threads: int, main_memory_gbps: float) -> float:
    """The cold-weight rate at `threads` threads, from the one measured at one thread: each
    thread fetches the weights of its share of a kernel, so the rates add, up to what main
    memory streams at that thread count,

        rate(T) = min(T x rate(1), main memory GB/s at T threads).

    Measured at one thread because the chains' extra time is a small difference of two
    larger ones, and at two threads on two shared vCPUs it came out anywhere from 2.5 to 34
    GB/s (at one: 14-18). At two threads on this host the chains' own 16 GB/s over-charged
    the 15 models of benchmarks/estimate_accuracy.py (median error 4.7%, mobilenet_v3 +27%);
    this rule's 28.8 GB/s gave 2.2% on the same measurements and 3.9% in a fresh run."""
    return min(threads * per_core_gbps, main_memory_gbps)


def denormal_factor(threads: int, min_time_s: float = 0.05) -> float:
    """How much slower ORT's MatMul runs on a left operand of float32 denormals (1e-40) than on
    normal numbers, on the shape of a shifted-window attention's P x V ([48, 49, 49] x
    [48, 49, 32], Swin-T's third stage): time_denormal / time_normal, each the median run over
    `min_time_s` (well under a second in all). x86 cores take a microcode assist on each
    denormal operand unless flush-to-zero is set, which ORT's CPU provider leaves off."""
    a, b = helper.make_tensor_value_info, TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "denormal",
                              [a("A", b, [48, 49, 49]), a("B", b, [48, 49, 32])],
                              [a("Y", b, [48, 49, 32])])
    session = make_session(helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17)]), threads)
    rng = np.random.default_rng(0)
    rhs = rng.random((48, 49, 32), dtype=np.float32)
    clock = "cpu" if threads == 1 else "wall"

    def median(lhs: np.ndarray) -> float:
        return time_session(session, {"A": lhs, "B": rhs}, runs=3, warmup=1,
                            min_time_s=min_time_s, clock=clock).median_s

    normal = median(rng.random((48, 49, 49), dtype=np.float32))
    return max(1.0, median(np.full((48, 49, 49), 1e-40, np.float32)) / normal)


def _point(name: str, model: onnx.ModelProto, run_s: float, fixed_s: float,
           kernel_s: float, block: int = 0) -> Point | None:
    """The benchmark's group cost (onnxlens's analysis) and the time the estimator's
    max(compute, memory) term should give it: its fastest run less the fixed cost of a run
    call and one kernel overhead (the estimator adds its own). Its class is that of its
    largest ORT kernel when `block` (the NCHWc block) is given: the estimator's class on a
    profile calibrated through ORT (a Conv off ORT's NCHWc path is `grouped_conv`)."""
    result = analyze(model)
    if len(result.groups) != 1:
        return None
    group = result.groups[0]
    cost = result.group_costs[group.id].cost
    seconds = run_s - fixed_s - kernel_s
    if cost is None or seconds <= 0:
        return None
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    nbytes = cost.bytes_read + cost.bytes_written
    if not block:
        return Point(name, op_class(result.graph, group, costs), cost.macs, cost.other_flops,
                     nbytes, seconds, transcendental=cost.transcendental)
    main = max(ort_kernels(result.graph, group, costs, block), key=lambda k: k.cost.flops())
    return Point(name, main.cls, cost.macs, cost.other_flops, nbytes, seconds, main.reuse,
                 main.calls, cost.transcendental, main.epilogue.other_flops,
                 main.epilogue.transcendental, main.runs)


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope (a single point: intercept only)."""
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


class _progress_bar:
    """A context giving `advance(label)`; a rich progress bar on stderr, or nothing."""

    def __init__(self, show: bool, total: int) -> None:
        self.show, self.total = show, total

    def __enter__(self) -> Callable[[str], None]:
        if not self.show:
            return lambda label: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"),
                            console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("", total=self.total)

        def advance(label: str) -> None:
            self.bar.update(task, advance=1, description=label)
        return advance

    def __exit__(self, *exc: object) -> None:
        if self.show:
            self.bar.stop()


# ---- fitting ----------------------------------------------------------------------------------

def fit(points: Sequence[Point], hw: HardwareProfile, threads: int,
        kernel_s: float) -> Calibration:
    """Peak, bandwidths and curves from measured points (module docstring, Fitting)."""
    mac_points = [p for p in points if p.macs]
    gemm_rates = {p.name: 2 * p.macs / p.seconds for p in mac_points if p.op_class == "gemm"}
    peak = max(hw.peak_flops("fp32"), *gemm_rates.values())
    # The measured GEMM peak of the naive estimate: the largest square GEMM, as one would
    # measure a peak (the best rate of any GEMM when that one was skipped).
    square = gemm_rates.get(SQUARE_GEMM.name, max(gemm_rates.values(), default=peak))
    # Transposes that copy run by run stay in the bandwidth fit: without them, at two threads
    # it found a degenerate optimum (all levels 94 GB/s, τ 54; with them 53 GB/s, τ 1.8).
    # `fit_copy_run` then rates their runs against the bandwidths fitted.
    vector_points = [p for p in points if not p.macs]
    bandwidth, vector, tau = fit_vector(vector_points, hw, peak)
    curves = {VECTOR_CLASS: vector,
              **fit_vector_classes(vector_points, hw, peak, bandwidth, tau)}
    for cls in MAC_CLASSES:
        eff_points = []
        for p in (p for p in mac_points if p.op_class == cls):
            flops = 2 * p.macs + p.other_flops
            intensity = flops / p.bytes
            memory_s = _stream_s(p.bytes, hw, bandwidth)
            work = 2 * p.macs + p.cost().vector_flops(tau)  # MACs and epilogue
            # An activation pass after the kernel, at the elementwise rate (`activation_pass`).
            pass_work = p.pass_cost().vector_flops(tau)
            run_s = p.seconds - (pass_work / (peak * vector(pass_work, math.inf))
                                 if pass_work else 0.0)
            # The curve reads one call's FLOPs (its GEMM's alone when a reuse is given), the
            # reuse, and the level of their ratio, as the estimator asks it (`estimate_group`,
            # `Calibration.efficiency`).
            reuse = p.reuse or intensity
            call_flops = (2 * p.macs if p.reuse else flops) / p.calls
            if memory_s < COMPUTE_BOUND_SHARE * run_s and run_s > 0:
                eff_points.append((call_flops, reuse, min(1.0, work / (peak * run_s)),
                                   memory_level(hw, call_flops / reuse).name))
        if eff_points:
            f, i, e, lv = zip(*eff_points, strict=True)
            curves[cls] = fit_curve(np.asarray(f), np.asarray(i), np.asarray(e), lv)
    return Calibration(
        host=host_name(), cpu=detect_cpu().model, threads=threads,
        peak_fp32_tflops=peak / 1e12, gemm_tflops=square / 1e12,
        kernel_overhead_us=kernel_s * 1e6, bandwidth_gbps=bandwidth, curves=curves,
        levels=[(lv.name, lv.size_bytes) for lv in hw.memory],
        points=tuple(points), ort_version=ort.__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        transcendental_flops=tau,
        copy_run_ns=fit_copy_run([p for p in points if p.runs], hw, bandwidth))


def fit_copy_run(points: Sequence[Point], hw: HardwareProfile, bandwidth: dict[str, float]
                 ) -> float:
    """Nanoseconds per contiguous run a Transpose copies (`transpose_runs`), beyond the time
    its bytes take at the fitted bandwidth of their level: all the points' extra time over
    all their runs (a least-squares slope through the origin would let the point with most
    runs decide alone; a median would let one with 128 runs, whose extra time is noise). 0
    without such points. Measured here: 10.9 ns per run of 8 floats, 6.3 ns per run of 32."""
    extra_s = sum(p.seconds - _stream_s(p.bytes, hw, bandwidth) for p in points)
    runs = sum(p.runs for p in points)
    return max(0.0, extra_s / runs * 1e9) if runs else 0.0


def _stream_s(nbytes: float, hw: HardwareProfile, bandwidth: dict[str, float]) -> float:
    """`nbytes` at the fitted bandwidth of the level they fit in (the profile's own where
    that level was not fitted)."""
    level = memory_level(hw, nbytes)
    return nbytes / (bandwidth.get(level.name, level.bandwidth_gbps) * 1e9)


def fit_vector(points: Sequence[Point], hw: HardwareProfile, peak: float
               ) -> tuple[dict[str, float], Curve, float]:
    """Bandwidth per memory level, the `elementwise` curve and τ, the plain vector FLOPs one
    transcendental evaluation costs, from benchmarks without MACs: for each τ on
    TRANSCENDENTAL_GRID, `_fit_vector_at` fits bandwidths and curve; the τ whose fit predicts
    the times of the benchmarks they are for (all but the classes with curves of their own)
    best, by mean |ln(max(compute, memory) / measured)|, wins. A Relu and a Sigmoid of the
    same size do one FLOP per element each by our count, the Sigmoid's a transcendental: the
    Relu streams at the bandwidth, the Sigmoid is slower by what τ says."""
    levels = [memory_level(hw, p.bytes).name for p in points]
    mine = [(p, lv) for p, lv in zip(points, levels, strict=True)
            if p.op_class not in OWN_VECTOR_CLASSES]
    best: tuple[float, dict[str, float], Curve, float] | None = None
    for tau in map(float, TRANSCENDENTAL_GRID):
        bandwidth, curve = _fit_vector_at(points, levels, hw, peak, tau)
        error = statistics.fmean(
            abs(math.log(_vector_time(p, bandwidth[lv], curve, peak, tau) / p.seconds))
            for p, lv in mine)
        if best is None or error < best[0]:
            best = (error, bandwidth, curve, tau)
    assert best is not None
    return best[1], best[2], best[3]


def _vector_time(p: Point, gbps: float, curve: Curve, peak: float, tau: float) -> float:
    """The estimator's time of a benchmark without MACs: max(compute, memory)."""
    work = p.cost().vector_flops(tau)
    compute_s = work / (peak * curve(work, work / p.bytes)) if work else 0.0
    return max(compute_s, p.bytes / (gbps * 1e9))


def _fit_vector_at(points: Sequence[Point], levels: Sequence[str], hw: HardwareProfile,
                   peak: float, tau: float) -> tuple[dict[str, float], Curve]:
    """Bandwidths and the `elementwise` curve at τ, fitted in turn: bandwidth on the
    benchmarks the curve calls memory bound, the curve on those the bandwidths call compute
    bound. The curve has no reuse factor and no level factors (an elementwise op's traffic is
    the memory term's business); it costs kernels without MACs only (a kernel with MACs runs
    its bias and activation at its own rate)."""
    rates = [p.bytes / p.seconds / 1e9 for p in points]
    bandwidth = {lv: max(r for r, lv2 in zip(rates, levels, strict=True) if lv2 == lv)
                 for lv in set(levels)}
    curve = Curve(1.0)

    def compute_s(p: Point) -> float:
        work = p.cost().vector_flops(tau)
        return work / (peak * curve(work, work / p.bytes))

    for _ in range(FIT_ROUNDS):
        eff_points = _compute_bound(points, levels, bandwidth, peak, tau)
        if eff_points:
            curve = fit_curve(*map(np.asarray, zip(*eff_points, strict=True)), reuse=False)
        for lv in bandwidth:
            bound = [r for p, r, lv2 in zip(points, rates, levels, strict=True) if lv2 == lv
                     and (not p.other_flops or compute_s(p) < COMPUTE_BOUND_SHARE * p.seconds)]
            if bound:
                bandwidth[lv] = statistics.median(bound)
    # A faster level is never slower: its tiny benchmarks are mostly fixed cost.
    slowest = 0.0
    for level in reversed([lv.name for lv in hw.memory if lv.name in bandwidth]):
        slowest = bandwidth[level] = max(bandwidth[level], slowest)
    return bandwidth, curve


def _compute_bound(points: Sequence[Point], levels: Sequence[str], bandwidth: dict[str, float],
                   peak: float, tau: float) -> list[tuple[float, float, float]]:
    """(work, work per byte, efficiency) of the benchmarks without MACs that `bandwidth` does
    not call memory bound, their work in plain-FLOP equivalents at τ."""
    out = []
    for p, lv in zip(points, levels, strict=True):
        work = p.cost().vector_flops(tau)
        if work and p.bytes / (bandwidth[lv] * 1e9) < COMPUTE_BOUND_SHARE * p.seconds:
            out.append((work, work / p.bytes, work / (peak * p.seconds)))
    return out


def fit_vector_classes(points: Sequence[Point], hw: HardwareProfile, peak: float,
                       bandwidth: dict[str, float], tau: float = 1.0) -> dict[str, Curve]:
    """A curve of its own for each class in OWN_VECTOR_CLASSES (pools, normalizations,
    reductions) with at least LEVEL_POINTS benchmarks: their loops (a window, a row statistic,
    exp) run at rates of their own, not an elementwise op's. Fitted on every benchmark of the
    class, memory bound or not, its work in plain-FLOP equivalents at τ: the curve then gives
    its measured time, and the memory term takes over only where the bandwidths say a level
    is slower still (a pool streams its input faster than an elementwise op of the same
    bytes, which writes as much as it reads: its benchmarks sit above the fitted bandwidths,
    not on them)."""
    curves = {}
    for cls in OWN_VECTOR_CLASSES:
        mine = [p for p in points if p.op_class == cls]
        eff_points = _compute_bound(mine, [memory_level(hw, p.bytes).name for p in mine],
                                    {lv: math.inf for lv in bandwidth}, peak, tau)
        if len(eff_points) >= LEVEL_POINTS:
            curves[cls] = fit_curve(*map(np.asarray, zip(*eff_points, strict=True)))
    return curves


def fit_check(cal: Calibration) -> dict[str, float]:
    """Per op class, the median |estimate / measured - 1| of the calibration's own benchmarks:
    each costed by the estimator (`estimate_group`, one kernel on the calibrated profile, no
    overhead: a point's time has it taken out) against the time measured. How well the fitted
    model explains what it was fitted on; a curve's own `log_error` covers only the points
    that curve was fitted on."""
    hw = apply_calibration(host_profile(cal.threads), cal)
    errors: dict[str, list[float]] = {}
    for p in cal.points:
        seconds = estimate_group(p.cost(), p.op_class, hw, "fp32", cal.efficiency, 0, p.reuse,
                                 p.calls, p.runs).latency_s
        if p.pass_flops:
            seconds += activation_pass(p.pass_cost(), hw, "fp32", cal.efficiency).latency_s
        errors.setdefault(p.op_class, []).append(abs(seconds / p.seconds - 1))
    return {cls: statistics.median(errs) for cls, errs in errors.items()}


def describe_fit_check(cal: Calibration) -> str:
    """`fit_check` in one line, worst class first."""
    check = sorted(fit_check(cal).items(), key=lambda kv: -kv[1])
    return ("fit check, median |estimate / measured - 1| on its own benchmarks: "
            + ", ".join(f"{cls} {err:.0%}" for cls, err in check))


def fit_curve(flops: np.ndarray, intensity: np.ndarray, eff: np.ndarray,
              levels: Sequence[str] = (), reuse: bool = True) -> Curve:
    """Least absolute deviations on ln(eff) of e_max · F/(F + f_half) · I/(I + i_half · level
    factor), with e_max <= 1. The shape is fitted on the most common level's points (the
    reference, factor 1; all points when no levels are given): a grid over (f_half, i_half)
    with e_max closed-form (the median log residual). Each other level with LEVEL_POINTS
    points or more then takes the factor from LEVEL_GRID that fits its points best, and e_max
    is refitted on all. Intensities past the largest fitted one are read as it (no
    extrapolation). Absolute, not squared, deviations: one odd benchmark (a channel count ORT
    runs on a slow path) must not drag a whole class. Fewer than 3 points fit e_max alone;
    `reuse` False fits no reuse factor (i_half 0)."""
    y = np.log(eff)
    names = np.asarray(levels if len(levels) else [""] * len(y))
    counts = {lv: int((names == lv).sum()) for lv in dict.fromkeys(names.tolist())}
    reference, *others = sorted(counts, key=lambda lv: -counts[lv])
    ref = names == reference
    f_grid = np.asarray(F_HALF_GRID if ref.sum() >= 3 else (0.0,))
    i_grid = np.asarray(I_HALF_GRID if reuse and ref.sum() >= 3 else (0.0,))
    g = (np.log(flops[ref] / (flops[ref] + f_grid[:, None]))[:, None, :]
         + np.log(intensity[ref] / (intensity[ref] + i_grid[:, None]))[None, :, :])
    r = y[ref] - g  # ln e_max each reference point asks for
    log_e = np.minimum(np.median(r, axis=-1), 0.0)  # e_max <= 1
    fi, ii = np.unravel_index(int(np.argmin(np.abs(r - log_e[..., None]).mean(axis=-1))),
                              log_e.shape)
    f_half, i_half = float(f_grid[fi]), float(i_grid[ii])
    size = np.log(flops / (flops + f_half))
    scale = np.ones_like(y)  # each point's i_half factor
    factors: dict[str, float] = {}
    for level in others if i_half else ():
        mask = names == level
        if mask.sum() >= LEVEL_POINTS:
            reuse = np.log(intensity[mask] / (intensity[mask] + i_half * LEVEL_GRID[:, None]))
            level_err = np.abs(y[mask] - log_e[fi, ii] - size[mask] - reuse).mean(axis=-1)
            factors[level] = float(LEVEL_GRID[int(np.argmin(level_err))])
            scale[mask] = factors[level]
    shape = size + np.log(intensity / (intensity + i_half * scale))
    e_max = min(float(np.median(y - shape)), 0.0)
    return Curve(float(math.exp(e_max)), f_half, i_half, float(intensity.max()), factors,
                 len(y), float(np.abs(y - shape - e_max).mean()))
