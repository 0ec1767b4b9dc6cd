"""Fuzz targets and the strategies that feed them, shared by the bounded run of the test suite
(`test_fuzz.py`) and the long run (`benchmarks/fuzz.py`).

Every input must end in a result or an `OnnxLensError`: any other exception is a bug, and so is
an input that takes more than `HANG_SECONDS` or grows the process by more than `MAX_GROWTH`.

- `loader`: mutated bytes of small valid models (bit flips, truncations, inserted, deleted and
  duplicated bytes, overwritten varints, two models spliced) through `onnxlens.analyze`.
- `validation`: one-op graphs with random attributes, shapes and constant inputs, many of them
  hostile (zero strides, pads of 2**62, huge constant shapes, NaN scales ...).
- `analyzer`: chains of up to six ops drawn from the cost registry, analyzed and serialized.
- `inputs`: mutated .npy / .npz / .pb files through `backends.base.load_inputs`.
- `native`: mutated plans of the native executor (`_native.Executor`): refused, or run safely.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.cost.base import REGISTRY
from onnxlens.analyzer.errors import OnnxLensError

HANG_SECONDS = 20.0
MAX_GROWTH = 2 << 30  # bytes of peak RSS one input may add
# Set by a long-running worker: called with (target, input bytes) before each run, so that the
# input survives a crash of the whole process.
on_input: Callable[[str, bytes], None] | None = None

vi = helper.make_tensor_value_info
F = TensorProto.FLOAT


class Finding(AssertionError):
    """An input that broke the rule: the target and the input's bytes travel with it."""

    def __init__(self, target: str, data: bytes, what: str) -> None:
        super().__init__(f"{target}: {what}")
        self.target, self.data = target, data


def run_target(target: str, data: bytes, call: Callable[[], object]) -> bool:
    """Run `call` on one input; True if it gave a result, False for an `OnnxLensError`.

    Anything else propagates (the bug), as does a `Finding` for a hang or a blow-up.
    """
    if on_input is not None:
        on_input(target, data)
    peak = _peak_rss()
    start = time.perf_counter()
    try:
        call()
        ok = True
    except OnnxLensError as e:
        assert str(e) and "\n" not in str(e).strip(), f"{target}: multi-line error: {e!r}"
        ok = False
    elapsed = time.perf_counter() - start
    grown = _peak_rss() - peak
    if elapsed > HANG_SECONDS:
        raise Finding(target, data, f"took {elapsed:.1f} s")
    if grown > MAX_GROWTH:
        raise Finding(target, data, f"peak memory grew by {grown / 2**30:.1f} GiB")
    return ok


def _peak_rss() -> int:
    """The process's peak resident memory in bytes (/proc is faster than getrusage, which
    walks every thread)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- seeds ------------------------------------------------------------------------------------


def _w(name: str, *shape: int) -> TensorProto:
    rng = np.random.default_rng(len(name) + sum(shape))
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _i64(name: str, values: Any) -> TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[TensorProto], opset: int = 17,
           functions: list[onnx.FunctionProto] | None = None,
           domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "seed", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, functions=functions or [])


def seed_models() -> list[onnx.ModelProto]:
    """Small valid models covering the loader's paths: weights, shapes computed from constants,
    bodies, local functions, symbolic dims."""
    n = helper.make_node
    cnn = _model(
        [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         n("Relu", ["c1"], ["r1"], name="relu1"),
         n("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
         n("Conv", ["p1", "w2"], ["c2"], name="dw", group=4, kernel_shape=[3, 3],
           pads=[1, 1, 1, 1]),
         n("Add", ["c2", "p1"], ["a"], name="residual"),
         n("GlobalAveragePool", ["a"], ["g"], name="gap"),
         n("Flatten", ["g"], ["f"], name="flat"),
         n("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1),
         n("Softmax", ["logits"], ["y"], name="softmax")],
        [vi("x", F, [1, 3, 8, 8])], [vi("y", F, [1, 5])],
        [_w("w1", 4, 3, 3, 3), _w("b1", 4), _w("w2", 4, 1, 3, 3), _w("w3", 5, 4), _w("b3", 5)])
    attention = _model(
        [n("MatMul", ["x", "wq"], ["q"], name="q"),
         n("MatMul", ["x", "wk"], ["k"], name="k"),
         n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
         n("MatMul", ["q", "kt"], ["s"], name="scores"),
         n("Div", ["s", "scale"], ["sd"], name="scale"),
         n("Softmax", ["sd"], ["p"], name="softmax", axis=-1),
         n("MatMul", ["p", "x"], ["o"], name="context"),
         n("LayerNormalization", ["o", "gamma", "beta"], ["ln"], name="ln", axis=-1),
         n("Reshape", ["ln", "shape"], ["y"], name="reshape")],
        [vi("x", F, ["batch", 6, 8])], [vi("y", F, ["batch", 48])],
        [_w("wq", 8, 8), _w("wk", 8, 8), numpy_helper.from_array(np.array(2.8, np.float32),
                                                                  "scale"),
         _w("gamma", 8), _w("beta", 8), _i64("shape", [0, -1])])
    then = helper.make_graph([n("Relu", ["x"], ["t"])], "then", [], [vi("t", F, [2, 4])])
    other = helper.make_graph([n("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [2, 4])])
    control = _model(
        [n("Constant", [], ["idx"], name="const", value_ints=[1, 0]),
         n("Gather", ["x", "idx"], ["g"], name="gather", axis=0),
         n("If", ["cond"], ["b"], name="branch", then_branch=then, else_branch=other),
         n("Slice", ["g", "starts", "ends"], ["s"], name="slice"),
         n("Concat", ["s", "b"], ["cat"], name="concat", axis=0),
         n("Expand", ["cat", "eshape"], ["e"], name="expand"),
         n("Tile", ["e", "reps"], ["y"], name="tile")],
        [vi("x", F, [2, 4]), vi("cond", TensorProto.BOOL, [])], [vi("y", F, [4, 8])],
        [_i64("starts", [0]), _i64("ends", [2]), _i64("eshape", [4, 4]), _i64("reps", [1, 2])])
    body = [n("Relu", ["a"], ["r"]), n("Add", ["r", "a"], ["b"])]
    function = helper.make_function("local", "Block", ["a"], ["b"], body,
                                    [helper.make_opsetid("", 17)])
    local = _model(
        [n("Block", ["x"], ["h"], domain="local", name="block1"),
         n("Block", ["h"], ["y"], domain="local", name="block2")],
        [vi("x", F, [2, 4])], [vi("y", F, [2, 4])], [], functions=[function],
        domains=("local",))
    shapes = _model(
        [n("Shape", ["x"], ["s"], name="shape"),
         n("ConstantOfShape", ["s"], ["z"], name="zeros"),
         n("Range", ["start", "limit", "delta"], ["r"], name="range"),
         n("Resize", ["z", "", "scales"], ["up"], name="resize", mode="nearest"),
         n("ReduceSum", ["up"], ["sum"], name="sum", keepdims=0),
         n("Add", ["sum", "r"], ["y"], name="add")],
        [vi("x", F, [1, 1, 2, 2])], [vi("y", F, [3])],
        [numpy_helper.from_array(np.array(v, np.float32), k)
         for k, v in (("start", 0.0), ("limit", 3.0), ("delta", 1.0))]
        + [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    return [cnn, attention, control, local, shapes]


SEEDS = [m.SerializeToString() for m in seed_models()]


# ---- loader: mutated bytes --------------------------------------------------------------------


@st.composite
def mutated_model_bytes(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 5]))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "byte", "insert", "delete", "truncate",
                                     "duplicate", "varint", "splice"]))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x08, 0x12, 0x3A]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "duplicate":
            size = draw(st.integers(1, 64))
            data[at:at] = data[draw(st.integers(0, len(data) - 1)):][:size]
        elif kind == "varint":  # a large or negative varint where a length or value was
            data[at:at + 1] = draw(st.sampled_from([b"\xff\xff\xff\xff\x0f",
                                                    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                                                    b"\x80\x80\x80\x80\x04", b"\x00"]))
        else:
            other = draw(st.sampled_from(SEEDS))
            data = data[:at] + other[draw(st.integers(0, len(other) - 1)):]
    return bytes(data)


def loader(data: bytes) -> bool:
    def call() -> None:
        onnxlens.analyze(data).to_dict()

    return run_target("loader", data, call)


# ---- validation and analyzer: generated graphs -------------------------------------------------

HOSTILE_INTS = [-(2**63), -(2**62), -(2**31), -2, -1, 0, 2**31 - 1, 2**31, 2**32, 2**40, 2**62,
                2**63 - 1]
HOSTILE_FLOATS = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e30, 1e-30]
AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "BOGUS")
# Inputs: x data (graph input or weight), i int64 constant, f float constant, s scalar
# constant; "?" optional (may be left out, or given as ''). Attributes by kind. Ops not listed
# here (the rest of the cost registry) get data inputs and attributes from their onnx schema.
OPS: dict[str, tuple[str, dict[str, Any]]] = {
    "Conv": ("x x x?", {"strides": "ints", "dilations": "ints", "pads": "ints", "group": "int",
                        "kernel_shape": "ints", "auto_pad": AUTO_PAD}),
    "ConvTranspose": ("x x x?", {"strides": "ints", "dilations": "ints", "pads": "ints",
                                 "group": "int", "kernel_shape": "ints", "auto_pad": AUTO_PAD,
                                 "output_padding": "ints", "output_shape": "ints"}),
    "ConvInteger": ("x x", {"strides": "ints", "pads": "ints", "group": "int"}),
    "MaxPool": ("x", {"kernel_shape": "ints", "strides": "ints", "pads": "ints",
                      "dilations": "ints", "ceil_mode": "int", "auto_pad": AUTO_PAD}),
    "AveragePool": ("x", {"kernel_shape": "ints", "strides": "ints", "pads": "ints",
                          "ceil_mode": "int", "count_include_pad": "int"}),
    "LpPool": ("x", {"kernel_shape": "ints", "strides": "ints", "pads": "ints", "p": "int"}),
    "Gemm": ("x x x?", {"transA": "int", "transB": "int", "alpha": "float", "beta": "float"}),
    "MatMul": ("x x", {}),
    "Einsum": ("x x", {"equation": ("ij,jk->ik", "bij,bjk->bik", "i,i->", "ij->ji", "a,b",
                                    "...ij,...jk", "")}),
    "Reshape": ("x i", {"allowzero": "int"}),
    "Gather": ("x i", {"axis": "int"}),
    "GatherElements": ("x i", {"axis": "int"}),
    "Slice": ("x i i i? i?", {}),
    "Expand": ("x i", {}),
    "Tile": ("x i", {}),
    "Resize": ("x f? f? i?", {"mode": ("nearest", "linear", "cubic", "bogus")}),
    "ConstantOfShape": ("i", {}),
    "Range": ("s s s", {}),
    "Transpose": ("x", {"perm": "ints"}),
    "Concat": ("x x", {"axis": "int"}),
    "Split": ("x i?", {"axis": "int"}),
    "Softmax": ("x", {"axis": "int"}),
    "Flatten": ("x", {"axis": "int"}),
    "ReduceSum": ("x i?", {"keepdims": "int"}),
    "Squeeze": ("x i?", {}),
    "Unsqueeze": ("x i", {}),
    "Pad": ("x i f?", {"mode": ("constant", "reflect", "edge")}),
    "BatchNormalization": ("x x x x x", {"epsilon": "float"}),
    "LayerNormalization": ("x x x?", {"axis": "int"}),
    "TopK": ("x i", {"axis": "int"}),
    "DepthToSpace": ("x", {"blocksize": "int"}),
    "CumSum": ("x i", {}),
    "OneHot": ("x i x", {"axis": "int"}),
    "NoSuchOp": ("x", {}),
}
GENERIC_OPS = sorted({op for _, op in REGISTRY if op not in OPS})
_SCHEMA_KINDS = {onnx.AttributeProto.INT: "int", onnx.AttributeProto.INTS: "ints",
                 onnx.AttributeProto.FLOAT: "float"}
SMALL_DIMS = [1, 1, 2, 3, 4, 5, 8]
DTYPES = [TensorProto.INT64, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.UINT8,
          TensorProto.DOUBLE, TensorProto.BOOL]


_LISTED = st.sampled_from(sorted(OPS))
# Strategies built once (building one per draw costs more than the draw).
_PERCENT, _THIRDS, _QUARTERS, _COUNTS = (st.integers(0, 99), st.integers(0, 2),
                                         st.integers(0, 3), st.integers(0, 5))
_BOOLS = st.booleans()
_RANKS = st.sampled_from([0, 1, 2, 2, 3, 4, 4, 4, 5])
_SMALL_DIMS = st.sampled_from(SMALL_DIMS)
_HOSTILE_DIMS = st.sampled_from([0, "batch", "seq", None, 2**31, 2**40, 2**62, -1])
_SMALL_INTS, _HOSTILE_INTS = st.integers(-1, 8), st.sampled_from(HOSTILE_INTS)
_NICE_FLOATS = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])
_HOSTILE_FLOATS = st.sampled_from(HOSTILE_FLOATS)
_LENGTHS = st.sampled_from([1, 2, 2, 3, 4])
_ATTRIBUTE_INTS, _ATTRIBUTE_FLOATS = st.integers(0, 3), st.sampled_from([0.5, 1.0, 1e-5])
_SCALARS = st.integers(-5, 20)
_HOSTILE_SCALARS = st.sampled_from([*HOSTILE_INTS[4:8], 0.5, -1.5, *HOSTILE_FLOATS])
_choices = functools.cache(lambda values: st.sampled_from(values))


@functools.cache
def _generic_ops(opset: int) -> st.SearchStrategy[str]:
    return st.sampled_from([op for op in GENERIC_OPS if onnx.defs.has(op, opset)])


@functools.cache
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    return onnx.defs.get_schema(op, opset) if onnx.defs.has(op, opset) else None


@dataclass
class _Graph:
    draw: st.DrawFn
    hostile: int  # percent of values drawn from the hostile pools
    opset: int
    nodes: list[onnx.NodeProto]
    inputs: list[onnx.ValueInfoProto]
    inits: list[TensorProto]
    count: int = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def pick(self, normal: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
        return self.draw(hostile if self.draw(_PERCENT) < self.hostile else normal)

    def dim(self) -> int | str | None:
        return self.pick(_SMALL_DIMS, _HOSTILE_DIMS)

    def shape(self, small: bool = False) -> list[Any]:
        rank = self.draw(_RANKS)
        if small:
            return [self.draw(_SMALL_DIMS) for _ in range(rank)]
        return [self.dim() for _ in range(rank)]

    def ints(self, length: int | None = None) -> list[int]:
        size = self.draw(_COUNTS) if length is None else length
        return [self.pick(_SMALL_INTS, _HOSTILE_INTS) for _ in range(size)]

    def floats(self) -> list[float]:
        return [self.pick(_NICE_FLOATS, _HOSTILE_FLOATS) for _ in range(self.draw(_COUNTS))]

    def data(self, elem: int) -> str:
        """A fresh data tensor: a graph input of any shape, or a small weight."""
        name = self.name("t")
        if self.draw(_BOOLS):
            self.inputs.append(vi(name, elem, self.shape()))
        else:
            dtype = helper.tensor_dtype_to_np_dtype(elem)
            self.inits.append(numpy_helper.from_array(np.ones(self.shape(small=True), dtype),
                                                      name))
        return name

    def constant(self, values: np.ndarray) -> str:
        name = self.name("k")
        if self.draw(_BOOLS):
            self.inits.append(numpy_helper.from_array(values, name))
        else:
            self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                               value=numpy_helper.from_array(values, name)))
        return name

    def attribute(self, kind: Any) -> Any:
        if isinstance(kind, tuple):
            return self.draw(_choices(kind))
        if kind == "ints":
            return self.ints(self.draw(_LENGTHS))
        if kind == "int":
            return self.pick(_ATTRIBUTE_INTS, _HOSTILE_INTS)
        return self.pick(_ATTRIBUTE_FLOATS, _HOSTILE_FLOATS)

    def node(self, data: str | None, elem: int) -> str:
        """One random op reading `data` (or a fresh tensor) first; returns its first output."""
        draw = self.draw
        op = draw(st.one_of(_LISTED, _generic_ops(self.opset)))
        schema = _schema(op, self.opset)
        spec, kinds = OPS.get(op, ("", {}))
        if not spec:  # from the schema: data inputs, the optional ones marked
            low = schema.min_input if schema else 1
            high = min(schema.max_input, low + 2) if schema else 2
            spec = " ".join("x" if i < low else "x?" for i in range(high))
        if schema is not None:
            for key, attr in schema.attributes.items():
                if attr.type in _SCHEMA_KINDS and (attr.required or key not in kinds):
                    kinds = {**kinds, key: _SCHEMA_KINDS[attr.type]}
        required = {k for k, a in schema.attributes.items() if a.required} if schema else set()
        names: list[str] = []
        for position, kind in enumerate(spec.split()):
            if kind.endswith("?") and draw(_THIRDS) == 0:
                names.append("")
                continue
            kind = kind.rstrip("?")
            if kind == "x":
                names.append(data if position == 0 and data else self.data(elem))
            elif kind == "i":
                names.append(self.constant(np.array(self.ints(), np.int64)))
            elif kind == "f":
                names.append(self.constant(np.array(self.floats(), np.float32)))
            else:
                value = self.pick(_SCALARS, _HOSTILE_SCALARS)
                dtype = np.float32 if isinstance(value, float) else np.int64
                names.append(self.constant(np.array(value, dtype)))
        while names and not names[-1]:
            names.pop()
        attrs = {k: self.attribute(kind) for k, kind in kinds.items()
                 if k in required or draw(_QUARTERS) == 0}
        count = max(schema.min_output, 1) if schema else 1
        outputs = [self.name("o") for _ in range(2 if op in ("Split", "TopK") else count)]
        self.nodes.append(helper.make_node(op, names, outputs, name=self.name(op), **attrs))
        return outputs[0]


@st.composite
def op_graphs(draw: st.DrawFn, max_nodes: int = 1, hostile: int = 20) -> onnx.ModelProto:
    """Up to `max_nodes` random ops in a chain (each reads the one before), then Shape of the
    last: the graph output is int64 of rank 1 whatever the ops make. `hostile`: the percentage
    of dims, attribute and constant values drawn from the hostile pools."""
    opset = draw(st.sampled_from([17] * 6 + [7, 9, 11, 13, 18, 21]))
    g = _Graph(draw, hostile, opset, [], [], [])
    elem = draw(st.sampled_from([F] * 12 + DTYPES))
    data: str | None = None
    for _ in range(draw(st.integers(1, max_nodes))):
        data = g.node(data, elem)
    assert data is not None
    outputs = [vi("shape_of_last", TensorProto.INT64, [None])]
    g.nodes.append(helper.make_node("Shape", [data], ["shape_of_last"], name="shape_of_last"))
    if draw(st.integers(0, 9)) == 0:  # also the last tensor itself, of a guessed rank
        outputs.append(vi(data, elem, [None] * draw(st.integers(0, 4))))
    graph = helper.make_graph(g.nodes, "fuzz", g.inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def validation(model: onnx.ModelProto) -> bool:
    return run_target("validation", model.SerializeToString(),
                      lambda: onnxlens.analyze(model))


def analyzer(model: onnx.ModelProto) -> bool:
    def call() -> None:
        result = onnxlens.analyze(model)
        result.to_json()
        result.to_csv()
        result.to_csv(level="groups")

    return run_target("analyzer", model.SerializeToString(), call)


# ---- inputs given by the user -----------------------------------------------------------------


def _input_specs() -> list[Any]:
    from onnxlens.backends.base import input_specs

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [vi("a", F, ["batch", 4]), vi("b", F, [1, 4])],
                              [vi("y", F, ["batch", 4])])
    return input_specs(helper.make_model(graph))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


INPUT_SEEDS = {
    ".npz": [_npz(a=np.ones((2, 4), np.float32), b=np.ones((1, 4), np.float32)),
             _npz(a=np.ones((3, 4), np.float64), b=np.zeros((1, 4), np.int8))],
    ".npy": [_npy(np.ones((2, 4), np.float32))],
    ".pb": [numpy_helper.from_array(np.ones((2, 4), np.float32), "a").SerializeToString()],
}


@st.composite
def mutated_input_files(draw: st.DrawFn) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from(sorted(INPUT_SEEDS)))
    data = bytearray(draw(st.sampled_from(INPUT_SEEDS[suffix])))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return suffix, bytes(data)


def inputs(suffix: str, data: bytes, folder: Any) -> bool:
    """`folder`: a directory to write the file in (a pathlib.Path)."""
    from onnxlens.backends.base import load_inputs

    path = folder / f"input{suffix}"
    path.write_bytes(data)
    one = _input_specs()[:1] if suffix != ".npz" else _input_specs()
    return run_target("inputs", suffix.encode() + b"\0" + data,
                      lambda: load_inputs([path], one))


# ---- the native executor's plan builder -------------------------------------------------------
# Valid plans of small models (`backends.native.plan`, lowered to `_native.Executor`'s
# arguments), mutated: dims negative, zero, huge or with overflowing products; unknown dtypes and
# storages; offsets out of their area; constants of the wrong size or dtype; tensor ids out of
# range; unknown kernels, attributes of any value, element-wise programs reading anything;
# arena and scratch sizes. The executor must refuse the plan (`BackendError`) or, if it accepts
# it, run it on inputs of the plan's sizes with no crash (a refused run is a `BackendError` too).
# Run under tests/sanitize.sh, an out-of-bounds access is caught where it happens.

INTERESTING = (-2**63, -2**31 - 1, -2**31, -65536, -2, -1, 0, 1, 2, 3, 7, 64, 255, 4096,
               2**31 - 1, 2**31, 2**32, 2**40, 2**40 + 1, 2**62, 2**63 - 1)
MAX_RUN_BYTES = 64 << 20  # an accepted plan is run only when its buffers are this small
# Under AddressSanitizer (tests/sanitize.sh) an allocation of 1 TiB, the most a plan may ask
# for, aborts the process instead of raising std::bad_alloc: such plans are left to plain runs.
SANITIZED_MAX_AREA = (1 << 36) if os.environ.get("ONNXLENS_NATIVE_MODULE") else None


def _plan_seed_models() -> list[onnx.ModelProto]:
    def typed(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
              outputs: list[str], inits: list[TensorProto], opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(nodes, "plan", inputs, [onnx.ValueInfoProto(name=o)
                                                          for o in outputs], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=8)
        return onnx.shape_inference.infer_shapes(model)

    n = helper.make_node
    return [
        typed([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
               n("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", F, [1, 3, 8, 8])], ["y"], [_w("w", 4, 3, 3, 3), _w("b", 4)]),
        typed([n("Conv", ["x", "w"], ["c"], group=2, strides=[2, 1], dilations=[1, 2]),
               n("AveragePool", ["c"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                 count_include_pad=1),
               n("GlobalAveragePool", ["p"], ["y"])],
              [vi("x", F, [2, 4, 9, 9])], ["y"], [_w("w", 6, 2, 3, 3)]),
        typed([n("Gemm", ["x", "w", "c"], ["g"], transB=1, alpha=0.5),
               n("Softmax", ["g"], ["y"], axis=-1)],
              [vi("x", F, [3, 5])], ["y"], [_w("w", 4, 5), _w("c", 4)]),
        typed([n("MatMul", ["x", "w"], ["m"]), n("Add", ["m", "b"], ["a"]),
               n("Tanh", ["a"], ["y"])],
              [vi("x", F, [2, 3, 4])], ["y"], [_w("w", 4, 5), _w("b", 5)]),
        typed([n("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
               n("LayerNormalization", ["x", "s", "b"], ["l"], axis=-1),
               n("Sub", ["l", "m"], ["y"])],
              [vi("x", F, [2, 3, 6])], ["y"], [_i64("axes", [1]), _w("s", 6), _w("b", 6)],
              opset=18),
        typed([n("Gather", ["t", "i"], ["g"], axis=0), n("Transpose", ["g"], ["tr"],
                                                         perm=[1, 0, 2]),
               n("Concat", ["tr", "tr"], ["y"], axis=2)],
              [vi("i", TensorProto.INT64, [2, 3])], ["y"], [_w("t", 10, 4)]),
        typed([n("Resize", ["x", "", "scales"], ["r"], mode="linear"),
               n("Less", ["r", "z"], ["l"]), n("Where", ["l", "z", "r"], ["y"])],
              [vi("x", F, [1, 2, 4, 4])], ["y"],
              [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
               _w("z", 1)]),
        typed([n("Split", ["x", "sp"], ["a", "b"], axis=1), n("Mul", ["a", "b"], ["m"]),
               n("ArgMax", ["m"], ["y"], axis=1, keepdims=0),
               n("InstanceNormalization", ["x", "s", "c"], ["y2"]),
               n("ReduceSumSquare", ["y2", "ax"], ["y3"], keepdims=0)],
              [vi("x", F, [2, 4, 5])], ["y", "y3"],
              [_i64("sp", [2, 2]), _w("s", 4), _w("c", 4), _i64("ax", [2])], opset=18),
    ]


@functools.cache
def plan_seeds() -> tuple[tuple[Any, ...], ...]:
    """The executor arguments of every seed model native-cpu can run."""
    from onnxlens.backends.native_cpu import NativeCpuBackend

    seeds = []
    for model in _plan_seed_models():
        backend = NativeCpuBackend(1)
        try:
            backend.prepare(model)
        except OnnxLensError:  # an op the executor does not have (yet): not a seed
            continue
        seeds.append(backend.prepared.plan.native_args())
    return tuple(seeds)


def _some_int(draw: st.DrawFn) -> int:
    return draw(st.one_of(st.sampled_from(INTERESTING), st.integers(-8, 300)))


@st.composite
def mutated_plans(draw: st.DrawFn) -> tuple[tuple[Any, ...], int, str, list[tuple[int, int]]]:
    """(executor arguments, threads, isa, captures as (step, tensor))."""
    from onnxlens.backends.native_cpu import native_module

    seeds = plan_seeds()
    seed = copy.deepcopy(draw(st.sampled_from(seeds)))  # the seeds are cached: never changed
    tensors, constants, inputs, outputs, steps, arena, scratch = seed
    tensors = [list(t) for t in tensors]
    constants, inputs, outputs = list(constants), list(inputs), list(outputs)
    steps = [(g, name, [list(k) for k in kernels]) for g, name, kernels in steps]
    kernels = [k for _, _, ks in steps for k in ks]
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["dim", "rank", "dtype", "storage", "offset", "constant",
                                     "io", "kernel_op", "kernel_id", "ints", "floats",
                                     "operand", "program", "area", "steps", "alias"]))
        t = draw(st.sampled_from(tensors))
        k = draw(st.sampled_from(kernels))
        if what == "dim" and t[2]:
            t[2] = list(t[2])
            t[2][draw(st.integers(0, len(t[2]) - 1))] = _some_int(draw)
        elif what == "rank":
            t[2] = draw(st.lists(st.one_of(st.integers(0, 9), st.sampled_from(INTERESTING)),
                                 max_size=7))
        elif what == "dtype":
            t[1] = draw(st.one_of(st.integers(-1, 26), st.sampled_from(INTERESTING)))
        elif what == "storage":
            t[3] = draw(st.one_of(st.integers(-1, 3), st.sampled_from(INTERESTING)))
        elif what == "offset":
            t[4] = draw(st.one_of(st.integers(-8, 4096), st.sampled_from(INTERESTING)))
        elif what == "alias":
            t[5] = draw(st.one_of(st.integers(-2, len(tensors)), st.sampled_from(INTERESTING)))
        elif what == "constant" and constants:
            at = draw(st.integers(0, len(constants) - 1))
            dtype = draw(st.sampled_from([np.float32, np.int64, np.uint8, np.float64]))
            count = draw(st.integers(0, 300))
            constants[at] = np.ones(count, dtype)
        elif what == "io":
            which = draw(st.sampled_from([inputs, outputs]))
            if which and draw(st.booleans()):
                which[draw(st.integers(0, len(which) - 1))] = _some_int(draw)
            elif which and draw(st.booleans()):
                which.append(which[0])
            elif which:
                which.pop()
        elif what == "kernel_op":
            k[0] = draw(st.one_of(st.sampled_from(native_module().kernel_ops()),
                                  st.text(max_size=8)))
        elif what == "kernel_id":
            ids = draw(st.sampled_from([k[1], k[2]]))
            if ids:
                ids[draw(st.integers(0, len(ids) - 1))] = draw(
                    st.one_of(st.integers(-2, len(tensors) + 1), st.sampled_from(INTERESTING)))
            else:
                ids.append(draw(st.integers(-2, len(tensors) + 1)))
        elif what == "ints":
            ints = dict(k[3])
            name = draw(st.one_of(st.sampled_from(sorted(ints) or ["axis"]),
                                  st.sampled_from(["axis", "pads", "strides", "group", "perm",
                                                   "kernel_shape", "dilations", "split"])))
            ints[name] = draw(st.lists(st.one_of(st.integers(-4, 12),
                                                 st.sampled_from(INTERESTING)), max_size=8))
            k[3] = ints
        elif what == "floats":
            floats = dict(k[4])
            name = draw(st.sampled_from(sorted(floats) or ["alpha", "epsilon", "beta"]))
            floats[name] = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True),
                                         max_size=4))
            k[4] = floats
        elif what == "operand":
            k[5] = [*k[5], (draw(st.integers(-2, len(tensors))),
                            draw(st.lists(st.integers(-3, 40), max_size=6)))]
        elif what == "program":
            program = list(k[6])
            program.append((draw(st.one_of(st.text(max_size=8), st.sampled_from(
                                ["Relu", "Add", "Mul", "Div", "Sigmoid", "Clip", "Pow"]))),
                            draw(st.integers(-2, 12)),
                            draw(st.lists(st.integers(-2, 12), max_size=3)),
                            draw(st.lists(st.floats(allow_nan=True), max_size=3))))
            if program and draw(st.booleans()):
                at = draw(st.integers(0, len(program) - 1))
                op, _, srcs, params = program[at]
                program[at] = (op, _some_int(draw), [_some_int(draw) for _ in srcs], params)
            k[6] = program
        elif what == "area":
            if draw(st.booleans()):
                arena = _some_int(draw)
            else:
                scratch = _some_int(draw)
        elif what == "steps" and len(steps) > 1:
            i, j = draw(st.integers(0, len(steps) - 1)), draw(st.integers(0, len(steps) - 1))
            steps[i], steps[j] = steps[j], steps[i]
    args = ([tuple(t) for t in tensors], constants, inputs, outputs,
            [(g, name, [tuple(k) for k in ks]) for g, name, ks in steps], arena, scratch)
    threads = draw(st.sampled_from([1, 2]))
    isa = draw(st.sampled_from(["", *native_module().available_isas()]))
    captures = draw(st.lists(st.tuples(st.integers(-2, len(steps) + 1),
                                       st.integers(-2, len(tensors))), max_size=2))
    return args, threads, isa, captures


def _plan_bytes(args: tuple[Any, ...], threads: int, isa: str,
                captures: list[tuple[int, int]]) -> bytes:
    """A finding's input, as JSON (arrays as dtype, shape and hex; tuples tagged)."""
    def enc(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return {"a": [v.dtype.str, list(v.shape), v.tobytes().hex()]}
        if isinstance(v, tuple):
            return {"t": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, dict):
            return {"d": [[key, enc(x)] for key, x in v.items()]}
        return v

    return json.dumps(enc([args, threads, isa, captures])).encode()


def plan_from_bytes(data: bytes) -> tuple[Any, ...]:
    def dec(v: Any) -> Any:
        if isinstance(v, list):
            return [dec(x) for x in v]
        if isinstance(v, dict) and "a" in v:
            dtype, shape, hexed = v["a"]
            return np.frombuffer(bytes.fromhex(hexed), np.dtype(dtype)).reshape(shape).copy()
        if isinstance(v, dict) and "t" in v:
            return tuple(dec(x) for x in v["t"])
        if isinstance(v, dict):
            return {key: dec(x) for key, x in v["d"]}
        return v

    args, threads, isa, captures = dec(json.loads(data))
    return tuple(args), threads, isa, [tuple(c) for c in captures]


def native_plan(args: tuple[Any, ...], threads: int, isa: str,
                captures: list[tuple[int, int]]) -> bool:
    from onnxlens.backends.base import BackendError
    from onnxlens.backends.native_cpu import make_executor, native_module

    native = native_module()

    def call() -> None:
        if SANITIZED_MAX_AREA and max(args[5], args[6]) > SANITIZED_MAX_AREA:
            return
        executor = make_executor(native, args, threads, isa)
        tensors, _, inputs, outputs = args[:4]

        def buffer(tid: int) -> np.ndarray:
            _, elem, shape, *_ = tensors[tid]
            return np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(elem))

        sizes = [math.prod(tensors[i][2]) * 8 for i in (*inputs, *outputs)]
        if sum(sizes) > MAX_RUN_BYTES:
            return
        caps = [(s, t, buffer(t)) for s, t in captures if 0 <= t < len(tensors)
                and math.prod(tensors[t][2]) * 8 <= MAX_RUN_BYTES]
        try:
            executor.run([buffer(i) for i in inputs], [buffer(i) for i in outputs], caps)
        except native.RunError as e:
            raise BackendError(f"run failed: {e}") from None

    return run_target("native", _plan_bytes(args, threads, isa, captures), call)
