"""native-cpu: the project's own C++ executor (backends/native), run on the CPU.

`prepare` analyzes the model (the plan needs every shape: a model with symbolic dims is
planned on the first `run`, at the shapes of its inputs, and again for new shapes), lowers
the fused groups to the core's kernels (`native.plan`) and builds the executor: every kernel
is validated and its weights packed before anything runs. `run` copies the inputs into the
arena, runs the steps and copies the outputs out. Timing is per step, one step per fused group,
reported as a `Profile` whose kernels are named after each group's last node, so the profile
maps to our groups with no special case. `intermediates` gives every materialized tensor (the
group boundaries); tensors inside a fused kernel never exist.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..analyzer.analysis import AnalysisResult, analyze
from ..analyzer.cost.reduce import REDUCE_OPS
from .base import Backend, BackendError, Feeds, Profile, load_proto
from .values import ModelSource, NodeTime

PROVIDER = "native-cpu"

# Inputs that set up a kernel rather than feed it data (axes, bounds, pads, sizes, shapes,
# BatchNorm's statistics): the plan needs their values. A graph input used only at these
# positions is planned at the values it is given, and planned again for other values.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    **{op: (1,) for op in REDUCE_OPS}, "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "BatchNormalization": (1, 2, 3, 4), "Reshape": (1,), "Expand": (1,),
    "Tile": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Split": (1,), "CumSum": (1,)}
_MAX_PARAMETER_VALUES = 4096


def native_module() -> Any:
    """The extension, or BackendError with the reason it is missing."""
    try:
        from . import _native
    except ImportError as e:
        raise BackendError(f"the native extension is not built ({e}); reinstall with "
                           "`pip install -e .`", PROVIDER) from None
    return _native


class NativeCpuBackend(Backend):
    name = PROVIDER
    intermediates_complete = False

    def __init__(self, threads: int = 1, isa: str = "") -> None:
        super().__init__(threads)
        self._native = native_module()
        if isa and isa not in self._native.available_isas():
            raise BackendError(f"instruction set {isa!r} is not available here "
                               f"(have {', '.join(self._native.available_isas())})", PROVIDER)
        self.isa = isa
        self._model: onnx.ModelProto | None = None
        self._base_dir: Path | None = None
        self._parameters: frozenset[str] = frozenset()
        self._prepared: dict[tuple[tuple[int, ...], ...], _Prepared] = {}

    def prepare(self, model: ModelSource) -> None:
        # The graph only: the plan reads the weights from their files (`initializer_array`).
        self._model = load_proto(model, weights=False)
        self._base_dir = (None if isinstance(model, bytes | onnx.ModelProto)
                          else Path(model).parent)
        self._prepared.clear()
        self._parameters = parameter_inputs(self._model)
        if not _symbolic(self._model) and not self._parameters:
            self._prepare_for(None)

    def _prepare_for(self, inputs: Feeds | None) -> _Prepared:
        if self._model is None:
            raise BackendError("prepare() a model first", self.name)
        params = {} if inputs is None else {n: np.asarray(inputs[n]) for n in self._parameters
                                            if n in inputs}
        key = () if inputs is None else (tuple(np.shape(v) for v in inputs.values()) +
                                         tuple(v.tobytes() for v in params.values()))
        if key in self._prepared:
            return self._prepared[key]
        if () in self._prepared and not _symbolic(self._model):
            return self._prepared[()]
        model = with_constants(self._model, params) if params else self._model
        shapes = None if inputs is None else {k: tuple(np.shape(v)) for k, v in inputs.items()
                                               if k not in params}
        result = analyze(model, input_shapes=shapes, symbolic=False, base_dir=self._base_dir)
        prepared = _Prepared(result, self._native, self.threads, self.isa, self.name)
        self._prepared[key] = prepared
        return prepared

    @property
    def prepared(self) -> _Prepared:
        """The plan and executor of the last prepared shapes."""
        if not self._prepared:
            raise BackendError("prepare() a model first", self.name)
        return next(reversed(self._prepared.values()))

    def run(self, inputs: Feeds) -> dict[str, np.ndarray]:
        return self._prepare_for(inputs).run(inputs)[0]

    def profile(self, inputs: Feeds, *, runs: int = 5, warmup: int = 2) -> Profile:
        """Each step's median seconds over `runs`, named after its group's last node."""
        prepared = self._prepare_for(inputs)
        for _ in range(warmup):
            prepared.run(inputs)
        per_run = [prepared.run(inputs)[1] for _ in range(runs)]
        steps = prepared.plan.steps
        kernels = tuple(NodeTime(step.name, step.pattern,
                                 statistics.median(r[i] for r in per_run), self.name)
                        for i, step in enumerate(steps))
        return Profile(kernels, statistics.median(sum(r) for r in per_run))

    def intermediates(self, inputs: Feeds) -> dict[str, np.ndarray]:
        return self._prepare_for(inputs).run(inputs, capture=True)[0]

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"threads": self.threads, "provider": self.name}
        if self._prepared:
            p = self.prepared
            info.update(isa=p.executor.isa, arena_bytes=p.plan.arena_bytes,
                        activation_peak_bytes=p.plan.activation_peak_bytes,
                        scratch_bytes=p.plan.scratch_bytes,
                        workspace_bytes=p.executor.workspace_bytes)
        return info


def supported_ops() -> list[str]:
    """The ONNX ops native-cpu runs (default domain, float32 where arithmetic). Any other op is
    run too when its outputs are computed from constants alone (folded when planning)."""
    from .native.lower import ELEMENTWISE, LOWERINGS, MAIN_OPS

    return sorted(ELEMENTWISE | MAIN_OPS | set(LOWERINGS))


def make_executor(native: Any, args: tuple[Any, ...], threads: int, isa: str,
                  backend: str = PROVIDER) -> Any:
    """`_native.Executor` on a plan's arguments; a malformed plan is a BackendError of
    `backend` (the core checks every size, offset and attribute before it allocates or runs
    anything)."""
    try:
        return native.Executor(*args, threads, isa)
    except (native.PlanError, ValueError, TypeError) as e:
        # nanobind's TypeError lists every accepted signature, on lines of their own.
        raise BackendError(f"invalid plan: {str(e).splitlines()[0]}", backend) from None
    except MemoryError as e:  # std::bad_alloc: an arena or a packed weight larger than memory
        raise BackendError(f"cannot allocate the plan's memory ({e})", backend) from None


class _Prepared:
    """One plan and its executor, for one set of input shapes."""

    def __init__(self, result: AnalysisResult, native: Any, threads: int, isa: str,
                 backend: str) -> None:
        from .native.plan import build_plan

        self.result = result
        self.backend = backend
        self.plan = build_plan(result, backend)
        # A kernel this build lacks (the CUDA executor's GroupQueryAttention; an extension
        # built before a kernel was added) is named here, before the core reads the plan.
        lacking = {k.op for s in self.plan.steps for k in s.kernels} - set(native.kernel_ops())
        if lacking:
            raise BackendError(f"no kernel for {', '.join(sorted(lacking))} in this build",
                               backend)
        self.executor = make_executor(native, self.plan.native_args(), threads, isa, backend)
        self._run_error = native.RunError
        # An alias (plan.aliases_of_copies) holds its bytes' tensor's bytes from that one's step.
        self._producers = self.executor.producer_steps()
        for t in self.plan.tensors:
            if t.alias is not None:
                self._producers[self.plan.ids[t.name]] = self._producers[self.plan.ids[t.alias]]

    def run(self, inputs: Feeds, capture: bool = False
            ) -> tuple[dict[str, np.ndarray], list[float]]:
        plan = self.plan
        feeds = [self._input(name, inputs) for name in plan.inputs]
        outputs = {name: np.empty(plan.tensor(name).shape, _dtype(plan.tensor(name).elem_type))
                   for name in plan.outputs}
        captures = []
        if capture:
            from .native.plan import ARENA

            for t in plan.tensors:
                step = self._producers[plan.ids[t.name]]
                if t.storage == ARENA and step >= 0 and t.name not in outputs:
                    captures.append((step, plan.ids[t.name],
                                     np.empty(t.shape, _dtype(t.elem_type))))
            captures.sort(key=lambda c: c[0])
        try:
            seconds = self.executor.run(feeds, list(outputs.values()), captures)
        except self._run_error as e:
            raise BackendError(f"run failed: {e}", self.backend) from None
        found = dict(outputs)
        for _, tid, array in captures:
            found[plan.tensors[tid].name] = array
        if capture:
            found.update({name: np.asarray(inputs[name]) for name in plan.inputs})
            found.update({t.name: found[t.alias].reshape(t.shape) for t in plan.tensors
                          if t.alias in plan.inputs})
        return found, seconds

    def _input(self, name: str, inputs: Feeds) -> np.ndarray:
        if name not in inputs:
            raise BackendError(f"no value for input {name!r}", self.backend)
        t = self.plan.tensor(name)
        value = np.asarray(inputs[name], dtype=_dtype(t.elem_type))
        if not value.flags.c_contiguous:  # (ascontiguousarray would make a 0-d array 1-d)
            value = value.copy()
        if value.shape != t.shape:
            raise BackendError(f"input {name!r} has shape {value.shape}, the plan was made "
                               f"for {t.shape}", self.backend)
        return value


def parameter_inputs(model: onnx.ModelProto) -> frozenset[str]:
    """Graph inputs (not initializers) consumed only as PARAMETER_INPUTS, of at most
    _MAX_PARAMETER_VALUES values when their shape is known."""
    weights = {t.name for t in model.graph.initializer}
    small = {i.name for i in model.graph.input if i.name not in weights and
             all(d.HasField("dim_value") for d in i.type.tensor_type.shape.dim) and
             np.prod([d.dim_value for d in i.type.tensor_type.shape.dim]) <=
             _MAX_PARAMETER_VALUES}
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in model.graph.node for a in node.attribute):
        return frozenset()  # inputs a subgraph reads are not traced here
    used_as_data: set[str] = set()
    used_as_parameter: set[str] = set()
    for node in model.graph.node:
        positions = PARAMETER_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
        for i, name in enumerate(node.input):
            (used_as_parameter if i in positions else used_as_data).add(name)
    return frozenset(small & used_as_parameter - used_as_data)


def with_constants(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` whose inputs named in `values` are initializers of those values."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [i for i in out.graph.input if i.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(onnx.numpy_helper.from_array(v, n) for n, v in values.items())
    return out


def _dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _symbolic(model: onnx.ModelProto) -> bool:
    weights = {t.name for t in model.graph.initializer}
    return any(not d.HasField("dim_value") for i in model.graph.input if i.name not in weights
               for d in i.type.tensor_type.shape.dim)

