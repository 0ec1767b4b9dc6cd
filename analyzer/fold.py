"""Constant folding: the values of nodes computed from constants alone, node by node.

One evaluator (`fold_nodes`) serves every place that folds:

- the loader (`fold_shape_subgraphs`): exporters often compute a shape at run time
  (`Shape -> Gather -> Div -> Concat -> Reshape`, or Swin's window padding
  `Shape -> Sub -> Mod -> Concat -> Pad`). onnx's data propagation follows only some of those
  ops, and a Pad whose pads it cannot see leaves every later shape unknown. With the input
  shapes pinned such subgraphs are constants: their values (small integer tensors only) go
  back to shape inference as initializers. Nothing here changes the analyzed graph; it only
  lets inference see through it.
- the exporter, which writes the folded values into the exported graph as Constant nodes;
- the native executor's plan (`backends/native/fold.py`), which computes every static node
  once, weights included, and runs only the rest.

`static_nodes` is the same rule without values: which nodes a runtime that folds (ONNX Runtime
when a session loads) computes before running anything (`backends/profile_map.py`).

A node folds when it is a standard-domain op whose result is a function of its inputs, every
input it names has a value, and onnx's reference evaluator computes it; Shape and Size fold
from a known shape alone. Whatever the evaluator cannot do (an op it lacks, a value it
mishandles, a result over `max_elements`) leaves that node unfolded: folding never raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from .ir import NodeInfo, TensorInfo

# Ops whose outputs are not a function of their inputs (random, or Dropout in training mode),
# or that read values other than their inputs (subgraphs): never folded.
NEVER_FOLDED = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "Dropout", "If", "Loop", "Scan",
})
_SHAPE_OPS = frozenset({"Shape", "Size"})  # computed from a known shape, not from values

# The ops that shape subgraphs are made of: what the loader folds.
SHAPE_ARITHMETIC = frozenset({
    "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Floor", "Ceil", "Max", "Min", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where", "Cast",
    "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Range",
    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "Expand", "Tile", "Sqrt",
    "ConstantOfShape", "Transpose", "Flatten", "Size", "Shape", "Constant",
})
MAX_ELEMENTS = 4096  # a value the loader folds larger than this is not shape arithmetic

Dims = Callable[[str], Sequence[int] | None]  # a tensor's shape, when known


def _no_dims(_name: str) -> None:
    return None


def fold_nodes(nodes: Iterable[onnx.NodeProto], values: dict[str, np.ndarray],
               opsets: Mapping[str, int], *, dims: Dims = _no_dims,
               ops: frozenset[str] | None = None, max_elements: int | None = None
               ) -> dict[str, np.ndarray]:
    """Fold `nodes` (in graph order): the values of the outputs of those that fold, by tensor
    name. `values` holds the constants known (initializers, earlier folds) and gets each new
    value too; a node whose outputs all have values is not evaluated again. `dims` gives the
    shapes Shape and Size read; `ops` limits folding to those op types; `max_elements` bounds
    every folded value (ops whose output size comes from a value are refused before they run).
    """
    folded: dict[str, np.ndarray] = {}
    for node in nodes:
        named = [o for o in node.output if o]
        if not named or all(o in values for o in named):
            continue
        outputs = evaluate_node(node, values, opsets, dims, ops, max_elements)
        if outputs is None:
            continue
        for name, value in zip(node.output, outputs, strict=False):
            if name:
                values[name] = folded[name] = value
    return folded


def evaluate_node(node: onnx.NodeProto, values: Mapping[str, np.ndarray],
                  opsets: Mapping[str, int], dims: Dims = _no_dims,
                  ops: frozenset[str] | None = None, max_elements: int | None = None
                  ) -> list[np.ndarray] | None:
    """The outputs of `node` on the constants in `values`, or None when it does not fold."""
    op = node.op_type
    if (node.domain not in ("", "ai.onnx") or op in NEVER_FOLDED
            or (ops is not None and op not in ops)):
        return None
    if op in _SHAPE_OPS:
        source = node.input[0] if node.input else ""
        shape = values[source].shape if source in values else dims(source)
        return None if shape is None else [shape_value(op, tuple(shape), _ints(node))]
    if any(name and name not in values for name in node.input):
        return None
    inputs = [values[name] if name else None for name in node.input]
    if op == "Constant" and node.attribute and node.attribute[0].name == "value":
        tensor = node.attribute[0].t
        if max_elements is not None and _count(tensor.dims) > max_elements:
            return None
        return [numpy_helper.to_array(tensor)]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if max_elements is not None and not _output_fits(op, inputs, max_elements, axis):
        return None
    return _run_reference(node, inputs, opsets, max_elements)


def _run_reference(node: onnx.NodeProto, inputs: list[np.ndarray | None],
                   opsets: Mapping[str, int], max_elements: int | None
                   ) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    feeds = {name: v for name, v in zip(node.input, inputs, strict=True) if name}
    try:
        outputs = ReferenceEvaluator(node, opsets=dict(opsets)).run(None, feeds)
    except Exception:  # an op the reference lacks, or one it gets wrong: the node stays
        return None
    arrays = [np.asarray(o) if isinstance(o, np.ndarray | np.generic) else None
              for o in outputs]
    if any(a is None or (max_elements is not None and a.size > max_elements) for a in arrays):
        return None  # a sequence, an optional, or too large
    return arrays  # type: ignore[return-value]


def shape_value(op: str, dims: tuple[int, ...], attrs: Mapping[str, int]) -> np.ndarray:
    """Shape's output (its `start` / `end` slice of `dims`) or Size's."""
    if op == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    return np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))], dtype=np.int64)


def static_nodes(nodes: Iterable[NodeInfo], constants: Iterable[str]) -> set[str]:
    """The names of `nodes` (in graph order) that a runtime folds before it runs anything, by
    the rule of `fold_nodes` in any domain (ONNX Runtime folds its own ops too), without
    computing a value: `constants` are the tensors with a value from the start (initializers).
    Shape and Size fold when their input's shape is known."""
    static: set[str] = set()
    constant = set(constants)
    for info in nodes:
        inputs = [t for t in info.inputs if t is not None]
        if info.op_type in NEVER_FOLDED:
            continue
        if ((info.op_type in _SHAPE_OPS and inputs and inputs[0].known)
                or all(t.name in constant for t in inputs)):
            static.add(info.name)
            constant.update(t.name for t in info.outputs)
    return static


def fold_shape_subgraphs(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo],
                         known: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Values of node outputs computable from known shapes and small constants (the loader's
    folding: SHAPE_ARITHMETIC ops, values of at most MAX_ELEMENTS).

    `known`: values folded before (an earlier round); their nodes are not evaluated again.
    """
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer
              if _count(t.dims) <= MAX_ELEMENTS}
    values.update(known or {})
    opsets = {o.domain: o.version for o in model.opset_import}

    def shape_of(name: str) -> tuple[int, ...] | None:
        info = tensors.get(name)
        return info.dims if info is not None and info.known else None

    new = fold_nodes(graph.node, values, opsets, dims=shape_of, ops=SHAPE_ARITHMETIC,
                     max_elements=MAX_ELEMENTS)
    return {**(known or {}), **new}


def _ints(node: onnx.NodeProto) -> dict[str, int]:
    return {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}


def _count(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


# Ops whose output takes the broadcast shape of their inputs.
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Equal", "Less",
                           "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Where"})


def _output_fits(op: str, inputs: list[np.ndarray | None], max_elements: int, axis: int = 0
                 ) -> bool:
    """Refuse, before computing, an output over `max_elements`: inputs of that size at most
    can ask for far more (a [4096, 1] times a [1, 4096] is 16M elements, a Where of three
    such 4096**3), so every op's output size is bounded from its inputs first."""
    try:
        if op == "ConstantOfShape":
            size = int(np.prod(np.ravel(inputs[0]))) if inputs and inputs[0] is not None else 1
        elif op == "Expand":
            target = tuple(int(d) for d in np.ravel(inputs[1]))
            size = int(np.prod(np.broadcast_shapes(inputs[0].shape, target)))  # type: ignore[union-attr]
        elif op == "Tile":
            size = int(inputs[0].size * np.prod(np.ravel(inputs[1])))  # type: ignore[union-attr]
        elif op == "Range":
            start, limit, delta = (float(np.ravel(v)[0]) for v in inputs)  # type: ignore[arg-type]
            size = int((limit - start) / delta) if delta else max_elements + 1
        elif op in _BROADCASTING:
            size = math.prod(np.broadcast_shapes(*(v.shape for v in inputs if v is not None)))
        elif op == "Gather":  # data.shape[:axis] + indices.shape + data.shape[axis + 1:]
            data, indices = inputs[0], inputs[1]
            along = data.shape[axis]  # type: ignore[union-attr]
            size = indices.size * (data.size // along) if along else 0  # type: ignore[union-attr]
        else:  # the rest (Concat, Slice, Reshape, Cast, Reduce* ...) make at most what they read
            size = sum(v.size for v in inputs if v is not None)
    except (ValueError, TypeError, AttributeError, IndexError):
        return False
    return 0 <= size <= max_elements
