"""ONNX Runtime backends: the CPU execution provider and the CUDA execution provider.

Sessions use `ort_timing.session_options`: intra-op threads pinned, one inter-op thread,
sequential execution and ORT_ENABLE_ALL (what users of ORT get). Latency comes from a session
with profiling off; per-kernel times from a second, profiled session that also saves ORT's
optimized graph, which `profile_map` needs to map ORT's fused kernels back to our nodes.

`intermediates` runs a copy of the model in which every node output is also a graph output,
with graph optimizations disabled so that no tensor is fused away or renamed.

CUDA: onnxruntime-gpu lists the CUDA provider even where it cannot load (no GPU, no CUDA
libraries); a session then falls back to the CPU and ORT prints loader errors on fd 2. The
probe and every CUDA session creation run with fd 2 redirected, and a session that did not get
the CUDA provider makes the backend unavailable, with ORT's own reason in one line. CUDA
latency is that of `session.run` on host arrays: it includes the copies to and from the device.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from .base import Backend, BackendError, BackendUnavailable, Feeds, Profile, load_proto
from .ort_timing import parse_trace, session_options, time_session
from .values import ModelSource, NodeTime, Timing

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
CUDA_UNAVAILABLE = "CUDA EP unavailable: "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class OrtBackend(Backend):
    intermediates_complete = True

    def __init__(self, provider: str = "cpu", threads: int = 1) -> None:
        super().__init__(threads)
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
        self.provider = provider
        self.name = f"ort-{provider}"
        self._model: str | bytes | None = None
        self._session: ort.InferenceSession | None = None

    def prepare(self, model: ModelSource) -> None:
        self._model = (model.SerializeToString() if isinstance(model, onnx.ModelProto)
                       else model if isinstance(model, bytes) else str(model))
        self._session = self._new_session(self._model, session_options(self.threads))

    def _new_session(self, model: str | bytes, options: ort.SessionOptions
                     ) -> ort.InferenceSession:
        providers = [PROVIDERS[self.provider]]
        if self.provider == "cuda":
            providers.append(PROVIDERS["cpu"])  # ORT places what CUDA lacks on the CPU
        with captured_stderr() as err:
            try:
                session = ort.InferenceSession(model, options, providers=providers)
            except Exception as e:  # ORT raises its own pybind types; the message is the news
                raise BackendError(f"cannot load the model: {_first_line(e)}", self.name
                                   ) from None
        if session.get_providers()[0] != PROVIDERS[self.provider]:
            raise BackendUnavailable(CUDA_UNAVAILABLE + loader_reason(err[0]), self.name)
        return session

    @property
    def session(self) -> ort.InferenceSession:
        if self._session is None:
            raise BackendError("prepare() a model first", self.name)
        return self._session

    def run(self, inputs: Feeds) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self._run(self.session, inputs), strict=True))

    def _run(self, session: ort.InferenceSession, inputs: Feeds) -> list[np.ndarray]:
        try:
            return session.run(None, dict(inputs))
        except Exception as e:  # wrong shape or dtype, or a kernel failure
            raise BackendError(f"run failed: {_first_line(e)}", self.name) from None

    def time(self, inputs: Feeds, *, warmup: int = 5, runs: int = 50) -> Timing:
        self._run(self.session, inputs)  # a bad input fails here with one line
        return time_session(self.session, dict(inputs), runs=runs, warmup=warmup)

    def profile(self, inputs: Feeds, *, runs: int = 5, warmup: int = 2) -> Profile:
        """Kernel times of `runs` profiled runs at ORT_ENABLE_ALL, with the optimized graph."""
        assert self._model is not None, "prepare() first"
        with tempfile.TemporaryDirectory(prefix="onnxlens-ort-") as tmp:
            optimized = Path(tmp) / "optimized.onnx"
            options = session_options(self.threads, profile_prefix=str(Path(tmp) / "profile"),
                                      optimized_model_path=str(optimized))
            # Weights go to a side file: only the graph is read back.
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", "weights.bin")
            session = self._new_session(self._model, options)
            for _ in range(warmup + runs):
                self._run(session, inputs)
            trace = Path(session.end_profiling())
            runs_seen = parse_trace(json.loads(trace.read_text(encoding="utf-8")))[warmup:]
            graph = onnx.load(str(optimized), load_external_data=False).graph
        kernels, run_s = summarize_runs(runs_seen)
        return Profile(kernels, run_s, graph)

    def intermediates(self, inputs: Feeds) -> dict[str, np.ndarray]:
        """Every node output, from an unoptimized run of a copy that exports them all."""
        assert self._model is not None, "prepare() first"
        model = onnx.ModelProto()
        model.CopyFrom(load_proto(self._model if isinstance(self._model, bytes)
                                  else Path(self._model)))
        exported = {o.name for o in model.graph.output}
        for node in model.graph.node:
            for name in node.output:
                if name and name not in exported:
                    exported.add(name)
                    model.graph.output.append(onnx.ValueInfoProto(name=name))
        options = session_options(self.threads)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = self._new_session(model.SerializeToString(), options)
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, self._run(session, inputs), strict=True))

    def describe(self) -> dict[str, Any]:
        return {"threads": self.threads, "inter_op_threads": 1,
                "provider": PROVIDERS[self.provider], "onnxruntime": ort.__version__,
                "graph_optimization": "ORT_ENABLE_ALL"}


# ---- ORT's profile ----------------------------------------------------------------------------

def summarize_runs(runs: list[tuple[float, list[NodeTime]]]
                   ) -> tuple[tuple[NodeTime, ...], float]:
    """Each kernel's median duration over the runs, and the run time they make up.

    Medians resist a run slowed by another process, but medians taken kernel by kernel need
    not add up to the median run; the run time returned is the kernels' sum over the median
    share of a run spent inside kernels, so that shares of it are consistent.
    """
    first = runs[0][1]
    if any(len(kernels) != len(first) for _, kernels in runs):
        raise BackendError("ORT profile: runs executed different kernels")
    kernels = tuple(replace(k, duration_s=statistics.median(ks[i].duration_s for _, ks in runs))
                    for i, k in enumerate(first))
    inside = statistics.median(sum(k.duration_s for k in ks) / run for run, ks in runs if run)
    return kernels, sum(k.duration_s for k in kernels) / inside


# ---- the CUDA probe ---------------------------------------------------------------------------

@contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Redirect fd 2 (where ORT's C++ logger writes) to a file; the list gets its text."""
    sys.stderr.flush()
    saved = os.dup(2)
    text: list[str] = []
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read().decode("utf-8", "replace"))


def loader_reason(log: str) -> str:
    """The one line of ORT's CUDA loader log that says why, e.g. the missing library."""
    log = _ANSI.sub("", log)
    missing = re.search(r"with error: (\S+): cannot open shared object file", log)
    needs = re.search(r"Require (cuDNN [^\s.]+\.\* and CUDA [^\s.]+\.\*)", log)
    failure = re.search(r"CUDA failure \d+: ([^;\n]+)", log)
    if missing:
        reason = f"{missing.group(1)} not found"
    elif failure:
        reason = failure.group(1).strip()
    else:
        lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
        reason = lines[-1][:200] if lines else "ORT fell back to the CPU provider"
    if needs:
        reason += f" (onnxruntime-gpu needs {needs.group(1)})"
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        reason += "; no NVIDIA GPU device on this machine"
    return reason


@cache
def cuda_unavailable_reason() -> str | None:
    """None when a session really gets the CUDA provider, else why not (one line, starting
    with CUDA_UNAVAILABLE)."""
    if PROVIDERS["cuda"] not in ort.get_available_providers():
        return (CUDA_UNAVAILABLE + "this onnxruntime build has no CUDA provider (install "
                "onnxruntime-gpu)")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    probe = onnx.helper.make_model(graph, ir_version=8,
                                   opset_imports=[onnx.helper.make_opsetid("", 17)])
    try:
        OrtBackend("cuda").prepare(probe)
    except BackendUnavailable as e:
        return e.reason
    except BackendError as e:
        return CUDA_UNAVAILABLE + e.reason
    return None


def _first_line(e: BaseException) -> str:
    text = _ANSI.sub("", str(e)).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
