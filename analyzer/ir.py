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

# Bytes per element for each ONNX element type (sub-byte types rounded up to one byte).
_DTYPE_BYTES: dict[int, int] = {
    onnx.TensorProto.FLOAT: 4,
    onnx.TensorProto.UINT8: 1,
    onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.INT16: 2,
    onnx.TensorProto.INT32: 4,
    onnx.TensorProto.INT64: 8,
    onnx.TensorProto.STRING: 8,
    onnx.TensorProto.BOOL: 1,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.UINT32: 4,
    onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.COMPLEX64: 8,
    onnx.TensorProto.COMPLEX128: 16,
    onnx.TensorProto.BFLOAT16: 2,
}


def dtype_bytes(elem_type: int) -> int:
    """Storage size of one element; 8-bit and 4-bit float/int types count as one byte."""
    return _DTYPE_BYTES.get(elem_type, 1)


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
        return self.elements * _DTYPE_BYTES.get(self.elem_type, 1)

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
