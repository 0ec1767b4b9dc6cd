"""The native executor's kernel models: the kernels its own planner makes of each group.

The estimate of a profile calibrated through native-cpu (`onnxlens calibrate --backend
native-cpu`) costs what the executor runs, read from the planner itself
(`plan.lower_groups`), never from a restatement of its rules:

- a Conv, Gemm or MatMul with the elementwise nodes fused after it is one kernel. Its
  epilogue runs at the kernel's rate, on values in registers, when the tile can apply it as
  it stores (ops.def's TILE_EPILOGUE: bias, BatchNorm as scale and shift, a residual Add,
  Relu, Clip); any other op (SiLU, HardSwish, Sigmoid ...) makes the core run the whole
  program over the output after the tile, a pass at the elementwise rate (`_interpreted`). A
  batched MatMul is one GEMM call per matrix when B is batched (`_gemm_calls`);
- a convolution keeps its class (`depthwise`, `grouped_conv`, `conv`): the core's depthwise
  path is what the calibration's depthwise benchmarks timed, one call per channel plane
  (`_planes`), its output rows in whole blocks of 16 columns, a stride-2 one loading two
  input vectors per output vector and tap (`depthwise_work`); a global pool is a `reduce`;
- a run of elementwise nodes is one Elementwise kernel (its register program), which reads
  the tensors entering it and writes the one leaving it;
- any other group (attention, a norm, a squeeze-excite) runs as the planner's sequence of
  kernels, their intermediate values in scratch memory: each kernel pays its own traffic and
  launch;
- a view (Reshape, Squeeze, ...) is a Copy kernel of its bytes, not free as the analysis
  charges it: the executor gives its output a tensor of its own; a data-movement kernel
  pays each separate memcpy it makes and each element a strided loop copies alone
  (`copies`), and a Copy or Gather reads only what it writes;
- a row-wise kernel (a normalization, Softmax, a reduction, a global pool) pays a fixed cost
  per vector pass over each row (`row_passes`), which short rows do not amortize;
- nodes computed from constants are folded before the run and cost nothing; a folded tensor
  that crosses a group boundary is copied into the arena (a `data_movement` kernel of its
  bytes).

Each kernel's cost is `analyzer.runtimes.kernel_of` of the nodes it computes (their formulas,
the tensors crossing the kernel's boundary), so its FLOPs are the analyzer's own. A group the
executor cannot run is estimated as one kernel (what the analyzer would otherwise assume), so
the estimate stays complete; `onnxlens compare` says the backend cannot run it. A GEMM's
MACs are those of the whole micro-tiles the core computes (`tile_work`). Not modelled: the
other conditions of the tile's epilogue (per-row constants; no residual in a depthwise
kernel), under which a program of TILE_EPILOGUE ops also runs as a pass; a Softmax over an
inner axis gathers each row before its passes (charged its passes only); memcpy-based copies
(Concat, Slice) stream faster than the elementwise benchmarks that fit the bandwidths.

native-cuda (`-H a100 --runtime native-cuda`) costs the same plan on a GPU profile, each plan
kernel one CUDA launch (`cuda/lower.cpp`; a group with a kernel the CUDA executor lacks is one
kernel), at the profile's constant efficiencies: no GPU has calibrated it, and every output
of such an estimate says `calibrated: false`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable

from ...analyzer.cost.base import Cost
from ...analyzer.cost.moe import moe_layout
from ...analyzer.cost.ops import VIEWS
from ...analyzer.fusion import Group
from ...analyzer.graph import ModelGraph
from ...analyzer.hardware import (
    NATIVE_CPU,
    NATIVE_CUDA,
    NATIVE_GQA,
    NATIVE_NBITS,
    HardwareProfile,
)
from ...analyzer.ir import NodeInfo, dtype_bytes
from ...analyzer.loader import LoadedModel
from ...analyzer.runtimes import (
    ANY,
    GroupKernels,
    Kernel,
    inner_run,
    kernel_of,
    node_class,
    one_kernel_per_group,
    register_kernel_model,
)
from . import lower
from .catalogue import GEMM_NARROW_COLS, GEMM_TILES, REDUCE_OPS, TILE_EPILOGUE
from .lower import MAIN_OPS
from .plan import FOLDED, lower_groups


class NativePlan:
    """The native executor's plan, kernel by kernel, for one of its runtimes: native-cpu, or
    native-cuda (the same plan, each kernel one CUDA launch: `cuda/lower.cpp`), where a group
    with a kernel the CUDA executor lacks is one kernel, as a refused group."""

    def __init__(self, runtime: str, runnable: Callable[[], frozenset[str]] | None = None
                 ) -> None:
        self.runtime = runtime
        self._runnable = runnable  # the kernel ops this runtime has (None: all the plan makes)

    def kernels(self, mg: ModelGraph, groups: list[Group], node_costs: dict[str, Cost | None],
                group_costs: dict[int, Cost | None], hw: HardwareProfile,
                model: LoadedModel | None = None) -> GroupKernels:
        if model is None:  # no tensors to plan with: the analyzer's groups as they are
            return one_kernel_per_group.kernels(mg, groups, node_costs, group_costs, hw)
        lowered = lower_groups(model, mg, groups)
        ops = self._runnable() if self._runnable else None
        refused = lowered.refused | {
            step.group for step in lowered.steps
            if ops is not None and any(k.op not in ops for k in step.kernels)}
        fallback = one_kernel_per_group.kernels(
            mg, [g for g in groups if g.id in refused], node_costs, group_costs, hw)
        cpu = self.runtime == NATIVE_CPU
        copies_inside = cpu and own_class(hw, NATIVE_GQA)
        out: GroupKernels = {}
        for group, step in zip(groups, lowered.steps, strict=True):
            if group.id in refused or any(node_costs.get(k) is None for k in group.nodes):
                out[group.id] = fallback.get(group.id)
                continue
            out[group.id] = _cache_copies(step.kernels, model, copies_inside) + [
                _kernel(mg, k, node_costs, model, cpu, hw) for k in step.kernels]
        return out


def own_class(hw: HardwareProfile, cls: str) -> bool:
    """Whether `hw` prices native class `cls` (NATIVE_NBITS, NATIVE_GQA) as a class of its own:
    uncalibrated (a calibration reads its benchmarks through it) or calibrated with its curve.
    A calibration taken before the class costs the kernel as before it: MatMulNBits at the
    gemm curve, GroupQueryAttention at the attention curve with its cache copy a
    data-movement kernel apart."""
    return not hw.calibrated or cls in hw.efficiency


def _cache_copies(kernels: list[lower.Kernel], model: LoadedModel, inside: bool
                  ) -> list[Kernel]:
    """GroupQueryAttention's copy of the past K and V into present (k_attention.cpp
    `extend_cache`, one memcpy per batch, KV head and tensor) before its arithmetic: past bytes
    read and written again, which the node's cost (each tensor once) leaves out. Measured (Qwen2
    genai decoder, 2 KV heads of 32, past 1000, 1 thread, Zen 5): 72 us a layer, 14 us estimated
    without it; the copy is 512 KB each way. None when the GroupQueryAttention kernel's own
    class (`inside`: `row_attention`) has the copy in its cost."""
    out = []
    if inside:
        return out
    for k in kernels:
        past = [model.tensors[n] for n in k.inputs[3:5] if k.op == "GroupQueryAttention" and n]
        nbytes = sum(t.nbytes for t in past)
        if nbytes:
            runs = 2 * math.prod(past[0].dims[:2])
            out.append(Kernel("data_movement", Cost(bytes_read=nbytes, bytes_written=nbytes),
                              tuple(k.nodes), runs=runs))
    return out


def _kernel(mg: ModelGraph, k: lower.Kernel, costs: dict[str, Cost | None],
            model: LoadedModel, cpu: bool, hw: HardwareProfile) -> Kernel:
    """Plan kernel `k` as the estimator costs it; `cpu`: as the C++ CPU core runs it (its GEMM
    tiles, its epilogue passes), which the CUDA executor's kernels do not share."""
    if not k.nodes:  # a folded tensor copied into the arena: read once, written once
        nbytes = sum(model.tensors[n].nbytes for n in k.outputs)
        name = k.inputs[0] or ""
        return Kernel("data_movement", Cost(bytes_read=nbytes, bytes_written=nbytes),
                      (name.removesuffix(FOLDED),))
    if k.op == "Copy" and len(k.nodes) == 1 and mg.info(k.nodes[0]).op_type in VIEWS:
        return _copied_view(mg, k)
    cls = _CLASS_OF_KERNEL.get(k.op) or node_class(mg.info(k.nodes[0]))
    passes = frozenset(k.nodes[1:]) if cpu and _interpreted(k) else frozenset()
    dims = {name: model.tensors[name].dims
            for name in [*k.inputs, *k.outputs, *(name for name, _ in k.operands)]
            if name and name in model.tensors}
    calls = _gemm_calls(k, dims) if cls != "depthwise" else _planes(k, dims)
    out = model.tensors.get(k.outputs[0]) if k.outputs else None
    if cpu and out is not None and blocked_transpose(k, dims, dtype_bytes(out.elem_type)):
        runs, elements = 0, 0
    else:
        runs, elements = copies(k, dims)
    kernel = kernel_of(mg, k.nodes, costs, cls, ANY, ANY, passes=passes, calls=calls,
                       runs=runs)
    cost = kernel.cost
    # MatMulNBits runs a kernel of its own (k_nbits.cpp), not the GEMM's tiles.
    if cpu and (work := winograd_work(k, dims, winograd_lanes())) is not None:
        cost = dataclasses.replace(cost, macs=round(cost.macs * work))
    elif (cpu and cls in ("conv", "grouped_conv", "gemm") and k.op != "MatMulNBits"
            and (tile := gemm_tile()) is not None):
        shape = _gemm_shape(k, dims.get(k.outputs[0], ()), calls)
        cost = dataclasses.replace(cost, macs=round(cost.macs * tile_work(*shape, *tile)))
    if cpu and k.op == "MatMulNBits":
        rows = math.prod(dims.get(k.outputs[0], (1,))[:-1])
        cost = dataclasses.replace(cost, macs=round(cost.macs * nbits_work(rows)))
        if own_class(hw, NATIVE_NBITS):  # it multiplies floats: at the fp32 peak, whatever
            kernel = dataclasses.replace(kernel, cls=NATIVE_NBITS, peak="fp32")  # the group's
    if cpu and k.op == "GroupQueryAttention" and own_class(hw, NATIVE_GQA):
        return row_attention(kernel, k, dims)
    if cpu and k.op == "MoE":
        return expert_gemms(kernel, k, mg.info(k.nodes[0]), hw)
    if cpu and cls == "depthwise":
        work = depthwise_work(k, dims.get(k.outputs[0], (1,)), dims.get(k.inputs[0], (1,)))
        cost = dataclasses.replace(cost, macs=round(cost.macs * work))
    if k.op in _PICKING and k.outputs[0] in model.tensors:
        picked = model.tensors[k.outputs[0]].nbytes + sum(
            model.tensors[n].nbytes for n in k.inputs[1:] if n in model.tensors)
        # An embedding table is a weight the Gather reads only the picked rows of.
        cost = _reads_at_most(cost, picked)
    if k.op == "GatherBlockQuantized":
        cost = _picked_blocks(mg.info(k.nodes[0]), cost)
        # Its loop takes each value apart with a shift by a count of its own, one value at a
        # time at the baseline ISA it is compiled for: every output value an element.
        elements = math.prod(dims.get(k.outputs[0], ()))
    return dataclasses.replace(kernel, cost=cost, elements=elements,
                               rows=row_passes(k, dims))


def _picked_blocks(info: NodeInfo, cost: Cost) -> Cost:
    """GatherBlockQuantized as k_nbits.cpp runs it reads, per index, its row of the packed
    table, the row's scales and (when the model has them) its zero points, which the planner
    turned into floats of the scales' shape, and the indices, where the analysis charges the
    whole table (an embedding of 2048 x 256 int4 values: 320 KB for one token's 640 bytes)."""
    data, ids, scales = info.inputs[0], info.inputs[1], info.inputs[2]
    if data is None or ids is None or scales is None or not data.dims or not data.dims[0]:
        return cost
    floats = 2 if info.input(3) is not None else 1
    row = data.nbytes // data.dims[0] + floats * scales.nbytes // data.dims[0]
    return _reads_at_most(cost, ids.size * row + ids.nbytes)


def _reads_at_most(cost: Cost, picked: int) -> Cost:
    """`cost` reading at most `picked` bytes, weights among them."""
    return dataclasses.replace(cost, bytes_read=min(cost.bytes_read, picked),
                               param_bytes=min(cost.param_bytes, picked))


def row_attention(kernel: Kernel, k: lower.Kernel, dims: dict[str, tuple[int, ...]]
                  ) -> Kernel:
    """A GroupQueryAttention as k_attention.cpp runs it, one kernel of class NATIVE_GQA: it
    copies each KV head's past into the present (`extend_cache`), then takes the query rows
    (batch x heads x new tokens) one at a time (`attend`): rotary on the row, the scores over
    its causal keys (past + s + 1 for new token s, at most local_window_size: `causal_keys`;
    a sliding window's buffer read as full) as dot products of the head size D, a
    softmax's max and exp-sum passes over them, and the weighted values as axpys of D.

    - MACs: 2·D a score (a dot product and an axpy), causal scores only: the analysis counts
      every row over all past + S keys (its attention cost: ORT computes the full product), so
      prefill 8 with no past does 36 of its 64 scores a head;
    - calls: the query rows, each a job with its own fixed cost (rotary, the softmax's passes
      and their horizontal max and sum, a store), so the curve's f_half is a cost per row;
    - reuse: 4·D FLOPs a score, so the curve's i_half is a cost per score whatever D (its
      16-lane horizontal sum), as ORT's `gqa_decode`;
    - bytes: the node's boundary (past read, present written), and the present K and V read
      again by the rows (the copy's re-read, once: a KV head's query heads share it in cache;
      twice with a sliding window's buffer: into it and out to present); with
      GQA_TRANSPOSE_ROWS query rows or more to a KV head its keys transposed, written and read
      once more;
      of the rotary caches (the node's whole cos and sin) only the new tokens' rows.
    """
    q, y = dims.get(k.inputs[0] or "", ()), dims.get(k.outputs[0], ())
    present = [dims.get(name, ()) for name in k.outputs[1:3]]
    if len(q) != 3 or not y or any(len(p) != 4 for p in present):
        return dataclasses.replace(kernel, cls=NATIVE_GQA)
    batch, seq = q[0], q[1]
    heads = k.ints["num_heads"][0]
    window = k.ints.get("local_window_size", [-1])[0]
    sliding = bool(k.ints.get("sliding_window_cache", [0])[0])
    past, head = present[0][2] - (0 if sliding else seq), present[0][3]
    scores = batch * heads * causal_keys(past, seq, window)
    reread = 4 * sum(math.prod(p) for p in present)
    if sliding:  # its keys a buffer apart: the past copied in, the kept rows copied out
        reread *= 2
    if seq * heads // k.ints["kv_num_heads"][0] >= GQA_TRANSPOSE_ROWS:
        reread += 2 * 4 * math.prod(present[0][:2]) * (past + seq) * head  # keys transposed
    unread = 4 * sum((c[0] - seq) * c[1] for name in k.inputs[6:8]
                     if len(c := dims.get(name or "", ())) == 2)
    cost = dataclasses.replace(kernel.cost, macs=2 * head * scores,
                               bytes_read=kernel.cost.bytes_read + reread - unread)
    return dataclasses.replace(kernel, cls=NATIVE_GQA, cost=cost, calls=batch * heads * seq,
                               reuse=4 * head)


def causal_keys(past: int, seq: int, window: int) -> int:
    """The keys the `seq` new query rows after `past` cached tokens attend, together: row s
    sees n = past + s + 1 of them, at most `window` (local_window_size; <= 0: none). Sum of
    min(n, W) over n = past + 1 .. past + seq: the c = clamp(W - past, 0, seq) rows under the
    window see past + 1 .. past + c (c·past + c(c + 1)/2), the rest W each. A sliding window's
    buffer of W rows is read as full (its tokens count is an input's value, not a shape):
    prefill over it counts W keys a row, W(W - 1)/2 more than ORT's first rows attend."""
    if window <= 0:
        return seq * past + seq * (seq + 1) // 2
    under = min(max(window - past, 0), seq)
    return under * past + under * (under + 1) // 2 + (seq - under) * window


def expert_gemms(kernel: Kernel, k: lower.Kernel, info: NodeInfo, hw: HardwareProfile
                 ) -> Kernel:
    """MoE / QMoE as k_moe.cpp runs them: each used expert's routed rows through two products
    (fc1, fc2), where the analysis has no class for the op (elementwise):
    - float experts (MoE; QMoE's 8-bit, dequantized by the planner): the core's GEMM, class
      gemm at the fp32 peak, reading the used experts' float32 weights, 4·(F·I·H + H·I) bytes
      each;
    - 4-bit experts (QMoE): MatMulNBits' product (class NATIVE_NBITS where the profile prices
      it, its conversions `nbits_work` at the mean rows an expert gets), reading each used
      expert's packed weight (a byte per 2 values, blocks padded) and a float scale and zero
      point per block and row;
    - calls: 2 per expert used, at most min(E, T·k) of the E; and their biases;
    - QMoE's dequantization (2 FLOPs a picked weight in the analysis) is not a float
      expert's: the planner's, once; a 4-bit product's conversions are its MACs' factor."""
    tokens, hidden, experts, inter, fusion = moe_layout(info)
    picks = tokens * info.attr("k", 1)
    used = min(experts, picks)
    per_expert = fusion * inter * hidden + hidden * inter
    biases = (4, 7) if info.op_type == "QMoE" else (3, 5)
    bias_bytes = sum(b.nbytes for at in biases if (b := info.input(at)) is not None)
    macs, cls = kernel.cost.macs, "gemm"
    if k.ints.get("bits", [0])[0] == 4:
        packed = 0
        for rows, depth, block in ((fusion * inter, hidden, k.ints["block_size"][0]),
                                   (hidden, inter, k.ints["block_size"][1])):
            blocks = -(-depth // block)
            packed += rows * blocks * (block // 2 + 8)  # bytes, scale and zero point floats
        macs = round(macs * nbits_work(-(-picks // used)))
        cls = NATIVE_NBITS if own_class(hw, NATIVE_NBITS) else "gemm"
    else:
        packed = 4 * per_expert
    weights = used * (packed + bias_bytes // experts)
    dequantized = 2 * per_expert * picks if info.op_type == "QMoE" else 0
    cost = dataclasses.replace(kernel.cost, macs=macs,
                               other_flops=kernel.cost.other_flops - dequantized,
                               bytes_read=kernel.cost.bytes_read - kernel.cost.param_bytes
                               + weights, param_bytes=weights)
    return dataclasses.replace(kernel, cls=cls, peak="fp32", cost=cost, calls=2 * used)


# Query rows to a KV head from which k_attention.cpp transposes its keys (kTransposeRows).
GQA_TRANSPOSE_ROWS = 8


# Copy kernels that read only the elements they write (a Slice, Transpose, Expand; a Gather,
# and its indices): the analysis charges the whole input (Swin-T's Gathers of one of q, k, v
# from [3, 64, 3, 49, 32]: 3.6 MB charged, 1.2 MB copied).
_PICKING = frozenset({"Copy", "Gather"})


# Plan kernels whose class is not their node's: an elementwise program; a global pool, which
# the core runs as the row sum or max a Reduce over contiguous axes runs (k_pool.cpp's
# simd_.sum / simd_.max per channel plane), not as a windowed pool.
_CLASS_OF_KERNEL = {"Elementwise": "elementwise", "GlobalAveragePool": "reduce",
                    "GlobalMaxPool": "reduce"}


@functools.cache
def gemm_tile() -> tuple[int, int] | None:
    """The GEMM micro-tile (mr, nr) the core computes on this CPU: ops.def's GEMM_TILE row of
    the instruction set it picks (`_native.default_isa`); None when it is not built."""
    try:
        from .. import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return GEMM_TILES[_native.default_isa()]


@functools.cache
def winograd_lanes() -> int:
    """The channel block of the core's Winograd F(2x2, 3x3) convolution on this CPU
    (`_native.winograd_lanes`); 0 where it has none or the core is not built."""
    try:
        from .. import _native  # type: ignore[attr-defined]
    except ImportError:
        return 0
    return int(_native.winograd_lanes())


def winograd_work(k: lower.Kernel, dims: dict[str, tuple[int, ...]], lanes: int
                  ) -> float | None:
    """The work of a 3x3 convolution of stride and dilation 1 that the core runs as Winograd
    F(2x2, 3x3) (k_conv.cpp BlockedDirect::winograd_fits: whole blocks of `lanes` channels, 32
    or more; filters filling three quarters of their blocks, as the blocked kernel takes them)
    over its direct multiply-adds; None for any other. Per tile of 2 x 2 output pixels (the
    plane rounded up to whole tiles) and image: 16 products per channel and filter, where
    direct takes 4 x 9; the input's transform 32 adds per channel, the output's 24 per
    filter. ResNet-18's 3x3 convolutions of 64-256 channels at 56-14 pixels: 0.47-0.46
    charged, 0.52-0.58x measured (Zen 4, AVX-512, 1 thread)."""
    if not lanes or k.op != "Conv":
        return None
    x, y = dims.get(k.inputs[0] or "", ()), dims.get(k.outputs[0], ())
    if (len(x) != 4 or len(y) != 4 or k.ints.get("kernel_shape") != [3, 3]
            or k.ints.get("strides") != [1, 1] or k.ints.get("dilations") != [1, 1]
            or k.ints.get("group") != [1]):
        return None
    c, m = x[1], y[1]
    if c % lanes or c < 32 or 4 * m < 3 * -(-m // lanes) * lanes:
        return None
    tiles = -(-y[2] // 2) * -(-y[3] // 2)
    return (16 * c * m + 32 * c + 24 * m) * tiles / (9 * c * m * y[2] * y[3])


def _planes(k: lower.Kernel, dims: dict[str, tuple[int, ...]]) -> int:
    """The output channel planes a depthwise kernel computes one at a time (k_conv.cpp
    `run_depthwise`), each a call with its own fixed cost (edges, a masked last vector).
    With calls and `depthwise_work`'s strides, the depthwise curve's fit check on its own 33
    benchmarks went 24% -> 13% on the 16:44 calibration's timings and 22% -> 13% on the
    15:59 one's, the same curve from both (e_max 0.217, f_half 1778 FLOPs: 38 ns a plane),
    where one fixed cost per kernel read 6 x 6 planes up to 64% fast."""
    y = dims.get(k.outputs[0], ())
    return max(1, math.prod(y[:2])) if y else 1


DEPTHWISE_COLUMNS = 16  # simd_kernels.inc `depthwise_row_block`'s block, on every ISA


def depthwise_work(k: lower.Kernel, y: tuple[int, ...], x: tuple[int, ...]) -> float:
    """The work of a depthwise kernel with output `y` and input `x` over its MACs, as the core
    runs it (simd_kernels.inc `depthwise_row_block`, `depthwise_block`): each output row in
    whole blocks of DEPTHWISE_COLUMNS (a last block masked: a 9-wide row computes 16), and
    per output vector and tap one input vector loaded at column stride 1, two at any other (a
    stride-2 block loads 32 floats for 16 outputs and takes every other one; a wider stride
    gathers 16 scalars, not measured). On the calibrations' timings, one rate for every width
    and stride had read the stride-2 benchmarks 21-37% fast and 5x5 and 7x7 kernels on 6x6
    planes 43-47% fast; with the blocks, the depthwise fit check went 13 -> 8%, 11 -> 6% and
    14 -> 8% (16:53, 16:57, 17:04 calibrations); the strides had taken it 24 -> 13% before
    (with `_planes`). A stride-1 plane narrower than two blocks whose output rows are as wide
    as its input's is one flat row of vectors across output rows (`depthwise_flat`): a 7 x 7
    plane computes 64 outputs, not 7 x 16."""
    width, plane = y[-1], math.prod(y[2:])
    unit = all(s == 1 for s in k.ints["strides"])
    if unit and width == x[-1] and width < 2 * DEPTHWISE_COLUMNS:
        return -(-plane // DEPTHWISE_COLUMNS) * DEPTHWISE_COLUMNS / max(plane, 1)
    blocks = -(-width // DEPTHWISE_COLUMNS) * DEPTHWISE_COLUMNS / max(width, 1)
    return blocks * (1 if k.ints["strides"][-1] == 1 else 2)


# gemm.cpp `columns`: up to GEMM_NARROW_COLS (ops.def; simd.h kNarrowCols) columns past a
# tile's whole vectors of nr / 2 run column by column (gemm_ucols), each costing about
# NARROW_COST columns of the micro-kernel (perf, AVX-512, a 512 x 49 x 4608 product: the 1
# narrow column took 5.4% of the time, the 16-column vector beside it 20.4%).
NARROW_COST = 4


# Rows of A up to which k_nbits.cpp's MatMulNBits converts the 4-bit values row by row
# (kDirectRows there); above, once per run into a float panel the rows share.
NBITS_DIRECT_ROWS = 2


def nbits_work(rows: int) -> float:
    """MatMulNBits' work on the core per MAC of the product (charged at the GEMM class's
    rate): each weight value is also converted to a float, one operation like a MAC, by every
    row up to NBITS_DIRECT_ROWS rows, else once: 1 + conversions / (rows · K · N), so 2 for a
    decode step, 1 + 1/8 for 8 rows. Measured (1 thread, Zen 5, AVX-512, N 4096, K 256): 1 row
    54 us, 8 rows 158 us (2.9x the time for 4.5x the charged work: the rows also share the
    loads of the panel)."""
    rows = max(rows, 1)
    return 1.0 + (rows if rows <= NBITS_DIRECT_ROWS else 1) / rows


def tile_columns(n: int, nr: int) -> int:
    """The columns a full-height tile row computes for n columns: whole tiles of nr, then the
    last tile's columns in vectors of nr / 2, or its few columns past them
    (1..GEMM_NARROW_COLS) at NARROW_COST each. The generic ISA's micro-kernel computes all nr
    columns of a vector pair; its tiles are charged as AVX2's."""
    half = max(nr // 2, 1)
    last = n % nr
    narrow = last % half
    if 1 <= narrow <= GEMM_NARROW_COLS:
        return n - last + (last - narrow) + NARROW_COST * narrow
    return n - last + -(-last // half) * half


def tile_work(m: int, n: int, mr: int, nr: int) -> float:
    """The work of an m x n GEMM product over its own, as the core runs it (gemm.cpp `tile`):
    every row over `tile_columns` (a last tile of fewer rows computes only its own: the
    micro-kernel has an instance per row count), except a last tile of one row, which is a
    matrix-vector product (gemv_panel, nr columns wide). AVX-512's 12 x 32 tile on ResNet-18's
    last convolutions (512 rows, 7·7 = 49 columns): 32 + 16 + 1 narrow columns, 52 charged,
    1.06x; on a squeeze-excite's 1x1 convolution of one pixel (240 rows, 1 column), 4x."""
    if m <= 0 or n <= 0:
        return 1.0
    gemv = 1 if m % mr == 1 else 0
    padded = -(-n // nr) * nr
    work = (m - gemv) * tile_columns(n, nr) + gemv * padded
    return work / (m * n)


def _gemm_shape(k: lower.Kernel, y: tuple[int, ...], calls: int) -> tuple[int, int]:
    """Rows and columns of one GEMM of a main kernel writing `y`: a convolution's output
    channels (per group) by its pixels; a Gemm's or MatMul's rows (per call) by columns."""
    if not y:
        return 0, 0
    if k.op == "Conv":
        return y[1] // k.ints["group"][0], y[0] * math.prod(y[2:])
    return math.prod(y[:-1]) // calls, y[-1]


def _gemm_calls(k: lower.Kernel, dims: dict[str, tuple[int, ...]]) -> int:
    """The GEMMs the core's MatMul makes (k_matmul.cpp): one per matrix of the output's batch
    when B is batched (attention's Q·Kᵀ and P·V: Swin-T's first stage, 192 of 49x32x49); one
    when B is a single matrix, the batch folded into A's rows."""
    if k.op != "MatMul":
        return 1
    b, y = dims.get(k.inputs[1] or "", ()), dims.get(k.outputs[0], ())
    return max(1, math.prod(y[:-2])) if math.prod(b[:-2]) > 1 else 1


def _copy_dims(shape: tuple[int, ...], strides: list[int]) -> list[tuple[int, int]]:
    """(size, input stride) of a Copy's output dims as the core merges them (k_data.cpp
    `CopyKernel::coalesce`): size-1 dims dropped, a dim merged into the one before it when
    the two are contiguous in the input."""
    merged: list[tuple[int, int]] = []
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if merged and stride * size == merged[-1][1]:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged


def blocked_transpose(k: lower.Kernel, dims: dict[str, tuple[int, ...]], elem_bytes: int
                      ) -> bool:
    """Whether the core runs Copy kernel `k` as a batch of 2-D transposes in 8 x 8 tiles
    (k_data.cpp `CopyKernel::transposes`: 4-byte elements, the innermost output dim strided,
    the one before it contiguous in the input: NCHW <-> NHWC). Measured (Zen 5, AVX-512, 1
    thread): [1, 64, 56, 56] -> NHWC 17 us, a Relu over the same tensor 20, where element by
    element it took 65."""
    if k.op != "Copy" or "strides" not in k.ints or elem_bytes != 4:
        return False
    merged = _copy_dims(dims.get(k.outputs[0], ()), k.ints["strides"])
    return len(merged) >= 2 and merged[-2][1] == 1 and merged[-1][1] > 1


def copies(k: lower.Kernel, dims: dict[str, tuple[int, ...]]) -> tuple[int, int]:
    """The separate copies a data-movement kernel of the core makes (k_data.cpp), each a
    fixed cost beyond its bytes: (runs, the calibration's `copy_run_ns` each; elements copied
    one at a time, its `copy_element_ns` each); (0, 0) for one contiguous copy.

    - Copy (Transpose, Slice, Expand ...; `strides` per output dim, in input elements): the
      output's trailing dims that are contiguous in the input too form a run, copied by one
      memcpy; when the innermost dim is strided, a loop copies element by element: every
      output element is one (measured: 0.47 ns per element of NCHW -> NHWC on [1, 64, 48,
      48], 69 us where its 1.2 MB at the fitted L3 rate say 21); the C++ CPU core's
      transposes of 4-byte elements whose dim before the innermost one is contiguous in the
      input are blocked instead (`blocked_transpose`), costed by their bytes only;
    - MapCopy (Pad, Tile, nearest Resize; `map_runs`): one memcpy or fill per run of the
      dim before the trailing dims it copies whole, per index of the dims before that;
    - Concat and Split: one per part per index of the dims before the axis;
    - Gather: one per index per index of the dims before the axis;
    - Elementwise: one chunk of its program per span of the output over which every
      operand's index rises by one stride (ewprog.cpp `suffix_block`, `EwProgram::apply`),
      each recomputing its operands' positions: a squeeze-excite gate [1, C, H, W] x
      [1, C, 1, 1] is C spans of H·W;
    - CumSum (k_reduce.cpp `scan_block`, x seen as [outer, len, inner] around the axis): one
      loop per row of `inner` elements adding the row of sums before it, outer·len of them;
      along the last axis (inner 1) each sum waits for the one before: every element is one
      at a time, as a strided copy's are.
    """
    if not k.outputs or any(n not in dims for n in [*k.inputs, *k.outputs] if n):
        return 0, 0
    y = dims[k.outputs[0]]
    if not math.prod(y):  # an empty tensor (a KV cache at prefill, past 0) copies nothing
        return 0, 0
    if k.op == "Copy" and "strides" in k.ints:
        run = 1
        for size, stride in reversed(list(zip(y, k.ints["strides"], strict=True))):
            if size == 1:
                continue
            if stride != run:
                break
            run *= size
        if run == 1 and math.prod(y) > 1:
            return 0, math.prod(y)
        runs = math.prod(y) // run
    elif k.op == "MapCopy":
        runs = map_runs(k.ints["map"], dims[k.inputs[0] or ""], y)
    elif k.op in ("Concat", "Split"):
        whole = y if k.op == "Concat" else dims[k.inputs[0] or ""]
        parts = len(k.inputs) if k.op == "Concat" else len(k.outputs)
        runs = math.prod(whole[:k.ints["axis"][0]]) * parts
    elif k.op == "Gather":
        axis = k.ints["axis"][0]
        runs = math.prod(dims[k.inputs[0] or ""][:axis]) * math.prod(dims[k.inputs[1] or ""])
    elif k.op == "Elementwise":
        # ewprog.cpp `suffix_block` is ORT's Broadcaster's inner run: the output's trailing
        # dims over which an operand broadcasts on every one or reads every one.
        block = min((inner_run(view or dims.get(name, ()), y) for name, view in k.operands
                     if view or name in dims), default=math.prod(y))
        runs = math.prod(y) // max(block, 1)
    elif k.op == "CumSum":
        axis = k.ints["axis"][0]
        if math.prod(y[axis + 1:]) == 1:
            return 0, math.prod(y)
        runs = math.prod(y[:axis + 1])
    else:
        return 0, 0
    return (runs if runs > 1 else 0), 0


def map_runs(flat: list[int], x: tuple[int, ...], y: tuple[int, ...]) -> int:
    """The memcpy / fill calls of a MapCopy (k_data.cpp `MapCopyKernel::plan_runs`): the
    output's trailing dims whose map is the identity are one unit; along the dim before them
    a run is consecutive indices reading consecutive units, or the fill value (-1); every
    index of the dims before that repeats the runs. Swin-T's Pad of [1, 56, 56, 96] that pads
    nothing is 1 (element by element it was 301,056: 454 us where ORT's copy takes 10)."""
    starts = [0, *itertools.accumulate(y)]
    maps = [flat[a:b] for a, b in itertools.pairwise(starts)]
    k = len(y)
    while k > 0 and y[k - 1] == x[k - 1] and maps[k - 1] == list(range(y[k - 1])):
        k -= 1
    if k == 0:
        return 1
    row = maps[k - 1]
    runs = 1 + sum(1 for prev, m in itertools.pairwise(row)
                   if not ((m < 0 and prev < 0) or (m >= 0 and prev >= 0 and m == prev + 1)))
    return math.prod(y[:k - 1]) * runs


# Vector passes the core makes over each row of a row-wise kernel (k_norm.cpp, k_reduce.cpp,
# k_pool.cpp), each with a fixed cost per row beyond its elements (loop set-up, a tail, a
# horizontal sum or max the next pass waits for): LayerNormalization's `moments` (sum;
# x - mean; its square; sum) and `normalize`; Softmax's max, exp_shift_sum and scale; a
# reduction's or a global pool's one sum or max per output element.
# RMSNormalization (k_rms_norm.cpp): the square, its sum, `normalize`, and one add each for a
# skip and a bias.
ROW_PASSES = {"LayerNormalization": 5, "InstanceNormalization": 5, "Softmax": 3,
              "LogSoftmax": 3, "GlobalAveragePool": 1, "GlobalMaxPool": 1,
              "RMSNormalization": 3, **{op: 1 for op in REDUCE_OPS}}


def row_passes(k: lower.Kernel, dims: dict[str, tuple[int, ...]]) -> int:
    """Rows x passes of a row-wise kernel (`ROW_PASSES`), the units of the calibration's
    `norm_row_ns`; 0 for any other kernel or an unknown shape. Rows: a normalization's input
    elements over its row length (all dims from `axis`: LayerNormalization; the one `axis`:
    Softmax; a channel plane: InstanceNormalization), a reduction's or global pool's output
    elements. Measured (1 thread, Zen 5, AVX-512): LayerNormalization [4608, 8] 140 us,
    [64, 1024] 14 us (72x the rows, 1/8 the elements: 30 ns per row, 6 per pass), ReduceMean
    [4096, 32] 30 us against [64, 4096] 9.6 (7 ns per row of one pass)."""
    passes = ROW_PASSES.get(k.op, 0)
    x = dims.get(k.inputs[0] or "", ()) if k.inputs else ()
    y = dims.get(k.outputs[0], ()) if k.outputs else ()
    if not passes or not x or not y:
        return 0
    if k.op == "RMSNormalization":
        passes += sum(1 for name in k.inputs[2:] if name)
    if k.op in ("LayerNormalization", "InstanceNormalization", "Softmax", "LogSoftmax",
                "RMSNormalization"):
        axis = 2 if k.op == "InstanceNormalization" else k.ints["axis"][0]
        flatten = (k.op in ("LayerNormalization", "InstanceNormalization", "RMSNormalization")
                   or bool(k.ints.get("flatten", [0])[0]))
        length = math.prod(x[axis:]) if flatten else x[axis]
        return passes * math.prod(x) // max(length, 1)
    return passes * math.prod(y)


def _interpreted(k: lower.Kernel) -> bool:
    """A Conv, Gemm or MatMul whose epilogue program the tile cannot apply as it stores (an
    operation outside ops.def's TILE_EPILOGUE: SiLU, HardSwish, a Sigmoid ...): the core runs
    the program over the output after the tile, chunk by chunk in L1 (`EwProgram::apply`),
    as an Elementwise kernel runs it."""
    return k.op in MAIN_OPS and any(i.op not in TILE_EPILOGUE for i in k.program)


def _copied_view(mg: ModelGraph, k: lower.Kernel) -> Kernel:
    """A view the planner runs as a Copy kernel (`lower._view`: the output has a tensor of its
    own): it reads its input and writes its output, where the analysis charges a view nothing."""
    info = mg.info(k.nodes[0])
    x, y = info.inputs[0], info.outputs[0]
    cost = Cost(bytes_read=x.nbytes if x is not None else 0, bytes_written=y.nbytes)
    return Kernel("data_movement", cost, (k.nodes[0],),
                  inputs=(x,) if x is not None else (), outputs=(y,))


@functools.cache
def cuda_kernel_ops() -> frozenset[str]:
    """The plan kernels the CUDA executor lowers: its lowering table, read from the CPU
    emulator's build of the same code (no GPU needed); none when it is not built."""
    try:
        from .. import _native_cuda_emu  # type: ignore[attr-defined]
    except ImportError:
        return frozenset()
    return frozenset(_native_cuda_emu.kernel_ops())


NATIVE_CPU_MODEL = NativePlan(NATIVE_CPU)
NATIVE_CUDA_MODEL = NativePlan(NATIVE_CUDA, cuda_kernel_ops)
register_kernel_model(NATIVE_CPU_MODEL)
register_kernel_model(NATIVE_CUDA_MODEL)
