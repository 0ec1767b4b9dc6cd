"""ONNX Runtime's CPU attention as the kernels it runs (`ort_cpu` costs them): its
GroupQueryAttention kernel's copies and products, and which nodes of a decomposed attention
group (an eager or SDPA export) run inside the products and softmax or as kernels of their own
(`in_attention_block`; profiled in the Llama export: per layer FusedMatMul, Add, Softmax,
IsNaN, Where, MatMul and 2 Expands of K and V).

ORT's GroupQueryAttention kernel (contrib_ops/cpu/bert/gqa_attention_base.h, ORT 1.2x-1.3x)
loops over the query heads, one job per batch row and query head, and in each job:

1. copies its KV head's past chunk and the new tokens into `present` (ConcatStateChunkGQA),
   for the key (before Q·Kᵀ) and the value (before P·V), after a memset of both present
   buffers; a query head sharing its KV head with others copies the same chunk again, so the
   copies scale with the query heads, not the KV heads;
2. multiplies its Q rows by the present K (one MLAS SGEMM call, Kᵀ packed first) into a
   scratch of S x T scores, softmaxes the causal part of each row with its own MLAS call and
   zeroes the rest, and multiplies by the present V (a second call).

ORT skips the memset and the past's copy when the caller binds one buffer as both past and
present (onnxruntime-genai's past_present_share_buffer); a session run as `--measure` runs it
does not, and the graph cannot say: the copies are always counted, over a present of P + S
tokens (the loader's shape for present: `loader._gqa_present_shape`). At a decode step the
copies dominate: 16 query heads over 4 KV heads of 64 at context 512 move 9.4 MB for 2.1
MFLOP of products.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..cost.activation import softmax_rows
from ..cost.attention import softcap_scores
from ..cost.base import Cost
from ..cost.ops import VIEWS
from ..graph import ModelGraph
from ..hardware import GQA_DECODE, REORDER
from ..ir import NodeInfo, dtype_bytes
from . import Kernel, constant_input


def gqa_kernels(info: NodeInfo, k: Kernel, lanes: int) -> list[Kernel]:
    """`k` (the node as one `attention` kernel) as ORT runs it: with one new token, the node
    as one `gqa_decode` kernel (`decode_kernel`); with more, the KV-cache copy, a
    `data_movement` pass inside the same kernel (no launch of its own), then the per-head
    products at the attention curve, 2 GEMM calls per query head, and the B·N·S score rows'
    softmax and mask loop (`row_softmax`; `lanes`: the profile's fp32 SIMD width in floats,
    its NCHWc block).

    Derivation, with B the batch, N the query heads, Nkv the KV heads, D the head size, P the
    past and S the new tokens, T the present length (P + S), e the element bytes, and
    c = T·D·e one head's present K (or V):

        memset     = 2·B·Nkv·c                          written
        copies     = 2·B·N·T·D·e         read and written
        products   read Q, K and V's new tokens, 2·B·N·c (each job's GEMMs read its present
                   K and V), the rotary caches' B·S rows; write the output

    Measured (ORT 1.31, 1 thread, Zen 5), one node at decode: 16 query / 4 KV heads of 64,
    past 255, 511, 1023: 80, 144, 274 us (linear in T, 0.26 us per token: 26.6 KB per token
    over the three terms, 102 GB/s); 16 / 16 heads 240 us, 4 / 4 heads 70 us; estimated at
    past 511 168 us as a copy and GEMM calls (copies 116, products 52), 111 as `gqa_decode`
    (its curve fitted on the catalogue's four decode nodes). A shape this function cannot
    read is left as `k`."""
    q, y, past = info.input(0), info.outputs[0], info.input(3)
    present = info.outputs[1] if len(info.outputs) > 1 else None
    heads = info.attr("num_heads")
    if (present is None or not present.known or present.rank != 4 or not q.known
            or not y.known or not heads):
        return [k]
    batch, kv_heads, _, head = present.dims
    seq = q.dims[1]
    total = seq + (past.dims[2] if past is not None and past.known else 0)
    e = dtype_bytes(present.elem_type)
    chunk = total * head * e
    memset = 2 * batch * kv_heads * chunk
    new_kv = sum(t.nbytes for i in (1, 2) if (t := info.input(i)) is not None and t.known)
    cos = info.input(7)
    rotary = (2 * batch * seq * cos.dims[-1] * dtype_bytes(cos.elem_type)
              if info.attr("do_rotary", 0) and cos is not None and cos.known else 0)
    weights = rotary if 7 in info.const_inputs else 0
    capped = info.attr("softcap", 0.0) != 0.0
    if seq == 1:
        past_kv = sum(t.nbytes for i in (3, 4) if (t := info.input(i)) is not None and t.known)
        return [decode_kernel(k, batch * heads, head, q.nbytes + new_kv + rotary + past_kv,
                              y.nbytes + memset, weights, batch * heads * total * capped)]
    copied = 2 * batch * heads * total * head * e
    cache = Kernel("data_movement", Cost(bytes_read=copied, bytes_written=memset + copied),
                   k.nodes, k.reads, k.writes, launches=0)
    products = replace(k.cost, bytes_read=q.nbytes + new_kv + 2 * batch * heads * chunk + rotary,
                       bytes_written=y.nbytes, param_bytes=weights)
    rows = batch * heads * seq
    counted, keys = prompt_keys(info, seq, total)
    # in the node's cost (`scaled_dot_product`); `row_softmax` runs both
    loops = softmax_rows(rows, counted) + softcap_scores(rows * counted * capped)
    products = replace(products, macs=products.macs * keys // counted,
                       other_flops=products.other_flops - loops.other_flops,
                       transcendental=products.transcendental - loops.transcendental)
    return [cache, replace(k, cost=products, calls=2 * batch * heads),
            row_softmax(rows, keys, k, lanes, capped)]


def prompt_keys(info: NodeInfo, seq: int, total: int) -> tuple[int, int]:
    """(the keys a query attends in the node's cost, the keys ORT's products and softmax rows
    run over) at `seq` > 1 new tokens over a present of `total`: both `total`, except in a
    layer with a sliding-window cache (`sliding_window_cache`, `local_window_size` W), whose
    cost counts min(W, total) keys (`cost.attention.group_query_attention`) where ORT 1.31's
    kernel (gqa_attention_base.h) multiplies each head's S query rows by all the prompt's keys
    (one GEMM of S x T, T its total_seqlen) and applies the window in the softmax, zeroing
    the rest of each row. Its past input is the cache's capacity, not tokens held, so T is
    taken as S, a first prompt's (the LLM view's prefill, past 0). Measured (ORT 1.31, 1
    thread, Zen 5, gpt-oss as the builder writes it, prefill 128, window 64): the sliding
    layer's node 87-108 us against the full layer's 88-103 in three passes; estimated 78
    against 91.5 with the cost's 64 keys (its softmax subtracted over 192 keys: negative
    FLOPs left in the products)."""
    window = info.attr("local_window_size", -1)
    if not info.attr("sliding_window_cache", 0) or window <= 0:
        return total, total
    return min(window, total), seq


def decode_kernel(k: Kernel, jobs: int, head: int, read: int, written: int, weights: int,
                  capped: int = 0) -> Kernel:
    """A GQA node at one new token as ORT 1.31 runs it: one kernel of class `gqa_decode`, its
    `jobs` (batch x query heads) each a call. Profiled (perf, ORT 1.31, Zen 5, 8 query / 2 KV
    heads of 32 over 512 tokens, alone and in the small Qwen2's decode step), a job's time is
    its scores, one at a time, in two SSE loops outside MLAS's AVX-512 kernels: Q·Kᵀ as a dot
    product of the head size, a horizontal sum and a scaled store a score (29% of the node
    alone), P·V as an axpy of the head size into the output row a score (35%); the present's
    memset and the past's copies, 9%, hit L1 and L2 (each KV head's chunk is copied again
    by its N/Nkv query heads, to the same place). The copies and both loops all grow as
    T·D a job, so one curve fitted on decode nodes (`catalogue.gqa_decode`) prices the
    three by the products' MACs, with a cost per job (its FLOPs, f_half) and per score: its
    reuse is the 4·D FLOPs of one score's dot product and axpy (`head`: D), so the curve's
    I / (I + i_half) is a cost per score whatever D, as a horizontal sum is. Measured alone
    (the catalogue's four, 1 thread, Zen 5): 0.13 ns a MAC at D 32, 0.11 at 64, 0.095 at
    128, 10 us at T 128 against 34 at 512 (D 32); fitted e_max 0.103, i_half 42, f_half 4217,
    all four within 1.5%. Its traffic is the node's boundary, each tensor once: `read` Q and
    the new K and V, the rotary rows (`weights` where constant) and the past K and V;
    `written` the output and the present K and V; the in-cache copies and re-reads are in
    the curve. Not modelled: one KV head per query head (no repeats to hit the cache: 8 / 8
    heads of 32 over 512 tokens 54 us measured, 36 read), a past too big for the cache.
    Before (the copies at the L3 rate over all their 2.4 MB, the products as 16 GEMM calls
    at the gemm curve's 1.4 us a call) it read 57 us for the Qwen2's 34. `capped` scores
    (a softcap's) each pass through libm's tanhf alone, as at a prefill (`row_softmax`)."""
    cap = softcap_scores(capped)
    cost = replace(k.cost, bytes_read=read, bytes_written=written, param_bytes=weights,
                   other_flops=k.cost.other_flops - cap.other_flops,
                   transcendental=k.cost.transcendental - cap.transcendental)
    return replace(k, cls=GQA_DECODE, cost=cost, calls=jobs, reuse=4 * head, libm_calls=capped)


def row_softmax(rows: int, length: int, k: Kernel, lanes: int, capped: bool = False
                ) -> Kernel:
    """The softmax ORT 1.31's GQA kernel runs between its two products, inside the same kernel
    (no launch), on `rows` rows of its float32 score scratch, each `length` (the present, T)
    long, read and written in place (profiled with perf, ORT 1.31, Zen 5, 8 heads of 32 over
    128 tokens: 38% of the node's samples in the SGEMM kernel, 24% in MLAS's softmax kernels
    called row by row, 23% in a scalar loop that writes the lowest float over each row's
    masked scores, a compare and a branch per score):

    - the softmax over every score of the row (the node's own `softmax_rows` over the full
      length: the masked scores go through it too), at the softmax class with its rows, as a
      decomposed attention's Softmax kernel is costed: the attention curve was measured on
      blocks with the Softmax cut out, so left in the products it ran at the GEMM's rate;
    - the mask loop, one score at a time where vector code does `lanes` (the fp32 SIMD width
      in floats): `lanes` vector FLOPs a score;
    - with `capped` (a `softcap`), before the softmax, softcap·tanh(x / softcap) on every
      score of the S x T matrix, one at a time through libm's tanhf (ORT 1.31's
      ComputeAttentionSoftcapInplace): a libm call a score (`runtime.libm_call_ns`), its
      divide and multiply hidden in the call. Measured (ORT 1.31, 1 thread, Zen 5), 4 query
      / 2 KV heads of 32, softcap 50: prefill 128 160 -> 567 us, 32 30 -> 56 us, 6.2-6.4 ns
      a score (in later runs 3.1-5.5, in two modes: `fit.fit_libm_call`), where MLAS's
      vector Tanh takes 0.23-0.26 ns an element.

    Derivation: scores = rows·length; FLOPs (5·length - 2)·rows + lanes·scores, transcendental
    scores; bytes read = bytes written = 4·scores (the scratch, float32 whatever the model's
    type). Measured (ORT 1.31, 1 thread, Zen 5), 8 query / 2 KV heads of 32 over 128 tokens:
    the node 183-211 us, of which the products ~76 (the SGEMM's share); estimated 98 before
    (the softmax at the GEMM's rate, no mask loop)."""
    scores = rows * length
    work = softmax_rows(rows, length) + Cost(other_flops=lanes * scores)
    scratch = 4 * scores
    return Kernel("softmax", replace(work, bytes_read=scratch, bytes_written=scratch), k.nodes,
                  k.reads, k.writes, launches=0, rows=rows, libm_calls=scores * capped)


# What ORT runs of a decomposed attention block as the calibration's attention benchmark
# measured it (MatMul, a scale Mul, MatMul; its Softmax cut out): the two products, with the
# views between them, a Transpose of K (MatMulTransposeFusion) and a multiply or divide by a
# scalar constant (MatMulScaleFusion), both folded into a FusedMatMul. The Softmax is a kernel
# of ORT's own between them, costed at the softmax class with its rows: over short rows
# (windows of 16-49 tokens) MLAS's per-row reductions, not the products, set much of the
# block's time (TinyViT's 16 x 4 x 49 x 32 block, 264 us: its Softmax 73 us, 0.47 ns per
# element), which one curve over the products' size could not give both there and at 512
# tokens (fitted on both, it read 2 x 512 x 64 46-77% slow).
_BLOCK_OPS = frozenset({"MatMul", "Transpose", "Constant", *VIEWS})
_SCALES = frozenset({"Mul", "Div"})


def packed_keys(mg: ModelGraph, nodes: Sequence[str]) -> list[Kernel]:
    """The copy MLAS makes of the keys before a decode step's scaled Q·Kᵀ: one query row a
    head (M = 1). MLAS's SGEMM multiplies a single row straight from B (its GEMV kernel,
    MlasSgemmKernelM1) only with alpha = 1; ORT's MatMulScaleFusion puts the attention's
    scale into the FusedMatMul's alpha, so MLAS first packs B, the keys, panel by panel
    (MlasSgemmCopyPackB or TransposePackB): |K| read and written, a blocked copy at the
    calibrated `reorder` rate, inside the product's kernel (no launch). The first MatMul of
    `nodes` of two activations is Q·Kᵀ; a block without a scalar Mul or Div (T5's) keeps
    alpha = 1 and copies nothing, and neither does a prompt (M > 1: B is packed once and
    reused by each row, in the attention curve). Measured alone (ORT 1.31, 1 thread, Zen 5;
    [1, H, 1, d] x [1, H, d, T]), MatMul against FusedMatMul with alpha 0.177: H 4, d 32,
    T 512 (K 256 KB) 3.3 / 7.3 us, T 2048 12.4 / 36.8; H 8, d 64, T 512 (1 MB) 11.3 / 31.4;
    packing at 91 GB/s reads +5.6 and +22 us for the two sizes."""
    qk = next((k for k in nodes if mg.info(k).op_type == "MatMul"
               and not constant_input(mg, mg.info(k), 1)), None)  # not a projection
    scaled = any(i.op_type in _SCALES and in_attention_block(mg, i) for i in map(mg.info, nodes))
    if qk is None or not scaled:
        return []
    a, keys = mg.info(qk).input(0), mg.info(qk).input(1)
    if a is None or keys is None or not (a.known and keys.known) or a.rank < 2 or a.dims[-2] != 1:
        return []
    return [Kernel(REORDER, Cost(bytes_read=keys.nbytes, bytes_written=keys.nbytes), (qk,),
                   launches=0)]


def in_attention_block(mg: ModelGraph, info: NodeInfo) -> bool:
    """Whether ORT runs node `info` of an attention group inside the products (`_BLOCK_OPS`;
    a Mul or Div with a one-element constant operand, an initializer or a Constant node's
    output); any other node (the Softmax, the mask's Add, IsNaN, Where, And, a GQA's Expand
    of K and V, Swin's relative position bias Add) is a kernel of its own. A Transpose is in
    the block only where MatMulTransposeFusion folds it (`swaps_last_two`): LeViT's and
    TinyViT's K, [B, N, H, D] -> [B, H, D, N] (perm 0, 2, 3, 1), is a Transpose kernel before
    the FusedMatMul in ORT's optimized graph, and so is one whose output reaches the MatMul
    only through a view of a shape computed at run time (`reaches_matmul`)."""
    if info.op_type == "Transpose":
        return swaps_last_two(info) and reaches_matmul(mg, info)
    if info.op_type in _BLOCK_OPS:
        return True
    return info.op_type in _SCALES and any(
        t is not None and t.known and t.size == 1 and constant_input(mg, info, i)
        for i, t in enumerate(info.inputs))


def reaches_matmul(mg: ModelGraph, info: NodeInfo) -> bool:
    """Whether every reader of `info`'s output is a MatMul, or a view (`VIEWS`) whose shape or
    axes are constants (`constant_input`) and whose readers are so in turn: what
    MatMulTransposeFusion folds into a FusedMatMul, after ORT has rewritten the views around
    the Transpose (a `_new_reshape` in its optimized graph). A view of a shape computed at run
    time (the dynamo export's SDPA reshapes K to 3-D and back, the shapes a Concat of a
    symbolic length's Shape) keeps the Transpose a kernel of its own. Checked against ORT
    1.31's optimized graphs: the HF Llama's decode step at past 511 runs K's [4, 512, 32] ->
    [4, 32, 512] Transpose as a kernel in each layer (6.5-7 us alone, Zen 5, 1 thread); the
    same layer cut out with its shapes as initializers runs it in the FusedMatMul. Not
    modelled: a constant shape with a -1 keeps it too (the graph holds no initializer
    values), as it did before this rule."""
    readers = [mg.info(k) for k in mg.consumers.get(info.outputs[0].name, ())]
    return bool(readers) and all(
        r.op_type == "MatMul" or (r.op_type in VIEWS and all(
            constant_input(mg, r, i) for i in range(1, len(r.inputs)) if r.inputs[i])
            and reaches_matmul(mg, r))
        for r in readers)


def swaps_last_two(info: NodeInfo) -> bool:
    """Whether Transpose `info` swaps its last two axes only, the one FusedMatMul takes as
    transA / transB (an unknown rank: taken)."""
    x = info.input(0)
    if x is None or not x.known:
        return True
    rank = len(x.dims)
    perm = list(info.attr("perm", list(range(rank))[::-1]))
    return rank >= 2 and perm == [*range(rank - 2), rank - 1, rank - 2]


def without_work_of(k: Kernel, others: list[Cost]) -> Kernel:
    """`k` less the arithmetic of `others` (nodes run as kernels of their own): the block keeps
    its boundary traffic, as the calibration's attention benchmark counted it."""
    flops = sum(c.other_flops for c in others)
    transcendental = sum(c.transcendental for c in others)
    return replace(k, cost=replace(k.cost, other_flops=k.cost.other_flops - flops,
                                   transcendental=k.cost.transcendental - transcendental))
