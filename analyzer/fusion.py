"""Fusion passes: partition the graph into the groups a fusing runtime would run as one kernel.

Every node belongs to exactly one group; a node no pattern claims is a group of its own.
Groups come out in execution order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import ModelGraph


@dataclass(frozen=True, slots=True)
class Group:
    id: int
    pattern: str  # "Conv+BN+Relu", or the op_type of a singleton
    nodes: tuple[str, ...]  # node keys in execution order


def fuse(mg: ModelGraph) -> list[Group]:
    return [Group(i, mg.info(k).op_type, (k,)) for i, k in enumerate(mg.order)]
