"""Fold the shape arithmetic of a model whose input shapes are known.

Exporters often compute a shape at run time: `Shape -> Gather -> Div -> Concat -> Reshape`, or
Swin's window padding `Shape -> Sub -> Mod -> Concat -> Pad`. onnx's data propagation follows
only some of those ops, and a Pad whose pads it cannot see leaves every later shape unknown.
With the input shapes pinned such subgraphs are constants: we evaluate them (with
`onnx.reference`, node by node, small integer tensors only) and hand the values back to shape
inference as initializers. Nothing here changes the analyzed graph; it only lets inference
see through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from .ir import TensorInfo

# Ops that shape subgraphs are made of; each is evaluated only on small constant inputs.
FOLDABLE = frozenset({
    "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Floor", "Ceil", "Max", "Min", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where", "Cast",
    "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Range",
    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "Expand", "Tile", "Sqrt",
    "ConstantOfShape", "Transpose", "Flatten", "Size",
})
MAX_ELEMENTS = 4096  # a folded value larger than this is not shape arithmetic


def fold_shape_subgraphs(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo],
                         known: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Values of node outputs computable from known shapes and small constants.

    `known`: values folded before (an earlier round); their nodes are not evaluated again.
    """
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    values: dict[str, np.ndarray] = {
        t.name: numpy_helper.to_array(t) for t in graph.initializer
        if _small(t.dims)}
    values.update(known or {})
    opsets = {o.domain: o.version for o in model.opset_import}
    folded: dict[str, np.ndarray] = dict(known or {})
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or all(o in folded for o in node.output if o):
            continue
        outputs = _evaluate(node, values, tensors, opsets, ReferenceEvaluator)
        if outputs is None:
            continue
        for name, value in zip(node.output, outputs, strict=False):
            if name and isinstance(value, np.ndarray) and value.size <= MAX_ELEMENTS:
                values[name] = folded[name] = value
    return folded


def _small(dims: object) -> bool:
    n = 1
    for d in dims:  # type: ignore[attr-defined]
        n *= d
    return n <= MAX_ELEMENTS


# Ops whose output takes the broadcast shape of their inputs.
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Equal", "Less",
                           "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Where"})


def _output_small(op_type: str, inputs: list[np.ndarray | None], axis: int = 0
                  ) -> bool:
    """Refuse, before computing, an output over `MAX_ELEMENTS`: inputs of that size at most
    can ask for far more (a [4096, 1] times a [1, 4096] is 16M elements, a Where of three
    such 4096**3), so every op's output size is bounded from its inputs first."""
    try:
        if op_type == "ConstantOfShape":
            size = int(np.prod(np.ravel(inputs[0]))) if inputs[0] is not None else 1
        elif op_type == "Expand":
            target = tuple(int(d) for d in np.ravel(inputs[1]))
            size = int(np.prod(np.broadcast_shapes(inputs[0].shape, target)))
        elif op_type == "Tile":
            size = int(inputs[0].size * np.prod(np.ravel(inputs[1])))
        elif op_type == "Range":
            start, limit, delta = (float(np.ravel(v)[0]) for v in inputs)
            size = int((limit - start) / delta) if delta else MAX_ELEMENTS + 1
        elif op_type in _BROADCASTING:
            size = math.prod(np.broadcast_shapes(*(v.shape for v in inputs if v is not None)))
        elif op_type == "Gather":  # data.shape[:axis] + indices.shape + data.shape[axis + 1:]
            data, indices = inputs[0], inputs[1]
            along = data.shape[axis]
            size = indices.size * (data.size // along) if along else 0
        else:  # the rest (Concat, Slice, Reshape, Cast, Reduce* ...) make at most what they read
            size = sum(v.size for v in inputs if v is not None)
    except (ValueError, TypeError, AttributeError, IndexError):
        return False
    return 0 <= size <= MAX_ELEMENTS


def _evaluate(node: onnx.NodeProto, values: dict[str, np.ndarray],
              tensors: Mapping[str, TensorInfo], opsets: dict[str, int],
              evaluator: type) -> list[np.ndarray] | None:
    if node.op_type == "Constant":
        attr = next((a for a in node.attribute if a.name == "value"), None)
        if attr is None or not _small(attr.t.dims):
            return None
        return [numpy_helper.to_array(attr.t)]
    if node.op_type == "Shape":
        if node.input[0] in values:
            dims = values[node.input[0]].shape
        else:
            source = tensors.get(node.input[0])
            if source is None or not source.known:
                return None
            dims = source.dims
        attrs = {a.name: a.i for a in node.attribute}
        return [np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))],
                         dtype=np.int64)]
    if node.op_type not in FOLDABLE:
        return None
    inputs = [values.get(name) if name else None for name in node.input]
    if any(v is None for v, name in zip(inputs, node.input, strict=True) if name):
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if not _output_small(node.op_type, inputs, axis):
        return None
    try:
        run = evaluator(node, opsets=opsets)
        feeds = {name: v for name, v in zip(node.input, inputs, strict=True) if name}
        return list(run.run(None, feeds))
    except Exception:  # a node we cannot fold stays for inference to handle
        return None
