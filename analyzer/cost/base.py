"""The cost value and the op registry.

A cost formula is a pure function of one node's shapes, dtypes and attributes (a `NodeInfo`)
returning the arithmetic it does as a `Cost`. Memory traffic and parameters are not the
formulas' business: they follow from tensor sizes alone and are filled in by the analysis
(`with_memory`), so that one rule charges bytes the same way for every op.

Conventions (README, "Counting conventions"):
- ``macs``: multiply-accumulates of Conv, ConvTranspose, Gemm, MatMul, Einsum.
- ``flops``: every floating-point operation; ``flops_per_mac`` (2 by default) per MAC, plus
  ``other_flops`` (elementwise, normalization, activation, pooling, softmax, bias work).
- ``transcendental``: exp/log/erf/tanh/sqrt-like evaluations, also counted in ``other_flops``
  as one FLOP each; kept apart because hardware runs them on slower units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from ..ir import NodeInfo, TensorInfo


@dataclass(frozen=True, slots=True, init=False)
class Cost:
    macs: int = 0
    other_flops: int = 0
    transcendental: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    params: int = 0
    param_bytes: int = 0

    def __init__(self, macs: int = 0, other_flops: int = 0, transcendental: int = 0,
                 bytes_read: int = 0, bytes_written: int = 0, params: int = 0,
                 param_bytes: int = 0) -> None:
        # Written through the slots' own setters: two are built per node, and the generated
        # __init__ of a frozen dataclass (object.__setattr__ per field) took twice as long.
        _set_macs(self, macs)
        _set_other_flops(self, other_flops)
        _set_transcendental(self, transcendental)
        _set_bytes_read(self, bytes_read)
        _set_bytes_written(self, bytes_written)
        _set_params(self, params)
        _set_param_bytes(self, param_bytes)

    def flops(self, flops_per_mac: int = 2) -> int:
        return flops_per_mac * self.macs + self.other_flops

    def vector_flops(self, transcendental_flops: float = 1.0) -> float:
        """The work without MACs in plain-FLOP equivalents, when one transcendental evaluation
        costs `transcendental_flops` plain FLOPs on the vector units: other_flops counts it as
        one, so it adds (transcendental_flops - 1) per evaluation. 1 gives other_flops."""
        return self.other_flops + (transcendental_flops - 1) * self.transcendental

    def __add__(self, other: Cost) -> Cost:
        # Spelled out: this runs once per node and group, and fields() is slow.
        return Cost(self.macs + other.macs, self.other_flops + other.other_flops,
                    self.transcendental + other.transcendental,
                    self.bytes_read + other.bytes_read, self.bytes_written + other.bytes_written,
                    self.params + other.params, self.param_bytes + other.param_bytes)


(_set_macs, _set_other_flops, _set_transcendental, _set_bytes_read, _set_bytes_written,
 _set_params, _set_param_bytes) = (getattr(Cost, f.name).__set__ for f in fields(Cost))
ZERO = Cost()
MS = "com.microsoft"  # ONNX Runtime's contrib domain
NCHWC_DOMAIN = "com.microsoft.nchwc"  # ORT's NCHWc kernels (its optimized models)
Formula = Callable[[NodeInfo], Cost]
# The operands of an op's MACs: tensors (whose stored precision `precision` looks up) or an
# element type the op converts them to itself (DynamicQuantizeMatMul quantizes A to uint8).
Operands = Callable[[NodeInfo], tuple[TensorInfo | int | None, ...]]


def operands_at(*positions: int) -> Operands:
    """MAC operands at these input positions."""

    def operands(node: NodeInfo) -> tuple[TensorInfo | None, ...]:
        return tuple(node.input(i) for i in positions)

    return operands


FIRST_TWO = operands_at(0, 1)  # A and B, X and W, Q and K
Packed = Callable[[NodeInfo], dict[int, int]]


@dataclass(frozen=True, slots=True)
class OpSpec:
    op_type: str
    formula: Formula
    family: str
    # A view (Reshape, Squeeze, ...) moves no data on any real backend: no bytes charged.
    is_view: bool = False
    # Which tensors' precision the op's MACs run at (read only for nodes with MACs).
    operands: Operands = FIRST_TWO
    # Inputs whose stored elements pack several parameters (MatMulNBits' uint8 blobs of 4-bit
    # weights): position -> the number of parameters they hold. None: one per element.
    packed: Packed | None = None


class DuplicateOpError(RuntimeError):
    """Two modules registered a formula for the same op: a programming error."""


REGISTRY: dict[tuple[str, str], OpSpec] = {}


def register(*op_types: str, family: str, domain: str = "", is_view: bool = False,
             operands: Operands = FIRST_TWO, packed: Packed | None = None
             ) -> Callable[[Formula], Formula]:
    """Register `formula` for each ONNX `op_type` (in `domain`); twice is an error."""

    def decorate(formula: Formula) -> Formula:
        for op in op_types:
            key = (domain, op)
            if key in REGISTRY:
                raise DuplicateOpError(f"cost formula for {domain or 'ai.onnx'}::{op} registered "
                                       f"twice ({REGISTRY[key].family} and {family})")
            REGISTRY[key] = OpSpec(op, formula, family, is_view, operands, packed)
        return formula

    return decorate


def lookup(op_type: str, domain: str = "") -> OpSpec | None:
    if domain == "ai.onnx":
        domain = ""
    return REGISTRY.get((domain, op_type))
