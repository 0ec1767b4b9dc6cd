"""Cost formulas, one module per op family, all registered in one table keyed by op_type."""

from . import conv  # noqa: F401  (importing a family registers its formulas)
from .base import REGISTRY, ZERO, Cost, OpSpec, lookup, register

__all__ = ["REGISTRY", "ZERO", "Cost", "OpSpec", "lookup", "register"]
