"""ONNX Runtime CPU timing: a pinned session, warm-up, N timed runs, per-kernel profile.

Settings, chosen so that a measurement is repeatable and matches what a user of ORT gets:
`intra_op_num_threads` pinned to the requested count, one inter-op thread, sequential
execution, the default graph optimizations (ORT_ENABLE_ALL: fused Conv+Add+Relu, NCHWc
layouts) and profiling off for latency. Per-kernel times come from a separate profiled session
(ORT's Chrome-trace JSON, read by `parse_trace`), since profiling adds time on many small
kernels. The ORT backends (`ort.py`) and the calibration build on this module.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import onnxruntime as ort

from .values import ModelSource, NodeTime, Timing

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_FLOATS = (np.float32, np.float64)
_NUMPY_OF_ORT = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


class Runnable(Protocol):
    """What `time_session` can time: an ORT session, or anything with its `run`."""

    def run(self, output_names: None, feeds: Mapping[str, np.ndarray]) -> object: ...


def session_options(threads: int, *, profile_prefix: str | None = None,
                    optimized_model_path: str | None = None) -> ort.SessionOptions:
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only: keep ORT's notices out of the user's terminal
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if optimized_model_path is not None:
        so.optimized_model_filepath = optimized_model_path
    return so


def make_session(model: ModelSource, threads: int, **options: str | None
                 ) -> ort.InferenceSession:
    """A CPU-provider session on a file path, serialized bytes or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = str(model)
    return ort.InferenceSession(model, session_options(threads, **options),
                                providers=["CPUExecutionProvider"])


def random_feeds(session: ort.InferenceSession, *, seed: int = 0) -> dict[str, np.ndarray]:
    """A random input per graph input; symbolic dims are taken as 1 (a fixed 0 stays: an
    empty KV cache)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else 1 for d in arg.shape]
        dtype = _NUMPY_OF_ORT.get(arg.type)
        if dtype is None:
            raise ValueError(f"input {arg.name!r}: type {arg.type} not supported for timing")
        feeds[arg.name] = (rng.standard_normal(shape, dtype=dtype) if dtype in _FLOATS
                           else rng.standard_normal(shape).astype(dtype))
    return feeds


def time_session(session: Runnable, feeds: Mapping[str, np.ndarray], *,
                 runs: int = 20, warmup: int = 3, min_time_s: float = 0.0,
                 max_runs: int = 100_000, clock: str = "wall") -> Timing:
    """Warm up, then time `runs` runs, or more until `min_time_s` has passed (tiny kernels).

    An ORT session's inputs and outputs are bound once (IOBinding; outputs of static shape to
    buffers allocated here), so a run times the kernels and not the conversion of outputs to
    numpy arrays; another `Runnable` is timed through its `run`.
    `clock` "wall" is elapsed time; "cpu" is this process's CPU time, which equals the
    latency of an idle machine when ORT runs on one thread (`threads=1` computes on the
    calling thread) and, unlike wall time, does not grow when other processes share the cores.
    With more threads CPU time adds the threads up (and their spinning): use "wall".
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if isinstance(session, ort.InferenceSession):
        binding, _buffers = _bind(session, feeds)  # the buffers must outlive the runs
        run = partial(session.run_with_iobinding, binding)
    else:
        run = partial(session.run, None, feeds)
    for _ in range(warmup):
        run()
    read = CLOCKS[clock]
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs or (time.perf_counter() - start < min_time_s
                                and len(times) < max_runs):
        t0 = read()
        run()
        times.append(read() - t0)
    return Timing(tuple(times), clock)


def _bind(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]
          ) -> tuple[ort.IOBinding, list[ort.OrtValue]]:
    binding = session.io_binding()
    buffers = []
    for name, value in feeds.items():
        binding.bind_cpu_input(name, np.asarray(value, order="C"))  # 0-d stays 0-d
    for arg in session.get_outputs():
        dtype = _NUMPY_OF_ORT.get(arg.type)
        if dtype is not None and all(isinstance(d, int) and d >= 0 for d in arg.shape):
            buffers.append(ort.OrtValue.ortvalue_from_numpy(np.empty(arg.shape, dtype)))
            binding.bind_ortvalue_output(arg.name, buffers[-1])
        else:  # a dynamic shape: ORT allocates it each run
            binding.bind_output(arg.name, "cpu")
    return binding, buffers


def time_model(model: ModelSource, threads: int, *, runs: int = 20, warmup: int = 3,
               min_time_s: float = 0.0, clock: str = "wall") -> Timing:
    """Latency of one inference on random inputs (profiling off)."""
    session = make_session(model, threads)
    return time_session(session, random_feeds(session), runs=runs, warmup=warmup,
                        min_time_s=min_time_s, clock=clock)


def profile_model(model: ModelSource, threads: int, *, runs: int = 5, warmup: int = 3,
                  optimized_model_path: str | None = None) -> list[list[NodeTime]]:
    """Per-kernel times of `runs` profiled runs (one list per run, in execution order);
    `optimized_model_path` also saves ORT's optimized graph there (its kernels' names are the
    profile's)."""
    return [kernels for _, kernels in profile_runs(model, threads, runs=runs, warmup=warmup,
                                                   optimized_model_path=optimized_model_path)]


def profile_runs(model: ModelSource, threads: int, *, runs: int = 5, warmup: int = 3,
                 optimized_model_path: str | None = None) -> list[tuple[float, list[NodeTime]]]:
    """`profile_model`'s runs, each with its whole time (seconds; `parse_trace`)."""
    with tempfile.TemporaryDirectory(prefix="onnxlens-ort-") as tmp:
        session = make_session(model, threads, profile_prefix=str(Path(tmp) / "ort"),
                               optimized_model_path=optimized_model_path)
        binding, _buffers = _bind(session, random_feeds(session))
        for _ in range(warmup + runs):
            session.run_with_iobinding(binding)
        trace = Path(session.end_profiling())
        events = json.loads(trace.read_text(encoding="utf-8"))
    return parse_trace(events)[warmup:]


def parse_trace(events: list[dict[str, Any]]) -> list[tuple[float, list[NodeTime]]]:
    """(run seconds, kernels in execution order) per `model_run` of an ORT Chrome trace.

    A run's events are written after its kernels', so kernels are assigned by time span.
    """
    spans = sorted((ev["ts"], ev["ts"] + ev["dur"]) for ev in events
                   if ev.get("cat") == "Session" and ev.get("name") == "model_run")
    runs: list[tuple[float, list[NodeTime]]] = [((end - start) * 1e-6, []) for start, end in spans]
    kernels = sorted((ev for ev in events if ev.get("cat") == "Node"
                      and ev.get("name", "").endswith("_kernel_time")), key=lambda ev: ev["ts"])
    i = 0
    for ev in kernels:
        while i < len(spans) and ev["ts"] > spans[i][1]:
            i += 1
        if i < len(spans) and ev["ts"] >= spans[i][0]:
            args = ev.get("args", {})
            runs[i][1].append(NodeTime(ev["name"].removesuffix("_kernel_time"),
                                       args.get("op_name", ""), ev["dur"] * 1e-6,
                                       args.get("provider", ""),
                                       _shapes(args.get("input_type_shape", ())),
                                       _shapes(args.get("output_type_shape", ()))))
    return runs


def _shapes(typed: list[dict[str, list[int]]]) -> tuple[tuple[int, ...], ...]:
    """ORT's `[{"float": [1, 64, 56, 56]}, ...]` -> `((1, 64, 56, 56), ...)`."""
    return tuple(tuple(shape) for entry in typed for shape in entry.values())
