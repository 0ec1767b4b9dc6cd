"""Loading: external data, pinned and symbolic dims, the two shape inferences, unknown shapes.

Models are built here with onnx.helper, tiny. Bad input is in tests/bad_inputs/.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer import loader
from onnxlens.analyzer.analysis import Unknown
from onnxlens.analyzer.errors import ExternalDataError, ShapeError, UsageError
from onnxlens.analyzer.loader import load_model, parse_dim_spec, parse_shape_spec

vi = helper.make_tensor_value_info
OPSET = [helper.make_opsetid("", 17)]


def _init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(data, name)


def conv_model(channels: int = 16) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv(w[C,3,3,3], b[C]) -> Relu -> y[1,C,6,6]; w is over 1 KB (external)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "conv", [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [vi("y", TensorProto.FLOAT, [1, channels, 6, 6])],
                              [_init("w", (channels, 3, 3, 3)), _init("b", (channels,))])
    return helper.make_model(graph, opset_imports=OPSET)


def dynamic_model() -> onnx.ModelProto:
    """x[batch,3,32,32] -> Conv -> Relu -> Reshape to [batch, -1] (by Shape/Gather/Concat) ->
    MatMul[7200,10] -> y[batch,10]."""
    inits = [_init("w", (8, 3, 3, 3)), _init("fw", (7200, 10)),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Concat", ["n", "minus_one"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["r", "target"], ["flat"], name="reshape"),
             helper.make_node("MatMul", ["flat", "fw"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "dynamic",
                              [vi("x", TensorProto.FLOAT, ["batch", 3, 32, 32])],
                              [vi("y", TensorProto.FLOAT, ["batch", 10])], inits)
    return helper.make_model(graph, opset_imports=OPSET)


def one_op_then_conv(op_type: str, domain: str) -> onnx.ModelProto:
    """x[1,3,8,8] -> domain::op_type -> c -> Conv(w[4,3,3,3]) -> y."""
    nodes = [helper.make_node(op_type, ["x"], ["c"], name="custom", domain=domain),
             helper.make_node("Conv", ["c", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "custom", [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [vi("y", TensorProto.FLOAT, [None] * 4)], [_init("w", (4, 3, 3, 3))])
    return helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid(domain, 1)])


def shapes(model: loader.LoadedModel, *names: str) -> dict[str, object]:
    return {n: model.tensors[n].shape for n in names}


# ---- external data ----------------------------------------------------------------------------


def _node_costs(result: onnxlens.AnalysisResult) -> dict[str, object]:
    return {k: v.cost for k, v in result.node_costs.items()}


def test_external_data_gives_the_embedded_costs(tmp_path: Path) -> None:
    model = conv_model()
    embedded = tmp_path / "embedded.onnx"
    onnx.save(model, embedded)
    (tmp_path / "ext").mkdir()
    path = tmp_path / "ext" / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin")
    assert (tmp_path / "ext" / "weights.bin").stat().st_size >= 16 * 27 * 4
    assert path.stat().st_size < embedded.stat().st_size

    ext, emb = onnxlens.analyze(path), onnxlens.analyze(embedded)
    assert ext.totals == emb.totals
    assert _node_costs(ext) == _node_costs(emb)
    assert ext.totals["params"] == 16 * 27 + 16
    w = ext.model.initializers["w"]
    assert w.data_location == TensorProto.DEFAULT and not w.external_data
    assert w.raw_data == conv_model().graph.initializer[0].raw_data


def test_external_data_in_a_subfolder_and_through_an_inner_symlink(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    onnx.save(conv_model(), tmp_path / "model.onnx", save_as_external_data=True,
              location="data/weights.bin")
    assert onnxlens.analyze(tmp_path / "model.onnx").totals["params"] == 16 * 27 + 16
    # A symlink that stays inside the model's folder is followed.
    (tmp_path / "data" / "weights.bin").rename(tmp_path / "real.bin")
    (tmp_path / "data" / "weights.bin").symlink_to(tmp_path / "real.bin")
    assert onnxlens.analyze(tmp_path / "model.onnx").totals["params"] == 16 * 27 + 16


def test_bytes_and_proto_with_external_data_need_base_dir(tmp_path: Path) -> None:
    onnx.save(conv_model(), tmp_path / "model.onnx", save_as_external_data=True,
              location="weights.bin")
    data = (tmp_path / "model.onnx").read_bytes()
    proto = onnx.load(tmp_path / "model.onnx", load_external_data=False)
    expected = onnxlens.analyze(conv_model()).totals
    assert onnxlens.analyze(data, base_dir=tmp_path).totals == expected
    assert onnxlens.analyze(proto, base_dir=tmp_path).totals == expected
    with pytest.raises(ExternalDataError, match="pass base_dir"):
        onnxlens.analyze(data)
    assert proto.graph.initializer[0].data_location == TensorProto.EXTERNAL  # not changed


def matmul_model(k: int, n: int) -> onnx.ModelProto:
    """x[1,K] -> MatMul(w[K,N]) -> Add(b[N]) -> y[1,N]."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="bias")]
    graph = helper.make_graph(nodes, "mm", [vi("x", TensorProto.FLOAT, [1, k])],
                              [vi("y", TensorProto.FLOAT, [1, n])],
                              [_init("w", (k, n)), _init("b", (n,))])
    return helper.make_model(graph, ir_version=8, opset_imports=OPSET)  # ir 8: ORT runs it


def test_weights_stay_in_their_file_and_are_read_when_asked(tmp_path: Path) -> None:
    model = matmul_model(64, 128)  # w: 8,192 values, over what folding reads; b: 128
    onnx.save(matmul_model(64, 128), tmp_path / "model.onnx", save_as_external_data=True,
              size_threshold=0, location="weights.bin")
    loaded = load_model(tmp_path / "model.onnx")
    w, b = loaded.initializers["w"], loaded.initializers["b"]
    assert w.data_location == TensorProto.EXTERNAL and not w.HasField("raw_data")
    assert set(loaded.external) == {"w"}
    assert (loaded.external["w"].offset, loaded.external["w"].length) == (0, 64 * 128 * 4)
    assert b.data_location == TensorProto.DEFAULT  # small: read, for folding and validation
    for name in ("w", "b"):
        expected = numpy_helper.to_array(next(t for t in model.graph.initializer
                                              if t.name == name))
        np.testing.assert_array_equal(loaded.initializer_array(name), expected)
    result = onnxlens.analyze(tmp_path / "model.onnx")
    assert result.totals == onnxlens.analyze(model).totals
    assert result.totals["macs"] == 64 * 128
    assert result.totals["param_bytes"] == (64 * 128 + 128) * 4


def test_a_weight_file_replaced_after_loading_is_not_read(tmp_path: Path) -> None:
    onnx.save(matmul_model(64, 128), tmp_path / "model.onnx", save_as_external_data=True,
              size_threshold=0, location="weights.bin")
    loaded = load_model(tmp_path / "model.onnx")
    # Another file of the same bytes put in its place (made while the first exists: a new inode).
    (tmp_path / "other.bin").write_bytes((tmp_path / "weights.bin").read_bytes())
    (tmp_path / "other.bin").replace(tmp_path / "weights.bin")
    with pytest.raises(ExternalDataError, match=r"tensor 'w': external data 'weights\.bin': the "
                       "file changed since the model was loaded"):
        loaded.initializer_array("w")


def test_analysis_never_reads_the_weights(tmp_path: Path) -> None:
    """A 64 MiB weight whose file is garbage (random bytes, then a hole): the analysis is right
    and its Python allocations stay far below the weight's size, so it was never read."""
    import tracemalloc

    k = n = 4096
    model = matmul_model(8, 8)
    graph = model.graph
    graph.input[0].CopyFrom(vi("x", TensorProto.FLOAT, [1, k]))
    graph.output[0].CopyFrom(vi("y", TensorProto.FLOAT, [1, n]))
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[k, n],
                         data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(k * n * 4))):
        w.external_data.add(key=key, value=value)
    graph.initializer[0].CopyFrom(w)
    graph.initializer[1].CopyFrom(_init("b", (n,)))
    onnx.save(model, tmp_path / "model.onnx")
    with (tmp_path / "weights.bin").open("wb") as f:
        f.write(np.random.default_rng(1).bytes(4096))
        f.truncate(k * n * 4)  # sparse: the rest is a hole

    tracemalloc.start()
    try:
        result = onnxlens.analyze(tmp_path / "model.onnx")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.totals["macs"] == k * n
    assert result.totals["param_bytes"] == (k * n + n) * 4
    assert peak < (k * n * 4) // 8, f"peak {peak:,} bytes: the weight was read"


# ---- pinned dims ------------------------------------------------------------------------------


def cache_model() -> onnx.ModelProto:
    """A KV-cache step: x[batch, seq, 16], past[batch, past_len, 16] -> kv = Concat(past, x) ->
    q = x @ W[16, 32] and scores = x @ kv^T [batch, seq, past_len + seq]."""
    nodes = [helper.make_node("Concat", ["past", "x"], ["kv"], name="cat", axis=1),
             helper.make_node("MatMul", ["x", "W"], ["q"], name="proj"),
             helper.make_node("Transpose", ["kv"], ["kvT"], name="t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "kvT"], ["scores"], name="scores")]
    graph = helper.make_graph(
        nodes, "cache", [vi("x", TensorProto.FLOAT, ["batch", "seq", 16]),
                         vi("past", TensorProto.FLOAT, ["batch", "past_len", 16])],
        [vi("q", TensorProto.FLOAT, [None] * 3), vi("scores", TensorProto.FLOAT, [None] * 3)],
        [_init("W", (16, 32))])
    return helper.make_model(graph, opset_imports=OPSET)


def _cache_macs(batch: int, seq: int, past: int) -> int:
    # projection b·s·16·32, scores b·s·(past + s)·16 (one MAC per product term)
    return batch * seq * 16 * 32 + batch * seq * (past + seq) * 16


@pytest.mark.parametrize(("dims", "batch", "macs"), [
    ({"batch": 2, "seq": 3, "past_len": 5}, None, _cache_macs(2, 3, 5)),
    ({"seq": 3, "past_len": 0}, 2, _cache_macs(2, 3, 0)),  # prefill: an empty cache
    ({"batch": 2, "seq": 0, "past_len": 7}, None, 0),  # no new token: nothing to compute
])
def test_dims_pin_named_dims_to_hand_counted_costs(dims: dict[str, int], batch: int | None,
                                                   macs: int) -> None:
    result = onnxlens.analyze(cache_model(), dims=dims, batch=batch)
    b, s, p = batch or dims["batch"], dims["seq"], dims["past_len"]
    assert result.totals["macs"] == macs
    assert result.totals["complete"] and not result.formulas
    tensors = result.model.tensors
    assert tensors["kv"].shape == (b, p + s, 16)
    assert tensors["scores"].shape == (b, s, p + s)
    assert tensors["past"].nbytes == b * p * 16 * 4  # 0 bytes for an empty cache


def test_a_dim_left_symbolic_keeps_its_formula() -> None:
    result = onnxlens.analyze(cache_model(), dims={"batch": 1, "past_len": 0})
    assert result.symbols == {"seq": 1}
    assert result.totals["macs"] == _cache_macs(1, 1, 0)


@pytest.mark.parametrize("batch", [None, 2])
def test_more_dims_pin_as_a_fresh_load_with_them_would_reading_the_model_once(
        batch: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`more_dims` reads the model loaded with `dims` (past_len left named) and names another
    pin: the model comes back as `load_model` with both pins gives it, by a second inference
    but one parse; a `more_dims` naming nothing leaves the first load as it is."""
    dims = {"seq": 3} if batch else {"batch": 2, "seq": 3}
    reference = load_model(cache_model(), dims={**dims, "past_len": 5}, batch=batch)
    fresh = load_model(cache_model(), dims=dims, batch=batch)
    parse = loader._parse
    parses = []
    monkeypatch.setattr(loader, "_parse", lambda *a: parses.append(a) or parse(*a))
    seen: list[tuple[object, ...] | None] = []

    def past_len(model: loader.LoadedModel) -> dict[str, int]:
        seen.append(model.tensors["past"].shape)
        return {"past_len": 5}

    pinned = load_model(cache_model(), dims=dims, batch=batch, more_dims=past_len)
    assert len(parses) == 1 and seen == [(2, "past_len", 16)]
    assert pinned.dims_added == {"past_len": 5} and not reference.dims_added
    assert pinned.tensors == reference.tensors and pinned.warnings == reference.warnings
    assert pinned.tensors["scores"].shape == (2, 3, 8)  # past_len + seq
    assert pinned.proto.SerializeToString() == reference.proto.SerializeToString()
    unchanged = load_model(cache_model(), dims=dims, batch=batch, more_dims=lambda _: {})
    assert unchanged.tensors == fresh.tensors and not unchanged.dims_added
    assert unchanged.proto.SerializeToString() == fresh.proto.SerializeToString()


@pytest.mark.parametrize(("dims", "error", "message"), [
    ({"sequence": 4}, ShapeError, "--dim sequence: the model has no symbolic dim 'sequence'; "
     "its symbolic dims are batch, seq, past_len"),
    ({"seq": -1}, UsageError, "--dim seq=-1: the value must be an integer >= 0"),
    ({"seq": 1.5}, UsageError, "--dim seq=1.5: the value must be an integer >= 0"),
    ({"batch": 0, "seq": 1, "past_len": 2**40}, ShapeError,  # 0 bytes, but that dim
     "input 'past': dimension 1,099,511,627,776 in shape 0x1099511627776x16 is over the"),
])
def test_bad_dims(dims: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        load_model(cache_model(), dims=dims, max_tensor_bytes=2**30)


def test_parse_dim_spec() -> None:
    assert parse_dim_spec("past_sequence_length=0") == ("past_sequence_length", 0)
    assert parse_dim_spec("a=b=3") == ("a=b", 3)
    for bad in ("seq", "=3", "seq=x", "seq=-2"):
        with pytest.raises(UsageError, match="--dim"):
            parse_dim_spec(bad)


def test_batch_pins_every_shape() -> None:
    model = load_model(dynamic_model(), batch=4)
    assert shapes(model, "c", "flat", "y") == {"c": (4, 8, 30, 30), "flat": (4, 7200),
                                               "y": (4, 10)}
    assert all(t.known for t in model.tensors.values())
    assert model.warnings == []


def test_input_shapes_pin_every_shape() -> None:
    model = load_model(dynamic_model(), input_shapes={"x": (2, 3, 32, 32)})
    assert shapes(model, "r", "flat", "y") == {"r": (2, 8, 30, 30), "flat": (2, 7200),
                                               "y": (2, 10)}
    assert all(t.known for t in model.tensors.values())


def test_pinned_costs() -> None:
    result = onnxlens.analyze(dynamic_model(), batch=4)
    assert result.node_costs["conv"].cost.macs == 4 * 8 * 30 * 30 * 3 * 3 * 3
    assert result.node_costs["fc"].cost.macs == 4 * 7200 * 10
    assert result.totals["complete"] is True


def test_batch_replaces_the_batch_symbol_everywhere_and_nothing_else() -> None:
    nodes = [helper.make_node("Mul", ["x", "mask"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "scale"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["n", 5]),
                                           vi("mask", TensorProto.FLOAT, ["n", 1]),
                                           vi("scale", TensorProto.FLOAT, [1])],
                              [vi("y", TensorProto.FLOAT, ["n", 5])])
    model = load_model(helper.make_model(graph, opset_imports=OPSET), batch=3)
    assert shapes(model, "x", "mask", "scale", "y") == {"x": (3, 5), "mask": (3, 1),
                                                        "scale": (1,), "y": (3, 5)}
    assert model.warnings == []


def test_batch_on_a_static_model_overrides_with_a_warning() -> None:
    model = load_model(conv_model(), batch=2)
    assert shapes(model, "x", "y") == {"x": (2, 3, 8, 8), "y": (2, 16, 6, 6)}
    assert model.warnings == ["input 'x': batch dim was fixed at 1; analyzed at 2"]


def test_pinning_does_not_change_the_callers_proto() -> None:
    proto = dynamic_model()
    before = proto.SerializeToString()
    load_model(proto, batch=4)
    assert proto.SerializeToString() == before
    assert shapes(load_model(proto), "x")["x"] == ("batch", 3, 32, 32)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch": 0}, "--batch 0: the batch must be a positive integer"),
    ({"batch": True}, "--batch True"),
    ({"input_shapes": {"x": (-1, 3, 32, 32)}}, "--input-shape x: dims must be integers >= 0"),
    ({"input_shapes": {"x": "1x3x32x32"}}, "--input-shape x: dims must be integers >= 0"),
    ({"max_tensor_bytes": 0}, "--max-tensor-bytes 0"),
])
def test_bad_requests(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_model(dynamic_model(), **kwargs)  # type: ignore[arg-type]


def test_tensor_budget_names_the_tensor() -> None:
    with pytest.raises(ShapeError, match=r"tensor 'c': shape 16x8x30x30 needs 460,800 bytes"):
        load_model(dynamic_model(), batch=16, max_tensor_bytes=300_000)


def test_parse_shape_spec() -> None:
    assert parse_shape_spec("input.1=1x3X224x224") == ("input.1", (1, 3, 224, 224))
    assert parse_shape_spec("past=1x2x0x16") == ("past", (1, 2, 0, 16))  # an empty KV cache
    for bad in ("1x3", "x=", "x=1xa", "x=-1x3"):
        with pytest.raises(UsageError):
            parse_shape_spec(bad)


# ---- shape inference: onnx first, ORT's symbolic inference for the rest ------------------------


def test_symbolic_dims_stay_symbolic_and_ort_fills_the_reshape() -> None:
    # onnx's data propagation leaves Reshape's -1 unknown while batch is symbolic...
    onnx_only = onnx.shape_inference.infer_shapes(dynamic_model(), data_prop=True)
    flat = next(v for v in onnx_only.graph.value_info if v.name == "flat")
    assert not flat.type.tensor_type.shape.dim[1].HasField("dim_value")
    # ... and ORT's symbolic inference computes it.
    model = load_model(dynamic_model())
    assert shapes(model, "x", "c", "flat", "y") == {
        "x": ("batch", 3, 32, 32), "c": ("batch", 8, 30, 30), "flat": ("batch", 7200),
        "y": ("batch", 10)}


def test_ort_infers_what_onnx_cannot() -> None:
    model = one_op_then_conv("FastGelu", "com.microsoft")
    onnx_only = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    assert not any(v.name == "c" for v in onnx_only.graph.value_info)
    loaded = load_model(model)
    assert shapes(loaded, "c", "y") == {"c": (1, 3, 8, 8), "y": (1, 4, 6, 6)}
    assert onnxlens.analyze(model).node_costs["conv"].cost.macs == 4 * 6 * 6 * 3 * 3 * 3


def test_shapes_neither_can_infer_are_unknown_and_named() -> None:
    result = onnxlens.analyze(one_op_then_conv("Mystery", "example.custom"))
    assert result.model.tensors["c"].shape is None  # not ORT's guessed rank
    conv = result.node_costs["conv"]
    assert conv.cost is None and "'y'" in conv.unknown_reason
    assert conv.unknown is Unknown.SHAPE
    custom = result.node_costs["custom"]
    assert custom.cost is None and custom.unknown is Unknown.NO_FORMULA
    assert custom.unknown_reason == "no cost formula for Mystery"
    assert result.totals["complete"] is False
    # The warning names the nodes of unknown shape, not the unsupported op (its own warning).
    shape_warning = next(w for w in result.warnings if "unknown shapes" in w)
    assert "'y'" in shape_warning and "custom (" not in shape_warning


def test_symbolic_inference_is_skipped_on_big_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "SYMBOLIC_INFERENCE_MAX_NODES", 3)
    model = load_model(dynamic_model())
    assert shapes(model, "flat")["flat"] == ("batch", None)
    assert model.warnings == ["some shapes are unknown; ONNX Runtime's symbolic shape inference "
                              "is skipped on models over 3 nodes (slow): pin the dims with "
                              "--batch or --input-shape"]
    assert all(t.known for t in load_model(dynamic_model(), batch=2).tensors.values())


def test_a_runtime_shape_input_loads_with_unknown_dims() -> None:
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [2, 3]),
                                           vi("s", TensorProto.INT64, [2])],
                              [vi("y", TensorProto.FLOAT, [None, None])])
    model = load_model(helper.make_model(graph, opset_imports=OPSET))
    assert model.tensors["y"].shape is None  # rank 2 known, no dim: nothing to cost with


def test_stale_recorded_shapes_are_replaced_with_a_warning() -> None:
    model = conv_model()
    model.graph.value_info.append(vi("c", TensorProto.FLOAT, [1, 16, 7, 7]))
    loaded = load_model(model)
    assert shapes(loaded, "c")["c"] == (1, 16, 6, 6)
    assert loaded.warnings == ["shapes recorded in the model are stale: tensor 'c' recorded as "
                               "1x16x7x7, inferred 1x16x6x6; inferred shapes used"]


def test_inferred_types_are_written_to_the_returned_proto() -> None:
    loaded = load_model(dynamic_model(), batch=4)
    recorded = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in (*loaded.proto.graph.value_info, *loaded.proto.graph.output)}
    assert recorded["flat"] == [4, 7200] and recorded["y"] == [4, 10]


def test_plain_analysis_imports_no_heavy_module(tmp_path: Path) -> None:
    """`analyze x.onnx` must start fast: no torch, and no sympy/ORT when onnx infers it all."""
    path = tmp_path / "conv.onnx"
    onnx.save(conv_model(), path)
    code = ("import sys, onnxlens; onnxlens.analyze(sys.argv[1]); "
            "print(sorted(m for m in ('torch', 'sympy', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_incomplete_symbolic_inference_writes_nothing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # ORT's `infer_shapes` saves `sym_shape_infer_temp.onnx` into the working directory when its
    # loop ends with a shape unknown; the loader must not let it. Make every pass end so.
    engine = loader._ort_symbolic_shape_infer().SymbolicShapeInference
    monkeypatch.setattr(engine, "_infer_impl", lambda self: setattr(self, "run_", False) or False)
    monkeypatch.chdir(tmp_path)
    result = onnxlens.analyze(one_op_then_conv("Mystery", "example.custom"))
    assert list(tmp_path.iterdir()) == []
    assert "ONNX Runtime's symbolic shape inference gave up: some shapes stay unknown" \
        in result.warnings


def test_backends_read_the_weights_from_their_file(tmp_path: Path) -> None:
    """ORT (given the path) and native-cpu (through `initializer_array`) run a model whose
    weights stayed in their file, and agree with numpy on the saved values."""
    pytest.importorskip("onnxlens.backends._native")
    from onnxlens.backends.native_cpu import NativeCpuBackend
    from onnxlens.backends.ort import OrtBackend

    model = matmul_model(64, 128)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, size_threshold=0,
              location="weights.bin")
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    expected = x @ weights["w"] + weights["b"]
    for backend in (OrtBackend("cpu"), NativeCpuBackend(1)):
        backend.prepare(tmp_path / "model.onnx")
        np.testing.assert_allclose(backend.run({"x": x})["y"], expected, rtol=1e-5, atol=1e-5)


def test_dim_on_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from onnxlens.cli import app

    onnx.save(cache_model(), tmp_path / "cache.onnx")
    out = tmp_path / "a.json"
    run = CliRunner().invoke(app, ["analyze", str(tmp_path / "cache.onnx"), "--dim", "batch=2",
                                   "--dim", "seq=3", "--dim", "past_len=0", "--json", str(out)])
    assert run.exit_code == 0, run.output
    assert json.loads(out.read_text())["totals"]["macs"] == _cache_macs(2, 3, 0)
    bad = CliRunner().invoke(app, ["analyze", str(tmp_path / "cache.onnx"), "--dim", "len=4"])
    assert bad.exit_code != 0
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and "no symbolic dim 'len'; its symbolic dims are batch, seq, " \
        "past_len" in lines[0] and "Traceback" not in bad.output


def test_compare_feeds_the_pinned_dims(tmp_path: Path) -> None:
    """compare --dim: the analysis and the inputs made for every backend take the pinned dims
    (an empty cache included), and the backends agree."""
    pytest.importorskip("onnxlens.backends._native")
    from onnxlens.backends.compare import compare

    model = cache_model()
    model.ir_version = 8  # what ORT runs
    onnx.save(model, tmp_path / "cache.onnx")
    dims = {"batch": 2, "seq": 3, "past_len": 0}
    result = compare(tmp_path / "cache.onnx", ["ort-cpu", "native-cpu"], runs=2, warmup=0,
                     profile_runs=1, samples=2, memory=False, dims=dims)
    assert result.analysis.totals["macs"] == _cache_macs(2, 3, 0)
    assert set(result.runs) == {"ort-cpu", "native-cpu"}, result.unavailable
    assert result.agreements and result.agreements[0].samples == 2
    assert all(a.passed for a in result.agreements)
    assert result.to_dict()["settings"]["dims"] == dims


def test_ort_default_domain_ops_are_those_ort_registers_and_onnx_lacks() -> None:
    """The loader's list of ONNX Runtime's own default-domain ops, against ORT's schemas."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    from onnxlens.analyzer.loader import ORT_DEFAULT_DOMAIN_OPS

    registered = {s.name for s in ort_state.get_all_operator_schema()
                  if s.domain in ("", "ai.onnx") and not onnx.defs.has(s.name)}
    assert registered == ORT_DEFAULT_DOMAIN_OPS


def test_an_ort_default_domain_op_loads_with_a_warning() -> None:
    """SimplifiedLayerNormalization (RMSNorm) in the default domain: the checker would refuse
    it; it loads, its shape comes from ORT's symbolic inference, its cost from RMSNorm's
    formula (x / sqrt(mean(x²) + eps) · scale: 4n + 3 FLOPs per row of n, 4 rows of 8)."""
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1,
                          epsilon=1e-6, name="rms")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = onnxlens.analyze(model)
    assert result.model.tensors["y"].shape == (4, 8)
    assert any("SimplifiedLayerNormalization" in w for w in result.warnings)
    assert not result.incomplete and not result.unsupported_ops
    assert result.total.other_flops == 4 * (4 * 8 + 3)
