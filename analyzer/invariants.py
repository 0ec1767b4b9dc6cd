"""Checks that hold after every pass; tests run them after fusion (DESIGN convention 7).

`check_invariants` raises `InvariantError` (an `AssertionError`) naming the first broken rule
and the nodes or tensors at fault, and returns the tensors on graph edges whose dtype or
shape is unknown: a gap in shape inference to report, not a broken graph.
"""

from __future__ import annotations

from collections.abc import Iterable

from .fusion import Group
from .graph import ModelGraph


class InvariantError(AssertionError):
    """A graph or a fusion plan breaks a rule the rest of the analysis relies on."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvariantError(message)


def _first(items: Iterable[str], limit: int = 5) -> str:
    items = list(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(repr(i) for i in items[:limit]) + more


def check_graph(mg: ModelGraph) -> list[str]:
    """No dangling tensor, edges consistent with producers; returns unknown-type/shape edges."""
    available = set(mg.producer) | set(mg.graph_inputs) | mg.initializers
    dangling = [t for t in mg.consumers if t not in available]
    _require(not dangling, f"tensors read but never produced: {_first(dangling)}")
    missing = [t for t in mg.graph_outputs if t not in available]
    _require(not missing, f"graph outputs never produced: {_first(missing)}")
    unknown: list[str] = []
    for (src, dst), tensors in mg.edges.items():
        for t in tensors:
            if mg.producer.get(t.name) != src or dst not in mg.consumers.get(t.name, ()):
                raise InvariantError(f"edge {src!r} -> {dst!r} carries {t.name!r}, which "
                                     f"{src!r} does not produce for {dst!r}")
            if t.elem_type == 0 or t.shape is None or None in t.shape:
                unknown.append(t.name)
    return sorted(set(unknown))


def check_groups(mg: ModelGraph, groups: list[Group]) -> None:
    """A partition of the nodes, in topological order, each group convex with one exit."""
    _require([g.id for g in groups] == list(range(len(groups))),
             "group ids are not 0..n-1 in order")
    group_of: dict[str, int] = {}
    for g in groups:
        if not g.nodes:
            raise InvariantError(f"group {g.id} is empty")
        for key in g.nodes:
            if key in group_of:
                raise InvariantError(f"node {key!r} is in groups {group_of[key]} and {g.id}")
            group_of[key] = g.id
    missing = [k for k in mg.order if k not in group_of]
    _require(not missing, f"nodes in no group: {_first(missing)}")
    strangers = [k for k in group_of if k not in mg.infos]
    _require(not strangers, f"groups name nodes not in the graph: {_first(strangers)}")
    position = {key: i for i, key in enumerate(mg.order)}
    outputs = set(mg.graph_outputs)
    for g in groups:
        if list(g.nodes) != sorted(g.nodes, key=position.__getitem__):
            raise InvariantError(f"group {g.id} ({g.pattern}) lists its nodes out of "
                                 "execution order")
        for key in g.nodes:
            for t in mg.info(key).inputs:
                src = mg.producer.get(t.name) if t is not None else None
                if src is not None and group_of[src] > g.id:
                    raise InvariantError(f"group {g.id} ({g.pattern}) reads {t.name!r} from "
                                         f"later group {group_of[src]}")
        for key in g.nodes[:-1]:
            for t in mg.info(key).outputs:
                if t.name in outputs or any(group_of[user] != g.id
                                            for user in mg.consumers.get(t.name, ())):
                    raise InvariantError(f"group {g.id} ({g.pattern}): {t.name!r}, computed "
                                         f"inside by {key!r}, is read outside it")


def check_invariants(mg: ModelGraph, groups: list[Group]) -> list[str]:
    """Every check; returns the edge tensors whose dtype or shape is unknown."""
    unknown = check_graph(mg)
    check_groups(mg, groups)
    return unknown
