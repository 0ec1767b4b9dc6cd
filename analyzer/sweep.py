"""The architecture table over batch sizes, precisions and hardware profiles.

One row per (batch, precision, hardware): latency, energy, throughput, and relative to the
first hardware profile at the same batch and precision: speedup = latency_first / latency and
energy efficiency = energy_first / energy (both > 1 mean better than the first profile).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .analysis import AnalysisResult
from .estimate import Efficiency
from .hardware import HardwareProfile

Target = tuple[HardwareProfile, Efficiency | None]


def sweep_rows(analyze_at: Callable[[int], AnalysisResult], batches: Sequence[int],
               precisions: Sequence[str | None], targets: Sequence[Target]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for batch in batches:
        result = analyze_at(batch)
        for precision in precisions:
            first: dict[str, Any] | None = None
            for hw, efficiency in targets:
                est = result.estimate(hw, precision, efficiency)
                row = {"batch": batch, "precision": est.precision, "hardware": hw.key,
                       "calibrated": est.calibrated, "complete": est.complete,
                       "latency_s": est.latency_s, "energy_j": est.energy_j,
                       "throughput_per_s": batch / est.latency_s if est.latency_s else None}
                first = first or row
                row["speedup"] = _ratio(first["latency_s"], est.latency_s)
                row["energy_efficiency"] = _ratio(first["energy_j"], est.energy_j)
                rows.append(row)
    return rows


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None
