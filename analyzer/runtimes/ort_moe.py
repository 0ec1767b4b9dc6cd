"""ONNX Runtime's CPU MoE and QMoE (com.microsoft) as the kernel it runs (`ort_cpu` costs it).

ORT 1.31's kernel (contrib_ops/cpu/moe/moe_cpu.cc) routes every token (a scalar softmax and
partial sort of its E logits), groups the T·k (token, expert) routes by expert, and for each
picked expert in turn, on its M routed rows:

1. fc1: one MlasGemm of [M, H] by the expert's [F·I, H] weight transposed, unpacked: MLAS
   packs the weight into panels at every call (MlasSgemmTransposePackB), reading each of its
   F·I·H values once a call;
2. the activation, a scalar loop over the M·I inter values (ApplySwiGLUActivation: a min, a
   clamp, std::exp, a divide and three products a value, in the same order ONNX writes them);
3. fc2: one MlasGemm of [M, I] by [H, I] transposed, packed likewise, its bias added per row;
4. a scalar weighted scatter of the M output rows into the token rows.

So a picked expert is one call of time c·M·W + b·M·I + a·W + d (W its weights, F·I·H + I·H;
c the GEMMs' time a MAC, b the activation's a value, a the packing's a weight, d the call's
fixed cost). Measured (the node alone, ORT 1.31, 1 thread, Zen 5, load 3-5,
/tmp/ortest/moe_probe.py, T tokens of H, top 2 of E experts of I): T = 128, H = I = 128, E =
4 (gpt-oss as the builder writes a tiny config) 390-550 us, 1.5-2.1 us a route for its 49k
MACs; H and I swapped at H·I = 64k (same MACs, weights and packing) 0.91 ms at I = 128
against 1.83 at I = 512: b = 9.4 ns a value (the scalar loop); c 7-9 ps a MAC (MLAS's
rate, the calibrated peak's 8.7), so the loop is ~400 / H of the products' time (3x at H =
128, 14% at H = 2880); a = 0.2-0.3 ns a weight packed from L3 (8 experts of 512 x 512 at 16
rows each, 3.4 ms), far less from L1 or L2 (a decode step's 2 experts of 49k weights, 7.8 us).

The estimator prices it as one kernel of class `moe` (`qmoe` for QMoE, whose 4-bit experts
ran 0.9-1.4x MoE's time, at one token the same: nothing is dequantized per route): its MACs, a
call per picked expert (the curve's per-call term f_half: d, and the packing as far as the
experts' sizes are alike) and reuse H, the MACs each of the F + 1 products does per activated
value (fc1 H for each of its F outputs a value, fc2 H), so that the curve's I / (I + i_half)
is b's cost per value whatever H: c·MACs·(1 + i_half / H) with i_half = b / (c·(F + 1)).
Fitted on the catalogue's MoE (QMoE) nodes (`catalogue.moe`); on Zen 5 (BENCHMARKS.md, 01:10)
the fit keeps no per-value term (i_half ~0, e_max 0.31, the six within 0.8-1.55x): its 8 x
512² benchmark is bound by the packing, which one f_half and one i_half cannot hold beside the
loop. Not modelled apart: the packing (a, ~a / (c·M) of the products: from L3 about the
products' time at 16 rows an expert), routing skew (every expert a token may pick is assumed
picked, `picked_experts`).
"""

from __future__ import annotations

from dataclasses import replace

from ..cost.base import Cost
from ..cost.moe import moe_layout
from ..hardware import MOE, QMOE
from ..ir import NodeInfo
from . import Kernel


def picked_experts(info: NodeInfo, cost: Cost) -> Cost:
    """A MoE's or QMoE's cost as ORT's kernel runs it: reading the weights (and scales,
    biases) of the experts its tokens pick, at most min(E, T·k) of E, not the whole table the
    analysis charges (gpt-oss at one token: 2 of 4 experts' weights; the estimate read 3x the
    measured time with all of them)."""
    x, router = info.input(0), info.input(1)
    if x is None or router is None or not x.known or not router.known:
        return cost
    experts = router.dims[-1]
    touched = min(experts, x.size // x.dims[-1] * info.attr("k", 1))
    tables = [t for i, t in enumerate(info.inputs) if i in info.const_inputs and t is not None
              and t.known and t.rank >= 2 and t.dims[0] == experts]
    skipped = sum(t.nbytes for t in tables) * (experts - touched) // experts
    return replace(cost, bytes_read=cost.bytes_read - skipped,
                   param_bytes=cost.param_bytes - skipped)


def moe_kernel(info: NodeInfo, k: Kernel) -> Kernel:
    """`k` (the node's kernel at the gemm class) as ORT's MoE / QMoE kernel runs it (module
    docstring): class `moe` or `qmoe`, the picked experts' weights read (`picked_experts`), a
    call per picked expert, reuse H, the MACs each product does per activated inter value; a
    QMoE's dequantization FLOPs (2 a weight, per row in the node's cost) taken out,
    since ORT does not dequantize per row (its time is in the qmoe curve)."""
    cost = picked_experts(info, k.cost)
    x, router, fc1 = info.input(0), info.input(1), info.input(2)
    if not all(t is not None and t.known for t in (x, router, fc1)) or not cost.macs:
        return replace(k, cost=cost)
    tokens, hidden, experts, inter, fusion = moe_layout(info)
    top = info.attr("k", 1)
    routes = tokens * top
    quantized = info.op_type == "QMoE"
    if quantized:  # the formula's 2 FLOPs a weight, a route (`cost.moe.qmoe`)
        fc3 = info.input(8)
        weights = hidden * inter * (fusion + 1 + (fc3 is not None))
        cost = replace(cost, other_flops=cost.other_flops - 2 * weights * routes)
    return replace(k, cls=QMOE if quantized else MOE, cost=cost,
                   calls=min(experts, routes), reuse=hidden)
