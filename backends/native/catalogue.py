"""The native executor's operation catalogue, read from `ops.def`, the one file the C++ core
and the CUDA kernels include as X-macros: the elementwise operations of the fused programs
(name, operand count, scalar parameters), the reduction kernels, the storage codes of plan
tensors, the operations a GEMM or depthwise tile applies as it stores (`TILE_EPILOGUE`),
each instruction set's GEMM micro-tile (`GEMM_TILES`) and the columns past its last whole
vector that run narrow (`GEMM_NARROW_COLS`).
The planner builds its instructions and tensors from these, so Python and C++ cannot disagree
on a name or a code; an operation the catalogue lacks is refused when it is emitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...analyzer.cost.reduce import REDUCE_OPS as ANALYZER_REDUCE_OPS

_ENTRY = re.compile(
    r"^(EW_UNARY|EW_BINARY|EW_TERNARY|REDUCE_OP|STORAGE|TILE_EPILOGUE)\((\w+)(?:,\s*(\w+))?")
_GEMM_TILE = re.compile(r"^GEMM_TILE\((\w+),\s*(\d+),\s*(\d+)\)")
_GEMM_NARROW_COLS = re.compile(r"^GEMM_NARROW_COLS\((\d+)\)")
_ARITY = {"EW_UNARY": 1, "EW_BINARY": 2, "EW_TERNARY": 3}


@dataclass(frozen=True, slots=True)
class EwOp:
    name: str
    arity: int  # operands
    params: int  # scalar parameters (p0, p1) it reads


_LINES = Path(__file__).with_name("ops.def").read_text(encoding="utf-8").splitlines()
_ALL = [(m[1], m[2], m[3]) for line in _LINES if (m := _ENTRY.match(line))]
EW_OPS: dict[str, EwOp] = {
    name: EwOp(name, _ARITY[kind], int(extra or 0) if kind == "EW_UNARY" else 0)
    for kind, name, extra in _ALL if kind in _ARITY}


def same_reductions(native: tuple[str, ...], analyzer: tuple[str, ...]) -> tuple[str, ...]:
    """`native` (ops.def's kernels) when it names the analyzer's reductions, the one list;
    else a loud error at import."""
    if set(native) != set(analyzer):
        raise ValueError(f"ops.def's REDUCE_OP entries {sorted(native)} differ from "
                         f"analyzer/cost/reduce.py's REDUCE_OPS {sorted(analyzer)}")
    return native


REDUCE_OPS = same_reductions(tuple(name for kind, name, _ in _ALL if kind == "REDUCE_OP"),
                             ANALYZER_REDUCE_OPS)
STORAGE: dict[str, int] = {name: int(code or 0) for kind, name, code in _ALL if kind == "STORAGE"}
# A fused epilogue of these alone can be applied by the tile as it stores; any other operation
# makes it a program run over the kernel's output after the tile (ewprog.cpp).
TILE_EPILOGUE: frozenset[str] = frozenset(name for kind, name, _ in _ALL
                                          if kind == "TILE_EPILOGUE")
# Instruction set -> (mr, nr): the GEMM micro-tile the core's GEMM computes whole.
GEMM_TILES: dict[str, tuple[int, int]] = {
    m[1]: (int(m[2]), int(m[3])) for line in _LINES if (m := _GEMM_TILE.match(line))}
# The most columns past a tile's last whole vector that the GEMM runs column by column.
(GEMM_NARROW_COLS,) = (int(m[1]) for line in _LINES if (m := _GEMM_NARROW_COLS.match(line)))
