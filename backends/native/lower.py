"""ONNX nodes to kernels of the C++ core: one registry keyed by op_type.

Three kinds of node:

- *elementwise* (`ELEMENTWISE`): float32 ops that become instructions of an elementwise program
  (`Instr`; which instruction, and which attributes are its parameters, is the op catalogue's
  row, `analyzer.cost.ops`; Clip, Gelu, BatchNormalization and Q/DQ have rules here), fused
  after a Conv / Gemm / MatMul as its epilogue or run as an `Elementwise` kernel of their own.
  QuantizeLinear and DequantizeLinear are among them (simulated quantization, `_quantize`):
  inside a program an integer tensor is held as the float of the
  same value (exact up to 2^24), so a Q -> DQ pair costs a few instructions and no memory;
  where such a tensor enters or leaves a kernel, a Cast converts it (`float_twin`);
- *main* (`MAIN_OPS`): Conv, Gemm, MatMul, which take such an epilogue;
- the rest (`LOWERINGS`): one function per op returning its kernels.

A node the core cannot run (an op missing here, a float64 input, a 3-D convolution) raises
`Unsupported` with the reason; the planner collects them all before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import onnx

from ...analyzer.cost.ops import POINTWISE, PointwiseOp
from ...analyzer.ir import NodeInfo, TensorInfo
from .catalogue import EW_OPS, REDUCE_OPS, EwOp

FLOAT = onnx.TensorProto.FLOAT
_T = onnx.TensorProto
# The integer types QuantizeLinear writes and DequantizeLinear reads here, with their ranges
# (every value exact in float32); DequantizeLinear also reads int32 (a bias, a MatMul sum).
QUANT_RANGES: dict[int, tuple[int, int]] = {
    _T.UINT8: (0, 255), _T.INT8: (-128, 127), _T.UINT16: (0, 65535), _T.INT16: (-32768, 32767)}
_DEQUANT_TYPES = frozenset({*QUANT_RANGES, _T.INT32})
QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


class Unsupported(Exception):
    """This node cannot run on the native executor; the message says why."""


@dataclass(frozen=True, slots=True)
class Instr:
    """dst = op(srcs): a source >= 0 is a register, < 0 is operand -1 - src. `op` is one of
    the catalogue's (`catalogue.EW_OPS`, from ops.def), with its operand and parameter counts:
    anything else is refused here, before it reaches the core."""

    op: str
    dst: int
    srcs: tuple[int, ...]
    params: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        spec = EW_OPS.get(self.op)
        if spec is None or (len(self.srcs), len(self.params)) != (spec.arity, spec.params):
            raise ValueError(f"elementwise {self.op}{self.srcs} with {len(self.params)} "
                             "parameter(s) is not an operation of ops.def")


@dataclass
class Kernel:
    """One kernel of the core; tensors by name (resolved to ids by the planner)."""

    op: str
    inputs: list[str | None]
    outputs: list[str]
    ints: dict[str, list[int]] = field(default_factory=dict)
    floats: dict[str, list[float]] = field(default_factory=dict)
    operands: list[tuple[str, tuple[int, ...] | None]] = field(default_factory=list)
    program: list[Instr] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # the graph nodes it computes (their keys)

    def operand(self, name: str, view: tuple[int, ...] | None = None) -> int:
        """The source code of operand `name` seen as `view`, added once."""
        entry = (name, view)
        if entry not in self.operands:
            self.operands.append(entry)
        return -1 - self.operands.index(entry)


class Lowering:
    """What a lowering function may ask: tensor facts, constant values, new constants."""

    def __init__(self, tensors: dict[str, TensorInfo], values: dict[str, np.ndarray],
                 opset: int) -> None:
        self.tensors = tensors
        self.values = values
        self.opset = opset
        self.derived: dict[str, np.ndarray] = {}
        self.twins: dict[str, TensorInfo] = {}  # float32 copies of integer tensors (float_twin)

    def info(self, name: str) -> TensorInfo:
        t = self.tensors.get(name)
        if t is None or not t.known:
            raise Unsupported(f"tensor {name!r} has no static shape")
        return t

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).dims

    def const(self, name: str | None) -> np.ndarray | None:
        return None if name is None else self.values.get(name)

    def need_const(self, node: NodeInfo, i: int, what: str) -> np.ndarray | None:
        """Input `i` of `node` as a value (None if omitted); Unsupported if computed at run time."""
        t = node.input(i)
        if t is None:
            return None
        value = self.const(t.name)
        if value is None:
            raise Unsupported(f"{what} must be a constant")
        return value

    def add_const(self, name: str, value: np.ndarray) -> str:
        self.derived[name] = value
        self.values[name] = value
        return name

    def float_twin(self, name: str, reader: str = "") -> str:
        """A float32 tensor of `name`'s shape holding its integer values: what an elementwise
        program reads or writes in its place, converted by a Cast (a constant: at plan time).
        Each reading node gets its own twin: a scratch tensor lives in one step only."""
        twin = name + "::float" + (f"@{reader}" if reader else "")
        value = self.const(name)
        if value is not None:
            return self.add_const(twin, np.asarray(value, dtype=np.float32))
        self.twins[twin] = TensorInfo(twin, FLOAT, self.shape(name))
        return twin


# ---- elementwise ------------------------------------------------------------------------------

def instructions(table: Mapping[str, PointwiseOp], ops: Mapping[str, EwOp]
                 ) -> dict[str, tuple[str, PointwiseOp]]:
    """op -> (instruction, row) for the rows of the op catalogue (`analyzer.cost.ops`) that run
    as an instruction of ops.def (`ops`: n - 1 of them for a variadic op). Each is checked
    against ops.def: an instruction it lacks, or that disagrees on the parameters or operands,
    is a ValueError when this module is imported, not a wrong program at run time."""
    out: dict[str, tuple[str, PointwiseOp]] = {}
    for op, row in table.items():
        if row.native is None:
            continue
        spec = ops.get(row.native)
        if spec is None or spec.params != len(row.params) or (row.variadic and spec.arity != 2):
            raise ValueError(f"op catalogue: {op} runs as {row.native} with {len(row.params)} "
                             "parameter(s), an instruction ops.def does not define")
        out[op] = row.native, row
    return out


_INSTRUCTION = instructions(POINTWISE, EW_OPS)
# ONNX Runtime's GELUs (com.microsoft), as its transformer optimizer writes them: Gelu is ONNX's
# erf form, FastGelu the tanh form of x (+ bias), BiasGelu the erf form of a + b.
CONTRIB_GELUS = frozenset({"Gelu", "FastGelu", "BiasGelu"})
ELEMENTWISE = frozenset({*_INSTRUCTION, "Clip", *CONTRIB_GELUS, "BatchNormalization", *QDQ})
# Ops whose inputs after the first are parameters the lowering lays out (per channel, per
# axis, per block), not operands broadcast by numpy's rules.
PARAMETRIZED = frozenset({"BatchNormalization", *QDQ})
MAIN_OPS = frozenset({"Conv", "Gemm", "MatMul"})

class Source(Protocol):
    """Source codes of tensors within the program being built."""

    def __call__(self, name: str) -> int: ...  # a value of the program, or an operand
    def view(self, name: str, view: tuple[int, ...]) -> int: ...  # an operand seen as `view`


NewReg = Callable[[], int]


def is_elementwise(node: NodeInfo, low: Lowering) -> bool:
    """An elementwise node this executor can fuse: float32 in and out, one output."""
    if node.op_type not in ELEMENTWISE or not (
            node.domain in ("", "ai.onnx")
            or (node.domain == "com.microsoft" and node.op_type in CONTRIB_GELUS)):
        return False
    outs = [t for t in node.outputs if t.name]
    if len(outs) != 1:
        return False
    if node.op_type == "Dropout" and (len(node.outputs) > 1 or not _inference(node, low)):
        return False
    if node.op_type == "BatchNormalization" and (node.attr("training_mode", 0)
                                                 or len(node.outputs) > 1):
        return False
    if node.op_type == "Mod" and not node.attr("fmod", 0):
        return False
    if node.op_type == "QuantizeLinear":
        return node.inputs[0].elem_type == FLOAT and outs[0].elem_type in QUANT_RANGES
    if node.op_type == "DequantizeLinear":
        return node.inputs[0].elem_type in _DEQUANT_TYPES and outs[0].elem_type == FLOAT
    if node.op_type == "Pow" and _integer_constant(node, low, 1):  # Nemotron's relu(x) ** 2
        return node.inputs[0].elem_type == FLOAT and outs[0].elem_type == FLOAT
    return all(t.elem_type == FLOAT for t in [*outs, *data_inputs(node)])


def _integer_constant(node: NodeInfo, low: Lowering, i: int) -> bool:
    """Input `i` is a constant of an integer type (read as float32 by the program: exact for
    an exponent)."""
    t = node.input(i)
    return t is not None and t.elem_type in _INTEGERS and low.const(t.name) is not None


def _inference(dropout: NodeInfo, low: Lowering) -> bool:
    """A Dropout that is the identity: no training_mode input, or a constant false one (in
    training it zeroes random elements and scales the rest)."""
    mode = dropout.input(2)
    value = low.const(mode.name) if mode is not None else False
    return value is not None and not bool(np.asarray(value))


def elementwise_limits(op: str) -> str:
    """What an elementwise op needs to run here, for the refusal message."""
    if op in QDQ:
        return "only float32 and 8- or 16-bit integers, or int32 to dequantize"
    if op == "Dropout":
        return "only float32, one output, training_mode a constant false"
    return "only float32, one output"


def data_inputs(node: NodeInfo) -> list[TensorInfo]:
    """The inputs that carry float data (not Clip's bounds, not BatchNorm's parameters)."""
    if node.op_type in ("Clip", "Dropout", *PARAMETRIZED):
        return [node.inputs[0]] if node.inputs and node.inputs[0] is not None else []
    return [t for t in node.inputs if t is not None]


def elementwise_instrs(node: NodeInfo, low: Lowering, src: Source, new_reg: NewReg
                       ) -> tuple[list[Instr], int]:
    """The instructions computing `node`'s output from its inputs, and its register."""
    op = node.op_type
    ins = [t.name if t is not None else None for t in node.inputs]
    if op == "Pow" and _integer_constant(node, low, 1):
        ins[1] = low.float_twin(ins[1])  # the program reads float32 operands
    if op in _INSTRUCTION and _INSTRUCTION[op][1].variadic:
        return _variadic(node, _INSTRUCTION[op][0], ins, src, new_reg)
    if op in ("FastGelu", "BiasGelu"):
        return _bias_gelu(node, ins, src, new_reg)
    if op in _INSTRUCTION or op == "Gelu":
        core, params = _instruction(node)
        dst = new_reg()
        return [Instr(core, dst, tuple(src(n) for n in ins[:EW_OPS[core].arity]), params)], dst
    if op == "Clip":
        return _clip(node, low, ins, src, new_reg)
    if op in QDQ:
        return _quantize(node, low, src, new_reg)
    return _batch_norm(node, low, src, new_reg)


def _instruction(node: NodeInfo) -> tuple[str, tuple[float, ...]]:
    """The instruction of a one-instruction op and its parameters (attributes or defaults)."""
    if node.op_type == "Gelu":
        return ("GeluTanh" if node.attr("approximate", "none") == "tanh" else "Gelu"), ()
    core, row = _INSTRUCTION[node.op_type]
    return core, tuple(float(node.attr(a, d)) for a, d in row.params)


def _bias_gelu(node: NodeInfo, ins: list[str | None], src: Source, new_reg: NewReg
               ) -> tuple[list[Instr], int]:
    """ORT's FastGelu (tanh form) and BiasGelu (erf form) of their input plus the bias, when
    FastGelu has one."""
    names = [n for n in ins if n]
    code: list[Instr] = []
    acc = src(names[0])
    if len(names) == 2:
        dst = new_reg()
        code.append(Instr("Add", dst, (acc, src(names[1]))))
        acc = dst
    dst = new_reg()
    code.append(Instr("GeluTanh" if node.op_type == "FastGelu" else "Gelu", dst, (acc,)))
    return code, dst


def _variadic(node: NodeInfo, core: str, ins: list[str | None], src: Source, new_reg: NewReg
              ) -> tuple[list[Instr], int]:
    names = [n for n in ins if n]
    code: list[Instr] = []
    acc = src(names[0])
    for name in names[1:]:
        dst = new_reg()
        code.append(Instr(core, dst, (acc, src(name))))
        acc = dst
    if node.op_type == "Mean" or len(names) == 1:
        dst = new_reg()
        code.append(Instr("Affine", dst, (acc,), (1.0 / len(names), 0.0)))
        acc = dst
    return code, acc


def _clip(node: NodeInfo, low: Lowering, ins: list[str | None], src: Source, new_reg: NewReg
          ) -> tuple[list[Instr], int]:
    if low.opset < 11:
        lo, hi = float(node.attr("min", -np.inf)), float(node.attr("max", np.inf))
        dst = new_reg()
        return [Instr("Clip", dst, (src(ins[0]),), (lo, hi))], dst
    bounds = [ins[i] if i < len(ins) else None for i in (1, 2)]
    values = [low.const(b) for b in bounds]
    if all(b is None or v is not None for b, v in zip(bounds, values, strict=True)):
        lo = float(values[0]) if values[0] is not None else -np.inf
        hi = float(values[1]) if values[1] is not None else np.inf
        dst = new_reg()
        return [Instr("Clip", dst, (src(ins[0]),), (lo, hi))], dst
    code: list[Instr] = []
    acc = src(ins[0])
    for bound, core in zip(bounds, ("Max", "Min"), strict=True):
        if bound:
            dst = new_reg()
            code.append(Instr(core, dst, (acc, src(bound))))
            acc = dst
    return code, acc


def _batch_norm(node: NodeInfo, low: Lowering, src: Source, new_reg: NewReg
                ) -> tuple[list[Instr], int]:
    """Inference BatchNorm as x * scale + shift per channel (axis 1)."""
    params = [low.need_const(node, i, "BatchNormalization's parameters") for i in range(1, 5)]
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
    scale = gamma / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
    shift = beta - mean * scale
    x = node.inputs[0]
    rank = len(low.shape(x.name))
    view = (scale.size,) + (1,) * max(rank - 2, 0)
    s = low.add_const(f"{node.name}::scale", scale.astype(np.float32))
    b = low.add_const(f"{node.name}::shift", shift.astype(np.float32))
    dst = new_reg()
    return [Instr("MulAdd", dst, (src(x.name), src.view(s, view), src.view(b, view)))], dst


def _quantize(node: NodeInfo, low: Lowering, src: Source, new_reg: NewReg
              ) -> tuple[list[Instr], int]:
    """QuantizeLinear and DequantizeLinear as ONNX defines them, in float32:
    Q: y = clip(rint(x / scale) + zero_point, lo, hi) (rint: half to even, the rounding mode
    nearbyintf uses); DQ: x = (y - zero_point) * scale. Each step is exact in float32 or
    rounds once as the reference's float32 numpy does (x / scale, (y - zp) * scale), so the
    result is the reference's to the bit. NaN clips to lo, as the reference's int32 cast does."""
    x = node.inputs[0].name
    scale = _qdq_operand(node, low, src, node.inputs[1])
    zp = node.input(2)
    zp_value = low.const(zp.name) if zp is not None else None
    code: list[Instr] = []

    def emit(op: str, srcs: tuple[int, ...], params: tuple[float, ...] = ()) -> int:
        dst = new_reg()
        code.append(Instr(op, dst, srcs, params))
        return dst

    def shift(value: int, sign: float) -> int:
        """value + sign * zero point (one constant: a parameter; none: + 0.0)."""
        if zp is None or (zp_value is not None and zp_value.size == 1):
            zero = 0.0 if zp_value is None else float(zp_value.reshape(-1)[0])
            return emit("Affine", (value,), (1.0, sign * zero))
        return emit("Add" if sign > 0 else "Sub", (value, _qdq_operand(node, low, src, zp)))

    if node.op_type == "DequantizeLinear":
        return code, emit("Mul", (shift(src(x), -1.0), scale))
    # Adding the zero point also turns rint's -0 into the integer 0 (+0).
    q = shift(emit("Round", (emit("Div", (src(x), scale)),)), 1.0)
    lo, hi = QUANT_RANGES[node.outputs[0].elem_type]
    return code, emit("Clip", (q,), (float(lo), float(hi)))


def _qdq_operand(node: NodeInfo, low: Lowering, src: Source, t: TensorInfo) -> int:
    """A Q/DQ node's scale or zero point `t` as a float32 operand laid out against x: one
    value, one per index of `axis` (1-D), or one per block of `block_size` along it (a
    constant, expanded to x's shape)."""
    # An integer constant becomes a float32 one now; a computed one is converted by a Cast
    # where its kernel starts (plan._GroupLowering).
    constant = low.const(t.name) is not None
    name = low.float_twin(t.name) if t.elem_type != FLOAT and constant else t.name
    x_shape = low.shape(node.inputs[0].name)
    shape = low.shape(t.name)
    if int(np.prod(shape)) == 1:
        return src.view(name, ())
    axis = _axis(int(node.attr("axis", 1)), len(x_shape))
    block = int(node.attr("block_size", 0))
    if not block:
        if len(shape) != 1 or not 0 <= axis < len(x_shape) or shape[0] != x_shape[axis]:
            raise Unsupported(f"{node.op_type}'s {t.name!r} {list(shape)} does not lie "
                              f"along axis {axis} of x {list(x_shape)}")
        return src.view(name, (shape[0],) + (1,) * (len(x_shape) - axis - 1))
    value = low.const(name)
    if value is None:
        raise Unsupported(f"{node.op_type}'s blocked {t.name!r} must be a constant")
    full = np.repeat(value, block, axis=axis).take(range(x_shape[axis]), axis=axis)
    if full.shape != x_shape:
        raise Unsupported(f"{node.op_type}'s {t.name!r} {list(shape)} does not block x "
                          f"{list(x_shape)} by {block} along axis {axis}")
    return src(low.add_const(f"{node.name}::{t.name}::blocks", np.ascontiguousarray(full)))


# ---- main ops (with an epilogue) --------------------------------------------------------------

def _pads(node: NodeInfo, in_spatial: tuple[int, ...], kernel: tuple[int, ...],
          strides: list[int], dilations: list[int]) -> list[int]:
    """Explicit pads (begins, then ends) from `pads` or `auto_pad`."""
    n = len(in_spatial)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(node.attr("pads", [0] * 2 * n))
    if auto == "VALID":
        return [0] * 2 * n
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(big if auto == "SAME_LOWER" else small)
        ends.append(small if auto == "SAME_LOWER" else big)
    return begins + ends


def _window_ints(node: NodeInfo, x_shape: tuple[int, ...], kernel: tuple[int, ...]
                 ) -> dict[str, list[int]]:
    n = len(kernel)
    if n not in (1, 2):
        raise Unsupported(f"{n}-D windows (only 1-D and 2-D)")
    strides = list(node.attr("strides", [1] * n))
    dilations = list(node.attr("dilations", [1] * n))
    pads = _pads(node, x_shape[2:], kernel, strides, dilations)
    return {"strides": strides, "dilations": dilations, "pads": pads,
            "kernel_shape": list(kernel)}


def _require_float(node: NodeInfo, *tensors: TensorInfo | None) -> None:
    for t in tensors:
        if t is not None and t.elem_type != FLOAT:
            raise Unsupported(f"{onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)} tensors "
                              f"(only float32)")


def main_kernel(node: NodeInfo, low: Lowering) -> Kernel:
    """The kernel of a Conv, Gemm or MatMul, its bias already in the epilogue."""
    x, w = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    _require_float(node, x, w, out, node.input(2))
    if node.op_type == "MatMul":
        return Kernel("MatMul", [x.name, w.name], [out.name])
    if node.op_type == "Gemm":
        return _gemm(node, x.name, w.name, out.name)
    kernel = low.shape(w.name)[2:]
    ints = _window_ints(node, low.shape(x.name), kernel)
    ints["group"] = [int(node.attr("group", 1))]
    k = Kernel("Conv", [x.name, w.name], [out.name], ints)
    bias = node.input(2)
    if bias is not None:
        view = (low.shape(bias.name)[0],) + (1,) * len(kernel)
        k.program.append(Instr("Add", 0, (0, k.operand(bias.name, view))))
    return k


def _gemm(node: NodeInfo, a: str, b: str, out: str) -> Kernel:
    k = Kernel("Gemm", [a, b], [out], {"transA": [int(node.attr("transA", 0))],
                                       "transB": [int(node.attr("transB", 0))]})
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        k.program.append(Instr("Affine", 0, (0,), (alpha, 0.0)))
    c = node.input(2)
    if c is not None and beta != 0.0:
        source = k.operand(c.name)
        if beta != 1.0:
            k.program.append(Instr("Affine", 1, (source,), (beta, 0.0)))
            source = 1
        k.program.append(Instr("Add", 0, (0, source)))
    return k


# ---- everything else --------------------------------------------------------------------------

Lower = Callable[[NodeInfo, Lowering], list[Kernel]]
LOWERINGS: dict[str, Lower] = {}


def lowering(*ops: str) -> Callable[[Lower], Lower]:
    def register(fn: Lower) -> Lower:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"lowering for {op} registered twice")
            LOWERINGS[op] = fn
        return fn
    return register


def _io(node: NodeInfo) -> tuple[str, str]:
    return node.inputs[0].name, node.outputs[0].name


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


@lowering("MaxPool", "AveragePool")
def _pool(node: NodeInfo, low: Lowering) -> list[Kernel]:
    if len([o for o in node.outputs if o.name]) > 1:
        raise Unsupported("MaxPool's Indices output")
    x, y = _io(node)
    _require_float(node, node.inputs[0])
    ints = _window_ints(node, low.shape(x), tuple(node.attr("kernel_shape")))
    ints["ceil_mode"] = [int(node.attr("ceil_mode", 0))]
    ints["count_include_pad"] = [int(node.attr("count_include_pad", 0))]
    if node.op_type == "AveragePool" and any(d != 1 for d in ints["dilations"]):
        raise Unsupported("AveragePool with dilations")
    return [Kernel(node.op_type, [x], [y], ints)]


@lowering("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node: NodeInfo, low: Lowering) -> list[Kernel]:
    _require_float(node, node.inputs[0])
    x, y = _io(node)
    return [Kernel(node.op_type, [x], [y])]


@lowering("Softmax", "LogSoftmax")
def _softmax(node: NodeInfo, low: Lowering) -> list[Kernel]:
    _require_float(node, node.inputs[0])
    x, y = _io(node)
    rank = len(low.shape(x))
    legacy = low.opset < 13
    axis = _axis(int(node.attr("axis", 1 if legacy else -1)), rank)
    return [Kernel(node.op_type, [x], [y], {"axis": [axis], "flatten": [int(legacy)]})]


@lowering("LayerNormalization")
def _layer_norm(node: NodeInfo, low: Lowering) -> list[Kernel]:
    outs = [o.name for o in node.outputs]
    while outs and not outs[-1]:
        outs.pop()
    if not all(outs):
        raise Unsupported("LayerNormalization's InvStdDev output without its Mean output")
    _require_float(node, *node.inputs, *node.outputs[1:len(outs)])
    x = node.inputs[0].name
    rank = len(low.shape(x))
    axis = _axis(int(node.attr("axis", -1)), rank)
    inner = int(np.prod(low.shape(x)[axis:]))
    for t in node.inputs[1:]:
        if t is not None and int(np.prod(low.shape(t.name))) != inner:
            raise Unsupported("LayerNormalization's scale / bias broadcast")
    ins = [x] + [t.name if t is not None else None for t in node.inputs[1:3]]
    return [Kernel("LayerNormalization", ins, outs, {"axis": [axis]},
                   {"epsilon": [float(node.attr("epsilon", 1e-5))]})]


@lowering("InstanceNormalization")
def _instance_norm(node: NodeInfo, low: Lowering) -> list[Kernel]:
    _require_float(node, *node.inputs)
    return [Kernel("InstanceNormalization", [t.name for t in node.inputs],
                   [node.outputs[0].name], {}, {"epsilon": [float(node.attr("epsilon", 1e-5))]})]


@lowering(*REDUCE_OPS)
def _reduce(node: NodeInfo, low: Lowering) -> list[Kernel]:
    integers = node.op_type == "ReduceSum" and node.inputs[0].elem_type in (_T.INT32, _T.INT64)
    if not integers:
        _require_float(node, node.inputs[0])
    x, y = _io(node)
    rank = len(low.shape(x))
    axes_in = low.need_const(node, 1, "the axes") if len(node.inputs) > 1 else None
    axes = (list(axes_in.reshape(-1)) if axes_in is not None else node.attr("axes"))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [Kernel("Copy", [x], [y])]
        axes = list(range(rank))
    axes = sorted(_axis(int(a), rank) for a in axes)
    return _integer_sum(node, low, axes) if integers else [Kernel(node.op_type, [x], [y],
                                                                  {"axes": axes})]


def _integer_sum(node: NodeInfo, low: Lowering, axes: list[int]) -> list[Kernel]:
    """ReduceSum of int32 / int64 over one axis (a decoder's attention mask lengths): an
    inclusive CumSum along it, whose last element a strided Copy takes."""
    x, y = _io(node)
    if len(axes) != 1:
        raise Unsupported("ReduceSum of integers over more than one axis")
    shape, axis = low.shape(x), axes[0]
    if shape[axis] == 0:
        raise Unsupported("ReduceSum of integers over an empty axis")
    scan = f"{y}::cumsum"
    low.twins[scan] = TensorInfo(scan, node.inputs[0].elem_type, shape)
    strides = _strides(shape)
    keep = bool(node.attr("keepdims", 1))
    out_strides = [s for d, s in enumerate(strides) if keep or d != axis]
    last = (shape[axis] - 1) * strides[axis]
    return [Kernel("CumSum", [x], [scan], {"axis": [axis], "exclusive": [0], "reverse": [0]}),
            Kernel("Copy", [scan], [y], {"strides": out_strides, "offset": [last]})]


@lowering("ArgMax", "ArgMin")
def _arg(node: NodeInfo, low: Lowering) -> list[Kernel]:
    _require_float(node, node.inputs[0])
    x, y = _io(node)
    return [Kernel(node.op_type, [x], [y], {
        "axis": [_axis(int(node.attr("axis", 0)), len(low.shape(x)))],
        "select_last_index": [int(node.attr("select_last_index", 0))]})]


_SCANNED = {FLOAT, _T.INT32, _T.INT64}


@lowering("CumSum")
def _cumsum(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    elem_type = node.inputs[0].elem_type
    if elem_type not in _SCANNED:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        raise Unsupported(f"CumSum of {dtype} (only float32, int32, int64)")
    axis = low.need_const(node, 1, "CumSum's axis")
    return [Kernel("CumSum", [x], [y], {
        "axis": [_axis(int(np.asarray(axis).reshape(-1)[0]), len(low.shape(x)))],
        "exclusive": [int(node.attr("exclusive", 0))],
        "reverse": [int(node.attr("reverse", 0))]})]


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def _view(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    return [Kernel("Copy", [x], [y])]


@lowering("Transpose")
def _transpose(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    shape = low.shape(x)
    perm = node.attr("perm") or list(reversed(range(len(shape))))
    strides = _strides(shape)
    return [Kernel("Copy", [x], [y], {"strides": [strides[p] for p in perm], "offset": [0]})]


@lowering("Expand")
def _expand(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    xs, ys = low.shape(x), low.shape(y)
    strides = [0] * (len(ys) - len(xs)) + [0 if d == 1 else s
                                           for d, s in zip(xs, _strides(xs), strict=True)]
    return [Kernel("Copy", [x], [y], {"strides": strides, "offset": [0]})]


@lowering("Slice")
def _slice(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    shape = low.shape(x)
    if low.opset < 10:
        starts, axes, steps = node.attr("starts"), node.attr("axes"), None
    else:
        starts, _ends, axes, steps = (low.need_const(node, i, "Slice's bounds")
                                     for i in range(1, 5))
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [_axis(int(a), rank) for a in axes]
    steps = [1] * len(axes) if steps is None else [int(s) for s in steps]
    base = _strides(shape)
    strides, offset = list(base), 0
    for axis, start, step in zip(axes, starts, steps, strict=True):
        dim = shape[axis]
        start = int(start) + dim if int(start) < 0 else int(start)
        start = min(max(start, 0), dim - 1 if step < 0 else dim)
        offset += start * base[axis]
        strides[axis] = base[axis] * step
    return [Kernel("Copy", [x], [y], {"strides": strides, "offset": [offset]})]


@lowering("Concat")
def _concat(node: NodeInfo, low: Lowering) -> list[Kernel]:
    y = node.outputs[0].name
    axis = _axis(int(node.attr("axis")), len(low.shape(y)))
    return [Kernel("Concat", [t.name for t in node.inputs if t is not None], [y],
                   {"axis": [axis]})]


@lowering("Split")
def _split(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x = node.inputs[0].name
    axis = _axis(int(node.attr("axis", 0)), len(low.shape(x)))
    return [Kernel("Split", [x], [t.name for t in node.outputs], {"axis": [axis]})]


def _fill_value(value: np.ndarray | float | None) -> float:
    return 0.0 if value is None else float(np.asarray(value).reshape(-1)[0])


@lowering("Pad")
def _pad(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    shape = low.shape(x)
    rank = len(shape)
    if low.opset < 11:
        pads, value = node.attr("pads"), node.attr("value", 0.0)
    else:
        pads = low.need_const(node, 1, "Pad's pads")
        value = _fill_value(low.need_const(node, 2, "Pad's value"))
        axes = low.need_const(node, 3, "Pad's axes")
        if axes is not None:
            full = [0] * 2 * rank
            axes = [_axis(int(a), rank) for a in axes]
            for i, a in enumerate(axes):
                full[a], full[a + rank] = int(pads[i]), int(pads[i + len(axes)])
            pads = full
    mode = node.attr("mode", "constant")
    maps = []
    for d, size in enumerate(shape):
        begin, end = int(pads[d]), int(pads[d + rank])
        maps += [_pad_index(o - begin, size, mode) for o in range(size + begin + end)]
    return [Kernel("MapCopy", [x], [y], {"map": maps}, {"value": [float(value)]})]


def _pad_index(i: int, size: int, mode: str) -> int:
    if 0 <= i < size:
        return i
    if mode == "constant" or size == 0:
        return -1
    if mode == "edge":
        return min(max(i, 0), size - 1)
    if mode == "wrap":
        return i % size
    if size == 1:  # reflect
        return 0
    period = 2 * (size - 1)
    i %= period
    return i if i < size else period - i


@lowering("Tile")
def _tile(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    maps = [o % size for size, out in zip(low.shape(x), low.shape(y), strict=True)
            for o in range(out)]
    return [Kernel("MapCopy", [x], [y], {"map": maps})]


@lowering("Gather")
def _gather(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    axis = _axis(int(node.attr("axis", 0)), len(low.shape(x)))
    return [Kernel("Gather", [x, node.inputs[1].name], [y], {"axis": [axis]})]


@lowering("GatherElements")
def _gather_elements(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    axis = _axis(int(node.attr("axis", 0)), len(low.shape(x)))
    return [Kernel("GatherElements", [x, node.inputs[1].name], [y], {"axis": [axis]})]


@lowering("GatherND")
def _gather_nd(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    return [Kernel("GatherND", [x, node.inputs[1].name], [y],
                   {"batch_dims": [int(node.attr("batch_dims", 0))]})]


@lowering("Cast")
def _cast(node: NodeInfo, low: Lowering) -> list[Kernel]:
    x, y = _io(node)
    return [Kernel("Cast", [x], [y])]


@lowering("Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
          "Xor", "Not", "IsNaN")
def _logic(node: NodeInfo, low: Lowering) -> list[Kernel]:
    return [Kernel(node.op_type, [t.name for t in node.inputs], [node.outputs[0].name])]


_INTEGERS = frozenset({_T.INT8, _T.UINT8, _T.INT16, _T.UINT16, _T.INT32, _T.UINT32, _T.INT64,
                       _T.UINT64})


@lowering("Add", "Sub", "Mul")
def _integer_arithmetic(node: NodeInfo, low: Lowering) -> list[Kernel]:
    """Add, Sub or Mul of integers (position ids, masks), one kernel broadcasting as numpy does;
    float32 ones are elementwise programs and never come here."""
    types = {t.elem_type for t in [*node.inputs, *node.outputs] if t is not None}
    if len(types) != 1 or not types <= _INTEGERS:
        raise Unsupported(f"{node.op_type} (only float32, or integers of one type)")
    return [Kernel(node.op_type, [t.name for t in node.inputs], [node.outputs[0].name])]


@lowering("Resize", "Upsample")
def _resize(node: NodeInfo, low: Lowering) -> list[Kernel]:
    from .resize import resize_kernel

    return [resize_kernel(node, low)]


@lowering("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
          "SkipLayerNormalization", "GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized",
          "MoE", "QMoE")
def _decoder(node: NodeInfo, low: Lowering) -> list[Kernel]:
    from . import decoder

    lower_op = {"GroupQueryAttention": decoder.group_query_attention,
                "SkipLayerNormalization": decoder.skip_layer_norm,
                "MatMulNBits": decoder.matmul_nbits,
                "GatherBlockQuantized": decoder.gather_block_quantized, "MoE": decoder.moe,
                "QMoE": decoder.qmoe}
    return lower_op.get(node.op_type, decoder.rms_norm)(node, low)
