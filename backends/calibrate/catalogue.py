"""The micro-benchmark catalogue of `onnxlens calibrate`: small ONNX graphs built with
onnx.helper, each one fused group (the package docstring says which and why).
"""


from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization

from ...analyzer.cost.base import NCHWC_DOMAIN
from ...analyzer.hardware import NATIVE_CPU, ORT_CPU
from ...analyzer.host import host_profile
from ...analyzer.runtimes.ort_cpu import nchwc_block

OPSET = 17
IR_VERSION = 8  # what ORT 1.18+ reads
CHAIN_LENGTHS = (1, 17, 33, 65)


# ---- micro-benchmark graphs ---------------------------------------------------------------------

@dataclass(frozen=True)
class Bench:
    name: str
    build: Callable[[], onnx.ModelProto]
    tier: int  # 0: the coarse set, 1: the full set, 2: slow (DRAM-sized, big GEMM)
    work: float  # rough seconds per run, for the budget (FLOPs at 50 GFLOP/s, bytes at 10 GB/s)


_RNG = np.random.default_rng(0)


def value_info(name: str, shape: Sequence[int], elem_type: int = TensorProto.FLOAT
               ) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def _const(name: str, shape: Sequence[int], scale: float = 0.1) -> TensorProto:
    return numpy_helper.from_array((_RNG.standard_normal(shape, dtype=np.float32) * scale), name)


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, Sequence[int]]],
           output: tuple[str, Sequence[int]], consts: Iterable[TensorProto] = (),
           input_type: int = TensorProto.FLOAT, output_type: int = TensorProto.FLOAT
           ) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", [value_info(n, s, input_type) for n, s in inputs],
                              [value_info(*output, output_type)], list(consts))
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


def conv_weight_input(cin: int, cout: int, size: int, kernel: int = 3, tier: int = 1
                      ) -> Bench:
    """`conv`'s Conv with its weight a graph input, as a DequantizeLinear's output is one at
    run time: ORT neither prepacks it nor reorders it to NCHWc (`hardware.CONV_UNPACKED`)."""
    base = conv(cin, cout, size, kernel, tier=tier)

    def build() -> onnx.ModelProto:
        model = base.build()
        w = next(t for t in model.graph.initializer if t.name == "W")
        model.graph.initializer.remove(w)
        model.graph.input.append(value_info("W", list(w.dims)))
        return model
    return Bench(f"{base.name} W input", build, tier, base.work)


def matmul_n_bits(m: int, k: int, n: int, tier: int = 1, block: int = 32) -> Bench:
    """Y[m,n] = X[m,k] · B[k,n], B in 4 bits with a float scale per block of `block` along K
    (no zero point), as onnxruntime-genai's model builder writes its int4 MatMulNBits: at
    accuracy_level 4 ORT quantizes X to int8 per block and runs MLAS's CompInt8 kernel (the
    estimator's `gemm_nbits` class, measured rather than derived from its instruction mix)."""
    def build() -> onnx.ModelProto:
        blocks = k // block
        packed = numpy_helper.from_array(
            _RNG.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8), "B")
        node = helper.make_node("MatMulNBits", ["X", "B", "S"], ["Y"], domain="com.microsoft",
                                K=k, N=n, bits=4, block_size=block, accuracy_level=4)
        model = _model([node], [("X", (m, k))], ("Y", (m, n)),
                       [packed, _const("S", (n, blocks), 0.01)])
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return model
    return Bench(f"MatMulNBits {m}x{k}x{n} int4", build, tier,
                 _work(2 * m * k * n, 4 * (m * k + m * n) + k * n // 2))


def _gelu(x: str, y: str) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    """GELU from `x` to `y` as torch exports it at opset 17, 0.5·x·(1 + erf(x / √2)): nodes
    and constants (ORT's GeluFusion makes them one Gelu kernel)."""
    nodes = [helper.make_node("Div", [x, "sqrt2"], ["D"]),
             helper.make_node("Erf", ["D"], ["E"]),
             helper.make_node("Add", ["E", "one"], ["A"]),
             helper.make_node("Mul", [x, "A"], ["P"]),
             helper.make_node("Mul", ["P", "half"], [y])]
    return nodes, [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in
                   (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]


def linear(rows: int, k: int, n: int, gelu: bool = False, tier: int = 1) -> Bench:
    """nn.Linear on a [1, rows, k] activation as torch exports it (MatMul, Add bias), then
    GELU spelled out in erf (opset 17) if `gelu`: a transformer or ConvNeXt MLP's group."""
    def build() -> onnx.ModelProto:
        nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]),
                 helper.make_node("Add", ["M", "B"], ["H" if gelu else "Y"])]
        consts = [_const("W", (k, n)), _const("B", (n,))]
        if gelu:
            gelu_nodes, gelu_consts = _gelu("H", "Y")
            nodes, consts = nodes + gelu_nodes, consts + gelu_consts
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


def gelu(n: int, tier: int = 1) -> Bench:
    """GELU alone (`_gelu`): one group of ours, one Gelu kernel of ORT's."""
    def build() -> onnx.ModelProto:
        nodes, consts = _gelu("X", "Y")
        return _model(nodes, [("X", _flat(n))], ("Y", _flat(n)), consts)
    return Bench(f"Gelu {n}", build, tier, _work(8 * n, 8 * n))


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
    """LayerNormalization, Softmax or a reduction (ReduceMean, ReduceL2, ReduceSumSquare)
    over the last axis of [rows, cols]."""
    reduction = op.startswith("Reduce")
    if op == "LayerNormalization":
        node = helper.make_node(op, ["X", "G", "Bt"], ["Y"], axis=-1)
        consts = [_const("G", (cols,)), _const("Bt", (cols,))]
    elif reduction:
        node = helper.make_node(op, ["X"], ["Y"], axes=[-1], keepdims=1)
        consts = []
    else:
        node = helper.make_node(op, ["X"], ["Y"], axis=-1)
        consts = []
    out = (rows, 1) if reduction else (rows, cols)
    return Bench(f"{op} {rows}x{cols}", lambda: _model(
        [node], [("X", (rows, cols))], ("Y", out), consts), tier,
        _work(8 * rows * cols, 8 * rows * cols))


def skip_norm(rows: int, cols: int, tier: int = 1) -> Bench:
    """A residual Add, then LayerNormalization over its last axis ([1, rows, cols]): post-norm
    BERT's; ORT runs it as one SkipLayerNormalization."""
    return Bench(f"Add+LayerNormalization {rows}x{cols}", lambda: _model(
        [helper.make_node("Add", ["X", "R"], ["S"]),
         helper.make_node("LayerNormalization", ["S", "G", "Bt"], ["Y"], axis=-1)],
        [("X", (1, rows, cols)), ("R", (1, rows, cols))], ("Y", (1, rows, cols)),
        [_const("G", (cols,)), _const("Bt", (cols,))]), tier, _work(8 * rows * cols,
                                                                   12 * rows * cols))


def skip_rms_norm(rows: int, cols: int, tier: int = 1) -> Bench:
    """ORT's SkipSimplifiedLayerNormalization ([1, rows, cols], with the residual sum as its
    fourth output), as onnxruntime-genai's model builder writes every decoder layer's
    residual RMSNorm."""
    def build() -> onnx.ModelProto:
        node = helper.make_node("SkipSimplifiedLayerNormalization", ["X", "R", "G"],
                                ["Y", "", "", "S"], domain="com.microsoft", epsilon=1e-6)
        model = _model([node], [("X", (1, rows, cols)), ("R", (1, rows, cols))],
                       ("Y", (1, rows, cols)), [_const("G", (cols,))])
        model.graph.output.append(value_info("S", (1, rows, cols)))
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return model
    return Bench(f"SkipSimplifiedLayerNormalization {rows}x{cols}", build, tier,
                 _work(6 * rows * cols, 16 * rows * cols))


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


def reorder(op: str, channels: int, size: int, tier: int = 1) -> Bench:
    """ORT's NCHWc layout change alone: a ReorderInput (NCHW to NCHWc) or ReorderOutput (back)
    of [1, channels, size, size], its NCHWc side padded to whole blocks of this host's
    (`ort_cpu.nchwc_block`), as ORT's NchwcTransformer writes it into the optimized model."""
    def build() -> onnx.ModelProto:
        block = nchwc_block(host_profile(1))
        plain = (1, channels, size, size)
        blocked = (1, -(-channels // block) * block, size, size)
        x, y = (plain, blocked) if op == "ReorderInput" else (blocked, plain)
        attrs = {"channels": channels} if op == "ReorderOutput" else {}
        model = _model([helper.make_node(op, ["X"], ["Y"], domain=NCHWC_DOMAIN, **attrs)],
                       [("X", x)], ("Y", y))
        model.opset_import.append(helper.make_opsetid(NCHWC_DOMAIN, 1))
        return model
    return Bench(f"{op} {channels}x{size}x{size}", build, tier,
                 _work(0, 8 * channels * size * size))


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
    """softmax(Q·Kᵀ·s)·V over `heads` heads; timed without its Softmax, which ORT runs as a
    kernel of its own (`measure.without_softmax`): the estimator's `attention` class."""
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


def gqa_decode(heads: int, kv_heads: int, head: int, past: int, tier: int = 1, seq: int = 1,
               softcap: float = 0.0) -> Bench:
    """`seq` new tokens (one: a decode step) of GroupQueryAttention as onnxruntime-genai's
    model builder writes it: packed QKV, rotary from cos / sin caches, a KV cache of `past`
    tokens in (empty at 0: a prefill) and past + seq out (present K and V, ORT's outputs 1 and
    2, left unread), its scores soft-capped at `softcap` (Gemma 2's; 0: none). ORT runs a
    decode step as per-head SSE loops over the scores (`ort_attention.decode_kernel`): the
    estimator's `gqa_decode` class."""
    total = past + seq

    def build() -> onnx.ModelProto:
        # (the cache's names not past_* / present*, which would make it a decoder to analyze)
        inputs = ["QKV", "", "", "K_cache", "V_cache", "seqlens_k", "total", "cos", "sin"]
        node = helper.make_node("GroupQueryAttention", inputs, ["Y", "K_out", "V_out"],
                                domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads,
                                do_rotary=1, **({"softcap": softcap} if softcap else {}))
        consts = [numpy_helper.from_array(np.array([total - 1], np.int32), "seqlens_k"),
                  numpy_helper.from_array(np.array(total, np.int32), "total"),
                  _const("cos", (total, head // 2), 1.0), _const("sin", (total, head // 2), 1.0)]
        cache = (1, kv_heads, past, head)
        model = _model([node], [("QKV", (1, seq, (heads + 2 * kv_heads) * head)),
                                ("K_cache", cache), ("V_cache", cache)],
                       ("Y", (1, seq, heads * head)), consts)
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return model
    step = f"past {past}" if seq == 1 else f"prefill {seq} past {past}"
    capped = f"{CAPPED}{softcap:g}" if softcap else ""
    return Bench(f"GroupQueryAttention decode {heads}/{kv_heads}x{head} {step}{capped}", build,
                 tier, _work(4 * heads * seq * total * head,
                             4 * 8 * (heads + kv_heads) * total * head))


def moe(tokens: int, hidden: int, inter: int, experts: int, bits: int = 0, tier: int = 1
        ) -> Bench:
    """One MoE node as onnxruntime-genai's builder writes gpt-oss's (QMoE at `bits`, blocks of
    32 along K): `tokens` rows of `hidden`, router logits an input, top 2 of `experts`, SwiGLU
    fused into fc1 (interleaved, clamped at 7), fc1 and fc2 biases, routing weights
    normalized. ORT runs it as per-expert GEMMs around a scalar SwiGLU loop
    (`ort_moe.moe_kernel`): the estimator's `moe` / `qmoe` class."""
    fc1, fc2 = (experts, 2 * inter, hidden), (experts, hidden, inter)

    def weights(name: str, shape: tuple[int, int, int]) -> list[TensorProto]:
        if not bits:
            return [_const(name, shape)]
        rows, k = shape[:2], shape[2]
        packed = _RNG.integers(0, 256, (*rows, k * bits // 8), dtype=np.uint8)
        return [numpy_helper.from_array(packed, name), _const(f"{name}_s", (*rows, k // 32))]

    def build() -> onnx.ModelProto:
        tables = [*weights("fc1", fc1), _const("b1", fc1[:2]), *weights("fc2", fc2),
                  _const("b2", fc2[:2])]
        quantized = {"expert_weight_bits": bits, "block_size": 32} if bits else {}
        node = helper.make_node("QMoE" if bits else "MoE", ["X", "R", *(t.name for t in tables)],
                                ["Y"], domain="com.microsoft", k=2, activation_type="swiglu",
                                swiglu_fusion=1, swiglu_limit=7.0, activation_alpha=1.702,
                                activation_beta=1.0, normalize_routing_weights=1, **quantized)
        model = _model([node], [("X", (tokens, hidden)), ("R", (tokens, experts))],
                       ("Y", (tokens, hidden)), tables)
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return model
    macs = tokens * 2 * 3 * hidden * inter
    kind = f"QMoE int{bits}" if bits else "MoE"
    return Bench(f"{kind} {tokens}x{hidden} I {inter} E {experts}", build, tier,
                 _work(2 * macs, 4 * experts * 3 * hidden * inter))


def where(shape: Sequence[int], cond: Sequence[int] | None = None, tier: int = 1) -> Bench:
    """Where(C, 0, Y): Y of `shape`, a scalar X, the condition C of `cond` (broadcast; the
    whole shape by default), as an encoder's SDPA guard Where(IsNaN(p), 0, p) or masked_fill
    writes it. ORT runs two select passes and a merge (`ort_cpu.where_passes`): the
    estimator's `where` class."""
    cond = tuple(cond or shape)
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "Z")
    n = math.prod(shape)

    def build() -> onnx.ModelProto:
        model = _model([helper.make_node("Where", ["C", "Z", "Y"], ["W"])],
                       [("C", cond), ("Y", shape)], ("W", shape), [zero])
        model.graph.input[0].type.tensor_type.elem_type = TensorProto.BOOL
        return model
    return Bench(f"Where {'x'.join(map(str, shape))} cond {'x'.join(map(str, cond))}", build,
                 tier, _work(3 * n, 24 * n))


def _ort_only() -> list[Bench]:
    """ORT's kernels with classes of their own that only an ORT calibration times (the
    native executor's MoE and Where are kernels of its own, which its kernel model prices
    at its `gemm` and `elementwise` curves). MoE and QMoE nodes
    (tokens, hidden, inter, experts; top 2): gpt-oss's tiny config at a prefill of 128 and 32
    tokens and a decode step, hidden and inter swapped at 512 (the scalar SwiGLU loop's
    share), 8 experts of 512 x 512; its QMoE at four of them. Where: the SDPA guard of a
    hidden-256 encoder (4 heads, 128 tokens) and ViT-B's (12 heads, 197), a small one, and
    masked_fill's mask broadcast over the heads. GroupQueryAttention prefills of 32, 64 and
    128 tokens with and without Gemma 2's softcap, whose tanhf per score `fit.fit_libm_call`
    reads from each pair's difference (measured, ORT 1.31, Zen 5: 3.1, 3.5-5.5 and 5.5 ns a
    score, the pair of 64 either of two, run to run)."""
    shapes = ((128, 128, 128, 4), (32, 128, 128, 4), (1, 128, 128, 4), (128, 512, 128, 4),
              (128, 128, 512, 4), (64, 512, 512, 8))
    return ([moe(*shape) for shape in shapes]
            + [moe(*shapes[i], bits=4) for i in (0, 2, 3, 5)]
            + [where((1, 4, 128, 128)), where((12, 197, 197)), where((8, 32, 32)),
               where((1, 4, 128, 128), (1, 1, 128, 128))]
            + [gqa_decode(4, 2, 32, 0, seq=seq, softcap=cap) for seq in (32, 64, 128)
               for cap in (0.0, 50.0)])


def chain(length: int) -> Bench:
    """`length` Relu kernels on 16 floats: almost nothing but per-kernel overhead."""
    return Bench(f"Relu{CHAIN}{length}", lambda: _model(
        [helper.make_node("Relu", ["X" if i == 0 else f"t{i}"], [f"t{i + 1}"])
         for i in range(length)], [("X", (16,))], (f"t{length}", (16,))), 0, 0.0)


# Chains of small copies, whose slope is a copy kernel's cost inside a graph
# (`fit.fit_copy_fixed`): each at two step counts, on COPY_CHAIN_FLOATS floats (a decode step's
# hidden size), Split and Concat with COPY_CHAIN_PARTS parts each.
CHAIN = " chain "  # in every chain benchmark's name: a point of none
COPY_CHAIN_STEPS = (4, 20)
COPY_CHAIN_FLOATS = 128
COPY_CHAIN_PARTS = (2, 4, 8)
COPY_FAMILIES = ("Slice", "Gather", "Expand", "Split")


def copy_chain(family: str, steps: int, parts: int = 2) -> Bench:
    """`steps` steps of a small copy on COPY_CHAIN_FLOATS floats, each feeding the next:
    "Slice" drops one element; "Gather" permutes the elements; "Expand" doubles the rows and
    a Slice takes one back; "Split" splits into `parts` and a Concat joins them reversed."""
    n = COPY_CHAIN_FLOATS

    def build() -> onnx.ModelProto:
        consts = [numpy_helper.from_array(np.asarray(v, np.int64), name) for name, v in (
            ("one", [1]), ("zero", [0]), ("rows", [2, n]),
            ("sizes", [n // parts] * parts), ("perm", _RNG.permutation(n)))]
        nodes, width = [], n + steps if family == "Slice" else n
        for i in range(steps):
            x, y = f"t{i}", f"t{i + 1}"
            nodes += _copy_step(family, x, y, i, width - i, parts, consts)
        return _model(nodes, [("t0", (1, width))], (f"t{steps}", (1, n)), consts)
    name = f"{family}{CHAIN}{steps}" + (f" x{parts}" if family == "Split" else "")
    return Bench(name, build, 0, 0.0)


def _copy_step(family: str, x: str, y: str, i: int, width: int, parts: int,
               consts: list[TensorProto]) -> list[onnx.NodeProto]:
    """One step of `copy_chain` from `x` ([1, width]) to `y`."""
    if family == "Slice":
        consts.append(numpy_helper.from_array(np.asarray([width - 1], np.int64), f"end{i}"))
        return [helper.make_node("Slice", [x, "zero", f"end{i}", "one"], [y])]
    if family == "Gather":
        return [helper.make_node("Gather", [x, "perm"], [y], axis=1)]
    if family == "Expand":
        return [helper.make_node("Expand", [x, "rows"], [f"e{i}"]),
                helper.make_node("Slice", [f"e{i}", "zero", "one", "zero"], [y])]
    pieces = [f"p{i}_{j}" for j in range(parts)]
    return [helper.make_node("Split", [x, "sizes"], pieces, axis=1),
            helper.make_node("Concat", pieces[::-1], [y], axis=1)]


def copy_chains() -> list[Bench]:
    """`copy_chain` of each family at both step counts, Split's at each part count."""
    return [copy_chain(family, steps, parts) for steps in COPY_CHAIN_STEPS
            for family in COPY_FAMILIES
            for parts in (COPY_CHAIN_PARTS if family == "Split" else (2,))]


SQUARE_GEMM = matmul(1024, 1024, 1024, 2)
CAPPED = " softcap "  # a soft-capped benchmark's name: its twin's and this, then the cap


def _gemms() -> list[Bench]:
    """Matrix products."""
    # GEMM: square, skinny (one row: memory bound), wide and deep; Gemm as nn.Linear exports.
    out: list[Bench] = [matmul(64, 256, 256, 0), matmul(256, 512, 512, 0), matmul(1, 1024, 1024, 0),
            matmul(32, 32, 32), matmul(128, 128, 128), matmul(512, 512, 512),
            matmul(1, 256, 512), matmul(4, 512, 2048), matmul(16, 1024, 256),
            matmul(64, 64, 1024), matmul(1024, 64, 64), matmul(256, 2048, 128),
            matmul(2048, 256, 256), matmul(128, 1024, 2048), gemm(1, 1024, 512),
            gemm(64, 512, 1024), gemm(1, 4096, 2048), batched_matmul(8, 64, 64, 64),
            batched_matmul(16, 128, 32, 128), batched_matmul(4, 256, 256, 64),
            linear(2048, 128, 512, gelu=True), linear(2048, 512, 128), linear(512, 256, 1024),
            linear(512, 1024, 256), linear(256, 512, 2048, gelu=True), linear(256, 2048, 512),
            SQUARE_GEMM, matmul(1, 8192, 4096, 2, weight=False)]
    # 4-bit weights as LLMs ship for ORT, over a prefill's rows; two over a short K, where
    # MLAS's CompInt8 kernel pays per output (`gemm_nbits`'s i_half); one row, a decode
    # step's GEMV (`gemv_nbits`), in L1 and L2.
    out += [matmul_n_bits(128, 1024, 2048, 0), matmul_n_bits(32, 1024, 1024),
            matmul_n_bits(256, 512, 1536), matmul_n_bits(64, 2048, 512),
            matmul_n_bits(128, 256, 1024), matmul_n_bits(128, 256, 4096)]
    out += [matmul_n_bits(1, k, n) for k, n in ((128, 128), (128, 256), (512, 512),
                                                 (256, 1024), (1024, 1024), (2048, 512))]
    return out


def _convolutions() -> list[Bench]:
    """Dense, strided, pointwise and grouped convolutions."""
    # Convolutions: 3x3 over channel counts and sizes, strided, 1x1 up and down, the stem,
    # grouped (group widths 4, 8, 12, 24 on ORT's NCHW path, 16 and 32 whole NCHWc blocks on
    # AVX-512); channel counts that are and are not multiples of 16
    # (ORT's NCHWc block on AVX-512 pads the others); fused activations, from the free Relu to
    # the costlier ReLU6 and HardSwish, as networks use them.
    out: list[Bench] = [conv(64, 64, 24, tier=0), conv(32, 128, 24, 1, tier=0),
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
            depthwise(54, 48), depthwise(90, 24, 3, 2),
            # Depthwise on the NCHW path (`depthwise_nchw`): ReXNet's odd channel counts,
            # FastViT's channel multiplier of 2.
            depthwise(38, 56), depthwise(162, 28, 3, 2), depthwise(366, 14, 5),
            conv(48, 96, 28, 7, 2, 48)]
    return out


def _depthwise() -> list[Bench]:
    """Depthwise convolutions, and those whose working sets pass L2."""
    # Depthwise: 3x3 / 5x5 / 7x7, stride 1 and 2, small and large spatial sizes, channel counts
    # on and off the NCHWc block, with and without a fused activation.
    out: list[Bench] = [
            depthwise(64, 48, tier=0), depthwise(32, 96, act="Clip"), depthwise(128, 48),
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
    return out


def _vector() -> list[Bench]:
    """Elementwise ops, pools, normalizations and reductions."""
    # Elementwise at sizes in L1 (2^10), L2 (2^14, 2^16), the LLC (2^19, 2^21) and DRAM (2^24).
    out: list[Bench] = [unary("Relu", 1 << 16, 0), binary("Add", 1 << 16, 0),
                        unary("Relu", 1 << 21, 0)]
    for n in (1 << 10, 1 << 14, 1 << 19):
        out += [unary("Relu", n), binary("Add", n), binary("Mul", n)]
    out += [binary("Add", 1 << 21), binary("Mul", 1 << 16)]
    for n in (1 << 12, 1 << 16, 1 << 19):
        out += [unary("Sigmoid", n), unary("HardSwish", n), unary("Tanh", n), unary("Erf", n),
                binary("Div", n)]
    out += [channel_scale(256, 24), channel_scale(64, 96), channel_scale(1024, 6)]
    out += [silu(1 << 14), silu(1 << 17), silu(1 << 20)]
    out += [gelu(1 << 12), gelu(1 << 16), gelu(1 << 19)]
    out += [unary("Relu", 1 << 24, 2), binary("Add", 1 << 24, 2)]
    # Pools, normalizations, reductions.
    out += [pool("MaxPool", 64, 96), pool("MaxPool", 128, 48, 2, 2), pool("MaxPool", 256, 24),
            pool("AveragePool", 128, 48, 2, 2), pool("AveragePool", 256, 24, 2, 2),
            pool("GlobalAveragePool", 64, 48), pool("GlobalAveragePool", 1024, 6),
            pool("GlobalAveragePool", 256, 24),
            row_op("LayerNormalization", 256, 256), row_op("LayerNormalization", 1024, 128),
            row_op("LayerNormalization", 64, 1024), row_op("LayerNormalization", 4096, 64),
            # Short rows (channels-last norms of 8-48 channels, softmaxes over a few tokens),
            # where each row's serial reductions, not its elements, set the time.
            row_op("LayerNormalization", 2304, 24), row_op("LayerNormalization", 4608, 8),
            row_op("LayerNormalization", 1152, 48), row_op("Softmax", 2304, 24),
            row_op("Softmax", 4608, 8),
            row_op("Softmax", 512, 64), row_op("Softmax", 256, 256), row_op("Softmax", 64, 1024),
            row_op("Softmax", 2048, 128), row_op("ReduceMean", 1024, 256),
            row_op("ReduceMean", 64, 4096), row_op("ReduceMean", 4096, 32),
            # Sums of squares (a GRN's or F.normalize's ReduceL2) over a channel's plane.
            row_op("ReduceL2", 128, 2304), row_op("ReduceL2", 512, 576),
            row_op("ReduceL2", 1024, 144), row_op("ReduceSumSquare", 256, 1024),
            batch_norm(128, 24), batch_norm(256, 12), skip_norm(96, 192, 0), skip_norm(48, 384),
            skip_norm(384, 96), skip_norm(24, 768), skip_rms_norm(128, 256, 0),
            skip_rms_norm(64, 1024), skip_rms_norm(512, 128), skip_rms_norm(32, 2048)]
    return out


def _movement_and_attention() -> list[Bench]:
    """Data movement and attention blocks."""
    # Data movement: 4-D and 5-D (channel shuffle) transposes, concat, slice.
    out: list[Bench] = [
            transpose((1, 64, 48, 48), (0, 2, 3, 1)), transpose((1, 256, 12, 12), (0, 2, 3, 1)),
            transpose((1, 48, 48, 64), (0, 3, 1, 2)), transpose((1, 56, 56, 40), (0, 3, 1, 2)),
            transpose((1, 128, 196), (0, 2, 1)),
            transpose((1, 2, 64, 24, 24), (0, 2, 1, 3, 4)),
            transpose((64, 36, 4, 32), (0, 2, 1, 3)), transpose((256, 16, 8, 8), (0, 2, 1, 3)),
            transpose((96, 32, 16, 16), (0, 2, 1, 3)),
            # The innermost axis moved with others: ORT copies element by element.
            transpose((1, 576, 3, 4, 16), (2, 0, 3, 4, 1)), transpose((8, 96, 3, 32), (2, 0, 3, 1)),
            concat(64, 48), concat(128, 24), concat(256, 6), slice_half(128, 48),
            slice_half(256, 12)]
    # NCHWc layout changes, channels whole blocks and not (GhostNet's 8 and 24 of 16).
    out += [reorder(op, channels, size) for op in ("ReorderInput", "ReorderOutput")
            for channels, size in ((8, 112), (24, 56), (64, 56), (72, 28))]
    # Attention blocks: heads x sequence x head dim; windows of 16 and 49 tokens (LeViT's,
    # TinyViT's, Swin's), where each head's products are small GEMMs of odd sizes, at counts
    # beside the models' (TinyViT's 64 x 49 x 32, Swin-T's 192 x 49 x 32 left to them).
    out += [attention(4, 64, 32, 0), attention(8, 128, 64), attention(4, 256, 32),
            attention(16, 64, 64), attention(2, 512, 64), attention(32, 36, 32),
            attention(48, 49, 32), attention(12, 49, 32), attention(96, 49, 16),
            attention(8, 49, 64), attention(128, 16, 16), attention(24, 16, 32)]
    # A decoder's attention at one new token (a decode step), query / KV heads x head size
    # over a KV cache: the small Qwen2's at two lengths, a Llama's 16 / 4 x 64 and 32 / 8 x 128.
    out += [gqa_decode(8, 2, 32, 511), gqa_decode(8, 2, 32, 127), gqa_decode(16, 4, 64, 511),
            gqa_decode(32, 8, 128, 255)]
    return out


def quantize_linear(op: str, shape: Sequence[int], axis: int | None, tier: int = 1) -> Bench:
    """A QuantizeLinear (float32 -> int8) or DequantizeLinear (int8 -> float32) of `shape`,
    per tensor (`axis` None) or per axis, as ORT runs the Q and DQ it leaves unfused: its
    kernel runs one block per index up to the axis (`ort_cpu.quantization_blocks`), so the
    last axis of [K, N] is K·N blocks of one element, the first Cout blocks of the rest."""
    per_tensor = axis is None
    n = 1 if per_tensor else shape[axis]
    scale = numpy_helper.from_array(
        np.full(() if per_tensor else (n,), 0.02, np.float32), "scale")
    zero = numpy_helper.from_array(np.zeros(() if per_tensor else (n,), np.int8), "zero")
    quantize = op == "QuantizeLinear"
    x_type, y_type = ((TensorProto.FLOAT, TensorProto.INT8) if quantize
                      else (TensorProto.INT8, TensorProto.FLOAT))
    size = math.prod(shape)

    def build() -> onnx.ModelProto:
        node = helper.make_node(op, ["X", "scale", "zero"], ["Y"], axis=axis or 0)
        return _model([node], [("X", shape)], ("Y", shape), [scale, zero], x_type, y_type)
    where = "per tensor" if per_tensor else f"axis {axis}"
    blocks = 1 if per_tensor else math.prod(shape[:axis + 1])
    return Bench(f"{op} {'x'.join(map(str, shape))} {where}", build, tier,
                 _work(2 * size + 50 * blocks, 5 * size))


class _Reader(quantization.CalibrationDataReader):
    """Two random input sets for quantize_static's ranges (the kernels ORT picks do not
    depend on them)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in model.graph.input}
        self.left = [{n: _RNG.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
                     for _ in range(2)]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return self.left.pop() if self.left else None


def _without_io_quantization(model: onnx.ModelProto, elem_type: int) -> onnx.ModelProto:
    """A QDQ graph whose input and output are its quantized tensors: the QuantizeLinear of the
    graph input and the DequantizeLinear of the graph output cut off (in a network those are
    the neighbouring groups' work, and a micro-benchmark must be one group), of `elem_type`."""
    graph = model.graph
    inputs, outputs = {v.name for v in graph.input}, {v.name for v in graph.output}
    edge = [n for n in graph.node if (n.op_type == "QuantizeLinear" and n.input[0] in inputs)
            or (n.op_type == "DequantizeLinear" and n.output[0] in outputs)]
    renamed = {n.input[0]: n.output[0] for n in edge if n.op_type == "QuantizeLinear"}
    renamed |= {n.output[0]: n.input[0] for n in edge if n.op_type == "DequantizeLinear"}
    for v in [*graph.input, *graph.output]:
        v.name = renamed.get(v.name, v.name)
        v.type.tensor_type.elem_type = elem_type
    for n in edge:
        graph.node.remove(n)
    return model


@dataclass(frozen=True)
class _Static:
    """A `quantized` mode through quantize_static: its format and activation type (also the
    graph's input and output type once their Q and DQ are cut off), the benchmark's name
    suffix, and its work per fp32 work."""
    format: quantization.QuantFormat
    activations: quantization.QuantType
    suffix: str
    work: float


_STATIC = {"qdq": _Static(quantization.QuantFormat.QDQ, quantization.QuantType.QUInt8,
                          "QDQ u8s8", 0.5),
           "qop-s8": _Static(quantization.QuantFormat.QOperator, quantization.QuantType.QInt8,
                             "QOperator s8s8", 2.0)}


def quantized(bench: Bench, mode: str, tier: int = 1) -> Bench:
    """`bench`'s fp32 graph quantized by ONNX Runtime's own tools, as a user's model is:
    `mode` "qdq" (quantize_static, QDQ, uint8 activations, int8 weights per channel: ORT runs
    QLinearConv / QGemm; graph input and output uint8), "qop-s8" (quantize_static, QOperator,
    int8 activations, its default: MLAS's portable int8 x int8 GEMM) or "dynamic"
    (quantize_dynamic, int8 weights: DynamicQuantizeLinear, MatMulInteger, scale; ORT runs
    DynamicQuantizeMatMul)."""
    static = _STATIC.get(mode)

    def build() -> onnx.ModelProto:
        fp32 = bench.build()
        logging.disable(logging.WARNING)  # the quantizer's advice to pre-process, per graph
        try:
            with tempfile.TemporaryDirectory(prefix="onnxlens-calibrate-") as tmp:
                out = Path(tmp) / "q.onnx"
                if static:
                    quantization.quantize_static(
                        fp32, out, _Reader(fp32), quant_format=static.format,
                        activation_type=static.activations,
                        weight_type=quantization.QuantType.QInt8, per_channel=True)
                else:
                    quantization.quantize_dynamic(fp32, out,
                                                  weight_type=quantization.QuantType.QInt8)
                model = onnx.load(out)
        finally:
            logging.disable(logging.NOTSET)
        return (_without_io_quantization(model, static.activations.tensor_type) if static
                else model)
    suffix, work = (static.suffix, static.work) if static else ("dynamic s8", 0.5)
    return Bench(f"{bench.name} {suffix}", build, tier, bench.work * work)


def _quantized() -> list[Bench]:
    """Convolutions, GEMMs, softmaxes and adds (QLinearSoftmax, QLinearAdd) as ORT's
    quantization tools leave them (one of each kind in the coarse tier): quantized kernels
    are measured, never assumed faster than float ones."""
    qdq = [conv(64, 64, 24), conv(32, 128, 24, 1), depthwise(64, 48), gemm(64, 512, 1024),
           conv(128, 128, 24, act="Relu"), conv(256, 256, 12), conv(32, 64, 96, 3, 2),
           conv(64, 256, 24, 1, act="Relu"), conv(512, 128, 12, 1), conv(3, 32, 208, 3, 2),
           depthwise(128, 24, act="Relu"), depthwise(256, 12), depthwise(96, 48, 3, 2),
           gemm(1, 1024, 512), matmul(256, 512, 512),
           # attention's products of two activations, a call per head (B packed at each)
           batched_matmul(8, 128, 32, 128), batched_matmul(12, 64, 64, 64),
           batched_matmul(4, 256, 64, 256), batched_matmul(16, 32, 64, 32)]
    # stems of 3 input channels: ORT's im2col path (`ort_cpu.symmetric_conv`), with the one
    # above (3->32 at 208) enough points for a curve of its own
    qdq += [conv(3, 64, 112, 7, 2), conv(3, 16, 96)]
    # the float Conv of a QDQ unit ORT leaves unfused (int8 activations): weights from a DQ
    unpacked = [conv_weight_input(64, 64, 28), conv_weight_input(128, 128, 14),
                conv_weight_input(256, 256, 7), conv_weight_input(64, 256, 24, 1)]
    qdq += [row_op("Softmax", 2048, 32), row_op("Softmax", 512, 128), row_op("Softmax", 96, 512),
            binary("Add", 1 << 14), binary("Add", 1 << 17), binary("Add", 1 << 19),
            binary("Mul", 1 << 16)]
    dynamic = [matmul(64, 256, 256), conv(64, 64, 24, act="Relu"), linear(512, 256, 1024),
               matmul(256, 512, 512), matmul(1, 1024, 1024), linear(256, 1024, 256),
               conv(32, 128, 24, 1), conv(128, 128, 12), depthwise(64, 48), depthwise(256, 12)]
    # one-row GEMMs (GEMV_INT8: a decode step's projections), three in L1 and two in L2 beside
    # the 1 MB one above, so that each level fits a factor of its own
    dynamic += [matmul(1, 128, 128), matmul(1, 128, 256), matmul(1, 256, 128),
                matmul(1, 512, 512), matmul(1, 256, 1024)]
    # int8 activations in QOperator QLinearConv / QLinearMatMul (GEMM_S8S8)
    s8 = [conv(64, 64, 24), matmul(64, 256, 256), conv(32, 128, 24, 1)]
    # Standalone Q and DQ: per tensor, per channel on the first axis, per column on the last.
    standalone = [quantize_linear(op, shape, axis, tier)
                  for op in ("DequantizeLinear", "QuantizeLinear")
                  for shape, axis, tier in (((256, 256), 1, 0), ((1 << 16,), None, 0),
                                            ((1 << 20,), None, 1), ((256, 1024), 0, 1),
                                            ((64, 1024), 1, 1))]
    return (standalone + unpacked
            + [quantized(b, "qdq", 0 if i < 4 else 1) for i, b in enumerate(qdq)]
            + [quantized(b, "dynamic", 0 if i < 2 else 1) for i, b in enumerate(dynamic)]
            + [quantized(b, "qop-s8", 0 if i < 1 else 1) for i, b in enumerate(s8)])


def _native_decoder() -> list[Bench]:
    """The native executor's decoder kernels at the shapes a genai decoder gives them, which
    only a native-cpu calibration times (through ORT they would move its `gemm` and
    `gemm_nbits` curves): its MatMulNBits (NATIVE_NBITS) at 1 and 2 rows, where each row
    converts the 4-bit values itself, and 8 and 16, where a panel of floats is shared (the
    catalogue's others have 32-256), and its GroupQueryAttention (NATIVE_GQA) at prefills of 8
    to 64 tokens and decode steps at a short and a long past (the catalogue's four decode
    steps are measured too)."""
    nbits = [matmul_n_bits(m, k, n) for m, k, n in (
        (1, 256, 4096), (1, 1024, 1024), (1, 2048, 512), (2, 512, 2048), (8, 256, 4096),
        (8, 1024, 1024), (16, 256, 1024))]
    gqa = [gqa_decode(8, 2, 32, 0, seq=8), gqa_decode(8, 2, 32, 0, seq=64),
           gqa_decode(16, 4, 64, 0, seq=16), gqa_decode(8, 2, 32, 8),
           gqa_decode(8, 2, 32, 1000)]
    return nbits + gqa


def benchmarks(backend: str = ORT_CPU) -> list[Bench]:
    """The whole set `backend` is calibrated on, coarse tier first; names are unique."""
    out = [chain(n) for n in CHAIN_LENGTHS] + (copy_chains() if backend == ORT_CPU else [])
    for family in (_gemms, _convolutions, _depthwise, _vector, _movement_and_attention,
                   _quantized):
        out += family()
    if backend == NATIVE_CPU:
        out += _native_decoder()
    else:
        out += _ort_only()
    return sorted(out, key=lambda b: b.tier)


# Conv+Relu chains (layers, channels, kernel, size) whose weights, one per layer, add up to
# 17-19 MB, as a mid-sized network's do: what one inference reads that the caches did not keep
# from the last. Size 12, as every calibration grid: no torchvision layer at 224x224.
COLD_CHAINS = ((64, 256, 1, 12), (32, 128, 3, 12))


# Depthwise Conv chains (channels, size, kernel) whose filters a network's kernels fetch cold,
# one window of each of MLAS's depthwise kernels the timm and torchvision sets run (3x3 and 5x5
# at 7-14 pixels, EdgeNeXt's 7x7 and 9x9), 24 to 75 KB of filter a layer.
COLD_FILTER_CHAINS = ((960, 7, 3), (240, 14, 5), (384, 12, 7), (168, 7, 9))
# A Relu over this many float32s after each chain: 32 MB read and 32 written, past the
# last-level cache, as a network's weights and activations between two runs of one kernel.
FLUSH_FLOATS = 8 << 20
FLUSH = "flush"  # its node's name


def flushed(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` beside a Relu over FLUSH_FLOATS (a second input and output, so that ORT keeps
    it) that evicts every cache line between two runs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shape = (1, FLUSH_FLOATS)
    out.graph.node.append(helper.make_node("Relu", ["F"], ["FR"], name=FLUSH))
    out.graph.input.append(value_info("F", shape))
    out.graph.output.append(value_info("FR", shape))
    return out


def depthwise_chain(layers: int, channels: int, size: int, kernel: int, shared: bool
                    ) -> onnx.ModelProto:
    """`layers` depthwise Convs (stride 1, same padding) of `channels` at `size`, each with a
    filter of its own, or all reading one (`shared`)."""
    nodes, weights, x = [], [], "X"
    for i in range(layers):
        w = "W0" if shared else f"W{i}"
        if not shared or i == 0:
            weights.append(_const(w, (channels, 1, kernel, kernel)))
        nodes.append(helper.make_node("Conv", [x, w], [f"C{i}"], group=channels,
                                      kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4))
        x = f"C{i}"
    shape = (1, channels, size, size)
    return _model(nodes, [("X", shape)], (x, shape), weights)


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
