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

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class _Entry:
    description: str
    probe: Callable[[], str | None]  # None when available, else why not
    build: Callable[[int, ModuleFactory | None], Backend]
    note: str = ""
    needs_module: bool = False  # built from the original torch module


def _ort_cpu_reason() -> str | None:
    import onnxruntime as ort

    return (None if "CPUExecutionProvider" in ort.get_available_providers()
            else "this onnxruntime build has no CPU provider")


def _ort_cuda_reason() -> str | None:
    from .ort import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    return None if reason is None else f"CUDA EP unavailable: {reason}"


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
        raise BackendUnavailable(f"torch: {TORCH_NEEDS_MODULE}")
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


_ENTRIES: dict[str, _Entry] = {
    "ort-cpu": _Entry("ONNX Runtime, CPU execution provider", _ort_cpu_reason,
                      _build_ort("cpu")),
    "ort-cuda": _Entry("ONNX Runtime, CUDA execution provider", _ort_cuda_reason,
                       _build_ort("cuda")),
    "native-cpu": _Entry("onnxlens native executor (C++, CPU; one kernel per fused group)",
                         _native_cpu_reason, _build_native_cpu),
    "native-cuda": _Entry("onnxlens native executor on CUDA (its own kernels; one per fused "
                          "group, timed by CUDA events)", _native_cuda_reason,
                          _build_native_cuda),
    "torch": _Entry("PyTorch eager (reference)", _torch_reason, _build_torch,
                    note=f"only for models exported by onnxlens: {TORCH_NEEDS_MODULE}",
                    needs_module=True),
}


def availability(name: str) -> BackendInfo:
    entry = _entry(name)
    reason = entry.probe()
    return BackendInfo(name, entry.description, reason is None, reason or "", entry.note)


def list_backends() -> list[BackendInfo]:
    """Every backend with whether it can run here; the rows of `onnxlens backends`."""
    return [availability(name) for name in _ENTRIES]


def needs_module(name: str) -> bool:
    """Whether the backend runs the original torch module (and so needs its factory)."""
    return _entry(name).needs_module


def create(name: str, *, threads: int = 1, torch_factory: ModuleFactory | None = None
           ) -> Backend:
    """A backend ready to `prepare`; `BackendUnavailable` (one line) when it cannot run here."""
    info = availability(name)
    if not info.available:
        raise BackendUnavailable(f"{name}: {info.reason}")
    return _entry(name).build(threads, torch_factory)


def _entry(name: str) -> _Entry:
    if name not in _ENTRIES:
        raise UsageError(f"unknown backend {name!r}: expected one of {', '.join(_ENTRIES)}")
    return _ENTRIES[name]
