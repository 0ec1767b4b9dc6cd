"""The plan of the native executor: one step per fused group of the analyzer, in its order.

A step runs its group as one kernel where the core has one: a Conv, Gemm or MatMul with every
elementwise node after it fused as its epilogue (bias, BatchNorm as scale and shift, residual
Add, Relu, Clip, HardSwish, SiLU, GELU spelled out in primitives ...), or one elementwise kernel
for a group of elementwise nodes. Other groups (attention, squeeze-excite) run as a short
sequence of kernels, each again with what it can fuse; the values passed between them live in a
scratch area, not in the arena, and the step is still timed as one.

Memory: a tensor is materialized exactly when the analyzer says so (`boundary_lifetimes`, the
rule behind `activation_peak_bytes`): graph inputs, graph outputs, tensors read by a later
group. Those live in one arena at offsets that never overlap while both tensors are live, so the
arena is as large as the analyzer's activation peak whenever the offsets pack perfectly (they do
on the models tested; `Plan.arena_bytes` says), less where a reshape's output shares its input's
bytes (`aliases_of_copies`; the analyzer counts the two apart). Nodes computed from constants
alone are folded (`fold.py`); a folded tensor that crosses a group boundary is copied into the
arena by its step, except weights a DequantizeLinear made: those stay constants (the analyzer's
peak counts them when their DequantizeLinear is a group of its own, so the arena is smaller than
it then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ...analyzer.analysis import AnalysisResult
from ...analyzer.fusion import Group
from ...analyzer.graph import ModelGraph
from ...analyzer.ir import NodeInfo, TensorInfo, dtype_bytes
from ...analyzer.loader import LoadedModel
from ...analyzer.memory import boundary_lifetimes
from ..base import BackendError
from .catalogue import STORAGE
from .decoder import CONTRIB_OPS
from .fold import static_values
from .lower import (
    CONTRIB_GELUS,
    ELEMENTWISE,
    FLOAT,
    LOWERINGS,
    MAIN_OPS,
    PARAMETRIZED,
    Instr,
    Kernel,
    Lowering,
    Unsupported,
    data_inputs,
    elementwise_instrs,
    elementwise_limits,
    is_elementwise,
    main_kernel,
)

ARENA, SCRATCH, CONST = STORAGE["arena"], STORAGE["scratch"], STORAGE["constant"]
_MAX_REGISTERS = 60
# Every arena and scratch tensor starts on a cache line (the areas are allocated so aligned,
# huge_pages.h): at element alignment a 64-byte vector of a tensor 16 bytes into a line split
# across two lines on every load and store.
CACHE_LINE = 64


class UnsupportedModel(BackendError):
    """The native executor has no kernel for some nodes (listed, with the reason): a backend
    error of the backend planning (`compare` then measures the others)."""


@dataclass(frozen=True, slots=True)
class PlanTensor:
    name: str
    elem_type: int
    shape: tuple[int, ...]
    storage: int
    offset: int  # bytes into the arena or scratch area; index of a constant
    alias: str | None = None  # the arena tensor whose bytes it shares (aliases_of_copies)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dtype_bytes(self.elem_type)


@dataclass
class Step:
    group: int
    name: str  # the group's last node: the kernel name the profile reports
    pattern: str
    kernels: list[Kernel]


@dataclass
class Plan:
    tensors: list[PlanTensor]
    constants: list[np.ndarray]
    steps: list[Step]
    inputs: list[str]
    outputs: list[str]
    arena_bytes: int
    scratch_bytes: int
    activation_peak_bytes: int | None  # the analyzer's figure for the same groups
    ids: dict[str, int] = field(default_factory=dict)

    def tensor(self, name: str) -> PlanTensor:
        return self.tensors[self.ids[name]]

    def native_args(self) -> tuple[Any, ...]:
        """The arguments of `_native.Executor` (before threads and isa)."""
        tensors = [(t.name, t.elem_type, list(t.shape), t.storage, t.offset,
                    -1 if t.alias is None else self.ids[t.alias]) for t in self.tensors]
        steps = [(s.group, s.name, [self._kernel_args(k) for k in s.kernels])
                 for s in self.steps]
        return (tensors, self.constants, [self.ids[n] for n in self.inputs],
                [self.ids[n] for n in self.outputs], steps, self.arena_bytes, self.scratch_bytes)

    def _kernel_args(self, k: Kernel) -> tuple[Any, ...]:
        def tid(name: str | None) -> int:
            return -1 if name is None else self.ids[name]

        return (k.op, [tid(n) for n in k.inputs], [tid(n) for n in k.outputs], k.ints,
                k.floats, [(tid(n), list(v) if v is not None else []) for n, v in k.operands],
                [(i.op, i.dst, list(i.srcs), list(i.params)) for i in k.program])


# ---- building -----------------------------------------------------------------------------------

def build_plan(result: AnalysisResult, backend: str = "native-cpu") -> Plan:
    """The plan of `result`'s groups; `UnsupportedModel` lists every node it cannot run."""
    lowered = lower_groups(result.model, result.graph, result.groups)
    if lowered.problems:
        raise UnsupportedModel("cannot run " + "; ".join(
            f"{what} (node {nodes[0]!r}" + (f" and {len(nodes) - 1} more)" if len(nodes) > 1
                                            else ")")
            for what, nodes in lowered.problems.items()), backend)
    return _assemble(result, lowered, backend)


@dataclass
class Lowered:
    """Every group's step (a refused group's holds only its folded copies), and why not."""

    steps: list[Step]
    problems: dict[str, list[str]]  # reason -> the nodes it refuses
    refused: set[int]  # ids of the groups with a node the executor cannot run
    values: dict[str, np.ndarray]  # constants and folded tensors
    lifetimes: dict[str, tuple[int, int]]  # the tensors that cross group boundaries
    twins: dict[str, TensorInfo] = field(default_factory=dict)  # Lowering.float_twin's
    aliases: dict[str, str] = field(default_factory=dict)  # aliases_of_copies'


def lower_groups(model: LoadedModel, mg: ModelGraph, groups: list[Group]) -> Lowered:
    """The executor's kernels for each group, in order: what the plan runs and what the
    native kernel model (`backends.native.kernel_model`) costs."""
    values, static = static_values(model, mg)
    low = Lowering(model.tensors, values, model.opset)
    lifetimes = boundary_lifetimes(mg, groups)
    for name in _dequantized_weights(mg, static):
        lifetimes.pop(name, None)
    problems: dict[str, list[str]] = {}
    steps, refused = [], set()
    for group in groups:
        kernels, ok = _lower_group(group, mg, low, static, lifetimes, problems)
        steps.append(Step(group.id, group.nodes[-1], group.pattern, kernels))
        if not ok:
            refused.add(group.id)
    aliases = aliases_of_copies(steps, lifetimes, model.tensors)
    return Lowered(steps, problems, refused, values, lifetimes, low.twins, aliases)


def aliases_of_copies(steps: list[Step], lifetimes: dict[str, tuple[int, int]],
                      tensors: dict[str, TensorInfo]) -> dict[str, str]:
    """Arena tensors that share the bytes of another (tensor -> the one it shares): the
    output of a step that is one plain Copy between arena tensors of one element type and
    size (Reshape, Flatten, Squeeze, Unsqueeze, Identity), whose Copy is dropped. Nothing
    writes a tensor after its step, so the two hold the same bytes for as long as either is
    read: `lifetimes` keeps the shared bytes (the first tensor's entry) live over both, and
    the alias's own entry goes. ViT-B/16 made 121 such copies a run, 1.8 ms of its 174."""
    aliases: dict[str, str] = {}
    for step in steps:
        if len(step.kernels) != 1:
            continue
        k = step.kernels[0]
        if k.op != "Copy" or k.ints or k.floats or k.operands or len(k.inputs) != 1:
            continue
        x, y = k.inputs[0], k.outputs[0]
        if (x not in lifetimes and x not in aliases) or y not in lifetimes:
            continue
        if (tensors[x].elem_type, tensors[x].nbytes) != (tensors[y].elem_type, tensors[y].nbytes):
            continue
        root = aliases.get(x, x)
        aliases[y] = root
        (a, b), (c, d) = lifetimes[root], lifetimes.pop(y)
        lifetimes[root] = (min(a, c), max(b, d))
        step.kernels = []
    return aliases


def _dequantized_weights(mg: ModelGraph, static: set[str]) -> set[str]:
    """Folded tensors made from a DequantizeLinear's (weights, and a static Transpose of
    them ...), graph outputs aside. Where one crosses a group boundary it stays a constant its
    readers take, as the integer weight was, rather than a copy into the arena each run."""
    made: set[str] = set()
    for key in mg.order:
        info = mg.info(key)
        if key in static and (info.op_type == "DequantizeLinear"
                              or any(t is not None and t.name in made for t in info.inputs)):
            made.update(t.name for t in info.outputs)
    return made - set(mg.graph_outputs)


def _lower_group(group: Group, mg: ModelGraph, low: Lowering, static: set[str],
                 lifetimes: dict[str, tuple[int, int]], problems: dict[str, list[str]]
                 ) -> tuple[list[Kernel], bool]:
    kernels = [Kernel("Copy", [_folded(t.name)], [t.name]) for key in group.nodes
               if key in static for t in mg.info(key).outputs if t.name in lifetimes]
    nodes = [mg.info(key) for key in group.nodes if key not in static]
    reasons = [(info, reason) for info in nodes if (reason := _unsupported_reason(info, low))]
    for info, reason in reasons:
        problems.setdefault(reason, []).append(info.name)
    if reasons:
        return kernels, False
    try:
        return kernels + _GroupLowering(nodes, group, mg, low, lifetimes).lower(), True
    except Unsupported as e:
        problems.setdefault(f"{group.pattern}: {e}", []).append(group.nodes[-1])
        return kernels, False


FOLDED = "::folded"


def _folded(name: str) -> str:
    """The constant holding a folded tensor's value (the tensor itself is an arena copy)."""
    return name + FOLDED


def _unsupported_reason(info: NodeInfo, low: Lowering) -> str | None:
    if info.domain not in ("", "ai.onnx") and not (
            info.domain == "com.microsoft" and info.op_type in CONTRIB_OPS | CONTRIB_GELUS):
        return f"{info.domain}::{info.op_type} (no kernel)"
    known = info.op_type in LOWERINGS or info.op_type in MAIN_OPS
    if not known and not is_elementwise(info, low):
        why = elementwise_limits(info.op_type) if info.op_type in ELEMENTWISE else "no kernel"
        return f"{info.op_type} ({why})"
    try:
        for t in [*info.inputs, *info.outputs]:
            if t is not None and t.name:
                low.info(t.name)
    except Unsupported as e:
        return f"{info.op_type} ({e})"
    return None


class _Open:
    """A fused kernel being built: the main kernel (or an Elementwise one) and its values."""

    def __init__(self, kernel: Kernel, shape: tuple[int, ...]) -> None:
        self.kernel = kernel
        self.shape = shape
        self.values: dict[str, int] = {}
        self.nodes: list[NodeInfo] = []
        self.next_reg = 1 + max((r for i in kernel.program for r in (i.dst, *i.srcs) if r >= 0),
                                default=0)

    def new_reg(self) -> int:
        self.next_reg += 1
        return self.next_reg - 1

    def __call__(self, name: str) -> int:
        return self.values[name] if name in self.values else self.kernel.operand(name)

    def view(self, name: str, view: tuple[int, ...]) -> int:
        return self.kernel.operand(name, view)


class _GroupLowering:
    """Greedy: each main node opens a kernel that absorbs the elementwise nodes after it that
    read its values and have its output's shape; elementwise nodes left over open an
    Elementwise kernel the same way. A value made inside a kernel but read outside it cannot
    stay in registers: the node that buried it is then not absorbed, and the group is lowered
    again (`barrier`)."""

    def __init__(self, nodes: list[NodeInfo], group: Group, mg: ModelGraph,
                 low: Lowering, lifetimes: dict[str, tuple[int, int]]) -> None:
        self.nodes = nodes
        self.members = set(group.nodes)
        self.mg = mg
        self.low = low
        self.lifetimes = lifetimes
        self.barrier: set[str] = set()

    def lower(self) -> list[Kernel]:
        while True:
            kernels, opens = self._attempt()
            buried = self._buried(opens)
            if buried is None:
                return kernels
            self.barrier.add(buried)

    def _attempt(self) -> tuple[list[Kernel], list[_Open]]:
        kernels: list[Kernel] = []
        opens: list[_Open] = []
        done: set[str] = set()  # tensors written by the kernels closed so far
        current: _Open | None = None
        for node in self.nodes:
            if current is not None and self._absorbs(current, node, done):
                self._absorb(current, node)
                continue
            if current is not None:
                kernels += self._close(current, done)
                current = None
            if node.op_type in MAIN_OPS:
                out = node.outputs[0].name
                current = _Open(main_kernel(node, self.low), self.low.shape(out))
                current.values[out] = 0
                current.nodes.append(node)
                opens.append(current)
            elif is_elementwise(node, self.low):
                out = node.outputs[0].name
                current = _Open(Kernel("Elementwise", [], [out]), self.low.shape(out))
                self._absorb(current, node)
                opens.append(current)
            else:
                for k in LOWERINGS[node.op_type](node, self.low):
                    k.nodes = [node.name]
                    kernels.append(k)
                    done.update(k.outputs)
        if current is not None:
            kernels += self._close(current, done)
        return kernels, opens

    def _absorbs(self, current: _Open, node: NodeInfo, done: set[str]) -> bool:
        if node.name in self.barrier or not is_elementwise(node, self.low):
            return False
        if self.low.shape(node.outputs[0].name) != current.shape:
            return False
        if current.next_reg + 4 > _MAX_REGISTERS:
            return False
        inputs = [t for t in node.inputs if t is not None and t.name]
        if not any(t.name in current.values for t in data_inputs(node)):
            return False
        # BatchNorm's and Q/DQ's parameters are laid out by their lowering; every other input
        # is an operand.
        operands = inputs[:1] if node.op_type in PARAMETRIZED else inputs
        for t in inputs:
            if t.name in current.values:
                continue
            inside = self.mg.producer.get(t.name) in self.members
            if inside and t.name not in done and t.name not in self.low.values:
                return False
            if t in operands and not _broadcasts(self.low.shape(t.name), current.shape):
                return False
        return True

    def _absorb(self, current: _Open, node: NodeInfo) -> None:
        code, reg = elementwise_instrs(node, self.low, current, current.new_reg)
        current.kernel.program.extend(code)
        current.values[node.outputs[0].name] = reg
        current.nodes.append(node)

    def _close(self, current: _Open, done: set[str]) -> list[Kernel]:
        """The kernel, with a Cast before it for each integer operand it reads and one after
        it when its output is an integer tensor (a QuantizeLinear's): programs are float32."""
        k = current.kernel
        last_node = current.nodes[-1]
        final = last_node.outputs[0].name
        reg = current.values[final]
        if reg != 0:  # the last instruction writes the output, register 0
            last = k.program[-1]
            k.program[-1] = Instr(last.op, 0, last.srcs, last.params)
        k.nodes = [n.name for n in current.nodes]
        done.add(final)
        before = []
        for i, (name, view) in enumerate(k.operands):
            if name not in self.low.values and self.low.info(name).elem_type != FLOAT:
                reader = next(n.name for n in current.nodes
                              if any(t is not None and t.name == name for t in n.inputs))
                twin = self.low.float_twin(name, reader)
                k.operands[i] = (twin, view)
                before.append(Kernel("Cast", [name], [twin], nodes=[reader]))
        if self.low.info(final).elem_type == FLOAT:
            k.outputs = [final]
            return [*before, k]
        k.outputs = [self.low.float_twin(final)]
        return [*before, k, Kernel("Cast", k.outputs, [final], nodes=[last_node.name])]

    def _buried(self, opens: list[_Open]) -> str | None:
        """The node after a value that is read outside its kernel, or None."""
        outputs = set(self.mg.graph_outputs)
        for current in opens:
            keys = {n.name for n in current.nodes}
            for i, node in enumerate(current.nodes[:-1]):
                name = node.outputs[0].name
                readers = self.mg.consumers.get(name, [])
                if name in outputs or any(r not in keys for r in readers):
                    return current.nodes[i + 1].name
        return None


def _broadcasts(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    if len(shape) > len(out):
        return False
    return all(d in (1, o) for d, o in zip(reversed(shape), reversed(out), strict=False))


# ---- tensors, constants, arena ----------------------------------------------------------------

def _assemble(result: AnalysisResult, lowered: Lowered, backend: str) -> Plan:
    model = result.model
    steps, values, lifetimes = lowered.steps, lowered.values, lowered.lifetimes
    tensors: list[PlanTensor] = []
    constants: list[np.ndarray] = []
    ids: dict[str, int] = {}

    def add(t: PlanTensor) -> None:
        ids[t.name] = len(tensors)
        tensors.append(t)

    for name in _referenced(steps):
        if name in ids:
            continue
        if name.endswith(FOLDED) or (name in values and name not in lifetimes):
            # np.asarray keeps a 0-d constant 0-d (ascontiguousarray would make it 1-d)
            value = np.asarray(values[name.removesuffix(FOLDED)], order="C")
            add(PlanTensor(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
                           value.shape, CONST, len(constants)))
            constants.append(value)
    offsets, arena = arena_offsets({n: (span, model.tensors[n].nbytes)
                                    for n, span in lifetimes.items()}, CACHE_LINE)
    for name in lifetimes:
        info = model.tensors[name]
        add(PlanTensor(name, info.elem_type, info.dims, ARENA, offsets[name]))
    for name, root in lowered.aliases.items():
        info = model.tensors[name]
        add(PlanTensor(name, info.elem_type, info.dims, ARENA, offsets[root], root))
    scratch = 0
    for step in steps:
        at = 0
        for k in step.kernels:
            for name in k.outputs:
                if name in ids:
                    continue
                info = lowered.twins.get(name) or model.tensors[name]
                add(PlanTensor(name, info.elem_type, info.dims, SCRATCH, at))
                at += -(-info.nbytes // CACHE_LINE) * CACHE_LINE
        scratch = max(scratch, at)
    missing = [n for n in _referenced(steps) if n not in ids]
    if missing:
        raise UnsupportedModel(f"tensors with no storage: {', '.join(missing[:5])}", backend)
    return Plan(tensors, constants, steps, list(result.graph.graph_inputs),
                list(result.graph.graph_outputs), arena, scratch,
                result.activation_peak_bytes, ids)


def _referenced(steps: list[Step]) -> list[str]:
    names: list[str] = []
    for step in steps:
        for k in step.kernels:
            names += [n for n in k.inputs if n]
            names += [n for n, _ in k.operands]
    return names


def arena_offsets(tensors: dict[str, tuple[tuple[int, int], int]], align: int
                  ) -> tuple[dict[str, int], int]:
    """Offsets for tensors given as name -> ((first step, last step), bytes), and the arena size.

    Each tensor goes to the lowest offset, a multiple of `align`, clear of every tensor placed
    before it that is live at the same time. The order matters (no order is best for every
    model), so three are tried: largest first, longest-lived among equals first, and by birth;
    the smallest wins.
    """
    def size_first(n: str) -> tuple[int, int]:
        return -tensors[n][1], tensors[n][0][0]

    def size_then_life(n: str) -> tuple[int, int]:
        (first, last), size = tensors[n]
        return -size, first - last

    def birth(n: str) -> tuple[int, int]:
        return tensors[n][0][0], -tensors[n][1]

    layouts = [_place(sorted(tensors, key=key), tensors, align)
               for key in (size_first, size_then_life, birth)]
    return min(layouts, key=lambda layout: layout[1])


def _place(order: list[str], tensors: dict[str, tuple[tuple[int, int], int]],
           align: int) -> tuple[dict[str, int], int]:
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first step, last step)
    offsets: dict[str, int] = {}
    for name in order:
        (first, last), size = tensors[name]
        clash = sorted((o, e) for o, e, f, z in placed if f <= last and first <= z)
        at = 0
        for o, e in clash:
            if at + size <= o:
                break
            at = max(at, -(-e // align) * align)
        offsets[name] = at
        if size:
            placed.append((at, at + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)
