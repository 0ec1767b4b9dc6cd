"""The small values the rest of the analyzer speaks in: tensors and nodes.

A dimension is an ``int`` when known, a ``str`` when symbolic (``"batch"``) and ``None`` when
nothing is known about it. A tensor whose rank is unknown has ``shape = None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    elem_type: int = 0
    shape: Shape | None = None
    # Element count when every dim is known, else None; computed once (formulas ask often).
    elements: int | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.shape is not None and all(type(d) is int for d in self.shape):
            object.__setattr__(self, "elements", math.prod(self.shape))  # type: ignore[arg-type]

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
        return self.size * dtype_bytes(self.elem_type)

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise UnknownShape(self.name)
        return len(self.shape)


@dataclass(frozen=True, slots=True)
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

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> TensorInfo | None:
        return self.inputs[i] if i < len(self.inputs) else None
