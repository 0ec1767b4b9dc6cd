"""Static nodes: nodes whose outputs are known before anything runs, evaluated once.

With every input shape fixed, a node is static when all its inputs are constants (initializers
or outputs of static nodes), or when it is a Shape / Size of a tensor of known shape. The
exporters leave many of them (shape arithmetic in ViT and Swin, Constant nodes); the plan
computes them here with `onnx.reference` and treats their outputs as constants. A static group
whose output crosses a group boundary still has its step: it copies the value into the arena.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ...analyzer.graph import ModelGraph
from ...analyzer.loader import LoadedModel

# Ops whose outputs differ from run to run, or that have side effects: never folded.
_NOT_STATIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                         "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def static_values(model: LoadedModel, mg: ModelGraph) -> tuple[dict[str, np.ndarray], set[str]]:
    """The value of every initializer and static node output, and the static node keys."""
    values = {name: numpy_helper.to_array(t) for name, t in model.initializers.items()}
    shapes: dict[str, np.ndarray] = {}
    static: list[str] = []
    known = set(values)
    for key in mg.order:
        info = mg.info(key)
        inputs = [t for t in info.inputs if t is not None]
        if info.op_type in ("Shape", "Size") and inputs and inputs[0].known:
            shapes[info.outputs[0].name] = _shape_value(info.op_type, inputs[0].dims, info.attrs)
        elif info.op_type in _NOT_STATIC or not all(t.name in known for t in inputs):
            continue
        static.append(key)
        known.update(t.name for t in info.outputs)
    values.update(shapes)
    pending = [k for k in static if mg.info(k).outputs[0].name not in shapes]
    if pending:
        values.update(_evaluate(model, mg, pending, values))
    return values, set(static)


def _shape_value(op: str, dims: tuple[int, ...], attrs: dict) -> np.ndarray:
    if op == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(dims[start:end], dtype=np.int64)


def _evaluate(model: LoadedModel, mg: ModelGraph, keys: list[str],
              values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the static nodes, in order, as one model fed by the values they read."""
    nodes = [model.proto.graph.node[mg.info(k).index] for k in keys]
    produced = {o for n in nodes for o in n.output if o}
    needed = {i for n in nodes for i in n.input if i and i not in produced}
    feeds = {name: values[name] for name in needed}
    graph = helper.make_graph(
        nodes, "static",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype),
                                       feeds[n].shape) for n in sorted(needed)],
        [onnx.ValueInfoProto(name=o) for o in sorted(produced)])
    sub = helper.make_model(graph, opset_imports=list(model.proto.opset_import),
                            ir_version=model.proto.ir_version)
    names = sorted(produced)
    results = ReferenceEvaluator(sub).run(names, feeds)
    return {n: np.asarray(v) for n, v in zip(names, results, strict=True)}
