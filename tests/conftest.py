"""Shared fixtures: small models built in the test, torchvision exports cached per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def torchvision_onnx(export_dir: Path) -> Callable[..., Path]:
    """Export a torchvision model (random weights, 1x3x224x224) once per session."""

    def export(name: str, *, keep_batchnorm: bool = False) -> Path:
        path = export_dir / f"{name}{'_bn' if keep_batchnorm else ''}.onnx"
        if path.exists():
            return path
        import torch
        import torchvision

        from onnxlens.exporters.torch_export import export_module

        model = torchvision.models.get_model(name, weights=None)
        return export_module(model, (torch.randn(1, 3, 224, 224),), path,
                             keep_batchnorm=keep_batchnorm)

    return export


@pytest.fixture(scope="session")
def resnet18_path(torchvision_onnx: Callable[..., Path]) -> Path:
    """ResNet-18 (random weights), 1x3x224x224, BatchNorm folded."""
    return torchvision_onnx("resnet18")


@pytest.fixture(scope="session")
def resnet18_bn_path(torchvision_onnx: Callable[..., Path]) -> Path:
    """ResNet-18 (random weights), 1x3x224x224, BatchNorm kept."""
    return torchvision_onnx("resnet18", keep_batchnorm=True)
