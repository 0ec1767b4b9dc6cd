"""Models quantized by ONNX Runtime's own tools, shared by the quantization tests: ResNet-18 at
64x64 (every op of the full model, a few seconds to quantize) and its calibration data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime import quantization

SIZE = 64


class Reader(quantization.CalibrationDataReader):
    """Two random images for input "x" (values in [0, 1)): enough for ranges (the numbers do
    not matter, the graph does)."""

    def __init__(self, shape: tuple[int, ...] = (1, 3, SIZE, SIZE)) -> None:
        self.left, self.shape = 2, shape
        self.rng = np.random.default_rng(0)

    def get_next(self) -> dict[str, np.ndarray] | None:
        if not self.left:
            return None
        self.left -= 1
        return {"x": self.rng.random(self.shape, dtype=np.float32)}


def resnet18(directory: Path) -> Path:
    """torchvision's ResNet-18 (random weights, seed 0) exported at 1x3x64x64, input "x"."""
    import torch
    import torchvision

    from onnxlens.exporters.torch_export import export_module

    torch.manual_seed(0)
    return export_module(torchvision.models.resnet18(weights=None),
                         (torch.randn(1, 3, SIZE, SIZE),), directory / "fp32.onnx",
                         input_names=["x"])


def quantize_qdq(fp32: Path, out: Path, **options: Any) -> Path:
    """`fp32` quantized by quantize_static in the QDQ format (`options`: per_channel ...)."""
    quantization.quantize_static(fp32, out, Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 **options)
    return out
