"""Subgraph cost and "what if this prefix were cached", on ResNet-18."""

from __future__ import annotations

from pathlib import Path

import pytest

import onnxlens
from onnxlens.analyzer.errors import UsageError
from onnxlens.analyzer.whatif import caching_scenario, module_path, resolve_node, subgraph

# Conv MACs of ResNet-18 at 224 (N*M*H*W outputs x C*kh*kw), derived by hand:
STEM = 64 * 112 * 112 * 3 * 7 * 7  # 118,013,952
CONV3_SAME = {64: 56, 128: 28, 256: 14, 512: 7}  # channels -> spatial side of a 3x3 conv


def conv3(c_in: int, c_out: int) -> int:
    side = CONV3_SAME[c_out]
    return c_out * side * side * c_in * 9


def stage(c_in: int, c_out: int) -> int:
    """Two basic blocks; the first strided with a 1x1 downsample when the width changes."""
    downsample = c_out * CONV3_SAME[c_out] ** 2 * c_in if c_in != c_out else 0
    return conv3(c_in, c_out) + 3 * conv3(c_out, c_out) + downsample


def test_module_path_of_torchscript_names() -> None:
    assert module_path("/layer2/layer2.1/relu_1/Relu") == "layer2.1.relu_1"
    assert module_path("/conv1/Conv") == "conv1"
    assert module_path("/layer1/layer1.0/downsample/downsample.0/Conv") == \
        "layer1.0.downsample.0"


@pytest.fixture(scope="module")
def resnet18(resnet18_path: Path) -> onnxlens.AnalysisResult:
    return onnxlens.analyze(resnet18_path)


def test_cached_prefix_through_layer3(resnet18: onnxlens.AnalysisResult) -> None:
    mg = resnet18.graph
    costs = {k: nc.cost for k, nc in resnet18.node_costs.items()}
    s = caching_scenario(mg, costs, "layer3.1.relu_1")
    prefix_macs = STEM + stage(64, 64) + stage(64, 128) + stage(128, 256)
    assert s.prefix.macs == prefix_macs == 1_402_519_552
    # A notebook's "first 3 blocks" total, 2.7793 GFLOPs, is this minus the two 1x1
    # downsample convs it left out of its layer list.
    notebook_macs = prefix_macs - (128 * 28 * 28 * 64 + 256 * 14 * 14 * 128)
    assert round(2 * notebook_macs / 1e9, 4) == 2.7793
    assert s.cached_tensors == [mg.info(s.until).outputs[0].name]
    assert s.cache_read_bytes == 4 * 256 * 14 * 14
    assert s.after.macs == resnet18.totals["macs"] - prefix_macs
    d = s.as_dict(2)
    assert d["flops_saved"] == d["flops_before"] - d["flops_after"]
    assert 0.7 < d["saved_share"] < 0.8


def test_subgraph_between_two_nodes(resnet18: onnxlens.AnalysisResult) -> None:
    mg = resnet18.graph
    nodes = subgraph(mg, "layer4.0.conv1", "layer4.1.relu_1")
    macs = sum(resnet18.node_costs[k].cost.macs for k in nodes)  # type: ignore[union-attr]
    # All of layer4 but its downsample conv, which does not depend on layer4.0.conv1.
    assert macs == stage(256, 512) - 512 * 7 * 7 * 256


def test_unknown_and_ambiguous_names(resnet18: onnxlens.AnalysisResult) -> None:
    with pytest.raises(UsageError, match=r"did you mean 'layer3\.1\.relu_1'"):
        resolve_node(resnet18.graph, "layer3.1.relu1")
    with pytest.raises(UsageError, match="does not depend"):
        subgraph(resnet18.graph, "layer4.1.relu_1", "conv1")
