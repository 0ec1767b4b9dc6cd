"""Fusion passes: partition the graph into the groups a fusing runtime would run as one kernel.

Every node belongs to exactly one group; a node no pattern claims is a group of its own, named
by its op_type. Groups come out in execution order, ids 0..n-1.

The passes are one table, `PATTERNS`. A pattern is a tree matched backwards from the group's
last node (its *sink*) through the producers of its inputs, like tinygrad's `UPat`:

- `op("Div|Mul", a, b)`: a node of one of those ops whose first output is the tensor, whose
  first inputs match `a`, `b`; Add and Mul also match with their two inputs swapped;
- `ANY` / `CONST`: a tensor from outside the group (`CONST`: an initializer or a Constant's
  output); `Leaf("x")` binds the name, so every other `x` must be that same tensor;
- `Alt((p, q))`: `p`, or else `q`; `optional(op(...))` is that op or its first input;
- `bind("x", p)`: `p`, and every other `x` must be the same tensor.

Matching walks `mg.order` backwards once. At each unclaimed node the table's entries whose
sink op fits are tried in order (larger patterns first) and the first match that is *safe*
wins: no node of it is claimed already, and no value computed inside it is read outside it
(or is a graph output) except the sink's. That makes every group convex and every group's
externally read tensors its sink's, so ordering groups by their sink is a topological order.
Constant nodes, and integer / bool shape arithmetic computed from constants alone
(TorchScript's Expand shapes), read only by a matched group are baked into it, as a fusing
runtime would.

Masks and rotary tables: a transformer builds its attention mask (dynamo: Cast, GatherND, And,
Where; TorchScript: dozens of shape and compare ops) and its RoPE cos / sin once, and every
layer reads them. They are not in the attention or RoPE groups (one exit per group: they are
read by every layer), nor left as singletons: the tensor an `Attention` match reads as its
mask (`bind("mask")`) is built by one `Mask` group, and a `RoPE` match's cos / sin by a
`Positions` group each: the tensor's producer and, up its inputs, every unclaimed node whose
outputs only that group reads. Their names do not contain `Attention` or `RoPE`, so a reader
counting layers by name does not count them.

Quantized graphs (QDQ): a DequantizeLinear -> op -> QuantizeLinear chain is one group, as
ONNX Runtime (QLinearConv ...) and TensorRT run it. Patterns see through a QuantizeLinear ->
DequantizeLinear pair between two of their ops (Conv -> Q -> DQ -> Add matches as Conv -> Add)
and take the pair in; a DequantizeLinear of constants (int8 weights, int32 biases) is a
constant; a QuantizeLinear whose range starts at 0 (its zero point is its type's lowest value)
saturates negatives to 0 and so is the ReLU that ONNX Runtime's quantizer folded into it: it
matches as the activation ``Relu``. Each group then takes its quantization edges
(`_Matcher.quant_edges`): the DequantizeLinear nodes only it reads (weights, its activation
inputs), the QuantizeLinear its sink's output feeds alone, and after that the DequantizeLinear of
that output when several groups read it (a residual: one DequantizeLinear feeds the next block
and the Add; ORT duplicates it into both, a partition cannot, so the dequantized tensor is the
group's exit). Q and DQ nodes left over (the model's input Q, the output DQ) are groups of their
own. A dynamically quantized MatMul (DynamicQuantizeLinear, MatMulInteger, the Cast and the
scale Mul) matches where a MatMul does.

Naming: a pattern's name is shown to users with its `{slots}` filled by the match, e.g.
``"{conv}+BN+{act}"`` gives ``"Conv+BN+Relu"`` or ``"DwConv+BN+Clip"``. ``DwConv`` is a
depthwise Conv (``group`` == input channels > 1); activations are named by ONNX op
(``Clip`` is ReLU6 as torch exports it) or, when spelled in primitives, by what they compute
(``SiLU``, ``HardSwish``, ``Gelu``, ``QuickGelu``, ``SquaredRelu``). A lone depthwise
Conv stays a singleton named ``Conv``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto

from .cost.ops import FUSABLE_ACTIVATIONS
from .graph import ModelGraph
from .ir import NodeInfo, TensorInfo, dtype_bits


@dataclass(frozen=True, slots=True, init=False)
class Group:
    id: int
    pattern: str  # "Conv+BN+Relu", or the op_type of a singleton
    nodes: tuple[str, ...]  # node keys in execution order

    def __init__(self, id: int, pattern: str, nodes: tuple[str, ...]) -> None:
        # Through the slots' own setters, as `ir.TensorInfo`: one is built per group.
        _set_id(self, id)
        _set_pattern(self, pattern)
        _set_nodes(self, nodes)


_set_id, _set_pattern, _set_nodes = (getattr(Group, f).__set__ for f in ("id", "pattern",
                                                                          "nodes"))


# ---- pattern names other layers match (issue 16: constants, not string literals) --------------

ATTENTION = "Attention"
LAYER_NORM = "LayerNorm"
RMS_NORM = "RMSNorm"
ADD_LAYER_NORM = "Add+LayerNorm"  # a residual Add joined to the norm after it
ADD_RMS_NORM = "Add+RMSNorm"
ROPE = "RoPE"
SWIGLU = "SwiGLU"
SQUEEZE_EXCITE = "SqueezeExcite"
MASK = "Mask"  # the attention-mask construction, one group (module docstring)
POSITIONS = "Positions"  # the rotary cos / sin tables' construction, one group
NORMS = frozenset({LAYER_NORM, RMS_NORM, ADD_LAYER_NORM, ADD_RMS_NORM})

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
# What a pattern sees of a QuantizeLinear whose range starts at 0: a ReLU (module docstring).
SATURATING_Q = "QuantizeLinear(>=0)"


# ---- the pattern language ---------------------------------------------------------------------

Fill = tuple[str, str | Callable[[NodeInfo], str]]  # (slot, value or value of the matched node)


@dataclass(frozen=True, eq=False)
class Leaf:
    """A tensor read from outside the group; `const`: an initializer or a Constant's output."""

    name: str | None = None
    const: bool = False
    first: None = field(default=None, init=False)  # matches whatever produced the tensor


@dataclass(frozen=True, eq=False)
class Op:
    """A node of one of `ops` producing the tensor (as its first output); `srcs` match its
    first inputs in order (either order for a commutative binary op)."""

    ops: frozenset[str]
    srcs: tuple[Pat, ...] = ()
    fills: Fill | None = None
    where: Callable[[NodeInfo], bool] | None = None
    name: str | None = None

    # Positions of `srcs` that constrain anything (not a bare ANY), computed once.
    checked: tuple[int, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "checked", tuple(i for i, s in enumerate(self.srcs)
                                                  if s is not ANY))

    @property
    def first(self) -> frozenset[str]:
        return self.ops


@dataclass(frozen=True, eq=False)
class Alt:
    """The first of `alts` that leads to a safe match of the whole pattern."""

    alts: tuple[Pat, ...]
    name: str | None = None
    # Precomputed dispatch: the producer's op_type -> the alternatives that may match it, in
    # order; `first` is None when some alternative may match any tensor.
    first: frozenset[str] | None = field(default=None, init=False)
    by_op: dict[str | None, tuple[Pat, ...]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        firsts = [a.first for a in self.alts]
        ops = frozenset().union(*(f for f in firsts if f is not None))
        object.__setattr__(self, "first", None if None in firsts else ops)
        for key in (*ops, None):
            self.by_op[key] = tuple(a for a, f in zip(self.alts, firsts, strict=True)
                                    if f is None or key in f)


Pat = Leaf | Op | Alt
ANY = Leaf()
CONST = Leaf(const=True)
_COMMUTATIVE = frozenset({"Add", "Mul"})
_ABSENT = "<absent>"  # in a sink signature: an omitted optional input


def op(ops: str, *srcs: Pat, fills: Fill | None = None,
       where: Callable[[NodeInfo], bool] | None = None) -> Op:
    return Op(frozenset(ops.split("|")), srcs, fills, where)


def optional(wrapper: Op) -> Alt:
    """`wrapper` applied to its first input, or that input alone."""
    return Alt((wrapper, wrapper.srcs[0]))


def bind(name: str, pat: Pat) -> Pat:
    return dataclasses.replace(pat, name=name)


@dataclass(frozen=True)
class Pattern:
    """One entry of the table: the name users see, what it matches, who spells it so."""

    name: str
    drawing: str
    exporter: str
    tree: Pat

    @property
    def sink_ops(self) -> frozenset[str]:
        assert self.tree.first is not None, f"{self.name}: a pattern must end in an op"
        return self.tree.first


# ---- predicates and building blocks -----------------------------------------------------------

def _conv_kind(info: NodeInfo) -> str:
    """``DwConv`` when each group sees one input channel (weight ``[M, C/group, ...]``)."""
    weight = info.input(1)
    depthwise = (info.attr("group", 1) > 1 and weight is not None and weight.shape is not None
                 and len(weight.shape) > 1 and weight.shape[1] == 1)
    return "DwConv" if depthwise else "Conv"


def _has_scalar_input(info: NodeInfo) -> bool:
    """One operand holds a single element (an attention scale)."""
    return any(t is not None and t.shape is not None and all(d == 1 for d in t.shape)
               for t in info.inputs)


def _half_x_times(x: Pat, gate: Pat, label: str) -> tuple[Op, ...]:
    """``0.5 * x * gate`` in the three association orders exporters write it."""
    fills = ("act", label)
    return (op("Mul", op("Mul", x, gate), CONST, fills=fills),  # torch: (x * g) * 0.5
            op("Mul", op("Mul", x, CONST), gate, fills=fills),  # keras, ORT: (x * 0.5) * g
            op("Mul", x, op("Mul", gate, CONST), fills=fills))  # x * (g * 0.5)


def _spelled_activations(x: Pat) -> tuple[Op, ...]:
    """Activations written in primitive ops; `x` must be named (it is read twice)."""
    erf_gate = op("Add", op("Erf", op("Div|Mul", x, CONST)), CONST)  # 1 + erf(x / sqrt2)
    cube = Alt((op("Pow", x, CONST), op("Mul", x, op("Mul", x, x))))
    # sqrt(2/pi) * (x + 0.044715 x^3), or HF Bloom's sqrt(2/pi) x * (1 + 0.044715 x x)
    tanh_arg = Alt((op("Mul", op("Add", x, op("Mul", cube, CONST)), CONST),
                    op("Mul", op("Mul", x, CONST),
                       op("Add", op("Mul", op("Mul", x, CONST), x), CONST))))
    tanh_gate = op("Add", op("Tanh", tanh_arg), CONST)  # 1 + tanh(...)
    relu = bind("relu", op("Relu", x))  # relu(x)²: Persimmon's, Nemotron's relu2
    return (op("Mul", x, op("Sigmoid", x), fills=("act", "SiLU")),
            op("Pow", relu, CONST, fills=("act", "SquaredRelu")),  # dynamo: torch.square
            op("Mul", relu, Leaf("relu"), fills=("act", "SquaredRelu")),  # TorchScript
            # x * sigmoid(1.702 x): HF CLIP's and OpenAI's quick_gelu, ORT's QuickGelu
            op("Mul", x, op("Sigmoid", op("Mul", x, CONST)), fills=("act", "QuickGelu")),
            op("Mul", x, op("HardSigmoid", x), fills=("act", "HardSwish")),
            op("Div", op("Mul", x, op("Clip", op("Add", x, CONST))), CONST,
               fills=("act", "HardSwish")),  # x * relu6(x + 3) / 6
            *_half_x_times(x, erf_gate, "Gelu"),
            *_half_x_times(x, tanh_gate, "Gelu"))


def activation(x: Pat) -> Alt:
    """Any activation of `x`: one op (named by its op_type) or a spelled-out one."""
    single = tuple(op(name, x, fills=("act", name)) for name in FUSABLE_ACTIVATIONS)
    folded = op(SATURATING_Q, x, fills=("act", "Relu"))  # a ReLU a QDQ quantizer folded
    return Alt((*_spelled_activations(x), *single, folded))


def _conv_chain(bn: bool) -> Pat:
    # A dynamic Conv only with its bias Add: alone, its scale Mul would take the bias Add
    # for a residual one.
    conv = Alt((op("Conv", ANY, fills=("conv", _conv_kind)), _dynamic_conv()[0]))
    return op("BatchNormalization", conv) if bn else conv


def _dynamic_conv() -> tuple[Op, Op]:
    """quantize_dynamic's Conv: ConvInteger of the dynamically quantized input, scaled, plus
    the bias reshaped to [C, 1, 1] (none when the Conv has no bias)."""
    scaled = _dynamic_quantized("ConvInteger", fills=("conv", _conv_kind))
    return op("Add", scaled, op("Reshape", CONST)), scaled


def _conv_residual(bn: bool) -> Pat:
    return activation(bind("x", op("Add", _conv_chain(bn), ANY)))


def _dynamic_quantized(ops: str, fills: Fill | None = None) -> Op:
    """quantize_dynamic's MatMul or Conv (`ops`: MatMulInteger, ConvInteger) of the
    dynamically quantized input (its DynamicQuantizeLinear inside when no other group reads
    it), cast to float and scaled by the product of the input's and the weight's scales."""
    quantized = Alt((op("DynamicQuantizeLinear", ANY), ANY))
    return op("Mul", op("Cast", op(ops, quantized, fills=fills)), op("Mul", ANY, ANY))


def _dynamic_matmul() -> Op:
    return _dynamic_quantized("MatMulInteger")


def _matmul_bias() -> Op:
    matmul = Alt((op("MatMul|MatMulNBits", ANY, ANY), _dynamic_matmul()))
    return op("Add", matmul, CONST)


def _layer_norm(x: Pat) -> Alt:
    """LayerNormalization of `x` (the op, or spelled out); `x` must be named (read twice)."""
    d = bind("d", op("Sub", x, op("ReduceMean", x)))
    var = op("ReduceMean", Alt((op("Pow", d, CONST), op("Mul", d, d))))
    std = op("Sqrt", op("Add", var, CONST))
    normed = Alt((op("Div", d, std), op("Mul", d, op("Reciprocal", std))))
    return Alt((op("LayerNormalization", x), op("SkipLayerNormalization"),  # ORT's, with Add
                optional(op("Add", optional(op("Mul", normed, CONST)), CONST))))


def _rms_norm(x: Pat) -> Alt:
    """RMSNormalization of `x` (ONNX's op, ORT's SimplifiedLayerNormalization, or spelled out
    as x / sqrt(mean(x²) + eps) · γ); `x` must be named. HF Llama's TorchScript export casts
    x to float32 and the normalized value back (`Cast`s of the same type in an fp32 export);
    the reciprocal is written Reciprocal (dynamo's rsqrt) or 1 / sqrt (TorchScript's)."""
    mean_square = op("ReduceMean", Alt((op("Pow", x, CONST), op("Mul", x, x))))
    std = op("Sqrt", op("Add", mean_square, CONST))
    normed = Alt((op("Mul", x, op("Reciprocal", std)), op("Mul", x, op("Div", CONST, std)),
                  op("Div", x, std)))
    # γ is ANY: TorchScript shares one initializer between norms through Identity nodes.
    return Alt((op("RMSNormalization|SimplifiedLayerNormalization", x),
                op("SkipSimplifiedLayerNormalization"),  # ORT's; a residual Add inside
                op("Mul", optional(op("Cast", normed)), ANY)))


def _maybe_cast(x: str) -> Pat:
    """The tensor named `x`, or the Cast that made it (taken into the group)."""
    return bind(x, Alt((op("Cast", ANY), ANY)))


def _no_const_input(info: NodeInfo) -> bool:
    return not info.const_inputs


def _same_shape_operands(info: NodeInfo) -> bool:
    a, b = info.input(0), info.input(1)
    return a is not None and b is not None and a.shape is not None and a.shape == b.shape


def _residual(x: str) -> Pat:
    """`x` named as a residual sum (an Add of two computed tensors, not a bias), maybe cast."""
    add = op("Add", ANY, ANY, where=_no_const_input)
    return bind(x, Alt((op("Cast", add), add)))


def _kv_heads(x: Pat) -> Alt:
    """GQA's K/V head expansion (HF `repeat_kv`: x[:, :, None].expand(...).reshape(...)), or
    `x` itself."""
    return Alt((op("Reshape", op("Expand", op("Unsqueeze", ANY))), x))


def _attention() -> Op:
    scaled = {"where": _has_scalar_input}
    q = optional(op("Mul", ANY, ANY, **scaled))
    kv = _kv_heads(ANY)
    # kᵀ: a Transpose, or (dynamo's decomposed SDPA) a Transpose in a 3-D view of k, where
    # the view may be GQA's own Reshape of the expanded heads.
    view = op("Reshape", Alt((op("Expand", op("Unsqueeze", ANY)), kv)))
    kt = Alt((op("Transpose", kv), op("Reshape", op("Transpose", view)), kv))
    k = Alt((op("Mul|Div", kt, ANY, **scaled), kt))  # Div: DeBERTa's kᵀ / sqrt(d)
    scores = optional(op("Div|Mul", op("MatMul", q, k), ANY, **scaled))
    # The mask: a tensor from outside (its construction is the MASK group), or a per-layer
    # Where(bool mask, 0, -inf) of it (TorchScript).
    mask = Alt((op("Where", bind("mask", ANY), CONST, CONST), bind("mask", ANY)))
    # HF Bloom adds ALiBi to the scores in their 3-D view (baddbmm), the mask in 4-D; Gemma 2
    # soft-caps them, c·tanh(scores / c).
    alibi = op("Reshape", op("Add", scores, ANY), ANY)
    capped = op("Mul", op("Tanh", op("Div", scores, ANY, **scaled)), ANY, **scaled)
    # MPNet adds its relative position bias, then the mask.
    positioned = op("Add", scores, ANY)
    biased = optional(op("Add", Alt((capped, alibi, positioned, scores)), mask))
    # Swin's shifted windows add their mask in a 5-D view of the scores.
    swin = op("Reshape", op("Add", op("Reshape", biased, ANY), ANY), ANY)
    # HF DeBERTa: masked_fill(~mask, min) of the scores plus the disentangled relative-position
    # bias (computed per layer outside the group), in a 4-D view of the 3-D scores.
    # ORT's transformer optimizer drops the ~ and swaps the branches: Where(mask, scores, min).
    viewed = optional(op("Reshape", op("Add", scores, ANY), ANY))
    filled = Alt((op("Where", bind("mask", ANY), CONST, viewed),
                  op("Where", bind("mask", ANY), viewed, CONST)))
    probs = bind("p", op("Softmax", Alt((swin, filled, biased))))
    # torch's SDPA zeroes the rows a mask left all -inf: Where(IsNaN(p), 0, p).
    guarded = Alt((op("Where", op("IsNaN", probs), CONST, probs), probs))
    # DeBERTa multiplies the probabilities in a 3-D view (torch.bmm).
    return op("MatMul", optional(op("Reshape", guarded, ANY)), _kv_heads(ANY))


def _einsum_attention() -> Op:
    """`_attention` written with Einsum, as HF Funnel does (Q·Kᵀ 'bind,bjnd->bnij', P·V
    'bnij,bjnd->bind'): a scale, up to two terms added to the scores (Funnel's relative
    positional and token-type terms, each computed outside the group) and the mask
    subtracted (scores - 1e30·(1 - mask)), in TorchScript's export between two Casts."""
    scaled = {"where": _has_scalar_input}
    scores = optional(op("Mul|Div", op("Einsum", ANY, ANY), ANY, **scaled))
    positioned = optional(op("Add", optional(op("Add", scores, ANY)), ANY))
    cast = Alt((op("Cast", positioned), positioned))  # TorchScript casts around the softmax
    probs = bind("p", op("Softmax", optional(op("Sub", cast, bind("mask", ANY)))))
    return op("Einsum", Alt((op("Cast", probs), probs)), ANY)


def _qlinear(ops: str, a: Pat, b: Pat) -> Op:
    """An ONNX Runtime QLinear op (com.microsoft) of `a` and `b`: it reads (tensor, scale,
    zero point) triples, so its two tensors are inputs 0 and 3."""
    return op(ops, a, ANY, ANY, b)


def _qlinear_attention() -> Op:
    """`_attention` as quantize_static's QOperator format writes it (QLinearMatMul, QLinearMul
    by a quantized constant scale, QLinearAdd of the mask, QLinearSoftmax); torch's SDPA guard
    runs on the dequantized probabilities, quantized again for P·V."""
    view = op("Reshape", op("Transpose", op("Reshape", ANY)))  # dynamo's kᵀ in a 3-D view
    kt = Alt((op("Transpose", ANY), view, ANY))
    q = Alt((_qlinear("QLinearMul", ANY, CONST), ANY))
    k = Alt((_qlinear("QLinearMul", kt, CONST), kt))
    scores = _qlinear("QLinearMatMul", q, k)
    masked = Alt((_qlinear("QLinearAdd", scores, bind("mask", ANY)), scores))
    probs = bind("p", op("QLinearSoftmax", masked))
    real = bind("real", op(DEQUANTIZE, probs))
    guarded = op(f"{QUANTIZE}|{SATURATING_Q}", op("Where", op("IsNaN", real), CONST, real))
    return _qlinear("QLinearMatMul", Alt((guarded, probs)), ANY)


def _rope() -> Alt:
    x = Leaf("x")
    half = op("Concat", op("Neg", op("Slice", x)), op("Slice", x))  # rotate_half(x)
    # HF GPT-J's rotate_every_two(x): stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2);
    # TorchScript computes the flattened shape from the stack's: Concat(Shape(s)[:-2], [-1])
    stacked = bind("s", op("Concat", op("Unsqueeze", op("Neg", op("Slice", x))),
                           op("Unsqueeze", op("Slice", x))))
    flat = Alt((op("Concat", op("Slice", op("Shape", Leaf("s"))), CONST), ANY))
    pairs = op("Reshape", stacked, flat)
    rotated = Alt((half, pairs))
    return Alt((op("Add", op("Mul", x, bind("cos", ANY)), op("Mul", rotated, bind("sin", ANY))),
                op("RotaryEmbedding")))  # com.microsoft


def _swiglu() -> Alt:
    gate = Leaf("g")
    silu = Alt((op("Mul", gate, op("Sigmoid", gate)), op("Swish", ANY)))
    same = {"where": _same_shape_operands}  # up has gate's shape: not a scale
    return Alt((op("Mul", silu, ANY, **same),  # silu(gate) * up
                # gate * (σ(gate) * up)
                op("Mul", gate, op("Mul", op("Sigmoid", gate), ANY, **same))))


def _squeeze_excite() -> Op:
    x = Leaf("x")
    hidden = bind("h", op("Conv", op("GlobalAveragePool|ReduceMean", x)))
    return op("Mul", op("Sigmoid|HardSigmoid", op("Conv", activation(hidden))), x)


# ---- the table --------------------------------------------------------------------------------

PATTERNS: tuple[Pattern, ...] = (
    Pattern(ATTENTION, """
        q ─[Mul s]─────────────┐
        k ─[Transpose]─[Mul s]─ MatMul ─[Div|Mul s]─[Add mask]─┐
            ┌─[Reshape ─ Add mask ─ Reshape]───────────────────┘
            └─ Softmax ─┐
                  v ─ MatMul ─►
        ([...]: optional; s: a one-element scale)""",
            "torch TorchScript: q @ k.transpose(-2, -1) / sqrt(d); F.scaled_dot_product_"
            "attention and nn.MultiheadAttention scale q and k; torchvision Swin adds a "
            "relative position bias and, in shifted windows, a mask in a 5-D view; HF "
            "eager attention (TorchScript) and SDPA decomposed by dynamo, which writes kᵀ "
            "in a 3-D view and guards softmax with Where(IsNaN(p), 0, p); GQA (Llama) "
            "expands K and V heads with Unsqueeze/Expand/Reshape inside the group; HF "
            "DeBERTa divides kᵀ, adds its relative-position bias and masks with "
            "Where(~mask, min, scores) in a 4-D view of 3-D scores and probabilities; HF "
            "Bloom adds ALiBi in a 3-D view (baddbmm) before the mask; HF Gemma 2 soft-caps "
            "the scores, c·tanh(s / c)",
            _attention()),
    Pattern(ATTENTION, """
        q ─ Einsum ─[Mul|Div s]─[Add]─[Add]─[Sub mask]─ Softmax ─┐
        k ─┘                                       v ─ Einsum ─►""",
            "HF Funnel (dynamo and TorchScript): attention as Einsums, its relative "
            "positional and token-type terms added to the scores", _einsum_attention()),
    Pattern(ATTENTION, """
        q ─[QLinearMul s]────┐
        k ─[QLinearMul s]─ QLinearMatMul ─[QLinearAdd mask]─ QLinearSoftmax ─┐
                  ┌─[DequantizeLinear ─ Where(IsNaN) ─ QuantizeLinear]─────┘
              v ─ QLinearMatMul ─►
        (each QLinear op reads (tensor, scale, zero point) triples)""",
            "ONNX Runtime quantize_static, QOperator format, of the torch exports above "
            "(HF BERT, ViT: dynamo and TorchScript)", _qlinear_attention()),
    Pattern(ADD_LAYER_NORM, """
        a ─┐
        b ─ Add ─ LayerNorm ─►     (LayerNorm: the op or spelled out as in LayerNorm)
        (the sum must be read by the norm only: post-norm BERT, a pre-norm model's final
        norm; a pre-norm block's sum also feeds the next residual and stays an Add)""",
            "torch (HF BERT post-norm, GPT-2 / ViT final norm); ORT fuses it as "
            "SkipLayerNormalization", _layer_norm(_residual("x"))),
    Pattern(ADD_RMS_NORM, """
        a ─┐
        b ─ Add ─[Cast]─ RMSNorm ─►     (as in RMSNorm, the sum read by the norm only)""",
            "torch (HF Llama's final norm); ORT: SkipSimplifiedLayerNormalization",
            _rms_norm(_residual("x"))),
    Pattern(LAYER_NORM, """
        LayerNormalization ─►    (opset >= 17)
        x ─┬─ ReduceMean ─┐
           └──────────── Sub ─┬─ Pow 2 ─ ReduceMean ─ Add eps ─ Sqrt ─┐
                              └────────────────────────────────── Div ─[Mul γ]─[Add β]─►
        (Pow 2 may be Mul d,d; Div may be Mul by Reciprocal)""",
            "torch (LayerNormalization at opset >= 17; TorchScript at <= 16), TF/keras",
            _layer_norm(Leaf("x"))),
    Pattern(RMS_NORM, """
        RMSNormalization | SimplifiedLayerNormalization ─►      (ONNX opset 23, ORT)
        x ─┬─ Pow 2 ─ ReduceMean ─ Add eps ─ Sqrt ─ Reciprocal ─┐
           └──────────────────────────────────────────────── Mul ─[Cast]─ Mul γ ─►
        (Reciprocal may be Div 1/·, or the Mul a Div by the Sqrt; x may be a Cast)""",
            "torch dynamo and TorchScript (HF Llama/Mistral/Qwen RMSNorm)",
            _rms_norm(_maybe_cast("x"))),
    Pattern(ROPE, """
        x ─┬──────────────────────────────── Mul cos ─┐
           ├─ Slice ─┐                                 Add ─►
           └─ Slice ─ Neg ─ Concat ─────── Mul sin ─┘
        (rotate_half: the second half negated, then the first half; or rotate_every_two:
        Slice 1::2 ─ Neg ─ Unsqueeze, Slice ::2 ─ Unsqueeze, Concat ─ Reshape)""",
            "torch dynamo and TorchScript (HF apply_rotary_pos_emb; GPT-J's interleaved "
            "pairs)", _rope()),
    Pattern(SQUEEZE_EXCITE, """
        x ─┬─ GlobalAveragePool|ReduceMean ─ Conv ─ act ─ Conv ─ Sigmoid|HardSigmoid ─┐
           └──────────────────────────────────────────────────────────────────── Mul ─►""",
            "torchvision SqueezeExcitation (MobileNetV3, EfficientNet, RegNet)",
            _squeeze_excite()),
    Pattern("{conv}+BN+Add+{act}", """
        Conv ─ BatchNormalization ─ Add ─ act ─►      (ResNet block end, BatchNorm kept)
                           residual ─┘""",
            "torch TorchScript with --keep-batchnorm", _conv_residual(bn=True)),
    Pattern("{conv}+Add+{act}", """
        Conv ─ Add ─ act ─►      (ResNet block end, BatchNorm folded)
        residual ─┘
        DQ ─ Conv ─ Q ─ DQ ─ Add ─ Q(>=0) ─►      (quantize_static QDQ: ReLU folded in the Q)
                 DQ residual ─┘""",
            "torch TorchScript (BatchNorm folded); onnxruntime quantize_static (QDQ)",
            _conv_residual(bn=False)),
    Pattern("{conv}+BN+{act}", "Conv ─ BatchNormalization ─ act ─►",
            "torch TorchScript with --keep-batchnorm",
            activation(bind("x", _conv_chain(bn=True)))),
    Pattern("{conv}+{act}", """
        Conv ─ act ─►        act: one op, or spelled out as in the last entry, e.g. SiLU:
        Conv ─┬─ Sigmoid ─┐
              └──────── Mul ─►
        DQ ─ Conv ─ Q(>=0) ─►   (QDQ: a Q whose range starts at 0 is the ReLU)""",
            "torch TorchScript (BatchNorm folded); onnxruntime quantize_static (QDQ)",
            activation(bind("x", _conv_chain(bn=False)))),
    Pattern("{conv}", """
        x ─ DynamicQuantizeLinear ─┬─ ConvInteger W ─ Cast ─┐
                                   └─ Mul w_scale ──────── Mul ─ Add (Reshape bias) ─►
        (a Conv without activation; with one: {conv}+{act}, as a Conv)""",
            "onnxruntime.quantization.quantize_dynamic", Alt(_dynamic_conv())),
    Pattern("{conv}+BN", "Conv ─ BatchNormalization ─►   (ResNet downsample)",
            "torch TorchScript with --keep-batchnorm", _conv_chain(bn=True)),
    Pattern(SWIGLU, """
        gate ─┬─ Sigmoid ─┐
              └──────── Mul ─┐       (or Swish(gate); or gate · (σ(gate) · up))
                     up ─── Mul ─►""",
            "torch dynamo and TorchScript (HF LlamaMLP: act_fn(gate_proj(x)) * up_proj(x))",
            _swiglu()),
    Pattern("Gemm+{act}", "Gemm ─ act ─►", "torch TorchScript (nn.Linear on 2-D input)",
            activation(bind("x", op("Gemm")))),
    Pattern("MatMul+Add+{act}", "MatMul ─ Add bias ─ act ─►   (act: Gelu op or spelled out)",
            "torch TorchScript (nn.Linear on 3-D input, transformer MLP)",
            activation(bind("x", _matmul_bias()))),
    Pattern("MatMul+Add", "MatMul ─ Add bias ─►",
            "torch TorchScript (nn.Linear on 3-D input)", _matmul_bias()),
    Pattern("MatMul", """
        x ─ DynamicQuantizeLinear ─┬─ MatMulInteger W ─ Cast ─┐
                                   └─ Mul w_scale ────────── Mul ─►
        (DynamicQuantizeLinear inside unless other MatMuls read it; with a bias: MatMul+Add)""",
            "onnxruntime.quantization.quantize_dynamic", _dynamic_matmul()),
    Pattern("{act}", """
        x ─┬─ Sigmoid ─┐                    SiLU (HardSigmoid in place of Sigmoid: HardSwish)
           └──────── Mul ─►
        x ─┬─ Mul 1.702 ─ Sigmoid ─┐        QuickGelu (HF CLIP's quick_gelu)
           └──────────────────── Mul ─►
        x ─ Relu ─ Pow 2 ─►  (or Mul by itself)  SquaredRelu (HF Persimmon, Nemotron)
        x ─┬─ Add 3 ─ Clip 0,6 ─┐           HardSwish
           └───────────────── Mul ─ Div 6 ─►
        x ─┬─ Div √2 ─ Erf ─ Add 1 ─┐       Gelu; the 0.5 may also scale x or the gate first
           └───────────────────── Mul ─ Mul 0.5 ─►
        x ─┬─ Pow 3 ─ Mul 0.0447 ─┐         Gelu, tanh approximation
           ├──────────────────── Add ─ Mul √(2/π) ─ Tanh ─ Add 1 ─┐
           └───────────────────────────────────────────────────── Mul ─ Mul 0.5 ─►
        (or HF Bloom's tanh argument: Mul √(2/π) x by Add 1 (Mul 0.0447 x · x))""",
            "torch TorchScript (nn.SiLU, nn.GELU at opset < 20, approximate='tanh'), "
            "keras/HF GELU, HF CLIP quick_gelu, HF Bloom, HF relu2",
            Alt(_spelled_activations(Leaf("x")))),
)


# ---- matching ---------------------------------------------------------------------------------

class _Matcher:
    """One pass over a ModelGraph: plain dicts only, no networkx in the loop."""

    def __init__(self, mg: ModelGraph, constant: Callable[[str], np.ndarray] | None) -> None:
        self.infos = mg.infos
        self.producer = mg.producer
        self.consumers = mg.consumers
        self.initializers = mg.initializers
        self.graph_outputs = frozenset(mg.graph_outputs)
        self.position = {key: i for i, key in enumerate(mg.order)}
        # A graph with no QuantizeLinear or DequantizeLinear (an fp32 model) has no saturating
        # Q, no Q -> DQ pair and no quantization edge: the passes that look for them are skipped.
        self.quantized = not {QUANTIZE, DEQUANTIZE}.isdisjoint(
            {info.op_type for info in self.infos.values()})
        # What patterns see of a node: its op_type, SATURATING_Q for a QuantizeLinear that is
        # a folded ReLU; and of a tensor, its producer's (through a Q -> DQ pair: `through`),
        # or, through a saturating Q (`relu_through`), also that Q.
        self.saturating = (_saturating_quantizers(mg, constant) if self.quantized
                           else frozenset())
        self.op_of = {t: self.infos[k].op_type for t, k in mg.producer.items()}
        for key in self.saturating:
            for t in self.infos[key].outputs:
                self.op_of[t.name] = SATURATING_Q
        self.through = _qdq_pairs(mg) if self.quantized else {}
        self.relu_through = {t for t, (_, _, (_, q)) in self.through.items()
                             if q in self.saturating}
        for t, (source, _, _) in self.through.items():
            self.op_of[t] = self.op_of.get(source)  # type: ignore[assignment]
        self.claimed: set[str] = set()
        self.group_of: dict[str, int] = {}  # claimed node -> the index of its group in `fuse`
        self.by_sink: dict[str, list[tuple[int, Pattern]]] = {}
        for index, pattern in enumerate(PATTERNS):
            for sink_op in pattern.sink_ops:
                self.by_sink.setdefault(sink_op, []).append((index, pattern))
        # Sink signature -> indexes of the patterns refused at the sink itself: the same
        # signature is refused again (most attempts: a model repeats its blocks).
        self.refused: dict[tuple, set[int]] = {}
        # State of the attempt in progress.
        self.bound: dict[str, str] = {}
        self.members: list[tuple[str, Op]] = []
        self.member_set: set[str] = set()
        self.progressed = False  # did some op of the pattern fit by its inputs' op_types?
        self.static = _static_nodes(mg)
        # Tensors a matched group reads as its mask or rotary table -> the name of the group
        # that builds them (`region`), found when the backward walk reaches their producer.
        self.seeds: dict[str, str] = {}

    def first_match(self, key: str) -> tuple[str, list[str]] | None:
        """The name and nodes of the first safe match with `key` as sink, if any."""
        info = self.infos[key]
        patterns = self.by_sink.get(self.kind(key))
        if not info.outputs or patterns is None:
            return None
        # A failed attempt leaves the state as it found it: cleared once, not per pattern.
        self.bound.clear()
        self.members.clear()
        self.member_set.clear()
        tensor, contained = info.outputs[0].name, self._contained
        refused = self.refused.setdefault(self._signature(info), set())
        for index, pattern in patterns:
            if index in refused:
                continue
            self.progressed = False
            if self._match(pattern.tree, tensor, contained):
                for slot, region in _SEEDS.items():
                    if slot in self.bound:
                        self.seeds.setdefault(self.bound[slot], region)
                return self._name(pattern), [*self.member_set,
                                             *self._baked_static(self.member_set, self.member_set)]
            if not self.progressed:
                refused.add(index)
        return None

    def _signature(self, info: NodeInfo) -> tuple:
        """What decides whether a pattern's first op fits `info` as its sink (`_match_op`
        before `where`): the op_type, each input's producer op_type (`_ABSENT` for an omitted
        input), and whether the first two inputs are the same tensor."""
        inputs, op_of, relu = info.inputs, self.op_of, self.relu_through
        return (self.kind(info.name),
                tuple([_ABSENT if t is None else (op_of.get(t.name), t.name in relu)
                       if relu else op_of.get(t.name) for t in inputs]),
                len(inputs) > 1 and inputs[0] == inputs[1])

    # Matching is backtracking in continuation-passing style: `_match(pat, tensor, then)`
    # extends the state by one way of matching `pat` and calls `then()` for the rest of the
    # pattern, trying the next way when that fails. True: all matched, the state holds the
    # match. False: the state is as it was.
    def _match(self, pat: Pat, tensor: str, then: Callable[[], bool]) -> bool:
        name = pat.name
        if name is not None:
            seen = self.bound.get(name)
            if seen is not None:
                return seen == tensor and then()
            self.bound[name] = tensor
        kind = pat.__class__
        if kind is Op:
            ok = self._match_op(pat, tensor, then)  # type: ignore[arg-type]
        elif kind is Alt:
            ok = False
            for alt in self._alternatives(pat, tensor):  # type: ignore[arg-type]
                if self._match(alt, tensor, then):
                    ok = True
                    break
        else:
            ok = (not pat.const or self._is_const(tensor)) and then()  # type: ignore[union-attr]
        if not ok and name is not None:
            del self.bound[name]
        return ok

    def _alternatives(self, pat: Alt, tensor: str) -> tuple[Pat, ...]:
        """The alternatives of `pat` that may match at `tensor`, by what made it."""
        alts = pat.by_op.get(self.op_of.get(tensor), pat.by_op[None])
        if tensor in self.relu_through and SATURATING_Q in pat.by_op:
            relu = pat.by_op[SATURATING_Q]
            return tuple(a for a in pat.alts if a in alts or a in relu)
        return alts

    def kind(self, key: str) -> str:
        return SATURATING_Q if key in self.saturating else self.infos[key].op_type

    def _match_op(self, pat: Op, tensor: str, then: Callable[[], bool]) -> bool:
        pair = self.through.get(tensor)
        if pair is not None:
            return self._match_through(pat, pair, then)
        key = self.producer.get(tensor)
        if key is None or key in self.claimed or key in self.member_set:
            return False
        info = self.infos[key]
        inputs = info.inputs
        n = len(pat.srcs)
        if self.kind(key) not in pat.ops or info.outputs[0].name != tensor or len(inputs) < n:
            return False
        # The orders of the inputs whose producers' op_types fit, found before the state
        # changes: most attempts end here.
        orders = [inputs] if self._srcs_fit(pat, inputs) else []
        if n == 2 and info.op_type in _COMMUTATIVE and inputs[0] != inputs[1]:
            swapped = inputs[1::-1]
            if self._srcs_fit(pat, swapped):
                orders.append(swapped)
        if not orders:
            return False
        self.progressed = True  # past what the signature decides: `where` reads shapes
        if pat.where is not None and not pat.where(info):
            return False
        self.members.append((key, pat))
        self.member_set.add(key)
        for order in orders:
            if self._match_from(pat, order, 0, then):
                return True
        self.members.pop()
        self.member_set.discard(key)
        return False

    def _match_through(self, pat: Op, pair: tuple[str, str, tuple[str, str]],
                       then: Callable[[], bool]) -> bool:
        """`pat` at the tensor a Q -> DQ pair quantized, the pair taken into the match; or,
        when `pat` is a saturating Q (a ReLU) and the pair's Q is one, at that Q."""
        source, quantized, (dq, q) = pair
        keys, at = ((dq,), quantized) if SATURATING_Q in pat.ops and q in self.saturating else (
            (dq, q), source)
        if any(k in self.claimed or k in self.member_set for k in keys):
            return False
        for k in keys:
            self.members.append((k, _THROUGH))
            self.member_set.add(k)
        if self._match_op(pat, at, then):
            return True
        for k in keys:
            self.members.pop()
            self.member_set.discard(k)
        return False

    def _srcs_fit(self, pat: Op, inputs: tuple[TensorInfo | None, ...]) -> bool:
        """Whether each input that `pat.srcs` constrains is there and made by an op it allows."""
        op_of = self.op_of
        for i in pat.checked:
            t, first = inputs[i], pat.srcs[i].first
            if t is None or (first is not None and op_of.get(t.name) not in first and not (
                    SATURATING_Q in first and t.name in self.relu_through)):
                return False
        return True

    def _match_from(self, pat: Op, inputs: tuple[TensorInfo | None, ...], j: int,
                    then: Callable[[], bool]) -> bool:
        if j == len(pat.checked):
            return then()
        i = pat.checked[j]
        return self._match(pat.srcs[i], inputs[i].name,  # type: ignore[union-attr]
                           lambda: self._match_from(pat, inputs, j + 1, then))

    def _is_const(self, tensor: str) -> bool:
        producer_op = self.op_of.get(tensor)
        # A quantized weight or bias; TorchScript's Identity alias of an initializer it
        # shares between parameters of equal values (a fresh model's zero biases), which
        # quantize_static then quantizes as if it were an activation.
        if producer_op in (DEQUANTIZE, QUANTIZE, "Identity"):
            return all(t is None or self._is_const(t.name)
                       for t in self.infos[self.producer[tensor]].inputs)
        return tensor in self.initializers if producer_op is None else producer_op == "Constant"

    def _contained(self) -> bool:
        """No value computed before the sink (members[0]) is read outside the match."""
        member_set = self.member_set
        return all(self._read_only_by(key, member_set) for key, _ in self.members[1:])

    def _baked_static(self, members: set[str], start: Iterable[str]) -> set[str]:
        """Unclaimed static nodes (`_static_nodes`: Constant, TorchScript's shape arithmetic)
        whose outputs only `members` read, found up the inputs of the nodes `start`, and so on
        up their inputs: a fusing runtime folds them into the kernel."""
        return self._upstream(members, start, self.static)

    def _upstream(self, members: set[str], start: Iterable[str],
                  allowed: set[str] | None = None) -> set[str]:
        """Unclaimed nodes (of `allowed`, when given) up the inputs of the nodes `start`, and so
        on up their inputs, whose outputs only `members` and the nodes found read."""
        found = set(members)  # the readers so far; `members` left out of the answer
        frontier = list(start)
        while frontier:
            for t in self.infos[frontier.pop()].inputs:
                src = self.producer.get(t.name) if t is not None else None
                if (src is not None and (allowed is None or src in allowed) and src not in found
                        and src not in self.claimed and self._read_only_by(src, found)):
                    found.add(src)
                    frontier.append(src)
        return found.difference(members)

    def _read_only_by(self, key: str, readers: set[str]) -> bool:
        return all(t.name not in self.graph_outputs and all(
            user in readers for user in self.consumers.get(t.name, ()))
            for t in self.infos[key].outputs)

    def region(self, sink: str) -> list[str]:
        """`sink` and the unclaimed nodes up its inputs whose outputs only these nodes read:
        the subgraph that builds `sink`'s tensor alone, stopped at anything read elsewhere
        (a graph input, the shared token embedding). One exit, as every group."""
        return [sink, *self._upstream({sink}, (sink,))]

    def quant_edges(self, keys: list[str]) -> list[str]:
        """`keys` with their quantization edges (module docstring): the Q that alone reads the
        sink's output, then the DQ of that Q's output when several groups read it; and every
        DQ whose outputs only the group reads."""
        if not self.quantized:
            return keys
        members = set(keys)
        sink = max(keys, key=self.position.__getitem__)
        if self.infos[sink].op_type != QUANTIZE:
            quantize = self._sole_reader(sink, QUANTIZE)
            if quantize is not None:
                members.add(quantize)
                sink = quantize
        if self.infos[sink].op_type == QUANTIZE:
            dq = self._sole_reader(sink, DEQUANTIZE)
            if dq is not None and len({self.group_of.get(user) for t in self.infos[dq].outputs
                                       for user in self.consumers.get(t.name, ())}) > 1:
                members.add(dq)
        for key in list(members):
            for t in self.infos[key].inputs:
                src = self.producer.get(t.name) if t is not None else None
                if (src is not None and src not in members and src not in self.claimed
                        and self.infos[src].op_type == DEQUANTIZE
                        and self._read_only_by(src, members)):
                    members.add(src)
        # The edges' own constants (a scale or zero point given by a Constant node).
        return [*members, *self._baked_static(members, members.difference(keys))]

    def _sole_reader(self, key: str, op_type: str) -> str | None:
        """The unclaimed node of `op_type` that alone reads `key`'s one output, if any."""
        outputs = self.infos[key].outputs
        if len(outputs) != 1 or outputs[0].name in self.graph_outputs:
            return None
        users = self.consumers.get(outputs[0].name, ())
        if len(users) != 1 or users[0] in self.claimed:
            return None
        return users[0] if self.infos[users[0]].op_type == op_type else None

    def _name(self, pattern: Pattern) -> str:
        slots = {}
        for key, pat in self.members:
            if pat.fills is not None:
                slot, value = pat.fills
                slots[slot] = value if isinstance(value, str) else value(self.infos[key])
        return pattern.name.format(**slots)


_THROUGH = Op(frozenset({QUANTIZE, DEQUANTIZE}))  # a member seen through: a Q -> DQ pair


def _qdq_pairs(mg: ModelGraph) -> dict[str, tuple[str, str, tuple[str, str]]]:
    """The output of each DequantizeLinear of a QuantizeLinear's output -> (the tensor that
    QuantizeLinear quantized, its quantized output, (the DQ's key, the Q's key))."""
    pairs = {}
    for key in mg.order:
        info = mg.infos[key]
        x = info.input(0)
        q = mg.producer.get(x.name) if info.op_type == DEQUANTIZE and x is not None else None
        if q is not None and mg.infos[q].op_type == QUANTIZE and mg.infos[q].inputs[0]:
            pairs[info.outputs[0].name] = (mg.infos[q].inputs[0].name, x.name, (key, q))
    return pairs


def _saturating_quantizers(mg: ModelGraph, constant: Callable[[str], np.ndarray] | None
                           ) -> frozenset[str]:
    """The QuantizeLinear nodes to an integer type whose zero point is the type's lowest value
    (uint8 0, int8 -128): y = saturate(x / s + zp) maps every x <= 0 to that value, which
    dequantizes to 0, so the node computes ReLU(x) quantized. Read from the zero point's
    initializer (`constant`); an omitted zero point is 0. Without `constant`: none."""
    found = set()
    for key in mg.order:
        info = mg.infos[key]
        y = info.outputs[0] if info.op_type == QUANTIZE and info.outputs else None
        if constant is None or y is None or y.elem_type not in _QUANTIZED_INTEGERS:
            continue
        zp = info.input(2)
        if zp is not None and zp.name not in mg.initializers:
            continue  # computed or a Constant node's: not read here
        lowest = -(2 ** (dtype_bits(y.elem_type) - 1)) if y.elem_type in _SIGNED else 0
        if bool(np.all((0 if zp is None else constant(zp.name)) == lowest)):
            found.add(key)
    return frozenset(found)


_SIGNED = frozenset({TensorProto.INT4, TensorProto.INT8, TensorProto.INT16})
_QUANTIZED_INTEGERS = _SIGNED | {TensorProto.UINT4, TensorProto.UINT8, TensorProto.UINT16}


# Leaves a pattern binds -> the group that builds that tensor (see the module docstring).
_SEEDS = {"mask": MASK, "cos": POSITIONS, "sin": POSITIONS}


# Shape arithmetic's element types: what TorchScript leaves unfolded around Reshape / Expand.
_INDEX_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL})


def _static_nodes(mg: ModelGraph) -> set[str]:
    """Constant nodes, and nodes of integer or bool outputs whose inputs are all initializers
    or outputs of static nodes (shape arithmetic), or that quantize or dequantize such inputs
    (weights; a constant scale quantized). Float values computed from weights (Swin's
    relative position bias) are left out: they are work a runtime may do per run."""
    static: set[str] = set()
    for key in mg.order:
        info = mg.infos[key]
        outputs = info.outputs
        if info.op_type == "Constant" or (
                (info.op_type in (QUANTIZE, DEQUANTIZE)
                 # the first output's type first: most nodes compute floats
                 or not outputs or (outputs[0].elem_type in _INDEX_TYPES
                                    and all(t.elem_type in _INDEX_TYPES for t in outputs)))
                and all(t is None or t.name in mg.initializers or mg.producer.get(t.name) in static
                        for t in info.inputs)):
            static.add(key)
    return static


def fuse(mg: ModelGraph, constant: Callable[[str], np.ndarray] | None = None) -> list[Group]:
    """Partition `mg` into groups in execution order (see the module docstring). `constant`:
    an initializer's value (`LoadedModel.initializer_array`), read for quantizers' zero points;
    without it no QuantizeLinear is taken for a ReLU."""
    matcher = _Matcher(mg, constant)
    position = matcher.position
    found: list[tuple[str, list[str]]] = []
    for key in reversed(mg.order):
        if key in matcher.claimed:
            continue
        info = matcher.infos[key]
        region = next((matcher.seeds[t.name] for t in info.outputs if t.name in matcher.seeds),
                      None)
        match = (region, matcher.region(key)) if region else matcher.first_match(key)
        if match is None and info.op_type in (QUANTIZE, DEQUANTIZE):
            continue  # a quantization edge of a group found later in this walk, or alone
        name, keys = match if match is not None else (info.op_type, [key])
        _claim(matcher, found, name, matcher.quant_edges(keys))
    for key in mg.order:  # Q and DQ no group took: the model's input Q, its output DQ ...
        if key not in matcher.claimed:
            _claim(matcher, found, matcher.infos[key].op_type, [key])
    ordered = [(name, sorted(keys, key=position.__getitem__) if len(keys) > 1 else keys)
               for name, keys in found]
    # A group's last node in execution order is its sink: ordering by it is topological.
    ordered.sort(key=lambda match: position[match[1][-1]])
    return [Group(i, name, tuple(keys)) for i, (name, keys) in enumerate(ordered)]


def _claim(matcher: _Matcher, found: list[tuple[str, list[str]]], name: str,
           keys: list[str]) -> None:
    matcher.claimed.update(keys)
    matcher.group_of.update(dict.fromkeys(keys, len(found)))
    found.append((name, keys))
