"""The small values the rest of the analyzer speaks in: tensors and nodes.

A dimension is an ``int`` when known, a ``str`` when symbolic (``"batch"``) and ``None`` when
nothing is known about it. A tensor whose rank is unknown has ``shape = None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import onnx

Dim = int | str | None
Shape = tuple[Dim, ...]

# Bits per element for each ONNX element type, as stored: sub-byte types are packed (two 4-bit
# values per byte, ONNX's int4/uint4/float4e2m1 layout; four 2-bit values; float6 bit-packed).
_T = onnx.TensorProto
_DTYPE_BITS: dict[int, int] = {
    _T.FLOAT: 32, _T.UINT8: 8, _T.INT8: 8, _T.UINT16: 16, _T.INT16: 16, _T.INT32: 32,
    _T.INT64: 64, _T.STRING: 64, _T.BOOL: 8, _T.FLOAT16: 16, _T.DOUBLE: 64, _T.UINT32: 32,
    _T.UINT64: 64, _T.COMPLEX64: 64, _T.COMPLEX128: 128, _T.BFLOAT16: 16,
    _T.FLOAT8E4M3FN: 8, _T.FLOAT8E4M3FNUZ: 8, _T.FLOAT8E5M2: 8, _T.FLOAT8E5M2FNUZ: 8,
    _T.FLOAT8E8M0: 8, _T.UINT4: 4, _T.INT4: 4, _T.FLOAT4E2M1: 4, _T.UINT2: 2, _T.INT2: 2,
    _T.FLOAT6E2M3: 6, _T.FLOAT6E3M2: 6,
}
# Bytes per element, sub-byte types rounded up to one byte (an element's own storage, as an
# executor that unpacks them holds it).
_DTYPE_BYTES: dict[int, int] = {t: max(bits // 8, 1) for t, bits in _DTYPE_BITS.items()}


def dtype_bytes(elem_type: int) -> int:
    """Storage size of one element; sub-byte types count as one byte (unknown types too)."""
    return _DTYPE_BYTES.get(elem_type, 1)


def dtype_bits(elem_type: int) -> int:
    """Bits per stored element (8 for a type this table does not know)."""
    return _DTYPE_BITS.get(elem_type, 8)


def packed_bytes(elem_type: int, elements: int) -> int:
    """Bytes of `elements` values stored packed: ceil(elements * bits / 8) (an odd count of
    4-bit values leaves half a byte of padding)."""
    return -(-elements * _DTYPE_BITS.get(elem_type, 8) // 8)


def dtype_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"dtype{elem_type}"


class UnknownShape(Exception):
    """Raised by a cost formula when a shape it needs is not known; names the tensor."""

    def __init__(self, tensor: str) -> None:
        super().__init__(tensor)
        self.tensor = tensor


def _elements(shape: Shape | None) -> int | None:
    """The product of the dims when every one is an int, else None."""
    if shape is None:
        return None
    count = 1
    for d in shape:
        if type(d) is not int:
            return None
        count *= d
    return count


@dataclass(frozen=True, slots=True, init=False)
class TensorInfo:
    name: str
    elem_type: int = 0
    shape: Shape | None = None
    # Element count when every dim is known, else None; computed once (formulas ask often).
    elements: int | None = field(init=False, repr=False, compare=False, default=None)

    # Written through the slots' own setters: one is built per tensor (100,000 on a
    # 50,000-node model), and the generated __init__ with a __post_init__ took 3x as long.
    def __init__(self, name: str, elem_type: int = 0, shape: Shape | None = None) -> None:
        _set_name(self, name)
        _set_elem_type(self, elem_type)
        _set_shape(self, shape)
        _set_elements(self, _elements(shape))

    @property
    def known(self) -> bool:
        return self.elements is not None

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape as ints, or `UnknownShape` naming this tensor."""
        if self.elements is None:
            raise UnknownShape(self.name)
        return self.shape  # type: ignore[return-value]

    @property
    def size(self) -> int:
        if self.elements is None:
            raise UnknownShape(self.name)
        return self.elements

    @property
    def nbytes(self) -> int:
        if self.elements is None:
            raise UnknownShape(self.name)
        # packed_bytes, inlined: one call per tensor read or written by every node
        return -(-self.elements * _DTYPE_BITS.get(self.elem_type, 8) // 8)

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise UnknownShape(self.name)
        return len(self.shape)


_set_name, _set_elem_type, _set_shape, _set_elements = (
    getattr(TensorInfo, f).__set__ for f in ("name", "elem_type", "shape", "elements"))


@dataclass(frozen=True, slots=True, init=False)
class NodeInfo:
    """One ONNX node as the cost formulas see it: op, attributes and typed tensors.

    `inputs` keeps ONNX positions; an omitted optional input is ``None``.
    """

    name: str
    op_type: str
    domain: str
    attrs: dict[str, Any]
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo, ...]
    index: int = 0
    # Input positions fed by initializers (weights, biases, constant shapes).
    const_inputs: frozenset[int] = field(default_factory=frozenset)

    def __init__(self, name: str, op_type: str, domain: str, attrs: dict[str, Any],
                 inputs: tuple[TensorInfo | None, ...], outputs: tuple[TensorInfo, ...],
                 index: int = 0, const_inputs: frozenset[int] = frozenset()) -> None:
        # As TensorInfo's: one per node.
        _set_node_name(self, name)
        _set_op_type(self, op_type)
        _set_domain(self, domain)
        _set_attrs(self, attrs)
        _set_inputs(self, inputs)
        _set_outputs(self, outputs)
        _set_index(self, index)
        _set_const_inputs(self, const_inputs)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> TensorInfo | None:
        return self.inputs[i] if i < len(self.inputs) else None


(_set_node_name, _set_op_type, _set_domain, _set_attrs, _set_inputs, _set_outputs, _set_index,
 _set_const_inputs) = (getattr(NodeInfo, f.name).__set__ for f in fields(NodeInfo))


# Attribute kinds whose value `NodeFields` reads up front; the value of any other kind (and of a
# reference to a local function's attribute) is left in the proto, `DEFERRED`.
_INT, _INTS, _FLOAT, _FLOATS, _STRING, _TENSOR, _GRAPH, _GRAPHS = (
    onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT,
    onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRING, onnx.AttributeProto.TENSOR,
    onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
DEFERRED = object()


class NodeFields(NamedTuple):
    """One NodeProto's fields, read once for the structure checks, the validation layer and the
    graph: every read of a proto field builds a new Python object (about half of loading a
    50,000-node model went to reading the same fields three times). A tuple: one is built per
    node.

    Text fields are as protobuf gives them (bytes when not UTF-8: the checks refuse those).
    `attributes`: (name, kind, value) in file order; a STRING is decoded, ``INTS``/``FLOATS``
    and ``GRAPHS`` are lists, other kinds and references are `DEFERRED`.
    """

    proto: onnx.NodeProto
    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: tuple[tuple[str, int, Any], ...]


def read_nodes(nodes: Iterable[onnx.NodeProto]) -> list[NodeFields]:
    return [NodeFields(node, node.name, node.op_type, node.domain, node.input[:],
                       node.output[:], _read_attributes(node)) for node in nodes]


def _read_attributes(node: onnx.NodeProto) -> tuple[tuple[str, int, Any], ...]:
    out = []
    for a in node.attribute:
        kind = a.type
        if a.ref_attr_name:
            value = DEFERRED
        elif kind == _INTS:
            value = a.ints[:]
        elif kind == _INT:
            value = a.i
        elif kind == _STRING:
            value = a.s.decode("utf-8", "replace")
        elif kind == _FLOAT:
            value = a.f
        elif kind == _FLOATS:
            value = a.floats[:]
        elif kind == _TENSOR:
            value = a.t
        elif kind == _GRAPH:
            value = a.g
        elif kind == _GRAPHS:
            value = a.graphs[:]
        else:
            value = DEFERRED
        out.append((a.name, kind, value))
    return tuple(out)
