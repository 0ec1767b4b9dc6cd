"""Measured backends (ONNX Runtime, torch eager, the native executor) behind one interface."""

import os as _os

if _os.environ.get("ONNXLENS_NATIVE_MODULE"):
    # Another build of the native extension for this process (tests/sanitize.sh's
    # AddressSanitizer build): `onnxlens.backends._native` is that file. Never set otherwise.
    def _load_native(path: str) -> None:
        import importlib.util
        import sys

        spec = importlib.util.spec_from_file_location(f"{__name__}._native", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"ONNXLENS_NATIVE_MODULE={path}: not an extension module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)

    _load_native(_os.environ["ONNXLENS_NATIVE_MODULE"])

# native-cpu's kernel model registers itself with the analyzer's estimator (the analyzer
# imports no backend: ARCHITECTURE.md, "Kernel models").
from .native import kernel_model as _kernel_model  # noqa: F401
