"""Shared fixtures: small models built in the test, torchvision exports cached per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def resnet18_path(export_dir: Path) -> Path:
    """ResNet-18 (random weights), 1x3x224x224, BatchNorm folded."""
    import torch
    import torchvision

    from onnxlens.exporters.torch_export import export_module

    model = torchvision.models.resnet18(weights=None)
    return export_module(model, (torch.randn(1, 3, 224, 224),), export_dir / "resnet18.onnx")


@pytest.fixture(scope="session")
def resnet18_bn_path(export_dir: Path) -> Path:
    """ResNet-18 (random weights), 1x3x224x224, BatchNorm kept."""
    import torch
    import torchvision

    from onnxlens.exporters.torch_export import export_module

    model = torchvision.models.resnet18(weights=None)
    return export_module(model, (torch.randn(1, 3, 224, 224),), export_dir / "resnet18_bn.onnx",
                         keep_batchnorm=True)
