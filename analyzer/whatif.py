"""What-if questions on a model's graph: the cost of one subgraph, and of caching a prefix.

Caching a prefix ("what if these layers were cached"): every node up to and
including the named node is not run; instead the tensors that leave the prefix (read by a
later node, or graph outputs) are read back from memory. So

    after   = total - cost(prefix) + reads(cached tensors)      [+ cost(other model)]
    savings = total - after

where `reads` charges each cached tensor's bytes as read once. A tensor the rest of the model
needs from inside the prefix (a skip connection from an early layer) is cached too, and listed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import networkx as nx

from .cost.base import Cost
from .errors import UsageError
from .graph import ModelGraph
from .ir import UnknownShape


def module_path(node_name: str) -> str:
    """`/layer2/layer2.1/relu_1/Relu` -> `layer2.1.relu_1` (the torch module path of a node
    exported by the TorchScript exporter: scopes are cumulative, the last part is the op)."""
    path: list[str] = []
    for part in [p for p in node_name.split("/") if p][:-1]:
        # A child of a Sequential repeats its parent's attribute name: `layer1`, `layer1.0`.
        if path and part.startswith(path[-1] + "."):
            path[-1] = part
        else:
            path.append(part)
    return ".".join(path)


def resolve_node(mg: ModelGraph, ref: str) -> str:
    """A node named by the user: its node name, an output tensor's name, or its module path."""
    if ref in mg.graph:
        return ref
    if ref in mg.producer:
        return mg.producer[ref]
    by_path = [k for k in mg.order if module_path(k) == ref]
    if len(by_path) == 1:
        return by_path[0]
    if len(by_path) > 1:
        raise UsageError(f"node {ref!r} is ambiguous: {', '.join(by_path[:4])}")
    names = [*mg.order, *(module_path(k) for k in mg.order)]
    close = difflib.get_close_matches(ref, names, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise UsageError(f"no node, tensor or module path {ref!r} in the model{hint}")


def subgraph(mg: ModelGraph, start: str, end: str) -> list[str]:
    """Nodes on some path from `start` to `end` (both included), in execution order."""
    a, b = resolve_node(mg, start), resolve_node(mg, end)
    if a != b and not nx.has_path(mg.graph, a, b):
        raise UsageError(f"node {b!r} does not depend on node {a!r}: no subgraph between them")
    between = (nx.descendants(mg.graph, a) | {a}) & (nx.ancestors(mg.graph, b) | {b})
    return [k for k in mg.order if k in between]


def prefix(mg: ModelGraph, until: str) -> list[str]:
    """The node and everything it depends on, in execution order."""
    end = resolve_node(mg, until)
    keep = nx.ancestors(mg.graph, end) | {end}
    return [k for k in mg.order if k in keep]


def sum_costs(costs: dict[str, Cost | None], keys: list[str]) -> Cost | None:
    total = Cost()
    for k in keys:
        c = costs[k]
        if c is None:
            return None
        total = total + c
    return total


@dataclass(frozen=True)
class CachingScenario:
    until: str  # the resolved node
    prefix_nodes: list[str]
    cached_tensors: list[str]
    total: Cost
    prefix: Cost
    cache_read_bytes: int
    after: Cost  # without any added model

    def as_dict(self, flops_per_mac: int) -> dict:
        before, after = self.total.flops(flops_per_mac), self.after.flops(flops_per_mac)
        return {
            "cached_until": self.until,
            "prefix_nodes": len(self.prefix_nodes),
            "cached_tensors": self.cached_tensors,
            "cache_read_bytes": self.cache_read_bytes,
            "flops_before": before,
            "flops_prefix": self.prefix.flops(flops_per_mac),
            "flops_after": after,
            "flops_saved": before - after,
            "saved_share": (before - after) / before if before else 0.0,
            "macs_before": self.total.macs,
            "macs_after": self.after.macs,
            "bytes_before": self.total.bytes_read + self.total.bytes_written,
            "bytes_after": self.after.bytes_read + self.after.bytes_written,
        }


def caching_scenario(mg: ModelGraph, costs: dict[str, Cost | None], until: str
                     ) -> CachingScenario:
    nodes = prefix(mg, until)
    inside = set(nodes)
    total, pre = sum_costs(costs, mg.order), sum_costs(costs, nodes)
    if total is None or pre is None:
        raise UsageError("caching scenario needs every node's cost; some are unknown")
    outputs = set(mg.graph_outputs)
    cached = [t.name for k in nodes for t in mg.info(k).outputs
              if t.name in outputs or any(u not in inside for u in mg.consumers.get(t.name, []))]
    try:
        read = sum(mg.info(mg.producer[name]).outputs[_index(mg, name)].nbytes for name in cached)
    except UnknownShape as e:
        raise UsageError(f"caching scenario: shape of tensor {e.tensor!r} unknown") from None
    after_prefix = Cost(total.macs - pre.macs, total.other_flops - pre.other_flops,
                        total.transcendental - pre.transcendental,
                        total.bytes_read - pre.bytes_read + read,
                        total.bytes_written - pre.bytes_written, total.params - pre.params,
                        total.param_bytes - pre.param_bytes)
    return CachingScenario(resolve_node(mg, until), nodes, cached, total, pre, read, after_prefix)


def _index(mg: ModelGraph, tensor: str) -> int:
    outputs = mg.info(mg.producer[tensor]).outputs
    return next(i for i, t in enumerate(outputs) if t.name == tensor)
