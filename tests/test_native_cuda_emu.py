"""The CUDA kernels (backends/native/cuda) run by their CPU emulator, against references that do
not share their code: numpy in float64, torch for convolution and pooling, ONNX Runtime for
whole models run through the CUDA executor's host side (lowering, arena, steps, timing) with
the emulator as its device.

The emulator runs the very phase functions the __global__ kernels run, over the same grid, one
phase of every thread of a block before the next (the barrier). Every case runs twice, the
threads of each phase once in order and once reversed: a race between threads of one phase
would give two different results, so both must be bit-identical. Shared memory starts as NaN,
so a read of a word nobody wrote would show in the result.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

emu = pytest.importorskip("onnxlens.backends._native_cuda_emu")
torch = pytest.importorskip("torch")

CUDA_DIR = Path(__file__).resolve().parents[1] / "backends" / "native" / "cuda"
ROW_OPS = {name: i for i, name in enumerate(emu.ROW_OPS)}


def run_both_orders(fn: Callable[..., None], y: np.ndarray, *args, **kwargs) -> np.ndarray:
    """`y` filled by the emulated kernel; the reversed thread order must give the same bits."""
    fn(*args, y=y, **kwargs)
    again = np.full_like(y, np.nan)
    fn(*args, y=again, reverse=True, **kwargs)
    np.testing.assert_array_equal(y, again, err_msg="thread order changes the result (a race)")
    return y


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


# ---- epilogues: the ops fused after a GEMM / conv, their references in float64 ---------------

def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


# name -> (program after the main op, operands (by output shape), numpy of the main result)
def epilogues(rng: np.random.Generator, shape: tuple[int, ...], channel_dim: int
              ) -> dict[str, tuple[list, list[np.ndarray], Callable]]:
    view = [1] * len(shape)
    view[channel_dim] = shape[channel_dim]
    bias, scale, shift = (randn(rng, *view) for _ in range(3))
    residual = randn(rng, *shape)
    f64 = np.float64
    return {
        "none": ([], [], lambda v: v),
        "bias_relu": ([("Add", 0, [0, -1], []), ("Relu", 0, [0], [])], [bias],
                      lambda v: np.maximum(v + bias.astype(f64), 0)),
        "batchnorm_clip": ([("MulAdd", 0, [0, -1, -2], []), ("Clip", 0, [0], [0.0, 6.0])],
                           [scale, shift],
                           lambda v: np.clip(v * scale.astype(f64) + shift, 0, 6)),
        "bias_hardswish": ([("Add", 0, [0, -1], []), ("HardSwish", 0, [0], [])], [bias],
                           lambda v: (v + bias) * np.clip((v + bias) / 6 + 0.5, 0, 1)),
        "sigmoid": ([("Sigmoid", 0, [0], [])], [], _sigmoid),
        "silu_via_register": ([("Sigmoid", 1, [0], []), ("Mul", 0, [0, 1], [])], [],
                              lambda v: v * _sigmoid(v)),
        "silu": ([("SiLU", 0, [0], [])], [], lambda v: v * _sigmoid(v)),
        "bias_residual_relu": ([("Add", 0, [0, -1], []), ("Add", 0, [0, -2], []),
                                ("Relu", 0, [0], [])], [bias, residual],
                               lambda v: np.maximum(v + bias + residual.astype(f64), 0)),
    }


# ---- SGEMM ----------------------------------------------------------------------------------

# (batch of A, batch of B, M, N, K): tile edges (64 x 64, depth 16) on every side, thin shapes
GEMM_SHAPES = [(1, 1, 64, 64, 16), (1, 1, 70, 90, 33), (1, 1, 1, 1, 1), (1, 1, 1, 130, 7),
               (1, 1, 129, 1, 300), (3, 3, 17, 65, 48), (4, 1, 20, 31, 17), (1, 2, 65, 5, 64)]


# the tiled SGEMM, and the untiled kernel the executor picks for few rows (depthwise conv, GEMV)
KERNELS = ["tiled", "direct"]


@pytest.mark.parametrize(("za", "zb", "m", "n", "k"), GEMM_SHAPES)
@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (True, False), (False, True),
                                                  (True, True)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_sgemm_matches_numpy(za, zb, m, n, k, trans_a, trans_b, kernel):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = randn(rng, za, *((k, m) if trans_a else (m, k)))
    b = randn(rng, zb, *((n, k) if trans_b else (k, n)))
    y = np.empty((max(za, zb), m, n), np.float32)
    run_both_orders(emu.matmul, y, a, b, trans_a=trans_a, trans_b=trans_b, program=[],
                    operands=[], kernel=kernel)
    a64 = np.swapaxes(a, 1, 2) if trans_a else a
    b64 = np.swapaxes(b, 1, 2) if trans_b else b
    close(y, a64.astype(np.float64) @ b64, atol=1e-4 * math.sqrt(k))


@pytest.mark.parametrize("epilogue", ["none", "bias_relu", "batchnorm_clip", "bias_hardswish",
                                      "sigmoid", "silu_via_register", "silu",
                                      "bias_residual_relu"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_sgemm_fused_epilogue(epilogue, kernel):
    rng = np.random.default_rng(1)
    m, n, k = 67, 75, 40
    a, b = randn(rng, 1, m, k), randn(rng, 1, k, n)
    program, operands, ref = epilogues(rng, (1, m, n), channel_dim=1)[epilogue]
    y = np.empty((1, m, n), np.float32)
    run_both_orders(emu.matmul, y, a, b, trans_a=False, trans_b=False, program=program,
                    operands=operands, kernel=kernel)
    close(y, ref(a.astype(np.float64) @ b))


def test_gemm_column_bias_broadcast():
    """A Gemm's C of shape [N] is broadcast along rows (a per-column epilogue operand)."""
    rng = np.random.default_rng(2)
    a, b, c = randn(rng, 1, 33, 21), randn(rng, 1, 21, 100), randn(rng, 100)
    y = np.empty((1, 33, 100), np.float32)
    program = [("Affine", 0, [0], [0.5, 0.0]), ("Affine", 1, [-1], [2.0, 0.0]),
               ("Add", 0, [0, 1], [])]
    run_both_orders(emu.matmul, y, a, b, trans_a=False, trans_b=False, program=program,
                    operands=[c])
    close(y, 0.5 * (a.astype(np.float64) @ b) + 2.0 * c)


# ---- convolution (implicit GEMM) --------------------------------------------------------------

def conv_reference(x, w, strides, pads, dilations, group):
    """torch's conv2d in float64; asymmetric pads (top, left, bottom, right) applied first."""
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    out = torch.nn.functional.conv2d(torch.from_numpy(xp), torch.from_numpy(w.astype(np.float64)),
                                     stride=tuple(strides), dilation=tuple(dilations),
                                     groups=group)
    return out.numpy()


# (N, C, H, W, M, kh, kw, strides, pads, dilations, group)
CONV_CASES = [
    (1, 3, 9, 11, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (2, 5, 13, 10, 70, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),    # M > one tile, N over images
    (1, 4, 12, 12, 6, 3, 3, (1, 2), (0, 2, 1, 0), (2, 1), 2),     # asymmetric pads, dilation
    (2, 8, 9, 9, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),       # depthwise
    (1, 6, 7, 7, 12, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 3),
    (1, 17, 8, 9, 33, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),     # 1x1, K not a multiple of 16
    (2, 4, 1, 40, 7, 1, 5, (1, 3), (0, 2, 0, 1), (1, 2), 1),      # 1-D (H = kh = 1)
    (1, 3, 30, 30, 16, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1),   # a ResNet stem, smaller
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:7])))
@pytest.mark.parametrize("kernel", KERNELS)
def test_conv_matches_torch(case, kernel):
    n, c, h, w_, m, kh, kw, strides, pads, dilations, group = case
    rng = np.random.default_rng(sum(case[:7]))
    x, w = randn(rng, n, c, h, w_), randn(rng, m, c // group, kh, kw)
    want = conv_reference(x, w, strides, pads, dilations, group)
    y = np.empty(want.shape, np.float32)
    run_both_orders(emu.conv, y, x, w, strides=list(strides), pads=list(pads),
                    dilations=list(dilations), group=group, program=[], operands=[],
                    kernel=kernel)
    close(y, want, atol=1e-4 * math.sqrt(c // group * kh * kw))


@pytest.mark.parametrize("epilogue", ["bias_relu", "batchnorm_clip", "bias_hardswish", "silu",
                                      "bias_residual_relu"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_conv_fused_epilogue(epilogue, kernel):
    rng = np.random.default_rng(3)
    x, w = randn(rng, 2, 6, 10, 10), randn(rng, 10, 3, 3, 3)
    base = conv_reference(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 2)
    program, operands, ref = epilogues(rng, base.shape, channel_dim=1)[epilogue]
    y = np.empty(base.shape, np.float32)
    run_both_orders(emu.conv, y, x, w, strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1],
                    group=2, program=program, operands=operands, kernel=kernel)
    close(y, ref(base))


# ---- elementwise (broadcasting) ---------------------------------------------------------------

def _erf(v):
    return np.vectorize(math.erf)(v)


# op -> (params, numpy reference, input domain: "any" or "positive")
UNARY = {
    "Neg": ([], np.negative, "any"), "Abs": ([], np.abs, "any"),
    "Relu": ([], lambda v: np.maximum(v, 0), "any"), "Sigmoid": ([], _sigmoid, "any"),
    "Tanh": ([], np.tanh, "any"), "Exp": ([], np.exp, "any"), "Log": ([], np.log, "positive"),
    "Sqrt": ([], np.sqrt, "positive"), "Reciprocal": ([], lambda v: 1 / v, "positive"),
    "Erf": ([], _erf, "any"), "Floor": ([], np.floor, "any"), "Ceil": ([], np.ceil, "any"),
    "Sign": ([], np.sign, "any"), "Sin": ([], np.sin, "any"), "Cos": ([], np.cos, "any"),
    "Gelu": ([], lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))), "any"),
    "GeluTanh": ([], lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                      * (v + 0.044715 * v ** 3))), "any"),
    "SiLU": ([], lambda v: v * _sigmoid(v), "any"),
    "HardSwish": ([], lambda v: v * np.clip(v / 6 + 0.5, 0, 1), "any"),
    "Softplus": ([], lambda v: np.log1p(np.exp(v)), "any"),
    "Softsign": ([], lambda v: v / (1 + np.abs(v)), "any"),
    "Mish": ([], lambda v: v * np.tanh(np.log1p(np.exp(v))), "any"),
    "LeakyRelu": ([0.1], lambda v: np.where(v < 0, 0.1 * v, v), "any"),
    "Clip": ([-0.5, 0.7], lambda v: np.clip(v, -0.5, 0.7), "any"),
    "HardSigmoid": ([0.3, 0.4], lambda v: np.clip(0.3 * v + 0.4, 0, 1), "any"),
    "Elu": ([0.7], lambda v: np.where(v < 0, 0.7 * (np.exp(v) - 1), v), "any"),
    "Selu": ([1.6, 1.05], lambda v: 1.05 * np.where(v <= 0, 1.6 * (np.exp(v) - 1), v), "any"),
    "Celu": ([0.8], lambda v: np.maximum(v, 0) + np.minimum(0, 0.8 * (np.exp(v / 0.8) - 1)),
             "any"),
    "ThresholdedRelu": ([0.3], lambda v: np.where(v > 0.3, v, 0), "any"),
    "Shrink": ([0.2, 0.5], lambda v: np.where(v < -0.5, v + 0.2, np.where(v > 0.5, v - 0.2, 0)),
               "any"),
    "Affine": ([2.5, -1.0], lambda v: 2.5 * v - 1.0, "any"),
}

BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
    "Max": np.maximum, "Min": np.minimum, "PRelu": lambda a, b: np.where(a < 0, a * b, a),
    "Pow": lambda a, b: np.abs(a) ** b, "Mod": np.fmod,
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_elementwise(op):
    params, ref, domain = UNARY[op]
    rng = np.random.default_rng(len(op))
    x = randn(rng, 3, 5, 37) * 3
    if domain == "positive":
        x = np.abs(x) + 0.05
    y = np.empty(x.shape, np.float32)
    run_both_orders(emu.elementwise, y, program=[(op, 0, [-1], params)], operands=[x])
    close(y, ref(x.astype(np.float64)), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_elementwise_broadcasts(op):
    rng = np.random.default_rng(len(op) + 100)
    a, b = randn(rng, 2, 3, 4, 5), randn(rng, 3, 1, 5)
    if op == "Pow":  # ONNX Pow of a negative base is NaN for fractional exponents
        program = [("Abs", 1, [-1], []), ("Pow", 0, [1, -2], [])]
    else:
        program = [(op, 0, [-1, -2], [])]
        if op in ("Div", "Mod"):
            b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    y = np.empty(a.shape, np.float32)
    run_both_orders(emu.elementwise, y, program=program, operands=[a, b])
    close(y, BINARY[op](a.astype(np.float64), b.astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_elementwise_program_of_several_broadcast_operands():
    """(a + b) * c + d with four operand shapes and a scalar: one fused elementwise kernel."""
    rng = np.random.default_rng(5)
    a, b, c, d = randn(rng, 2, 1, 4, 7), randn(rng, 3, 1, 7), randn(rng, 7), randn(rng, 1)
    program = [("Add", 1, [-1, -2], []), ("MulAdd", 0, [1, -3, -4], []), ("Tanh", 0, [0], [])]
    y = np.empty((2, 3, 4, 7), np.float32)
    run_both_orders(emu.elementwise, y, program=program, operands=[a, b, c, d])
    close(y, np.tanh((a.astype(np.float64) + b) * c + d), rtol=1e-5, atol=1e-5)


def test_elementwise_over_many_blocks():
    """More elements than one block (and not a multiple of it)."""
    rng = np.random.default_rng(6)
    a = randn(rng, 1000, 77)
    y = np.empty(a.shape, np.float32)
    run_both_orders(emu.elementwise, y, program=[("Relu", 0, [-1], [])], operands=[a])
    np.testing.assert_array_equal(y, np.maximum(a, 0))


@pytest.mark.parametrize(("program", "operands", "message"), [
    ([("Add", 9, [-1, -1], []), ("Identity", 0, [9], [])], [(3,)], "register"),
    ([("Add", 0, [-1, -2], [])], [(3,), (4,)], "broadcast"),
    ([("Add", 0, [-1, -3], [])], [(3,), (3,)], "out of range"),
    ([("Relu", 1, [-1], [])], [(3,)], "register 0"),
    ([("Frobnicate", 0, [-1], [])], [(3,)], "Frobnicate"),
])
def test_malformed_programs_are_plan_errors(program, operands, message):
    arrays = [np.zeros(s, np.float32) for s in operands]
    with pytest.raises(emu.PlanError, match=message):
        emu.elementwise(np.empty(3, np.float32), program=program, operands=arrays)


# ---- pooling ------------------------------------------------------------------------------

def pool_reference(x, is_max, kernel, strides, pads, dilations, ceil, include_pad):
    """torch's max_pool2d / avg_pool2d in float64 (symmetric pads: torch's own padding)."""
    t = torch.from_numpy(x.astype(np.float64))
    pt, pl, pb, pr = pads
    assert (pt, pl) == (pb, pr)
    if is_max:
        out = torch.nn.functional.max_pool2d(t, kernel, strides, (pt, pl), dilations,
                                             ceil_mode=ceil)
    else:
        out = torch.nn.functional.avg_pool2d(t, kernel, strides, (pt, pl), ceil_mode=ceil,
                                             count_include_pad=include_pad)
    return out.numpy()


# (shape, kernel, strides, pads, dilations, ceil)
POOL_CASES = [
    ((1, 3, 9, 9), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((2, 4, 10, 11), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True),
    ((1, 2, 12, 7), (2, 3), (2, 1), (0, 1, 0, 1), (1, 1), False),
    ((1, 70, 16, 16), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), True),  # more than one block
    ((1, 2, 8, 9), (3, 2), (3, 2), (1, 1, 1, 1), (1, 1), True),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: "x".join(map(str, c[0] + c[1])))
@pytest.mark.parametrize("kind", ["max", "avg", "avg_include_pad"])
def test_pool_matches_torch(case, kind):
    shape, kernel, strides, pads, dilations, ceil = case
    x = randn(np.random.default_rng(sum(shape)), *shape)
    is_max, include_pad = kind == "max", kind == "avg_include_pad"
    want = pool_reference(x, is_max, kernel, strides, pads, dilations, ceil, include_pad)
    y = np.empty(want.shape, np.float32)
    run_both_orders(emu.pool, y, x, max=is_max, kernel=list(kernel), strides=list(strides),
                    pads=list(pads), dilations=list(dilations), include_pad=include_pad)
    close(y, want, rtol=1e-5, atol=1e-6)


def test_max_pool_with_dilation():
    x = randn(np.random.default_rng(7), 1, 3, 11, 12)
    want = pool_reference(x, True, (3, 2), (1, 2), (1, 1, 1, 1), (2, 3), False, False)
    y = np.empty(want.shape, np.float32)
    run_both_orders(emu.pool, y, x, max=True, kernel=[3, 2], strides=[1, 2], pads=[1, 1, 1, 1],
                    dilations=[2, 3], include_pad=False)
    close(y, want, rtol=0, atol=0)


def test_asymmetric_pads_average_counts_only_the_input():
    """Pads (top 1, left 0, bottom 0, right 2): the window's divisor is what lies inside the
    input, or inside the padded input with count_include_pad (numpy reference)."""
    x = randn(np.random.default_rng(8), 1, 2, 5, 6)
    inside = np.pad(np.ones_like(x, np.float64), ((0, 0), (0, 0), (1, 0), (0, 2)))
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 0), (0, 2)))
    oh, ow = (5 + 1 - 2) // 1 + 1, (6 + 2 - 3) // 2 + 1
    sums, counts = np.zeros((1, 2, oh, ow)), np.zeros((1, 2, oh, ow))
    for ky in range(2):
        for kx in range(3):
            sums += padded[:, :, ky:ky + oh, kx:kx + 2 * ow - 1:2]
            counts += inside[:, :, ky:ky + oh, kx:kx + 2 * ow - 1:2]
    for include_pad, divisor in ((False, counts), (True, 6.0)):
        y = np.empty((1, 2, oh, ow), np.float32)
        run_both_orders(emu.pool, y, x, max=False, kernel=[2, 3], strides=[1, 2],
                        pads=[1, 0, 0, 2], dilations=[1, 1], include_pad=include_pad)
        close(y, sums / divisor, rtol=1e-6, atol=1e-6)


# ---- row kernels: block reductions ------------------------------------------------------------

def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# (shape, axis): rows shorter and longer than a block (256), rows strided by `inner`
ROW_SHAPES = [((4, 10), 1), ((3, 1000), 1), ((2, 300, 3), 1), ((5, 4, 6), 0), ((1, 1), 1),
              ((2, 3, 257), 2)]


@pytest.mark.parametrize(("shape", "axis"), ROW_SHAPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_matches_numpy(shape, axis, log):
    x = randn(np.random.default_rng(sum(shape)), *shape) * 4
    y = np.empty_like(x)
    run_both_orders(emu.rows, y, ROW_OPS["LogSoftmax" if log else "Softmax"], x, axis=axis,
                    flatten=False, scale=None, bias=None, epsilon=0.0)
    want = _softmax(x.astype(np.float64), axis)
    close(y, np.log(want) if log else want, rtol=1e-5, atol=1e-6)


def test_softmax_flattened_before_opset_13():
    """Opset < 13: the softmax runs over all dims from axis on, as one row per leading index."""
    x = randn(np.random.default_rng(9), 3, 4, 50)
    y = np.empty_like(x)
    run_both_orders(emu.rows, y, ROW_OPS["Softmax"], x, axis=1, flatten=True, scale=None,
                    bias=None, epsilon=0.0)
    want = _softmax(x.reshape(3, -1).astype(np.float64), 1).reshape(x.shape)
    close(y, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("shape", "axis"), [((4, 10), 1), ((3, 1000), 1), ((2, 5, 7, 9), 2),
                                             ((6, 768), -1)])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_matches_numpy(shape, axis, affine):
    rng = np.random.default_rng(sum(shape))
    x = randn(rng, *shape) * 3 + 5  # an offset: a one-pass variance would lose digits
    axis = axis % len(shape)
    inner = shape[axis:]
    scale, bias = (randn(rng, *inner), randn(rng, *inner)) if affine else (None, None)
    y = np.empty_like(x)
    run_both_orders(emu.rows, y, ROW_OPS["LayerNorm"], x, axis=axis, flatten=False, scale=scale,
                    bias=bias, epsilon=1e-5)
    axes = tuple(range(axis, len(shape)))
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(axes, keepdims=True)) / np.sqrt(x64.var(axes, keepdims=True) + 1e-5)
    if affine:
        want = want * scale + bias
    close(y, want, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 300, 1, 1), (1, 5, 30, 31)])
@pytest.mark.parametrize("kind", ["Mean", "Max"])
def test_global_pool_matches_numpy(shape, kind):
    x = randn(np.random.default_rng(sum(shape)), *shape)
    y = np.empty((*shape[:2], 1, 1), np.float32)
    run_both_orders(emu.rows, y, ROW_OPS[kind], x, axis=2, flatten=False, scale=None, bias=None,
                    epsilon=0.0)
    x64 = x.astype(np.float64)
    want = x64.mean((2, 3), keepdims=True) if kind == "Mean" else x64.max((2, 3), keepdims=True)
    close(y, want, rtol=1e-5, atol=1e-6)


# ---- the .cu sources compile -------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: the CUDA sources "
                    "are not compiled here (the emulator tests above still run the kernels)")
def test_cuda_sources_compile_with_nvcc(tmp_path):
    """Every .cu file compiles for one architecture (sm_80), warnings as errors."""
    include = CUDA_DIR.parent / "include"
    sources = sorted(CUDA_DIR.glob("*.cu"))
    assert sources
    for source in sources:
        cmd = ["nvcc", "-std=c++17", "-arch=sm_80", "-O2", f"-I{include}", f"-I{CUDA_DIR}",
               f"-I{CUDA_DIR.parent}",  # ops.def, the operation catalogue
               "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror", "-c",
               str(source), "-o", str(tmp_path / (source.stem + ".o"))]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{source.name}:\n{done.stderr}"


# ---- whole plans: the CUDA executor's host side with the emulator as its device ---------------

def _model(nodes, inputs, weights, outputs, opset=18):
    import onnx
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        nodes, "m",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, v.shape)
         for n, v in inputs.items()],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [numpy_helper.from_array(v, n) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def cnn_model(rng):
    """Conv+BN+Relu, MaxPool (ceil), depthwise Conv+HardSwish, 1x1 Conv + residual + Relu,
    AveragePool (count_include_pad), GlobalAveragePool, Flatten, Gemm, Softmax."""
    from onnx import helper

    w = {"w1": randn(rng, 8, 3, 3, 3), "b1": randn(rng, 8), "scale": randn(rng, 8),
         "shift": randn(rng, 8), "mean": randn(rng, 8),
         "var": np.abs(randn(rng, 8)) + 0.5, "w2": randn(rng, 8, 1, 3, 3),
         "w3": randn(rng, 8, 8, 1, 1), "w4": randn(rng, 10, 8), "b4": randn(rng, 10)}
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["bn"]),
        n("Relu", ["bn"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
          ceil_mode=1),
        n("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=8),
        n("HardSwish", ["c2"], ["h2"]),
        n("Conv", ["h2", "w3"], ["c3"]),
        n("Add", ["c3", "p1"], ["a3"]),
        n("Relu", ["a3"], ["r3"]),
        n("AveragePool", ["r3"], ["p3"], kernel_shape=[2, 2], pads=[1, 1, 0, 0],
          count_include_pad=1),
        n("GlobalAveragePool", ["p3"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "w4", "b4"], ["logits"], transB=1),
        n("Softmax", ["logits"], ["out"]),
    ]
    return _model(nodes, {"x": randn(rng, 2, 3, 17, 19)}, w, ["out"])


def attention_model(rng):
    """MatMul + bias + LayerNorm + SiLU, a transposed copy, batched MatMuls, Softmax,
    LogSoftmax, a residual Add."""
    from onnx import helper

    w = {"wq": randn(rng, 16, 16), "bq": randn(rng, 16), "g": randn(rng, 16),
         "beta": randn(rng, 16)}
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q1"]),
        n("LayerNormalization", ["q1", "g", "beta"], ["q2"], axis=-1, epsilon=1e-5),
        n("Sigmoid", ["q2"], ["s"]), n("Mul", ["q2", "s"], ["q"]),
        n("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "qt"], ["scores"]),
        n("Softmax", ["scores"], ["attn"], axis=-1),
        n("MatMul", ["attn", "q"], ["ctx"]),
        n("Add", ["ctx", "x"], ["y"]),
        n("LogSoftmax", ["y"], ["out"], axis=1),
    ]
    return _model(nodes, {"x": randn(rng, 2, 5, 16)}, w, ["out"])


def ort_run(model, feeds):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds),
                    strict=True))


def emulated_backend(variant=""):
    from onnxlens.backends.native_cuda import NativeCudaBackend

    return NativeCudaBackend(module=emu, variant=variant)


@pytest.mark.parametrize("make", [cnn_model, attention_model])
def test_emulated_executor_runs_models_like_onnxruntime(make):
    rng = np.random.default_rng(11)
    model = make(rng)
    x = {"x": randn(rng, *[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])}
    want = ort_run(model, x)
    got = {}
    for variant in ("", "reverse"):
        backend = emulated_backend(variant)
        backend.prepare(model)
        got[variant] = backend.run(x)
    np.testing.assert_array_equal(got[""]["out"], got["reverse"]["out"])
    np.testing.assert_allclose(got[""]["out"], want["out"], rtol=1e-4, atol=1e-5)


def test_emulated_executor_profiles_each_group_and_captures_boundaries():
    rng = np.random.default_rng(12)
    model = cnn_model(rng)
    x = {"x": randn(rng, 2, 3, 17, 19)}
    backend = emulated_backend()
    backend.prepare(model)
    profile = backend.profile(x, runs=2, warmup=0)
    steps = backend.prepared.plan.steps
    assert [k.name for k in profile.kernels] == [s.name for s in steps]
    assert {k.provider for k in profile.kernels} == {"native-cuda"}
    assert all(k.duration_s > 0 for k in profile.kernels)
    assert profile.run_s >= sum(k.duration_s for k in profile.kernels) * 0.5
    inter = backend.intermediates(x)
    ref = ort_run(model, x)
    np.testing.assert_allclose(inter["out"], ref["out"], rtol=1e-4, atol=1e-5)
    assert "r1" in inter or "p1" in inter  # a group boundary was captured
    assert backend.describe()["device"] == "emulated"


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_torchvision_models_through_the_emulated_executor_match_onnxruntime(name):
    """ResNet-18 (Conv+Add+Relu groups, MaxPool, Gemm) and MobileNetV2 (depthwise convs on the
    untiled kernel, Clip, residual adds), at 32x32 to keep the emulation short."""
    import onnx

    from onnxlens.exporters.torch_export import cached_export

    model = onnx.load(str(cached_export(name, image_size=32)))
    name = model.graph.input[0].name
    x = {name: randn(np.random.default_rng(13), 1, 3, 32, 32)}
    backend = emulated_backend()
    backend.prepare(model)
    got, want = backend.run(x), ort_run(model, x)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-4)


def test_a_kernel_without_a_cuda_version_fails_prepare_with_its_name():
    from onnx import helper

    from onnxlens.backends.base import BackendError

    model = _model([helper.make_node("ReduceSum", ["x"], ["out"], keepdims=1)],
                   {"x": np.zeros((2, 3), np.float32)}, {}, ["out"])
    with pytest.raises(BackendError, match=r"^native-cuda: no kernel for ReduceSum in this "
                                           r"build") as info:
        emulated_backend().prepare(model)
    assert info.value.backend == "native-cuda"


def test_matmul_broadcasting_part_of_a_batch_is_refused_with_the_reason():
    from onnx import helper

    from onnxlens.backends.base import BackendError

    model = _model([helper.make_node("MatMul", ["a", "b"], ["out"])],
                   {"a": np.zeros((2, 1, 3, 4), np.float32),
                    "b": np.zeros((1, 5, 4, 6), np.float32)}, {}, ["out"])
    with pytest.raises(BackendError, match="broadcasts whole batches only"):
        emulated_backend().prepare(model)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found: no CUDA module built")
def test_cuda_module_imports_without_a_gpu_and_says_why():
    """Built where nvcc is; its runtime is static, so it imports even with no driver, and the
    probe answers with a count and a one-line reason instead of failing."""
    cuda = pytest.importorskip("onnxlens.backends._native_cuda")
    assert set(cuda.kernel_ops()) == set(emu.kernel_ops())
    count = cuda.device_count()
    assert count >= 0
    if count == 0:
        reason = cuda.unavailable_reason()
        assert reason and "\n" not in reason


def test_native_cuda_is_registered_and_refused_here_with_one_line():
    from onnxlens.backends import registry
    from onnxlens.backends.base import BackendUnavailable
    from onnxlens.backends.native_cuda import unavailable_reason

    info = registry.availability("native-cuda")
    assert info.available == (unavailable_reason() is None)
    if not info.available:
        assert info.reason and "\n" not in info.reason
        with pytest.raises(BackendUnavailable, match="native-cuda: "):
            registry.create("native-cuda")
