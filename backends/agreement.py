"""Numerical agreement between two backends, Polygraphy style, and the layer-by-layer dump-diff.

Per output, over all input samples: the largest absolute error, the largest relative error, the
smallest cosine similarity, and for classifier outputs (float, shape [N, C] with C > 1) the share
of rows whose arg-max (top-1 class) agrees.

A tensor is within tolerance when every element satisfies

    |candidate - reference| <= atol * s + rtol * |reference|,   s = max(1, max |reference|)

with (atol, rtol) per dtype (`TOLERANCES`). `s` scales the absolute term to the tensor's
magnitude: deep activations of random-weight models reach hundreds, where an fp32 rounding
difference of 1e-4 is not a disagreement. The relative error is reported over the elements with
|reference| > atol * s (elsewhere it measures noise around zero). Integer and boolean tensors
must be equal.

Dump-diff: every tensor both backends expose, visited in our execution order; the first node
one of whose outputs is not within tolerance is where the backends diverge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..analyzer.graph import ModelGraph

# dtype name -> (atol, rtol)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-6), "float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(atol, rtol) for a dtype; exact for integers and booleans."""
    return TOLERANCES.get(np.dtype(dtype).name, (0.0, 0.0))


@dataclass(frozen=True, slots=True)
class TensorDiff:
    max_abs_err: float
    max_rel_err: float
    cosine: float
    within: bool
    note: str = ""  # why the tensors could not be compared elementwise (shape, dtype kind)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                                "cosine": self.cosine, "within_tolerance": self.within}
        if self.note:
            d["note"] = self.note
        return d


def diff_tensors(candidate: np.ndarray, reference: np.ndarray) -> TensorDiff:
    """How far `candidate` is from `reference`, at the reference dtype's tolerance."""
    if candidate.shape != reference.shape:
        return TensorDiff(np.inf, np.inf, 0.0, False,
                          f"shape {list(candidate.shape)} vs {list(reference.shape)}")
    atol, rtol = tolerance(reference.dtype)
    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    err = np.where(both_nan, 0.0, np.abs(a - b))
    err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only
    magnitude = np.abs(np.where(both_nan, 0.0, b))
    scale = max(1.0, float(magnitude.max(initial=0.0)))
    within = bool(np.all(err <= atol * scale + rtol * magnitude))
    big = magnitude > atol * scale
    max_rel = float((err[big] / magnitude[big]).max(initial=0.0))
    return TensorDiff(float(err.max(initial=0.0)), max_rel, cosine(a, b), within)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of the flattened tensors; 1 when both are zero, NaNs read as 0."""
    x = np.nan_to_num(a.ravel().astype(np.float64))
    y = np.nan_to_num(b.ravel().astype(np.float64))
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))


# ---- outputs over samples -----------------------------------------------------------------------

@dataclass(frozen=True)
class OutputAgreement:
    name: str
    dtype: str
    shape: tuple[int, ...]
    atol: float
    rtol: float
    max_abs_err: float
    max_rel_err: float
    min_cosine: float
    top1: float | None  # share of rows whose arg-max agrees (classifier outputs only)
    passed: bool
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
             "atol": self.atol, "rtol": self.rtol, "max_abs_err": self.max_abs_err,
             "max_rel_err": self.max_rel_err, "min_cosine": self.min_cosine,
             "top1_agreement": self.top1, "passed": self.passed}
        return d | ({"note": self.note} if self.note else {})


@dataclass(frozen=True)
class Agreement:
    reference: str
    candidate: str
    samples: int
    outputs: tuple[OutputAgreement, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def key(self) -> str:
        return f"{self.reference} vs {self.candidate}"

    def to_dict(self) -> dict[str, object]:
        return {"reference": self.reference, "candidate": self.candidate,
                "samples": self.samples, "passed": self.passed,
                "outputs": [o.to_dict() for o in self.outputs]}


def agreement(reference: str, ref_outputs: Sequence[Mapping[str, np.ndarray]],
              candidate: str, cand_outputs: Sequence[Mapping[str, np.ndarray]]) -> Agreement:
    """Compare the outputs two backends gave for the same input samples."""
    rows = []
    for name, first in ref_outputs[0].items():
        if any(name not in c for c in cand_outputs):
            rows.append(OutputAgreement(name, first.dtype.name, first.shape, 0.0, 0.0, np.inf,
                                        np.inf, 0.0, None, False, f"{candidate} has no {name}"))
            continue
        pairs = [(c[name], r[name]) for c, r in zip(cand_outputs, ref_outputs, strict=True)]
        diffs = [diff_tensors(c, r) for c, r in pairs]
        atol, rtol = tolerance(first.dtype)
        notes = sorted({d.note for d in diffs if d.note})
        rows.append(OutputAgreement(
            name, first.dtype.name, first.shape, atol, rtol,
            max(d.max_abs_err for d in diffs), max(d.max_rel_err for d in diffs),
            min(d.cosine for d in diffs), top1_agreement(pairs) if not notes else None,
            all(d.within for d in diffs), "; ".join(notes)))
    return Agreement(reference, candidate, len(ref_outputs), tuple(rows))


def top1_agreement(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> float | None:
    """Share of rows with the same arg-max, for float [N, C] outputs with C > 1; else None."""
    _, ref = pairs[0]
    if ref.ndim != 2 or ref.shape[1] < 2 or not np.issubdtype(ref.dtype, np.floating):
        return None
    same = sum(int(np.sum(np.argmax(c, axis=1) == np.argmax(r, axis=1))) for c, r in pairs)
    return same / sum(r.shape[0] for _, r in pairs)


# ---- dump-diff ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Divergence:
    node: str
    op_type: str
    tensor: str
    diff: TensorDiff

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor,
                **self.diff.to_dict()}


@dataclass(frozen=True)
class DumpDiff:
    reference: str
    candidate: str
    compared: int  # tensors both backends exposed
    diverging: int  # of those, how many are out of tolerance
    first: Divergence | None  # the first node, in execution order, that diverges
    note: str = ""  # what limits the comparison (a backend that exposes outputs only)

    def to_dict(self) -> dict[str, object]:
        return {"reference": self.reference, "candidate": self.candidate,
                "tensors_compared": self.compared, "tensors_diverging": self.diverging,
                "first_divergence": self.first.to_dict() if self.first else None,
                "note": self.note}


def dump_diff(mg: ModelGraph, reference: str, ref_tensors: Mapping[str, np.ndarray],
              candidate: str, cand_tensors: Mapping[str, np.ndarray], *, note: str = ""
              ) -> DumpDiff:
    """Every tensor both sides computed, node by node in execution order."""
    compared = diverging = 0
    first: Divergence | None = None
    for key in mg.order:
        info = mg.info(key)
        for out in info.outputs:
            if out.name not in ref_tensors or out.name not in cand_tensors:
                continue
            compared += 1
            diff = diff_tensors(cand_tensors[out.name], ref_tensors[out.name])
            if not diff.within:
                diverging += 1
                if first is None:
                    first = Divergence(key, info.op_type, out.name, diff)
    return DumpDiff(reference, candidate, compared, diverging, first, note)
