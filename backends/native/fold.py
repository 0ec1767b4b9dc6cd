"""Static nodes: nodes whose outputs are known before anything runs, evaluated once.

With every input shape fixed, a node is static when all its inputs are constants (initializers
or outputs of static nodes), or when it is a Shape / Size of a tensor of known shape. The
exporters leave many of them (shape arithmetic in ViT and Swin, Constant nodes); the plan
computes them with the analyzer's folding (`analyzer.fold.fold_nodes`, no size limit: weight
transforms fold too) and treats their outputs as constants. A node that folding cannot
evaluate stays in the plan, to be run (or refused) like any other. A static group whose output
crosses a group boundary still has its step: it copies the value into the arena.
"""

from __future__ import annotations

import numpy as np

from ...analyzer.fold import fold_nodes
from ...analyzer.graph import ModelGraph
from ...analyzer.loader import LoadedModel


def static_values(model: LoadedModel, mg: ModelGraph) -> tuple[dict[str, np.ndarray], set[str]]:
    """The value of every initializer and static node output, and the static node keys."""
    values = {name: model.initializer_array(name) for name in model.initializers}
    tensors = model.tensors

    def shape_of(name: str) -> tuple[int, ...] | None:
        info = tensors.get(name)
        return info.dims if info is not None and info.known else None

    nodes = model.proto.graph.node
    opsets = {o.domain: o.version for o in model.proto.opset_import}
    folded = fold_nodes((nodes[mg.info(key).index] for key in mg.order), values, opsets,
                        dims=shape_of)
    static = {key for key in mg.order
              if all(t.name in folded for t in mg.info(key).outputs)}
    return values, static
