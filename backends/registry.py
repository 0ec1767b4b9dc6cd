"""The measured backends by name, whether each can run here, and why not in one line.

Probes are quiet (ORT's CUDA loader errors never reach the terminal) and cached per process.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..analyzer.errors import UsageError
from .base import Backend, BackendUnavailable
from .torch_eager import ModuleFactory

TORCH_NEEDS_MODULE = ("needs the original module: give a torchvision model name or "
                      "module:factory, not an .onnx file")


@dataclass(frozen=True, slots=True)
class BackendInfo:
    name: str
    description: str
    available: bool
    reason: str  # why it cannot run here; "" when it can
    note: str = ""  # a condition that holds even when available
    ops: str = ""  # the ops it covers, in one line (`onnxlens backends --ops`)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class _Entry:
    description: str
    probe: Callable[[], str | None]  # None when available, else why not
    build: Callable[[int, ModuleFactory | None], Backend]
    coverage: Callable[[], str]  # the ops it runs, in one line
    note: str = ""
    needs_module: bool = False  # built from the original torch module


def _ort_cpu_reason() -> str | None:
    import onnxruntime as ort

    return (None if "CPUExecutionProvider" in ort.get_available_providers()
            else "this onnxruntime build has no CPU provider")


def _ort_cuda_reason() -> str | None:
    from .ort import cuda_unavailable_reason

    return cuda_unavailable_reason()


def _torch_reason() -> str | None:
    return None if importlib.util.find_spec("torch") else "torch is not installed"


def _build_ort(provider: str) -> Callable[[int, ModuleFactory | None], Backend]:
    def build(threads: int, _factory: ModuleFactory | None) -> Backend:
        from .ort import OrtBackend

        return OrtBackend(provider, threads)

    return build


def _build_torch(threads: int, factory: ModuleFactory | None) -> Backend:
    from .torch_eager import TorchEagerBackend

    if factory is None:
        raise BackendUnavailable(TORCH_NEEDS_MODULE, "torch")
    return TorchEagerBackend(factory, threads)


def _native_cpu_reason() -> str | None:
    if importlib.util.find_spec("onnxlens.backends._native") is None:
        return "the native extension is not built (reinstall with pip install -e .)"
    return None


def _build_native_cpu(threads: int, _factory: ModuleFactory | None) -> Backend:
    from .native_cpu import NativeCpuBackend

    return NativeCpuBackend(threads)


def _native_cuda_reason() -> str | None:
    from .native_cuda import unavailable_reason

    return unavailable_reason()


def _build_native_cuda(threads: int, _factory: ModuleFactory | None) -> Backend:
    from .native_cuda import NativeCudaBackend

    return NativeCudaBackend(threads)


def _ort_coverage() -> str:
    return ("ONNX Runtime's own kernel registry: the standard ONNX ops of the opsets it "
            "supports, and its com.microsoft contrib ops")


def _native_cpu_coverage() -> str:
    from .native_cpu import supported_ops

    return (", ".join(supported_ops()) + "; any other op whose outputs are computed from "
            "constants alone is folded when planning")


def _native_cuda_coverage() -> str:
    """The plan kernels with a CUDA kernel: read from the emulator module, which holds the same
    lowering table as the CUDA one and is built everywhere."""
    try:
        from ._native_cuda_emu import kernel_ops
    except ImportError:
        return "unknown: the native extension is not built"
    return ("native-cpu's ops whose plan kernels have a CUDA kernel; plan kernels: "
            + ", ".join(sorted(kernel_ops())))


def _torch_coverage() -> str:
    return "every op of the original torch module (it runs the module, not the ONNX graph)"


_ENTRIES: dict[str, _Entry] = {
    "ort-cpu": _Entry("ONNX Runtime, CPU execution provider", _ort_cpu_reason,
                      _build_ort("cpu"), _ort_coverage),
    "ort-cuda": _Entry("ONNX Runtime, CUDA execution provider", _ort_cuda_reason,
                       _build_ort("cuda"), _ort_coverage),
    "native-cpu": _Entry("onnxlens native executor (C++, CPU; one kernel per fused group)",
                         _native_cpu_reason, _build_native_cpu, _native_cpu_coverage),
    "native-cuda": _Entry("onnxlens native executor on CUDA (its own kernels; one per fused "
                          "group, timed by CUDA events)", _native_cuda_reason,
                          _build_native_cuda, _native_cuda_coverage),
    "torch": _Entry("PyTorch eager (reference)", _torch_reason, _build_torch, _torch_coverage,
                    note=f"only for models exported by onnxlens: {TORCH_NEEDS_MODULE}",
                    needs_module=True),
}


def availability(name: str, *, ops: bool = False) -> BackendInfo:
    """Whether `name` runs here and why not; with `ops`, the ops it covers too."""
    entry = _entry(name)
    reason = entry.probe()
    return BackendInfo(name, entry.description, reason is None, reason or "", entry.note,
                       entry.coverage() if ops else "")


def list_backends(*, ops: bool = False) -> list[BackendInfo]:
    """Every backend with whether it can run here; the rows of `onnxlens backends`."""
    return [availability(name, ops=ops) for name in _ENTRIES]


def needs_module(name: str) -> bool:
    """Whether the backend runs the original torch module (and so needs its factory)."""
    return _entry(name).needs_module


def create(name: str, *, threads: int = 1, torch_factory: ModuleFactory | None = None
           ) -> Backend:
    """A backend ready to `prepare`; `BackendUnavailable` (one line) when it cannot run here."""
    info = availability(name)
    if not info.available:
        raise BackendUnavailable(info.reason, name)
    return _entry(name).build(threads, torch_factory)


def _entry(name: str) -> _Entry:
    if name not in _ENTRIES:
        raise UsageError(f"unknown backend {name!r}: expected one of {', '.join(_ENTRIES)}")
    return _ENTRIES[name]
