"""Costs as formulas of a model's symbolic dims (``batch``, ``seq``, ...).

A model exported with a dynamic batch or sequence names its input dims instead of fixing them.
Every total onnxlens counts is a polynomial in those dims of low degree (attention's MACs grow
with seq², a convnet's with batch), so rather than push symbols through every formula we
analyze the model at a few integer points and solve exactly (rational arithmetic) for the
coefficients of a polynomial of total degree <= 3, then check the fit at one more point. A
total that is not such a polynomial (the activation peak can move between layers as dims grow)
gets no formula rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from itertools import product

from .ir import TensorInfo

MAX_DEGREE = 3
MAX_SYMBOLS = 2
Point = tuple[int, ...]


def symbolic_dims(inputs: Sequence[TensorInfo]) -> list[str]:
    """Names of the symbolic dims of the graph inputs, in order of first appearance."""
    names: list[str] = []
    for t in inputs:
        for d in t.shape or ():
            if isinstance(d, str) and d not in names:
                names.append(d)
    return names


def pinned_shapes(inputs: Sequence[TensorInfo], values: Mapping[str, int]
                  ) -> dict[str, tuple[int, ...]] | None:
    """Input shapes with each symbol replaced by its value; None if a dim stays unknown."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in inputs:
        if t.shape is None:
            return None
        dims = [values.get(d) if isinstance(d, str) else d for d in t.shape]
        if any(d is None for d in dims):
            return None
        shapes[t.name] = tuple(dims)  # type: ignore[arg-type]
    return shapes


def _monomials(n: int) -> list[Point]:
    return [e for e in product(range(MAX_DEGREE + 1), repeat=n) if sum(e) <= MAX_DEGREE]


def sample_points(n: int) -> tuple[list[Point], Point]:
    """A unisolvent set for polynomials of total degree <= 3 in n variables, and a check point.

    The triangular grid {1 + e : e a monomial exponent} is unisolvent for that space; the
    all-ones point comes first so that the caller can keep its analysis as the primary one.
    """
    fit = [tuple(1 + k for k in e) for e in _monomials(n)]
    return fit, tuple([MAX_DEGREE + 2] * n)


def _solve(matrix: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    """Gaussian elimination over the rationals (the systems have at most 10 unknowns)."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if a[r][col] != 0)
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col and a[r][col] != 0:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def _evaluate(coeffs: Mapping[Point, Fraction], point: Point) -> Fraction:
    total = Fraction(0)
    for exps, c in coeffs.items():
        term = c
        for v, e in zip(point, exps, strict=True):
            term *= v**e
        total += term
    return total


def fit_polynomial(samples: Mapping[Point, int], fit_points: list[Point], check: Point
                   ) -> dict[Point, Fraction] | None:
    """Coefficients by monomial exponent, or None if the check point disagrees."""
    exps = _monomials(len(check))
    matrix = [[Fraction(_evaluate({e: Fraction(1)}, p)) for e in exps] for p in fit_points]
    coeffs = _solve(matrix, [Fraction(samples[p]) for p in fit_points])
    poly = {e: c for e, c in zip(exps, coeffs, strict=True) if c != 0}
    return poly if _evaluate(poly, check) == samples[check] else None


def format_polynomial(poly: Mapping[Point, Fraction], symbols: Sequence[str]) -> str:
    """``{(1,): 1814073344}`` -> ``"1814073344*batch"``; highest degree first."""
    if not poly:
        return "0"
    terms = []
    for exps in sorted(poly, key=lambda e: (-sum(e), [-x for x in e])):
        c = poly[exps]
        factors = [s if e == 1 else f"{s}^{e}" for s, e in zip(symbols, exps, strict=True) if e]
        coef = str(c) if c.denominator == 1 else f"({c})"
        if factors and abs(c) == 1:
            terms.append(("-" if c < 0 else "") + "*".join(factors))
        else:
            terms.append("*".join([coef, *factors]))
    return " + ".join(terms).replace("+ -", "- ")


def formulas(evaluate: Callable[[Point], Mapping[str, int | None]], symbols: Sequence[str]
             ) -> dict[str, str]:
    """Each total as a formula of `symbols`, from analyses at the sample points."""
    fit_points, check = sample_points(len(symbols))
    samples = {p: evaluate(p) for p in [*fit_points, check]}
    out: dict[str, str] = {}
    for key in samples[check]:
        values = {p: s[key] for p, s in samples.items()}
        if any(v is None for v in values.values()):
            continue
        poly = fit_polynomial(values, fit_points, check)  # type: ignore[arg-type]
        if poly is not None:
            out[key] = format_polynomial(poly, symbols)
    return out
