"""Fusion: one small module per spelling, exported and fused, group patterns counted exactly.

Spellings torch does not emit (other GELU association orders, LayerNorm with a reciprocal,
hard-swish as x * relu6(x + 3) / 6, attention with a mask) are built with onnx.helper. Every
plan is checked by `check_invariants`, which must also report every edge typed and shaped.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from torchvision.ops.misc import SqueezeExcitation

import onnxlens
from onnxlens.analyzer.analysis import AnalysisResult
from onnxlens.analyzer.fusion import PATTERNS, Group, fuse
from onnxlens.analyzer.graph import ModelGraph, build_graph
from onnxlens.analyzer.invariants import InvariantError, check_groups, check_invariants
from onnxlens.analyzer.loader import load_model
from onnxlens.exporters.torch_export import export_module

IMAGE = (1, 8, 16, 16)
TOKENS = (2, 5, 16)


def _checked(result: AnalysisResult) -> AnalysisResult:
    assert check_invariants(result.graph, result.groups) == []
    return result


def _exported(module: nn.Module, shape: tuple[int, ...], tmp_path: Path, *,
              keep_batchnorm: bool = False, opset: int | None = None) -> AnalysisResult:
    path = export_module(module, (torch.randn(*shape),), tmp_path / "x.onnx",
                         keep_batchnorm=keep_batchnorm, opset=opset)
    return _checked(onnxlens.analyze(path))


def _patterns(result: AnalysisResult) -> Counter[str]:
    return Counter(g.pattern for g in result.groups)


def _ops(result: AnalysisResult, group: Group) -> list[str]:
    return [result.graph.info(k).op_type for k in group.nodes]


def _only(result: AnalysisResult, pattern: str) -> Group:
    (group,) = [g for g in result.groups if g.pattern == pattern]
    return group


# ---- convolutions -----------------------------------------------------------------------------

ACTIVATIONS = [(nn.ReLU, "Relu"), (nn.ReLU6, "Clip"), (nn.Hardswish, "HardSwish"),
               (nn.Sigmoid, "Sigmoid"), (nn.SiLU, "SiLU"), (nn.LeakyReLU, "LeakyRelu")]


@pytest.mark.parametrize(("act", "name"), ACTIVATIONS)
@pytest.mark.parametrize("keep_batchnorm", [True, False])
def test_conv_bn_activation(act: type[nn.Module], name: str, keep_batchnorm: bool,
                            tmp_path: Path) -> None:
    module = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), act())
    result = _exported(module, IMAGE, tmp_path, keep_batchnorm=keep_batchnorm)
    expected = f"Conv+BN+{name}" if keep_batchnorm else f"Conv+{name}"
    assert _patterns(result) == {expected: 1}


def test_relu6_bakes_its_clip_bounds(tmp_path: Path) -> None:
    result = _exported(nn.Sequential(nn.Conv2d(8, 8, 3), nn.ReLU6()), IMAGE, tmp_path)
    assert _ops(result, result.groups[0]) == ["Conv", "Constant", "Constant", "Clip"]


def test_hardswish_spelled_as_hardsigmoid_times_x(tmp_path: Path) -> None:
    # At opset 13 torch writes hardswish as x * HardSigmoid(x).
    module = nn.Sequential(nn.Conv2d(8, 8, 3), nn.Hardswish())
    result = _exported(module, IMAGE, tmp_path, opset=13)
    assert _patterns(result) == {"Conv+HardSwish": 1}
    assert _ops(result, result.groups[0]) == ["Conv", "HardSigmoid", "Mul"]


@pytest.mark.parametrize(("groups", "expected"), [(8, "DwConv+BN+Relu"), (2, "Conv+BN+Relu")])
def test_depthwise_conv_is_named_dwconv(groups: int, expected: str, tmp_path: Path) -> None:
    module = nn.Sequential(nn.Conv2d(8, 8, 3, groups=groups), nn.BatchNorm2d(8), nn.ReLU())
    assert _patterns(_exported(module, IMAGE, tmp_path, keep_batchnorm=True)) == {expected: 1}


def test_depthwise_conv_relu6_folded(tmp_path: Path) -> None:
    module = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8), nn.BatchNorm2d(8), nn.ReLU6())
    assert _patterns(_exported(module, IMAGE, tmp_path)) == {"DwConv+Clip": 1}


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + x)


@pytest.mark.parametrize(("keep_batchnorm", "expected"),
                         [(True, "Conv+BN+Add+Relu"), (False, "Conv+Add+Relu")])
def test_conv_residual_add_relu(keep_batchnorm: bool, expected: str, tmp_path: Path) -> None:
    result = _exported(Residual(), IMAGE, tmp_path, keep_batchnorm=keep_batchnorm)
    assert _patterns(result) == {expected: 1}


@pytest.mark.parametrize(("keep_batchnorm", "expected"), [(True, "Conv+BN"), (False, "Conv")])
def test_conv_bn_alone(keep_batchnorm: bool, expected: str, tmp_path: Path) -> None:
    module = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))
    assert _patterns(_exported(module, IMAGE, tmp_path, keep_batchnorm=keep_batchnorm)) == {
        expected: 1}


# ---- linear layers and transformer pieces -----------------------------------------------------

@pytest.mark.parametrize(("module", "shape", "opset", "expected"), [
    (nn.Sequential(nn.Linear(16, 8), nn.ReLU()), (2, 16), None, "Gemm+Relu"),
    (nn.Sequential(nn.Linear(16, 8), nn.ReLU()), TOKENS, None, "MatMul+Add+Relu"),
    (nn.Linear(16, 8), TOKENS, None, "MatMul+Add"),
    (nn.Sequential(nn.Linear(16, 8), nn.GELU()), TOKENS, None, "MatMul+Add+Gelu"),  # erf
    (nn.Sequential(nn.Linear(16, 8), nn.GELU("tanh")), TOKENS, None, "MatMul+Add+Gelu"),
    (nn.Sequential(nn.Linear(16, 8), nn.GELU()), TOKENS, 20, "MatMul+Add+Gelu"),  # Gelu op
    (nn.GELU(), TOKENS, None, "Gelu"),
    (nn.SiLU(), TOKENS, None, "SiLU"),
    (nn.LayerNorm(16), TOKENS, None, "LayerNorm"),  # LayerNormalization op
    (nn.LayerNorm(16), TOKENS, 16, "LayerNorm"),  # spelled out in 9 primitives
], ids=["gemm-relu", "matmul-relu", "matmul", "gelu-erf", "gelu-tanh", "gelu-op", "gelu-alone",
        "silu-alone", "layernorm-op", "layernorm-spelled"])
def test_linear_and_transformer_spellings(module: nn.Module, shape: tuple[int, ...],
                                          opset: int | None, expected: str,
                                          tmp_path: Path) -> None:
    assert _patterns(_exported(module, shape, tmp_path, opset=opset)) == {expected: 1}


def test_linear_biases_shared_through_identity(tmp_path: Path) -> None:
    """TorchScript writes one initializer for parameters of equal values (a fresh model's zero
    biases) and Identity aliases of it for the others: those biases are constants, so each
    Linear is still one MatMul+Add (the Identity nodes stay groups of their own)."""
    module = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16))
    for layer in module:
        nn.init.zeros_(layer.bias)
    path = tmp_path / "linears.onnx"
    torch.onnx.export(module, (torch.randn(*TOKENS),), str(path), dynamo=False)
    result = _checked(onnxlens.analyze(path))
    assert _patterns(result)["MatMul+Add"] == 3
    assert sum(result.graph.info(k).op_type == "Identity" for k in result.graph.order) >= 1


def test_spelled_layernorm_takes_all_eleven_nodes(tmp_path: Path) -> None:
    result = _exported(nn.LayerNorm(16), TOKENS, tmp_path, opset=16)
    assert sorted(_ops(result, result.groups[0])) == sorted(
        ["ReduceMean", "Sub", "Constant", "Pow", "ReduceMean", "Constant", "Add", "Sqrt", "Div",
         "Mul", "Add"])


class Attention(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(-2, -1) / math.sqrt(x.shape[-1])
        return torch.softmax(scores, -1) @ x


class Sdpa(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x)


def test_attention(tmp_path: Path) -> None:
    result = _exported(Attention(), TOKENS, tmp_path)
    assert _patterns(result) == {"Attention": 1}
    assert _ops(result, result.groups[0]) == ["Transpose", "MatMul", "Constant", "Div",
                                              "Softmax", "MatMul"]


def test_scaled_dot_product_attention_scales_q_and_k(tmp_path: Path) -> None:
    result = _exported(Sdpa(), TOKENS, tmp_path)
    assert _patterns(result)["Attention"] == 1
    # The exporter folds the scale (computed from the shape) into constants, which the
    # fusion takes in with the Muls that read them.
    assert _ops(result, _only(result, "Attention")) == [
        "Transpose", "Constant", "Mul", "Constant", "Mul", "MatMul", "Softmax", "MatMul"]
    assert set(_patterns(result)) == {"Attention"}


@pytest.mark.parametrize(("activation", "scale"),
                         [(nn.ReLU, nn.Sigmoid), (nn.SiLU, nn.Hardsigmoid)])
def test_squeeze_excite(activation: type[nn.Module], scale: type[nn.Module],
                        tmp_path: Path) -> None:
    module = SqueezeExcitation(8, 4, activation=activation, scale_activation=scale)
    assert _patterns(_exported(module, IMAGE, tmp_path)) == {"SqueezeExcite": 1}


# ---- spellings built by hand ------------------------------------------------------------------

def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


Shapes = dict[str, list[int]]


def _model(nodes: list[onnx.NodeProto], inputs: Shapes, outputs: Shapes,
           initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    def values(shapes: Shapes) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]

    graph = helper.make_graph(nodes, "g", values(inputs), values(outputs), initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _analyzed(model: onnx.ModelProto) -> AnalysisResult:
    return _checked(onnxlens.analyze(model))


N = helper.make_node
X, X_OUT = {"x": [2, 8]}, {"y": [2, 8]}
HALF, ONE = _scalar("half", 0.5), _scalar("one", 1.0)


@pytest.mark.parametrize("nodes", [
    # keras / ORT pattern 1: (x * 0.5) * (1 + erf(x * 1/sqrt2))
    [N("Mul", ["x", "half"], ["h"]), N("Mul", ["x", "rsqrt2"], ["s"]), N("Erf", ["s"], ["e"]),
     N("Add", ["e", "one"], ["g"]), N("Mul", ["h", "g"], ["y"])],
    # ORT pattern 3: x * ((1 + erf(x / sqrt2)) * 0.5)
    [N("Div", ["x", "sqrt2"], ["s"]), N("Erf", ["s"], ["e"]), N("Add", ["one", "e"], ["g"]),
     N("Mul", ["g", "half"], ["h"]), N("Mul", ["x", "h"], ["y"])],
], ids=["half-x-first", "half-gate-first"])
def test_gelu_spellings_torch_does_not_write(nodes: list[onnx.NodeProto]) -> None:
    inits = [HALF, ONE, _scalar("sqrt2", math.sqrt(2)), _scalar("rsqrt2", 1 / math.sqrt(2))]
    result = _analyzed(_model(nodes, X, X_OUT, inits))
    assert _patterns(result) == {"Gelu": 1}


def test_layernorm_with_reciprocal_and_square_as_mul() -> None:
    nodes = [N("ReduceMean", ["x"], ["m"], axes=[-1]), N("Sub", ["x", "m"], ["d"]),
             N("Mul", ["d", "d"], ["sq"]), N("ReduceMean", ["sq"], ["v"], axes=[-1]),
             N("Add", ["v", "eps"], ["ve"]), N("Sqrt", ["ve"], ["sd"]),
             N("Reciprocal", ["sd"], ["r"]), N("Mul", ["d", "r"], ["n"]),
             N("Mul", ["n", "gamma"], ["g"]), N("Add", ["g", "beta"], ["y"])]
    inits = [_scalar("eps", 1e-5), numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(8, np.float32), "beta")]
    result = _analyzed(_model(nodes, X, X_OUT, inits))
    assert _patterns(result) == {"LayerNorm": 1}


def test_hardswish_spelled_with_relu6() -> None:
    nodes = [N("Add", ["x", "three"], ["a"]), N("Clip", ["a", "zero", "six"], ["c"]),
             N("Mul", ["x", "c"], ["m"]), N("Div", ["m", "six"], ["y"])]
    inits = [_scalar("three", 3), _scalar("zero", 0), _scalar("six", 6)]
    assert _patterns(_analyzed(_model(nodes, X, X_OUT, inits))) == {"HardSwish": 1}


def _attention_nodes() -> list[onnx.NodeProto]:
    return [N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), N("MatMul", ["q", "kt"], ["s"]),
            N("Mul", ["s", "scale"], ["ss"]), N("Add", ["ss", "mask"], ["sm"]),
            N("Softmax", ["sm"], ["p"], axis=-1), N("MatMul", ["p", "v"], ["y"])]


ATTENTION_INPUTS = {"q": [2, 5, 8], "k": [2, 5, 8], "v": [2, 5, 8], "mask": [1, 5, 5]}


def test_attention_with_mask_and_scale_by_mul() -> None:
    result = _analyzed(_model(_attention_nodes(), ATTENTION_INPUTS, {"y": [2, 5, 8]},
                              [_scalar("scale", 0.35)]))
    assert _patterns(result) == {"Attention": 1}
    assert len(result.groups[0].nodes) == 6


# ---- safety: values computed inside a group must not be read outside it ------------------------

class ConvEscapes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return torch.relu(y), y * 2


class BnEscapes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.bn(self.conv(x))
        return torch.relu(y), y


def test_escaping_interior_value_prevents_fusion(tmp_path: Path) -> None:
    result = _exported(ConvEscapes(), IMAGE, tmp_path)
    assert _patterns(result) == {"Conv": 1, "Relu": 1, "Mul": 1, "Constant": 1}


def test_escape_falls_back_to_the_largest_safe_pattern(tmp_path: Path) -> None:
    # BN's output is also a graph output: Conv+BN+Relu is unsafe, Conv+BN (BN last) is safe.
    result = _exported(BnEscapes(), IMAGE, tmp_path, keep_batchnorm=True)
    assert [g.pattern for g in result.groups] == ["Conv+BN", "Relu"]


def test_attention_leaves_out_a_transpose_read_elsewhere() -> None:
    nodes = [*_attention_nodes(), N("Neg", ["kt"], ["z"])]
    result = _analyzed(_model(nodes, ATTENTION_INPUTS, {"y": [2, 5, 8], "z": [2, 8, 5]},
                              [_scalar("scale", 0.35)]))
    assert _patterns(result) == {"Transpose": 1, "Attention": 1, "Neg": 1}
    assert "Transpose" not in _ops(result, _only(result, "Attention"))


# ---- whole networks ---------------------------------------------------------------------------

RESNET_TAIL = {"MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}


def test_resnet18_batchnorm_kept(resnet18_bn_path: Path) -> None:
    result = _checked(onnxlens.analyze(resnet18_bn_path))
    assert _patterns(result) == {"Conv+BN+Relu": 9, "Conv+BN+Add+Relu": 8, "Conv+BN": 3,
                                 **RESNET_TAIL}


def test_resnet18_batchnorm_folded(resnet18_path: Path) -> None:
    result = _checked(onnxlens.analyze(resnet18_path))
    assert _patterns(result) == {"Conv+Relu": 9, "Conv+Add+Relu": 8, "Conv": 3, **RESNET_TAIL}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "expected"), [
    ("mobilenet_v3_small", {"Conv+HardSwish": 10, "DwConv+HardSwish": 8, "DwConv+Relu": 3,
                            "Conv+Relu": 2, "SqueezeExcite": 9, "Conv": 11, "Add": 6,
                            "GlobalAveragePool": 1, "Flatten": 1, "Gemm+HardSwish": 1,
                            "Gemm": 1}),
    ("efficientnet_b0", {"Conv+SiLU": 17, "DwConv+SiLU": 16, "SqueezeExcite": 16, "Conv": 16,
                         "Add": 9, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}),
])
def test_torchvision_mobile_networks(name: str, expected: dict[str, int],
                                     tmp_path: Path) -> None:
    import torchvision

    module = getattr(torchvision.models, name)(weights=None)
    assert _patterns(_exported(module, (1, 3, 224, 224), tmp_path)) == expected


def _chain(blocks: int) -> onnx.ModelProto:
    """`blocks` x [Conv, Relu, Conv, Add(block input), Relu]: 5 nodes a block."""
    nodes, x = [], "x"
    for b in range(blocks):
        c1, r1, c2, a, y = (f"{b}.{t}" for t in ("c1", "r1", "c2", "a", "y"))
        nodes += [N("Conv", [x, "w"], [c1]), N("Relu", [c1], [r1]), N("Conv", [r1, "w"], [c2]),
                  N("Add", [c2, x], [a]), N("Relu", [a], [y])]
        x = y
    weight = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    return _model(nodes, {"x": [1, 4, 4, 4]}, {x: [1, 4, 4, 4]}, [weight])


def _graph(model: onnx.ModelProto) -> ModelGraph:
    return build_graph(load_model(model))


def test_fifty_thousand_node_chain() -> None:
    mg = _graph(_chain(10_000))
    groups = fuse(mg)
    assert len(mg) == 50_000
    assert Counter(g.pattern for g in groups) == {"Conv+Relu": 10_000, "Conv+Add+Relu": 10_000}
    assert check_invariants(mg, groups) == []


# ---- the table and the checker themselves -----------------------------------------------------

def test_every_pattern_documents_itself() -> None:
    for pattern in PATTERNS:
        assert pattern.name and pattern.drawing.strip() and pattern.exporter, pattern.name
        assert pattern.sink_ops, pattern.name


def _plan(mg: ModelGraph, spec: str) -> list[Group]:
    """``"0 1|2"``: groups of the graph's nodes given by their positions in execution order."""
    return [Group(i, "p", tuple(mg.order[int(k)] for k in part.split()))
            for i, part in enumerate(spec.split("|"))]


# Two chain blocks, nodes 0-9: [Conv, Relu, Conv, Add, Relu] x 2; node 4's output feeds 5 and 8.
@pytest.mark.parametrize(("spec", "message"), [
    ("0 1|2 3|4 5|6|7 8", "nodes in no group"),
    ("0 1|1 2 3|4 5|6|7 8 9", "is in groups 0 and 1"),
    ("1|0|2 3|4 5|6|7 8 9", "later group"),
    ("1 0|2 3|4 5|6|7 8 9", "out of execution order"),
    ("0 1|2 3|4 5|6|7 8 9", "computed inside by .* is read outside it"),
])
def test_invariant_checker_catches_broken_plans(spec: str, message: str) -> None:
    mg = _graph(_chain(2))
    check_groups(mg, _plan(mg, "0 1|2 3 4|5 6|7 8 9"))  # a sound plan passes
    with pytest.raises(InvariantError, match=message):
        check_groups(mg, _plan(mg, spec))


def test_invariant_checker_wants_ids_in_order() -> None:
    mg = _graph(_chain(1))
    plan = _plan(mg, "0 1|2 3 4")
    with pytest.raises(InvariantError, match="ids are not"):
        check_groups(mg, [plan[0], Group(2, "p", plan[1].nodes)])
