"""Map a backend's kernel times back to our nodes and fusion groups.

ORT rewrites the graph before it runs it: at ORT_ENABLE_ALL
ResNet-18's 49 nodes become 25 kernels, most of them NCHWc convolutions named after the ONNX
tensor of the last node they absorbed plus ``_nchwc``, whose outputs are renamed
``reorder_token_N``; transformer graphs get ORT's own Reshape/Gemm/Reshape triples and
SkipLayerNormalization. The optimized graph (saved by the profiled session) lists every
kernel's inputs and outputs, and the mapping goes through tensor names:

1. Resolve each tensor of the optimized graph to the original tensor holding the same value:
   the same name; the output of an ``<T>_nchwc`` kernel is T in another layout, or for a Conv
   that fused a residual Add and an activation after T, the output of those; the output of
   ReorderInput is its input in another layout; the output of a fused kernel named
   ``<node>/QuickGeluFusion/`` is that node's (x·sigmoid(x) is named after its Mul, and
   between NCHWc convolutions writes a tensor of ORT's own). Other tensors are ORT's own
   (unresolved).
2. Kernels joined by an unresolved tensor form one unit (gemm_input_reshape -> Gemm ->
   gemm_output_reshape); a unit covers the original producers of the resolved tensors it
   writes, walking back through the original graph until a tensor that exists in the optimized
   graph (a kernel's output, a graph input, a weight). Nodes computed from constants alone
   (Constant, shape arithmetic on known shapes) are folded by ORT when the session loads and
   are never reached by the walk past the unit's own outputs, so they get no time.
3. A unit that covers nothing is a layout change with no ONNX counterpart (ReorderOutput,
   ReorderInput of a graph input): its time is reported as unmapped, not hidden.

Time: each kernel's share of the kernels' total in a profiled run (medians over the runs) is
applied to the latency measured with profiling off. Profiling slows a run, most of all between
kernel events (ORT records each event's arguments: a 30-kernel transformer block spends a third
of a profiled run between events, and runs 2.5x faster unprofiled), so the time between events
cannot be told apart from profiler overhead; it is reported (`outside_kernel_share`), not
charged, and the executor's real time between kernels is spread with the kernels' shares. A
kernel's time is split over the nodes it covers in proportion to their estimated FLOPs (all
equal when none has any), so a kernel spanning several of our groups is split across them in
proportion to the FLOPs of its nodes in each. A group's time is the sum over its nodes, and
the groups add up to the latency less the unmapped kernels' share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from ..analyzer.analysis import AnalysisResult
from ..analyzer.fold import static_nodes
from ..analyzer.graph import ModelGraph
from ..analyzer.ir import NodeInfo
from ..analyzer.loader import inline_ifs
from .base import Profile

_NCHWC_SUFFIX = "_nchwc"
# ORT fusions that name their kernel `<node><suffix>` after the last node of the pattern they
# replace and compute that node's output, possibly into a tensor of their own (NCHWc chains).
# Other fusions (MatMulAddFusion, named after its MatMul) write ORT's own tensors that join
# them to their neighbours, or write original tensors.
_NAMED_AFTER_LAST = ("/QuickGeluFusion/",)
_LAYOUT_OPS = frozenset({"ReorderInput", "ReorderOutput"})


@dataclass(frozen=True, slots=True)
class KernelShare:
    name: str
    op_type: str
    duration_s: float  # median in the profiled runs
    nodes: tuple[str, ...]  # our node keys it covers, execution order; () = unmapped


@dataclass(frozen=True)
class MeasuredTimes:
    """Per-node and per-group seconds at the scale of the measured latency."""

    kernels: tuple[KernelShare, ...]
    node_s: dict[str, float]
    group_s: dict[int, float]
    latency_s: float  # the model time the shares are applied to
    unmapped_share: float  # of the kernels' time: kernels with no ONNX counterpart
    outside_kernel_share: float  # of a profiled run: between kernel events (not charged)

    @property
    def mapped_kernels(self) -> int:
        return sum(1 for k in self.kernels if k.nodes)

    def to_dict(self) -> dict[str, object]:
        return {
            "kernels": len(self.kernels), "mapped_kernels": self.mapped_kernels,
            "unmapped_share": self.unmapped_share,
            "outside_kernel_share": self.outside_kernel_share,
            "unmapped_kernels": [{"name": k.name, "op_type": k.op_type,
                                  "duration_s": k.duration_s} for k in self.kernels
                                 if not k.nodes],
        }


def map_profile(profile: Profile, analysis: AnalysisResult,
                latency_s: float | None = None) -> MeasuredTimes:
    """Kernel times mapped to `analysis`'s nodes and groups, scaled so that all kernels add up
    to `latency_s` (default: the profiled run time)."""
    mg = analysis.graph
    covers = (kernel_covers(mg, _named_as_profiled(_branches_inlined(profile.optimized),
                                                   [(k.name, k.op_type) for k in profile.kernels]))
              if profile.optimized is not None else {})
    # Kernels named after our nodes (a backend that runs our graph as is) cover those nodes.
    # An If's event spans the kernels of its branch, which ORT lists too: only those count.
    kernels = tuple(KernelShare(k.name, k.op_type, k.duration_s,
                                covers.get(k.name, (k.name,) if k.name in mg.graph else ()))
                    for k in profile.kernels if k.op_type != "If")
    latency = latency_s if latency_s is not None else profile.run_s
    in_kernels = sum(k.duration_s for k in kernels)
    scale = latency / in_kernels if in_kernels else 0.0
    flops = {key: _flops(analysis, key) for key in mg.order}
    node_s = dict.fromkeys(mg.order, 0.0)
    for k in kernels:
        for key, part in _split(k.duration_s * scale, k.nodes, flops):
            node_s[key] += part
    group_s = {g.id: sum(node_s[key] for key in g.nodes) for g in analysis.groups}
    unmapped = sum(k.duration_s for k in kernels if not k.nodes) / (in_kernels or 1.0)
    outside = max(0.0, 1.0 - in_kernels / profile.run_s) if profile.run_s else 0.0
    return MeasuredTimes(kernels, node_s, group_s, latency, unmapped, outside)


def _branches_inlined(optimized: onnx.GraphProto) -> onnx.GraphProto:
    """The optimized graph with each If replaced by its branch as the loader inlines it (the
    same names), so that kernels ORT ran inside a branch (an optimum merged decoder's) map
    back to our nodes as the graph's own do."""
    if not any(n.op_type == "If" for n in optimized.node):
        return optimized
    flat = onnx.GraphProto()
    flat.CopyFrom(optimized)
    inline_ifs(flat)
    return flat


def _named_as_profiled(optimized: onnx.GraphProto, kernels: list[tuple[str, str]]
                       ) -> onnx.GraphProto:
    """The optimized graph with its unnamed nodes named as ORT's profile names their kernels.

    A node ORT creates without a name (the body of a function it inlined: the CPU provider has
    no fp16 Softmax or Gelu kernel, so it runs their function bodies between Casts to float)
    is profiled as ``<op_type>_<node index>``, and the graph it saves leaves it unnamed. Each op
    type's unnamed nodes, in the saved order, take its unknown kernel names in index order: one
    instance's nodes of a type may swap among themselves (the saved order is a topological
    sort), but they are joined by ORT's own tensors into one unit and cover the same nodes, and
    the instances keep their order. Where the counts differ, the nodes stay unnamed (unmapped).
    """
    if all(node.name for node in optimized.node):
        return optimized
    known = {node.name for node in optimized.node}
    profiled: dict[str, list[tuple[int, str]]] = {}
    for name, op_type in kernels:
        head, _, index = name.rpartition("_")
        if name not in known and head == op_type and index.isdigit():
            profiled.setdefault(op_type, []).append((int(index), name))
    named = onnx.GraphProto()
    named.CopyFrom(optimized)
    unnamed: dict[str, list[onnx.NodeProto]] = {}
    for node in named.node:
        if not node.name:
            unnamed.setdefault(node.op_type, []).append(node)
    for op_type, nodes in unnamed.items():
        names = sorted(profiled.get(op_type, []))
        if len(names) == len(nodes):
            for node, (_, name) in zip(nodes, names, strict=True):
                node.name = name
    return named


def _flops(analysis: AnalysisResult, key: str) -> float:
    cost = analysis.node_costs[key].cost
    return float(cost.flops(analysis.flops_per_mac)) if cost is not None else 0.0


def _split(seconds: float, nodes: tuple[str, ...], flops: dict[str, float]
           ) -> Iterable[tuple[str, float]]:
    total = sum(flops[n] for n in nodes)
    for n in nodes:
        yield n, seconds * (flops[n] / total if total else 1 / len(nodes))


# ---- kernels to nodes -------------------------------------------------------------------------

def kernel_covers(mg: ModelGraph, optimized: onnx.GraphProto) -> dict[str, tuple[str, ...]]:
    """Kernel (optimized node) name -> the keys of our nodes it covers, in execution order."""
    original = _original_tensors(mg)
    alias = resolve_tensors(optimized, mg)
    present = ({a for a in alias.values() if a is not None} | set(mg.graph_inputs)
               | set(mg.initializers)
               | {t.name for t in optimized.initializer if t.name in original})
    static = ort_folds(mg)
    rank = {key: i for i, key in enumerate(mg.order)}
    covers: dict[str, tuple[str, ...]] = {}
    for unit in _units(optimized, alias):
        written = {alias[t] for n in unit for t in n.output if t and alias.get(t)}
        read = {alias.get(t) or t for n in unit for t in n.input if t}
        nodes = _walk_back(mg, written - read, present, static)
        ordered = tuple(sorted(nodes, key=rank.__getitem__))
        for n in unit:
            covers[n.name] = tuple(sorted(set(covers.get(n.name, ())) | set(ordered),
                                          key=rank.__getitem__))
    return covers


def resolve_tensors(optimized: onnx.GraphProto, mg: ModelGraph) -> dict[str, str | None]:
    """Optimized-graph tensor name -> the original tensor with the same value (None: ORT's own)."""
    original = _original_tensors(mg)
    alias: dict[str, str | None] = {}
    for node in optimized.node:
        for i, out in enumerate(node.output):
            if not out:
                continue
            named = node.name.removesuffix(_NCHWC_SUFFIX)
            last = _fused_last(mg, node.name)
            if out in original:
                alias[out] = out
            elif node.name.endswith(_NCHWC_SUFFIX) and i == 0 and named in original:
                alias[out] = _nchwc_result(mg, named, node, alias)
            elif last is not None and i < len(last.outputs):
                alias[out] = last.outputs[i].name
            elif node.op_type in _LAYOUT_OPS and node.input:
                source = node.input[0]
                alias[out] = alias.get(source) or (source if source in original else None)
            else:
                alias[out] = None
    return alias


def _fused_last(mg: ModelGraph, kernel: str) -> NodeInfo | None:
    """The node a kernel named `<node>/QuickGeluFusion/` (`_NAMED_AFTER_LAST`) is named
    after, if it is one of ours."""
    for suffix in _NAMED_AFTER_LAST:
        if kernel.endswith(suffix) and (key := kernel.removesuffix(suffix)) in mg.infos:
            return mg.info(key)
    return None


def _original_tensors(mg: ModelGraph) -> set[str]:
    return set(mg.producer) | set(mg.graph_inputs) | set(mg.initializers)


def _nchwc_result(mg: ModelGraph, named: str, node: onnx.NodeProto,
                  alias: dict[str, str | None]) -> str:
    """The original tensor an NCHWc kernel computes. ORT names it after the tensor of the Conv
    (or Conv+BN, Conv+activation) it converted, then fuses in place, without renaming, the
    residual Add (as the kernel's 4th input, `Sum`) and the activation after it (attribute
    `activation`): follow those from the named tensor."""
    if node.op_type != "Conv":
        return named
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    pending = set()
    if len(node.input) > 3 and node.input[3]:
        pending.add("Add")
    if "activation" in attrs:
        pending.add(attrs["activation"].decode())
    total = named
    while pending:
        users = mg.consumers.get(total, [])
        if len(users) != 1 or mg.info(users[0]).op_type not in pending:
            break
        info = mg.info(users[0])
        operands = {t.name for t in info.inputs if t is not None}
        if info.op_type == "Add" and alias.get(node.input[3]) not in operands:
            break  # an Add of something other than the kernel's Sum input
        pending.discard(info.op_type)
        total = info.outputs[0].name
    return total


def _units(optimized: onnx.GraphProto, alias: dict[str, str | None]
           ) -> list[list[onnx.NodeProto]]:
    """Optimized nodes joined through tensors of ORT's own (union-find), in graph order."""
    parent = list(range(len(optimized.node)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer = {out: i for i, node in enumerate(optimized.node) for out in node.output if out}
    for i, node in enumerate(optimized.node):
        for t in node.input:
            if t in producer and alias.get(t) is None:
                parent[find(i)] = find(producer[t])
    units: dict[int, list[onnx.NodeProto]] = {}
    for i, node in enumerate(optimized.node):
        units.setdefault(find(i), []).append(node)
    return list(units.values())


def _walk_back(mg: ModelGraph, start: set[str], present: set[str], static: set[str]
               ) -> set[str]:
    """The producers of `start` and, through tensors absent from the optimized graph, theirs."""
    found: set[str] = set()
    stack = [mg.producer[t] for t in start if t in mg.producer]
    first = set(stack)
    while stack:
        key = stack.pop()
        if key in found or (key in static and key not in first):
            continue
        found.add(key)
        for t in mg.info(key).inputs:
            if t is not None and t.name not in present and t.name in mg.producer:
                stack.append(mg.producer[t.name])
    return found


def ort_folds(mg: ModelGraph) -> set[str]:
    """Nodes whose outputs are known when the session loads: constants, arithmetic on
    constants, and Shape/Size of tensors whose shape is known (`analyzer.fold.static_nodes`).
    ORT folds them."""
    return static_nodes((mg.info(key) for key in mg.order), mg.initializers)
