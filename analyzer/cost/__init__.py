"""Cost formulas, one module per op family, all registered in one table keyed by op_type."""

# Importing a family registers its formulas.
from . import (  # noqa: F401
    activation,
    attention,
    conv,
    elementwise,
    fused,
    matmul,
    moe,
    norm,
    pool,
    quant,
    reduce,
    shape,
)
from .base import REGISTRY, ZERO, Cost, OpSpec, lookup, register

__all__ = ["REGISTRY", "ZERO", "Cost", "OpSpec", "lookup", "register"]
