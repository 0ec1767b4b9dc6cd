"""The Backend interface every measured backend implements, and the inputs they are fed.

A backend is prepared once on a model, then asked to:

- `run(inputs)`: the graph outputs, by ONNX output name;
- `time(inputs, warmup=, runs=)`: warm-up runs, then `runs` timed runs (a `values.Timing`:
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

import math
import os
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ..analyzer.errors import ModelLoadError, OnnxLensError, UsageError
from ..analyzer.validate import DEFAULT_LIMITS, Limits, check_input_tensor, check_inputs
from .ort_timing import time_session
from .values import ModelSource, NodeTime, Timing

Feeds = Mapping[str, np.ndarray]
Dim = int | str | None


class BackendProblem(OnnxLensError):
    """A backend's one-line `reason`; `backend` names it (None: no one backend's). The message
    is ``backend: reason``."""

    def __init__(self, reason: str, backend: str | None = None) -> None:
        super().__init__(f"{backend}: {reason}" if backend else reason)
        self.reason = reason
        self.backend = backend


class BackendUnavailable(BackendProblem):
    """A backend cannot run here (no GPU, no original module, not installed); one line why."""

    exit_code = 3


class BackendError(BackendProblem):
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


def pin_dims(specs: Sequence[InputSpec], dims: Mapping[str, int]) -> list[InputSpec]:
    """`specs` with each named dim in `dims` set to its value (`--dim`)."""
    return [InputSpec(s.name, s.dtype, tuple(dims.get(d, d) if isinstance(d, str) else d
                                             for d in s.shape)) for s in specs]


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
    more. An integer attention mask (an input named `attention_mask`, or ending in `_mask`)
    is all ones: every token attended, as a decoder's caller passes it (random 0/1 masks make
    ONNX Runtime's GroupQueryAttention refuse the step: its past length comes from the mask's
    sum). An optimum merged decoder's `use_cache_branch` is true: the step with the cache,
    the If branch the analysis inlines. The same seed gives the same inputs to every backend.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = {}
        for spec in specs:
            shape = concrete_shape(spec, batch)
            if np.issubdtype(spec.dtype, np.floating):
                value = rng.standard_normal(shape).astype(spec.dtype)
            elif spec.dtype == np.bool_ and spec.name == "use_cache_branch":
                value = np.ones(shape, np.bool_)  # optimum's cached step, the branch analyzed
            elif spec.dtype == np.bool_:
                value = rng.random(shape) < 0.5
            elif np.issubdtype(spec.dtype, np.integer) and _is_mask(spec.name):
                value = np.ones(shape, spec.dtype)
            elif np.issubdtype(spec.dtype, np.integer):
                value = rng.integers(0, 10, shape).astype(spec.dtype)
            else:
                raise BackendError(f"input {spec.name!r}: cannot make random {spec.dtype} values")
            sample[spec.name] = value
        samples.append(sample)
    return samples


def _is_mask(name: str) -> bool:
    return name == "attention_mask" or name.endswith("_mask")


# An .npz is a zip archive: its directory is read only when small, and only the members named
# like the model's inputs are decompressed, after their .npy headers are checked.
MAX_NPZ_MEMBERS = 1024
MAX_NPZ_DIRECTORY_BYTES = 1 << 22
_NPZ_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


def load_inputs(files: Sequence[str | Path], specs: Sequence[InputSpec], *,
                limits: Limits = DEFAULT_LIMITS) -> list[dict[str, np.ndarray]]:
    """One input set per file: `.npz` (arrays named like the inputs), or `.npy` / `.pb` (a
    single array or TensorProto, for a model with one input). Each array must fit its input
    (`analyzer.validate.check_inputs`).

    Nothing is allocated before it is known to fit: the .npy headers (shape, dtype) are checked
    against the model's inputs, and each array's bytes (and the file's total) against
    `limits.max_tensor_bytes`, before any data is read or decompressed; .npz members are read
    only when their declared uncompressed size agrees with their header. Object arrays (a
    pickle) are refused."""
    samples = []
    names = [s.name for s in specs]
    for file in files:
        path = Path(file)
        try:
            if path.suffix == ".npz":
                sample = _read_npz(path, specs, limits.max_tensor_bytes)
            elif path.suffix in (".npy", ".pb"):
                if len(names) != 1:
                    raise UsageError(f"{path}: the model has {len(names)} inputs; give an .npz "
                                     f"with arrays named {', '.join(names)}")
                if path.suffix == ".npy":
                    with path.open("rb") as f:
                        size = os.fstat(f.fileno()).st_size
                        array = _read_npy(f, size, path, "", specs, limits.max_tensor_bytes)
                else:
                    tensor = onnx.load_tensor(str(path))
                    check_input_tensor(tensor, str(path))
                    array = onnx.numpy_helper.to_array(tensor)
                sample = {names[0]: array}
            else:
                raise UsageError(f"{path}: expected an .npy, .npz or .pb file")
        except OnnxLensError:
            raise
        except Exception as e:  # numpy, zipfile and onnx raise many kinds on a malformed file
            raise UsageError(f"{path}: cannot read inputs ({e})") from None
        missing = [n for n in names if n not in sample]
        if missing:
            raise UsageError(f"{path}: no array for input(s) {', '.join(missing)}")
        check_inputs(sample, specs, str(path))
        samples.append({n: sample[n].astype(s.dtype, copy=False) for n, s in
                        zip(names, specs, strict=True)})
    return samples


@dataclass(frozen=True)
class _Header:
    """An .npy header: what `check_inputs` needs of an array, before its data is read."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    offset: int  # where the data starts


def _read_header(f: IO[bytes], what: str) -> _Header:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise UsageError(f"{what}: .npy format version {version[0]}.{version[1]} is not "
                             "read (1.0 and 2.0 are)")
    except (ValueError, EOFError, SyntaxError) as e:  # numpy's words for a malformed header
        raise UsageError(f"{what}: cannot read inputs ({e})") from None
    if dtype.hasobject:
        raise UsageError(f"{what}: an object array (dtype {dtype}: a pickle); only plain "
                         "arrays are read")
    if any(d < 0 for d in shape):
        raise UsageError(f"{what}: the .npy header's shape {list(shape)} has a negative dim")
    return _Header(dtype, shape, fortran, f.tell())


def _check_headers(headers: Mapping[str, _Header], specs: Sequence[InputSpec],
                   available: Mapping[str, int], labels: Mapping[str, str], path: Path,
                   budget: int) -> None:
    """Shapes and dtypes against the model (`check_inputs`), then sizes: each array and the
    file's total within `budget`, each within the bytes its file or member holds."""
    check_inputs(headers, specs, str(path))  # type: ignore[arg-type]
    total = 0
    for spec in specs:
        header = headers[spec.name]
        count = math.prod(header.shape)
        size = count * max(header.dtype.itemsize, spec.dtype.itemsize)  # after conversion too
        if size > budget:
            raise UsageError(f"{labels[spec.name]}: the .npy header asks for {list(header.shape)} "
                             f"{header.dtype} ({size} bytes), over the limit of {budget} bytes "
                             "(max_tensor_bytes)")
        total += size
    if total > budget:
        raise UsageError(f"{path}: the inputs take {total} bytes together, over the limit of "
                         f"{budget} bytes (max_tensor_bytes)")
    for spec in specs:
        header = headers[spec.name]
        data = math.prod(header.shape) * header.dtype.itemsize
        if data > available[spec.name]:
            raise UsageError(f"{labels[spec.name]}: the .npy header asks for {data} bytes of "
                             f"data, but only {available[spec.name]} follow it")


def _read_npy(f: IO[bytes], size: int, path: Path, label: str, specs: Sequence[InputSpec],
              budget: int) -> np.ndarray:
    """A single-input .npy: header checked, then the data read."""
    what = f"{path}{label}"
    header = _read_header(f, what)
    spec = specs[0]
    _check_headers({spec.name: header}, specs, {spec.name: size - header.offset},
                   {spec.name: what}, path, budget)
    f.seek(0)
    return np.lib.format.read_array(f, allow_pickle=False)


def _read_npz(path: Path, specs: Sequence[InputSpec], budget: int) -> dict[str, np.ndarray]:
    """The members named like the inputs: every header and declared size checked first."""
    with path.open("rb") as f:
        _check_zip_directory(f, path)
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_NPZ_MEMBERS:
                raise UsageError(f"{path}: {len(infos)} members; an input file holds at most "
                                 f"{MAX_NPZ_MEMBERS} arrays")
            members: dict[str, zipfile.ZipInfo] = {}
            for info in infos:
                key = info.filename.removesuffix(".npy")
                if key in members:
                    raise UsageError(f"{path}: member {info.filename!r} appears twice")
                members[key] = info
            missing = [s.name for s in specs if s.name not in members]
            if missing:
                raise UsageError(f"{path}: no array for input(s) {', '.join(missing)}")
            headers, available, labels = {}, {}, {}
            for spec in specs:
                info = members[spec.name]
                what = labels[spec.name] = f"{path}: member {info.filename!r}"
                if info.compress_type not in _NPZ_METHODS:
                    raise UsageError(f"{what} uses zip compression method {info.compress_type}; "
                                     "only stored and deflated members are read")
                if info.file_size > budget + (1 << 16):  # the data and a header
                    raise UsageError(f"{what} declares {info.file_size} bytes uncompressed, "
                                     f"over the limit of {budget} bytes (max_tensor_bytes)")
                with archive.open(info) as member:
                    headers[spec.name] = _read_header(member, what)
                available[spec.name] = info.file_size - headers[spec.name].offset
            _check_headers(headers, specs, available, labels, path, budget)
            sample = {}
            for spec in specs:
                with archive.open(members[spec.name]) as member:
                    sample[spec.name] = np.lib.format.read_array(member, allow_pickle=False)
    return sample


def _check_zip_directory(f: IO[bytes], path: Path) -> None:
    """The member count and directory size the archive's end record declares, before zipfile
    reads the directory (an object per member)."""
    end = zipfile._EndRecData(f)  # type: ignore[attr-defined]  # zipfile's own reader
    if end is None:
        raise UsageError(f"{path}: cannot read inputs (File is not a zip file)")
    members, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
    if members > MAX_NPZ_MEMBERS:
        raise UsageError(f"{path}: {members} members; an input file holds at most "
                         f"{MAX_NPZ_MEMBERS} arrays")
    if size > MAX_NPZ_DIRECTORY_BYTES:
        raise UsageError(f"{path}: its zip directory takes {size} bytes; at most "
                         f"{MAX_NPZ_DIRECTORY_BYTES} are read")
    f.seek(0)
