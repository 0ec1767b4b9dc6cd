"""PyTorch eager: the reference backend, for models that onnxlens exported itself.

The backend needs the original module, so it takes a factory that builds it again with the
weights of the export (the exporter builds torchvision models and module:factory callables
under a fixed seed, so the same call gives the same weights). Feeds are passed to the module
positionally in the order of the ONNX graph inputs, and the module's outputs are flattened
the way the exporter flattens them (tensors, lists/tuples in order, dict values in order) and
named after the ONNX graph outputs.

Intermediates: forward hooks see module boundaries, not ONNX tensor names, so `intermediates`
gives the graph outputs only (`intermediates_complete` is False); a dump-diff against torch
compares outputs. No per-kernel profile (`profile` is None): per-group measured times come
from ONNX Runtime. Threads: `torch.set_num_threads` is set for each call and restored after;
inter-op threads are torch's own (they cannot be changed once torch has run anything).

torch is imported inside the methods, never when this module is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .base import Backend, BackendError, Feeds, input_specs, load_proto
from .values import ModelSource, Timing

ModuleFactory = Callable[[], Any]  # () -> torch.nn.Module


class TorchEagerBackend(Backend):
    name = "torch"

    def __init__(self, factory: ModuleFactory, threads: int = 1) -> None:
        super().__init__(threads)
        self._factory = factory
        self._module: Any = None
        self._inputs: list[str] = []
        self._outputs: list[str] = []

    def prepare(self, model: ModelSource) -> None:
        proto = load_proto(model, weights=False)  # only the graph's input and output names
        self._inputs = [s.name for s in input_specs(proto)]
        self._outputs = [o.name for o in proto.graph.output]
        with self._threads():
            self._module = self._factory().eval()

    @contextmanager
    def _threads(self) -> Iterator[None]:
        import torch

        saved = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(saved)

    def run(self, inputs: Feeds) -> dict[str, np.ndarray]:
        import torch

        if self._module is None:
            raise BackendError("prepare() a model first", "torch")
        args = [torch.from_numpy(np.ascontiguousarray(inputs[name])) for name in self._inputs]
        with self._threads(), torch.no_grad():
            result = self._module(*args)
        tensors = flatten(result)
        if len(tensors) != len(self._outputs):
            raise BackendError(f"the module returned {len(tensors)} tensors, the ONNX graph "
                               f"has {len(self._outputs)} outputs", "torch")
        return {name: t.detach().cpu().numpy() for name, t in
                zip(self._outputs, tensors, strict=True)}

    def time(self, inputs: Feeds, *, warmup: int = 5, runs: int = 50) -> Timing:
        with self._threads():
            return super().time(inputs, warmup=warmup, runs=runs)

    def describe(self) -> dict[str, Any]:
        import torch

        return {"threads": self.threads, "inter_op_threads": torch.get_num_interop_threads(),
                "torch": torch.__version__, "intermediates": "outputs only"}


def flatten(value: Any) -> list[Any]:
    """The tensors of a forward's result in the exporter's order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flatten(v)]
    return []
