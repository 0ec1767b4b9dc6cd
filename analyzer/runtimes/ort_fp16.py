"""Where ORT's CPU provider runs a float16 graph in float32, and the Casts that costs.

ORT's CPU provider has float16 kernels for data movement and a few other ops only. Its
InsertCastTransformer runs every other op reading or writing float16 on its float32 kernel
between Casts, then RemoveDuplicateCastTransformer drops the back-to-back pairs, so one Cast
is left on each float16 tensor that crosses between a float16 kernel and a float32 one (per
tensor, however many readers it has); those of constants are folded when the session loads."""

from __future__ import annotations

from dataclasses import replace

import onnx

from ..cost.base import Cost
from ..graph import ModelGraph
from ..ir import NodeInfo, TensorInfo
from . import Kernel

# The ops whose one-node float16 graph ORT 1.31 (x86) optimizes without a Cast
# (tests/test_ort_fp16.py reads them back from ORT). Relu is left out: its graph holds one.
FLOAT16_KERNELS = frozenset({
    "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherND", "Expand",
    "Squeeze", "Unsqueeze", "Identity", "Flatten", "Shape", "IsNaN", "Cast", "Clip", "Max",
    "Min", "Round", "Sign", "LayerNormalization", "SimplifiedLayerNormalization",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})


def is_float16(t: TensorInfo | None) -> bool:
    return t is not None and t.elem_type == onnx.TensorProto.FLOAT16


def _checked_inputs(info: NodeInfo) -> tuple[TensorInfo | None, ...]:
    """The inputs ORT's isolation check reads: the first of each formal parameter, so of a
    variadic one (Concat's) only the first; all of an op onnx does not define (ORT's own)."""
    if not onnx.defs.has(info.op_type, info.domain):
        return info.inputs
    formals = onnx.defs.get_schema(info.op_type, domain=info.domain).inputs
    variadic = formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    return info.inputs[:len(formals)] if variadic else info.inputs


def _isolated(mg: ModelGraph, key: str, fp32: set[str]) -> bool:
    """ORT's IsIsolatedFp16NodeOnCpu: a float16-kernel node that reads some node's output,
    writes no graph output, and whose float16 inputs (`_checked_inputs`) all come from, and
    float16 outputs all go to, float32 nodes, runs in float32 too (its Casts would outnumber
    its work)."""
    info = mg.info(key)
    fed = [t.name for t in info.inputs if t is not None and t.name in mg.producer]
    fp16_in = [mg.producer[t.name] for t in _checked_inputs(info)
               if is_float16(t) and t.name in mg.producer]
    fp16_out = [t for t in info.outputs if is_float16(t)]
    return (bool(fed) and bool(fp16_in) and bool(fp16_out)
            and not any(t.name in mg.graph_outputs for t in info.outputs)
            and all(p in fp32 for p in fp16_in)
            and all(r in fp32 for t in fp16_out for r in mg.consumers.get(t.name, ())))


def float32_nodes(mg: ModelGraph) -> frozenset[str]:
    """The nodes reading or writing float16 that ORT runs on float32 kernels: those without a
    float16 kernel, then, in one pass in file order as ORT makes it, the isolated others."""
    fp32 = {key for key, info in mg.infos.items() if info.op_type not in FLOAT16_KERNELS
            and any(map(is_float16, (*info.inputs, *info.outputs)))}
    for key, info in mg.infos.items():
        if info.op_type in FLOAT16_KERNELS and _isolated(mg, key, fp32):
            fp32.add(key)
    return frozenset(fp32)


def _cast(mg: ModelGraph, name: str, fp32: frozenset[str], constant: bool) -> bool:
    """Whether ORT runs a Cast of float16 tensor `name` (one per tensor, whatever its
    readers). A constant's is folded into its reader when it has one reader
    (FuseInitializersTransformer), not when more float32 nodes share it."""
    readers = mg.consumers.get(name, [])
    to_fp32 = sum(r in fp32 for r in readers)
    if constant:
        return to_fp32 > 1
    if mg.producer.get(name) in fp32:
        return to_fp32 < len(readers) or name in mg.graph_outputs
    return to_fp32 > 0


def inserted_casts(mg: ModelGraph, fp32: frozenset[str],
                   constants: set[str]) -> dict[str, list[TensorInfo]]:
    """Node key -> the float16 tensors ORT casts beside that node's kernel (`_cast`): a
    float32 node's output that a float16 kernel or the caller reads, cast down after it; a
    float16 kernel's output that a float32 node reads, cast up after it; a graph input or a
    constant (`constants`: initializers, outputs folded at load), cast up at its first
    float32 reader. `fp32` is `float32_nodes`."""
    tensors = {t.name: t for info in mg.infos.values()
               for t in (*info.inputs, *info.outputs) if is_float16(t)}
    casts: dict[str, list[TensorInfo]] = {}
    for name, t in tensors.items():
        constant = name in constants
        if not _cast(mg, name, fp32, constant):
            continue
        at = mg.producer.get(name)
        if at is None or constant:
            at = next(r for r in mg.consumers[name] if r in fp32)
        casts.setdefault(at, []).append(t)
    return casts


def cast_kernel(t: TensorInfo) -> Kernel:
    """One Cast between float16 and float32: each element read at one width and written at
    the other (2 + 4 bytes), one conversion each."""
    elements = t.nbytes // 2
    return Kernel("elementwise", Cost(other_flops=elements, bytes_read=2 * elements,
                                      bytes_written=4 * elements), (), inputs=(t,))


def float16_as_float32(k: Kernel, fp32: frozenset[str]) -> Kernel:
    """ORT's CPU provider has no float16 Conv, Gemm or MatMul on x86 (MLAS's are ARM's): it
    puts Casts around them (InsertCastTransformer), folds those of the weights at load and
    drops back-to-back pairs, so an fp16 model runs the fp32 model's kernels on 4-byte
    tensors (profiled, ORT 1.31, ResNet-18 fp16: 20 Conv, 1 Gemm and 1 Cast, all float32): a
    kernel writing float16 moves twice the bytes stored, its weights included. Its MACs run at
    the profile's fp16 peak, which a CPU without fp16 units reads as fp32's. Kernels of
    `fp32`'s nodes only (`float32_nodes`): the others run in float16."""
    if fp32.isdisjoint(k.nodes) or not any(map(is_float16, k.outputs)):
        return k
    c = k.cost
    return replace(k, cost=replace(c, bytes_read=2 * c.bytes_read,
                                   bytes_written=2 * c.bytes_written,
                                   param_bytes=2 * c.param_bytes))
