"""Every crash, hang or abort the fuzzers found, minimized, with the answer it gets now.

Inputs that crashed the interpreter itself (onnx's C++ shape inference) run in a child process,
so that a regression fails this test instead of ending the test run. The native executor's
findings (plans, under tests/sanitize.sh) are at the end.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
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
    OnnxLensError,
    ShapeError,
)

vi = helper.make_tensor_value_info
F = TensorProto.FLOAT


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[TensorProto] | None = None,
           opsets: tuple[tuple[str, int], ...] = (("", 17),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "regression", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _one(op: str, shape: list[Any], inits: list[TensorProto] | None = None, rank: int = 2,
         **attrs: Any) -> onnx.ModelProto:
    names = ["x"] + [t.name for t in inits or []]
    return _model([helper.make_node(op, names, ["y"], name="n", **attrs)], [vi("x", F, shape)],
                  [vi("y", F, [None] * rank)], inits)


def _ones(name: str, *shape: int) -> TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _not_utf8(model: onnx.ModelProto, text: str) -> bytes:
    """The serialized model with the first byte of every `text` made invalid UTF-8 (same
    length, so the protobuf stays well formed)."""
    data = model.SerializeToString()
    word = text.encode()
    assert word in data
    return data.replace(word, b"\x80" + word[1:])


@dataclass
class Regression:
    id: str
    source: Callable[[Path], Any]
    error: type[OnnxLensError] | None  # None: a result
    fragment: str = ""


def _conv_transpose_scalar_weight(_: Path) -> onnx.ModelProto:
    """A scalar weight after an input of unknown rank: onnx infers nothing, the cost formula
    unpacked the weight's dims (found by a 10-minute fuzzing run)."""
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                 np.zeros(0, np.int64), "k")),
             helper.make_node("Reshape", ["t", "k"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("ConvTranspose", ["p", "w"], ["y"], name="ct", dilations=[2, 2]),
             helper.make_node("Shape", ["y"], ["s"])]
    return _model(nodes, [vi("w", F, [])], [vi("s", TensorProto.INT64, [None])],
                  [_ones("t", 2, 8, 5, 4)])


def _bad_name_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu_node")],
                  [vi("x", F, [2, 3])], [vi("y", F, ["batch_dim", 3])])


def _huge_1d_gather(_: Path) -> onnx.ModelProto:
    return _model([helper.make_node("Gather", ["x", "i"], ["y"])],
                  [vi("x", TensorProto.FLOAT16, [2**31])], [vi("y", TensorProto.FLOAT16, [None])],
                  [numpy_helper.from_array(np.array([7, 0, 6], np.int64), "i")])


def _with_metadata() -> onnx.ModelProto:
    model = _bad_name_model()
    helper.set_model_props(model, {"license": "licence_text"})
    return model


def _external_location(folder: Path) -> str:
    w = _ones("w", 4, 3, 3, 3)
    (folder / "weights.bin").write_bytes(w.raw_data)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="weights.bin")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", F, [1, 3, 8, 8])],
                   [vi("y", F, [None] * 4)], [w])
    path = folder / "model.onnx"
    path.write_bytes(_not_utf8(model, "eights.bin").replace(b"\x80eights", b"w\x80ights"))
    return str(path)


REGRESSIONS = [
    # Cost formulas given shapes that onnx's inference let through.
    Regression("LpNormalization of a scalar", lambda _: _one("LpNormalization", [], rank=0),
               None),
    Regression("InstanceNormalization of zero channels",
               lambda _: _one("InstanceNormalization", [2, 0, 4],
                              [_ones("s", 0), _ones("b", 0)], rank=3), None),
    Regression("GroupNormalization num_groups 0",
               lambda _: _model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"],
                                                  name="n", num_groups=0)],
                                [vi("x", F, [2, 4, 3])], [vi("y", F, [None] * 3)],
                                [_ones("s", 4), _ones("b", 4)], opsets=(("", 21),)),
               InvalidModelError, "node 'n' (GroupNormalization): attribute num_groups = 0"),
    Regression("GroupNormalization channels not a multiple of num_groups",
               lambda _: _model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"],
                                                  name="n", num_groups=3)],
                                [vi("x", F, [2, 4, 3])], [vi("y", F, [None] * 3)],
                                [_ones("s", 4), _ones("b", 4)], opsets=(("", 21),)),
               ShapeError, "input 'x' has 4 channels, not a multiple of num_groups 3"),
    Regression("MeanVarianceNormalization of a scalar (opset 11)",
               lambda _: _model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"],
                                                  name="n")], [vi("x", F, [])], [vi("y", F, [])],
                                opsets=(("", 11),)), ShapeError,
               "node 'n' (MeanVarianceNormalization): axes [0, 2, 3] out of range for input 'x' "
               "of rank 0"),
    Regression("LayerNormalization of a scalar",
               lambda _: _one("LayerNormalization", [], [_ones("s", 1)], rank=0, axis=3),
               ShapeError, "attribute axis = 3 is out of range for input 'x' of rank 0"),
    Regression("Einsum with an empty equation",
               lambda _: _one("Einsum", [2, 8], [_ones("b", 8)], equation=""),
               InvalidModelError, "node 'n' (Einsum): attribute equation '' has 1 operand "
               "term(s) for 2 input(s)"),
    Regression("ConvInteger with a 1-D weight",
               lambda _: _model([helper.make_node("Foo", ["x"], ["t"], domain="com.acme"),
                                 helper.make_node("ConvInteger", ["t", "w"], ["y"], name="n")],
                                [vi("x", TensorProto.UINT8, [1, 2, 4, 4])],
                                [vi("y", TensorProto.INT32, [None] * 4)],
                                [numpy_helper.from_array(np.ones(2, np.uint8), "w")],
                                opsets=(("", 17), ("com.acme", 1))),
               ShapeError, "'w' [2] has rank 1; Conv takes rank 3 or more"),
    Regression("DepthToSpace of channels not a multiple of blocksize**2",
               lambda _: _one("DepthToSpace", [5, 3, 2, 1], rank=4, blocksize=2), ShapeError,
               "input 'x' [5, 3, 2, 1]: dim 1 is not a multiple of 4 (blocksize 2)"),
    Regression("Resize with empty scales (opset 11)",
               lambda _: _model([helper.make_node("Resize", ["x", "roi", "scales"], ["y"],
                                                  name="n"),
                                 helper.make_node("Shape", ["y"], ["shape"])],
                                [vi("x", TensorProto.UINT8, [5, 2])],
                                [vi("shape", TensorProto.INT64, [None])],
                                [numpy_helper.from_array(np.array([1e-30, 3, 3], np.float32),
                                                         "roi"),
                                 numpy_helper.from_array(np.array([], np.float32), "scales")],
                                opsets=(("", 11),)),
               ShapeError, "node 'n' (Resize): output 'y' of rank 0 for input 'x' of rank 2"),
    # A hang: onnx's data propagation walks every element of a 1-D tensor.
    Regression("Gather from a 1-D input of 2**31 elements", _huge_1d_gather, None),
    # protobuf hands invalid UTF-8 over as bytes.
    Regression("graph output dim name not UTF-8",
               lambda _: _not_utf8(_bad_name_model(), "batch_dim"), InvalidModelError,
               "graph output 'y' dim b'\\x80atch_dim' is not valid UTF-8 text"),
    Regression("node name not UTF-8", lambda _: _not_utf8(_bad_name_model(), "relu_node"),
               InvalidModelError, "node #0 name b'\\x80elu_node' is not valid UTF-8 text"),
    Regression("initializer name not UTF-8 (everywhere)",
               lambda _: _not_utf8(_one("Add", [2], [_ones("weight_b", 2)], rank=1), "weight_b"),
               InvalidModelError, "initializer b'\\x80eight_b' is not valid UTF-8 text"),
    Regression("node output name not UTF-8 (everywhere)",
               lambda _: _not_utf8(_model([helper.make_node("Relu", ["x"], ["middle"]),
                                           helper.make_node("Neg", ["middle"], ["y"])],
                                          [vi("x", F, [2])], [vi("y", F, [2])]), "middle"),
               InvalidModelError, "output b'\\x80iddle' is not valid UTF-8 text"),
    Regression("metadata value not UTF-8 (exported with the analysis)",
               lambda _: _not_utf8(_with_metadata(), "licence_text"), InvalidModelError,
               "metadata 'license' value b'\\x80icence_text' is not valid UTF-8 text"),
    Regression("external data location not UTF-8", _external_location, ExternalDataError,
               "tensor 'w': external data location b'w\\x80ights.bin' is not valid UTF-8 text"),
    Regression("ConvTranspose with a scalar weight", _conv_transpose_scalar_weight, ShapeError,
               "node 'ct' (ConvTranspose): 'w' [] has rank 0; ConvTranspose takes rank 3 or "
               "more"),
]


@pytest.mark.parametrize("case", REGRESSIONS, ids=[c.id for c in REGRESSIONS])
def test_regression(case: Regression, tmp_path: Path) -> None:
    source = case.source(tmp_path)
    if case.error is None:
        result = onnxlens.analyze(source)
        assert result.to_json()
        return
    with pytest.raises(OnnxLensError) as caught:
        onnxlens.analyze(source)
    assert type(caught.value) is case.error, f"{type(caught.value).__name__}: {caught.value}"
    assert case.fragment in str(caught.value)


def test_huge_1d_input_turns_data_propagation_off(tmp_path: Path) -> None:
    warnings = onnxlens.analyze(_huge_1d_gather(tmp_path)).warnings
    assert any(w.startswith("onnx's shape data propagation is off: a tensor of 2,147,483,648 "
                            "elements") for w in warnings)


# Inputs that made onnx's C++ shape inference crash the process: checked in a child.
_IN_A_CHILD = {
    # A segmentation fault: EyeLike with a dtype reads the type of an untyped input.
    "EyeLike with a dtype after a custom op": ("""
        nodes = [helper.make_node("Foo", ["x"], ["t"], domain="com.acme"),
                 helper.make_node("EyeLike", ["t"], ["y"], dtype=1, k=1)]
        graph = helper.make_graph(nodes, "g", [vi("x", 1, [2, 2])], [vi("y", 1, [None, None])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.acme", 1)])
        """, "result"),
    "EyeLike with a dtype after a failing node": ("""
        c = lambda n, v, t: numpy_helper.from_array(np.array(v, t), n)
        nodes = [helper.make_node("Range", ["a", "b", "d"], ["r"]),
                 helper.make_node("EyeLike", ["r"], ["y"], dtype=2)]
        graph = helper.make_graph(nodes, "g", [], [vi("y", 2, [None, None])],
                                  [c("a", 0.5, np.float32), c("b", 20, np.int64),
                                   c("d", 14, np.int64)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        """, "ShapeError"),
    # A segmentation fault: GatherND with batch_dims -2**31.
    "GatherND batch_dims -2**31": ("""
        nodes = [helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=-2**31)]
        graph = helper.make_graph(nodes, "g", [vi("d", 1, [8, 2, 3, 5]), vi("i", 7, [4, 8])],
                                  [vi("y", 1, [None])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        """, "InvalidModelError"),
    # An abort: Split with fewer num_outputs than outputs indexes past a vector.
    "Split num_outputs below the outputs": ("""
        nodes = [helper.make_node("Split", ["x"], ["a", "b"], name="n", axis=0, num_outputs=1)]
        graph = helper.make_graph(nodes, "g", [vi("x", 1, [6, 2])],
                                  [vi("a", 1, [None, None]), vi("b", 1, [None, None])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        """, "InvalidModelError"),
}
_CHILD = """
import numpy as np, onnx, onnxlens
from onnx import helper, numpy_helper
vi = helper.make_tensor_value_info
{build}
try:
    onnxlens.analyze(model)
    print("result")
except onnxlens.OnnxLensError as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize("case", list(_IN_A_CHILD))
def test_crash_of_onnx_inference(case: str) -> None:
    build, expected = _IN_A_CHILD[case]
    code = _CHILD.format(build=textwrap.dedent(build))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert out.stdout.startswith(expected), out.stdout


# ---- the native executor's plans (found under AddressSanitizer/UBSan, tests/sanitize.sh) -----

needs_native = pytest.mark.skipif(importlib.util.find_spec("onnxlens.backends._native") is None,
                                  reason="the native extension is not built")


def _plan(**change: Any) -> tuple[Any, ...]:
    """The first seed plan of fuzz_targets (Conv, Relu, MaxPool), with the input tensor 'x'
    (an arena tensor of float32) or the first constant changed."""
    import fuzz_targets

    tensors, constants, *rest = copy.deepcopy(fuzz_targets.plan_seeds()[0])
    tensors = [list(t) for t in tensors]
    x = next(t for t in tensors if t[0] == "x")
    assert x[3] == 0 and x[1] == TensorProto.FLOAT
    if "offset" in change:
        x[4] = change["offset"](x[4])
    if "dtype" in change:
        x[1] = change["dtype"]
    if "constant" in change:
        constants[0] = change["constant"](constants[0])
    return ([tuple(t) for t in tensors], constants, *rest)


def _unaligned(array: np.ndarray) -> np.ndarray:
    raw = np.zeros(array.nbytes + 1, np.uint8)
    view = np.frombuffer(raw.data, array.dtype, count=array.size, offset=1).reshape(array.shape)
    assert not view.flags.aligned
    return view


@needs_native
@pytest.mark.parametrize(("change", "message"), [
    # UBSan: a float stored at a misaligned address (k_reduce.cpp); the offset is now refused.
    ({"offset": lambda o: o - 2 if o else 2},
     r"tensor x: offset \d+ is not a multiple of its 4-byte elements"),
    ({"constant": _unaligned}, "tensor w: its data is not aligned to its 4-byte elements"),
    # UBSan: the message of the area check computed offset + nbytes unchecked (plan.cpp).
    ({"offset": lambda _: 2**63 - 1}, "size overflow: 9223372036854775807 \\+ 768"),
    # A multi-line error: nanobind lists every accepted signature on lines of their own.
    ({"dtype": -2**63}, r"__init__\(\): incompatible function arguments\. The following "
                        "argument types are supported:$"),
])
def test_malformed_native_plan(change: dict[str, Any], message: str) -> None:
    from onnxlens.backends.base import BackendError
    from onnxlens.backends.native_cpu import make_executor, native_module

    with pytest.raises(BackendError) as caught:
        make_executor(native_module(), _plan(**change), 1, "")
    assert "\n" not in str(caught.value)
    assert re.search(f"^native-cpu: invalid plan: {message}", str(caught.value)), caught.value


def test_native_plan_larger_than_memory_is_a_backend_error() -> None:
    """std::bad_alloc (an arena of 1 TiB, the most a plan may ask for) was a MemoryError."""
    from types import SimpleNamespace

    from onnxlens.backends.base import BackendError
    from onnxlens.backends.native_cpu import make_executor

    def executor(*_: Any) -> None:
        raise MemoryError("std::bad_alloc")

    fake = SimpleNamespace(Executor=executor, PlanError=RuntimeError)
    with pytest.raises(BackendError, match=r"^native-cpu: cannot allocate the plan's memory "
                                           r"\(std::bad_alloc\)$"):
        make_executor(fake, (), 1, "")
