"""What broke when models nobody here had tried were brought as a new user would (issue 13,
2026-11-26): each case rebuilt tiny here and checked against ONNX Runtime or a hand count."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from onnxlens import analyze as analyze_with_views
from onnxlens.analyzer.analysis import analyze
from onnxlens.analyzer.errors import InvalidModelError
from onnxlens.analyzer.fusion import ATTENTION
from onnxlens.analyzer.host import host_profile
from onnxlens.backends.native.kernel_model import NATIVE_CPU_MODEL

MS = "com.microsoft"


def _qlinear_concat_model() -> onnx.ModelProto:
    """A QOperator ViT's embedding: the class token concatenated before the patches
    (QLinearConcat), the position embedding added (QLinearAdd), dequantized."""
    u8 = TensorProto.UINT8
    inits = [numpy_helper.from_array(np.full((1, 1, 8), 3, np.uint8), "cls"),
             numpy_helper.from_array(np.full((1, 1, 8), 5, np.uint8), "pos"),
             numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z")]
    nodes = [helper.make_node("QLinearConcat", ["s", "z", "cls", "s", "z", "x", "s", "z"],
                              ["cat"], axis=1, domain=MS),
             helper.make_node("QLinearAdd", ["cat", "s", "z", "pos", "s", "z", "s", "z"],
                              ["add"], domain=MS),
             helper.make_node("DequantizeLinear", ["add", "s", "z"], ["y"])]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "tokens", 8])
    graph = helper.make_graph(nodes, "vit_embed",
                              [helper.make_tensor_value_info("x", u8, [1, "patches", 8])], [y],
                              inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])


def test_qlinear_concat_keeps_the_quantized_type_and_concatenates() -> None:
    """ORT's symbolic inference lacks QLinearConcat and gave float: the analysis refused the
    DequantizeLinear after it ('zero point is uint8, but add_quantized is float')."""
    model = _qlinear_concat_model()
    x = np.full((1, 4, 8), 130, np.uint8)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    result = analyze(model, dims={"patches": 4})
    tensors = result.model.tensors
    assert tensors["cat"].elem_type == TensorProto.UINT8
    assert tuple(tensors["cat"].shape) == (1, 5, 8)
    assert tuple(tensors["y"].shape) == expected.shape == (1, 5, 8)
    assert result.totals["complete"]


class _Encoder(torch.nn.Module):
    """Two pre-norm layers of SDPA attention with a padding mask, hidden 32, 4 heads."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, 3 * HIDDEN)
                                       for _ in range(LAYERS))
        self.out = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS))

    def forward(self, x, mask):
        b, s, _ = x.shape
        bias = (1.0 - mask[:, None, None, :]) * -1e4
        for qkv, out in zip(self.qkv, self.out, strict=True):
            q, k, v = (t.view(b, s, HEADS, -1).transpose(1, 2)
                       for t in qkv(x).chunk(3, dim=-1))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            x = x + out(a.transpose(1, 2).reshape(b, s, HIDDEN))
        return x


LAYERS, HIDDEN, HEADS, SEQ = 2, 32, 4, 16


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.feeds = iter([{"x": rng.standard_normal((1, SEQ, HIDDEN), np.float32),
                            "mask": np.ones((1, SEQ), np.float32)} for _ in range(2)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


@pytest.mark.parametrize("dynamo", [False, True])
def test_qoperator_attention_is_one_group_a_layer(tmp_path, dynamo: bool) -> None:
    """quantize_static's QOperator format (QLinearMatMul, QLinearAdd of the mask,
    QLinearSoftmax; dynamo's SDPA guard on the dequantized probabilities) matched no attention
    pattern: 0 groups for 2 layers."""
    fp32, q = tmp_path / "fp32.onnx", tmp_path / "qop.onnx"
    args = (torch.randn(1, SEQ, HIDDEN), torch.ones(1, SEQ))
    torch.onnx.export(_Encoder().eval(), args, str(fp32), dynamo=dynamo, input_names=["x", "mask"],
                      output_names=["y"], **({} if dynamo else {"opset_version": 17}))
    quantize_static(str(fp32), str(q), _Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    result = analyze(str(q))
    attention = [g for g in result.groups if g.pattern == ATTENTION]
    assert len(attention) == LAYERS
    # Q·Kᵀ and P·V: S² scores a head, d MACs each, twice: 2·S²·H MACs a layer
    assert [result.group_costs[g.id].cost.macs for g in attention] == [2 * SEQ * SEQ * HIDDEN] * 2
    ops = {result.graph.infos[k].op_type for k in attention[0].nodes}
    assert {"QLinearMatMul", "QLinearSoftmax"} <= ops


def _chain(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [1, "n"])],
                              [value("y", TensorProto.FLOAT, [1, "n"])])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_out_of_order_are_analyzed_sorted_as_ort_runs_them() -> None:
    """ORT's convert_float_to_float16(keep_io_types=True) appends the input Casts after the
    nodes reading them; ORT sorts and runs such a graph, the analysis refused it."""
    ops = [helper.make_node("Mul", ["h", "h"], ["y"]),  # reads h before the Cast makes it
           helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT)]
    unsorted = _chain(ops)
    x = np.arange(3, dtype=np.float32)[None]
    got = ort.InferenceSession(unsorted.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x * x)  # ORT runs it
    result = analyze(unsorted, dims={"n": 3})
    assert [result.graph.infos[k].op_type for g in result.groups for k in g.nodes] == [
        "Cast", "Mul"]
    assert result.totals["flops"] == analyze(_chain(ops[::-1]), dims={"n": 3}).totals["flops"]
    assert any("not in topological order" in w and "'h'" in w for w in result.warnings)
    symbolic = analyze(unsorted)  # reloads the sorted proto per sample: the warning stays
    assert any("not in topological order" in w for w in symbolic.warnings)


def test_a_cycle_is_still_refused() -> None:
    cycle = _chain([helper.make_node("Relu", ["b"], ["a"]),
                    helper.make_node("Mul", ["a", "x"], ["b"]),
                    helper.make_node("Identity", ["a"], ["y"])])
    with pytest.raises(InvalidModelError, match="cycle"):
        analyze(cycle)


def test_native_estimate_of_an_empty_copy() -> None:
    """A strided copy of an empty tensor (a Slice of a KV cache at prefill, past 0):
    native-cpu's kernel model divided by its zero-length run (ZeroDivisionError in `compare`
    of a dynamo Mistral at past 0). It copies nothing."""
    value = helper.make_tensor_value_info
    bounds = [numpy_helper.from_array(np.array([v], np.int64), n)
              for n, v in (("start", -8), ("end", 2**62), ("axis", 2))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "start", "end", "axis"], ["y"])], "g",  # the last 8
        [value("x", TensorProto.FLOAT, [1, 2, "past", 4])],
        [value("y", TensorProto.FLOAT, [1, 2, "kept", 4])], bounds)
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    r = analyze(model, dims={"past": 0})
    kernels = NATIVE_CPU_MODEL.kernels(r.graph, r.groups,
                                       {k: nc.cost for k, nc in r.node_costs.items()},
                                       {g: nc.cost for g, nc in r.group_costs.items()},
                                       host_profile(1), r.model)
    (k,) = [k for ks in kernels.values() for k in ks]
    assert (k.runs, k.elements, k.cost.bytes_read, k.cost.bytes_written) == (0, 0, 0, 0)


WINDOW = 8  # the sliding window: a layer keeps its last WINDOW - 1 tokens, as HF's does


class _SlidingDecoder(torch.nn.Module):
    """One attention layer whose cache slides, as transformers' sliding-window layers export
    (Mistral): present holds the last WINDOW - 1 rows of past + new."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = torch.nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)

    def forward(self, x, past_k, past_v):
        k, v = (t.view(1, -1, 1, HIDDEN).transpose(1, 2) for t in self.kv(x).chunk(2, -1))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        q = x.view(1, -1, 1, HIDDEN).transpose(1, 2)
        y = torch.softmax(q @ k.transpose(2, 3), dim=-1) @ v
        return y, k[:, :, 1 - WINDOW:], v[:, :, 1 - WINDOW:]


def test_the_cache_held_is_what_present_returns(tmp_path) -> None:
    """A cache that slides holds WINDOW - 1 tokens at any context: the LLM view's memory
    counted the context (Mistral's at 2048: 2 MiB where it holds 63 KiB)."""
    path = tmp_path / "sliding.onnx"
    cache = {2: "past_sequence_length"}
    torch.onnx.export(_SlidingDecoder().eval(),
                      (torch.randn(1, 3, HIDDEN), torch.randn(1, 1, 20, HIDDEN),
                       torch.randn(1, 1, 20, HIDDEN)), str(path), dynamo=False,
                      input_names=["x", "past_key_values.0.key", "past_key_values.0.value"],
                      output_names=["y", "present.0.key", "present.0.value"],
                      dynamic_axes={"x": {1: "sequence_length"},
                                    "past_key_values.0.key": cache,
                                    "past_key_values.0.value": cache})
    llm = analyze_with_views(str(path), prompt_len=4, context_len=[6, 64]).llm
    per_token = 2 * HIDDEN * 4  # K and V of one head of HIDDEN, fp32
    held = [d["memory"]["kv_cache_bytes"] for d in llm["context_sweep"]]
    assert held == [6 * per_token, (WINDOW - 1) * per_token]  # under the window, then capped


def _merged(condition: np.ndarray | None) -> onnx.ModelProto:
    """An If as optimum's merged decoders write it: then x·A (32 MACs a row), else x·B·C (16 +
    32 a row), each branch holding its own weights, and a second output, a bias, returned as
    the branch's initializer."""
    value = helper.make_tensor_value_info

    def branch(name: str, weights: dict[str, tuple[int, int]]) -> onnx.GraphProto:
        names = list(weights)
        nodes = [helper.make_node("MatMul", [src, w], [f"{name}{i}"])
                 for i, (src, w) in enumerate(zip(["x", *(f"{name}{i}" for i in range(
                     len(names) - 1))], names, strict=True))]
        inits = [numpy_helper.from_array(np.full(shape, 0.5, np.float32), w)
                 for w, shape in weights.items()]
        inits.append(numpy_helper.from_array(np.full(4, 2.0, np.float32), "bias"))
        return helper.make_graph(nodes, name, [], [value(f"{name}{len(names) - 1}",
                                                         TensorProto.FLOAT, None),
                                                   value("bias", TensorProto.FLOAT, None)], inits)

    inputs = [value("x", TensorProto.FLOAT, ["n", 4])]
    inits = []
    if condition is None:
        inputs.append(value("use_cache_branch", TensorProto.BOOL, [1]))
    else:
        inits.append(numpy_helper.from_array(condition, "use_cache_branch"))
    node = helper.make_node("If", ["use_cache_branch"], ["y", "bias"], name="optimum::if",
                            then_branch=branch("then", {"A": (4, 8)}),
                            else_branch=branch("else", {"B": (4, 4), "C": (4, 8)}))
    graph = helper.make_graph([node], "merged", inputs,
                              [value("y", TensorProto.FLOAT, ["n", 8]),
                               value("bias", TensorProto.FLOAT, [4])], inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def test_an_if_on_an_input_is_analyzed_as_its_then_branch() -> None:
    """optimum's decoder_model_merged.onnx: an If on `use_cache_branch` was one node of
    unknown cost (0 MACs). Its then branch is inlined, as ORT runs it when the input is true."""
    model = _merged(None)
    x = np.ones((3, 4), np.float32)
    y, bias = ort.InferenceSession(model.SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(None, {"x": x, "use_cache_branch": np.array([True])})
    result = analyze(model, dims={"n": 3})
    assert result.totals["macs"] == 3 * 4 * 8 and result.totals["complete"]
    tensors = result.model.tensors
    assert tuple(tensors["y"].shape) == y.shape and tuple(tensors["bias"].shape) == bias.shape
    assert any("inlined If 'optimum::if'" in w and "use_cache_branch" in w
               for w in result.warnings)
    assert any("inlined If" in w for w in analyze(model).warnings)  # the symbolic path too


def test_an_if_on_a_constant_is_analyzed_as_the_branch_it_takes() -> None:
    result = analyze(_merged(np.array([False])), dims={"n": 3})
    assert result.totals["macs"] == 3 * 4 * 4 + 3 * 4 * 8
    assert not any("inlined If" in w for w in result.warnings)


def test_nested_ifs_read_the_inlined_branch() -> None:
    """An If inside the then branch reading a tensor that branch computes: inlined twice, its
    read follows the tensor's new name. 3 x 4 x 8 MACs, then a Relu."""
    value = helper.make_tensor_value_info
    leaf = helper.make_graph([helper.make_node("Relu", ["h"], ["r"])], "leaf", [],
                             [value("r", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["h"], ["m"])], "other", [],
                              [value("m", TensorProto.FLOAT, None)])
    inner = helper.make_node("If", ["c"], ["out"], name="inner", then_branch=leaf,
                             else_branch=other)
    weight = numpy_helper.from_array(np.ones((4, 8), np.float32), "w")
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), inner], "then", [],
                             [value("out", TensorProto.FLOAT, None)], [weight])
    outer = helper.make_node("If", ["c"], ["y"], name="outer", then_branch=then,
                             else_branch=other)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h"]), outer], "g",
                              [value("x", TensorProto.FLOAT, [3, 4]),
                               value("c", TensorProto.BOOL, [1])],
                              [value("y", TensorProto.FLOAT, [3, 8])],
                              [numpy_helper.from_array(np.ones((4, 8), np.float32), "w0")])
    result = analyze(helper.make_model(graph, ir_version=9,
                                       opset_imports=[helper.make_opsetid("", 17)]))
    assert result.totals["macs"] == 2 * 3 * 4 * 8  # the outer MatMul and the branch's
    relu = next(i for i in result.graph.infos.values() if i.op_type == "Relu")
    assert relu.inputs[0].name == "outer/then/h"  # the branch's h, not the outer one
    assert sum("inlined If" in w for w in result.warnings) == 2


def test_a_saved_analysis_missing_a_field_is_a_one_line_error(tmp_path) -> None:
    """`onnxlens report` of a JSON whose LLM view lacks its layout: a KeyError traceback."""
    import json

    from typer.testing import CliRunner

    from onnxlens.cli import app

    model, saved = tmp_path / "m.onnx", tmp_path / "a.json"
    onnx.save(_chain([helper.make_node("Relu", ["x"], ["y"])]), model)
    runner = CliRunner()
    assert runner.invoke(app, ["analyze", str(model), "--dim", "n=4", "--json",
                               str(saved)]).exit_code == 0
    d = json.loads(saved.read_text())
    d["llm"] = {"layers": 2}  # kv_heads, head_dim, phases missing
    saved.write_text(json.dumps(d))
    run = runner.invoke(app, ["report", str(saved), "-o", str(tmp_path / "r.html")])
    assert run.exit_code == 2 and not isinstance(run.exception, KeyError)
    assert "malformed analysis (KeyError: 'kv_heads')" in run.output
    assert "Traceback" not in run.output


def test_kernels_ort_runs_inside_a_branch_map_to_our_nodes(tmp_path) -> None:
    """ORT profiles an If's branch kernel by kernel, and the If as one event spanning them:
    --measure mapped 1 of 137 kernels of a merged BART decoder (66% of the time unmapped)."""
    from onnxlens.backends.compare import compare

    path = tmp_path / "merged.onnx"
    onnx.save(_merged(None), path)
    result = compare(path, ["ort-cpu"], runs=2, warmup=1, profile_runs=1, samples=1,
                     memory=False, dims={"n": 3})
    times = result.runs["ort-cpu"].times
    assert times is not None and times.unmapped_share == 0
    assert times.mapped_kernels == len(times.kernels) > 0
    assert "If" not in {k.op_type for k in times.kernels}
    matmul = next(k for k in times.kernels if k.op_type == "MatMul")
    assert [result.analysis.graph.infos[n].op_type for n in matmul.nodes] == ["MatMul"]


def test_kernels_of_a_function_ort_inlines_map_to_its_node(tmp_path) -> None:
    """ORT's CPU provider has no fp16 Softmax kernel: it runs the op's function body (ReduceMax,
    Sub, Exp, ReduceSum, Div) between Casts to float, profiles those unnamed nodes as
    ``<op_type>_<index>`` and saves them unnamed: they were unmapped (14% of an fp16 RoBERTa's
    kernel time)."""
    from onnxlens.backends.compare import compare

    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="softmax")], "fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 16, 16])])
    path = tmp_path / "fp16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), path)
    result = compare(path, ["ort-cpu"], runs=2, warmup=1, profile_runs=1, samples=1,
                     memory=False)
    times = result.runs["ort-cpu"].times
    assert times is not None and times.unmapped_share == 0
    assert times.mapped_kernels == len(times.kernels)
    body = [k for k in times.kernels if k.op_type in ("ReduceMax", "Exp", "ReduceSum")]
    assert len(body) == 3 and all(k.nodes == ("softmax",) for k in body)


def test_ort_symbolic_inference_failing_names_its_node(tmp_path) -> None:
    """ORT's symbolic shape inference fails with a bare AssertionError (HF Gemma 3's cache model
    at a past under its window: an Expand whose shapes do not broadcast); the warning names the
    node, the one ONNX Runtime's own loader refuses. Here FastGelu (unknown to onnx's inference)
    feeds an Add of [2, 3] and [2, 5]."""
    nodes = [helper.make_node("FastGelu", ["x"], ["g"], domain="com.microsoft"),
             helper.make_node("Add", ["g", "y"], ["z"], name="the_add")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                     helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, "m"])])
    path = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)],
                                ir_version=10), path)
    with pytest.raises(Exception, match=r"Node \(the_add\) Op \(Add\)"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result = analyze(str(path))
    assert ("ONNX Runtime's symbolic shape inference gave up at node 'the_add' (Add): "
            "AssertionError") in result.warnings
    assert not result.totals["complete"]
