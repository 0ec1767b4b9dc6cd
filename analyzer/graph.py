"""The graph IR: a networkx DiGraph whose nodes are ONNX nodes and whose edges are tensors.

Node key: the node's unique name (ONNX allows empty or repeated names; those get
``<op_type>_<index>``). Node data: ``info`` (a `NodeInfo`). Edge data: ``tensors``, the list of
`TensorInfo` flowing from producer to consumer (a list: one producer may feed one consumer
through several tensors, and a DiGraph keeps one edge per pair).
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _attributes(node: onnx.NodeProto) -> dict:
    attrs = {}
    for a in node.attribute:
        # Subgraphs and tensors stay protos; everything else becomes plain Python values.
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            attrs[a.name] = a.g if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        else:
            value = onnx.helper.get_attribute_value(a)
            attrs[a.name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return attrs


def build_graph(model: LoadedModel) -> ModelGraph:
    proto = model.proto
    tensors = model.tensors
    initializers = frozenset(model.initializers)
    graph_inputs = [i.name for i in proto.graph.input if i.name not in initializers]

    keys: list[str] = []
    taken: set[str] = set()
    producer: dict[str, str] = {}
    for index, node in enumerate(proto.graph.node):
        key = node.name if node.name and node.name not in taken else f"{node.op_type}_{index}"
        while key in taken:
            key += "_"
        taken.add(key)
        keys.append(key)
        for out in node.output:
            if out:
                producer[out] = key

    g = nx.DiGraph()
    consumers: dict[str, list[str]] = {}
    edges: dict[tuple[str, str], list[TensorInfo]] = {}
    for index, (key, node) in enumerate(zip(keys, proto.graph.node, strict=True)):
        inputs: list[TensorInfo | None] = []
        const: list[int] = []
        for pos, name in enumerate(node.input):
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
        outputs = tuple(tensors.get(o) or TensorInfo(o) for o in node.output if o)
        info = NodeInfo(key, node.op_type, node.domain, _attributes(node), tuple(inputs), outputs,
                        index, frozenset(const))
        g.add_node(key, info=info)
    g.add_edges_from((a, b, {"tensors": t}) for (a, b), t in edges.items())

    order = _execution_order(g, keys)
    if order is not keys:  # keep consumer lists in execution order
        rank = {k: i for i, k in enumerate(order)}
        for users in consumers.values():
            users.sort(key=rank.__getitem__)
    outputs = [o.name for o in proto.graph.output]
    return ModelGraph(g, order, producer, consumers, graph_inputs, outputs, initializers)


def _execution_order(g: nx.DiGraph, file_order: list[str]) -> list[str]:
    """The file's order when it is topological (ONNX requires it), else a topological sort.

    The loader has already refused cycles, so a topological order exists.
    """
    position = {k: i for i, k in enumerate(file_order)}
    if all(position[a] < position[b] for a, b in g.edges):
        return file_order
    return list(nx.lexicographical_topological_sort(g, key=position.__getitem__))
