"""The Backend interface every measured backend implements, and the inputs they are fed.

A backend is prepared once on a model, then asked to:

- `run(inputs)`: the graph outputs, by ONNX output name;
- `time(inputs, warmup=, runs=)`: warm-up runs, then `runs` timed runs (an `ort_timing.Timing`:
  median, p90, min, max; `latency_dict` adds the spread);
- `profile(inputs, runs=)`: per-kernel times of profiled runs (a `Profile`), or ``None`` when the
  backend has no per-kernel profiler;
- `intermediates(inputs)`: every tensor the model computes, by ONNX tensor name, where the
  backend can name them (`intermediates_complete`); otherwise only the outputs.

The thread count is fixed when the backend is made and reported by `describe()`. A backend
that cannot run here raises `BackendUnavailable` with a one-line reason, from its constructor
or from `prepare` (ORT's CUDA provider only knows it fell back to the CPU once a session
exists).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ..analyzer.errors import ModelLoadError, OnnxLensError, UsageError
from ..analyzer.validate import check_input_tensor, check_inputs
from .ort_timing import ModelSource, NodeTime, Timing, time_session

Feeds = Mapping[str, np.ndarray]
Dim = int | str | None


class BackendUnavailable(OnnxLensError):
    """A backend cannot run here (no GPU, no original module, not installed); one line why."""

    exit_code = 3


class BackendError(OnnxLensError):
    """A backend failed on this model or these inputs (unsupported op, wrong input shape)."""


@dataclass(frozen=True)
class Profile:
    """Per-kernel times of a backend's profiled runs.

    `kernels`: one per executed kernel, in execution order, each the median over the profiled
    runs. `run_s`: the time of a typical profiled run, of which the kernels take their sum
    (the rest is time between kernels). `optimized`: the backend's own
    graph after its fusions (ORT's optimized model), which maps kernels to our nodes; ``None``
    when kernels are named after our nodes.
    """

    kernels: tuple[NodeTime, ...]
    run_s: float
    optimized: onnx.GraphProto | None = None


class Backend(ABC):
    name: str
    # True when `intermediates` names every tensor of the ONNX graph, not only its outputs.
    intermediates_complete: bool = False

    def __init__(self, threads: int = 1) -> None:
        if threads < 1:
            raise UsageError(f"threads must be at least 1, got {threads}")
        self.threads = threads

    @abstractmethod
    def prepare(self, model: ModelSource) -> None:
        """Load `model` (a path, serialized bytes or a ModelProto) for the calls below."""

    @abstractmethod
    def run(self, inputs: Feeds) -> dict[str, np.ndarray]:
        """The graph outputs for `inputs`, keyed by ONNX output name."""

    def time(self, inputs: Feeds, *, warmup: int = 5, runs: int = 50) -> Timing:
        """Wall-clock latency of `run` after `warmup` untimed runs."""
        return time_session(_Session(self), inputs, runs=runs, warmup=warmup)

    def profile(self, inputs: Feeds, *, runs: int = 5, warmup: int = 2) -> Profile | None:
        """Per-kernel times, or None where the backend has no per-kernel profiler."""
        return None

    def intermediates(self, inputs: Feeds) -> dict[str, np.ndarray]:
        """Every tensor the backend can name (see `intermediates_complete`)."""
        return self.run(inputs)

    def describe(self) -> dict[str, Any]:
        """Facts worth reporting beside a measurement (threads, versions, provider)."""
        return {"threads": self.threads}


class _Session:
    """A backend seen as an ORT session, so `ort_timing.time_session` times it."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def run(self, _names: None, feeds: Feeds) -> dict[str, np.ndarray]:
        return self._backend.run(feeds)


def latency_dict(timing: Timing) -> dict[str, float | int]:
    """Seconds; `spread` is (max - min) / median, the run-to-run noise of the measurement."""
    median = timing.median_s
    return {"median": median, "p90": timing.p90_s, "min": timing.min_s, "max": timing.max_s,
            "spread": (timing.max_s - timing.min_s) / median if median else 0.0,
            "runs": len(timing.runs_s)}


def load_proto(model: ModelSource, *, weights: bool = True) -> onnx.ModelProto:
    """The ModelProto of a path, bytes or proto (the proto itself, not a copy)."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_from_string(model)
        return onnx.load(str(model), load_external_data=weights)
    except (OSError, DecodeError) as e:
        where = "the model" if isinstance(model, bytes) else str(model)
        raise ModelLoadError(f"{where}: cannot read an ONNX model ({e})") from None


# ---- inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs a caller feeds (initializers listed as inputs are weights)."""
    weights = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in tensor.shape.dim)
        specs.append(InputSpec(value.name,
                               np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)),
                               dims))
    return specs


def fixed_batch(specs: Sequence[InputSpec]) -> int | None:
    """The batch (first dim) the model is fixed at, or None when it is symbolic or absent."""
    firsts = [s.shape[0] for s in specs if s.shape]
    return firsts[0] if firsts and isinstance(firsts[0], int) else None


def concrete_shape(spec: InputSpec, batch: int) -> tuple[int, ...]:
    """`spec.shape` with a symbolic first dim set to `batch` and other symbolic dims to 1."""
    return tuple(d if isinstance(d, int) else (batch if i == 0 else 1)
                 for i, d in enumerate(spec.shape))


def random_inputs(specs: Sequence[InputSpec], *, count: int, batch: int, seed: int = 0
                  ) -> list[dict[str, np.ndarray]]:
    """`count` input sets: floats from N(0, 1), integers in [0, 10), booleans fair coins.

    Integers stay below 10 so that they are valid indices of any embedding table of 10 rows or
    more. The same seed gives the same inputs to every backend.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = {}
        for spec in specs:
            shape = concrete_shape(spec, batch)
            if np.issubdtype(spec.dtype, np.floating):
                value = rng.standard_normal(shape).astype(spec.dtype)
            elif spec.dtype == np.bool_:
                value = rng.random(shape) < 0.5
            elif np.issubdtype(spec.dtype, np.integer):
                value = rng.integers(0, 10, shape).astype(spec.dtype)
            else:
                raise BackendError(f"input {spec.name!r}: cannot make random {spec.dtype} values")
            sample[spec.name] = value
        samples.append(sample)
    return samples


def load_inputs(files: Sequence[str | Path], specs: Sequence[InputSpec]
                ) -> list[dict[str, np.ndarray]]:
    """One input set per file: `.npz` (arrays named like the inputs), or `.npy` / `.pb` (a
    single array or TensorProto, for a model with one input). Each array must fit its input
    (`analyzer.validate.check_inputs`)."""
    samples = []
    names = [s.name for s in specs]
    for file in files:
        path = Path(file)
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as data:
                    sample = {k: data[k] for k in data.files}
            elif path.suffix in (".npy", ".pb"):
                if len(names) != 1:
                    raise UsageError(f"{path}: the model has {len(names)} inputs; give an .npz "
                                     f"with arrays named {', '.join(names)}")
                if path.suffix == ".npy":
                    array = np.load(path, allow_pickle=False)
                else:
                    tensor = onnx.load_tensor(str(path))
                    check_input_tensor(tensor, str(path))
                    array = onnx.numpy_helper.to_array(tensor)
                sample = {names[0]: array}
            else:
                raise UsageError(f"{path}: expected an .npy, .npz or .pb file")
        except OnnxLensError:
            raise
        except Exception as e:  # numpy and onnx raise many kinds on a malformed file
            raise UsageError(f"{path}: cannot read inputs ({e})") from None
        missing = [n for n in names if n not in sample]
        if missing:
            raise UsageError(f"{path}: no array for input(s) {', '.join(missing)}")
        check_inputs(sample, specs, str(path))
        samples.append({n: sample[n].astype(s.dtype, copy=False) for n, s in
                        zip(names, specs, strict=True)})
    return samples
