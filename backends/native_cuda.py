"""native-cuda: the native executor's plan run by its CUDA kernels (backends/native/cuda).

Everything on the host is native-cpu's: the model is analyzed and planned by `native.plan`
(one step per fused group, the arena by liveness), and the same executor interface runs it, so
this backend is `NativeCpuBackend` with another extension module behind it. That module's
executor lowers each step's kernels to CUDA launches, keeps the arena, scratch and weights in
device memory, and times each step between two CUDA events on its stream: `profile` reports
those per group, in the shape native-cpu and ORT report theirs.

The extension `_native_cuda` is built only where nvcc was found, and is usable only with a
CUDA device; `unavailable_reason` probes both quietly. `_native_cuda_emu` has the same
executor on the CPU emulator of the kernels: tests run this backend through it (`module=`).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

from .base import BackendUnavailable
from .native_cpu import NativeCpuBackend

PROVIDER = "native-cuda"


@functools.cache
def unavailable_reason() -> str | None:
    """None when a CUDA device can run native-cuda, else one line why not (cached)."""
    try:
        module = importlib.import_module("onnxlens.backends._native_cuda")
    except ImportError:
        return "the CUDA executor is not built (nvcc was not found when onnxlens was installed)"
    if module.device_count() > 0:
        return None
    return f"no usable CUDA device ({module.unavailable_reason()})"


def cuda_module() -> ModuleType:
    """The CUDA extension, or BackendUnavailable with the reason it cannot run here."""
    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason, PROVIDER)
    return importlib.import_module("onnxlens.backends._native_cuda")


class NativeCudaBackend(NativeCpuBackend):
    name = PROVIDER

    def __init__(self, threads: int = 1, *, module: ModuleType | None = None,
                 variant: str = "") -> None:
        """`module`: an extension with the executor interface (default: the CUDA one; tests
        pass `_native_cuda_emu`); `variant` is given to its executor (the emulator takes
        "reverse": threads of each phase in reverse order)."""
        super().__init__(threads)
        self._native = module if module is not None else cuda_module()
        self.isa = variant

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        if self._prepared:
            info["device"] = info.pop("isa")
            info.pop("workspace_bytes", None)
        return info

