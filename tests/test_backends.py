"""The backends one by one: ORT CPU (run, time, profile, intermediates), the CUDA probe, the
mapping of ORT's kernels to our nodes and groups, agreement and dump-diff, and inputs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxlens.analyzer.analysis import analyze
from onnxlens.analyzer.errors import UsageError
from onnxlens.backends import registry
from onnxlens.backends.agreement import (
    agreement,
    cosine,
    diff_tensors,
    dump_diff,
    tolerance,
    top1_agreement,
)
from onnxlens.backends.base import (
    BackendError,
    BackendUnavailable,
    input_specs,
    latency_dict,
    load_inputs,
    load_proto,
    random_inputs,
)
from onnxlens.backends.ort import OrtBackend, cuda_unavailable_reason, loader_reason
from onnxlens.backends.ort_timing import parse_trace, random_feeds
from onnxlens.backends.profile_map import kernel_covers, map_profile, ort_folds

LAYOUT_KERNELS = {"ReorderInput", "ReorderOutput"}  # NCHW <-> NCHWc, no ONNX counterpart


def _tiny_model(batch: int | str = 1) -> onnx.ModelProto:
    """y = Relu(x @ W + b), z = Softmax(y): 3 nodes, one input [batch, 8], two outputs."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["pre"], name="add"),
             helper.make_node("Relu", ["pre"], ["y"], name="relu"),
             helper.make_node("Softmax", ["y"], ["z"], name="softmax", axis=1)]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 4])], [w, b])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def _profiled(path: Path, runs: int = 2):
    backend = OrtBackend("cpu", threads=1)
    backend.prepare(path)
    feeds = random_inputs(input_specs(load_proto(path, weights=False)), count=1, batch=1)[0]
    return backend, feeds, backend.profile(feeds, runs=runs, warmup=1)


# ---- ORT CPU ------------------------------------------------------------------------------------

def test_ort_cpu_runs_times_and_names_intermediates() -> None:
    model = _tiny_model()
    backend = OrtBackend("cpu", threads=1)
    backend.prepare(model)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)[:1] / 10
    w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    out = backend.run({"x": x})
    np.testing.assert_allclose(out["y"], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
    timing = backend.time({"x": x}, warmup=1, runs=7)
    stats = latency_dict(timing)
    assert stats["runs"] == 7 and stats["min"] <= stats["median"] <= stats["p90"] <= stats["max"]
    assert stats["spread"] == pytest.approx((stats["max"] - stats["min"]) / stats["median"])
    tensors = backend.intermediates({"x": x})
    assert set(tensors) == {"xw", "pre", "y", "z"}
    np.testing.assert_allclose(tensors["xw"], x @ w, rtol=1e-5, atol=1e-6)
    assert backend.describe()["threads"] == 1 and backend.describe()["inter_op_threads"] == 1


def test_bad_input_is_one_line_backend_error() -> None:
    backend = OrtBackend("cpu")
    backend.prepare(_tiny_model())
    with pytest.raises(BackendError, match="ort-cpu: run failed") as info:
        backend.run({"x": np.zeros((1, 3), np.float32)})
    assert "\n" not in str(info.value)
    assert info.value.backend == "ort-cpu" and info.value.reason.startswith("run failed: ")


def test_parse_trace_assigns_kernels_by_time_span() -> None:
    """ORT writes a run's Session events after its kernels'."""
    def kernel(name: str, ts: int, dur: int) -> dict:
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": "Conv", "provider": "CPUExecutionProvider",
                         "input_type_shape": [{"float": [1, 3, 8, 8]}, {"float": [4, 3, 3, 3]}],
                         "output_type_shape": [{"float": [1, 4, 6, 6]}]}}

    events = [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 50},
              kernel("a", 101, 10), kernel("b", 112, 20),
              {"cat": "Session", "name": "model_run", "ts": 100, "dur": 40},
              kernel("a", 201, 12), kernel("b", 214, 22),
              {"cat": "Session", "name": "model_run", "ts": 200, "dur": 45}]
    runs = parse_trace(events)
    assert [r for r, _ in runs] == pytest.approx([40e-6, 45e-6])
    assert [[k.name for k in ks] for _, ks in runs] == [["a", "b"], ["a", "b"]]
    assert runs[1][1][1].duration_s == pytest.approx(22e-6)
    assert runs[0][1][0].input_shapes == ((1, 3, 8, 8), (4, 3, 3, 3))
    assert runs[0][1][0].output_shapes == ((1, 4, 6, 6),)


# ---- CUDA: unavailable here, said in one line -------------------------------------------------

def test_cuda_unavailable_is_one_quiet_line(capfd: pytest.CaptureFixture[str]) -> None:
    cuda_unavailable_reason.cache_clear()
    info = registry.availability("ort-cuda")
    if info.available:
        pytest.skip("a CUDA device is usable here")
    assert info.reason.startswith("CUDA EP unavailable: ")
    assert "\n" not in info.reason and "Traceback" not in info.reason
    assert capfd.readouterr().err == ""  # ORT's loader errors never reach the terminal
    with pytest.raises(BackendUnavailable, match=r"^ort-cuda: CUDA EP unavailable: "):
        registry.create("ort-cuda")


def test_loader_reason_names_the_missing_library() -> None:
    log = ("\x1b[1;31m2026 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 operator()] "
           "Failed to load library libonnxruntime_providers_cuda.so with error: "
           "libcublasLt.so.13: cannot open shared object file: No such file or directory\n"
           "\x1b[m[W:onnxruntime] Failed to create CUDAExecutionProvider. Require cuDNN 9.* "
           "and CUDA 13.*. Please install all dependencies")
    reason = loader_reason(log)
    assert reason.startswith("libcublasLt.so.13 not found (onnxruntime-gpu needs cuDNN 9.* and "
                             "CUDA 13.*)")
    assert "\n" not in reason and "\x1b" not in reason
    assert loader_reason("CUDA failure 100: no CUDA-capable device is detected ; GPU=0") \
        .startswith("no CUDA-capable device is detected")


def test_registry_lists_every_backend_and_refuses_unknown_names() -> None:
    rows = {b.name: b for b in registry.list_backends()}
    assert set(rows) == {"ort-cpu", "ort-cuda", "native-cpu", "native-cuda", "torch"}
    assert rows["native-cpu"].available  # built by pip install -e .
    assert rows["ort-cpu"].available and rows["ort-cpu"].reason == ""
    assert "original module" in rows["torch"].note
    with pytest.raises(BackendUnavailable, match="torchvision model name or module:factory"
                       ) as info:
        registry.create("torch")  # no module factory: an .onnx file
    assert (info.value.backend, info.value.reason) == ("torch", registry.TORCH_NEEDS_MODULE)
    with pytest.raises(UsageError, match="unknown backend 'tensorrt'"):
        registry.create("tensorrt")



def test_backends_list_their_op_coverage() -> None:
    from typer.testing import CliRunner

    from onnxlens.backends.native_cpu import supported_ops
    from onnxlens.cli import app

    rows = {b.name: b for b in registry.list_backends(ops=True)}
    assert rows["native-cpu"].ops.startswith(", ".join(supported_ops()) + ";")
    assert {"Conv", "MaxPool", "GlobalAveragePool"} <= set(supported_ops())
    # native-cuda's kernels come from the emulator's lowering table, the CUDA module's own.
    cuda_kernels = rows["native-cuda"].ops.split("plan kernels: ")[1].split(", ")
    assert {"Conv", "MatMul", "Softmax", "LayerNormalization", "Elementwise"} <= set(cuda_kernels)
    assert "Resize" not in cuda_kernels  # no CUDA kernel yet: native-cuda refuses it
    assert all(b.ops == "" for b in registry.list_backends())  # only when asked
    out = CliRunner().invoke(app, ["backends", "--ops"], terminal_width=400)
    assert out.exit_code == 0
    assert "native-cpu runs: " + ", ".join(supported_ops()[:3]) in out.output

def test_backends_do_not_import_torch() -> None:
    code = ("import sys, onnxlens.backends.compare, onnxlens.backends.registry, "
            "onnxlens.reports.compare_terminal; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- ORT kernels -> our nodes and groups --------------------------------------------------------

def _check_mapping(path: Path) -> tuple[int, int]:
    """Every kernel but NCHWc layout changes covers one of our nodes; groups add up."""
    analysis = analyze(path)
    backend, feeds, profile = _profiled(path)
    latency = backend.time(feeds, warmup=1, runs=3).median_s
    times = map_profile(profile, analysis, latency)
    unmapped = [k for k in times.kernels if not k.nodes]
    assert {k.op_type for k in unmapped} <= LAYOUT_KERNELS, [k.name for k in unmapped]
    assert times.unmapped_share < 0.05
    assert sum(times.group_s.values()) == pytest.approx(latency, rel=0.10)
    assert set(times.group_s) == {g.id for g in analysis.groups}
    covered = {n for k in times.kernels for n in k.nodes}
    static = ort_folds(analysis.graph)
    # Every node that computes at run time is some kernel's.
    assert [n for n in analysis.graph.order if n not in covered and n not in static] == []
    return times.mapped_kernels, len(times.kernels)


def test_resnet18_kernels_map_to_our_nodes(resnet18_path: Path) -> None:
    mapped, kernels = _check_mapping(resnet18_path)
    assert (mapped, kernels) == (24, 25)  # 20 NCHWc Conv, pools, Flatten, Gemm; ReorderOutput
    analysis = analyze(resnet18_path)
    _, _, profile = _profiled(resnet18_path, runs=1)
    covers = kernel_covers(analysis.graph, profile.optimized)
    # Named after the Conv's output, the kernel also ran the residual Add and the Relu.
    residual = covers["/layer1/layer1.0/conv2/Conv_output_0_nchwc"]
    group = next(g for g in analysis.groups if residual[0] in g.nodes)
    assert group.pattern == "Conv+Add+Relu" and residual == group.nodes


def test_resnet18_with_batchnorm_maps_bn_into_the_conv_kernels(resnet18_bn_path: Path) -> None:
    analysis = analyze(resnet18_bn_path)
    _, _, profile = _profiled(resnet18_bn_path, runs=1)
    covers = kernel_covers(analysis.graph, profile.optimized)
    ops = {k: {analysis.graph.info(n).op_type for n in nodes} for k, nodes in covers.items()}
    stem = ops["/relu/Relu_output_0_nchwc"]
    assert stem == {"Conv", "BatchNormalization", "Relu"}
    residual = ops["/layer1/layer1.0/bn2/BatchNormalization_output_0_nchwc"]
    assert residual == {"Conv", "BatchNormalization", "Add", "Relu"}


@pytest.fixture(scope="module")
def mobilenet_v2_path(torchvision_onnx: Callable[..., Path]) -> Path:
    return torchvision_onnx("mobilenet_v2")


@pytest.fixture(scope="module")
def transformer_block_path(export_dir: Path) -> Path:
    import torch

    from onnxlens.exporters.torch_export import export_module

    class Block(torch.nn.Module):
        """The layer called with its defaults (exported bare, the exporter passes them all)."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

    # The fused fast path has no ONNX export; the composite one exports as primitive ops.
    saved = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return export_module(Block(), (torch.randn(1, 16, 64),), export_dir / "block.onnx")
    finally:
        torch.backends.mha.set_fastpath_enabled(saved)


def test_mobilenet_v2_kernels_map_to_our_nodes(mobilenet_v2_path: Path) -> None:
    mapped, kernels = _check_mapping(mobilenet_v2_path)
    assert kernels - mapped == 1  # ReorderOutput


def _silu_chain() -> onnx.ModelProto:
    """EfficientNet's spelling, twice: Conv, then x·sigmoid(x) (ORT: NCHWc Conv, QuickGelu)."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i, (cin, cout, k) in enumerate(((16, 32, 3), (32, 32, 1))):
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                   kernel_shape=[k, k], pads=[k // 2] * 4),
                  helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"], name=f"sigmoid{i}"),
                  helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"y{i}"], name=f"mul{i}")]
        weights.append(numpy_helper.from_array(
            rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.1, f"w{i}"))
        x = f"y{i}"
    graph = helper.make_graph(
        nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 32, 24, 24])], weights)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_each_kernel_covers_only_the_nodes_it_runs(tmp_path: Path) -> None:
    """ORT's QuickGelu between NCHWc Convs writes a tensor of its own; named after our Mul,
    it covers the Sigmoid and the Mul, and the next Conv kernel only its Conv (joined to the
    QuickGelu through that tensor, both once claimed all three nodes and split their time
    by FLOPs, so the Conv took most of the QuickGelu's)."""
    path = tmp_path / "silu.onnx"
    onnx.save(_silu_chain(), path)
    analysis = analyze(path)
    _, _, profile = _profiled(path, runs=1)
    by_name = kernel_covers(analysis.graph, profile.optimized)
    covers: dict[str, list[tuple[str, ...]]] = {}
    for kernel in profile.kernels:
        covers.setdefault(kernel.op_type, []).append(by_name.get(kernel.name, ()))
    assert covers["QuickGelu"] == [("sigmoid0", "mul0"), ("sigmoid1", "mul1")]
    assert covers["Conv"] == [("conv0",), ("conv1",)]


def test_transformer_block_kernels_map_to_our_nodes(transformer_block_path: Path) -> None:
    """ORT's own Reshape/Gemm/Reshape, Split, SkipLayerNormalization: all mapped."""
    mapped, kernels = _check_mapping(transformer_block_path)
    assert mapped == kernels


def test_kernels_named_after_our_nodes_map_without_an_optimized_graph() -> None:
    """A backend that runs our graph as is (the native executor) needs no optimized model."""
    from onnxlens.backends.base import Profile
    from onnxlens.backends.values import NodeTime

    analysis = analyze(_tiny_model())
    kernels = tuple(NodeTime(n, "", 1e-3, "native") for n in ("mm", "add", "relu", "softmax"))
    times = map_profile(Profile(kernels, 4e-3), analysis, latency_s=8e-3)
    assert sum(times.node_s.values()) == pytest.approx(8e-3)
    assert times.node_s["mm"] == pytest.approx(2e-3) and times.unmapped_share == 0


def test_split_across_groups_follows_flops() -> None:
    """One kernel covering two groups: the time goes by the FLOPs of its nodes."""
    from onnxlens.backends.base import Profile
    from onnxlens.backends.values import NodeTime

    analysis = analyze(_tiny_model())
    graph = helper.make_graph([helper.make_node("FusedMatMul", ["x", "W", "b"], ["y"], name="k1"),
                               helper.make_node("Softmax", ["y"], ["z"], name="k2")],
                              "optimized", [], [])
    covers = kernel_covers(analysis.graph, graph)
    assert covers == {"k1": ("mm", "add", "relu"), "k2": ("softmax",)}
    kernels = (NodeTime("k1", "FusedMatMul", 3e-3, "cpu"), NodeTime("k2", "Softmax", 1e-3, "cpu"))
    times = map_profile(Profile(kernels, 4e-3, graph), analysis)
    flops = {k: analysis.node_costs[k].cost.flops() for k in ("mm", "add", "relu")}
    share = flops["mm"] / sum(flops.values())
    assert times.node_s["mm"] == pytest.approx(3e-3 * share)
    assert sum(times.group_s.values()) == pytest.approx(4e-3)


# ---- agreement and dump-diff --------------------------------------------------------------------

def test_tolerances_per_dtype() -> None:
    assert tolerance(np.dtype(np.float32)) == (1e-4, 1e-3)
    assert tolerance(np.dtype(np.float16)) == (1e-2, 1e-2)
    assert tolerance(np.dtype(np.int64)) == (0.0, 0.0)
    ref = np.array([1000.0, 0.0, -2.0], np.float32)
    assert diff_tensors(ref + np.float32(1e-4) * 500, ref).within  # scaled to the magnitude
    assert not diff_tensors(ref + np.array([0, 0, 0.2], np.float32), ref).within
    assert not diff_tensors(np.array([1, 2]), np.array([1, 3])).within  # integers are exact
    bad = diff_tensors(np.zeros((2, 3)), np.zeros((3, 2)))
    assert not bad.within and "shape" in bad.note
    nan = np.array([np.nan, 1.0])
    assert diff_tensors(nan, nan).within and not diff_tensors(np.array([np.nan, 1.0]),
                                                              np.array([0.0, 1.0])).within


def test_cosine_and_top1() -> None:
    assert cosine(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(0.0)
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    a = np.array([[0.1, 0.9], [0.8, 0.2]])
    b = np.array([[0.2, 0.7], [0.1, 0.5]])
    assert top1_agreement([(a, b)]) == 0.5
    assert top1_agreement([(a[:, :1], b[:, :1])]) is None  # one class: not a classifier
    result = agreement("ref", [{"o": b}], "cand", [{"o": a}])
    assert not result.passed and result.outputs[0].top1 == 0.5


class PerturbedOrt(OrtBackend):
    """A deliberately wrong backend: ORT CPU with 0.05 added to one node's output."""

    def __init__(self, node: str) -> None:
        super().__init__("cpu", threads=1)
        self.name = "perturbed"
        self.node = node

    def prepare(self, model) -> None:
        proto = onnx.ModelProto()
        proto.CopyFrom(load_proto(model))
        nodes = list(proto.graph.node)
        index = next(i for i, n in enumerate(nodes) if n.name == self.node)
        target = nodes[index].output[0]
        nodes[index].output[0] = target + "__raw"
        proto.graph.initializer.append(numpy_helper.from_array(np.float32(0.05), "noise"))
        nodes.insert(index + 1, helper.make_node("Add", [target + "__raw", "noise"], [target]))
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        super().prepare(proto)


def test_dump_diff_names_the_perturbed_node(resnet18_path: Path) -> None:
    analysis = analyze(resnet18_path)
    node = "/layer2/layer2.0/conv1/Conv"
    assert node in analysis.graph.order
    reference, wrong = OrtBackend("cpu"), PerturbedOrt(node)
    reference.prepare(resnet18_path)
    wrong.prepare(resnet18_path)
    x = random_inputs(input_specs(load_proto(resnet18_path, weights=False)), count=1, batch=1)[0]
    result = dump_diff(analysis.graph, "ort-cpu", reference.intermediates(x), "perturbed",
                       wrong.intermediates(x))
    assert result.first is not None and result.first.node == node
    assert result.compared == len(analysis.graph.order)  # every node output compared
    assert result.diverging >= 1


# ---- inputs -------------------------------------------------------------------------------------

def test_random_inputs_are_seeded_and_follow_the_batch() -> None:
    specs = input_specs(_tiny_model("batch"))
    a = random_inputs(specs, count=2, batch=3, seed=7)
    b = random_inputs(specs, count=2, batch=3, seed=7)
    assert a[0]["x"].shape == (3, 8) and a[0]["x"].dtype == np.float32
    np.testing.assert_array_equal(a[1]["x"], b[1]["x"])
    assert not np.array_equal(a[0]["x"], a[1]["x"])


def test_load_inputs_from_npy_npz_and_pb(tmp_path: Path) -> None:
    specs = input_specs(_tiny_model())
    x = np.ones((1, 8), np.float64)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", x=x * 2)
    (tmp_path / "c.pb").write_bytes(numpy_helper.from_array(x * 3, "x").SerializeToString())
    samples = load_inputs([tmp_path / "a.npy", tmp_path / "b.npz", tmp_path / "c.pb"], specs)
    assert [float(s["x"][0, 0]) for s in samples] == [1.0, 2.0, 3.0]
    assert all(s["x"].dtype == np.float32 for s in samples)
    np.savez(tmp_path / "bad.npz", y=x)
    with pytest.raises(UsageError, match="no array for input"):
        load_inputs([tmp_path / "bad.npz"], specs)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(UsageError, match="cannot read inputs"):
        load_inputs([tmp_path / "junk.npy"], specs)


def test_random_feeds_keep_a_fixed_empty_dim_and_take_symbolic_ones_as_one() -> None:
    """An empty KV cache [1, 2, 0, 4] (a prefill's past) is fed empty, as ORT requires of a
    fixed 0; a symbolic batch is 1."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past", "new"], ["present"], axis=2)], "g",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, 0, 4]),
         helper.make_tensor_value_info("new", TensorProto.FLOAT, ["batch", 2, 3, 4])],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, 2, 3, 4])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = random_feeds(session)
    assert feeds["past"].shape == (1, 2, 0, 4) and feeds["new"].shape == (1, 2, 3, 4)
    assert session.run(None, feeds)[0].shape == (1, 2, 3, 4)
