"""Fusion of quantized graphs: a DequantizeLinear -> op -> QuantizeLinear chain is one group.

A QDQ ResNet-18 (onnxruntime's quantize_static, per tensor and per channel) has its fp32
twin's groups, plus the model's input Q and output DQ, each MAC group int8; hand-built QDQ
Conv+Relu graphs (the Relu kept, or folded into a Q whose range starts at 0, checked against
onnx.reference) are one group; quantize_dynamic's MatMul chain is one group. Every plan keeps
the invariants and its group costs add up to the model's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxlens.analyzer.analysis import AnalysisResult, analyze
from onnxlens.analyzer.invariants import check_invariants
from onnxlens.analyzer.runtimes import Kernel
from onnxlens.analyzer.runtimes.ort_cpu import ort_kernels

quantization = pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("torchvision")

from quant_models import Reader, quantize_qdq, resnet18  # noqa: E402

MAC_OPS = {"Conv", "Gemm", "MatMul", "MatMulInteger"}


def _checked(result: AnalysisResult) -> AnalysisResult:
    """Invariants hold and the group costs add up to the node costs."""
    check_invariants(result.graph, result.groups)
    groups = [nc.cost for nc in result.group_costs.values()]
    nodes = [nc.cost for nc in result.node_costs.values()]
    assert None not in groups and None not in nodes
    for kind in ("macs", "other_flops", "transcendental", "params", "param_bytes"):
        assert sum(getattr(c, kind) for c in groups) == sum(getattr(c, kind) for c in nodes), kind
    return result


def _ops(result: AnalysisResult, index: int) -> list[str]:
    return [result.graph.info(k).op_type for k in result.groups[index].nodes]


def _ort_kernels(result: AnalysisResult, index: int) -> list[Kernel]:
    """The kernels ORT's CPU kernel model makes of group `index` (AVX2's NCHWc block 8)."""
    costs = {k: nc.cost for k, nc in result.node_costs.items()}
    return ort_kernels(result.graph, result.groups[index], costs, 8)


# ---- ResNet-18 quantized by onnxruntime -------------------------------------------------------

@pytest.fixture(scope="module")
def resnets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisResult]:
    d = tmp_path_factory.mktemp("resnet18")
    fp32 = resnet18(d)
    quantization.quantize_dynamic(fp32, d / "dynamic.onnx")
    return {"fp32": analyze(fp32), "dynamic": analyze(d / "dynamic.onnx"),
            "per_tensor": analyze(quantize_qdq(fp32, d / "per_tensor.onnx")),
            # uint8 activations, ORT's x86 recommendation: with int8 ORT fuses few of them
            "per_channel": analyze(quantize_qdq(
                fp32, d / "per_channel.onnx", per_channel=True,
                activation_type=quantization.QuantType.QUInt8))}


@pytest.mark.parametrize("name", ["per_tensor", "per_channel"])
def test_qdq_resnet18_has_the_fp32_groups(resnets: dict[str, AnalysisResult], name: str) -> None:
    fp32, qdq = resnets["fp32"], _checked(resnets[name])
    # The fp32 twin: 9 Conv+Relu, 8 Conv+Add+Relu, 3 Conv (downsample), pools, Flatten, Gemm.
    fp32_patterns = Counter(g.pattern for g in fp32.groups)
    assert len(fp32.groups) == 24 and fp32_patterns["Conv+Add+Relu"] == 8
    # ORT's quantizer removed the Relus (their range is the Q's): the Q's saturation at 0 is
    # named Relu; the groups are the fp32 ones plus the dangling input Q and output DQ.
    assert sum(1 for n in qdq.graph.infos.values() if n.op_type == "Relu") == 0
    assert Counter(g.pattern for g in qdq.groups) == fp32_patterns + Counter(
        {"QuantizeLinear": 1, "DequantizeLinear": 1})
    first, last = qdq.groups[0], qdq.groups[-1]
    assert _ops(qdq, 0) == ["QuantizeLinear"] and qdq.graph.info(first.nodes[0]).inputs[0].name \
        == "x"
    assert _ops(qdq, -1) == ["DequantizeLinear"]
    assert qdq.graph.info(last.nodes[0]).outputs[0].name in qdq.graph.graph_outputs
    # Every other group works in int8, MAC groups and pools alike.
    assert {qdq.group_precisions[g.id] for g in qdq.groups[1:-1]} == {"int8"}
    # Every Q and DQ of the model is in a group with a real op but those two.
    alone = [g for g in qdq.groups if set(_ops(qdq, g.id)) <= {"QuantizeLinear",
                                                                "DequantizeLinear"}]
    assert alone == [first, last]


def test_qdq_residual_block_group(resnets: dict[str, AnalysisResult]) -> None:
    """A block's second conv: its activation DQ, weight and bias DQs, Conv, Q -> DQ, the
    residual Add and the saturating Q; the shared DQ after it (read by the next block's first
    conv and its Add) ends the group; ResNet's last block ends in its Q (the pool reads it
    alone)."""
    qdq = resnets["per_channel"]
    blocks = [g for g in qdq.groups if g.pattern == "Conv+Add+Relu"]
    counts = [Counter(_ops(qdq, g.id)) for g in blocks]
    for c in counts:
        assert (c["Conv"], c["Add"], c["QuantizeLinear"]) == (1, 1, 2)
    # DQs: input, weight, bias, the one between Conv and Add, and the trailing shared one (7 of
    # 8 blocks: the last block's output is read by the pool alone); in the three downsampling
    # blocks (layer2.0, 3.0, 4.0) also the DQ of the downsample Conv's output, which only the
    # Add reads.
    assert [c["DequantizeLinear"] for c in counts] == [5, 5, 6, 5, 6, 5, 6, 4]
    assert [_ops(qdq, g.id)[-1] for g in blocks] == ["DequantizeLinear"] * 7 + ["QuantizeLinear"]


def test_qdq_group_bytes_are_int8_at_the_boundary(resnets: dict[str, AnalysisResult]) -> None:
    """A 3x3 Conv+Relu group inside a block reads its uint8/int8 activation and weights and
    writes its int8 output: the boundary bytes are the fp32 twin's activations at 1 byte."""
    fp32, qdq = resnets["fp32"], resnets["per_tensor"]

    def conv_relu(result: AnalysisResult) -> list[int]:
        return [g.id for g in result.groups if g.pattern == "Conv+Relu"]

    g32, g8 = conv_relu(fp32)[1], conv_relu(qdq)[1]  # layer1.0's first conv, 64 -> 64 at 16x16
    c32, c8 = fp32.group_costs[g32].cost, qdq.group_costs[g8].cost
    assert c32.macs == c8.macs == 64 * 64 * 9 * 16 * 16
    assert c32.bytes_written == 4 * 64 * 16 * 16 and c8.bytes_written == 64 * 16 * 16


def test_ort_runs_qdq_groups_as_its_quantized_kernels(resnets: dict[str, AnalysisResult]) -> None:
    """ORT's QDQ transformer with uint8 activations: DQ -> Conv -> Q is one QLinearConv,
    DQ -> Add -> Q a QLinearAdd (not fused into the convolution, as the fp32 Conv's sum input
    is), pools and Gemm one kernel each; the input Q and output DQ one each."""
    fp32, qdq = resnets["fp32"], resnets["per_channel"]
    kernels = {g.pattern: len(_ort_kernels(qdq, g.id)) for g in qdq.groups}
    assert kernels == {"QuantizeLinear": 1, "Conv+Relu": 1, "MaxPool": 1, "Conv+Add+Relu": 2,
                       "Conv": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1,
                       "DequantizeLinear": 1}
    assert {g.pattern: len(_ort_kernels(fp32, g.id)) for g in fp32.groups}["Conv+Add+Relu"] == 1
    block = next(g for g in qdq.groups if g.pattern == "Conv+Add+Relu")
    conv, add = _ort_kernels(qdq, block.id)
    assert [qdq.graph.info(k).op_type for k in (conv.nodes[0], add.nodes[0])] == ["Conv", "Add"]
    # The two kernels' arithmetic is the group's, less the DQs of the QLinearConv (which
    # multiplies the stored integers); QLinearAdd keeps its own (dequantize, add, requantize).
    dequantized = sum(qdq.node_costs[k].cost.other_flops for k in conv.nodes
                      if qdq.graph.info(k).op_type == "DequantizeLinear")
    assert dequantized > 0
    assert conv.cost.macs + add.cost.macs == qdq.group_costs[block.id].cost.macs
    assert conv.cost.other_flops + add.cost.other_flops == \
        qdq.group_costs[block.id].cost.other_flops - dequantized


def _blocks() -> dict[str, object]:
    import torch
    from torch import nn
    from torchvision.ops.misc import SqueezeExcitation

    torch.manual_seed(0)
    se = {"regnet": (nn.ReLU, nn.Sigmoid), "mobilenet_v3": (nn.ReLU, nn.Hardsigmoid)}
    blocks = {name: nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                  SqueezeExcitation(16, 4, act, gate))
              for name, (act, gate) in se.items()}
    blocks["efficientnet"] = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.SiLU(),
                                           nn.Conv2d(16, 16, 3, padding=1, groups=16),
                                           nn.Hardswish())
    return blocks


@pytest.mark.parametrize("name", ["regnet", "mobilenet_v3", "efficientnet"])
def test_qdq_cnn_blocks_keep_their_groups(tmp_path: Path, name: str) -> None:
    """Squeeze-excite (its ReLU folded into a Q in the middle of the pattern, its gate's
    output quantized) and spelled-out activations (SiLU: x · σ(x), each operand through its
    own Q -> DQ) match through the quantization as in fp32. ORT leaves a final HardSwish
    unquantized: no output DQ then."""
    import torch

    from onnxlens.exporters.torch_export import export_module

    shape = (1, 8, 16, 16)
    fp32 = export_module(_blocks()[name].eval(), (torch.randn(*shape),), tmp_path / "f.onnx",
                         input_names=["x"])
    quantization.quantize_static(fp32, tmp_path / "q.onnx", Reader(shape),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True)
    before, after = analyze(fp32), _checked(analyze(tmp_path / "q.onnx"))
    dangling = Counter({"QuantizeLinear": 1, "DequantizeLinear": name != "efficientnet"})
    assert Counter(g.pattern for g in after.groups) == Counter(
        g.pattern for g in before.groups) + dangling
    assert {after.group_precisions[g.id] for g in after.groups[1:len(before.groups) + 1]
            if after.group_costs[g.id].cost.macs} == {"int8"}


def test_dynamic_resnet18_has_the_fp32_groups(resnets: dict[str, AnalysisResult]) -> None:
    """quantize_dynamic: each Conv is DynamicQuantizeLinear, ConvInteger, Cast, the scale Mul
    and the bias Add of a reshaped bias, matched as a Conv; the Gemm a MatMulInteger chain with
    its bias (MatMul+Add). A DynamicQuantizeLinear read by two convolutions (a downsampling
    block's first Conv and its downsample) is a group of its own."""
    fp32, dynamic = resnets["fp32"], _checked(resnets["dynamic"])
    expected = Counter(g.pattern for g in fp32.groups) - Counter({"Gemm": 1}) + Counter(
        {"MatMul+Add": 1, "DynamicQuantizeLinear": 3})
    assert Counter(g.pattern for g in dynamic.groups) == expected
    assert {dynamic.group_precisions[g.id] for g in dynamic.groups
            if dynamic.group_costs[g.id].cost.macs} == {"int8"}
    stem = dynamic.groups[0]
    assert stem.pattern == "Conv+Relu" and Counter(_ops(dynamic, 0)) == Counter(
        {"DynamicQuantizeLinear": 1, "ConvInteger": 1, "Cast": 1, "Mul": 2, "Reshape": 1,
         "Add": 1, "Relu": 1})


# ---- hand-built QDQ graphs --------------------------------------------------------------------

def _qdq_conv(relu: bool, out_zero_point: int) -> onnx.ModelProto:
    """x [1, 3, 8, 8] float -> Q (uint8, zp 128) -> DQ -> Conv 4x3x3x3 (int8 weights per output
    channel, int32 bias) [-> Relu] -> Q (uint8, `out_zero_point`) -> DQ -> y."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
        "w_scale": rng.uniform(0.002, 0.01, 4).astype(np.float32),
        "w_zero": np.zeros(4, np.int8),
        "b": rng.integers(-500, 500, 4).astype(np.int32),
        "b_scale": np.array(0.0001, np.float32),
        "x_scale": np.array(1 / 64, np.float32), "x_zero": np.array(128, np.uint8),
        "y_scale": np.array(0.05, np.float32), "y_zero": np.array(out_zero_point, np.uint8),
    }
    conv_out = "c" if relu else "r"
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zero"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "b_scale"], ["bf"]),
             helper.make_node("Conv", ["xf", "wf", "bf"], [conv_out], pads=[1, 1, 1, 1]),
             *([helper.make_node("Relu", ["c"], ["r"])] if relu else []),
             helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zero"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zero"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(v, n) for n, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(("relu", "zero_point", "pattern"), [
    (True, 0, "Conv+Relu"), (True, 100, "Conv+Relu"),  # the Relu kept: named by it
    (False, 0, "Conv+Relu"),  # folded: a uint8 Q with zero point 0 saturates x < 0 to 0
    (False, 100, "Conv"),  # no Relu: the Q keeps negative values
])
def test_per_channel_qdq_conv_is_one_group(relu: bool, zero_point: int, pattern: str) -> None:
    result = _checked(analyze(_qdq_conv(relu, zero_point)))
    assert [g.pattern for g in result.groups] == ["QuantizeLinear", pattern, "DequantizeLinear"]
    conv_ops = ["DequantizeLinear"] * 3 + ["Conv"] + ["Relu"] * relu + ["QuantizeLinear"]
    assert _ops(result, 1) == conv_ops
    assert result.group_precisions[1] == "int8"
    # The Conv group reads the uint8 input (1 x 3 x 8 x 8) and its constants (108 int8
    # weights, 4 float and 4 int8 per-channel scales and zero points, 4 int32 biases, the
    # scalars), and writes uint8 [1, 4, 8, 8].
    cost = result.group_costs[1].cost
    assert cost.macs == 4 * 8 * 8 * 3 * 9
    assert cost.bytes_written == 4 * 8 * 8
    consts = 108 + 4 * 4 + 4 + 4 * 4 + 4 + 4 + 1 + 4 + 1
    assert cost.bytes_read == 3 * 8 * 8 + consts
    # ORT runs it as one QLinearConv of the group's bytes and MACs, at its own rate, without
    # the DQs' arithmetic: the input's 192 and the weights' 108 elements at 3 FLOPs (with a
    # zero point), the bias's 4 at 2; of 3 input channels, on the im2col path
    # (`ort_cpu.symmetric_conv`).
    (kernel,) = _ort_kernels(result, 1)
    assert kernel.cls == "conv_int8_im2col"
    assert kernel.cost == dataclasses.replace(
        cost, other_flops=cost.other_flops - (192 * 3 + 108 * 3 + 4 * 2))


def test_a_zero_point_at_the_lowest_value_is_a_relu() -> None:
    """What names the folded Q Relu, checked by onnx.reference: quantizing the conv output
    with zero point 0 gives what quantizing Relu(conv) does; with zero point 100 it does not."""
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)

    def run(relu: bool, zero_point: int) -> np.ndarray:
        return ReferenceEvaluator(_qdq_conv(relu, zero_point)).run(None, {"x": x})[0]

    assert np.array_equal(run(False, 0), run(True, 0))
    assert not np.array_equal(run(False, 100), run(True, 100))


# ---- dynamic quantization ---------------------------------------------------------------------

def _mlp(tmp_path: Path, bias: bool, shared_input: bool, rows: int = 7) -> Path:
    """x [1, rows, 32] -> MatMul [32, 16] (+ bias) -> y; with `shared_input`, a second MatMul
    reads x too (its DynamicQuantizeLinear is then shared, as for attention's Q, K and V)."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "w"], ["m" if bias else "y"])]
    inits = [weight("w", 32, 16)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, 16])]
    if bias:
        nodes.append(helper.make_node("Add", ["m", "b"], ["y"]))
        inits.append(weight("b", 16))
    if shared_input:
        nodes.append(helper.make_node("MatMul", ["x", "w2"], ["z"]))
        inits.append(weight("w2", 32, 16))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, rows, 16]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, 32])
    graph = helper.make_graph(nodes, "mlp", [x], outputs, inits)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), fp32)  # one ORT 1.31 loads
    quantization.quantize_dynamic(fp32, tmp_path / "dynamic.onnx")
    return tmp_path / "dynamic.onnx"


@pytest.mark.parametrize(("bias", "pattern"), [(True, "MatMul+Add"), (False, "MatMul")])
def test_a_dynamic_quantized_matmul_is_one_group(tmp_path: Path, bias: bool,
                                                 pattern: str) -> None:
    result = _checked(analyze(_mlp(tmp_path, bias, shared_input=False)))
    assert [g.pattern for g in result.groups] == [pattern]
    assert Counter(_ops(result, 0)) == Counter(
        {"DynamicQuantizeLinear": 1, "MatMulInteger": 1, "Cast": 1, "Mul": 2, "Add": bias})
    assert result.group_precisions[0] == "int8"
    # MACs: 7 rows x 16 outputs x K 32, as the fp32 MatMul's.
    assert result.group_costs[0].cost.macs == 7 * 16 * 32
    # ORT: one DynamicQuantizeMatMul (MatMulIntegerToFloat with its bias).
    (kernel,) = _ort_kernels(result, 0)
    assert kernel.cls == "gemm_int8" and kernel.cost == result.group_costs[0].cost


def _ort_mac_kernel(path: Path) -> tuple[str, bool, list[int]]:
    """ORT's own optimized graph (CPU, all optimizations): its one integer MAC kernel's op,
    whether its B is an initializer (prepacked at load), and A's shape."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(path.with_suffix(".ort.onnx"))
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph = onnx.shape_inference.infer_shapes(onnx.load(options.optimized_model_filepath)).graph
    (node,) = [n for n in graph.node if n.op_type in (
        "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger")]
    b = 3 if node.op_type == "QLinearMatMul" else 1
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*graph.input, *graph.value_info)}
    return node.op_type, node.input[b] in {i.name for i in graph.initializer}, shapes[
        node.input[0]]


@pytest.mark.parametrize(("rows", "cls"), [(1, "gemv_int8"), (7, "gemm_int8")])
def test_a_dynamic_quantized_matmul_of_one_row_is_a_gemv(tmp_path: Path, rows: int,
                                                         cls: str) -> None:
    """A decode step's projection (one row of A on weights) is a class of its own
    (hardware.GEMV_INT8): ORT runs a DynamicQuantizeMatMul on a prepacked B of one row."""
    path = _mlp(tmp_path, bias=False, shared_input=False, rows=rows)
    op, packed, a_shape = _ort_mac_kernel(path)
    assert (op, packed, a_shape) == ("DynamicQuantizeMatMul", True, [1, rows, 32])
    (kernel,) = _ort_kernels(_checked(analyze(path)), 0)
    assert kernel.cls == cls and kernel.cost.macs == rows * 32 * 16


def test_a_quantized_product_of_two_activations_is_unpacked(tmp_path: Path) -> None:
    """Attention's Q·Kᵀ quantized by quantize_static (QDQ): both operands are activations, so
    ORT packs B at each call (hardware.GEMM_INT8_UNPACKED), one call per head."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["x", "xt"], ["y"])]
    graph = helper.make_graph(
        nodes, "qk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])])
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), fp32)
    quantization.quantize_static(fp32, tmp_path / "qdq.onnx", Reader((1, 2, 8, 16)),
                                 quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QUInt8)
    op, packed, a_shape = _ort_mac_kernel(tmp_path / "qdq.onnx")
    assert not packed and a_shape == [1, 2, 8, 16], op
    result = _checked(analyze(tmp_path / "qdq.onnx"))
    (kernel,) = [k for g in range(len(result.groups)) for k in _ort_kernels(result, g)
                 if k.cost.macs]
    assert (kernel.cls, kernel.calls, kernel.cost.macs) == ("gemm_int8_unpacked", 2, 2 * 8 * 16 * 8)


def test_a_shared_dynamic_quantizer_is_its_own_group(tmp_path: Path) -> None:
    result = _checked(analyze(_mlp(tmp_path, bias=True, shared_input=True)))
    patterns = Counter(g.pattern for g in result.groups)
    assert patterns == {"DynamicQuantizeLinear": 1, "MatMul+Add": 1, "MatMul": 1}
    assert _ops(result, 0) == ["DynamicQuantizeLinear"]


# ---- transformers -----------------------------------------------------------------------------

class _TokenReader(quantization.CalibrationDataReader):
    """Two random 16-token sequences of the tiny models' vocabulary, no padding."""

    def __init__(self) -> None:
        self.rng, self.left = np.random.default_rng(0), 2

    def get_next(self) -> dict[str, np.ndarray] | None:
        if not self.left:
            return None
        self.left -= 1
        return {"input_ids": self.rng.integers(0, 60, (1, 16)),
                "attention_mask": np.ones((1, 16), np.int64)}


def test_qdq_bert_keeps_its_layers(tmp_path: Path) -> None:
    """quantize_static QDQ of a 2-layer BERT: one attention group per layer and its norms, as
    the fp32 model, every MAC group int8; the only new groups are the output's DQ and weights'
    DQs that several groups read (LayerNorm weights shared through TorchScript's Identity
    nodes)."""
    pytest.importorskip("transformers")
    from hf_models import export

    from onnxlens.analyzer.fusion import ATTENTION, NORMS

    fp32 = export("bert", tmp_path / "bert.onnx", layers=2, hidden=64, seq=16, dynamo=False)
    quantization.quantize_static(fp32, tmp_path / "qdq.onnx", _TokenReader(),
                                 quant_format=quantization.QuantFormat.QDQ)
    before, after = analyze(fp32), _checked(analyze(tmp_path / "qdq.onnx"))
    assert Counter(g.pattern for g in after.groups) - Counter(g.pattern for g in before.groups) \
        == Counter({"DequantizeLinear": 4})
    for result in (before, after):
        assert sum(ATTENTION in g.pattern for g in result.groups) == 2
        assert sum(g.pattern in NORMS for g in result.groups) == 5
    *shared, output = [after.graph.info(g.nodes[0]) for g in after.groups
                       if g.pattern == "DequantizeLinear"]
    assert output.outputs[0].name in after.graph.graph_outputs
    for info in shared:
        assert info.inputs[0].name in after.graph.initializers
        assert len(after.graph.consumers[info.outputs[0].name]) > 1
    assert {after.group_precisions[g.id] for g in after.groups
            if after.group_costs[g.id].cost.macs} == {"int8"}
