"""Bad input, each generated here: one clear error line, a non-zero exit, no traceback.

Every case runs twice: through the Python API (`onnxlens.analyze` raises exactly the expected
`OnnxLensError` subclass, with a message naming the file, node, tensor or field) and through
the `analyze` command (non-zero exit, stderr exactly one line starting with "error:").
External-data cases also prove, with an audit hook on "open", that nothing outside the model's
folder was opened: each has a sentinel file in a sibling folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.errors import (
    ExternalDataError,
    InvalidModelError,
    ModelLoadError,
    OnnxLensError,
    ShapeError,
    UsageError,
)

vi = helper.make_tensor_value_info


# ---- tiny models ------------------------------------------------------------------------------


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto] | None = None,
           opsets: tuple[tuple[str, int], ...] = (("", 17),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bad", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _weights(shape: tuple[int, ...] = (4, 3, 3, 3), name: str = "w") -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def conv_model(w: onnx.TensorProto | None = None, x_shape: list[Any] | None = None
               ) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv(w[4,3,3,3]) -> Relu -> y[1,4,6,6]."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [vi("x", TensorProto.FLOAT, x_shape or [1, 3, 8, 8])],
                  [vi("y", TensorProto.FLOAT, [None] * 4)], [w or _weights()])


def chain(*links: tuple[str, list[str], str, str]) -> onnx.ModelProto:
    """Nodes given as (op_type, inputs, output, name), from x[2,3] to y[2,3]."""
    nodes = [helper.make_node(op, ins, [out], name=name) for op, ins, out, name in links]
    return _model(nodes, [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])


def external(model: onnx.ModelProto, **entries: str | int) -> onnx.ModelProto:
    """`model` with initializer w's data moved out to the file and place `entries` say."""
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in entries.items():
        w.external_data.add(key=key, value=str(value))
    return model


W_BYTES = 4 * 3 * 3 * 3 * 4  # conv_model's w: 108 float32


# ---- cases ------------------------------------------------------------------------------------


@dataclass
class Call:
    """What one case feeds to `onnxlens.analyze`, and to the CLI (None: not expressible)."""

    source: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    cli: list[str] | None = None


@dataclass
class Folders:
    """A model's folder and, beside it, a folder it must never read (holding the sentinel)."""

    model: Path
    outside: Path

    @property
    def sentinel(self) -> Path:
        return self.outside / "secret.bin"

    def save(self, model: onnx.ModelProto, name: str = "model.onnx", **kwargs: Any) -> Call:
        path = self.model / name
        path.write_bytes(model.SerializeToString())
        cli = [str(path)]
        for key, value in kwargs.items():
            if key == "batch":
                cli += ["--batch", str(value)]
            elif key == "input_shapes":
                cli += [f"--input-shape={n}={'x'.join(map(str, s))}" for n, s in value.items()]
        return Call(path, kwargs, cli)

    def write(self, data: bytes, name: str = "model.onnx") -> Call:
        path = self.model / name
        path.write_bytes(data)
        return Call(path, {}, [str(path)])


Build = Callable[[Folders], Call]


@dataclass
class Case:
    id: str
    build: Build
    error: type[OnnxLensError]
    fragment: str  # a piece of the message that names the problem


def _valid_bytes() -> bytes:
    return conv_model().SerializeToString()


def _truncated(f: Folders) -> Call:
    data = _valid_bytes()
    return f.write(data[: len(data) // 2])


def _missing(f: Folders) -> Call:
    path = f.model / "missing.onnx"
    return Call(path, {}, [str(path)])


def _directory(f: Folders) -> Call:
    path = f.model / "dir.onnx"
    path.mkdir()
    return Call(path, {}, [str(path)])


def _cycle(f: Folders) -> Call:
    # add reads t2, which relu makes from add's own output.
    nodes = [helper.make_node("Add", ["x", "t2"], ["t1"], name="add"),
             helper.make_node("Relu", ["t1"], ["t2"], name="relu"),
             helper.make_node("Identity", ["t2"], ["y"], name="out")]
    return f.save(_model(nodes, [vi("x", TensorProto.FLOAT, [2])],
                         [vi("y", TensorProto.FLOAT, [2])]))


def _self_loop(f: Folders) -> Call:
    return f.save(chain(("Add", ["x", "y"], "y", "loop")))


def _dangling(f: Folders) -> Call:
    return f.save(chain(("Add", ["x", "ghost"], "y", "reader")))


def _produced_twice(f: Folders) -> Call:
    return f.save(chain(("Relu", ["x"], "t", "one"), ("Neg", ["x"], "t", "two"),
                        ("Identity", ["t"], "y", "out")))


def _shadows_input(f: Folders) -> Call:
    return f.save(chain(("Relu", ["x"], "x", "shadow"), ("Identity", ["x"], "y", "out")))


def _output_unproduced(f: Folders) -> Call:
    return f.save(chain(("Relu", ["x"], "t", "r")))


def _initializer_twice(f: Folders) -> Call:
    model = conv_model()
    model.graph.initializer.append(_weights())
    return f.save(model)


def _unknown_op(f: Folders) -> Call:
    return f.save(chain(("NoSuchOp", ["x"], "y", "mystery")))


def _bad_attribute(f: Folders) -> Call:
    model = chain(("Relu", ["x"], "y", "r"))
    model.graph.node[0].attribute.append(helper.make_attribute("alpha_typo", 1.0))
    return f.save(model)


def _output_without_shape(f: Folders) -> Call:
    model = conv_model()
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return f.save(model)


def _unknown_dtype(f: Folders) -> Call:
    model = conv_model()
    model.graph.initializer[0].data_type = 99
    return f.save(model)


def _short_raw_data(big: bool) -> Build:
    # The small w is checked by onnx's checker, the big one (left out of the light copy that
    # onnx checks) by us.
    def build(f: Folders) -> Call:
        w = _weights((512, 3, 3, 3) if big else (4, 3, 3, 3))
        w.raw_data = w.raw_data[:-4]
        model = conv_model(w)
        if big:
            model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 512
        return f.save(model)

    return build


def _huge_input(f: Folders) -> Call:
    return f.save(conv_model(x_shape=[2**40, 3, 8, 8]))


def _huge_initializer(f: Folders) -> Call:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**40, 3, 3, 3])
    return f.save(conv_model(w))


def _huge_inferred(f: Folders) -> Call:
    # The shape is computed (no constant input asks for it): only inference finds the size.
    side = numpy_helper.from_array(np.array([2**20], np.int64), "side")
    nodes = [helper.make_node("Concat", ["side", "side"], ["shape"], name="shape", axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
             helper.make_node("ReduceSum", ["big"], ["y"], name="sum", keepdims=0)]
    return f.save(_model(nodes, [], [vi("y", TensorProto.FLOAT, [])], [side]))


def _negative_input_dim(f: Folders) -> Call:
    return f.save(conv_model(x_shape=[1, -3, 8, 8]))


def _negative_initializer_dim(f: Folders) -> Call:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, -3, 3, 3])
    return f.save(conv_model(w))


def _matmul_conflict(f: Folders) -> Call:
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    return f.save(_model(nodes, [vi("a", TensorProto.FLOAT, [2, 3]),
                                 vi("b", TensorProto.FLOAT, [4, 5])],
                         [vi("y", TensorProto.FLOAT, [None, None])]))


def _pinned(**kwargs: Any) -> Build:
    return lambda f: f.save(conv_model(x_shape=["batch", 3, 8, 8]), **kwargs)


def _ext(entries: dict[str, str | int], setup: Callable[[Folders], None] | None = None
         ) -> Build:
    def build(f: Folders) -> Call:
        if setup is not None:
            setup(f)
        if not (f.model / "weights.bin").exists() and "location" in entries:
            (f.model / "weights.bin").write_bytes(_weights().raw_data)
        return f.save(external(conv_model(), **entries))

    return build


def _truncated_weights(f: Folders) -> None:
    (f.model / "weights.bin").write_bytes(_weights().raw_data[:-8])


def _symlink_file(f: Folders) -> None:
    (f.model / "weights.bin").symlink_to(f.sentinel)


def _symlink_dir(f: Folders) -> None:
    (f.model / "sub").symlink_to(f.outside, target_is_directory=True)


def _hard_link(f: Folders) -> None:
    os.link(f.sentinel, f.model / "weights.bin")


def _fifo(f: Folders) -> None:
    os.mkfifo(f.model / "weights.bin")


def _bytes_with_external(f: Folders) -> Call:
    (f.model / "weights.bin").write_bytes(_weights().raw_data)
    return Call(external(conv_model(), location="weights.bin").SerializeToString())


def _proto_with_external(f: Folders) -> Call:
    (f.model / "weights.bin").write_bytes(_weights().raw_data)
    return Call(external(conv_model(), location="weights.bin"))



# ---- the validation layer (analyzer/validate.py) ----------------------------------------------


def _const(name: str, values: Any, dtype: Any = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype), name)


def _conv(x_shape: list[Any] | None = None, w_shape: tuple[int, ...] = (4, 3, 3, 3),
          op: str = "Conv", bias: int | None = None, **attrs: Any) -> Build:
    """x -> `op`(w[, b], attrs) -> y, the output's rank recorded only."""
    def build(f: Folders) -> Call:
        x = x_shape or [1, 3, 8, 8]
        inits = [_weights(w_shape)] + ([_weights((bias,), "b")] if bias else [])
        node = helper.make_node(op, ["x", "w"] + (["b"] if bias else []), ["y"], name="conv",
                                **attrs)
        return f.save(_model([node], [vi("x", TensorProto.FLOAT, x)],
                             [vi("y", TensorProto.FLOAT, [None] * len(x))], inits))

    return build


def _pool(op: str = "MaxPool", x_shape: tuple[int, ...] = (1, 3, 8, 8), **attrs: Any) -> Build:
    attrs.setdefault("kernel_shape", [2, 2])
    return lambda f: f.save(_model([helper.make_node(op, ["x"], ["y"], name="pool", **attrs)],
                                   [vi("x", TensorProto.FLOAT, list(x_shape))],
                                   [vi("y", TensorProto.FLOAT, [None] * len(x_shape))]))


def _one_op(op: str, inputs: list[tuple[str, list[Any]]], consts: list[onnx.TensorProto],
            rank: int, elem: int = TensorProto.FLOAT, **attrs: Any) -> Build:
    """One `op` node named 'n' reading graph inputs (name, shape), then constants, and making
    y of rank `rank`."""
    names = [n for n, _ in inputs] + [c.name for c in consts]
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    graph_inputs = [vi(n, elem, s) for n, s in inputs]
    return lambda f: f.save(_model([node], graph_inputs, [vi("y", elem, [None] * rank)], consts))


def _quant(op: str, scale: np.ndarray, zero_point: np.ndarray | None = None,
           x_type: int = TensorProto.FLOAT, **attrs: Any) -> Build:
    """Opset 21 QuantizeLinear or DequantizeLinear 'n' of x [4, 8] with a constant scale
    (and zero point)."""
    consts = [numpy_helper.from_array(scale.astype(np.float32), "s")]
    if zero_point is not None:
        consts.append(numpy_helper.from_array(zero_point, "z"))
    node = helper.make_node(op, ["x"] + [c.name for c in consts], ["y"], name="n", **attrs)
    y_type = (TensorProto.FLOAT if op == "DequantizeLinear" else
              helper.np_dtype_to_tensor_dtype(zero_point.dtype) if zero_point is not None
              else TensorProto.UINT8)
    return lambda f: f.save(_model([node], [vi("x", x_type, [4, 8])], [vi("y", y_type, [4, 8])],
                                   consts, (("", 21),)))


def _int4_weight(packed: bytes) -> Build:
    """DequantizeLinear of a [5, 3] int4 initializer (15 values: 8 packed bytes)."""
    w = TensorProto(name="w", data_type=TensorProto.INT4, dims=[5, 3], raw_data=packed)
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="n")
    scale = numpy_helper.from_array(np.float32(0.5), "s")
    return lambda f: f.save(_model([node], [], [vi("y", TensorProto.FLOAT, [5, 3])], [w, scale],
                                   (("", 21),)))


def _n_bits(b_shape: tuple[int, ...] = (16, 2, 16), a_k: int = 64, **attrs: Any) -> Build:
    """com.microsoft MatMulNBits 'mm': a [1, 3, a_k] x 4-bit B for K 64, N 16, blocks of 32
    (B [16, 2, 16] uint8, 32 scales)."""
    b = numpy_helper.from_array(np.zeros(b_shape, np.uint8), "b")
    scales = numpy_helper.from_array(np.ones(32, np.float32), "s")
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], name="mm",
                            domain="com.microsoft", **{"K": 64, "N": 16, "bits": 4,
                                                       "block_size": 32, **attrs})
    return lambda f: f.save(_model([node], [vi("a", TensorProto.FLOAT, [1, 3, a_k])],
                                   [vi("y", TensorProto.FLOAT, [1, 3, 16])], [b, scales],
                                   (("", 17), ("com.microsoft", 1))))


def _gather_block(**attrs: Any) -> Build:
    """com.microsoft GatherBlockQuantized 'emb': rows [2, 3] of an int4 table [96, 64] uint8
    (K 128, blocks of 32: scales [96, 4])."""
    table = numpy_helper.from_array(np.zeros((96, 64), np.uint8), "t")
    scales = numpy_helper.from_array(np.ones((96, 4), np.float32), "s")
    node = helper.make_node("GatherBlockQuantized", ["t", "ids", "s"], ["y"], name="emb",
                            domain="com.microsoft", **{"bits": 4, "block_size": 32, **attrs})
    return lambda f: f.save(_model([node], [vi("ids", TensorProto.INT64, [2, 3])],
                                   [vi("y", TensorProto.FLOAT, [2, 3, 128])], [table, scales],
                                   (("", 17), ("com.microsoft", 1))))


def _gather(indices: list[int]) -> Build:
    return _one_op("Gather", [("x", [5, 3])], [_const("i", indices)], 2)


def _resize(scales: list[float] | None = None, sizes: list[int] | None = None) -> Build:
    """Resize-13 of x[1,1,4,4]: inputs X, roi (omitted), scales, sizes."""
    if scales is not None:
        names, consts = ["x", "", "scales"], [_const("scales", scales, np.float32)]
    else:
        names, consts = ["x", "", "", "sizes"], [_const("sizes", sizes)]
    node = helper.make_node("Resize", names, ["y"], name="n", mode="nearest")
    return lambda f: f.save(_model([node], [vi("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                                   [vi("y", TensorProto.FLOAT, [None] * 4)], consts))


def _range(start: Any, limit: Any, delta: Any, dtype: Any = np.float32) -> Build:
    return _one_op("Range", [], [_const("start", start, dtype), _const("limit", limit, dtype),
                                 _const("delta", delta, dtype)], 1,
                   elem=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _reshape_constant_node(f: Folders) -> Call:
    """The shape comes from a Constant node, not an initializer."""
    nodes = [helper.make_node("Constant", [], ["shape"], name="k", value_ints=[-1, 2, -1]),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="n")]
    return f.save(_model(nodes, [vi("x", TensorProto.FLOAT, [2, 3, 4])],
                         [vi("y", TensorProto.FLOAT, [None] * 3)]))


def _opsets(*opsets: tuple[str, int]) -> Build:
    return lambda f: f.save(_model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                   [vi("x", TensorProto.FLOAT, [2])],
                                   [vi("y", TensorProto.FLOAT, [2])], opsets=opsets))


def _duplicate_output(f: Folders) -> Call:
    model = chain(("Relu", ["x"], "y", "r"))
    model.graph.output.append(model.graph.output[0])
    return f.save(model)


LOCAL = helper.make_opsetid("local", 1)


def _function(name: str, body: list[onnx.NodeProto]) -> onnx.FunctionProto:
    return helper.make_function("local", name, ["a"], ["b"], body,
                                [helper.make_opsetid("", 17), LOCAL])


def _calls(callee: str) -> list[onnx.NodeProto]:
    return [helper.make_node(callee, ["a"], ["b"], domain="local")]


def _with_functions(functions: list[onnx.FunctionProto]) -> Build:
    def build(f: Folders) -> Call:
        node = helper.make_node(functions[0].name, ["x"], ["y"], domain="local", name="call")
        graph = helper.make_graph([node], "g", [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                                  [vi("y", TensorProto.FLOAT, [None] * 4)])
        return f.save(helper.make_model(graph, functions=functions,
                                        opset_imports=[helper.make_opsetid("", 17), LOCAL]))

    return build


def _function_chain(length: int) -> list[onnx.FunctionProto]:
    return [_function(f"F{i}", _calls(f"F{i + 1}") if i < length - 1 else
                      [helper.make_node("Relu", ["a"], ["b"])]) for i in range(length)]


def _calls_in_turn(callee: str, times: int) -> list[onnx.NodeProto]:
    """a -> callee -> callee ... (`times` calls) -> b."""
    names = ["a", *(f"t{i}" for i in range(times - 1)), "b"]
    return [helper.make_node(callee, [names[i]], [names[i + 1]], domain="local")
            for i in range(times)]


def _function_tree(length: int, times: int = 2) -> list[onnx.FunctionProto]:
    """F0 calls F1 `times` times, F1 calls F2 as often ...: times**(length - 1) Relu nodes of
    a file a few hundred bytes long."""
    return [_function(f"F{i}", _calls_in_turn(f"F{i + 1}", times) if i < length - 1 else
                      [helper.make_node("Relu", ["a"], ["b"])]) for i in range(length)]


def _branch_tree(length: int) -> list[onnx.FunctionProto]:
    """F_i holds an If whose two branches each call F_(i+1) twice: shape inference infers both
    branches, so each level multiplies the work by 4."""
    def body(i: int) -> list[onnx.NodeProto]:
        if i == length - 1:
            return [helper.make_node("Relu", ["a"], ["b"])]
        branches = {}
        for branch in ("then_branch", "else_branch"):
            calls = [helper.make_node(f"F{i + 1}", ["a"], [f"{branch}0"], domain="local"),
                     helper.make_node(f"F{i + 1}", [f"{branch}0"], [f"{branch}1"],
                                      domain="local")]
            branches[branch] = helper.make_graph(calls, branch, [],
                                                 [vi(f"{branch}1", TensorProto.FLOAT, None)])
        return [helper.make_node("Constant", [], ["c"], value=helper.make_tensor(
                    "c", TensorProto.BOOL, [], [True])),
                helper.make_node("If", ["c"], ["b"], **branches)]

    return [_function(f"F{i}", body(i)) for i in range(length)]


def _nested_ifs(depth: int) -> onnx.ModelProto:
    """If nodes nested `depth` deep (in their then_branch), built in place: protobuf refuses to
    parse messages nested that deep, so neither bytes nor helper.make_node can hold them."""
    model = onnx.ModelProto(ir_version=8)
    model.opset_import.add(domain="", version=17)
    graph, out = model.graph, "y"
    graph.name = "g"
    graph.input.extend([vi("x", TensorProto.FLOAT, [2]), vi("c", TensorProto.BOOL, [])])
    graph.output.extend([vi("y", TensorProto.FLOAT, [2])])
    for i in range(depth):
        node = graph.node.add(op_type="If", name=f"if{i}", input=["c"], output=[out])
        then = node.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH)
        other = node.attribute.add(name="else_branch", type=onnx.AttributeProto.GRAPH)
        other.g.name = f"else{i}"
        other.g.node.add(op_type="Relu", input=["x"], output=[f"e{i}"])
        other.g.output.extend([vi(f"e{i}", TensorProto.FLOAT, [2])])
        graph, out = then.g, f"t{i}"
        graph.name = f"then{i}"
        graph.output.extend([vi(out, TensorProto.FLOAT, [2])])
    graph.node.add(op_type="Relu", name="leaf", input=["x"], output=[out])
    return model


def _deep_ifs_proto(f: Folders) -> Call:
    return Call(_nested_ifs(33))


def _conv_in_if_body(f: Folders) -> Call:
    def body(name: str, **attrs: Any) -> onnx.GraphProto:
        conv = helper.make_node("Conv", ["x", "w"], [name], name=name, **attrs)
        return helper.make_graph([conv], name, [], [vi(name, TensorProto.FLOAT, [None] * 4)])

    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=body("bad", strides=[0, 1]),
                            else_branch=body("good"))
    return f.save(_model([node], [vi("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                  vi("c", TensorProto.BOOL, [])],
                         [vi("y", TensorProto.FLOAT, [None] * 4)], [_weights()]))


CASES = [
    # Files that are not ONNX models.
    Case("missing file", _missing, ModelLoadError, "missing.onnx: no such file"),
    Case("directory", _directory, ModelLoadError, "dir.onnx: a directory"),
    Case("empty file", lambda f: f.write(b""), ModelLoadError, "model.onnx: empty"),
    Case("truncated model", _truncated, ModelLoadError, "model.onnx: not an ONNX model, or "
         "truncated"),
    Case("random bytes", lambda f: f.write(np.random.default_rng(0).bytes(4096)),
         ModelLoadError, "model.onnx: not an ONNX model"),
    Case("text file", lambda f: f.write(b"graph {\n  node: relu\n}\n"), ModelLoadError,
         "model.onnx: not an ONNX model"),
    Case("png header", lambda f: f.write(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(64)),
         ModelLoadError, "model.onnx: not an ONNX model"),
    Case("zip archive", lambda f: f.write(b"PK\x03\x04" + bytes(64)), ModelLoadError,
         "a zip archive"),
    Case("protobuf without graph", lambda f: f.write(b"\x08\x07"), ModelLoadError,
         "no ir_version or no graph"),
    # Graph structure.
    Case("cycle", _cycle, InvalidModelError, "graph has a cycle: nodes 'add' -> 'relu' -> 'add'"),
    Case("node reads its own output", _self_loop, InvalidModelError,
         "graph has a cycle: nodes 'loop' -> 'loop'"),
    Case("dangling input", _dangling, InvalidModelError,
         "node 'reader' reads tensor 'ghost', which no node, graph input or initializer"),
    Case("tensor produced twice", _produced_twice, InvalidModelError,
         "tensor 't' is produced twice, by node 'one' and node 'two'"),
    Case("node output shadows a graph input", _shadows_input, InvalidModelError,
         "tensor 'x' is a graph input and is also produced by node 'shadow'"),
    Case("graph output produced by no node", _output_unproduced, InvalidModelError,
         "graph output 'y' is produced by no node"),
    Case("initializer defined twice", _initializer_twice, InvalidModelError,
         "initializer 'w' is defined twice"),
    Case("unknown op in the default domain", _unknown_op, InvalidModelError,
         "node 'mystery' (NoSuchOp): No Op registered for NoSuchOp"),
    Case("unknown attribute", _bad_attribute, InvalidModelError,
         "node 'r' (Relu): Unrecognized attribute: alpha_typo"),
    Case("graph output without a shape", _output_without_shape, InvalidModelError,
         "graph output 'y' has no shape"),
    Case("unknown data type", _unknown_dtype, InvalidModelError,
         "initializer 'w': unknown data type 99"),
    Case("raw data too short (small initializer)", _short_raw_data(big=False),
         InvalidModelError, "(tensor name: w) raw_data size (428 bytes) is too small"),
    Case("raw data too short (big initializer)", _short_raw_data(big=True), InvalidModelError,
         "initializer 'w': TensorProto (tensor name: w) raw_data size"),
    # Sizes and shapes.
    Case("input dim 2**40", _huge_input, ShapeError,
         "input 'x': shape 1099511627776x3x8x8 needs 844,424,930,131,968 bytes, over the"),
    Case("initializer dim 2**40", _huge_initializer, ShapeError,
         "initializer 'w': shape 1099511627776x3x3x3 needs"),
    Case("inferred tensor too big", _huge_inferred, ShapeError,
         "tensor 'big': shape 1048576x1048576 needs"),
    Case("negative input dim", _negative_input_dim, ShapeError,
         "input 'x': negative dimension -3"),
    Case("negative initializer dim", _negative_initializer_dim, ShapeError,
         "initializer 'w': negative dimension -3"),
    Case("MatMul shape conflict", _matmul_conflict, ShapeError,
         "node 'mm' (MatMul): Incompatible dimensions for matrix multiplication "
         "(inputs 'a' 2x3, 'b' 4x5)"),
    Case("--input-shape names no input", _pinned(input_shapes={"image": (1, 3, 8, 8)}),
         ShapeError, "--input-shape image: the model has no input 'image'; its inputs are 'x'"),
    Case("--input-shape of the wrong rank", _pinned(input_shapes={"x": (1, 3, 8)}), ShapeError,
         "--input-shape x: rank 3 given, but input 'x' has rank 4"),
    Case("--batch 0", _pinned(batch=0), UsageError, "--batch"),
    Case("--input-shape with a negative dim", _pinned(input_shapes={"x": (-1, 3, 8, 8)}),
         UsageError, "--input-shape x: dims must be integers >= 0"),
    # External data.
    Case("external '..'", _ext({"location": "../outside/secret.bin"}), ExternalDataError,
         "tensor 'w': external data location '../outside/secret.bin' contains '..'"),
    Case("external 'sub/../../x'", _ext({"location": "sub/../../outside/secret.bin"}),
         ExternalDataError, "location 'sub/../../outside/secret.bin' contains '..'"),
    Case("external absolute path", lambda f: _ext({"location": str(f.sentinel)})(f),
         ExternalDataError, "secret.bin' is absolute"),
    Case("external symlink to a file outside", _ext({"location": "weights.bin"}, _symlink_file),
         ExternalDataError, "location 'weights.bin' leads out of the model's folder"),
    Case("external symlinked folder", _ext({"location": "sub/secret.bin"}, _symlink_dir),
         ExternalDataError, "location 'sub/secret.bin' leads out of the model's folder"),
    Case("external hard link", _ext({"location": "weights.bin"}, _hard_link), ExternalDataError,
         "file 'weights.bin' has other hard links"),
    Case("external FIFO", _ext({"location": "weights.bin"}, _fifo), ExternalDataError,
         "location 'weights.bin' is not a regular file"),
    Case("external negative offset", _ext({"location": "weights.bin", "offset": -4}),
         ExternalDataError, "tensor 'w': external data offset -4 is negative"),
    Case("external negative length", _ext({"location": "weights.bin", "length": -1}),
         ExternalDataError, "tensor 'w': external data length -1 is negative"),
    Case("external offset past the end", _ext({"location": "weights.bin", "offset": 10_000}),
         ExternalDataError, f"offset 10000 is past the end of 'weights.bin' ({W_BYTES} bytes)"),
    Case("external length past the end",
         _ext({"location": "weights.bin", "offset": 8, "length": W_BYTES}), ExternalDataError,
         f"offset 8 + length {W_BYTES} runs past the end of 'weights.bin'"),
    Case("external data file truncated",
         _ext({"location": "weights.bin"}, _truncated_weights), ExternalDataError,
         f"tensor 'w': external data: {W_BYTES - 8} bytes at offset 0 of 'weights.bin' "
         f"({W_BYTES - 8} bytes), but its shape 4x3x3x3 of float needs {W_BYTES}"),
    Case("external length shorter than the shape",
         _ext({"location": "weights.bin", "offset": 0, "length": 100}), ExternalDataError,
         f"tensor 'w': external data: 100 bytes at offset 0 of 'weights.bin' ({W_BYTES} "
         f"bytes), but its shape 4x3x3x3 of float needs {W_BYTES}"),
    Case("external offset not a number", _ext({"location": "weights.bin", "offset": "1e3"}),
         ExternalDataError, "tensor 'w': external data offset '1e3' is not an integer"),
    Case("external unknown key", _ext({"location": "weights.bin", "url": "http://x"}),
         ExternalDataError, "tensor 'w': external data has unknown key 'url'"),
    Case("external no location", _ext({"offset": 0}), ExternalDataError,
         "tensor 'w': external data has no location"),
    Case("external data file missing", _ext({"location": "gone.bin"}), ExternalDataError,
         "file 'gone.bin' not found next to the model"),
    Case("external data as bytes without base_dir", _bytes_with_external, ExternalDataError,
         "model was given without a folder: pass base_dir"),
    Case("external data as a proto without base_dir", _proto_with_external, ExternalDataError,
         "model was given without a folder: pass base_dir"),
    # Window attributes of Conv and pooling, before shape inference.
    Case("Conv strides 0", _conv(strides=[0, 1]), InvalidModelError,
         "node 'conv' (Conv): attribute strides = [0, 1]: 0 is not positive"),
    Case("Conv negative strides", _conv(strides=[1, -2]), InvalidModelError,
         "attribute strides = [1, -2]: -2 is not positive"),
    Case("Conv dilations 0", _conv(dilations=[0, 0]), InvalidModelError,
         "node 'conv' (Conv): attribute dilations = [0, 0]: 0 is not positive"),
    Case("Conv negative pads", _conv(pads=[-1, 0, 0, 0]), InvalidModelError,
         "node 'conv' (Conv): attribute pads = [-1, 0, 0, 0]: -1 is negative"),
    Case("Conv pads 2**62", _conv(pads=[2**62, 0, 0, 0]), InvalidModelError,
         "attribute pads = [4611686018427387904, 0, 0, 0]: 4,611,686,018,427,387,904 is over "
         "the limit of 2,147,483,647 (Limits.max_window_value)"),
    Case("Conv odd pads", _conv(pads=[1, 1, 1]), InvalidModelError,
         "attribute pads = [1, 1, 1]: an odd count (3)"),
    Case("Conv attributes of different ranks", _conv(strides=[1, 1, 1], kernel_shape=[3, 3]),
         InvalidModelError,
         "attributes disagree on the number of spatial axes: kernel_shape 2, strides 3"),
    Case("Conv kernel_shape 0", _conv(kernel_shape=[0, 3]), InvalidModelError,
         "attribute kernel_shape = [0, 3]: 0 is not positive"),
    Case("Conv group 0", _conv(group=0), InvalidModelError,
         "node 'conv' (Conv): attribute group = 0: must be between 1 and 2,147,483,647"),
    Case("Conv negative group", _conv(group=-3), InvalidModelError, "attribute group = -3"),
    Case("MaxPool strides 0", _pool(strides=[0, 0]), InvalidModelError,
         "node 'pool' (MaxPool): attribute strides = [0, 0]: 0 is not positive"),
    Case("AveragePool pads 2**40", _pool("AveragePool", pads=[2**40] * 4), InvalidModelError,
         "node 'pool' (AveragePool): attribute pads = [1099511627776, "),
    Case("ConvTranspose negative output_padding",
         _conv(w_shape=(3, 2, 3, 3), op="ConvTranspose", output_padding=[-1, 0]),
         InvalidModelError, "(ConvTranspose): attribute output_padding = [-1, 0]: -1 is negative"),
    Case("ConvTranspose strides 2**40 (output overflow)",
         _conv(w_shape=(3, 2, 3, 3), op="ConvTranspose", strides=[2**40, 1]), InvalidModelError,
         "attribute strides = [1099511627776, 1]: 1,099,511,627,776 is over the limit"),
    # Channel and group arithmetic, output sizes, on inferred shapes.
    Case("Conv C != W[1] * group", _conv(group=3), ShapeError,
         "node 'conv' (Conv): input 'x' has 3 channels, but weight 'w' [4, 3, 3, 3] with group 3 "
         "takes 3 x 3 = 9"),
    Case("Conv M % group != 0", _conv(w_shape=(4, 1, 3, 3), group=3), ShapeError,
         "weight 'w' [4, 1, 3, 3] has 4 output channels, not a multiple of group 3"),
    Case("Conv kernel_shape differs from the weight", _conv(kernel_shape=[5, 5]), ShapeError,
         "attribute kernel_shape = [5, 5] does not match weight 'w' [4, 3, 3, 3]"),
    Case("Conv kernel_shape of the wrong rank", _conv(kernel_shape=[3]), ShapeError,
         "node 'conv' (Conv): Attribute kernel_shape has incorrect size"),
    Case("Conv bias of the wrong length", _conv(bias=7), ShapeError,
         "bias 'b' [7] should be [4], one value per output channel"),
    Case("Conv output size 0", _conv(x_shape=[1, 3, 2, 2]), ShapeError,
         "output spatial dim 0 would be 0: the window (kernel 3, dilation 1) is larger than the "
         "padded input (2 + pads 0 + 0)"),
    Case("Conv dilated window past the input", _conv(dilations=[4, 1]), ShapeError,
         "output spatial dim 0 would be 0: the window (kernel 3, dilation 4)"),
    Case("AveragePool output size negative", _pool("AveragePool", (1, 1, 4, 4),
                                                   kernel_shape=[20, 20]), ShapeError,
         "node 'pool' (AveragePool): output spatial dim 0 would be -15"),
    Case("ConvTranspose C != W[0]", _conv(w_shape=(2, 2, 3, 3), op="ConvTranspose"), ShapeError,
         "(ConvTranspose): input 'x' has 3 channels, but weight 'w' [2, 2, 3, 3] takes 2"),
    Case("Gemm inner dimensions differ",
         _one_op("Gemm", [("a", [2, 3]), ("b", [4, 5])], [], 2), ShapeError,
         "node 'n' (Gemm): Dimension mismatch in unification between 4 and 3 (inputs 'a' 2x3, "
         "'b' 4x5)"),
    Case("Gemm transB inner dimensions differ",
         _one_op("Gemm", [("a", [2, 3])], [_weights((5, 4), "b")], 2, transB=1), ShapeError,
         "node 'n' (Gemm): Dimension mismatch in unification between 4 and 3"),
    Case("Gather index past the end", _gather([0, 7]), InvalidModelError,
         "node 'n' (Gather): index 7 in constant input 'i' is out of range for axis 0 of 'x' "
         "(size 5)"),
    Case("Gather negative index before the start", _gather([-6]), InvalidModelError,
         "index -6 in constant input 'i' is out of range for axis 0 of 'x' (size 5)"),
    Case("Slice axis out of range",
         _one_op("Slice", [("x", [4, 4])], [_const("starts", [0]), _const("ends", [2]),
                                            _const("axes", [5])], 2),
         ShapeError, "node 'n' (Slice): Unexpected axis value: 5"),
    Case("Slice step 0",
         _one_op("Slice", [("x", [4, 4])], [_const("starts", [0]), _const("ends", [2]),
                                            _const("axes", [0]), _const("steps", [0])], 2),
         ShapeError, "node 'n' (Slice): 'step' cannot be 0"),
    # What constant inputs ask for.
    Case("Reshape with two -1", _one_op("Reshape", [("x", [2, 3, 4])],
                                        [_const("shape", [-1, 2, -1])], 3),
         InvalidModelError, "node 'n' (Reshape): shape input 'shape' = [-1, 2, -1] has more "
         "than one -1"),
    Case("Reshape with two -1 from a Constant node", _reshape_constant_node, InvalidModelError,
         "node 'n' (Reshape): shape input 'shape' = [-1, 2, -1] has more than one -1"),
    Case("Reshape dim -2", _one_op("Reshape", [("x", [2, 3, 4])], [_const("shape", [-2, 12])],
                                   2),
         InvalidModelError, "shape input 'shape' = [-2, 12] has -2; a dim is -1, 0 or positive"),
    Case("Reshape allowzero with 0 and -1",
         _one_op("Reshape", [("x", [2, 3, 4])], [_const("shape", [0, -1])], 2, allowzero=1),
         InvalidModelError, "has both 0 and -1 with allowzero=1"),
    Case("ConstantOfShape negative dim", _one_op("ConstantOfShape", [],
                                                 [_const("shape", [-5, 3])], 2),
         InvalidModelError, "node 'n' (ConstantOfShape): shape input 'shape' = [-5, 3] has the "
         "negative value -5"),
    Case("ConstantOfShape over the budget",
         _one_op("ConstantOfShape", [], [_const("shape", [2**16] * 4)], 4), ShapeError,
         "node 'n' (ConstantOfShape): shape input 'shape' asks for a [65536, 65536, 65536, "
         "65536] tensor (73,786,976,294,838,206,464 bytes), over the 274,877,906,944-byte limit"),
    Case("Expand to 2**62 x 2**62", _one_op("Expand", [("x", [1, 1])],
                                            [_const("shape", [2**62, 2**62])], 2),
         ShapeError, "node 'n' (Expand): shape input 'shape' asks for a [4611686018427387904, "
         "4611686018427387904] tensor"),
    Case("Tile past int64", _one_op("Tile", [("x", [4, 4])], [_const("repeats", [2**62, 4])], 2),
         ShapeError, "node 'n' (Tile): repeats input 'repeats' asks for a "
         "[18446744073709551616, 16] tensor"),
    Case("Range delta 0", _range(0, 10, 0, np.int64), InvalidModelError,
         "node 'n' (Range): delta input 'delta' is 0: the range never ends"),
    Case("Range over the budget", _range(0.0, 1e30, 1.0), ShapeError,
         "node 'n' (Range): inputs 'start', 'limit', 'delta' = 0.0, 1.0000000150474662e+30, 1.0 "
         "ask for 1e+30 elements"),
    Case("Range NaN limit", _range(0.0, np.nan, 1.0), InvalidModelError,
         "inputs 'start', 'limit', 'delta' = 0.0, nan, 1.0: not finite"),
    Case("Resize scale NaN", _resize([1, 1, np.nan, 1]), InvalidModelError,
         "node 'n' (Resize): scales input 'scales' = [1.0, 1.0, nan, 1.0] has nan; scales must be "
         "finite and positive"),
    Case("Resize scale 0", _resize([1, 1, 0, 1]), InvalidModelError,
         "scales input 'scales' = [1.0, 1.0, 0.0, 1.0] has 0.0"),
    Case("Resize scale 1e30", _resize([1, 1, 1e30, 1e30]), ShapeError,
         "node 'n' (Resize): scales input 'scales' = [1.0, 1.0, 1.0000000150474662e+30, "
         "1.0000000150474662e+30] asks for more than the 274,877,906,944-byte limit"),
    Case("Resize sizes over the budget", _resize(sizes=[1, 1, 2**40, 2**40]), ShapeError,
         "node 'n' (Resize): sizes input 'sizes' asks for a [1, 1, 1099511627776, "
         "1099511627776] tensor"),
    # Opsets, outputs, nesting and local functions.
    Case("opset -1", _opsets(("", -1)), InvalidModelError,
         "opset_import: domain 'ai.onnx' version -1 is out of range (1 to "),
    Case("opset 0", _opsets(("", 0)), InvalidModelError,
         "opset_import: domain 'ai.onnx' version 0 is out of range"),
    Case("opset newer than onnx knows", _opsets(("", 999)), InvalidModelError,
         "opset_import: domain 'ai.onnx' version 999 is out of range (1 to "),
    Case("ai.onnx.ml opset 99", _opsets(("", 17), ("ai.onnx.ml", 99)), InvalidModelError,
         "domain 'ai.onnx.ml' version 99 is out of range"),
    Case("custom domain version -3", _opsets(("", 17), ("com.acme", -3)), InvalidModelError,
         "domain 'com.acme' version -3 is out of range (1 or more)"),
    Case("domain imported twice", _opsets(("", 17), ("", 13)), InvalidModelError,
         "opset_import: domain 'ai.onnx' imported twice (versions 17 and 13)"),
    Case("graph output listed twice", _duplicate_output, InvalidModelError,
         "graph output 'y' is listed twice"),
    Case("local function calling itself",
         _with_functions([_function("F", _calls("F"))]), InvalidModelError,
         "local functions are recursive: local::F -> local::F"),
    Case("local functions calling each other",
         _with_functions([_function("F", _calls("G")), _function("G", _calls("F"))]),
         InvalidModelError, "local functions are recursive: local::F -> local::G -> local::F"),
    Case("local functions nested 40 deep", _with_functions(_function_chain(40)),
         InvalidModelError, "local function local::F0: If/Loop/Scan bodies and local-function "
         "calls nest at least 33 deep (calls local::F1 -> local::F2 -> local::F3 -> local::F4 "
         "-> ...), over the limit of 32"),
    # Expansion: each a file of 1-3 KB that onnx's shape inference would expand call by call.
    # Size of F_i: its own nodes plus `times` x F_(i+1)'s, the leaf 1: with 2 calls,
    # s = 3 * 2**k - 2 for k levels below; the graph adds its call: 3 * 2**23 - 1 for 24 deep.
    # With 30 calls, 6 deep: 1, 60, 1,830, 54,930, 1,647,930, 49,437,930, and the graph's call.
    Case("local functions calling the next twice, 24 deep", _with_functions(_function_tree(24)),
         InvalidModelError, "the model expands to 25,165,823 nodes with its local functions "
         "inlined (local function local::F0: 25,165,822 nodes, called 1 time(s) by the graph), "
         "over the limit of 1,000,000 (Limits.max_expanded_nodes; raise it with "
         "--max-expanded-nodes)"),
    Case("local functions calling the next 30 times, 6 deep",
         _with_functions(_function_tree(6, times=30)), InvalidModelError,
         "the model expands to 49,437,931 nodes"),
    Case("local functions calling the next twice in both branches of an If, 14 deep",
         _with_functions(_branch_tree(14)), InvalidModelError,
         "over the limit of 1,000,000 (Limits.max_expanded_nodes"),
    Case("bad attribute inside a local function",
         _with_functions([_function("F", [helper.make_node("MaxPool", ["a"], ["b"],
                                                           kernel_shape=[2, 2],
                                                           strides=[1, 0])])]),
         InvalidModelError, "local function local::F: node #0 (MaxPool): attribute strides = "
         "[1, 0]: 0 is not positive"),
    Case("If bodies nested 33 deep", _deep_ifs_proto, InvalidModelError,
         "body 'then_branch' of node 'if31' (If): node 'if32' (If): body 'then_branch' is nested "
         "33 deep, over the limit of 32 (Limits.max_nesting_depth)"),
    Case("bad attribute inside an If body", _conv_in_if_body, InvalidModelError,
         "body 'then_branch' of node 'if' (If): node 'bad' (Conv): attribute strides = [0, 1]: "
         "0 is not positive"),
    # Quantization parameters.
    Case("quantization scale zero", _quant("QuantizeLinear", np.array(0.0)), InvalidModelError,
         "node 'n' (QuantizeLinear): scale 's' holds 0.0: a quantization scale must be positive "
         "(and not NaN)"),
    Case("quantization scale negative", _quant("DequantizeLinear", np.array([0.5, -2.0, 1.0, 1.0]),
                                               axis=0), InvalidModelError,
         "node 'n' (DequantizeLinear): scale 's' holds -2.0: a quantization scale must be "
         "positive"),
    Case("quantization scale NaN", _quant("QuantizeLinear", np.array(np.nan)), InvalidModelError,
         "scale 's' holds nan: a quantization scale must be positive (and not NaN)"),
    Case("zero point of another type",
         _quant("DequantizeLinear", np.array(0.5), np.array(0, np.uint8), TensorProto.INT8),
         InvalidModelError, "node 'n' (DequantizeLinear): zero point 'z' is uint8, but 'x' is "
         "int8: they must have one type"),
    Case("quantization axis out of range", _quant("QuantizeLinear", np.ones(8), axis=2),
         ShapeError, "node 'n' (QuantizeLinear): attribute axis = 2 is out of range for input "
         "'x' of rank 2"),
    Case("per-axis scale of the wrong length", _quant("QuantizeLinear", np.ones(3), axis=1),
         ShapeError, "scale 's' [3] has 3 values for axis 1 of 'x' [4, 8], which has 8"),
    Case("block size does not divide the axis into the scale's blocks",
         _quant("DequantizeLinear", np.ones((4, 2)), np.zeros((4, 2), np.int8),
                TensorProto.INT8, axis=1, block_size=3), ShapeError,
         "node 'n' (DequantizeLinear): block_size 3 does not divide axis 1 of 'x' [4, 8] into "
         "the blocks of scale 's' [4, 2]: expected [4, 3]"),
    Case("int4 initializer with packed bytes too many", _int4_weight(b"\x11" * 9),
         InvalidModelError, "initializer 'w' (int4, 15 values): 9 bytes of packed data, "
         "expected 8 (2 values per byte)"),
    Case("MatMulNBits blob of the wrong packed length", _n_bits((16, 2, 8)), ShapeError,
         "node 'mm' (MatMulNBits): B 'b' [16, 2, 8] does not hold K = 64 x N = 16 weights of 4 "
         "bits packed in blocks of 32: expected [16, 2, 16]"),
    Case("MatMulNBits K differs from A's", _n_bits(a_k=60), ShapeError,
         "node 'mm' (MatMulNBits): input 'a' [1, 3, 60] has K = 60, but attribute K = 64"),
    Case("MatMulNBits block size not a power of 2", _n_bits(block_size=24), InvalidModelError,
         "node 'mm' (MatMulNBits): attribute block_size = 24: must be a power of 2, at least 16"),
    Case("GatherBlockQuantized of 3 bits", _gather_block(bits=3), InvalidModelError,
         "node 'emb' (GatherBlockQuantized): attribute bits = 3: must be 4 or 8"),
    Case("GatherBlockQuantized gather axis past the table", _gather_block(gather_axis=2),
         InvalidModelError, "node 'emb' (GatherBlockQuantized): attribute gather_axis = 2: out "
         "of range for the 2-D table 't'"),
    Case("int4 initializer with packed bytes too few", _int4_weight(b"\x11" * 5),
         InvalidModelError, "initializer 'w' (int4, 15 values): 5 bytes of packed data, "
         "expected 8"),
]
EXTERNAL = {c.id for c in CASES if c.id.startswith("external")}


def _folders(root: Path) -> Folders:
    folders = Folders(root / "model", root / "outside")
    folders.model.mkdir(parents=True)
    folders.outside.mkdir()
    folders.sentinel.write_bytes(_weights().raw_data)
    return folders


# ---- the Python API ---------------------------------------------------------------------------

_opened: list[str] | None = None  # paths opened while recording


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside `recording_opens`


@contextmanager
def recording_opens() -> Iterator[list[str]]:
    global _opened
    _opened = opened = []
    try:
        yield opened
    finally:
        _opened = None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_error(case: Case, tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    call = case.build(folders)
    with recording_opens() as opened, pytest.raises(OnnxLensError) as caught:
        onnxlens.analyze(call.source, **call.kwargs)
    error = caught.value
    assert type(error) is case.error, f"{type(error).__name__}: {error}"
    message = str(error)
    assert case.fragment in message
    assert "\n" not in message and "Traceback" not in message
    if case.id in EXTERNAL:
        secret = folders.sentinel.stat()
        for path in opened:
            resolved = Path(path).resolve()
            assert not resolved.is_relative_to(folders.outside.resolve()), path
            if resolved.exists():
                st = resolved.stat()
                assert (st.st_dev, st.st_ino) != (secret.st_dev, secret.st_ino), path


def test_audit_hook_sees_opens(tmp_path: Path) -> None:
    """The hook records both ways of opening a file that the checks above rely on it to see."""
    folders = _folders(tmp_path)
    with recording_opens() as opened:
        with open(folders.sentinel, "rb"):
            pass
        os.close(os.open(folders.sentinel, os.O_RDONLY))
    assert opened == [str(folders.sentinel)] * 2


# ---- the command line -------------------------------------------------------------------------
# A process start costs about a second here, so every case runs through the `analyze` entry point
# in one driver process (fresh argv and captured streams per case, exit codes from SystemExit,
# and what the interpreter would print for an uncaught exception); a few cases also run as real
# `analyze FILE` processes, alongside it.

API_ONLY = (_bytes_with_external, _proto_with_external, _deep_ifs_proto)  # no file to name
CLI_CASES = [c for c in CASES if c.build not in API_ONLY]
AS_PROCESS = ("truncated model", "external '..'")

_DRIVER = """
import contextlib, io, json, sys, traceback
from onnxlens.cli import analyze_main
results = []
for args in json.load(sys.stdin):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["analyze", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            analyze_main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append([code, err.getvalue()])
json.dump(results, sys.stdout)
"""


@dataclass
class Outcome:
    returncode: int
    stderr: str


def _analyze_command() -> list[str]:
    script = Path(sys.executable).parent / "analyze"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from onnxlens.cli import analyze_main; analyze_main()"]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Outcome of each CLI case by id (and of the real processes by "process: " + id)."""
    calls: dict[str, list[str]] = {}
    for case in CLI_CASES:
        call = case.build(_folders(tmp_path_factory.mktemp("cli")))
        assert call.cli is not None
        calls[case.id] = call.cli
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300,
                              env=env)

    with ThreadPoolExecutor(max_workers=1 + len(AS_PROCESS)) as pool:
        driver = pool.submit(run, [sys.executable, "-c", _DRIVER], json.dumps(list(calls.values())))
        processes = {i: pool.submit(run, [*_analyze_command(), *calls[i]]) for i in AS_PROCESS}
        done = driver.result()
        assert done.returncode == 0, done.stderr
        outcomes = {i: Outcome(*r) for i, r in zip(calls, json.loads(done.stdout), strict=True)}
        for i, future in processes.items():
            out = future.result()
            outcomes[f"process: {i}"] = Outcome(out.returncode, out.stderr)
    return outcomes


def _assert_one_error_line(out: Outcome, fragment: str | None) -> None:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error:")
    if fragment is not None:
        assert fragment in lines[0]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_cli_error(case: Case, cli_runs: dict[str, Outcome]) -> None:
    # The CLI may word its own checks of its flags.
    _assert_one_error_line(cli_runs[case.id], None if case.error is UsageError else case.fragment)


@pytest.mark.parametrize("case_id", AS_PROCESS)
def test_cli_process_error(case_id: str, cli_runs: dict[str, Outcome]) -> None:
    case = next(c for c in CASES if c.id == case_id)
    _assert_one_error_line(cli_runs[f"process: {case_id}"],
                           None if case.error is UsageError else case.fragment)
