"""The validation layer: what the cost model and the executors rely on, checked before they run.

onnx's checker and shape inference pass models that would make an executor divide by zero,
overflow its index arithmetic, allocate without bound or read out of range: a Conv with
``group=0`` or ``pads=[2**62, ...]``, a Range with ``delta=0``, Gather indices past the end.
Some even crash onnx's own inference. Two passes, one per stage of loading:

- `validate_model` runs on the proto before onnx's checker and shape inference (the loader
  calls it after its structure checks; a backend may call it on any proto): names that are not
  UTF-8, opset imports and domains, graph outputs, nesting of If/Loop/Scan bodies and
  local-function calls, recursion between local functions, the window attributes of Conv and
  pooling nodes, and what the constant inputs of Reshape, ConstantOfShape, Expand, Tile, Range
  and Resize ask for. Nodes inside bodies and local functions are checked too. It also decides
  what onnx's inference may safely be given (`Validation.make_inference_safe`, `data_prop`).
- `Validation.check_shapes` runs on the inferred shapes of the main graph: channel and group
  arithmetic and output sizes of Conv, ConvTranspose and pooling, the inner dimension of Gemm
  and MatMul, constant Gather indices, and the shapes other cost formulas rely on.

`check_inputs` and `check_input_tensor` check what a user feeds a backend. What onnx's strict
shape inference already refuses with the node named (Slice axes and steps, Transpose perms,
kernel_shape of the wrong rank ...) is not checked again here.

The limits are in one place, `Limits`. Every problem is an `OnnxLensError` naming the node
(by name, or by position and op type), the attribute or input, and the value.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn, Protocol

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto

from .errors import InvalidModelError, OnnxLensError, ShapeError, UsageError
from .ir import (
    DEFERRED,
    Dim,
    NodeFields,
    TensorInfo,
    dtype_bits,
    dtype_bytes,
    dtype_name,
    packed_bytes,
    read_nodes,
)


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits a model must stay within; each a positive integer.

    - `max_tensor_bytes` (256 GiB): the largest tensor, initializer, input or intermediate,
      and the largest request of a ConstantOfShape, Expand, Tile, Range or Resize node. Also
      the largest single dimension.
    - `max_nesting_depth` (32): If/Loop/Scan bodies and local-function calls, nested. Real
      models nest a few levels; protobuf refuses messages nested past 100 levels (about 33
      levels of bodies) anyway.
    - `max_window_value` (2**31 - 1): the largest kernel_shape, strides, dilations, pads,
      output_padding or group value of a Conv or pooling node, and the largest blocksize or
      GatherND batch_dims. Past it, the index arithmetic of an executor
      (``out * stride + k * dilation - pad``) could overflow int64.
    - `max_expanded_nodes` (1,000,000): the nodes of the model with every local-function call
      inlined (a call counts as itself plus its function's expanded size; If/Loop/Scan bodies
      counted once, as shape inference sees them). Counted from the call graph before anything
      expands: functions that each call the next twice make 2**depth nodes of a 2 KB file,
      and onnx's shape inference expands every call (about 1.2 s per million nodes here).
    """

    max_tensor_bytes: int = 1 << 38
    max_nesting_depth: int = 32
    max_window_value: int = (1 << 31) - 1
    max_expanded_nodes: int = 1_000_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"--{f.name.replace('_', '-')} {value!r}: must be a positive "
                                 "integer")


DEFAULT_LIMITS = Limits()

# Past this many elements in a graph input or a requested tensor, onnx's data propagation is
# left off (about 5 s of it at 2**25 elements on this machine).
_DATA_PROP_MAX_ELEMENTS = 1 << 25
# Constant inputs bigger than this are not read (checking them would cost more than it saves;
# shape inference and the size checks still see what they produce).
_MAX_CONSTANT_ELEMENTS = 1 << 20
_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})
# Domains whose ops ONNX Runtime implements (its contrib and layout ops, ATen fallback).
_RUNTIME_DOMAINS = frozenset({"com.microsoft", "com.microsoft.nchwc",
                              "com.microsoft.experimental", "com.ms.internal.nhwc",
                              "org.pytorch.aten"})
_NUMERIC_TYPES = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
    TensorProto.BOOL})
_SHOWN_VALUES = 8


def _known_opsets() -> dict[str, int]:
    """Domain -> the newest opset version this onnx knows ("" for ai.onnx)."""
    from onnx.onnx_cpp2py_export.defs import schema_version_map

    return {domain: high for domain, (_, high) in schema_version_map().items()}


# ---- the pass before shape inference ----------------------------------------------------------


Array = np.ndarray
FunctionKey = tuple[str, str, str]  # domain, name, overload


@dataclass
class Validation:
    """What `validate_model` found: warnings for the analysis, and the shape checks to run once
    shapes are inferred (`check_shapes`)."""

    limits: Limits
    warnings: list[str] = field(default_factory=list)
    shape_checks: list[tuple[Check, NodeView]] = field(default_factory=list, repr=False)
    eyelike_dtype: bool = False  # an EyeLike with a dtype somewhere: see `make_inference_safe`
    largest_elements: int = 0  # of a graph input or a tensor a constant input asks for

    @property
    def data_prop(self) -> bool:
        """Whether onnx's shape inference may propagate data (shapes computed from shapes).

        Its data propagation takes time linear in the length of every 1-D tensor that reaches
        Gather, Slice, Squeeze, Add ... (onnx 1.23: 6 s for 3e7 elements, minutes for 2**31).
        It is left off, with a warning, when a graph input or a tensor that a constant input
        asks for (Range, ConstantOfShape, Expand, Tile, Resize) is that big.
        """
        return self.largest_elements <= _DATA_PROP_MAX_ELEMENTS

    def make_inference_safe(self, copy: onnx.ModelProto) -> None:
        """Rewrite, in the copy of the model made for onnx's checker and shape inference, the
        nodes whose inference crashes onnx.

        Known: EyeLike with a `dtype` whose input has no type (the output of a custom op, or of
        a node whose own inference failed): onnx 1.23 reads the missing type, a segmentation
        fault. It becomes Cast(to=dtype), which infers the same type and shape; the 2-D rule
        of EyeLike is checked on the inferred shapes instead (`check_shapes`).
        """
        if not self.eyelike_dtype:
            return
        graphs: list[onnx.GraphProto] = [copy.graph]
        bodies: list[Sequence[onnx.NodeProto]] = [f.node for f in copy.functions]
        while graphs or bodies:
            nodes = graphs.pop().node if graphs else bodies.pop()
            for node in nodes:
                for attr in node.attribute:
                    graphs += [attr.g] if attr.type == AttributeProto.GRAPH else attr.graphs
                dtype = next((a for a in node.attribute if a.name == "dtype"), None)
                if node.op_type == "EyeLike" and dtype is not None and node.domain in \
                        _DEFAULT_DOMAINS:
                    to = AttributeProto()
                    to.CopyFrom(dtype)
                    to.name = "to"
                    node.op_type = "Cast"
                    del node.attribute[:]
                    node.attribute.append(to)

    def check_shapes(self, tensors: Mapping[str, TensorInfo]) -> list[str]:
        """The checks that need inferred shapes, on the main graph's nodes; the warnings they
        add.

        A check that reads only attributes and shapes passes or fails alike on nodes that
        agree in both (most Conv nodes of a model do): each such combination is checked once.
        """
        passed: set[tuple[Any, ...]] = set()
        before = len(self.warnings)
        for check, view in self.shape_checks:
            view.tensors = tensors
            key = view.signature(check) if check in _SHAPE_ONLY else None
            if key is None or key not in passed:
                check(view)
                if key is not None:
                    passed.add(key)
        return self.warnings[before:]


def validate_model(proto: onnx.ModelProto, *, limits: Limits = DEFAULT_LIMITS,
                   nodes: Sequence[NodeFields] | None = None) -> Validation:
    """Check what needs no inferred shape; the returned `Validation` checks the rest later.

    External data must already be read (constant inputs with external data are not looked at).
    `nodes`: the main graph's nodes already read (`read_nodes`), as the loader has them.
    """
    validation = Validation(limits, _check_opsets(proto))
    for prop in proto.metadata_props:  # exported with the analysis
        check_text(prop.key, "metadata key")
        check_text(prop.value, f"metadata {prop.key!r} value")
    _check_graph(proto.graph, validation)
    _check_packed(proto.graph.initializer)
    walker = _Walker(proto, limits, validation)
    walker.check_functions()
    walker.check_main_graph(read_nodes(proto.graph.node) if nodes is None else nodes)
    if not validation.data_prop:
        validation.warnings.append(
            f"onnx's shape data propagation is off: a tensor of "
            f"{validation.largest_elements:,} elements would make it take minutes; shapes "
            "computed from shapes may stay unknown")
    return validation


def _check_opsets(proto: onnx.ModelProto) -> list[str]:
    """Versions in range, each domain imported once; custom domains become a warning."""
    known = _known_opsets()
    local = {f.domain for f in proto.functions}
    custom: list[str] = []
    scopes = [("opset_import", proto.opset_import)]
    scopes += [(f"local function {f.domain}::{f.name} opset_import", f.opset_import)
               for f in proto.functions]
    for f in proto.functions:
        for field_name in ("domain", "name", "overload"):
            check_text(getattr(f, field_name), f"local function {field_name}")
    for where, imports in scopes:
        seen: dict[str, int] = {}
        for entry in imports:
            check_text(entry.domain, f"{where}: domain")
            domain = "" if entry.domain == "ai.onnx" else entry.domain
            shown = repr(entry.domain or "ai.onnx")
            if domain in seen:
                raise InvalidModelError(f"{where}: domain {shown} imported twice (versions "
                                        f"{seen[domain]} and {entry.version})")
            seen[domain] = entry.version
            newest = known.get(domain)
            if entry.version < 1 or (newest is not None and entry.version > newest):
                span = f"1 to {newest}" if newest is not None else "1 or more"
                raise InvalidModelError(
                    f"{where}: domain {shown} version {entry.version} is out of range ({span}"
                    + (", for this onnx" if newest is not None else "") + ")")
            if (newest is None and domain not in _RUNTIME_DOMAINS and domain not in local
                    and domain not in custom and where == "opset_import"):
                custom.append(domain)
    if not custom:
        return []
    return [f"custom op domain(s) {', '.join(map(repr, custom))}: their ops are checked by "
            "nothing here and their cost is unknown"]


def check_text(value: str | bytes, what: str) -> None:
    """protobuf hands a string field that is not valid UTF-8 over as bytes: refuse it (names
    end up in dict keys, JSON, reports and regular expressions)."""
    if value.__class__ is not str:
        raise InvalidModelError(f"{what} {value[:60]!r} is not valid UTF-8 text")


def _check_graph(graph: onnx.GraphProto, validation: Validation) -> None:
    """The main graph's name, its inputs' and outputs' names and dim names are text; no output
    is listed twice. Notes the size of the largest input."""
    check_text(graph.name, "graph name")
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            check_text(value.name, f"graph {kind}")
            elements = 1
            for d in value.type.tensor_type.shape.dim:
                check_text(d.dim_param, f"graph {kind} {value.name!r} dim")
                elements *= max(d.dim_value, 1)
            if kind == "input":
                validation.largest_elements = max(validation.largest_elements, elements)
    seen: set[str] = set()
    for out in graph.output:
        if out.name in seen:
            raise InvalidModelError(f"graph output {out.name!r} is listed twice")
        seen.add(out.name)


_PACKED = frozenset({TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1,
                     TensorProto.INT2, TensorProto.UINT2})


def _check_packed(initializers: Sequence[TensorProto]) -> None:
    """A sub-byte initializer holds exactly ceil(values * bits / 8) packed bytes, in raw_data
    or one byte per int32_data entry (onnx's checker refuses too few raw bytes only)."""
    for t in initializers:
        if t.data_type not in _PACKED or t.data_location == TensorProto.EXTERNAL:
            continue
        values = math.prod(t.dims)
        expected = packed_bytes(t.data_type, values)
        got = len(t.raw_data) if t.HasField("raw_data") else len(t.int32_data)
        if got != expected:
            raise InvalidModelError(
                f"initializer {t.name!r} ({dtype_name(t.data_type)}, {values:,} values): "
                f"{got:,} bytes of packed data, expected {expected:,} "
                f"({8 // dtype_bits(t.data_type)} values per byte)")


_INT, _INTS, _STRING, _TENSOR = (AttributeProto.INT, AttributeProto.INTS, AttributeProto.STRING,
                                  AttributeProto.TENSOR)
_VIEWED = frozenset({_INT, _INTS, _STRING, _TENSOR})  # the attribute kinds the checks read


class NodeView:
    """One node as the checks see it: attributes, constant inputs, known shapes, a label.

    Attributes and input names are read from the proto once (protobuf field access is slow)
    and kept as plain values for the checks before and after shape inference."""

    __slots__ = ("_index", "_scope", "_where", "attrs", "limits", "node", "op",
                 "opset", "tensors", "validation")

    def __init__(self, node: NodeFields, op: str, index: int, where: str, opset: int,
                 scope: _Scope, validation: Validation, tensors: Mapping[str, TensorInfo]
                 ) -> None:
        self.node, self.op = node, op
        self.opset = opset
        self.validation = validation
        self.limits = validation.limits
        self.tensors = tensors  # the shapes known so far
        self._scope = scope
        self._index, self._where = index, where
        # Attribute name -> (type, value) for ints, int lists, strings and tensors (attribute
        # references of local functions left out).
        self.attrs: dict[str, tuple[int, Any]] = {}
        for name, kind, value in node.attributes:
            if kind in _VIEWED and value is not DEFERRED:
                self.attrs[name] = (kind, value)

    @property
    def label(self) -> str:
        return _node_label(self.node, self._index, self._where)

    def fail(self, error: type[OnnxLensError], text: str) -> NoReturn:
        raise error(f"{self.label}: {text}")

    def signature(self, check: Check) -> tuple[Any, ...] | None:
        """What `check` reads, if only attributes and input shapes (None if a tensor)."""
        attrs = []
        for name, (kind, value) in self.attrs.items():
            if kind == _TENSOR:
                return None
            attrs.append((name, tuple(value) if kind == _INTS else value))
        shapes = []
        for name in self.input_names():
            info = self.tensors.get(name) if name else None
            shapes.append(None if info is None else (info.elem_type, info.shape))
        return check, self.op, tuple(attrs), tuple(shapes)

    def _get(self, name: str, kind: int) -> Any:
        found = self.attrs.get(name)
        return found[1] if found is not None and found[0] == kind else None

    def ints(self, name: str) -> list[int] | None:
        return self._get(name, _INTS)

    def int(self, name: str, default: int) -> int:
        value = self._get(name, _INT)
        return default if value is None else value

    def tensor(self, name: str) -> TensorProto | None:
        return self._get(name, _TENSOR)

    def text(self, name: str, default: str) -> str:
        value = self._get(name, _STRING)
        return default if value is None else value

    def input_name(self, position: int) -> str:
        inputs = self.node.inputs
        return inputs[position] if position < len(inputs) else ""

    def input_names(self) -> list[str]:
        return self.node.inputs

    def const(self, position: int) -> Array | None:
        """The value of a constant input (initializer or Constant node), if small and sound."""
        name = self.input_name(position)
        return self._scope.value(name) if name else None

    def dims(self, position: int) -> list[Dim] | None:
        """The shape of an input where known (dims may be symbolic or None)."""
        info = self.tensors.get(self.input_name(position))
        return list(info.shape) if info is not None and info.shape is not None else None

    def output_dims(self, position: int) -> list[Dim] | None:
        outputs = self.node.outputs
        info = self.tensors.get(outputs[position]) if position < len(outputs) else None
        return list(info.shape) if info is not None and info.shape is not None else None

    def elem_type(self, position: int) -> int:
        info = self.tensors.get(self.input_name(position))
        return info.elem_type if info is not None else 0

    def fits(self, dims: Sequence[int], elem_type: int, what: str) -> None:
        """Refuse a request for a tensor over the byte budget, or with one dim over it."""
        budget = self.limits.max_tensor_bytes
        elements = math.prod(dims)
        self.validation.largest_elements = max(self.validation.largest_elements, elements)
        nbytes = elements * dtype_bytes(elem_type)
        if nbytes > budget or any(d > budget for d in dims):
            self.fail(ShapeError, f"{what} asks for a {_show(dims)} tensor ({nbytes:,} bytes), "
                      f"over the {budget:,}-byte limit (--max-tensor-bytes)")


Check = Callable[[NodeView], None]


class _Walker:
    """Walks the main graph, its bodies and the local functions, checking each node."""

    def __init__(self, proto: onnx.ModelProto, limits: Limits, validation: Validation) -> None:
        self.proto = proto
        self.limits = limits
        self.validation = validation
        # What the views hold: `validation.shape_checks` keeps views, so a strong reference
        # back would make a cycle, and the whole tensor table garbage only the collector frees.
        self.for_views = weakref.proxy(validation)
        self.opset = next((o.version for o in proto.opset_import
                           if o.domain in _DEFAULT_DOMAINS), 0)
        self.functions: dict[FunctionKey, onnx.FunctionProto] = {
            (f.domain, f.name, f.overload): f for f in proto.functions}
        self.function_names = frozenset(f.name for f in proto.functions)
        # How deep each local function nests (itself counting 1), and the callee that makes it.
        self.depth: dict[FunctionKey, int] = {}
        self.via: dict[FunctionKey, FunctionKey | None] = {}
        # How many nodes each local function stands for with its calls inlined (`_depths`).
        self.size: dict[FunctionKey, int] = {}

    # -- local functions ------------------------------------------------------------------

    def check_functions(self) -> None:
        """Check each body once; refuse recursion; compute each function's nesting depth."""
        calls: dict[FunctionKey, list[tuple[int, FunctionKey]]] = {}
        inner: dict[FunctionKey, int] = {}
        nodes: dict[FunctionKey, int] = {}
        for key, function in self.functions.items():
            where = f"local function {_function_name(key)}: "
            opset = next((o.version for o in function.opset_import
                          if o.domain in _DEFAULT_DOMAINS), self.opset)
            inner[key], calls[key], nodes[key] = self._walk(
                read_nodes(function.node), where, opset, _Scope(()), {}, main=False)
        for root in self.functions:
            if root not in self.depth:
                self._depths(root, calls, inner, nodes)

    def _depths(self, root: FunctionKey, calls: Mapping[FunctionKey, list[tuple[int,
                FunctionKey]]], inner: Mapping[FunctionKey, int],
                nodes: Mapping[FunctionKey, int]) -> None:
        """Depth-first over the call graph from `root`, without recursion in Python (a path
        longer than the nesting limit is refused, so it stays short). Each function's depth
        and expanded size (its nodes plus its callees' expanded sizes: ints, never a copy)
        are computed once, after its callees'."""
        path: list[FunctionKey] = [root]
        stack: list[Iterator[tuple[int, FunctionKey]]] = [iter(calls[root])]
        limit = self.limits.max_nesting_depth
        while stack:
            for _, callee in stack[-1]:
                if callee in path:
                    cycle = [*path[path.index(callee):], callee]
                    raise InvalidModelError(
                        "local functions are recursive: "
                        + " -> ".join(_function_name(k) for k in cycle))
                if callee not in self.depth:
                    if len(path) >= limit:
                        self._too_deep(f"local function {_function_name(path[0])}",
                                       len(path) + 1, [*path[1:], callee], at_least=True)
                    path.append(callee)
                    stack.append(iter(calls[callee]))
                    break
            else:
                stack.pop()
                key = path.pop()
                deepest, via = inner[key], None
                for level, callee in calls[key]:
                    if level + self.depth[callee] > deepest:
                        deepest, via = level + self.depth[callee], callee
                self.depth[key], self.via[key] = deepest + 1, via
                self.size[key] = nodes[key] + sum(self.size[c] for _, c in calls[key])
                if deepest + 1 > limit:
                    self._too_deep(f"local function {_function_name(key)}", deepest + 1,
                                   self._chain(via))

    def _chain(self, first: FunctionKey | None) -> list[FunctionKey]:
        """The calls that make a function as deep as it is, from `first` down."""
        chain: list[FunctionKey] = []
        while first is not None:
            chain.append(first)
            first = self.via.get(first)
        return chain

    def _too_deep(self, where: str, depth: int, chain: list[FunctionKey], *,
                  at_least: bool = False) -> NoReturn:
        shown = " -> ".join(_function_name(k) for k in chain[:4])
        more = " -> ..." if len(chain) > 4 else ""
        how = f" (calls {shown}{more})" if chain else ""
        raise InvalidModelError(
            f"{where}: If/Loop/Scan bodies and local-function calls nest "
            f"{'at least ' if at_least else ''}{depth} deep{how}, over the limit of "
            f"{self.limits.max_nesting_depth} (Limits.max_nesting_depth)")

    # -- the main graph -------------------------------------------------------------------

    def check_main_graph(self, nodes: Sequence[NodeFields]) -> None:
        graph = self.proto.graph
        deepest, calls, count = self._walk(nodes, "", self.opset, _Scope(graph.initializer),
                                           _ShapesBeforeInference(graph), main=True)
        for level, callee in calls:
            if level + self.depth[callee] > deepest:
                deepest = level + self.depth[callee]
                if deepest > self.limits.max_nesting_depth:
                    self._too_deep("graph", deepest, self._chain(callee))
        self._check_expanded(count, [callee for _, callee in calls])

    def _check_expanded(self, count: int, calls: list[FunctionKey]) -> None:
        """The main graph's nodes with every call inlined, within `max_expanded_nodes`."""
        limit = self.limits.max_expanded_nodes
        total = count + sum(self.size[c] for c in calls)
        if total <= limit:
            return
        times: dict[FunctionKey, int] = {}
        for c in calls:
            times[c] = times.get(c, 0) + 1
        worst = max(times, key=lambda c: times[c] * self.size[c])
        raise InvalidModelError(
            f"the model expands to {_count(total)} nodes with its local functions inlined "
            f"(local function {_function_name(worst)}: {_count(self.size[worst])} nodes, called "
            f"{times[worst]:,} time(s) by the graph), over the limit of {limit:,} "
            "(Limits.max_expanded_nodes; raise it with --max-expanded-nodes)")

    # -- one graph and its bodies ---------------------------------------------------------

    def _walk(self, nodes: Sequence[NodeFields], where: str, opset: int, scope: _Scope,
              known: Mapping[str, TensorInfo], *, main: bool
              ) -> tuple[int, list[tuple[int, FunctionKey]], int]:
        """Check `nodes` and every body under them (iteratively, depth-first).

        Returns the deepest body level reached (0: none), the local-function calls, each
        with the body level it is made from (0: a node of `nodes` itself), and the number of
        nodes in `nodes` and its bodies.
        """
        limit = self.limits.max_nesting_depth
        calls: list[tuple[int, FunctionKey]] = []
        deepest = count = 0
        work: list[tuple[Sequence[NodeFields] | Sequence[onnx.NodeProto], str, int, _Scope]] = [
            (nodes, where, 0, scope)]
        wanted = _WANTED | self.function_names
        while work:
            found, here, level, scope = work.pop()
            body = found if level == 0 else read_nodes(found)  # bodies: read when reached
            deepest = max(deepest, level)
            count += len(body)
            shape_checks = _SHAPE_CHECKS if main and level == 0 else {}
            for index, node in enumerate(body):
                op, domain = node.op_type, node.domain
                if not (op.__class__ is str and domain.__class__ is str
                        and node.name.__class__ is str):
                    for field_name in ("op_type", "domain", "name"):
                        check_text(getattr(node, field_name),
                                   f"{here}node #{index} {field_name}")
                if op not in wanted:
                    continue
                if domain not in _DEFAULT_DOMAINS:
                    key = (domain, op, node.proto.overload)
                    if key in self.functions:
                        calls.append((level, key))
                    elif shape_checks and domain == CONTRIB_DOMAIN and op in _CONTRIB_SHAPE_CHECKS:
                        self.validation.shape_checks.append((_CONTRIB_SHAPE_CHECKS[op], NodeView(
                            node, op, index, here, opset, scope, self.for_views, known)))
                    continue
                if op == "Constant":
                    scope.add_constant(node.proto)
                    continue
                check, shape_check = _CHECKS.get(op), shape_checks.get(op)
                if check is not None or shape_check is not None:
                    view = NodeView(node, op, index, here, opset, scope, self.for_views,
                                    known)
                    if check is not None:
                        check(view)
                    if shape_check is not None:
                        self.validation.shape_checks.append((shape_check, view))
                if op == "EyeLike" and any(name == "dtype" for name, _, _ in node.attributes):
                    self.validation.eyelike_dtype = True
                if op in _CONTROL_FLOW:
                    for attr in node.proto.attribute:
                        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else (
                            list(attr.graphs) if attr.type == AttributeProto.GRAPHS else [])
                        for g in graphs:
                            if level + 1 > limit:
                                raise InvalidModelError(
                                    f"{_node_label(node, index, here)}: body {attr.name!r} is "
                                    f"nested {level + 1} deep, over the limit of {limit} "
                                    "(Limits.max_nesting_depth)")
                            parent = _node_label(node, index, "")
                            work.append((g.node, f"body {attr.name!r} of {parent}: ",
                                         level + 1, _Scope(g.initializer, scope)))
        return deepest, calls, count


def _node_label(node: NodeFields, index: int, where: str) -> str:
    name = repr(node.name) if node.name else f"#{index}"
    return f"{where}node {name} ({node.op_type})"


def _count(n: int) -> str:
    """A node count; past 10**15 as a power of ten (a call tree can reach 10**90)."""
    return f"{n:,}" if n < 10**15 else f"about 10**{len(str(n)) - 1}"


def _function_name(key: FunctionKey) -> str:
    domain, name, overload = key
    return f"{domain}::{name}" + (f":{overload}" if overload else "")


# ---- constants --------------------------------------------------------------------------------


class _Scope:
    """The constants a graph sees: its initializers and Constant outputs, read on demand (the
    first lookup indexes the initializers), over those of the graphs around it."""

    __slots__ = ("_constants", "_index", "_initializers", "_outer", "_values")

    def __init__(self, initializers: Sequence[TensorProto], outer: _Scope | None = None) -> None:
        self._initializers = initializers
        self._outer = outer
        self._index: dict[str, TensorProto] | None = None
        self._constants: dict[str, TensorProto | Array] = {}
        self._values: dict[str, Array | None] = {}

    def add_constant(self, node: onnx.NodeProto) -> None:
        if not node.output or not node.attribute or node.attribute[0].ref_attr_name:
            return
        attr = node.attribute[0]
        if attr.type == AttributeProto.TENSOR:
            self._constants[node.output[0]] = attr.t
        elif attr.type in (AttributeProto.INT, AttributeProto.INTS):
            self._constants[node.output[0]] = np.array(onnx.helper.get_attribute_value(attr),
                                                       np.int64)
        elif attr.type in (AttributeProto.FLOAT, AttributeProto.FLOATS):
            self._constants[node.output[0]] = np.array(onnx.helper.get_attribute_value(attr),
                                                       np.float32)

    def value(self, name: str) -> Array | None:
        if name in self._values:
            return self._values[name]
        source = self._constants.get(name)
        if source is None:
            if self._index is None:
                self._index = {t.name: t for t in self._initializers}
            source = self._index.get(name)
        if source is None:
            return self._outer.value(name) if self._outer is not None else None
        value = source if isinstance(source, np.ndarray) else _array(source)
        self._values[name] = value
        return value


class _ShapesBeforeInference(Mapping[str, TensorInfo]):
    """The main graph's shapes known before inference (graph inputs, initializers), indexed on
    the first lookup."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._graph = graph
        self._table: dict[str, TensorInfo] | None = None

    def _known(self) -> dict[str, TensorInfo]:
        if self._table is None:
            self._table = {}
            for value in self._graph.input:
                tensor_type = value.type.tensor_type
                dims = tuple(d.dim_value if d.HasField("dim_value") else None
                             for d in tensor_type.shape.dim)
                self._table[value.name] = TensorInfo(
                    value.name, tensor_type.elem_type,
                    dims if tensor_type.HasField("shape") else None)
            for t in self._graph.initializer:
                self._table[t.name] = TensorInfo(t.name, t.data_type, tuple(t.dims))
        return self._table

    def __getitem__(self, name: str) -> TensorInfo:
        return self._known()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._known())

    def __len__(self) -> int:
        return len(self._known())


def _array(t: TensorProto) -> Array | None:
    """A small numeric tensor's value; None when it is big, external or malformed (the checker
    and the loader report malformed ones)."""
    dims = list(t.dims)
    if (t.data_type not in _NUMERIC_TYPES or t.data_location == TensorProto.EXTERNAL
            or any(d < 0 for d in dims) or math.prod(dims) > _MAX_CONSTANT_ELEMENTS):
        return None
    count = math.prod(dims)
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    if t.HasField("raw_data"):
        if len(t.raw_data) != count * itemsize:
            return None
    elif len(getattr(t, onnx.helper.tensor_dtype_to_field(t.data_type))) != count:
        return None
    try:
        return onnx.numpy_helper.to_array(t)
    except ValueError:
        return None


# ---- checks before shape inference ------------------------------------------------------------


def _show(values: Sequence[object]) -> str:
    shown = ", ".join(str(v) for v in values[:_SHOWN_VALUES])
    return f"[{shown}{', ...' if len(values) > _SHOWN_VALUES else ''}]"


_WINDOW_LOW = {"kernel_shape": 1, "strides": 1, "dilations": 1, "pads": 0, "output_padding": 0,
               "output_shape": 1}


def _window(v: NodeView) -> None:
    """Conv and pooling attributes: kernel, strides and dilations at least 1, pads and
    output_padding at least 0, group at least 1, none past `max_window_value`; ranks agree."""
    limit = v.limits.max_window_value
    ranks: dict[str, int] = {}
    for name, (kind, values) in v.attrs.items():
        low = _WINDOW_LOW.get(name)
        if low is None or kind != _INTS:
            continue
        if values and (min(values) < low or max(values) > limit):
            for value in values:
                if value < low:
                    v.fail(InvalidModelError, f"attribute {name} = {_show(values)}: {value} is "
                           + ("negative" if low == 0 else "not positive"))
                if value > limit:
                    v.fail(InvalidModelError, f"attribute {name} = {_show(values)}: {value:,} "
                           f"is over the limit of {limit:,} (Limits.max_window_value)")
        if name == "pads" and len(values) % 2:
            v.fail(InvalidModelError, f"attribute pads = {_show(values)}: an odd count "
                   f"({len(values)}); pads holds a begin and an end per spatial axis")
        ranks[name] = len(values) // 2 if name == "pads" else len(values)
    if len(set(ranks.values())) > 1:
        v.fail(InvalidModelError, "attributes disagree on the number of spatial axes: "
               + ", ".join(f"{k} {n}" for k, n in sorted(ranks.items())))
    group = v.int("group", 1)
    if not 1 <= group <= limit:
        v.fail(InvalidModelError, f"attribute group = {group}: must be between 1 and {limit:,}")


def _reshape(v: NodeView) -> None:
    shape = v.const(1)
    if shape is None:
        return
    values = shape.reshape(-1).tolist()
    where = f"shape input {v.input_name(1)!r} = {_show(values)}"
    if values.count(-1) > 1:
        v.fail(InvalidModelError, f"{where} has more than one -1")
    bad = next((d for d in values if d < -1), None)
    if bad is not None:
        v.fail(InvalidModelError, f"{where} has {bad}; a dim is -1, 0 or positive")
    if v.int("allowzero", 0) and 0 in values and -1 in values:
        v.fail(InvalidModelError, f"{where} has both 0 and -1 with allowzero=1")


def _requested_dims(v: NodeView, position: int, what: str) -> list[int] | None:
    """A constant shape-like input as non-negative ints (None if not constant)."""
    value = v.const(position)
    if value is None:
        return None
    dims = value.reshape(-1).tolist()
    if not all(isinstance(d, int) for d in dims):
        v.fail(InvalidModelError, f"{what} input {v.input_name(position)!r} holds non-integers")
    bad = next((d for d in dims if d < 0), None)
    if bad is not None:
        v.fail(InvalidModelError, f"{what} input {v.input_name(position)!r} = {_show(dims)} "
               f"has the negative value {bad}")
    return dims


def _known_dims(v: NodeView, position: int) -> list[int | None]:
    """An input's dims as known before inference: ints, or None where unknown."""
    dims = v.dims(position) or []
    return [d if isinstance(d, int) else None for d in dims]


def _constant_of_shape(v: NodeView) -> None:
    dims = _requested_dims(v, 0, "shape")
    if dims is not None:
        value = v.tensor("value")
        elem_type = value.data_type if value is not None else TensorProto.FLOAT
        v.fits(dims, elem_type, f"shape input {v.input_name(0)!r}")


def _expand(v: NodeView) -> None:
    shape = _requested_dims(v, 1, "shape")
    if shape is None:
        return
    data = _known_dims(v, 0)
    rank = max(len(data), len(shape))
    data = [1] * (rank - len(data)) + data
    shape = [1] * (rank - len(shape)) + shape
    # Broadcasting: a 1 in `shape` keeps the input's dim (unknown ones count as 1).
    out = [(d if d is not None else 1) if s == 1 else s for d, s in zip(data, shape, strict=True)]
    v.fits(out, v.elem_type(0), f"shape input {v.input_name(1)!r}")


def _tile(v: NodeView) -> None:
    repeats = _requested_dims(v, 1, "repeats")
    if repeats is None:
        return
    data = _known_dims(v, 0)
    out = [(d if d is not None else 1) * r for d, r in zip(data + [1] * len(repeats), repeats,
                                                           strict=False)]
    v.fits(out, v.elem_type(0), f"repeats input {v.input_name(1)!r}")


def _range(v: NodeView) -> None:
    values = [v.const(i) for i in range(3)]
    if any(x is None or x.size != 1 for x in values):
        return
    start, limit, delta = (x.reshape(-1)[0].item() for x in values)  # type: ignore[union-attr]
    names = ", ".join(repr(v.input_name(i)) for i in range(3))
    if not all(math.isfinite(x) for x in (start, limit, delta)):
        v.fail(InvalidModelError, f"inputs {names} = {start}, {limit}, {delta}: not finite")
    if delta == 0:
        v.fail(InvalidModelError, f"delta input {v.input_name(2)!r} is 0: the range never ends")
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        count = max(-((start - limit) // delta), 0)
    else:
        steps = (limit - start) / delta
        if not math.isfinite(steps) or steps > v.limits.max_tensor_bytes:
            v.fail(ShapeError, f"inputs {names} = {start}, {limit}, {delta} ask for "
                   f"{steps:.3g} elements, over the {v.limits.max_tensor_bytes:,}-byte limit "
                   "(--max-tensor-bytes)")
        count = max(math.ceil(steps), 0)
    v.fits([count], v.elem_type(0) or TensorProto.FLOAT, f"inputs {names}")


def _resize(v: NodeView) -> None:
    """Resize (and Upsample): scales finite and positive, what they or `sizes` ask for within
    the budget. Inputs: X, roi, scales, sizes from opset 11; X, scales before."""
    scales_at, sizes_at = (2, 3) if v.op == "Resize" and v.opset >= 11 else (1, None)
    data = _known_dims(v, 0)
    scales = v.const(scales_at)
    if scales is not None and scales.size:
        values = scales.reshape(-1).tolist()
        where = f"scales input {v.input_name(scales_at)!r} = {_show(values)}"
        bad = next((s for s in values if not (math.isfinite(s) and s > 0)), None)
        if bad is not None:
            v.fail(InvalidModelError, f"{where} has {bad}; scales must be finite and positive")
        budget = v.limits.max_tensor_bytes
        if any(s > budget for s in values):
            v.fail(ShapeError, f"{where} asks for more than the {budget:,}-byte limit "
                   "(--max-tensor-bytes)")
        dims = data if len(data) == len(values) else [None] * len(values)
        out = [math.floor((d if d is not None else 1) * s) for d, s in zip(dims, values,
                                                                           strict=True)]
        v.fits(out, v.elem_type(0), where)
    if sizes_at is not None:
        sizes = _requested_dims(v, sizes_at, "sizes")
        if sizes:
            v.fits(sizes, v.elem_type(0), f"sizes input {v.input_name(sizes_at)!r}")


def _einsum_terms(v: NodeView) -> list[str]:
    """The operand terms of the equation, without spaces."""
    return v.text("equation", "").replace(" ", "").split("->")[0].split(",")


def _einsum(v: NodeView) -> None:
    """One term per operand, each of letters and at most one '...'."""
    equation = v.text("equation", "")
    terms = _einsum_terms(v)
    operands = [name for name in v.input_names() if name]
    if len(terms) != len(operands):
        v.fail(InvalidModelError, f"attribute equation {equation!r} has {len(terms)} operand "
               f"term(s) for {len(operands)} input(s)")
    for term in terms:
        head, _, tail = term.partition("...")
        if not all(c.isascii() and c.isalpha() for c in head + tail):
            v.fail(InvalidModelError, f"attribute equation {equation!r}: term {term!r} is not "
                   "letters with at most one '...'")


def _blocksize(v: NodeView) -> None:
    size = v.int("blocksize", 1)
    if not 1 <= size <= v.limits.max_window_value:
        v.fail(InvalidModelError, f"attribute blocksize = {size}: must be between 1 and "
               f"{v.limits.max_window_value:,}")


def _gather_nd(v: NodeView) -> None:
    """GatherND's batch_dims is not negative: onnx 1.23's inference crashes on -2**31."""
    batch_dims = v.int("batch_dims", 0)
    if not 0 <= batch_dims <= v.limits.max_window_value:
        v.fail(InvalidModelError, f"attribute batch_dims = {batch_dims}: must be between 0 and "
               f"{v.limits.max_window_value:,}")


def _split(v: NodeView) -> None:
    """Split's num_outputs (opset 18) is the number of outputs: onnx 1.23's inference indexes
    past its table otherwise (an abort)."""
    parts = v.int("num_outputs", 0)
    outputs = len(v.node.outputs)
    if "num_outputs" in v.attrs and parts != outputs:
        v.fail(InvalidModelError, f"attribute num_outputs = {parts}, but the node has {outputs} "
               "output(s)")


def _group_norm(v: NodeView) -> None:
    groups = v.int("num_groups", 1)
    if groups < 1:
        v.fail(InvalidModelError, f"attribute num_groups = {groups}: must be at least 1")


_WINDOW_OPS = ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "MaxPool", "AveragePool",
               "LpPool")
_CHECKS: dict[str, Check] = {
    **dict.fromkeys(_WINDOW_OPS, _window),
    "Reshape": _reshape,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "Resize": _resize,
    "Upsample": _resize,
    "Einsum": _einsum,
    "GroupNormalization": _group_norm,
    "DepthToSpace": _blocksize,
    "SpaceToDepth": _blocksize,
    "Split": _split,
    "GatherND": _gather_nd,
}


# ---- checks on inferred shapes ----------------------------------------------------------------


def _ints(dims: list[Dim] | None) -> list[int | None] | None:
    return [d if isinstance(d, int) else None for d in dims] if dims is not None else None


def _spatial_out(v: NodeView, spatial: list[int | None], kernel: Sequence[int | None],
                 *, transpose: bool = False) -> None:
    """Each output dim of a window op must be at least 1 and within the budget.

    Conv / pool: floor((in + pad_begin + pad_end - ((k - 1) * dilation + 1)) / stride) + 1
    (ceil with ceil_mode; SAME_* pads to ceil(in / stride), VALID pads nothing).
    ConvTranspose: stride * (in - 1) + output_padding + (k - 1) * dilation + 1 - pads
    (SAME_*: in * stride), unless output_shape gives it.
    """
    n = len(spatial)
    strides = v.ints("strides") or [1] * n
    dilations = v.ints("dilations") or [1] * n
    pads = v.ints("pads") or [0] * (2 * n)
    auto_pad = v.text("auto_pad", "NOTSET")
    output_padding = v.ints("output_padding") or [0] * n
    if transpose and v.ints("output_shape"):
        return
    ceil_mode = bool(v.int("ceil_mode", 0))
    if not (len(strides) == len(dilations) == len(output_padding) == n == len(kernel)
            and len(pads) == 2 * n):
        return  # ranks that disagree are refused by shape inference
    for axis in range(n):
        size, k = spatial[axis], kernel[axis]
        if size is None or k is None:
            continue
        s, d = strides[axis], dilations[axis]
        reach = (k - 1) * d + 1
        if transpose:
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = size * s
            else:
                out = s * (size - 1) + output_padding[axis] + reach - pads[axis] - pads[axis + n]
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
        else:
            padded = size + (0 if auto_pad == "VALID" else pads[axis] + pads[axis + n])
            out = (-(-(padded - reach) // s) if ceil_mode else (padded - reach) // s) + 1
        if out < 1:
            why = (f"input {size}, stride {s}, kernel {k}, pads {pads[axis]} + "
                   f"{pads[axis + n]}" if transpose else
                   f"the window (kernel {k}, dilation {d}) is larger than the padded input "
                   f"({size} + pads {pads[axis]} + {pads[axis + n]})")
            v.fail(ShapeError, f"output spatial dim {axis} would be {out}: {why}")
        if out > v.limits.max_tensor_bytes:
            v.fail(ShapeError, f"output spatial dim {axis} would be {out:,}, over the "
                   f"{v.limits.max_tensor_bytes:,}-byte limit (--max-tensor-bytes)")


_CONV_POSITIONS = {"Conv": (0, 1, 2), "ConvInteger": (0, 1, None), "QLinearConv": (0, 3, 8)}


def _conv_shapes(v: NodeView) -> None:
    """Conv: X [N, C, ...], W [M, C / group, k...], B [M]: C = W[1] * group, M % group = 0."""
    xi, wi, bi = _CONV_POSITIONS[v.op]
    x, w = _ints(v.dims(xi)), _ints(v.dims(wi))
    xn, wn = v.input_name(xi), v.input_name(wi)
    for name, dims in ((xn, x), (wn, w)):
        if dims is not None and len(dims) < 3:
            v.fail(ShapeError, f"{name!r} {_show(dims)} has rank {len(dims)}; Conv takes rank 3 "
                   "or more (batch or output channels, channels, spatial axes)")
    if x is None or w is None:
        return
    if len(w) != len(x):
        v.fail(ShapeError, f"input {xn!r} {_show(x)} and weight {wn!r} {_show(w)} differ in rank")
    group = v.int("group", 1)
    channels, per_group, maps = x[1], w[1], w[0]
    if channels is not None and per_group is not None and channels != per_group * group:
        v.fail(ShapeError, f"input {xn!r} has {channels} channels, but weight {wn!r} "
               f"{_show(w)} with group {group} takes {per_group} x {group} = "
               f"{per_group * group}")
    if maps is not None and maps % group:
        v.fail(ShapeError, f"weight {wn!r} {_show(w)} has {maps} output channels, not a "
               f"multiple of group {group}")
    kernel = v.ints("kernel_shape")
    if kernel is not None and len(kernel) == len(w) - 2 and any(
            k != d for k, d in zip(kernel, w[2:], strict=True) if d is not None):
        v.fail(ShapeError, f"attribute kernel_shape = {_show(kernel)} does not match weight "
               f"{wn!r} {_show(w)}")
    bias = _ints(v.dims(bi)) if bi is not None and v.input_name(bi) else None
    if bias is not None and maps is not None and bias not in ([maps], [None]):
        v.fail(ShapeError, f"bias {v.input_name(bi)!r} {_show(bias)} should be [{maps}], one "
               "value per output channel")
    _spatial_out(v, x[2:], w[2:])


def _conv_transpose_shapes(v: NodeView) -> None:
    """ConvTranspose: X [N, C, ...], W [C, M / group, k...]: C = W[0]."""
    x, w = _ints(v.dims(0)), _ints(v.dims(1))
    for name, dims in ((v.input_name(0), x), (v.input_name(1), w)):
        if dims is not None and len(dims) < 3:  # (a scalar weight reached the cost formula)
            v.fail(ShapeError, f"{name!r} {_show(dims)} has rank {len(dims)}; ConvTranspose "
                   "takes rank 3 or more (batch or input channels, channels, spatial axes)")
    if x is None or w is None or len(w) != len(x):
        return
    if x[1] is not None and w[0] is not None and x[1] != w[0]:
        v.fail(ShapeError, f"input {v.input_name(0)!r} has {x[1]} channels, but weight "
               f"{v.input_name(1)!r} {_show(w)} takes {w[0]}")
    _spatial_out(v, x[2:], w[2:], transpose=True)


def _pool_shapes(v: NodeView) -> None:
    x, kernel = _ints(v.dims(0)), v.ints("kernel_shape")
    if x is None or kernel is None or len(x) != len(kernel) + 2:
        return
    _spatial_out(v, x[2:], kernel)


_MATMUL_POSITIONS = {"Gemm": (0, 1), "MatMul": (0, 1), "MatMulInteger": (0, 1),
                     "QLinearMatMul": (0, 3)}


def _matmul_shapes(v: NodeView) -> None:
    """The inner dimension K of A and B agree (Gemm: after transA / transB).

    Strict onnx inference refuses a mismatch it sees; this also guards shapes that ONNX
    Runtime's symbolic inference merged, which the cost formulas take K from."""
    ai, bi = _MATMUL_POSITIONS[v.op]
    a, b = _ints(v.dims(ai)), _ints(v.dims(bi))
    if not a or not b:
        return
    if v.op == "Gemm":
        if len(a) != 2 or len(b) != 2:
            return
        ka, kb = a[0 if v.int("transA", 0) else 1], b[1 if v.int("transB", 0) else 0]
    else:
        ka, kb = a[-1], b[-2] if len(b) >= 2 else b[0]
    if ka is not None and kb is not None and ka != kb:
        v.fail(ShapeError, f"inner dimensions differ: {v.input_name(ai)!r} {_show(a)} has K = "
               f"{ka}, {v.input_name(bi)!r} {_show(b)} has K = {kb}")


def _gather_shapes(v: NodeView) -> None:
    """Constant indices lie in [-d, d - 1], d the size of the gathered axis."""
    data, indices = _ints(v.dims(0)), v.const(1)
    if data is None or indices is None or not indices.size:
        return
    axis = v.int("axis", 0)
    if not -len(data) <= axis < len(data):
        return  # refused by shape inference
    size = data[axis]
    if size is None or indices.dtype.kind not in "iu":
        return
    low, high = int(indices.min()), int(indices.max())
    bad = low if low < -size else high if high >= size else None
    if bad is not None:
        v.fail(InvalidModelError, f"index {bad} in constant input {v.input_name(1)!r} is out "
               f"of range for axis {axis} of {v.input_name(0)!r} (size {size})")


def _einsum_shapes(v: NodeView) -> None:
    """Each term names one index per dim of its operand ('...' stands for the rest)."""
    for position, term in enumerate(_einsum_terms(v)):
        dims = v.dims(position)
        labels = len(term.replace("...", ""))
        if dims is not None and (labels > len(dims) if "..." in term else labels != len(dims)):
            v.fail(ShapeError, f"equation term {term!r} does not fit input "
                   f"{v.input_name(position)!r} of rank {len(dims)}")


def _norm_shapes(v: NodeView) -> None:
    """Instance and group normalization: X [N, C, ...]; C a multiple of num_groups."""
    x = _ints(v.dims(0))
    if x is None:
        return
    if len(x) < 2:
        v.fail(ShapeError, f"input {v.input_name(0)!r} has rank {len(x)}; it must be "
               "[batch, channels, ...]")
    groups = v.int("num_groups", 1)
    if v.op == "GroupNormalization" and x[1] is not None and x[1] % groups:
        v.fail(ShapeError, f"input {v.input_name(0)!r} has {x[1]} channels, not a multiple of "
               f"num_groups {groups}")


def _axes_shapes(v: NodeView) -> None:
    """MeanVarianceNormalization: every axis (default 0, 2, 3) within the input's rank."""
    dims = v.dims(0)
    axes = v.ints("axes") or [0, 2, 3]
    if dims is not None and any(not -len(dims) <= a < len(dims) for a in axes):
        v.fail(ShapeError, f"axes {_show(axes)} out of range for input {v.input_name(0)!r} of "
               f"rank {len(dims)}")


def _block_shapes(v: NodeView) -> None:
    """DepthToSpace: C a multiple of blocksize**2; SpaceToDepth: H and W multiples of it."""
    x, size = _ints(v.dims(0)), v.int("blocksize", 1)
    if x is None or len(x) != 4:
        return
    depth = v.op == "DepthToSpace"
    for axis, multiple in ([(1, size * size)] if depth else [(2, size), (3, size)]):
        if x[axis] is not None and x[axis] % multiple:
            v.fail(ShapeError, f"input {v.input_name(0)!r} {_show(x)}: dim {axis} is not a "
                   f"multiple of {multiple} (blocksize {size})")


def _axis_shapes(v: NodeView) -> None:
    """Layer and RMS normalization: an input of rank 1 or more, `axis` within it."""
    dims, axis = v.dims(0), v.int("axis", -1)
    if dims is not None and not -len(dims) <= axis < len(dims):
        v.fail(ShapeError, f"attribute axis = {axis} is out of range for input "
               f"{v.input_name(0)!r} of rank {len(dims)}")


def _resize_shapes(v: NodeView) -> None:
    """Resize and Upsample keep the rank (the cost formula pairs input and output dims)."""
    x, y = v.dims(0), v.output_dims(0)
    if x is not None and y is not None and len(x) != len(y):
        v.fail(ShapeError, f"output {v.node.outputs[0]!r} of rank {len(y)} for input "
               f"{v.input_name(0)!r} of rank {len(x)}: scales, sizes or roi do not fit the "
               "input")


def _eyelike_shapes(v: NodeView) -> None:
    dims = v.dims(0)
    if dims is not None and len(dims) != 2:
        v.fail(ShapeError, f"input {v.input_name(0)!r} has rank {len(dims)}; EyeLike takes a "
               "2-D tensor")


# Quantized ops: (scale, zero point, quantized tensor) positions per quantization parameter
# set; the tensor is an input position, or -1 for output 0 (what QuantizeLinear writes).
_QUANT_PARAMS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "QuantizeLinear": ((1, 2, -1),),
    "DequantizeLinear": ((1, 2, 0),),
    "QLinearConv": ((1, 2, 0), (4, 5, 3), (6, 7, -1)),
    "QLinearMatMul": ((1, 2, 0), (4, 5, 3), (6, 7, -1)),
}


def _quant_shapes(v: NodeView) -> None:
    """Scales that are constants are positive and not NaN (a zero scale divides by zero, a
    negative one flips the values); an infinite one is a warning: ORT's quantizer writes it
    for a tensor whose range overflows float32 (a TorchScript attention mask's -3.4e38), and
    ORT runs the model (the tensor quantizes to its zero point and dequantizes to NaN); the
    cost does not depend on it. A zero point has the type of the tensor it quantizes; for
    QuantizeLinear and DequantizeLinear, a per-axis or blocked scale fits the tensor."""
    for scale_at, zero_at, data_at in _QUANT_PARAMS[v.op]:
        scale = v.const(scale_at)
        if scale is not None and scale.dtype.kind == "f" and scale.size and not np.all(
                scale > 0):
            bad = scale[~(scale > 0)].flat[0]
            v.fail(InvalidModelError, f"scale {v.input_name(scale_at)!r} holds {bad}: a "
                   "quantization scale must be positive (and not NaN)")
        if scale is not None and scale.dtype.kind == "f" and np.any(np.isinf(scale)):
            v.validation.warnings.append(
                f"{v.label}: scale {v.input_name(scale_at)!r} holds inf (the quantizer met a "
                "range past float32's): the tensor quantizes to its zero point and dequantizes "
                "to NaN; costed as any other scale")
        if not v.input_name(zero_at):
            continue
        data = v.node.outputs[0] if data_at < 0 else v.input_name(data_at)
        data_type = v.tensors[data].elem_type if data in v.tensors else 0
        zero_type = v.elem_type(zero_at)
        if data_type and zero_type and data_type != zero_type:
            v.fail(InvalidModelError, f"zero point {v.input_name(zero_at)!r} is "
                   f"{dtype_name(zero_type)}, but {data!r} is {dtype_name(data_type)}: they "
                   "must have one type")
    if v.op in ("QuantizeLinear", "DequantizeLinear"):
        _quant_axis(v)


def _quant_axis(v: NodeView) -> None:
    """Per axis: `axis` within the rank, scale [dims[axis]]. Blocked (block_size > 0): the
    scale has the input's rank, ceil(dims[axis] / block_size) blocks along `axis` (ONNX's
    rule: the last block may be short) and the input's other dims."""
    x, scale = v.dims(0), v.dims(1)
    block = v.int("block_size", 0)
    if x is None or scale is None or (math.prod(d or 2 for d in scale) == 1 and not block):
        return  # per tensor: axis is not read
    axis = v.int("axis", 1)
    if not -len(x) <= axis < len(x):
        v.fail(ShapeError, f"attribute axis = {axis} is out of range for input "
               f"{v.input_name(0)!r} of rank {len(x)}")
    axis %= len(x)
    size = x[axis]
    if block < 0:
        v.fail(InvalidModelError, f"attribute block_size = {block}: must be 0 (per axis) or "
               "positive")
    if not block:
        if len(scale) != 1 or None in (scale[0], size) or scale[0] == size:
            return
        v.fail(ShapeError, f"scale {v.input_name(1)!r} {_show(scale)} has {scale[0]} values "
               f"for axis {axis} of {v.input_name(0)!r} {_show(x)}, which has {size}")
    expected = [-(-d // block) if i == axis and isinstance(d, int) else d
                for i, d in enumerate(x)]
    if len(scale) != len(x) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                   for a, b in zip(scale, expected, strict=True)):
        v.fail(ShapeError, f"block_size {block} does not divide axis {axis} of "
               f"{v.input_name(0)!r} {_show(x)} into the blocks of scale {v.input_name(1)!r} "
               f"{_show(scale)}: expected {_show(expected)}")


def _both(first: Check, second: Check) -> Check:
    def check(v: NodeView) -> None:
        first(v)
        second(v)

    return check


_SHAPE_CHECKS: dict[str, Check] = {
    "QuantizeLinear": _quant_shapes,
    "DequantizeLinear": _quant_shapes,
    "Conv": _conv_shapes,
    "ConvInteger": _conv_shapes,
    "QLinearConv": _both(_conv_shapes, _quant_shapes),
    "ConvTranspose": _conv_transpose_shapes,
    "MaxPool": _pool_shapes,
    "AveragePool": _pool_shapes,
    "LpPool": _pool_shapes,
    **dict.fromkeys(_MATMUL_POSITIONS, _matmul_shapes),
    "QLinearMatMul": _both(_matmul_shapes, _quant_shapes),
    "Gather": _gather_shapes,
    "EyeLike": _eyelike_shapes,
    "Einsum": _einsum_shapes,
    "InstanceNormalization": _norm_shapes,
    "GroupNormalization": _norm_shapes,
    "MeanVarianceNormalization": _axes_shapes,
    "DepthToSpace": _block_shapes,
    "SpaceToDepth": _block_shapes,
    "LayerNormalization": _axis_shapes,
    "RMSNormalization": _axis_shapes,
    "Resize": _resize_shapes,
    "Upsample": _resize_shapes,
}


def _block_size(v: NodeView, block: int) -> None:
    """A block-quantized contrib op's `block_size` (MatMulNBits', GatherBlockQuantized's): a
    power of 2 from 16."""
    if block < 16 or block & (block - 1) or block > v.limits.max_window_value:
        v.fail(InvalidModelError, f"attribute block_size = {block}: must be a power of 2, at "
               "least 16")


def _n_bits_shapes(v: NodeView) -> None:
    """MatMulNBits: `bits` 2 to 8, `block_size` a power of 2 from 16, A's last dim K, and B the
    K x N weights packed as [N, ceil(K / block_size), block_size * bits / 8] bytes, with one
    scale per block of each column (the cost formula reads K and N)."""
    bits, block = v.int("bits", 4), v.int("block_size", 0)
    k, n = v.int("K", 0), v.int("N", 0)
    if not 2 <= bits <= 8:
        v.fail(InvalidModelError, f"attribute bits = {bits}: must be between 2 and 8")
    _block_size(v, block)
    if k < 1 or n < 1:
        v.fail(InvalidModelError, f"attributes K = {k}, N = {n}: both must be positive")
    a = v.dims(0)
    if a and isinstance(a[-1], int) and a[-1] != k:
        v.fail(ShapeError, f"input {v.input_name(0)!r} {_show(a)} has K = {a[-1]}, but "
               f"attribute K = {k}")
    blocks = -(-k // block)
    expected = [n, blocks, block * bits // 8]
    b = v.dims(1)
    if b is not None and all(isinstance(d, int) for d in b) and b != expected:
        v.fail(ShapeError, f"B {v.input_name(1)!r} {_show(b)} does not hold K = {k} x N = {n} "
               f"weights of {bits} bits packed in blocks of {block}: expected {_show(expected)}")
    scales = _ints(v.dims(2))
    if scales is not None and None not in scales and math.prod(scales) != n * blocks:
        v.fail(ShapeError, f"scales {v.input_name(2)!r} {_show(scales)} should hold {n * blocks} "
               f"values, one per block of {block} of each of N = {n} columns")


def _gather_block_shapes(v: NodeView) -> None:
    """GatherBlockQuantized: `bits` 4 or 8 (ORT's kernel), `block_size` a power of 2 from 16,
    `gather_axis` and `quantize_axis` within the table's rank (the shape rule and the cost
    formula read them)."""
    bits, block = v.int("bits", 4), v.int("block_size", 128)
    if bits not in (4, 8):
        v.fail(InvalidModelError, f"attribute bits = {bits}: must be 4 or 8")
    _block_size(v, block)
    data = v.dims(0)
    for name, default in (("gather_axis", 0), ("quantize_axis", 1)):
        axis = v.int(name, default)
        if data is not None and not -len(data) <= axis < len(data):
            v.fail(InvalidModelError, f"attribute {name} = {axis}: out of range for the "
                   f"{len(data)}-D table {v.input_name(0)!r}")


def _moe_shapes(v: NodeView) -> None:
    """MoE / QMoE: an `activation_type` the cost formula knows (ORT's five), top `k` between 1
    and the experts (fc1's first dim), fc1 3-D; QMoE's weight bits 2, 4 or 8."""
    act = v.text("activation_type", "relu")
    if act not in ("relu", "gelu", "silu", "identity", "swiglu"):
        v.fail(InvalidModelError, f"attribute activation_type = {act!r}: must be relu, gelu, "
               "silu, identity or swiglu")
    fc1 = v.dims(2)
    if fc1 is not None and len(fc1) != 3:
        v.fail(ShapeError, f"fc1_experts_weights {v.input_name(2)!r} {_show(fc1)}: expected 3-D "
               "[experts, rows, K]")
    k = v.int("k", 1)
    if k < 1 or (fc1 is not None and isinstance(fc1[0], int) and k > fc1[0]):
        v.fail(InvalidModelError, f"attribute k = {k}: must be between 1 and the "
               f"{fc1[0] if fc1 else '?'} experts")
    bits = [v.int(name, v.int("expert_weight_bits", 4)) for name in (
        "fc1_expert_weight_bits", "fc2_expert_weight_bits", "fc3_expert_weight_bits")]
    if v.op == "QMoE" and any(b not in (2, 4, 8) for b in bits):
        v.fail(InvalidModelError, f"expert weight bits {bits}: each must be 2, 4 or 8")


CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops
_CONTRIB_SHAPE_CHECKS: dict[str, Check] = {
    "MoE": _moe_shapes,
    "QMoE": _moe_shapes,
    "MatMulNBits": _n_bits_shapes,
    "GatherBlockQuantized": _gather_block_shapes,
    "QuantizeLinear": _quant_shapes,
    "DequantizeLinear": _quant_shapes,
}
_SHAPE_ONLY = frozenset({_conv_shapes, _conv_transpose_shapes, _pool_shapes, _matmul_shapes})
_WANTED = frozenset({*_CHECKS, *_SHAPE_CHECKS, *_CONTRIB_SHAPE_CHECKS, *_CONTROL_FLOW,
                     "Constant"})


# ---- inputs given by the user -----------------------------------------------------------------


class ExpectedInput(Protocol):
    """What a backend knows of a graph input (`backends.base.InputSpec` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> np.dtype: ...
    @property
    def shape(self) -> tuple[Dim, ...]: ...


def check_input_tensor(tensor: TensorProto, where: str) -> None:
    """A TensorProto read from a user's .pb file: its data inside the file, its type known."""
    if tensor.data_location == TensorProto.EXTERNAL or tensor.external_data:
        raise UsageError(f"{where}: the tensor's data is in another file (external data); only "
                         "self-contained .pb inputs are read")
    if tensor.data_type not in _NUMERIC_TYPES:
        raise UsageError(f"{where}: unsupported tensor data type {tensor.data_type}")


def check_inputs(sample: Mapping[str, np.ndarray], expected: Sequence[ExpectedInput],
                 where: str) -> None:
    """Arrays fed to a model: the rank and fixed dims of each input, one value per symbolic
    dim, and a dtype that converts within its kind (float64 data for a float32 input is
    converted; float data for an integer input is refused)."""
    symbols: dict[str, tuple[int, str]] = {}
    for spec in expected:
        array = sample[spec.name]
        what = f"{where}: input {spec.name!r}"
        if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
            raise UsageError(f"{what} is {array.dtype}, but the model takes {spec.dtype}")
        got = array.shape
        if len(got) != len(spec.shape):
            raise UsageError(f"{what} has shape {_show(got)} (rank {len(got)}), but the model "
                             f"takes rank {len(spec.shape)}: {_show(_named(spec.shape))}")
        for axis, (want, have) in enumerate(zip(spec.shape, got, strict=True)):
            if isinstance(want, int) and want != have:
                raise UsageError(f"{what} has shape {_show(got)}, but the model takes "
                                 f"{_show(_named(spec.shape))} (dim {axis} differs)")
            if isinstance(want, str):
                first = symbols.setdefault(want, (have, spec.name))
                if first[0] != have:
                    raise UsageError(f"{what}: dim {want!r} is {have}, but {first[0]} in input "
                                     f"{first[1]!r}")


def _named(shape: Sequence[Dim]) -> list[object]:
    return ["?" if d is None else d for d in shape]
