"""The plain values every backend speaks in: a model to load, a latency's timed runs, one
kernel's time in a profiled run."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass

import onnx

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of each timed `run` call (warm-up excluded), in the order run, on `clock`."""

    runs_s: tuple[float, ...]
    clock: str = "wall"

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def min_s(self) -> float:
        return min(self.runs_s)

    @property
    def max_s(self) -> float:
        return max(self.runs_s)

    @property
    def p90_s(self) -> float:
        """Nearest-rank 90th percentile."""
        ordered = sorted(self.runs_s)
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class NodeTime:
    """One kernel of a profiled run: its name (an ONNX node, or the runtime's own), op, time,
    provider, and the shapes it read and wrote when the profiler records them."""

    name: str
    op_type: str
    duration_s: float
    provider: str
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = ()
