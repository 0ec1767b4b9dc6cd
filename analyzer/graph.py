"""The graph IR: a networkx DiGraph whose nodes are ONNX nodes and whose edges are tensors.

Node key: the node's unique name (ONNX allows empty or repeated names; those get
``<op_type>_<index>``). Node data: ``info`` (a `NodeInfo`). Edge data: ``tensors``, the list of
`TensorInfo` flowing from producer to consumer (a list: one producer may feed one consumer
through several tensors, and a DiGraph keeps one edge per pair).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import networkx as nx
import onnx

from .ir import NodeInfo, TensorInfo
from .loader import LoadedModel


@dataclass
class ModelGraph:
    graph: nx.DiGraph
    order: list[str]  # a topological execution order of node keys
    producer: dict[str, str]  # tensor name -> node key
    consumers: dict[str, list[str]]  # tensor name -> node keys, in execution order
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: frozenset[str]

    def info(self, key: str) -> NodeInfo:
        return self.graph.nodes[key]["info"]

    def __len__(self) -> int:
        return len(self.order)


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for a in node.attribute:
        # Subgraphs and tensors stay protos; everything else becomes plain Python values.
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            attrs[a.name] = a.g if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        else:
            value = onnx.helper.get_attribute_value(a)
            attrs[a.name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return attrs


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (restored on exit, also on error).

    Building allocates about a dozen container objects per node and keeps them all, so the
    collector would only walk them, and the rest of the heap, again and again: it took 40% of
    `build_graph`'s time on 50,000 nodes. Nothing built here is cyclic garbage.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_graph(model: LoadedModel) -> ModelGraph:
    with collector_paused():
        return _build_graph(model)


def _build_graph(model: LoadedModel) -> ModelGraph:
    proto = model.proto
    tensors = model.tensors
    initializers = frozenset(model.initializers)
    graph_inputs = [i.name for i in proto.graph.input if i.name not in initializers]
    # Each proto field read once: every access to a field of a proto builds a new wrapper.
    # Slicing copies a repeated field into a list in one call, twice as fast as list().
    nodes = [(node.name, node.op_type, node.domain, node.input[:],
              [o for o in node.output[:] if o], _attributes(node)) for node in proto.graph.node]

    keys: list[str] = []
    taken: set[str] = set()
    producer: dict[str, str] = {}
    for index, (node_name, op_type, _, _, node_outputs, _) in enumerate(nodes):
        key = node_name if node_name and node_name not in taken else f"{op_type}_{index}"
        while key in taken:
            key += "_"
        taken.add(key)
        keys.append(key)
        for out in node_outputs:
            producer[out] = key

    position = {key: index for index, key in enumerate(keys)}
    topological = True  # is the file's order an execution order? (ONNX requires it)
    node_data: list[tuple[str, dict[str, NodeInfo]]] = []
    consumers: dict[str, list[str]] = {}
    edges: dict[tuple[str, str], list[TensorInfo]] = {}
    for index, (key, (_, op_type, domain, node_inputs, node_outputs, attrs)) in enumerate(
            zip(keys, nodes, strict=True)):
        inputs: list[TensorInfo | None] = []
        const: list[int] = []
        for pos, name in enumerate(node_inputs):
            if not name:
                inputs.append(None)
                continue
            info = tensors.get(name) or TensorInfo(name)
            inputs.append(info)
            consumers.setdefault(name, []).append(key)
            if name in initializers:
                const.append(pos)
            src = producer.get(name)
            if src is not None:
                edges.setdefault((src, key), []).append(info)
                topological = topological and position[src] < index
        outputs = tuple(tensors.get(o) or TensorInfo(o) for o in node_outputs)
        node_data.append((key, {"info": NodeInfo(key, op_type, domain, attrs, tuple(inputs),
                                                 outputs, index, frozenset(const))}))

    g = nx.DiGraph()
    g.add_nodes_from(node_data)
    g.add_edges_from((a, b, {"tensors": t}) for (a, b), t in edges.items())
    if topological:
        order = keys
    else:  # the loader has refused cycles, so a topological order exists
        order = list(nx.lexicographical_topological_sort(g, key=position.__getitem__))
        rank = {k: i for i, k in enumerate(order)}
        for users in consumers.values():
            users.sort(key=rank.__getitem__)
    outputs = [o.name for o in proto.graph.output]
    return ModelGraph(g, order, producer, consumers, graph_inputs, outputs, initializers)
