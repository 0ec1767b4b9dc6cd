"""onnxlens: where does the time go, what would it cost on that hardware, how wrong is the estimate.

    >>> import onnxlens
    >>> result = onnxlens.analyze("model.onnx", batch=8)
    >>> result.totals["macs"]

Every error caused by bad input is an `onnxlens.OnnxLensError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .analyzer.errors import OnnxLensError

if TYPE_CHECKING:
    from .analyzer.analysis import AnalysisResult

__all__ = ["AnalysisResult", "OnnxLensError", "analyze"]


def __getattr__(name: str) -> Any:
    if name == "AnalysisResult":  # lazy: importing onnxlens stays cheap
        from .analyzer.analysis import AnalysisResult

        return AnalysisResult
    raise AttributeError(name)
__version__ = "0.1.0"


def analyze(source: Any, **options: Any) -> AnalysisResult:
    """Analyze an ONNX model (path, bytes or ModelProto); see `onnxlens.api.analyze`."""
    from .api import analyze as _analyze

    return _analyze(source, **options)
