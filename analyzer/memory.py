"""Peak activation memory of the fused plan, by liveness over its execution order.

The plan runs group after group. A tensor is materialized only if it crosses a group boundary
(a graph input, a graph output, or read by a later group); tensors inside a group stay in
registers or cache. A materialized tensor is live from the step that produces it (graph inputs:
from the start) through the last step that reads it (graph outputs: to the end). The peak is
the largest sum of live bytes at any step, counting a step's inputs and outputs together,
since a kernel reads the one while writing the other. Weights are not activations and are
reported apart (``param_bytes``).
"""

from __future__ import annotations

from itertools import accumulate

from .fusion import Group
from .graph import ModelGraph
from .ir import TensorInfo, UnknownShape


def boundary_lifetimes(mg: ModelGraph, groups: list[Group]) -> dict[str, tuple[int, int]]:
    """Each materialized tensor's (first step, last step) of the plan, both inclusive.

    The one liveness rule of the plan: the analyzer's peak and the native executor's arena
    offsets (backends/native/plan.py) both come from it.
    """
    step_of_node = {key: step for step, g in enumerate(groups) for key in g.nodes}
    last_step = len(groups) - 1
    graph_outputs = frozenset(mg.graph_outputs)
    consumers = mg.consumers
    lifetimes: dict[str, tuple[int, int]] = {}
    for name in mg.graph_inputs:  # live from the start
        readers = [step_of_node[u] for u in consumers.get(name, ())]
        lifetimes[name] = (0, last_step if name in graph_outputs else max(readers, default=0))
    for name, producer in mg.producer.items():
        step = step_of_node[producer]
        if name in graph_outputs:
            lifetimes[name] = (step, last_step)
            continue
        users = consumers.get(name)
        if not users:
            continue
        readers = [step_of_node[u] for u in users]
        if readers.count(step) != len(readers):  # read by another group
            lifetimes[name] = (step, max(step, *readers))
    return lifetimes


def activation_peak_bytes(mg: ModelGraph, groups: list[Group],
                          tensors: dict[str, TensorInfo]) -> int | None:
    """Peak live bytes of boundary tensors; None when some boundary tensor's size is unknown."""
    # Sweep: +bytes at birth, -bytes after death.
    delta = [0] * (len(groups) + 1)
    try:
        for name, (start, end) in boundary_lifetimes(mg, groups).items():
            size = _nbytes(tensors, name)
            delta[start] += size
            delta[end + 1] -= size
    except UnknownShape:
        return None
    return max(accumulate(delta[:-1]), default=0)


def touched_bytes(mg: ModelGraph, groups: list[Group],
                  tensors: dict[str, TensorInfo]) -> int | None:
    """Every boundary tensor's bytes, each once: what a run's activations touch when each has
    a buffer of its own (an upper bound where a runtime reuses buffers: the estimator's
    `HardwareProfile.weights_level` reads it); None when some size is unknown."""
    try:
        return sum(_nbytes(tensors, name) for name in boundary_lifetimes(mg, groups))
    except UnknownShape:
        return None


def _nbytes(tensors: dict[str, TensorInfo], name: str) -> int:
    info = tensors.get(name)
    if info is None:
        raise UnknownShape(name)
    return info.nbytes
