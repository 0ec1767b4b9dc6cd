"""Published figures travel with an exported model and are set beside ours in the report."""

from __future__ import annotations

from pathlib import Path

import onnxlens
from onnxlens.exporters.torch_export import export_model
from onnxlens.reports.html import render_html
from onnxlens.reports.validation import references


def test_resnet18_against_torchvision_and_the_seed_report(tmp_path: Path) -> None:
    path = export_model("resnet18", tmp_path / "r18.onnx")
    d = onnxlens.analyze(path).to_dict()
    meta = d["model"]["metadata"]
    assert meta["onnxlens.source"] == "torchvision:resnet18"
    assert meta["torchvision.gmacs"] == "1.814" and meta["torchvision.num_params"] == "11689512"
    rows = {r["figure"]: r for r in references(d)}
    assert abs(rows["MACs"]["ratio"] - 1) < 1e-4
    # A published "theoretical" 3.59 G misses the three 1x1 downsample convs: 1.1% short.
    seed = rows['FLOPs of Conv + FC ("theoretical")']
    assert seed["ours"] == 2 * 1_814_073_344 and round(seed["ratio"], 3) == 1.011
    assert rows["fused Conv tiles"]["ours"] == 20 and rows["fused Conv tiles"]["reference"] == 17
    html = render_html(d)
    assert "Validation against published figures" in html and "downsample" in html


def test_no_references_for_a_model_of_unknown_origin(resnet18_path: Path) -> None:
    assert references(onnxlens.analyze(resnet18_path).to_dict()) == []


def test_hostile_metadata_is_ignored(resnet18_path: Path) -> None:
    d = onnxlens.analyze(resnet18_path).to_dict()
    d["model"]["metadata"] = {"torchvision.gmacs": "abc", "torchvision.num_params": "nan"}
    assert references(d) == []
    assert "Validation against published figures" not in render_html(d)
