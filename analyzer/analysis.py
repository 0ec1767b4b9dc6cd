"""One analysis: load -> graph -> fusion -> cost per node and group -> totals and memory.

`analyze` is the Python API the CLI is a thin layer over. It raises `OnnxLensError`
subclasses for bad input, never anything else the user could have caused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

import onnx

from . import cost as _cost_families  # noqa: F401  (registers every formula)
from .cost.base import Cost, lookup
from .cost.precision import group_precision, mac_precision
from .errors import OnnxLensError, UnsupportedOpError, UsageError
from .fusion import Group, fuse
from .graph import ModelGraph, build_graph, collector_paused
from .ir import NodeInfo, Shape, TensorInfo, UnknownShape, dtype_name
from .llm import head_dim_pins, several_past_dims, unpinned_head_dims, window_pins
from .loader import REWRITE_NOTES, LoadedModel, load_model
from .memory import activation_peak_bytes
from .symbolic import MAX_SYMBOLS, formulas, pinned_shapes, sample_points, symbolic_dims
from .validate import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:  # estimates are on request: `analyze` alone imports neither
    from .estimate import Efficiency, ModelEstimate
    from .hardware import HardwareProfile

SCHEMA = "onnxlens/1"
# Formulas of symbolic dims take one analysis per sample point (5 for one symbol, 11 for two):
# past this many nodes times points (about 6 s here) the dims are analyzed at 1 only, so that
# the time stays bounded by the file's size.
SYMBOLIC_MAX_NODE_ANALYSES = 60_000


class Unknown(Enum):
    """Why a cost is unknown."""

    NO_FORMULA = "no cost formula"  # an op with no cost formula (reported as unsupported)
    SHAPE = "shape unknown"  # a tensor's shape that inference could not find


@dataclass(frozen=True, slots=True, init=False)
class NodeCost:
    """A node's cost, or why it is unknown (``cost is None``): `unknown` says which kind of
    reason, `unknown_reason` says it to a person (the JSON's and CSV's `unknown_reason`)."""

    cost: Cost | None
    unknown_reason: str | None = None
    unknown: Unknown | None = None

    def __init__(self, cost: Cost | None, unknown_reason: str | None = None,
                 unknown: Unknown | None = None) -> None:
        # As Cost's: one is built per node and per group.
        _set_cost(self, cost)
        _set_unknown_reason(self, unknown_reason)
        _set_unknown(self, unknown)


_set_cost, _set_unknown_reason, _set_unknown = (
    getattr(NodeCost, f).__set__ for f in ("cost", "unknown_reason", "unknown"))


@dataclass
class AnalysisResult:
    model: LoadedModel
    graph: ModelGraph
    groups: list[Group]
    node_costs: dict[str, NodeCost]
    group_costs: dict[int, NodeCost]
    activation_peak_bytes: int | None
    unsupported_ops: dict[str, list[str]]  # op_type -> node names
    flops_per_mac: int = 2
    warnings: list[str] = field(default_factory=list)
    # Symbolic input dims and the value each was analyzed at, and totals as their formulas.
    symbols: dict[str, int] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)
    # Filled on request: estimates per hardware key, sweep rows, what-if scenarios, LLM phases.
    estimates: dict[str, ModelEstimate] = field(default_factory=dict)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    whatif: dict[str, Any] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)  # a KV-cache decoder's phases (api)
    # The inputs as the model declares them, symbolic dims unpinned (`model` has them pinned).
    declared_inputs: list[TensorInfo] = field(default_factory=list)
    # Named dims pinned beyond those asked: a KV cache's head size (`analyze`'s `dims`).
    dims_added: dict[str, int] = field(default_factory=dict)

    def estimate(self, hw: HardwareProfile, precision: str | None = None,
                 efficiency: Efficiency | None = None) -> ModelEstimate:
        """Every group's latency and energy on `hw` (see `analyzer.estimate`), at `precision`:
        None is the graph's own (`default_precision`); a what-if precision needs an fp32
        graph."""
        from .estimate import estimate_model
        from .hardware import GRAPH

        own = self.default_precision
        if precision is None:
            precision = own
        elif own == GRAPH and precision != GRAPH:
            dtypes = ", ".join(k for k in self.macs_by_dtype if k != "float32")
            raise UsageError(f"precision {precision}: the model computes in {dtypes}, so its "
                             "estimate runs at the graph's own precision (leave --precision "
                             "out, or give 'graph'); a what-if precision applies to fp32 models")
        return estimate_model(self.graph, self.groups,
                              {g: nc.cost for g, nc in self.group_costs.items()},
                              {k: nc.cost for k, nc in self.node_costs.items()},
                              hw, precision, efficiency, self.model, self.group_precisions)

    @property
    def default_precision(self) -> str:
        """The precision an estimate runs at unless told: fp32 for a graph whose MACs are all
        float32 (or that has none), else `hardware.GRAPH`: a quantized or fp16 model's groups
        each run at the precision their graph gives them."""
        from .hardware import GRAPH

        return "fp32" if set(self.macs_by_dtype) <= {"float32"} else GRAPH

    def add_estimate(self, hw: HardwareProfile, precision: str | None = None,
                     efficiency: Efficiency | None = None) -> ModelEstimate:
        """`estimate`, kept in `estimates[hw.key]` (and so in the JSON)."""
        self.estimates[hw.key] = self.estimate(hw, precision, efficiency)
        return self.estimates[hw.key]

    # ---- totals -------------------------------------------------------------------------
    @cached_property
    def total(self) -> Cost:
        """Sum over nodes whose cost is known (see `incomplete`)."""
        # Field by field: adding Cost values would build one per node.
        macs = other_flops = transcendental = bytes_read = bytes_written = 0
        for nc in self.node_costs.values():
            c = nc.cost
            if c is not None:
                macs += c.macs
                other_flops += c.other_flops
                transcendental += c.transcendental
                bytes_read += c.bytes_read
                bytes_written += c.bytes_written
        # Parameters are counted once per initializer, however many nodes read it.
        params, param_bytes = _param_totals(self.model, self.graph)
        return Cost(macs, other_flops, transcendental, bytes_read, bytes_written, params,
                    param_bytes)

    @cached_property
    def node_precisions(self) -> dict[str, tuple[str, int]]:
        """Node key -> (the precision its MACs run at, its MACs), for the nodes with MACs (the
        rule: `cost.precision`); "unknown" where no operand type is known."""
        infos, producer = self.graph.infos, self.graph.producer

        def made(name: str) -> NodeInfo | None:
            key = producer.get(name)
            return infos[key] if key is not None else None

        return {key: (mac_precision(infos[key], made) or "unknown", nc.cost.macs)
                for key, nc in self.node_costs.items() if nc.cost is not None and nc.cost.macs}

    @cached_property
    def macs_by_dtype(self) -> dict[str, int]:
        """Total MACs per precision (`node_precisions`), largest first."""
        return _by_precision(self.node_precisions.values())

    @cached_property
    def group_precisions(self) -> dict[int, str]:
        """Group id -> its precision (`precision_of_group`)."""
        return {g.id: self.precision_of_group(g) for g in self.groups}

    def precision_of_group(self, group: Group) -> str:
        """The precision doing most of `group`'s MACs, or its output's type."""
        precisions = self.node_precisions
        macs = [precisions[k] for k in group.nodes if k in precisions]
        if len(macs) == 1:  # most groups: one Conv or MatMul, its precision
            return macs[0][0]
        infos = self.graph.infos
        return group_precision(_by_precision(macs), [infos[k] for k in group.nodes[-2:]])

    @property
    def incomplete(self) -> bool:
        return any(nc.cost is None for nc in self.node_costs.values())

    @property
    def totals(self) -> dict[str, Any]:
        t = self.total
        return {
            "macs": t.macs,
            "flops": t.flops(self.flops_per_mac),
            "transcendental": t.transcendental,
            "bytes_read": t.bytes_read,
            "bytes_written": t.bytes_written,
            "params": t.params,
            "param_bytes": t.param_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "nodes": len(self.graph),
            "groups": len(self.groups),
            "complete": not self.incomplete,
            "macs_by_dtype": dict(self.macs_by_dtype),
        }

    # ---- renderings -----------------------------------------------------------------------
    def to_dict(self, *, nodes: bool = True, top_groups: int | None = None) -> dict[str, Any]:
        """The JSON contract as a dict (`nodes=False`: without the per-node rows and the group
        edges; `top_groups`: the group rows the terminal summary lists, not all)."""
        from .serialize import analysis_to_dict

        return analysis_to_dict(self, nodes=nodes, top_groups=top_groups)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        from .serialize import write_json

        return write_json(self, path)

    def to_csv(self, path: str | os.PathLike | None = None, *, level: str = "nodes") -> str:
        from .serialize import write_csv

        return write_csv(self, path, level=level)

    def nodes_frame(self) -> Any:
        """The `nodes` rows as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.to_dict()["nodes"])

    def groups_frame(self) -> Any:
        """The `groups` rows as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.to_dict()["groups"])


def analyze(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    batch: int | None = None,
    strict: bool = False,
    flops_per_mac: int = 2,
    base_dir: str | os.PathLike | None = None,
    max_tensor_bytes: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
    symbolic: bool = True,
    dims: Mapping[str, int] | None = None,
) -> AnalysisResult:
    """Analyze a model given as a path, serialized bytes or a ModelProto.

    `dims` (named dims, ``{"sequence_length": 128}``, 0 allowed), `input_shapes` and `batch`
    pin dynamic dims; a KV cache's head dim they leave named is pinned too, to the head size
    its attention node reads (`llm.head_dim_pins`, `result.dims_added`). Dims left symbolic are,
    with `symbolic`, analyzed at 1 and the totals also given as formulas of them
    (`result.formulas`); without it, costs that depend on them are unknown. `strict` makes
    an op with no cost formula an error instead of a warning; `limits` bounds what a model
    may ask for (`validate.Limits`; `max_tensor_bytes` overrides its byte budget);
    `flops_per_mac` is 2 (one multiply, one add) unless a caller follows the 1-FLOP-per-MAC
    convention of some peers.
    """
    load = partial(load_model, base_dir=base_dir, max_tensor_bytes=max_tensor_bytes,
                   limits=limits)
    with collector_paused():  # an analysis builds a large graph of objects and frees none
        model = load(source, input_shapes=input_shapes, batch=batch, dims=dims,
                     more_dims=partial(_kv_head_dims, dims=dims or {}))
        added = model.dims_added
        symbols = symbolic_dims(model.graph_inputs) if symbolic else []
        result = (_analyze_symbolic(model, symbols, load, strict, flops_per_mac) if symbols
                  else _analyze_model(model, strict, flops_per_mac))
    result.declared_inputs = model.graph_inputs
    result.dims_added = added
    # The symbolic path reloads the proto loading rewrote: say what the file was.
    result.warnings[:0] = [w for w in model.warnings
                           if w.startswith(REWRITE_NOTES) and w not in result.warnings]
    result.warnings += [f"--dim {name}={size} added: the KV cache's head size or sliding-window "
                        "capacity, read from the attention node that reads it"
                        for name, size in added.items()]
    return result


def _kv_head_dims(model: LoadedModel, dims: Mapping[str, int]) -> dict[str, int]:
    """The KV cache's head dims `dims` leaves named, each at the size the attention node
    reading the cache has (`llm.head_dim_pins`), and a sliding-window cache's past dim at its
    capacity (`llm.window_pins`): pinned before the analysis, which then runs once, where a
    named head dim made it a symbolic one (an analysis per sample point)."""
    shapes = {t.name: t.shape or () for t in model.graph_inputs}
    if not unpinned_head_dims(shapes, dims) and not several_past_dims(shapes):
        return {}  # no KV cache with a named head dim or a window: no graph built for it
    graph = build_graph(model)
    return head_dim_pins(shapes, graph, dims) | window_pins(shapes, graph, dims)


def _analyze_symbolic(model: LoadedModel, symbols: list[str], load: Callable[..., LoadedModel],
                      strict: bool, flops_per_mac: int) -> AnalysisResult:
    """Analyses at sample values of the symbols; the one at all-ones is returned."""
    fitted, pinned_at_one = symbols[:MAX_SYMBOLS], symbols[MAX_SYMBOLS:]
    fit, _ = sample_points(len(fitted))
    analyses = (len(fit) + 1) * len(model.nodes)
    if analyses > SYMBOLIC_MAX_NODE_ANALYSES:
        shapes = pinned_shapes(model.graph_inputs, dict.fromkeys(symbols, 1))
        result = _analyze_model(load(model.proto, input_shapes=shapes,
                                     base_dir=model.base_dir), strict, flops_per_mac)
        result.model.path, result.model.name = model.path, model.name
        result.symbols = dict.fromkeys(symbols, 1)
        result.warnings.append(
            f"symbolic dim(s) {', '.join(symbols)} analyzed at 1, without formulas: "
            f"{len(fit) + 1} analyses of {len(model.nodes):,} nodes would be over "
            f"{SYMBOLIC_MAX_NODE_ANALYSES:,} node analyses; pin them with --batch or "
            "--input-shape")
        return result
    data = model.proto.SerializeToString()  # weights left in their files stay there
    results: dict[tuple[int, ...], AnalysisResult] = {}

    def evaluate(point: tuple[int, ...]) -> dict[str, int | None]:
        values = dict(zip(fitted, point, strict=True)) | dict.fromkeys(pinned_at_one, 1)
        shapes = pinned_shapes(model.graph_inputs, values)
        results[point] = _analyze_model(load(data, input_shapes=shapes, base_dir=model.base_dir),
                                        strict, flops_per_mac)
        totals = results[point].totals
        return {k: v for k, v in totals.items() if k in _FORMULA_KEYS}

    try:
        found = formulas(evaluate, fitted)
    except OnnxLensError as e:
        result = _analyze_model(model, strict, flops_per_mac)
        result.warnings.append(f"no cost formulas of {', '.join(fitted)}: analysis at sample "
                               f"values failed ({e})")
        return result
    result = results[tuple([1] * len(fitted))]
    result.model.path, result.model.name = model.path, model.name
    result.symbols = dict.fromkeys(symbols, 1)
    result.formulas = found
    note = f"symbolic dim(s) {', '.join(symbols)} analyzed at 1; totals as formulas of them"
    if pinned_at_one:
        note += f" (only {', '.join(fitted)} in formulas: at most {MAX_SYMBOLS} symbols)"
    result.warnings.append(note)
    return result


_FORMULA_KEYS = ("macs", "flops", "transcendental", "bytes_read", "bytes_written", "params",
                 "param_bytes", "activation_peak_bytes")


def _analyze_model(model: LoadedModel, strict: bool, flops_per_mac: int) -> AnalysisResult:
    mg = build_graph(model)
    node_costs = _node_costs(mg)
    unsupported = _unsupported_ops(mg, node_costs)
    if unsupported and strict:
        raise UnsupportedOpError("no cost formula for " + _describe_unsupported(unsupported))
    warnings = list(model.warnings)
    if unsupported:
        warnings.append("cost unknown for unsupported op(s) " + _describe_unsupported(unsupported))
    groups = fuse(mg, model.initializer_array)
    graph_outputs = frozenset(mg.graph_outputs)
    group_costs = {g.id: group_cost(mg, g, node_costs, graph_outputs) for g in groups}
    unknown = [f"{k} ({nc.unknown_reason})" for k, nc in node_costs.items()
               if nc.unknown is Unknown.SHAPE]
    if unknown:
        warnings.append(f"cost unknown for {len(unknown)} node(s) with unknown shapes, e.g. "
                        + "; ".join(unknown[:3]))
    peak = activation_peak_bytes(mg, groups, model.tensors)
    return AnalysisResult(model, mg, groups, node_costs, group_costs, peak, unsupported,
                          flops_per_mac, warnings)


def _by_precision(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """(precision, MACs) pairs summed per precision, largest first."""
    out: dict[str, int] = {}
    for precision, macs in pairs:
        out[precision] = out.get(precision, 0) + macs
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _unsupported_ops(mg: ModelGraph, node_costs: dict[str, NodeCost]) -> dict[str, list[str]]:
    """Op label -> the nodes of that op with no cost formula (`node_cost` has looked it up)."""
    out: dict[str, list[str]] = {}
    for key, nc in node_costs.items():
        if nc.unknown is Unknown.NO_FORMULA:
            info = mg.infos[key]
            qualified = info.domain not in ("", "ai.onnx")
            label = f"{info.domain}::{info.op_type}" if qualified else info.op_type
            out.setdefault(label, []).append(key)
    return out


def _describe_unsupported(unsupported: dict[str, list[str]]) -> str:
    return ", ".join(f"{op} (node {nodes[0]!r}" + (f" and {len(nodes) - 1} more)" if len(nodes) > 1
                                                   else ")") for op, nodes in unsupported.items())


def _tensor_bytes(tensors: Sequence[TensorInfo | None]) -> int:
    n = len(tensors)
    if n == 1:  # most nodes have one output
        t = tensors[0]
        return 0 if t is None else t.nbytes
    if n == 2:  # a binary op, a weight and a bias
        a, b = tensors
        if a is None or b is None or a.name == b.name:
            return _tensor_bytes((a or b,))
        return a.nbytes + b.nbytes
    seen: set[str] = set()
    total = 0
    for t in tensors:
        if t is not None and t.name not in seen:
            seen.add(t.name)
            total += t.nbytes
    return total


def _node_costs(mg: ModelGraph) -> dict[str, NodeCost]:
    """Every node's `node_cost`, computed once per `_cost_signature`: a model repeats its
    layers (a 50,000-node chain has three signatures), and building the signature costs half
    of costing a node."""
    infos = mg.infos
    known: dict[tuple[Any, ...], NodeCost] = {}
    costs: dict[str, NodeCost] = {}
    for key in mg.order:
        info = infos[key]
        signature = _cost_signature(info)
        nc = known.get(signature) if signature is not None else None
        if nc is None:
            nc = node_cost(info)
            if signature is not None and nc.cost is not None:  # a reason names its tensor
                known[signature] = nc
        costs[key] = nc
    return costs


def _cost_signature(info: NodeInfo) -> tuple[Any, ...] | None:
    """What `node_cost` reads of a node: its op, attributes, which inputs are constant, and
    the type and shape of each input and output (a formula sees no name and no value). None
    when an attribute is not a plain value (a tensor, a graph) or a tensor is read twice (its
    bytes count once), so that such a node is costed on its own."""
    attrs = []
    for name, value in info.attrs.items():
        kind = value.__class__
        if kind is list:
            value = tuple(value)
        elif kind is not int and kind is not float and kind is not str:
            return None
        attrs.append((name, value))
    inputs, outputs = _typed_shapes(info.inputs), _typed_shapes(info.outputs)
    if inputs is None or outputs is None:
        return None
    return info.op_type, info.domain, tuple(attrs), info.const_inputs, inputs, outputs


def _typed_shapes(tensors: Sequence[TensorInfo | None]
                  ) -> tuple[tuple[int, Shape | None] | None, ...] | None:
    """Each tensor's (type, shape), None for an omitted one; None if a tensor comes twice."""
    out: list[tuple[int, Shape | None] | None] = []
    names: set[str] = set()
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        if t.name in names:
            return None
        names.add(t.name)
        out.append((t.elem_type, t.shape))
    return tuple(out)


def node_cost(info: NodeInfo) -> NodeCost:
    """Arithmetic from the op's formula plus memory traffic and parameters from tensor sizes.

    Bytes: every distinct input read once, every output written once (views move nothing).
    """
    spec = lookup(info.op_type, info.domain)
    if spec is None:
        return NodeCost(None, f"no cost formula for {info.op_type}", Unknown.NO_FORMULA)
    try:
        work = spec.formula(info)
        if spec.is_view:
            read = written = 0
        else:
            read = _tensor_bytes(info.inputs)
            written = _tensor_bytes(info.outputs)
        params = param_bytes = 0
        if info.const_inputs:
            positions = sorted(info.const_inputs)
            weights = [info.inputs[i] for i in positions]
            packed = spec.packed(info) if spec.packed is not None else {}
            params = sum(packed.get(i, t.size) for i, t in zip(positions, weights, strict=True)
                         if t is not None)
            param_bytes = _tensor_bytes(weights)
    except UnknownShape as e:
        return NodeCost(None, f"shape of tensor {e.tensor!r} unknown", Unknown.SHAPE)
    return NodeCost(Cost(work.macs, work.other_flops, work.transcendental, read, written, params,
                         param_bytes))


def group_cost(mg: ModelGraph, group: Group, node_costs: dict[str, NodeCost],
               graph_outputs: frozenset[str]) -> NodeCost:
    """Sum of the nodes' arithmetic; bytes only for tensors that cross the group's boundary."""
    keys = group.nodes
    if len(keys) == 1:
        nc = node_costs[keys[0]]
        return nc if nc.cost is not None else NodeCost(
            None, f"node {keys[0]!r}: {nc.unknown_reason}", nc.unknown)
    # Field by field, as `total`: adding Cost values would build one per member.
    macs = other_flops = transcendental = params = param_bytes = 0
    for key in keys:
        c = node_costs[key].cost
        if c is None:
            nc = node_costs[key]
            return NodeCost(None, f"node {key!r}: {nc.unknown_reason}", nc.unknown)
        macs += c.macs
        other_flops += c.other_flops
        transcendental += c.transcendental
        params += c.params
        param_bytes += c.param_bytes
    members = set(keys)
    producer, consumers, infos = mg.producer, mg.consumers, mg.infos
    outside_inputs: list[TensorInfo | None] = []
    outputs: list[TensorInfo | None] = []
    for key in keys:
        info = infos[key]
        for t in info.inputs:
            if t is not None and producer.get(t.name) not in members:
                outside_inputs.append(t)
        for t in info.outputs:
            name = t.name
            if name in graph_outputs or not members.issuperset(consumers.get(name, ())):
                outputs.append(t)
    try:
        read, written = _tensor_bytes(outside_inputs), _tensor_bytes(outputs)
    except UnknownShape as e:
        return NodeCost(None, f"shape of tensor {e.tensor!r} unknown", Unknown.SHAPE)
    return NodeCost(Cost(macs, other_flops, transcendental, read, written, params, param_bytes))


def _param_totals(model: LoadedModel, mg: ModelGraph) -> tuple[int, int]:
    """Parameters (one per initializer element, or what a packing op says its packed input
    holds: `OpSpec.packed`) and their stored bytes."""
    counts: dict[str, int] = {}
    for info in mg.infos.values():
        if not info.const_inputs:  # only a constant input's count is replaced
            continue
        spec = lookup(info.op_type, info.domain)
        if spec is not None and spec.packed is not None:
            try:
                packed = spec.packed(info)
            except UnknownShape:
                continue
            for i, n in packed.items():
                t = info.input(i)
                if t is not None and i in info.const_inputs:
                    counts[t.name] = n
    params = param_bytes = 0
    tensors = model.tensors
    for name in model.initializers:
        info = tensors[name]
        params += counts.get(name, info.size)
        param_bytes += info.nbytes
    return params, param_bytes


def describe_tensor(t: TensorInfo) -> dict[str, Any]:
    return {"name": t.name, "dtype": dtype_name(t.elem_type),
            "shape": list(t.shape) if t.shape is not None else None}
