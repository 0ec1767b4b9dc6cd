"""Which precision a node's MACs run at, and so a group's: read from the stored types of the
tensors the MACs multiply, seen through dequantization.

The rule (README, "Precision"):
- A MAC-carrying node's operands are the tensors its op registers (`OpSpec.operands`: A and
  B, X and W, Q and K ...). An operand made by DequantizeLinear (through layout-only ops:
  Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity) counts at the type it was
  dequantized from: a QDQ Conv multiplies uint8 activations by int8 weights.
- Operands of several types: a float one wins (int4 weights dequantized for an fp16
  activation are fp16 MACs, weight-only quantization); else the widest (int8 x int4: int8).
- Integer types are named by width, signed or not (`int8` for uint8 x int8, `int4`); float
  types by ONNX's name with their width (`float32`, `float16`, `bfloat16`, `float8e4m3fn`).
- A group's precision is that of the precision doing most of its MACs; a group without MACs
  (Relu, a residual Add, a lone Q or DQ) has its last node's output type, or, when it ends by
  dequantizing its own quantized output (a QDQ MaxPool whose output several groups read:
  `analyzer.fusion`), the type of that output: its work ran quantized.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence

import onnx

from ..ir import NodeInfo, TensorInfo, dtype_bits, dtype_name
from .base import lookup
from .ops import RESHAPES

_T = onnx.TensorProto
_FLOATS = frozenset({_T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BFLOAT16})
_INTEGERS = frozenset({_T.INT2, _T.UINT2, _T.INT4, _T.UINT4, _T.INT8, _T.UINT8, _T.INT16,
                       _T.UINT16, _T.INT32, _T.UINT32, _T.INT64, _T.UINT64})
DEQUANTIZE = frozenset({"DequantizeLinear"})
LAYOUT = frozenset({*RESHAPES, "Transpose"})


@functools.cache  # a handful of types, asked once per MAC-carrying node
def precision_name(elem_type: int) -> str:
    if elem_type in _INTEGERS:
        return f"int{dtype_bits(elem_type)}"
    if elem_type in (_T.FLOAT, _T.DOUBLE):
        return f"float{dtype_bits(elem_type)}"
    return dtype_name(elem_type)


def combine(types: Iterable[int]) -> str | None:
    """The precision of MACs between operands of these stored types (0: unknown, skipped);
    between types of one width, the first operand's (float16 x bfloat16: float16)."""
    known = [t for t in types if t]  # in operand order: `max` keeps the first of a width
    if len(set(known)) <= 1:  # most nodes: one type, or none known
        return precision_name(known[0]) if known else None
    floats = [t for t in known if t in _FLOATS]
    return precision_name(max(floats or known, key=dtype_bits))


def stored_type(t: TensorInfo, producer: Callable[[str], NodeInfo | None]) -> int:
    """`t`'s element type, or the type it was dequantized from (through layout-only ops)."""
    seen = t
    for _ in range(8):  # a few layout ops at most between a DequantizeLinear and its reader
        node = producer(seen.name)
        if node is None or not node.inputs or node.inputs[0] is None:
            break
        if node.op_type in DEQUANTIZE:
            return node.inputs[0].elem_type
        if node.op_type not in LAYOUT:
            break
        seen = node.inputs[0]
    return t.elem_type


def mac_precision(node: NodeInfo, producer: Callable[[str], NodeInfo | None]) -> str | None:
    """The precision of `node`'s MACs (None for an op without a formula or unknown types)."""
    spec = lookup(node.op_type, node.domain)
    if spec is None:
        return None
    return combine(o if isinstance(o, int) else stored_type(o, producer)
                   for o in spec.operands(node) if o is not None)


def group_precision(macs: Mapping[str, int], tail: Sequence[NodeInfo]) -> str:
    """A group's precision from its MACs per precision, or from the output type of its last
    node that is not a trailing DequantizeLinear. `tail`: the group's last nodes in execution
    order; its last two are all this reads (callers pass just those)."""
    if macs:
        return max(macs, key=macs.__getitem__)
    last = tail[-1]
    if len(tail) > 1 and last.op_type in DEQUANTIZE:
        last = tail[-2]  # the QuantizeLinear whose output the group dequantizes
    return precision_name(last.outputs[0].elem_type) if last.outputs else "unknown"
