"""Resize and Upsample as index tables: nearest becomes a `MapCopy` (one input coordinate per
output coordinate and axis), linear a `LinearResize` (two coordinates and a weight).

The coordinate of output index x along an axis, for scale s and lengths out / in, follows the
ONNX operator's coordinate_transformation_mode; linear interpolation reads the edge value for
coordinates outside the input (as the ONNX reference does). Cubic interpolation, antialiasing,
tf_crop_and_resize and aspect-ratio policies other than "stretch" are not supported.
"""

from __future__ import annotations

import math

import numpy as np

from ...analyzer.ir import NodeInfo
from .lower import Kernel, Lowering, Unsupported


def resize_kernel(node: NodeInfo, low: Lowering) -> Kernel:
    x, y = node.inputs[0].name, node.outputs[0].name
    in_shape, out_shape = low.shape(x), low.shape(y)
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"{mode} interpolation")
    if node.attr("antialias", 0) or node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise Unsupported("antialias / keep_aspect_ratio_policy")
    legacy = node.op_type == "Upsample" or low.opset < 11
    transform = "asymmetric" if legacy else node.attr("coordinate_transformation_mode",
                                                      "half_pixel")
    if transform == "tf_crop_and_resize":
        raise Unsupported("tf_crop_and_resize")
    scales = _scales(node, low, in_shape, out_shape, legacy)
    if mode == "nearest":
        rounding = "floor" if legacy else node.attr("nearest_mode", "round_prefer_floor")
        table = [_nearest(_source(o, s, n_in, n_out, transform), n_in, rounding)
                 for n_in, n_out, s in zip(in_shape, out_shape, scales, strict=True)
                 for o in range(n_out)]
        return Kernel("MapCopy", [x], [y], {"map": table})
    lo: list[int] = []
    hi: list[int] = []
    w: list[float] = []
    for n_in, n_out, s in zip(in_shape, out_shape, scales, strict=True):
        for o in range(n_out):
            c = _source(o, s, n_in, n_out, transform) if n_in != n_out or s != 1 else float(o)
            base = math.floor(c)
            lo.append(min(max(base, 0), n_in - 1))
            hi.append(min(max(base + 1, 0), n_in - 1))
            w.append(c - base if lo[-1] != hi[-1] else 0.0)
    return Kernel("LinearResize", [x], [y], {"lo": lo, "hi": hi}, {"w": w})


def _scales(node: NodeInfo, low: Lowering, in_shape: tuple[int, ...],
            out_shape: tuple[int, ...], legacy: bool) -> list[float]:
    rank = len(in_shape)
    if legacy:
        given = (node.attr("scales") if node.op_type == "Upsample" and low.opset < 9
                 else low.need_const(node, 1, "the scales"))
        return [float(v) for v in np.asarray(given).reshape(-1)]
    scales = low.need_const(node, 2, "the scales")
    low.need_const(node, 3, "the sizes")  # the output shape already holds them; it must be static
    axes = [a + rank if a < 0 else a for a in node.attr("axes", list(range(rank)))]
    full = [1.0] * rank
    if scales is not None and scales.size:
        for a, v in zip(axes, scales.reshape(-1), strict=True):
            full[a] = float(v)
    else:
        for a in axes:
            full[a] = out_shape[a] / in_shape[a]
    return full


def _source(o: int, scale: float, n_in: int, n_out: int, transform: str) -> float:
    """The input coordinate of output index `o` (ONNX Resize, coordinate_transformation_mode)."""
    if transform == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if n_out > 1 else 0.0
    if transform == "align_corners":
        return 0.0 if n_out == 1 else o * (n_in - 1) / (n_out - 1)
    if transform == "asymmetric":
        return o / scale
    if transform == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if transform == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adjustment) + (o + 0.5) / scale - 0.5
    raise Unsupported(f"coordinate_transformation_mode {transform}")


def _nearest(c: float, n_in: int, rounding: str) -> int:
    if rounding == "round_prefer_floor":
        i = math.ceil(c - 0.5)
    elif rounding == "round_prefer_ceil":
        i = math.floor(c + 0.5)
    elif rounding == "floor":
        i = math.floor(c)
    elif rounding == "ceil":
        i = math.ceil(c)
    else:
        raise Unsupported(f"nearest_mode {rounding}")
    return min(max(i, 0), n_in - 1)
