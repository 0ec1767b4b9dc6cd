"""The op catalogue: each pointwise op and each view, defined once.

A row says what an ONNX op is, and every layer reads it from here rather than keeping a list
of its own:

- its arithmetic, FLOPs and transcendental evaluations per output element, with the
  derivation beside it (the cost formulas: `elementwise`, `activation`);
- its cost family, what `onnxlens ops` lists it under;
- whether fusion takes it as the activation a Conv / Gemm / MatMul pattern ends in
  (`fusion.activation`);
- the native executor's instruction that computes it (a name of `backends/native/ops.def`,
  whose line holds the C++ / CUDA arithmetic) and the attributes, with their ONNX defaults,
  that become the instruction's scalar parameters p0, p1 (`backends/native/lower.py` builds
  its programs from these and checks each name and parameter count against ops.def when it is
  imported).

A row without arithmetic has a formula of its own (its count depends on attributes or inputs:
Clip's bounds, Gelu's approximation, a variadic Sum's inputs); a row without an instruction
does not run on the native executor, or runs through a lowering rule of its own (Clip's bounds
may be tensors, Gelu's code depends on `approximate`).

Views (`VIEWS`) move no data on any real backend and are charged no bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

ELEMENTWISE = "elementwise"
ACTIVATION = "activation"
SHAPE = "shape"


@dataclass(frozen=True, slots=True)
class PointwiseOp:
    family: str  # ELEMENTWISE, ACTIVATION, or SHAPE (a view the executor copies)
    # (FLOPs, transcendental) per output element; None: a formula of its own
    arithmetic: tuple[int, int] | None
    native: str | None = None  # the executor's instruction (ops.def), its operands the op's
    params: tuple[tuple[str, float], ...] = ()  # (attribute, ONNX default) -> p0, p1
    variadic: bool = False  # n inputs: n - 1 binary instructions, left to right
    activation: bool = False  # fusion takes it as a Conv / Gemm / MatMul pattern's activation


def _ew(flops: int, transcendental: int = 0, native: str | None = None) -> PointwiseOp:
    return PointwiseOp(ELEMENTWISE, (flops, transcendental), native)


def _act(flops: int, transcendental: int = 0, native: str | None = None,
         params: tuple[tuple[str, float], ...] = (), activation: bool = False) -> PointwiseOp:
    return PointwiseOp(ACTIVATION, (flops, transcendental), native, params,
                       activation=activation)


POINTWISE: dict[str, PointwiseOp] = {
    # -- arithmetic: one operation each
    "Add": _ew(1, 0, "Add"), "Sub": _ew(1, 0, "Sub"), "Mul": _ew(1, 0, "Mul"),
    "Div": _ew(1, 0, "Div"), "Neg": _ew(1, 0, "Neg"), "Abs": _ew(1, 0, "Abs"),
    "Reciprocal": _ew(1, 0, "Reciprocal"), "Floor": _ew(1, 0, "Floor"),
    "Ceil": _ew(1, 0, "Ceil"), "Round": _ew(1, 0, "Round"), "Sign": _ew(1, 0, "Sign"),
    # approximation: fmod counted as 1 FLOP (it is a divide, truncate and multiply-subtract);
    # the executor runs fmod=1 only (lower.is_elementwise)
    "Mod": _ew(1, 0, "Mod"),
    # -- comparisons, logic, selects, casts: one instruction each
    "Equal": _ew(1), "Less": _ew(1), "LessOrEqual": _ew(1), "Greater": _ew(1),
    "GreaterOrEqual": _ew(1), "Not": _ew(1), "And": _ew(1), "Or": _ew(1), "Xor": _ew(1),
    "IsNaN": _ew(1), "IsInf": _ew(1), "Where": _ew(1), "Cast": _ew(1), "CastLike": _ew(1),
    # -- special functions: one evaluation each
    "Sqrt": _ew(1, 1, "Sqrt"), "Exp": _ew(1, 1, "Exp"), "Log": _ew(1, 1, "Log"),
    "Erf": _ew(1, 1, "Erf"), "Sin": _ew(1, 1, "Sin"), "Cos": _ew(1, 1, "Cos"),
    "Tanh": PointwiseOp(ELEMENTWISE, (1, 1), "Tanh", activation=True),
    "Tan": _ew(1, 1), "Asin": _ew(1, 1), "Acos": _ew(1, 1), "Atan": _ew(1, 1),
    "Sinh": _ew(1, 1), "Cosh": _ew(1, 1), "Asinh": _ew(1, 1), "Acosh": _ew(1, 1),
    "Atanh": _ew(1, 1),
    # approximation: Pow as one special function, exp(y*log x); exporters' constant exponents
    # (x^2 in a spelled-out LayerNorm) are a multiply on most runtimes
    "Pow": _ew(1, 1, "Pow"),
    # -- variadic (formula `elementwise.variadic`): k inputs, k - 1 binary ops per element;
    # Mean then multiplies by 1/k (the executor's Affine after the sum)
    "Sum": PointwiseOp(ELEMENTWISE, None, "Add", variadic=True),
    "Max": PointwiseOp(ELEMENTWISE, None, "Max", variadic=True),
    "Min": PointwiseOp(ELEMENTWISE, None, "Min", variadic=True),
    "Mean": PointwiseOp(ELEMENTWISE, None, "Add", variadic=True),
    # one comparison per bound given (formula `elementwise.clip`); bounds may be tensors
    "Clip": PointwiseOp(ELEMENTWISE, None, activation=True),
    # -- activations
    "Relu": _act(1, 0, "Relu", activation=True),  # max(x, 0)
    # x < 0 ? alpha*x : x: compare, multiply
    "LeakyRelu": _act(2, 0, "LeakyRelu", (("alpha", 0.01),), activation=True),
    "PRelu": _act(2, 0, "PRelu"),  # x < 0 ? slope*x : x: compare, multiply
    # x > alpha ? x : 0: compare
    "ThresholdedRelu": _act(1, 0, "ThresholdedRelu", (("alpha", 1.0),)),
    "Sigmoid": _act(1, 1, "Sigmoid", activation=True),  # one sigmoid evaluation
    # max(0, min(1, alpha*x + beta)): mul, add, min, max
    "HardSigmoid": _act(4, 0, "HardSigmoid", (("alpha", 0.2), ("beta", 0.5)), activation=True),
    "HardSwish": _act(5, 0, "HardSwish", activation=True),  # x * HardSigmoid(x): 4, then mul
    "Swish": _act(3, 1),  # x * sigmoid(alpha*x): mul, sigmoid, mul
    # x < 0 ? alpha*(exp(x) - 1) : x: compare, exp, sub, mul
    "Elu": _act(4, 1, "Elu", (("alpha", 1.0),), activation=True),
    # gamma * Elu_alpha(x): compare, exp, sub, mul, mul
    "Selu": _act(5, 1, "Selu", (("alpha", 1.67326319217681884765625),
                                ("gamma", 1.05070102214813232421875)), activation=True),
    # max(0, x) + min(0, alpha*(exp(x/alpha) - 1)): div, exp, sub, mul, min, max, add
    "Celu": _act(7, 1, "Celu", (("alpha", 1.0),)),
    "Softplus": _act(3, 2, "Softplus", activation=True),  # log(exp(x) + 1): exp, add, log
    "Softsign": _act(3, 0, "Softsign"),  # x / (1 + |x|): abs, add, div
    # x * tanh(log(1 + exp(x))): exp, add, log, tanh, mul
    "Mish": _act(5, 3, "Mish", activation=True),
    # x < -lambd ? x + bias : x > lambd ? x - bias : 0: two compares, one add or subtract
    "Shrink": _act(3, 0, "Shrink", (("bias", 0.0), ("lambd", 0.5))),
    # exact or tanh form by `approximate` (formula `activation.gelu`; the executor's Gelu or
    # GeluTanh instruction)
    "Gelu": PointwiseOp(ACTIVATION, None, activation=True),
    # -- views that run as a copy where they cannot alias (the executor's Identity)
    "Identity": PointwiseOp(SHAPE, None, "Identity"),
    "Dropout": PointwiseOp(SHAPE, None, "Identity"),  # inference: the identity
}

# A new shape over the same buffer: no data moves.
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
# Ops that move no data: those, a read of a tensor's shape or size, and Dropout at inference
# (the identity; its optional mask output is all ones).
VIEWS = (*RESHAPES, "Shape", "Size", "Dropout")


def costed(family: str) -> dict[str, tuple[int, int]]:
    """The ops of `family` whose arithmetic is a fixed count per element."""
    return {op: row.arithmetic for op, row in POINTWISE.items()
            if row.family == family and row.arithmetic is not None}


# Fusion's activations: a Conv / Gemm / MatMul pattern ends in one of these.
FUSABLE_ACTIVATIONS = tuple(op for op, row in POINTWISE.items() if row.activation)
VARIADIC = tuple(op for op, row in POINTWISE.items() if row.variadic)
